//! Fault injection (issue 4, section 6): a steady workload of JSON and plain callers runs
//! through the proxy while the upstream fails every key (a 5xx storm, answers slower than the
//! timeout, connection resets, the upstream down and back), and each test checks what the
//! callers got, what became of the keys, and that traffic returned to normal by itself.
//!
//! Every test follows one script, [`run`]: healthy traffic, inject the fault, keep the
//! traffic going, clear the fault, wait (bounded) until every key serves submits again and
//! `/readyz` is 200, then more traffic that must be entirely normal. Each exchange is logged
//! with the phase it began and the phase it ended in, so assertions about the fault apply to
//! exactly the requests that ran while it was active from start to end. Requests that
//! straddle an edge must still get a well-formed answer.
//!
//! These tests run on tokio's single-threaded test runtime: the script, the callers and the
//! proxy interleave only at `.await`, which makes the phase bookkeeping exact.
//!
//! One more test pins down a bug these runs surfaced (now fixed): a submit that found no key
//! in rotation could claim "all 0 attempts failed upstream".

mod common;

use std::future::{ready, Future};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper::header::CONTENT_TYPE;
use hyper::{Request, StatusCode};
use keyrelay::config::{Config, Upstream};
use keyrelay::health::{HealthEvent, StateKind};
use keyrelay::proxy::KEY_HEADER;
use keyrelay::sim::{FaultKind, FaultTarget, SimHandle, SimKey, Simulator};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// The pool: three keys of equal weight, so every failover has somewhere to go.
const KEYS: [(&str, &str); 3] = [("a", KEY_A), ("b", KEY_B), ("c", KEY_C)];
/// Concurrent callers: JSON and plain, GET and POST.
const WORKERS: usize = 4;
/// Exchanges that must run wholly inside a phase before the script moves on.
const PER_PHASE: usize = 12;
/// Of those under the fault, at least this many submits and this many polls.
const PER_KIND: usize = 3;
/// Hard cap on each caller's requests; a passing run uses a small fraction of it.
const MAX_REQUESTS_PER_CALLER: usize = 2_000;
/// A caller's pause between requests, as a client's poll interval: it bounds the request
/// rate while keyrelay answers at once (every key cooling), not a guess at timing.
const PACE: Duration = Duration::from_millis(5);
/// A request without an answer by then counts as a hang.
const CALLER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on each wait of the script but recovery.
const WAIT_LIMIT: Duration = Duration::from_secs(15);
/// Bound on recovery after the fault clears: the transient cooldown plus a wide margin.
const RECOVERY_LIMIT: Duration = Duration::from_secs(10);
/// Period of every condition check.
const CHECK_EVERY: Duration = Duration::from_millis(10);
/// Short, so keys cooled by the fault come back within the recovery bound.
const TRANSIENT_COOLDOWN: Duration = Duration::from_millis(500);

const NOT_READY: &str = "CAPCHA_NOT_READY";
/// keyrelay's `error_text` for a poll the upstream did not answer.
const POLL_UNANSWERED: &str = "the upstream did not answer this poll; poll again";

// === the workload ===

/// Where the script is. Requests are logged with the phase they began and ended in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Before the fault.
    Healthy,
    /// The fault is being put in place.
    Injecting,
    /// The fault is active.
    Faulty,
    /// The fault is cleared; requests begun before may still be in flight.
    Draining,
    /// No request begun before the fault cleared is in flight; waiting for every key to
    /// serve again.
    Recovering,
    /// Every key has served a submit since the fault and `/readyz` is 200.
    Recovered,
}

const PHASES: [Phase; 6] = [
    Phase::Healthy,
    Phase::Injecting,
    Phase::Faulty,
    Phase::Draining,
    Phase::Recovering,
    Phase::Recovered,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Submit,
    Poll(u64),
}

/// How one caller talks: `json=1` or plain answers, query string or form body.
#[derive(Clone, Copy, Debug)]
struct Caller {
    json: bool,
    post: bool,
}

impl Caller {
    fn for_worker(worker: usize) -> Caller {
        Caller {
            json: worker % 2 == 0,
            post: worker >= 2,
        }
    }

    fn request(self, h: &Harness, kind: Kind) -> Request<Full<Bytes>> {
        let mut params = vec![("key", CALLER_KEY.to_owned())];
        let path = match kind {
            Kind::Submit => {
                params.push(("method", "userrecaptcha".to_owned()));
                params.push(("googlekey", "site".to_owned()));
                params.push(("pageurl", "https://x.test".to_owned()));
                "/in.php"
            }
            Kind::Poll(id) => {
                params.push(("action", "get".to_owned()));
                params.push(("id", id.to_string()));
                "/res.php"
            }
        };
        if self.json {
            params.push(("json", "1".to_owned()));
        }
        let form = serde_urlencoded::to_string(&params).expect("string pairs always encode");
        let request = if self.post {
            Request::post(h.url(path))
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Full::new(Bytes::from(form)))
        } else {
            Request::get(h.url(&format!("{path}?{form}"))).body(Full::new(Bytes::new()))
        };
        request.expect("a request from valid parts")
    }
}

/// A caller's answer, checked well-formed and reduced to what the assertions need.
#[derive(Debug)]
struct Reply {
    /// `OK|…` or `"status":1`.
    ok: bool,
    /// The value after `OK|`, the JSON `request`, or the bare code.
    request: String,
    /// JSON `error_text`; plain answers have none.
    error_text: Option<String>,
}

/// One request and its answer.
#[derive(Debug)]
struct Exchange {
    worker: usize,
    json: bool,
    kind: Kind,
    began: Phase,
    ended: Phase,
    took: Duration,
    /// `X-Keyrelay-Key`: the key of a relayed answer; keyrelay's own answers have none.
    key: Option<String>,
    reply: Reply,
}

impl Exchange {
    fn wholly_in(&self, phase: Phase) -> bool {
        self.began == phase && self.ended == phase
    }

    /// The task id of an accepted submit.
    fn accepted_task(&self) -> Option<u64> {
        match self.kind {
            Kind::Submit if self.reply.ok => self.reply.request.parse().ok(),
            _ => None,
        }
    }

    /// Upstream attempts a refused submit's JSON `error_text` reports; 0 when it cannot tell.
    fn attempts_reported(&self) -> u32 {
        match self.reply.error_text.as_deref() {
            Some(text) if text.starts_with("the upstream did not answer (") => 1,
            Some(text) => attempts_in(text).unwrap_or(0),
            None => 0,
        }
    }

    /// What a healthy upstream gives, relayed: a task id for a submit; "not ready" or the
    /// simulator's solution of exactly this task for a poll.
    fn is_normal(&self) -> bool {
        if self.key.is_none() {
            return false;
        }
        match self.kind {
            Kind::Submit => self.accepted_task().is_some(),
            Kind::Poll(id) => {
                let reply = &self.reply;
                (!reply.ok && reply.request == NOT_READY)
                    || (reply.ok && reply.request == format!("tok-{id}"))
            }
        }
    }
}

/// The shared state of callers, key watcher and script.
struct Load {
    phase: AtomicU8,
    stopped: AtomicBool,
    /// Requests in flight, by the phase they began in.
    in_flight: [AtomicUsize; PHASES.len()],
    log: Mutex<Vec<Exchange>>,
}

impl Load {
    fn new() -> Load {
        Load {
            phase: AtomicU8::new(Phase::Healthy as u8),
            stopped: AtomicBool::new(false),
            in_flight: Default::default(),
            log: Mutex::new(Vec::new()),
        }
    }

    fn phase(&self) -> Phase {
        PHASES[usize::from(self.phase.load(SeqCst))]
    }

    fn enter(&self, phase: Phase) {
        self.phase.store(phase as u8, SeqCst);
    }

    fn stop(&self) {
        self.stopped.store(true, SeqCst);
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(SeqCst)
    }

    fn begin(&self) -> Phase {
        let phase = self.phase();
        self.in_flight[phase as usize].fetch_add(1, SeqCst);
        phase
    }

    fn end(&self, began: Phase) -> Phase {
        self.in_flight[began as usize].fetch_sub(1, SeqCst);
        self.phase()
    }

    /// Requests still in flight that began before `phase`.
    fn in_flight_before(&self, phase: Phase) -> usize {
        self.in_flight[..phase as usize]
            .iter()
            .map(|n| n.load(SeqCst))
            .sum()
    }

    fn record(&self, exchange: Exchange) {
        self.lock().push(exchange);
    }

    fn count(&self, which: impl Fn(&Exchange) -> bool) -> usize {
        self.lock().iter().filter(|e| which(e)).count()
    }

    /// Keys that served an accepted submit begun in `phase`.
    fn keys_serving_in(&self, phase: Phase) -> Vec<&'static str> {
        let log = self.lock();
        KEYS.iter()
            .map(|(name, _)| *name)
            .filter(|name| {
                log.iter().any(|e| {
                    e.began == phase
                        && e.accepted_task().is_some()
                        && e.key.as_deref() == Some(*name)
                })
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Exchange>> {
        // A panicking caller fails the test anyway; the log stays readable for the message.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn into_log(self) -> Vec<Exchange> {
        self.log
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One caller: submit, then poll that task twice (the simulator answers at the second poll),
/// and again, until the load stops. Polls keep going to the last accepted task while submits
/// fail, as a client's would.
async fn caller(h: &Harness, load: &Load, worker: usize) {
    let mut task: Option<u64> = None;
    for n in 0..MAX_REQUESTS_PER_CALLER {
        if load.is_stopped() {
            return;
        }
        let kind = match task {
            Some(id) if n % 3 != 0 => Kind::Poll(id),
            _ => Kind::Submit,
        };
        let exchange = exchange(h, load, worker, kind).await;
        if let Some(id) = exchange.accepted_task() {
            task = Some(id);
        }
        load.record(exchange);
        tokio::time::sleep(PACE).await;
    }
}

/// Sends one request, bounded in time, and fails the test on a hang, a connection error or
/// a malformed answer.
async fn exchange(h: &Harness, load: &Load, worker: usize, kind: Kind) -> Exchange {
    let caller = Caller::for_worker(worker);
    let request = caller.request(h, kind);
    let began = load.begin();
    let started = Instant::now();
    let sent = tokio::time::timeout(CALLER_TIMEOUT, async {
        let response = h.client.request(request).await.map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((parts, body.to_bytes()))
    })
    .await;
    let took = started.elapsed();
    let ended = load.end(began);
    let what = || format!("caller {worker} {caller:?}, {kind:?} begun {began:?}, ended {ended:?}");
    let (parts, body) = match sent {
        Err(_) => panic!("{}: no answer within {CALLER_TIMEOUT:?}", what()),
        Ok(Err(error)) => panic!("{}: connection error: {error}", what()),
        Ok(Ok(answer)) => answer,
    };
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let reply = well_formed(caller.json, parts.status, content_type, &body).unwrap_or_else(|why| {
        panic!(
            "{}: malformed answer ({why}): {:?}",
            what(),
            String::from_utf8_lossy(&body)
        )
    });
    let key = parts
        .headers
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Exchange {
        worker,
        json: caller.json,
        kind,
        began,
        ended,
        took,
        key,
        reply,
    }
}

/// A 2captcha answer in the caller's format, with HTTP 200: JSON with `status` (0 or 1) and
/// `request`, or plain `OK|…`, `CAPCHA_NOT_READY` or `ERROR_…`.
fn well_formed(
    json: bool,
    status: StatusCode,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Reply, String> {
    if status != StatusCode::OK {
        return Err(format!("HTTP {status}"));
    }
    let text = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8".to_owned())?;
    let is_code = |s: &str| {
        (s == NOT_READY || s.starts_with("ERROR_"))
            && s.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    };
    if json {
        if content_type != Some("application/json") {
            return Err(format!("content type {content_type:?} for a JSON caller"));
        }
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let ok = match value["status"].as_u64() {
            Some(1) => true,
            Some(0) => false,
            _ => return Err("status is neither 0 nor 1".to_owned()),
        };
        let request = match &value["request"] {
            serde_json::Value::String(s) if ok && !s.is_empty() => s.clone(),
            serde_json::Value::String(s) if !ok && is_code(s) => s.clone(),
            // The service answers reCAPTCHA task ids as numbers.
            serde_json::Value::Number(n) if ok && n.is_u64() => n.to_string(),
            other => return Err(format!("request {other} does not fit status {ok}")),
        };
        let error_text = match value.get("error_text") {
            None => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(format!("error_text {other} is not a string")),
        };
        return Ok(Reply {
            ok,
            request,
            error_text,
        });
    }
    if !content_type.is_some_and(|ct| ct.starts_with("text/plain")) {
        return Err(format!("content type {content_type:?} for a plain caller"));
    }
    if let Some(value) = text.strip_prefix("OK|") {
        if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '|') {
            return Err("OK| without a single value".to_owned());
        }
        return Ok(Reply {
            ok: true,
            request: value.to_owned(),
            error_text: None,
        });
    }
    if is_code(text) {
        return Ok(Reply {
            ok: false,
            request: text.to_owned(),
            error_text: None,
        });
    }
    Err("neither OK|…, CAPCHA_NOT_READY nor ERROR_…".to_owned())
}

// === the script ===

/// A key seen cooling, and when.
#[derive(Debug)]
struct Sighting {
    phase: Phase,
    key: &'static str,
    reason: Option<&'static str>,
}

/// Samples every key's health until the load stops; fails at once on a benched key, which
/// would otherwise only show as a recovery that never comes.
async fn watch_keys(h: &Harness, load: &Load) -> Vec<Sighting> {
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
async fn until<F: Future<Output = bool>>(
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
struct Report {
    log: Vec<Exchange>,
    /// From the fault being cleared to every key serving again with `/readyz` 200.
    recovery: Duration,
}

impl Report {
    fn wholly_faulty(&self) -> impl Iterator<Item = &Exchange> {
        self.log.iter().filter(|e| e.wholly_in(Phase::Faulty))
    }

    /// Submits keyrelay may have sent upstream: all but those it answered without trying a
    /// key.
    fn submits_tried(&self) -> usize {
        let untried = |e: &Exchange| Refusal::NoKeyInRotation.matches(e);
        self.log
            .iter()
            .filter(|e| e.kind == Kind::Submit && !untried(e))
            .count()
    }

    /// The fewest failed upstream attempts the wholly faulty exchanges prove: three per poll
    /// (retried on its own key up to `max_attempts`), and for a JSON submit the attempts its
    /// `error_text` reports.
    fn least_failed_attempts(&self) -> f64 {
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
async fn run(
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

// === what a failed submit may be answered ===

/// The answers keyrelay may give a submit it could not place, each with its exact text.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// Every attempt failed before the upstream could act (a 5xx, a refused connection), so
    /// each was retried on another key.
    AllAttemptsFailed,
    /// The first attempt may have reached the upstream and created a task, so keyrelay did
    /// not send it again (`retry_unsure_submits` is off by default); the label names why.
    MayHaveArrived(&'static str),
    /// Transient cooldowns took every key out of rotation.
    NoKeyInRotation,
}

const REFUSED_ALL_ATTEMPTS: &str = " attempts failed upstream; retry later";

impl Refusal {
    fn code(self) -> &'static str {
        match self {
            Refusal::NoKeyInRotation => "ERROR_ZERO_BALANCE",
            _ => "ERROR_SERVER_ERROR",
        }
    }

    /// Whether `text` is this refusal's JSON `error_text`.
    fn fits(self, text: &str) -> bool {
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
    fn matches(self, e: &Exchange) -> bool {
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

/// N in "all N attempts failed upstream; retry later".
fn attempts_in(text: &str) -> Option<u32> {
    text.strip_prefix("all ")?
        .strip_suffix(REFUSED_ALL_ATTEMPTS)?
        .parse()
        .ok()
}

/// Every exchange that ran wholly under the fault got keyrelay's own answer: a poll is "not
/// ready" (the client polls again), a submit one of `refusals`.
fn assert_fault_answers(report: &Report, refusals: &[Refusal]) {
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

// === setup ===

/// A simulator whose keys have threads to spare: submits that time out still create tasks
/// upstream, and nobody polls those.
async fn roomy_sim() -> SimHandle {
    let mut sim = Simulator::new();
    for (_, key) in KEYS {
        sim = sim.key(SimKey {
            threads: 100,
            ..SimKey::valid(key)
        });
    }
    sim.spawn().await.expect("simulator binds 127.0.0.1:0")
}

fn pool_config(sim: &SimHandle) -> Config {
    let keys: Vec<(&str, &str, f64)> = KEYS.iter().map(|(n, k)| (*n, *k, 1.0)).collect();
    let mut config = config_for(sim, &keys);
    config.failover.transient_cooldown = TRANSIENT_COOLDOWN;
    config
}

/// `keyrelay_key_errors_total` for `code`, summed over the pool.
fn errors(metrics: &str, code: &str) -> f64 {
    KEYS.iter()
        .map(|(key, _)| key_errors(metrics, key, code))
        .sum()
}

fn key_errors(metrics: &str, key: &str, code: &str) -> f64 {
    let series = format!(
        "keyrelay_key_errors_total{{code=\"{code}\",key=\"{key}\",provider=\"captchaai\"}}"
    );
    metric(metrics, &series).unwrap_or(0.0)
}

fn in_php_received(h: &Harness) -> usize {
    h.sim
        .received()
        .iter()
        .filter(|r| r.path == "/in.php")
        .count()
}

// === the upstream down and back ===

/// A TCP relay between keyrelay and the simulator that can take the upstream down. While
/// down, its port stays bound but does not listen: every connection is refused, as by a
/// stopped server, and no other socket can take the port before the upstream comes back.
/// (Pointing keyrelay at a freed port and binding it again later would race every other
/// test that binds ephemeral ports; a relay also keeps the simulator's handle and state.)
struct Gate {
    addr: SocketAddr,
    target: SocketAddr,
    state: Mutex<Option<GateState>>,
}

enum GateState {
    Up {
        stop: oneshot::Sender<()>,
        relay: JoinHandle<()>,
    },
    Down(TcpSocket),
}

impl Gate {
    /// A gate on an ephemeral port, up, relaying to `target`.
    fn open(target: SocketAddr) -> Gate {
        let socket = reserve(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind 127.0.0.1:0");
        let addr = socket.local_addr().expect("a bound socket has an address");
        let gate = Gate {
            addr,
            target,
            state: Mutex::new(Some(GateState::Down(socket))),
        };
        gate.up();
        gate
    }

    fn up(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(GateState::Down(socket)) = state.take() else {
            panic!("the gate is already up");
        };
        let listener = socket.listen(1024).expect("a bound socket can listen");
        let (stop, stopped) = oneshot::channel();
        let relay = tokio::spawn(relay(listener, self.target, stopped));
        *state = Some(GateState::Up { stop, relay });
    }

    /// Returns once the listener and every relayed connection are closed and the port is
    /// bound again without listening.
    async fn down(&self) {
        let taken = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(GateState::Up { stop, relay }) = taken else {
            panic!("the gate is already down");
        };
        // Fails only if the relay already ended, which the await below reports.
        let _ = stop.send(());
        relay.await.expect("the relay ends cleanly");
        let socket =
            reserve(self.addr).unwrap_or_else(|e| panic!("cannot bind {} again: {e}", self.addr));
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = Some(GateState::Down(socket));
    }
}

fn reserve(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = TcpSocket::new_v4()?;
    // Relayed connections the gate closed linger in TIME_WAIT on this port.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

async fn relay(listener: TcpListener, target: SocketAddr, mut stop: oneshot::Receiver<()>) {
    let mut pipes = JoinSet::new();
    loop {
        tokio::select! {
            // A dropped gate stops the relay too.
            _ = &mut stop => break,
            Some(_) = pipes.join_next(), if !pipes.is_empty() => {}
            accepted = listener.accept() => {
                if let Ok((inbound, _)) = accepted {
                    pipes.spawn(pipe(inbound, target));
                }
            }
        }
    }
    drop(listener);
    // Every relayed connection closes, as when a server goes down.
    pipes.shutdown().await;
}

async fn pipe(mut inbound: TcpStream, target: SocketAddr) {
    if let Ok(mut outbound) = TcpStream::connect(target).await {
        // Ends when either side closes; an error is one more way of closing.
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    }
}

// === the faults ===

async fn pool() -> Harness {
    let sim = roomy_sim().await;
    let config = pool_config(&sim);
    Harness::start(sim, config).await
}

#[tokio::test]
async fn a_5xx_storm_on_every_key_answers_everyone_and_benches_no_key() {
    let h = pool().await;
    let report = run(
        &h,
        async {
            let submits = fault(FaultTarget::Submit, FaultKind::Status(502), None);
            let polls = fault(FaultTarget::Poll, FaultKind::Status(503), None);
            h.sim.add_fault("*", submits);
            h.sim.add_fault("*", polls);
        },
        async { h.sim.clear_faults() },
    )
    .await;
    // A 5xx says the upstream did not take the task, so each submit moved on to the next key
    // until none was left to try.
    assert_fault_answers(
        &report,
        &[Refusal::AllAttemptsFailed, Refusal::NoKeyInRotation],
    );
    let metrics = h.metrics().await;
    // Every key was either tried by a submit under the fault or cooled by 5xx answers.
    for (key, _) in KEYS {
        assert!(
            key_errors(&metrics, key, "http_5xx") >= 1.0,
            "no 5xx counted for key {key}:\n{metrics}"
        );
    }
    assert!(errors(&metrics, "http_5xx") >= report.least_failed_attempts());
    h.stop().await;
}

#[tokio::test]
async fn an_upstream_slower_than_the_timeout_is_answered_in_time() {
    const SLOW: Duration = Duration::from_secs(1);
    let sim = roomy_sim().await;
    let mut config = pool_config(&sim);
    config.timeouts.request = Duration::from_millis(300);
    let h = Harness::start(sim, config).await;
    let report = run(
        &h,
        async {
            let slow = fault(FaultTarget::Any, FaultKind::Delay(SLOW), None);
            h.sim.add_fault("*", slow);
        },
        async { h.sim.clear_faults() },
    )
    .await;
    // A submit that timed out may have reached the upstream and created a task, so keyrelay
    // answers ERROR_SERVER_ERROR and does not send it again; a poll that timed out on every
    // retry answers CAPCHA_NOT_READY.
    assert_fault_answers(
        &report,
        &[Refusal::MayHaveArrived("timeout"), Refusal::NoKeyInRotation],
    );
    for e in report.wholly_faulty().filter(|e| e.kind == Kind::Submit) {
        assert!(
            e.took < SLOW,
            "a submit waited for the slow upstream: {e:?}"
        );
    }
    assert!(
        in_php_received(&h) <= report.submits_tried(),
        "a submit that timed out was sent again"
    );
    let metrics = h.metrics().await;
    assert!(errors(&metrics, "timeout") >= report.least_failed_attempts());
    h.stop().await;
}

#[tokio::test]
async fn connection_resets_are_answered_and_no_submit_is_sent_twice() {
    let h = pool().await;
    let report = run(
        &h,
        async {
            let reset = fault(FaultTarget::Any, FaultKind::Reset, None);
            h.sim.add_fault("*", reset);
        },
        async { h.sim.clear_faults() },
    )
    .await;
    // The upstream read each request before closing: a submit may have created its task.
    assert_fault_answers(
        &report,
        &[
            Refusal::MayHaveArrived("no_answer"),
            Refusal::NoKeyInRotation,
        ],
    );
    assert!(
        in_php_received(&h) <= report.submits_tried(),
        "a submit whose connection was reset was sent again"
    );
    let metrics = h.metrics().await;
    assert!(errors(&metrics, "no_answer") >= report.least_failed_attempts());
    h.stop().await;
}

#[tokio::test]
async fn the_upstream_down_then_back_is_recovered_from_without_a_restart() {
    let sim = roomy_sim().await;
    let gate = Gate::open(sim.addr());
    let mut config = pool_config(&sim);
    let upstream =
        Upstream::parse(&format!("http://{}", gate.addr)).expect("a loopback url is valid");
    for key in &mut config.keys {
        key.upstream = upstream.clone();
    }
    config.upstream = upstream;
    let h = Harness::start(sim, config).await;
    let report = run(
        &h,
        async {
            gate.down().await;
            let refused = TcpStream::connect(gate.addr).await.map(drop);
            assert_eq!(
                refused.map_err(|e| e.kind()),
                Err(std::io::ErrorKind::ConnectionRefused),
                "a down upstream refuses connections"
            );
        },
        async { gate.up() },
    )
    .await;
    // A refused connection never reached the upstream, and every key sits behind the gate's
    // one host:port, so the submit's walk ended there: one attempt, answered at once. A
    // request caught on a pooled connection that the gate had just closed may have arrived,
    // and is answered as such.
    assert_fault_answers(
        &report,
        &[
            Refusal::AllAttemptsFailed,
            Refusal::MayHaveArrived("no_answer"),
            Refusal::NoKeyInRotation,
        ],
    );
    for e in report
        .wholly_faulty()
        .filter(|e| e.json && Refusal::AllAttemptsFailed.matches(e))
    {
        assert_eq!(
            e.attempts_reported(),
            1,
            "a second key behind the gate: {e:?}"
        );
    }
    let metrics = h.metrics().await;
    assert!(errors(&metrics, "connect") >= 1.0, "{metrics}");
    assert!(
        errors(&metrics, "connect") + errors(&metrics, "no_answer")
            >= report.least_failed_attempts()
    );
    h.stop().await;
}

/// keyrelay decides that no key is in rotation and words its answer at two different
/// instants (`proxy::submit`: the candidates, then `exhausted`). A key that came back in
/// between (a cooldown ending, a refresh restoring it) used to turn "no key in rotation"
/// (ERROR_ZERO_BALANCE, on which the SDK waits) into ERROR_SERVER_ERROR "all 0 attempts
/// failed upstream", though nothing was sent. Here a thread takes the lone key out and puts
/// it back as fast as it can while submits run, so many of them straddle a change; every
/// answer must still be a task id or exactly "no key in rotation".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_that_tried_no_key_says_so() {
    const SUBMITS: usize = 300;
    const FLIPS_AT_MOST: usize = 20_000_000;
    const NO_KEY: &str = "keyrelay has no key in rotation (1 configured); retry later";
    // Threads to spare: the tasks are never polled.
    let sim = Simulator::new()
        .key(SimKey {
            threads: 10_000,
            ..SimKey::valid(KEY_A)
        })
        .spawn()
        .await
        .expect("simulator binds 127.0.0.1:0");
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    let h = Harness::start(sim, config).await;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flipper = {
        let (app, stop) = (h.app.clone(), stop.clone());
        let key = app.snapshot().pool.keys()[0].clone();
        std::thread::spawn(move || {
            let out = HealthEvent::Cool {
                reason: keyrelay::health::Reason::of_code("MAX_USER_TURN"),
                duration: Duration::from_secs(3600),
            };
            for _ in 0..FLIPS_AT_MOST {
                if stop.load(SeqCst) {
                    break;
                }
                app.record_health(&key, out);
                app.record_health(&key, HealthEvent::Restore);
            }
        })
    };
    let submit =
        format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1");
    let mut refused = Vec::new();
    for _ in 0..SUBMITS {
        let json = h.get(&submit).await.json();
        if json["status"] != 1 {
            refused.push(json);
        }
    }
    stop.store(true, SeqCst);
    flipper.join().expect("the flipping thread ends");
    let mislabelled: Vec<_> = refused
        .iter()
        .filter(|json| json["error_text"] != NO_KEY)
        .collect();
    assert!(!refused.is_empty(), "no submit ever met the key out");
    assert!(
        mislabelled.is_empty(),
        "{} of {} submits refused for want of a key were answered otherwise, e.g. {}",
        mislabelled.len(),
        refused.len(),
        mislabelled[0]
    );
    h.stop().await;
}
