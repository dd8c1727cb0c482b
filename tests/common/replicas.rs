//! keyrelay replicas sharing one pool on a test's [`Redis`]: their configs, a fleet of
//! three on one simulator, submits and polls through any of them, and the checks the
//! cluster tests share (no key overfilled, no lease or spare left behind).

use std::sync::Arc;
use std::time::Duration;

use keyrelay::config::{Cluster, Config, RedisUrl};
use keyrelay::sim::{SimHandle, SimKey, Simulator};

use rand::Rng;

use super::redis_server::Redis;
use super::*;

pub const THREADS: u32 = 5;
pub const KEYS: [(&str, &str); 3] = [("a", KEY_A), ("b", KEY_B), ("c", KEY_C)];
pub async fn sim() -> SimHandle {
    sim_with(THREADS).await
}

pub async fn sim_with(threads: u32) -> SimHandle {
    let mut sim = Simulator::new().polls_to_ready(2);
    for (_, key) in KEYS {
        let mut k = SimKey::valid(key);
        k.threads = threads;
        sim = sim.key(k);
    }
    sim.spawn().await.expect("simulator binds 127.0.0.1:0")
}

/// The replicas' `[cluster] timeout`. CI runs these tests side by side on two cores, each
/// with its own redis-server and replicas; there a call held past the default 250 ms is the
/// machine, not keyrelay, and one timed-out call rightly puts a replica in degraded mode,
/// where polls probe and tests that count probes would fail for the wrong reason.
pub const REDIS_CALL_TIMEOUT: Duration = Duration::from_secs(1);

pub fn replica_config(sim: &SimHandle, redis: &Redis, name: &str) -> Config {
    replica_config_with(sim, redis, name, THREADS)
}

pub fn replica_config_with(sim: &SimHandle, redis: &Redis, name: &str, threads: u32) -> Config {
    let keys: Vec<(&str, &str, f64)> = KEYS.iter().map(|(n, k)| (*n, *k, 1.0)).collect();
    let mut config = config_for(sim, &keys);
    for key in &mut config.keys {
        key.threads = Some(threads);
    }
    config.capacity.queue_timeout = Duration::from_secs(60);
    config.cluster = Some(Cluster {
        redis: RedisUrl::new(redis.url()),
        replica: name.to_owned(),
        prefix: "keyrelay".to_owned(),
        replica_timeout: Duration::from_secs(3),
        timeout: REDIS_CALL_TIMEOUT,
        sync_interval: Duration::from_millis(500),
    });
    config
}

/// Three in-process replicas on one simulator and one Redis, each in shared mode.
pub async fn fleet(sim: &SimHandle, redis: &Redis) -> Vec<Harness> {
    let mut replicas = Vec::new();
    for name in ["kr-1", "kr-2", "kr-3"] {
        let config = replica_config(sim, redis, name);
        replicas.push(Harness::start_without_refresh_wait(sim.clone(), config).await);
    }
    for replica in &replicas {
        wait_shared(replica).await;
    }
    wait_fleet(&replicas, 3).await;
    replicas
}

/// A lone replica `kr-1` in shared mode, on a simulator whose keys have `threads` threads
/// each and a Redis of its own; `None` where redis-server is missing (see `Redis::start`).
pub async fn lone_replica(threads: u32) -> Option<(Redis, Harness)> {
    let redis = Redis::start()?;
    let sim = sim_with(threads).await;
    let config = replica_config_with(&sim, &redis, "kr-1", threads);
    let replica = Harness::start_without_refresh_wait(sim, config).await;
    wait_shared(&replica).await;
    Some((redis, replica))
}

pub async fn wait_shared(replica: &Harness) {
    let app = replica.app.clone();
    eventually("replica in shared mode", move || {
        app.cluster().is_some_and(|c| c.is_shared())
    })
    .await;
}

/// Waits until every replica has seen all `count` of them alive.
pub async fn wait_fleet(replicas: &[Harness], count: usize) {
    for replica in replicas {
        let app = replica.app.clone();
        eventually("the whole fleet seen alive", move || {
            app.cluster()
                .is_some_and(|c| c.live_replicas().len() == count)
        })
        .await;
    }
}

/// Submits through `via` until accepted; the task id and the key that served it.
pub async fn submit(via: &Harness) -> (u64, String) {
    let answer = via
        .get("/in.php?key=callerkey&method=userrecaptcha&googlekey=site&pageurl=https://x.test&json=1")
        .await;
    let json = answer.json();
    assert_eq!(json["status"], 1, "submit refused: {}", answer.text());
    let id: u64 = match &json["request"] {
        serde_json::Value::Number(n) => n.as_u64().expect("numeric id"),
        serde_json::Value::String(s) => s.parse().expect("numeric id"),
        other => panic!("no task id in {other}"),
    };
    let key = answer
        .headers
        .get("x-keyrelay-key")
        .and_then(|v| v.to_str().ok())
        .expect("X-Keyrelay-Key on a relayed answer")
        .to_owned();
    (id, key)
}

/// Polls `id` through `via` once; whether the answer is final, and the key it went with.
pub async fn poll(via: &Harness, id: u64) -> (bool, Option<String>) {
    let answer = via
        .get(&format!("/res.php?key=callerkey&action=get&id={id}&json=1"))
        .await;
    let json = answer.json();
    let key = answer
        .headers
        .get("x-keyrelay-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let done = json["status"] == 1;
    assert!(
        done || json["request"] == "CAPCHA_NOT_READY",
        "poll of {id} answered {}",
        answer.text()
    );
    (done, key)
}

pub fn probes(replica: &Harness) -> f64 {
    let text = replica.app.render_metrics();
    text.lines()
        .filter(|l| l.starts_with("keyrelay_probes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The replica's failed Redis calls by op, for failure messages: a failed call puts it in
/// degraded mode, where polls elsewhere may probe.
pub fn cluster_errors(replica: &Harness) -> String {
    let text = replica.app.render_metrics();
    text.lines()
        .filter(|l| l.starts_with("keyrelay_cluster_errors_total{") && !l.ends_with(" 0"))
        .collect::<Vec<_>>()
        .join(", ")
}
/// Waits until only tasks' leases are left, one per task the simulator is working on.
pub async fn eventually_async_leases(redis: &Redis, tasks: usize) {
    for _ in 0..500 {
        let leases: Vec<String> = KEYS
            .iter()
            .flat_map(|(name, _)| redis.leases(name))
            .collect();
        if leases.iter().all(|m| m.starts_with("t:")) && leases.len() == tasks {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let leases: Vec<String> = KEYS
        .iter()
        .flat_map(|(name, _)| redis.leases(name))
        .collect();
    panic!("leases left behind: {leases:?}, tasks working: {tasks}");
}

/// Tasks made and polled to their end by `loops` loops over random replicas until `stop`;
/// every task made, with its key. Without Redis a poll on another replica may probe, so
/// loops accept "not ready" for as long as it takes.
pub fn run_loops(
    replicas: &Arc<Vec<Harness>>,
    loops: usize,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    done: &Arc<std::sync::atomic::AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<Vec<(u64, String)>>> {
    use std::sync::atomic::Ordering;
    (0..loops)
        .map(|_| {
            let (replicas, stop, done) = (replicas.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut made = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let pick = || rand::rng().random_range(0..replicas.len());
                    let (id, key) = submit(&replicas[pick()]).await;
                    made.push((id, key.clone()));
                    loop {
                        let (finished, polled) = poll(&replicas[pick()], id).await;
                        if let Some(polled) = polled {
                            assert_eq!(polled, key, "task {id} polled with its creating key");
                        }
                        if finished {
                            break;
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                made
            })
        })
        .collect()
}

pub async fn wait_done(
    done: &std::sync::atomic::AtomicUsize,
    at_least: usize,
    replicas: &[Harness],
    phase: &str,
) {
    for _ in 0..3000 {
        if done.load(std::sync::atomic::Ordering::Relaxed) >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut states = String::new();
    for replica in replicas {
        let status = replica.get("/status").await.json();
        states.push_str(&format!(
            "\n{}: {} queued {} keys {}",
            status["cluster"]["replica"],
            status["cluster"]["mode"],
            status["queued"],
            status["keys"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|k| format!(
                    "{}={}/{}",
                    k["name"], k["threads_in_use"], k["fleet_threads_in_use"]
                ))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    panic!("{phase}: the loops stalled below {at_least} tasks; replicas:{states}");
}

/// No key over its threads, and no busy answer from the upstream: the simulator refuses a
/// task beyond its threads, so its peak alone proves nothing.
pub fn assert_never_overfilled(sim: &SimHandle, replicas: &[Harness]) {
    assert_never_overfilled_at(sim, replicas, THREADS);
}

pub fn assert_never_overfilled_at(sim: &SimHandle, replicas: &[Harness], threads: u32) {
    for (_, key) in KEYS {
        let peak = sim.peak_threads(key);
        assert!(peak <= threads, "peak {peak} threads of {threads} on {key}");
    }
    for replica in replicas {
        let text = replica.app.render_metrics();
        for (name, _) in KEYS {
            let series =
                format!("keyrelay_key_submits_total{{key=\"{name}\",outcome=\"key_full\"}}");
            assert_eq!(
                metric(&text, &series).unwrap_or(0.0),
                0.0,
                "the upstream never said no free thread ({series})"
            );
        }
    }
}
/// Leases, spares and round trips of a replica, by the metric names operators read.
pub fn round_trips(replica: &Harness, op: &str) -> f64 {
    let text = replica.app.render_metrics();
    metric(
        &text,
        &format!("keyrelay_cluster_round_trips_total{{op=\"{op}\"}}"),
    )
    .unwrap_or(0.0)
}

pub fn all_spares(redis: &Redis) -> Vec<String> {
    KEYS.iter()
        .flat_map(|(name, _)| redis.spares(name))
        .collect()
}

/// Waits until the fleet holds no spare in Redis or locally: unused ones go back by
/// themselves within `SPARE_IDLE` and a sync.
pub async fn eventually_no_spares(redis: &Redis, replicas: &[Harness]) {
    for _ in 0..1000 {
        let local: usize = replicas
            .iter()
            .filter_map(|r| r.app.cluster().cloned())
            .map(|c| KEYS.iter().map(|(n, _)| c.spares_ready(n)).sum::<usize>())
            .sum();
        if all_spares(redis).is_empty() && local == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("spares left behind: {:?}", all_spares(redis));
}
/// Polls `condition` every 20 ms for at most `bound`.
pub async fn within(bound: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + bound;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {bound:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
