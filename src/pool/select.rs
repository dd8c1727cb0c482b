//! Choosing a key for a new task: tiers first, then the pool's strategy within the tier.
//!
//! Every pick looks at the pool afresh: which keys are in rotation, which are full, their
//! balances and loads. The candidates of one request come out at most once each, so a
//! failover never lands on a key the task already failed on, nor on one behind a host:port
//! that refused the task's connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rand::Rng;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::{KeyEntry, KeyPool};
use crate::captcha::ZeroBalance;
use crate::config::Strategy;
use crate::health::HealthView;
use crate::tokens::Token;

/// Per-key scratch of one pick, on the stack for pools of up to this many keys: a pick
/// runs for every submit, and the heap allocations of four `Vec`s were most of its cost.
const INLINE_KEYS: usize = 16;
type PerKey<T> = SmallVec<[T; INLINE_KEYS]>;

/// Iterator returned by [`KeyPool::candidates`].
pub struct Candidates<'a, R> {
    pool: &'a KeyPool,
    tried: PerKey<bool>,
    rng: R,
    now: Instant,
    /// Full keys count as candidates too (for requests that take no thread).
    ignore_load: bool,
    /// The last pick passed over a key only because it was full.
    saw_full: bool,
    /// The caller's token, when it may use only some of the keys.
    token: Option<&'a Token>,
    /// The submit's `method`, when some key's provider is known not to serve one.
    method: Option<&'a str>,
}

impl<'a, R: Rng> Candidates<'a, R> {
    pub(super) fn new(pool: &'a KeyPool, rng: R, now: Instant) -> Self {
        Candidates {
            pool,
            tried: smallvec::smallvec![false; pool.keys.len()],
            rng,
            now,
            ignore_load: false,
            saw_full: false,
            token: None,
            method: None,
        }
    }

    /// Only the keys whose provider serves `method` are candidates (`captcha::Profile`):
    /// a submit of a type one service lacks goes to the others instead of failing there.
    pub fn for_method(mut self, method: Option<&'a str>) -> Self {
        self.method = method;
        self
    }

    /// Only the keys `token` may use are candidates (all of them, for `None`).
    pub fn for_token(mut self, token: Option<&'a Token>) -> Self {
        self.token = token.filter(|t| t.is_limited());
        self
    }

    /// Moves the clock used for health checks, so keys cooled during this request's earlier
    /// attempts are seen as such.
    pub fn at(&mut self, now: Instant) {
        self.now = now;
    }

    /// Full keys are candidates too: for actions that take no thread.
    pub fn ignoring_load(mut self) -> Self {
        self.ignore_load = true;
        self
    }

    /// Whether the last `next` passed over keys in rotation only because they were full:
    /// `None` then means "wait for a thread", not "no key left".
    pub fn saw_full(&self) -> bool {
        self.saw_full
    }

    /// Makes `key` a candidate again: it was picked, but its thread went to another request
    /// before this one could take it.
    pub fn put_back(&mut self, key: &KeyEntry) {
        if let Some(i) = self.pool.keys.iter().position(|k| k.id == key.id) {
            self.tried[i] = false;
        }
    }

    /// `key`'s upstream refused the connection, or could not be reached, before anything was
    /// written. That is about its host:port, not the key, so every key behind the same
    /// host:port (whatever its path prefix or provider) is out of this walk too, as if
    /// tried. Only a failure pays for the scan; a pick never looks at origins.
    pub fn shun_origin_of(&mut self, key: &KeyEntry) {
        for (tried, other) in self.tried.iter_mut().zip(&self.pool.keys) {
            *tried |= other.upstream.same_origin(&key.upstream);
        }
    }

    /// Indices of the keys this pick chooses among: untried, in rotation, not full, and of
    /// the lowest tier that has any. Keys of a provider that is down come after every key
    /// of one that is up, whatever their tier: they are tried only when nothing else is
    /// left (so a pool of one provider still tries it), and never while a key of a live
    /// provider is only full, when waiting for its thread is the better bet.
    fn eligible(&mut self, views: &[HealthView]) -> PerKey<usize> {
        let pool = self.pool;
        self.saw_full = false;
        let down = pool.outages.down_set(self.now);
        let mut live_full = false;
        let mut open = PerKey::new();
        for (i, key) in pool.keys.iter().enumerate() {
            if self.tried[i] || !pool.in_rotation_by(key, &views[i]) {
                continue;
            }
            if self.token.is_some_and(|t| !t.may_use(key.id)) {
                continue;
            }
            if self.method.is_some_and(|m| !key.profile().serves(m)) {
                continue;
            }
            if !self.ignore_load && pool.is_full(key) {
                self.saw_full = true;
                live_full |= !down.contains(key.provider);
                continue;
            }
            open.push(i);
        }
        let rank = |i: usize| {
            let key = &pool.keys[i];
            (down.contains(key.provider), key.tier)
        };
        let Some(best) = open.iter().map(|&i| rank(i)).min() else {
            return open;
        };
        if best.0 && live_full {
            open.clear();
            return open;
        }
        open.retain(|i| rank(*i) == best);
        open
    }

    /// At random, in proportion to weight × balance × slow start.
    fn weighted(&mut self, eligible: &[usize], views: &[HealthView]) -> usize {
        let pool = self.pool;
        let fallback = mean_balance(pool, views);
        let scores: PerKey<f64> = eligible
            .iter()
            .map(|&i| {
                let key = &pool.keys[i];
                let balance = key.stats.balance().unwrap_or(fallback).max(0.0);
                key.weight * balance * pool.slow_start_by(&views[i], self.now)
            })
            .collect();
        let total: f64 = scores.iter().sum();
        if !(total > 0.0 && total.is_finite()) {
            // Every key weighs zero (say, all balances read 0 with min_balance < 0): pick
            // uniformly rather than refuse to serve.
            return eligible[self.rng.random_range(0..eligible.len())];
        }
        let mut point = self.rng.random::<f64>() * total;
        for (&i, score) in eligible.iter().zip(&scores) {
            point -= score;
            if point < 0.0 {
                return i;
            }
        }
        eligible[eligible.len() - 1]
    }

    /// The lowest price for the task's method among the eligible keys; weight × balance
    /// among the keys at that price. A key without a price costs 0 where its provider bills
    /// by threads, and the most elsewhere (it could cost anything). Without a method (the
    /// submit named none) every key is priced as without a price.
    fn cheapest(&mut self, eligible: &[usize], views: &[HealthView]) -> usize {
        let pool = self.pool;
        let method = self.method.unwrap_or("");
        let price = |i: usize| {
            let key = &pool.keys[i];
            let listed = pool.selection.prices.per_task(key.provider, method);
            listed.unwrap_or(match key.profile().zero_balance {
                ZeroBalance::Threads => 0.0,
                ZeroBalance::Funds => f64::INFINITY,
            })
        };
        let lowest = eligible
            .iter()
            .map(|&i| price(i))
            .fold(f64::INFINITY, f64::min);
        let cheapest: PerKey<usize> = eligible
            .iter()
            .copied()
            .filter(|&i| price(i) <= lowest)
            .collect();
        self.weighted(&cheapest, views)
    }

    /// The lowest observed solve time for the task's method at each key's provider;
    /// weight × balance among equals. Until every eligible key's provider has a trusted time
    /// for the method (`solve_times::MIN_SOLVES` solves), weight × balance alone: a provider
    /// not yet timed must get tasks to be timed at all.
    fn fastest(&mut self, eligible: &[usize], views: &[HealthView]) -> usize {
        let pool = self.pool;
        let method = self.method.unwrap_or("");
        let times: PerKey<Option<std::time::Duration>> = eligible
            .iter()
            .map(|&i| (pool.solve_times).typical(pool.keys[i].provider, method, self.now))
            .collect();
        let Some(times) = times.into_iter().collect::<Option<PerKey<_>>>() else {
            return self.weighted(eligible, views);
        };
        let best = times
            .iter()
            .min()
            .copied()
            .expect("eligible is never empty");
        let fastest: PerKey<usize> = eligible
            .iter()
            .zip(&times)
            .filter(|(_, took)| **took == best)
            .map(|(&i, _)| i)
            .collect();
        self.weighted(&fastest, views)
    }

    /// The lowest threads-in-use share (nginx's `least_conn`); the higher weight among
    /// equals, then at random. A key ramping up after a return counts its capacity scaled
    /// by its slow-start share, so it looks busier than it is.
    fn least_loaded(&mut self, eligible: &[usize], views: &[HealthView]) -> usize {
        let pool = self.pool;
        let fallback = mean_capacity(pool);
        let score = |i: usize| {
            let key = &pool.keys[i];
            let capacity = key.thread_capacity().map_or(fallback, f64::from);
            let usable = capacity * pool.slow_start_by(&views[i], self.now);
            let ratio = f64::from(pool.in_use(key)) / usable.max(f64::MIN_POSITIVE);
            (ratio, key.weight)
        };
        let scored: PerKey<(usize, (f64, f64))> = eligible.iter().map(|&i| (i, score(i))).collect();
        let best = scored
            .iter()
            .map(|(_, s)| *s)
            .reduce(|a, b| if better(b, a) { b } else { a })
            .expect("eligible is never empty");
        let ties: PerKey<usize> = scored
            .iter()
            .filter(|(_, s)| *s == best)
            .map(|(i, _)| *i)
            .collect();
        ties[self.rng.random_range(0..ties.len())]
    }

    /// The next eligible key at or after the pool's cursor, in config order. A key ramping
    /// up after a return takes its turn with probability equal to its slow-start share.
    fn round_robin(&mut self, eligible: &[usize], views: &[HealthView]) -> usize {
        let pool = self.pool;
        let n = pool.keys.len();
        loop {
            let seen = pool.cursor.load(Ordering::Relaxed);
            let cursor = seen % n;
            let mut order: PerKey<usize> = eligible.iter().copied().collect();
            // Config order, starting at the cursor and wrapping around.
            order.sort_by_key(|&i| (i + n - cursor) % n);
            let chosen = order
                .iter()
                .copied()
                .find(|&i| self.rng.random::<f64>() < pool.slow_start_by(&views[i], self.now))
                .unwrap_or(order[0]);
            // Concurrent picks each move the cursor on, so each gets the next key in turn.
            if pool
                .cursor
                .compare_exchange(seen, (chosen + 1) % n, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return chosen;
            }
        }
    }
}

/// Lower share first; equal shares: higher weight first.
fn better((ratio, weight): (f64, f64), (best_ratio, best_weight): (f64, f64)) -> bool {
    ratio < best_ratio || (ratio == best_ratio && weight > best_weight)
}

/// Balance used for a key whose own is unknown: the mean of the known balances of keys in
/// rotation (so a new key gets a fair share, not none), or 1 if none is known.
fn mean_balance(pool: &KeyPool, views: &[HealthView]) -> f64 {
    mean(
        pool.keys
            .iter()
            .zip(views)
            .filter(|(key, view)| pool.in_rotation_by(key, view))
            .filter_map(|(key, _)| key.stats.balance()),
    )
}

/// Capacity used for a key whose own is unknown: the mean of the known ones, or 1.
fn mean_capacity(pool: &KeyPool) -> f64 {
    mean(
        pool.keys
            .iter()
            .filter_map(|k| k.thread_capacity())
            .map(f64::from),
    )
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0u32), |(sum, n), v| (sum + v, n + 1));
    if count == 0 {
        1.0
    } else {
        sum / f64::from(count)
    }
}

impl<'a, R: Rng> Iterator for Candidates<'a, R> {
    type Item = &'a Arc<KeyEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        // Each key's health is read once per pick: every step below looks at it, and each
        // read is a lookup in a shared map.
        // Filled in place: a collected SmallVec is moved out whole, inline buffer and all.
        let mut views: PerKey<HealthView> = PerKey::new();
        views.extend(
            self.pool
                .keys
                .iter()
                .map(|key| self.pool.health(key, self.now)),
        );
        let eligible = self.eligible(&views);
        if eligible.is_empty() {
            return None;
        }
        let chosen = match self.pool.selection.strategy {
            Strategy::Weighted => self.weighted(&eligible, &views),
            Strategy::LeastLoaded => self.least_loaded(&eligible, &views),
            Strategy::RoundRobin => self.round_robin(&eligible, &views),
            Strategy::Cheapest => self.cheapest(&eligible, &views),
            Strategy::Fastest => self.fastest(&eligible, &views),
        };
        self.tried[chosen] = true;
        Some(&self.pool.keys[chosen])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{Capacity, Lease, MemoryLoad};
    use crate::captcha::TaskId;
    use crate::config::{KeyConfig, Upstream};
    use crate::health::{HealthEvent, MemoryHealth, Reason};
    use crate::key_id::KeyId;
    use crate::pool::Selection;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::time::Duration;

    /// (weight, tier, threads) per key.
    fn pool_of(strategy: Strategy, keys: &[(f64, u32, Option<u32>)]) -> KeyPool {
        let upstream = Upstream::parse("http://127.0.0.1:1").unwrap();
        let keys = keys
            .iter()
            .enumerate()
            .map(|(i, (weight, tier, threads))| {
                let mut config =
                    KeyConfig::new(&format!("k{i}"), &format!("key-{i:029}"), upstream.clone());
                config.weight = *weight;
                config.tier = *tier;
                config.threads = *threads;
                Arc::new(KeyEntry::from_config(KeyId(i as u16), &config))
            })
            .collect();
        let selection = Selection {
            strategy,
            min_balance: 0.01,
            slow_start: Duration::from_secs(30),
            prices: Default::default(),
        };
        let capacity = Arc::new(Capacity::new(Box::new(MemoryLoad::new())));
        KeyPool::new(keys, Arc::new(MemoryHealth::new()), capacity, selection)
    }

    fn pool(weights: &[f64]) -> KeyPool {
        let keys: Vec<_> = weights.iter().map(|w| (*w, 0, None)).collect();
        pool_of(Strategy::Weighted, &keys)
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

    /// Task ids unique across a test's calls of `load_up`.
    static NEXT_TASK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

    /// Picks `n` keys one after another, each taking and keeping a thread, as `n`
    /// concurrent tasks would.
    fn load_up(pool: &KeyPool, n: u64, rng: &mut StdRng) -> Vec<usize> {
        let mut counts = vec![0; pool.keys().len()];
        for _ in 0..n {
            let task = NEXT_TASK.fetch_add(1, Ordering::Relaxed);
            let key = pool.candidates(&mut *rng, Instant::now()).next().unwrap();
            let lease: Lease<'_> = pool.hold(key).expect("a candidate has a free thread");
            lease.keep_for(TaskId::Num(task), Instant::now());
            counts[key.id.0 as usize] += 1;
        }
        counts
    }

    #[tokio::test(start_paused = true)]
    async fn weighted_picks_follow_weight_times_balance() {
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
                reason: Reason::of_code("ERROR_KEY_DOES_NOT_EXIST"),
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
                reason: Reason::of_code("MAX_USER_TURN"),
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
                reason: Reason::of_code("ERROR_IP_NOT_ALLOWED"),
            },
            Instant::now(),
        );
        candidates.at(Instant::now());
        assert!(candidates.next().is_none());
        assert!(!candidates.saw_full());
    }

    #[tokio::test(start_paused = true)]
    async fn held_keys_take_no_new_task_until_the_hold_is_lifted() {
        use crate::pool::HoldStore as _;
        let holds = Arc::new(crate::pool::MemoryHolds::default());
        let pool = pool(&[1.0, 1.0, 1.0]).with_admin_holds(holds.clone());
        let any = &|_: &str| true;
        holds
            .set("k0", Some(crate::pool::AdminHold::Disabled), any)
            .unwrap();
        holds
            .set("k1", Some(crate::pool::AdminHold::Draining), any)
            .unwrap();
        assert_eq!(first_pick_counts(&pool, 1_000), vec![0, 0, 1_000]);
        let walk: Vec<u16> = pool
            .candidates(rand::rng(), Instant::now())
            .ignoring_load()
            .map(|k| k.id.0)
            .collect();
        assert_eq!(walk, vec![2], "a failover walk skips them too");
        assert_eq!(pool.active_count(Instant::now()), 1);
        holds
            .set("k2", Some(crate::pool::AdminHold::Draining), any)
            .unwrap();
        assert!(pool
            .candidates(rand::rng(), Instant::now())
            .next()
            .is_none());
        holds.set("k0", None, any).unwrap();
        assert_eq!(first_pick_counts(&pool, 100), vec![100, 0, 0]);
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

    #[tokio::test(start_paused = true)]
    async fn full_keys_are_passed_over_and_said_so() {
        let pool = pool_of(Strategy::Weighted, &[(1.0, 0, Some(1)), (1.0, 0, Some(1))]);
        let mut rng = StdRng::seed_from_u64(5);
        let counts = load_up(&pool, 2, &mut rng);
        assert_eq!(counts, vec![1, 1], "one task each, never two on one key");
        let mut candidates = pool.candidates(&mut rng, Instant::now());
        assert!(candidates.next().is_none());
        assert!(candidates.saw_full(), "full, not gone");
        let any = pool
            .candidates(&mut rng, Instant::now())
            .ignoring_load()
            .count();
        assert_eq!(any, 2, "actions that take no thread still see both keys");
    }

    #[tokio::test(start_paused = true)]
    async fn a_down_providers_keys_come_last_and_never_before_waiting_for_a_live_one() {
        use crate::outage::OutagePolicy;
        use crate::provider::Provider;
        let upstream = Upstream::parse("http://127.0.0.1:1").unwrap();
        let keys = [
            (Provider::CaptchaAi, 0, None),
            (Provider::CaptchaAi, 0, None),
            (Provider::TwoCaptcha, 1, Some(1)),
        ]
        .iter()
        .enumerate()
        .map(|(i, (provider, tier, threads))| {
            let mut config =
                KeyConfig::new(&format!("k{i}"), &format!("key-{i:029}"), upstream.clone());
            config.provider = *provider;
            config.tier = *tier;
            config.threads = *threads;
            Arc::new(KeyEntry::from_config(KeyId(i as u16), &config))
        })
        .collect();
        let selection = Selection {
            strategy: Strategy::Weighted,
            min_balance: 0.01,
            slow_start: Duration::from_secs(30),
            prices: Default::default(),
        };
        let capacity = Arc::new(Capacity::new(Box::new(MemoryLoad::new())));
        let pool = KeyPool::new(keys, Arc::new(MemoryHealth::new()), capacity, selection);
        let mut rng = StdRng::seed_from_u64(3);
        let ids = |pool: &KeyPool, rng: &mut StdRng| -> Vec<u16> {
            pool.candidates(rng, Instant::now())
                .map(|k| k.id.0)
                .collect()
        };
        assert_eq!(ids(&pool, &mut rng)[2], 2, "up: the backup tier comes last");
        let policy = OutagePolicy {
            threshold: 3,
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(300),
            jitter: 1.0,
        };
        for key in [0, 1, 0] {
            pool.outages()
                .failed(Provider::CaptchaAi, KeyId(key), 2, &policy, Instant::now());
        }
        let order = ids(&pool, &mut rng);
        assert_eq!(order[0], 2, "down: the backup first, whatever the tiers");
        assert_eq!(order.len(), 3, "and the down provider's keys still, last");
        // The live backup only full: wait for its thread rather than try a dead provider.
        let lease = pool.hold(&pool.keys()[2]).expect("its one thread");
        let mut candidates = pool.candidates(&mut rng, Instant::now());
        assert!(candidates.next().is_none());
        assert!(candidates.saw_full());
        drop(lease);
        // Once the cooldown ends, the provider's keys are back in their own tier.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_ne!(ids(&pool, &mut rng)[0], 2);
    }

    /// One key per upstream URL, each with one thread, weighted alike.
    fn pool_at(upstreams: &[&str]) -> KeyPool {
        let keys = upstreams
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let upstream = Upstream::parse(url).unwrap();
                let mut config =
                    KeyConfig::new(&format!("k{i}"), &format!("key-{i:029}"), upstream);
                config.threads = Some(1);
                Arc::new(KeyEntry::from_config(KeyId(i as u16), &config))
            })
            .collect();
        let selection = Selection {
            strategy: Strategy::Weighted,
            min_balance: 0.01,
            slow_start: Duration::from_secs(30),
            prices: Default::default(),
        };
        let capacity = Arc::new(Capacity::new(Box::new(MemoryLoad::new())));
        KeyPool::new(keys, Arc::new(MemoryHealth::new()), capacity, selection)
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusing_origin_takes_every_key_behind_it_out_of_the_walk() {
        let pool = pool_at(&[
            "http://127.0.0.1:9000/captchaai",
            "http://127.0.0.1:9000/2captcha",
            "http://127.0.0.1:9001",
            "http://127.0.0.1:9000",
            "https://127.0.0.1:9000",
        ]);
        let mut rng = StdRng::seed_from_u64(6);
        let mut candidates = pool.candidates(&mut rng, Instant::now());
        candidates.shun_origin_of(&pool.keys()[1]);
        let mut left: Vec<u16> = candidates.map(|k| k.id.0).collect();
        left.sort();
        assert_eq!(left, vec![2, 4], "another port, another scheme");

        // A full key behind the refusing origin is not waited for: the walk has nothing left.
        let lease = pool.hold(&pool.keys()[0]).expect("its one thread");
        let mut candidates = pool.candidates(&mut rng, Instant::now());
        candidates.shun_origin_of(&pool.keys()[3]);
        let mut left: Vec<u16> = candidates.by_ref().map(|k| k.id.0).collect();
        left.sort();
        assert_eq!(left, vec![2, 4]);
        assert!(!candidates.saw_full(), "nothing to wait for");
        drop(lease);
    }

    /// One key per (provider, threads), 2captcha's priced 2.99 and rucaptcha's 1.0 per
    /// 1,000 `userrecaptcha`; capmonster's and captchaai's unpriced.
    fn priced_pool(keys: &[(crate::provider::Provider, u32)]) -> KeyPool {
        pool_by_provider(Strategy::Cheapest, keys)
    }

    fn pool_by_provider(strategy: Strategy, keys: &[(crate::provider::Provider, u32)]) -> KeyPool {
        use crate::provider::Provider;
        let upstream = Upstream::parse("http://127.0.0.1:1").unwrap();
        let keys = keys
            .iter()
            .enumerate()
            .map(|(i, (provider, threads))| {
                let mut config =
                    KeyConfig::new(&format!("k{i}"), &format!("key-{i:029}"), upstream.clone());
                config.provider = *provider;
                config.threads = Some(*threads);
                Arc::new(KeyEntry::from_config(KeyId(i as u16), &config))
            })
            .collect();
        let mut prices = crate::config::Prices::default();
        prices.set(Provider::TwoCaptcha, "userrecaptcha", 2.99);
        prices.set(Provider::RuCaptcha, "userrecaptcha", 1.0);
        let selection = Selection {
            strategy,
            min_balance: 0.01,
            slow_start: Duration::from_secs(30),
            prices,
        };
        let capacity = Arc::new(Capacity::new(Box::new(MemoryLoad::new())));
        KeyPool::new(keys, Arc::new(MemoryHealth::new()), capacity, selection)
    }

    #[tokio::test(start_paused = true)]
    async fn cheapest_takes_the_lowest_price_and_the_next_when_it_is_full() {
        use crate::provider::Provider::*;
        // A thread-billed key without a price costs 0; a pay-per-task one without a price
        // could cost anything, so it comes last.
        let pool = priced_pool(&[
            (TwoCaptcha, 2),
            (CapMonster, 2),
            (RuCaptcha, 2),
            (CaptchaAi, 2),
        ]);
        let mut rng = StdRng::seed_from_u64(5);
        let mut order = Vec::new();
        for task in 0..8 {
            let key = pool
                .candidates(&mut rng, Instant::now())
                .for_method(Some("userrecaptcha"))
                .next()
                .expect("a key with room");
            order.push(key.id.0);
            pool.hold(key)
                .unwrap()
                .keep_for(TaskId::Num(task), Instant::now());
        }
        assert_eq!(order, vec![3, 3, 2, 2, 0, 0, 1, 1]);
        // A method without prices: the thread-billed key first, then the others at random
        // (all "the most").
        let pool = priced_pool(&[(TwoCaptcha, 9), (CaptchaAi, 1)]);
        let first = pool
            .candidates(&mut rng, Instant::now())
            .for_method(Some("base64"))
            .next()
            .unwrap();
        assert_eq!(first.id, KeyId(1));
    }

    #[tokio::test(start_paused = true)]
    async fn fastest_goes_by_weight_until_every_provider_is_timed_then_to_the_fastest() {
        use crate::provider::Provider::*;
        let pool = pool_by_provider(Strategy::Fastest, &[(TwoCaptcha, 100), (RuCaptcha, 2)]);
        let mut rng = StdRng::seed_from_u64(3);
        let pick = |rng: &mut StdRng| {
            pool.candidates(rng, Instant::now())
                .for_method(Some("userrecaptcha"))
                .next()
                .unwrap()
                .id
                .0
        };
        let now = Instant::now();
        // RuCaptcha timed fast, 2captcha only four times: not trusted yet, so both share.
        for _ in 0..5 {
            pool.solve_times()
                .record(RuCaptcha, "userrecaptcha", Duration::from_secs(8), now);
        }
        for _ in 0..4 {
            pool.solve_times()
                .record(TwoCaptcha, "userrecaptcha", Duration::from_secs(30), now);
        }
        let picks: Vec<u16> = (0..200).map(|_| pick(&mut rng)).collect();
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
        // Both timed: the fastest every time, the other when it is full.
        pool.solve_times()
            .record(TwoCaptcha, "userrecaptcha", Duration::from_secs(30), now);
        let mut order = Vec::new();
        for task in 0..4 {
            let key = pool
                .candidates(&mut rng, Instant::now())
                .for_method(Some("userrecaptcha"))
                .next()
                .unwrap();
            order.push(key.id.0);
            pool.hold(key)
                .unwrap()
                .keep_for(TaskId::Num(task), Instant::now());
        }
        assert_eq!(order, vec![1, 1, 0, 0]);
        // Another method has its own times: none yet, so weight x balance again.
        let other: Vec<u16> = (0..200)
            .map(|_| {
                pool.candidates(&mut rng, Instant::now())
                    .for_method(Some("turnstile"))
                    .next()
                    .unwrap()
                    .id
                    .0
            })
            .collect();
        assert!(other.contains(&0), "{other:?}");
        assert!(pool.restricts_methods(), "the method is read to time it");
    }

    #[tokio::test(start_paused = true)]
    async fn cheapest_breaks_ties_by_weight_and_balance() {
        use crate::provider::Provider::*;
        let pool = priced_pool(&[(RuCaptcha, 100), (RuCaptcha, 100)]);
        let mut rng = StdRng::seed_from_u64(9);
        let mut counts = [0u32; 2];
        for _ in 0..400 {
            let key = pool
                .candidates(&mut rng, Instant::now())
                .for_method(Some("userrecaptcha"))
                .next()
                .unwrap();
            counts[usize::from(key.id.0)] += 1;
        }
        assert!(
            counts.iter().all(|&n| n > 120),
            "both keys share the ties: {counts:?}"
        );
        assert!(pool.selection.reads_method());
        assert!(pool.restricts_methods(), "the method is read to price it");
    }

    #[tokio::test(start_paused = true)]
    async fn least_loaded_fills_keys_in_proportion_to_their_threads() {
        // 5, 15 and 50 threads: each pick goes to the lowest share in use, so after 35
        // tasks every key is half full, and after 70 every key is full.
        let pool = pool_of(
            Strategy::LeastLoaded,
            &[(1.0, 0, Some(5)), (1.0, 0, Some(15)), (1.0, 0, Some(50))],
        );
        let mut rng = StdRng::seed_from_u64(11);
        let half = load_up(&pool, 35, &mut rng);
        let loads: Vec<u32> = pool.keys().iter().map(|k| pool.load(k).in_use()).collect();
        assert!(
            loads
                .iter()
                .zip([5.0, 15.0, 50.0])
                .all(|(l, cap)| (f64::from(*l) - cap / 2.0).abs() <= 1.0),
            "half full each, within one task: {loads:?} after {half:?}"
        );
        load_up(&pool, 35, &mut rng);
        let loads: Vec<u32> = pool.keys().iter().map(|k| pool.load(k).in_use()).collect();
        assert_eq!(loads, vec![5, 15, 50]);
        assert!(pool.candidates(&mut rng, Instant::now()).next().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn least_loaded_breaks_ties_by_weight() {
        let pool = pool_of(
            Strategy::LeastLoaded,
            &[(1.0, 0, Some(10)), (3.0, 0, Some(10))],
        );
        let mut rng = StdRng::seed_from_u64(2);
        // Both idle: the heavier key first, every time.
        for _ in 0..100 {
            let key = pool.candidates(&mut rng, Instant::now()).next().unwrap();
            assert_eq!(key.id, KeyId(1));
        }
        // Then strictly alternating: after each pick the other key has the lower share.
        let order: Vec<u16> = (0..6)
            .map(|task| {
                let key = pool.candidates(&mut rng, Instant::now()).next().unwrap();
                pool.hold(key)
                    .unwrap()
                    .keep_for(TaskId::Num(task), Instant::now());
                key.id.0
            })
            .collect();
        assert_eq!(order, vec![1, 0, 1, 0, 1, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn round_robin_takes_each_usable_key_in_turn() {
        let pool = pool_of(
            Strategy::RoundRobin,
            &[(1.0, 0, None), (9.0, 0, None), (1.0, 0, None)],
        );
        let mut rng = StdRng::seed_from_u64(4);
        let mut pick = || {
            pool.candidates(&mut rng, Instant::now())
                .next()
                .unwrap()
                .id
                .0
        };
        let order: Vec<u16> = (0..7).map(|_| pick()).collect();
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2, 0], "weights do not matter");
        pool.record(
            &pool.keys()[1],
            HealthEvent::Bench {
                reason: Reason::OtherCode,
            },
            Instant::now(),
        );
        let order: Vec<u16> = (0..4).map(|_| pick()).collect();
        assert_eq!(order, vec![2, 0, 2, 0], "a benched key is skipped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failover_walk_still_tries_every_key_once_in_round_robin() {
        let pool = pool_of(Strategy::RoundRobin, &[(1.0, 0, None); 4]);
        let mut rng = StdRng::seed_from_u64(4);
        let walk: Vec<u16> = pool
            .candidates(&mut rng, Instant::now())
            .map(|k| k.id.0)
            .collect();
        assert_eq!(walk, vec![0, 1, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn backup_tiers_get_nothing_while_a_lower_tier_has_room() {
        let pool = pool_of(
            Strategy::Weighted,
            &[
                (1.0, 1, None),
                (1.0, 0, Some(2)),
                (1.0, 0, Some(2)),
                (1.0, 2, None),
            ],
        );
        let mut rng = StdRng::seed_from_u64(8);
        assert_eq!(load_up(&pool, 4, &mut rng), vec![0, 2, 2, 0]);
        // Tier 0 is full: tier 1 takes everything, tier 2 still nothing.
        assert_eq!(load_up(&pool, 50, &mut rng), vec![50, 0, 0, 0]);
        pool.record(
            &pool.keys()[0],
            HealthEvent::Bench {
                reason: Reason::OtherCode,
            },
            Instant::now(),
        );
        assert_eq!(load_up(&pool, 5, &mut rng), vec![0, 0, 0, 5]);
        // A failover walk goes down the tiers in order.
        let fresh = pool_of(
            Strategy::Weighted,
            &[(1.0, 1, None), (1.0, 0, None), (1.0, 2, None)],
        );
        let walk: Vec<u16> = fresh
            .candidates(&mut rng, Instant::now())
            .map(|k| k.id.0)
            .collect();
        assert_eq!(walk, vec![1, 0, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_returning_key_ramps_up_its_share() {
        let pool = pool(&[1.0, 1.0]);
        pool.record(
            &pool.keys()[1],
            HealthEvent::Cool {
                reason: Reason::of_code("MAX_USER_TURN"),
                duration: Duration::from_secs(10),
            },
            Instant::now(),
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        let key = &pool.keys()[1];
        assert_eq!(pool.slow_start(key, Instant::now()), 0.1, "the floor");
        assert_eq!(pool.slow_start(&pool.keys()[0], Instant::now()), 1.0);
        // A tenth of the weight: 1 : 0.1.
        let share = first_pick_counts(&pool, 20_000)[1] as f64 / 20_000.0;
        assert!((share - 0.1 / 1.1).abs() < 0.01, "{share}");
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(pool.slow_start(key, Instant::now()), 0.5);
        let share = first_pick_counts(&pool, 20_000)[1] as f64 / 20_000.0;
        assert!((share - 0.5 / 1.5).abs() < 0.01, "{share}");
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(pool.slow_start(key, Instant::now()), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_never_out_of_rotation_start_at_full_share() {
        let pool = pool(&[1.0]);
        assert_eq!(pool.slow_start(&pool.keys()[0], Instant::now()), 1.0);
    }
}
