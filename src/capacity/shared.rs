//! The fleet's side of a key's threads, behind one narrow interface: where several
//! replicas share a pool, a submit takes a seat in the fleet's count after its thread here,
//! and a task keeps it until its final answer, seen on whichever replica. A single instance
//! has no fleet count ([`NoSharedThreads`]); admission asks the same of either.

use std::future::Future;
use std::pin::Pin;

use crate::captcha::TaskId;

/// A boxed step of the fleet's count: a Redis round trip where there is one.
pub type Step<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the fleet's count said to a submit.
pub enum SharedTake {
    /// A seat is this submit's until it is dropped or kept for the task.
    Seated(Box<dyn SharedSeat>),
    /// Every thread of the key is held somewhere in the fleet.
    Full,
    /// The count could not be asked; why, for the log. This instance's own share applies.
    Unavailable(String),
}

/// A seat in the fleet's count, held by a submit on its way upstream: dropped, it goes back.
pub trait SharedSeat: Send {
    /// The service accepted the submit: the seat becomes `task`'s, under a name any
    /// replica can give back, with its pin shared (`token`: the caller token's name, empty
    /// for none), before the caller has the id.
    fn keep<'a>(
        self: Box<Self>,
        task: &'a TaskId,
        key: &'a str,
        token: &'a str,
        limit: u32,
    ) -> Step<'a, ()>;
}

pub trait SharedThreads: Send + Sync + 'static {
    /// Whether there is a fleet count to take seats in at all: a single instance's own
    /// count is the whole check, and it pays nothing more per submit.
    fn counts(&self) -> bool;
    /// A seat of `key`'s threads, if fewer than `limit` are held across the fleet.
    fn take<'a>(&'a self, key: &'a str, limit: u32) -> Step<'a, SharedTake>;
    /// `task` of `key` had its final answer here: its seat goes back, whichever replica
    /// created it.
    fn finished(&self, key: &str, task: &TaskId);
    /// Whether the fleet's count is whole and is the check now: then this instance counts
    /// none of a key's threads as its own limit, and weighs keys by the fleet's use.
    fn is_whole(&self) -> bool;
    /// The threads of `key` (of `capacity`, `limit` of them the fleet's to count) this
    /// instance may hold by its own count: all when alone, none of its own while the
    /// fleet's count is whole (`None`), a share while it is not.
    fn own_limit(&self, key: &str, capacity: u32, limit: u32) -> Option<u32>;
}

/// A single instance: no fleet to count.
#[derive(Debug, Default)]
pub struct NoSharedThreads;

impl SharedThreads for NoSharedThreads {
    fn counts(&self) -> bool {
        false
    }

    fn take<'a>(&'a self, _key: &'a str, _limit: u32) -> Step<'a, SharedTake> {
        Box::pin(std::future::ready(SharedTake::Unavailable(
            "no fleet".to_owned(),
        )))
    }

    fn finished(&self, _key: &str, _task: &TaskId) {}

    fn is_whole(&self) -> bool {
        false
    }

    fn own_limit(&self, _key: &str, capacity: u32, _limit: u32) -> Option<u32> {
        Some(capacity)
    }
}
