//! The fault tests' script ([`run`]): healthy traffic, inject the fault, keep the traffic
//! going, clear the fault, wait (bounded) until every key serves submits again and
//! `/readyz` is 200, then more traffic that must be entirely normal; and what a failed
//! submit may be answered. Assertions about the fault apply to exactly the exchanges that
//! ran while it was active from start to end; ones that straddle an edge must still get a
//! well-formed answer.
//!
//! The tests run on tokio's single-threaded test runtime: the script, the callers and the
//! proxy interleave only at `.await`, which makes the phase bookkeeping exact.

use std::future::{ready, Future};
use std::time::Duration;

use futures_util::future::join_all;
use hyper::StatusCode;
use keyrelay::config::Config;
use keyrelay::health::StateKind;
use keyrelay::sim::{SimHandle, SimKey, Simulator};
use tokio::time::Instant;

use super::fault_load::*;
use super::*;

/// A key seen cooling, and when.
#[derive(Debug)]
pub struct Sighting {
    pub phase: Phase,
    pub key: &'static str,
    pub reason: Option<&'static str>,
}

/// Samples every key's health until the load stops; fails at once on a benched key, which
/// would otherwise only show as a recovery that never comes.
pub async fn watch_keys(h: &Harness, load: &Load) -> Vec<Sighting> {
    let mut seen = Vec::new();
    while !load.is_stopped() {
        let phase = load.phase();
        // max_transient_ejection is 0.5: of three keys, transient faults may cool one.
        let out = KEYS
            .iter()
            .filter(|(key, _)| h.state_of(key).0 != StateKind::Active)
            .count();
        assert!(
            out <= 1,
            "{out} of 3 keys out of rotation at once in phase {phase:?}; the cap is half"
        );
        for (key, _) in KEYS {
            let (state, reason) = h.state_of(key);
            assert_ne!(
                state,
                StateKind::Benched,
                "key {key} benched ({reason:?}) by a transient fault, seen in phase {phase:?}"
            );
            if state != StateKind::Active {
                seen.push(Sighting { phase, key, reason });
            }
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
    seen
}

/// Checks `condition` every [`CHECK_EVERY`] until it holds; fails the test after `limit`.
pub async fn until<F: Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut condition: impl FnMut() -> F,
) {
    let deadline = Instant::now() + limit;
    while !condition().await {
        assert!(
            Instant::now() < deadline,
            "gave up after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

/// What a run leaves for the test's own assertions.
pub struct Report {
    pub log: Vec<Exchange>,
    /// From the fault being cleared to every key serving again with `/readyz` 200.
    pub recovery: Duration,
}

impl Report {
    pub fn wholly_faulty(&self) -> impl Iterator<Item = &Exchange> {
        self.log.iter().filter(|e| e.wholly_in(Phase::Faulty))
    }

    /// Submits keyrelay may have sent upstream: all but those it answered without trying a
    /// key.
    pub fn submits_tried(&self) -> usize {
        let untried = |e: &Exchange| Refusal::NoKeyInRotation.matches(e);
        self.log
            .iter()
            .filter(|e| e.kind == Kind::Submit && !untried(e))
            .count()
    }

    /// The fewest failed upstream attempts the wholly faulty exchanges prove: three per poll
    /// (retried on its own key up to `max_attempts`), and for a JSON submit the attempts its
    /// `error_text` reports.
    pub fn least_failed_attempts(&self) -> f64 {
        self.wholly_faulty()
            .map(|e| match e.kind {
                Kind::Poll(_) => 3.0,
                Kind::Submit => f64::from(e.attempts_reported()),
            })
            .sum()
    }
}

/// Runs the workload through the whole script and checks what holds for every fault:
/// well-formed answers everywhere (checked per exchange), normal traffic before and after,
/// no key ever benched, cooling only for transient reasons and only around the fault, and the
/// full pool back in rotation at the end.
pub async fn run(
    h: &Harness,
    inject: impl Future<Output = ()>,
    clear: impl Future<Output = ()>,
) -> Report {
    let load = Load::new();
    let mut cleared_at = None;
    let mut recovered_at = None;
    let script = async {
        until("healthy traffic from every caller", WAIT_LIMIT, || {
            ready(
                load.count(|e| e.wholly_in(Phase::Healthy)) >= PER_PHASE
                    && (0..WORKERS)
                        .all(|w| load.count(|e| e.worker == w && e.accepted_task().is_some()) > 0),
            )
        })
        .await;
        load.enter(Phase::Injecting);
        inject.await;
        load.enter(Phase::Faulty);
        until("submits and polls under the fault", WAIT_LIMIT, || {
            let faulty = |kind: fn(&Kind) -> bool| {
                load.count(|e| e.wholly_in(Phase::Faulty) && kind(&e.kind))
            };
            let submits = faulty(|k| *k == Kind::Submit);
            let polls = faulty(|k| matches!(k, Kind::Poll(_)));
            ready(submits + polls >= PER_PHASE && submits >= PER_KIND && polls >= PER_KIND)
        })
        .await;
        load.enter(Phase::Draining);
        clear.await;
        cleared_at = Some(Instant::now());
        until("requests begun under the fault to end", WAIT_LIMIT, || {
            ready(load.in_flight_before(Phase::Draining) == 0)
        })
        .await;
        load.enter(Phase::Recovering);
        until(
            "every key serving submits again and /readyz 200",
            RECOVERY_LIMIT,
            || async {
                load.keys_serving_in(Phase::Recovering).len() == KEYS.len()
                    && h.get("/readyz").await.status == StatusCode::OK
            },
        )
        .await;
        recovered_at = Some(Instant::now());
        load.enter(Phase::Recovered);
        until("normal traffic after recovery", WAIT_LIMIT, || {
            ready(load.count(|e| e.wholly_in(Phase::Recovered)) >= PER_PHASE)
        })
        .await;
        load.stop();
    };
    let callers = join_all((0..WORKERS).map(|w| caller(h, &load, w)));
    let ((), _, sightings) = tokio::join!(script, callers, watch_keys(h, &load));
    let log = load.into_log();

    for e in &log {
        if e.wholly_in(Phase::Healthy) || e.wholly_in(Phase::Recovered) {
            assert!(
                e.is_normal(),
                "a healthy upstream gave an abnormal answer: {e:?}"
            );
        }
    }
    for s in &sightings {
        assert_eq!(
            s.reason,
            Some("transient"),
            "{} cooled for another reason: {s:?}",
            s.key
        );
        assert!(
            !matches!(s.phase, Phase::Healthy | Phase::Recovered),
            "{} out of rotation away from the fault: {s:?}",
            s.key
        );
    }
    for (key, _) in KEYS {
        assert_eq!(
            h.state_of(key),
            (StateKind::Active, None),
            "key {key} at the end"
        );
    }
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_keys_active"),
        Some(KEYS.len() as f64)
    );
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("keyrelay_key_transitions_total{")
                && l.contains("state=\"benched\"")
                && !l.ends_with(" 0")),
        "a key was benched:\n{metrics}"
    );
    let ready = h.get("/readyz").await;
    assert_eq!(
        (ready.status, ready.text().as_str()),
        (StatusCode::OK, "ready: 3 of 3 keys in rotation\n")
    );

    let recovery = recovered_at.expect("the script ran to its end")
        - cleared_at.expect("the script ran to its end");
    let report = Report { log, recovery };
    eprintln!(
        "{} exchanges, {} wholly under the fault; recovered {:?} after the fault cleared",
        report.log.len(),
        report.wholly_faulty().count(),
        report.recovery
    );
    report
}

/// The answers keyrelay may give a submit it could not place, each with its exact text.
#[derive(Clone, Copy, Debug)]
pub enum Refusal {
    /// Every attempt failed before the upstream could act (a 5xx, a refused connection), so
    /// each was retried on another key.
    AllAttemptsFailed,
    /// The first attempt may have reached the upstream and created a task, so keyrelay did
    /// not send it again (`retry_unsure_submits` is off by default); the label names why.
    MayHaveArrived(&'static str),
    /// Transient cooldowns took every key out of rotation.
    NoKeyInRotation,
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::NoKeyInRotation => "ERROR_ZERO_BALANCE",
            _ => "ERROR_SERVER_ERROR",
        }
    }

    /// Whether `text` is this refusal's JSON `error_text`.
    pub fn fits(self, text: &str) -> bool {
        match self {
            // max_attempts is 3; a key cooled mid-way can cut the attempts short.
            Refusal::AllAttemptsFailed => matches!(attempts_in(text), Some(1..=3)),
            Refusal::MayHaveArrived(label) => {
                text == format!(
                    "the upstream did not answer ({label}); the task may have been created, so keyrelay did not send it again"
                )
            }
            Refusal::NoKeyInRotation => {
                text == "keyrelay has no key in rotation (3 configured); retry later"
            }
        }
    }

    /// A submit answered by keyrelay itself with this refusal, in the caller's format.
    pub fn matches(self, e: &Exchange) -> bool {
        let reply = &e.reply;
        let text_fits = match &reply.error_text {
            Some(text) => e.json && self.fits(text),
            None => !e.json,
        };
        e.kind == Kind::Submit
            && e.key.is_none()
            && !reply.ok
            && reply.request == self.code()
            && text_fits
    }
}

/// Every exchange that ran wholly under the fault got keyrelay's own answer: a poll is "not
/// ready" (the client polls again), a submit one of `refusals`.
pub fn assert_fault_answers(report: &Report, refusals: &[Refusal]) {
    for e in report.wholly_faulty() {
        match e.kind {
            Kind::Poll(_) => {
                let reply = &e.reply;
                let text = e.json.then_some(POLL_UNANSWERED);
                assert!(
                    e.key.is_none()
                        && !reply.ok
                        && reply.request == NOT_READY
                        && reply.error_text.as_deref() == text,
                    "a poll under the fault must answer keyrelay's not ready: {e:?}"
                );
            }
            Kind::Submit => assert!(
                refusals.iter().any(|r| r.matches(e)),
                "a submit under the fault got none of {refusals:?}: {e:?}"
            ),
        }
    }
}

/// A simulator whose keys have threads to spare: submits that time out still create tasks
/// upstream, and nobody polls those.
pub async fn roomy_sim() -> SimHandle {
    let mut sim = Simulator::new();
    for (_, key) in KEYS {
        sim = sim.key(SimKey {
            threads: 100,
            ..SimKey::valid(key)
        });
    }
    sim.spawn().await.expect("simulator binds 127.0.0.1:0")
}

pub fn pool_config(sim: &SimHandle) -> Config {
    let keys: Vec<(&str, &str, f64)> = KEYS.iter().map(|(n, k)| (*n, *k, 1.0)).collect();
    let mut config = config_for(sim, &keys);
    config.failover.transient_cooldown = TRANSIENT_COOLDOWN;
    config
}

/// `keyrelay_key_errors_total` for `code`, summed over the pool.
pub fn errors(metrics: &str, code: &str) -> f64 {
    KEYS.iter()
        .map(|(key, _)| key_errors(metrics, key, code))
        .sum()
}

pub fn key_errors(metrics: &str, key: &str, code: &str) -> f64 {
    let series = format!(
        "keyrelay_key_errors_total{{code=\"{code}\",key=\"{key}\",provider=\"captchaai\"}}"
    );
    metric(metrics, &series).unwrap_or(0.0)
}

pub fn in_php_received(h: &Harness) -> usize {
    h.sim
        .received()
        .iter()
        .filter(|r| r.path == "/in.php")
        .count()
}
pub async fn pool() -> Harness {
    let sim = roomy_sim().await;
    let config = pool_config(&sim);
    Harness::start(sim, config).await
}
