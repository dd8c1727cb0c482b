//! The owner probe's memory of ids no key owns: bounded in bytes, and every entry gone once its
//! hold has passed. Knows task ids and time; not keys, HTTP or the probe itself.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::time::{Duration, Instant};

use crate::captcha::TaskId;

/// What one remembered id costs besides its text: the map entry (id, time, hash control
/// byte, load-factor slack) and the queue entry. An estimate on the high side, so the
/// bound holds.
const ENTRY_BYTES: usize =
    2 * (std::mem::size_of::<TaskId>() + std::mem::size_of::<Instant>()) + 16;

/// Ids remembered for `hold` after a probe found no owner, within `max_bytes`.
pub struct ProbeMisses {
    hold: Duration,
    max_bytes: usize,
    /// A std `Mutex`: held for a lookup or an insert and the expired entries before it,
    /// never across an await. One lock is enough: only ids without a pin come here.
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Each id and when its hold ends.
    until: HashMap<TaskId, Instant>,
    /// The same ids in the order remembered, which is the order their holds end (the hold
    /// is the same for all). An id remembered twice is queued twice; the older entry is
    /// skipped when it comes up, as the map holds the newer time.
    queue: VecDeque<(TaskId, Instant)>,
    /// What the queued entries cost, by [`cost`].
    bytes: usize,
}

fn cost(task: &TaskId) -> usize {
    match task {
        TaskId::Num(_) => ENTRY_BYTES,
        // The text is kept once, in the map's key, and once in the queue's copy.
        TaskId::Text(text) => ENTRY_BYTES + 2 * text.len(),
    }
}

impl ProbeMisses {
    pub(crate) fn new(hold: Duration, max_bytes: usize) -> ProbeMisses {
        ProbeMisses {
            hold,
            max_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Whether `task` was found nobody's less than `hold` ago.
    pub(crate) fn held(&self, task: &TaskId, now: Instant) -> bool {
        let mut inner = self.lock();
        inner.expire(now);
        inner.until.get(task).is_some_and(|until| *until > now)
    }

    /// Remembers that no key owns `task`, dropping the oldest entries if the bound needs it.
    pub(crate) fn remember(&self, task: TaskId, now: Instant) {
        let until = now + self.hold;
        let cost = cost(&task);
        let mut inner = self.lock();
        inner.expire(now);
        if cost > self.max_bytes {
            return;
        }
        while inner.bytes + cost > self.max_bytes && inner.pop_oldest() {}
        inner.until.insert(task.clone(), until);
        inner.queue.push_back((task, until));
        inner.bytes += cost;
    }

    /// Forgets `task`: a key has claimed it since.
    pub(crate) fn forget(&self, task: &TaskId) {
        self.lock().until.remove(task);
    }

    /// Drops every entry whose hold has ended; returns how many ids are left.
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        let mut inner = self.lock();
        inner.expire(now);
        inner.until.len()
    }

    /// What the entries held now cost, by the same measure as the bound.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("probe miss lock poisoned")
    }
}

impl Inner {
    fn expire(&mut self, now: Instant) {
        let before = self.queue.len();
        while self.queue.front().is_some_and(|(_, until)| *until <= now) {
            self.pop_oldest();
        }
        // After a burst, give the memory back rather than keep the high-water mark.
        if self.queue.len() < before && self.queue.len() < self.queue.capacity() / 4 {
            self.queue.shrink_to(self.queue.len() * 2);
            self.until.shrink_to(self.until.len() * 2);
        }
    }

    /// Drops the oldest queued entry, and its id unless it was remembered again since.
    fn pop_oldest(&mut self) -> bool {
        let Some((task, until)) = self.queue.pop_front() else {
            return false;
        };
        self.bytes -= cost(&task);
        if self.until.get(&task) == Some(&until) {
            self.until.remove(&task);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOLD: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn an_id_is_held_for_the_hold_and_then_gone_without_other_traffic() {
        let misses = ProbeMisses::new(HOLD, 1 << 20);
        let start = Instant::now();
        misses.remember(TaskId::Num(7), start);
        misses.remember(TaskId::Text("abc".into()), start);
        tokio::time::advance(HOLD - Duration::from_millis(1)).await;
        assert!(misses.held(&TaskId::Num(7), Instant::now()));
        assert!(!misses.held(&TaskId::Num(8), Instant::now()));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!misses.held(&TaskId::Num(7), Instant::now()));
        // Expired entries are dropped, not only hidden: nothing is left, and no bytes.
        assert_eq!(misses.sweep(Instant::now()), 0);
        assert_eq!(misses.bytes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn remembering_again_extends_the_hold_and_the_stale_entry_does_not_cut_it() {
        let misses = ProbeMisses::new(HOLD, 1 << 20);
        misses.remember(TaskId::Num(7), Instant::now());
        tokio::time::advance(HOLD / 2).await;
        misses.remember(TaskId::Num(7), Instant::now());
        tokio::time::advance(HOLD / 2).await;
        assert!(
            misses.held(&TaskId::Num(7), Instant::now()),
            "the newer hold"
        );
        tokio::time::advance(HOLD / 2).await;
        assert!(!misses.held(&TaskId::Num(7), Instant::now()));
        assert_eq!(misses.bytes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn forgetting_an_id_ends_its_hold() {
        let misses = ProbeMisses::new(HOLD, 1 << 20);
        misses.remember(TaskId::Num(7), Instant::now());
        misses.forget(&TaskId::Num(7));
        assert!(!misses.held(&TaskId::Num(7), Instant::now()));
    }

    #[test]
    fn past_the_byte_bound_the_oldest_go_first() {
        let max = 10 * cost(&TaskId::Num(0));
        let misses = ProbeMisses::new(HOLD, max);
        let now = Instant::now();
        for n in 0..25 {
            misses.remember(TaskId::Num(n), now);
            assert!(misses.bytes() <= max);
        }
        assert!((0..15).all(|n| !misses.held(&TaskId::Num(n), now)));
        assert!((15..25).all(|n| misses.held(&TaskId::Num(n), now)));
        // One entry dearer than the whole bound is simply not kept.
        let huge = TaskId::Text("x".repeat(max).into());
        misses.remember(huge.clone(), now);
        assert!(!misses.held(&huge, now));
        assert!(misses.held(&TaskId::Num(24), now));
    }

    proptest! {
        /// Whatever is remembered, forgotten or waited for, the cost stays within the bound,
        /// an id is held only within its hold, and the newest ids under the bound are held.
        #[test]
        fn the_bound_and_the_hold_hold_for_any_sequence(
            ops in proptest::collection::vec((0u8..3, 0u64..40, 0u64..90), 1..300),
            max_entries in 1usize..30,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let max = max_entries * (ENTRY_BYTES + 2 * 8);
                let misses = ProbeMisses::new(HOLD, max);
                let mut model: HashMap<TaskId, Instant> = HashMap::new();
                for (op, n, secs) in ops {
                    let task = if n % 2 == 0 {
                        TaskId::Num(n)
                    } else {
                        TaskId::Text(format!("t{n:07}").into())
                    };
                    let now = Instant::now();
                    match op {
                        0 => {
                            misses.remember(task.clone(), now);
                            model.insert(task, now + HOLD);
                        }
                        1 => {
                            misses.forget(&task);
                            model.remove(&task);
                            prop_assert!(!misses.held(&task, now));
                        }
                        _ => tokio::time::advance(Duration::from_secs(secs)).await,
                    }
                    prop_assert!(misses.bytes() <= max);
                    let now = Instant::now();
                    for (task, until) in &model {
                        // Never held beyond the hold; evicted early only for the bound.
                        if *until <= now {
                            prop_assert!(!misses.held(task, now));
                        }
                    }
                }
                Ok(())
            })?;
        }
    }
}
