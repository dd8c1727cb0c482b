//! In-memory pins: the lookup tables every pin store answers from, bounded by TTL and a size cap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::{Pin, PinStore, TokenId};
use crate::captcha::TaskId;
use crate::key_id::KeyId;
#[cfg(test)]
use crate::task_table::Stamp;
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
    /// a later second. An id pinned again within the same second keeps its one entry
    /// (`pin` adds none), so for the size cap it goes a little early, and for the TTL no
    /// differently, as both pins expire in the same second.
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
    pub token: TokenId,
    /// Rounded down to the second the store keeps.
    pub created: Instant,
}

impl MemoryPins {
    /// Pins not expired at `now`, oldest first: replaying them in this order into an empty
    /// store rebuilds the same eviction order.
    ///
    /// The queue is copied under its lock (a copy of 12 bytes a numeric pin) and walked
    /// without it: the walk looks every entry up in the map, and holding the lock every
    /// `pin()` needs for that long would stop the request path. So a pin made during the
    /// walk may or may not be in the snapshot; the journal's compaction copies the records
    /// appended after its mark anyway.
    pub(super) fn live(&self, now: Instant) -> Vec<LivePin> {
        let order = self.order().clone();
        let mut live = Vec::with_capacity(self.len().min(order.len()));
        // `pin` queues an id once per second it is pinned in, so no (id, second) is queued
        // twice, and only the entry of the pin's own second is current.
        for (task, created) in order.iter() {
            let Some(pin) = self.map.get(&task) else {
                continue;
            };
            if pin.at == created && self.clock.age(pin.at, now) < self.ttl {
                live.push(LivePin {
                    task,
                    key: pin.key,
                    token: TokenId(pin.owner),
                    created: self.clock.instant(pin.at),
                });
            }
        }
        live
    }
}

impl PinStore for MemoryPins {
    fn pin_for(&self, task: TaskId, key: KeyId, token: TokenId, now: Instant) {
        let at = self.clock.stamp(now);
        let mut order = self.order();
        let entry = Entry {
            key,
            at,
            owner: token.0,
        };
        match self.map.insert(&task, entry) {
            None => {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            // Pinned again within the same second: the queue's entry for it is already
            // the one this pin needs, and a second one would only be stale weight.
            Some(before) if before.at == at => return,
            Some(_) => {}
        }
        order.push_back(&task, at);
        // The queue holds a stale entry for each id re-pinned in a later second; its own
        // bound keeps those few.
        while !order.is_empty()
            && (self.len() > self.max_pins || order.len() > self.max_pins.saturating_mul(2))
        {
            self.pop_oldest(&mut order);
        }
    }

    fn pinned(&self, task: &TaskId, now: Instant) -> Option<Pin> {
        let pin = self.map.get(task)?;
        (self.clock.age(pin.at, now) < self.ttl).then_some(Pin {
            key: pin.key,
            token: TokenId(pin.owner),
        })
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

    fn live_pins(&self, now: Instant) -> Vec<(TaskId, Pin)> {
        self.live(now)
            .into_iter()
            .map(|pin| {
                let owner = Pin {
                    key: pin.key,
                    token: pin.token,
                };
                (pin.task, owner)
            })
            .collect()
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
    async fn a_pin_keeps_its_token_and_says_who_may_poll_it() {
        let pins = MemoryPins::new(Duration::from_secs(3600), 10);
        let now = Instant::now();
        pins.pin_for(id(1), KeyId(2), TokenId(3), now);
        pins.pin(id(2), KeyId(2), now);
        let owned = pins.pinned(&id(1), now).unwrap();
        assert_eq!(
            owned,
            Pin {
                key: KeyId(2),
                token: TokenId(3)
            }
        );
        assert!(owned.belongs_to(Some(TokenId(3))));
        assert!(!owned.belongs_to(Some(TokenId(4))));
        assert!(owned.belongs_to(None), "no tokens configured: anyone");
        let nobodys = pins.pinned(&id(2), now).unwrap();
        assert_eq!(nobodys.token, TokenId::NONE);
        assert!(nobodys.belongs_to(Some(TokenId(4))));
        assert_eq!(
            std::mem::size_of::<crate::task_table::Entry>(),
            8,
            "no bigger for it"
        );
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
            token: TokenId::NONE,
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
    async fn a_re_pin_within_a_second_adds_no_queue_entry() {
        let pins = MemoryPins::new(Duration::from_secs(60), 10);
        let t0 = Instant::now();
        for key in 0..1000 {
            pins.pin(id(1), KeyId(key % 3), t0);
        }
        assert_eq!(pins.order().len(), 1);
        assert_eq!(pins.owner(&id(1), t0), Some(KeyId(999 % 3)));
        // A re-pin in a later second does need its own entry, and the pin lives from then.
        tokio::time::advance(Duration::from_secs(30)).await;
        let t1 = Instant::now();
        pins.pin(id(1), KeyId(2), t1);
        assert_eq!(pins.order().len(), 2);
        assert_eq!(pins.sweep(t0 + Duration::from_secs(60)), 0);
        assert_eq!(
            pins.owner(&id(1), t0 + Duration::from_secs(60)),
            Some(KeyId(2))
        );
        assert_eq!(pins.sweep(t1 + Duration::from_secs(60)), 1);
        assert_eq!(pins.order().len(), 0);
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
                // Every pin has its queue entry, or eviction and expiry would never find it.
                let queued: Vec<(TaskId, Stamp)> = pins.order().iter().collect();
                for (task, pin) in pins.map.select(|_| true) {
                    proptest::prop_assert!(queued.contains(&(task.clone(), pin.at)), "{task:?} has no queue entry");
                }
                // The snapshot lists exactly the unexpired pins, each once.
                let live = pins.live(now);
                let unexpired = pins.map.select(|pin| pins.clock.age(pin.at, now) < pins.ttl);
                proptest::prop_assert_eq!(live.len(), unexpired.len());
            }
        }
    }
}
