//! Operator holds and the admin API end to end, against the simulator: a disabled or
//! draining key takes no new task but its pinned tasks are still polled with it; holds last
//! through refreshes and reloads; `/admin/` lists, holds and refreshes keys, behind its
//! token or on loopback only; `[admin] listen` takes the operator endpoints off the proxy's
//! listeners.

mod common;

use common::{metric, Harness, CALLER_KEY, KEY_A, KEY_B, KEY_C};
use keyrelay::pool::AdminHold;
use keyrelay::reload;

/// Polls a task through keyrelay until its final answer, and returns it.
async fn poll_to_the_end(h: &Harness, id: u64) -> serde_json::Value {
    for _ in 0..100 {
        let json = h
            .get(&format!(
                "/res.php?key={CALLER_KEY}&action=get&id={id}&json=1"
            ))
            .await
            .json();
        if json["request"] != "CAPCHA_NOT_READY" {
            return json;
        }
    }
    panic!("task {id} never finished");
}

/// The names of the keys that served `n` submits, each polled to the end.
async fn serving_keys(h: &Harness, n: usize) -> Vec<String> {
    let mut served = Vec::new();
    for _ in 0..n {
        let id = h.submit().await;
        assert_eq!(poll_to_the_end(h, id).await["status"], 1);
        let owner = h.sim.task_owner(id).expect("the simulator knows the task");
        served.push(owner);
    }
    served
}

fn set(h: &Harness, name: &str, hold: Option<AdminHold>) {
    h.app.set_admin_hold(name, hold).expect("a configured key");
}

// === holds ===

#[tokio::test]
async fn held_keys_take_no_new_tasks_but_their_pinned_tasks_are_still_polled() {
    let h = Harness::three_keys().await;
    // A task on each key, then a, b held: their tasks must still finish with their keys.
    let mut pinned = Vec::new();
    while pinned.len() < 6 {
        pinned.push(h.submit().await);
    }
    set(&h, "a", Some(AdminHold::Disabled));
    set(&h, "b", Some(AdminHold::Draining));
    h.sim.clear_received();
    for id in &pinned {
        let answer = poll_to_the_end(&h, *id).await;
        assert_eq!(answer["status"], 1, "task {id}: {answer}");
    }
    let polled_with: Vec<String> = h
        .sim
        .received()
        .iter()
        .filter(|r| r.action.as_deref() == Some("get"))
        .filter_map(|r| r.key.clone())
        .collect();
    assert!(
        polled_with.iter().any(|k| k == KEY_A),
        "a's tasks polled with a"
    );
    assert!(
        polled_with.iter().any(|k| k == KEY_B),
        "b's tasks polled with b"
    );

    let served = serving_keys(&h, 10).await;
    assert!(served.iter().all(|k| k == KEY_C), "{served:?}");

    // /status and /metrics show the holds; /readyz is still ready with c.
    let status = h.get("/status").await.json();
    let hold_of = |name: &str| {
        status["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == name)
            .map(|k| (k["hold"].clone(), k["in_rotation"].clone()))
            .unwrap()
    };
    assert_eq!(hold_of("a"), ("disabled".into(), false.into()));
    assert_eq!(hold_of("b"), ("draining".into(), false.into()));
    assert_eq!(hold_of("c"), (serde_json::Value::Null, true.into()));
    let metrics = h.metrics().await;
    for (series, value) in [
        (r#"keyrelay_key_admin_hold{hold="disabled",key="a"}"#, 1.0),
        (r#"keyrelay_key_admin_hold{hold="draining",key="a"}"#, 0.0),
        (r#"keyrelay_key_admin_hold{hold="draining",key="b"}"#, 1.0),
        (r#"keyrelay_key_admin_hold{hold="disabled",key="c"}"#, 0.0),
        (r#"keyrelay_key_admin_hold{hold="draining",key="c"}"#, 0.0),
        ("keyrelay_keys_active", 1.0),
    ] {
        assert_eq!(metric(&metrics, series), Some(value), "{series}\n{metrics}");
    }
    let ready = h.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.text());

    // c held too: not ready, and submits are refused as with no key in rotation.
    set(&h, "c", Some(AdminHold::Draining));
    let ready = h.get("/readyz").await;
    assert_eq!(ready.status, 503);
    assert!(
        ready.text().contains("3 held by the operator"),
        "{}",
        ready.text()
    );
    let refused = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=s&pageurl=https://x.test&json=1"
        ))
        .await
        .json();
    assert_eq!(refused["status"], 0, "{refused}");

    // Enabling lifts either hold.
    set(&h, "a", None);
    set(&h, "c", None);
    let served = serving_keys(&h, 12).await;
    assert!(served.iter().any(|k| k == KEY_A), "{served:?}");
    assert!(
        !served.iter().any(|k| k == KEY_B),
        "b still drains: {served:?}"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_disabled_key_is_not_refreshed_and_a_draining_key_is() {
    let h = Harness::three_keys().await;
    set(&h, "a", Some(AdminHold::Disabled));
    set(&h, "b", Some(AdminHold::Draining));
    h.sim.clear_received();
    keyrelay::refresh::refresh_all(&h.app).await;
    let read_with: Vec<String> = h
        .sim
        .received()
        .iter()
        .filter_map(|r| r.key.clone())
        .collect();
    assert!(!read_with.iter().any(|k| k == KEY_A), "{read_with:?}");
    assert!(read_with.iter().any(|k| k == KEY_B), "{read_with:?}");
    assert!(read_with.iter().any(|k| k == KEY_C), "{read_with:?}");
    h.stop().await;
}

#[tokio::test]
async fn holds_last_through_reloads_and_go_with_a_removed_key() {
    let h = Harness::three_keys().await;
    set(&h, "a", Some(AdminHold::Disabled));
    set(&h, "b", Some(AdminHold::Draining));
    assert_eq!(
        h.app.set_admin_hold("nobody", Some(AdminHold::Disabled)),
        Err(keyrelay::app::NoSuchKey)
    );
    // The same keys, with a new weight: both holds stay.
    let mut config = h.app.snapshot().config.clone();
    config.keys[0].weight = 3.0;
    reload::apply(&h.app, config.clone()).unwrap();
    assert_eq!(h.app.admin_hold("a"), Some(AdminHold::Disabled));
    assert_eq!(h.app.admin_hold("b"), Some(AdminHold::Draining));
    // b removed: its hold goes, and a key named b that comes back later is not held.
    let without_b: Vec<_> = config
        .keys
        .iter()
        .filter(|k| k.name != "b")
        .cloned()
        .collect();
    let mut smaller = config.clone();
    smaller.keys = without_b;
    reload::apply(&h.app, smaller).unwrap();
    assert_eq!(h.app.admin_hold("b"), None);
    assert_eq!(
        h.app.set_admin_hold("b", Some(AdminHold::Disabled)),
        Err(keyrelay::app::NoSuchKey),
        "b is not configured now"
    );
    reload::apply(&h.app, config).unwrap();
    assert_eq!(h.app.admin_hold("b"), None);
    assert_eq!(h.app.admin_hold("a"), Some(AdminHold::Disabled));
    let served = serving_keys(&h, 8).await;
    assert!(!served.iter().any(|k| k == KEY_A), "{served:?}");
    h.stop().await;
}
