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

mod account;
mod body;
mod poll;
mod submit;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::time::Instant;

use crate::app::{App, Snapshot};
use crate::captcha::{self, Answer, Endpoint, Outcome, ParsedRequest, Reply};
use crate::failover;
use crate::pool::KeyEntry;
use crate::upstream::{self, Outgoing, UpstreamAnswer, UpstreamError};

/// Every response keyrelay sends is fully buffered: answers are small.
pub type Body = Full<Bytes>;

/// Serves one request. Never fails: every problem becomes a well-formed answer.
pub async fn handle(app: App, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    if path == "/metrics" && req.method() == Method::GET {
        return Ok(plain(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            app.render_metrics(),
        ));
    }
    let Some(endpoint) = Endpoint::from_path(path) else {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: keyrelay serves /in.php, /res.php, /solve.php and /metrics\n",
        ));
    };
    if req.method() != Method::GET && req.method() != Method::POST {
        let mut response = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "method not allowed: use GET or POST\n",
        );
        response
            .headers_mut()
            .insert("allow", HeaderValue::from_static("GET, POST"));
        return Ok(response);
    }
    Ok(api(app, endpoint, req).await)
}

/// What a handler decided to answer, and a closed-set label for the request metric.
pub(crate) struct Handled {
    pub reply: Answered,
    pub outcome: &'static str,
}

/// The answer itself.
pub(crate) enum Answered {
    /// An upstream answer, passed through verbatim: status, headers, body.
    Upstream(UpstreamAnswer),
    /// An answer keyrelay made itself, always HTTP 200.
    Local(Answer),
}

impl Handled {
    fn upstream(answer: UpstreamAnswer, outcome: &'static str) -> Handled {
        Handled {
            reply: Answered::Upstream(answer),
            outcome,
        }
    }

    fn local(answer: Answer, outcome: &'static str) -> Handled {
        Handled {
            reply: Answered::Local(answer),
            outcome,
        }
    }
}

async fn api(app: App, endpoint: Endpoint, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let snapshot = app.snapshot();
    let query = parts.uri.query();
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let limit = snapshot.config.limits.max_body;
    let handled = match body::read(body, declared, limit).await {
        Err(body::BodyError::TooLarge { prefix }) => {
            let json = json_hint(query, content_type, &prefix);
            let text =
                format!("the request body exceeds keyrelay's limits.max_body of {limit} bytes");
            Handled::local(
                captcha::error_answer("ERROR_TOO_BIG_CAPTCHA_FILESIZE", &text, json),
                "bad_request",
            )
        }
        Err(body::BodyError::Io(e)) => {
            tracing::debug!(error = %e, "caller body unreadable");
            let json = json_hint(query, content_type, &[]);
            Handled::local(
                captcha::error_answer(
                    "ERROR_BAD_PARAMETERS",
                    "the request body could not be read",
                    json,
                ),
                "bad_request",
            )
        }
        Ok(bytes) => match ParsedRequest::parse(query, content_type, bytes) {
            Err(e) => {
                let json = json_hint(query, content_type, &[]);
                Handled::local(
                    captcha::error_answer(e.code(), &e.to_string(), json),
                    "bad_request",
                )
            }
            Ok(parsed) => {
                let ctx = Ctx {
                    json: parsed.wants_json(),
                    app: app.clone(),
                    snapshot,
                    endpoint,
                    method: parts.method.clone(),
                    headers: parts.headers,
                };
                match endpoint {
                    Endpoint::In | Endpoint::Solve => submit::submit(&ctx, &parsed).await,
                    Endpoint::Res => dispatch_res(&ctx, &parsed).await,
                }
            }
        },
    };
    app.metrics()
        .requests
        .with_label_values(&[endpoint.label(), handled.outcome])
        .inc();
    into_response(handled.reply)
}

async fn dispatch_res(ctx: &Ctx, parsed: &ParsedRequest) -> Handled {
    match parsed.action() {
        None => ctx.local_error(
            "ERROR_EMPTY_ACTION",
            "res.php needs an action parameter",
            "bad_request",
        ),
        Some("get" | "get2" | "reportbad" | "reportgood") => poll::poll(ctx, parsed).await,
        Some("getbalance") => account::balance(ctx).await,
        Some("threadsinfo") => account::threads(ctx),
        Some("add_pingback" | "get_pingback" | "del_pingback") => {
            account::pingback(ctx, parsed).await
        }
        Some(_) => account::other(ctx, parsed).await,
    }
}

/// Everything one API request needs while it is served.
pub(crate) struct Ctx {
    pub app: App,
    /// Loaded once: the request sees one pool even if it is replaced meanwhile.
    pub snapshot: Arc<Snapshot>,
    pub endpoint: Endpoint,
    pub method: Method,
    pub headers: HeaderMap,
    /// Format of answers keyrelay makes itself.
    pub json: bool,
}

/// One exchange with the upstream, classified.
pub(crate) struct Attempt {
    pub outcome: Outcome,
    /// The upstream's error code, or a label for a transport or HTTP failure; a closed set.
    pub code: &'static str,
    pub reply: Reply,
    pub result: Result<UpstreamAnswer, UpstreamError>,
}

impl Attempt {
    /// The upstream answer, if it may go to the caller as is: a complete 2xx answer that is
    /// not a transient failure. Anything else is replaced by an answer of keyrelay's own,
    /// because clients read a non-200 status as a network failure.
    pub fn deliverable(self) -> Option<UpstreamAnswer> {
        let transient = self.outcome == Outcome::Transient;
        self.result
            .ok()
            .filter(|answer| !transient && answer.status.is_success())
    }
}

impl Ctx {
    /// Sends the caller's request upstream with `key` (and any `extra` replacements), and
    /// classifies the result. Records latency and the outcome per key.
    pub async fn attempt(
        &self,
        key: &KeyEntry,
        parsed: &ParsedRequest,
        extra: &[(&str, &str)],
    ) -> Attempt {
        let mut set = Vec::with_capacity(1 + extra.len());
        set.push(("key", key.key.expose()));
        set.extend_from_slice(extra);
        let rewritten = parsed.rewrite(&set);
        let timeouts = &self.snapshot.config.timeouts;
        let timeout = if self.endpoint == Endpoint::Solve {
            timeouts.solve
        } else {
            timeouts.request
        };
        let started = Instant::now();
        let result = self
            .app
            .client()
            .send(Outgoing {
                method: self.method.clone(),
                uri: key
                    .upstream
                    .endpoint(self.endpoint.path(), &rewritten.query),
                headers: &self.headers,
                body: rewritten.body,
                timeout,
            })
            .await;
        self.app
            .metrics()
            .upstream_duration
            .with_label_values(&[self.endpoint.label()])
            .observe(started.elapsed().as_secs_f64());
        let attempt = classify(result);
        self.app
            .metrics()
            .upstream_outcomes
            .with_label_values(&[key.name.as_str(), attempt.outcome.label()])
            .inc();
        attempt
    }

    pub fn local_error(&self, code: &str, text: &str, outcome: &'static str) -> Handled {
        Handled::local(captcha::error_answer(code, text, self.json), outcome)
    }

    pub fn policy(&self) -> &crate::config::Failover {
        &self.snapshot.config.failover
    }
}

/// Classifies an upstream result with the protocol's one outcome table.
fn classify(result: Result<UpstreamAnswer, UpstreamError>) -> Attempt {
    match &result {
        Err(e) => Attempt {
            outcome: Outcome::Transient,
            code: e.label(),
            reply: Reply::Garbage,
            result,
        },
        Ok(answer) => {
            let reply = captcha::parse_reply(&answer.body);
            let status = answer.status.as_u16();
            let outcome = captcha::classify(status, &reply);
            let code = match &reply {
                Reply::Error(code) => failover::reason_code(code),
                _ if status == 429 => "http_429",
                _ if status >= 500 => "http_5xx",
                _ if !answer.status.is_success() => "http_error",
                Reply::Garbage => "bad_answer",
                _ => "none",
            };
            Attempt {
                outcome,
                code,
                reply,
                result,
            }
        }
    }
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

fn into_response(reply: Answered) -> Response<Body> {
    match reply {
        Answered::Upstream(answer) => {
            let mut response = Response::new(Full::new(answer.body));
            *response.status_mut() = answer.status;
            let headers = response.headers_mut();
            for (name, value) in upstream::answer_headers(&answer.headers) {
                headers.append(name.clone(), value.clone());
            }
            response
        }
        Answered::Local(answer) => plain(StatusCode::OK, answer.content_type, answer.body),
    }
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
}
