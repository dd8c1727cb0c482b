//! The fleet's copy of task pins, behind one narrow interface: where several replicas share
//! a pool, a task made through one is polled through another, which reads the creating
//! replica's pin here. A single instance has no such copy ([`NoSharedPins`]); the request
//! path asks the same questions of either and never knows which it holds.

use std::future::Future;
use std::pin::Pin as Boxed;

use crate::captcha::TaskId;

/// A pin as its creating replica shared it: the key's and the caller token's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedPin {
    pub key: String,
    /// Empty: no token.
    pub token: String,
}

/// What the fleet's copy says of a task.
#[derive(Debug)]
pub enum SharedLookup {
    /// The creating replica's pin.
    Found(SharedPin),
    /// No replica shared a pin for it (or there is no fleet).
    Missing,
    /// The copy could not be read now; why, for the log.
    Unreadable(String),
}

/// A boxed lookup: the poll path awaits it only for a task with no pin here.
pub type LookupFuture<'a> = Boxed<Box<dyn Future<Output = SharedLookup> + Send + 'a>>;

pub trait SharedPins: Send + Sync + 'static {
    /// The pin of `task` some replica shared, if any.
    fn lookup<'a>(&'a self, task: &'a TaskId) -> LookupFuture<'a>;
    /// Shares a pin found by probing (no lease: keyrelay did not see the task submitted),
    /// so that no other replica probes for it again. Best effort.
    fn share_found(&self, task: &TaskId, key: &str, token: &str);
    /// Whether a task without a pin here may yet get one: the fleet's copy is being put
    /// back (Redis lost it) or cannot be read, so its creating replica may still say whose
    /// it is. A single instance: never.
    fn owners_may_return(&self) -> bool;
}

/// A single instance: no copy to read or write.
#[derive(Debug, Default)]
pub struct NoSharedPins;

impl SharedPins for NoSharedPins {
    fn lookup<'a>(&'a self, _task: &'a TaskId) -> LookupFuture<'a> {
        Box::pin(std::future::ready(SharedLookup::Missing))
    }

    fn share_found(&self, _task: &TaskId, _key: &str, _token: &str) {}

    fn owners_may_return(&self) -> bool {
        false
    }
}
