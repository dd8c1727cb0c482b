//! A replica's spares (leases taken ahead of submits) and its Redis round trips: one per
//! submit on the success path, scripts by sha, and spares that never let the fleet
//! overfill a key and go back when idle.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::Redis;
use common::replicas::*;
// The fleet's, by threads per key, not common's by key values.
use common::replicas::sim_with;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_submit_on_the_success_path_costs_one_round_trip_once_a_spare_is_ready() {
    let Some((redis, replica)) = lone_replica(20).await else {
        return;
    };
    let (acquires, pins) = (
        round_trips(&replica, "acquire"),
        round_trips(&replica, "pin"),
    );
    let mut made = Vec::new();
    for _ in 0..30 {
        made.push(submit(&replica).await);
    }
    let acquired = round_trips(&replica, "acquire") - acquires;
    let pinned = round_trips(&replica, "pin") - pins;
    assert_eq!(pinned, 30.0, "one pin round trip per accepted submit");
    // The first submit of each key takes its lease on its own; every later one uses the
    // spare the previous pin took.
    assert!(
        acquired <= 3.0,
        "{acquired} acquire round trips for 30 submits"
    );
    // Spares are not threads in use: the fleet counts one lease per open task.
    let leases: usize = KEYS.iter().map(|(n, _)| redis.leases(n).len()).sum();
    assert_eq!(leases, made.len(), "one lease per open task");
    assert!(!all_spares(&redis).is_empty(), "the replica holds a spare");
    for (id, key) in &made {
        let (_, polled) = poll(&replica, *id).await;
        assert_eq!(polled.as_deref(), Some(key.as_str()));
    }
    // Idle, the spares go back; the open tasks keep their leases.
    eventually_no_spares(&redis, std::slice::from_ref(&replica)).await;
    let leases: usize = KEYS.iter().map(|(n, _)| redis.leases(n).len()).sum();
    assert_eq!(
        leases,
        made.len(),
        "tasks' leases untouched by the spares' return"
    );
}

/// `INFO commandstats` calls of one command (`evalsha`, `eval`, …), 0 if never called.
fn command_calls(redis: &Redis, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.conn())
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix)?.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scripts_go_by_sha_and_a_redis_that_forgot_them_is_taught_again() {
    let Some((redis, replica)) = lone_replica(20).await else {
        return;
    };
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(submit(&replica).await);
    }
    assert!(
        command_calls(&redis, "evalsha") >= 5,
        "scripts sent by SHA1"
    );
    assert_eq!(command_calls(&redis, "eval"), 0, "no script body sent");
    // Redis forgets every script, as a restart without data or `SCRIPT FLUSH` does. Each
    // kind of call (the pin, an acquire, the sync's counts) loads them again and goes on.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut redis.conn())
        .expect("SCRIPT FLUSH");
    for _ in 0..5 {
        made.push(submit(&replica).await);
    }
    for (id, key) in &made {
        let (_, polled) = poll(&replica, *id).await;
        assert_eq!(polled.as_deref(), Some(key.as_str()), "task {id}");
    }
    let leases: usize = KEYS.iter().map(|(n, _)| redis.leases(n).len()).sum();
    assert_eq!(leases, made.len(), "one lease per open task, none lost");
    assert!(
        replica.app.cluster().is_some_and(|c| c.is_shared()),
        "a forgotten script is no outage: {}",
        cluster_errors(&replica)
    );
    assert_eq!(cluster_errors(&replica), "", "no failed Redis call");
    assert_eq!(
        command_calls(&redis, "eval"),
        0,
        "still no script body sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spares_never_let_the_fleet_overfill_a_key_and_go_back_when_idle() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let Some(redis) = Redis::start() else { return };
    const THREADS_HERE: u32 = 8;
    let sim = sim_with(THREADS_HERE).await;
    let mut replicas = Vec::new();
    for name in ["kr-1", "kr-2"] {
        let config = replica_config_with(&sim, &redis, name, THREADS_HERE);
        replicas.push(Harness::start_without_refresh_wait(sim.clone(), config).await);
    }
    for replica in &replicas {
        wait_shared(replica).await;
    }
    wait_fleet(&replicas, 2).await;
    let replicas = Arc::new(replicas);
    // Light load first: with room to spare, submits use spares and need no acquire round
    // trip. Then more loops than the fleet has threads: spares are refused once the keys
    // fill, and whatever they hold still counts against each key.
    for (loops, tasks, light) in [(6, 120, true), (40, 300, false)] {
        let (stop, done) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let acquires: f64 = replicas.iter().map(|r| round_trips(r, "acquire")).sum();
        let handles = run_loops(&replicas, loops, &stop, &done);
        wait_done(&done, tasks, &replicas, "loops with spares").await;
        stop.store(true, Ordering::Relaxed);
        let mut made = 0;
        for handle in handles {
            made += handle.await.expect("a loop").len();
        }
        assert_never_overfilled_at(&sim, &replicas, THREADS_HERE);
        let acquired = replicas
            .iter()
            .map(|r| round_trips(r, "acquire"))
            .sum::<f64>()
            - acquires;
        // How many submits find a spare depends on how the loops' submits fall on keys and
        // replicas in time (an unused spare goes back after SPARE_IDLE), so only their use
        // is asserted here; the round trip a spare saves is counted exactly in
        // a_submit_on_the_success_path_costs_one_round_trip_once_a_spare_is_ready.
        if light {
            assert!(
                acquired < made as f64,
                "no submit used a spare: {acquired} acquires for {made} submits"
            );
        }
    }
    for replica in replicas.iter() {
        assert_eq!(
            probes(replica),
            0.0,
            "no replica probed; its failed Redis calls: {}",
            cluster_errors(replica)
        );
    }
    eventually_async_leases(&redis, 0).await;
    eventually_no_spares(&redis, &replicas).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pins_never_take_more_than_eight_spares_of_a_key() {
    // keyrelay's MAX_SPARES: the most spares a replica keeps of one key.
    const MAX_SPARES: usize = 8;
    let Some((redis, replica)) = lone_replica(40).await else {
        return;
    };
    let (redis, replica) = (Arc::new(redis), Arc::new(replica));
    let cluster = replica.app.cluster().cloned().expect("a cluster replica");
    let mut made = 0;
    for burst in 0..4 {
        // Many pins at once (96 tasks in all, of 120 threads), each of which may ask for a
        // batch of spares: between them they never ask for more than the stock has room
        // for.
        let submits: Vec<_> = (0..24)
            .map(|_| {
                let replica = replica.clone();
                tokio::spawn(async move { submit(&replica).await })
            })
            .collect();
        for handle in submits {
            handle.await.expect("a submit");
            made += 1;
        }
        for (name, _) in KEYS {
            let in_redis = redis.spares(name).len();
            let ready = cluster.spares_ready(name);
            assert!(
                in_redis <= MAX_SPARES && ready <= MAX_SPARES,
                "burst {burst}, key {name}: {in_redis} spares in Redis, {ready} ready"
            );
        }
        // Every spare granted is in the stock (a sync giving idle ones back may be between
        // its local removal and its ZREM for a moment; an orphan would stay for 3 s).
        let (redis_view, stock) = (redis.clone(), cluster.clone());
        within(
            Duration::from_secs(1),
            "Redis's spares are the stock's",
            move || {
                KEYS.iter()
                    .all(|(name, _)| redis_view.spares(name).len() == stock.spares_ready(name))
            },
        )
        .await;
    }
    let leases: usize = KEYS.iter().map(|(n, _)| redis.leases(n).len()).sum();
    assert_eq!(leases, made, "one lease per open task");
    assert_eq!(cluster_errors(&replica), "", "no failed Redis call");
    eventually_no_spares(&redis, std::slice::from_ref(&*replica)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spares_granted_after_their_pin_gave_up_waiting_are_removed() {
    use keyrelay::captcha::TaskId;
    use keyrelay::cluster::Admit;
    let Some((redis, replica)) = lone_replica(20).await else {
        return;
    };
    let cluster = replica.app.cluster().cloned().expect("a cluster replica");
    let Ok(Admit::Granted(lease)) = cluster.acquire("a", 20).await else {
        panic!("a lease of an idle key");
    };
    // Redis holds every command for one and a half call timeouts: the pin (which asks for a
    // spare, the key's stock being empty) gives up after its timeout, and Redis runs it
    // afterwards, granting a spare that nobody here will use or renew.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(REDIS_CALL_TIMEOUT.as_millis() as u64 * 3 / 2)
        .arg("ALL")
        .query(&mut redis.conn())
        .expect("CLIENT PAUSE");
    cluster.pin(Some(lease), &TaskId::Num(1), "a", "", 20).await;
    assert_eq!(
        cluster.spares_ready("a"),
        0,
        "no answer, no spare in the stock"
    );
    // The pin's guard removed what it asked for, after the script: long before the spare
    // would expire on its own (3 s after the pause ends, the test's replica_timeout).
    let redis = Arc::new(redis);
    let leases = redis.clone();
    within(
        Duration::from_millis(2000),
        "the orphan spare removed",
        move || leases.spares("a").is_empty() && leases.leases("a") == ["t:1"],
    )
    .await;
}
