//! Several replicas as one pool: the narrow, async interface to what they share on Redis
//! (thread leases, task pins, key health, the refresher's readings, the IP-ban pause, the
//! refresher lease and the replica list), and this replica's view of whether Redis is there
//! (shared mode) or not (degraded mode, where it serves on its own share of each key).
//!
//! Every call is bounded by `[cluster] timeout` and none holds a request longer. A lease
//! exists in Redis only while a [`SharedLease`] guard or one of this replica's open tasks
//! holds it: dropping the guard (the request failed, timed out or was cancelled at any
//! await) removes it, and a replica that stops renewing loses its leases within
//! `replica_timeout` of its last renewal.

mod conn;
mod held;
mod holds;
mod layout;
mod pins;
mod remembered;
mod scripts;
mod sync;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Notify;
use tokio::time::Instant;

use conn::{connection_info, from_value, redis_error};
pub use conn::{ClusterError, Op};
use held::{Held, HeldLeases};
pub use holds::SharedHold;
pub use layout::Layout;
pub use pins::SharedPin;
use pins::{PendingPin, MAX_BACKLOG};
pub use sync::{unix_ms, KeySync, Readings, SharedHealth, Synced};

use crate::captcha::TaskId;
use crate::config;

/// How often a replica without Redis tries it again (at least; `fleet` runs the heartbeat).
pub const DOWN_RETRY: Duration = Duration::from_secs(1);

/// The most spares (threads taken ahead for the next submits) a replica keeps of one key:
/// enough for the submits one replica has on their way at once, few enough that a replica
/// never sits on much of a key the others need.
const MAX_SPARES: usize = 8;

/// A pin asks Redis for spares of its key once the stock (ready and already asked for) is
/// down to this many, and then for a batch: the room check in Redis (six commands) is paid
/// once per batch, not once per submit.
const SPARES_LOW: usize = MAX_SPARES / 2;

/// A spare unused this long goes back: the replica's submits no longer need it. Checked at
/// every sync, so it goes back within this plus one `sync_interval`.
pub const SPARE_IDLE: Duration = Duration::from_secs(1);

/// What the shared lease set said to a submit.
pub enum Admit {
    /// A thread of the key is this request's until the guard is dropped or kept.
    Granted(SharedLease),
    /// Every thread of the key is held somewhere in the fleet.
    Full,
    /// Redis cannot count the fleet now (it is away, or lost its state and the fleet has
    /// not put it back): the thread is this replica's share's, and counted in Redis when
    /// the heartbeat puts this replica's leases back, until the guard is dropped or kept.
    Alone(SharedLease),
}

/// The most leases one renewal script handles: a script blocks Redis while it runs, so a
/// replica with many open tasks renews them in several short scripts that other replicas'
/// calls can run between, not one long one.
const RENEW_BATCH: usize = 256;

/// A spare's lease member, and when it came into the stock.
type Spare = (String, Instant);

/// A key's spares: those ready for the next submits, newest last with when each came (so
/// that a stock larger than the demand ages at its front and is given back), and how many
/// the pins on their way have asked Redis for, so that concurrent pins never ask for more
/// than [`MAX_SPARES`] between them.
#[derive(Debug, Default)]
struct Stock {
    ready: Vec<Spare>,
    asked: usize,
    /// The key's pins in this [`SPARE_IDLE`] window and the one before, and when this one
    /// began: a batch is no larger than the demand, so that a replica with a trickle of
    /// submits never sits on threads other replicas could use.
    pins_now: usize,
    pins_before: usize,
    window: Option<Instant>,
}

impl Stock {
    /// Counts a pin at `now`; returns the pins of the last full window or of this one,
    /// whichever is more.
    fn count_pin(&mut self, now: Instant) -> usize {
        let age = self
            .window
            .map(|start| now.saturating_duration_since(start));
        match age {
            Some(age) if age < SPARE_IDLE => {}
            Some(age) if age < SPARE_IDLE * 2 => {
                self.pins_before = self.pins_now;
                self.pins_now = 0;
                self.window = Some(now);
            }
            _ => {
                self.pins_before = 0;
                self.pins_now = 0;
                self.window = Some(now);
            }
        }
        self.pins_now += 1;
        self.pins_now.max(self.pins_before)
    }
}

/// Spares a pin asked Redis for, counted in the key's stock until dropped. Dropped before
/// Redis's answer was read (the call failed or timed out, or the pin was cancelled at its
/// await), it also removes them from Redis, best effort, since Redis may have granted them
/// with nobody here to use or renew them: a lost answer never holds a batch of the key's
/// threads until they expire.
struct Asked<'a> {
    cluster: &'a Arc<Cluster>,
    key: &'a str,
    members: Vec<String>,
    answered: bool,
}

impl<'a> Asked<'a> {
    fn none(cluster: &'a Arc<Cluster>, key: &'a str) -> Asked<'a> {
        Asked {
            cluster,
            key,
            members: Vec::new(),
            answered: false,
        }
    }
}

impl Drop for Asked<'_> {
    fn drop(&mut self) {
        if self.members.is_empty() {
            return;
        }
        if let Some(stock) = lock(&self.cluster.spares).get_mut(self.key) {
            stock.asked = stock.asked.saturating_sub(self.members.len());
        }
        if self.answered {
            return;
        }
        let key: Arc<str> = Arc::from(self.key);
        let gone: Vec<(Arc<str>, String)> = self
            .members
            .drain(..)
            .map(|member| (key.clone(), member))
            .collect();
        let cluster = self.cluster.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { cluster.remove_members(&gone).await });
        }
    }
}

/// Where this replica is on its way to shared mode.
#[derive(Debug)]
enum Settle {
    /// Redis does not answer.
    Down,
    /// Redis answers again since the heartbeat of `since_ms` (Redis time); the share still
    /// applies until every live replica has marked itself synced since then, or until
    /// `deadline`.
    Waiting {
        since_ms: u64,
        deadline: Instant,
        /// The live replicas not yet synced, at the last look.
        waiting_for: Vec<String>,
        /// Redis lost the fleet's state (rather than being away): no replica admitted on
        /// its share meanwhile, and none does while the fleet puts its state back, since
        /// the others' last count this replica read may be a sync interval old.
        after_loss: bool,
    },
    Shared,
    /// A script found the key's generation stale (Redis lost its data, or came back from an
    /// older copy): Redis's count is not trusted until the next heartbeat has moved the
    /// fleet to a new epoch and this replica has put its state back.
    Lost,
}

/// The fleet's epoch as this replica knows it, and per key the lowest generation counter
/// Redis may answer with: the highest this replica was told.
#[derive(Debug, Default)]
struct Generation {
    epoch: Option<Arc<str>>,
    floors: HashMap<Arc<str>, u64, foldhash::fast::RandomState>,
}

/// What the heartbeat's look at the fleet's epoch found.
struct EpochCheck {
    /// Redis lost state this replica had written: its epoch is gone or was moved on.
    lost: bool,
    /// This replica began the epoch: Redis had none, or an older state than it saw.
    created: bool,
}

/// A release sent lately, kept to be sent again if Redis loses it: the task's lease would
/// otherwise be put back by the replica that created it, for a task that has ended.
struct SentRelease {
    key: Arc<str>,
    member: String,
    at: Instant,
}

/// The fleet as last seen.
#[derive(Clone, Debug, Default)]
struct Fleet {
    /// Live replicas, sorted; this one among them once it has heartbeated.
    live: Vec<String>,
}

/// This replica's handle on the shared pool.
pub struct Cluster {
    config: config::Cluster,
    layout: Layout,
    client: redis::Client,
    conn: ConnectionManager,
    /// `replica:boot` prefix of this process's pending lease members: a restarted replica
    /// never renews its predecessor's.
    boot: String,
    seq: AtomicU64,
    up: AtomicBool,
    /// Set at the first heartbeat that got through.
    ever_up: AtomicBool,
    /// Whether shared mode has begun since Redis last came back, or what it waits for.
    settle: Mutex<Settle>,
    down_reason: Mutex<Option<String>>,
    held: Mutex<HeldLeases>,
    /// Spares per key name.
    spares: Mutex<HashMap<Arc<str>, Stock>>,
    backlog: Mutex<VecDeque<PendingPin>>,
    /// Threads of each key held by the other replicas at the last sync. In shared mode a
    /// replica may hold more than its share; when Redis goes away those threads stay busy,
    /// so the shares are taken from what they left free, until this replica's own
    /// `threadsinfo` reconciliation counts them instead.
    others: Mutex<HashMap<String, u32>>,
    /// Final answers seen while Redis was away, to release when it returns.
    released: Mutex<VecDeque<(Arc<str>, String)>>,
    fleet: Mutex<Fleet>,
    generation: Mutex<Generation>,
    /// Releases sent within the pin TTL, newest last.
    sent_releases: Mutex<VecDeque<SentRelease>>,
    /// Woken when a script finds the generation stale, so that the heartbeat puts the
    /// fleet's state back at once rather than at its next period.
    lost: Notify,
    refresher: AtomicBool,
    errors: [AtomicU64; Op::ALL.len()],
    round_trips: [AtomicU64; Op::ALL.len()],
    /// Pin TTL, for the Redis copy of each pin.
    pin_ttl: Duration,
    /// Where the live replicas are remembered across restarts (`data_dir`), if anywhere.
    fleet_file: Option<PathBuf>,
    /// What that file holds.
    remembered: Mutex<Vec<String>>,
}

impl Cluster {
    /// A handle that connects on first use: a replica starts and serves while Redis is
    /// away, in degraded mode until a heartbeat gets through, on its share of the fleet it
    /// last saw (remembered in `data_dir`; without one, or on a first start, it counts as
    /// alone).
    ///
    /// # Errors
    /// The URL cannot be used (checked by config validation already).
    pub fn new(
        config: config::Cluster,
        pin_ttl: Duration,
        data_dir: Option<&Path>,
    ) -> Result<Cluster, ClusterError> {
        let client = redis::Client::open(connection_info(config.redis.expose())?)
            .map_err(|e| redis_error(Op::Heartbeat, &e))?;
        let manager = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.timeout))
            .set_connection_timeout(Some(config.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager)
            .map_err(|e| redis_error(Op::Heartbeat, &e))?;
        let boot = format!("{}:{:08x}", config.replica, rand::random::<u32>());
        let fleet_file = remembered::path(data_dir);
        let live = fleet_file
            .as_deref()
            .map(remembered::load)
            .unwrap_or_default();
        if !live.is_empty() {
            tracing::info!(
                replicas = live.len(),
                "the fleet last seen, for the shares until redis answers"
            );
        }
        Ok(Cluster {
            layout: Layout::new(&config.prefix),
            config,
            client,
            conn,
            boot,
            seq: AtomicU64::new(0),
            up: AtomicBool::new(false),
            ever_up: AtomicBool::new(false),
            settle: Mutex::new(Settle::Down),
            down_reason: Mutex::new(Some("not connected yet".to_owned())),
            held: Mutex::new(HeldLeases::default()),
            spares: Mutex::new(HashMap::new()),
            backlog: Mutex::new(VecDeque::new()),
            released: Mutex::new(VecDeque::new()),
            others: Mutex::new(HashMap::new()),
            fleet: Mutex::new(Fleet { live: live.clone() }),
            remembered: Mutex::new(live),
            generation: Mutex::new(Generation::default()),
            sent_releases: Mutex::new(VecDeque::new()),
            lost: Notify::new(),
            refresher: AtomicBool::new(false),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            round_trips: std::array::from_fn(|_| AtomicU64::new(0)),
            pin_ttl,
            fleet_file,
        })
    }

    pub fn config(&self) -> &config::Cluster {
        &self.config
    }

    pub fn replica(&self) -> &str {
        &self.config.replica
    }

    /// Whether the fleet's count in Redis is the one check on a key's threads: Redis
    /// answers, and every live replica has put back what it admitted without it.
    pub fn is_shared(&self) -> bool {
        self.is_up() && matches!(*lock(&self.settle), Settle::Shared)
    }

    /// Whether Redis answers this replica. While it does, every lease and pin goes there,
    /// even before shared mode begins (the share still applies until then), so that the
    /// replicas that wait for the fleet's count see this one's.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Why this replica is in degraded mode, while it is.
    pub fn degraded_reason(&self) -> Option<String> {
        if self.is_shared() {
            return None;
        }
        if let Some(down) = lock(&self.down_reason).clone() {
            return Some(down);
        }
        Some(match &*lock(&self.settle) {
            Settle::Waiting { waiting_for, .. } if !waiting_for.is_empty() => format!(
                "redis returned; waiting for {} to put back what they admitted alone",
                waiting_for.join(", ")
            ),
            _ => "redis returned; putting back what was admitted alone".to_owned(),
        })
    }

    /// Errors of `op` since start.
    pub fn errors(&self, op: Op) -> u64 {
        self.errors[op as usize].load(Ordering::Relaxed)
    }

    /// Round trips to Redis for `op` since start, failed ones included.
    pub fn round_trips(&self, op: Op) -> u64 {
        self.round_trips[op as usize].load(Ordering::Relaxed)
    }

    /// Spares of `key` this replica has ready for its next submits.
    pub fn spares_ready(&self, key: &str) -> usize {
        lock(&self.spares)
            .get(key)
            .map_or(0, |stock| stock.ready.len())
    }

    /// The replicas seen alive at the last heartbeat.
    pub fn live_replicas(&self) -> Vec<String> {
        lock(&self.fleet).live.clone()
    }

    /// Whether this replica runs the balance and thread refresh. Without Redis every
    /// replica refreshes for itself.
    pub fn is_refresher(&self) -> bool {
        !self.is_shared() || self.refresher.load(Ordering::Acquire)
    }

    /// This replica's share of a key's `threads` while Redis is away: the threads divided
    /// by the replicas last seen alive, the remainder to the first by name, so that the
    /// shares add up to the threads and the fleet still cannot overfill the key.
    pub fn share(&self, threads: u32) -> u32 {
        let fleet = lock(&self.fleet);
        let count = fleet.live.len().max(1) as u32;
        let rank = fleet
            .live
            .iter()
            .position(|name| name == &self.config.replica)
            .unwrap_or(fleet.live.len()) as u32;
        threads / count + u32::from(rank < threads % count)
    }

    /// The most threads of a key of `limit` this replica may take while Redis is away: its
    /// share, and no more than the other replicas left free at the last sync.
    pub fn degraded_limit(&self, key: &str, limit: u32) -> u32 {
        if self.puts_back_a_loss() {
            return 0;
        }
        let others = lock(&self.others).get(key).copied().unwrap_or(0);
        self.share(limit).min(limit.saturating_sub(others))
    }

    /// Whether the fleet is putting back the state Redis lost while it answered: then no
    /// replica takes a new thread until Redis counts the whole fleet again (about one
    /// heartbeat, at most `replica_timeout`). A share would be taken from what the others
    /// held at this replica's last sync, and a submit they sent since would overfill.
    fn puts_back_a_loss(&self) -> bool {
        matches!(
            *lock(&self.settle),
            Settle::Lost
                | Settle::Waiting {
                    after_loss: true,
                    ..
                }
        )
    }

    /// The service's own count now covers the other replicas' threads of `key` (a
    /// reconciliation while degraded put them in the key's outside load).
    pub fn forget_others(&self, key: &str) {
        lock(&self.others).remove(key);
    }

    /// How many leases and spares of this replica's are live, by key name.
    pub fn held_by_me(&self, key: &str) -> usize {
        lock(&self.held).count(key)
    }

    /// Takes one of `key`'s threads in the fleet if fewer than `limit` are held: a spare
    /// this replica took ahead if it has one (no round trip), or a lease from Redis. While
    /// Redis cannot count the fleet (away, or its state lost), a lease of this replica's
    /// own, which the heartbeat writes to Redis when it can.
    ///
    /// # Errors
    /// Redis did not answer in time, or answered with a stale generation; the caller admits
    /// on the share instead.
    pub async fn acquire(self: &Arc<Self>, key: &str, limit: u32) -> Result<Admit, ClusterError> {
        if !self.is_counting() {
            return Ok(Admit::Alone(self.open_lease(Arc::from(key), false)));
        }
        if let Some(spare) = self.take_spare(key) {
            return Ok(Admit::Granted(spare));
        }
        let Some((epoch, floor)) = self.generation_of(key) else {
            // A key the heartbeat has not started in Redis yet (a reload added it).
            return Ok(Admit::Alone(self.open_lease(Arc::from(key), false)));
        };
        let key: Arc<str> = Arc::from(key);
        // The guard exists before the call is sent: a cancelled or timed-out call still
        // removes whatever the script may have added.
        let mut lease = self.open_lease(key.clone(), true);
        let member = lease.member.clone().unwrap_or_default();
        let mut cmd = scripts::ACQUIRE.call(3);
        cmd.arg(self.layout.leases(&key))
            .arg(self.layout.spares(&key))
            .arg(self.layout.generation(&key))
            .arg(&member)
            .arg(limit)
            .arg(self.lease_ttl_ms())
            .arg(&*epoch)
            .arg(floor);
        let (granted, taken, counter): (i32, u32, u64) = self.call(Op::Acquire, cmd).await?;
        if granted >= 0 {
            self.saw(&key, counter);
            // This lease is in `held` already, and in `taken` only if it was granted.
            self.count_others(&key, taken + u32::from(granted == 0), 0);
        }
        if granted == 1 {
            return Ok(Admit::Granted(lease));
        }
        // The script added nothing: no release to send.
        if let Some(member) = lease.member.take() {
            lock(&self.held).remove(&member);
        }
        if granted == 0 {
            Ok(Admit::Full)
        } else {
            self.found_stale(&key);
            Err(ClusterError::Stale)
        }
    }

    /// A submit's lease of `key`, held here from now on; `in_redis` says whether it is
    /// about to be written there, or waits for the heartbeat to put it back.
    fn open_lease(self: &Arc<Self>, key: Arc<str>, in_redis: bool) -> SharedLease {
        let member = self.next_member("p");
        lock(&self.held).insert(
            member.clone(),
            Held {
                key: key.clone(),
                task: None,
                opened: Instant::now(),
                in_redis,
            },
        );
        SharedLease {
            cluster: self.clone(),
            key,
            member: Some(member),
        }
    }

    /// Whether Redis's count of the fleet is taken and trusted now: it answers, and no
    /// script has found its state older than what this replica saw.
    fn is_counting(&self) -> bool {
        self.is_up() && !matches!(*lock(&self.settle), Settle::Lost)
    }

    /// The epoch and the counter floor to send with a script about `key`; `None` for a key
    /// whose generation this replica has not started in the current epoch.
    fn generation_of(&self, key: &str) -> Option<(Arc<str>, u64)> {
        let generation = lock(&self.generation);
        let floor = *generation.floors.get(key)?;
        Some((generation.epoch.clone()?, floor))
    }

    /// Redis told a script `key`'s generation counter is at `counter`: no copy of Redis
    /// with a lower one is trusted from now on.
    fn saw(&self, key: &str, counter: u64) {
        let mut generation = lock(&self.generation);
        if let Some(floor) = generation.floors.get_mut(key) {
            *floor = (*floor).max(counter);
        }
    }

    /// Redis counted `taken` leases and spares of `key` just now, `not_held_yet` of them
    /// this replica's though not yet in its own count: what the others hold is the rest.
    /// Kept as fresh as this replica's last script, so that if Redis goes away the share it
    /// then takes is taken from what the others held a moment ago, not a sync ago.
    fn count_others(&self, key: &str, taken: u32, not_held_yet: usize) {
        if !self.is_shared() {
            return;
        }
        let mine = self.held_by_me(key) + not_held_yet;
        let others = taken.saturating_sub(u32::try_from(mine).unwrap_or(u32::MAX));
        if let Some(known) = lock(&self.others).get_mut(key) {
            *known = others;
            return;
        }
        lock(&self.others).insert(key.to_owned(), others);
    }

    /// A script found `key`'s generation stale. For a key this replica started in the
    /// current epoch, Redis lost state: Redis's count is not trusted until the heartbeat,
    /// woken now, has moved the fleet on and put this replica's state back. A key not yet
    /// started (added by a reload) is started at the next heartbeat.
    fn found_stale(&self, key: &str) {
        if !lock(&self.generation).floors.contains_key(key) {
            return;
        }
        let mut settle = lock(&self.settle);
        if !matches!(*settle, Settle::Lost) {
            tracing::warn!(key, "redis answered with an older state than this replica saw; serving on this replica's share until the fleet's state is put back");
            *settle = Settle::Lost;
        }
        drop(settle);
        self.lost.notify_one();
    }

    /// Resolves when a script has found Redis's state stale, for the heartbeat loop.
    pub async fn lost(&self) {
        self.lost.notified().await;
    }

    /// The newest spare of `key`, as a lease for a submit on its way upstream.
    fn take_spare(self: &Arc<Self>, key: &str) -> Option<SharedLease> {
        let (member, _) = lock(&self.spares).get_mut(key)?.ready.pop()?;
        Some(SharedLease {
            cluster: self.clone(),
            key: Arc::from(key),
            member: Some(member),
        })
    }

    /// Records that `key` created `task` for the token named `token` (empty: none): the
    /// submit's lease becomes the task's and the pin is written, in one round trip, before
    /// the caller gets the id. The same round trip takes a spare of the key for this
    /// replica's next submit while enough of the key's `limit` stays free, so that a submit
    /// on the success path costs one round trip, not two. Without Redis the pin waits in the
    /// backlog and the lease is put back when Redis returns.
    pub async fn pin(
        self: &Arc<Self>,
        lease: Option<SharedLease>,
        task: &TaskId,
        key: &str,
        token: &str,
        limit: u32,
    ) {
        let task_text = task.to_string();
        let member = Layout::task_lease(&task_text);
        let old = lease.and_then(|mut lease| lease.member.take());
        let value = [key, "\t", token].concat();
        let margin = lock(&self.fleet).live.len().max(1) as u32;
        let generation = self
            .is_counting()
            .then(|| self.generation_of(key))
            .flatten();
        let keeps = old.is_some() && generation.is_some();
        let mut asked = if keeps {
            self.ask_spares(key)
        } else {
            Asked::none(self, key)
        };
        let mut granted = 0;
        let in_redis = if let (Some(old), Some((epoch, floor))) = (&old, generation) {
            let mut pipe = redis::Pipeline::with_capacity(2);
            pipe.add_command(scripts::KEEP.call(3))
                .arg(self.layout.leases(key))
                .arg(self.layout.spares(key))
                .arg(self.layout.generation(key))
                .arg(old)
                .arg(&member)
                .arg(self.lease_ttl_ms())
                .arg(limit)
                .arg(margin)
                .arg(&*epoch)
                .arg(floor)
                .arg(&asked.members)
                .cmd("SET")
                .arg(self.layout.pin(&task_text))
                .arg(&value)
                .arg("EX")
                .arg(self.pin_ttl.as_secs().max(1))
                .ignore();
            match self
                .call_pipe::<((i32, usize, u64, u32),)>(Op::Pin, pipe)
                .await
            {
                Ok(((had, n, counter, taken),)) if had >= 0 => {
                    asked.answered = true;
                    granted = n.min(asked.members.len());
                    self.saw(key, counter);
                    // The submit's lease is in `held` (as the task's in `taken`); the spares
                    // granted are in `taken` and not yet in `held`.
                    self.count_others(key, taken, granted);
                    true
                }
                Ok(_) => {
                    // Nothing was added: the task's lease and pin are put back with the rest
                    // of this replica's state.
                    asked.answered = true;
                    self.found_stale(key);
                    false
                }
                Err(_) => false,
            }
        } else {
            false
        };
        let key: Arc<str> = Arc::from(key);
        // One clock read for the task's lease, its spares and their place in the stock.
        let now = Instant::now();
        let mut held = lock(&self.held);
        if let Some(old) = &old {
            held.remove(old);
        }
        held.insert(
            member,
            Held {
                key: key.clone(),
                task: Some(task.clone()),
                opened: now,
                in_redis,
            },
        );
        let spares = &asked.members[..granted];
        for spare in spares {
            held.insert(
                spare.clone(),
                Held {
                    key: key.clone(),
                    task: None,
                    opened: now,
                    in_redis: true,
                },
            );
        }
        drop(held);
        if !spares.is_empty() {
            // Into the stock before the ask is forgotten, so that the stock never looks
            // emptier than it is to a pin deciding whether to ask.
            lock(&self.spares)
                .entry(key)
                .or_default()
                .ready
                .extend(spares.iter().map(|spare| (spare.clone(), now)));
        }
        drop(asked);
        if !in_redis {
            self.backlog_pin(task_text, value);
        }
    }

    /// How many spares of `key` this pin asks for: none while the stock, with what other
    /// pins asked for, is above [`SPARES_LOW`]; else as many as the key had pins in the
    /// last second, up to a stock of [`MAX_SPARES`]. Counted as asked until the guard is
    /// dropped.
    fn ask_spares<'a>(self: &'a Arc<Self>, key: &'a str) -> Asked<'a> {
        let mut spares = lock(&self.spares);
        // The key's name is copied only the first time: `entry` would take an owned one.
        if !spares.contains_key(key) {
            spares.insert(Arc::from(key), Stock::default());
        }
        let stock = spares.get_mut(key).expect("inserted above");
        let demand = stock.count_pin(Instant::now());
        let have = stock.ready.len() + stock.asked;
        let count = if have <= SPARES_LOW {
            demand.min(MAX_SPARES - have)
        } else {
            0
        };
        stock.asked += count;
        drop(spares);
        Asked {
            cluster: self,
            key,
            members: (0..count).map(|_| self.next_member("s")).collect(),
            answered: false,
        }
    }

    /// Gives back the spares unused for [`SPARE_IDLE`], and every spare of the keys in
    /// `shrunk` (whose fleet count is above their limit now, or which left rotation), in one
    /// round trip. Run at each sync.
    pub async fn trim_spares(&self, shrunk: &[Arc<str>]) {
        let now = Instant::now();
        let mut gone: Vec<(Arc<str>, String)> = Vec::new();
        {
            let mut spares = lock(&self.spares);
            for (key, stock) in spares.iter_mut() {
                let ready = &mut stock.ready;
                let all = shrunk.contains(key);
                let keep_from = if all {
                    ready.len()
                } else {
                    ready
                        .iter()
                        .position(|(_, at)| now.saturating_duration_since(*at) < SPARE_IDLE)
                        .unwrap_or(ready.len())
                };
                gone.extend(ready.drain(..keep_from).map(|(m, _)| (key.clone(), m)));
            }
            // An empty stock keeps its pin count while that is recent.
            spares.retain(|_, stock| {
                let recent = stock
                    .window
                    .is_some_and(|start| now.saturating_duration_since(start) < SPARE_IDLE * 2);
                !stock.ready.is_empty() || stock.asked > 0 || recent
            });
        }
        if gone.is_empty() {
            return;
        }
        {
            let mut held = lock(&self.held);
            for (_, member) in &gone {
                held.remove(member);
            }
        }
        self.remove_members(&gone).await;
    }

    /// Removes these members from their keys' sets in one round trip, best effort: a member
    /// not removed now expires with its lease TTL.
    async fn remove_members(&self, members: &[(Arc<str>, String)]) {
        let mut pipe = redis::pipe();
        for (key, member) in members {
            pipe.cmd("ZREM")
                .arg(self.layout.set_of(key, member))
                .arg(member)
                .ignore();
        }
        let _ = self.call_pipe::<()>(Op::Release, pipe).await;
    }

    fn next_member(&self, kind: &str) -> String {
        // Pushed, not `format!`ed: a submit names one to three members, and the formatting
        // machinery cost 0.5k instructions each.
        let mut digits = itoa::Buffer::new();
        let n = digits.format(self.seq.fetch_add(1, Ordering::Relaxed));
        let mut member = String::with_capacity(kind.len() + self.boot.len() + n.len() + 2);
        member.push_str(kind);
        member.push(':');
        member.push_str(&self.boot);
        member.push(':');
        member.push_str(n);
        member
    }

    /// `task` had its final answer: its thread goes back to the fleet, whichever replica
    /// created it, and the fleet remembers that it ended. Without Redis the release waits
    /// in a backlog for its return.
    pub fn release_task(self: &Arc<Self>, key: &str, task: &TaskId) {
        let member = Layout::task_lease(&task.to_string());
        lock(&self.held).remove(&member);
        let key: Arc<str> = Arc::from(key);
        self.remember_release(&key, &member);
        if !self.up.load(Ordering::Acquire) {
            self.backlog_release(key, member);
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if this
                .send_releases(&[(key.clone(), member.clone())])
                .await
                .is_err()
            {
                this.backlog_release(key, member);
            }
        });
    }

    /// Keeps a release for the pin TTL (the released set's lifetime in Redis), to send again
    /// if Redis loses it.
    fn remember_release(&self, key: &Arc<str>, member: &str) {
        let now = Instant::now();
        let mut sent = lock(&self.sent_releases);
        while sent.front().is_some_and(|old| {
            sent.len() >= MAX_BACKLOG || now.saturating_duration_since(old.at) > self.pin_ttl
        }) {
            sent.pop_front();
        }
        sent.push_back(SentRelease {
            key: key.clone(),
            member: member.to_owned(),
            at: now,
        });
    }

    /// Sends again every release of the pin TTL, after Redis lost them.
    async fn resend_releases(&self) -> bool {
        let releases: Vec<(Arc<str>, String)> = lock(&self.sent_releases)
            .iter()
            .map(|sent| (sent.key.clone(), sent.member.clone()))
            .collect();
        for batch in releases.chunks(500) {
            if self.send_releases(batch).await.is_err() {
                return false;
            }
        }
        true
    }

    fn backlog_release(&self, key: Arc<str>, member: String) {
        let mut released = lock(&self.released);
        if released.len() >= MAX_BACKLOG {
            released.pop_front();
        }
        released.push_back((key, member));
    }

    async fn send_releases(&self, releases: &[(Arc<str>, String)]) -> Result<(), ClusterError> {
        let mut pipe = redis::pipe();
        for (key, member) in releases {
            pipe.add_command(scripts::RELEASE.call(2))
                .arg(self.layout.leases(key))
                .arg(self.layout.released(key))
                .arg(member)
                .arg(self.pin_ttl.as_millis() as u64)
                .ignore();
        }
        self.call_pipe::<()>(Op::Release, pipe).await
    }

    /// The heartbeat, run every third of `replica_timeout` (every `DOWN_RETRY` at most
    /// while not shared, and at once when a script found Redis's state stale): records this
    /// replica as alive, reads the live ones, checks the fleet's epoch, renews this
    /// replica's leases, takes or keeps the refresher lease, and, when Redis has come back
    /// or lost its state, puts back what this replica holds: its leases (those of requests
    /// admitted alone among them), its pins (`pins`, read from its own store only then),
    /// and the releases it sent lately. A heartbeat that got all of that into Redis says so
    /// (its `synced` mark); shared mode begins once every live replica has said so since
    /// Redis came back. Returns the tasks whose leases another replica released (their
    /// final answer was polled there), for the caller to end locally.
    pub async fn heartbeat(
        &self,
        keys: &[Arc<str>],
        refresh_interval: Duration,
        stale_after: Duration,
        pins: impl FnOnce() -> Vec<(String, String)>,
    ) -> Vec<TaskId> {
        let was_up = self.up.load(Ordering::Acquire);
        let mut cmd = scripts::HEARTBEAT.call(1);
        cmd.arg(self.layout.replicas())
            .arg(&self.config.replica)
            .arg(self.config.replica_timeout.as_millis() as u64);
        let live: Vec<String> = match self.call(Op::Heartbeat, cmd).await {
            Ok(live) => live,
            Err(_) => return Vec::new(),
        };
        let mut live = live;
        let redis_ms: u64 = live.pop().and_then(|t| t.parse().ok()).unwrap_or(0);
        lock(&self.fleet).live = live.clone();
        self.remember(live.clone()).await;
        let Some(epoch) = self.check_epoch(keys, !was_up).await else {
            return Vec::new();
        };
        if !was_up {
            self.mark_up();
        }
        self.drop_stale(stale_after).await;
        if epoch.lost {
            self.backlog_pins(pins());
        }
        let admitted_alone =
            self.backlog_len() > 0 || lock(&self.held).iter().any(|(_, h)| !h.in_redis);
        let (ended, renewed) = self.renew(epoch.lost || !was_up).await;
        let resent = !epoch.lost || self.resend_releases().await;
        let flushed = self.flush_backlog().await;
        if !was_up || epoch.lost {
            // A fresh start that admitted nothing alone, into a fleet whose state Redis
            // still has, has no outage to wait out: the others' counts are in Redis already.
            let after_outage = self.ever_up.swap(true, Ordering::AcqRel);
            let others_lost_theirs = epoch.created && live.len() > 1;
            let settle = if after_outage || admitted_alone || epoch.lost || others_lost_theirs {
                Settle::Waiting {
                    since_ms: redis_ms,
                    deadline: Instant::now() + self.config.replica_timeout,
                    waiting_for: Vec::new(),
                    after_loss: epoch.lost,
                }
            } else {
                tracing::info!(replica = %self.config.replica, "redis is reachable; shared mode");
                Settle::Shared
            };
            *lock(&self.settle) = settle;
        }
        if renewed && resent && flushed && self.is_up() {
            self.mark_synced(redis_ms, &live).await;
        }
        self.take_refresher(refresh_interval).await;
        ended
    }

    /// Says that every lease and pin this replica had when the heartbeat of `redis_ms`
    /// began is in Redis, and, while this replica waits to share, whether every live
    /// replica has said the same since Redis came back: then the fleet's count is whole and
    /// shared mode begins. One that never does (a replica of an older version, or one that
    /// heartbeats but cannot renew) is waited for until `replica_timeout` has passed.
    async fn mark_synced(&self, redis_ms: u64, live: &[String]) {
        // A mark names the epoch it was made in: one made after a loss by a replica that has
        // not seen the loss yet (its heartbeat began before it) must not count as put back.
        let Some(epoch) = lock(&self.generation).epoch.clone() else {
            return;
        };
        if matches!(*lock(&self.settle), Settle::Lost) {
            return;
        }
        let mut pipe = redis::pipe();
        pipe.cmd("HSET")
            .arg(self.layout.synced())
            .arg(&self.config.replica)
            .arg(format!("{redis_ms} {epoch}"))
            .ignore()
            .cmd("HGETALL")
            .arg(self.layout.synced());
        let Ok((marks,)) = self
            .call_pipe::<(HashMap<String, String>,)>(Op::Heartbeat, pipe)
            .await
        else {
            return;
        };
        let synced_at = |replica: &String| -> Option<u64> {
            let (at, in_epoch) = marks.get(replica)?.split_once(' ')?;
            (in_epoch == &*epoch).then(|| at.parse().ok()).flatten()
        };
        let gone: Vec<&String> = marks.keys().filter(|r| !live.contains(r)).collect();
        if !gone.is_empty() {
            let mut cmd = redis::cmd("HDEL");
            cmd.arg(self.layout.synced()).arg(gone);
            let _ = self.call::<()>(Op::Heartbeat, cmd).await;
        }
        let mut settle = lock(&self.settle);
        let Settle::Waiting {
            since_ms,
            deadline,
            waiting_for,
            ..
        } = &mut *settle
        else {
            return;
        };
        *waiting_for = live
            .iter()
            .filter(|r| synced_at(r).is_none_or(|at| at < *since_ms))
            .cloned()
            .collect();
        if waiting_for.is_empty() {
            tracing::info!(replica = %self.config.replica, "redis is reachable and every live replica has put its leases back; shared mode");
        } else if Instant::now() >= *deadline {
            tracing::warn!(replica = %self.config.replica, waiting_for = ?waiting_for, "replicas alive but not yet synced after replica_timeout; shared mode without them");
        } else {
            return;
        }
        *settle = Settle::Shared;
    }

    /// How often [`Cluster::heartbeat`] runs.
    pub fn renew_period(&self) -> Duration {
        self.config.replica_timeout / 3
    }

    /// Keeps the live replicas in `data_dir` when they changed since last saved.
    async fn remember(&self, live: Vec<String>) {
        let Some(file) = &self.fleet_file else {
            return;
        };
        if *lock(&self.remembered) == live {
            return;
        }
        match remembered::save(file, &live).await {
            Ok(()) => *lock(&self.remembered) = live,
            Err(e) => {
                tracing::warn!(error = %e, file = %file.display(), "could not remember the fleet");
            }
        }
    }

    /// Moves this replica to the fleet's epoch, moving the fleet to a new one first when
    /// Redis has none (it lost its data) or a script found Redis's state older than this
    /// replica saw in the epoch it knows (a copy from before), and starts the generation of
    /// every key of `keys` not yet started in that epoch, the stale ones included, so that
    /// every replica still on the old epoch finds its next script refused. `None` if Redis
    /// did not answer.
    async fn check_epoch(&self, keys: &[Arc<str>], returning: bool) -> Option<EpochCheck> {
        let stale = matches!(*lock(&self.settle), Settle::Lost)
            || (returning && self.generations_went_back().await?);
        let known = lock(&self.generation).epoch.clone();
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.layout.epoch());
        let current = self.call::<Option<String>>(Op::Heartbeat, cmd).await.ok()?;
        let (adopted, created) = match current {
            Some(current) if !(stale && known.as_deref() == Some(current.as_str())) => {
                (current, false)
            }
            _ => {
                let fresh = format!("{:016x}", rand::random::<u64>());
                let mut cmd = scripts::EPOCH.call(1);
                cmd.arg(self.layout.epoch())
                    .arg(known.as_deref().unwrap_or(""))
                    .arg(&fresh);
                let adopted: String = self.call(Op::Heartbeat, cmd).await.ok()?;
                let created = adopted == fresh;
                (adopted, created)
            }
        };
        let moved = known.as_deref() != Some(adopted.as_str());
        let mut started: Vec<Arc<str>> = {
            let generation = lock(&self.generation);
            keys.iter()
                .chain(lock(&self.held).iter().map(|(_, held)| &held.key))
                .filter(|key| moved || !generation.floors.contains_key(&***key))
                .cloned()
                .collect()
        };
        started.sort_unstable();
        started.dedup();
        let mut counters: Vec<u64> = Vec::new();
        if !started.is_empty() {
            let mut pipe = redis::pipe();
            for key in &started {
                pipe.add_command(scripts::STAMP.call(1))
                    .arg(self.layout.generation(key))
                    .arg(&adopted);
            }
            counters = self.call_pipe(Op::Heartbeat, pipe).await.ok()?;
        }
        {
            let mut generation = lock(&self.generation);
            if moved {
                generation.floors.clear();
                generation.epoch = Some(Arc::from(adopted.as_str()));
            }
            for (key, counter) in started.into_iter().zip(counters) {
                generation.floors.insert(key, counter);
            }
        }
        let lost = known.is_some() && moved;
        if lost {
            tracing::warn!("redis lost the fleet's state; putting this replica's leases, pins and releases back");
        }
        Some(EpochCheck { lost, created })
    }

    /// Whether any key's generation in Redis is older than this replica saw: read when
    /// Redis answers again after an outage, which may have been a restart from an older
    /// copy. `None` if Redis did not answer.
    async fn generations_went_back(&self) -> Option<bool> {
        let (epoch, started): (Arc<str>, Vec<(Arc<str>, u64)>) = {
            let generation = lock(&self.generation);
            let Some(epoch) = generation.epoch.clone() else {
                return Some(false);
            };
            let floors = generation.floors.iter();
            (
                epoch,
                floors.map(|(key, floor)| (key.clone(), *floor)).collect(),
            )
        };
        if started.is_empty() {
            return Some(false);
        }
        let mut pipe = redis::pipe();
        for (key, _) in &started {
            pipe.cmd("HMGET")
                .arg(self.layout.generation(key))
                .arg("e")
                .arg("n");
        }
        let found: Vec<(Option<String>, Option<u64>)> =
            self.call_pipe(Op::Heartbeat, pipe).await.ok()?;
        Some(started.iter().zip(found).any(|((_, floor), (e, n))| {
            e.as_deref() != Some(&*epoch) || n.is_none_or(|n| n < *floor)
        }))
    }

    /// Gives back the fleet's threads of tasks open longer than `stale_after`, as the local
    /// count gives back its own: abandoned tasks must not hold threads for ever.
    async fn drop_stale(&self, stale_after: Duration) {
        let Some(cutoff) = Instant::now().checked_sub(stale_after) else {
            return;
        };
        let stale: Vec<(Arc<str>, String)> = {
            let mut held = lock(&self.held);
            let members: Vec<String> = held
                .iter()
                .filter(|(_, h)| h.task.is_some() && h.opened <= cutoff)
                .map(|(member, _)| member.clone())
                .collect();
            members
                .into_iter()
                .filter_map(|member| held.remove(&member).map(|h| (h.key, member)))
                .collect()
        };
        if stale.is_empty() {
            return;
        }
        self.remove_members(&stale).await;
    }

    /// Renews every lease this replica holds; with `restore`, adds back any that Redis no
    /// longer has. Returns the tasks whose leases are gone, and whether every lease was
    /// renewed.
    async fn renew(&self, restore: bool) -> (Vec<TaskId>, bool) {
        let mut by_key: HashMap<Arc<str>, Vec<String>> = HashMap::new();
        let mut upload: HashMap<Arc<str>, Vec<String>> = HashMap::new();
        for (member, held) in lock(&self.held).iter() {
            let list = if held.in_redis || restore {
                &mut by_key
            } else {
                &mut upload
            };
            list.entry(held.key.clone())
                .or_default()
                .push(member.clone());
        }
        let mut ended = Vec::new();
        for (list, restore) in [(by_key, restore), (upload, true)] {
            let chunks = list.into_iter().flat_map(|(key, members)| {
                members
                    .chunks(RENEW_BATCH)
                    .map(|chunk| (key.clone(), chunk.to_vec()))
                    .collect::<Vec<_>>()
            });
            for (key, members) in chunks {
                let (epoch, floor) = self
                    .generation_of(&key)
                    .unwrap_or_else(|| (Arc::from(""), 0));
                let mut cmd = scripts::RENEW.call(4);
                cmd.arg(self.layout.leases(&key))
                    .arg(self.layout.released(&key))
                    .arg(self.layout.spares(&key))
                    .arg(self.layout.generation(&key))
                    .arg(self.lease_ttl_ms())
                    .arg(if restore { "1" } else { "0" })
                    .arg(&*epoch)
                    .arg(floor)
                    .arg(&members);
                let Ok((counter, missing)) = self.call::<(i64, Vec<String>)>(Op::Renew, cmd).await
                else {
                    return (ended, false);
                };
                match u64::try_from(counter) {
                    Ok(counter) => self.saw(&key, counter),
                    Err(_) => {
                        // Missing from a Redis that lost its state is not ended.
                        self.found_stale(&key);
                        return (ended, false);
                    }
                }
                let mut held = lock(&self.held);
                for member in &members {
                    held.mark_in_redis(member);
                }
                let mut spares_gone = Vec::new();
                for member in missing {
                    // A pending lease is its request's until the request ends; only tasks'
                    // leases are released by other replicas. A spare that expired is no
                    // thread any more.
                    if Layout::is_spare(&member) {
                        held.remove(&member);
                        spares_gone.push(member);
                    } else if member.starts_with("t:") {
                        if let Some(Held {
                            task: Some(task), ..
                        }) = held.remove(&member)
                        {
                            ended.push(task);
                        }
                    }
                }
                drop(held);
                if !spares_gone.is_empty() {
                    if let Some(stock) = lock(&self.spares).get_mut(&key) {
                        stock
                            .ready
                            .retain(|(member, _)| !spares_gone.contains(member));
                    }
                }
            }
        }
        (ended, true)
    }

    async fn take_refresher(&self, refresh_interval: Duration) {
        let ttl = (refresh_interval * 3).max(self.config.replica_timeout);
        let mut cmd = scripts::REFRESHER.call(1);
        cmd.arg(self.layout.refresher())
            .arg(&self.config.replica)
            .arg(ttl.as_millis() as u64);
        let held = self
            .call::<u32>(Op::Refresher, cmd)
            .await
            .is_ok_and(|r| r == 1);
        self.refresher.store(held, Ordering::Release);
    }

    fn lease_ttl_ms(&self) -> u64 {
        self.config.replica_timeout.as_millis() as u64
    }
}

/// One of the fleet's threads of a key, held by a submit on its way upstream. Dropped
/// without [`Cluster::pin`], the thread goes back at once.
#[must_use = "a shared lease not kept for a task is given back when dropped"]
pub struct SharedLease {
    cluster: Arc<Cluster>,
    key: Arc<str>,
    member: Option<String>,
}

impl Drop for SharedLease {
    fn drop(&mut self) {
        let Some(member) = self.member.take() else {
            return;
        };
        let held = lock(&self.cluster.held).remove(&member);
        if held.is_some_and(|held| !held.in_redis) {
            // Admitted alone and never written: nothing in Redis to remove.
            return;
        }
        let cluster = self.cluster.clone();
        let gone = [(self.key.clone(), member)];
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { cluster.remove_members(&gone).await });
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn cluster(replica: &str) -> Cluster {
        let config = config::Cluster {
            redis: config::RedisUrl::new("redis://127.0.0.1:1/0"),
            replica: replica.to_owned(),
            prefix: "kr".to_owned(),
            replica_timeout: Duration::from_secs(15),
            timeout: Duration::from_millis(50),
            sync_interval: Duration::from_millis(500),
        };
        Cluster::new(config, Duration::from_secs(60), None).expect("valid url")
    }

    #[tokio::test]
    async fn members_are_named_kind_boot_and_a_number_never_used_twice() {
        let c = cluster("kr-7");
        assert!(c.boot.starts_with("kr-7:"), "{}", c.boot);
        let names: Vec<String> = ["p", "s", "s", "r"]
            .iter()
            .map(|kind| c.next_member(kind))
            .collect();
        let want: Vec<String> = ["p:{}:0", "s:{}:1", "s:{}:2", "r:{}:3"]
            .iter()
            .map(|pattern| pattern.replace("{}", &c.boot))
            .collect();
        assert_eq!(names, want);
    }

    #[tokio::test]
    async fn shares_add_up_to_the_threads_whatever_the_fleet() {
        for fleet_size in 1..=5usize {
            let names: Vec<String> = (0..fleet_size).map(|i| format!("r{i}")).collect();
            for threads in 0..=11u32 {
                let total: u32 = names
                    .iter()
                    .map(|me| {
                        let c = cluster(me);
                        lock(&c.fleet).live = names.clone();
                        c.share(threads)
                    })
                    .sum();
                assert_eq!(total, threads, "{fleet_size} replicas, {threads} threads");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn spares_are_asked_for_in_batches_no_larger_than_the_demand() {
        let c = Arc::new(cluster("r0"));
        // A trickle, a pin every 2 s: one spare at a time, never a batch.
        for _ in 0..3 {
            assert_eq!(c.ask_spares("a").members.len(), 1);
            tokio::time::advance(SPARE_IDLE * 2).await;
        }
        // A flow: each ask grows with the pins of the last second.
        let asks: Vec<Asked<'_>> = (0..3).map(|_| c.ask_spares("b")).collect();
        let counts: Vec<usize> = asks.iter().map(|a| a.members.len()).collect();
        assert_eq!(counts, [1, 2, 3], "the demand so far, nothing granted yet");
        drop(asks);
        // The next window remembers this one's demand.
        tokio::time::advance(SPARE_IDLE).await;
        assert_eq!(
            c.ask_spares("b").members.len(),
            3,
            "the last window's three pins"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn spares_are_asked_for_up_to_the_stock_and_an_ask_is_forgotten_when_its_pin_ends() {
        let c = Arc::new(cluster("r0"));
        for _ in 0..20 {
            drop(c.ask_spares("a"));
            drop(c.ask_spares("b"));
        }
        let first = c.ask_spares("a");
        assert_eq!(
            first.members.len(),
            MAX_SPARES,
            "a busy key's empty stock asks to be filled"
        );
        assert_eq!(
            c.ask_spares("a").members.len(),
            0,
            "asked for already: none more"
        );
        assert_eq!(
            c.ask_spares("b").members.len(),
            MAX_SPARES,
            "each key has its own stock"
        );
        // The pin is cancelled (or Redis granted nothing): the ask goes with its guard.
        drop(first);
        let again = c.ask_spares("a");
        assert_eq!(again.members.len(), MAX_SPARES);
        // Granted spares join the stock before the guard goes: a stock above the low
        // mark asks for nothing, one at it asks for the rest.
        let now = Instant::now();
        lock(&c.spares).get_mut("a").expect("a stock").ready =
            (0..=SPARES_LOW).map(|i| (format!("s:{i}"), now)).collect();
        drop(again);
        assert_eq!(
            c.ask_spares("a").members.len(),
            0,
            "{} ready",
            SPARES_LOW + 1
        );
        lock(&c.spares).get_mut("a").expect("a stock").ready.pop();
        assert_eq!(c.ask_spares("a").members.len(), MAX_SPARES - SPARES_LOW);
    }

    #[tokio::test]
    async fn a_replica_that_never_reached_redis_is_degraded_and_says_why() {
        let c = Arc::new(cluster("r0"));
        assert!(!c.is_shared());
        assert!(c.degraded_reason().is_some());
        // Its submits take leases of its own, for the heartbeat to write when it can.
        let Ok(Admit::Alone(lease)) = c.acquire("a", 5).await else {
            panic!("a lease of this replica's own");
        };
        assert_eq!(c.held_by_me("a"), 1);
        drop(lease);
        assert_eq!(c.held_by_me("a"), 0, "given back when dropped");
    }
}
