//! The fleet's epoch and each key's generation counter: how a replica tells that Redis
//! lost its state, or came back from an older copy, and stops trusting its count until
//! the heartbeat has moved the fleet to a new epoch and put this replica's state back.

use std::collections::HashMap;
use std::sync::Arc;

use super::conn::Op;
use super::membership::Settle;
use super::scripts;
use super::{lock, Cluster};

/// The fleet's epoch as this replica knows it, and per key the lowest generation counter
/// Redis may answer with: the highest this replica was told.
#[derive(Debug, Default)]
pub(super) struct Generation {
    pub(super) epoch: Option<Arc<str>>,
    floors: HashMap<Arc<str>, u64, foldhash::fast::RandomState>,
}

/// What the heartbeat's look at the fleet's epoch found.
pub(super) struct EpochCheck {
    /// Redis lost state this replica had written: its epoch is gone or was moved on.
    pub(super) lost: bool,
    /// This replica began the epoch: Redis had none, or an older state than it saw.
    pub(super) created: bool,
}

impl Cluster {
    /// Whether Redis's count of the fleet is taken and trusted now: it answers, and no
    /// script has found its state older than what this replica saw.
    pub(super) fn is_counting(&self) -> bool {
        self.is_up() && !matches!(*lock(&self.settle), Settle::Lost)
    }

    /// The epoch and the counter floor to send with a script about `key`; `None` for a key
    /// whose generation this replica has not started in the current epoch.
    pub(super) fn generation_of(&self, key: &str) -> Option<(Arc<str>, u64)> {
        let generation = lock(&self.generation);
        let floor = *generation.floors.get(key)?;
        Some((generation.epoch.clone()?, floor))
    }

    /// Redis told a script `key`'s generation counter is at `counter`: no copy of Redis
    /// with a lower one is trusted from now on.
    pub(super) fn saw(&self, key: &str, counter: u64) {
        let mut generation = lock(&self.generation);
        if let Some(floor) = generation.floors.get_mut(key) {
            *floor = (*floor).max(counter);
        }
    }

    /// A script found `key`'s generation stale. For a key this replica started in the
    /// current epoch, Redis lost state: Redis's count is not trusted until the heartbeat,
    /// woken now, has moved the fleet on and put this replica's state back. A key not yet
    /// started (added by a reload) is started at the next heartbeat.
    pub(super) fn found_stale(&self, key: &str) {
        if !lock(&self.generation).floors.contains_key(key) {
            return;
        }
        self.found_lost(key);
    }

    /// Redis's state is older than this replica saw (`what` found it, for the log): its
    /// count is not trusted, and the heartbeat, woken, puts the fleet's state back.
    pub(super) fn found_lost(&self, what: &str) {
        let mut settle = lock(&self.settle);
        if !matches!(*settle, Settle::Lost) {
            tracing::warn!(what, "redis answered with an older state than this replica saw; serving on this replica's share until the fleet's state is put back");
            *settle = Settle::Lost;
        }
        drop(settle);
        self.lost.notify_one();
    }

    /// Resolves when a script has found Redis's state stale, for the heartbeat loop.
    pub async fn lost(&self) {
        self.lost.notified().await;
    }

    /// Moves this replica to the fleet's epoch, moving the fleet to a new one first when
    /// Redis has none (it lost its data) or a script found Redis's state older than this
    /// replica saw in the epoch it knows (a copy from before), and starts the generation of
    /// every key of `keys` not yet started in that epoch, the stale ones included, so that
    /// every replica still on the old epoch finds its next script refused. `None` if Redis
    /// did not answer.
    pub(super) async fn check_epoch(
        &self,
        keys: &[Arc<str>],
        returning: bool,
    ) -> Option<EpochCheck> {
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
                .chain(lock(&self.held).keys())
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
}
