//! `App`: the cheap-to-clone handle to everything a request needs: the current pool
//! snapshot, the pins, health, the operator's holds, metrics, the upstream client and the
//! event feed.

mod health_events;
mod holds;
mod provider_outages;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tower::retry::budget::{Budget, TpsBudget};

use crate::budgets::Budgets;
use crate::capacity::{Capacity, MemoryLoad, NoSharedThreads, ReadMark, SharedThreads};
use crate::cluster::{Cluster, ClusterError};
use crate::config::Config;
use crate::config::DEFAULT_BUDGET_PERIOD;
use crate::health::{HealthStore, MemoryHealth, NoSharedHealth, Reason, SharedHealth, StateKind};
use crate::metrics::{Metrics, Release};
use crate::outage::Outages;
use crate::pins::{JournalPins, MemoryPins, NoSharedPins, PinStore, ProbeState, SharedPins};
use crate::polling::{NoSharedPolls, PollShaper, SharedPolls};
use crate::pool::{
    FileHolds, HoldStore, HoldsFileError, KeyEntry, KeyPool, MemoryHolds, Selection, SolveTimes,
};
use crate::provider::Provider;
use crate::registry::{KeyRegistry, RegistryFull};
use crate::tls::{LocalCa, TlsError};
use crate::tokens::{Denials, TokenCounters, TokenTable};
use crate::upstream::roots::{self, RootsError};
use crate::upstream::UpstreamClient;

/// The configuration and the pool built from it, replaced as a whole.
pub struct Snapshot {
    pub config: Config,
    pub pool: KeyPool,
    /// `[[access.tokens]]` resolved against `pool`; empty: no token is asked for.
    pub tokens: TokenTable,
}

/// Something worth telling an observer (the demo, tests) as it happens.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A key changed state.
    KeyState {
        key: String,
        from: StateKind,
        to: StateKind,
        reason: Option<Reason>,
    },
    /// A task left `key` for another key because of `reason`.
    Failover { key: String, reason: &'static str },
    /// A submit was accepted upstream and pinned.
    Pinned { key: String, task_id: String },
    /// A whole provider went down (`up: false`) or answered again after an outage.
    Provider { provider: Provider, up: bool },
}

/// How long a first attempt keeps earning retries in the budget.
const RETRY_BUDGET_WINDOW: Duration = Duration::from_secs(10);

/// Events are for live observers; a slow one misses old events rather than slowing requests.
const EVENT_BUFFER: usize = 1024;

/// Shared state of one keyrelay instance.
#[derive(Clone)]
pub struct App(Arc<Inner>);

struct Inner {
    /// Loaded once per request (`load_full`) so a request sees one consistent pool.
    snapshot: ArcSwap<Snapshot>,
    /// Outlives snapshots: tasks must keep polling with their key.
    pins: Arc<dyn PinStore>,
    /// The fleet's copy of pins, read for a task with no pin here; none for a single
    /// instance.
    shared_pins: Arc<dyn SharedPins>,
    /// The fleet's count of threads, where submits take a seat after their thread here;
    /// none for a single instance.
    shared_threads: Arc<dyn SharedThreads>,
    /// Where key health changes and the IP-ban pause go for other replicas to adopt;
    /// nowhere for a single instance.
    shared_health: Arc<dyn SharedHealth>,
    /// Where polling turns and kept answers are shared across replicas; nowhere for a
    /// single instance.
    shared_polls: Arc<dyn SharedPolls>,
    /// Every key ever configured, by stable id; outlives snapshots for the same reason.
    /// Shared with the pin journal, which writes keys by name.
    registry: Arc<KeyRegistry>,
    /// Outlives snapshots, keyed by key id, so health is not reset by a rebuild.
    health: Arc<dyn HealthStore>,
    /// Threads in use per key and the queue for a full pool; outlives snapshots, so a
    /// reload neither forgets running tasks nor drops queued submits.
    capacity: Arc<Capacity>,
    /// The operator's holds on keys, by name; outlive snapshots, so a hold lasts through
    /// reloads until it is lifted. Shared with every pool, which reads them on each pick.
    /// In `data_dir` when there is one, so they outlive the process too.
    holds: Arc<dyn HoldStore>,
    /// Which providers are down; outlives snapshots, as health does.
    outages: Arc<Outages>,
    /// Solve times seen per provider and method; outlive snapshots, as health does.
    solve_times: Arc<SolveTimes>,
    /// Providers being probed after an outage, as a bit set: one probe each at a time.
    probing: std::sync::atomic::AtomicU8,
    metrics: Metrics,
    client: UpstreamClient,
    events: broadcast::Sender<Event>,
    /// When this instance started, for the status page's uptime.
    started: Instant,
    /// Set while all upstream traffic is paused because the service banned keyrelay's IP.
    /// A std `Mutex`: read and written in a few instructions, never across an await.
    paused_until: Mutex<Option<Instant>>,
    /// What the owner probe keeps between requests: ids found to be nobody's, and the
    /// budget its upstream requests draw from.
    probe: ProbeState,
    /// Each open task's polling cadence and the final answers kept; outlives snapshots, as
    /// pins do.
    polling: PollShaper,
    /// What each caller token's tasks have spent; outlives snapshots, and is saved in
    /// `data_dir` (`budgets.json`) so it outlives the process too.
    budgets: Budgets,
    /// Threads held per caller token, by name; outlives snapshots as `capacity` does.
    token_counters: Arc<TokenCounters>,
    /// Wrong tokens by address: the allowance that rate-limits token guessing.
    denials: Denials,
    /// Held while an attempt's health decision is made and applied (a few instructions,
    /// never across an await), so the ejection cap counts every cooldown in flight.
    ejection_lock: Mutex<()>,
    /// Every API request runs in a task of its own (so a caller leaving cannot cut it short),
    /// tracked so that shutdown waits for the ones whose callers left.
    requests: TaskTracker,
    /// Caps retries to a share of recent first attempts, so an upstream outage cannot
    /// multiply the traffic keyrelay sends it.
    retry_budget: TpsBudget,
    /// Set only for reproducible runs (the demo): every request's randomness then derives
    /// from one seeded generator, so a sequential workload picks the same keys every time.
    seeded: Option<Mutex<SmallRng>>,
    /// The local CA, made or loaded on first use ([`App::ca`]) from the `[ca]` and
    /// `data_dir` of that moment: tests and setups that never need a certificate never
    /// write one.
    ca: Mutex<Option<Arc<LocalCa>>>,
    /// The fleet this replica shares its pool with, if `[cluster]` is configured. Fixed
    /// for the process's life: joining or leaving a cluster takes a restart.
    cluster: Option<Arc<Cluster>>,
}

/// Why an [`App`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot set up TLS for the upstream client: {0}")]
    Tls(#[from] rustls::Error),
    #[error(transparent)]
    UpstreamCa(#[from] RootsError),
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Registry(#[from] RegistryFull),
    #[error("cannot set up the cluster: {0}")]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Holds(#[from] HoldsFileError),
    #[error("cannot open the pin journal in {dir}: {source}")]
    Pins {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl App {
    /// Builds the pool from a validated config.
    ///
    /// # Errors
    /// TLS setup or metric registration failures, neither of which depends on the config.
    pub fn new(config: Config) -> Result<App, AppError> {
        App::build(config, None)
    }

    /// Like [`App::new`], with key selection and jitter drawn from a seeded generator.
    ///
    /// # Errors
    /// As [`App::new`].
    pub fn with_seed(config: Config, seed: u64) -> Result<App, AppError> {
        App::build(config, Some(seed))
    }

    fn build(config: Config, seed: Option<u64>) -> Result<App, AppError> {
        let health: Arc<dyn HealthStore> = Arc::new(MemoryHealth::new());
        let roots = roots::configured(config.upstream_ca.as_deref())?;
        let client = UpstreamClient::new(
            config.timeouts.connect,
            roots,
            config.upstream_proxy.as_ref(),
        )?;
        let metrics = Metrics::new()?;
        metrics.admit_keys(config.keys.iter().map(|k| k.name.as_str()));
        metrics.admit_providers(config.keys.iter().map(|k| k.provider));
        metrics.admit_tokens(config.access.tokens.iter().map(|t| t.name.as_str()));
        let registry = Arc::new(KeyRegistry::new());
        let capacity = Arc::new(Capacity::new(Box::new(MemoryLoad::new())));
        let holds = open_holds(&config)?;
        let outages = Arc::new(Outages::new());
        let cluster = match &config.cluster {
            Some(shared) => Some(Arc::new(Cluster::new(
                shared.clone(),
                config.pins.ttl,
                config.data_dir.as_deref(),
            )?)),
            None => None,
        };
        // Single instance and cluster differ in these stores, chosen here, and nowhere on
        // the request path or in the pool.
        let (shared_pins, shared_threads, shared_health, shared_polls): SharedStores =
            match &cluster {
                Some(cluster) => (
                    Arc::new(cluster.clone()),
                    Arc::new(cluster.clone()),
                    Arc::new(cluster.clone()),
                    Arc::new(cluster.clone()),
                ),
                None => (
                    Arc::new(NoSharedPins),
                    Arc::new(NoSharedThreads),
                    Arc::new(NoSharedHealth),
                    Arc::new(NoSharedPolls),
                ),
            };
        let solve_times = Arc::new(SolveTimes::default());
        let shares = PoolShares {
            health: health.clone(),
            capacity: capacity.clone(),
            holds: holds.clone(),
            outages: outages.clone(),
            shared_threads: shared_threads.clone(),
            solve_times: solve_times.clone(),
        };
        let pool = build_pool(&config, &registry, shares)?;
        let token_counters = Arc::new(TokenCounters::default());
        let pins = open_pins(&config, &registry, &token_counters)?;
        let retry_budget = TpsBudget::new(
            RETRY_BUDGET_WINDOW,
            config.failover.retry_budget_min,
            config.failover.retry_budget as f32,
        );
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let tokens = token_table(&config, &pool, &token_counters);
        let config_data_dir = config.data_dir.clone();
        Ok(App(Arc::new(Inner {
            snapshot: ArcSwap::from_pointee(Snapshot {
                config,
                pool,
                tokens,
            }),
            pins,
            shared_pins,
            shared_threads,
            shared_health,
            shared_polls,
            registry,
            health,
            capacity,
            holds,
            outages,
            solve_times,
            probing: std::sync::atomic::AtomicU8::new(0),
            metrics,
            client,
            events,
            seeded: seed.map(|s| Mutex::new(SmallRng::seed_from_u64(s))),
            started: Instant::now(),
            paused_until: Mutex::new(None),
            probe: ProbeState::default(),
            polling: PollShaper::default(),
            budgets: open_budgets(&config_data_dir),
            token_counters,
            denials: Denials::default(),
            ejection_lock: Mutex::new(()),
            requests: TaskTracker::new(),
            retry_budget,
            ca: Mutex::new(None),
            cluster,
        })))
    }

    /// The local CA that issues the `[tls]` listener's certificate and the forward proxy's
    /// leaves: loaded or generated on the first call (`keyrelay` makes it at start), the
    /// same one after. `[ca]` changes take effect at the next start.
    ///
    /// # Errors
    /// The CA's files are unreadable, invalid or half a pair ([`TlsError`] names the file);
    /// the next call tries again.
    pub fn ca(&self) -> Result<Arc<LocalCa>, TlsError> {
        // Held while the files are read or written, once per process, so that two first
        // callers cannot both generate a CA.
        let mut ca = self.0.ca.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ca) = &*ca {
            return Ok(ca.clone());
        }
        let config = &self.snapshot().config;
        let made = Arc::new(LocalCa::load_or_create(
            &config.ca,
            config.data_dir.as_deref(),
        )?);
        *ca = Some(made.clone());
        Ok(made)
    }

    /// The current configuration and pool, owned, so it can be held across awaits.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.0.snapshot.load_full()
    }

    /// Caches here a pin another replica wrote: polls of the task go out with its key from
    /// now on without asking Redis again. `None` if no key of that name was ever configured.
    pub fn adopt_pin(
        &self,
        task: &crate::captcha::TaskId,
        shared: &crate::pins::SharedPin,
    ) -> Option<crate::pins::Pin> {
        let key = self.0.registry.id_of(&shared.key)?;
        let token = if shared.token.is_empty() {
            crate::tokens::TokenId::NONE
        } else {
            self.0.token_counters.id_of(&shared.token)
        };
        self.0
            .pins
            .pin_for(task.clone(), key, token, Instant::now());
        Some(crate::pins::Pin { key, token })
    }

    /// Every live pin as the fleet stores it: the task id, and `key name \t token name`
    /// (empty: none). For putting the fleet's copy back after Redis lost it.
    pub fn pins_to_share(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        self.0
            .pins
            .live_pins(now)
            .into_iter()
            .filter_map(|(task, pin)| {
                let key = self.0.registry.get(pin.key)?;
                let token = self.0.token_counters.name(pin.token);
                let value = [&*key.name, "\t", token.as_deref().unwrap_or("")].concat();
                Some((task.to_string(), value))
            })
            .collect()
    }

    /// The fleet, when this replica is one of several sharing the pool.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.0.cluster.as_ref()
    }

    pub fn pins(&self) -> &dyn PinStore {
        &*self.0.pins
    }

    /// The fleet's count of threads (none for a single instance).
    pub fn shared_threads(&self) -> &dyn SharedThreads {
        &*self.0.shared_threads
    }

    /// The fleet's copy of pins (none for a single instance).
    pub fn shared_pins(&self) -> &dyn SharedPins {
        &*self.0.shared_pins
    }

    pub fn shared_polls(&self) -> &dyn SharedPolls {
        &*self.0.shared_polls
    }

    /// Every key this process has served, current or retired, by id.
    pub fn registry(&self) -> &KeyRegistry {
        &self.0.registry
    }

    pub fn health(&self) -> &dyn HealthStore {
        &*self.0.health
    }

    /// Threads in use per key, leases, and the queue for a full pool.
    pub fn polling(&self) -> &PollShaper {
        &self.0.polling
    }

    pub fn budgets(&self) -> &Budgets {
        &self.0.budgets
    }

    /// Saves the budgets' ledger in `data_dir`, if it changed since the last save and there
    /// is a `data_dir`. Blocking file I/O: run it off the request path.
    ///
    /// # Errors
    /// The file's I/O error; the ledger is saved again at the next call.
    pub fn save_budgets(&self) -> std::io::Result<()> {
        let Some(path) = budgets_path(self.snapshot().config.data_dir.as_deref()) else {
            return Ok(());
        };
        let Some(saved) = self.0.budgets.to_save() else {
            return Ok(());
        };
        let text = serde_json::to_vec(&saved).expect("the ledger serializes");
        crate::atomic_file::replace(&path, &text).inspect_err(|_| self.0.budgets.mark_dirty())
    }

    pub fn capacity(&self) -> &Capacity {
        &self.0.capacity
    }

    /// A task got its final answer: its thread is free again (counted the first time only).
    pub fn finish_task(&self, task: &crate::captcha::TaskId) {
        let key = self.0.capacity.finish(task);
        if key.is_some() {
            self.count_releases(Release::Final, 1);
        }
        if self.0.shared_threads.counts() {
            // Another replica's task holds a seat in the fleet's count, named by the task
            // id: whoever sees the final answer gives it back.
            let owner = key.or_else(|| self.0.pins.owner(task, Instant::now()));
            if let Some(entry) = owner.and_then(|id| self.0.registry.get(id)) {
                self.0.shared_threads.finished(&entry.name, task);
            }
        }
    }

    /// A task this replica created had its final answer polled on another replica, which
    /// gave the fleet's thread back: the local count follows.
    pub fn finished_elsewhere(&self, task: &crate::captcha::TaskId) {
        if self.0.capacity.finish(task).is_some() {
            self.count_releases(Release::Final, 1);
        }
    }

    /// Aligns `key`'s thread count with the upstream's `working` threads, read by a request
    /// sent after `mark` (see `LoadStore::reconcile`), and counts the threads that gives back.
    pub fn reconcile_threads(&self, key: &KeyEntry, working: u32, mark: ReadMark) {
        debug_assert_eq!(mark.key(), key.id, "a read is reconciled with its own key");
        let released = self.0.capacity.reconcile(mark, working);
        if released > 0 {
            self.count_releases(Release::Reconciled, u64::from(released));
            tracing::debug!(key = %key.name, released, working, "threads reconciled with threadsinfo");
        }
    }

    /// Gives back the threads of tasks open since before `cutoff` and counts them; one key
    /// per task released.
    pub fn release_stale_threads(&self, cutoff: Instant) -> Vec<crate::key_id::KeyId> {
        let released = self.0.capacity.release_stale(cutoff);
        self.count_releases(Release::Stale, released.len() as u64);
        released
    }

    /// The one place thread releases are counted, by reason.
    fn count_releases(&self, reason: Release, released: u64) {
        if released > 0 {
            self.0.metrics.count_releases(reason, released);
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    pub fn client(&self) -> &UpstreamClient {
        &self.0.client
    }

    /// Stops all upstream traffic for `duration`: the service has banned keyrelay's IP,
    /// and every request, on any key, would extend the ban.
    pub fn pause_upstream(&self, duration: Duration) {
        self.adopt_pause(duration);
        self.0
            .shared_health
            .announce_pause(std::time::SystemTime::now() + duration);
    }

    /// Pauses upstream traffic here for `duration`, as another replica of the fleet did.
    pub fn adopt_pause(&self, duration: Duration) {
        let until = Instant::now() + duration;
        let mut paused = self.0.paused_until.lock().expect("pause lock poisoned");
        if paused.is_none_or(|current| current < until) {
            if paused.is_none_or(|current| current <= Instant::now()) {
                tracing::warn!(pause = ?duration, "the service banned keyrelay's IP; pausing all upstream traffic");
            }
            *paused = Some(until);
        }
    }

    /// When the upstream pause ends, while one is in force.
    pub fn upstream_paused(&self) -> Option<Instant> {
        let paused = *self.0.paused_until.lock().expect("pause lock poisoned");
        paused.filter(|until| *until > Instant::now())
    }

    /// The tasks API requests run in.
    pub fn requests(&self) -> &TaskTracker {
        &self.0.requests
    }

    pub(crate) fn ejection_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.0.ejection_lock.lock().expect("ejection lock poisoned")
    }

    /// Wrong tokens by address, for the wrong-token limit every token check goes through.
    pub fn denials(&self) -> &Denials {
        &self.0.denials
    }

    pub(crate) fn probe(&self) -> &ProbeState {
        &self.0.probe
    }

    /// Records a first attempt, which earns retries for later.
    pub(crate) fn deposit_retry(&self) {
        self.0.retry_budget.deposit();
    }

    /// Takes one retry from the budget; `false` when it is spent.
    pub(crate) fn withdraw_retry(&self) -> bool {
        let allowed = self.0.retry_budget.withdraw();
        if !allowed {
            self.0.metrics.retries_denied.inc();
        }
        allowed
    }

    /// Time since this instance was built.
    pub fn uptime(&self) -> Duration {
        self.0.started.elapsed()
    }

    /// A random generator for one request.
    pub(crate) fn rng(&self) -> SmallRng {
        match &self.0.seeded {
            Some(seeded) => SmallRng::from_rng(&mut *seeded.lock().expect("rng lock poisoned")),
            None => SmallRng::from_rng(&mut rand::rng()),
        }
    }

    /// A feed of [`Event`]s from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.0.events.subscribe()
    }

    /// Announces an event, built only if someone listens: no receiver is the normal case
    /// outside the demo and tests, and a submit's event costs two strings.
    pub(crate) fn emit(&self, event: impl FnOnce() -> Event) {
        if self.0.events.receiver_count() > 0 {
            let _ = self.0.events.send(event());
        }
    }

    /// A pool for `config`, built off to the side: keys that keep their name, value and
    /// upstream get their id back (and with it their health and learned figures), others a
    /// new one. Nothing changes until [`App::install`].
    ///
    /// # Errors
    /// [`RegistryFull`].
    pub fn build_pool(&self, config: &Config) -> Result<KeyPool, RegistryFull> {
        let shares = PoolShares {
            health: self.0.health.clone(),
            capacity: self.0.capacity.clone(),
            holds: self.0.holds.clone(),
            outages: self.0.outages.clone(),
            shared_threads: self.0.shared_threads.clone(),
            solve_times: self.0.solve_times.clone(),
        };
        build_pool(config, &self.0.registry, shares)
    }

    /// The snapshot of `config` and its `pool` (from [`App::build_pool`]), with the token
    /// table resolved against that pool.
    pub fn snapshot_of(&self, config: Config, pool: KeyPool) -> Snapshot {
        let tokens = token_table(&config, &pool, &self.0.token_counters);
        Snapshot {
            config,
            pool,
            tokens,
        }
    }

    /// Makes `snapshot` the one every new request loads, in one atomic store. Requests in
    /// flight finish on the snapshot they loaded.
    pub fn install(&self, snapshot: Snapshot) {
        self.0
            .metrics
            .admit_keys(snapshot.config.keys.iter().map(|k| k.name.as_str()));
        self.0
            .metrics
            .admit_providers(snapshot.config.keys.iter().map(|k| k.provider));
        self.0
            .metrics
            .admit_tokens(snapshot.tokens.tokens().iter().map(|t| &*t.name));
        let names: Vec<String> = snapshot
            .pool
            .keys()
            .iter()
            .map(|k| k.name.clone())
            .collect();
        self.0.snapshot.store(Arc::new(snapshot));
        // After the store, under the holds' lock: a hold set meanwhile saw either pool.
        for name in self.0.holds.retain(&|name| names.iter().any(|n| n == name)) {
            tracing::info!(key = %name, "the key left the config; its admin hold is dropped");
        }
        // New keys, capacities or tiers may give queued submits somewhere to go.
        self.0.capacity.nudge();
    }

    /// The `/metrics` text.
    pub fn render_metrics(&self) -> String {
        let snapshot = self.snapshot();
        let wall = crate::budgets::now();
        for token in snapshot.tokens.tokens() {
            self.0
                .metrics
                .set_token_threads(&token.name, token.threads.in_use());
            let period = (token.budget.as_ref()).map_or(DEFAULT_BUDGET_PERIOD, |b| b.period);
            let usage = self.0.budgets.usage(&token.name, period, wall);
            let budget = (token.budget.as_ref()).map(|b| (usage.ratio(b).min(1.0), b.soft));
            self.0
                .metrics
                .set_token_budget(&token.name, usage.spend, budget);
        }
        let now = Instant::now();
        (self.0.metrics).set_solve_times(&self.0.solve_times.all(now));
        self.0.metrics.render(
            &snapshot.pool,
            &*self.0.pins,
            crate::metrics::Scene {
                scaling: self.scaling_at(&snapshot, now),
                brake_balance: snapshot.config.scaling.brake_balance,
                paused: self.upstream_paused().is_some(),
                cluster: self.0.cluster.as_deref(),
                now,
            },
        )
    }

    /// The `/scaling` answer: the pool-wide figures and how many workers they call for.
    pub fn scaling(&self) -> crate::scaling::Scaling {
        self.scaling_at(&self.snapshot(), Instant::now())
    }

    fn scaling_at(&self, snapshot: &Snapshot, now: Instant) -> crate::scaling::Scaling {
        let figures = snapshot.pool.figures(self.0.capacity.queued(), now);
        crate::scaling::recommend(figures, snapshot.config.scaling.brake_balance)
    }
}

/// Where the budgets' ledger is kept: `data_dir/budgets.json`; nowhere without a
/// `data_dir` (a config built in code).
fn budgets_path(data_dir: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    data_dir.map(|dir| dir.join("budgets.json"))
}

/// The ledger saved in `data_dir`, if any. A file that cannot be read is reported and
/// the counts start from zero rather than keeping keyrelay from starting.
fn open_budgets(data_dir: &Option<std::path::PathBuf>) -> Budgets {
    let budgets = Budgets::default();
    let Some(path) = budgets_path(data_dir.as_deref()) else {
        return budgets;
    };
    match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(saved) => budgets.restore(saved),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "the budgets file is unreadable; counting from zero")
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot read the budgets file; counting from zero")
        }
    }
    budgets
}

/// The stores that differ between a single instance and replicas sharing the pool.
type SharedStores = (
    Arc<dyn SharedPins>,
    Arc<dyn SharedThreads>,
    Arc<dyn SharedHealth>,
    Arc<dyn SharedPolls>,
);

/// The pin store: a journal in `data_dir` when pins are durable and there is a directory
/// (a config loaded from a file), else memory only (configs built in code: tests, demo).
fn open_pins(
    config: &Config,
    registry: &Arc<KeyRegistry>,
    tokens: &Arc<TokenCounters>,
) -> Result<Arc<dyn PinStore>, AppError> {
    let (ttl, max_pins) = (config.pins.ttl, config.pins.max_pins);
    let dir = match &config.data_dir {
        Some(dir) if config.pins.durable => dir,
        _ => return Ok(Arc::new(MemoryPins::new(ttl, max_pins))),
    };
    // Only keys configured now may own pins read back from disk: a removed key's value is
    // gone, so its tasks could not be polled anyway.
    let configured = |name: &str| {
        config
            .keys
            .iter()
            .any(|k| k.name == name)
            .then(|| registry.id_of(name))
            .flatten()
    };
    let names = registry.clone();
    let key_name = Arc::new(move |id| names.get(id).map(|key| Arc::from(key.name.as_str())));
    let (pins, _recovery) =
        JournalPins::open_for_tokens(dir, ttl, max_pins, &configured, key_name, tokens.clone())
            .map_err(|source| AppError::Pins {
                dir: dir.clone(),
                source,
            })?;
    Ok(Arc::new(pins))
}

/// The holds store: a file in `data_dir` when there is a directory (a config loaded from a
/// file), else memory only (configs built in code: tests, demo), as pins are. In a cluster
/// the file is this replica's copy of the fleet's holds, made by the replica's name.
fn open_holds(config: &Config) -> Result<Arc<dyn HoldStore>, AppError> {
    let origin = config.cluster.as_ref().map_or("", |c| c.replica.as_str());
    let Some(dir) = &config.data_dir else {
        return Ok(Arc::new(MemoryHolds::new(origin)));
    };
    let configured = |name: &str| config.keys.iter().any(|k| k.name == name);
    Ok(Arc::new(FileHolds::open(dir, origin, &configured)?))
}

fn token_table(config: &Config, pool: &KeyPool, counters: &TokenCounters) -> TokenTable {
    // The pool's keys are the config's, in config order (`KeyRegistry::admit`).
    let keys = pool.keys().iter().map(|k| k.id).zip(&config.keys);
    TokenTable::new(&config.access.tokens, keys, counters)
}

/// What every configuration's pool shares with the others, and so outlives snapshots.
struct PoolShares {
    health: Arc<dyn HealthStore>,
    capacity: Arc<Capacity>,
    holds: Arc<dyn HoldStore>,
    outages: Arc<Outages>,
    shared_threads: Arc<dyn SharedThreads>,
    solve_times: Arc<SolveTimes>,
}

fn build_pool(
    config: &Config,
    registry: &KeyRegistry,
    shares: PoolShares,
) -> Result<KeyPool, RegistryFull> {
    let keys = registry.admit(&config.keys)?;
    let selection = Selection::from_config(config);
    Ok(
        KeyPool::new(keys, shares.health, shares.capacity, selection)
            .with_admin_holds(shares.holds)
            .with_outages(shares.outages)
            .with_shared_threads(shares.shared_threads)
            .with_solve_times(shares.solve_times),
    )
}
