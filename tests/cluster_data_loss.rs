//! Redis losing the fleet's state while the replicas run (issue 38 §1), on a real
//! `redis-server`: flushed under load, restarted empty, and brought back from an older copy.
//! Each run asserts that no key is ever handed more tasks than its threads (at the
//! simulator, which counts every task it works on), that every task accepted is polled to
//! its end, and that once the load is over no lease is left in Redis and no replica counts
//! a task or submit of its own as holding a thread, within twice `replica_timeout`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::Redis;
use common::replicas::*;
use common::*;

/// `replica_timeout` in [`replica_config`]: leases and threads must be back within twice it.
const REPLICA_TIMEOUT: Duration = Duration::from_secs(3);

/// Loops submitting and polling over three replicas while `fault` is done to Redis between
/// rounds of tasks; then every check of the module's header.
async fn load_through(phase: &str, mut fault: impl FnMut(&mut Redis, usize)) {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let sim = sim().await;
    let replicas = Arc::new(fleet(&sim, &redis).await);
    let (stop, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let loops = run_loops(&replicas, 24, &stop, &done);
    let mut target = 20;
    wait_done(&done, target, &replicas, "before the fault").await;
    for round in 0..3 {
        fault(&mut redis, round);
        target = done.load(Ordering::Relaxed) + 20;
        wait_done(&done, target, &replicas, phase).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut made = 0;
    for handle in loops {
        made += handle.await.expect("a loop").len();
    }
    let ended = Instant::now();
    assert_eq!(
        made,
        done.load(Ordering::Relaxed),
        "every task polled to its end"
    );
    assert_never_overfilled(&sim, &replicas);
    assert_nothing_held(&redis, &replicas, ended).await;
}

/// Within twice `replica_timeout` of the last final answer: no lease or spare of any kind
/// in Redis, and every replica counts no thread in use.
async fn assert_nothing_held(redis: &Redis, replicas: &[Harness], since: Instant) {
    let held = |redis: &Redis| -> Vec<String> {
        ["a", "b", "c"]
            .iter()
            .flat_map(|key| {
                let mut members = redis.leases(key);
                members.extend(redis.spares(key));
                members
            })
            .collect()
    };
    // keyrelay's own count: submits on their way and tasks open. The service's own reading
    // of other clients (`external`, read while degraded) is the refresher's to correct.
    let in_use = |replica: &Harness| -> u32 {
        let snapshot = replica.app.snapshot();
        let pool = &snapshot.pool;
        pool.keys()
            .iter()
            .map(|key| {
                let load = pool.load(key);
                load.pending + load.open
            })
            .sum()
    };
    let deadline = since + REPLICA_TIMEOUT * 2 + Duration::from_secs(1);
    while Instant::now() < deadline {
        if held(redis).is_empty() && replicas.iter().all(|r| in_use(r) == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counts: Vec<u32> = replicas.iter().map(in_use).collect();
    panic!(
        "left behind after twice replica_timeout: in redis {:?}, threads in use per replica {counts:?}",
        held(redis)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_flushed_while_running_overfills_nothing_loses_nothing_and_leaks_nothing() {
    load_through("after FLUSHALL", |redis, _| {
        redis::cmd("FLUSHALL")
            .query::<()>(&mut redis.conn())
            .expect("FLUSHALL");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_empty_overfills_nothing_loses_nothing_and_leaks_nothing() {
    load_through("after a restart with no data", |redis, _| {
        redis.restart_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_back_from_an_older_copy_overfills_nothing_loses_nothing_and_leaks_nothing() {
    let mut copy = None;
    load_through("after a failover to an older copy", move |redis, round| {
        // The copy is taken in one round and gone back to in the next: the tasks made and
        // ended in between are what the copy does not know.
        match (round, copy.take()) {
            (0, _) | (2, None) => copy = Some(redis.snapshot()),
            (_, Some(older)) => redis.restore(&older),
            (_, None) => {}
        }
    })
    .await;
}

const ALICE: &str = "alice-token-alice-token-alice-01";
const BOB: &str = "bob-token-bob-token-bob-token-02";

/// A replica of a two-replica fleet whose callers carry tokens.
async fn token_replica(sim: &keyrelay::sim::SimHandle, redis: &Redis, name: &str) -> Harness {
    let mut config = replica_config(sim, redis, name);
    config.access.tokens = vec![caller_token("alice", ALICE), caller_token("bob", BOB)];
    Harness::start_without_refresh_wait(sim.clone(), config).await
}

async fn poll_as(via: &Harness, token: &str, id: u64) -> serde_json::Value {
    via.get(&format!("/res.php?key={token}&action=get&id={id}&json=1"))
        .await
        .json()
}

/// Issue 38 §1: token A's task, made through one replica; Redis restarts empty; token B
/// polls it through the other replica, which never cached the pin. B never gets A's
/// result (no probe hands the task to whoever asks first), and A gets it from either
/// replica once the creating replica has put its pins back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_redis_loses_the_pins_a_task_is_answered_only_to_the_token_that_made_it() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let sim = sim().await;
    let maker = token_replica(&sim, &redis, "kr-1").await;
    let other = token_replica(&sim, &redis, "kr-2").await;
    for replica in [&maker, &other] {
        wait_shared(replica).await;
    }
    let submitted = maker
        .get(&format!(
            "/in.php?key={ALICE}&method=userrecaptcha&googlekey=site&pageurl=https://x.test&json=1"
        ))
        .await
        .json();
    assert_eq!(submitted["status"], 1, "{submitted}");
    let id: u64 = submitted["request"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .or_else(|| submitted["request"].as_u64())
        .expect("a numeric task id");
    redis.restart_empty();
    // Bob polls through the replica without the pin until Alice has her result there.
    let deadline = Instant::now() + Duration::from_secs(20);
    let result = loop {
        let bobs = poll_as(&other, BOB, id).await;
        assert_ne!(bobs["status"], 1, "bob was handed alice's task: {bobs}");
        assert!(
            bobs["request"] == "CAPCHA_NOT_READY" || bobs["request"] == "ERROR_WRONG_CAPTCHA_ID",
            "bob: {bobs}"
        );
        let alices = poll_as(&other, ALICE, id).await;
        if alices["status"] == 1 {
            break alices["request"].clone();
        }
        if alices["request"] != "CAPCHA_NOT_READY" {
            let status = other.get("/status").await.json();
            let maker_status = maker.get("/status").await.json();
            panic!(
                "alice: {alices}; other: {}; maker: {}",
                status["cluster"], maker_status["cluster"]
            );
        }
        assert!(
            Instant::now() < deadline,
            "alice never got her result through the other replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(result.is_string(), "a solution: {result}");
    // From then on, on both replicas: alice's, and unknown to bob.
    for via in [&maker, &other] {
        assert_eq!(poll_as(via, ALICE, id).await["request"], result);
        assert_eq!(
            poll_as(via, BOB, id).await["request"],
            "ERROR_WRONG_CAPTCHA_ID"
        );
    }
}
