//! A cluster through outages: Redis killed mid-run and restarted, Redis that lost its
//! data, a killed replica, a replica restarted while Redis is away, and Redis coming back
//! for one replica before another. Nothing is lost, nothing overfills.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::Redis;
use common::replicas::*;
use common::*;
use keyrelay::config::RedisUrl;
use keyrelay::sim::SimHandle;

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
async fn outside_load_read_while_redis_was_away_is_forgotten_when_it_returns() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let sim = sim().await;
    let replicas = fleet(&sim, &redis).await;
    redis.kill();
    for replica in &replicas {
        let app = replica.app.clone();
        eventually("degraded", move || {
            app.cluster().is_some_and(|c| !c.is_shared())
        })
        .await;
    }
    // Two tasks through the second replica, never polled: the service works on them.
    for _ in 0..2 {
        submit(&replicas[1]).await;
    }
    // The first replica reads the service while Redis is away: to it, those tasks are
    // outside load.
    let app = replicas[0].app.clone();
    let snapshot = app.snapshot();
    let timeout = Duration::from_secs(5);
    for key in snapshot.pool.keys() {
        keyrelay::refresh::refresh_key(&app, key, timeout).await;
    }
    let external = |app: &keyrelay::App| -> u32 {
        let snapshot = app.snapshot();
        snapshot
            .pool
            .keys()
            .iter()
            .map(|key| app.capacity().load(key.id).external)
            .sum()
    };
    assert_eq!(
        external(&app),
        2,
        "the other replica's tasks, as outside load"
    );
    redis.launch();
    wait_shared(&replicas[0]).await;
    // The fleet's count holds those tasks again: they are not counted twice.
    eventually("outside load forgotten", move || external(&app) == 0).await;
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
