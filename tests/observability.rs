//! What operators see: the metric set after real traffic, liveness and readiness, the status
//! page in JSON and HTML, and the headers that say which key served an answer.

mod common;

use common::*;
use keyrelay::sim::{FaultKind, FaultTarget, SimKeyState};

/// Drives one of everything through the pool: a solved task, a failover, a caller error,
/// a transient failure, an unknown task, a malformed request.
async fn varied_traffic(h: &Harness) -> u64 {
    let id = h.submit().await;
    h.get(&format!("/res.php?action=get&id={id}")).await;
    h.get(&format!("/res.php?action=get&id={id}")).await;
    h.get(&format!(
        "/in.php?key={CALLER_KEY}&method=userrecaptcha&pageurl=p&json=1"
    ))
    .await;
    h.get("/res.php?action=get&id=42&json=1").await;
    h.post("/in.php", "application/json", "{broken").await;
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Submit, FaultKind::Status(502), Some(1)),
    );
    h.sim.set_state(KEY_B, SimKeyState::Unknown);
    h.submit().await;
    id
}

/// Pool a (heavy), b (medium), c (light).
async fn pool() -> Harness {
    let sim = sim_with(&[KEY_A, KEY_B, KEY_C]).await;
    let config = config_for(
        &sim,
        &[
            ("a", KEY_A, 10_000.0),
            ("b", KEY_B, 100.0),
            ("c", KEY_C, 1.0),
        ],
    );
    Harness::start(sim, config).await
}

#[tokio::test]
async fn the_metric_set_after_real_traffic() {
    let h = pool().await;
    varied_traffic(&h).await;
    let text = h.metrics().await;
    // Series print with their labels in name order.
    let expect = |series: &str, value: f64| {
        assert_eq!(metric(&text, series), Some(value), "{series} in:\n{text}");
    };
    expect(
        &format!(
            "keyrelay_build_info{{commit=\"{}\",version=\"{}\"}}",
            keyrelay::BUILD_COMMIT,
            env!("CARGO_PKG_VERSION")
        ),
        1.0,
    );
    expect("keyrelay_keys_configured", 3.0);
    expect("keyrelay_keys_active", 2.0);
    expect("keyrelay_key_up{key=\"b\"}", 0.0);
    expect("keyrelay_key_state{key=\"b\",state=\"benched\"}", 1.0);
    expect("keyrelay_key_state{key=\"b\",state=\"active\"}", 0.0);
    expect("keyrelay_key_state{key=\"a\",state=\"active\"}", 1.0);
    expect(
        "keyrelay_key_state_reason{key=\"b\",reason=\"ERROR_KEY_DOES_NOT_EXIST\"}",
        1.0,
    );
    expect("keyrelay_key_state_reason{key=\"a\",reason=\"none\"}", 1.0);
    expect("keyrelay_key_balance{key=\"c\"}", 10.0);
    expect("keyrelay_key_threads{key=\"a\"}", 5.0);
    expect("keyrelay_key_working_threads{key=\"c\"}", 0.0);
    // The first task was polled to its answer; the last one is still open.
    expect("keyrelay_tasks_pinned", 2.0);
    let in_flight: f64 = ["a", "b", "c"]
        .iter()
        .filter_map(|k| {
            metric(
                &text,
                &format!("keyrelay_key_tasks_in_flight{{key=\"{k}\"}}"),
            )
        })
        .sum();
    assert_eq!(in_flight, 1.0, "{text}");
    expect("keyrelay_key_submits_total{key=\"a\",outcome=\"ok\"}", 1.0);
    expect(
        "keyrelay_key_submits_total{key=\"a\",outcome=\"caller_error\"}",
        1.0,
    );
    expect(
        "keyrelay_key_submits_total{key=\"a\",outcome=\"transient\"}",
        1.0,
    );
    expect(
        "keyrelay_key_submits_total{key=\"b\",outcome=\"key_unusable\"}",
        1.0,
    );
    expect(
        "keyrelay_key_errors_total{code=\"http_5xx\",key=\"a\",provider=\"captchaai\"}",
        1.0,
    );
    expect(
        "keyrelay_key_errors_total{code=\"ERROR_GOOGLEKEY\",key=\"a\",provider=\"captchaai\"}",
        1.0,
    );
    expect(
        "keyrelay_key_errors_total{code=\"ERROR_KEY_DOES_NOT_EXIST\",key=\"b\",provider=\"captchaai\"}",
        1.0,
    );
    expect("keyrelay_failovers_total{reason=\"http_5xx\"}", 1.0);
    expect(
        "keyrelay_failovers_total{reason=\"ERROR_KEY_DOES_NOT_EXIST\"}",
        1.0,
    );
    expect(
        "keyrelay_key_transitions_total{key=\"b\",state=\"benched\"}",
        1.0,
    );
    expect(
        "keyrelay_local_answers_total{code=\"ERROR_WRONG_CAPTCHA_ID\"}",
        1.0,
    );
    expect(
        "keyrelay_local_answers_total{code=\"ERROR_BAD_PARAMETERS\"}",
        1.0,
    );
    expect(
        "keyrelay_request_duration_seconds_count{endpoint=\"in\",outcome=\"success\"}",
        2.0,
    );
    expect(
        "keyrelay_request_duration_seconds_count{endpoint=\"res\",outcome=\"unknown_task\"}",
        1.0,
    );
    // Two polls of the solved task, and the probe for the unknown id 42, which asks every key.
    expect(
        "keyrelay_upstream_duration_seconds_count{endpoint=\"res\",key=\"a\",provider=\"captchaai\"}",
        3.0,
    );
    expect("keyrelay_probes_total{result=\"not_found\"}", 1.0);
    assert!(metric(&text, "keyrelay_refresh_runs_total").unwrap() >= 1.0);
    // Labels only: a sample's value is a number that may hold any digits (a duration sum of
    // 0.0037114730000000003 once failed a whole-line check).
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let labels = line
            .rsplit_once(' ')
            .map_or(line, |(series, _value)| series);
        assert!(
            !labels.contains("73000000"),
            "no task id in a label: {line}"
        );
    }
    h.stop().await;
}

#[tokio::test]
async fn healthz_is_liveness_and_readyz_needs_a_key_in_rotation() {
    let h = pool().await;
    let live = h.get("/healthz").await;
    assert_eq!((live.status.as_u16(), live.text().as_str()), (200, "ok\n"));
    let ready = h.get("/readyz").await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.text(), "ready: 3 of 3 keys in rotation\n");
    for key in [KEY_A, KEY_B, KEY_C] {
        h.sim.set_state(key, SimKeyState::Unknown);
    }
    // Three submits meet the three dead keys and bench them all.
    h.get(&format!(
        "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
    ))
    .await;
    let not_ready = h.get("/readyz").await;
    assert_eq!(not_ready.status, 503);
    assert_eq!(not_ready.text(), "not ready: none of 3 keys in rotation\n");
    assert_eq!(h.get("/healthz").await.status, 200, "still alive");
    h.stop().await;
}

#[tokio::test]
async fn status_json_describes_every_key_without_its_value() {
    let h = pool().await;
    varied_traffic(&h).await;
    let answer = h.get("/status").await;
    assert_eq!(answer.content_type(), Some("application/json"));
    let text = answer.text();
    for key in [KEY_A, KEY_B, KEY_C, CALLER_KEY] {
        assert!(!text.contains(key), "a key value in /status:\n{text}");
    }
    let status = answer.json();
    assert_eq!(status["keys_configured"], 3);
    assert_eq!(status["keys_active"], 2);
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    let keys = status["keys"].as_array().unwrap();
    let b = keys.iter().find(|k| k["name"] == "b").unwrap();
    assert_eq!(b["fingerprint"], "…0002");
    assert_eq!(b["state"], "benched");
    assert_eq!(b["reason"], "ERROR_KEY_DOES_NOT_EXIST");
    assert_eq!(b["in_rotation"], false);
    assert_eq!(b["last_error"]["code"], "ERROR_KEY_DOES_NOT_EXIST");
    assert!(b["since"].as_str().unwrap().ends_with('Z'));
    assert_eq!(b["counts"]["submits_key_unusable"], 1);
    let a = keys.iter().find(|k| k["name"] == "a").unwrap();
    assert_eq!(a["state"], "active");
    assert_eq!(a["reason"], serde_json::Value::Null);
    // As last read by the startup refresh; the next read is minutes away.
    assert_eq!(a["balance"], 10.0);
    assert_eq!(a["threads"], 5);
    assert_eq!(a["tier"], 0);
    assert_eq!(a["counts"]["submits_ok"], 1);
    assert_eq!(status["strategy"], "weighted");
    assert_eq!(status["queued"], 0);
    // The first task was polled to its answer; the last one is still open on its key.
    let in_use: u64 = keys
        .iter()
        .map(|k| k["threads_in_use"].as_u64().unwrap())
        .sum();
    let in_flight: u64 = keys
        .iter()
        .map(|k| k["tasks_in_flight"].as_u64().unwrap())
        .sum();
    assert_eq!((in_use, in_flight), (1, 1), "{status}");
    assert_eq!(a["last_error"]["code"], "http_5xx");
    h.stop().await;
}

#[tokio::test]
async fn status_html_is_a_self_contained_page() {
    let h = pool().await;
    varied_traffic(&h).await;
    let answer = h
        .send(hyper::Method::GET, "/status", None, bytes::Bytes::new())
        .await;
    assert_eq!(answer.content_type(), Some("application/json"));
    let request = hyper::Request::get(h.url("/status"))
        .header("accept", "text/html,application/xhtml+xml;q=0.9")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = h.client.request(request).await.unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "text/html; charset=utf-8"
    );
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let html = String::from_utf8(body.to_vec()).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.contains("<meta http-equiv=\"refresh\""));
    assert!(html.contains("2 of 3 keys in rotation"));
    assert!(html.contains("strategy weighted &middot; 0 submits waiting for a thread"));
    assert!(html.contains("<th>Threads used</th>"));
    assert!(html.contains("<span class=\"badge benched\">benched</span>"));
    assert!(html.contains("ERROR_KEY_DOES_NOT_EXIST"));
    for external in ["src=", "href=", "http://", "https://"] {
        assert!(
            !html.contains(external),
            "external asset ({external}):\n{html}"
        );
    }
    for key in [KEY_A, KEY_B, KEY_C] {
        assert!(!html.contains(key));
    }
    h.stop().await;
}

#[tokio::test]
async fn relayed_answers_say_which_key_served_them() {
    let h = pool().await;
    h.sim.set_state(KEY_A, SimKeyState::Unknown);
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
        ))
        .await;
    assert!(answer.text().starts_with("OK|"));
    assert_eq!(answer.headers["x-keyrelay-key"], "b");
    assert_eq!(answer.headers["x-keyrelay-attempts"], "2");
    let id: u64 = answer.text()[3..].parse().unwrap();
    let poll = h.get(&format!("/res.php?action=get&id={id}")).await;
    assert_eq!(poll.headers["x-keyrelay-key"], "b");
    assert_eq!(poll.headers["x-keyrelay-attempts"], "1");
    // Answers keyrelay makes itself carry neither.
    let local = h.get("/res.php?action=get&id=1").await;
    assert!(local.headers.get("x-keyrelay-key").is_none());
    assert!(local.headers.get("x-keyrelay-attempts").is_none());
    h.stop().await;
}

#[tokio::test]
async fn the_key_headers_can_be_turned_off() {
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.observability.key_headers = false;
    let h = Harness::start(sim, config).await;
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
        ))
        .await;
    assert!(answer.text().starts_with("OK|"));
    assert!(answer.headers.get("x-keyrelay-key").is_none());
    assert!(answer.headers.get("x-keyrelay-attempts").is_none());
    h.stop().await;
}

/// Metric names a file mentions: every `keyrelay_…` token.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("keyrelay_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names.sort();
    names.dedup();
    names
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_use_is_exported() {
    let h = pool().await;
    varied_traffic(&h).await;
    let text = h.metrics().await;
    let exported: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let is_exported = |name: &str| {
        exported.contains(&name)
            || ["_bucket", "_count", "_sum"].iter().any(|suffix| {
                name.strip_suffix(suffix)
                    .is_some_and(|base| exported.contains(&base))
            })
    };
    for file in ["docs/prometheus/alerts.yml", "docs/grafana/keyrelay.json"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let content = std::fs::read_to_string(&path).expect("shipped file");
        let names = metric_names(&content);
        assert!(!names.is_empty(), "{file} uses no keyrelay metric");
        // A replica in a cluster exports these; tests/cluster.rs checks them there. The
        // forecast's series appear only after minutes of readings (src/forecast.rs's tests
        // hold them), which this short run does not have. The budget ratios exist per
        // caller token with a budget, which this pool has none of: tests/budgets.rs reads
        // them.
        let later = [
            "keyrelay_key_balance_runs_out_seconds",
            "keyrelay_key_spend_per_hour",
            "keyrelay_token_budget_used_ratio",
            "keyrelay_token_budget_soft_ratio",
        ];
        for name in names
            .into_iter()
            .filter(|n| !n.starts_with("keyrelay_cluster_") && !later.contains(&n.as_str()))
        {
            assert!(
                is_exported(&name),
                "{file} uses {name}, which /metrics does not export"
            );
        }
    }
    h.stop().await;
}

#[test]
fn metric_names_are_read_from_text() {
    assert_eq!(
        metric_names("sum(rate(keyrelay_key_errors_total{code=~\"x\"}[5m])) / keyrelay_keys_active, job=\"keyrelay\""),
        vec!["keyrelay_key_errors_total", "keyrelay_keys_active"]
    );
}

// === counters start at 0 ===

/// Counters whose label values are not all known at start: documented in docs/metrics.md
/// as appearing on first use.
const OPEN_COUNTERS: [&str; 2] = ["keyrelay_key_errors_total", "keyrelay_failovers_total"];

/// Every series that must exist before any traffic: each value of each of keyrelay's own
/// closed label sets (taken from the enums the code counts with, so a value added there is
/// checked here), and for each key in `keys` every per-key combination.
fn closed_series(keys: &[&str]) -> Vec<String> {
    use keyrelay::capacity::Refusal;
    use keyrelay::health::StateKind;
    use keyrelay::metrics::{
        ForwardOutcome, LocalCode, ProbeResult, Release, ReloadResult, SubmitOutcome, WaitResult,
    };
    let mut series: Vec<String> = vec![
        "keyrelay_connections_rejected_total".to_owned(),
        "keyrelay_retries_denied_total".to_owned(),
    ];
    let one = |name: &str, label: &str, value: &str| format!("{name}{{{label}=\"{value}\"}}");
    series.extend(
        Refusal::ALL
            .iter()
            .map(|r| one("keyrelay_pool_full_total", "reason", r.label())),
    );
    series.extend(
        Release::ALL
            .iter()
            .map(|r| one("keyrelay_thread_releases_total", "reason", r.label())),
    );
    series.extend(
        ProbeResult::ALL
            .iter()
            .map(|r| one("keyrelay_probes_total", "result", r.label())),
    );
    series.extend(
        ReloadResult::ALL
            .iter()
            .map(|r| one("keyrelay_config_reloads_total", "result", r.label())),
    );
    series.extend(
        keyrelay::failover::CheckResult::ALL
            .iter()
            .map(|r| one("keyrelay_key_checks_total", "result", r.label())),
    );
    series.extend(
        WaitResult::ALL
            .iter()
            .map(|r| one("keyrelay_queue_wait_seconds_count", "result", r.label())),
    );
    series.extend(
        LocalCode::ALL
            .iter()
            .map(|c| one("keyrelay_local_answers_total", "code", c.label())),
    );
    series.extend(
        keyrelay::metrics::Denied::ALL
            .iter()
            .map(|d| one("keyrelay_access_denied_total", "reason", d.label())),
    );
    series.extend(
        ForwardOutcome::ALL
            .iter()
            .map(|o| one("keyrelay_forward_requests_total", "outcome", o.label())),
    );
    for key in keys {
        series.extend(SubmitOutcome::ALL.iter().map(|o| {
            format!(
                "keyrelay_key_submits_total{{key=\"{key}\",outcome=\"{}\"}}",
                o.label()
            )
        }));
        series.extend(StateKind::ALL.iter().map(|s| {
            format!(
                "keyrelay_key_transitions_total{{key=\"{key}\",state=\"{}\"}}",
                s.label()
            )
        }));
        series.push(one("keyrelay_refresh_failures_total", "key", key));
    }
    series
}

fn assert_all_zero(text: &str, series: &[String]) {
    for s in series {
        assert_eq!(metric(text, s), Some(0.0), "{s} is not at 0 in:\n{text}");
    }
}

#[tokio::test]
async fn every_closed_label_set_is_at_zero_before_any_traffic() {
    let h = Harness::three_keys().await;
    let text = h.metrics().await;
    assert_all_zero(&text, &closed_series(&["a", "b", "c"]));
    // And nothing else is missing: every counter family in the output has a series, except
    // the documented open ones.
    for line in text.lines() {
        let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"))
        else {
            continue;
        };
        assert!(
            !OPEN_COUNTERS.contains(&name),
            "{name} has series before any traffic; is its label set closed now?"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(name) && !l.starts_with('#')),
            "{name} has no series"
        );
    }
    h.stop().await;
}

#[tokio::test]
async fn keys_a_reload_adds_start_at_zero_too() {
    let h = Harness::three_keys().await;
    let mut config = h.app.snapshot().config.clone();
    let upstream = config.upstream.clone();
    config.keys.push(key("d", KEY_D, 1.0, &upstream));
    keyrelay::reload::apply(&h.app, config).expect("the reload applies");
    let text = h.metrics().await;
    assert_all_zero(&text, &closed_series(&["d"]));
    h.stop().await;
}

#[test]
fn metrics_md_names_every_counter_with_an_open_label_set() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
        .expect("docs/metrics.md");
    let section = doc
        .split("**Counters start at 0.**")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("docs/metrics.md has a \"Counters start at 0.\" paragraph");
    for name in OPEN_COUNTERS {
        assert!(
            section.contains(&format!("`{name}`")),
            "{name} in:\n{section}"
        );
    }
}
