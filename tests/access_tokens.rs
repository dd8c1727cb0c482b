//! Caller access tokens end to end (issue 13 §3): with `[[access.tokens]]` configured, a
//! request is served only with a token as its `key` (or as its `Proxy-Authorization: Basic`
//! credential); any other gets `ERROR_WRONG_USER_KEY` in its format, never reaches the
//! upstream, and is counted by reason. A token itself never reaches the upstream, in any
//! spelling or encoding of `key`.

mod common;

use bytes::Bytes;
use common::*;
use hyper::Method;
use keyrelay::config::TokenConfig;

const TOKEN_ONE: &str = "tok1tok1tok1tok1tok1tok1tok1tok1";
const TOKEN_TWO: &str = "tok2-a-token-of-another-length";

async fn with_tokens() -> Harness {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.access.tokens = vec![
        caller_token("one", TOKEN_ONE),
        caller_token("two", TOKEN_TWO),
    ];
    Harness::start(sim, config).await
}

/// (method, path and query, headers, body).
type Case = (Method, String, Vec<(&'static str, String)>, String);

const TASK: &str = "method=userrecaptcha&googlekey=site&pageurl=https://x.test";

fn denied(metrics: &str, reason: &str) -> f64 {
    metric(
        metrics,
        &format!("keyrelay_access_denied_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or_else(|| panic!("no series for {reason}"))
}

#[tokio::test]
async fn a_missing_or_wrong_token_is_refused_in_the_callers_format_and_never_forwarded() {
    let h = with_tokens().await;
    let start = h.metrics().await;
    assert_eq!(denied(&start, "missing"), 0.0, "zero-started");
    assert_eq!(denied(&start, "wrong"), 0.0, "zero-started");
    h.sim.clear_received();

    for (path, json) in [
        (format!("/in.php?{TASK}"), false),
        (format!("/in.php?{TASK}&json=1"), true),
        ("/res.php?action=getbalance".to_owned(), false),
        ("/res.php?action=get&id=1&json=1".to_owned(), true),
        (format!("/in.php?key=&{TASK}"), false),
    ] {
        let answer = h.get(&path).await;
        assert_eq!(answer.status, 200, "{path}");
        if json {
            let body = answer.json();
            assert_eq!(body["status"], 0, "{path}");
            assert_eq!(body["request"], "ERROR_WRONG_USER_KEY", "{path}");
        } else {
            assert_eq!(answer.text(), "ERROR_WRONG_USER_KEY", "{path}");
        }
    }
    for path in [
        format!("/in.php?key={CALLER_KEY}&{TASK}"),
        // A pool key is no token either.
        format!("/in.php?key={KEY_A}&{TASK}"),
        format!("/res.php?key={}&action=getbalance", &TOKEN_ONE[1..]),
        format!("/solve.php?key={TOKEN_ONE}x&{TASK}"),
    ] {
        assert_eq!(h.get(&path).await.text(), "ERROR_WRONG_USER_KEY", "{path}");
    }
    // A token in the query does not save a wrong one in the body: the body's `key` wins.
    let answer = h
        .post(
            &format!("/in.php?key={TOKEN_ONE}"),
            "application/x-www-form-urlencoded",
            format!("key=nope&{TASK}"),
        )
        .await;
    assert_eq!(answer.text(), "ERROR_WRONG_USER_KEY");

    assert!(
        h.sim.received().is_empty(),
        "denied requests reached the upstream: {:?}",
        h.sim.received()
    );
    let end = h.metrics().await;
    assert_eq!(denied(&end, "missing"), 5.0);
    assert_eq!(denied(&end, "wrong"), 5.0);
    assert_eq!(
        metric(
            &end,
            "keyrelay_local_answers_total{code=\"ERROR_WRONG_USER_KEY\"}"
        ),
        Some(10.0)
    );
    assert!(!end.contains(TOKEN_ONE) && !end.contains(TOKEN_TWO));
    h.stop().await;
}

#[tokio::test]
async fn a_token_is_served_with_a_pool_key_and_never_reaches_the_upstream() {
    let h = with_tokens().await;
    h.sim.clear_received();
    let boundary = "----tokenboundary";
    let multipart = |name: &str| {
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{TOKEN_TWO}\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"method\"\r\n\r\nuserrecaptcha\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"googlekey\"\r\n\r\nsite\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"pageurl\"\r\n\r\nhttps://x.test\r\n\
             --{boundary}--\r\n"
        )
    };
    let multipart_type = format!("multipart/form-data; boundary={boundary}");
    let cases: Vec<Case> = vec![
        (Method::GET, format!("/in.php?key={TOKEN_ONE}&{TASK}"), vec![], String::new()),
        (Method::GET, format!("/in.php?k%65y={TOKEN_ONE}&{TASK}"), vec![], String::new()),
        (Method::GET, format!("/in.php?key[]={TOKEN_TWO}&{TASK}"), vec![], String::new()),
        (Method::GET, format!("/in.php?KEY={TOKEN_ONE}&key={TOKEN_TWO}&{TASK}"), vec![], String::new()),
        (
            Method::POST,
            "/in.php".into(),
            vec![("content-type", "application/x-www-form-urlencoded".into())],
            format!("key={TOKEN_ONE}&+key={TOKEN_ONE}&{TASK}"),
        ),
        (
            Method::POST,
            "/in.php".into(),
            vec![("content-type", multipart_type.clone())],
            multipart("key"),
        ),
        (
            Method::POST,
            "/in.php".into(),
            vec![("content-type", "application/json".into())],
            format!("{{\"key\":\"{TOKEN_TWO}\",\"method\":\"userrecaptcha\",\"googlekey\":\"site\",\"pageurl\":\"https://x.test\"}}"),
        ),
        // Forward-proxy style: the script's real key stays, the token is the proxy password.
        (
            Method::GET,
            format!("/in.php?key={CALLER_KEY}&{TASK}"),
            // "user:tok1tok1..."
            vec![("proxy-authorization", "Basic dXNlcjp0b2sxdG9rMXRvazF0b2sxdG9rMXRvazF0b2sxdG9rMQ==".into())],
            String::new(),
        ),
    ];
    for (method, path, headers, body) in &cases {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let answer = h
            .send_with_headers(method.clone(), path, &headers, Bytes::from(body.clone()))
            .await;
        assert!(
            answer.text().starts_with("OK|"),
            "{method} {path} {body:?}: {}",
            answer.text()
        );
    }
    let received = h.sim.received();
    let submits: Vec<_> = received.iter().filter(|r| r.path == "/in.php").collect();
    assert_eq!(submits.len(), cases.len());
    for r in &received {
        for secret in [TOKEN_ONE, TOKEN_TWO, CALLER_KEY, "dG9rMXRvazF0b2sx"] {
            assert!(
                !r.query.contains(secret)
                    && !String::from_utf8_lossy(&r.body).contains(secret)
                    && !r.params.iter().any(|(_, v)| v.contains(secret)),
                "{secret} reached the upstream: {r:?}"
            );
        }
        assert!(
            r.key.as_deref() == Some(KEY_A) || r.key.as_deref() == Some(KEY_B),
            "a pool key: {r:?}"
        );
    }
    let metrics = h.metrics().await;
    assert_eq!(denied(&metrics, "missing") + denied(&metrics, "wrong"), 0.0);
    h.stop().await;
}

#[tokio::test]
async fn without_tokens_any_key_is_served_as_before() {
    let h = Harness::three_keys().await;
    let answer = h.get(&format!("/in.php?{TASK}")).await;
    assert!(answer.text().starts_with("OK|"), "{}", answer.text());
    let metrics = h.metrics().await;
    assert_eq!(denied(&metrics, "missing"), 0.0);
    h.stop().await;
}

// === keys and threads per token ===

fn limited(name: &str, value: &str, keys: &[&str], max_threads: Option<u32>) -> TokenConfig {
    TokenConfig {
        keys: Some(keys.iter().map(|k| (*k).to_owned()).collect()),
        max_threads,
        ..caller_token(name, value)
    }
}

fn key_header(answer: &Answer) -> String {
    answer
        .headers
        .get("x-keyrelay-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Polls `id` with `token` until its final answer.
async fn poll_to_the_end(h: &Harness, token: &str, id: &str) -> String {
    for _ in 0..100 {
        let answer = h
            .get(&format!("/res.php?key={token}&action=get&id={id}"))
            .await;
        if answer.text() != "CAPCHA_NOT_READY" {
            return answer.text();
        }
    }
    panic!("task {id} never finished");
}

fn task_id(answer: &Answer) -> String {
    answer
        .text()
        .strip_prefix("OK|")
        .unwrap_or_else(|| panic!("not accepted: {}", answer.text()))
        .to_owned()
}

#[tokio::test]
async fn a_tokens_submits_go_only_to_its_keys_and_none_left_is_the_no_key_answer() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.access.tokens = vec![
        limited("one", TOKEN_ONE, &["b"], None),
        caller_token("two", TOKEN_TWO),
    ];
    let h = Harness::start(sim, config).await;
    // b has 5 threads.
    for _ in 0..5 {
        let answer = h.get(&format!("/in.php?key={TOKEN_ONE}&{TASK}")).await;
        task_id(&answer);
        assert_eq!(key_header(&answer), "b");
    }
    // b leaves rotation: token one has no key left, and nothing goes upstream for it.
    let b = h.app.snapshot().pool.keys()[1].clone();
    assert_eq!(b.name, "b");
    h.app.record_health(
        &b,
        keyrelay::health::HealthEvent::Bench {
            reason: keyrelay::health::Reason::of_code("ERROR_KEY_DOES_NOT_EXIST"),
        },
    );
    h.sim.clear_received();
    let answer = h
        .get(&format!("/in.php?key={TOKEN_ONE}&{TASK}&json=1"))
        .await;
    assert_eq!(
        answer.json()["request"],
        "ERROR_ZERO_BALANCE",
        "{}",
        answer.text()
    );
    assert!(h.sim.received().is_empty(), "{:?}", h.sim.received());
    // Token two may use any key: a serves it.
    let answer = h.get(&format!("/in.php?key={TOKEN_TWO}&{TASK}")).await;
    task_id(&answer);
    assert_eq!(key_header(&answer), "a");
    let metrics = h.metrics().await;
    let series = |token: &str, outcome: &str| {
        metric(
            &metrics,
            &format!("keyrelay_token_submits_total{{outcome=\"{outcome}\",token=\"{token}\"}}"),
        )
    };
    assert_eq!(series("one", "ok"), Some(5.0));
    assert_eq!(series("one", "no_key"), Some(1.0));
    assert_eq!(series("two", "ok"), Some(1.0));
    assert_eq!(series("two", "full"), Some(0.0), "zero-started");
    h.stop().await;
}

#[tokio::test]
async fn max_threads_caps_a_tokens_tasks_across_keys_until_they_end() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.access.tokens = vec![
        TokenConfig {
            max_threads: Some(2),
            max_tunnels: keyrelay::config::DEFAULT_MAX_TUNNELS,
            ..caller_token("capped", TOKEN_ONE)
        },
        caller_token("free", TOKEN_TWO),
    ];
    // Queue off: a submit over the cap is refused at once, as by a full pool.
    config.capacity.queue_timeout = std::time::Duration::ZERO;
    let h = Harness::start(sim, config).await;
    let submit = |token: &'static str| {
        let path = format!("/in.php?key={token}&{TASK}");
        let h = &h;
        async move { h.get(&path).await }
    };
    let first = task_id(&submit(TOKEN_ONE).await);
    let _second = task_id(&submit(TOKEN_ONE).await);
    let threads = |metrics: &str, token: &str| {
        metric(
            metrics,
            &format!("keyrelay_token_threads_in_use{{token=\"{token}\"}}"),
        )
    };
    assert_eq!(threads(&h.metrics().await, "capped"), Some(2.0));
    h.sim.clear_received();
    assert_eq!(submit(TOKEN_ONE).await.text(), "ERROR_ZERO_BALANCE");
    assert!(h.sim.received().is_empty(), "over the cap: not sent");
    // Another token has the pool's threads to itself.
    task_id(&submit(TOKEN_TWO).await);
    // A task's final answer gives its thread back.
    assert!(poll_to_the_end(&h, TOKEN_ONE, &first)
        .await
        .starts_with("OK|"));
    let metrics = h.metrics().await;
    assert_eq!(threads(&metrics, "capped"), Some(1.0));
    assert_eq!(threads(&metrics, "free"), Some(1.0));
    task_id(&submit(TOKEN_ONE).await);
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_token_submits_total{outcome=\"full\",token=\"capped\"}"
        ),
        Some(1.0)
    );
    assert!(!metrics.contains(TOKEN_ONE));
    h.stop().await;
}

#[tokio::test]
async fn a_submit_over_the_cap_waits_in_the_queue_when_it_is_on() {
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.access.tokens = vec![TokenConfig {
        max_threads: Some(1),
        max_tunnels: keyrelay::config::DEFAULT_MAX_TUNNELS,
        ..caller_token("capped", TOKEN_ONE)
    }];
    config.capacity.queue_timeout = std::time::Duration::from_secs(60);
    let h = std::sync::Arc::new(Harness::start(sim, config).await);
    let first = task_id(&h.get(&format!("/in.php?key={TOKEN_ONE}&{TASK}")).await);
    let waiting = tokio::spawn({
        let h = h.clone();
        async move { h.get(&format!("/in.php?key={TOKEN_ONE}&{TASK}")).await }
    });
    let sim = h.sim.clone();
    eventually("the first task is polled", || {
        sim.received()
            .iter()
            .filter(|r| r.path == "/in.php")
            .count()
            == 1
    })
    .await;
    assert!(poll_to_the_end(&h, TOKEN_ONE, &first)
        .await
        .starts_with("OK|"));
    let answer = waiting.await.unwrap();
    task_id(&answer);
    assert_eq!(
        h.sim
            .received()
            .iter()
            .filter(|r| r.path == "/in.php")
            .count(),
        2
    );
}

// === task ownership ===

#[tokio::test]
async fn a_task_is_pollable_and_reportable_only_with_the_token_that_created_it() {
    let h = with_tokens().await;
    let mine = task_id(&h.get(&format!("/in.php?key={TOKEN_ONE}&{TASK}")).await);
    let theirs = task_id(&h.get(&format!("/in.php?key={TOKEN_TWO}&{TASK}")).await);
    h.sim.clear_received();
    for action in ["get", "get2", "reportbad", "reportgood"] {
        let answer = h
            .get(&format!(
                "/res.php?key={TOKEN_TWO}&action={action}&id={mine}"
            ))
            .await;
        assert_eq!(answer.text(), "ERROR_WRONG_CAPTCHA_ID", "{action}");
        let json = h
            .get(&format!(
                "/res.php?key={TOKEN_TWO}&action={action}&id={mine}&json=1"
            ))
            .await
            .json();
        assert_eq!(json["request"], "ERROR_WRONG_CAPTCHA_ID", "{action}");
    }
    assert!(
        h.sim.received().is_empty(),
        "another token's task was neither polled nor probed: {:?}",
        h.sim.received()
    );
    // `ids=` answers only the caller's own tasks, slot by slot.
    let answer = h
        .get(&format!(
            "/res.php?key={TOKEN_ONE}&action=get&ids={mine},{theirs}"
        ))
        .await;
    let items: Vec<String> = answer.text().split('|').map(str::to_owned).collect();
    assert_eq!(items.len(), 2, "{}", answer.text());
    assert_ne!(items[0], "ERROR_WRONG_CAPTCHA_ID", "{}", answer.text());
    assert_eq!(items[1], "ERROR_WRONG_CAPTCHA_ID", "{}", answer.text());
    assert!(
        h.sim
            .received()
            .iter()
            .all(|r| !r.query.contains(&theirs)
                && !String::from_utf8_lossy(&r.body).contains(&theirs))
    );
    // The owner polls it to the end.
    assert!(poll_to_the_end(&h, TOKEN_ONE, &mine)
        .await
        .starts_with("OK|"));
    assert!(poll_to_the_end(&h, TOKEN_TWO, &theirs)
        .await
        .starts_with("OK|"));
    h.stop().await;
}

#[tokio::test]
async fn an_unpinned_task_is_never_probed_for_nor_handed_to_a_token() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.access.tokens = vec![
        limited("only-b", TOKEN_ONE, &["b"], None),
        caller_token("any", TOKEN_TWO),
    ];
    let h = Harness::start(sim, config).await;
    // A task keyrelay never saw, on key a: no token created it, so whose it is cannot be
    // known, and a probe would hand it to whichever token asked first.
    let outside = h.submit_past_keyrelay(KEY_A).await;
    h.sim.clear_received();
    for token in [TOKEN_ONE, TOKEN_TWO, TOKEN_ONE] {
        for action in ["get", "get2", "reportbad"] {
            let answer = h
                .get(&format!(
                    "/res.php?key={token}&action={action}&id={outside}"
                ))
                .await;
            assert_eq!(answer.text(), "ERROR_WRONG_CAPTCHA_ID", "{action}");
        }
        let answer = h
            .get(&format!(
                "/res.php?key={token}&action=get&ids={outside},{outside}&json=1"
            ))
            .await;
        assert_eq!(
            answer.json()["request"],
            "ERROR_WRONG_CAPTCHA_ID|ERROR_WRONG_CAPTCHA_ID"
        );
    }
    assert!(
        h.sim.received().is_empty(),
        "no key was asked on a token's behalf: {:?}",
        h.sim.received().len()
    );
    h.stop().await;
}

#[tokio::test]
async fn getbalance_and_threadsinfo_answer_for_the_tokens_keys() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    sim.set_balance(KEY_B, 2.5);
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.access.tokens = vec![
        limited("only-b", TOKEN_ONE, &["b"], None),
        caller_token("any", TOKEN_TWO),
    ];
    let h = Harness::start(sim, config).await;
    let balance = |token: &'static str| {
        let h = &h;
        async move {
            h.get(&format!("/res.php?key={token}&action=getbalance"))
                .await
                .text()
        }
    };
    assert_eq!(balance(TOKEN_ONE).await, "2.5");
    assert_eq!(balance(TOKEN_TWO).await, "12.5");
    let threads = |token: &'static str| {
        let h = &h;
        async move {
            h.get(&format!("/res.php?key={token}&action=threadsinfo"))
                .await
                .json()["threads"]
                .as_u64()
        }
    };
    assert_eq!(threads(TOKEN_ONE).await, Some(5));
    assert_eq!(threads(TOKEN_TWO).await, Some(10));
    h.stop().await;
}

// === rate-limiting guessers ===

#[tokio::test]
async fn parallel_wrong_tokens_from_one_address_are_checked_at_five_a_second() {
    let h = with_tokens().await;
    let started = std::time::Instant::now();
    let guesses = (0..200).map(|n| {
        let h = &h;
        async move { h.get(&format!("/in.php?key=guess-{n}&{TASK}")).await.text() }
    });
    let answers = futures_util::future::join_all(guesses).await;
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        answers.iter().all(|a| a == "ERROR_WRONG_USER_KEY"),
        "{answers:?}"
    );
    let metrics = h.metrics().await;
    let checked = metric(&metrics, "keyrelay_access_denied_total{reason=\"wrong\"}").unwrap();
    let limited = metric(
        &metrics,
        "keyrelay_access_denied_total{reason=\"rate_limited\"}",
    )
    .unwrap();
    // A burst of 10, then 5 a second: parallel guessing gains nothing.
    assert!(checked >= 10.0, "{checked}");
    assert!(
        checked <= 10.0 + 5.0 * elapsed + 1.0,
        "{checked} in {elapsed} s"
    );
    assert_eq!(checked + limited, 200.0);
    // (That a valid token from an address over its limit is refused the same way is
    // proxy::access's unit test, on paused time.) Nothing went upstream, and once the
    // bucket refills the valid token is served.
    let right = format!("/in.php?key={TOKEN_ONE}&{TASK}");
    assert_eq!(
        h.sim
            .received()
            .iter()
            .filter(|r| r.path == "/in.php")
            .count(),
        0
    );
    let mut served = None;
    for _ in 0..100 {
        let answer = h.get(&right).await.text();
        if answer.starts_with("OK|") {
            served = Some(answer);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(served.is_some(), "the valid token was never served again");
    h.stop().await;
}

// === reload ===

#[tokio::test]
async fn a_reload_that_changes_tokens_takes_effect_at_once_and_a_kept_name_keeps_its_tasks() {
    let h = with_tokens().await;
    let task = task_id(&h.get(&format!("/in.php?key={TOKEN_ONE}&{TASK}")).await);
    // Token "one" gets a new value; "two" is removed; "three" is new.
    let mut config = h.app.snapshot().config.clone();
    let renewed = "tok1-renewed-renewed-renewed-123";
    config.access.tokens = vec![
        caller_token("one", renewed),
        caller_token("three", "tok3tok3tok3"),
    ];
    keyrelay::reload::apply(&h.app, config).expect("applies");
    for old in [TOKEN_ONE, TOKEN_TWO] {
        assert_eq!(
            h.get(&format!("/in.php?key={old}&{TASK}")).await.text(),
            "ERROR_WRONG_USER_KEY"
        );
    }
    task_id(&h.get(&format!("/in.php?key=tok3tok3tok3&{TASK}")).await);
    // The task "one" made before the reload is still its own, under its new value...
    assert!(poll_to_the_end(&h, renewed, &task).await.starts_with("OK|"));
    // ...and not the new token's.
    assert_eq!(
        h.get(&format!("/res.php?key=tok3tok3tok3&action=get&id={task}"))
            .await
            .text(),
        "ERROR_WRONG_CAPTCHA_ID"
    );
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_token_submits_total{outcome=\"ok\",token=\"three\"}"
        ),
        Some(1.0)
    );
    h.stop().await;
}

// === forward proxy ===

#[tokio::test]
async fn an_absolute_form_request_may_carry_its_token_as_the_proxy_password() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = with_tokens().await;
    h.sim.clear_received();
    let send = |credential: &'static str| {
        let addr = h.addr;
        async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "GET http://ocr.captchaai.com/in.php?key={CALLER_KEY}&{TASK} HTTP/1.1\r\n\
                 Host: ocr.captchaai.com\r\nProxy-Authorization: {credential}\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                stream.read_to_end(&mut answer),
            )
            .await
            .expect("an answer within 10 s")
            .unwrap();
            String::from_utf8_lossy(&answer).into_owned()
        }
    };
    // "anyone:tok1tok1...": the script's real key stays in its request.
    let served = send("Basic YW55b25lOnRvazF0b2sxdG9rMXRvazF0b2sxdG9rMXRvazF0b2sx").await;
    assert!(served.contains("\r\n\r\nOK|"), "{served}");
    // "anyone:wrong".
    let refused = send("Basic YW55b25lOndyb25n").await;
    assert!(refused.ends_with("ERROR_WRONG_USER_KEY"), "{refused}");
    let received = h.sim.received();
    assert_eq!(received.len(), 1, "{received:?}");
    let key = received[0].key.as_deref();
    assert!(
        key == Some(KEY_A) || key == Some(KEY_B),
        "a pool key: {key:?}"
    );
    h.stop().await;
}
