//! Operator holds are pool state that outlives the process and is shared by a fleet (issue
//! 38 §2): a single instance keeps them in `data_dir` through `kill -9` and reloads, and
//! refuses (5xx, nothing changed) a hold it could not save; replicas on one real
//! `redis-server` apply a hold set through any of them within a sync, lift it through any
//! other, and keep it through a FLUSHALL, a Redis outage and a restart.
//!
//! `redis-server` runs on a unix socket in a temp dir, as in `tests/cluster.rs`. Without it
//! the cluster tests say so and pass; with `CI=true` or `KEYRELAY_REQUIRE_REDIS=1` its
//! absence is a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::redis_server::Redis;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use keyrelay::config::{Cluster, Config, RedisUrl};
use keyrelay::pool::AdminHold;
use keyrelay::reload;
use keyrelay::sim::{SimHandle, SimKey, Simulator};

/// The holds file's name in `data_dir` (docs/admin.md).
const HOLDS_FILE: &str = "admin-holds.json";

/// Sends `method path` to `addr`; the status and the body.
async fn call(addr: &str, method: Method, path: &str) -> (StatusCode, String) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let response = client.request(request).await.expect("keyrelay answers");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The `hold` of key `name` in `GET /admin/keys` through `addr`.
async fn listed_hold(addr: &str, name: &str) -> Option<String> {
    let (status, body) = call(addr, Method::GET, "/admin/keys").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).expect("json");
    let row = list["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|row| row["name"] == name)
        .unwrap_or_else(|| panic!("no row for {name}: {body}"))
        .clone();
    row["hold"].as_str().map(str::to_owned)
}

/// The keys the simulator received the submits of since its last `clear_received`.
fn submitted_with(sim: &SimHandle) -> Vec<String> {
    sim.received()
        .into_iter()
        .filter(|r| r.path == "/in.php")
        .filter_map(|r| r.key)
        .collect()
}

/// Submits `n` tasks through `addr`, each accepted.
async fn submit_n(addr: &str, n: usize) {
    for _ in 0..n {
        let (status, body) = call(
            addr,
            Method::GET,
            &format!(
                "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=https://x.test&json=1"
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("\"status\":1"), "submit refused: {body}");
    }
}

/// A simulator with keys A, B, C, each with room for every task these tests submit.
async fn roomy_sim() -> SimHandle {
    let mut sim = Simulator::new();
    for key in [KEY_A, KEY_B, KEY_C] {
        sim = sim.key(SimKey {
            threads: 50,
            ..SimKey::valid(key)
        });
    }
    sim.spawn().await.expect("simulator binds 127.0.0.1:0")
}

// === a single instance ===

/// Writes a proxy.toml for `sim` in `dir`, which is then its `data_dir` too.
fn write_config(dir: &Path, sim_url: &str) -> PathBuf {
    let path = dir.join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{sim_url}\"\nrefresh_interval = \"1h\"\n\
             [[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n[[keys]]\nname = \"b\"\nkey = \"{KEY_B}\"\n\
             [[keys]]\nname = \"c\"\nkey = \"{KEY_C}\"\n"
        ),
    )
    .expect("write the config");
    path
}

#[tokio::test]
async fn a_disabled_key_stays_disabled_after_kill_minus_9() {
    let sim = roomy_sim().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(dir.path(), &sim.url());
    let args = ["--config", config.to_str().expect("utf-8 path")];

    let mut proxy = Binary::spawn(&args, &[]);
    let addr = proxy.wait_for_addr();
    let (status, body) = call(&addr, Method::POST, "/admin/keys/a/disable").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&addr, Method::POST, "/admin/keys/b/drain").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Answered: on disk now, whatever happens to the process next.
    let killed = Command::new("kill")
        .args(["-9", &proxy.pid().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    proxy.wait_exit(Duration::from_secs(10));
    assert!(dir.path().join(HOLDS_FILE).exists());

    let mut proxy = Binary::spawn(&args, &[]);
    let addr = proxy.wait_for_addr();
    assert_eq!(listed_hold(&addr, "a").await.as_deref(), Some("disabled"));
    assert_eq!(listed_hold(&addr, "b").await.as_deref(), Some("draining"));
    assert_eq!(listed_hold(&addr, "c").await, None);
    sim.clear_received();
    submit_n(&addr, 6).await;
    let keys = submitted_with(&sim);
    assert_eq!(keys.len(), 6);
    assert!(
        keys.iter().all(|k| k == KEY_C),
        "held keys took submits: {keys:?}"
    );

    // Enabled, and killed again: the lift is kept as the holds were.
    let (status, _) = call(&addr, Method::POST, "/admin/keys/a/enable").await;
    assert_eq!(status, StatusCode::OK);
    drop(proxy);
    let mut proxy = Binary::spawn(&args, &[]);
    let addr = proxy.wait_for_addr();
    assert_eq!(listed_hold(&addr, "a").await, None);
    assert_eq!(listed_hold(&addr, "b").await.as_deref(), Some("draining"));
    drop(proxy);
}

/// A config for `sim` with keys a, b, c, keeping its state in `dir`.
fn config_in(sim: &SimHandle, dir: &Path) -> Config {
    let mut config = config_for(
        sim,
        &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
    );
    config.data_dir = Some(dir.to_owned());
    config
}

#[tokio::test]
async fn a_drain_survives_a_reload_and_a_removed_keys_hold_is_dropped_at_start() {
    let sim = roomy_sim().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let h = Harness::start(sim.clone(), config_in(&sim, dir.path())).await;
    h.app
        .set_admin_hold("b", Some(AdminHold::Draining))
        .expect("b is configured");
    h.app
        .set_admin_hold("c", Some(AdminHold::Disabled))
        .expect("c is configured");
    let mut config = h.app.snapshot().config.clone();
    config.keys[1].weight = 5.0;
    reload::apply(&h.app, config.clone()).expect("a valid config");
    assert_eq!(h.app.admin_hold("b"), Some(AdminHold::Draining));
    sim.clear_received();
    let addr = h.addr.to_string();
    submit_n(&addr, 4).await;
    assert!(
        submitted_with(&sim).iter().all(|k| k == KEY_A),
        "{:?}",
        submitted_with(&sim)
    );
    h.stop().await;

    // Started again without c: b's drain is read back, c's hold is dropped.
    let mut without_c = config_in(&sim, dir.path());
    without_c.keys.retain(|k| k.name != "c");
    let h = Harness::start(sim.clone(), without_c).await;
    assert_eq!(h.app.admin_hold("b"), Some(AdminHold::Draining));
    assert_eq!(h.app.admin_hold("c"), None);
    h.stop().await;
    // And c, configured again later, starts without it.
    let h = Harness::start(sim.clone(), config_in(&sim, dir.path())).await;
    assert_eq!(h.app.admin_hold("c"), None);
    assert_eq!(h.app.admin_hold("b"), Some(AdminHold::Draining));
    h.stop().await;
}

#[tokio::test]
async fn a_hold_that_cannot_be_saved_is_a_500_and_changes_nothing() {
    let sim = roomy_sim().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let h = Harness::start(sim.clone(), config_in(&sim, dir.path())).await;
    let addr = h.addr.to_string();
    let (status, _) = call(&addr, Method::POST, "/admin/keys/b/drain").await;
    assert_eq!(status, StatusCode::OK);
    // A directory where the file goes: every later write of it fails.
    let file = dir.path().join(HOLDS_FILE);
    std::fs::remove_file(&file).expect("the holds file");
    std::fs::create_dir(&file).expect("mkdir");
    std::fs::write(file.join("blocker"), b"x").expect("write");

    for (action, before) in [("disable", None), ("enable", Some("draining"))] {
        let key = if before.is_some() { "b" } else { "a" };
        let (status, body) =
            call(&addr, Method::POST, &format!("/admin/keys/{key}/{action}")).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
        let error: serde_json::Value = serde_json::from_str(&body).expect("a json error");
        let text = error["error"].as_str().expect("an error text");
        assert!(
            text.contains(HOLDS_FILE) && text.contains("not applied"),
            "{text}"
        );
        assert_eq!(listed_hold(&addr, key).await.as_deref(), before, "{action}");
    }
    // An unknown key is still a 404, before any write.
    let (status, body) = call(&addr, Method::POST, "/admin/keys/nobody/disable").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // Once the file can be written again, so can holds.
    std::fs::remove_dir_all(&file).expect("rm");
    let (status, _) = call(&addr, Method::POST, "/admin/keys/a/disable").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h.app.admin_hold("a"), Some(AdminHold::Disabled));
    h.stop().await;
}

// === a cluster ===

/// The `state` of key `name`'s hold hash, as the fleet recorded it.
fn hold_state(redis: &Redis, name: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(format!("keyrelay:key:{{{name}}}:hold"))
        .arg("state")
        .query(&mut redis.conn())
        .expect("HGET")
}

fn flushall(redis: &Redis) {
    redis::cmd("FLUSHALL")
        .query::<()>(&mut redis.conn())
        .expect("FLUSHALL");
}

/// Replica `name` of the fleet on `redis`, keeping its state in `dir`.
fn replica_config(sim: &SimHandle, redis: &Redis, name: &str, dir: &Path) -> Config {
    let mut config = config_in(sim, dir);
    config.cluster = Some(Cluster {
        redis: RedisUrl::new(redis.url()),
        replica: name.to_owned(),
        prefix: "keyrelay".to_owned(),
        replica_timeout: Duration::from_secs(3),
        // As tests/cluster.rs: a slow call on a busy CI machine is not a Redis outage.
        timeout: Duration::from_secs(1),
        sync_interval: Duration::from_millis(500),
    });
    config
}

async fn start_replica(sim: &SimHandle, redis: &Redis, name: &str, dir: &Path) -> Harness {
    let config = replica_config(sim, redis, name, dir);
    let replica = Harness::start_without_refresh_wait(sim.clone(), config).await;
    let app = replica.app.clone();
    eventually("replica in shared mode", move || {
        app.cluster().is_some_and(|c| c.is_shared())
    })
    .await;
    replica
}

/// Waits until `replica` has `hold` on `name`.
async fn wait_hold(replica: &Harness, name: &str, hold: Option<AdminHold>) {
    let app = replica.app.clone();
    let what = format!("{name} held {hold:?}");
    eventually(&what, move || app.admin_hold(name) == hold).await;
}

/// Two replicas on one Redis, each with its own data_dir; `None` without redis-server.
struct Fleet {
    sim: SimHandle,
    redis: Redis,
    dirs: [tempfile::TempDir; 2],
    r1: Harness,
    r2: Harness,
}

impl Fleet {
    async fn start() -> Option<Fleet> {
        let redis = Redis::start()?;
        let sim = roomy_sim().await;
        let dirs = [
            tempfile::tempdir().expect("temp dir"),
            tempfile::tempdir().expect("temp dir"),
        ];
        let r1 = start_replica(&sim, &redis, "kr-1", dirs[0].path()).await;
        let r2 = start_replica(&sim, &redis, "kr-2", dirs[1].path()).await;
        Some(Fleet {
            sim,
            redis,
            dirs,
            r1,
            r2,
        })
    }
}

#[tokio::test]
async fn a_hold_set_through_one_replica_holds_on_all_and_outlives_redis_data_and_restarts() {
    let Some(Fleet {
        sim,
        redis,
        dirs,
        r1,
        r2,
    }) = Fleet::start().await
    else {
        return;
    };
    let (addr1, addr2) = (r1.addr.to_string(), r2.addr.to_string());

    // Disabled through replica 1: replica 2 applies it within a sync, lists it, and sends
    // the key no submit.
    let (status, body) = call(&addr1, Method::POST, "/admin/keys/a/disable").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    wait_hold(&r2, "a", Some(AdminHold::Disabled)).await;
    assert_eq!(listed_hold(&addr2, "a").await.as_deref(), Some("disabled"));
    sim.clear_received();
    submit_n(&addr2, 9).await;
    let keys = submitted_with(&sim);
    assert_eq!(keys.len(), 9);
    assert!(!keys.iter().any(|k| k == KEY_A), "{keys:?}");

    // Enabled through replica 2: lifted on replica 1.
    let (status, body) = call(&addr2, Method::POST, "/admin/keys/a/enable").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    wait_hold(&r1, "a", None).await;
    assert_eq!(listed_hold(&addr1, "a").await, None);

    // Redis loses everything: the hold stays in force on both, and is put back.
    let (status, _) = call(&addr1, Method::POST, "/admin/keys/b/drain").await;
    assert_eq!(status, StatusCode::OK);
    wait_hold(&r2, "b", Some(AdminHold::Draining)).await;
    flushall(&redis);
    for _ in 0..3 {
        // Several syncs' worth: absence in Redis never lifts a hold.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(r1.app.admin_hold("b"), Some(AdminHold::Draining));
        assert_eq!(r2.app.admin_hold("b"), Some(AdminHold::Draining));
    }
    let state = || hold_state(&redis, "b");
    for _ in 0..1000 {
        if state().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state().as_deref(), Some("draining"), "put back into redis");
    // The lift of a is put back too: a copy of the older disable can never win over it.
    assert_eq!(hold_state(&redis, "a").as_deref(), Some("enabled"));

    // A lift made right after a flush is not undone by a replica putting back its older
    // copy of the drain.
    flushall(&redis);
    let (status, _) = call(&addr2, Method::POST, "/admin/keys/b/enable").await;
    assert_eq!(status, StatusCode::OK);
    wait_hold(&r1, "b", None).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(r1.app.admin_hold("b"), None);
        assert_eq!(r2.app.admin_hold("b"), None);
    }
    assert_eq!(hold_state(&redis, "b").as_deref(), Some("enabled"));

    // A restarted replica keeps the hold, from its file before Redis answers, and after.
    let (status, _) = call(&addr1, Method::POST, "/admin/keys/c/disable").await;
    assert_eq!(status, StatusCode::OK);
    wait_hold(&r2, "c", Some(AdminHold::Disabled)).await;
    r2.stop().await;
    let r2 = start_replica(&sim, &redis, "kr-2", dirs[1].path()).await;
    assert_eq!(r2.app.admin_hold("c"), Some(AdminHold::Disabled));
    assert_eq!(r2.app.admin_hold("a"), None);
    assert_eq!(
        listed_hold(&r2.addr.to_string(), "c").await.as_deref(),
        Some("disabled")
    );
    r1.stop().await;
    r2.stop().await;
}

#[tokio::test]
async fn a_hold_set_while_redis_is_down_reaches_the_other_replicas_when_it_returns() {
    let Some(Fleet {
        sim: _sim,
        mut redis,
        dirs: _dirs,
        r1,
        r2,
    }) = Fleet::start().await
    else {
        return;
    };
    redis.kill();
    // Applied and kept on the replica that answered, though Redis cannot take it.
    let (status, body) = call(&r1.addr.to_string(), Method::POST, "/admin/keys/a/disable").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(r1.app.admin_hold("a"), Some(AdminHold::Disabled));
    assert_eq!(
        r2.app.admin_hold("a"),
        None,
        "the other replica cannot know yet"
    );
    redis.launch();
    wait_hold(&r2, "a", Some(AdminHold::Disabled)).await;
    assert_eq!(hold_state(&redis, "a").as_deref(), Some("disabled"));
    r1.stop().await;
    r2.stop().await;
}
