//! Task pinning: polls and reports go out with the key that created the task, `ids=` lists
//! are split per key and re-joined in the caller's order, and unknown ids are refused.

mod common;

use common::*;
use keyrelay::health::StateKind;
use keyrelay::sim::{FaultKind, FaultTarget};

fn polls_by(h: &Harness) -> Vec<(String, String)> {
    h.sim
        .received()
        .into_iter()
        .filter(|r| {
            r.path == "/res.php"
                && r.action.as_deref() != Some("getbalance")
                && r.action.as_deref() != Some("threadsinfo")
        })
        .map(|r| (r.action.unwrap_or_default(), r.key.unwrap_or_default()))
        .collect()
}

/// Submits until every key of the three-key pool owns at least one task; returns the ids
/// with their owning key.
async fn tasks_on_every_key(h: &Harness) -> Vec<(u64, String)> {
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let id = h.submit().await;
        tasks.push((id, h.sim.task_owner(id).expect("sim knows the task")));
        let mut owners: Vec<&String> = tasks.iter().map(|(_, k)| k).collect();
        owners.sort();
        owners.dedup();
        if owners.len() == 3 {
            return tasks;
        }
    }
    panic!("200 weighted picks never reached all three keys");
}

#[tokio::test]
async fn every_poll_and_report_uses_the_creating_key() {
    let h = Harness::three_keys().await;
    let tasks = tasks_on_every_key(&h).await;
    for (id, owner) in &tasks {
        for action in ["get", "get2", "reportgood", "reportbad"] {
            let answer = h
                .get(&format!(
                    "/res.php?key={CALLER_KEY}&action={action}&id={id}&json=1"
                ))
                .await;
            assert_eq!(answer.status, 200);
            let json = answer.json();
            assert_ne!(
                json["request"], "ERROR_WRONG_CAPTCHA_ID",
                "{action} {id}: {json}"
            );
            let (seen_action, seen_key) = polls_by(&h).pop().unwrap();
            assert_eq!((seen_action.as_str(), &seen_key), (action, owner));
        }
    }
    h.stop().await;
}

#[tokio::test]
async fn a_task_is_polled_to_its_answer_in_both_formats() {
    let h = Harness::three_keys().await;
    let id = h.submit().await;
    let first = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&id={id}"))
        .await;
    assert_eq!(first.text(), "CAPCHA_NOT_READY");
    let second = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&id={id}"))
        .await;
    assert_eq!(second.text(), format!("OK|tok-{id}"));
    let json = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&id={id}&json=1"
        ))
        .await
        .json();
    assert_eq!(json["status"], 1);
    assert_eq!(json["request"], format!("tok-{id}"));
    h.stop().await;
}

#[tokio::test]
async fn a_benched_key_still_serves_its_pinned_tasks() {
    let h = Harness::three_keys().await;
    let id = h.submit().await;
    let owner = h.sim.task_owner(id).unwrap();
    let name = h
        .app
        .snapshot()
        .pool
        .keys()
        .iter()
        .find(|k| k.key.expose() == owner)
        .cloned()
        .unwrap();
    h.app.record_health(
        &name,
        keyrelay::health::HealthEvent::Bench {
            reason: keyrelay::health::Reason::of_code("ERROR_KEY_DOES_NOT_EXIST"),
        },
    );
    assert_eq!(
        h.app
            .health()
            .view(name.id, tokio::time::Instant::now())
            .state,
        StateKind::Benched
    );
    h.get(&format!("/res.php?key={CALLER_KEY}&action=get&id={id}"))
        .await;
    let answer = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&id={id}"))
        .await;
    assert_eq!(answer.text(), format!("OK|tok-{id}"));
    assert_eq!(polls_by(&h).last().unwrap().1, owner);
    h.stop().await;
}

#[tokio::test]
async fn ids_lists_are_split_per_key_and_rejoined_in_the_callers_order() {
    let h = Harness::three_keys().await;
    let tasks = tasks_on_every_key(&h).await;
    // Make every task ready (polls_to_ready is 2) except the first, which stays not ready.
    for (id, _) in tasks.iter().skip(1) {
        h.get(&format!("/res.php?action=get&id={id}")).await;
    }
    let unknown = 999_999_999u64;
    let mut ids: Vec<u64> = tasks.iter().map(|(id, _)| *id).collect();
    ids.insert(1, unknown);
    ids.reverse();
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");

    let expected: Vec<String> = ids
        .iter()
        .map(|id| {
            if *id == unknown {
                "ERROR_WRONG_CAPTCHA_ID".to_owned()
            } else if *id == tasks[0].0 {
                // This is its first poll: not ready yet.
                "CAPCHA_NOT_READY".to_owned()
            } else {
                format!("tok-{id}")
            }
        })
        .collect();
    let plain = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&ids={list}"))
        .await;
    assert_eq!(plain.text(), expected.join("|"));

    let json = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&ids={list}&json=1"
        ))
        .await
        .json();
    assert_eq!(json["status"], 1);
    let items: Vec<&str> = json["request"].as_str().unwrap().split('|').collect();
    assert_eq!(items.len(), ids.len());
    assert_eq!(
        items[ids.iter().position(|i| *i == unknown).unwrap()],
        "ERROR_WRONG_CAPTCHA_ID"
    );
    // Each key received only its own ids.
    for r in
        h.sim.received().iter().filter(|r| {
            r.action.as_deref() == Some("get") && r.params.iter().any(|(k, _)| k == "ids")
        })
    {
        let key = r.key.clone().unwrap();
        let sent = &r.params.iter().rev().find(|(k, _)| k == "ids").unwrap().1;
        for id in sent.split(',') {
            let id: u64 = id.parse().unwrap();
            // An unknown id is probed on every key; a known one goes to its key alone.
            if let Some(owner) = h.sim.task_owner(id) {
                assert_eq!(owner, key);
            }
        }
    }
    h.stop().await;
}

#[tokio::test]
async fn ids_of_one_key_pass_through_verbatim() {
    let h = Harness::three_keys().await;
    let a = h.submit().await;
    let owner = h.sim.task_owner(a).unwrap();
    let mut b = h.submit().await;
    while h.sim.task_owner(b).as_deref() != Some(owner.as_str()) {
        b = h.submit().await;
    }
    let answer = h.get(&format!("/res.php?action=get&ids={a},{b}")).await;
    assert_eq!(answer.text(), "CAPCHA_NOT_READY|CAPCHA_NOT_READY");
    h.stop().await;
}

#[tokio::test]
async fn unknown_ids_get_wrong_captcha_id_in_the_callers_format() {
    let h = Harness::three_keys().await;
    let plain = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&id=123456"))
        .await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.text(), "ERROR_WRONG_CAPTCHA_ID");
    let json = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&id=123456&json=1"
        ))
        .await
        .json();
    assert_eq!(json["status"], 0);
    assert_eq!(json["request"], "ERROR_WRONG_CAPTCHA_ID");
    assert!(json["error_text"].as_str().unwrap().contains("123456"));
    let missing = h.get("/res.php?action=get&json=1").await.json();
    assert_eq!(missing["request"], "ERROR_WRONG_CAPTCHA_ID");
    // The first poll asked each key once; the repeat within the hold asked nobody.
    let mut asked: Vec<String> = polls_by(&h).into_iter().map(|(_, k)| k).collect();
    asked.sort();
    assert_eq!(asked, vec![KEY_A, KEY_B, KEY_C]);
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_probes_total{result=\"not_found\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_probes_total{result=\"remembered\"}"),
        Some(1.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn a_task_keyrelay_never_saw_is_found_on_its_key_and_pinned() {
    let h = Harness::three_keys().await;
    // Submitted past keyrelay, with key b: no pin exists.
    let id = h.submit_past_keyrelay(KEY_B).await;
    let first = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&id={id}"))
        .await;
    assert_eq!(first.text(), "CAPCHA_NOT_READY", "the owner's own answer");
    assert_eq!(first.headers["x-keyrelay-key"], "b");
    // Now pinned: the next poll goes to b alone.
    h.sim.clear_received();
    let second = h.get(&format!("/res.php?action=get&id={id}")).await;
    assert_eq!(second.text(), format!("OK|tok-{id}"));
    assert_eq!(polls_by(&h), vec![("get".to_owned(), KEY_B.to_owned())]);
    assert_eq!(
        metric(
            &h.metrics().await,
            "keyrelay_probes_total{result=\"found\"}"
        ),
        Some(1.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn a_poll_the_upstream_cannot_answer_reads_as_not_ready() {
    let h = Harness::three_keys().await;
    let id = h.submit().await;
    let owner = h.sim.task_owner(id).unwrap();
    h.sim.add_fault(
        &owner,
        fault(FaultTarget::Poll, FaultKind::Status(502), None),
    );
    let json = h
        .get(&format!("/res.php?action=get&id={id}&json=1"))
        .await
        .json();
    assert_eq!(json["status"], 0);
    assert_eq!(json["request"], "CAPCHA_NOT_READY");
    // Polls never move to another key.
    assert!(polls_by(&h).iter().all(|(_, k)| *k == owner));
    assert_eq!(
        polls_by(&h).len(),
        3,
        "retried up to max_attempts on the same key"
    );
    h.sim.clear_faults();
    let json = h
        .get(&format!("/res.php?action=get&id={id}&json=1"))
        .await
        .json();
    assert_ne!(json["request"], "ERROR_WRONG_CAPTCHA_ID");
    h.stop().await;
}

#[tokio::test]
async fn pins_expire_after_their_ttl() {
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.pins.ttl = std::time::Duration::from_millis(300);
    let h = Harness::start(sim, config).await;
    let id = h.submit().await;
    let before = h.get(&format!("/res.php?action=get&id={id}")).await;
    assert_eq!(before.text(), "CAPCHA_NOT_READY");
    eventually("pin expired", || {
        h.app
            .pins()
            .owner(
                &keyrelay::captcha::TaskId::Num(id),
                tokio::time::Instant::now(),
            )
            .is_none()
    })
    .await;
    // The expired pin is gone, and the probe finds the task on its key again.
    let after = h.get(&format!("/res.php?action=get&id={id}")).await;
    assert_eq!(after.text(), format!("OK|tok-{id}"));
    assert_eq!(
        metric(
            &h.metrics().await,
            "keyrelay_probes_total{result=\"found\"}"
        ),
        Some(1.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn unsolvable_answers_pass_through() {
    let h = Harness::three_keys().await;
    let id = h.submit().await;
    h.sim.make_unsolvable(id);
    let answer = h.get(&format!("/res.php?action=get&id={id}")).await;
    assert_eq!(answer.text(), "ERROR_CAPTCHA_UNSOLVABLE");
    h.stop().await;
}

#[tokio::test]
async fn a_rate_limited_poll_reads_as_not_ready_not_as_http_429() {
    let h = Harness::three_keys().await;
    let id = h.submit().await;
    let owner = h.sim.task_owner(id).unwrap();
    h.sim.add_fault(
        &owner,
        fault(FaultTarget::Poll, FaultKind::Status(429), Some(1)),
    );
    let answer = h.get(&format!("/res.php?action=get&id={id}")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.text(), "CAPCHA_NOT_READY");
    h.stop().await;
}

#[tokio::test]
async fn unknown_ids_in_an_ids_list_are_found_too() {
    let h = Harness::three_keys().await;
    let known = h.submit().await;
    let stranger = h.submit_past_keyrelay(KEY_C).await;
    let answer = h
        .get(&format!(
            "/res.php?action=get&ids={known},{stranger},5&json=1"
        ))
        .await
        .json();
    let items: Vec<&str> = answer["request"].as_str().unwrap().split('|').collect();
    assert_eq!(items[0], "CAPCHA_NOT_READY");
    assert_ne!(
        items[1], "ERROR_WRONG_CAPTCHA_ID",
        "found on key c: {items:?}"
    );
    assert_eq!(items[2], "ERROR_WRONG_CAPTCHA_ID");
    // Pinned now: a single poll goes straight to c.
    h.sim.clear_received();
    h.get(&format!("/res.php?action=get&id={stranger}")).await;
    assert_eq!(polls_by(&h), vec![("get".to_owned(), KEY_C.to_owned())]);
    h.stop().await;
}
