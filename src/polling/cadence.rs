//! Each open task's turn: when its next upstream poll may go, when a caller last asked about
//! it, and whether this process created it (and so polls it itself once its caller is gone).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::captcha::TaskId;
use crate::fast_map::FastMap;
use crate::provider::Provider;

/// Where and when a task of this process's began: for its solve time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub submitted: Instant,
    pub provider: Provider,
    /// The `in.php` method, lowercase; shared by every task of the method.
    pub method: Arc<str>,
}

#[derive(Clone, Debug)]
struct Turn {
    /// No upstream poll before this.
    next: Instant,
    /// The submit, or the last poll of a caller.
    seen: Instant,
    /// Created by a submit of this process (not only polled here), and where: this
    /// process polls it once its caller is gone. In a cluster, each task is so one
    /// replica's alone.
    origin: Option<Origin>,
}

/// Turns by task. Sharded: every poll of a task reads and writes its turn.
#[derive(Default)]
pub struct Cadence {
    turns: FastMap<TaskId, Turn>,
}

impl Cadence {
    /// A task this process created: its first upstream poll may go at `first`.
    pub fn open(&self, task: &TaskId, origin: Origin, first: Instant) {
        self.turns.insert(
            task.clone(),
            Turn {
                next: first,
                seen: origin.submitted,
                origin: Some(origin),
            },
        );
    }

    /// Whether a caller's poll at `now` may go upstream; if so, the next may go `interval`
    /// later. A task without a turn (created before a restart, or by another replica) goes
    /// upstream now, and is shaped from then on.
    pub fn take_turn(&self, task: &TaskId, interval: Duration, now: Instant) -> bool {
        if let Some(mut turn) = self.turns.get_mut(task) {
            turn.seen = now;
            if now < turn.next {
                return false;
            }
            turn.next = now + interval;
            return true;
        }
        self.turns.insert(
            task.clone(),
            Turn {
                next: now + interval,
                seen: now,
                origin: None,
            },
        );
        true
    }

    /// A caller polled `task` at `now`, relayed whatever its turn: only that it is not
    /// abandoned is noted.
    pub fn seen(&self, task: &TaskId, now: Instant) {
        if let Some(mut turn) = self.turns.get_mut(task) {
            turn.seen = now;
        }
    }

    /// Tasks this process created whose callers have not asked about them for `after`,
    /// and whose turn has come: the `limit` whose turns came first.
    pub fn orphans(&self, after: Duration, now: Instant, limit: usize) -> Vec<TaskId> {
        if limit == 0 {
            return Vec::new();
        }
        let mut due: Vec<(Instant, TaskId)> = self
            .turns
            .iter()
            .filter(|entry| {
                let turn = entry.value();
                turn.origin.is_some()
                    && now >= turn.next
                    && now.saturating_duration_since(turn.seen) >= after
            })
            .map(|entry| (entry.value().next, entry.key().clone()))
            .collect();
        if due.len() > limit {
            due.select_nth_unstable_by_key(limit - 1, |(next, _)| *next);
            due.truncate(limit);
        }
        due.sort_unstable_by_key(|(next, _)| *next);
        due.into_iter().map(|(_, task)| task).collect()
    }

    /// keyrelay itself polls `task` now: the next upstream poll waits `interval`, and its
    /// caller still counts as gone.
    pub fn polled_for_orphan(&self, task: &TaskId, interval: Duration, now: Instant) {
        if let Some(mut turn) = self.turns.get_mut(task) {
            turn.next = now + interval;
        }
    }

    /// The task has its final answer: where it began, if this process created it.
    pub fn close(&self, task: &TaskId) -> Option<Origin> {
        self.turns.remove(task).and_then(|(_, turn)| turn.origin)
    }

    /// Forgets tasks nobody asked about for `after`.
    pub fn sweep(&self, after: Duration, now: Instant) {
        self.turns
            .retain(|_, turn| now.saturating_duration_since(turn.seen) < after);
    }

    pub fn len(&self) -> usize {
        self.turns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }
}
