//! Several replicas as one pool on a real `redis-server` (issue 14): threads never overfill
//! a key across the fleet, every poll finds its key on any replica without a probe, a
//! benched key leaves every replica's rotation, and no request leaks a lease. Redis
//! outages are `cluster_outages.rs`, spares `cluster_spares.rs`; the Redis server and the
//! replicas are `common/redis_server.rs` and `common/replicas.rs`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::Redis;
use common::replicas::*;
// The fleet's, by threads per key, not common's by key values.
use common::replicas::sim_with;
use common::*;
use keyrelay::health::StateKind;
use keyrelay::sim::{FaultKind, FaultTarget, SimKeyState};
use rand::Rng;

fn key_value(name: &str) -> &'static str {
    KEYS.iter().find(|(n, _)| *n == name).expect("a pool key").1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_loops_over_three_replicas_never_overfill_a_key_and_never_probe() {
    let Some(redis) = Redis::start() else { return };
    let sim = sim().await;
    let replicas = Arc::new(fleet(&sim, &redis).await);
    let loops = (0..200).map(|_| {
        let replicas = replicas.clone();
        let sim = sim.clone();
        tokio::spawn(async move {
            let pick = || rand::rng().random_range(0..replicas.len());
            let (id, key) = submit(&replicas[pick()]).await;
            assert_eq!(
                sim.task_owner(id).as_deref(),
                Some(key_value(&key)),
                "the header names the key that created {id}"
            );
            for _ in 0..50 {
                let (done, polled_with) = poll(&replicas[pick()], id).await;
                assert_eq!(
                    polled_with.as_deref(),
                    Some(key.as_str()),
                    "task {id} polled with its creating key"
                );
                if done {
                    return;
                }
            }
            panic!("task {id} never got ready");
        })
    });
    for handle in loops.collect::<Vec<_>>() {
        handle.await.expect("loop finished");
    }
    for (_, key) in KEYS {
        let peak = sim.peak_threads(key);
        assert!(peak <= THREADS, "peak {peak} threads on one key");
        assert!(peak > 0, "every key was used");
    }
    for replica in replicas.iter() {
        assert_eq!(probes(replica), 0.0, "no replica probed");
    }
    assert_never_overfilled(&sim, &replicas);
    // Every thread went back: the final answers released the leases wherever they landed.
    eventually_async_leases(&redis, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_benched_on_one_replica_gets_no_task_from_any_replica_a_second_later() {
    let Some(redis) = Redis::start() else { return };
    let sim = sim().await;
    let replicas = fleet(&sim, &redis).await;
    sim.set_state(KEY_B, SimKeyState::Unknown);
    // Tasks through the first replica until one lands on b and benches it there; each is
    // polled to its end, so that the other keys' threads stay free.
    let b = replicas[0].app.snapshot().pool.keys()[1].clone();
    assert_eq!(b.name, "b");
    let benched = |app: &keyrelay::App| {
        app.health().view(b.id, tokio::time::Instant::now()).state == StateKind::Benched
    };
    let mut benched_at = None;
    for _ in 0..100 {
        let (id, _) = submit(&replicas[0]).await;
        if benched(&replicas[0].app) {
            benched_at = Some(std::time::Instant::now());
            break;
        }
        while !poll(&replicas[0], id).await.0 {}
    }
    let benched_at = benched_at.expect("b was benched on the first replica");
    for replica in &replicas[1..] {
        let app = replica.app.clone();
        let id = b.id;
        eventually("b benched on every replica", move || {
            app.health().view(id, tokio::time::Instant::now()).state == StateKind::Benched
        })
        .await;
    }
    assert!(
        benched_at.elapsed() <= Duration::from_secs(1),
        "took {:?} to reach every replica",
        benched_at.elapsed()
    );
    for i in 0..30 {
        let key = solve(&replicas[1 + i % 2]).await;
        assert_ne!(key, "b");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ip_ban_seen_on_one_replica_pauses_every_replica() {
    let Some(redis) = Redis::start() else { return };
    let sim = sim().await;
    let replicas = fleet(&sim, &redis).await;
    sim.add_fault(
        "*",
        fault(
            FaultTarget::Submit,
            FaultKind::Code("IP_BANNED".into()),
            Some(1),
        ),
    );
    let banned = replicas[0]
        .get("/in.php?key=callerkey&method=userrecaptcha&googlekey=site&pageurl=https://x.test")
        .await;
    assert_eq!(banned.text(), "IP_BANNED", "the service's answer, verbatim");
    assert!(replicas[0].app.upstream_paused().is_some());
    for replica in &replicas[1..] {
        let app = replica.app.clone();
        eventually("the pause reached every replica", move || {
            app.upstream_paused().is_some()
        })
        .await;
    }
    // Paused, another replica answers for the service and sends nothing upstream.
    let sent = sim.received().len();
    let answer = replicas[1]
        .get("/in.php?key=callerkey&method=userrecaptcha&googlekey=site&pageurl=https://x.test&json=1")
        .await
        .json();
    assert_eq!(answer["request"], "IP_BANNED");
    assert_eq!(sim.received().len(), sent, "nothing upstream while paused");
}

/// A task submitted and polled to its end through `via`; the key that served it.
async fn solve(via: &Harness) -> String {
    let (id, key) = submit(via).await;
    for _ in 0..50 {
        if poll(via, id).await.0 {
            return key;
        }
    }
    panic!("task {id} never got ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn submits_whose_callers_leave_leave_no_lease_behind() {
    let Some(redis) = Redis::start() else { return };
    let sim = sim().await;
    let mut replicas = Vec::new();
    for name in ["kr-1", "kr-2"] {
        let mut config = replica_config(&sim, &redis, name);
        config.capacity.queue_timeout = Duration::from_millis(200);
        replicas.push(Harness::start_without_refresh_wait(sim.clone(), config).await);
    }
    for replica in &replicas {
        wait_shared(replica).await;
    }
    let addrs: Vec<_> = replicas.iter().map(|r| r.addr).collect();
    let callers = (0..1000).map(|i| {
        let addr = addrs[i % addrs.len()];
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let request = "GET /in.php?key=k&method=userrecaptcha&googlekey=site&pageurl=https://x.test HTTP/1.1\r\nhost: x\r\n\r\n";
            stream.write_all(request.as_bytes()).await.expect("send");
            // The caller leaves at once, or a moment later: mid-queue or mid-upstream.
            if i % 2 == 1 {
                tokio::task::yield_now().await;
            }
            drop(stream);
        })
    });
    for caller in callers.collect::<Vec<_>>() {
        caller.await.expect("caller");
    }
    // Every request ends by itself (accepted, or refused when the queue wait runs out).
    for replica in &replicas {
        let app = replica.app.clone();
        eventually("every request finished", move || {
            app.capacity().queued() == 0
        })
        .await;
    }
    // What is left is one lease per task the service is working on, and nothing else.
    let tasks: usize = KEYS
        .iter()
        .map(|(_, key)| sim.working_threads(key) as usize)
        .sum();
    assert!(
        tasks > 0,
        "some submits were accepted before their wait ran out"
    );
    eventually_async_leases(&redis, tasks).await;
    eventually_no_spares(&redis, &replicas).await;
}
/// Redis's clock, ms.
fn redis_now_ms(redis: &Redis) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis.conn()).expect("TIME");
    secs * 1000 + micros / 1000
}

/// Leases of `key` whose expiry is still ahead, and the latest expiry.
fn live_leases(redis: &Redis, key: &str) -> (usize, u64) {
    let scored: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg(format!("keyrelay:key:{{{key}}}:leases"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut redis.conn())
        .expect("ZRANGE WITHSCORES");
    let now = redis_now_ms(redis);
    let live = scored.iter().filter(|(_, at)| *at > now).count();
    (live, scored.iter().map(|(_, at)| *at).max().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_open_tasks_keep_their_leases_past_the_lease_ttl() {
    let Some(redis) = Redis::start() else { return };
    // More open tasks than one renewal script takes, on one key.
    const OPEN: u32 = 600;
    let sim = sim_with(OPEN).await;
    let mut config = replica_config_with(&sim, &redis, "kr-1", OPEN);
    config.keys.truncate(1);
    let replica = Harness::start_without_refresh_wait(sim.clone(), config).await;
    wait_shared(&replica).await;
    for _ in 0..OPEN {
        submit(&replica).await;
    }
    let (live, first_expiry) = live_leases(&redis, "a");
    assert_eq!(live, OPEN as usize);
    // Past every lease's first expiry (replica_timeout after it was written), each has
    // been renewed.
    for _ in 0..1000 {
        if redis_now_ms(&redis) > first_expiry + 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        redis_now_ms(&redis) > first_expiry,
        "waited past the first expiry"
    );
    let (live, _) = live_leases(&redis, "a");
    assert_eq!(live, OPEN as usize, "every open task's lease was renewed");
}
