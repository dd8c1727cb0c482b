//! This replica's view of the fleet and of its own mode: shared (Redis's count is the one
//! check on a key's threads), on its way back to it, or degraded, serving on its share of
//! each key, taken from the replicas it last saw and what they left free. State only, no
//! call: the calls' outcomes (`conn.rs`), the heartbeat, the sync and the generation
//! checks move it, by what Redis answers.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{lock, Cluster};

/// Where this replica is on its way to shared mode.
#[derive(Debug)]
pub(super) enum Settle {
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
        /// Replicas seen alive before Redis went or lost its data: waited for too (until
        /// `deadline`), since a Redis that lost its replica list knows only those that have
        /// heartbeated since, and one alone there would take itself for the whole fleet.
        known_before: Vec<String>,
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

/// Which keys' services were read since Redis went away, for [`Cluster::degraded_limit`].
#[derive(Debug, Default)]
pub(super) struct ServiceReadings {
    pub read: HashSet<String>,
    pub unreadable: HashSet<String>,
}

/// The fleet as last seen.
#[derive(Clone, Debug, Default)]
pub(super) struct Fleet {
    /// Live replicas, sorted; this one among them once it has heartbeated.
    pub(super) live: Vec<String>,
}

impl Cluster {
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
    /// share, once the service's own `threadsinfo` has been read since Redis went (the
    /// refresh then counts every other replica's tasks as the key's outside load, and a
    /// share of what is left cannot overfill); none before. A share taken from the others'
    /// holdings as Redis last counted them could: a replica above its share and one below
    /// it would both grow to theirs. For a key whose service does not answer `threadsinfo`,
    /// the share, less what the others held at this replica's last count.
    pub fn degraded_limit(&self, key: &str, limit: u32) -> u32 {
        if self.puts_back_a_loss() {
            return 0;
        }
        let (read, unreadable) = {
            let readings = lock(&self.readings);
            (
                readings.read.contains(key),
                readings.unreadable.contains(key),
            )
        };
        if read {
            return self.share(limit);
        }
        if unreadable {
            let others = lock(&self.others).get(key).copied().unwrap_or(0);
            return self.share(limit).min(limit.saturating_sub(others));
        }
        0
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
    /// reconciliation while degraded put them in the key's outside load): its share may be
    /// taken.
    pub fn forget_others(&self, key: &str) {
        let mut readings = lock(&self.readings);
        readings.unreadable.remove(key);
        readings.read.insert(key.to_owned());
    }

    /// `key`'s service did not answer `threadsinfo` while Redis is away: its share is taken
    /// from the others' last count, the best there is.
    pub fn cannot_read(&self, key: &str) {
        lock(&self.readings).unreadable.insert(key.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cluster::tests::cluster;
    use crate::cluster::Admit;

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

    #[tokio::test]
    async fn a_share_waits_for_the_services_reading_since_redis_went() {
        let c = cluster("r0");
        lock(&c.fleet).live = vec!["r0".into(), "r1".into()];
        // r1 held four of five threads at the last count: the old rule gave r0 one more
        // (min(share 3, 5 - 4)) while r1 kept four and might take none back: safe only if
        // r1 never grows. Without a reading nothing is taken.
        lock(&c.others).insert("a".into(), 4);
        assert_eq!(c.degraded_limit("a", 5), 0, "no reading yet");
        // The service's count now holds every other replica's task as outside load.
        c.forget_others("a");
        assert_eq!(c.degraded_limit("a", 5), c.share(5));
        assert_eq!(c.degraded_limit("b", 5), 0, "per key");
        // A service that cannot say: the share, less the others' last count (none: the
        // share, as before any count).
        c.cannot_read("b");
        assert_eq!(c.degraded_limit("b", 5), c.share(5));
        lock(&c.others).insert("b".into(), 3);
        assert_eq!(c.degraded_limit("b", 5), 2);
        // Redis back and gone again: the reading is of before; wait for a new one.
        c.up.store(true, Ordering::Release);
        c.mark_down(
            crate::cluster::Op::Acquire,
            &crate::cluster::ClusterError::Degraded,
        );
        assert_eq!(c.degraded_limit("a", 5), 0);
        // While the fleet puts back what Redis lost, nothing, reading or not.
        c.forget_others("a");
        *lock(&c.settle) = Settle::Lost;
        assert_eq!(c.degraded_limit("a", 5), 0);
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
