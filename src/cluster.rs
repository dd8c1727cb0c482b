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
//!
//! The one type, [`Cluster`], is defined here; its methods are spread over `cluster/` by
//! what they own. Each file imports (`super::x`) only files listed before it:
//!
//! - `held.rs`, `layout.rs`, `scripts.rs`, `remembered.rs`: leaves; this replica's leases,
//!   every Redis key's name, the Lua scripts, the fleet kept in `data_dir`;
//! - `membership.rs`: the mode (shared, settling, degraded) and the fleet last seen, and
//!   the share of each key taken from them; state only;
//! - `conn.rs`: the connection and every call on it, timeouts, error and round-trip
//!   counts, the step into degraded mode ([`Op`], [`ClusterError`]);
//! - `generation.rs`: the fleet's epoch and each key's generation, which tell a Redis
//!   that lost its state;
//! - `pins.rs`: pins read by other replicas, and the pins that wait for Redis;
//! - `polls.rs`: a task's polling turn across the fleet and its kept final answer;
//! - `spares.rs`: threads taken ahead for the next submits;
//! - `leases.rs`: a submit's lease, kept as its task's with the pin, and releases
//!   ([`SharedLease`], [`Admit`]);
//! - `heartbeat.rs`: renewals, the refresher lease, putting state back, the synced mark;
//! - `sync.rs`: health, readings, the pause and counts, published and read back;
//! - `holds.rs`: operator holds, published, put back and read.

mod conn;
mod generation;
mod heartbeat;
mod held;
mod holds;
mod layout;
mod leases;
mod membership;
mod pins;
mod polls;
mod remembered;
mod scripts;
mod spares;
mod sync;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Notify;

use conn::{connection_info, redis_error};
pub use conn::{ClusterError, Op};
use generation::Generation;
pub use heartbeat::DOWN_RETRY;
use held::HeldLeases;
pub use holds::SharedHold;
pub use layout::Layout;
use leases::SentRelease;
pub use leases::{Admit, SharedLease};
use membership::{Fleet, ServiceReadings, Settle};
use pins::PendingPin;
pub use pins::SharedPin;
use spares::Stocks;
pub use spares::SPARE_IDLE;
pub use sync::{unix_ms, HealthRecord, KeySync, Readings, Synced};

use crate::config;

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
    spares: Mutex<Stocks>,
    backlog: Mutex<VecDeque<PendingPin>>,
    /// Threads of each key held by the other replicas at the last sync. In shared mode a
    /// replica may hold more than its share; when Redis goes away those threads stay busy,
    /// so the shares are taken from what they left free, until this replica's own
    /// `threadsinfo` reconciliation counts them instead.
    others: Mutex<HashMap<String, u32>>,
    /// Keys whose service was read (or could not be) since Redis went away: the shares
    /// wait for a reading.
    readings: Mutex<ServiceReadings>,
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
            spares: Mutex::new(Stocks::default()),
            backlog: Mutex::new(VecDeque::new()),
            released: Mutex::new(VecDeque::new()),
            others: Mutex::new(HashMap::new()),
            readings: Mutex::new(ServiceReadings::default()),
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

    /// How many leases and spares of this replica's are live, by key name.
    pub fn held_by_me(&self, key: &str) -> usize {
        lock(&self.held).count(key)
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

    fn lease_ttl_ms(&self) -> u64 {
        self.config.replica_timeout.as_millis() as u64
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
}
