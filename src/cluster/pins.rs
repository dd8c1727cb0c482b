//! Task pins in Redis: the copy another replica reads before it considers probing, and the
//! backlog of pins written while Redis was away (or lost them), sent when it returns. The
//! pin written with a task's lease, in the same round trip, is the lease's business
//! (`leases.rs`).

use std::sync::Arc;

use super::conn::{ClusterError, Op};
use super::{lock, Cluster};
use crate::captcha::TaskId;
use crate::pins::{LookupFuture, SharedLookup, SharedPins};

/// The most pins kept to write to Redis when it returns; beyond it the oldest are dropped
/// (they stay in the local journal, and other replicas find them by probing).
pub(super) const MAX_BACKLOG: usize = 100_000;

pub use crate::pins::SharedPin;

/// A pin to write once Redis returns.
pub(super) struct PendingPin {
    task: String,
    value: String,
}

/// The fleet's copy of pins is Redis's; an owner not there may be put back while the fleet
/// is not sharing (Redis away, or putting back what it lost).
impl SharedPins for Arc<Cluster> {
    fn lookup<'a>(&'a self, task: &'a TaskId) -> LookupFuture<'a> {
        Box::pin(async move {
            match Cluster::lookup(self, task).await {
                Ok(Some(pin)) => SharedLookup::Found(pin),
                Ok(None) => SharedLookup::Missing,
                Err(error) => SharedLookup::Unreadable(error.to_string()),
            }
        })
    }

    fn share_found(&self, task: &TaskId, key: &str, token: &str) {
        self.share_found_pin(task, key, token);
    }

    fn owners_may_return(&self) -> bool {
        !self.is_shared()
    }
}

impl Cluster {
    /// Shares a pin found by probing (no lease: keyrelay did not see the task submitted), so
    /// that no other replica probes for it again. Best effort, in the background.
    pub fn share_found_pin(self: &Arc<Self>, task: &TaskId, key: &str, token: &str) {
        if !self.is_up() {
            return;
        }
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.layout.pin(&task.to_string()))
            .arg(format!("{key}\t{token}"))
            .arg("EX")
            .arg(self.pin_ttl.as_secs().max(1));
        let this = self.clone();
        tokio::spawn(async move {
            let _ = this.call::<()>(Op::Pin, cmd).await;
        });
    }

    /// The pin another replica wrote for `task`, if Redis has one. A pin missing from a
    /// Redis whose epoch is not the one this replica knows is no answer (`Stale`).
    ///
    /// # Errors
    /// Redis did not answer in time.
    pub async fn lookup(&self, task: &TaskId) -> Result<Option<SharedPin>, ClusterError> {
        if !self.is_up() {
            return Err(ClusterError::Degraded);
        }
        // With the fleet's epoch: a pin missing from a Redis that lost its data (the epoch
        // gone or replaced) may come back with the creating replica's, and "no pin" must
        // not be taken as "nobody's task" before it has.
        let known = lock(&self.generation).epoch.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(self.layout.epoch())
            .cmd("GET")
            .arg(self.layout.pin(&task.to_string()));
        let (epoch, value): (Option<String>, Option<String>) =
            self.call_pipe(Op::Lookup, pipe).await?;
        if value.is_none() && known.is_some() && epoch.as_deref() != known.as_deref() {
            self.found_lost("a pin lookup");
            return Err(ClusterError::Stale);
        }
        Ok(value.and_then(|value| {
            let (key, token) = value.split_once('\t')?;
            Some(SharedPin {
                key: key.to_owned(),
                token: token.to_owned(),
            })
        }))
    }

    /// Keeps a pin that did not reach Redis, to write when it returns; a full backlog drops
    /// its oldest.
    pub(super) fn backlog_pin(&self, task: String, value: String) {
        let mut backlog = lock(&self.backlog);
        if backlog.len() >= MAX_BACKLOG {
            backlog.pop_front();
        }
        backlog.push_back(PendingPin { task, value });
    }

    /// Keeps this replica's pins to write again after Redis lost them, as many as the
    /// backlog has room for.
    pub(super) fn backlog_pins(&self, pins: Vec<(String, String)>) {
        let mut backlog = lock(&self.backlog);
        for (task, value) in pins {
            if backlog.len() >= MAX_BACKLOG {
                break;
            }
            backlog.push_back(PendingPin { task, value });
        }
    }

    /// Sends the releases and pins that waited for Redis. Returns whether all went.
    pub(super) async fn flush_backlog(&self) -> bool {
        let released: Vec<(Arc<str>, String)> = lock(&self.released).drain(..).collect();
        if !released.is_empty() && self.send_releases(&released).await.is_err() {
            let mut backlog = lock(&self.released);
            for release in released.into_iter().rev() {
                backlog.push_front(release);
            }
            return false;
        }
        loop {
            let batch: Vec<PendingPin> = {
                let mut backlog = lock(&self.backlog);
                let n = backlog.len().min(500);
                backlog.drain(..n).collect()
            };
            if batch.is_empty() {
                return true;
            }
            let mut pipe = redis::pipe();
            for pin in &batch {
                pipe.cmd("SET")
                    .arg(self.layout.pin(&pin.task))
                    .arg(&pin.value)
                    .arg("EX")
                    .arg(self.pin_ttl.as_secs().max(1))
                    .ignore();
            }
            if self.call_pipe::<()>(Op::Pin, pipe).await.is_err() {
                let mut backlog = lock(&self.backlog);
                for pin in batch.into_iter().rev() {
                    backlog.push_front(pin);
                }
                return false;
            }
        }
    }

    /// Pins waiting for Redis to return.
    pub fn backlog_len(&self) -> usize {
        lock(&self.backlog).len()
    }
}
