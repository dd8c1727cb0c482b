//! The JSON task API's front door: `createTask`, `getTaskResult`, `getBalance` and the
//! reports, each turned into the `in.php` / `res.php` request it means and served by the
//! same path as those (`serve`: the token check, then submit, poll or account), so pins,
//! thread accounting, token caps, failover, probing and metrics apply unchanged. Only the
//! answer is translated back, into the shape of the client's service (`json_api::Dialect`).

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE, PROXY_AUTHORIZATION, USER_AGENT};
use hyper::{Method, Request, Response, StatusCode};
use tokio::time::Instant;

use super::{body, dispatch, observe, Body, Ctx, Handled, Local, KEY_HEADER_NAME};
use crate::app::App;
use crate::captcha::{self, Endpoint, ParsedRequest, Reply};
use crate::json_api::{self, Dialect, JsonError, JsonMethod, JsonRequest};
use crate::metrics::RequestOutcome;

/// The endpoint a JSON method is served as, for the pool and the metrics.
pub(super) fn endpoint_of(method: JsonMethod) -> Endpoint {
    match method {
        JsonMethod::CreateTask => Endpoint::In,
        _ => Endpoint::Res,
    }
}

/// Serves one JSON API request; never fails: every problem is an error in the client's
/// shape, with HTTP 200 as the services answer theirs.
pub(super) async fn answer(
    app: App,
    method: JsonMethod,
    dialect: Dialect,
    peer: std::net::IpAddr,
    req: Request<Incoming>,
) -> (Response<Body>, RequestOutcome) {
    let started = Instant::now();
    let endpoint = endpoint_of(method);
    let (parts, body) = req.into_parts();
    let snapshot = app.snapshot();
    let limit = snapshot.config.limits.max_body;
    let key_headers = snapshot.config.observability.key_headers;
    let bytes = match body::read(body, &parts.headers, limit).await {
        Ok(bytes) => Ok(bytes),
        Err(body::BodyError::TooLarge { .. }) => Err(JsonError::from_service(
            "ERROR_TOO_BIG_CAPTCHA_FILESIZE",
            &format!("the request body exceeds keyrelay's limits.max_body of {limit} bytes"),
        )),
        Err(body::BodyError::Io(_)) => Err(JsonError::bad_parameters(
            "the request body could not be read",
        )),
    };
    let refused = |error: JsonError| {
        let outcome = RequestOutcome::BadRequest;
        let metrics = app.metrics();
        metrics.observe_request(endpoint, outcome, started.elapsed().as_secs_f64());
        (json_response(dialect.error(&error), None), outcome)
    };
    let read = bytes.as_deref().map_err(Clone::clone);
    let request = match read.and_then(|body| in_php(method, &JsonRequest::parse(body)?)) {
        Ok(request) => request,
        Err(error) => return refused(error),
    };
    // A type no key of the pool can solve is refused at once, never walked over the keys.
    if let Some(unserved) = request.method.filter(|m| !snapshot.pool.serves_method(m)) {
        return refused(JsonError::not_served(unserved));
    }
    let upstream_method = match method {
        JsonMethod::CreateTask => Method::POST,
        _ => Method::GET,
    };
    let headers = upstream_headers(&parts.headers, method);
    let handled = match super::admit(&app, &snapshot, peer, &request.parsed, &headers) {
        Err(denied) => denied.into(),
        Ok(token) => {
            let ctx = Ctx {
                app: app.clone(),
                snapshot,
                endpoint,
                method: upstream_method,
                headers,
                token,
            };
            dispatch(&ctx, &request.parsed).await
        }
    };
    let outcome = observe(&app, endpoint, &handled, started);
    let value = translated(method, dialect, &handled);
    let key = match &handled {
        Handled::Relayed { key, .. } if key_headers => key.clone(),
        _ => None,
    };
    (json_response(value, key), outcome)
}

/// `ERROR_NO_SUCH_METHOD`, for a path that is none of the JSON API's methods on a host
/// that serves it.
pub(super) fn no_such_method(dialect: Dialect) -> Response<Body> {
    json_response(dialect.error(&JsonError::no_such_method()), None)
}

/// A panic in the handler, answered as an error rather than a dropped connection.
pub(super) fn panicked(dialect: Dialect) -> Response<Body> {
    let error = JsonError::from_service(
        "ERROR_SERVER_ERROR",
        "keyrelay failed to serve this request; retry it",
    );
    json_response(dialect.error(&error), None)
}

/// The `in.php` / `res.php` request a JSON one means.
struct InPhp {
    parsed: ParsedRequest,
    /// The submit's `in.php` method, for `createTask`.
    method: Option<&'static str>,
}

fn in_php(method: JsonMethod, request: &JsonRequest<'_>) -> Result<InPhp, JsonError> {
    let task_id = || {
        request
            .task_id
            .as_deref()
            .ok_or_else(|| JsonError::bad_parameters("the request needs a \"taskId\""))
    };
    let mut submit_method = None;
    let mut form = Form::new();
    // Where tokens are configured, the client key is the caller's token, checked as `key`
    // is; otherwise it is ignored, as `key` is.
    if !request.client_key.is_empty() {
        form.pair("key", &request.client_key);
    }
    form.pair("json", "1");
    match method {
        JsonMethod::CreateTask => {
            let task = request
                .task
                .as_ref()
                .ok_or_else(|| JsonError::bad_parameters("createTask needs a \"task\""))?;
            let translated = json_api::translate(task)?;
            for (name, value) in &translated.params {
                form.pair(name, value);
            }
            submit_method = Some(translated.task_type.method);
        }
        JsonMethod::GetTaskResult => {
            form.pair("action", "get").pair("id", task_id()?);
        }
        JsonMethod::GetBalance => {
            form.pair("action", "getbalance");
        }
        JsonMethod::ReportIncorrect => {
            form.pair("action", "reportbad").pair("id", task_id()?);
        }
        JsonMethod::ReportCorrect => {
            form.pair("action", "reportgood").pair("id", task_id()?);
        }
    }
    let encoded = form.finish();
    let parsed = match method {
        JsonMethod::CreateTask => ParsedRequest::parse(
            None,
            Some("application/x-www-form-urlencoded"),
            Bytes::from(encoded),
        ),
        _ => match std::str::from_utf8(&encoded) {
            Ok(query) => ParsedRequest::parse(Some(query), None, Bytes::new()),
            Err(_) => {
                return Err(JsonError::bad_parameters(
                    "the request could not be encoded",
                ))
            }
        },
    };
    // What keyrelay encoded itself always parses; should it not, the client hears why.
    let parsed = parsed.map_err(|e| JsonError::bad_parameters(&e.to_string()))?;
    Ok(InPhp {
        parsed,
        method: submit_method,
    })
}

/// An urlencoded form, written once into a buffer sized for it. Values escape only what a
/// form reader would misread (`%`, `&`, `+`, `=`, `#`, `"`, spaces, controls and
/// non-ASCII): base64's `/` goes as it is, and an image's long runs are copied whole.
///
/// Written here rather than with `percent_encoding`'s iterator, whose chunk at a time cost
/// about 9 instructions a byte of an image, the largest share of a `createTask`'s own
/// work: a table lookup a byte and one copy a run cost a third of that.
struct Form(Vec<u8>);

/// Which bytes a form value escapes.
const ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = byte < 0x20
            || byte >= 0x7F
            || matches!(byte as u8, b' ' | b'"' | b'#' | b'%' | b'&' | b'+' | b'=');
        byte += 1;
    }
    table
};

const HEX: &[u8; 16] = b"0123456789ABCDEF";

impl Form {
    fn new() -> Form {
        // A submit with an image is a few hundred bytes; this saves regrowing for them.
        Form(Vec::with_capacity(512))
    }

    fn pair(&mut self, name: &str, value: &str) -> &mut Form {
        if !self.0.is_empty() {
            self.0.push(b'&');
        }
        self.escaped(name.as_bytes());
        self.0.push(b'=');
        self.escaped(value.as_bytes());
        self
    }

    fn escaped(&mut self, value: &[u8]) {
        let mut run = 0;
        for (at, &byte) in value.iter().enumerate() {
            if ESCAPED[usize::from(byte)] {
                self.0.extend_from_slice(&value[run..at]);
                self.0.extend_from_slice(&[
                    b'%',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 0xF)],
                ]);
                run = at + 1;
            }
        }
        self.0.extend_from_slice(&value[run..]);
    }

    /// The form's bytes: ASCII, every other byte escaped.
    fn finish(self) -> Vec<u8> {
        self.0
    }
}

/// The headers the upstream request goes with: the caller's `User-Agent`, the form's
/// `Content-Type` for a submit, and the caller's `Proxy-Authorization` (a token there is
/// the caller's, as on `in.php`; it never goes upstream).
fn upstream_headers(caller: &HeaderMap, method: JsonMethod) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for name in [USER_AGENT, PROXY_AUTHORIZATION] {
        if let Some(value) = caller.get(&name) {
            headers.insert(name, value.clone());
        }
    }
    if method == JsonMethod::CreateTask {
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
    }
    headers
}

/// The JSON API's answer for what the `in.php` path answered.
fn translated(method: JsonMethod, dialect: Dialect, handled: &Handled) -> String {
    match handled {
        Handled::Relayed { answer, .. } => relayed(method, dialect, &answer.body),
        Handled::Local(local) => local_answer(method, dialect, local),
    }
}

fn relayed(method: JsonMethod, dialect: Dialect, body: &[u8]) -> String {
    let reply = captcha::parse_reply(body);
    if let Reply::Error(code) = &reply {
        let description = format!("the service answered {code}");
        return dialect.error(&JsonError::from_service(code, &description));
    }
    let done = match (method, &reply) {
        (JsonMethod::CreateTask, Reply::Ok(id)) => Some(dialect.created(id)),
        (JsonMethod::GetTaskResult, Reply::NotReady) => Some(dialect.processing()),
        // GeeTest's answer is an object, which is no `Reply::Ok`: the solution reads both.
        (JsonMethod::GetTaskResult, _) => json_api::solution(body).map(|solution| {
            let now = unix_now();
            dialect.ready(&solution, (now, now))
        }),
        (JsonMethod::GetBalance, Reply::Ok(text) | Reply::Value(text)) => text
            .trim()
            .parse::<f64>()
            .ok()
            .map(|balance| dialect.balance(balance)),
        (
            JsonMethod::ReportIncorrect | JsonMethod::ReportCorrect,
            Reply::Ok(_) | Reply::Value(_),
        ) => Some(dialect.reported()),
        _ => None,
    };
    done.unwrap_or_else(|| {
        dialect.error(&JsonError::from_service(
            "ERROR_UNREADABLE_ANSWER",
            "the service gave an answer keyrelay cannot read; retry later",
        ))
    })
}

fn local_answer(method: JsonMethod, dialect: Dialect, local: &Local) -> String {
    let text = local.text();
    let error = match local {
        Local::Balance(balance) if method == JsonMethod::GetBalance => {
            if let Ok(balance) = balance.trim().parse::<f64>() {
                return dialect.balance(balance);
            }
            JsonError::from_service("ERROR_UNREADABLE_ANSWER", "the pool's balance is unknown")
        }
        // "Not ready, as far as keyrelay knows": the client polls again.
        Local::NoVerdict { get: true, .. } | Local::Shaped => return dialect.processing(),
        // The final answer kept from an earlier poll: read as if it had just come.
        Local::Kept(kept) => return relayed(method, dialect, &kept.body),
        // Every thread busy: the JSON clients' "no slot, retry" rather than in.php's
        // zero-balance spelling of it.
        Local::PoolFull { .. } | Local::AllBusy { .. } => {
            JsonError::from_service("ERROR_NO_SLOT_AVAILABLE", &text)
        }
        Local::NoTaskId | Local::NotATaskId | Local::UnknownTask { .. } => {
            let mut error = JsonError::no_such_task();
            error.description = text.into_owned();
            error
        }
        Local::MethodNotServed => JsonError::from_service("ERROR_TASK_NOT_SUPPORTED", &text),
        other => JsonError::from_service(other.code().label(), &text),
    };
    dialect.error(&error)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Every JSON API answer: HTTP 200 with a JSON body, and the key that served it when the
/// operator shows keys.
fn json_response(text: String, key: Option<HeaderValue>) -> Response<Body> {
    let mut response = Response::new(Body::new(Bytes::from(text)));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(key) = key {
        headers.insert(KEY_HEADER_NAME, key);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: String) -> serde_json::Value {
        serde_json::from_str(&text).expect("an answer is JSON")
    }

    fn relayed_value(method: JsonMethod, dialect: Dialect, body: &[u8]) -> serde_json::Value {
        v(relayed(method, dialect, body))
    }

    #[test]
    fn unmapped_answers_are_errors_of_their_own_id() {
        let value = relayed_value(JsonMethod::CreateTask, Dialect::AntiCaptcha, b"<html>");
        assert_eq!(value["errorId"], json_api::UNMAPPED);
        assert!(value["errorDescription"].is_string());
    }

    #[test]
    fn service_answers_translate() {
        let d = Dialect::AntiCaptcha;
        assert_eq!(
            relayed_value(JsonMethod::CreateTask, d, br#"{"status":1,"request":"91"}"#)["taskId"],
            91
        );
        assert_eq!(
            relayed_value(
                JsonMethod::GetTaskResult,
                d,
                br#"{"status":0,"request":"CAPCHA_NOT_READY"}"#
            )["status"],
            "processing"
        );
        let ready = relayed_value(
            JsonMethod::GetTaskResult,
            d,
            br#"{"status":1,"request":"abc"}"#,
        );
        assert_eq!(ready["status"], "ready");
        assert_eq!(ready["solution"]["text"], "abc");
        let unsolvable = relayed_value(
            JsonMethod::GetTaskResult,
            d,
            br#"{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}"#,
        );
        assert_eq!(unsolvable["errorId"], 12);
        assert_eq!(unsolvable["errorCode"], "ERROR_CAPTCHA_UNSOLVABLE");
        assert_eq!(
            relayed_value(JsonMethod::GetBalance, d, b"12.5")["balance"],
            12.5
        );
        assert_eq!(
            relayed_value(JsonMethod::ReportIncorrect, d, b"OK_REPORT_RECORDED")["status"],
            "success"
        );
    }

    #[test]
    fn the_form_reads_back_as_the_values_written() {
        let values = [
            "BwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8w+/=",
            "a&key=stolen",
            "100% sure #1",
            "ünïcødé \u{7f}\t\n",
            "",
        ];
        let mut form = Form::new();
        for (i, value) in values.iter().enumerate() {
            form.pair(["body", "comment", "x", "y", "z"][i], value);
        }
        let text = String::from_utf8(form.finish()).expect("a form is ASCII");
        assert!(text.is_ascii(), "{text}");
        let read: Vec<(String, String)> = form_urlencoded::parse(text.as_bytes())
            .into_owned()
            .collect();
        assert_eq!(read.len(), values.len(), "{text}");
        for ((_, read), written) in read.iter().zip(values) {
            assert_eq!(read, written, "{text}");
        }
        assert!(text.contains("/"), "base64's slash goes as it is: {text}");
    }

    #[test]
    fn every_byte_a_form_reader_would_misread_is_escaped_and_no_other() {
        for byte in 0u8..=0x7F {
            let value = char::from(byte).to_string();
            let mut form = Form::new();
            form.pair("v", &value);
            let text = String::from_utf8(form.finish()).expect("a form is ASCII");
            let escaped = text != format!("v={value}");
            let misread = byte < 0x20 || byte == 0x7F || b" \"#%&+=".contains(&byte);
            assert_eq!(escaped, misread, "{byte:#x}: {text}");
            let read: Vec<(String, String)> = form_urlencoded::parse(text.as_bytes())
                .into_owned()
                .collect();
            assert_eq!(read, vec![("v".to_owned(), value)], "{byte:#x}");
        }
    }
}
