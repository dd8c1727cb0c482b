//! Pins survive restarts: a clean stop and a `kill -9` both keep every task whose submit was
//! answered, and a damaged journal is recovered from, never fatal.

mod common;

use common::*;
use http_body_util::BodyExt;
use hyper::body::Bytes;
use std::path::Path;

/// Writes a proxy.toml for `sim` in `dir`; pins go to `dir` too (the default data_dir).
fn write_config(dir: &Path, sim_url: &str) -> std::path::PathBuf {
    let path = dir.join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{sim_url}\"\nrefresh_interval = \"1h\"\n\
             [[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n[[keys]]\nname = \"b\"\nkey = \"{KEY_B}\"\n\
             [[keys]]\nname = \"c\"\nkey = \"{KEY_C}\"\n"
        ),
    )
    .unwrap();
    path
}

async fn get(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<Bytes>,
    >,
    url: String,
) -> String {
    let response = client.get(url.parse().unwrap()).await.expect("answered");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

fn client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<Bytes>,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// Submits `n` tasks through a fresh binary, stops it with `signal`, restarts it, and checks
/// that every task is polled with the key that created it.
async fn survive(signal: &str, n: usize) {
    // Enough threads that no submit is refused for want of one.
    let mut sim = keyrelay::sim::Simulator::new();
    for key in [KEY_A, KEY_B, KEY_C] {
        sim = sim.key(keyrelay::sim::SimKey {
            threads: 100,
            ..keyrelay::sim::SimKey::valid(key)
        });
    }
    let sim = sim.spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &sim.url());
    let args = ["--config", config.to_str().unwrap()];
    let client = client();

    let mut proxy = Binary::spawn(&args, &[]);
    let addr = proxy.wait_for_addr();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let answer = get(
            &client,
            format!(
                "http://{addr}/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
            ),
        )
        .await;
        let id: u64 = answer
            .strip_prefix("OK|")
            .expect("accepted")
            .parse()
            .unwrap();
        tasks.push(id);
    }
    let killed = std::process::Command::new("kill")
        .args([signal, &proxy.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    proxy.wait_exit(std::time::Duration::from_secs(20));
    drop(proxy);

    let mut proxy = Binary::spawn(&args, &[]);
    let addr = proxy.wait_for_addr();
    let replay = proxy
        .log
        .lines()
        .find(|l| l.contains("pin journal replayed"))
        .unwrap_or_else(|| panic!("no replay line:\n{}", proxy.log))
        .to_owned();
    assert!(replay.contains(&format!("loaded={n}")), "{replay}");
    sim.clear_received();
    for id in &tasks {
        let answer = get(
            &client,
            format!("http://{addr}/res.php?key={CALLER_KEY}&action=get&id={id}"),
        )
        .await;
        assert_eq!(answer, "CAPCHA_NOT_READY", "task {id} after {signal}");
    }
    let polls = sim.received();
    assert_eq!(
        polls
            .iter()
            .filter(|r| r.action.as_deref() == Some("get"))
            .count(),
        n
    );
    for r in polls.iter().filter(|r| r.action.as_deref() == Some("get")) {
        let id: u64 = r
            .params
            .iter()
            .find(|(k, _)| k == "id")
            .unwrap()
            .1
            .parse()
            .unwrap();
        assert_eq!(
            r.key,
            sim.task_owner(id),
            "task {id} polled with its creating key"
        );
    }
    let log = proxy.stop();
    assert!(!log.contains(KEY_A), "no key in the log");
}

#[tokio::test]
async fn pins_survive_a_clean_restart() {
    survive("-TERM", 30).await;
}

#[tokio::test]
async fn pins_survive_kill_minus_9() {
    survive("-KILL", 30).await;
}

#[tokio::test]
async fn a_damaged_journal_is_recovered_from() {
    let sim = sim_with(&[KEY_A, KEY_B, KEY_C]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &sim.url());
    std::fs::write(
        dir.path().join("pins.journal"),
        b"\x07\x00\x00\x00garbage that is no journal",
    )
    .unwrap();
    let mut proxy = Binary::spawn(&["--config", config.to_str().unwrap()], &[]);
    let addr = proxy.wait_for_addr();
    let answer = get(
        &client(),
        format!("http://{addr}/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"),
    )
    .await;
    assert!(answer.starts_with("OK|"), "{answer}");
    let log = proxy.stop();
    assert!(
        log.contains("pin journal has a torn or corrupt tail") && log.contains("loaded=0"),
        "the recovery is logged:\n{log}"
    );
}
