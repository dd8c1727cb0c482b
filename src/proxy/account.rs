//! `res.php` account actions, which concern the pool rather than one task: `getbalance` and
//! `threadsinfo` answer pool totals, pingback actions go to every key, and actions keyrelay
//! does not know are forwarded with a key in rotation. What goes upstream carries the
//! action keyrelay read, once and canonically named, and no other spelling of it. A caller token limited to some keys
//! sees only those: the totals of its keys, its pingbacks set on its keys.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::local::ThreadsAnswer;
use super::{Checked, Ctx, Handled, Local};
use crate::captcha::{Outcome, ParsedRequest};
use crate::metrics::RequestOutcome;

/// `getbalance`: the sum over keys in rotation. Keys whose balance is unknown are read now,
/// so the first call after startup is not an undercount.
pub(super) async fn balance(ctx: &Ctx) -> Handled {
    let pool = &ctx.snapshot.pool;
    let now = Instant::now();
    let unknown = pool
        .keys()
        .iter()
        .filter(|k| ctx.may_use(k) && pool.in_rotation(k, now) && k.stats.balance().is_none());
    let timeout = ctx.snapshot.config.timeouts.refresh;
    // Paused after an IP ban: answer from what is known rather than reach the upstream.
    let unknown = unknown.filter(|_| ctx.app.upstream_paused().is_none());
    join_all(unknown.map(|key| async move {
        if let Ok(balance) = ctx.app.client().read_balance(key.account(), timeout).await {
            key.stats.set_balance(Some(balance));
        }
    }))
    .await;
    let now = Instant::now();
    let mut usable = pool
        .keys()
        .iter()
        .filter(|k| ctx.may_use(k) && pool.in_rotation(k, now))
        .peekable();
    // Money adds up only within a currency: the total is in that of the first usable key
    // in config order (the primary's, as a rule), and keys in another are left out.
    let currency = usable.peek().map(|k| k.profile().currency);
    let total: f64 = usable
        .filter(|k| Some(k.profile().currency) == currency)
        .filter_map(|k| k.stats.balance())
        .sum();
    Local::Balance(format_balance(total)).into()
}

/// Balances are money: six decimals, trailing zeros trimmed, as the service prints them.
fn format_balance(total: f64) -> String {
    let text = format!("{total:.6}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() || text == "-" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

/// How long after refusing a submit for want of a thread `threadsinfo` keeps reporting no
/// free thread. The official SDK asks right after the refusal, and reads "threads free, yet
/// refused" as an account without a plan (a fatal error); a thread freed in between must
/// not turn a busy pool into that.
const BUSY_ECHO: Duration = Duration::from_secs(10);

/// `threadsinfo`: pool totals over keys in rotation, as admission counts them, so a client
/// that checks threads after a "no free thread" answer sees the same picture keyrelay acted
/// on. A key with a known capacity counts its threads and its threads in use; a key without
/// one takes any number of tasks, so it counts one free thread above its use. The service
/// answers this action in JSON only.
///
/// Only keys of providers that have threads count (CaptchaAI's plans, or a `threads` the
/// config gives): a pay-per-task key would add a made-up thread to a real plan's figure.
/// A pool of such keys alone still counts them, so that the answer never reads as "no
/// plan" to a client that asks.
pub(super) fn threads(ctx: &Ctx) -> Handled {
    let pool = &ctx.snapshot.pool;
    let now = Instant::now();
    let (mut threads, mut working) = (0u64, 0u64);
    let serving = || {
        pool.keys()
            .iter()
            .filter(|k| ctx.may_use(k) && pool.in_rotation(k, now))
    };
    let has_threads = |k: &&std::sync::Arc<crate::pool::KeyEntry>| {
        k.profile().threadsinfo || k.thread_capacity().is_some()
    };
    let only_threaded = serving().any(|k| has_threads(&k));
    for key in serving().filter(|k| !only_threaded || has_threads(k)) {
        // In a cluster, the whole fleet's use as last synced: every replica answers alike.
        let used = u64::from(pool.in_use(key));
        match key.thread_capacity().map(u64::from) {
            Some(capacity) => {
                threads += capacity;
                working += used.min(capacity);
            }
            None => {
                threads += used + 1;
                working += used;
            }
        }
    }
    let capacity = ctx.app.capacity();
    if capacity.queued() > 0 || capacity.refused_within(BUSY_ECHO, now) {
        // Submits are waiting or were just refused: any thread that looks free is spoken for.
        working = threads;
    }
    Local::Threads(ThreadsAnswer {
        status: 1,
        threads,
        working_threads: working,
        free_threads: threads - working,
    })
    .into()
}

/// Pingback addresses apply to every key, because a task can land on any of them. The answer
/// is the first key's that succeeded (for `get_pingback`, every key holds the same list).
pub(super) async fn pingback(ctx: &Ctx, parsed: &ParsedRequest, action: &str) -> Handled {
    if let Some(paused) = ctx.paused() {
        return paused;
    }
    let keys: Vec<_> = ctx
        .snapshot
        .pool
        .keys()
        .iter()
        .filter(|k| ctx.may_use(k))
        .collect();
    let set = [("action", action)];
    let checked = Checked {
        set: &set,
        drop: untaskable(ctx),
    };
    let attempts = join_all(keys.iter().map(|key| ctx.attempt(key, parsed, checked))).await;
    let mut first_answer = None;
    for (&key, attempt) in keys.iter().zip(attempts) {
        let succeeded = attempt.outcome() == Outcome::Success;
        let outcome = RequestOutcome::relayed(attempt.outcome());
        if !succeeded {
            tracing::warn!(key = %key.name, code = attempt.code(), "pingback action failed on a key");
        }
        if let Some(answer) = attempt.deliverable() {
            if succeeded {
                return Handled::relayed(answer, outcome, key, 1);
            }
            first_answer.get_or_insert((answer, outcome, key));
        }
    }
    match first_answer {
        Some((answer, outcome, key)) => Handled::relayed(answer, outcome, key, 1),
        None => Local::NoUpstreamAnswer.into(),
    }
}

/// An action keyrelay has no rule for: forwarded once with a key in rotation, answer verbatim.
pub(super) async fn other(ctx: &Ctx, parsed: &ParsedRequest, action: &str) -> Handled {
    if let Some(paused) = ctx.paused() {
        return paused;
    }
    let pool = &ctx.snapshot.pool;
    let rng = ctx.app.rng();
    // No thread is taken: these actions start no task.
    let mut candidates = pool
        .candidates(rng, Instant::now())
        .ignoring_load()
        .for_token(ctx.token.as_deref());
    let Some(key) = candidates.next() else {
        let configured = pool.keys().len();
        return Local::NoKeyInRotation { configured }.into();
    };
    let set = [("action", action)];
    let checked = Checked {
        set: &set,
        drop: untaskable(ctx),
    };
    let attempt = ctx.attempt(key, parsed, checked).await;
    let outcome = RequestOutcome::relayed(attempt.outcome());
    match attempt.deliverable() {
        Some(answer) => Handled::relayed(answer, outcome, key, 1),
        None => Local::NoUpstreamAnswer.into(),
    }
}

/// The names an action that is no task action must not send, with tokens configured: every
/// spelling of `id` and `ids`. keyrelay checks whose a task is only for the actions it has a
/// rule for; one it has none for (`GET`, a typo, a future action) reaches a service that may
/// read it as a task action all the same, and must not name another token's task there.
/// Without tokens there are no owners, and such requests go as they came.
fn untaskable(ctx: &Ctx) -> &'static [&'static str] {
    if ctx.token.is_some() {
        &["id", "ids"]
    } else {
        &[]
    }
}

#[cfg(test)]
mod tests {
    use super::format_balance;

    #[test]
    fn balances_print_like_the_service() {
        assert_eq!(format_balance(10.0), "10");
        assert_eq!(format_balance(9.997), "9.997");
        assert_eq!(format_balance(0.1 + 0.2), "0.3");
        assert_eq!(format_balance(0.0), "0");
    }
}
