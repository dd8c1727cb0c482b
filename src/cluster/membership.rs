//! This replica's view of the fleet and of its own mode: shared (Redis's count is the one
//! check on a key's threads), on its way back to it, or degraded, serving on its share of
//! each key, taken from the replicas it last saw and what they left free. State only, no
//! call: the calls' outcomes (`conn.rs`), the heartbeat, the sync and the generation
//! checks move it, by what Redis answers.

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

    /// Redis counted `taken` leases and spares of `key` just now, `not_held_yet` of them
    /// this replica's though not yet in its own count: what the others hold is the rest.
    /// Kept as fresh as this replica's last script, so that if Redis goes away the share it
    /// then takes is taken from what the others held a moment ago, not a sync ago.
    pub(super) fn count_others(&self, key: &str, taken: u32, not_held_yet: usize) {
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

    /// The service's own count now covers the other replicas' threads of `key` (a
    /// reconciliation while degraded put them in the key's outside load).
    pub fn forget_others(&self, key: &str) {
        lock(&self.others).remove(key);
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
