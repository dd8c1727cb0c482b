//! The admission queue: submits that found every key full wait here, first come first
//! served, for a thread to be given back.
//!
//! Only the head of the queue looks for a thread; the others wait for their turn on a
//! one-permit semaphore, which tokio hands out in request order. So the order is FIFO
//! without a hand-written wait list, a waiter that times out or whose caller goes away
//! simply leaves, and a submit that arrives while others wait queues behind them instead of
//! taking the next free thread.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

/// How often the head looks again even without news: a safety net for room that appears
/// without a thread being given back and without a known time (a balance read, say).
const RECHECK: Duration = Duration::from_secs(1);

/// Why a submit got no thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Waiting is off (`queue_timeout = 0`).
    NoQueue,
    /// The queue already held `max_queued` submits.
    QueueFull,
    /// No thread came free before the deadline.
    TimedOut,
}

impl Refusal {
    /// Every refusal, so their metric series can exist from the first scrape.
    pub const ALL: [Refusal; 3] = [Refusal::NoQueue, Refusal::QueueFull, Refusal::TimedOut];

    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoQueue => "no_queue",
            Refusal::QueueFull => "queue_full",
            Refusal::TimedOut => "queue_timeout",
        }
    }
}

/// What one look for a thread found.
pub enum Take<T> {
    Got(T),
    /// Keys that could take the task exist, but every one is full.
    Full,
    /// No key could take the task at all (none in rotation, or every one tried).
    NoKey,
}

/// What waiting ended with.
pub enum Waited<T> {
    Got(T),
    NoKey,
    Refused(Refusal),
}

#[derive(Debug)]
pub(super) struct Queue {
    /// The head's turn: one permit.
    turnstile: Semaphore,
    /// Signalled whenever a thread is given back. Only the head waits on it; a signal with
    /// nobody waiting is kept for the next head, so none is lost between look and wait.
    freed: Notify,
    /// Submits queued, the head included.
    len: AtomicUsize,
    /// The last refusal, so `threadsinfo` can keep agreeing with it for a moment.
    refused_at: Mutex<Option<Instant>>,
}

impl Default for Queue {
    fn default() -> Queue {
        Queue {
            turnstile: Semaphore::new(1),
            freed: Notify::new(),
            len: AtomicUsize::new(0),
            refused_at: Mutex::new(None),
        }
    }
}

/// A place in the queue, given up when dropped (served, timed out or cancelled).
struct Place<'a>(&'a AtomicUsize);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Queue {
    pub(super) fn freed(&self) {
        self.freed.notify_one();
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::SeqCst)
    }

    pub(super) fn refused_within(&self, window: Duration, now: Instant) -> bool {
        let at = *self.refused_at.lock().expect("refusal lock poisoned");
        at.is_some_and(|at| now.saturating_duration_since(at) < window)
    }

    fn refuse<T>(&self, refusal: Refusal) -> Waited<T> {
        *self.refused_at.lock().expect("refusal lock poisoned") = Some(Instant::now());
        Waited::Refused(refusal)
    }

    /// Returns how it ended, and how long the submit was queued (`None` if it was not).
    pub(super) async fn wait<T>(
        &self,
        deadline: Instant,
        max_queued: usize,
        recheck: impl Fn() -> Option<Instant>,
        mut take: impl FnMut() -> Take<T>,
    ) -> (Waited<T>, Option<Duration>) {
        if self.len() == 0 {
            match take() {
                Take::Got(got) => return (Waited::Got(got), None),
                Take::NoKey => return (Waited::NoKey, None),
                Take::Full => {}
            }
        }
        if max_queued == 0 || deadline <= Instant::now() {
            return (self.refuse(Refusal::NoQueue), None);
        }
        let placed = self
            .len
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max_queued).then_some(n + 1)
            });
        if placed.is_err() {
            return (self.refuse(Refusal::QueueFull), None);
        }
        let _place = Place(&self.len);
        let queued = Instant::now();
        let waited = self.wait_in_line(deadline, recheck, take).await;
        (waited, Some(queued.elapsed()))
    }

    /// The part of `wait` spent in the queue: first the turn, then looks until a thread.
    async fn wait_in_line<T>(
        &self,
        deadline: Instant,
        recheck: impl Fn() -> Option<Instant>,
        mut take: impl FnMut() -> Take<T>,
    ) -> Waited<T> {
        let Ok(Ok(_turn)) = tokio::time::timeout_at(deadline, self.turnstile.acquire()).await
        else {
            // The semaphore is never closed, so this is the deadline.
            return self.refuse(Refusal::TimedOut);
        };
        loop {
            // Registered before looking, so a thread given back after the look still wakes us.
            let mut freed = pin!(self.freed.notified());
            freed.as_mut().enable();
            match take() {
                Take::Got(got) => return Waited::Got(got),
                Take::NoKey => return Waited::NoKey,
                Take::Full => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return self.refuse(Refusal::TimedOut);
            }
            let wake = [Some(deadline), Some(now + RECHECK), recheck()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(deadline);
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    /// A pool of `free` interchangeable threads, as `take` sees it.
    struct Threads(AtomicU32);

    impl Threads {
        fn take(&self) -> Take<()> {
            match self
                .0
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            {
                Ok(_) => Take::Got(()),
                Err(_) => Take::Full,
            }
        }
    }

    fn got<T>((waited, _): (Waited<T>, Option<Duration>)) -> bool {
        matches!(waited, Waited::Got(_))
    }

    fn refusal<T>((waited, _): (Waited<T>, Option<Duration>)) -> Option<Refusal> {
        match waited {
            Waited::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_free_thread_is_taken_at_once() {
        let queue = Queue::default();
        let threads = Threads(AtomicU32::new(1));
        let deadline = Instant::now() + Duration::from_secs(5);
        assert!(got(queue
            .wait(deadline, 10, || None, || threads.take())
            .await));
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_proceeds_when_a_thread_is_given_back() {
        let queue = Arc::new(Queue::default());
        let threads = Arc::new(Threads(AtomicU32::new(0)));
        let started = Instant::now();
        let waiter = tokio::spawn({
            let (queue, threads) = (queue.clone(), threads.clone());
            async move {
                let deadline = Instant::now() + Duration::from_secs(5);
                got(queue.wait(deadline, 10, || None, || threads.take()).await)
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(queue.len(), 1, "waiting");
        threads.0.fetch_add(1, Ordering::SeqCst);
        queue.freed();
        assert!(waiter.await.unwrap());
        assert_eq!(queue.len(), 0);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "woken by the release"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_at_the_deadline_with_a_refusal() {
        let queue = Queue::default();
        let threads = Threads(AtomicU32::new(0));
        let started = Instant::now();
        let deadline = started + Duration::from_secs(3);
        let waited = queue.wait(deadline, 10, || None, || threads.take()).await;
        assert_eq!(
            waited.1,
            Some(Duration::from_secs(3)),
            "queued until the deadline"
        );
        assert_eq!(refusal(waited), Some(Refusal::TimedOut));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert!(queue.refused_within(Duration::from_secs(1), Instant::now()));
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_off_or_a_full_queue_refuse_at_once() {
        let queue = Arc::new(Queue::default());
        let threads = Arc::new(Threads(AtomicU32::new(0)));
        let deadline = Instant::now() + Duration::from_secs(5);
        let off = queue.wait(deadline, 0, || None, || threads.take()).await;
        assert_eq!(refusal(off), Some(Refusal::NoQueue));
        let first = tokio::spawn({
            let (queue, threads) = (queue.clone(), threads.clone());
            async move { queue.wait(deadline, 1, || None, || threads.take()).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second = queue.wait(deadline, 1, || None, || threads.take()).await;
        assert_eq!(refusal(second), Some(Refusal::QueueFull));
        assert_eq!(refusal(first.await.unwrap()), Some(Refusal::TimedOut));
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_first_come_first_served_and_newcomers_queue_behind() {
        let queue = Arc::new(Queue::default());
        let threads = Arc::new(Threads(AtomicU32::new(0)));
        let served = Arc::new(Mutex::new(Vec::new()));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut waiters = Vec::new();
        for n in 0..5 {
            let (queue, threads, served) = (queue.clone(), threads.clone(), served.clone());
            waiters.push(tokio::spawn(async move {
                let waited = queue.wait(deadline, 10, || None, || threads.take()).await;
                assert!(got(waited));
                served.lock().unwrap().push(n);
            }));
            // Each queues before the next arrives.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for _ in 0..5 {
            threads.0.fetch_add(1, Ordering::SeqCst);
            queue.freed();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*served.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_head_looks_again_at_the_recheck_time() {
        let queue = Queue::default();
        let opens_at = Instant::now() + Duration::from_millis(250);
        let deadline = Instant::now() + Duration::from_secs(5);
        let take = || {
            if Instant::now() >= opens_at {
                Take::Got(())
            } else {
                Take::Full
            }
        };
        let waited = queue.wait(deadline, 10, || Some(opens_at), take).await;
        assert_eq!(waited.1, Some(Duration::from_millis(250)));
        assert!(got(waited));
        assert_eq!(Instant::now(), opens_at, "no later than the recheck time");
    }

    #[tokio::test(start_paused = true)]
    async fn no_key_at_all_is_not_queued() {
        let queue = Queue::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        let (waited, queued) = queue
            .wait(deadline, 10, || None, || Take::<()>::NoKey)
            .await;
        assert!(matches!(waited, Waited::NoKey));
        assert_eq!(queued, None);
        assert!(!queue.refused_within(Duration::from_secs(1), Instant::now()));
    }
}
