//! Settling a verdict the service gave in answer to a caller's request with a read keyrelay
//! makes itself, in the background: `getbalance` before a key-unusable verdict benches a key;
//! after `ERROR_ZERO_BALANCE`, `threadsinfo` to tell a busy key from one without a plan at
//! CaptchaAI, and `getbalance` to see whether the money ran out where the code means that.
//!
//! The rule: a caller's request can fail over, but only keyrelay's own evidence can bench a
//! key. The caller chose every byte of its request, and a request the service misreads (a
//! spelling of `key` it takes for an empty key, say) draws the same "wrong key" answer as a
//! dead key would; these reads carry nothing of the caller's.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::app::App;
use crate::captcha::ZeroBalance;
use crate::failover::{self, Check, CheckResult};
use crate::health::Reason;
use crate::pool::{AdminHold, KeyEntry};

/// At most one key-unusable check per key in this long: callers drawing the verdict again
/// and again (a hostile or broken script) cost the key one `getbalance` per interval.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Starts `check` of `key` in the background; the request that drew the verdict goes on
/// (fails over) without waiting for it.
pub(super) fn spawn(app: &App, key: &Arc<KeyEntry>, check: Check) {
    if app.admin_hold(&key.name) == Some(AdminHold::Disabled) {
        // The operator wants no traffic on this key beyond its own tasks' polls.
        if let Check::Unusable { .. } = check {
            count(app, CheckResult::Skipped);
        }
        return;
    }
    if app.upstream_paused().is_some() {
        // All upstream traffic waits out an IP ban; a read now would only deepen it, and
        // the verdict is asked again by the next request that draws it.
        if let Check::Unusable { .. } = check {
            count(app, CheckResult::Skipped);
        }
        return;
    }
    match check {
        Check::ZeroBalance => match key.profile().zero_balance {
            ZeroBalance::Threads => {
                tokio::spawn(settle_zero_balance(app.clone(), key.clone()));
            }
            ZeroBalance::Funds => {
                tokio::spawn(settle_no_funds(app.clone(), key.clone()));
            }
        },
        Check::Unusable { reason } => {
            if !key.stats.begin_check(Instant::now(), CHECK_INTERVAL) {
                count(app, CheckResult::Skipped);
                return;
            }
            tokio::spawn(confirm_unusable(app.clone(), key.clone(), reason));
        }
    }
}

/// A caller's request drew "this key is unusable" (`reason`); keyrelay's own `getbalance`
/// with the key decides ([`failover::on_unusable_check`]). No answer changes nothing: the
/// next verdict or the periodic refresh will ask again.
async fn confirm_unusable(app: App, key: Arc<KeyEntry>, reason: Reason) {
    let timeout = app.snapshot().config.timeouts.refresh;
    let balance = app.client().read_balance(key.account(), timeout).await;
    let (event, result) = failover::on_unusable_check(&balance);
    match result {
        CheckResult::Confirmed => key.stats.set_balance(None),
        CheckResult::Refuted => {
            key.stats.set_balance(balance.ok());
            tracing::warn!(
                key = %key.name,
                reason = reason.label(),
                "the service refused a caller's request as if the key were unusable, but the key answers keyrelay's own getbalance; it stays in rotation"
            );
        }
        CheckResult::Inconclusive | CheckResult::Skipped => {
            tracing::debug!(key = %key.name, reason = reason.label(), "key check got no answer; nothing changed");
        }
    }
    if let Some(event) = event {
        app.record_health(&key, event);
    }
    count(&app, result);
}

fn count(app: &App, result: CheckResult) {
    app.metrics()
        .key_checks
        .with_label_values(&[result.label()])
        .inc();
}

/// `ERROR_ZERO_BALANCE` is settled with the key's `threadsinfo`
/// ([`failover::settle_zero_balance`]).
async fn settle_zero_balance(app: App, key: Arc<KeyEntry>) {
    let snapshot = app.snapshot();
    let mark = app.capacity().mark(key.id);
    let threads = app
        .client()
        .read_threads(key.account(), snapshot.config.timeouts.refresh)
        .await;
    if let Ok(info) = &threads {
        if failover::all_threads_working(info) {
            key.stats
                .set_threads(Some((info.threads, info.working_threads)));
            // Someone else holds the threads keyrelay thought free: count them, so the key
            // is not handed tasks it would refuse again once its cooldown ends.
            app.reconcile_threads(&key, info.working_threads, mark);
        }
    }
    match failover::settle_zero_balance(&threads, &snapshot.config.failover) {
        Some(event) => {
            app.record_health(&key, event);
        }
        None => {
            tracing::debug!(key = %key.name, "threadsinfo got no answer; zero-balance verdict unsettled");
        }
    }
}

/// `ERROR_ZERO_BALANCE` at a provider where it means "no money" is settled with the key's
/// `getbalance` ([`failover::settle_no_funds`]); the balance read is kept as the key's.
async fn settle_no_funds(app: App, key: Arc<KeyEntry>) {
    let snapshot = app.snapshot();
    let balance = app
        .client()
        .read_balance(key.account(), snapshot.config.timeouts.refresh)
        .await;
    match failover::settle_no_funds(&balance, &snapshot.config.failover) {
        Some(event) => {
            app.record_health(&key, event);
        }
        None => {
            tracing::debug!(key = %key.name, "getbalance showed money or got no answer; zero-balance verdict unsettled");
        }
    }
    // After the verdict: whoever sees the new balance sees the key's state that came of it.
    if let Ok(balance) = balance {
        key.stats.set_balance(Some(balance));
    }
}
