//! The JSON task API (issue 39) on keyrelay's listener, against the simulator: tasks of
//! each kind translated into the in.php submit and polled through res.php on the key that
//! made them, answers in anti-captcha's and CapSolver's shapes, tokens as `clientKey`, and
//! every kind of bad input answered as the JSON API answers it, with nothing sent upstream.

mod common;

use bytes::Bytes;
use common::*;
use hyper::Method;
use serde_json::{json, Value};

const JSON: &str = "application/json";

async fn call(h: &Harness, method: &str, body: Value) -> Answer {
    h.post(&format!("/{method}"), JSON, body.to_string()).await
}

/// Every JSON API answer is HTTP 200 with a JSON body.
fn json_of(answer: &Answer) -> Value {
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.content_type(), Some("application/json"));
    answer.json()
}

/// Polls `task` through `getTaskResult` until it is ready; the ready answer.
async fn result_of(h: &Harness, client_key: &str, task: &Value) -> Value {
    for _ in 0..20 {
        let answer = json_of(
            &call(
                h,
                "getTaskResult",
                json!({"clientKey": client_key, "taskId": task}),
            )
            .await,
        );
        assert_eq!(answer["errorId"], 0, "{answer}");
        if answer["status"] == "ready" {
            return answer;
        }
        assert_eq!(answer["status"], "processing", "{answer}");
    }
    panic!("task {task} never got ready");
}

fn submits(h: &Harness) -> Vec<keyrelay::sim::Received> {
    h.sim
        .received()
        .into_iter()
        .filter(|r| r.path == "/in.php")
        .collect()
}

fn param<'a>(received: &'a keyrelay::sim::Received, name: &str) -> Option<&'a str> {
    received
        .params
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn an_image_task_is_submitted_polled_and_solved_on_its_key() {
    let h = Harness::three_keys().await;
    let created = json_of(
        &call(
            &h,
            "createTask",
            json!({"clientKey": "anything", "softId": 0, "callbackUrl": null,
                   "task": {"type": "ImageToTextTask", "body": "aGVsbG8=", "numeric": 1}}),
        )
        .await,
    );
    assert_eq!(created["errorId"], 0, "{created}");
    let task = created["taskId"].clone();
    let id = task.as_u64().expect("taskId is a number");
    let sent = submits(&h);
    assert_eq!(sent.len(), 1);
    assert_eq!(param(&sent[0], "method"), Some("base64"));
    assert_eq!(param(&sent[0], "body"), Some("aGVsbG8="));
    assert_eq!(param(&sent[0], "numeric"), Some("1"));
    // The pool's key went upstream, never the caller's client key.
    let key = param(&sent[0], "key").expect("a key upstream");
    assert!([KEY_A, KEY_B, KEY_C].contains(&key), "{key}");
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(key));
    let ready = result_of(&h, "anything", &task).await;
    assert_eq!(ready["solution"]["text"], format!("tok-{id}"));
    for field in ["cost", "ip", "createTime", "endTime", "solveCount"] {
        assert!(!ready[field].is_null(), "{field} in {ready}");
    }
    // Every poll went to the key that made the task.
    let polls = h.sim.received();
    let polls = polls.iter().filter(|r| param(r, "action") == Some("get"));
    for poll in polls {
        assert_eq!(param(poll, "key"), Some(key));
        assert_eq!(param(poll, "id"), Some(id.to_string().as_str()));
    }
}

#[tokio::test]
async fn recaptcha_tasks_of_every_spelling_are_userrecaptcha_submits() {
    let h = Harness::three_keys().await;
    for task_type in [
        "RecaptchaV2TaskProxyless",
        "RecaptchaV2Task",
        "ReCaptchaV2TaskProxyLess",
        "NoCaptchaTaskProxyless",
    ] {
        h.sim.clear_received();
        let created = json_of(
            &call(
                &h,
                "createTask",
                json!({"clientKey": "k", "task": {"type": task_type,
                       "websiteURL": "https://x.test/login", "websiteKey": "6Le-site"}}),
            )
            .await,
        );
        assert_eq!(created["errorId"], 0, "{task_type}: {created}");
        let sent = submits(&h);
        assert_eq!(param(&sent[0], "method"), Some("userrecaptcha"));
        assert_eq!(param(&sent[0], "googlekey"), Some("6Le-site"));
        assert_eq!(param(&sent[0], "pageurl"), Some("https://x.test/login"));
        assert_eq!(param(&sent[0], "proxy"), None, "{task_type} is proxyless");
        let ready = result_of(&h, "k", &created["taskId"]).await;
        let token = ready["solution"]["gRecaptchaResponse"].as_str().unwrap();
        assert!(token.starts_with("tok-"));
        assert_eq!(ready["solution"]["token"], token);
    }
}

#[tokio::test]
async fn capsolvers_host_gets_capsolvers_shape() {
    let h = Harness::three_keys().await;
    let body = json!({"clientKey": "k", "appId": "x", "callbackUrl": null,
                      "task": {"type": "AntiTurnstileTaskProxyLess",
                               "websiteURL": "https://x.test", "websiteKey": "0x4AAA"}});
    let headers = [("host", "api.capsolver.com"), ("content-type", JSON)];
    let created = h
        .send_with_headers(
            Method::POST,
            "/createTask",
            &headers,
            Bytes::from(body.to_string()),
        )
        .await;
    let created = json_of(&created);
    assert_eq!(created["status"], "idle");
    let task = created["taskId"]
        .as_str()
        .expect("a text taskId")
        .to_owned();
    assert_eq!(param(&submits(&h)[0], "method"), Some("turnstile"));
    let allowed = [
        "errorId",
        "errorCode",
        "errorDescription",
        "taskId",
        "status",
        "solution",
    ];
    let mut ready = false;
    for _ in 0..20 {
        let body = json!({"clientKey": "k", "taskId": task}).to_string();
        let answer = h
            .send_with_headers(Method::POST, "/getTaskResult", &headers, Bytes::from(body))
            .await;
        let answer = json_of(&answer);
        for field in answer.as_object().unwrap().keys() {
            assert!(allowed.contains(&field.as_str()), "{field} in {answer}");
        }
        if answer["status"] == "ready" {
            assert!(answer["solution"]["token"]
                .as_str()
                .unwrap()
                .starts_with("tok-"));
            ready = true;
            break;
        }
    }
    assert!(ready, "the task got ready");
}

#[tokio::test]
async fn get_balance_answers_the_pools_balance() {
    let h = Harness::three_keys().await;
    let balance = json_of(&call(&h, "getBalance", json!({"clientKey": "k"})).await);
    assert_eq!(balance["errorId"], 0, "{balance}");
    // Three simulator keys of 10 each.
    assert_eq!(balance["balance"].as_f64(), Some(30.0));
}

#[tokio::test]
async fn reports_go_to_the_tasks_key() {
    let h = Harness::three_keys().await;
    let created = json_of(
        &call(
            &h,
            "createTask",
            json!({"clientKey": "k", "task": {"type": "ImageToTextTask", "body": "aGVsbG8="}}),
        )
        .await,
    );
    let task = created["taskId"].clone();
    let key = param(&submits(&h)[0], "key").unwrap().to_owned();
    result_of(&h, "k", &task).await;
    for method in ["reportIncorrectImageCaptcha", "reportCorrectRecaptcha"] {
        let answer = json_of(&call(&h, method, json!({"clientKey": "k", "taskId": task})).await);
        assert_eq!(answer["errorId"], 0, "{method}: {answer}");
        assert_eq!(answer["status"], "success");
    }
    let reports: Vec<_> = h
        .sim
        .received()
        .into_iter()
        .filter(|r| matches!(param(r, "action"), Some("reportbad" | "reportgood")))
        .collect();
    assert_eq!(reports.len(), 2);
    for report in &reports {
        assert_eq!(param(report, "key"), Some(key.as_str()));
    }
}

#[tokio::test]
async fn bad_input_gets_the_json_apis_errors_and_sends_nothing() {
    let h = Harness::three_keys().await;
    h.sim.clear_received();
    let cases: [(&str, &str, u64, &str); 10] = [
        ("createTask", "{", 110, "ERROR_BAD_PARAMETERS"),
        ("createTask", "[1]", 110, "ERROR_BAD_PARAMETERS"),
        (
            "createTask",
            r#"{"clientKey":"k"}"#,
            110,
            "ERROR_BAD_PARAMETERS",
        ),
        (
            "createTask",
            r#"{"task":{"type":"FunCaptchaTaskProxyless","websiteURL":"u","websiteKey":"k"}}"#,
            23,
            "ERROR_TASK_NOT_SUPPORTED",
        ),
        (
            "createTask",
            r#"{"task":{"type":"RecaptchaV2TaskProxyless","websiteURL":"u"}}"#,
            110,
            "ERROR_BAD_PARAMETERS",
        ),
        (
            "getTaskResult",
            r#"{"clientKey":"k"}"#,
            110,
            "ERROR_BAD_PARAMETERS",
        ),
        (
            "getTaskResult",
            r#"{"taskId":"x y"}"#,
            16,
            "ERROR_NO_SUCH_CAPCHA_ID",
        ),
        (
            "getTaskResult",
            r#"{"taskId":-5}"#,
            110,
            "ERROR_BAD_PARAMETERS",
        ),
        (
            "getQueueStats",
            r#"{"queueId":1}"#,
            14,
            "ERROR_NO_SUCH_METHOD",
        ),
        ("createTask", "\u{0}", 110, "ERROR_BAD_PARAMETERS"),
    ];
    for (method, body, id, code) in cases {
        let answer = json_of(&h.post(&format!("/{method}"), JSON, body.to_owned()).await);
        assert_eq!(answer["errorId"], id, "{method} {body}: {answer}");
        assert_eq!(answer["errorCode"], code, "{method} {body}");
        assert!(
            answer["errorDescription"]
                .as_str()
                .is_some_and(|d| !d.is_empty()),
            "{answer}"
        );
    }
    assert!(
        submits(&h).is_empty(),
        "nothing was submitted upstream for bad input"
    );
    // Every key is still in rotation: bad input benches nothing.
    for name in ["a", "b", "c"] {
        assert_eq!(h.state_of(name).0, keyrelay::health::StateKind::Active);
    }
}

#[tokio::test]
async fn an_unknown_task_id_is_no_such_captcha_id() {
    let h = Harness::three_keys().await;
    let answer = json_of(&call(&h, "getTaskResult", json!({"taskId": 999_999_999})).await);
    assert_eq!(answer["errorId"], 16, "{answer}");
}

#[tokio::test]
async fn client_keys_are_caller_tokens_when_tokens_are_configured() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.access.tokens = vec![
        caller_token("alice", "alice-token-0000000000000000"),
        caller_token("bob", "bob-token-00000000000000000000"),
    ];
    let h = Harness::start(sim, config).await;
    let image = json!({"type": "ImageToTextTask", "body": "aGVsbG8="});
    for body in [
        json!({"task": image}),
        json!({"clientKey": "not-a-token", "task": image}),
        json!({"clientKey": null, "task": image}),
    ] {
        let answer = json_of(&call(&h, "createTask", body.clone()).await);
        assert_eq!(answer["errorId"], 1, "{body}: {answer}");
        assert_eq!(answer["errorCode"], "ERROR_KEY_DOES_NOT_EXIST");
    }
    assert!(submits(&h).is_empty());
    let created = json_of(
        &call(
            &h,
            "createTask",
            json!({"clientKey": "alice-token-0000000000000000", "task": image}),
        )
        .await,
    );
    let task = created["taskId"].clone();
    // Bob cannot read or report Alice's task.
    for method in ["getTaskResult", "reportIncorrectImageCaptcha"] {
        let answer = json_of(
            &call(
                &h,
                method,
                json!({"clientKey": "bob-token-00000000000000000000", "taskId": task}),
            )
            .await,
        );
        assert_eq!(answer["errorId"], 16, "{method}: {answer}");
    }
    let ready = result_of(&h, "alice-token-0000000000000000", &task).await;
    assert!(ready["solution"]["text"].is_string());
}

#[tokio::test]
async fn an_unsolvable_task_is_error_12() {
    let h = Harness::three_keys().await;
    h.sim.add_fault(
        "*",
        fault(
            keyrelay::sim::FaultTarget::Poll,
            keyrelay::sim::FaultKind::Code("ERROR_CAPTCHA_UNSOLVABLE".into()),
            None,
        ),
    );
    let created = json_of(
        &call(
            &h,
            "createTask",
            json!({"task": {"type": "ImageToTextTask", "body": "aGVsbG8="}}),
        )
        .await,
    );
    let answer = json_of(&call(&h, "getTaskResult", json!({"taskId": created["taskId"]})).await);
    assert_eq!(answer["errorId"], 12, "{answer}");
    assert_eq!(answer["errorCode"], "ERROR_CAPTCHA_UNSOLVABLE");
}

#[tokio::test]
async fn in_php_and_json_clients_share_one_pool() {
    let h = Harness::three_keys().await;
    let old = h.submit().await;
    let created = json_of(
        &call(
            &h,
            "createTask",
            json!({"task": {"type": "ImageToTextTask", "body": "aGVsbG8="}}),
        )
        .await,
    );
    let new = created["taskId"].as_u64().unwrap();
    // Each generation reads the other's task: one pin table.
    let ready = result_of(&h, "", &json!(old)).await;
    assert!(ready["solution"]["gRecaptchaResponse"].is_string());
    let poll = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&id={new}&json=1"
        ))
        .await
        .json();
    assert!(poll["status"] == 0 || poll["status"] == 1, "{poll}");
}

#[tokio::test]
async fn an_unknown_method_on_a_json_api_host_is_its_error() {
    let h = Harness::three_keys().await;
    for host in [
        "api.anti-captcha.com",
        "api.capmonster.cloud",
        "API.CapSolver.com:443",
    ] {
        let answer = h
            .send_with_headers(
                Method::GET,
                "/getQueueStats",
                &[("host", host)],
                Bytes::new(),
            )
            .await;
        let answer = json_of(&answer);
        assert_eq!(
            answer["errorCode"], "ERROR_NO_SUCH_METHOD",
            "{host}: {answer}"
        );
        assert_ne!(answer["errorId"], 0);
    }
    // The in.php generation on the same host is served as ever (CapMonster's serves both).
    let answer = h
        .send_with_headers(
            Method::GET,
            &format!("/res.php?key={CALLER_KEY}&action=getbalance"),
            &[("host", "api.capmonster.cloud")],
            Bytes::new(),
        )
        .await;
    assert_eq!(answer.text().trim().parse::<f64>().ok(), Some(30.0));
}

#[tokio::test]
async fn other_paths_stay_as_they_were() {
    let h = Harness::three_keys().await;
    // A JSON body to an unknown path is the JSON API's error; anything else a 404.
    let answer = json_of(&h.post("/whatever", JSON, "{}").await);
    assert_eq!(answer["errorCode"], "ERROR_NO_SUCH_METHOD");
    let answer = h.get("/whatever").await;
    assert_eq!(answer.status, 404);
    // A JSON API method with another HTTP method is refused as the API paths are.
    let answer = h
        .send(Method::DELETE, "/createTask", None, Bytes::new())
        .await;
    assert_eq!(answer.status, 405);
}

#[test]
fn the_forward_proxy_intercepts_every_json_api_host_by_default() {
    for host in keyrelay::json_api::JSON_API_HOSTS {
        assert!(
            keyrelay::config::KNOWN_API_HOSTS.contains(host),
            "{host} is not intercepted by default"
        );
    }
}

#[tokio::test]
async fn task_values_cannot_smuggle_params_or_override_the_method() {
    let h = Harness::three_keys().await;
    h.sim.clear_received();
    let created = json_of(
        &call(
            &h,
            "createTask",
            json!({"clientKey": "k", "task": {
                "type": "ImageToTextTask", "body": "aGVsbG8=&key=stolen&method=userrecaptcha",
                "method": "userrecaptcha", "key": "smuggled", "json": 0, "soft_id": 9,
                "comment": "a=b&action=reportbad", "Comment": "ignored: the exact name wins",
            }}),
        )
        .await,
    );
    assert_eq!(created["errorId"], 0, "{created}");
    let sent = submits(&h);
    assert_eq!(sent.len(), 1);
    let names: Vec<&str> = sent[0].params.iter().map(|(n, _)| n.as_str()).collect();
    for once in ["method", "key", "json", "body", "textinstructions"] {
        assert_eq!(
            names.iter().filter(|n| **n == once).count(),
            1,
            "{once} in {names:?}"
        );
    }
    assert_eq!(param(&sent[0], "method"), Some("base64"));
    assert_eq!(
        param(&sent[0], "body"),
        Some("aGVsbG8=&key=stolen&method=userrecaptcha")
    );
    assert_eq!(
        param(&sent[0], "textinstructions"),
        Some("a=b&action=reportbad")
    );
    assert!(!names.contains(&"soft_id") && !names.contains(&"action"));
    let key = param(&sent[0], "key").unwrap();
    assert!(
        [KEY_A, KEY_B, KEY_C].contains(&key),
        "the pool's key: {key}"
    );
    // A task id with params in it is no task id, and sends nothing.
    h.sim.clear_received();
    let answer = json_of(
        &call(
            &h,
            "getTaskResult",
            json!({"taskId": format!("{}&action=reportbad", created["taskId"])}),
        )
        .await,
    );
    assert_eq!(answer["errorId"], 16, "{answer}");
    assert!(h.sim.received().is_empty(), "{:?}", h.sim.received());
}
