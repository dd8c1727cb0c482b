//! Finding the owner of a task id keyrelay has no pin for: a lost pin, a task submitted by
//! another keyrelay instance, or one submitted before keyrelay was introduced. The pool's
//! keys are asked concurrently; the first that answers with anything but "not my task" owns
//! it, and the task is pinned to it. Ids no key owns are remembered for a while, so a
//! client polling a bad id does not make keyrelay ask every key every time.

use std::sync::Arc;

use futures_util::future::join_all;
use tokio::time::{Duration, Instant};

use super::{Ctx, Handled};
use crate::captcha::{self, Outcome, ParsedRequest};
use crate::fast_map::FastMap;
use crate::metrics::ProbeResult;
use crate::pins::TaskId;
use crate::pool::KeyEntry;
use crate::upstream::UpstreamAnswer;

/// At most this many keys are asked about one id, at once: enough for any real pool, and a
/// bound on the traffic one unknown id can cause.
pub const MAX_PROBED_KEYS: usize = 16;

/// At most this many unknown ids of one `ids=` poll are probed; the rest answer
/// `ERROR_WRONG_CAPTCHA_ID` at once, so one request cannot fan out without bound.
pub const MAX_PROBED_IDS: usize = 8;

/// How long an id no key owns is answered from memory instead of asking again.
pub const MISS_HOLD: Duration = Duration::from_secs(60);

/// Remembered misses at most; beyond, the memory is cleared rather than grown.
const MAX_MISSES: usize = 100_000;

/// Answers that mean "this key does not know this task".
const NOT_MINE: [&str; 2] = ["ERROR_WRONG_CAPTCHA_ID", "ERROR_WRONG_ID_FORMAT"];

/// Ids recently probed without finding an owner, with when they may be probed again.
#[derive(Default)]
pub struct ProbeMisses {
    /// Sharded like the pins; entries are copied out, never held across an await.
    until: FastMap<TaskId, Instant>,
}

impl ProbeMisses {
    fn held(&self, task: &TaskId, now: Instant) -> bool {
        self.until.get(task).is_some_and(|until| *until > now)
    }

    fn remember(&self, task: TaskId, now: Instant) {
        if self.until.len() >= MAX_MISSES {
            // Crude but bounded: a burst of bad ids costs one round of probes each again.
            self.until.clear();
        }
        self.until.insert(task, now + MISS_HOLD);
    }

    fn forget(&self, task: &TaskId) {
        self.until.remove(task);
    }
}

/// What probing found.
pub(super) enum Probed {
    /// A key owns the task: the key, its answer, and that answer's outcome label.
    Owner {
        key: Arc<KeyEntry>,
        answer: UpstreamAnswer,
        outcome: &'static str,
    },
    /// No key owns it, or it was probed without success moments ago.
    Nobody { rate_limited: bool },
}

impl Probed {
    /// The caller's answer for a single-id request.
    pub(super) fn into_handled(self, ctx: &Ctx, task: &TaskId) -> Handled {
        match self {
            Probed::Owner {
                key,
                answer,
                outcome,
            } => Handled::upstream(answer, outcome, &key, 1),
            Probed::Nobody { rate_limited } => {
                let text = if rate_limited {
                    format!("no key of the pool owns task {task} (asked moments ago)")
                } else {
                    format!("no key of the pool owns task {task}")
                };
                ctx.local_error(NOT_MINE[0], &text, "unknown_task")
            }
        }
    }
}

/// Asks the pool's keys who owns `task`, with the caller's own request and the `extra`
/// replacements (for a batch poll, `ids` narrowed to this one id). A `get` has no side
/// effect on a key that does not own the task; a report is recorded only by the owner.
pub(super) async fn probe(
    ctx: &Ctx,
    parsed: &ParsedRequest,
    task: &TaskId,
    extra: &[(&str, &str)],
) -> Probed {
    let now = Instant::now();
    let misses = ctx.app.probe_misses();
    if misses.held(task, now) {
        count(ctx, ProbeResult::RateLimited);
        return Probed::Nobody { rate_limited: true };
    }
    let keys: Vec<Arc<KeyEntry>> = ctx
        .snapshot
        .pool
        .keys()
        .iter()
        .take(MAX_PROBED_KEYS)
        .cloned()
        .collect();
    let attempts = join_all(keys.iter().map(|key| ctx.attempt(key, parsed, extra))).await;
    for (key, attempt) in keys.into_iter().zip(attempts) {
        // Only an answer about the task shows ownership: a result, "not ready", or a verdict
        // on the task such as unsolvable. A key that is dead or busy says nothing either way.
        // Read as a one-item answer, so that both a single poll's `ERROR_WRONG_CAPTCHA_ID`
        // and a batch poll's `{"status":1,"request":"ERROR_WRONG_CAPTCHA_ID"}` say "not mine".
        let not_mine = match &attempt.result {
            Ok(answer) => captcha::split_ids_reply(&answer.body, 1)
                .is_some_and(|items| NOT_MINE.contains(&items[0].as_str())),
            Err(_) => true,
        };
        let about_the_task = matches!(attempt.outcome, Outcome::Success | Outcome::CallerError);
        if not_mine || !about_the_task {
            continue;
        }
        let outcome = attempt.outcome.label();
        let Some(answer) = attempt.deliverable() else {
            continue;
        };
        // Pinned, not opened: a task keyrelay did not see submitted holds no thread in its
        // count (the refresh's threadsinfo counts it as the key's external load).
        ctx.app.pins().pin(task.clone(), key.id, Instant::now());
        misses.forget(task);
        count(ctx, ProbeResult::Found);
        tracing::info!(key = %key.name, task_id = %task, "unknown task found on a key and pinned");
        return Probed::Owner {
            key,
            answer,
            outcome,
        };
    }
    misses.remember(task.clone(), now);
    count(ctx, ProbeResult::NotFound);
    Probed::Nobody {
        rate_limited: false,
    }
}

fn count(ctx: &Ctx, result: ProbeResult) {
    ctx.app.metrics().count_probe(result);
}
