//! The key pool: the keys, what is known about each, and weighted failover selection.
//! Knows weights, balances and health; does not know HTTP or the 2captcha wire format.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rand::Rng;
use tokio::time::Instant;

use crate::config::{KeyConfig, Upstream};
use crate::health::{HealthStore, HealthView, KeyId, StateKind};
use crate::ApiKey;

/// One key of the pool and what keyrelay has learned about it.
#[derive(Debug)]
pub struct KeyEntry {
    pub id: KeyId,
    /// Label for logs, metrics and answers; the key itself is never shown.
    pub name: String,
    pub key: ApiKey,
    /// Each key names its upstream, so keys of different providers can share a pool later.
    pub upstream: Upstream,
    pub weight: f64,
    /// The plan's thread count from the config, if given.
    pub threads: Option<u32>,
    /// Shared with the entry this one replaced on reload, so learned figures carry over.
    pub stats: Arc<KeyStats>,
}

/// Figures read by the background refresh. Atomics, because the proxy reads them on every
/// selection while the refresh writes them, and a torn pair of figures is harmless.
#[derive(Debug)]
pub struct KeyStats {
    /// `f64` bits; NaN means unknown (never read, or the last read failed).
    balance: AtomicU64,
    /// Threads and working threads from `threadsinfo`; `u32::MAX` means unknown.
    threads: AtomicU32,
    working: AtomicU32,
    /// The last error code this key answered (or transport failure), and when, for the
    /// status page. A std `Mutex`: set and read in a few instructions, never across awaits.
    last_error: Mutex<Option<(&'static str, SystemTime)>>,
}

const UNKNOWN: u32 = u32::MAX;

impl Default for KeyStats {
    fn default() -> Self {
        KeyStats {
            balance: AtomicU64::new(f64::NAN.to_bits()),
            threads: AtomicU32::new(UNKNOWN),
            working: AtomicU32::new(UNKNOWN),
            last_error: Mutex::new(None),
        }
    }
}

impl KeyStats {
    /// The balance from the last successful `getbalance`, if the last read succeeded.
    pub fn balance(&self) -> Option<f64> {
        let value = f64::from_bits(self.balance.load(Ordering::Relaxed));
        (!value.is_nan()).then_some(value)
    }

    pub fn set_balance(&self, balance: Option<f64>) {
        let bits = balance.filter(|b| b.is_finite()).unwrap_or(f64::NAN);
        self.balance.store(bits.to_bits(), Ordering::Relaxed);
    }

    /// `(threads, working_threads)` from the last successful `threadsinfo`.
    pub fn threads(&self) -> Option<(u32, u32)> {
        let threads = self.threads.load(Ordering::Relaxed);
        let working = self.working.load(Ordering::Relaxed);
        (threads != UNKNOWN && working != UNKNOWN).then_some((threads, working))
    }

    /// The last error code and its wall-clock time.
    pub fn last_error(&self) -> Option<(&'static str, SystemTime)> {
        *self.last_error.lock().expect("last_error lock poisoned")
    }

    pub fn set_last_error(&self, code: &'static str) {
        *self.last_error.lock().expect("last_error lock poisoned") =
            Some((code, SystemTime::now()));
    }

    pub fn set_threads(&self, info: Option<(u32, u32)>) {
        let (threads, working) = info.unwrap_or((UNKNOWN, UNKNOWN));
        self.threads
            .store(threads.min(UNKNOWN - 1), Ordering::Relaxed);
        self.working
            .store(working.min(UNKNOWN - 1), Ordering::Relaxed);
    }
}

impl KeyEntry {
    /// A new key, as the config describes it.
    pub fn from_config(id: KeyId, config: &KeyConfig) -> KeyEntry {
        KeyEntry {
            id,
            name: config.name.clone(),
            key: config.key.clone(),
            upstream: config.upstream.clone(),
            weight: config.weight,
            threads: config.threads,
            stats: Arc::new(KeyStats::default()),
        }
    }

    /// A known key with a reloaded config's settings: same id, same learned figures.
    pub fn reconfigured(old: &KeyEntry, config: &KeyConfig) -> KeyEntry {
        KeyEntry {
            weight: config.weight,
            threads: config.threads,
            stats: old.stats.clone(),
            ..KeyEntry::from_config(old.id, config)
        }
    }

    /// The thread count to report: the upstream's figure when known, else the config's.
    pub fn thread_capacity(&self) -> Option<u32> {
        self.stats.threads().map(|(t, _)| t).or(self.threads)
    }
}

// === impl KeyPool ===

/// The keys of one configuration, with their shared health store.
pub struct KeyPool {
    keys: Vec<Arc<KeyEntry>>,
    health: Arc<dyn HealthStore>,
    min_balance: f64,
}

impl KeyPool {
    pub fn new(keys: Vec<Arc<KeyEntry>>, health: Arc<dyn HealthStore>, min_balance: f64) -> Self {
        KeyPool {
            keys,
            health,
            min_balance,
        }
    }

    pub fn keys(&self) -> &[Arc<KeyEntry>] {
        &self.keys
    }

    pub fn health(&self, key: &KeyEntry, now: Instant) -> HealthView {
        self.health.view(key.id, now)
    }

    /// Raw access for unit tests; the proxy goes through `App::record_health`, which also
    /// logs, counts and announces the change.
    #[cfg(test)]
    pub(crate) fn record(
        &self,
        key: &KeyEntry,
        event: crate::health::HealthEvent,
        now: Instant,
    ) -> Option<crate::health::Transition> {
        self.health.record(key.id, event, now)
    }

    /// Whether new tasks may go to this key: healthy, and not known to be out of balance.
    pub fn in_rotation(&self, key: &KeyEntry, now: Instant) -> bool {
        self.health.view(key.id, now).state == StateKind::Active && !self.below_min_balance(key)
    }

    /// A key whose last balance read is at or below `min_balance`.
    pub fn below_min_balance(&self, key: &KeyEntry) -> bool {
        key.stats.balance().is_some_and(|b| b <= self.min_balance)
    }

    pub fn active_count(&self, now: Instant) -> usize {
        self.keys
            .iter()
            .filter(|k| self.in_rotation(k, now))
            .count()
    }

    /// Keys in try-order for a new task: each pick is random with probability proportional
    /// to weight × balance among the keys still in rotation and not yet tried, so the first
    /// pick follows the weights and every failover does too. Each key comes at most once.
    pub fn candidates<R: Rng>(&self, rng: R, now: Instant) -> Candidates<'_, R> {
        Candidates {
            pool: self,
            tried: vec![false; self.keys.len()],
            rng,
            now,
        }
    }

    /// Balance used for weighting: the last read, or the mean of the known balances of keys
    /// in rotation while a key's own is unknown (so a new key gets a fair share, not none).
    fn effective_balances(&self, now: Instant) -> Vec<Option<f64>> {
        let known: Vec<f64> = self
            .keys
            .iter()
            .filter(|k| self.in_rotation(k, now))
            .filter_map(|k| k.stats.balance())
            .collect();
        let fallback = if known.is_empty() {
            1.0
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        };
        self.keys
            .iter()
            .map(|k| {
                self.in_rotation(k, now)
                    .then(|| k.stats.balance().unwrap_or(fallback).max(0.0))
            })
            .collect()
    }
}

/// Iterator returned by [`KeyPool::candidates`].
pub struct Candidates<'a, R> {
    pool: &'a KeyPool,
    tried: Vec<bool>,
    rng: R,
    now: Instant,
}

impl<R: Rng> Candidates<'_, R> {
    /// Moves the clock used for health checks, so keys cooled during this request's earlier
    /// attempts are seen as such.
    pub fn at(&mut self, now: Instant) {
        self.now = now;
    }
}

impl<'a, R: Rng> Iterator for Candidates<'a, R> {
    type Item = &'a Arc<KeyEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        let pool = self.pool;
        let balances = pool.effective_balances(self.now);
        let scores: Vec<(usize, f64)> = balances
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.tried[*i])
            .filter_map(|(i, b)| b.map(|b| (i, pool.keys[i].weight * b)))
            .collect();
        let total: f64 = scores.iter().map(|(_, s)| s).sum();
        let chosen = if scores.is_empty() {
            return None;
        } else if total > 0.0 && total.is_finite() {
            let mut point = self.rng.random::<f64>() * total;
            scores
                .iter()
                .find(|(_, s)| {
                    point -= s;
                    point < 0.0
                })
                .unwrap_or(&scores[scores.len() - 1])
                .0
        } else {
            // Every remaining key weighs zero (say, all balances read 0 with min_balance < 0):
            // fall back to a uniform pick rather than refusing to serve.
            scores[self.rng.random_range(0..scores.len())].0
        };
        self.tried[chosen] = true;
        Some(&pool.keys[chosen])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{HealthEvent, MemoryHealth};
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::time::Duration;

    fn entry(i: usize, weight: f64) -> Arc<KeyEntry> {
        let upstream = Upstream::parse("http://127.0.0.1:1").unwrap();
        let mut config = KeyConfig::new(&format!("k{i}"), &format!("key-{i:029}"), upstream);
        config.weight = weight;
        Arc::new(KeyEntry::from_config(KeyId(i as u16), &config))
    }

    fn pool(weights: &[f64]) -> KeyPool {
        let keys = weights
            .iter()
            .enumerate()
            .map(|(i, w)| entry(i, *w))
            .collect();
        KeyPool::new(keys, Arc::new(MemoryHealth::new()), 0.01)
    }

    fn first_pick_counts(pool: &KeyPool, rounds: usize) -> Vec<usize> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = vec![0; pool.keys().len()];
        let now = Instant::now();
        for _ in 0..rounds {
            let key = pool.candidates(&mut rng, now).next().unwrap();
            counts[key.id.0 as usize] += 1;
        }
        counts
    }

    #[tokio::test(start_paused = true)]
    async fn picks_follow_weight_times_balance() {
        let pool = pool(&[1.0, 2.0, 1.0]);
        pool.keys()[0].stats.set_balance(Some(10.0));
        pool.keys()[1].stats.set_balance(Some(10.0));
        pool.keys()[2].stats.set_balance(Some(30.0));
        // Expected shares: 10 : 20 : 30.
        let counts = first_pick_counts(&pool, 60_000);
        let shares: Vec<f64> = counts.iter().map(|c| *c as f64 / 60_000.0).collect();
        for (share, expected) in shares.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
            assert!((share - expected).abs() < 0.01, "{shares:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_balance_takes_the_average() {
        let pool = pool(&[1.0, 1.0, 1.0]);
        pool.keys()[0].stats.set_balance(Some(5.0));
        pool.keys()[1].stats.set_balance(Some(15.0));
        // Key 2 is unknown and weighs like the mean, 10: shares 5 : 15 : 10.
        let counts = first_pick_counts(&pool, 60_000);
        let share = counts[2] as f64 / 60_000.0;
        assert!((share - 1.0 / 3.0).abs() < 0.01, "{counts:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn keys_at_min_balance_or_out_of_rotation_are_never_picked() {
        let pool = pool(&[1.0, 1.0, 1.0]);
        pool.keys()[0].stats.set_balance(Some(0.01));
        pool.record(
            &pool.keys()[1],
            HealthEvent::Bench {
                reason: "ERROR_KEY_DOES_NOT_EXIST",
            },
            Instant::now(),
        );
        let counts = first_pick_counts(&pool, 1_000);
        assert_eq!(counts, vec![0, 0, 1_000]);
        assert_eq!(pool.active_count(Instant::now()), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn candidates_yield_each_usable_key_once() {
        let pool = pool(&[1.0, 5.0, 1.0, 1.0]);
        pool.record(
            &pool.keys()[3],
            HealthEvent::Cool {
                reason: "MAX_USER_TURN",
                duration: Duration::from_secs(10),
            },
            Instant::now(),
        );
        let mut rng = StdRng::seed_from_u64(1);
        let mut seen: Vec<u16> = pool
            .candidates(&mut rng, Instant::now())
            .map(|k| k.id.0)
            .collect();
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_cooled_mid_request_is_skipped() {
        let pool = pool(&[1.0, 1.0]);
        let mut rng = StdRng::seed_from_u64(3);
        let mut candidates = pool.candidates(&mut rng, Instant::now());
        let first = candidates.next().unwrap().id;
        let other = &pool.keys()[1 - first.0 as usize];
        pool.record(
            other,
            HealthEvent::Bench {
                reason: "ERROR_IP_NOT_ALLOWED",
            },
            Instant::now(),
        );
        candidates.at(Instant::now());
        assert!(candidates.next().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_rotation_yields_nothing() {
        let pool = pool(&[1.0]);
        pool.keys()[0].stats.set_balance(Some(0.0));
        assert!(pool
            .candidates(rand::rng(), Instant::now())
            .next()
            .is_none());
    }
}
