//! The sync of what the fleet shares besides leases: each key's health (written as it
//! changes and announced on the changes channel), the refresher's readings, the IP-ban
//! pause, and each key's fleet count, all read back in one round trip at every
//! `sync_interval`. Reads and writes only; `fleet` decides what to adopt.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use redis::Value;

use super::conn::{from_value, redis_error, ClusterError, Op};
use super::scripts;
use super::{lock, Cluster};

/// A pool key's shared health, as the last replica to change it wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthRecord {
    pub version: u64,
    pub state: String,
    pub reason: String,
    /// End of a cooldown, unix ms; 0: none.
    pub until_ms: u64,
    pub by: String,
}

/// The refresher's last reading of a key.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Readings {
    pub balance: Option<f64>,
    pub threads: Option<(u32, u32)>,
    /// Threads the service works on beyond the fleet's own leases.
    pub external: u32,
}

/// One key's shared state, read by [`Cluster::sync`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeySync {
    pub health: Option<HealthRecord>,
    pub readings: Option<Readings>,
    /// When the refresher published `readings` (unix ms): the same at every sync until it
    /// reads the key again, so a replica can tell a new reading from one it adopted before.
    pub readings_at: u64,
    /// Leases held across the fleet: threads in use.
    pub held: u32,
    /// Spares held across the fleet: threads taken ahead, not in use, but not free either.
    pub spares: u32,
}

/// What one sync read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Synced {
    /// In the order of the names asked for.
    pub keys: Vec<KeySync>,
    /// End of the fleet's IP-ban pause, unix ms, while one is in force.
    pub pause_until_ms: Option<u64>,
}

impl Cluster {
    /// Announces a key's new health to the fleet.
    pub async fn publish_health(
        &self,
        key: &str,
        state: &str,
        reason: &str,
        until: Option<SystemTime>,
    ) {
        if !self.up.load(Ordering::Acquire) {
            return;
        }
        let until_ms = until.map_or(0, unix_ms);
        let mut pipe = redis::pipe();
        pipe.add_command(scripts::HEALTH.call(1))
            .arg(self.layout.health(key))
            .arg(state)
            .arg(reason)
            .arg(until_ms)
            .arg(&self.config.replica)
            .ignore()
            .cmd("PUBLISH")
            .arg(self.layout.changes())
            .arg(key)
            .ignore();
        let _ = self.call_pipe::<()>(Op::Health, pipe).await;
    }

    /// A stream that yields whenever a replica announces a change (a key's health), so
    /// that the sync runs at once rather than at its next interval. A message missed while
    /// disconnected costs at most one `sync_interval`.
    ///
    /// # Errors
    /// Redis did not answer in time.
    pub async fn changes(&self) -> Result<impl futures_util::Stream<Item = ()>, ClusterError> {
        let subscribe = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(self.layout.changes()).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = match tokio::time::timeout(self.config.timeout, subscribe).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(e)) => return Err(redis_error(Op::Sync, &e)),
            Err(_) => {
                return Err(ClusterError::Timeout {
                    op: Op::Sync.label(),
                    after: self.config.timeout,
                })
            }
        };
        Ok(futures_util::StreamExt::map(
            pubsub.into_on_message(),
            |_| (),
        ))
    }

    /// Announces the IP-ban pause to the fleet.
    pub async fn publish_pause(&self, until: SystemTime) {
        if !self.up.load(Ordering::Acquire) {
            return;
        }
        let ms = until
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .as_millis()
            .max(1) as u64;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.layout.pause())
            .arg(unix_ms(until))
            .arg("PX")
            .arg(ms);
        let _ = self.call::<()>(Op::Pause, cmd).await;
    }

    /// The refresher writes what it read of a key for the fleet.
    pub async fn publish_readings(&self, key: &str, readings: Readings) {
        if !self.is_shared() {
            return;
        }
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.layout.readings(key))
            .arg("balance")
            .arg(readings.balance.map(|b| b.to_string()).unwrap_or_default())
            .arg("threads")
            .arg(
                readings
                    .threads
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
            )
            .arg("working")
            .arg(
                readings
                    .threads
                    .map(|t| t.1.to_string())
                    .unwrap_or_default(),
            )
            .arg("external")
            .arg(readings.external)
            .arg("at")
            .arg(unix_ms(SystemTime::now()));
        let _ = self.call::<()>(Op::Sync, cmd).await;
    }

    /// Leases held across the fleet for `key` now: its threads in use (spares not counted).
    ///
    /// # Errors
    /// Redis did not answer in time.
    pub async fn held(&self, key: &str) -> Result<u32, ClusterError> {
        let (leases, _spares, _counter): (u32, u32, i64) =
            self.call(Op::Sync, self.count(key)).await?;
        Ok(leases)
    }

    /// The script that counts `key`'s leases and spares and checks its generation.
    fn count(&self, key: &str) -> redis::Cmd {
        let (epoch, floor) = self
            .generation_of(key)
            .unwrap_or_else(|| (Arc::from(""), 0));
        let mut cmd = scripts::COUNT.call(3);
        cmd.arg(self.layout.leases(key))
            .arg(self.layout.spares(key))
            .arg(self.layout.generation(key))
            .arg(&*epoch)
            .arg(floor);
        cmd
    }

    /// Reads every named key's shared health, readings and lease count, and the pause, in
    /// one round trip.
    ///
    /// # Errors
    /// Redis did not answer in time.
    pub async fn sync(&self, keys: &[Arc<str>]) -> Result<Synced, ClusterError> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("HGETALL").arg(self.layout.health(key));
            pipe.cmd("HGETALL").arg(self.layout.readings(key));
            pipe.add_command(self.count(key));
        }
        pipe.cmd("GET").arg(self.layout.pause());
        // The heartbeats prune the dead; a replica that just died still counts here, which
        // only makes the shares smaller.
        pipe.cmd("ZRANGE")
            .arg(self.layout.replicas())
            .arg(0)
            .arg(-1);
        let values: Vec<Value> = self.call_pipe(Op::Sync, pipe).await?;
        let mut values = values.into_iter();
        let mut synced = Synced::default();
        // Only a whole count says what the others hold: one read from a Redis that lost its
        // state, or while the fleet puts it back, would understate it, and the shares are
        // taken from what the others left free.
        let whole = self.is_shared();
        let mut others = lock(&self.others).clone();
        for key in keys {
            let health: HashMap<String, String> = from_value(values.next());
            let readings: HashMap<String, String> = from_value(values.next());
            let (held, spares, counter): (u32, u32, i64) = from_value(values.next());
            let current = match u64::try_from(counter) {
                Ok(counter) => {
                    self.saw(key, counter);
                    true
                }
                Err(_) => {
                    self.found_stale(key);
                    false
                }
            };
            if whole && current {
                let mine = u32::try_from(self.held_by_me(key)).unwrap_or(u32::MAX);
                others.insert(key.to_string(), (held + spares).saturating_sub(mine));
            }
            synced.keys.push(KeySync {
                health: parse_health(&health),
                readings: parse_readings(&readings),
                readings_at: readings
                    .get("at")
                    .and_then(|at| at.parse().ok())
                    .unwrap_or(0),
                held,
                spares,
            });
        }
        *lock(&self.others) = others;
        let pause: Option<u64> = from_value(values.next());
        synced.pause_until_ms = pause.filter(|&until| until > unix_ms(SystemTime::now()));
        let mut live: Vec<String> = from_value(values.next());
        // While the fleet is not sharing, the list in Redis may be one it lost and is
        // rebuilding: the fleet last seen stays, for the shares and for whom to wait for.
        if !live.is_empty() && whole {
            live.sort();
            lock(&self.fleet).live = live;
        }
        Ok(synced)
    }
}

/// Key health and the IP-ban pause go to Redis, where every replica's sync reads them;
/// sent in the background, and dropped while Redis is away: a replica that would have
/// adopted the change meets the same answer from the service on its own.
impl crate::health::SharedHealth for Arc<Cluster> {
    fn announce(&self, key: &str, change: crate::health::Announcement) {
        let (cluster, key) = (self.clone(), key.to_owned());
        tokio::spawn(async move {
            let reason = change.reason.map_or("", crate::health::Reason::label);
            cluster
                .publish_health(&key, change.state.label(), reason, change.until)
                .await;
        });
    }

    fn announce_pause(&self, until: SystemTime) {
        let cluster = self.clone();
        tokio::spawn(async move { cluster.publish_pause(until).await });
    }
}

pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn parse_health(fields: &HashMap<String, String>) -> Option<HealthRecord> {
    Some(HealthRecord {
        version: fields.get("v")?.parse().ok()?,
        state: fields.get("state")?.clone(),
        reason: fields.get("reason").cloned().unwrap_or_default(),
        until_ms: fields
            .get("until")
            .and_then(|u| u.parse().ok())
            .unwrap_or(0),
        by: fields.get("by").cloned().unwrap_or_default(),
    })
}

fn parse_readings(fields: &HashMap<String, String>) -> Option<Readings> {
    fields.get("at")?;
    let number = |name: &str| fields.get(name).and_then(|v| v.parse::<u32>().ok());
    Some(Readings {
        balance: fields.get("balance").and_then(|v| v.parse().ok()),
        threads: number("threads").zip(number("working")),
        external: number("external").unwrap_or(0),
    })
}
