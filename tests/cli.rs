//! The command line as users meet it: help, version, `check` on the shipped and broken
//! configs, and `demo` end to end.

use std::process::{Command, Output};

fn keyrelay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyrelay"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_LOG")
        .output()
        .expect("keyrelay runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_lists_the_commands() {
    let out = keyrelay(&["--help"]);
    assert!(out.status.success());
    let text = stdout(&out);
    for word in ["check", "simulate", "demo", "--config"] {
        assert!(text.contains(word), "{word} missing from help:\n{text}");
    }
}

#[test]
fn version_prints_the_crate_version() {
    let out = keyrelay(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        stdout(&out).trim(),
        format!("keyrelay {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn check_accepts_the_shipped_config_and_prints_the_pool_without_keys() {
    let out = keyrelay(&["check", "--config", "proxy.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("sim-a") && text.contains("sim-b"), "{text}");
    for key in keyrelay::sim::DEFAULT_KEYS {
        assert!(!text.contains(key), "check printed a key:\n{text}");
        assert!(
            text.contains(&keyrelay::ApiKey::new(key).fingerprint()),
            "{text}"
        );
    }
}

#[test]
fn check_rejects_a_broken_config_with_a_precise_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "upstream = \"http://127.0.0.1:9\"\n[[keys]]\nname = \"main\"\nkey = \"0123456789abcdef0123456789abcdef\"\nweight = 0\n",
    )
    .unwrap();
    let out = keyrelay(&["check", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(
        text.contains("keys[0] (\"main\").weight: must be > 0"),
        "{text}"
    );
    assert!(
        text.contains(path.to_str().unwrap()),
        "names the file: {text}"
    );
    assert_eq!(text.matches("must be > 0").count(), 1, "said once: {text}");
    assert!(!text.contains("0123456789abcdef"), "{text}");
}

#[test]
fn check_reports_a_missing_file() {
    let out = keyrelay(&["check", "--config", "/nonexistent/proxy.toml"]);
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(text.contains("/nonexistent/proxy.toml"), "{text}");
    assert_eq!(
        text.matches("os error 2").count(),
        1,
        "cause printed once: {text}"
    );
}

#[test]
fn demo_shows_rotation_failover_capacity_and_metrics() {
    let out = keyrelay(&["demo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "served by",
        "failover: 'revoked' answered ERROR_KEY_DOES_NOT_EXIST",
        "key 'drained' benched: threadsinfo shows free threads",
        "a burst: 25 scripts submit at once",
        "spare    at most ",
        "25 of 25 solved;",
        "the service answered \"no free thread\" 0 times",
        "final pool state",
        "keyrelay_keys_active 3",
        "keyrelay_key_up{key=\"heavy\"} 1",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from the demo:\n{text}"
        );
    }
    assert!(
        !text.contains("demo-steady-0000"),
        "the demo printed a key:\n{text}"
    );
    // The backup key takes no task while the primaries have room: none in the first act.
    let first_act = text.split("a burst:").next().unwrap_or_default();
    assert!(!first_act.contains("served by spare"), "{text}");
    for line in text.lines().filter(|l| l.contains("threads at once")) {
        let peak: u32 = line
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no peak in {line:?}"));
        assert!(peak <= 5, "a key exceeded its threads: {line}");
    }
}

#[test]
fn the_demo_runs_on_one_thread_and_on_several() {
    // One thread takes tokio's current-thread runtime, more its multi-threaded one: the
    // whole demo (failover, a queued burst, refreshes) must work on both.
    for threads in ["1", "3"] {
        let out = keyrelay(&["--threads", threads, "demo"]);
        assert!(
            out.status.success(),
            "--threads {threads}: {}",
            stderr(&out)
        );
        assert!(
            stdout(&out).contains("25 of 25 solved;"),
            "--threads {threads}:\n{}",
            stdout(&out)
        );
    }
}

#[test]
fn zero_threads_is_refused_with_a_message() {
    let out = keyrelay(&["--threads", "0", "check"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--threads"), "{}", stderr(&out));
}

#[test]
fn json_logs_are_one_object_per_line() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\nrefresh_interval = \"1h\"\n[[keys]]\nname = \"only\"\nkey = \"0123456789abcdef0123456789abcdef\"\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyrelay"))
        .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
        .args(["--threads", "2"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Every line is a JSON object; the start line carries the bound address.
    let mut start = None;
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(20)) {
        let parsed: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if parsed["fields"]["message"] == "keyrelay listening" {
            start = Some((line, parsed));
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let (first, line) = start.expect("keyrelay logged its start");
    assert_eq!(line["level"], "INFO");
    assert_eq!(
        line["fields"]["threads"], 2,
        "--threads 2 is logged: {first}"
    );
    assert!(line["fields"]["addr"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    assert!(!first.contains("0123456789abcdef"));
}
