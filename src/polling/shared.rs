//! The fleet's side of shaped polling, behind one narrow interface: where several replicas
//! share a pool, a task's upstream polls are counted across all of them (one per interval,
//! whichever replica its callers reach), and a final answer one replica kept is seen by
//! every other. A single instance shares nothing ([`NoSharedPolls`]); the poll path asks the
//! same questions of either.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::Kept;
use crate::captcha::TaskId;

/// What the fleet says of a poll about to go upstream.
#[derive(Debug)]
pub enum SharedTurn {
    /// This replica's poll goes upstream; the fleet's next waits an interval.
    Go,
    /// Another replica polled the task upstream within the interval.
    Wait,
    /// A replica kept the task's final answer.
    Kept(Kept),
}

/// A boxed turn: awaited only where the local shaper would send a poll upstream.
pub type TurnFuture<'a> = Pin<Box<dyn Future<Output = SharedTurn> + Send + 'a>>;

pub trait SharedPolls: Send + Sync + 'static {
    /// Whether there is a fleet to ask at all; without one [`SharedPolls::turn`] is never
    /// awaited.
    fn shares(&self) -> bool;
    /// Before a caller's poll of `task` is answered: the answer a replica kept, else, with
    /// `interval` (this replica would poll the service now), whether this poll is the
    /// fleet's one in `interval`; without (too soon here), `Wait`. A fleet that cannot be
    /// asked now says `Go` or `Wait` as this replica would: each replica then shapes on its
    /// own, as a single instance does.
    fn turn<'a>(&'a self, task: &'a TaskId, interval: Option<Duration>) -> TurnFuture<'a>;
    /// Shares `task`'s final answer for `keep_for`. Best effort, in the background.
    fn keep(&self, task: &TaskId, kept: &Kept, keep_for: Duration);
}

/// A single instance: no fleet.
#[derive(Debug, Default)]
pub struct NoSharedPolls;

impl SharedPolls for NoSharedPolls {
    fn shares(&self) -> bool {
        false
    }

    fn turn<'a>(&'a self, _task: &'a TaskId, interval: Option<Duration>) -> TurnFuture<'a> {
        let turn = match interval {
            Some(_) => SharedTurn::Go,
            None => SharedTurn::Wait,
        };
        Box::pin(std::future::ready(turn))
    }

    fn keep(&self, _task: &TaskId, _kept: &Kept, _keep_for: Duration) {}
}

/// A kept answer as the fleet stores it: `1` or `0` for `get2`, then the body as the
/// service sent it.
pub fn encode(kept: &Kept) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(kept.body.len() + 1);
    bytes.push(if kept.get2 { b'1' } else { b'0' });
    bytes.extend_from_slice(&kept.body);
    bytes
}

/// What [`encode`] wrote; `None` for anything else (a value another version wrote).
pub fn decode(bytes: &[u8]) -> Option<Kept> {
    let (flag, body) = bytes.split_first()?;
    let get2 = match flag {
        b'1' => true,
        b'0' => false,
        _ => return None,
    };
    Kept::of(bytes::Bytes::copy_from_slice(body), get2)
}
