//! Provider outages: whether a whole provider's service is down, judged from the transport
//! failures and server errors of all its keys together. A connection refused says nothing
//! about the key that was sent, so an outage moves traffic to another provider at once,
//! instead of after each key has failed on its own and been cooled for it.
//!
//! A provider goes down after `threshold` transient failures in a row across its keys,
//! with no answer from it in between, and on more than one key where it has more than one
//! (so one broken account cannot take its provider out). It stays down for a cooldown that
//! doubles with each outage that follows without an answer, like a key's. When the cooldown
//! ends it is on probation: its keys are tried again, the first answer brings it back, and
//! the first failure takes it down again. Any answer at all, even a key's error code, shows
//! the service is reachable.
//!
//! State is per replica, like a key's transient-failure count: each replica sees an outage
//! for itself within a few requests.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::key_id::KeyId;
use crate::provider::Provider;

/// How transient failures take a provider out, from `[failover]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutagePolicy {
    /// Failures in a row, across the provider's keys, that make an outage.
    pub threshold: u32,
    pub cooldown: Duration,
    pub max_cooldown: Duration,
    /// Near 1, drawn by the caller, so that providers down together do not return together.
    pub jitter: f64,
}

/// A provider's outage began or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutageChange {
    /// Out until `until` (then on probation).
    Down { until: Instant },
    /// Answered again after an outage.
    Up,
}

/// A provider as seen at one instant, for `/status` and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutageView {
    /// Down, or on probation after an outage and not yet answered.
    pub out: bool,
    /// End of the current outage's cooldown, while it runs.
    pub until: Option<Instant>,
    /// When the current outage began.
    pub since: Option<Instant>,
}

/// Providers whose keys are out of rotation right now, as a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DownSet(u8);

impl DownSet {
    pub fn contains(self, provider: Provider) -> bool {
        self.0 & bit(provider) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Every provider's outage state, in process.
#[derive(Debug, Default)]
pub struct Outages {
    entries: [Mutex<Entry>; Provider::ALL.len()],
    /// Providers down until a deadline: read on every pick, so a pick while nothing is
    /// down costs one load.
    down: AtomicU8,
    /// Providers with anything to forget on an answer (a run, an outage, probation): an
    /// answer from any other costs one load, not a lock.
    troubled: AtomicU8,
}

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    run: u32,
    first: Option<KeyId>,
    several: bool,
    until: Option<Instant>,
    since: Option<Instant>,
    probation: bool,
    /// Outages since the provider last answered while up: each doubles the next cooldown.
    outages: u32,
}

fn bit(provider: Provider) -> u8 {
    1 << (provider as u8)
}

impl Outages {
    pub fn new() -> Outages {
        Outages::default()
    }

    fn entry(&self, provider: Provider) -> std::sync::MutexGuard<'_, Entry> {
        self.entries[provider as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends a cooldown that has run out: the provider goes on probation.
    fn settle(&self, provider: Provider, entry: &mut Entry, now: Instant) {
        if entry.until.is_some_and(|until| until <= now) {
            entry.until = None;
            entry.probation = true;
            self.down.fetch_and(!bit(provider), Ordering::AcqRel);
        }
    }

    /// The providers down right now.
    pub fn down_set(&self, now: Instant) -> DownSet {
        let marked = self.down.load(Ordering::Acquire);
        if marked == 0 {
            return DownSet(0);
        }
        let mut down = 0;
        for provider in Provider::ALL {
            if marked & bit(provider) == 0 {
                continue;
            }
            let mut entry = self.entry(provider);
            self.settle(provider, &mut entry, now);
            if entry.until.is_some() {
                down |= bit(provider);
            }
        }
        DownSet(down)
    }

    /// Whether `provider` is down right now (not on probation: its keys are tried then).
    pub fn is_down(&self, provider: Provider, now: Instant) -> bool {
        self.down_set(now).contains(provider)
    }

    pub fn view(&self, provider: Provider, now: Instant) -> OutageView {
        let mut entry = self.entry(provider);
        self.settle(provider, &mut entry, now);
        OutageView {
            out: entry.until.is_some() || entry.probation,
            until: entry.until,
            since: entry
                .since
                .filter(|_| entry.until.is_some() || entry.probation),
        }
    }

    /// The provider answered (any answer, even an error code about the key).
    pub fn answered(&self, provider: Provider, now: Instant) -> Option<OutageChange> {
        if self.troubled.load(Ordering::Acquire) & bit(provider) == 0 {
            return None;
        }
        let mut entry = self.entry(provider);
        self.settle(provider, &mut entry, now);
        let was_out = entry.until.is_some() || entry.probation;
        *entry = Entry {
            // A provider that comes back and fails again soon is taken out for longer.
            outages: if was_out { entry.outages } else { 0 },
            ..Entry::default()
        };
        self.down.fetch_and(!bit(provider), Ordering::AcqRel);
        if entry.outages == 0 {
            self.troubled.fetch_and(!bit(provider), Ordering::AcqRel);
        }
        was_out.then_some(OutageChange::Up)
    }

    /// A transient failure (transport failure, 5xx, server error) of `key`, one of the
    /// provider's `keys` keys in the pool.
    pub fn failed(
        &self,
        provider: Provider,
        key: KeyId,
        keys: usize,
        policy: &OutagePolicy,
        now: Instant,
    ) -> Option<OutageChange> {
        let mut entry = self.entry(provider);
        self.settle(provider, &mut entry, now);
        self.troubled.fetch_or(bit(provider), Ordering::AcqRel);
        if entry.until.is_some() {
            return None;
        }
        entry.run = entry.run.saturating_add(1);
        match entry.first {
            None => entry.first = Some(key),
            Some(first) if first != key => entry.several = true,
            Some(_) => {}
        }
        let spread = entry.several || keys <= 1;
        if !(entry.probation || (entry.run >= policy.threshold.max(1) && spread)) {
            return None;
        }
        let grown = policy
            .cooldown
            .saturating_mul(2u32.saturating_pow(entry.outages))
            .min(policy.max_cooldown);
        let until = now
            + grown
                .mul_f64(policy.jitter.clamp(0.0, 2.0))
                .min(policy.max_cooldown);
        *entry = Entry {
            until: Some(until),
            since: if entry.probation {
                entry.since
            } else {
                Some(now)
            },
            outages: entry.outages.saturating_add(1),
            ..Entry::default()
        };
        self.down.fetch_or(bit(provider), Ordering::AcqRel);
        Some(OutageChange::Down { until })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Provider = Provider::TwoCaptcha;
    const POLICY: OutagePolicy = OutagePolicy {
        threshold: 3,
        cooldown: Duration::from_secs(30),
        max_cooldown: Duration::from_secs(300),
        jitter: 1.0,
    };

    fn fail(outages: &Outages, key: u16, keys: usize) -> Option<OutageChange> {
        outages.failed(P, KeyId(key), keys, &POLICY, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_across_two_keys_takes_the_provider_down_and_no_other() {
        let outages = Outages::new();
        assert_eq!(fail(&outages, 0, 3), None);
        assert_eq!(fail(&outages, 1, 3), None);
        let now = Instant::now();
        assert_eq!(
            fail(&outages, 0, 3),
            Some(OutageChange::Down {
                until: now + Duration::from_secs(30)
            })
        );
        assert!(outages.is_down(P, now));
        for other in Provider::ALL.into_iter().filter(|p| *p != P) {
            assert!(!outages.is_down(other, now), "{other}");
        }
        // Failures while down change nothing.
        assert_eq!(fail(&outages, 2, 3), None);
    }

    #[tokio::test(start_paused = true)]
    async fn one_broken_key_never_takes_out_a_provider_with_others() {
        let outages = Outages::new();
        for _ in 0..100 {
            assert_eq!(fail(&outages, 0, 2), None);
        }
        assert!(!outages.is_down(P, Instant::now()));
        // Its only key failing is the provider failing.
        let lone = Outages::new();
        assert_eq!(fail(&lone, 0, 1), None);
        assert_eq!(fail(&lone, 0, 1), None);
        assert!(matches!(fail(&lone, 0, 1), Some(OutageChange::Down { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_between_resets_the_run() {
        let outages = Outages::new();
        fail(&outages, 0, 2);
        fail(&outages, 1, 2);
        assert_eq!(outages.answered(P, Instant::now()), None, "never out");
        fail(&outages, 0, 2);
        assert_eq!(fail(&outages, 1, 2), None, "a new run of two");
        assert!(fail(&outages, 1, 2).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_cooldown_one_answer_brings_it_back_and_one_failure_takes_it_out() {
        let outages = Outages::new();
        for key in [0, 1, 0] {
            fail(&outages, key, 2);
        }
        let began = Instant::now();
        tokio::time::advance(Duration::from_secs(30)).await;
        let now = Instant::now();
        assert!(!outages.is_down(P, now), "tried again after the cooldown");
        let view = outages.view(P, now);
        assert!(view.out, "but not up until it answers");
        assert_eq!(view.since, Some(began));
        // On probation a single failure is an outage, twice as long.
        assert_eq!(
            fail(&outages, 1, 2),
            Some(OutageChange::Down {
                until: now + Duration::from_secs(60)
            })
        );
        assert_eq!(outages.view(P, now).since, Some(began), "the same outage");
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(outages.answered(P, Instant::now()), Some(OutageChange::Up));
        let view = outages.view(P, Instant::now());
        assert_eq!((view.out, view.until, view.since), (false, None, None));
        assert_eq!(outages.answered(P, Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_ends_an_outage_before_its_cooldown() {
        let outages = Outages::new();
        for key in [0, 1, 0] {
            fail(&outages, key, 2);
        }
        assert_eq!(outages.answered(P, Instant::now()), Some(OutageChange::Up));
        assert!(outages.down_set(Instant::now()).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn outages_that_follow_each_other_double_up_to_the_cap_and_an_answer_while_up_resets() {
        let outages = Outages::new();
        let mut seen = Vec::new();
        for _ in 0..6 {
            let now = Instant::now();
            let Some(OutageChange::Down { until }) = (loop {
                if let Some(change) = fail(&outages, 0, 1) {
                    break Some(change);
                }
            }) else {
                panic!("an outage");
            };
            seen.push((until - now).as_secs());
            tokio::time::advance(until - now).await;
        }
        assert_eq!(seen, vec![30, 60, 120, 240, 300, 300]);
        outages.answered(P, Instant::now());
        outages.answered(P, Instant::now());
        for _ in 0..2 {
            assert_eq!(fail(&outages, 0, 1), None, "a full run again");
        }
        let now = Instant::now();
        assert_eq!(
            fail(&outages, 0, 1),
            Some(OutageChange::Down {
                until: now + Duration::from_secs(30)
            })
        );
    }
}
