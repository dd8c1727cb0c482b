//! Where replicas share the pool, what this one announces of its keys' health (and of the
//! service's IP-ban pause) for the others to adopt, behind one narrow interface. A single
//! instance announces nothing ([`NoSharedHealth`]); `App` announces to either alike.

use std::time::SystemTime;

use super::{Reason, StateKind};

/// A key's new state as the other replicas adopt it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Announcement {
    pub state: StateKind,
    pub reason: Option<Reason>,
    /// The end of a cooldown, by the wall clock (the replicas share no monotonic one).
    pub until: Option<SystemTime>,
}

pub trait SharedHealth: Send + Sync + 'static {
    /// `key` changed state here: the others adopt it at their next sync. Sent in the
    /// background: a request that changed a key's state never waits on the others.
    fn announce(&self, key: &str, change: Announcement);
    /// The service banned this host's IP until `until`: every replica pauses, since a
    /// request from any of them would extend the ban.
    fn announce_pause(&self, until: SystemTime);
}

/// A single instance: nobody to tell.
#[derive(Debug, Default)]
pub struct NoSharedHealth;

impl SharedHealth for NoSharedHealth {
    fn announce(&self, _key: &str, _change: Announcement) {}

    fn announce_pause(&self, _until: SystemTime) {}
}
