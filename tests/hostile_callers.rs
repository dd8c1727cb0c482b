//! No caller request can bench a key or get its key upstream, end to end: malformed and
//! hostile submits against a healthy pool leave every key in rotation, and a key-unusable
//! verdict drawn by a caller's request benches a key only once keyrelay's own `getbalance`
//! confirms it.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use keyrelay::health::StateKind;
use keyrelay::sim::{FaultKind, FaultTarget, SimKey, SimKeyState, Simulator};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// One request as a hostile or broken script might send it.
struct Hostile {
    method: Method,
    path_and_query: String,
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Vec<u8>,
}

fn get(path_and_query: String) -> Hostile {
    Hostile {
        method: Method::GET,
        path_and_query,
        headers: vec![],
        body: vec![],
    }
}

fn post(path_and_query: &str, content_type: &[u8], body: impl Into<Vec<u8>>) -> Hostile {
    Hostile {
        method: Method::POST,
        path_and_query: path_and_query.to_owned(),
        headers: vec![("content-type", content_type.to_vec())],
        body: body.into(),
    }
}

fn multipart(disposition: &str) -> Vec<u8> {
    format!(
        "--X\r\nContent-Disposition: form-data; name=\"method\"\r\n\r\nbase64\r\n\
         --X\r\nContent-Disposition: {disposition}\r\n\r\n{CALLER_KEY}\r\n\
         --X\r\nContent-Disposition: form-data; name=\"body\"\r\n\r\nR0lGOD\r\n--X--\r\n"
    )
    .into_bytes()
}

/// Every class of malformed submit found so far, in several spellings each.
fn hostile_submits() -> Vec<Hostile> {
    let task = "method=userrecaptcha&googlekey=g&pageurl=https://x.test";
    let mut all = Vec::new();
    for name in [
        "key[]",
        "key%5B%5D",
        "+key",
        "%20key",
        "key%00x",
        "KEY",
        "Key",
        "k%65y",
        "key[a]",
        "key[",
        "%EF%BB%BFkey",
        "key%20",
    ] {
        all.push(get(format!("/in.php?{name}={CALLER_KEY}&{task}&json=1")));
        all.push(get(format!("/in.php?key={CALLER_KEY}&{name}=x&{task}")));
        all.push(post(
            "/in.php?json=1",
            b"application/x-www-form-urlencoded",
            format!("{name}={CALLER_KEY}&method=base64&body=R0lGOD"),
        ));
    }
    for disposition in [
        "form-data; name=\"key[]\"",
        "form-data; name=key",
        "form-data; NAME=\"KEY\"",
        "form-data; name=\"key\"; name=\"x\"",
        "form-data; name=\"x\"; name=\"key\"",
        "form-data; name*=UTF-8''key",
        "form-data; name*0=\"k\"; name*1=\"ey\"",
        "form-data; name=\"key\"; filename=\"k.txt\"",
        "form-data; name=\"x\"\r\nContent-Disposition: form-data; name=\"key\"",
    ] {
        all.push(post(
            "/in.php",
            b"multipart/form-data; boundary=X",
            multipart(disposition),
        ));
    }
    for json in [
        format!(r#"{{"Key":"{CALLER_KEY}","method":"base64","body":"R0lG"}}"#),
        format!(r#"{{" key":"{CALLER_KEY}","method":"base64","body":"R0lG"}}"#),
        format!(r#"{{"key[]":"{CALLER_KEY}","method":"base64","body":"R0lG"}}"#),
        format!(r#"{{"k\u0065y":"{CALLER_KEY}","key":"x","method":"base64","body":"R0lG"}}"#),
    ] {
        all.push(post("/in.php", b"application/json", json.clone()));
        all.push(post("/in.php", b"text/plain;charset=UTF-8", json));
    }
    // What keyrelay cannot read with certainty: refused, never forwarded.
    all.push(post(
        "/in.php",
        b"multipart/form-data; boundary=X; charset=\xe9",
        multipart("form-data; name=\"key\""),
    ));
    all.push(post(
        "/in.php",
        b"application/x-www-form-urlencoded; charset=utf-16",
        format!("key={CALLER_KEY}&method=base64"),
    ));
    let mut gzip = post(
        "/in.php",
        b"application/x-www-form-urlencoded",
        format!("key={CALLER_KEY}&method=base64"),
    );
    gzip.headers.push(("content-encoding", b"gzip".to_vec()));
    all.push(gzip);
    let mut two_types = post(
        "/in.php",
        b"multipart/form-data; boundary=X",
        multipart("form-data; name=\"key\""),
    );
    two_types.headers.push((
        "content-type",
        b"application/x-www-form-urlencoded".to_vec(),
    ));
    all.push(two_types);
    // Credentials in headers.
    let mut with_credentials = get(format!("/in.php?{task}"));
    for name in [
        "authorization",
        "x-api-key",
        "proxy-authorization",
        "cookie",
    ] {
        with_credentials
            .headers
            .push((name, format!("key={CALLER_KEY}").into_bytes()));
    }
    all.push(with_credentials);
    all
}

async fn send(h: &Harness, hostile: &Hostile) -> Answer {
    let mut request = Request::builder()
        .method(hostile.method.clone())
        .uri(h.url(&hostile.path_and_query));
    for (name, value) in &hostile.headers {
        request = request.header(
            *name,
            hyper::header::HeaderValue::from_bytes(value).unwrap(),
        );
    }
    let request = request
        .body(Full::new(Bytes::from(hostile.body.clone())))
        .expect("valid request");
    let response = h.client.request(request).await.expect("keyrelay answers");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("whole answer").to_bytes(),
    }
}

/// A well-formed 2captcha answer: `OK|…` or an error code, plain or JSON.
fn well_formed(answer: &Answer) -> bool {
    let text = answer.text();
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) {
        return json.get("status").is_some() && json.get("request").is_some();
    }
    text.starts_with("OK|") || text.starts_with("ERROR_")
}

#[tokio::test]
async fn no_sequence_of_malformed_submits_benches_a_healthy_key() {
    // Room for every task the well-formed variants create, so that no answer is "busy".
    let mut sim = Simulator::new();
    for key in [KEY_A, KEY_B, KEY_C] {
        sim = sim.key(SimKey {
            threads: 1000,
            balance: 1000.0,
            ..SimKey::valid(key)
        });
    }
    let sim = sim.spawn().await.expect("simulator binds");
    let config = config_for(
        &sim,
        &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
    );
    let h = Harness::start(sim, config).await;
    let mut submits = hostile_submits();
    let count = submits.len();
    assert!(count > 50, "{count} variants");
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for round in 0..3 {
        submits.shuffle(&mut rng);
        for hostile in &submits {
            let answer = send(&h, hostile).await;
            assert_eq!(
                answer.status, 200,
                "round {round}: {}",
                hostile.path_and_query
            );
            assert!(
                well_formed(&answer),
                "round {round}: {} got {}",
                hostile.path_and_query,
                answer.text()
            );
            assert!(!answer.text().contains(CALLER_KEY));
        }
    }

    for name in ["a", "b", "c"] {
        assert_eq!(h.state_of(name), (StateKind::Active, None), "{name}");
    }
    assert_eq!(h.get("/readyz").await.status, 200);
    let metrics = h.metrics().await;
    assert_eq!(metric(&metrics, "keyrelay_keys_active"), Some(3.0));
    for (key, pool_key) in [("a", KEY_A), ("b", KEY_B), ("c", KEY_C)] {
        let errors =
            format!(
                "keyrelay_key_errors_total{{code=\"ERROR_WRONG_USER_KEY\",key=\"{key}\",provider=\"captchaai\"}}"
            );
        assert_eq!(
            metric(&metrics, &errors),
            None,
            "{key} drew wrong-key answers"
        );
        assert!(!metrics.contains(pool_key));
    }

    // The upstream never saw the caller's key, nor any key but the pool's.
    let received = h.sim.received();
    assert!(!received.is_empty());
    for r in &received {
        assert!(!r.query.contains(CALLER_KEY), "query {}", r.query);
        assert!(
            !String::from_utf8_lossy(&r.body).contains(CALLER_KEY),
            "body of {} {}",
            r.method,
            r.path
        );
        let key = r.key.as_deref().unwrap_or_default();
        assert!([KEY_A, KEY_B, KEY_C].contains(&key), "{key:?}");
    }
    // And the pool still works for everyone else.
    h.submit().await;
    h.stop().await;
}

#[tokio::test]
async fn what_keyrelay_cannot_read_is_refused_in_the_callers_format_and_never_forwarded() {
    let h = Harness::three_keys().await;
    let before = h.sim.received().len();
    for (content_type, extra) in [
        (&b"multipart/form-data; boundary=X; charset=\xe9"[..], None),
        (b"multipart/form-data; boundary=\xffX", None),
        (b"multipart/form-data; boundary=X; charset=UTF-16", None),
        (
            b"multipart/form-data; boundary=X",
            Some(("content-encoding", &b"br"[..])),
        ),
    ] {
        for json in [false, true] {
            let query = if json { "/in.php?json=1" } else { "/in.php" };
            let mut hostile = post(query, content_type, multipart("form-data; name=\"key\""));
            if let Some((name, value)) = extra {
                hostile.headers.push((name, value.to_vec()));
            }
            let answer = send(&h, &hostile).await;
            assert_eq!(answer.status, 200);
            if json {
                let body = answer.json();
                assert_eq!(body["status"], 0);
                assert_eq!(body["request"], "ERROR_BAD_PARAMETERS");
                assert!(body["error_text"].as_str().is_some_and(|t| !t.is_empty()));
            } else {
                assert!(
                    answer.text().starts_with("ERROR_BAD_PARAMETERS"),
                    "{}",
                    answer.text()
                );
            }
        }
    }
    assert_eq!(h.sim.received().len(), before, "nothing went upstream");
    h.stop().await;
}

/// Key a first, key b as backup: every submit tries a first.
async fn a_then_backup_b() -> Harness {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.keys[1].tier = 1;
    Harness::start(sim, config).await
}

#[tokio::test]
async fn a_wrong_key_verdict_on_a_callers_request_does_not_bench_a_key_that_answers_keyrelay() {
    for code in [
        "ERROR_WRONG_USER_KEY",
        "ERROR_KEY_DOES_NOT_EXIST",
        "ERROR_IP_NOT_ALLOWED",
    ] {
        let h = a_then_backup_b().await;
        // The service refuses every submit made with a, but a's own account answers.
        h.sim.add_fault(
            KEY_A,
            fault(FaultTarget::Submit, FaultKind::Code(code.to_owned()), None),
        );
        for _ in 0..5 {
            let id = h.submit().await;
            assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B), "{code}");
        }
        eventually("a's verdict checked", || {
            h.app
                .metrics()
                .key_checks
                .with_label_values(&["refuted"])
                .get()
                == 1
        })
        .await;
        assert_eq!(h.state_of("a"), (StateKind::Active, None), "{code}");
        let metrics = h.metrics().await;
        // One check for five verdicts: a script drawing the verdict cannot multiply reads.
        assert_eq!(
            metric(&metrics, "keyrelay_key_checks_total{result=\"skipped\"}"),
            Some(4.0)
        );
        assert_eq!(
            metric(&metrics, "keyrelay_key_checks_total{result=\"confirmed\"}"),
            Some(0.0)
        );
        let balance_reads = h
            .sim
            .received()
            .iter()
            .filter(|r| {
                r.action.as_deref() == Some("getbalance") && r.key.as_deref() == Some(KEY_A)
            })
            .count();
        assert_eq!(balance_reads, 2, "the startup refresh and one check");
        h.stop().await;
    }
}

#[tokio::test]
async fn a_check_without_an_answer_benches_nothing() {
    let h = a_then_backup_b().await;
    h.sim.add_fault(
        KEY_A,
        fault(
            FaultTarget::Submit,
            FaultKind::Code("ERROR_WRONG_USER_KEY".to_owned()),
            None,
        ),
    );
    // keyrelay's own getbalance (a res.php read) gets a 502.
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Poll, FaultKind::Status(502), None),
    );
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    eventually("a's check ended", || {
        h.app
            .metrics()
            .key_checks
            .with_label_values(&["inconclusive"])
            .get()
            == 1
    })
    .await;
    assert_eq!(h.state_of("a"), (StateKind::Active, None));
    h.stop().await;
}

#[tokio::test]
async fn a_dead_key_is_benched_once_keyrelay_confirms_it() {
    let h = a_then_backup_b().await;
    h.sim.set_state(KEY_A, SimKeyState::Unknown);
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    eventually("a benched", || {
        h.state_of("a") == (StateKind::Benched, Some("ERROR_KEY_DOES_NOT_EXIST"))
    })
    .await;
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_key_checks_total{result=\"confirmed\"}"),
        Some(1.0)
    );
    // Benched keys get no more tasks.
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    h.stop().await;
}
