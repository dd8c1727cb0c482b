//! Thread leases in Redis: a submit's lease (a spare of this replica's, or one `ACQUIRE`
//! takes), kept as its task's with the pin and the next spares in one round trip, and
//! released, by whichever replica sees the task's final answer, into the key's released
//! set. Without Redis a lease is this replica's own, and a release waits in a backlog.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::conn::{ClusterError, Op};
use super::held::Held;
use super::layout::{Joined, Layout};
use super::pins::MAX_BACKLOG;
use super::spares::{Asked, Stock};
use super::{lock, scripts, Cluster};
use crate::capacity::{SharedSeat, SharedTake, SharedThreads, Step};
use crate::captcha::TaskId;

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

/// A release sent lately, kept to be sent again if Redis loses it: the task's lease would
/// otherwise be put back by the replica that created it, for a task that has ended.
pub(super) struct SentRelease {
    key: Arc<str>,
    member: String,
    at: Instant,
}

impl Cluster {
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
        let (granted, _taken, counter): (i32, u32, u64) = self.call(Op::Acquire, cmd).await?;
        if granted >= 0 {
            self.saw(&key, counter);
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
        let mut spares = lock(&self.spares);
        let stock = spares.get_mut(key)?;
        let (member, _) = stock.ready.pop()?;
        Some(SharedLease {
            cluster: self.clone(),
            key: stock.key.clone(),
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
        let mut digits = itoa::Buffer::new();
        let task_text = task.text(&mut digits);
        let member = Layout::task_lease(task_text);
        // The lease's name of the key serves the task's lease and the spares: no new copy.
        let (old, name) = match lease {
            Some(mut lease) => (lease.member.take(), Some(lease.key.clone())),
            None => (None, None),
        };
        let value = Joined([key, "\t", token]);
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
            let mut keep = scripts::KEEP.call(3);
            keep.arg(self.layout.leases(key))
                .arg(self.layout.spares(key))
                .arg(self.layout.generation(key))
                .arg(old)
                .arg(&member)
                .arg(self.lease_ttl_ms())
                .arg(limit)
                .arg(margin)
                .arg(&*epoch)
                .arg(floor)
                .arg(&asked.members);
            // Sized for its five arguments: grown from empty, it reallocated twice a submit.
            let mut set = redis::Cmd::with_capacity(5, 128);
            set.arg("SET")
                .arg(self.layout.pin(task_text))
                .arg(value)
                .arg("EX")
                .arg(self.pin_ttl.as_secs().max(1));
            let mut pipe = redis::Pipeline::with_capacity(2);
            pipe.add_command(keep).add_command(set).ignore();
            match self.call_pipe::<((i32, usize, u64),)>(Op::Pin, pipe).await {
                Ok(((had, n, counter),)) if had >= 0 => {
                    asked.answered = true;
                    granted = n.min(asked.members.len());
                    self.saw(key, counter);
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
        let key = name.unwrap_or_else(|| Arc::from(key));
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
                .entry(key.clone())
                .or_insert_with(|| Stock::new(key))
                .ready
                .extend(spares.iter().map(|spare| (spare.clone(), now)));
        }
        drop(asked);
        if !in_redis {
            self.backlog_pin(task_text.to_owned(), value.to_string());
        }
    }

    /// Removes these members from their keys' sets in one round trip, best effort: a member
    /// not removed now expires with its lease TTL.
    pub(super) async fn remove_members(&self, members: &[(Arc<str>, String)]) {
        let mut pipe = redis::pipe();
        for (key, member) in members {
            pipe.cmd("ZREM")
                .arg(self.layout.set_of(key, member))
                .arg(member)
                .ignore();
        }
        let _ = self.call_pipe::<()>(Op::Release, pipe).await;
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
    pub(super) async fn resend_releases(&self) -> bool {
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

    pub(super) async fn send_releases(
        &self,
        releases: &[(Arc<str>, String)],
    ) -> Result<(), ClusterError> {
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

/// The fleet's count of threads is Redis's lease sets.
impl SharedThreads for Arc<Cluster> {
    fn counts(&self) -> bool {
        true
    }

    fn take<'a>(&'a self, key: &'a str, limit: u32) -> Step<'a, SharedTake> {
        Box::pin(async move {
            match self.acquire(key, limit).await {
                Ok(Admit::Granted(lease) | Admit::Alone(lease)) => {
                    SharedTake::Seated(Box::new(lease))
                }
                Ok(Admit::Full) => SharedTake::Full,
                Err(error) => SharedTake::Unavailable(error.to_string()),
            }
        })
    }

    fn finished(&self, key: &str, task: &TaskId) {
        self.release_task(key, task);
    }

    fn is_whole(&self) -> bool {
        self.is_shared()
    }

    fn own_limit(&self, key: &str, _capacity: u32, limit: u32) -> Option<u32> {
        (!self.is_shared()).then(|| self.degraded_limit(key, limit))
    }
}

impl SharedSeat for SharedLease {
    fn keep<'a>(
        self: Box<Self>,
        task: &'a TaskId,
        key: &'a str,
        token: &'a str,
        limit: u32,
    ) -> Step<'a, ()> {
        let cluster = self.cluster.clone();
        Box::pin(async move { cluster.pin(Some(*self), task, key, token, limit).await })
    }
}
