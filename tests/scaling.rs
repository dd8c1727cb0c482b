//! `GET /scaling` against the simulator: the pool-wide figures and the recommendation for
//! an idle pool, a busy pool with a queue, a benched key and a balance below the brake,
//! and the same figures in `/metrics`.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::sim::{SimKey, SimKeyState, Simulator};

/// A simulator whose keys have these thread counts and balances.
async fn sim_of(keys: &[(&str, u32, f64, SimKeyState)]) -> keyrelay::sim::SimHandle {
    let mut sim = Simulator::new();
    for &(value, threads, balance, state) in keys {
        let mut key = SimKey::valid(value);
        key.threads = threads;
        key.balance = balance;
        key.state = state;
        sim = sim.key(key);
    }
    sim.spawn().await.expect("simulator binds 127.0.0.1:0")
}

async fn scaling(harness: &Harness) -> serde_json::Value {
    let answer = harness.get("/scaling").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.content_type(), Some("application/json"));
    answer.json()
}

#[tokio::test]
async fn an_idle_pool_wants_no_workers_and_shows_its_threads_and_balance() {
    let sim = sim_of(&[
        (KEY_A, 5, 10.0, SimKeyState::Valid),
        (KEY_B, 3, 2.5, SimKeyState::Valid),
    ])
    .await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    let harness = Harness::start(sim, config).await;
    assert_eq!(
        scaling(&harness).await,
        serde_json::json!({
            "threads_total": 8, "threads_in_use": 0, "threads_free": 8, "queued": 0,
            "balance_total": 12.5, "brake": false, "workers_wanted": 0
        })
    );
    let metrics = harness.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_pool_threads{scope=\"pool\"}"),
        Some(8.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_pool_threads_free{scope=\"pool\"}"),
        Some(8.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_pool_balance{scope=\"pool\"}"),
        Some(12.5)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_scaling_brake_balance{scope=\"pool\"}"),
        Some(0.0)
    );
    harness.stop().await;
}

#[tokio::test]
async fn a_busy_pool_with_a_queue_wants_its_threads_and_no_more() {
    let mut key = SimKey::valid(KEY_A);
    key.threads = 2;
    let sim = Simulator::new()
        .polls_to_ready(u32::MAX)
        .key(key)
        .spawn()
        .await
        .expect("simulator binds 127.0.0.1:0");
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.capacity.queue_timeout = Duration::from_secs(120);
    let harness = Harness::start(sim, config).await;
    harness.submit().await;
    let busy = scaling(&harness).await;
    assert_eq!(
        (
            busy["threads_in_use"].as_u64(),
            busy["workers_wanted"].as_u64()
        ),
        (Some(1), Some(1))
    );
    harness.submit().await;
    // Both threads solving: a third submit waits for one.
    let url = harness.url(&format!(
        "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=s&pageurl=https://x.test"
    ));
    let waiting = tokio::spawn(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let _ = client.get(url.parse().expect("url")).await;
    });
    let app = harness.app.clone();
    eventually("a submit queued", || app.scaling().queued == 1).await;
    assert_eq!(
        scaling(&harness).await,
        serde_json::json!({
            "threads_total": 2, "threads_in_use": 2, "threads_free": 0, "queued": 1,
            "balance_total": 10.0, "brake": false, "workers_wanted": 2
        })
    );
    waiting.abort();
    harness.stop().await;
}

#[tokio::test]
async fn a_benched_key_takes_its_threads_and_balance_out_of_the_figures() {
    let sim = sim_of(&[
        (KEY_A, 5, 10.0, SimKeyState::Valid),
        (KEY_B, 4, 10.0, SimKeyState::Unknown),
    ])
    .await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    let harness = Harness::start(sim, config).await;
    let app = harness.app.clone();
    eventually("b benched", || {
        app.snapshot()
            .pool
            .active_count(tokio::time::Instant::now())
            == 1
    })
    .await;
    let answer = scaling(&harness).await;
    assert_eq!(answer["threads_total"], 5);
    assert_eq!(answer["balance_total"], 10.0);
    harness.stop().await;
}

#[tokio::test]
async fn a_balance_below_the_brake_wants_only_the_workers_solving() {
    let sim = Simulator::new()
        .polls_to_ready(u32::MAX)
        .key(SimKey::valid(KEY_A))
        .spawn()
        .await
        .expect("simulator binds 127.0.0.1:0");
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.scaling.brake_balance = 25.0;
    let harness = Harness::start(sim, config).await;
    harness.submit().await;
    assert_eq!(
        scaling(&harness).await,
        serde_json::json!({
            "threads_total": 5, "threads_in_use": 1, "threads_free": 4, "queued": 0,
            "balance_total": 10.0, "brake": true, "workers_wanted": 1
        })
    );
    harness.stop().await;
}

#[tokio::test]
async fn with_an_admin_listener_scaling_is_not_on_the_proxy_listener() {
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.admin.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let harness = Harness::start(sim, config).await;
    assert_eq!(harness.get("/scaling").await.status, 404);
    harness.stop().await;
}
