//! In-memory pins: the lookup tables every pin store answers from, bounded by TTL and a size cap.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::PinStore;
use crate::captcha::TaskId;
use crate::key_id::KeyId;
use crate::task_table::{Clock, Entry, TaskMap, TaskQueue};

/// In-memory pins with TTL expiry and oldest-first eviction. A pin is 8 bytes in the map
/// and 12 in the queue (numeric ids), plus the tables' slack; times are whole seconds.
pub struct MemoryPins {
    /// Lookups on the poll path run concurrently; the map shards its lock.
    map: TaskMap,
    /// Pins in insertion order, which is also expiry order because the TTL is uniform.
    /// A std `Mutex`, not a tokio one: it is held only to push or pop, never across an await.
    order: Mutex<TaskQueue>,
    /// Pins in `map`, counted here because `TaskMap::len` takes the lock of every shard of
    /// both its maps, and `pin` needs the count at every call (twice at the cap): that was a
    /// third of a pin's CPU. Changed only under `order`, as the map is, so it is exact
    /// whenever `order` is free.
    len: AtomicUsize,
    clock: Clock,
    ttl: Duration,
    max_pins: usize,
}

impl MemoryPins {
    /// An empty store keeping each pin for `ttl` and at most `max_pins` (at least one) pins.
    pub fn new(ttl: Duration, max_pins: usize) -> MemoryPins {
        MemoryPins {
            map: TaskMap::default(),
            order: Mutex::new(TaskQueue::default()),
            len: AtomicUsize::new(0),
            clock: Clock::new(),
            ttl,
            max_pins: max_pins.max(1),
        }
    }

    fn order(&self) -> std::sync::MutexGuard<'_, TaskQueue> {
        self.order.lock().expect("pin queue lock poisoned")
    }

    /// Removes the oldest queue entry, and its pin unless the id was pinned again since, in
    /// a later second. Within one second the two entries look the same, so the pin goes
    /// when the first of them does: for the size cap a little early, for the TTL no
    /// different, as both expire in the same second.
    fn pop_oldest(&self, order: &mut TaskQueue) {
        if let Some((task, created)) = order.pop_front() {
            if self.map.remove_if(&task, |pin| pin.at == created).is_some() {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// One pin as a snapshot reports it, for the journal's compaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LivePin {
    pub task: TaskId,
    pub key: KeyId,
    /// Rounded down to the second the store keeps.
    pub created: Instant,
}

impl MemoryPins {
    /// Pins not expired at `now`, oldest first: replaying them in this order into an empty
    /// store rebuilds the same eviction order.
    pub(super) fn live(&self, now: Instant) -> Vec<LivePin> {
        let order = self.order();
        // An id pinned twice in one second has two matching queue entries; the first is
        // the one eviction meets first.
        let mut seen = HashSet::new();
        let mut live = Vec::with_capacity(self.map.len());
        for (task, created) in order.iter() {
            let Some(pin) = self.map.get(&task) else {
                continue;
            };
            let current = pin.at == created;
            if current && self.clock.age(pin.at, now) < self.ttl && seen.insert(task.clone()) {
                live.push(LivePin {
                    task,
                    key: pin.key,
                    created: self.clock.instant(pin.at),
                });
            }
        }
        live
    }
}

impl PinStore for MemoryPins {
    fn pin(&self, task: TaskId, key: KeyId, now: Instant) {
        let at = self.clock.stamp(now);
        let mut order = self.order();
        if self.map.insert(&task, Entry { key, at }).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        order.push_back(&task, at);
        // The queue may hold stale entries for re-pinned ids; its own bound keeps those few.
        while !order.is_empty()
            && (self.len() > self.max_pins || order.len() > self.max_pins.saturating_mul(2))
        {
            self.pop_oldest(&mut order);
        }
    }

    fn owner(&self, task: &TaskId, now: Instant) -> Option<KeyId> {
        let pin = self.map.get(task)?;
        (self.clock.age(pin.at, now) < self.ttl).then_some(pin.key)
    }

    fn sweep(&self, now: Instant) -> usize {
        let mut order = self.order();
        let before = self.len();
        while let Some((_, created)) = order.front() {
            if self.clock.age(created, now) < self.ttl {
                break;
            }
            self.pop_oldest(&mut order);
        }
        before.saturating_sub(self.len())
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> TaskId {
        TaskId::Num(n)
    }

    #[tokio::test(start_paused = true)]
    async fn pins_resolve_until_they_expire() {
        let pins = MemoryPins::new(Duration::from_secs(3600), 10);
        pins.pin(id(1), KeyId(2), Instant::now());
        assert_eq!(pins.owner(&id(1), Instant::now()), Some(KeyId(2)));
        assert_eq!(pins.owner(&id(9), Instant::now()), None);
        tokio::time::advance(Duration::from_secs(3599)).await;
        assert_eq!(pins.owner(&id(1), Instant::now()), Some(KeyId(2)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(pins.owner(&id(1), Instant::now()), None);
        assert_eq!(pins.len(), 1, "expired but not yet swept");
        assert_eq!(pins.sweep(Instant::now()), 1);
        assert_eq!(pins.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn sweep_keeps_young_pins() {
        let pins = MemoryPins::new(Duration::from_secs(60), 10);
        pins.pin(id(1), KeyId(0), Instant::now());
        tokio::time::advance(Duration::from_secs(30)).await;
        pins.pin(id(2), KeyId(1), Instant::now());
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(pins.sweep(Instant::now()), 1);
        assert_eq!(pins.owner(&id(2), Instant::now()), Some(KeyId(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_evicts_oldest_first() {
        let pins = MemoryPins::new(Duration::from_secs(3600), 3);
        for n in 1..=5 {
            pins.pin(id(n), KeyId(n as u16), Instant::now());
        }
        assert_eq!(pins.len(), 3);
        let now = Instant::now();
        assert_eq!(pins.owner(&id(1), now), None);
        assert_eq!(pins.owner(&id(2), now), None);
        assert_eq!(pins.owner(&id(5), now), Some(KeyId(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn re_pinning_an_id_survives_eviction_of_its_old_entry() {
        let pins = MemoryPins::new(Duration::from_secs(3600), 2);
        pins.pin(id(1), KeyId(0), Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        pins.pin(id(1), KeyId(1), Instant::now());
        pins.pin(id(2), KeyId(0), Instant::now());
        pins.pin(id(3), KeyId(0), Instant::now());
        // The stale first entry of id 1 went first, then the newer one as the oldest live pin.
        assert_eq!(pins.len(), 2);
        assert_eq!(pins.owner(&id(3), Instant::now()), Some(KeyId(0)));
    }

    #[tokio::test(start_paused = true)]
    async fn re_pinning_moves_the_task_to_its_new_key() {
        let pins = MemoryPins::new(Duration::from_secs(60), 10);
        pins.pin(id(1), KeyId(0), Instant::now());
        pins.pin(id(1), KeyId(1), Instant::now());
        assert_eq!(pins.owner(&id(1), Instant::now()), Some(KeyId(1)));
        assert_eq!(pins.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn live_lists_current_unexpired_pins_oldest_first() {
        let pins = MemoryPins::new(Duration::from_secs(60), 10);
        let t0 = Instant::now();
        pins.pin(id(1), KeyId(0), t0);
        pins.pin(id(2), KeyId(1), t0);
        tokio::time::advance(Duration::from_secs(30)).await;
        let t1 = Instant::now();
        // Re-pinned: its first queue entry is stale and must not be listed.
        pins.pin(id(1), KeyId(2), t1);
        pins.pin(id(3), KeyId(0), t1);
        let live = |n, key, created| LivePin {
            task: id(n),
            key: KeyId(key),
            created,
        };
        assert_eq!(
            pins.live(t1),
            vec![live(2, 1, t0), live(1, 2, t1), live(3, 0, t1)]
        );
        // Task 2 expires at t0 + 60 s even before a sweep removes it.
        assert_eq!(
            pins.live(t0 + Duration::from_secs(60)),
            vec![live(1, 2, t1), live(3, 0, t1)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn live_lists_an_id_pinned_twice_at_one_instant_once() {
        let pins = MemoryPins::new(Duration::from_secs(60), 10);
        let now = Instant::now();
        pins.pin(id(1), KeyId(0), now);
        pins.pin(id(1), KeyId(1), now);
        let live = pins.live(now);
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].key, KeyId(1));
    }

    /// One step of the count's property test.
    #[derive(Debug, Clone)]
    enum Step {
        Pin { task: u64, text: bool, key: u16 },
        Advance { secs: u64 },
        Sweep,
    }

    fn any_step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0..12u64, any::<bool>(), 0..3u16)
                .prop_map(|(task, text, key)| Step::Pin { task, text, key }),
            2 => (0..40u64).prop_map(|secs| Step::Advance { secs }),
            1 => Just(Step::Sweep),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        /// The count `len` keeps is the map's own, whatever mix of new pins, re-pins (in the
        /// same second or later), evictions by the cap and sweeps came before, and a sweep
        /// returns how many pins it dropped.
        #[test]
        fn the_count_is_the_maps_after_any_pins_and_sweeps(
            cap in 1..8usize,
            steps in proptest::collection::vec(any_step(), 1..80),
        ) {
            let pins = MemoryPins::new(Duration::from_secs(60), cap);
            let start = Instant::now();
            let mut elapsed = 0;
            for step in steps {
                let now = start + Duration::from_secs(elapsed);
                match step {
                    Step::Pin { task, text, key } => {
                        let task = if text { TaskId::Text(format!("t{task}").into()) } else { id(task) };
                        pins.pin(task, KeyId(key), now);
                    }
                    Step::Advance { secs } => elapsed += secs,
                    Step::Sweep => {
                        let before = pins.map.len();
                        let dropped = pins.sweep(now);
                        proptest::prop_assert_eq!(dropped, before - pins.map.len());
                    }
                }
                proptest::prop_assert_eq!(pins.len(), pins.map.len());
                proptest::prop_assert!(pins.len() <= cap);
            }
        }
    }
}
