//! Account actions (`getbalance`, `threadsinfo`, pingbacks) and the background refresh that
//! keeps balances fresh and brings benched keys back.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::health::StateKind;
use keyrelay::sim::{FaultKind, FaultTarget, SimKey, SimKeyState, Simulator};

#[tokio::test]
async fn getbalance_answers_the_total_of_keys_in_rotation() {
    let sim = Simulator::new()
        .key(SimKey {
            balance: 2.5,
            ..SimKey::valid(KEY_A)
        })
        .key(SimKey {
            balance: 4.25,
            ..SimKey::valid(KEY_B)
        })
        .key(SimKey {
            balance: 100.0,
            state: SimKeyState::Unknown,
            ..SimKey::valid(KEY_C)
        })
        .spawn()
        .await
        .unwrap();
    let config = config_for(
        &sim,
        &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
    );
    let h = Harness::start(sim, config).await;
    assert_eq!(
        h.get(&format!("/res.php?key={CALLER_KEY}&action=getbalance"))
            .await
            .text(),
        "6.75"
    );
    let json = h.get("/res.php?action=getbalance&json=1").await.json();
    assert_eq!(json, serde_json::json!({"status": 1, "request": "6.75"}));
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_key_balance{key=\"a\"}"),
        Some(2.5)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_key_balance{key=\"c\"}"),
        None,
        "unknown, not zero"
    );
    h.stop().await;
}

#[tokio::test]
async fn threadsinfo_answers_pool_totals() {
    let sim = Simulator::new()
        .key(SimKey {
            threads: 5,
            ..SimKey::valid(KEY_A)
        })
        .key(SimKey {
            threads: 15,
            ..SimKey::valid(KEY_B)
        })
        .spawn()
        .await
        .unwrap();
    let config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    let h = Harness::start(sim, config).await;
    let answer = h
        .post(
            "/res.php",
            "application/x-www-form-urlencoded",
            format!("key={CALLER_KEY}&action=threadsinfo&json=1"),
        )
        .await;
    assert_eq!(
        answer.text(),
        r#"{"status":1,"threads":20,"working_threads":0,"free_threads":20}"#
    );
    let json = answer.json();
    assert_eq!(json["threads"], 20);
    assert_eq!(json["working_threads"], 0);
    assert_eq!(json["free_threads"], 20);
    h.stop().await;
}

#[tokio::test]
async fn pingback_actions_go_to_every_key() {
    let h = Harness::three_keys().await;
    let answer = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=add_pingback&addr=http://hook.test/cb"
        ))
        .await;
    assert_eq!(answer.text(), "OK");
    let listed = h.get("/res.php?action=get_pingback").await;
    assert_eq!(listed.text(), "OK|http://hook.test/cb");
    let adds: Vec<String> = h
        .sim
        .received()
        .into_iter()
        .filter(|r| r.action.as_deref() == Some("add_pingback"))
        .map(|r| r.key.unwrap())
        .collect();
    let mut sorted = adds.clone();
    sorted.sort();
    assert_eq!(sorted, vec![KEY_A, KEY_B, KEY_C]);
    h.stop().await;
}

#[tokio::test]
async fn the_refresh_brings_a_benched_key_back_once_it_is_usable() {
    let sim = Simulator::new()
        .key(SimKey {
            state: SimKeyState::Unknown,
            ..SimKey::valid(KEY_A)
        })
        .key(SimKey::valid(KEY_B))
        .spawn()
        .await
        .unwrap();
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.refresh_interval = Duration::from_millis(100);
    let h = Harness::start(sim, config).await;
    assert_eq!(h.state_of("a").0, StateKind::Benched);
    h.sim.set_state(KEY_A, SimKeyState::Valid);
    eventually("a restored by the refresh", || {
        h.state_of("a").0 == StateKind::Active
    })
    .await;
    assert_eq!(
        metric(&h.metrics().await, "keyrelay_keys_active"),
        Some(2.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn a_failed_refresh_makes_the_balance_unknown_not_zero() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.refresh_interval = Duration::from_millis(100);
    let h = Harness::start(sim, config).await;
    let key_a = h.app.snapshot().pool.keys()[0].clone();
    assert_eq!(key_a.stats.balance(), Some(10.0));
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Poll, FaultKind::Status(500), None),
    );
    eventually("balance unknown", || key_a.stats.balance().is_none()).await;
    // Unknown balance keeps the key in rotation: a refresh failure is not a key failure.
    assert_eq!(h.state_of("a").0, StateKind::Active);
    assert_eq!(
        metric(&h.metrics().await, "keyrelay_keys_active"),
        Some(2.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn a_key_that_runs_out_of_balance_leaves_rotation() {
    let sim = Simulator::new()
        .key(SimKey {
            balance: 2.0,
            cost: 1.0,
            ..SimKey::valid(KEY_A)
        })
        .key(SimKey::valid(KEY_B))
        .spawn()
        .await
        .unwrap();
    let config = config_for(&sim, &[("a", KEY_A, 10_000.0), ("b", KEY_B, 1.0)]);
    let h = Harness::start(sim, config).await;
    let first = h.submit().await;
    let second = h.submit().await;
    assert_eq!(h.sim.task_owner(first).as_deref(), Some(KEY_A));
    assert_eq!(h.sim.task_owner(second).as_deref(), Some(KEY_A));
    // The third finds the account empty and moves on.
    let third = h.submit().await;
    assert_eq!(h.sim.task_owner(third).as_deref(), Some(KEY_B));
    eventually("a benched", || h.state_of("a").0 == StateKind::Benched).await;
    h.stop().await;
}
