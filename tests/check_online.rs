//! `keyrelay check --online` as operators meet it: the real binary against the simulator
//! with usable, dead (`ERROR_KEY_DOES_NOT_EXIST`, `ERROR_WRONG_USER_KEY`) and empty keys,
//! its table, both exit codes, a clear error for an unreachable upstream, and never a
//! full key in what it prints.

use std::process::{Command, Output};

use keyrelay::sim::{SimHandle, SimKey, Simulator};
use keyrelay::ApiKey;

const USABLE_A: &str = "0123456789abcdef0123456789abcdef";
const USABLE_B: &str = "fedcba9876543210fedcba9876543210";
/// 32 characters but unknown to the service: `ERROR_KEY_DOES_NOT_EXIST`.
const UNKNOWN: &str = "deaddeaddeaddeaddeaddeaddeaddead";
/// Not a key's shape at all: `ERROR_WRONG_USER_KEY`.
const MALFORMED: &str = "not-a-real-key-value-x9";
/// Accepted, with nothing left to spend.
const EMPTY: &str = "emptyemptyemptyemptyemptyempty00";

async fn sim() -> SimHandle {
    let mut empty = SimKey::valid(EMPTY);
    empty.balance = 0.0;
    Simulator::new()
        .key(SimKey::valid(USABLE_A))
        .key(SimKey::valid(USABLE_B))
        .key(empty)
        .spawn()
        .await
        .expect("simulator binds 127.0.0.1:0")
}

/// `keyrelay check --online` on a config of `keys` (name, value) upstream of `upstream`.
async fn check_online(upstream: &str, keys: &[(&str, &str)]) -> (Output, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut text = format!("upstream = \"{upstream}\"\n");
    for (name, key) in keys {
        text.push_str(&format!("[[keys]]\nname = \"{name}\"\nkey = \"{key}\"\n"));
    }
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, text).unwrap();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_keyrelay"))
            .args(["check", "--online", "--config"])
            .arg(&path)
            .env_remove("RUST_LOG")
            .output()
            .expect("keyrelay runs")
    })
    .await
    .unwrap();
    drop(dir);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output, all)
}

/// The online table's row for `name` (the offline summary above it names keys too).
fn row<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .skip_while(|l| !l.starts_with("NAME "))
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name}:\n{text}"))
}

fn assert_no_full_key(text: &str, keys: &[&str]) {
    for key in keys {
        assert!(!text.contains(key), "a full key was printed:\n{text}");
    }
}

#[tokio::test]
async fn two_usable_keys_pass_and_the_dead_and_empty_ones_are_named() {
    let sim = sim().await;
    let keys = [
        ("alpha", USABLE_A),
        ("bravo", USABLE_B),
        ("gone", UNKNOWN),
        ("typo", MALFORMED),
        ("drained", EMPTY),
    ];
    let (out, text) = check_online(&sim.url(), &keys).await;
    assert!(out.status.success(), "{text}");
    let header = text.lines().find(|l| l.starts_with("NAME")).expect(&text);
    for column in ["FINGERPRINT", "STATE", "BALANCE", "THREADS"] {
        assert!(header.contains(column), "{header}");
    }
    for (name, key) in [("alpha", USABLE_A), ("bravo", USABLE_B)] {
        let line = row(&text, name);
        assert!(line.contains(&ApiKey::new(key).fingerprint()), "{line}");
        assert!(line.contains("usable"), "{line}");
        assert!(line.contains("10.00"), "{line}");
        assert!(line.contains("0/5 working"), "{line}");
    }
    assert!(
        row(&text, "gone").contains("ERROR_KEY_DOES_NOT_EXIST"),
        "{text}"
    );
    assert!(
        row(&text, "typo").contains("ERROR_WRONG_USER_KEY"),
        "{text}"
    );
    let drained = row(&text, "drained");
    assert!(
        drained.contains("empty") && drained.contains("0.00"),
        "{drained}"
    );
    assert!(text.contains("2 of 5 keys usable"), "{text}");
    assert_no_full_key(&text, &[USABLE_A, USABLE_B, UNKNOWN, MALFORMED, EMPTY]);
    sim.shutdown().await;
}

#[tokio::test]
async fn fewer_than_two_usable_keys_fail_with_the_table_printed() {
    let sim = sim().await;
    let keys = [("alpha", USABLE_A), ("gone", UNKNOWN), ("drained", EMPTY)];
    let (out, text) = check_online(&sim.url(), &keys).await;
    assert!(!out.status.success(), "{text}");
    assert!(row(&text, "alpha").contains("usable"), "{text}");
    assert!(
        row(&text, "gone").contains("ERROR_KEY_DOES_NOT_EXIST"),
        "{text}"
    );
    assert!(text.contains("1 of 3 keys usable"), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("only 1 usable key(s) of 3") && stderr.contains("at least 2"),
        "{stderr}"
    );
    assert_no_full_key(&text, &[USABLE_A, UNKNOWN, EMPTY]);
    sim.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_an_error_about_the_upstream_not_the_keys() {
    // A port that was just free: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let keys = [("alpha", USABLE_A), ("bravo", USABLE_B)];
    let (out, text) = check_online(&url, &keys).await;
    assert!(!out.status.success(), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no key got an answer from the upstream") && stderr.contains(&url),
        "{stderr}"
    );
    assert!(
        !text.contains("usable"),
        "a table for an unreachable upstream:\n{text}"
    );
    assert_no_full_key(&text, &[USABLE_A, USABLE_B]);
}

/// The README's command, as it shows it.
const README_COMMAND: &str = "keyrelay check --online --config proxy.toml";

#[tokio::test]
async fn the_readme_command_passes_on_the_shipped_config_and_simulator() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md reads");
    assert!(
        readme.contains(README_COMMAND),
        "README.md no longer shows it"
    );
    // The shipped config with its two simulator keys, pointed at a simulator on an
    // ephemeral port instead of the README's 9000.
    let mut sim = Simulator::new();
    for key in keyrelay::sim::DEFAULT_KEYS {
        sim = sim.key(SimKey::valid(key));
    }
    let sim = sim.spawn().await.unwrap();
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/proxy.toml"))
        .expect("proxy.toml reads");
    let moved = shipped.replace(
        "upstream = \"http://127.0.0.1:9000\"",
        &format!("upstream = \"{}\"", sim.url()),
    );
    assert_ne!(moved, shipped, "proxy.toml's upstream line changed");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("proxy.toml"), moved).unwrap();
    let args: Vec<String> = README_COMMAND
        .split_whitespace()
        .skip(1)
        .map(str::to_owned)
        .collect();
    let cwd = dir.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_keyrelay"))
            .args(&args)
            .current_dir(cwd)
            .env_remove("RUST_LOG")
            .output()
            .expect("keyrelay runs")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(row(&text, "sim-a").contains("usable"), "{text}");
    assert!(row(&text, "sim-b").contains("usable"), "{text}");
    assert_no_full_key(&text, &keyrelay::sim::DEFAULT_KEYS);
    sim.shutdown().await;
}

#[test]
fn the_threshold_is_the_one_the_fewer_than_two_keys_alert_uses() {
    let alerts = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/prometheus/alerts.yml"),
    )
    .expect("the shipped alerts");
    let expr = format!(
        "expr: keyrelay_keys_active < {}",
        keyrelay::online_check::MIN_USABLE
    );
    assert!(
        alerts.contains(&expr),
        "check --online and KeyrelayFewerThanTwoKeysActive disagree: no `{expr}` in alerts.yml"
    );
}
