//! The admin API under `/admin/`: list keys, disable, enable or drain one, and refresh one
//! or all now. JSON answers, and operator-style errors (`{"error": "..."}` with a 4xx or 5xx
//! status), since its callers are operators and `keyrelay ctl`, not captcha clients.
//! Served by `proxy` on whichever listener carries the operator endpoints; acts through
//! `App` and `refresh`.
//!
//! Every call is authorised first (`auth`); every change is logged at info with who made
//! it (`by = "admin"`, how it got in, and the peer address) and what it did.

mod auth;
mod budgets;
mod keys;

pub use auth::{Denied, Granted};
pub use budgets::{BudgetList, BudgetRow};
pub use keys::{ErrorBody, KeyAnswer, KeyList, KeyRow};

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use tokio::time::Instant;

use crate::app::App;
use crate::log_limit::{Clip, Throttle, INTERVAL};
use crate::pool::{AdminHold, HoldError, KeyEntry};
use crate::refresh;

/// Refused admin calls are logged at most once a minute per reason.
static REFUSED: Throttle = Throttle::new(INTERVAL);

/// The path every admin route lives under.
pub const PREFIX: &str = "/admin";

/// Whether `path` is the admin API's.
pub fn owns(path: &str) -> bool {
    path.strip_prefix(PREFIX)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// What a route asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    List,
    Budgets,
    Hold(String, Option<AdminHold>),
    RefreshOne(String),
    RefreshAll,
}

impl Route {
    /// The route of `path`, and the method it takes; `None`: no such route.
    fn parse(path: &str) -> Option<(Route, Method)> {
        let rest = path.strip_prefix(PREFIX)?;
        let segments: Vec<&str> = rest.trim_matches('/').split('/').collect();
        Some(match segments.as_slice() {
            ["keys"] => (Route::List, Method::GET),
            ["budgets"] => (Route::Budgets, Method::GET),
            ["refresh"] => (Route::RefreshAll, Method::POST),
            ["keys", name, action] => {
                let name = percent_encoding::percent_decode_str(name)
                    .decode_utf8()
                    .ok()?
                    .into_owned();
                let route = match *action {
                    "disable" => Route::Hold(name, Some(AdminHold::Disabled)),
                    "drain" => Route::Hold(name, Some(AdminHold::Draining)),
                    "enable" => Route::Hold(name, None),
                    "refresh" => Route::RefreshOne(name),
                    _ => return None,
                };
                (route, Method::POST)
            }
            _ => return None,
        })
    }
}

/// An admin answer: a status and a JSON body.
type Answer = Response<Full<Bytes>>;

/// Serves one admin request from `peer`. Never fails: every problem is a JSON error.
pub async fn handle<B>(app: &App, peer: SocketAddr, req: Request<B>) -> Answer {
    let snapshot = app.snapshot();
    let token = snapshot.config.admin.token.as_ref();
    let trusted = snapshot.config.loopback_trusted();
    let check = || auth::check(token, trusted, req.headers(), peer);
    // Wrong admin tokens draw on the address's allowance of wrong tokens, as callers' do;
    // without a token there is nothing to guess.
    let checked = match token {
        Some(_) => app
            .denials()
            .within(peer.ip(), check, |r| *r == Err(Denied::Wrong))
            .unwrap_or(Err(Denied::Limited)),
        None => check(),
    };
    let granted = match checked {
        Ok(granted) => granted,
        Err(denied) => {
            if let Some(admitted) = REFUSED.admit_key(denied.label()) {
                tracing::warn!(
                    %peer,
                    path = %Clip(req.uri().path()),
                    reason = denied.label(),
                    held_back = admitted.suppressed,
                    "admin call refused (logged once a minute per reason)"
                );
            }
            return refused(denied);
        }
    };
    let Some((route, method)) = Route::parse(req.uri().path()) else {
        return error(
            StatusCode::NOT_FOUND,
            "no such admin endpoint: see GET /admin/keys, POST /admin/keys/NAME/disable|enable|drain|refresh, POST /admin/refresh",
        );
    };
    if req.method() != method {
        let mut answer = error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("use {method} for this endpoint"),
        );
        answer.headers_mut().insert(
            ALLOW,
            HeaderValue::from_str(method.as_str()).expect("a method is a header value"),
        );
        return answer;
    }
    let who = Who { granted, peer };
    match route {
        Route::List => {
            tracing::debug!(by = "admin", auth = granted.label(), %peer, "admin listed keys");
            json(StatusCode::OK, &list(app))
        }
        Route::Budgets => {
            tracing::debug!(by = "admin", auth = granted.label(), %peer, "admin listed budgets");
            json(StatusCode::OK, &budget_list(app))
        }
        Route::Hold(name, hold) => set_hold(app, &who, &name, hold),
        Route::RefreshOne(name) => refresh_one(app, &who, &name).await,
        Route::RefreshAll => refresh_all(app, &who).await,
    }
}

/// Who made a call, for its log line.
struct Who {
    granted: Granted,
    peer: SocketAddr,
}

fn list(app: &App) -> KeyList {
    let snapshot = app.snapshot();
    let now = Instant::now();
    KeyList {
        keys: snapshot
            .pool
            .keys()
            .iter()
            .map(|key| KeyRow::of(&snapshot.pool, key, now))
            .collect(),
    }
}

/// Every caller token's spend, in config order.
fn budget_list(app: &App) -> BudgetList {
    let snapshot = app.snapshot();
    let now = crate::budgets::now();
    BudgetList {
        tokens: snapshot
            .tokens
            .tokens()
            .iter()
            .map(|token| BudgetRow::of(app.budgets(), token, now))
            .collect(),
    }
}

/// The row of the key named `name` in the running pool.
fn row(app: &App, name: &str) -> Option<KeyRow> {
    let snapshot = app.snapshot();
    let key = snapshot.pool.keys().iter().find(|k| k.name == name)?;
    Some(KeyRow::of(&snapshot.pool, key, Instant::now()))
}

fn no_such_key(name: &str) -> Answer {
    error(
        StatusCode::NOT_FOUND,
        format!("no configured key is named {name:?}"),
    )
}

fn set_hold(app: &App, who: &Who, name: &str, hold: Option<AdminHold>) -> Answer {
    let action = match hold {
        Some(AdminHold::Disabled) => "disable",
        Some(AdminHold::Draining) => "drain",
        None => "enable",
    };
    let previous = match app.set_admin_hold(name, hold) {
        Ok(previous) => previous,
        Err(HoldError::NoSuchKey) => return no_such_key(name),
        Err(e @ HoldError::Persist { .. }) => {
            tracing::error!(
                by = "admin",
                peer = %who.peer,
                action,
                key = name,
                error = %e,
                "admin action failed: the hold could not be saved; nothing changed"
            );
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{e}; the {action} was not applied"),
            );
        }
    };
    tracing::info!(
        by = "admin",
        auth = who.granted.label(),
        peer = %who.peer,
        action,
        key = name,
        previous = previous.map_or("none", AdminHold::label),
        "admin action"
    );
    match row(app, name) {
        Some(key) => json(
            StatusCode::OK,
            &KeyAnswer {
                key,
                previous_hold: previous.map(|hold| hold.label().to_owned()),
            },
        ),
        // A reload removed it in between.
        None => no_such_key(name),
    }
}

async fn refresh_one(app: &App, who: &Who, name: &str) -> Answer {
    let snapshot = app.snapshot();
    let Some(key) = snapshot
        .pool
        .keys()
        .iter()
        .find(|k| k.name == name)
        .cloned()
    else {
        return no_such_key(name);
    };
    if let Some(answer) = paused(app) {
        return answer;
    }
    tracing::info!(by = "admin", auth = who.granted.label(), peer = %who.peer, action = "refresh", key = name, "admin action");
    let timeout = snapshot.config.timeouts.refresh;
    let work = {
        let app = app.clone();
        refresh_one_owned(app, key, timeout)
    };
    if !finished_within(work, timeout).await {
        return unfinished(timeout);
    }
    match row(app, name) {
        Some(key) => json(
            StatusCode::OK,
            &KeyAnswer {
                key,
                previous_hold: None,
            },
        ),
        None => no_such_key(name),
    }
}

async fn refresh_one_owned(app: App, key: Arc<KeyEntry>, timeout: std::time::Duration) {
    refresh::refresh_key(&app, &key, timeout).await;
    // New figures may give queued submits somewhere to go, as after a round.
    app.capacity().nudge();
}

async fn refresh_all(app: &App, who: &Who) -> Answer {
    if let Some(answer) = paused(app) {
        return answer;
    }
    tracing::info!(by = "admin", auth = who.granted.label(), peer = %who.peer, action = "refresh", key = "*", "admin action");
    let timeout = app.snapshot().config.timeouts.refresh;
    if !finished_within(refresh::refresh_all_owned(app.clone()), timeout).await {
        return unfinished(timeout);
    }
    json(StatusCode::OK, &list(app))
}

/// Runs `work` on a task of its own and waits for it up to `limit`: an operator who gives
/// up waiting does not cut a refresh short halfway through its reads.
async fn finished_within(
    work: impl std::future::Future<Output = ()> + Send + 'static,
    limit: std::time::Duration,
) -> bool {
    let task = tokio::spawn(work);
    matches!(tokio::time::timeout(limit, task).await, Ok(Ok(())))
}

fn unfinished(limit: std::time::Duration) -> Answer {
    error(
        StatusCode::GATEWAY_TIMEOUT,
        format!(
            "the refresh did not finish within timeouts.refresh ({}); it goes on in the background",
            humantime::format_duration(limit)
        ),
    )
}

/// While an IP ban pauses upstream traffic, a refresh would only deepen it.
fn paused(app: &App) -> Option<Answer> {
    app.upstream_paused()?;
    Some(error(
        StatusCode::SERVICE_UNAVAILABLE,
        "upstream traffic is paused after an IP ban; refresh later",
    ))
}

fn refused(denied: Denied) -> Answer {
    match denied {
        Denied::Missing | Denied::Wrong => {
            let text = match denied {
                Denied::Missing => "the admin API needs Authorization: Bearer <admin.token>",
                _ => "wrong admin token",
            };
            let mut answer = error(StatusCode::UNAUTHORIZED, text);
            answer.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"keyrelay admin\""),
            );
            answer
        }
        Denied::NotLoopback => error(
            StatusCode::FORBIDDEN,
            "with no admin.token, the admin API answers loopback callers only",
        ),
        Denied::NoAdminToken => error(
            StatusCode::FORBIDDEN,
            "the admin API needs admin.token once caller tokens are configured or a listener is off loopback",
        ),
        Denied::Limited => error(
            StatusCode::TOO_MANY_REQUESTS,
            "too many wrong tokens from this address lately; try again in a few seconds",
        ),
    }
}

fn error(status: StatusCode, text: impl Into<String>) -> Answer {
    json(status, &ErrorBody { error: text.into() })
}

fn json(status: StatusCode, body: &impl Serialize) -> Answer {
    let text = serde_json::to_string_pretty(body).expect("admin answers serialise");
    let mut answer = Response::new(Full::new(Bytes::from(text + "\n")));
    *answer.status_mut() = status;
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_parsed_with_their_methods() {
        let parse = |p: &str| Route::parse(p);
        assert_eq!(parse("/admin/keys"), Some((Route::List, Method::GET)));
        assert_eq!(parse("/admin/keys/"), Some((Route::List, Method::GET)));
        assert_eq!(
            parse("/admin/refresh"),
            Some((Route::RefreshAll, Method::POST))
        );
        assert_eq!(
            parse("/admin/keys/client-a/disable"),
            Some((
                Route::Hold("client-a".into(), Some(AdminHold::Disabled)),
                Method::POST
            ))
        );
        assert_eq!(
            parse("/admin/keys/client%20a/drain"),
            Some((
                Route::Hold("client a".into(), Some(AdminHold::Draining)),
                Method::POST
            ))
        );
        assert_eq!(
            parse("/admin/keys/a/enable"),
            Some((Route::Hold("a".into(), None), Method::POST))
        );
        assert_eq!(
            parse("/admin/keys/a/refresh"),
            Some((Route::RefreshOne("a".into()), Method::POST))
        );
        for none in [
            "/admin",
            "/admin/",
            "/admin/keys/a",
            "/admin/keys/a/explode",
            "/admin/x",
            "/admin/keys/%ff/drain",
        ] {
            assert_eq!(parse(none), None, "{none}");
        }
    }

    #[test]
    fn the_prefix_is_a_whole_segment() {
        assert!(owns("/admin") && owns("/admin/") && owns("/admin/keys"));
        assert!(!owns("/administrator") && !owns("/in.php") && !owns("/"));
    }
}
