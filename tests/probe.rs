//! Unknown task ids: what keyrelay answers for an id it has no pin for, what it sends
//! upstream to find the owner, and what it refuses to send at all.

mod common;

use common::*;
use keyrelay::pins::TaskId;

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
        None
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
    while h.sim.task_owner(b).as_deref() != Some(owner.as_str()) {
        b = h.submit().await;
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
    assert_eq!(h.app.pins().len(), 2);
    let snapshot = h.app.snapshot();
    for key in snapshot.pool.keys() {
        assert_eq!(snapshot.pool.load(key).in_use(), 0, "{}", key.name);
    }
    h.stop().await;
}
