//! One caller request end to end: route, read, parse, pick a key, rewrite, forward,
//! classify, record, answer.
//!
//! Flow: `server` → [`handle`] → `captcha::ParsedRequest` → `submit` / `poll` / `account` →
//! `pool::candidates` → `upstream` → `captcha::classify` → `failover` → `App::record_health`.
//!
//! On the API paths every answer keyrelay gives is an upstream 2xx answer passed through
//! verbatim, or an HTTP 200 of its own in the caller's format (plain, or JSON with `json=1`),
//! as the real service answers its own errors: clients treat any other status as a network
//! failure and crash or retry blindly.

mod access;
pub(crate) use access::{proxy_token, Asker};
mod account;
mod body;
mod hangup;
mod json_front;
mod local;
mod orphans;
mod poll;
mod probe;
mod submit;
mod to_the_end;
pub mod verdict;

pub use hangup::Hangup;
pub(crate) use local::{Local, NoVerdict};
pub use orphans::poll_orphan;
use to_the_end::ToTheEnd;

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::Either;
use futures_util::FutureExt;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::admin;
use crate::app::{App, Snapshot};
use crate::captcha::{self, Endpoint, Outcome, ParsedRequest, Reply, ResCommand};
use crate::failover;
use crate::health::{Reason, StateKind};
use crate::json_api::{self, Dialect, JsonMethod};
use crate::metrics::{Denied, RequestOutcome, TokenSubmit};
use crate::pool::KeyEntry;
use crate::status;
use crate::tokens::Token;
use crate::upstream::{self, Outgoing, UpstreamAnswer, UpstreamError};

/// Every response keyrelay sends is fully buffered: answers are small.
pub type Body = Full<Bytes>;

/// Who sent a request: the connection it came on. Handed over directly, not in the
/// request's extensions, which would cost two allocations per request.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Whether the caller has closed its side of the connection.
    pub hangup: Hangup,
    /// The address the connection came from (for a request inside an intercepted
    /// `CONNECT`, the tunnel's).
    pub peer: std::net::SocketAddr,
}

/// Serves one request. Never fails: every problem becomes a well-formed answer.
pub async fn handle(
    app: App,
    caller: Caller,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    // The operator endpoints are served here unless `[admin] listen` gives them a listener
    // of their own; then this listener answers 404 for them. The snapshot is loaded only
    // for their paths: API requests never pay for the check.
    if is_operator_path(path) && app.snapshot().config.admin.listen.is_none() {
        if admin::owns(path) {
            return Ok(admin::handle(&app, caller.peer, req).await);
        }
        if req.method() == Method::GET {
            if let Some(response) = operator_endpoint(&app, path, req.headers()) {
                return Ok(response);
            }
        }
    }
    let Some(endpoint) = Endpoint::from_path(path) else {
        // The JSON task API: its methods on any host, and its own error for any other path
        // on its services' hosts or sent as JSON.
        let host = request_host(&req);
        let dialect = Dialect::of_host(host);
        if let Some(method) = JsonMethod::from_path(path) {
            if req.method() != Method::POST && req.method() != Method::GET {
                return Ok(not_allowed());
            }
            let front = Front::Json(method, dialect);
            return Ok(serve_to_the_end(app, front, caller, req).await);
        }
        let sent_json = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.to_ascii_lowercase().contains("json"));
        if sent_json || host.is_some_and(json_api::is_json_api_host) {
            return Ok(json_front::no_such_method(dialect));
        }
        let text = if app.snapshot().config.admin.listen.is_some() {
            "not found: keyrelay serves /in.php, /res.php and /solve.php here; /metrics, /status, /scaling, /healthz, /readyz and /admin/ are on the admin listener\n"
        } else {
            "not found: keyrelay serves /in.php, /res.php, /solve.php, /metrics, /status, /scaling, /healthz, /readyz and /admin/\n"
        };
        return Ok(plain(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            text,
        ));
    };
    if req.method() != Method::GET && req.method() != Method::POST {
        return Ok(not_allowed());
    }
    Ok(serve_to_the_end(app, Front::Captcha(endpoint), caller, req).await)
}

fn not_allowed() -> Response<Body> {
    let mut response = plain(
        StatusCode::METHOD_NOT_ALLOWED,
        "text/plain; charset=utf-8",
        "method not allowed: use GET or POST\n",
    );
    response
        .headers_mut()
        .insert("allow", HeaderValue::from_static("GET, POST"));
    response
}

/// The host a request names: its target's authority (absolute form, through the forward
/// proxy) or its `Host` header.
fn request_host(req: &Request<Incoming>) -> Option<&str> {
    req.uri().host().or_else(|| {
        req.headers()
            .get(hyper::header::HOST)
            .and_then(|v| v.to_str().ok())
    })
}

/// Which API generation a request speaks.
#[derive(Clone, Copy)]
enum Front {
    /// `in.php`, `res.php`, `solve.php`.
    Captcha(Endpoint),
    /// The JSON task API, answered in `Dialect`'s shape.
    Json(JsonMethod, Dialect),
}

/// Serves an API request to its end even if its caller leaves ([`to_the_end`]), and turns
/// a panic in it into a well-formed answer rather than a dropped connection.
async fn serve_to_the_end(
    app: App,
    front: Front,
    Caller { hangup, peer }: Caller,
    req: Request<Incoming>,
) -> Response<Body> {
    let requests = app.requests().clone();
    let endpoint = match front {
        Front::Captcha(endpoint) => endpoint,
        Front::Json(method, _) => json_front::endpoint_of(method),
    };
    // Either, not an async block around a match: a future is copied whole each time it
    // moves, and a wrapper of its own would be one more move of the largest on the path.
    let served = match front {
        Front::Captcha(endpoint) => Either::Left(api(app, endpoint, peer, req)),
        // Boxed: its state, inline, would grow every in.php request's future.
        Front::Json(method, dialect) => Either::Right(Box::pin(json_front::answer(
            app,
            method,
            dialect,
            peer.ip(),
            req,
        ))),
    };
    let work = async move {
        match AssertUnwindSafe(served).catch_unwind().await {
            Ok(served) => served,
            Err(_) => {
                static PANICKED: crate::log_limit::Throttle =
                    crate::log_limit::Throttle::new(crate::log_limit::INTERVAL);
                if let Some(admitted) = PANICKED.admit() {
                    tracing::error!(
                        endpoint = endpoint.label(),
                        held_back = admitted.suppressed,
                        "a request handler panicked (logged once a minute)"
                    );
                }
                let outcome = Local::Panicked.outcome();
                let response = match front {
                    Front::Captcha(_) => into_response(Local::Panicked.into(), false, false),
                    Front::Json(_, dialect) => json_front::panicked(dialect),
                };
                (response, outcome)
            }
        }
    };
    ToTheEnd::new(work, endpoint, requests, hangup).await
}

/// Whether `path` is an operator endpoint's: `/metrics`, `/healthz`, `/readyz`, `/status`
/// or the admin API under `/admin/`.
pub fn is_operator_path(path: &str) -> bool {
    matches!(
        path,
        "/metrics" | "/healthz" | "/readyz" | "/status" | "/scaling"
    ) || admin::owns(path)
}

/// Serves one request on the admin listener (`[admin] listen`): the operator endpoints and
/// the admin API, and 404 for everything else, the captcha API included.
pub async fn operator(
    app: App,
    caller: Caller,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    if admin::owns(path) {
        return Ok(admin::handle(&app, caller.peer, req).await);
    }
    if req.method() == Method::GET {
        if let Some(response) = operator_endpoint(&app, path, req.headers()) {
            return Ok(response);
        }
    }
    Ok(plain(
        StatusCode::NOT_FOUND,
        "text/plain; charset=utf-8",
        "not found: this is keyrelay's admin listener; it serves /metrics, /status, /scaling, /healthz, /readyz and /admin/, and the captcha API is on the proxy's listener\n",
    ))
}

/// `/metrics`, `/healthz`, `/readyz` and `/status`: on the proxy's own listener, or on the
/// admin listener when there is one.
fn operator_endpoint(app: &App, path: &str, headers: &HeaderMap) -> Option<Response<Body>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    Some(match path {
        "/metrics" => plain(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            app.render_metrics(),
        ),
        // Liveness: the process answers; nothing else is checked.
        "/healthz" => plain(StatusCode::OK, TEXT, "ok\n"),
        // Readiness: a proxy with an empty pool can only refuse work.
        "/readyz" => {
            let snapshot = app.snapshot();
            let pool = &snapshot.pool;
            let active = pool.active_count(Instant::now());
            let configured = pool.keys().len();
            // Held keys are out of rotation too; say so, or "none in rotation" misleads.
            let held = pool
                .keys()
                .iter()
                .filter(|k| pool.admin_hold(k).is_some())
                .count();
            let held = match held {
                0 => String::new(),
                n => format!(" ({n} held by the operator)"),
            };
            if active > 0 {
                let text = format!("ready: {active} of {configured} keys in rotation{held}\n");
                plain(StatusCode::OK, TEXT, text)
            } else {
                let text = format!("not ready: none of {configured} keys in rotation{held}\n");
                plain(StatusCode::SERVICE_UNAVAILABLE, TEXT, text)
            }
        }
        // For autoscalers that read HTTP (KEDA's metrics-api scaler): docs/scaling.md.
        "/scaling" => plain(
            StatusCode::OK,
            "application/json",
            serde_json::to_string(&app.scaling()).expect("the scaling answer serializes"),
        ),
        "/status" => {
            let status = status::pool_status(app);
            let wants_html = headers
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|accept| accept.contains("text/html"));
            if wants_html {
                plain(
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    status::to_html(&status),
                )
            } else {
                plain(StatusCode::OK, "application/json", status::to_json(&status))
            }
        }
        _ => return None,
    })
}

/// What a handler decided to answer.
pub(crate) enum Handled {
    /// An upstream answer, passed through verbatim: status, headers, body.
    Relayed {
        answer: UpstreamAnswer,
        /// How the request ended: the answer's class, or `pool_busy` for a busy answer
        /// relayed because every key was busy.
        outcome: RequestOutcome,
        /// Name of the key that served it (as its header value), and how many upstream
        /// attempts it took.
        key: Option<HeaderValue>,
        attempts: u32,
    },
    /// An answer keyrelay made itself.
    Local(Local),
}

impl Handled {
    fn relayed(
        answer: UpstreamAnswer,
        outcome: RequestOutcome,
        key: &KeyEntry,
        attempts: u32,
    ) -> Handled {
        Handled::Relayed {
            answer,
            outcome,
            key: key.name_header.clone(),
            attempts,
        }
    }

    fn outcome(&self) -> RequestOutcome {
        match self {
            Handled::Relayed { outcome, .. } => *outcome,
            Handled::Local(local) => local.outcome(),
        }
    }
}

impl From<Local> for Handled {
    fn from(local: Local) -> Handled {
        Handled::Local(local)
    }
}

async fn api(
    app: App,
    endpoint: Endpoint,
    peer: std::net::SocketAddr,
    req: Request<Incoming>,
) -> (Response<Body>, RequestOutcome) {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let snapshot = app.snapshot();
    let query = parts.uri.query();
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let limit = snapshot.config.limits.max_body;
    let key_headers = snapshot.config.observability.key_headers;
    let (handled, json) = match body::read(body, &parts.headers, limit).await {
        Err(body::BodyError::TooLarge { prefix }) => {
            let json = json_hint(query, content_type, &prefix);
            (Local::BodyTooLarge { limit }.into(), json)
        }
        Err(body::BodyError::Io(e)) => {
            tracing::debug!(error = %e, "caller body unreadable");
            let json = json_hint(query, content_type, &[]);
            (Local::BodyUnreadable.into(), json)
        }
        Ok(bytes) => {
            match ParsedRequest::parse_request(parts.uri.path_and_query(), &parts.headers, bytes) {
                Err(e) => {
                    let json = json_hint(query, content_type, &[]);
                    (Local::Unreadable(e).into(), json)
                }
                Ok(parsed) => {
                    let json = parsed.wants_json();
                    let token = admit(&app, &snapshot, peer.ip(), &parsed, &parts.headers);
                    let handled = match token {
                        Err(denied) => denied.into(),
                        Ok(token) => {
                            let ctx = Ctx {
                                app: app.clone(),
                                snapshot,
                                endpoint,
                                method: parts.method,
                                headers: parts.headers,
                                token,
                            };
                            // Inline rather than `dispatch`: one future less on the path
                            // every in.php request takes.
                            let handled = match endpoint {
                                Endpoint::In | Endpoint::Solve => {
                                    submit::submit(&ctx, &parsed).await
                                }
                                Endpoint::Res => dispatch_res(&ctx, &parsed).await,
                            };
                            count_token_submit(&ctx, &handled);
                            handled
                        }
                    };
                    (handled, json)
                }
            }
        }
    };
    let outcome = observe(&app, endpoint, &handled, started);
    (into_response(handled, json, key_headers), outcome)
}

/// The caller's token, where tokens are configured (`None` where they are not), or the
/// answer to a caller without a valid one. Both API generations are let in here.
fn admit(
    app: &App,
    snapshot: &Snapshot,
    peer: std::net::IpAddr,
    parsed: &ParsedRequest,
    headers: &HeaderMap,
) -> Result<Option<Arc<Token>>, Local> {
    let asker = access::Asker {
        peer,
        denials: app.denials(),
    };
    access::check(&snapshot.tokens, asker, parsed, headers).map_err(|denied| {
        // Never forwarded; an address over its wrong-token limit is answered at once,
        // unchecked (tokens::Denials).
        app.metrics().count_denied(denied);
        match denied {
            Denied::Missing => Local::NoToken,
            Denied::Wrong | Denied::Limited => Local::WrongToken,
        }
    })
}

/// Serves a request its caller was let in with: its endpoint's handler. The JSON front's
/// way in; `api` does the same inline.
async fn dispatch(ctx: &Ctx, parsed: &ParsedRequest) -> Handled {
    let handled = match ctx.endpoint {
        Endpoint::In | Endpoint::Solve => submit::submit(ctx, parsed).await,
        Endpoint::Res => dispatch_res(ctx, parsed).await,
    };
    count_token_submit(ctx, &handled);
    handled
}

/// A caller token's submit, counted by how it ended.
fn count_token_submit(ctx: &Ctx, handled: &Handled) {
    if let (Some(token), Endpoint::In | Endpoint::Solve) = (&ctx.token, ctx.endpoint) {
        let outcome = TokenSubmit::of(handled.outcome());
        ctx.app.metrics().count_token_submit(&token.name, outcome);
    }
}

/// Counts a served request in the metrics; its outcome.
fn observe(app: &App, endpoint: Endpoint, handled: &Handled, started: Instant) -> RequestOutcome {
    let outcome = handled.outcome();
    let metrics = app.metrics();
    metrics.observe_request(endpoint, outcome, started.elapsed().as_secs_f64());
    if let Handled::Local(local) = handled {
        metrics.count_local(local.code());
    }
    outcome
}

/// `res.php`, on what it asks for: its action is read here, once, and a request whose
/// decision params conflict is refused before anything else is looked at.
async fn dispatch_res(ctx: &Ctx, parsed: &ParsedRequest) -> Handled {
    let command = match ResCommand::of(parsed) {
        Ok(command) => command,
        // Never sent, and nothing held or freed for it: which value the service would read
        // is its own choice, so keyrelay cannot check the one it would act on.
        Err(conflict) => return Local::ConflictingParams(conflict).into(),
    };
    match command {
        ResCommand::NoAction => Local::EmptyAction.into(),
        ResCommand::Task(task) => poll::poll(ctx, parsed, task).await,
        ResCommand::Balance => account::balance(ctx).await,
        ResCommand::Threads => account::threads(ctx),
        ResCommand::Pingback(pingback) => account::pingback(ctx, parsed, pingback.name()).await,
        ResCommand::Other(action) => account::other(ctx, parsed, &action).await,
    }
}

/// The params an upstream request carries, besides the pool key, in place of the caller's:
/// each of `set` once, canonically named, with the value keyrelay checked (or decided on),
/// and no spelling of a name in `drop`. The rewrite removes every other spelling of each
/// name, in the query and the body, so the upstream reads what keyrelay checked and nothing
/// the caller slipped beside it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked<'a> {
    pub set: &'a [(&'a str, &'a str)],
    pub drop: &'a [&'a str],
}

/// Everything one API request needs while it is served.
pub(crate) struct Ctx {
    pub app: App,
    /// Loaded once: the request sees one pool even if it is replaced meanwhile.
    pub snapshot: Arc<Snapshot>,
    pub endpoint: Endpoint,
    pub method: Method,
    pub headers: HeaderMap,
    /// The caller's token, when tokens are configured: which keys may serve it, which tasks
    /// are its own.
    pub token: Option<Arc<Token>>,
}

/// One exchange with the upstream, classified.
pub(crate) enum Attempt {
    /// The upstream answered, whatever it said.
    Answered(Answered),
    /// No answer came: the exchange failed (its outcome is transient).
    Failed(UpstreamError),
}

/// An upstream answer and what it means.
pub(crate) struct Answered {
    pub answer: UpstreamAnswer,
    pub reply: Reply,
    pub outcome: Outcome,
    /// Why the answer failed: the upstream's error code, or the HTTP failure; `None` for a
    /// well-formed 2xx answer.
    pub reason: Option<Reason>,
}

impl Attempt {
    /// Whether a poll's answer ends its task: a solution, or a verdict on the task itself
    /// (unsolvable, unknown id). "Not ready" and failures of the key or the service do not.
    pub(crate) fn ends_task(&self) -> bool {
        match self {
            Attempt::Answered(answered) => match answered.outcome {
                Outcome::Success => answered.reply != Reply::NotReady,
                Outcome::CallerError => true,
                _ => false,
            },
            Attempt::Failed(_) => false,
        }
    }

    pub fn outcome(&self) -> Outcome {
        match self {
            Attempt::Answered(answered) => answered.outcome,
            Attempt::Failed(_) => Outcome::Transient,
        }
    }

    /// Whether the exchange got as far as a connection to its upstream's host:port.
    pub fn reach(&self) -> failover::Reach {
        match self {
            Attempt::Failed(error) if error.never_connected() => failover::Reach::Refused,
            _ => failover::Reach::Connected,
        }
    }

    /// The upstream's error code, or a label for a transport or HTTP failure; a closed set.
    pub fn code(&self) -> &'static str {
        match self {
            Attempt::Answered(answered) => answered.code(),
            Attempt::Failed(error) => error.label(),
        }
    }

    /// Why an answer failed, for the key's health; `None` when no answer came, or it did
    /// not fail.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Attempt::Answered(answered) => answered.reason,
            Attempt::Failed(_) => None,
        }
    }

    /// The upstream answer, if it may go to the caller as is: a complete 2xx answer that is
    /// not a transient failure. Anything else is replaced by an answer of keyrelay's own,
    /// because clients read a non-200 status as a network failure.
    pub fn deliverable(self) -> Option<UpstreamAnswer> {
        match self {
            Attempt::Answered(answered) => answered.deliverable(),
            Attempt::Failed(_) => None,
        }
    }
}

impl Answered {
    /// The label of why the answer failed, `none` if it did not.
    pub fn code(&self) -> &'static str {
        self.reason.map_or("none", Reason::label)
    }

    /// [`Attempt::deliverable`].
    pub fn deliverable(self) -> Option<UpstreamAnswer> {
        let transient = self.outcome == Outcome::Transient;
        (!transient && self.answer.status.is_success()).then_some(self.answer)
    }
}

impl Ctx {
    /// Sends the caller's request upstream with `key` and the `checked` params in place of
    /// the caller's, and classifies the result. Records latency and the outcome per key.
    pub async fn attempt(
        &self,
        key: &KeyEntry,
        parsed: &ParsedRequest,
        checked: Checked<'_>,
    ) -> Attempt {
        let attempt = self.exchange(key, parsed, checked).await;
        self.record_key_error(key, &attempt);
        attempt
    }

    /// [`Ctx::attempt`] without counting a failure against the key: for the owner probe, to
    /// which most keys rightly answer "not my task".
    pub async fn exchange(
        &self,
        key: &KeyEntry,
        parsed: &ParsedRequest,
        checked: Checked<'_>,
    ) -> Attempt {
        // The key and the few checked params, inline: no list to allocate for them.
        let mut set: SmallVec<[(&str, &str); 4]> = SmallVec::new();
        set.push(("key", key.key.expose()));
        set.extend_from_slice(checked.set);
        // The rewritten query is written straight into the upstream request's target.
        let mut target = key
            .upstream
            .target(self.endpoint.path(), parsed.query_len() + 64);
        let body = parsed.rewrite_into(&set, checked.drop, target.query());
        let timeouts = &self.snapshot.config.timeouts;
        let timeout = if self.endpoint == Endpoint::Solve {
            timeouts.solve
        } else {
            timeouts.request
        };
        let uri = match key.upstream.uri(target) {
            Ok(uri) => uri,
            // hyper only hands over queries a URI can carry, and the rewrite only splices
            // urlencoded ASCII into whole pairs, so this cannot happen through the listener;
            // should it ever, the attempt fails as undelivered (which it is), not a panic.
            Err(e) => return classify(key.profile(), Err(UpstreamError::Connect(e.to_string()))),
        };
        let started = Instant::now();
        let result = self
            .app
            .client()
            .send(Outgoing {
                method: self.method.clone(),
                uri,
                headers: &self.headers,
                body,
                timeout,
            })
            .await;
        self.app
            .metrics()
            .observe_upstream(key, self.endpoint, started.elapsed().as_secs_f64());
        let attempt = classify(key.profile(), result);
        if let Some(pause) = failover::pause_after(attempt.outcome(), self.policy()) {
            self.app.pause_upstream(pause);
        }
        attempt
    }

    /// Counts a failed attempt in `keyrelay_key_errors_total` and as the key's last error.
    pub fn record_key_error(&self, key: &KeyEntry, attempt: &Attempt) {
        if attempt.outcome() != Outcome::Success {
            let code = attempt.code();
            self.app
                .metrics()
                .key_errors
                .with_label_values(&[key.name.as_str(), key.provider.name(), code])
                .inc();
            key.stats.set_last_error(code);
        }
    }

    /// Decides what an attempt means for its key (with `decide`, a pure policy), applies
    /// that to the key's health in one step, and starts the check the decision asks for. Counting the keys already cooled and cooling
    /// another happen under one lock, so two failures at once cannot together cool more of
    /// the pool than `max_transient_ejection` allows.
    ///
    /// Only a transient outcome can eject a key for transient faults, so only it counts the
    /// pool and takes the lock; every other outcome skips that work on the request path.
    pub fn decide(
        &self,
        key: &Arc<KeyEntry>,
        outcome: Outcome,
        rng: &mut impl rand::Rng,
        decide: impl FnOnce(failover::Ejection) -> failover::Decision,
    ) -> failover::Decision {
        let (_one_ejection_at_a_time, ejection) = if outcome == Outcome::Transient {
            (Some(self.app.ejection_lock()), self.ejection(rng))
        } else {
            self.app.provider_answered(key.provider);
            (None, failover::Ejection::IRRELEVANT)
        };
        let mut decision = decide(ejection);
        // A failure while the key's whole provider is down is the provider's: counting it
        // against the key too would cool a key that did nothing wrong.
        if outcome == Outcome::Transient
            && self
                .app
                .provider_failed(&self.snapshot.pool, key, ejection.jitter)
        {
            decision.health = None;
        }
        if let Some(event) = decision.health {
            self.app.record_health(key, event);
        }
        if let Some(check) = decision.check {
            verdict::spawn(&self.app, key, check);
        }
        decision
    }

    /// What a transient failure may do to a key, given how much of the pool transient
    /// faults have already cooled.
    fn ejection(&self, rng: &mut impl rand::Rng) -> failover::Ejection {
        let pool = &self.snapshot.pool;
        let now = Instant::now();
        let ejected = pool
            .keys()
            .iter()
            .filter(|k| {
                let view = pool.health(k, now);
                view.state == StateKind::Cooling && view.reason == Some(Reason::Transient)
            })
            .count();
        failover::Ejection::decide(self.policy(), ejected, pool.keys().len(), rng)
    }

    /// While the upstream is paused after an IP ban, the answer every upstream-bound request
    /// gets: the service's own code, in the caller's format, with when to come back.
    pub fn paused(&self) -> Option<Handled> {
        let until = self.app.upstream_paused()?;
        Some(Local::IpBanPause { until }.into())
    }

    /// Whether `key` may serve this caller: any key without a token, else its token's.
    pub fn may_use(&self, key: &KeyEntry) -> bool {
        self.token.as_ref().is_none_or(|t| t.may_use(key.id))
    }

    pub fn policy(&self) -> &crate::config::Failover {
        &self.snapshot.config.failover
    }
}

/// Classifies an upstream result with the outcome table, as the key's provider reads it.
fn classify(profile: &captcha::Profile, result: Result<UpstreamAnswer, UpstreamError>) -> Attempt {
    let answer = match result {
        Ok(answer) => answer,
        Err(error) => return Attempt::Failed(error),
    };
    let reply = captcha::parse_reply(&answer.body);
    let status = answer.status.as_u16();
    let outcome = profile.classify(status, &reply);
    let reason = match &reply {
        Reply::Error(code) => Some(Reason::of_code(code)),
        _ if status == 429 => Some(Reason::Http429),
        _ if status >= 500 => Some(Reason::Http5xx),
        _ if !answer.status.is_success() => Some(Reason::HttpError),
        Reply::Garbage => Some(Reason::BadAnswer),
        _ => None,
    };
    Attempt::Answered(Answered {
        answer,
        reply,
        outcome,
        reason,
    })
}

/// The format for an answer made before the request could be parsed: the query's `json`, or
/// failing that a JSON body, or a `json=1` field early in an oversized form body.
fn json_hint(query: Option<&str>, content_type: Option<&str>, prefix: &[u8]) -> bool {
    let truthy = |v: &str| v == "1" || v.eq_ignore_ascii_case("true");
    let in_query = query.is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "json" && truthy(&v))
    });
    let json_body = content_type.is_some_and(|ct| ct.to_ascii_lowercase().contains("json"));
    let in_form = form_urlencoded::parse(prefix).any(|(k, v)| k == "json" && truthy(&v));
    in_query || json_body || in_form
}

/// The response for `handled`; `json`: the caller's format, for an answer of keyrelay's own.
fn into_response(handled: Handled, json: bool, key_headers: bool) -> Response<Body> {
    match handled {
        Handled::Relayed {
            answer,
            key,
            attempts,
            ..
        } => {
            let mut response = Response::new(Full::new(answer.body));
            *response.status_mut() = answer.status;
            let headers = response.headers_mut();
            *headers = upstream::answer_headers(answer.headers);
            if key_headers {
                // Key names are validated to header-safe characters; a failure is skipped.
                if let Some(value) = key {
                    headers.insert(KEY_HEADER_NAME, value);
                }
                headers.insert(ATTEMPTS_HEADER_NAME, attempts_value(attempts));
            }
            response
        }
        Handled::Local(local) => {
            let answer = local.answer(json);
            plain(StatusCode::OK, answer.content_type, answer.body)
        }
    }
}

/// Which key served a relayed answer.
pub const KEY_HEADER: &str = "x-keyrelay-key";
/// How many upstream attempts a relayed answer took.
pub const ATTEMPTS_HEADER: &str = "x-keyrelay-attempts";

// Typed once: inserting by `&str` looks the name up in the standard-header table and
// validates it on every answer (1.2k instructions for the two).
const KEY_HEADER_NAME: HeaderName = HeaderName::from_static(KEY_HEADER);
const ATTEMPTS_HEADER_NAME: HeaderName = HeaderName::from_static(ATTEMPTS_HEADER);

/// The `X-Keyrelay-Attempts` value: static for the counts `failover.max_attempts` usually
/// allows, formatted (an allocation) only beyond them.
fn attempts_value(attempts: u32) -> HeaderValue {
    static SMALL: [HeaderValue; 10] = [
        HeaderValue::from_static("0"),
        HeaderValue::from_static("1"),
        HeaderValue::from_static("2"),
        HeaderValue::from_static("3"),
        HeaderValue::from_static("4"),
        HeaderValue::from_static("5"),
        HeaderValue::from_static("6"),
        HeaderValue::from_static("7"),
        HeaderValue::from_static("8"),
        HeaderValue::from_static("9"),
    ];
    usize::try_from(attempts)
        .ok()
        .and_then(|i| SMALL.get(i))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(attempts))
}

fn plain(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_counts_read_the_same_static_or_formatted() {
        for attempts in [0, 1, 2, 9, 10, 11, 99, 1000, u32::MAX] {
            assert_eq!(
                attempts_value(attempts).to_str().unwrap(),
                attempts.to_string(),
                "{attempts}"
            );
        }
    }

    #[test]
    fn json_hint_reads_query_content_type_and_form_prefix() {
        assert!(json_hint(Some("a=1&json=1"), None, b""));
        assert!(!json_hint(Some("json=0"), None, b""));
        assert!(json_hint(
            None,
            Some("application/json; charset=utf-8"),
            b""
        ));
        assert!(json_hint(
            None,
            Some("application/x-www-form-urlencoded"),
            b"method=base64&json=1&body=AAAA"
        ));
        assert!(!json_hint(None, None, b""));
    }

    proptest::proptest! {
        /// A query a URI can carry (all hyper hands over) stays sendable after any rewrite
        /// an attempt makes (a pool key, a poll's split ids), so `Ctx::attempt`'s fallback
        /// is never taken for a request that came through the listener.
        #[test]
        fn a_query_that_passes_the_check_stays_sendable_when_rewritten(
            query in "((key|id|json|k%65y|\\+key|key\\[\\])(=[^&#]{0,12})?&?){0,6}",
            key in proptest::prelude::any::<String>(),
            id in proptest::prelude::any::<String>(),
        ) {
            let upstream = crate::config::Upstream::parse("http://127.0.0.1:9/x").unwrap();
            let Ok(parsed) = ParsedRequest::parse(Some(&query), None, Bytes::new()) else {
                return Ok(());
            };
            if upstream.endpoint("/res.php", &query).is_err() {
                return Ok(());
            }
            for set in [vec![("key", key.as_str())], vec![("key", key.as_str()), ("id", id.as_str())]] {
                let rewritten = parsed.rewrite(&set);
                proptest::prop_assert!(
                    upstream.endpoint("/res.php", &rewritten.query).is_ok(),
                    "{:?} -> {:?}", query, rewritten.query
                );
            }
        }
    }
}
