//! Finding the owner of a task id keyrelay has no pin for: a lost pin, a task submitted by
//! another keyrelay instance, or one submitted before keyrelay was introduced. The pool's
//! keys are asked concurrently; the first that answers about the task owns it, the task is
//! pinned to it, and its answer goes to the caller at once. "Nobody owns it" is said only
//! when every key asked said "not mine"; a key that could not answer makes the probe
//! unsure, which is no verdict. Ids no key owns are remembered for a while, so a client
//! polling a bad id does not make keyrelay ask every key every time.

use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::{Answered, Attempt, Checked, Ctx};
use crate::captcha::TaskId;
use crate::captcha::{self, Outcome, ParsedRequest};
use crate::metrics::ProbeResult;
use crate::pins::TokenId;
use crate::pool::KeyEntry;
use crate::upstream::UpstreamAnswer;

/// At most this many keys are asked about one id, at once: enough for any real pool, and a
/// bound on the traffic one unknown id can cause.
pub const MAX_PROBED_KEYS: usize = 16;

/// At most this many distinct unknown ids of one `ids=` poll are probed; the rest answer
/// `CAPCHA_NOT_READY` (no verdict yet), so one request cannot fan out without bound.
pub const MAX_PROBED_IDS: usize = 8;

/// Answers that mean "this key does not know this task".
pub(super) const NOT_MINE: [&str; 2] = ["ERROR_WRONG_CAPTCHA_ID", "ERROR_WRONG_ID_FORMAT"];

// Every probe of a full-size pool must fit in the smallest burst the config allows.
const _: () = assert!(MAX_PROBED_KEYS as u32 <= crate::config::MIN_PROBE_BURST);

/// What probing found.
pub(super) enum Probed {
    /// A key owns the task: the key, its answer, and that answer's class.
    Owner {
        key: Arc<KeyEntry>,
        answer: UpstreamAnswer,
        outcome: Outcome,
        /// The answer is the task's final one (see [`Attempt::ends_task`]).
        ends_task: bool,
    },
    /// Every key asked said the task is not theirs, now or moments ago (`remembered`).
    Nobody { remembered: bool },
    /// No owner claimed it, but some key could not say (an error, a timeout): the task may
    /// well exist, so this is no verdict.
    Unsure,
    /// Not probed: the probe budget is spent. No verdict either.
    NoBudget,
}

/// What one key's answer says about the task.
enum Verdict {
    /// It answered about the task: a result, "not ready", or a verdict such as unsolvable.
    Mine,
    /// It said the task is not its own.
    NotMine,
    /// It could not say: an error of the key or the service, a timeout, an odd answer.
    CannotSay,
}

fn verdict(attempt: &Attempt) -> Verdict {
    let Attempt::Answered(Answered {
        answer, outcome, ..
    }) = attempt
    else {
        return Verdict::CannotSay;
    };
    // Read as a one-item answer, so that both a single poll's `ERROR_WRONG_CAPTCHA_ID` and
    // a batch poll's `{"status":1,"request":"ERROR_WRONG_CAPTCHA_ID"}` say "not mine".
    let not_mine = answer.status.is_success()
        && captcha::split_ids_reply(&answer.body, 1)
            .is_some_and(|items| NOT_MINE.contains(&items[0].as_str()));
    if not_mine {
        return Verdict::NotMine;
    }
    // A key that is dead, busy or failing says nothing either way.
    let about_the_task = matches!(outcome, Outcome::Success | Outcome::CallerError);
    if about_the_task && answer.status.is_success() {
        Verdict::Mine
    } else {
        Verdict::CannotSay
    }
}

/// Asks the pool's keys who owns `task`, with the caller's own request and the `checked`
/// params in place of the caller's (the action, and `id` or, for a batch poll, `ids`
/// narrowed to this one id, canonically), and answers as soon as one claims it. Only a full
/// set of "not mine" answers is a verdict that nobody does.
pub(super) async fn probe(
    ctx: &Ctx,
    parsed: &ParsedRequest,
    task: &TaskId,
    checked: Checked<'_>,
) -> Probed {
    let now = Instant::now();
    let misses = &ctx.app.probe().misses;
    // A token limited to some keys asks only those: an id none of them owns may still be
    // another key's, so its misses are neither read from nor added to the shared memory.
    let limited = ctx.token.as_deref().filter(|t| t.is_limited());
    if limited.is_none() && misses.held(task, now) {
        count(ctx, ProbeResult::Remembered);
        return Probed::Nobody { remembered: true };
    }
    let keys: Vec<&Arc<KeyEntry>> = ctx
        .snapshot
        .pool
        .keys()
        .iter()
        .filter(|key| limited.is_none_or(|t| t.may_use(key.id)))
        .take(MAX_PROBED_KEYS)
        .collect();
    // Charged per key asked, before asking: what goes upstream is what the budget bounds.
    let pins = &ctx.snapshot.config.pins;
    let asked = keys.len() as u32;
    if !ctx
        .app
        .probe()
        .budget
        .try_take(asked, pins.probe_rate, pins.probe_burst, now)
    {
        count(ctx, ProbeResult::Budget);
        return Probed::NoBudget;
    }
    let mut asking: FuturesUnordered<_> = keys
        .iter()
        .map(|&key| async move { (key, ctx.exchange(key, parsed, checked).await) })
        .collect();
    let mut unsure = keys.is_empty();
    while let Some((key, attempt)) = asking.next().await {
        match verdict(&attempt) {
            Verdict::NotMine => {}
            Verdict::CannotSay => {
                // A real fault of the key, unlike "not mine", which is most keys' right answer.
                ctx.record_key_error(key, &attempt);
                unsure = true;
            }
            Verdict::Mine => {
                let outcome = attempt.outcome();
                let ends_task = attempt.ends_task();
                let Some(answer) = attempt.deliverable() else {
                    unsure = true;
                    continue;
                };
                // Pinned, not opened: a task keyrelay did not see submitted holds no thread in
                // its count (the refresh's threadsinfo counts it as the key's external load).
                // Pinned to no token: a probe finds the key, never who created the task, so
                // callers with tokens are never probed for (`poll::unpinned_for_a_token`).
                ctx.app
                    .pins()
                    .pin_for(task.clone(), key.id, TokenId::NONE, Instant::now());
                ctx.app.shared_pins().share_found(task, &key.name, "");
                misses.forget(task);
                count(ctx, ProbeResult::Found);
                tracing::info!(key = %key.name, task_id = %task, "unknown task found on a key and pinned");
                // Dropping `asking` cancels the requests still out: each closes its connection
                // (a connection goes back to the pool only with its whole answer read), and
                // whether or not it reached its key, it changes nothing there. A task has one
                // owner, and it has answered; to any other key a get or get2 is a read of a
                // task it does not have, and a reportbad or reportgood is refused with
                // ERROR_WRONG_CAPTCHA_ID and recorded nowhere.
                return Probed::Owner {
                    key: key.clone(),
                    answer,
                    outcome,
                    ends_task,
                };
            }
        }
    }
    if unsure {
        // Not remembered: the next poll asks again, and may find the owner then.
        count(ctx, ProbeResult::Unsure);
        return Probed::Unsure;
    }
    if limited.is_none() {
        misses.remember(task.clone(), now);
    }
    count(ctx, ProbeResult::NotFound);
    Probed::Nobody { remembered: false }
}

/// Counts one unknown id in `keyrelay_probes_total` by what became of it.
pub(super) fn count(ctx: &Ctx, result: ProbeResult) {
    ctx.app.metrics().count_probe(result);
}
