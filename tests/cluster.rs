//! Several replicas as one pool on a real `redis-server` (issue 14): threads never overfill
//! a key across the fleet, every poll finds its key on any replica without a probe, a
//! benched key leaves every replica's rotation, a killed replica's threads come back, a
//! Redis outage is served on shares and recovered from, and no request leaks a lease.
//!
//! `redis-server` runs on a unix socket in a temp dir (no TCP port at all). Without it the
//! tests say so and pass, so that `cargo test` works on a fresh machine; `.ci/run` installs
//! it and runs the suite with `CI=true`, which (as `KEYRELAY_REQUIRE_REDIS=1` does) turns its
//! absence into a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::cluster::*;
use common::*;
use keyrelay::config::RedisUrl;
use keyrelay::health::StateKind;
use keyrelay::sim::{SimHandle, SimKeyState};
use rand::Rng;

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

/// Waits until only tasks' leases are left, one per task the simulator is working on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_run_then_restarted_loses_nothing_and_overfills_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let sim = sim().await;
    let replicas = Arc::new(fleet(&sim, &redis).await);
    // A task made before the outage and never polled: it holds its thread throughout.
    let (before, before_key) = submit(&replicas[0]).await;
    let (stop, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let loops = run_loops(&replicas, 24, &stop, &done);
    wait_done(&done, 20, &replicas, "before the outage").await;
    redis.kill();
    for replica in replicas.iter() {
        let app = replica.app.clone();
        eventually("degraded", move || {
            app.cluster().is_some_and(|c| !c.is_shared())
        })
        .await;
        let status = replica.get("/status").await.json();
        assert_eq!(status["cluster"]["mode"], "degraded");
        assert!(status["cluster"]["degraded_reason"].is_string());
    }
    // Slower without Redis (a task finished on another replica holds its creator's
    // thread until Redis returns), but it goes on.
    let at_outage = done.load(Ordering::Relaxed);
    wait_done(&done, at_outage + 10, &replicas, "during the outage").await;
    redis.launch();
    for replica in replicas.iter() {
        wait_shared(replica).await;
    }
    let at_return = done.load(Ordering::Relaxed);
    wait_done(&done, at_return + 30, &replicas, "after the outage").await;
    stop.store(true, Ordering::Relaxed);
    let mut made = vec![(before, before_key)];
    for handle in loops {
        made.extend(handle.await.expect("a loop"));
    }
    assert_never_overfilled(&sim, &replicas);
    // No pin is lost: every task, made before, during or after the outage, is polled with
    // its creating key from a replica that did not make it, through Redis, not a probe.
    let probes_before: f64 = replicas.iter().map(probes).sum();
    for (i, (id, key)) in made.iter().enumerate() {
        let answer = replicas[i % 3]
            .get(&format!("/res.php?key=callerkey&action=get&id={id}&json=1"))
            .await;
        let polled = answer
            .headers
            .get("x-keyrelay-key")
            .and_then(|v| v.to_str().ok());
        assert_eq!(polled, Some(key.as_str()), "task {id}: {}", answer.text());
    }
    let probes_after: f64 = replicas.iter().map(probes).sum();
    assert_eq!(
        probes_after, probes_before,
        "every pin was in Redis or in the replica"
    );
    let metrics = replicas[0].app.render_metrics();
    assert_eq!(
        metric(&metrics, "keyrelay_cluster_up{replica=\"kr-1\"}"),
        Some(1.0)
    );
    let errors: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("keyrelay_cluster_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(errors >= 1.0, "the outage was counted:\n{metrics}");
    // Every cluster metric the shipped alerts name is exported by a replica.
    let alerts = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/prometheus/alerts.yml"),
    )
    .expect("shipped alerts");
    let mut named = 0;
    for (at, _) in alerts.match_indices("keyrelay_cluster_") {
        let name: String = alerts[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        named += 1;
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "alerts.yml uses {name}, which a replica does not export"
        );
    }
    assert!(named >= 2, "the cluster alert names its metrics");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_that_lost_its_data_gets_every_open_lease_back() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let Some(redis) = Redis::start() else { return };
    let sim = sim().await;
    let replicas = Arc::new(fleet(&sim, &redis).await);
    // Open tasks, never polled: each holds a thread of its key until the end of the test.
    let mut open = Vec::new();
    for i in 0..6 {
        open.push(submit(&replicas[i % 3]).await);
    }
    let leases = || -> usize { KEYS.iter().map(|(n, _)| redis.leases(n).len()).sum() };
    assert_eq!(leases(), open.len());
    redis::cmd("FLUSHALL")
        .query::<()>(&mut redis.conn())
        .expect("FLUSHALL");
    assert_eq!(leases(), 0);
    // Each replica notices at its next heartbeat (a third of replica_timeout) and puts its
    // leases back.
    for _ in 0..500 {
        if leases() == open.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(leases(), open.len(), "every open task's lease is back");
    let (stop, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let loops = run_loops(&replicas, 24, &stop, &done);
    wait_done(&done, 40, &replicas, "after the data loss").await;
    stop.store(true, Ordering::Relaxed);
    for handle in loops {
        handle.await.expect("a loop");
    }
    assert_never_overfilled(&sim, &replicas);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_replicas_threads_come_back_and_its_tasks_stay_pollable() {
    let Some(redis) = Redis::start() else { return };
    let sim = sim().await;
    let survivors = fleet(&sim, &redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config_path = write_binary_config(dir.path(), &sim, &redis);
    let mut doomed = Binary::spawn(
        &[
            "--config",
            config_path.to_str().expect("utf-8 path"),
            "--log",
            "info",
        ],
        &[],
    );
    let addr = doomed.wait_for_addr();
    let client = reqwest_free_get(&addr);
    let mut made = Vec::new();
    for _ in 0..6 {
        made.push(client(
            "/in.php?key=k&method=userrecaptcha&googlekey=site&pageurl=https://x.test&json=1",
        ));
    }
    let held_before: usize = KEYS.iter().map(|(n, _)| redis.leases(n).len()).sum();
    assert_eq!(held_before, made.len(), "one lease per task made");
    // kill -9: no shutdown, no release.
    let pid = doomed.pid();
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    let _ = doomed.stop();
    let killed_at = std::time::Instant::now();
    for _ in 0..1000 {
        let held: usize = KEYS.iter().map(|(n, _)| redis.leases(n).len()).sum();
        if held == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let held: usize = KEYS.iter().map(|(n, _)| redis.leases(n).len()).sum();
    assert_eq!(held, 0, "the dead replica's leases expired");
    assert!(
        killed_at.elapsed() <= Duration::from_secs(6),
        "within twice replica_timeout"
    );
    for (id, key) in made {
        let (_, polled) = poll(&survivors[0], id).await;
        assert_eq!(polled.as_deref(), Some(key.as_str()));
    }
    for replica in &survivors {
        assert_eq!(
            probes(replica),
            0.0,
            "found through Redis, not by probing; failed Redis calls: {}",
            cluster_errors(replica)
        );
    }
}

/// Leases, spares and round trips of a replica, by the metric names operators read.
fn round_trips(replica: &Harness, op: &str) -> f64 {
    let text = replica.app.render_metrics();
    metric(
        &text,
        &format!("keyrelay_cluster_round_trips_total{{op=\"{op}\"}}"),
    )
    .unwrap_or(0.0)
}

fn all_spares(redis: &Redis) -> Vec<String> {
    KEYS.iter()
        .flat_map(|(name, _)| redis.spares(name))
        .collect()
}

/// Waits until the fleet holds no spare in Redis or locally: unused ones go back by
/// themselves within `SPARE_IDLE` and a sync.
async fn eventually_no_spares(redis: &Redis, replicas: &[Harness]) {
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
    let sim = sim_with_threads(THREADS_HERE).await;
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
    let sim = sim_with_threads(OPEN).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_restarted_while_redis_is_away_takes_the_share_of_the_fleet_it_last_saw() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let sim = sim().await;
    let data = tempfile::tempdir().expect("temp dir");
    let with_data = |redis: &Redis, name: &str| {
        let mut config = replica_config(&sim, redis, name);
        config.data_dir = Some(data.path().to_owned());
        config
    };
    let mut replicas =
        vec![Harness::start_without_refresh_wait(sim.clone(), with_data(&redis, "kr-1")).await];
    for name in ["kr-2", "kr-3"] {
        let config = replica_config(&sim, &redis, name);
        replicas.push(Harness::start_without_refresh_wait(sim.clone(), config).await);
    }
    for replica in &replicas {
        wait_shared(replica).await;
    }
    wait_fleet(&replicas, 3).await;
    let file = data.path().join("cluster-fleet");
    eventually("the fleet remembered in data_dir", {
        let file = file.clone();
        move || std::fs::read_to_string(&file).is_ok_and(|t| t.lines().count() == 3)
    })
    .await;
    drop(replicas.remove(0));
    redis.kill();
    let restarted =
        Harness::start_without_refresh_wait(sim.clone(), with_data(&redis, "kr-1")).await;
    let cluster = restarted.app.cluster().cloned().expect("[cluster]");
    assert!(!cluster.is_shared(), "no redis: degraded");
    assert_eq!(cluster.live_replicas().len(), 3);
    // 5 threads over 3 replicas: 2 for the first by name, not all 5.
    assert_eq!(cluster.share(THREADS), 2);
    let fresh = tempfile::tempdir().expect("temp dir");
    let mut config = replica_config(&sim, &redis, "kr-9");
    config.data_dir = Some(fresh.path().to_owned());
    let first_start = Harness::start_without_refresh_wait(sim.clone(), config).await;
    let alone = first_start.app.cluster().cloned().expect("[cluster]");
    assert_eq!(
        alone.share(THREADS),
        THREADS,
        "a first start has seen no fleet"
    );
}

fn write_binary_config(dir: &Path, sim: &SimHandle, redis: &Redis) -> PathBuf {
    let mut text = format!(
        "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\ndata_dir = \"{}\"\n\n",
        sim.url(),
        dir.join("data").display()
    );
    for (name, key) in KEYS {
        text.push_str(&format!(
            "[[keys]]\nname = \"{name}\"\nkey = \"{key}\"\nthreads = {THREADS}\n\n"
        ));
    }
    text.push_str(&format!(
        "[cluster]\nredis = \"{}\"\nreplica = \"kr-doomed\"\nreplica_timeout = \"3s\"\ntimeout = \"{}ms\"\n",
        redis.url(),
        REDIS_CALL_TIMEOUT.as_millis()
    ));
    let path = dir.join("proxy.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// A blocking submit through a plain TCP connection to `addr`: the task id and its key.
fn reqwest_free_get(addr: &str) -> impl Fn(&str) -> (u64, String) + '_ {
    move |path| {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        .expect("send");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("read");
        let key = text
            .lines()
            .find_map(|l| l.strip_prefix("x-keyrelay-key: "))
            .expect("key header")
            .trim()
            .to_owned();
        let body = text.split("\r\n\r\n").nth(1).expect("body");
        let json: serde_json::Value = serde_json::from_str(body).expect("json body");
        let id = match &json["request"] {
            serde_json::Value::Number(n) => n.as_u64().expect("numeric id"),
            serde_json::Value::String(s) => s.parse().expect("numeric id"),
            other => panic!("no task id in {other}"),
        };
        (id, key)
    }
}

/// One replica's road to Redis, a unix-socket relay the test can cut and mend: Redis can
/// then come back for one replica and not for another.
struct Relay {
    path: PathBuf,
    open: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    fn start(redis: &Redis) -> Relay {
        use std::sync::atomic::{AtomicBool, Ordering};
        let path = redis.dir.path().join("relay.sock");
        let target = redis.socket();
        let listener = tokio::net::UnixListener::bind(&path).expect("relay binds");
        let open = Arc::new(AtomicBool::new(true));
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn({
            let open = open.clone();
            async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        return;
                    };
                    if !open.load(Ordering::Acquire) {
                        continue; // dropped: the replica sees its connection closed
                    }
                    let target = target.clone();
                    let mut cuts = cuts.clone();
                    cuts.mark_unchanged();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = tokio::net::UnixStream::connect(&target).await
                        else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = cuts.changed() => {}
                        }
                    });
                }
            }
        });
        Relay {
            path,
            open,
            cut,
            task,
        }
    }

    fn url(&self) -> String {
        format!("redis+unix://{}", self.path.display())
    }

    /// Closes every connection through the relay and refuses new ones.
    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::Release);
        self.cut.send_modify(|n| *n += 1);
    }

    fn mend(&self) {
        self.open.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `condition` every 20 ms for at most `bound`.
async fn within(bound: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + bound;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {bound:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_an_outage_no_replica_shares_until_every_live_one_has_put_its_leases_back() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let sim = sim().await;
    let relay = Relay::start(&redis);
    // A replica timeout long enough that kr-2 stays alive in the replica list for the
    // whole time Redis is back for kr-1 only.
    let timeout = Duration::from_secs(20);
    let mut direct = replica_config(&sim, &redis, "kr-1");
    let mut relayed = replica_config(&sim, &redis, "kr-2");
    relayed.cluster.as_mut().expect("cluster").redis = RedisUrl::new(relay.url());
    for config in [&mut direct, &mut relayed] {
        config.cluster.as_mut().expect("cluster").replica_timeout = timeout;
    }
    let kr1 = Harness::start_without_refresh_wait(sim.clone(), direct).await;
    let kr2 = Harness::start_without_refresh_wait(sim.clone(), relayed).await;
    let replicas = [kr1, kr2];
    for replica in &replicas {
        wait_shared(replica).await;
    }
    wait_fleet(&replicas, 2).await;
    let [kr1, kr2] = &replicas;
    let cluster = |h: &Harness| h.app.cluster().cloned().expect("a cluster replica");

    redis.kill();
    relay.cut();
    for replica in &replicas {
        let c = cluster(replica);
        within(Duration::from_secs(10), "degraded", || !c.is_up()).await;
    }
    // Admitted by kr-2 on its share, with Redis away: not in Redis yet.
    let (alone, alone_key) = submit(kr2).await;

    redis.launch();
    let c1 = cluster(kr1);
    within(Duration::from_secs(10), "kr-1 reaches redis again", || {
        c1.is_up()
    })
    .await;
    // kr-1's own submits go into Redis at once, while it still keeps to its share.
    let (early, early_key) = submit(kr1).await;
    assert!(
        redis.leases(&early_key).contains(&format!("t:{early}")),
        "a replica that reaches Redis puts its leases there before it shares"
    );
    // As long as kr-2 is alive in the list and has not put back what it admitted alone,
    // kr-1 does not count on Redis alone: watched for longer than the old fixed settle
    // period (a third of the replica timeout and a second).
    let watch_until = tokio::time::Instant::now() + timeout / 3 + Duration::from_secs(2);
    while tokio::time::Instant::now() < watch_until {
        assert!(!c1.is_shared(), "kr-1 shared while kr-2 still served alone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = kr1.get("/status").await.json();
    assert_eq!(status["cluster"]["mode"], "degraded");
    let reason = status["cluster"]["degraded_reason"]
        .as_str()
        .expect("a reason");
    assert!(reason.contains("waiting for kr-2"), "{reason}");

    relay.mend();
    let c2 = cluster(kr2);
    within(Duration::from_secs(30), "both replicas share again", || {
        c1.is_shared() && c2.is_shared()
    })
    .await;
    assert!(
        redis.leases(&alone_key).contains(&format!("t:{alone}")),
        "kr-2 put back the lease it admitted alone"
    );
    assert_never_overfilled(&sim, &replicas);
}
