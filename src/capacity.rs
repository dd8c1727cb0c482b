//! Thread accounting and admission: how many of each key's threads are in use, the leases
//! that hold them, and the FIFO queue a submit waits in when every key is full.
//!
//! CaptchaAI bills per concurrent thread, and a key handed more tasks than its `threads`
//! refuses them or queues them silently (docs/captcha-api.md §4). So keyrelay counts for
//! itself: a thread is taken ([`Lease`]) before a submit goes upstream, kept by the task it
//! creates until the task's final answer, a stale timeout, or a refresh that shows the
//! upstream no longer working on it, and given back at once if no task was created.
//!
//! The counts sit behind the narrow [`LoadStore`] interface, as pins and health do, so that
//! a shared store can later let several replicas count one pool's threads together.

mod memory;
mod queue;

pub use memory::MemoryLoad;
pub use queue::{Refusal, Take, Waited};

use std::time::Duration;

use tokio::time::Instant;

use crate::health::KeyId;
use crate::pins::TaskId;

/// One key's threads in use, as keyrelay counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Submits and `solve.php` requests on their way upstream.
    pub pending: u32,
    /// Tasks accepted through keyrelay and without a final answer yet.
    pub open: u32,
    /// Threads the upstream reported working beyond keyrelay's own tasks at the last
    /// refresh: other clients of the same key, or tasks from before a restart.
    pub external: u32,
}

impl Load {
    /// Every thread counted against the key's capacity.
    pub fn in_use(&self) -> u32 {
        self.pending
            .saturating_add(self.open)
            .saturating_add(self.external)
    }
}

/// The narrow interface to per-key thread counts.
pub trait LoadStore: Send + Sync + 'static {
    /// Takes one of `key`'s threads if fewer than `limit` are in use (always, without a
    /// limit). The check and the increment are one atomic step.
    fn try_hold(&self, key: KeyId, limit: Option<u32>) -> bool;
    /// Gives back a thread taken by `try_hold` whose request created no task.
    fn unhold(&self, key: KeyId);
    /// Turns a thread taken by `try_hold` into the open task `task`.
    fn open(&self, key: KeyId, task: TaskId, now: Instant);
    /// Ends an open task at its final answer. Returns its key the first time only, so
    /// repeated polls of a solved task give its thread back once.
    fn finish(&self, task: &TaskId) -> Option<KeyId>;
    /// The key's counts now.
    fn load(&self, key: KeyId) -> Load;
    /// Ends the open tasks opened at or before `cutoff`; one key per task ended.
    fn release_stale(&self, cutoff: Instant) -> Vec<KeyId>;
    /// Aligns `key`'s counts with the upstream's `working` threads, read by a request sent
    /// at `asked`: keyrelay's tasks opened before then beyond `working` are taken as done
    /// (oldest first; they are solved, only not polled yet), and working threads beyond
    /// keyrelay's tasks become the key's `external` load. Returns how many tasks it ended.
    fn reconcile(&self, key: KeyId, working: u32, asked: Instant) -> u32;
}

/// The shared side of admission: the counts, and the queue of submits waiting for a thread.
pub struct Capacity {
    store: Box<dyn LoadStore>,
    queue: queue::Queue,
}

impl Capacity {
    pub fn new(store: Box<dyn LoadStore>) -> Capacity {
        Capacity {
            store,
            queue: queue::Queue::default(),
        }
    }

    /// Takes a thread of `key` if fewer than `limit` are in use.
    pub fn try_hold(&self, key: KeyId, limit: Option<u32>) -> Option<Lease<'_>> {
        self.store.try_hold(key, limit).then_some(Lease {
            capacity: self,
            key,
            kept: false,
        })
    }

    pub fn load(&self, key: KeyId) -> Load {
        self.store.load(key)
    }

    /// Ends a task at its final answer; its key the first time only.
    pub fn finish(&self, task: &TaskId) -> Option<KeyId> {
        let key = self.store.finish(task)?;
        self.queue.freed();
        Some(key)
    }

    /// Ends tasks open since before `cutoff`; one key per task ended.
    pub fn release_stale(&self, cutoff: Instant) -> Vec<KeyId> {
        let released = self.store.release_stale(cutoff);
        if !released.is_empty() {
            self.queue.freed();
        }
        released
    }

    /// See [`LoadStore::reconcile`]. Queued submits look again if tasks gave their threads
    /// back.
    pub fn reconcile(&self, key: KeyId, working: u32, asked: Instant) -> u32 {
        let released = self.store.reconcile(key, working, asked);
        if released > 0 {
            self.queue.freed();
        }
        released
    }

    /// Wakes the queue's head to look again: call when keys may have gained room that no
    /// thread release announced (a reload, new capacity figures).
    pub fn nudge(&self) {
        self.queue.freed();
    }

    /// Submits waiting for a thread now.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether a submit was refused for want of a thread within the last `window`.
    pub fn refused_within(&self, window: Duration, now: Instant) -> bool {
        self.queue.refused_within(window, now)
    }

    /// Finds a thread with `take`, waiting in FIFO order until `deadline` while every key is
    /// full. `take` is tried at once when nobody waits (waiting submits are not overtaken),
    /// then each time a thread is given back, and at the latest at `recheck()` or every
    /// second, for room that comes back by the clock (a cooldown ending). The wait is
    /// refused when it is off (`max_queued == 0` or a past `deadline`), when `max_queued`
    /// submits already wait, or when the deadline passes. Also returns how long the submit
    /// was queued, `None` if it was served (or refused) without queueing.
    pub async fn wait_for<T>(
        &self,
        deadline: Instant,
        max_queued: usize,
        recheck: impl Fn() -> Option<Instant>,
        take: impl FnMut() -> Take<T>,
    ) -> (Waited<T>, Option<Duration>) {
        self.queue.wait(deadline, max_queued, recheck, take).await
    }
}

/// One thread of one key, taken for a request on its way upstream. Dropped, it gives the
/// thread back (the request created no task, or was cancelled); [`Lease::keep_for`] hands
/// it to the task the request created instead.
#[must_use = "a lease gives its thread back when dropped"]
pub struct Lease<'a> {
    capacity: &'a Capacity,
    key: KeyId,
    kept: bool,
}

impl Lease<'_> {
    pub fn key(&self) -> KeyId {
        self.key
    }

    /// The request created `task`: the thread stays taken until the task ends.
    pub fn keep_for(mut self, task: TaskId, now: Instant) {
        self.capacity.store.open(self.key, task, now);
        self.kept = true;
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.capacity.store.unhold(self.key);
            self.capacity.queue.freed();
        }
    }
}

impl std::fmt::Debug for Lease<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("key", &self.key).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity() -> Capacity {
        Capacity::new(Box::new(MemoryLoad::new()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_lease_gives_its_thread_back_and_a_kept_one_does_not() {
        let capacity = capacity();
        let lease = capacity.try_hold(KeyId(0), Some(1)).expect("a free thread");
        assert!(capacity.try_hold(KeyId(0), Some(1)).is_none());
        drop(lease);
        let lease = capacity.try_hold(KeyId(0), Some(1)).expect("given back");
        lease.keep_for(TaskId::Num(7), Instant::now());
        assert_eq!(capacity.load(KeyId(0)).open, 1);
        assert!(capacity.try_hold(KeyId(0), Some(1)).is_none());
        assert_eq!(capacity.finish(&TaskId::Num(7)), Some(KeyId(0)));
        assert!(capacity.try_hold(KeyId(0), Some(1)).is_some());
    }
}
