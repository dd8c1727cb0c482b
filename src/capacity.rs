//! Thread accounting and admission: how many of each key's threads are in use, the leases
//! that hold them, and the FIFO queue a submit waits in when every key is full.
//!
//! CaptchaAI bills per concurrent thread, and a key handed more tasks than its `threads`
//! refuses them or queues them silently (docs/captcha-api.md §4). So keyrelay counts for
//! itself: a thread is taken ([`Lease`]) before a submit goes upstream, kept by the task it
//! creates until the task's final answer, a stale timeout, or a refresh that shows the
//! upstream no longer working on it, and given back at once if no task was created.
//!
//! A `threadsinfo` read is matched against keyrelay's own count by a [`ReadMark`] taken just
//! before the read is sent, never by clock times: the service's `working` figure may include
//! any of keyrelay's tasks that was in flight at some moment of the read, so all of those are
//! subtracted before the rest is taken as outside load. No task is counted twice; outside
//! load errs low, which the service's "busy" answers and the cooldowns they cause make good,
//! where erring high would lock a key that has nothing to do.
//!
//! The counts sit behind the narrow [`LoadStore`] interface, as pins and health do, so that
//! a shared store can later let several replicas count one pool's threads together.

mod memory;
mod queue;
mod shared;

pub use memory::MemoryLoad;
pub use queue::{Refusal, Take, Waited};
pub use shared::{NoSharedThreads, SharedSeat, SharedTake, SharedThreads, Step};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::captcha::TaskId;
use crate::fast_map::FastMap;
use crate::key_id::KeyId;
use crate::task_table::Entry;
use crate::tokens::TokenHold;

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

/// What a store noted about one key just before a `threadsinfo` read was sent, for
/// [`LoadStore::reconcile`] to judge the answer by.
#[derive(Clone, Debug)]
pub struct ReadMark {
    pub(crate) key: KeyId,
    /// Submits on their way and tasks open, when marked. With the holds taken since, these
    /// are every task of keyrelay's the service can have counted while it read.
    pub(crate) in_flight: u32,
    /// The key's running count of holds ever taken, when marked.
    pub(crate) holds: u64,
    /// The tasks open when marked: created before the service was asked, so the answer
    /// counts each one that is still open and that the service still works on.
    pub(crate) open: Vec<(TaskId, Entry)>,
}

impl ReadMark {
    pub fn key(&self) -> KeyId {
        self.key
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
    /// Notes `key`'s counts for a `threadsinfo` read about to be sent; the answer goes to
    /// [`LoadStore::reconcile`] with this mark.
    fn mark(&self, key: KeyId) -> ReadMark;
    /// Aligns the marked key's counts with the upstream's `working` threads, as read by the
    /// request sent after `mark`. Tasks open at the mark and still open were surely counted
    /// if the service still works on them: beyond `working`, they are taken as done (oldest
    /// first; solved, only not polled yet). The key's `external` load becomes `working` minus
    /// every task of keyrelay's the service may have counted (in flight at the mark, or
    /// held since), at least zero. Returns how many tasks it ended.
    fn reconcile(&self, mark: ReadMark, working: u32) -> u32;
    /// Forgets `key`'s `external` load: another count of outside load (the one replicas
    /// share) takes over, and a reading taken without it would count their tasks twice.
    fn forget_external(&self, key: KeyId);
}

/// The shared side of admission: the counts, and the queue of submits waiting for a thread.
pub struct Capacity {
    store: Box<dyn LoadStore>,
    queue: queue::Queue,
    /// The caller token's thread each open task holds (when tokens are configured), given
    /// back with the key's thread at the task's final answer or stale timeout.
    token_tasks: FastMap<TaskId, (TokenHold, Instant)>,
    /// Set once a task held a token's thread: without tokens, finishing a task does not
    /// even hash its id into `token_tasks`.
    any_token_tasks: AtomicBool,
}

impl Capacity {
    pub fn new(store: Box<dyn LoadStore>) -> Capacity {
        Capacity {
            store,
            queue: queue::Queue::default(),
            token_tasks: FastMap::default(),
            any_token_tasks: AtomicBool::new(false),
        }
    }

    /// The task `task` holds one of its caller token's threads (`hold`) until it ends, as
    /// it holds its key's. A task that `reconcile` ends keeps it until its final answer is
    /// polled or it goes stale: the store does not say which tasks a read ended.
    pub fn keep_token(&self, task: TaskId, hold: TokenHold, now: Instant) {
        self.any_token_tasks.store(true, Ordering::Relaxed);
        self.token_tasks.insert(task, (hold, now));
    }

    /// Takes a thread of `key` if fewer than `limit` are in use.
    pub fn try_hold(&self, key: KeyId, limit: Option<u32>) -> Option<Lease<'_>> {
        // Lazily: a lease gives a thread back when dropped, so one built for a refused hold
        // would give back a thread someone else holds, and wake the queue for nothing.
        self.store.try_hold(key, limit).then(|| Lease {
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
        if self.any_token_tasks.load(Ordering::Relaxed) {
            // Dropped, the hold gives the token's thread back and wakes its waiters.
            self.token_tasks.remove(task);
        }
        let key = self.store.finish(task)?;
        self.queue.freed();
        Some(key)
    }

    /// Ends tasks open since before `cutoff`; one key per task ended.
    pub fn release_stale(&self, cutoff: Instant) -> Vec<KeyId> {
        if self.any_token_tasks.load(Ordering::Relaxed) {
            self.token_tasks.retain(|_, (_, opened)| *opened > cutoff);
        }
        let released = self.store.release_stale(cutoff);
        if !released.is_empty() {
            self.queue.freed();
        }
        released
    }

    /// Notes `key`'s counts just before its `threadsinfo` is asked; see [`LoadStore::mark`].
    pub fn mark(&self, key: KeyId) -> ReadMark {
        self.store.mark(key)
    }

    /// See [`LoadStore::reconcile`]. Queued submits look again if tasks gave their threads
    /// back or outside load went down.
    pub fn reconcile(&self, mark: ReadMark, working: u32) -> u32 {
        let key = mark.key;
        let external = self.store.load(key).external;
        let released = self.store.reconcile(mark, working);
        if released > 0 || self.store.load(key).external < external {
            self.queue.freed();
        }
        released
    }

    /// See [`LoadStore::forget_external`]. Queued submits look again if that was room.
    pub fn forget_external(&self, key: KeyId) {
        if self.store.load(key).external > 0 {
            self.store.forget_external(key);
            self.queue.freed();
        }
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::task::JoinHandle;

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

    #[tokio::test(start_paused = true)]
    async fn a_tasks_token_thread_is_given_back_at_its_end_or_when_stale() {
        use crate::config::{KeyConfig, TokenConfig, Upstream};
        use crate::tokens::{TokenCounters, TokenTable};
        let key = KeyConfig::new(
            "a",
            "0123456789abcdef0123456789abcdef",
            Upstream::parse("http://127.0.0.1:9").unwrap(),
        );
        let config = TokenConfig {
            name: "t".into(),
            token: crate::CallerToken::new("secret"),
            keys: None,
            tiers: None,
            max_threads: Some(2),
            max_tunnels: crate::config::DEFAULT_MAX_TUNNELS,
            budget: None,
        };
        let table = TokenTable::new(&[config], [(KeyId(0), &key)], &TokenCounters::default());
        let token = table.lookup("secret").unwrap();
        let capacity = capacity();
        let start = Instant::now();
        capacity.keep_token(TaskId::Num(1), token.try_hold().unwrap(), start);
        tokio::time::advance(Duration::from_secs(10)).await;
        capacity.keep_token(TaskId::Num(2), token.try_hold().unwrap(), Instant::now());
        assert!(token.try_hold().is_none(), "both threads held by tasks");
        // Task 1's final answer (finish counts even for a task this store did not open).
        let _ = capacity.finish(&TaskId::Num(1));
        assert_eq!(token.threads.in_use(), 1);
        // Task 2 goes stale.
        capacity.release_stale(Instant::now());
        assert_eq!(token.threads.in_use(), 0);
        assert!(token.try_hold().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_hold_changes_no_count() {
        for limit in 0..4 {
            for refused in 1..4 {
                let capacity = capacity();
                let leases: Vec<_> = (0..limit)
                    .map(|_| capacity.try_hold(KeyId(0), Some(limit)).expect("free"))
                    .collect();
                for _ in 0..refused {
                    assert!(capacity.try_hold(KeyId(0), Some(limit)).is_none());
                    assert_eq!(
                        capacity.load(KeyId(0)).pending,
                        limit,
                        "{limit} threads, {refused} refusals"
                    );
                }
                drop(leases);
                assert_eq!(capacity.load(KeyId(0)), Load::default());
            }
        }
    }

    /// A waiter on a full key, counting its looks; it gives up after `MAX_LOOKS`, so a head
    /// that looks again without being woken fails the test instead of spinning forever.
    fn waiter(capacity: &Arc<Capacity>, looks: &Arc<AtomicUsize>) -> JoinHandle<bool> {
        const MAX_LOOKS: usize = 20;
        let (capacity, looks) = (capacity.clone(), looks.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            let take = || {
                if looks.fetch_add(1, Ordering::SeqCst) >= MAX_LOOKS {
                    return Take::NoKey;
                }
                match capacity.try_hold(KeyId(0), Some(1)) {
                    Some(lease) => Take::Got(lease.key()),
                    None => Take::Full,
                }
            };
            let (waited, _) = capacity.wait_for(deadline, 10, || None, take).await;
            matches!(waited, Waited::Got(KeyId(0)))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_lowers_outside_load_wakes_a_waiting_submit() {
        let capacity = Arc::new(capacity());
        // Someone else works on the key's only thread.
        assert_eq!(capacity.reconcile(capacity.mark(KeyId(0)), 1), 0);
        let looks = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let waiting = waiter(&capacity, &looks);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(capacity.queued(), 1, "waiting");
        // Once before queueing, once at the head of the queue; refusals wake nobody.
        assert_eq!(looks.load(Ordering::SeqCst), 2, "no look without news");
        // The next read finds the other client gone; no task of keyrelay's ended.
        assert_eq!(capacity.reconcile(capacity.mark(KeyId(0)), 0), 0);
        assert!(waiting.await.unwrap(), "the waiter got the thread");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "woken by the read, not by the once-a-second recheck"
        );
    }

    #[derive(Clone, Debug)]
    enum LeaseOp {
        Hold(u32),
        Drop(proptest::sample::Index),
        Keep(proptest::sample::Index),
        Finish(proptest::sample::Index),
    }

    fn lease_op() -> impl proptest::strategy::Strategy<Value = LeaseOp> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (0_u32..4).prop_map(LeaseOp::Hold),
            1 => any::<proptest::sample::Index>().prop_map(LeaseOp::Drop),
            1 => any::<proptest::sample::Index>().prop_map(LeaseOp::Keep),
            1 => any::<proptest::sample::Index>().prop_map(LeaseOp::Finish),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 256,
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        /// Holds granted and refused, leases dropped or kept, tasks finished: the counts are
        /// always exactly the leases held and the tasks open, and a hold is granted exactly
        /// when fewer than its limit are in use.
        #[test]
        fn the_counts_are_exactly_the_leases_and_tasks_held(
            ops in proptest::collection::vec(lease_op(), 0..60),
        ) {
            let capacity = capacity();
            let mut leases = Vec::new();
            let mut tasks: Vec<TaskId> = Vec::new();
            let mut next = 0_u64;
            for op in ops {
                match op {
                    LeaseOp::Hold(limit) => {
                        let free = (leases.len() + tasks.len()) < limit as usize;
                        let lease = capacity.try_hold(KeyId(0), Some(limit));
                        proptest::prop_assert_eq!(lease.is_some(), free);
                        leases.extend(lease);
                    }
                    LeaseOp::Drop(i) if !leases.is_empty() => {
                        drop(leases.swap_remove(i.index(leases.len())));
                    }
                    LeaseOp::Keep(i) if !leases.is_empty() => {
                        let lease = leases.swap_remove(i.index(leases.len()));
                        next += 1;
                        lease.keep_for(TaskId::Num(next), Instant::now());
                        tasks.push(TaskId::Num(next));
                    }
                    LeaseOp::Finish(i) if !tasks.is_empty() => {
                        let task = tasks.swap_remove(i.index(tasks.len()));
                        proptest::prop_assert_eq!(capacity.finish(&task), Some(KeyId(0)));
                    }
                    _ => {}
                }
                let load = capacity.load(KeyId(0));
                proptest::prop_assert_eq!(
                    (load.pending as usize, load.open as usize, load.external),
                    (leases.len(), tasks.len(), 0)
                );
            }
        }
    }
}
