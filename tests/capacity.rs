//! Capacity end to end: keyrelay never gives a key more tasks than its threads, tiers and
//! strategies choose the keys they say, a full pool queues and then answers the code
//! clients back off on, and `threadsinfo` agrees with those decisions.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use keyrelay::config::{Config, Strategy};
use keyrelay::sim::{FaultKind, FaultTarget, SimKey, SimKeyState, Simulator};
use keyrelay::App;

/// A simulator whose keys have these thread counts (balance 1000, so money never runs out).
async fn sim_with_threads(keys: &[(&str, u32)]) -> keyrelay::sim::SimHandle {
    let mut sim = Simulator::new();
    for (value, threads) in keys {
        let mut key = SimKey::valid(value);
        key.threads = *threads;
        key.balance = 1000.0;
        sim = sim.key(key);
    }
    sim.spawn().await.expect("simulator binds 127.0.0.1:0")
}

/// `config_for` with each key's configured thread count.
fn config_with_threads(
    sim: &keyrelay::sim::SimHandle,
    keys: &[(&str, &str, u32)],
) -> keyrelay::Config {
    let plain: Vec<(&str, &str, f64)> = keys.iter().map(|(n, k, _)| (*n, *k, 1.0)).collect();
    let mut config = config_for(sim, &plain);
    for (key, (_, _, threads)) in config.keys.iter_mut().zip(keys) {
        key.threads = Some(*threads);
    }
    config
}

fn submit_path(json: bool) -> String {
    let json = if json { "&json=1" } else { "" };
    format!(
        "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=site&pageurl=https://x.test{json}"
    )
}

/// Polls a task through keyrelay until its final answer.
async fn poll_to_the_end(harness: &Harness, id: u64) -> String {
    for _ in 0..100 {
        let answer = harness
            .get(&format!(
                "/res.php?key={CALLER_KEY}&action=get&id={id}&json=1"
            ))
            .await;
        let json = answer.json();
        if json["request"] != "CAPCHA_NOT_READY" {
            return answer.text();
        }
    }
    panic!("task {id} never finished");
}

/// The `threadsinfo` answer: (threads, working_threads, free_threads).
async fn threadsinfo(harness: &Harness) -> (u64, u64, u64) {
    let json = harness
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=threadsinfo&json=1"
        ))
        .await
        .json();
    let n = |field: &str| {
        json[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} in {json}"))
    };
    (n("threads"), n("working_threads"), n("free_threads"))
}

fn key_header(answer: &Answer) -> String {
    answer
        .headers
        .get(keyrelay::proxy::KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// In.php requests the simulator received with `key`.
fn submits_seen(harness: &Harness, key: &str) -> usize {
    harness
        .sim
        .received()
        .iter()
        .filter(|r| r.path == "/in.php" && r.key.as_deref() == Some(key))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_submits_never_exceed_any_keys_threads() {
    let plans = [
        ("basic", KEY_A, 5),
        ("standard", KEY_B, 15),
        ("advance", KEY_C, 50),
    ];
    let sim = sim_with_threads(&[(KEY_A, 5), (KEY_B, 15), (KEY_C, 50)]).await;
    let mut config = config_with_threads(&sim, &plans);
    // Long enough for every queued submit to get a thread as the others finish.
    config.capacity.queue_timeout = Duration::from_secs(60);
    let harness = Arc::new(Harness::start(sim, config).await);

    // 200 scripts at once, each submitting a task and polling it to the end: 70 threads
    // in all, so most of them wait for a thread in keyrelay's queue.
    let scripts: Vec<_> = (0..200)
        .map(|_| {
            let harness = harness.clone();
            tokio::spawn(async move {
                let id = harness.submit().await;
                poll_to_the_end(&harness, id).await
            })
        })
        .collect();
    for script in scripts {
        let last = script.await.expect("script task");
        assert!(last.contains("tok-"), "every task is solved: {last}");
    }

    for (name, key, threads) in plans {
        let peak = harness.sim.peak_threads(key);
        assert!(
            peak <= threads,
            "{name}: {peak} tasks at once on {threads} threads"
        );
    }
    let metrics = harness.metrics().await;
    for (name, _, _) in plans {
        let full = metric(
            &metrics,
            &format!("keyrelay_key_submits_total{{key=\"{name}\",outcome=\"key_full\"}}"),
        );
        assert_eq!(
            full,
            Some(0.0),
            "{name} was never handed a task it had no thread for"
        );
    }
    let queued = metric(
        &metrics,
        "keyrelay_queue_wait_seconds_count{result=\"admitted\"}",
    )
    .unwrap_or(0.0);
    assert!(
        queued > 0.0,
        "the pool was full and submits queued:\n{metrics}"
    );
    for reason in ["no_queue", "queue_full", "queue_timeout"] {
        let refused = metric(
            &metrics,
            &format!("keyrelay_pool_full_total{{reason=\"{reason}\"}}"),
        );
        assert_eq!(refused, Some(0.0), "no submit was refused ({reason})");
    }
    // Every task finished, so every thread is free again.
    let snapshot = harness.app.snapshot();
    for key in snapshot.pool.keys() {
        assert_eq!(snapshot.pool.load(key).in_use(), 0, "{}", key.name);
    }
}

#[tokio::test]
async fn a_queued_submit_proceeds_when_a_thread_frees() {
    let sim = sim_with_threads(&[(KEY_A, 1)]).await;
    let mut config = config_with_threads(&sim, &[("a", KEY_A, 1)]);
    config.capacity.queue_timeout = Duration::from_secs(60);
    let harness = Arc::new(Harness::start(sim, config).await);
    let first = harness.submit().await;

    let waiting = tokio::spawn({
        let harness = harness.clone();
        async move { harness.get(&submit_path(true)).await }
    });
    let app = harness.app.clone();
    eventually("the second submit queues", || app.capacity().queued() == 1).await;
    // While a submit waits, threadsinfo says what admission does: no free thread.
    assert_eq!(threadsinfo(&harness).await, (1, 1, 0));
    assert_eq!(
        submits_seen(&harness, KEY_A),
        1,
        "the waiting task was not sent"
    );

    poll_to_the_end(&harness, first).await;
    let answer = waiting.await.expect("client task");
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    assert_eq!(key_header(&answer), "a");
    assert_eq!(harness.app.capacity().queued(), 0);
    assert_eq!(harness.sim.peak_threads(KEY_A), 1);
}

#[tokio::test]
async fn a_submit_that_waits_too_long_gets_the_code_clients_back_off_on() {
    let sim = sim_with_threads(&[(KEY_A, 1)]).await;
    let mut config = config_with_threads(&sim, &[("a", KEY_A, 1)]);
    config.capacity.queue_timeout = Duration::from_millis(300);
    let harness = Harness::start(sim, config).await;
    harness.submit().await;

    let json = harness.get(&submit_path(true)).await;
    assert_eq!(json.status, 200);
    let body = json.json();
    assert_eq!(body["status"], 0);
    assert_eq!(body["request"], "ERROR_ZERO_BALANCE");
    let text = body["error_text"].as_str().expect("error_text");
    assert!(text.contains("no thread came free within 300ms"), "{text}");
    // The official SDK asks threadsinfo next, and waits only if no thread is free.
    let (threads, working, free) = threadsinfo(&harness).await;
    assert!(working >= threads, "{threads} threads, {working} working");
    assert_eq!(free, 0);

    let plain = harness.get(&submit_path(false)).await;
    assert_eq!(plain.text(), "ERROR_ZERO_BALANCE");
    assert_eq!(
        submits_seen(&harness, KEY_A),
        1,
        "refused submits never went upstream"
    );
    let metrics = harness.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_pool_full_total{reason=\"queue_timeout\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_queue_wait_seconds_count{result=\"refused\"}"
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn a_full_queue_or_no_queue_refuses_at_once_and_reloads_apply() {
    let sim = sim_with_threads(&[(KEY_A, 1)]).await;
    let mut config = config_with_threads(&sim, &[("a", KEY_A, 1)]);
    config.capacity.queue_timeout = Duration::from_secs(60);
    config.capacity.max_queued = 1;
    let harness = Arc::new(Harness::start(sim, config.clone()).await);
    let first = harness.submit().await;
    let waiting = tokio::spawn({
        let harness = harness.clone();
        async move { harness.get(&submit_path(true)).await }
    });
    let app = harness.app.clone();
    eventually("one submit queues", || app.capacity().queued() == 1).await;

    let refused = harness.get(&submit_path(true)).await.json();
    assert_eq!(refused["request"], "ERROR_ZERO_BALANCE");
    let text = refused["error_text"].as_str().unwrap();
    assert!(text.contains("1 submits already wait"), "{text}");

    // Waiting off, by a live reload.
    let mut off = config.clone();
    off.capacity.queue_timeout = Duration::ZERO;
    keyrelay::reload::apply(&harness.app, off).expect("reload applies");
    poll_to_the_end(&harness, first).await;
    assert_eq!(
        waiting.await.unwrap().json()["status"],
        1,
        "the waiter got the thread"
    );
    let refused = harness.get(&submit_path(false)).await;
    assert_eq!(refused.text(), "ERROR_ZERO_BALANCE");
    let metrics = harness.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_pool_full_total{reason=\"queue_full\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_pool_full_total{reason=\"no_queue\"}"),
        Some(1.0)
    );
}

#[tokio::test]
async fn solve_php_holds_a_thread_for_the_whole_request() {
    let sim = sim_with_threads(&[(KEY_A, 1)]).await;
    let mut config = config_with_threads(&sim, &[("a", KEY_A, 1)]);
    config.capacity.queue_timeout = Duration::ZERO;
    let harness = Arc::new(Harness::start(sim, config).await);
    // The solve takes two seconds (a simulator delay), and holds its thread meanwhile.
    harness.sim.add_fault(
        KEY_A,
        fault(
            FaultTarget::Submit,
            FaultKind::Delay(Duration::from_secs(2)),
            Some(1),
        ),
    );
    let solving = tokio::spawn({
        let harness = harness.clone();
        async move {
            harness
                .get(&format!(
                    "/solve.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=s&pageurl=https://x.test&json=1"
                ))
                .await
        }
    });
    let app = harness.app.clone();
    eventually("the solve holds the thread", || {
        let snapshot = app.snapshot();
        snapshot.pool.load(&snapshot.pool.keys()[0]).pending == 1
    })
    .await;
    let refused = harness.get(&submit_path(true)).await.json();
    assert_eq!(refused["request"], "ERROR_ZERO_BALANCE", "{refused}");

    let solved = solving.await.unwrap();
    assert_eq!(solved.json()["status"], 1, "{}", solved.text());
    // Given back with the answer: nothing pinned, nothing open.
    let snapshot = harness.app.snapshot();
    assert_eq!(snapshot.pool.load(&snapshot.pool.keys()[0]).in_use(), 0);
    assert_eq!(harness.get(&submit_path(true)).await.json()["status"], 1);
}

#[tokio::test]
async fn a_backup_tier_gets_nothing_while_primaries_have_room_and_everything_when_they_are_out() {
    // Threads to spare: here the primaries are out because they die, not because they fill.
    let sim = sim_with_threads(&[(KEY_A, 100), (KEY_B, 100), (KEY_C, 100)]).await;
    let mut config = config_for(
        &sim,
        &[
            ("primary-a", KEY_A, 1.0),
            ("primary-b", KEY_B, 1.0),
            ("backup", KEY_C, 5.0),
        ],
    );
    config.keys[2].tier = 1;
    let harness = Harness::start(sim, config).await;
    let mut served = Vec::new();
    for _ in 0..20 {
        let answer = harness.get(&submit_path(true)).await;
        assert_eq!(answer.json()["status"], 1);
        served.push(key_header(&answer));
    }
    assert!(
        served.iter().all(|k| k.starts_with("primary")),
        "{served:?}"
    );
    assert_eq!(
        submits_seen(&harness, KEY_C),
        0,
        "the backup saw no traffic"
    );

    // Both primaries die: the first submits find out and fail over; then all to the backup.
    harness.sim.set_state(KEY_A, SimKeyState::Unknown);
    harness.sim.set_state(KEY_B, SimKeyState::Unknown);
    for _ in 0..20 {
        let answer = harness.get(&submit_path(true)).await;
        assert_eq!(answer.json()["status"], 1, "{}", answer.text());
        assert_eq!(key_header(&answer), "backup");
    }
    assert_eq!(submits_seen(&harness, KEY_C), 20);
}

#[tokio::test]
async fn a_backup_tier_takes_the_overflow_of_full_primaries() {
    let sim = sim_with_threads(&[(KEY_A, 2), (KEY_B, 5)]).await;
    let mut config = config_with_threads(&sim, &[("primary", KEY_A, 2), ("backup", KEY_B, 5)]);
    config.keys[1].tier = 1;
    let harness = Harness::start(sim, config).await;
    let mut served = Vec::new();
    for _ in 0..5 {
        served.push(key_header(&harness.get(&submit_path(true)).await));
    }
    assert_eq!(served, ["primary", "primary", "backup", "backup", "backup"]);
}

#[tokio::test]
async fn round_robin_from_the_config_takes_keys_in_turn() {
    let sim = sim_with(&[KEY_A, KEY_B, KEY_C]).await;
    let mut config = config_for(
        &sim,
        &[("a", KEY_A, 1.0), ("b", KEY_B, 9.0), ("c", KEY_C, 1.0)],
    );
    config.strategy = Strategy::RoundRobin;
    let harness = Harness::start(sim, config).await;
    let mut served = Vec::new();
    for _ in 0..6 {
        served.push(key_header(&harness.get(&submit_path(true)).await));
    }
    assert_eq!(served, ["a", "b", "c", "a", "b", "c"]);
}

#[tokio::test]
async fn least_loaded_evens_the_share_of_threads_in_use() {
    let sim = sim_with_threads(&[(KEY_A, 5), (KEY_B, 15)]).await;
    let mut config = config_with_threads(&sim, &[("basic", KEY_A, 5), ("standard", KEY_B, 15)]);
    config.strategy = Strategy::LeastLoaded;
    let harness = Harness::start(sim, config).await;
    for _ in 0..8 {
        harness.submit().await;
    }
    // Each pick goes to the lower share in use: 2 of 5 and 6 of 15 are both 40 %.
    assert_eq!(harness.sim.working_threads(KEY_A), 2);
    assert_eq!(harness.sim.working_threads(KEY_B), 6);
}

#[tokio::test]
async fn threads_used_outside_keyrelay_count_once_threadsinfo_shows_them() {
    let sim = sim_with_threads(&[(KEY_A, 5)]).await;
    let mut config = config_with_threads(&sim, &[("a", KEY_A, 5)]);
    config.capacity.queue_timeout = Duration::ZERO;
    let harness = Harness::start(sim, config).await;
    // Another script uses the same key directly.
    for _ in 0..3 {
        harness.submit_past_keyrelay(KEY_A).await;
    }
    keyrelay::refresh::refresh_all(&harness.app).await;
    assert_eq!(threadsinfo(&harness).await, (5, 3, 2));
    harness.submit().await;
    harness.submit().await;
    let refused = harness.get(&submit_path(true)).await.json();
    assert_eq!(refused["request"], "ERROR_ZERO_BALANCE");
    let metrics = harness.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_key_submits_total{key=\"a\",outcome=\"key_full\"}"
        ),
        Some(0.0),
        "keyrelay refused the sixth task itself; the key never had to"
    );
    assert_eq!(
        metric(&metrics, "keyrelay_key_threads_in_use{key=\"a\"}"),
        Some(5.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_key_tasks_in_flight{key=\"a\"}"),
        Some(2.0)
    );
}

#[tokio::test]
async fn the_capacity_from_threadsinfo_replaces_an_unknown_one() {
    let sim = sim_with_threads(&[(KEY_A, 2)]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.capacity.queue_timeout = Duration::ZERO;
    let harness = Harness::start(sim, config).await;
    let app = harness.app.clone();
    eventually("threadsinfo read", || {
        app.snapshot().pool.keys()[0].thread_capacity() == Some(2)
    })
    .await;
    harness.submit().await;
    harness.submit().await;
    let refused = harness.get(&submit_path(true)).await.json();
    assert_eq!(refused["request"], "ERROR_ZERO_BALANCE");
    assert_eq!(harness.sim.peak_threads(KEY_A), 2);
}

#[tokio::test]
async fn threadsinfo_totals_the_keys_in_rotation_as_admission_counts_them() {
    let sim = sim_with_threads(&[(KEY_A, 5), (KEY_B, 15), (KEY_C, 50)]).await;
    let config = config_with_threads(
        &sim,
        &[
            ("basic", KEY_A, 5),
            ("standard", KEY_B, 15),
            ("advance", KEY_C, 50),
        ],
    );
    let harness = Harness::start(sim, config).await;
    assert_eq!(threadsinfo(&harness).await, (70, 0, 70));
    let first = harness.submit().await;
    harness.submit().await;
    assert_eq!(threadsinfo(&harness).await, (70, 2, 68));
    poll_to_the_end(&harness, first).await;
    assert_eq!(threadsinfo(&harness).await, (70, 1, 69));
    // A benched key's threads are not on offer.
    harness.sim.set_state(KEY_A, SimKeyState::Unknown);
    keyrelay::refresh::refresh_all(&harness.app).await;
    let (threads, _, _) = threadsinfo(&harness).await;
    assert_eq!(threads, 65);
}

/// An app for in-process tests that never reach an upstream.
fn offline_app(config: Config) -> App {
    App::new(config).expect("app builds")
}

#[tokio::test(start_paused = true)]
async fn a_task_nobody_polls_gives_its_thread_back_after_the_stale_timeout() {
    let upstream = keyrelay::config::Upstream::parse("http://127.0.0.1:9").unwrap();
    let mut config = Config::for_keys(upstream.clone(), vec![key("a", KEY_A, 1.0, &upstream)]);
    config.keys[0].threads = Some(1);
    config.capacity.stale_after = Duration::from_secs(300);
    let app = offline_app(config);
    let snapshot = app.snapshot();
    let pool = &snapshot.pool;
    let key = &pool.keys()[0];
    pool.hold(key).expect("a free thread").keep_for(
        keyrelay::captcha::TaskId::Num(1),
        tokio::time::Instant::now(),
    );
    assert!(pool.is_full(key));
    tokio::spawn(keyrelay::background::release_stale(app.clone()));

    tokio::time::advance(Duration::from_secs(299)).await;
    settle().await;
    assert!(pool.is_full(key), "not stale yet");
    tokio::time::advance(Duration::from_secs(6)).await;
    settle().await;
    assert!(!pool.is_full(key), "released");
    assert_eq!(pool.load(key).in_use(), 0);
    let metrics = app.render_metrics();
    assert_eq!(
        metric(&metrics, "keyrelay_thread_releases_total{reason=\"stale\"}"),
        Some(1.0)
    );
}

/// Lets spawned tasks run at the paused instant.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_reload_switches_the_strategy_and_tiers_live() {
    let sim = sim_with_threads(&[(KEY_A, 100), (KEY_B, 100), (KEY_C, 100)]).await;
    let config = config_for(
        &sim,
        &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
    );
    let harness = Harness::start(sim, config.clone()).await;

    let mut round_robin = config.clone();
    round_robin.strategy = Strategy::RoundRobin;
    keyrelay::reload::apply(&harness.app, round_robin.clone()).expect("reload applies");
    let mut served = Vec::new();
    for _ in 0..6 {
        served.push(key_header(&harness.get(&submit_path(true)).await));
    }
    assert_eq!(served, ["a", "b", "c", "a", "b", "c"]);

    // a and b become backups: only c is served while it has room.
    let mut tiers = round_robin;
    tiers.keys[0].tier = 1;
    tiers.keys[1].tier = 1;
    keyrelay::reload::apply(&harness.app, tiers).expect("reload applies");
    for _ in 0..4 {
        assert_eq!(key_header(&harness.get(&submit_path(true)).await), "c");
    }
}

/// Issue 11 §3: a refresh that reads `threadsinfo` while keyrelay's own tasks are in flight
/// must not count them a second time as outside load, or the key stays "full" after they all
/// end and new submits are refused with `ERROR_ZERO_BALANCE`.
#[tokio::test]
async fn a_refresh_during_running_tasks_does_not_leave_the_key_full_after_they_end() {
    let sim = sim_with_threads(&[(KEY_A, 3)]).await;
    let mut config = config_with_threads(&sim, &[("a", KEY_A, 3)]);
    config.capacity.queue_timeout = Duration::ZERO;
    let harness = Harness::start(sim, config.clone()).await;
    let ids = [
        harness.submit().await,
        harness.submit().await,
        harness.submit().await,
    ];

    // A reload adds a key (one the service does not know, so it cannot take the overflow);
    // that triggers a refresh, whose threadsinfo sees all three tasks working.
    let mut reloaded = config;
    let upstream = reloaded.upstream.clone();
    reloaded.keys.push(key("b", KEY_D, 1.0, &upstream));
    keyrelay::reload::apply(&harness.app, reloaded).expect("reload applies");
    let app = harness.app.clone();
    // The refresh sets the figures and reconciles in one step, with no await between them,
    // and this test's runtime has one thread: once the figures show, reconciling is done.
    eventually(
        "the reload's refresh read threadsinfo and benched b",
        || {
            app.snapshot().pool.keys()[0].stats.threads() == Some((3, 3))
                && app.snapshot().pool.keys()[1].stats.threads().is_none()
                && app
                    .health()
                    .view(
                        app.snapshot().pool.keys()[1].id,
                        tokio::time::Instant::now(),
                    )
                    .state
                    == keyrelay::health::StateKind::Benched
        },
    )
    .await;
    let load = harness
        .app
        .capacity()
        .load(harness.app.snapshot().pool.keys()[0].id);
    assert_eq!(
        load.external, 0,
        "keyrelay's own tasks are not outside load: {load:?}"
    );

    for id in ids {
        poll_to_the_end(&harness, id).await;
    }
    let snapshot = harness.app.snapshot();
    assert_eq!(snapshot.pool.load(&snapshot.pool.keys()[0]).in_use(), 0);
    assert_eq!(threadsinfo(&harness).await, (3, 0, 3));
    let answer = harness.get(&submit_path(true)).await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    assert_eq!(key_header(&answer), "a");
}

#[tokio::test]
async fn a_refresh_counts_outside_tasks_once_and_keyrelays_own_not_at_all() {
    let sim = sim_with_threads(&[(KEY_A, 5)]).await;
    let mut config = config_with_threads(&sim, &[("a", KEY_A, 5)]);
    config.capacity.queue_timeout = Duration::ZERO;
    let harness = Harness::start(sim, config).await;
    // Two tasks through keyrelay and one from another script, all within the second the
    // refresh reads threadsinfo in.
    harness.submit().await;
    harness.submit().await;
    harness.submit_past_keyrelay(KEY_A).await;
    keyrelay::refresh::refresh_all(&harness.app).await;
    let snapshot = harness.app.snapshot();
    let load = snapshot.pool.load(&snapshot.pool.keys()[0]);
    assert_eq!((load.pending, load.open, load.external), (0, 2, 1));
    assert_eq!(threadsinfo(&harness).await, (5, 3, 2));
    // So the key takes exactly the two tasks it has threads for.
    harness.submit().await;
    harness.submit().await;
    let refused = harness.get(&submit_path(true)).await.json();
    assert_eq!(refused["request"], "ERROR_ZERO_BALANCE", "{refused}");
    assert_eq!(harness.sim.peak_threads(KEY_A), 5);
}
