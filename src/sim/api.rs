//! Endpoint behaviour of the simulator: routes `in.php`, `res.php` and `solve.php`, applies
//! faults and key checks, and renders answers plain or JSON. Account bookkeeping lives in
//! `state`, parsing in `wire`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use tracing::debug;

use super::faults::{FaultKind, FaultTarget};
use super::state::{round_money, Access, PollItem, Refusal, State, TaskSpec};
use super::wire::{self, Received};
use crate::provider::Provider;

/// Response body type of the simulator.
pub(crate) type Body = Full<Bytes>;

/// Request bodies above this are refused as malformed: BLS submits carry nine base64 images,
/// so a few MB must pass, but a runaway client must not exhaust memory.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// What the service adds to `user_agent` of reCAPTCHA Enterprise answers.
const SIM_USER_AGENT: &str = "Mozilla/5.0 (keyrelay-sim)";

// Codes the simulated service answers. `CAPCHA_NOT_READY` is misspelt on purpose: the real
// service spells it that way.
const NOT_READY: &str = "CAPCHA_NOT_READY";
const BAD_PARAMETERS: &str = "ERROR_BAD_PARAMETERS";
const EMPTY_ACTION: &str = "ERROR_EMPTY_ACTION";
const WRONG_USER_KEY: &str = "ERROR_WRONG_USER_KEY";
const KEY_DOES_NOT_EXIST: &str = "ERROR_KEY_DOES_NOT_EXIST";
const IP_NOT_ALLOWED: &str = "ERROR_IP_NOT_ALLOWED";
const ZERO_BALANCE: &str = "ERROR_ZERO_BALANCE";
const GOOGLEKEY: &str = "ERROR_GOOGLEKEY";
const PAGEURL: &str = "ERROR_PAGEURL";
const ZERO_FILESIZE: &str = "ERROR_ZERO_CAPTCHA_FILESIZE";
const WRONG_CAPTCHA_ID: &str = "ERROR_WRONG_CAPTCHA_ID";
const WRONG_ID_FORMAT: &str = "ERROR_WRONG_ID_FORMAT";
const UNSOLVABLE: &str = "ERROR_CAPTCHA_UNSOLVABLE";
const REPORT_RECORDED: &str = "OK_REPORT_RECORDED";
const NO_SUCH_METHOD: &str = "ERROR_NO_SUCH_METHOD";

/// Methods CaptchaAI documents and 2captcha's `in.php` reference does not list: the other
/// simulated services answer `ERROR_NO_SUCH_METHOD` to them.
const CAPTCHAAI_ONLY_METHODS: [&str; 2] = ["bls", "cloudflare_challenge"];

/// Returned by the service to make hyper drop the connection without writing a response.
#[derive(Debug, thiserror::Error)]
#[error("connection reset by an injected fault")]
pub(crate) struct ResetConnection;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Submit,
    Solve,
    Result,
}

impl Endpoint {
    fn from_path(path: &str) -> Option<Endpoint> {
        match path {
            "/in.php" => Some(Endpoint::Submit),
            "/solve.php" => Some(Endpoint::Solve),
            "/res.php" => Some(Endpoint::Result),
            _ => None,
        }
    }

    fn fault_target(self) -> FaultTarget {
        match self {
            Endpoint::Submit | Endpoint::Solve => FaultTarget::Submit,
            Endpoint::Result => FaultTarget::Poll,
        }
    }
}

// === replies ===

/// An answer before the caller's `json` flag picks its rendering.
enum Reply {
    /// An API answer in both renderings.
    Api { plain: String, json: String },
    /// JSON whatever the caller asked (`threadsinfo` has no plain form).
    JsonOnly(String),
    /// A bare HTTP status with its reason phrase as body.
    Status(u16),
    /// No answer at all.
    Reset,
}

/// `request` of a JSON answer: usually a string, an integer for reCAPTCHA task ids (as the
/// live service does), a list for pingback addresses.
#[derive(Serialize)]
#[serde(untagged)]
enum JsonRequest {
    Text(String),
    Id(u64),
    List(Vec<String>),
}

/// A JSON answer; field order follows the service (`status` first).
#[derive(Serialize)]
struct JsonAnswer {
    status: u8,
    request: JsonRequest,
    #[serde(skip_serializing_if = "Option::is_none")]
    price: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_agent: Option<&'static str>,
}

impl JsonAnswer {
    fn ok(request: JsonRequest) -> JsonAnswer {
        JsonAnswer {
            status: 1,
            request,
            price: None,
            result: None,
            user_agent: None,
        }
    }

    fn text(request: &str) -> JsonAnswer {
        JsonAnswer::ok(JsonRequest::Text(request.to_owned()))
    }
}

#[derive(Serialize)]
struct ThreadsJson {
    status: u8,
    threads: u32,
    working_threads: u32,
    free_threads: u32,
}

fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("structs of strings and integers always serialize")
}

impl Reply {
    fn success(plain: String, json: &JsonAnswer) -> Reply {
        Reply::Api {
            plain,
            json: to_json(json),
        }
    }

    /// An error code (or `CAPCHA_NOT_READY`): the bare code, or status 0 in JSON.
    fn error(code: &str) -> Reply {
        Reply::Api {
            plain: code.to_owned(),
            json: to_json(&JsonAnswer {
                status: 0,
                ..JsonAnswer::text(code)
            }),
        }
    }

    fn into_response(self, as_json: bool) -> Result<Response<Body>, ResetConnection> {
        Ok(match self {
            Reply::Api { plain, .. } if !as_json => text_response(StatusCode::OK, plain),
            Reply::Api { json, .. } | Reply::JsonOnly(json) => {
                let mut response = Response::new(Full::new(Bytes::from(json)));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response
            }
            Reply::Status(code) => {
                // A 1xx cannot be a final answer (hyper would send a 500 itself), and codes
                // outside 100..=999 do not exist: both become an explicit 500.
                let status = StatusCode::from_u16(code)
                    .ok()
                    .filter(|status| !status.is_informational())
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let reason = status.canonical_reason().unwrap_or("Error");
                text_response(status, reason.to_owned())
            }
            Reply::Reset => return Err(ResetConnection),
        })
    }
}

fn text_response(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Money as the service prints it: `10.5`, `9.997`.
fn format_money(amount: f64) -> String {
    round_money(amount).to_string()
}

fn flag(value: Option<&str>) -> bool {
    matches!(value, Some(v) if v == "1" || v.eq_ignore_ascii_case("true"))
}

// === request handling ===

/// The services one listener plays: each under its path prefix (`""` for the root).
pub(crate) struct Routes(pub(crate) Vec<(String, std::sync::Arc<State>)>);

impl Routes {
    /// The service a path is for, and the path within it: the longest prefix that ends
    /// at a `/` of the path wins, so `/2captcha/in.php` is 2captcha's `/in.php`.
    fn pick<'a>(&self, path: &'a str) -> Option<(&State, &'a str)> {
        self.0
            .iter()
            .filter_map(|(prefix, state)| {
                let rest = path.strip_prefix(prefix.as_str())?;
                rest.starts_with('/')
                    .then_some((prefix.len(), &**state, rest))
            })
            .max_by_key(|(len, _, _)| *len)
            .map(|(_, state, rest)| (state, rest))
    }
}

/// Answers one request: picks the service it is for, parses, records, then behaves like
/// that service.
pub(crate) async fn respond(
    routes: &Routes,
    request: Request<Incoming>,
) -> Result<Response<Body>, ResetConnection> {
    let path = request.uri().path().to_owned();
    let Some((state, path)) = routes.pick(&path) else {
        return Reply::Status(StatusCode::NOT_FOUND.as_u16()).into_response(false);
    };
    let path = path.to_owned();
    let (parts, body) = request.into_parts();
    // A body that cannot be read whole (too large, or the client vanished) is malformed.
    let (body, unreadable) = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => (collected.to_bytes(), false),
        Err(_) => (Bytes::new(), true),
    };
    let query = parts.uri.query().unwrap_or_default();
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let parsed = wire::parse(query, content_type.as_deref(), &body).await;
    let malformed = parsed.malformed || unreadable;
    let received = Received {
        method: parts.method.to_string(),
        path,
        query: query.to_owned(),
        content_type,
        key: parsed.get("key").map(str::to_owned),
        action: parsed.get("action").map(str::to_owned),
        body,
        params: parsed.params,
        files: parsed.files,
    };
    debug!(
        method = %received.method,
        path = %received.path,
        action = received.action.as_deref(),
        "sim request"
    );
    state.record(received.clone());
    let json = flag(wire::lookup(&received.params, "json"));
    let reply = match Endpoint::from_path(&received.path) {
        Some(endpoint) => handle(state, endpoint, &received, malformed).await,
        None => Reply::Status(StatusCode::NOT_FOUND.as_u16()),
    };
    reply.into_response(json)
}

async fn handle(state: &State, endpoint: Endpoint, request: &Received, malformed: bool) -> Reply {
    let key = request.key.as_deref();
    // Taken in its own statement so the fault book's lock is released before any await.
    let fault = state.faults().take(key, endpoint.fault_target());
    let mut solve_time = Duration::ZERO;
    match fault {
        Some(FaultKind::Status(code)) => return Reply::Status(code),
        Some(FaultKind::Reset) => return Reply::Reset,
        Some(FaultKind::Code(code)) => return Reply::error(&code),
        // solve.php spends the delay "solving", holding a thread, so tests can see it busy.
        Some(FaultKind::Delay(delay)) if endpoint == Endpoint::Solve => solve_time = delay,
        Some(FaultKind::Delay(delay)) => tokio::time::sleep(delay).await,
        Some(FaultKind::Hold(gate)) => gate.notified().await,
        None => {}
    }
    let checked = admit_request(state, key, malformed);
    match (endpoint, checked) {
        (Endpoint::Solve, Err(reply)) => {
            sleep_unless_zero(solve_time).await;
            reply
        }
        (_, Err(reply)) => reply,
        (Endpoint::Submit, Ok(key)) => submit(state, key, request),
        (Endpoint::Solve, Ok(key)) => solve(state, key, request, solve_time).await,
        (Endpoint::Result, Ok(key)) => result(state, key, request),
    }
}

async fn sleep_unless_zero(duration: Duration) {
    if !duration.is_zero() {
        tokio::time::sleep(duration).await;
    }
}

/// The checks every endpoint runs: a readable request, then a usable key.
fn admit_request<'a>(
    state: &State,
    key: Option<&'a str>,
    malformed: bool,
) -> Result<&'a str, Reply> {
    if malformed {
        return Err(Reply::error(BAD_PARAMETERS));
    }
    match (state.access(key), key) {
        (Access::Granted, Some(key)) => Ok(key),
        (Access::Granted | Access::WrongUserKey, _) => Err(Reply::error(WRONG_USER_KEY)),
        (Access::KeyDoesNotExist, _) => Err(Reply::error(KEY_DOES_NOT_EXIST)),
        (Access::IpNotAllowed, _) => Err(Reply::error(IP_NOT_ALLOWED)),
    }
}

/// Parameter validation of `in.php` / `solve.php`, as `provider` does it.
fn task_spec(provider: Provider, request: &Received) -> Result<TaskSpec, &'static str> {
    let param = |name| wire::lookup(&request.params, name).filter(|value| !value.is_empty());
    let method = param("method").ok_or(BAD_PARAMETERS)?;
    if provider != Provider::CaptchaAi && CAPTCHAAI_ONLY_METHODS.contains(&method) {
        return Err(NO_SUCH_METHOD);
    }
    match method {
        "userrecaptcha" => {
            param("googlekey").ok_or(GOOGLEKEY)?;
            param("pageurl").ok_or(PAGEURL)?;
        }
        "base64" => {
            param("body").ok_or(ZERO_FILESIZE)?;
        }
        "post" => {
            let has_image = request
                .files
                .iter()
                .any(|file| file.field == "file" && !file.bytes.is_empty());
            if !has_image {
                return Err(ZERO_FILESIZE);
            }
        }
        _ => {}
    }
    Ok(TaskSpec {
        enterprise: method == "userrecaptcha" && flag(param("enterprise")),
    })
}

fn refusal_reply(state: &State, refusal: Refusal) -> Reply {
    match refusal {
        Refusal::ZeroBalance => Reply::error(ZERO_BALANCE),
        Refusal::Busy => Reply::error(&state.busy_code),
        Refusal::Invalid(code) => Reply::error(code),
    }
}

fn submit(state: &State, key: &str, request: &Received) -> Reply {
    match state.submit(key, task_spec(state.provider, request)) {
        Ok(id) => {
            let is_recaptcha = wire::lookup(&request.params, "method") == Some("userrecaptcha");
            let json_id = if is_recaptcha {
                JsonRequest::Id(id)
            } else {
                JsonRequest::Text(id.to_string())
            };
            Reply::success(format!("OK|{id}"), &JsonAnswer::ok(json_id))
        }
        Err(refusal) => refusal_reply(state, refusal),
    }
}

/// Frees a `solve.php` task's thread when the solve ends, including when the client hangs up
/// mid-solve and hyper drops the request future.
struct Solving<'a> {
    state: &'a State,
    id: u64,
}

impl Drop for Solving<'_> {
    fn drop(&mut self) {
        self.state.finish_solve(self.id);
    }
}

async fn solve(state: &State, key: &str, request: &Received, solve_time: Duration) -> Reply {
    match state.submit(key, task_spec(state.provider, request)) {
        Ok(id) => {
            let solving = Solving { state, id };
            sleep_unless_zero(solve_time).await;
            drop(solving);
            let answer = format!("tok-{id}");
            Reply::success(format!("OK|{answer}"), &JsonAnswer::text(&answer))
        }
        Err(refusal) => {
            sleep_unless_zero(solve_time).await;
            refusal_reply(state, refusal)
        }
    }
}

fn result(state: &State, key: &str, request: &Received) -> Reply {
    let param = |name| wire::lookup(&request.params, name).unwrap_or_default();
    match param("action") {
        "" => Reply::error(EMPTY_ACTION),
        "get" if !param("ids").is_empty() => poll_many(state, key, param("ids")),
        "get" => poll_one(state, key, param("id"), false),
        "get2" => poll_one(state, key, param("id"), true),
        "reportbad" | "reportgood" if state.owns_task(key, param("id")) => Reply::success(
            REPORT_RECORDED.to_owned(),
            &JsonAnswer::text(REPORT_RECORDED),
        ),
        "reportbad" | "reportgood" => Reply::error(WRONG_CAPTCHA_ID),
        "getbalance" => {
            let balance = format_money(state.balance(key).unwrap_or_default());
            Reply::success(balance.clone(), &JsonAnswer::text(&balance))
        }
        // CaptchaAI's own action: the pay-per-task services know no such thing.
        "threadsinfo" if state.provider == Provider::CaptchaAi => {
            let info = state.threads_info(key);
            Reply::JsonOnly(to_json(&ThreadsJson {
                status: 1,
                threads: info.threads,
                working_threads: info.working,
                free_threads: info.threads.saturating_sub(info.working),
            }))
        }
        "add_pingback" | "del_pingback" if param("addr").is_empty() => Reply::error(BAD_PARAMETERS),
        "add_pingback" => {
            state.add_pingback(key, param("addr"));
            Reply::success("OK".to_owned(), &JsonAnswer::text("OK"))
        }
        "del_pingback" => {
            state.del_pingback(key, param("addr"));
            Reply::success("OK".to_owned(), &JsonAnswer::text("OK"))
        }
        "get_pingback" => {
            let addrs = state.pingbacks(key);
            let plain = std::iter::once("OK")
                .chain(addrs.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join("|");
            Reply::success(plain, &JsonAnswer::ok(JsonRequest::List(addrs)))
        }
        _ => Reply::error(BAD_PARAMETERS),
    }
}

/// `get` / `get2` of one id. `with_price` adds the task's cost (`get2`).
fn poll_one(state: &State, key: &str, id: &str, with_price: bool) -> Reply {
    match state.poll(key, id) {
        PollItem::Ready {
            answer,
            cost,
            enterprise,
        } => {
            let price = with_price.then(|| format_money(cost));
            let plain = match &price {
                Some(price) => format!("OK|{answer}|{price}"),
                None => format!("OK|{answer}"),
            };
            let json = JsonAnswer {
                price,
                // Enterprise answers carry the token twice: clients read `result`.
                result: enterprise.then(|| answer.clone()),
                user_agent: enterprise.then_some(SIM_USER_AGENT),
                ..JsonAnswer::text(&answer)
            };
            Reply::success(plain, &json)
        }
        other => Reply::error(item_text(other).as_str()),
    }
}

/// `get` with `ids=a,b,c`: each item's answer or code, joined by `|`, always status 1.
fn poll_many(state: &State, key: &str, ids: &str) -> Reply {
    let joined = ids
        .split(',')
        .map(|id| item_text(state.poll(key, id)))
        .collect::<Vec<_>>()
        .join("|");
    Reply::success(joined.clone(), &JsonAnswer::text(&joined))
}

fn item_text(item: PollItem) -> String {
    match item {
        PollItem::Ready { answer, .. } => answer,
        PollItem::NotReady => NOT_READY.to_owned(),
        PollItem::Unsolvable => UNSOLVABLE.to_owned(),
        PollItem::WrongId => WRONG_CAPTCHA_ID.to_owned(),
        PollItem::WrongIdFormat => WRONG_ID_FORMAT.to_owned(),
    }
}
