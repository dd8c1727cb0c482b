//! The timer behind the listener's header-read timeout (`limits.header_timeout`): coarse,
//! and cheap enough to arm once per request.
//!
//! hyper arms its header-read timer each time it starts reading a request head, keep-alive
//! waits included, and drops it when the head is in. With tokio's timer that is a boxed
//! `Sleep` registered in and removed from the timer wheel under the driver's lock, about
//! 1.5k instructions per request for a timer that almost never fires. Here a sleep is a
//! deadline and a waker in a slot of a shared table, and one background tick (a fraction of
//! the timeout, see [`resolution`]) wakes the sleeps whose deadline has passed. A sleep never
//! ends before its deadline and at most one tick after it, which is all a slow-loris
//! guard needs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};

/// The tick for a timeout: an eighth of it, within 10 ms and 1 s, so a sleep ends at most an
/// eighth late (10 s by default: at most 1 s late) and the tick costs nothing noticeable.
pub(super) fn resolution(timeout: Duration) -> Duration {
    (timeout / 8).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// A hyper [`Timer`] whose sleeps end on [`HeaderTimer::tick`]. Cheap to clone.
#[derive(Clone)]
pub(super) struct HeaderTimer {
    shared: Arc<Mutex<Table>>,
}

struct Table {
    /// A lower bound of the time, moved on by each tick: comparing deadlines with it rather
    /// than with the clock means a sleep can end late, never early, and reads no clock.
    now: Instant,
    /// A deadline and the waker of the task waiting for it, by slot; `None` is a free slot.
    slots: Vec<Option<(Instant, Option<Waker>)>>,
    free: Vec<usize>,
}

impl HeaderTimer {
    pub(super) fn new() -> HeaderTimer {
        HeaderTimer {
            shared: Arc::new(Mutex::new(Table {
                now: now(),
                slots: Vec::new(),
                free: Vec::new(),
            })),
        }
    }

    /// Moves the timer's time on to now and wakes every sleep whose deadline has passed.
    pub(super) fn tick(&self) {
        let mut due = Vec::new();
        {
            let mut table = lock(&self.shared);
            let now = now();
            table.now = now;
            for (deadline, waker) in table.slots.iter_mut().flatten() {
                if *deadline <= now {
                    due.extend(waker.take());
                }
            }
        }
        // Woken outside the lock: a waker may run code of its own.
        due.into_iter().for_each(Waker::wake);
    }

    /// Calls [`HeaderTimer::tick`] every `resolution`, forever.
    pub(super) async fn run(self, resolution: Duration) {
        let mut interval = tokio::time::interval(resolution);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            self.tick();
        }
    }

    /// Sleeps registered and not yet dropped (for tests).
    #[cfg(test)]
    fn registered(&self) -> usize {
        lock(&self.shared).slots.iter().flatten().count()
    }
}

/// tokio's clock, as hyper-util's `TokioTimer` reads it, so that paused test time applies.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn lock(shared: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    // The table is consistent after every statement; a panic elsewhere cannot break it.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Timer for HeaderTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(HeaderSleep {
            shared: self.shared.clone(),
            deadline,
            slot: None,
        })
    }

    fn now(&self) -> Instant {
        now()
    }
}

/// One armed timeout. It takes a slot on its first pending poll and frees it when dropped.
struct HeaderSleep {
    shared: Arc<Mutex<Table>>,
    deadline: Instant,
    slot: Option<usize>,
}

impl Future for HeaderSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut table = lock(&this.shared);
        if table.now >= this.deadline {
            return Poll::Ready(());
        }
        match this.slot {
            Some(slot) => {
                let entry = table.slots[slot]
                    .as_mut()
                    .expect("a sleep's slot is its own");
                if !entry.1.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    entry.1 = Some(cx.waker().clone());
                }
            }
            None => {
                let entry = Some((this.deadline, Some(cx.waker().clone())));
                let slot = match table.free.pop() {
                    Some(slot) => {
                        table.slots[slot] = entry;
                        slot
                    }
                    None => {
                        table.slots.push(entry);
                        table.slots.len() - 1
                    }
                };
                this.slot = Some(slot);
            }
        }
        Poll::Pending
    }
}

impl Sleep for HeaderSleep {}

impl Drop for HeaderSleep {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            let mut table = lock(&self.shared);
            table.slots[slot] = None;
            table.free.push(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::poll;

    /// Polls `sleep` once, as hyper does between reads.
    async fn is_done(sleep: &mut Pin<Box<dyn Sleep>>) -> bool {
        poll!(sleep.as_mut()).is_ready()
    }

    /// Lets every task woken so far run.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_task_is_woken_after_the_deadline_within_one_tick() {
        let tick = Duration::from_millis(100);
        let timer = HeaderTimer::new();
        tokio::spawn(timer.clone().run(tick));
        // Awaited by a task of its own, as hyper's connection task does: nothing polls it
        // again unless it is woken.
        let waiter = tokio::spawn(timer.sleep(Duration::from_millis(250)));
        settle().await;
        tokio::time::advance(Duration::from_millis(249)).await;
        settle().await;
        assert!(!waiter.is_finished(), "not before its deadline");
        tokio::time::advance(tick).await;
        settle().await;
        assert!(
            waiter.is_finished(),
            "woken within one tick of its deadline"
        );
        assert_eq!(timer.registered(), 0, "its slot is free again");
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_sleeps_give_their_slots_back() {
        let timer = HeaderTimer::new();
        for _ in 0..100 {
            let mut sleep = timer.sleep(Duration::from_secs(10));
            assert!(!is_done(&mut sleep).await);
            assert_eq!(timer.registered(), 1);
        }
        assert_eq!(timer.registered(), 0);
        assert_eq!(lock(&timer.shared).slots.len(), 1, "one slot, reused");
        // A sleep never polled takes no slot at all.
        let _unpolled = timer.sleep(Duration::from_secs(10));
        assert_eq!(timer.registered(), 0);
    }

    #[test]
    fn the_tick_is_an_eighth_of_the_timeout_within_bounds() {
        assert_eq!(resolution(Duration::from_secs(10)), Duration::from_secs(1));
        assert_eq!(
            resolution(Duration::from_millis(300)),
            Duration::from_micros(37_500)
        );
        assert_eq!(
            resolution(Duration::from_millis(1)),
            Duration::from_millis(10)
        );
    }

    proptest::proptest! {
        /// Any set of sleeps, armed at any times and polled at any steps of the clock: none
        /// ends before its deadline, and each has ended by one tick after it.
        #[test]
        fn sleeps_end_never_early_and_at_most_a_tick_late(
            sleeps in proptest::collection::vec((0u64..2_000, 1u64..3_000), 1..12),
            step in 1u64..400,
            tick_ms in 10u64..200,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async move {
                let tick = Duration::from_millis(tick_ms);
                let timer = HeaderTimer::new();
                tokio::spawn(timer.clone().run(tick));
                let start = tokio::time::Instant::now();
                let mut armed: Vec<(tokio::time::Instant, Pin<Box<dyn Sleep>>)> = Vec::new();
                let mut pending: Vec<(u64, u64)> = sleeps.clone();
                pending.sort_unstable();
                let end = Duration::from_millis(2_000 + 3_000 + 2 * tick_ms + step);
                while start.elapsed() <= end {
                    let elapsed = start.elapsed();
                    while pending.first().is_some_and(|(at, _)| Duration::from_millis(*at) <= elapsed) {
                        let (_, after) = pending.remove(0);
                        let deadline = tokio::time::Instant::now() + Duration::from_millis(after);
                        armed.push((deadline, timer.sleep_until(deadline.into_std())));
                    }
                    for (deadline, sleep) in &mut armed {
                        let done = is_done(sleep).await;
                        let now = tokio::time::Instant::now();
                        assert!(!done || now >= *deadline, "ended early");
                        assert!(done || now <= *deadline + tick, "more than a tick late");
                    }
                    armed.retain(|(deadline, _)| tokio::time::Instant::now() < *deadline + tick);
                    tokio::time::advance(Duration::from_millis(step)).await;
                    // Lets the tick task run at the new time.
                    tokio::task::yield_now().await;
                }
            });
        }
    }
}
