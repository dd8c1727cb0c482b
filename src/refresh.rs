//! Background refresh: every `refresh_interval`, read each key's balance and thread usage,
//! bench keys the service rejects, and bring benched keys back once they prove usable.
//! A failed read makes a figure unknown; it never reads as a zero balance.

use std::time::Duration;

use futures_util::future::join_all;
use hyper::header::HeaderMap;
use hyper::Method;
use tokio::time::Instant;

use crate::app::App;
use crate::captcha::{self, Outcome, Reply, ThreadsInfo};
use crate::failover;
use crate::health::{HealthEvent, StateKind};
use crate::pool::KeyEntry;
use crate::upstream::{Outgoing, UpstreamAnswer};

/// Why a read gave no figure.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The service rejected the key itself (`ERROR_KEY_DOES_NOT_EXIST` and kin).
    KeyRejected(&'static str),
    /// No usable answer: network, server error, or an answer without the figure.
    Unavailable,
}

/// Runs refreshes until the task is dropped: one now, then one per interval.
pub async fn run(app: App) {
    loop {
        refresh_all(&app).await;
        let interval = app.snapshot().config.refresh_interval;
        tokio::time::sleep(interval).await;
    }
}

/// [`refresh_all`] for a spawned task.
pub async fn refresh_all_owned(app: App) {
    refresh_all(&app).await;
}

/// Reads every key of the current pool concurrently and applies what was learned.
pub async fn refresh_all(app: &App) {
    if app.upstream_paused().is_some() {
        tracing::debug!("refresh skipped: upstream traffic is paused after an IP ban");
        return;
    }
    let snapshot = app.snapshot();
    let timeout = snapshot.config.timeouts.refresh;
    app.metrics().refresh_runs.inc();
    join_all(
        snapshot
            .pool
            .keys()
            .iter()
            .map(|key| refresh_key(app, key, timeout)),
    )
    .await;
    // New capacity figures or restored keys may give queued submits somewhere to go.
    app.capacity().nudge();
    let active = snapshot.pool.active_count(Instant::now());
    tracing::debug!(
        active,
        configured = snapshot.pool.keys().len(),
        "refresh done"
    );
}

async fn refresh_key(app: &App, key: &KeyEntry, timeout: Duration) {
    let balance = read_balance(app, key, timeout).await;
    if balance.is_err() {
        app.metrics()
            .refresh_failures
            .with_label_values(&[key.name.as_str()])
            .inc();
    }
    if let Err(ReadError::KeyRejected(code)) = balance {
        key.stats.set_balance(None);
        app.record_health(key, HealthEvent::Bench { reason: code });
        return;
    }
    key.stats.set_balance(balance.as_ref().ok().copied());
    // threadsinfo is CaptchaAI's own action; other services may not answer it. The mark
    // notes what keyrelay has in flight before the service is asked.
    let mark = app.capacity().mark(key.id);
    let threads = read_threads(app, key, timeout).await.ok();
    key.stats
        .set_threads(threads.map(|t| (t.threads, t.working_threads)));
    if let Some(info) = threads {
        app.reconcile_threads(key, info.working_threads, mark);
    }

    let snapshot = app.snapshot();
    let view = app.health().view(key.id, Instant::now());
    let usable = match balance {
        Ok(b) => b > snapshot.config.failover.min_balance,
        Err(_) => false,
    } && threads.is_none_or(|t| t.threads > 0);
    if view.state == StateKind::Benched && usable {
        app.record_health(key, HealthEvent::Restore);
    }
}

/// Reads a key's balance with `getbalance`.
///
/// # Errors
/// [`ReadError::KeyRejected`] when the service rejects the key, else `Unavailable`.
pub async fn read_balance(app: &App, key: &KeyEntry, timeout: Duration) -> Result<f64, ReadError> {
    let answer = account_request(app, key, "getbalance", timeout).await?;
    captcha::parse_balance(&answer.body).ok_or(ReadError::Unavailable)
}

/// Reads a key's thread usage with `threadsinfo`.
///
/// # Errors
/// As [`read_balance`].
pub async fn read_threads(
    app: &App,
    key: &KeyEntry,
    timeout: Duration,
) -> Result<ThreadsInfo, ReadError> {
    let answer = account_request(app, key, "threadsinfo", timeout).await?;
    captcha::parse_threads(&answer.body).ok_or(ReadError::Unavailable)
}

async fn account_request(
    app: &App,
    key: &KeyEntry,
    action: &str,
    timeout: Duration,
) -> Result<UpstreamAnswer, ReadError> {
    let query =
        serde_urlencoded::to_string([("key", key.key.expose()), ("action", action), ("json", "1")])
            .expect("string pairs always encode");
    let headers = HeaderMap::new();
    // serde_urlencoded's output is always a valid query.
    let uri = key
        .upstream
        .endpoint("/res.php", &query)
        .map_err(|_| ReadError::Unavailable)?;
    let result = app
        .client()
        .send(Outgoing {
            method: Method::GET,
            uri,
            headers: &headers,
            body: bytes::Bytes::new(),
            timeout,
        })
        .await;
    let answer = match result {
        Ok(answer) => answer,
        Err(e) => {
            tracing::debug!(key = %key.name, action, error = %e, "account read failed");
            return Err(ReadError::Unavailable);
        }
    };
    let reply = captcha::parse_reply(&answer.body);
    match (captcha::classify(answer.status.as_u16(), &reply), &reply) {
        (Outcome::KeyUnusable, Reply::Error(code)) => {
            Err(ReadError::KeyRejected(failover::reason_code(code)))
        }
        (Outcome::Success, _) => Ok(answer),
        _ => Err(ReadError::Unavailable),
    }
}
