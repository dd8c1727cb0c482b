//! Unknown task ids: what keyrelay answers for an id it has no pin for, what it sends
//! upstream to find the owner, and what it refuses to send at all.

mod common;

use common::*;
use keyrelay::captcha::TaskId;
use keyrelay::sim::{FaultKind, FaultTarget};

/// Every `res.php` request the simulator saw about a task (not the refresh's account reads).
fn task_requests(h: &Harness) -> Vec<keyrelay::sim::Received> {
    h.sim
        .received()
        .into_iter()
        .filter(|r| {
            r.path == "/res.php"
                && !matches!(r.action.as_deref(), Some("getbalance" | "threadsinfo"))
        })
        .collect()
}

/// The value of a request parameter as the simulator read it (the last one wins).
fn param(r: &keyrelay::sim::Received, name: &str) -> Option<String> {
    r.params
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// Ids no service issues: too long, or outside the id alphabet.
fn not_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "+7", "1,2", "1|2", "a b", "7;", "<b>", "é", "1\u{0}", "../1", "١٢٣", "7%",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    ids.push("9".repeat(65));
    ids.push("a".repeat(65));
    ids.push("7".repeat(4 << 20));
    ids
}

fn form_escape(raw: &str) -> String {
    form_urlencoded::byte_serialize(raw.as_bytes()).collect()
}

#[tokio::test]
async fn ids_that_cannot_be_task_ids_are_answered_without_asking_any_key() {
    let h = Harness::three_keys().await;
    for id in not_ids() {
        for json in [false, true] {
            // In the body: a 4 MiB id does not fit in a request head.
            let body = format!(
                "key={CALLER_KEY}&action=get&id={}{}",
                form_escape(&id),
                if json { "&json=1" } else { "" }
            );
            let answer = h
                .post("/res.php", "application/x-www-form-urlencoded", body)
                .await;
            let shown = &id[..id.len().min(20)];
            assert_eq!(answer.status, 200, "{shown:?}");
            assert!(answer.body.len() < 512, "{shown:?}: the id is not echoed");
            if json {
                let json = answer.json();
                assert_eq!(json["status"], 0, "{shown:?}");
                assert_eq!(json["request"], "ERROR_WRONG_CAPTCHA_ID", "{shown:?}");
                assert!(json["error_text"]
                    .as_str()
                    .unwrap()
                    .contains("not a task id"));
            } else {
                assert_eq!(answer.text(), "ERROR_WRONG_CAPTCHA_ID", "{shown:?}");
            }
        }
    }
    assert_eq!(task_requests(&h).len(), 0, "no key was asked");
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_probes_total{result=\"invalid\"}"),
        Some(2.0 * not_ids().len() as f64)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_probes_total{result=\"not_found\"}"),
        Some(0.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn ids_that_cannot_be_task_ids_keep_their_slot_in_an_ids_list_and_stay_home() {
    let h = Harness::three_keys().await;
    let known = h.submit().await;
    h.sim.clear_received();
    for bad in not_ids()
        .into_iter()
        .filter(|id| id.len() < 100 && !id.contains(','))
    {
        let list = format!("{known},{bad},{known}");
        let body = format!("action=get&json=1&ids={}", form_escape(&list));
        let answer = h
            .post("/res.php", "application/x-www-form-urlencoded", body)
            .await
            .json();
        let items: Vec<&str> = answer["request"].as_str().unwrap().split('|').collect();
        assert_eq!(items.len(), 3, "{bad:?}: {answer}");
        assert_eq!(items[1], "ERROR_WRONG_CAPTCHA_ID", "{bad:?}");
        assert_ne!(items[0], "ERROR_WRONG_CAPTCHA_ID", "{bad:?}");
    }
    for r in task_requests(&h) {
        let ids = param(&r, "ids").unwrap_or_default();
        assert!(
            ids.split(',').all(|id| id == known.to_string()),
            "only the real task went upstream: {ids:?}"
        );
    }
    h.stop().await;
}

#[tokio::test]
async fn leading_zeros_poll_the_real_task_and_release_its_thread() {
    for zeros in ["0", "00", "0000000"] {
        let h = Harness::three_keys().await;
        let id = h.submit().await;
        let owner = h.sim.task_owner(id).unwrap();
        let padded = format!("{zeros}{id}");
        h.sim.clear_received();
        let first = h.get(&format!("/res.php?action=get&id={padded}")).await;
        assert_eq!(first.text(), "CAPCHA_NOT_READY");
        let second = h
            .get(&format!("/res.php?action=get&id={padded}&json=1"))
            .await
            .json();
        assert_eq!(second["request"], format!("tok-{id}"), "{padded}");

        // Both polls went to the owner alone, with the id as the service issued it.
        let seen = task_requests(&h);
        assert_eq!(seen.len(), 2, "{padded}: no probe");
        for r in &seen {
            assert_eq!(r.key.as_deref(), Some(owner.as_str()));
            assert_eq!(param(r, "id"), Some(id.to_string()));
        }
        // One pin, and the final answer gave the task's thread back.
        assert_eq!(h.app.pins().len(), 1, "{padded}: no second pin");
        assert_eq!(
            h.app.pins().owner(
                &TaskId::parse(&padded).unwrap(),
                tokio::time::Instant::now()
            ),
            h.app
                .pins()
                .owner(&TaskId::Num(id), tokio::time::Instant::now()),
        );
        let snapshot = h.app.snapshot();
        for key in snapshot.pool.keys() {
            assert_eq!(
                snapshot.pool.load(key).in_use(),
                0,
                "{padded}: {}",
                key.name
            );
        }
        assert_eq!(
            metric(
                &h.metrics().await,
                "keyrelay_thread_releases_total{reason=\"final\"}"
            ),
            Some(1.0)
        );
        h.stop().await;
    }
}

#[tokio::test]
async fn leading_zeros_in_an_ids_list_poll_the_real_tasks() {
    let h = Harness::three_keys().await;
    let a = h.submit().await;
    let owner = h.sim.task_owner(a).unwrap();
    let mut b = h.submit().await;
    // Every submit pins its task, including those that landed on another key.
    let mut submitted = 2;
    while h.sim.task_owner(b).as_deref() != Some(owner.as_str()) {
        b = h.submit().await;
        submitted += 1;
    }
    h.sim.clear_received();
    let list = format!("0{a},00{b}");
    let first = h.get(&format!("/res.php?action=get&ids={list}")).await;
    assert_eq!(first.text(), "CAPCHA_NOT_READY|CAPCHA_NOT_READY");
    let second = h.get(&format!("/res.php?action=get&ids={list}")).await;
    assert_eq!(second.text(), format!("tok-{a}|tok-{b}"));
    for r in task_requests(&h) {
        assert_eq!(r.key.as_deref(), Some(owner.as_str()));
        assert_eq!(param(&r, "ids"), Some(format!("{a},{b}")));
    }
    assert_eq!(h.app.pins().len(), submitted);
    let snapshot = h.app.snapshot();
    let in_use: u32 = (snapshot.pool.keys().iter())
        .map(|key| snapshot.pool.load(key).in_use())
        .sum();
    // a and b were polled to their end; the other submits' tasks still hold a thread.
    assert_eq!(in_use as usize, submitted - 2);
    h.stop().await;
}

/// Faults that leave a key unable to say whether a task is its own.
fn unsure_faults() -> Vec<(&'static str, FaultKind)> {
    vec![
        ("502", FaultKind::Status(502)),
        ("500", FaultKind::Status(500)),
        ("429", FaultKind::Status(429)),
        ("reset", FaultKind::Reset),
        ("server error", FaultKind::Code("ERROR_SERVER_ERROR".into())),
        ("no key", FaultKind::Code("ERROR_KEY_DOES_NOT_EXIST".into())),
    ]
}

#[tokio::test]
async fn an_owner_that_cannot_answer_a_probe_gets_not_ready_and_is_asked_again() {
    for (name, kind) in unsure_faults() {
        for json in [false, true] {
            let h = Harness::three_keys().await;
            let id = h.submit_past_keyrelay(KEY_B).await;
            h.sim
                .add_fault(KEY_B, fault(FaultTarget::Poll, kind.clone(), Some(1)));
            let flag = if json { "&json=1" } else { "" };
            let first = h.get(&format!("/res.php?action=get&id={id}{flag}")).await;
            assert_eq!(first.status, 200, "{name}");
            if json {
                assert_eq!(first.json()["request"], "CAPCHA_NOT_READY", "{name}");
                assert_eq!(first.json()["status"], 0, "{name}");
            } else {
                assert_eq!(first.text(), "CAPCHA_NOT_READY", "{name}");
            }
            // Not remembered as a miss: the next poll asks again and finds the owner.
            let second = h.get(&format!("/res.php?action=get&id={id}{flag}")).await;
            assert_eq!(second.headers["x-keyrelay-key"], "b", "{name}");
            let metrics = h.metrics().await;
            for (result, value) in [
                ("unsure", Some(1.0)),
                ("found", Some(1.0)),
                ("not_found", Some(0.0)),
                ("remembered", Some(0.0)),
            ] {
                let series = format!("keyrelay_probes_total{{result=\"{result}\"}}");
                assert_eq!(metric(&metrics, &series), value, "{name}: {result}");
            }
            h.stop().await;
        }
    }
}

#[tokio::test]
async fn a_report_the_probe_cannot_place_asks_to_retry_not_to_give_up() {
    for (name, kind) in unsure_faults() {
        let h = Harness::three_keys().await;
        let id = h.submit_past_keyrelay(KEY_B).await;
        h.sim
            .add_fault(KEY_B, fault(FaultTarget::Poll, kind, Some(1)));
        let answer = h
            .get(&format!("/res.php?action=reportbad&id={id}&json=1"))
            .await
            .json();
        assert_eq!(answer["request"], "ERROR_SERVER_ERROR", "{name}");
        h.stop().await;
    }
}

#[tokio::test]
async fn a_timeout_during_a_probe_is_no_verdict_either() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.timeouts.request = std::time::Duration::from_millis(200);
    let h = Harness::start(sim, config).await;
    let id = h.submit_past_keyrelay(KEY_A).await;
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Poll, FaultKind::Hold(gate.clone()), Some(1)),
    );
    let answer = h.get(&format!("/res.php?action=get2&id={id}")).await;
    assert_eq!(answer.text(), "CAPCHA_NOT_READY");
    gate.notify_waiters();
    let again = h.get(&format!("/res.php?action=get2&id={id}")).await;
    assert_eq!(again.headers["x-keyrelay-key"], "a");
    h.stop().await;
}

#[tokio::test]
async fn the_probe_answers_when_the_owner_claims_the_id_not_when_the_slowest_key_does() {
    let h = Harness::three_keys().await;
    let id = h.submit_past_keyrelay(KEY_B).await;
    // a (not the owner) is held for as long as the test runs; b, the owner, until released.
    let slow = std::sync::Arc::new(tokio::sync::Notify::new());
    let owner = std::sync::Arc::new(tokio::sync::Notify::new());
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Poll, FaultKind::Hold(slow.clone()), Some(1)),
    );
    h.sim.add_fault(
        KEY_B,
        fault(FaultTarget::Poll, FaultKind::Hold(owner.clone()), Some(1)),
    );
    let poll = {
        let url = h.url(&format!("/res.php?action=get&id={id}"));
        let client = h.client.clone();
        tokio::spawn(async move {
            let response = client.get(url.parse().unwrap()).await.unwrap();
            let key = response.headers()["x-keyrelay-key"]
                .to_str()
                .unwrap()
                .to_owned();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            (key, String::from_utf8_lossy(&body).into_owned())
        })
    };
    let exchanges = |key: &str| {
        let series =
            format!("keyrelay_upstream_duration_seconds_count{{endpoint=\"res\",key=\"{key}\",provider=\"captchaai\"}}");
        metric(&h.app.render_metrics(), &series)
    };
    // c answers "not mine" at once; a and b are held.
    eventually("every key was asked and c answered", || {
        let asked: Vec<Option<String>> = task_requests(&h).into_iter().map(|r| r.key).collect();
        let all_asked = [KEY_A, KEY_B, KEY_C]
            .iter()
            .all(|k| asked.contains(&Some((*k).to_owned())));
        all_asked && exchanges("c") == Some(1.0)
    })
    .await;
    owner.notify_one();
    let (key, body) = poll.await.unwrap();
    assert_eq!((key.as_str(), body.as_str()), ("b", "CAPCHA_NOT_READY"));
    // a is still held: its exchange never finished, so it was neither timed nor failed.
    assert_eq!(exchanges("b"), Some(1.0));
    assert_eq!(exchanges("a"), None);
    assert!(!h
        .app
        .render_metrics()
        .contains("keyrelay_key_errors_total{code=\"timeout\""));
    // Pinned to b: the next poll goes to b alone, a is not asked again.
    h.sim.clear_received();
    let next = h.get(&format!("/res.php?action=get&id={id}")).await;
    assert_eq!(next.text(), format!("OK|tok-{id}"));
    assert_eq!(task_requests(&h).len(), 1);
    slow.notify_waiters();
    h.stop().await;
}

#[tokio::test]
async fn keys_that_rightly_say_not_mine_are_not_charged_an_error() {
    let h = Harness::three_keys().await;
    let stranger = h.submit_past_keyrelay(KEY_C).await;
    h.get(&format!("/res.php?action=get&id={stranger}")).await;
    h.get("/res.php?action=get&id=123456").await;
    h.get("/res.php?action=reportbad&id=654321").await;
    h.get("/res.php?action=get&ids=777,888&json=1").await;
    let metrics = h.metrics().await;
    assert!(
        !metrics.contains("keyrelay_key_errors_total"),
        "no key error: {metrics}"
    );
    let status = h.get("/status").await.json();
    for key in status["keys"].as_array().unwrap() {
        assert!(
            key["last_error"].is_null(),
            "{}: {}",
            key["name"],
            key["last_error"]
        );
    }
    // A real fault during a probe is still the key's error.
    let id = h.submit_past_keyrelay(KEY_B).await;
    h.sim.add_fault(
        KEY_B,
        fault(FaultTarget::Poll, FaultKind::Status(502), Some(1)),
    );
    h.get(&format!("/res.php?action=get&id={id}")).await;
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_key_errors_total{code=\"http_5xx\",key=\"b\",provider=\"captchaai\"}"
        ),
        Some(1.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn unknown_ids_draw_from_one_budget_whatever_the_pool_size() {
    let all = [KEY_A, KEY_B, KEY_C, KEY_D];
    for size in [1, 2, 4] {
        let keys = &all[..size];
        let sim = sim_with(keys).await;
        let names = ["a", "b", "c", "d"];
        let pool: Vec<(&str, &str, f64)> =
            keys.iter().zip(names).map(|(k, n)| (n, *k, 1.0)).collect();
        let mut config = config_for(&sim, &pool);
        // Sixteen requests, and next to no refill while the test runs.
        config.pins.probe_burst = 16;
        config.pins.probe_rate = 0.001;
        let h = Harness::start(sim, config).await;
        let ids = 100u64;
        for n in 0..ids {
            let flag = if n % 2 == 0 { "&json=1" } else { "" };
            let answer = h
                .get(&format!("/res.php?action=get&id={}{flag}", 5_000_000 + n))
                .await;
            assert_eq!(answer.status, 200);
            let code = if flag.is_empty() {
                answer.text()
            } else {
                answer.json()["request"].as_str().unwrap().to_owned()
            };
            assert!(
                code == "ERROR_WRONG_CAPTCHA_ID" || code == "CAPCHA_NOT_READY",
                "{size} keys: {code}"
            );
        }
        let probes = (16 / size) as u64;
        assert_eq!(
            task_requests(&h).len() as u64,
            probes * size as u64,
            "{size} keys: upstream requests within the burst"
        );
        let metrics = h.metrics().await;
        let count = |result: &str| {
            metric(
                &metrics,
                &format!("keyrelay_probes_total{{result=\"{result}\"}}"),
            )
        };
        assert_eq!(count("not_found"), Some(probes as f64), "{size} keys");
        assert_eq!(count("budget"), Some((ids - probes) as f64), "{size} keys");
        h.stop().await;
    }
}

#[tokio::test]
async fn an_ids_list_probes_each_unknown_id_once_and_the_rest_are_not_ready() {
    let h = Harness::three_keys().await;
    let same = vec!["4242"; 20].join(",");
    let answer = h.get(&format!("/res.php?action=get&ids={same}")).await;
    assert_eq!(answer.text(), vec!["ERROR_WRONG_CAPTCHA_ID"; 20].join("|"));
    assert_eq!(task_requests(&h).len(), 3, "one probe of one id");

    h.sim.clear_received();
    let many: Vec<String> = (0..12).map(|n| (6_000_000 + n).to_string()).collect();
    let answer = h
        .get(&format!(
            "/res.php?action=get&json=1&ids={}",
            many.join(",")
        ))
        .await
        .json();
    let items: Vec<&str> = answer["request"].as_str().unwrap().split('|').collect();
    let limit = 8; // MAX_PROBED_IDS

    assert_eq!(items[..limit], vec!["ERROR_WRONG_CAPTCHA_ID"; limit][..]);
    assert_eq!(items[limit..], vec!["CAPCHA_NOT_READY"; 12 - limit][..]);
    assert_eq!(task_requests(&h).len(), 3 * limit);
    h.stop().await;
}
