//! In-process thread accounting: per-key counts, the open tasks behind them, and the
//! running count of holds that lets a `threadsinfo` answer be matched to what keyrelay had in
//! flight while it was read.

use tokio::time::Instant;

use super::{Load, LoadStore, ReadMark};
use crate::captcha::TaskId;
use crate::fast_map::FastMap;
use crate::key_id::KeyId;
use crate::task_table::{Clock, Entry, TaskMap};

/// Threads in use per key, counted in memory.
///
/// A `tasks` shard is released before a `keys` shard is taken, so no two locks are ever
/// waited on in opposite orders.
#[derive(Default)]
pub struct MemoryLoad {
    /// The counts per key; admission checks and bumps them under the key's shard lock, so
    /// two submits racing for a key's last thread cannot both win.
    keys: FastMap<KeyId, Ledger>,
    /// Open tasks: accepted, no final answer yet; with their key and open time in whole
    /// seconds, 8 bytes a task. Every unpolled task stays here until `stale_after`, so
    /// there is no second, ordered copy: the stale release and the reconciliation scan the
    /// map instead, which at the usual few hundred open tasks costs nothing.
    tasks: TaskMap,
    clock: Clock,
}

/// One key's counts, and every hold it ever had: a read's mark keeps the total, so the
/// answer knows how many submits began while it was under way, whatever the clock said.
#[derive(Default)]
struct Ledger {
    load: Load,
    holds: u64,
}

impl MemoryLoad {
    pub fn new() -> MemoryLoad {
        MemoryLoad::default()
    }

    fn change(&self, key: KeyId, change: impl FnOnce(&mut Load)) {
        change(&mut self.keys.entry(key).or_default().load);
    }

    fn closed(&self, key: KeyId) {
        self.change(key, |load| load.open = load.open.saturating_sub(1));
    }
}

impl LoadStore for MemoryLoad {
    fn try_hold(&self, key: KeyId, limit: Option<u32>) -> bool {
        let mut ledger = self.keys.entry(key).or_default();
        if limit.is_some_and(|limit| ledger.load.in_use() >= limit) {
            return false;
        }
        ledger.load.pending = ledger.load.pending.saturating_add(1);
        ledger.holds = ledger.holds.wrapping_add(1);
        true
    }

    fn unhold(&self, key: KeyId) {
        self.change(key, |load| load.pending = load.pending.saturating_sub(1));
    }

    fn open(&self, key: KeyId, task: TaskId, now: Instant) {
        let at = self.clock.stamp(now);
        // An id the upstream handed out twice is one task: the older count goes.
        if let Some(old) = self.tasks.insert(&task, Entry { key, at, owner: 0 }) {
            self.closed(old.key);
        }
        self.change(key, |load| {
            load.pending = load.pending.saturating_sub(1);
            load.open = load.open.saturating_add(1);
        });
    }

    fn finish(&self, task: &TaskId) -> Option<KeyId> {
        let opened = self.tasks.remove(task)?;
        self.closed(opened.key);
        Some(opened.key)
    }

    fn load(&self, key: KeyId) -> Load {
        self.keys.get(&key).map(|l| l.load).unwrap_or_default()
    }

    fn release_stale(&self, cutoff: Instant) -> Vec<KeyId> {
        // Opened at or before the cut-off, by a stamp rounded up: never released early.
        let cutoff = self.clock.floor(cutoff);
        let mut stale = self.tasks.take_where(|opened| opened.at <= cutoff);
        stale.sort_by_key(|(_, opened)| opened.at);
        stale
            .into_iter()
            .map(|(_, opened)| {
                self.closed(opened.key);
                opened.key
            })
            .collect()
    }

    fn mark(&self, key: KeyId) -> ReadMark {
        // The scan and the counts need not be one instant: both come before the request is
        // sent, and every task in flight at any later moment is either counted here or a
        // hold taken after this.
        let open = self.tasks.select(|opened| opened.key == key);
        let (in_flight, holds) = self.keys.get(&key).map_or((0, 0), |ledger| {
            let load = ledger.load;
            (load.pending.saturating_add(load.open), ledger.holds)
        });
        ReadMark {
            key,
            in_flight,
            holds,
            open,
        }
    }

    fn reconcile(&self, mark: ReadMark, working: u32) -> u32 {
        let ReadMark {
            key,
            in_flight,
            holds,
            open,
        } = mark;
        // Open before the service was asked and not ended since (the same entry: not ended
        // and opened again): the answer counts each of these it still works on.
        let mut surely_counted: Vec<_> = open
            .into_iter()
            .filter(|(task, seen)| self.tasks.get(task) == Some(*seen))
            .collect();
        // More of them than the service works on: the oldest are done, only nobody has
        // polled them.
        let excess = surely_counted.len().saturating_sub(working as usize);
        if excess > 0 {
            surely_counted.sort_by_key(|(_, opened)| opened.at);
        }
        let released = surely_counted
            .iter()
            .take(excess)
            // Unless it finished or was opened again since the check.
            .filter(|(task, seen)| self.tasks.remove_if(task, |now| now == seen).is_some())
            .count();
        let released = u32::try_from(released).unwrap_or(u32::MAX);
        let mut ledger = self.keys.entry(key).or_default();
        ledger.load.open = ledger.load.open.saturating_sub(released);
        // Every task of keyrelay's the service may have been counting at the moment it read:
        // those in flight at the mark (some may have ended since) and those held since.
        // Only working threads beyond all of them are surely someone else's.
        let ours = u64::from(in_flight).saturating_add(ledger.holds.wrapping_sub(holds));
        let outside = u64::from(working).saturating_sub(ours);
        ledger.load.external = u32::try_from(outside).unwrap_or(u32::MAX);
        released
    }

    fn forget_external(&self, key: KeyId) {
        if let Some(mut ledger) = self.keys.get_mut(&key) {
            ledger.load.external = 0;
        }
    }
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const A: KeyId = KeyId(0);
    const B: KeyId = KeyId(1);

    fn id(n: u64) -> TaskId {
        TaskId::Num(n)
    }

    /// A submit that took a thread and was accepted as `task` at `at`.
    fn submit(store: &MemoryLoad, key: KeyId, task: TaskId, at: Instant) {
        assert!(
            store.try_hold(key, None),
            "an unlimited key always has a thread"
        );
        store.open(key, task, at);
    }

    fn load(pending: u32, open: u32, external: u32) -> Load {
        Load {
            pending,
            open,
            external,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn holds_stop_at_the_limit_and_open_tasks_count_against_it() {
        let store = MemoryLoad::new();
        assert!(store.try_hold(A, Some(2)));
        assert!(store.try_hold(A, Some(2)));
        assert!(!store.try_hold(A, Some(2)), "two of two in use");
        assert!(store.try_hold(B, Some(2)), "other keys are not affected");
        store.open(A, id(1), Instant::now());
        assert_eq!(store.load(A), load(1, 1, 0));
        assert!(
            !store.try_hold(A, Some(2)),
            "the open task still holds its thread"
        );
        store.unhold(A);
        assert!(store.try_hold(A, Some(2)));
        assert!(store.try_hold(A, None), "no limit, no refusal");
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_finishes_once() {
        let store = MemoryLoad::new();
        submit(&store, A, id(1), Instant::now());
        assert_eq!(store.finish(&id(1)), Some(A));
        assert_eq!(store.finish(&id(1)), None, "a second final answer");
        assert_eq!(store.finish(&id(9)), None, "never opened");
        assert_eq!(store.load(A), Load::default());
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_opened_again_moves_to_its_new_key() {
        let store = MemoryLoad::new();
        submit(&store, A, id(1), Instant::now());
        submit(&store, B, id(1), Instant::now());
        assert_eq!((store.load(A).open, store.load(B).open), (0, 1));
        assert_eq!(store.finish(&id(1)), Some(B));
    }

    #[tokio::test(start_paused = true)]
    async fn stale_tasks_are_released_oldest_first_and_finished_ones_skipped() {
        let store = MemoryLoad::new();
        let t0 = Instant::now();
        for n in 1..=3 {
            submit(&store, A, id(n), t0);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        submit(&store, B, id(4), Instant::now());
        store.finish(&id(2));
        assert_eq!(store.release_stale(t0), vec![A, A]);
        assert_eq!(store.load(A), Load::default());
        assert_eq!(store.load(B).open, 1, "younger than the cutoff");
        assert_eq!(
            store.finish(&id(1)),
            None,
            "released tasks do not finish twice"
        );
        assert_eq!(store.release_stale(Instant::now()), vec![B]);
        assert!(store.tasks.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn reconcile_releases_the_oldest_tasks_the_upstream_no_longer_works_on() {
        let store = MemoryLoad::new();
        for n in 1..=4 {
            submit(&store, A, id(n), Instant::now());
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let mark = store.mark(A);
        // Opened while the read was under way: not released, and not outside load either.
        submit(&store, A, id(5), Instant::now());
        assert_eq!(store.reconcile(mark, 1), 3);
        assert_eq!(store.load(A), load(0, 2, 0));
        assert_eq!(store.finish(&id(1)), None, "the oldest went first");
        assert_eq!(store.finish(&id(4)), Some(A));
    }

    #[tokio::test(start_paused = true)]
    async fn finished_and_repeated_tasks_leave_nothing_behind() {
        let store = MemoryLoad::new();
        // One long-running task, then many that finish at once, and one id handed out
        // again and again (a stub upstream does that).
        submit(&store, A, id(0), Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        for n in 1..=10_000 {
            submit(&store, A, id(n), Instant::now());
            store.finish(&id(n));
            submit(&store, B, id(99_999), Instant::now());
        }
        assert_eq!(store.tasks.len(), 2);
        assert_eq!(store.load(A).open, 1);
        assert_eq!(store.load(B).open, 1);
        // The long-running task is still found by age, and released first.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(store.release_stale(Instant::now()), vec![A, B]);
        assert_eq!(
            (store.load(A), store.load(B)),
            (Load::default(), Load::default())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn text_ids_are_released_and_reconciled_like_numeric_ones() {
        let store = MemoryLoad::new();
        let text = |s: &str| TaskId::Text(s.into());
        submit(&store, A, text("t-1"), Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        submit(&store, A, id(2), Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        submit(&store, A, text("t-3"), Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        // The upstream works on one: the two oldest, of both kinds, are done.
        assert_eq!(store.reconcile(store.mark(A), 1), 2);
        assert_eq!(store.finish(&text("t-1")), None);
        assert_eq!(store.finish(&id(2)), None);
        assert_eq!(store.finish(&text("t-3")), Some(A));
        assert_eq!(store.load(A), load(0, 0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn reconcile_counts_threads_used_by_others_as_external() {
        let store = MemoryLoad::new();
        submit(&store, A, id(1), Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(store.reconcile(store.mark(A), 4), 0);
        assert_eq!(store.load(A), load(0, 1, 3));
        assert!(
            !store.try_hold(A, Some(4)),
            "others' threads count against the limit"
        );
        // The next read replaces the estimate.
        assert_eq!(store.reconcile(store.mark(A), 1), 0);
        assert_eq!(store.load(A).external, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn forgetting_outside_load_keeps_the_tasks_and_frees_the_threads() {
        let store = MemoryLoad::new();
        submit(&store, A, id(1), Instant::now());
        assert_eq!(store.reconcile(store.mark(A), 4), 0);
        assert_eq!(store.load(A), load(0, 1, 3));
        store.forget_external(A);
        assert_eq!(store.load(A), load(0, 1, 0), "only the outside load goes");
        assert!(store.try_hold(A, Some(2)));
        // A key never read has nothing to forget, and gains no entry.
        store.forget_external(B);
        assert_eq!(store.load(B), load(0, 0, 0));
    }

    // The rule behind the next tests: the service's `working` can include any task of
    // keyrelay's that was in flight at some moment of the read, so none of those is outside
    // load, whatever second it was opened in.

    #[tokio::test(start_paused = true)]
    async fn tasks_opened_in_the_second_of_the_read_are_not_outside_load() {
        // Issue 11: three tasks, a read at once, the three polled to the end.
        let store = MemoryLoad::new();
        for n in 1..=3 {
            submit(&store, A, id(n), Instant::now());
        }
        let mark = store.mark(A);
        assert_eq!(store.reconcile(mark, 3), 0);
        assert_eq!(store.load(A), load(0, 3, 0));
        for n in 1..=3 {
            assert_eq!(store.finish(&id(n)), Some(A));
        }
        assert_eq!(store.load(A), Load::default(), "idle, so not full");
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ends_while_the_read_is_under_way_is_not_outside_load() {
        let store = MemoryLoad::new();
        submit(&store, A, id(1), Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        let mark = store.mark(A);
        // Solved and polled after the service counted it, before its answer came back.
        assert_eq!(store.finish(&id(1)), Some(A));
        assert_eq!(store.reconcile(mark, 1), 0);
        assert_eq!(store.load(A), Load::default());
    }

    #[tokio::test(start_paused = true)]
    async fn submits_on_their_way_during_the_read_are_not_outside_load() {
        let store = MemoryLoad::new();
        // Held before the read and accepted after it: the service may have counted it.
        assert!(store.try_hold(A, None));
        let mark = store.mark(A);
        // Held and accepted while the read was under way, then one more still on its way.
        submit(&store, A, id(2), Instant::now());
        assert!(store.try_hold(A, None));
        store.open(A, id(1), Instant::now());
        assert_eq!(store.reconcile(mark, 3), 0);
        assert_eq!(store.load(A), load(1, 2, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_opened_during_the_read_is_never_taken_as_done_by_it() {
        let store = MemoryLoad::new();
        let mark = store.mark(A);
        submit(&store, A, id(1), Instant::now());
        // The service had not seen it yet: its zero says nothing about this task.
        assert_eq!(store.reconcile(mark, 0), 0);
        assert_eq!(store.load(A), load(0, 1, 0));
        assert_eq!(store.finish(&id(1)), Some(A));
    }

    #[tokio::test(start_paused = true)]
    async fn outside_load_is_what_is_left_beyond_everything_of_ours_in_flight() {
        let store = MemoryLoad::new();
        submit(&store, A, id(1), Instant::now());
        submit(&store, A, id(2), Instant::now());
        assert!(store.try_hold(A, None));
        // Another key's tasks are not this key's.
        submit(&store, B, id(3), Instant::now());
        let mark = store.mark(A);
        assert_eq!(store.reconcile(mark, 5), 0);
        assert_eq!(store.load(A), load(1, 2, 2));
        assert_eq!(store.load(B), load(0, 1, 0));
        // Nothing of ours in flight: the whole figure is someone else's.
        let mark = store.mark(B);
        store.finish(&id(3));
        let idle = store.mark(B);
        assert_eq!(store.reconcile(idle, 4), 0);
        assert_eq!(store.load(B).external, 4);
        // An older read answered late still counts the task it saw as ours.
        assert_eq!(store.reconcile(mark, 4), 0);
        assert_eq!(store.load(B).external, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_of_zero_working_leaves_an_idle_key_with_no_load() {
        let store = MemoryLoad::new();
        for n in 1..=4 {
            submit(&store, A, id(n), Instant::now());
        }
        assert_eq!(store.reconcile(store.mark(A), 6), 0);
        assert_eq!(store.load(A).external, 2);
        // All four solved, none polled, the other client gone: the service says 0.
        assert_eq!(store.reconcile(store.mark(A), 0), 4);
        assert_eq!(store.load(A), Load::default());
        assert!(store.tasks.is_empty());
    }
}
