//! Settling a verdict the service gave in answer to a caller's request with a read keyrelay
//! makes itself, in the background: `getbalance` before a key-unusable verdict benches a key,
//! `threadsinfo` to tell a busy key from one without a plan after `ERROR_ZERO_BALANCE`.
//!
//! The rule: a caller's request can fail over, but only keyrelay's own evidence can bench a
//! key. The caller chose every byte of its request, and a request the service misreads (a
//! spelling of `key` it takes for an empty key, say) draws the same "wrong key" answer as a
//! dead key would; these reads carry nothing of the caller's.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::app::App;
use crate::failover::{Check, CheckResult};
use crate::health::HealthEvent;
use crate::pool::KeyEntry;
use crate::refresh::{self, ReadError};

/// At most one key-unusable check per key in this long: callers drawing the verdict again
/// and again (a hostile or broken script) cost the key one `getbalance` per interval.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Starts `check` of `key` in the background; the request that drew the verdict goes on
/// (fails over) without waiting for it.
pub(super) fn spawn(app: &App, key: &Arc<KeyEntry>, check: Check) {
    if app.upstream_paused().is_some() {
        // All upstream traffic waits out an IP ban; a read now would only deepen it, and
        // the verdict is asked again by the next request that draws it.
        if let Check::Unusable { .. } = check {
            count(app, CheckResult::Skipped);
        }
        return;
    }
    match check {
        Check::Threads => {
            tokio::spawn(settle_zero_balance(app.clone(), key.clone()));
        }
        Check::Unusable { reason } => {
            if !key.stats.begin_check(Instant::now(), CHECK_INTERVAL) {
                count(app, CheckResult::Skipped);
                return;
            }
            tokio::spawn(confirm_unusable(app.clone(), key.clone(), reason));
        }
    }
}

/// A caller's request drew "this key is unusable" (`reason`). keyrelay's own `getbalance`
/// with the key decides: rejected too, the key is benched with the service's code; answered,
/// the verdict was about the caller's request and the key stays; no answer, nothing changes
/// (the next verdict or the periodic refresh will ask again).
async fn confirm_unusable(app: App, key: Arc<KeyEntry>, reason: &'static str) {
    let timeout = app.snapshot().config.timeouts.refresh;
    let result = match refresh::read_balance(&app, &key, timeout).await {
        Err(ReadError::KeyRejected(code)) => {
            key.stats.set_balance(None);
            app.record_health(&key, HealthEvent::Bench { reason: code });
            CheckResult::Confirmed
        }
        Ok(balance) => {
            key.stats.set_balance(Some(balance));
            tracing::warn!(
                key = %key.name,
                reason,
                "the service refused a caller's request as if the key were unusable, but the key answers keyrelay's own getbalance; it stays in rotation"
            );
            CheckResult::Refuted
        }
        Err(ReadError::Unavailable) => {
            tracing::debug!(key = %key.name, reason, "key check got no answer; nothing changed");
            CheckResult::Inconclusive
        }
    };
    count(&app, result);
}

fn count(app: &App, result: CheckResult) {
    app.metrics()
        .key_checks
        .with_label_values(&[result.label()])
        .inc();
}

/// `ERROR_ZERO_BALANCE` means either "no plan or balance" or "no free thread right now".
/// The key's `threadsinfo` tells which: all threads working means full (a short cooldown),
/// free threads or none at all mean no plan (benched until a refresh sees the key usable).
/// No answer settles nothing: the provisional cooldown runs out by itself.
async fn settle_zero_balance(app: App, key: Arc<KeyEntry>) {
    let snapshot = app.snapshot();
    let policy = &snapshot.config.failover;
    let mark = app.capacity().mark(key.id);
    let info = refresh::read_threads(&app, &key, snapshot.config.timeouts.refresh).await;
    let event = match info {
        Ok(info) if info.threads > 0 && info.working_threads >= info.threads => {
            key.stats
                .set_threads(Some((info.threads, info.working_threads)));
            // Someone else holds the threads keyrelay thought free: count them, so the key
            // is not handed tasks it would refuse again once its cooldown ends.
            app.reconcile_threads(&key, info.working_threads, mark);
            HealthEvent::Cool {
                reason: "ERROR_ZERO_BALANCE",
                duration: policy.busy_cooldown,
            }
        }
        Ok(_) => HealthEvent::Bench {
            reason: "ERROR_ZERO_BALANCE",
        },
        Err(ReadError::KeyRejected(code)) => HealthEvent::Bench { reason: code },
        Err(ReadError::Unavailable) => {
            tracing::debug!(key = %key.name, "threadsinfo got no answer; zero-balance verdict unsettled");
            return;
        }
    };
    app.record_health(&key, event);
}
