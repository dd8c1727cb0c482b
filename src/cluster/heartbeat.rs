//! The heartbeat, run every third of `replica_timeout`: records this replica as alive,
//! renews its leases, takes or keeps the refresher lease, and after an outage or a loss
//! puts back what this replica holds, then marks it synced so that shared mode can begin
//! once the whole fleet has.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::conn::Op;
use super::held::Held;
use super::layout::Layout;
use super::membership::Settle;
use super::{lock, remembered, scripts, Cluster};
use crate::captcha::TaskId;

/// How often a replica without Redis tries it again (at least; `fleet` runs the heartbeat).
pub const DOWN_RETRY: Duration = Duration::from_secs(1);

/// The most leases one renewal script handles: a script blocks Redis while it runs, so a
/// replica with many open tasks renews them in several short scripts that other replicas'
/// calls can run between, not one long one.
const RENEW_BATCH: usize = 256;

impl Cluster {
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
        let known_before = std::mem::replace(&mut lock(&self.fleet).live, live.clone());
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
                    known_before,
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
            known_before,
            ..
        } = &mut *settle
        else {
            return;
        };
        let mut expected: Vec<&String> = live.iter().chain(known_before.iter()).collect();
        expected.sort_unstable();
        expected.dedup();
        *waiting_for = expected
            .into_iter()
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
}
