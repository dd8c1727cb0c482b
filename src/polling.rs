//! Shaped polling: whether a caller's poll of a task goes upstream now, is answered "not
//! ready" locally, or is answered with the task's kept final answer. One place decides it
//! for `res.php`, `ids=` batches and the JSON front alike.
//!
//! The services advise a poll every 5 seconds, and 2captcha blocks accounts that poll far
//! more than that; scripts poll as often as their authors wrote. Per task, keyrelay sends
//! at most one upstream poll per `[polling] interval` and none before the `first` delay;
//! a caller's poll between them is answered locally. A final answer is kept
//! (`keep_answers`), so a repeated poll never goes upstream again. The same turns tell
//! which of this process's tasks their callers left (`orphan_after`), for keyrelay to poll
//! itself.

mod cadence;
mod kept;
mod pace;
mod shared;

pub use cadence::{Cadence, Origin};
pub use kept::{Kept, KeptAnswers, MemoryKept, Verdict};
pub use pace::Pace;
pub use shared::{decode, encode, NoSharedPolls, SharedPolls, SharedTurn, TurnFuture};

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::captcha::TaskId;
use crate::config::{FirstPoll, Polling, DEFAULT_POLL_INTERVAL};
use crate::fast_map::FastMap;
use crate::provider::Provider;

/// What a caller's poll of one task gets.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Ask the service now.
    Upstream,
    /// Too soon after the submit or the last upstream poll: not ready, answered locally.
    NotYet,
    /// The task's final answer, kept.
    Kept(Arc<Kept>),
}

/// The shaper's state: each open task's cadence, and the final answers kept. The rules'
/// settings come with each call, from the request's snapshot, so a reload applies at once.
pub struct PollShaper {
    cadence: Cadence,
    kept: Box<dyn KeptAnswers>,
    /// Method names seen, shared by the tasks of each.
    methods: FastMap<Box<str>, Arc<str>>,
}

/// Method names shared at most: far more than the services define.
const MAX_METHODS: usize = 256;

impl PollShaper {
    pub fn new(kept: Box<dyn KeptAnswers>) -> PollShaper {
        PollShaper {
            cadence: Cadence::default(),
            kept,
            methods: FastMap::default(),
        }
    }

    /// The service accepted `task` at `provider`, a task of `method`, at `now`: no upstream
    /// poll before the `first` delay, `advised` being the provider's advice for the method
    /// (`first = "auto"`).
    pub fn opened(
        &self,
        settings: &Polling,
        task: &TaskId,
        (provider, method): (Provider, &str),
        advised: Duration,
        now: Instant,
    ) {
        let first = match settings.first {
            _ if !settings.shapes() => Duration::ZERO,
            FirstPoll::Auto => advised,
            FirstPoll::After(delay) => delay,
        };
        let origin = Origin {
            submitted: now,
            provider,
            method: self.method_name(method),
        };
        self.cadence.open(task, origin, now + first);
    }

    /// `method`, lowercase, shared by every task of it. Methods are the caller's words, so
    /// only `MAX_METHODS` are shared; others get a name of their own.
    fn method_name(&self, method: &str) -> Arc<str> {
        let method = method.trim();
        if let Some(name) = self.methods.get(method) {
            return name.clone();
        }
        let name: Arc<str> = Arc::from(method.to_ascii_lowercase());
        if self.methods.len() < MAX_METHODS {
            self.methods.insert(method.into(), name.clone());
        }
        name
    }

    /// A caller polls `task`, whose owner the caller is. An upstream poll is counted as sent
    /// from `now`: of two callers polling at once, one goes upstream.
    pub fn gate(&self, settings: &Polling, task: &TaskId, now: Instant) -> Gate {
        if !settings.shapes() {
            self.cadence.seen(task, now);
            return Gate::Upstream;
        }
        if let Some(kept) = self.kept.get(task, settings.keep_answers, now) {
            return Gate::Kept(kept);
        }
        if self.cadence.take_turn(task, settings.interval, now) {
            Gate::Upstream
        } else {
            Gate::NotYet
        }
    }

    /// An upstream poll of `task` got its final answer (here, or on another replica that
    /// shared it): no more upstream polls of it, and the answer is kept for repeated polls.
    /// Where the task began, if this process created it.
    pub fn finished(
        &self,
        settings: &Polling,
        task: &TaskId,
        answer: Kept,
        now: Instant,
    ) -> Option<Origin> {
        let origin = self.cadence.close(task);
        if settings.shapes() {
            let answer = Arc::new(answer);
            (self.kept).keep(task.clone(), answer, settings.keep_answers_max, now);
        }
        origin
    }

    /// Up to `limit` tasks this process created that nobody has polled for
    /// `orphan_after`, and whose turn has come, the longest waiting first.
    pub fn orphans_due(&self, settings: &Polling, now: Instant, limit: usize) -> Vec<TaskId> {
        self.cadence.orphans(settings.orphan_after, now, limit)
    }

    /// keyrelay polls the orphan `task` now: its next poll waits a turn, as a caller's would
    /// (5 s where shaping is off).
    pub fn orphan_polled(&self, settings: &Polling, task: &TaskId, now: Instant) {
        let interval = if settings.shapes() {
            settings.interval
        } else {
            DEFAULT_POLL_INTERVAL
        };
        self.cadence.polled_for_orphan(task, interval, now);
    }

    /// Stops following `task`: it ended with no answer to keep, or nobody can poll it any
    /// more (its pin is gone).
    pub fn forget(&self, task: &TaskId) -> Option<Origin> {
        self.cadence.close(task)
    }

    /// Drops kept answers past `keep_answers`, and the cadence of tasks nobody has asked
    /// about for `forget_after` (their caller and keyrelay both gave up on them).
    pub fn sweep(&self, settings: &Polling, forget_after: Duration, now: Instant) {
        self.kept.sweep(settings.keep_answers, now);
        self.cadence.sweep(forget_after, now);
    }

    /// Tasks with a cadence, and final answers kept.
    pub fn counts(&self) -> (usize, usize) {
        (self.cadence.len(), self.kept.len())
    }
}

impl Default for PollShaper {
    fn default() -> PollShaper {
        PollShaper::new(Box::new(MemoryKept::default()))
    }
}

#[cfg(test)]
mod tests;
