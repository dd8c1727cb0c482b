//! The key pool: the keys, what is known about each (balance, threads, health, load), and
//! which of them may take a new task. Knows weights, tiers, balances, health and thread
//! counts; does not know HTTP or the 2captcha wire format. Choosing among them is `select`.

mod holds;
mod select;
mod solve_times;

pub use holds::{
    parse_state, state_label, AdminHold, FileHolds, HoldChange, HoldError, HoldRecord, HoldStore,
    HoldsFileError, MemoryHolds,
};
pub use select::Candidates;
pub use solve_times::SolveTimes;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hyper::header::HeaderValue;
use tokio::time::Instant;

use crate::capacity::{Capacity, Lease, Load, NoSharedThreads, SharedThreads};
use crate::captcha::Profile;
use crate::config::{Config, KeyConfig, Prices, Strategy, Upstream};
use crate::forecast::{BalanceHistory, Forecast};
use crate::health::{HealthStore, HealthView, StateKind};
use crate::key_id::KeyId;
use crate::outage::Outages;
use crate::provider::Provider;
use crate::scaling::PoolFigures;
use crate::upstream::Account;
use crate::ApiKey;

/// One key of the pool and what keyrelay has learned about it.
#[derive(Debug)]
pub struct KeyEntry {
    pub id: KeyId,
    /// Label for logs, metrics and answers; the key itself is never shown.
    pub name: String,
    /// The name as the value of the `X-Keyrelay-Key` header of the answers this key serves,
    /// built once rather than per answer; `None` for a name a header cannot carry (validation
    /// allows none such, so that answer would just go without the header).
    pub name_header: Option<HeaderValue>,
    pub key: ApiKey,
    /// The service the key belongs to; its profile says what the service's answers mean.
    pub provider: Provider,
    /// Where the key's requests go (its provider's host unless the config names another).
    pub upstream: Upstream,
    pub weight: f64,
    /// The plan's thread count from the config, if given.
    pub threads: Option<u32>,
    /// Priority tier; 0 is the primary tier.
    pub tier: u32,
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
    /// When keyrelay last began a check of a verdict against the key, so that callers
    /// drawing the same verdict again and again cause one check per interval, not one each.
    check_begun: Mutex<Option<Instant>>,
    /// The last hour's balance readings, for the forecast. A std `Mutex`, as above.
    balance_history: Mutex<BalanceHistory>,
    /// What the pool's shared count says of the key, where replicas share the pool.
    pub shared: SharedView,
}

/// A key as the replicas sharing the pool see it: set from the shared count's answers and
/// its periodic sync, read on each pick only where a shared count exists.
#[derive(Debug, Default)]
pub struct SharedView {
    /// Threads the service works on beyond the shared count's leases, as the refresher
    /// read them.
    pub external: AtomicU32,
    /// Threads held across the replicas at the last sync: in use.
    pub held: AtomicU32,
    /// Spares across the replicas at the last sync: taken ahead by replicas for their next
    /// submits, so neither in use nor free.
    pub spares: AtomicU32,
    /// When the refresher published the readings this replica last adopted (unix ms), so
    /// that each of them is one forecast reading, not one per sync.
    pub readings_at: AtomicU64,
    /// The shared count said every thread is held: the key counts as full until then, so
    /// that submits move on (or wait) without asking again at once.
    full_until: Mutex<Option<Instant>>,
}

impl SharedView {
    /// How long a key stays full after the shared count said so, unless a sync shows a free thread.
    pub const FULL_HOLD: Duration = Duration::from_millis(100);

    pub fn set_full(&self, until: Option<Instant>) {
        *self
            .full_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = until;
    }

    pub fn full_until(&self) -> Option<Instant> {
        *self
            .full_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_full(&self, now: Instant) -> bool {
        self.full_until().is_some_and(|until| until > now)
    }
}

const UNKNOWN: u32 = u32::MAX;

impl Default for KeyStats {
    fn default() -> Self {
        KeyStats {
            balance: AtomicU64::new(f64::NAN.to_bits()),
            threads: AtomicU32::new(UNKNOWN),
            working: AtomicU32::new(UNKNOWN),
            last_error: Mutex::new(None),
            check_begun: Mutex::new(None),
            balance_history: Mutex::default(),
            shared: SharedView::default(),
        }
    }
}

impl KeyStats {
    /// Claims the key's next verdict check: true if none began within `interval` of `now`.
    pub fn begin_check(&self, now: Instant, interval: Duration) -> bool {
        let mut begun = self
            .check_begun
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if begun.is_some_and(|at| now.saturating_duration_since(at) < interval) {
            return false;
        }
        *begun = Some(now);
        true
    }

    /// The balance from the last successful `getbalance`, if the last read succeeded.
    pub fn balance(&self) -> Option<f64> {
        let value = f64::from_bits(self.balance.load(Ordering::Relaxed));
        (!value.is_nan()).then_some(value)
    }

    /// Sets the balance read now; a known one is also a reading for the forecast.
    pub fn set_balance(&self, balance: Option<f64>) {
        self.adopt_balance(balance, true);
    }

    /// Sets a balance read elsewhere (another replica's refresher), a reading for the forecast only
    /// if `new`: a sync finds the same reading every `sync_interval` until the next refresh,
    /// and recording each would fill the ring with seconds of copies instead of an hour.
    pub fn adopt_balance(&self, balance: Option<f64>, new: bool) {
        let balance = balance.filter(|b| b.is_finite());
        if let Some(balance) = balance.filter(|_| new) {
            self.history().record(Instant::now(), balance);
        }
        self.balance
            .store(balance.unwrap_or(f64::NAN).to_bits(), Ordering::Relaxed);
    }

    /// The balance's trend over the last hour of readings.
    pub fn forecast(&self, now: Instant) -> Forecast {
        self.history().forecast(now)
    }

    fn history(&self) -> std::sync::MutexGuard<'_, BalanceHistory> {
        self.balance_history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

    /// Records the last `threadsinfo`, or that it gave no figure (`None`: the key's
    /// threads are unknown again, and the configured `threads` apply).
    pub fn set_threads(&self, info: Option<(u32, u32)>) {
        // A reading is kept below the marker, which only `None` may store: clamping the
        // marker too once turned "unknown" into four billion known threads, lifting the
        // configured cap of every key whose threadsinfo failed or does not exist.
        let (threads, working) = info.map_or((UNKNOWN, UNKNOWN), |(threads, working)| {
            (threads.min(UNKNOWN - 1), working.min(UNKNOWN - 1))
        });
        self.threads.store(threads, Ordering::Relaxed);
        self.working.store(working, Ordering::Relaxed);
    }
}

impl KeyEntry {
    /// A new key, as the config describes it.
    pub fn from_config(id: KeyId, config: &KeyConfig) -> KeyEntry {
        KeyEntry {
            id,
            name: config.name.clone(),
            name_header: HeaderValue::from_str(&config.name).ok(),
            key: config.key.clone(),
            provider: config.provider,
            upstream: config.upstream.clone(),
            weight: config.weight,
            threads: config.threads,
            tier: config.tier,
            stats: Arc::new(KeyStats::default()),
        }
    }

    /// A known key with a reloaded config's settings: same id, same learned figures.
    pub fn reconfigured(old: &KeyEntry, config: &KeyConfig) -> KeyEntry {
        KeyEntry {
            stats: old.stats.clone(),
            ..KeyEntry::from_config(old.id, config)
        }
    }

    /// The key's thread capacity, which admission never exceeds: the upstream's figure
    /// when known, else the config's; `None` (no limit) when neither is.
    pub fn thread_capacity(&self) -> Option<u32> {
        self.stats.threads().map(|(t, _)| t).or(self.threads)
    }

    /// The key as keyrelay's own account reads use it.
    pub fn account(&self) -> Account<'_> {
        Account {
            name: &self.name,
            key: &self.key,
            upstream: &self.upstream,
            profile: self.profile(),
        }
    }

    /// What the key's service's answers mean.
    pub fn profile(&self) -> &'static Profile {
        Profile::of(self.provider)
    }
}

// === impl KeyPool ===

/// The slowest a returning key starts: a tenth of its share, so that it is tried at once
/// rather than not at all.
const SLOW_START_FLOOR: f64 = 0.1;

/// How a pool chooses keys; from the config, replaced with it.
#[derive(Clone, Debug)]
pub struct Selection {
    pub strategy: Strategy,
    /// Keys at or below this balance are out of rotation.
    pub min_balance: f64,
    /// How long a key back in rotation takes to reach its full share.
    pub slow_start: Duration,
    /// What a task of each method costs at each provider, for `cheapest`.
    pub prices: Prices,
}

impl Selection {
    pub fn from_config(config: &Config) -> Selection {
        Selection {
            strategy: config.strategy,
            min_balance: config.failover.min_balance,
            slow_start: config.capacity.slow_start,
            prices: config.prices.clone(),
        }
    }

    /// Whether a pick needs the submit's `method`: to price it, or to time it.
    pub fn reads_method(&self) -> bool {
        matches!(self.strategy, Strategy::Cheapest | Strategy::Fastest)
    }
}

/// The keys of one configuration, with the health store and thread counts they share with
/// every other configuration's pool.
pub struct KeyPool {
    keys: Vec<Arc<KeyEntry>>,
    health: Arc<dyn HealthStore>,
    capacity: Arc<Capacity>,
    /// The operator's holds, by name: shared with every other pool, as health is.
    holds: Arc<dyn HoldStore>,
    selection: Selection,
    /// Round-robin position: the index to look from for the next pick.
    cursor: AtomicUsize,
    /// The count of threads shared with other replicas: none for a single instance.
    shared: Arc<dyn SharedThreads>,
    /// Some key's provider is known not to serve some `method`.
    restricts_methods: bool,
    /// Which providers are down: shared with every other pool, as health is.
    outages: Arc<Outages>,
    /// Solve times seen per provider and method: shared with every other pool.
    solve_times: Arc<SolveTimes>,
}

impl KeyPool {
    pub fn new(
        keys: Vec<Arc<KeyEntry>>,
        health: Arc<dyn HealthStore>,
        capacity: Arc<Capacity>,
        selection: Selection,
    ) -> Self {
        KeyPool {
            restricts_methods: keys.iter().any(|k| !k.profile().unserved.is_empty()),
            keys,
            health,
            capacity,
            holds: Arc::new(MemoryHolds::default()),
            selection,
            cursor: AtomicUsize::new(0),
            shared: Arc::new(NoSharedThreads),
            outages: Arc::default(),
            solve_times: Arc::default(),
        }
    }

    /// The same pool, reading and recording solve times in `times` (the app's, which
    /// outlive every pool) instead of a table of its own.
    pub fn with_solve_times(mut self, times: Arc<SolveTimes>) -> Self {
        self.solve_times = times;
        self
    }

    /// Solve times seen per provider and method.
    pub fn solve_times(&self) -> &SolveTimes {
        &self.solve_times
    }

    /// The same pool, reading provider outages from `outages` (the app's, which outlive
    /// every pool) instead of a table of its own.
    pub fn with_outages(mut self, outages: Arc<Outages>) -> Self {
        self.outages = outages;
        self
    }

    /// Which providers are down, for every key of theirs.
    pub fn outages(&self) -> &Outages {
        &self.outages
    }

    /// The keys of `provider` in this pool.
    pub fn keys_of(&self, provider: Provider) -> usize {
        self.keys.iter().filter(|k| k.provider == provider).count()
    }

    /// The providers this pool's keys belong to, each once, in [`Provider::ALL`] order.
    pub fn providers(&self) -> impl Iterator<Item = Provider> + '_ {
        Provider::ALL
            .into_iter()
            .filter(|p| self.keys.iter().any(|k| k.provider == *p))
    }

    /// The same pool, counting threads with other replicas: a key's threads are counted
    /// across all of them, and while the shared count is away this one takes only its share.
    pub fn with_shared_threads(mut self, shared: Arc<dyn SharedThreads>) -> Self {
        self.shared = shared;
        self
    }

    /// The same pool, reading the operator's holds from `holds` (the app's, which outlive
    /// every pool) instead of a store of its own.
    pub fn with_admin_holds(mut self, holds: Arc<dyn HoldStore>) -> Self {
        self.holds = holds;
        self
    }

    /// The operator's hold on the key, if any.
    pub fn admin_hold(&self, key: &KeyEntry) -> Option<AdminHold> {
        self.holds.get(&key.name)
    }

    pub fn keys(&self) -> &[Arc<KeyEntry>] {
        &self.keys
    }

    /// The keys keyrelay may send requests of its own with (refreshes, provider probes):
    /// every key but those the operator disabled.
    pub fn askable(&self) -> impl Iterator<Item = &Arc<KeyEntry>> {
        self.keys
            .iter()
            .filter(|key| self.admin_hold(key) != Some(AdminHold::Disabled))
    }

    pub fn strategy(&self) -> Strategy {
        self.selection.strategy
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

    /// Whether new tasks may go to this key: healthy, not known to be out of balance, and not
    /// held by the operator (disabled or draining). A full key is still in rotation: it
    /// takes tasks again as soon as a thread frees.
    pub fn in_rotation(&self, key: &KeyEntry, now: Instant) -> bool {
        self.in_rotation_by(key, &self.health(key, now))
    }

    /// [`KeyPool::in_rotation`] for a health view already read.
    pub fn in_rotation_by(&self, key: &KeyEntry, view: &HealthView) -> bool {
        view.state == StateKind::Active
            && !self.below_min_balance(key)
            && self.admin_hold(key).is_none()
    }

    /// A key whose last balance read is at or below `min_balance`.
    pub fn below_min_balance(&self, key: &KeyEntry) -> bool {
        key.stats
            .balance()
            .is_some_and(|b| b <= self.selection.min_balance)
    }

    pub fn active_count(&self, now: Instant) -> usize {
        self.keys
            .iter()
            .filter(|k| self.in_rotation(k, now))
            .count()
    }

    /// The pool-wide figures an autoscaler reads (`scaling::recommend`), over the keys in
    /// rotation, with `queued` submits waiting. Threads are counted as admission counts
    /// them (shared with other replicas: their use as last synced), the way `threadsinfo` answers:
    /// a key without a known capacity adds one free thread above its use, since it takes
    /// any number of tasks.
    pub fn figures(&self, queued: usize, now: Instant) -> PoolFigures {
        let mut figures = PoolFigures {
            queued: queued as u64,
            balance_total: Some(0.0),
            ..PoolFigures::default()
        };
        for key in self.keys.iter().filter(|k| self.in_rotation(k, now)) {
            let used = u64::from(self.in_use(key));
            let (threads, in_use) = match key.thread_capacity().map(u64::from) {
                Some(capacity) => (capacity, used.min(capacity)),
                None => (used + 1, used),
            };
            figures.threads_total += threads;
            figures.threads_in_use += in_use;
            figures.balance_total = figures
                .balance_total
                .zip(key.stats.balance())
                .map(|(sum, balance)| sum + balance);
        }
        figures
    }

    /// The key's threads in use as keyrelay counts them.
    pub fn load(&self, key: &KeyEntry) -> Load {
        self.capacity.load(key.id)
    }

    /// The key's threads in use as selection weighs them: this replica's count, or in a
    /// pool shared with other replicas the shared count's (leases and others' use, as last
    /// synced) when that is higher, so that least-loaded spreads every replica's load.
    pub fn in_use(&self, key: &KeyEntry) -> u32 {
        let local = self.load(key).in_use();
        if !self.shared.is_whole() {
            return local;
        }
        let shared = &key.stats.shared;
        let held = shared.held.load(Ordering::Relaxed);
        local.max(held.saturating_add(shared.external.load(Ordering::Relaxed)))
    }

    /// Every thread of the key is in use (never, for a key without a known capacity).
    pub fn is_full(&self, key: &KeyEntry) -> bool {
        if self.shared.counts() && key.stats.shared.is_full(Instant::now()) {
            return true;
        }
        self.local_limit(key)
            .is_some_and(|capacity| self.load(key).in_use() >= capacity)
    }

    /// Takes one of the key's threads for a request, unless all are in use. Where replicas
    /// share the pool this is the local step: the shared count's seat is taken next.
    pub fn hold(&self, key: &KeyEntry) -> Option<Lease<'_>> {
        if self.shared.counts() && key.stats.shared.is_full(Instant::now()) {
            return None;
        }
        self.capacity.try_hold(key.id, self.local_limit(key))
    }

    /// The threads this replica may hold of the key: all of them when alone; none of its
    /// own while the shared count is whole (it is the one check, and a local count of tasks
    /// finished on other replicas lags); its share while the shared count is away, less what
    /// the others held beyond theirs when it went.
    fn local_limit(&self, key: &KeyEntry) -> Option<u32> {
        let capacity = key.thread_capacity()?;
        self.shared
            .own_limit(&key.name, capacity, self.shared_limit(key))
    }

    /// The limit the shared count is checked against: the key's threads less what the
    /// service works on for others (`u32::MAX` for a key of unknown capacity).
    pub fn shared_limit(&self, key: &KeyEntry) -> u32 {
        key.thread_capacity().map_or(u32::MAX, |capacity| {
            capacity.saturating_sub(key.stats.shared.external.load(Ordering::Relaxed))
        })
    }

    /// The share of its weight a key gets now: below 1 while it ramps up after coming back
    /// into rotation, from `SLOW_START_FLOOR` to 1 over `slow_start`.
    pub fn slow_start(&self, key: &KeyEntry, now: Instant) -> f64 {
        self.slow_start_by(&self.health(key, now), now)
    }

    /// [`KeyPool::slow_start`] for a health view already read.
    pub fn slow_start_by(&self, view: &HealthView, now: Instant) -> f64 {
        let ramp = self.selection.slow_start;
        match view.returned {
            Some(returned) if !ramp.is_zero() && view.state == StateKind::Active => {
                let elapsed = now.saturating_duration_since(returned);
                (elapsed.as_secs_f64() / ramp.as_secs_f64()).clamp(SLOW_START_FLOOR, 1.0)
            }
            _ => 1.0,
        }
    }

    /// The earliest end of a cooldown, when a key may come back by the clock alone (or,
    /// where replicas share the pool, of the shared count's "full" on a key).
    pub fn next_return(&self, now: Instant) -> Option<Instant> {
        let cooling = self
            .keys
            .iter()
            .map(|key| self.health(key, now))
            .filter(|view| view.state == StateKind::Cooling)
            .filter_map(|view| view.until);
        let shared_full = self
            .keys
            .iter()
            .filter(|_| self.shared.counts())
            .filter_map(|key| key.stats.shared.full_until())
            .filter(|&until| until > now);
        cooling.chain(shared_full).min()
    }

    /// Keys in try-order for a new task, each at most once: the keys of the lowest tier
    /// that has one in rotation and not full, chosen by the pool's strategy. Every call of
    /// `next` looks again, so a key cooled or filled meanwhile is passed over.
    pub fn candidates<R: rand::Rng>(&self, rng: R, now: Instant) -> Candidates<'_, R> {
        Candidates::new(self, rng, now)
    }

    /// Whether a submit's `method` picks its key: some key's provider is known not to
    /// serve some method, or the strategy prices the method. Only then is it read (strictly,
    /// as it goes upstream) before the pick.
    pub fn restricts_methods(&self) -> bool {
        self.restricts_methods || self.selection.reads_method()
    }

    /// Whether any key's provider serves `method`, in rotation or not.
    pub fn serves_method(&self, method: &str) -> bool {
        self.keys.iter().any(|k| k.profile().serves(method))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threadsinfo_with_no_figure_leaves_the_configured_threads_in_force() {
        let upstream = Upstream::parse("http://127.0.0.1:1").unwrap();
        let mut config = KeyConfig::new("k", "key-00000000000000000000000000001", upstream);
        config.threads = Some(5);
        let key = KeyEntry::from_config(KeyId(0), &config);
        assert_eq!(key.thread_capacity(), Some(5), "never read");
        key.stats.set_threads(None);
        assert_eq!(
            key.stats.threads(),
            None,
            "a failed read is unknown, not a figure"
        );
        assert_eq!(key.thread_capacity(), Some(5));
        key.stats.set_threads(Some((7, 2)));
        assert_eq!(key.thread_capacity(), Some(7), "the service's figure wins");
        key.stats.set_threads(Some((u32::MAX, u32::MAX)));
        assert_eq!(key.stats.threads(), Some((u32::MAX - 1, u32::MAX - 1)));
        key.stats.set_threads(None);
        assert_eq!(key.thread_capacity(), Some(5), "unknown again");
    }
}
