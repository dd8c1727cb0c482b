//! Hot reload: a changed proxy.toml takes effect without a restart, keys that keep their
//! name keep their health and figures, removed keys still serve their tasks, an invalid file
//! changes nothing, and reloads under load fail no request.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use keyrelay::config::Config;
use keyrelay::health::{HealthEvent, StateKind};
use keyrelay::reload::{reload_and_report, reload_file};

/// A proxy.toml for the simulator with the given keys: (name, value, weight).
fn write_config(path: &Path, sim_url: &str, keys: &[(&str, &str, f64)]) {
    let mut text = format!(
        "listen = \"127.0.0.1:0\"\nupstream = \"{sim_url}\"\nrefresh_interval = \"1h\"\n\
         [failover]\nbackoff_base = \"1ms\"\nbackoff_max = \"2ms\"\n\
         [polling]\ninterval = \"0s\"\n"
    );
    // Polls relayed as they come (`[polling] interval = "0s"`): these tests poll the
    // moment a task exists, to see which key the poll goes out with.
    for (name, value, weight) in keys {
        text.push_str(&format!(
            "[[keys]]\nname = \"{name}\"\nkey = \"{value}\"\nweight = {weight}\n"
        ));
    }
    std::fs::write(path, text).unwrap();
}

async fn from_file(keys: &[(&str, &str, f64)]) -> (Harness, tempfile::TempDir) {
    let sim = sim_with(&[KEY_A, KEY_B, KEY_C, KEY_D]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    write_config(&path, &sim.url(), keys);
    let config = Config::load(&path).unwrap();
    (Harness::start(sim, config).await, dir)
}

fn names(h: &Harness) -> Vec<String> {
    h.app
        .snapshot()
        .pool
        .keys()
        .iter()
        .map(|k| k.name.clone())
        .collect()
}

#[tokio::test]
async fn a_reload_adds_removes_and_keeps_keys_with_their_state() {
    let (h, dir) = from_file(&[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]).await;
    let path = dir.path().join("proxy.toml");
    let key_a = h.app.snapshot().pool.keys()[0].clone();
    // Cooling, which the refresh a reload triggers leaves alone (it would restore a
    // benched key that the simulator says is fine).
    h.app.record_health(
        &key_a,
        HealthEvent::Cool {
            reason: keyrelay::health::Reason::of_code("MAX_USER_TURN"),
            duration: std::time::Duration::from_secs(3600),
        },
    );
    // A task on b, which the reload removes.
    let task = h.submit().await;
    assert_eq!(h.sim.task_owner(task).as_deref(), Some(KEY_B));

    write_config(&path, &h.sim.url(), &[("a", KEY_A, 5.0), ("c", KEY_C, 1.0)]);
    let applied = reload_file(&h.app, &path).unwrap();
    assert_eq!(applied.added, vec!["c"]);
    assert_eq!(applied.kept, vec!["a"]);
    assert_eq!(applied.removed, vec!["b"]);
    assert!(applied.needs_restart.is_empty());
    assert_eq!(names(&h), vec!["a", "c"]);

    let snapshot = h.app.snapshot();
    let new_a = &snapshot.pool.keys()[0];
    assert_eq!(new_a.id, key_a.id, "same name and key: same id");
    assert_eq!(new_a.weight, 5.0, "new settings apply");
    assert_eq!(
        new_a.stats.balance(),
        Some(10.0),
        "learned figures carry over"
    );
    assert_eq!(h.state_of("a"), (StateKind::Cooling, Some("MAX_USER_TURN")));

    // b is out of rotation but still serves its task.
    let polled = h.get(&format!("/res.php?action=get&id={task}")).await;
    assert_eq!(polled.text(), "CAPCHA_NOT_READY");
    let poll = h
        .sim
        .received()
        .into_iter()
        .rfind(|r| r.action.as_deref() == Some("get"))
        .unwrap();
    assert_eq!(poll.key.as_deref(), Some(KEY_B));
    // New tasks go to c, the only key in rotation.
    let next = h.submit().await;
    assert_eq!(h.sim.task_owner(next).as_deref(), Some(KEY_C));
    h.stop().await;
}

#[tokio::test]
async fn an_invalid_file_is_rejected_and_changes_nothing() {
    let (h, dir) = from_file(&[("a", KEY_A, 1.0)]).await;
    let path = dir.path().join("proxy.toml");
    std::fs::write(
        &path,
        "upstream = \"http://127.0.0.1:1\"\n[[keys]]\nname = \"a\"\nkey = \"x\"\nweight = -1\n",
    )
    .unwrap();
    let error = reload_file(&h.app, &path).unwrap_err();
    assert!(error.to_string().contains("weight: must be > 0"), "{error}");
    reload_and_report(&h.app, &path, "test");
    assert_eq!(names(&h), vec!["a"]);
    assert_eq!(
        h.app.snapshot().config.upstream.as_str(),
        h.sim.url(),
        "upstream unchanged"
    );
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_config_reloads_total{result=\"rejected\"}"
        ),
        Some(1.0)
    );
    h.submit().await;
    h.stop().await;
}

/// `upstream_no_proxy` is read at start with the proxy; a reload that changes only the list
/// names it, not `upstream_proxy`, and keeps the running list.
#[tokio::test]
async fn a_changed_upstream_no_proxy_is_named_as_needing_a_restart() {
    let sim = sim_with(&[KEY_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    let write = |proxy: &str, direct: &str| {
        std::fs::write(
            &path,
            format!(
                "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\nrefresh_interval = \"1h\"\n\
                 upstream_proxy = \"{proxy}\"\nupstream_no_proxy = {direct}\n\
                 [[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n",
                sim.url()
            ),
        )
        .unwrap();
    };
    // Nothing listens on port 3: only the bypass lets the startup refresh through.
    write("http://127.0.0.1:3", "[\"127.0.0.1\"]");
    let h = Harness::start(sim.clone(), Config::load(&path).unwrap()).await;

    write("http://127.0.0.1:3", "[\"127.0.0.1\", \"localhost\"]");
    let applied = reload_file(&h.app, &path).unwrap();
    assert_eq!(applied.needs_restart, vec!["upstream_no_proxy"]);
    let running = h.app.snapshot().config.upstream_proxy.clone().unwrap();
    assert_eq!(running.direct(), ["127.0.0.1"]);

    write("http://127.0.0.1:4", "[\"127.0.0.1\"]");
    let applied = reload_file(&h.app, &path).unwrap();
    assert_eq!(applied.needs_restart, vec!["upstream_proxy"]);
    h.submit().await;
    h.stop().await;
}

#[tokio::test]
async fn start_only_settings_keep_their_running_values() {
    let (h, dir) = from_file(&[("a", KEY_A, 1.0)]).await;
    let path = dir.path().join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:1\"\nupstream = \"{}\"\nupstream_ca = \"roots.pem\"\n\
             upstream_proxy = \"http://u:pw@127.0.0.1:3\"\n\
             [pins]\nttl = \"3h\"\n\
             [tls]\nlisten = \"127.0.0.1:2\"\n[ca]\ncert = \"c.pem\"\nkey = \"k.pem\"\n\
             [forward]\nintercept = [\"x.test\"]\ntunnel = \"none\"\n[access]\nopen = true\n\
             [[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n",
            h.sim.url()
        ),
    )
    .unwrap();
    let applied = reload_file(&h.app, &path).unwrap();
    assert_eq!(
        applied.needs_restart,
        vec![
            "listen",
            "tls",
            "ca",
            "forward.intercept",
            "access.open",
            "upstream_ca",
            "upstream_proxy",
            "pins"
        ]
    );
    let snapshot = h.app.snapshot();
    assert_eq!(snapshot.config.listen.port(), 0);
    assert!(snapshot.config.tls.is_none() && snapshot.config.ca.files.is_none());
    assert!(snapshot.config.forward.intercept.is_none() && !snapshot.config.access.open);
    assert!(snapshot.config.upstream_ca.is_none());
    assert!(snapshot.config.upstream_proxy.is_none());
    // What the server reads per request applies at once.
    assert_eq!(
        snapshot.config.forward.tunnel,
        keyrelay::config::Tunnel::None
    );
    assert_eq!(
        snapshot.config.pins.ttl,
        std::time::Duration::from_secs(2 * 3600)
    );
    h.stop().await;
}

#[tokio::test]
async fn the_watcher_applies_a_changed_file() {
    let (h, dir) = from_file(&[("a", KEY_A, 1.0)]).await;
    let path = dir.path().join("proxy.toml");
    let watcher = tokio::spawn(keyrelay::reload::watch(h.app.clone(), path.clone()));
    write_config(&path, &h.sim.url(), &[("a", KEY_A, 1.0), ("d", KEY_D, 1.0)]);
    eventually("the watcher reloaded", || names(&h) == ["a", "d"]).await;
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_config_reloads_total{result=\"applied\"}"
        ),
        Some(1.0)
    );
    // The added key gets its balance read without waiting for the next round.
    let app = h.app.clone();
    eventually("d's balance read", || {
        app.snapshot().pool.keys()[1].stats.balance() == Some(10.0)
    })
    .await;
    watcher.abort();
    h.stop().await;
}

#[tokio::test]
async fn twenty_reloads_under_continuous_load_fail_no_request() {
    let (h, dir) = from_file(&[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]).await;
    let path = dir.path().join("proxy.toml");
    let h = Arc::new(h);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (h, stop, done) = (h.clone(), stop.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut bad = Vec::new();
            // Bounded: each worker stops on the flag or after 2,000 tasks.
            for _ in 0..2_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let submit = h
                    .get(&format!(
                        "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
                    ))
                    .await;
                let json: serde_json::Value = match serde_json::from_slice(&submit.body) {
                    Ok(json) => json,
                    Err(_) => {
                        bad.push(submit.text());
                        continue;
                    }
                };
                if submit.status != 200 || json["status"] != 1 {
                    bad.push(submit.text());
                    continue;
                }
                let id = &json["request"];
                for _ in 0..2 {
                    let poll = h.get(&format!("/res.php?action=get&id={id}&json=1")).await;
                    let ok = serde_json::from_slice::<serde_json::Value>(&poll.body)
                        .map(|p| p["status"] == 1 || p["request"] == "CAPCHA_NOT_READY")
                        .unwrap_or(false);
                    if poll.status != 200 || !ok {
                        bad.push(poll.text());
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            bad
        }));
    }
    let variants: [&[(&str, &str, f64)]; 4] = [
        &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)],
        &[("a", KEY_A, 3.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
        &[("b", KEY_B, 1.0), ("c", KEY_C, 2.0)],
        &[("a", KEY_A, 1.0), ("d", KEY_D, 1.0)],
    ];
    for round in 0..20 {
        // Pace reloads by traffic, not by the clock: a few tasks complete between each.
        let target = done.load(Ordering::Relaxed) + 5;
        let counter = done.clone();
        eventually("tasks between reloads", || {
            counter.load(Ordering::Relaxed) >= target
        })
        .await;
        write_config(&path, &h.sim.url(), variants[round % variants.len()]);
        reload_and_report(&h.app, &path, "test");
    }
    stop.store(true, Ordering::Relaxed);
    let mut bad = Vec::new();
    for worker in workers {
        bad.extend(worker.await.unwrap());
    }
    assert!(bad.is_empty(), "failed or malformed answers: {bad:?}");
    assert!(done.load(Ordering::Relaxed) >= 100);
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_config_reloads_total{result=\"applied\"}"
        ),
        Some(20.0)
    );
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_config_reloads_total{result=\"rejected\"}"
        ),
        Some(0.0)
    );
    Arc::try_unwrap(h).ok().unwrap().stop().await;
}

#[tokio::test]
async fn sighup_reloads_the_running_binary() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    write_config(&path, &sim.url(), &[("a", KEY_A, 1.0)]);
    let mut proxy = Binary::spawn(&["--config", path.to_str().unwrap()], &[]);
    proxy.wait_for_addr();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let line = proxy.wait_for_line("the SIGHUP reload", |l| l.contains("config reloaded"));
    assert!(line.contains("cause=\"SIGHUP\""), "{line}");
    // An invalid file under SIGHUP is rejected, and the process keeps running.
    std::fs::write(&path, "nonsense = true\n").unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let line = proxy.wait_for_line("the rejected reload", |l| {
        l.contains("config reload rejected")
    });
    assert!(line.contains("WARN"), "{line}");
    let log = proxy.stop();
    assert!(!log.contains(KEY_A));
}
