//! Shaped polling end to end (`[polling]`, docs/polling.md): polls too soon are answered
//! locally and never reach the service, a final answer is kept and answered again in the
//! caller's format, `ids=` batches are shaped per task, the JSON front is shaped alike, a
//! kept answer is never another token's, and tasks their callers left are polled by keyrelay
//! until their threads come back.
//!
//! No test here waits for time to pass: an interval of an hour makes "not again" certain,
//! a `first` of zero makes "now" certain, and the cadence over time is the unit tests'
//! (`src/polling/tests.rs`), on instants.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::config::{FirstPoll, Polling};
use keyrelay::sim::{SimKey, Simulator};

const HOUR: Duration = Duration::from_secs(3600);

/// Shaping on: the first upstream poll at once (`first = 0s`), the next an hour later.
fn shaped_now() -> Polling {
    Polling {
        interval: HOUR,
        first: FirstPoll::After(Duration::ZERO),
        ..Polling::default()
    }
}

async fn harness(polls_to_ready: u32, polling: Polling) -> Harness {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .polls_to_ready(polls_to_ready)
        .spawn()
        .await
        .expect("simulator binds 127.0.0.1:0");
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.polling = polling;
    Harness::start(sim, config).await
}

/// `res.php` polls of `id` the simulator received.
fn upstream_polls(h: &Harness, id: u64) -> usize {
    let id = id.to_string();
    h.sim
        .received()
        .iter()
        .filter(|r| r.path == "/res.php" && matches!(r.action.as_deref(), Some("get" | "get2")))
        .filter(|r| {
            r.params.iter().any(|(name, value)| match name.as_str() {
                "id" => *value == id,
                "ids" => value.split(',').any(|one| one == id),
                _ => false,
            })
        })
        .count()
}

async fn poll(h: &Harness, id: u64, json: bool) -> Answer {
    let json = if json { "&json=1" } else { "" };
    h.get(&format!(
        "/res.php?key={CALLER_KEY}&action=get&id={id}{json}"
    ))
    .await
}

#[tokio::test]
async fn polls_before_the_first_delay_never_reach_the_service() {
    let polling = Polling {
        first: FirstPoll::After(HOUR),
        ..Polling::default()
    };
    let h = harness(1, polling).await;
    let id = h.submit().await;
    for json in [true, false, true] {
        let answer = poll(&h, id, json).await;
        assert_eq!(answer.status, 200);
        if json {
            assert_eq!(answer.json()["status"], 0, "{}", answer.text());
            assert_eq!(answer.json()["request"], "CAPCHA_NOT_READY");
        } else {
            assert_eq!(answer.text(), "CAPCHA_NOT_READY");
        }
    }
    assert_eq!(upstream_polls(&h, id), 0, "no poll went upstream");
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_polls_total{answered=\"locally\"}"),
        Some(3.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_polls_total{answered=\"upstream\"}"),
        Some(0.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn at_most_one_upstream_poll_per_interval_whatever_the_callers_send() {
    let h = harness(3, shaped_now()).await;
    let id = h.submit().await;
    // The first poll goes upstream (not ready there); the next ten are answered here.
    for _ in 0..11 {
        let answer = poll(&h, id, true).await;
        assert_eq!(answer.json()["request"], "CAPCHA_NOT_READY");
    }
    assert_eq!(upstream_polls(&h, id), 1);
    // Ten more at once, from concurrent callers: still one upstream poll in all.
    let answers = futures_util::future::join_all((0..10).map(|_| poll(&h, id, false))).await;
    assert!(answers.iter().all(|a| a.text() == "CAPCHA_NOT_READY"));
    assert_eq!(upstream_polls(&h, id), 1);
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_polls_total{answered=\"locally\"}"),
        Some(20.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_polls_total{answered=\"upstream\"}"),
        Some(1.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn a_final_answer_is_kept_and_given_again_in_either_format_without_asking() {
    let h = harness(1, shaped_now()).await;
    let id = h.submit().await;
    let first = poll(&h, id, true).await.json();
    assert_eq!(first["status"], 1, "{first}");
    let solution = first["request"].as_str().expect("a solution").to_owned();
    // The thread came back with the final answer.
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_thread_releases_total{reason=\"final\"}"),
        Some(1.0)
    );
    for _ in 0..3 {
        let again = poll(&h, id, true).await.json();
        assert_eq!(
            again, first,
            "the same JSON, byte for byte as the service's"
        );
        let plain = poll(&h, id, false).await;
        assert_eq!(plain.text(), format!("OK|{solution}"));
    }
    assert_eq!(upstream_polls(&h, id), 1, "the service was asked once");
    // Still one release: a kept answer frees nothing again.
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_thread_releases_total{reason=\"final\"}"),
        Some(1.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn an_unsolvable_tasks_code_is_kept_too() {
    let h = harness(1, shaped_now()).await;
    let id = h.submit().await;
    h.sim.make_unsolvable(id);
    for _ in 0..3 {
        assert_eq!(poll(&h, id, false).await.text(), "ERROR_CAPTCHA_UNSOLVABLE");
        let json = poll(&h, id, true).await.json();
        assert_eq!(json["status"], 0);
        assert_eq!(json["request"], "ERROR_CAPTCHA_UNSOLVABLE");
    }
    assert_eq!(upstream_polls(&h, id), 1);
    h.stop().await;
}

#[tokio::test]
async fn ids_batches_are_shaped_per_task() {
    let h = harness(1, shaped_now()).await;
    let (a, b) = (h.submit().await, h.submit().await);
    // `a` alone first: its answer is kept.
    let kept = poll(&h, a, false).await.text();
    let solution_a = kept.strip_prefix("OK|").expect("solved").to_owned();
    // The batch asks the service about `b` only, and answers `a` from what was kept.
    let batch = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&ids={a},{b}"))
        .await
        .text();
    let items: Vec<&str> = batch.split('|').collect();
    assert_eq!(items.len(), 2, "{batch}");
    assert_eq!(items[0], solution_a);
    assert_ne!(items[1], "CAPCHA_NOT_READY", "{batch}");
    assert_eq!(upstream_polls(&h, a), 1);
    assert_eq!(upstream_polls(&h, b), 1);
    // Again: nothing goes upstream, and both answers are the kept ones.
    let again = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&ids={a},{b}"))
        .await
        .text();
    assert_eq!(again, batch);
    assert_eq!(upstream_polls(&h, a) + upstream_polls(&h, b), 2);
    // A single poll of `b` gets the answer the batch kept.
    assert_eq!(poll(&h, b, false).await.text(), format!("OK|{}", items[1]));
    h.stop().await;
}

#[tokio::test]
async fn a_batch_of_tasks_polled_too_soon_answers_not_ready_in_their_slots() {
    let polling = Polling {
        first: FirstPoll::After(HOUR),
        ..Polling::default()
    };
    let h = harness(1, polling).await;
    let (a, b) = (h.submit().await, h.submit().await);
    let batch = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&ids={a},{b},junk&json=1"
        ))
        .await
        .json();
    assert_eq!(
        batch["request"],
        "CAPCHA_NOT_READY|CAPCHA_NOT_READY|ERROR_WRONG_CAPTCHA_ID"
    );
    assert_eq!(upstream_polls(&h, a) + upstream_polls(&h, b), 0);
    h.stop().await;
}

#[tokio::test]
async fn an_interval_of_zero_relays_every_poll() {
    let h = harness(5, Polling::off()).await;
    let id = h.submit().await;
    for n in 1..=4 {
        assert_eq!(poll(&h, id, false).await.text(), "CAPCHA_NOT_READY");
        assert_eq!(upstream_polls(&h, id), n);
    }
    assert!(poll(&h, id, false).await.text().starts_with("OK|"));
    // Nothing kept: the next poll asks again.
    poll(&h, id, false).await;
    assert_eq!(upstream_polls(&h, id), 6);
    h.stop().await;
}

#[tokio::test]
async fn the_json_front_is_shaped_and_answered_from_the_kept_answer() {
    let h = harness(1, shaped_now()).await;
    let created = h
        .post(
            "/createTask",
            "application/json",
            br#"{"clientKey":"any","task":{"type":"RecaptchaV2TaskProxyless","websiteURL":"https://x.test","websiteKey":"site"}}"#.to_vec(),
        )
        .await
        .json();
    assert_eq!(created["errorId"], 0, "{created}");
    let id = created["taskId"].as_u64().expect("a numeric task id");
    let body = format!(r#"{{"clientKey":"any","taskId":{id}}}"#).into_bytes();
    let first = h
        .post("/getTaskResult", "application/json", body.clone())
        .await
        .json();
    assert_eq!(first["status"], "ready", "{first}");
    for _ in 0..3 {
        let again = h
            .post("/getTaskResult", "application/json", body.clone())
            .await
            .json();
        assert_eq!(again["status"], "ready", "{again}");
        assert_eq!(again["solution"], first["solution"]);
    }
    assert_eq!(upstream_polls(&h, id), 1);
    h.stop().await;
}

#[tokio::test]
async fn the_json_front_answers_processing_while_it_is_too_soon() {
    let polling = Polling {
        first: FirstPoll::After(HOUR),
        ..Polling::default()
    };
    let h = harness(1, polling).await;
    let created = h
        .post(
            "/createTask",
            "application/json",
            br#"{"clientKey":"any","task":{"type":"ImageToTextTask","body":"aGVsbG8="}}"#.to_vec(),
        )
        .await
        .json();
    let id = created["taskId"].as_u64().expect("a numeric task id");
    let body = format!(r#"{{"clientKey":"any","taskId":{id}}}"#).into_bytes();
    let answer = h
        .post("/getTaskResult", "application/json", body)
        .await
        .json();
    assert_eq!(
        answer,
        serde_json::json!({"errorId": 0, "status": "processing"})
    );
    assert_eq!(upstream_polls(&h, id), 0);
    h.stop().await;
}

#[tokio::test]
async fn a_kept_answer_is_never_another_tokens() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .polls_to_ready(1)
        .spawn()
        .await
        .expect("simulator binds 127.0.0.1:0");
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.polling = shaped_now();
    config.access.tokens = vec![
        caller_token("alice", "token-alice-0000000000000001"),
        caller_token("bob", "token-bob-00000000000000000002"),
    ];
    let h = Harness::start(sim, config).await;
    let submitted = h
        .get("/in.php?key=token-alice-0000000000000001&method=userrecaptcha&googlekey=s&pageurl=https://x.test&json=1")
        .await
        .json();
    let id = submitted["request"]
        .as_u64()
        .or_else(|| submitted["request"].as_str()?.parse().ok())
        .expect("an id");
    let alice = format!("/res.php?key=token-alice-0000000000000001&action=get&id={id}");
    let bob = format!("/res.php?key=token-bob-00000000000000000002&action=get&id={id}");
    assert!(h.get(&alice).await.text().starts_with("OK|"));
    for _ in 0..2 {
        assert_eq!(h.get(&bob).await.text(), "ERROR_WRONG_CAPTCHA_ID");
        assert!(h.get(&alice).await.text().starts_with("OK|"));
    }
    let batch = h
        .get(&format!(
            "/res.php?key=token-bob-00000000000000000002&action=get&ids={id}"
        ))
        .await
        .text();
    assert_eq!(batch, "ERROR_WRONG_CAPTCHA_ID");
    assert_eq!(upstream_polls(&h, id), 1);
    h.stop().await;
}

#[tokio::test]
async fn a_task_its_caller_left_is_polled_by_keyrelay_and_its_thread_comes_back() {
    let polling = Polling {
        first: FirstPoll::After(Duration::ZERO),
        orphan_after: Duration::from_millis(1),
        ..Polling::default()
    };
    let h = harness(1, polling).await;
    let id = h.submit().await;
    // Nobody polls: keyrelay does, and the final answer frees the thread.
    let mut released = false;
    for _ in 0..200 {
        let metrics = h.metrics().await;
        if metric(&metrics, "keyrelay_thread_releases_total{reason=\"final\"}") == Some(1.0) {
            assert_eq!(metric(&metrics, "keyrelay_orphan_polls_total"), Some(1.0));
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(released, "the orphan was never polled to its end");
    assert_eq!(upstream_polls(&h, id), 1);
    // The caller who comes back gets the kept answer; the service is not asked again.
    assert!(poll(&h, id, false).await.text().starts_with("OK|"));
    assert_eq!(upstream_polls(&h, id), 1);
    h.stop().await;
}

#[tokio::test]
async fn each_solve_is_timed_per_provider_and_method() {
    let h = harness(1, Polling::off()).await;
    for _ in 0..3 {
        let id = h.submit().await;
        assert!(poll(&h, id, false).await.text().starts_with("OK|"));
    }
    let metrics = h.metrics().await;
    let seconds = metric(
        &metrics,
        "keyrelay_solve_seconds{method=\"userrecaptcha\",provider=\"captchaai\"}",
    )
    .expect("the solve time is exported");
    assert!((0.0..60.0).contains(&seconds), "{seconds}");
    assert!(
        !metrics.contains("keyrelay_solve_seconds{method=\"base64\""),
        "no series for a method nobody solved"
    );
    h.stop().await;
}
