//! End to end with a real Prometheus server: it scrapes a real keyrelay in front of the
//! simulator, loads the shipped `docs/prometheus/alerts.yml`, and fires
//! `KeyrelayFewerThanTwoKeysActive` once two of three keys fail.
//!
//! Needs the `prometheus` binary (Debian package `prometheus`). Without it the test skips
//! with a message, except under CI (`CI` set), where it fails: CI must run it.

mod common;

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::future::Future;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use keyrelay::health::StateKind;
use keyrelay::sim::SimKeyState;
use serde_json::Value;
use tempfile::TempDir;

const FEWER_THAN_TWO: &str = "KeyrelayFewerThanTwoKeysActive";
const NO_KEY: &str = "KeyrelayNoKeyActive";
/// The shipped rule file, read from the source tree so the test checks what users get.
const SHIPPED_RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus/alerts.yml");
/// Every wait on Prometheus is bounded by this; the whole run normally takes seconds.
const WAIT_LIMIT: Duration = Duration::from_secs(60);
const POLL_STEP: Duration = Duration::from_millis(250);
/// One Prometheus API call; a hung call must not eat the whole wait.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn prometheus_fires_fewer_than_two_keys_when_two_of_three_keys_fail() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let sim = sim_with(&[KEY_A, KEY_B, KEY_C]).await;
    let mut config = config_for(
        &sim,
        &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
    );
    // The refresh is what benches a key the service rejects; it must run within the test.
    config.refresh_interval = Duration::from_millis(300);
    let h = Harness::start(sim, config).await;

    let mut prometheus = Prometheus::start(&binary, h.addr);
    let api = &PrometheusApi {
        client: &h.client,
        base: prometheus.url.clone(),
    };

    prometheus
        .wait_for("a successful scrape of keyrelay", move || async move {
            let up = api.scalar("up{job=\"keyrelay\"}").await?;
            let active = api.scalar("keyrelay_keys_active").await?;
            (up == 1.0 && active == 3.0).then_some(())
        })
        .await;
    // A rule evaluation that started after the scrape landed has seen three active keys, so
    // "not firing" below is a verdict on real data rather than on an empty database. The
    // second new evaluation is the first that surely started after the scrape: the first
    // may have been running already.
    let mut seen = prometheus
        .wait_for("the rules API", move || async move {
            Some(rules_last_evaluation(&api.rules().await?))
        })
        .await;
    let mut rules = Value::Null;
    for _ in 0..2 {
        let previous = &seen;
        rules = prometheus
            .wait_for("a rule evaluation after the scrape", move || async move {
                let rules = api.rules().await?;
                (rules_last_evaluation(&rules) != *previous).then_some(rules)
            })
            .await;
        seen = rules_last_evaluation(&rules);
    }
    assert_shipped_rules_loaded(&rules);
    let alerts = api.alerts().await.expect("the alerts API answers");
    for name in [FEWER_THAN_TWO, NO_KEY] {
        assert!(
            alert_named(&alerts, name).is_none(),
            "{name} is pending or firing with three active keys: {alerts:#}"
        );
    }

    h.sim.set_state(KEY_B, SimKeyState::Unknown);
    h.sim.set_state(KEY_C, SimKeyState::Unknown);

    let (firing, alerts) = prometheus
        .wait_for(
            "KeyrelayFewerThanTwoKeysActive to fire",
            move || async move {
                let alerts = api.alerts().await?;
                let alert = alert_named(&alerts, FEWER_THAN_TWO)?;
                (alert["state"] == "firing").then(|| (alert.clone(), alerts.clone()))
            },
        )
        .await;
    let instance = h.addr.to_string();
    assert_eq!(
        firing["labels"],
        serde_json::json!({
            "alertname": FEWER_THAN_TWO,
            "severity": "warning",
            "job": "keyrelay",
            "instance": instance,
        })
    );
    assert_eq!(
        firing["annotations"]["summary"],
        format!("keyrelay {instance} has 1 key(s) in rotation")
    );
    let description = firing["annotations"]["description"]
        .as_str()
        .expect("the alert has a description");
    assert!(
        description.contains("Out of rotation: b, c."),
        "the description does not name the failed keys: {description}"
    );
    assert!(
        alert_named(&alerts, NO_KEY).is_none(),
        "{NO_KEY} is pending or firing with one active key: {alerts:#}"
    );
    assert_eq!(api.scalar("keyrelay_keys_active").await, Some(1.0));
    // keyrelay's own view agrees with what Prometheus alerted on.
    for name in ["b", "c"] {
        assert_eq!(
            h.state_of(name),
            (StateKind::Benched, Some("ERROR_KEY_DOES_NOT_EXIST"))
        );
    }
    assert_eq!(h.state_of("a"), (StateKind::Active, None));

    drop(prometheus);
    h.stop().await;
}

/// Checks that the real server parsed every rule of the shipped file: its groups by name,
/// each alert and recording rule in order, and every one healthy.
fn assert_shipped_rules_loaded(rules: &Value) {
    let shipped = fs::read_to_string(SHIPPED_RULES).expect("the shipped rules are readable");
    let groups = rules["groups"].as_array().expect("rules has groups");
    let names: Vec<&str> = groups.iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(
        names,
        group_names(&shipped),
        "the shipped groups: {rules:#}"
    );
    let all: Vec<&Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("a group has rules"))
        .collect();
    let loaded: Vec<&str> = all
        .iter()
        .filter_map(|rule| rule["name"].as_str())
        .collect();
    assert_eq!(loaded, rule_names(&shipped));
    for rule in all {
        assert_eq!(rule["health"], "ok", "rule failed to evaluate: {rule:#}");
    }
}

/// The group names of a rule file, in order.
fn group_names(rules: &str) -> Vec<&str> {
    listed(rules, &["- name:"])
}

/// The alert and recording rule names of a rule file, in order.
fn rule_names(rules: &str) -> Vec<&str> {
    listed(rules, &["- alert:", "- record:"])
}

/// The alert names of a rule file, in order.
fn alert_names(rules: &str) -> Vec<&str> {
    listed(rules, &["- alert:"])
}

/// What follows any of `prefixes` on the lines of a rule file, in order.
fn listed<'a>(rules: &'a str, prefixes: &[&str]) -> Vec<&'a str> {
    rules
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            prefixes.iter().find_map(|prefix| line.strip_prefix(prefix))
        })
        .map(str::trim)
        .collect()
}

/// The shipped rules with every `for:` set to `duration`, so the test does not wait minutes.
/// Nothing else changes, so the expressions and annotations under test are the shipped ones.
fn with_for_durations(rules: &str, duration: &str) -> String {
    let mut shortened = 0;
    let mut out = String::with_capacity(rules.len());
    for line in rules.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("for:") {
            let indent = &line[..line.len() - trimmed.len()];
            out.push_str(&format!("{indent}for: {duration}\n"));
            shortened += 1;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    // A rule without `for:`, or one written another way, would keep the shipped delay.
    assert_eq!(
        shortened,
        alert_names(rules).len(),
        "every alert in {SHIPPED_RULES} must have exactly one `for:` line"
    );
    out
}

/// The `prometheus` binary, or `None` after a skip message; fails under CI.
fn prometheus_binary() -> Option<PathBuf> {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    match locate_prometheus(std::env::var_os("PATH").as_deref(), ci) {
        Ok(found) => found,
        Err(message) => panic!("{message}"),
    }
}

/// Finds `prometheus` on `path`. Missing is a skip (with a message on stderr) unless `ci`,
/// where it is an error: the end-to-end test must not silently vanish from CI.
fn locate_prometheus(path: Option<&OsStr>, ci: bool) -> Result<Option<PathBuf>, String> {
    let found = path
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .map(|dir| dir.join("prometheus"))
        .find(|candidate| candidate.is_file());
    match found {
        Some(binary) => Ok(Some(binary)),
        None if ci => Err(
            "CI is set but the `prometheus` binary is not on PATH: CI must run \
             the real-Prometheus test (.ci/run installs Debian's `prometheus` package)"
                .to_owned(),
        ),
        None => {
            eprintln!(
                "SKIPPED prometheus_e2e: no `prometheus` binary on PATH. Install Debian's \
                 `prometheus` package to run it (CI always does)."
            );
            Ok(None)
        }
    }
}

/// A Prometheus child process on a loopback port, with its own config, rules and storage in
/// a temporary directory. Dropping it kills and reaps the process, also when a test panics.
struct Prometheus {
    child: Child,
    url: String,
    log: PathBuf,
    /// Dropped after the child is gone, so the process never loses its storage mid-run.
    _dir: TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every second with the shipped rules.
    fn start(binary: &Path, target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let shipped = fs::read_to_string(SHIPPED_RULES).expect("the shipped rules are readable");
        // Only the `for:` durations differ from the shipped file (3s instead of minutes).
        fs::write(
            dir.path().join("alerts.yml"),
            with_for_durations(&shipped, "3s"),
        )
        .expect("rules written");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - alerts.yml\n\
             scrape_configs:\n  - job_name: keyrelay\n    static_configs:\n      \
             - targets: [\"{target}\"]\n"
        );
        let config_file = dir.path().join("prometheus.yml");
        fs::write(&config_file, config).expect("config written");
        let log = dir.path().join("prometheus.log");
        let log_file = File::create(&log).expect("log file created");
        let stderr = log_file.try_clone().expect("log file handle cloned");
        let port = free_loopback_port();
        let mut listen = OsString::from("--web.listen-address=");
        listen.push(format!("127.0.0.1:{port}"));
        let mut config_flag = OsString::from("--config.file=");
        config_flag.push(&config_file);
        let mut storage = OsString::from("--storage.tsdb.path=");
        storage.push(dir.path().join("data"));
        let child = Command::new(binary)
            .arg(config_flag)
            .arg(storage)
            .arg(listen)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(stderr)
            .spawn()
            .expect("prometheus starts");
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        }
    }

    /// Polls `probe` until it yields a value, failing if Prometheus exits or `WAIT_LIMIT`
    /// passes first.
    async fn wait_for<T, F, Fut>(&mut self, what: &str, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("child status readable") {
                panic!("prometheus exited ({status}) while waiting for {what}");
            }
            if let Some(value) = probe().await {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {WAIT_LIMIT:?} waiting for {what}"
            );
            tokio::time::sleep(POLL_STEP).await;
        }
    }

    /// The end of Prometheus's log, to explain a failure.
    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        let start = text
            .char_indices()
            .rev()
            .nth(4000)
            .map_or(0, |(index, _)| index);
        text[start..].to_owned()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // Errors mean it is already gone, which is the goal.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- prometheus log (end) ---\n{}", self.log_tail());
        }
    }
}

/// A free port on 127.0.0.1 for a child process to bind. The probe listener is dropped
/// here, just before the child starts; another process could take the port in between, in
/// which case Prometheus exits and `wait_for` reports it.
fn free_loopback_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Prometheus's HTTP API, through the harness's client. Every call answers `None` while
/// Prometheus is not ready (refused connection, non-200, unexpected body), so it can be
/// polled from the moment the process starts.
struct PrometheusApi<'a> {
    client: &'a Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl PrometheusApi<'_> {
    async fn get(&self, path_and_query: &str) -> Option<Value> {
        let uri = format!("{}{}", self.base, path_and_query)
            .parse()
            .expect("a valid API URI");
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.client.get(uri))
            .await
            .ok()?
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body = response.into_body().collect().await.ok()?.to_bytes();
        let json: Value = serde_json::from_slice(&body).ok()?;
        (json["status"] == "success").then(|| json["data"].clone())
    }

    /// The value of an instant query that must return exactly one series.
    async fn scalar(&self, query: &str) -> Option<f64> {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", query)
            .finish();
        let data = self.get(&format!("/api/v1/query?{query}")).await?;
        match data["result"].as_array()?.as_slice() {
            [series] => series["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    async fn alerts(&self) -> Option<Value> {
        Some(self.get("/api/v1/alerts").await?["alerts"].clone())
    }

    async fn rules(&self) -> Option<Value> {
        self.get("/api/v1/rules").await
    }
}

/// The groups' last evaluation times from `/api/v1/rules`, to notice a new evaluation.
fn rules_last_evaluation(rules: &Value) -> Vec<Value> {
    rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|group| group["lastEvaluation"].clone())
        .collect()
}

/// The alert called `name` in an `/api/v1/alerts` list, in any state.
fn alert_named<'a>(alerts: &'a Value, name: &str) -> Option<&'a Value> {
    alerts
        .as_array()?
        .iter()
        .find(|alert| alert["labels"]["alertname"] == name)
}

#[test]
fn for_durations_are_the_only_change_to_the_shipped_rules() {
    let shipped = fs::read_to_string(SHIPPED_RULES).expect("the shipped rules are readable");
    let shortened = with_for_durations(&shipped, "3s");
    let changed: Vec<(&str, &str)> = shipped
        .lines()
        .zip(shortened.lines())
        .filter(|(before, after)| before != after)
        .collect();
    assert_eq!(shipped.lines().count(), shortened.lines().count());
    assert_eq!(changed.len(), alert_names(&shipped).len());
    for (before, after) in changed {
        assert!(
            before.trim_start().starts_with("for: "),
            "changed: {before}"
        );
        assert_eq!(after.trim_start(), "for: 3s");
        assert_eq!(
            before.len() - before.trim_start().len(),
            after.len() - after.trim_start().len()
        );
    }
    assert!(alert_names(&shipped).contains(&FEWER_THAN_TWO));
    assert!(alert_names(&shipped).contains(&NO_KEY));
}

#[test]
#[should_panic(expected = "every alert in")]
fn an_alert_without_for_cannot_be_shortened_silently() {
    with_for_durations(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n",
        "3s",
    );
}

#[test]
fn a_missing_binary_skips_locally_and_fails_under_ci() {
    let empty = tempfile::tempdir().expect("a temporary directory");
    let path = empty.path().as_os_str();
    assert_eq!(locate_prometheus(Some(path), false), Ok(None));
    assert_eq!(locate_prometheus(None, false), Ok(None));
    let error = locate_prometheus(Some(path), true).expect_err("CI must not skip");
    assert_eq!(
        error,
        "CI is set but the `prometheus` binary is not on PATH: CI must run the \
         real-Prometheus test (.ci/run installs Debian's `prometheus` package)"
    );
    assert!(locate_prometheus(None, true).is_err());

    let with_binary = tempfile::tempdir().expect("a temporary directory");
    let binary = with_binary.path().join("prometheus");
    fs::write(&binary, "").expect("fake binary written");
    let path = std::env::join_paths([empty.path(), with_binary.path()]).expect("joinable");
    assert_eq!(locate_prometheus(Some(&path), true), Ok(Some(binary)));
}
