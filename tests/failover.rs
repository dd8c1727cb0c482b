//! Each failover class end to end: what the caller gets, which keys the simulator saw, and
//! what happened to the failing key.
//!
//! Tests steer the first pick with extreme weights (10_000 : 1 puts the heavy key first with
//! probability 0.9999), and the harness seeds the proxy's generator, so the key under test
//! is the one that fails, on every run.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::health::StateKind;
use keyrelay::sim::{FaultKind, FaultTarget, SimKey, SimKeyState, Simulator};

/// Pool: "a" (heavy, the one that fails) and "b" (light, the fallback).
async fn heavy_a_light_b() -> Harness {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let config = config_for(&sim, &[("a", KEY_A, 10_000.0), ("b", KEY_B, 1.0)]);
    Harness::start(sim, config).await
}

fn submits_by(h: &Harness) -> Vec<String> {
    h.sim
        .received()
        .into_iter()
        .filter(|r| r.path == "/in.php" || r.path == "/solve.php")
        .map(|r| r.key.unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn an_unusable_key_is_benched_once_keyrelay_confirms_it_and_the_task_moves_on() {
    for code_state in [SimKeyState::Unknown, SimKeyState::IpNotAllowed] {
        let h = heavy_a_light_b().await;
        h.sim.set_state(KEY_A, code_state);
        let id = h.submit().await;
        assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
        assert_eq!(submits_by(&h), vec![KEY_A.to_owned(), KEY_B.to_owned()]);
        let expected = match code_state {
            SimKeyState::Unknown => "ERROR_KEY_DOES_NOT_EXIST",
            _ => "ERROR_IP_NOT_ALLOWED",
        };
        // keyrelay's own getbalance with the key confirms the verdict, then benches it.
        eventually("a benched", || {
            h.state_of("a") == (StateKind::Benched, Some(expected))
        })
        .await;
        let metrics = h.metrics().await;
        assert_eq!(
            metric(&metrics, "keyrelay_key_checks_total{result=\"confirmed\"}"),
            Some(1.0)
        );
        assert_eq!(
            metric(
                &metrics,
                &format!("keyrelay_failovers_total{{reason=\"{expected}\"}}")
            ),
            Some(1.0)
        );
        assert_eq!(metric(&metrics, "keyrelay_key_up{key=\"a\"}"), Some(0.0));
        assert_eq!(metric(&metrics, "keyrelay_keys_active"), Some(1.0));
        // The benched key gets no more tasks.
        h.submit().await;
        assert_eq!(submits_by(&h).len(), 3);
        assert_eq!(submits_by(&h)[2], KEY_B);
        h.stop().await;
    }
}

#[tokio::test]
async fn zero_balance_without_a_plan_benches_after_threadsinfo() {
    let h = heavy_a_light_b().await;
    h.sim.set_state(KEY_A, SimKeyState::ZeroBalance);
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    // The key is out of rotation at once, and benched once threadsinfo shows free threads.
    assert_ne!(h.state_of("a").0, StateKind::Active);
    eventually("a benched", || {
        h.state_of("a") == (StateKind::Benched, Some("ERROR_ZERO_BALANCE"))
    })
    .await;
    assert!(h
        .sim
        .received()
        .iter()
        .any(|r| r.key.as_deref() == Some(KEY_A) && r.action.as_deref() == Some("threadsinfo")));
    h.stop().await;
}

#[tokio::test]
async fn zero_balance_with_every_thread_busy_only_cools_the_key() {
    let sim = Simulator::new()
        .key(SimKey {
            threads: 1,
            ..SimKey::valid(KEY_A)
        })
        .key(SimKey::valid(KEY_B))
        .spawn()
        .await
        .unwrap();
    let mut config = config_for(&sim, &[("a", KEY_A, 10_000.0), ("b", KEY_B, 1.0)]);
    config.failover.busy_cooldown = Duration::from_secs(3600);
    let h = Harness::start(sim, config).await;
    // The only thread of key A is taken by a task submitted past keyrelay.
    h.submit_past_keyrelay(KEY_A).await;
    assert_eq!(h.sim.working_threads(KEY_A), 1);

    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    eventually("a cooling as full", || {
        h.app.snapshot().pool.keys()[0].stats.threads() == Some((1, 1))
    })
    .await;
    assert_eq!(
        h.state_of("a"),
        (StateKind::Cooling, Some("ERROR_ZERO_BALANCE"))
    );
    h.stop().await;
}

#[tokio::test]
async fn a_full_key_cools_down_briefly_and_comes_back() {
    for code in ["ERROR_NO_SLOT_AVAILABLE", "MAX_USER_TURN"] {
        let sim = sim_with(&[KEY_A, KEY_B]).await;
        let mut config = config_for(&sim, &[("a", KEY_A, 10_000.0), ("b", KEY_B, 1.0)]);
        config.failover.busy_cooldown = Duration::from_millis(200);
        let h = Harness::start(sim, config).await;
        h.sim.add_fault(
            KEY_A,
            fault(FaultTarget::Submit, FaultKind::Code(code.into()), Some(1)),
        );
        let id = h.submit().await;
        assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
        assert_eq!(h.state_of("a").0, StateKind::Cooling);
        assert_eq!(h.state_of("a").1, Some(code));
        eventually("a back in rotation", || {
            h.state_of("a").0 == StateKind::Active
        })
        .await;
        let id = h.submit().await;
        assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_A));
        h.stop().await;
    }
}

#[tokio::test]
async fn http_429_counts_as_full() {
    let h = heavy_a_light_b().await;
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Submit, FaultKind::Status(429), Some(1)),
    );
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    assert_eq!(h.state_of("a").0, StateKind::Cooling);
    h.stop().await;
}

#[tokio::test]
async fn caller_errors_pass_through_verbatim_without_retry_or_penalty() {
    let h = heavy_a_light_b().await;
    // No googlekey: the service answers ERROR_GOOGLEKEY; any key would.
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&pageurl=p&json=1"
        ))
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["request"], "ERROR_GOOGLEKEY");
    let plain = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&pageurl=p"
        ))
        .await;
    assert_eq!(plain.text(), "ERROR_GOOGLEKEY");
    assert_eq!(
        submits_by(&h).len(),
        2,
        "one upstream request per caller request"
    );
    assert_eq!(h.state_of("a").0, StateKind::Active);
    assert_eq!(h.state_of("b").0, StateKind::Active);
    let metrics = h.metrics().await;
    assert!(!metrics.contains("keyrelay_failovers_total{"), "{metrics}");
    h.stop().await;
}

#[tokio::test]
async fn ip_banned_is_answered_without_touching_keys_or_rotating() {
    let h = heavy_a_light_b().await;
    h.sim.add_fault(
        "*",
        fault(
            FaultTarget::Submit,
            FaultKind::Code("IP_BANNED".into()),
            None,
        ),
    );
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
        ))
        .await;
    assert_eq!(answer.json()["request"], "IP_BANNED");
    assert_eq!(
        submits_by(&h).len(),
        1,
        "rotating keys would deepen the ban"
    );
    assert_eq!(h.state_of("a").0, StateKind::Active);
    h.stop().await;
}

#[tokio::test]
async fn transient_errors_retry_on_another_key_and_never_bench() {
    let h = heavy_a_light_b().await;
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Submit, FaultKind::Status(502), Some(1)),
    );
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    // One transient failure does not take a key out.
    assert_eq!(h.state_of("a").0, StateKind::Active);
    h.sim.add_fault(
        KEY_A,
        fault(
            FaultTarget::Submit,
            FaultKind::Code("ERROR_SERVER_ERROR".into()),
            Some(1),
        ),
    );
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    h.stop().await;
}

#[tokio::test]
async fn a_lone_key_gets_its_transient_retries() {
    let sim = sim_with(&[KEY_A]).await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    let h = Harness::start(sim, config).await;
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Submit, FaultKind::Status(500), Some(2)),
    );
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_A));
    assert_eq!(submits_by(&h).len(), 3);
    assert_ne!(h.state_of("a").0, StateKind::Benched);
    h.stop().await;
}

#[tokio::test]
async fn attempts_are_bounded_and_the_caller_gets_a_well_formed_error() {
    let sim = sim_with(&[KEY_A, KEY_B, KEY_C, KEY_D]).await;
    let config = config_for(
        &sim,
        &[
            ("a", KEY_A, 1.0),
            ("b", KEY_B, 1.0),
            ("c", KEY_C, 1.0),
            ("d", KEY_D, 1.0),
        ],
    );
    let h = Harness::start(sim, config).await;
    h.sim.add_fault(
        "*",
        fault(FaultTarget::Submit, FaultKind::Status(503), None),
    );
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
        ))
        .await;
    assert_eq!(answer.status, 200);
    let json = answer.json();
    assert_eq!(json["status"], 0);
    assert_eq!(json["request"], "ERROR_SERVER_ERROR");
    assert!(
        json["error_text"].as_str().unwrap().contains("3 attempts"),
        "{json}"
    );
    assert_eq!(submits_by(&h).len(), 3, "max_attempts defaults to 3");
    let plain = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
        ))
        .await;
    assert_eq!(plain.text(), "ERROR_SERVER_ERROR");
    assert_eq!(plain.content_type(), Some("text/plain; charset=utf-8"));
    for name in ["a", "b", "c", "d"] {
        assert_ne!(h.state_of(name).0, StateKind::Benched, "{name}");
    }
    h.stop().await;
}

#[tokio::test]
async fn a_lone_key_is_never_cooled_for_transient_faults() {
    let sim = sim_with(&[KEY_A]).await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    let h = Harness::start(sim, config).await;
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Submit, FaultKind::Status(500), None),
    );
    for _ in 0..4 {
        let answer = h
            .get(&format!(
                "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
            ))
            .await;
        assert_eq!(answer.json()["request"], "ERROR_SERVER_ERROR");
    }
    // Cooling it would empty the pool for nothing: nginx's single-server rule.
    assert_eq!(h.state_of("a"), (StateKind::Active, None));
    h.stop().await;
}

#[tokio::test]
async fn transient_faults_cool_at_most_the_allowed_share_of_the_pool() {
    let sim = sim_with(&[KEY_A, KEY_B, KEY_C, KEY_D]).await;
    let mut config = config_for(
        &sim,
        &[
            ("a", KEY_A, 1.0),
            ("b", KEY_B, 1.0),
            ("c", KEY_C, 1.0),
            ("d", KEY_D, 1.0),
        ],
    );
    config.failover.transient_cooldown = Duration::from_secs(3600);
    config.failover.transient_cooldown_max = Duration::from_secs(3600);
    let h = Harness::start(sim, config).await;
    h.sim.add_fault(
        "*",
        fault(FaultTarget::Submit, FaultKind::Status(500), None),
    );
    for _ in 0..12 {
        let answer = h
            .get(&format!(
                "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
            ))
            .await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.json()["status"], 0);
    }
    let states: Vec<_> = ["a", "b", "c", "d"].iter().map(|k| h.state_of(k)).collect();
    let cooling = states
        .iter()
        .filter(|s| **s == (StateKind::Cooling, Some("transient")))
        .count();
    // 36 failures over 4 keys: enough to cool every key, but max_transient_ejection (0.5)
    // keeps half of the pool in rotation.
    assert_eq!(cooling, 2, "{states:?}");
    assert!(states.iter().all(|s| s.0 != StateKind::Benched));
    h.stop().await;
}

#[tokio::test]
async fn a_submit_that_may_have_arrived_is_not_resent_by_default() {
    let h = heavy_a_light_b().await;
    h.sim
        .add_fault(KEY_A, fault(FaultTarget::Submit, FaultKind::Reset, Some(1)));
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
        ))
        .await;
    let json = answer.json();
    assert_eq!(json["request"], "ERROR_SERVER_ERROR");
    assert!(json["error_text"]
        .as_str()
        .unwrap()
        .contains("may have been created"));
    assert_eq!(submits_by(&h), vec![KEY_A.to_owned()]);
    h.stop().await;
}

#[tokio::test]
async fn unsure_submits_are_resent_when_configured() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 10_000.0), ("b", KEY_B, 1.0)]);
    config.failover.retry_unsure_submits = true;
    let h = Harness::start(sim, config).await;
    h.sim
        .add_fault(KEY_A, fault(FaultTarget::Submit, FaultKind::Reset, Some(1)));
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_B));
    h.stop().await;
}

#[tokio::test]
async fn a_pool_whose_keys_are_all_down_answers_in_the_callers_format() {
    let sim = Simulator::new()
        .key(SimKey {
            state: SimKeyState::Unknown,
            ..SimKey::valid(KEY_A)
        })
        .key(SimKey {
            state: SimKeyState::IpNotAllowed,
            ..SimKey::valid(KEY_B)
        })
        .spawn()
        .await
        .unwrap();
    let config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    let h = Harness::start(sim, config).await;
    // The startup refresh already benched both.
    assert_eq!(
        h.state_of("a"),
        (StateKind::Benched, Some("ERROR_KEY_DOES_NOT_EXIST"))
    );
    assert_eq!(
        h.state_of("b"),
        (StateKind::Benched, Some("ERROR_IP_NOT_ALLOWED"))
    );
    let json = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
        ))
        .await;
    assert_eq!(json.status, 200);
    let body = json.json();
    assert_eq!(body["status"], 0);
    assert_eq!(body["request"], "ERROR_ZERO_BALANCE");
    assert!(body["error_text"]
        .as_str()
        .unwrap()
        .contains("no key in rotation"));
    let plain = h
        .post(
            "/in.php",
            "application/x-www-form-urlencoded",
            "method=base64&body=QQ",
        )
        .await;
    assert_eq!(plain.text(), "ERROR_ZERO_BALANCE");
    assert!(submits_by(&h).is_empty(), "benched keys get no traffic");
    // threadsinfo agrees: no free thread anywhere.
    let threads = h.get("/res.php?action=threadsinfo&json=1").await.json();
    assert_eq!(threads["threads"], 0);
    assert_eq!(threads["working_threads"], 0);
    let metrics = h.metrics().await;
    assert_eq!(metric(&metrics, "keyrelay_keys_active"), Some(0.0));
    assert_eq!(metric(&metrics, "keyrelay_keys_configured"), Some(2.0));
    h.stop().await;
}

#[tokio::test]
async fn solve_php_fails_over_too() {
    let h = heavy_a_light_b().await;
    h.sim.set_state(KEY_A, SimKeyState::Unknown);
    let answer = h
        .get(&format!(
            "/solve.php?key={CALLER_KEY}&method=base64&body=QUJD&json=1"
        ))
        .await;
    let json = answer.json();
    assert_eq!(json["status"], 1, "{json}");
    assert!(json["request"].as_str().unwrap().starts_with("tok-"));
    assert_eq!(submits_by(&h), vec![KEY_A.to_owned(), KEY_B.to_owned()]);
    h.stop().await;
}

#[tokio::test]
async fn busy_everywhere_is_answered_busy_with_http_200() {
    let h = heavy_a_light_b().await;
    h.sim.add_fault(
        "*",
        fault(FaultTarget::Submit, FaultKind::Status(429), None),
    );
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
        ))
        .await;
    assert_eq!(answer.status, 200, "a 429 must not reach the caller");
    let json = answer.json();
    assert_eq!(json["request"], "ERROR_NO_SLOT_AVAILABLE");
    assert!(json["error_text"].as_str().unwrap().contains("busy"));
    h.stop().await;
}

#[tokio::test]
async fn busy_answers_from_the_service_pass_through_when_every_key_is_busy() {
    let h = heavy_a_light_b().await;
    h.sim.add_fault(
        "*",
        fault(
            FaultTarget::Submit,
            FaultKind::Code("ERROR_NO_SLOT_AVAILABLE".into()),
            None,
        ),
    );
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
        ))
        .await;
    assert_eq!(answer.text(), "ERROR_NO_SLOT_AVAILABLE");
    assert_eq!(submits_by(&h).len(), 2, "each key tried once");
    h.stop().await;
}

#[tokio::test]
async fn an_ip_ban_pauses_all_upstream_traffic_for_the_ban_period() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 10_000.0), ("b", KEY_B, 1.0)]);
    config.failover.ip_ban_pause = Duration::from_millis(500);
    let h = Harness::start(sim, config).await;
    let task = h.submit().await;
    h.sim.add_fault(
        "*",
        fault(
            FaultTarget::Submit,
            FaultKind::Code("IP_BANNED".into()),
            Some(1),
        ),
    );
    let banned = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
        ))
        .await;
    assert_eq!(banned.text(), "IP_BANNED", "the service's answer, verbatim");
    let sent = h.sim.received().len();
    // While paused, nothing reaches the upstream, in any format, for submits and polls.
    let json = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
        ))
        .await
        .json();
    assert_eq!(json["request"], "IP_BANNED");
    assert!(json["error_text"].as_str().unwrap().contains("paused"));
    let poll = h.get(&format!("/res.php?action=get&id={task}")).await;
    assert_eq!(poll.text(), "IP_BANNED");
    assert_eq!(
        h.sim.received().len(),
        sent,
        "no upstream request while paused"
    );
    assert_eq!(
        metric(&h.metrics().await, "keyrelay_upstream_paused"),
        Some(1.0)
    );
    // Keys are untouched: the IP is banned, not the keys.
    assert_eq!(h.state_of("a").0, StateKind::Active);
    assert_eq!(h.state_of("b").0, StateKind::Active);
    // After the pause, traffic flows again.
    let app = h.app.clone();
    eventually("the pause ends", || app.upstream_paused().is_none()).await;
    h.submit().await;
    h.stop().await;
}

#[tokio::test]
async fn a_spent_retry_budget_stops_retries() {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 10_000.0), ("b", KEY_B, 1.0)]);
    config.failover.retry_budget = 0.0;
    config.failover.retry_budget_min = 0;
    let h = Harness::start(sim, config).await;
    h.sim.add_fault(
        KEY_A,
        fault(FaultTarget::Submit, FaultKind::Status(502), None),
    );
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
        ))
        .await;
    let json = answer.json();
    assert_eq!(json["request"], "ERROR_SERVER_ERROR", "{json}");
    assert_eq!(submits_by(&h), vec![KEY_A.to_owned()], "no retry on b");
    assert_eq!(
        metric(&h.metrics().await, "keyrelay_retries_denied_total"),
        Some(1.0)
    );
    h.stop().await;
}

// === a host that refuses connections ===

/// A JSON submit, as a script sends it.
const SUBMIT: &str =
    "/in.php?key=callercallercallercallercaller99&method=userrecaptcha&googlekey=g&pageurl=p&json=1";

/// Far longer than any test runs: a submit that backed off even once would still be asleep
/// (full jitter makes a shorter sleep possible, but not one under a minute, bar a draw of
/// less than 1 in 10 000).
const NEVER: Duration = Duration::from_secs(1_000_000);

/// A submit's answer, which must come without a backoff: the pools below back off for
/// [`NEVER`], so an answer at all shows that no attempt was followed by one. The bound only
/// turns a hang into a failure.
async fn answered_without_backoff(h: &Harness, path: &str) -> Answer {
    tokio::time::timeout(Duration::from_secs(60), h.get(path))
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer; a backoff of up to {NEVER:?} ran"))
}

/// `keyrelay_key_errors_total` for a refused connection of each key named, summed.
fn refusals(metrics: &str, keys: &[&str]) -> f64 {
    keys.iter()
        .filter_map(|key| {
            metric(
                metrics,
                &format!(
                    "keyrelay_key_errors_total{{code=\"connect\",key=\"{key}\",provider=\"captchaai\"}}"
                ),
            )
        })
        .sum()
}

/// A key of the pool at `url`.
fn key_behind(name: &str, value: &str, weight: f64, url: &str) -> keyrelay::config::KeyConfig {
    let upstream = keyrelay::config::Upstream::parse(url).expect("a loopback url is valid");
    key(name, value, weight, &upstream)
}

#[tokio::test]
async fn a_refusing_host_costs_a_submit_one_attempt_and_no_backoff_whatever_the_strategy() {
    use keyrelay::config::Strategy;
    for strategy in [
        Strategy::Weighted,
        Strategy::LeastLoaded,
        Strategy::RoundRobin,
    ] {
        let (_refusing, port) = refusing_port();
        // Threads for every task the test leaves open: a full c would be waited for.
        let sim = Simulator::new()
            .key(SimKey {
                threads: 100,
                ..SimKey::valid(KEY_C)
            })
            .spawn()
            .await
            .expect("simulator starts");
        let mut config = config_for(&sim, &[]);
        // a and b share one host:port, one at its root and one under a path prefix, and
        // are picked first wherever weights count; c is the simulator.
        config.keys = vec![
            key_behind("a", KEY_A, 10_000.0, &format!("http://{port}")),
            key_behind("b", KEY_B, 10_000.0, &format!("http://{port}/mirror")),
            key_behind("c", KEY_C, 1.0, &sim.url()),
        ];
        config.strategy = strategy;
        config.failover.max_attempts = 3;
        config.failover.backoff_base = NEVER;
        config.failover.backoff_max = NEVER;
        let h = Harness::start_without_refresh_wait(sim, config).await;
        h.wait_for_refresh_of(&["c"]).await;

        const SUBMITS: u32 = 6;
        let mut refused = 0;
        for n in 1..=SUBMITS {
            let answer = answered_without_backoff(&h, SUBMIT).await;
            let json = answer.json();
            assert_eq!(json["status"], 1, "{strategy:?} {n}: {json}");
            let served = answer.headers.get("x-keyrelay-key");
            assert_eq!(
                served.map(|v| v.as_bytes()),
                Some(&b"c"[..]),
                "{strategy:?} {n}"
            );
            // One attempt behind the refusing host:port at most, then the simulator.
            let attempts = attempts_of(&answer).expect("a relayed answer says its attempts");
            assert!((1..=2).contains(&attempts), "{strategy:?} {n}: {attempts}");
            refused += attempts - 1;
        }
        assert!(
            refused >= 1,
            "{strategy:?}: the refusing host was never tried"
        );
        let metrics = h.metrics().await;
        assert_eq!(
            refusals(&metrics, &["a", "b"]),
            f64::from(refused),
            "{strategy:?}: one refusal per submit that met the host"
        );
        assert_eq!(
            metric(&metrics, "keyrelay_failovers_total{reason=\"connect\"}"),
            Some(f64::from(refused)),
            "{strategy:?}"
        );
        assert_eq!(
            submits_by(&h),
            vec![KEY_C.to_owned(); SUBMITS as usize],
            "{strategy:?}: every task made once, at c"
        );
        h.stop().await;
    }
}

#[tokio::test]
async fn a_pool_whose_every_host_refuses_is_answered_after_one_attempt_per_host() {
    let (_first, one) = refusing_port();
    let (_second, two) = refusing_port();
    let sim = sim_with(&[]).await;
    let mut config = config_for(&sim, &[]);
    config.keys = vec![
        key_behind("a", KEY_A, 1.0, &format!("http://{one}")),
        key_behind("b", KEY_B, 1.0, &format!("http://{one}/b")),
        key_behind("c", KEY_C, 1.0, &format!("http://{two}")),
        key_behind("d", KEY_D, 1.0, &format!("http://{two}/d")),
    ];
    // Room for a second key behind each host: only the rule keeps the walk from it.
    config.failover.max_attempts = 4;
    config.failover.backoff_base = NEVER;
    config.failover.backoff_max = NEVER;
    let h = Harness::start_without_refresh_wait(sim, config).await;

    let json = answered_without_backoff(&h, SUBMIT).await.json();
    assert_eq!(json["status"], 0);
    assert_eq!(json["request"], "ERROR_SERVER_ERROR");
    assert_eq!(
        json["error_text"], "all 2 attempts failed upstream; retry later",
        "{json}"
    );
    let metrics = h.metrics().await;
    assert_eq!(refusals(&metrics, &["a", "b"]), 1.0, "{metrics}");
    assert_eq!(refusals(&metrics, &["c", "d"]), 1.0, "{metrics}");

    let plain = answered_without_backoff(&h, SUBMIT.trim_end_matches("&json=1")).await;
    assert_eq!(plain.text(), "ERROR_SERVER_ERROR");
    let metrics = h.metrics().await;
    assert_eq!(refusals(&metrics, &["a", "b", "c", "d"]), 4.0);
    for name in ["a", "b", "c", "d"] {
        assert_eq!(h.state_of(name), (StateKind::Active, None), "{name}");
    }
    h.stop().await;
}

#[tokio::test]
async fn a_lone_key_whose_host_refuses_is_not_retried_in_the_same_submit() {
    // A lone key gets its retries after a 5xx (above); after a refusal its host:port is
    // what refused, and would again.
    let (_refusing, port) = refusing_port();
    let sim = sim_with(&[]).await;
    let mut config = config_for(&sim, &[]);
    config.keys = vec![key_behind("a", KEY_A, 1.0, &format!("http://{port}"))];
    config.failover.backoff_base = NEVER;
    config.failover.backoff_max = NEVER;
    let h = Harness::start_without_refresh_wait(sim, config).await;
    let json = answered_without_backoff(&h, SUBMIT).await.json();
    assert_eq!(json["request"], "ERROR_SERVER_ERROR");
    assert_eq!(
        json["error_text"], "all 1 attempts failed upstream; retry later",
        "{json}"
    );
    assert_eq!(refusals(&h.metrics().await, &["a"]), 1.0);
    assert_eq!(h.state_of("a"), (StateKind::Active, None));
    h.stop().await;
}

#[tokio::test]
async fn a_poll_whose_host_refuses_stays_on_its_own_key() {
    let (first, second) = (sim_with(&[KEY_A]).await, sim_with(&[KEY_B]).await);
    let mut config = config_for(&first, &[]);
    config.keys = vec![
        key_behind("a", KEY_A, 10_000.0, &first.url()),
        key_behind("b", KEY_B, 1.0, &second.url()),
    ];
    let h = Harness::start(first, config).await;
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_A));
    // a's host stops listening, and its port is held so that it keeps refusing.
    h.sim.go_down().await;
    let held = tokio::net::TcpSocket::new_v4().expect("a socket");
    held.set_reuseaddr(true).expect("reuseaddr");
    held.bind(h.sim.addr())
        .expect("the simulator's port, free again, is held");

    let poll = format!("/res.php?key={CALLER_KEY}&action=get&id={id}&json=1");
    let json = h.get(&poll).await.json();
    assert_eq!(json["request"], "CAPCHA_NOT_READY", "{json}");
    let metrics = h.metrics().await;
    // The first try may meet a's pooled connection as the simulator closes it, which
    // counts as no answer rather than a refusal; every try is a's all the same.
    let failed_on = |key: &str| -> f64 {
        ["connect", "no_answer"]
            .iter()
            .filter_map(|code| {
                metric(
                    &metrics,
                    &format!(
                        "keyrelay_key_errors_total{{code=\"{code}\",key=\"{key}\",provider=\"captchaai\"}}"
                    ),
                )
            })
            .sum()
    };
    assert_eq!(failed_on("a"), 3.0, "max_attempts tries on a:\n{metrics}");
    assert!(refusals(&metrics, &["a"]) >= 2.0, "{metrics}");
    assert_eq!(failed_on("b"), 0.0);
    assert!(
        !second
            .received()
            .iter()
            .any(|r| r.action.as_deref() == Some("get")),
        "the poll never went to b's host"
    );
    assert_eq!(
        metric(&metrics, "keyrelay_failovers_total{reason=\"connect\"}"),
        None
    );
    second.shutdown().await;
    h.stop().await;
}
