//! The fault tests' workload: callers, JSON and plain, GET and POST, submitting and
//! polling at a client's pace through the proxy, each exchange logged with the phase it
//! began and ended in, and checked to be a well-formed answer.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::CONTENT_TYPE;
use hyper::{Request, StatusCode};
use keyrelay::proxy::KEY_HEADER;
use tokio::time::Instant;

use super::*;

/// The pool: three keys of equal weight, so every failover has somewhere to go.
pub const KEYS: [(&str, &str); 3] = [("a", KEY_A), ("b", KEY_B), ("c", KEY_C)];
/// Concurrent callers: JSON and plain, GET and POST.
pub const WORKERS: usize = 4;
/// Exchanges that must run wholly inside a phase before the script moves on.
pub const PER_PHASE: usize = 12;
/// Of those under the fault, at least this many submits and this many polls.
pub const PER_KIND: usize = 3;
/// Hard cap on each caller's requests; a passing run uses a small fraction of it.
pub const MAX_REQUESTS_PER_CALLER: usize = 2_000;
/// A caller's pause between requests, as a client's poll interval: it bounds the request
/// rate while keyrelay answers at once (every key cooling), not a guess at timing.
pub const PACE: Duration = Duration::from_millis(5);
/// A request without an answer by then counts as a hang.
pub const CALLER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on each wait of the script but recovery.
pub const WAIT_LIMIT: Duration = Duration::from_secs(15);
/// Bound on recovery after the fault clears: the transient cooldown plus a wide margin.
pub const RECOVERY_LIMIT: Duration = Duration::from_secs(10);
/// Period of every condition check.
pub const CHECK_EVERY: Duration = Duration::from_millis(10);
/// Short, so keys cooled by the fault come back within the recovery bound.
pub const TRANSIENT_COOLDOWN: Duration = Duration::from_millis(500);

pub const NOT_READY: &str = "CAPCHA_NOT_READY";
/// keyrelay's `error_text` for a poll the upstream did not answer.
pub const POLL_UNANSWERED: &str = "the upstream did not answer this poll; poll again";

/// Where the script is. Requests are logged with the phase they began and ended in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
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

pub const PHASES: [Phase; 6] = [
    Phase::Healthy,
    Phase::Injecting,
    Phase::Faulty,
    Phase::Draining,
    Phase::Recovering,
    Phase::Recovered,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Submit,
    Poll(u64),
}

/// How one caller talks: `json=1` or plain answers, query string or form body.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub json: bool,
    pub post: bool,
}

impl Caller {
    pub fn for_worker(worker: usize) -> Caller {
        Caller {
            json: worker % 2 == 0,
            post: worker >= 2,
        }
    }

    pub fn request(self, h: &Harness, kind: Kind) -> Request<Full<Bytes>> {
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
pub struct Reply {
    /// `OK|…` or `"status":1`.
    pub ok: bool,
    /// The value after `OK|`, the JSON `request`, or the bare code.
    pub request: String,
    /// JSON `error_text`; plain answers have none.
    pub error_text: Option<String>,
}

/// One request and its answer.
#[derive(Debug)]
pub struct Exchange {
    pub worker: usize,
    pub json: bool,
    pub kind: Kind,
    pub began: Phase,
    pub ended: Phase,
    pub took: Duration,
    /// `X-Keyrelay-Key`: the key of a relayed answer; keyrelay's own answers have none.
    pub key: Option<String>,
    pub reply: Reply,
}

impl Exchange {
    pub fn wholly_in(&self, phase: Phase) -> bool {
        self.began == phase && self.ended == phase
    }

    /// The task id of an accepted submit.
    pub fn accepted_task(&self) -> Option<u64> {
        match self.kind {
            Kind::Submit if self.reply.ok => self.reply.request.parse().ok(),
            _ => None,
        }
    }

    /// Upstream attempts a refused submit's JSON `error_text` reports; 0 when it cannot tell.
    pub fn attempts_reported(&self) -> u32 {
        match self.reply.error_text.as_deref() {
            Some(text) if text.starts_with("the upstream did not answer (") => 1,
            Some(text) => attempts_in(text).unwrap_or(0),
            None => 0,
        }
    }

    /// What a healthy upstream gives, relayed: a task id for a submit; "not ready" or the
    /// simulator's solution of exactly this task for a poll.
    pub fn is_normal(&self) -> bool {
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
pub struct Load {
    pub phase: AtomicU8,
    pub stopped: AtomicBool,
    /// Requests in flight, by the phase they began in.
    pub in_flight: [AtomicUsize; PHASES.len()],
    pub log: Mutex<Vec<Exchange>>,
}

impl Load {
    pub fn new() -> Load {
        Load {
            phase: AtomicU8::new(Phase::Healthy as u8),
            stopped: AtomicBool::new(false),
            in_flight: Default::default(),
            log: Mutex::new(Vec::new()),
        }
    }

    pub fn phase(&self) -> Phase {
        PHASES[usize::from(self.phase.load(SeqCst))]
    }

    pub fn enter(&self, phase: Phase) {
        self.phase.store(phase as u8, SeqCst);
    }

    pub fn stop(&self) {
        self.stopped.store(true, SeqCst);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(SeqCst)
    }

    pub fn begin(&self) -> Phase {
        let phase = self.phase();
        self.in_flight[phase as usize].fetch_add(1, SeqCst);
        phase
    }

    pub fn end(&self, began: Phase) -> Phase {
        self.in_flight[began as usize].fetch_sub(1, SeqCst);
        self.phase()
    }

    /// Requests still in flight that began before `phase`.
    pub fn in_flight_before(&self, phase: Phase) -> usize {
        self.in_flight[..phase as usize]
            .iter()
            .map(|n| n.load(SeqCst))
            .sum()
    }

    pub fn record(&self, exchange: Exchange) {
        self.lock().push(exchange);
    }

    pub fn count(&self, which: impl Fn(&Exchange) -> bool) -> usize {
        self.lock().iter().filter(|e| which(e)).count()
    }

    /// Keys that served an accepted submit begun in `phase`.
    pub fn keys_serving_in(&self, phase: Phase) -> Vec<&'static str> {
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

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Exchange>> {
        // A panicking caller fails the test anyway; the log stays readable for the message.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn into_log(self) -> Vec<Exchange> {
        self.log
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One caller: submit, then poll that task twice (the simulator answers at the second poll),
/// and again, until the load stops. Polls keep going to the last accepted task while submits
/// fail, as a client's would.
pub async fn caller(h: &Harness, load: &Load, worker: usize) {
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
pub async fn exchange(h: &Harness, load: &Load, worker: usize, kind: Kind) -> Exchange {
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
pub fn well_formed(
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

pub const REFUSED_ALL_ATTEMPTS: &str = " attempts failed upstream; retry later";

/// N in "all N attempts failed upstream; retry later".
pub fn attempts_in(text: &str) -> Option<u32> {
    text.strip_prefix("all ")?
        .strip_suffix(REFUSED_ALL_ATTEMPTS)?
        .parse()
        .ok()
}
