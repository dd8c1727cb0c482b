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
mod generation;
mod heartbeat;
mod held;
mod holds;
mod layout;
mod membership;
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
use generation::Generation;
pub use heartbeat::DOWN_RETRY;
use held::{Held, HeldLeases};
pub use holds::SharedHold;
pub use layout::Layout;
use membership::{Fleet, Settle};
pub use pins::SharedPin;
use pins::{PendingPin, MAX_BACKLOG};
pub use sync::{unix_ms, KeySync, Readings, SharedHealth, Synced};

use crate::captcha::TaskId;
use crate::config;

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

/// A release sent lately, kept to be sent again if Redis loses it: the task's lease would
/// otherwise be put back by the replica that created it, for a task that has ended.
struct SentRelease {
    key: Arc<str>,
    member: String,
    at: Instant,
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
}
