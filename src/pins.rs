//! Task pins: which key created each task, so polls and reports go out with that key.
//!
//! Pins sit behind the narrow [`PinStore`] interface so that a shared store can later let
//! several keyrelay replicas poll each other's tasks. [`MemoryPins`] bounds its memory two
//! ways: pins expire after a TTL, and past a size cap the oldest pins are evicted first.
//! [`JournalPins`] wraps a `MemoryPins` with an append-only journal on disk, so pins survive
//! a restart and a `kill -9`.

mod journal;
mod memory;
mod misses;
mod probe_budget;
mod shared;

pub use journal::{JournalPins, Recovery};
pub use memory::MemoryPins;
pub use misses::ProbeMisses;
pub use probe_budget::ProbeBudget;
pub use shared::{LookupFuture, NoSharedPins, SharedLookup, SharedPin, SharedPins};

use std::time::Duration;

use tokio::time::Instant;

use crate::captcha::TaskId;
use crate::key_id::KeyId;
pub use crate::tokens::TokenId;

/// The narrow interface to task pins: which key created each task, until the pin expires or
/// is evicted. Whether a task is still running is not the store's business: thread accounting
/// belongs to the capacity ledger.
pub trait PinStore: Send + Sync + 'static {
    /// Records that `key` created `task` for a caller with no token.
    fn pin(&self, task: TaskId, key: KeyId, now: Instant) {
        self.pin_for(task, key, TokenId::NONE, now);
    }
    /// Records that `key` created `task` for the caller token `token` ([`TokenId::NONE`]:
    /// none), whose task it is from then on.
    fn pin_for(&self, task: TaskId, key: KeyId, token: TokenId, now: Instant);
    /// The key that created `task`, if the pin is known and not expired.
    fn owner(&self, task: &TaskId, now: Instant) -> Option<KeyId> {
        self.pinned(task, now).map(|pin| pin.key)
    }
    /// The key and the caller token of `task`, if the pin is known and not expired.
    fn pinned(&self, task: &TaskId, now: Instant) -> Option<Pin>;
    /// Drops expired pins; returns how many were dropped.
    fn sweep(&self, now: Instant) -> usize;
    /// Every pin not expired at `now`, oldest first: what a replica puts back into the
    /// fleet's copy when Redis lost it. Walks the whole store; never on the request path.
    fn live_pins(&self, now: Instant) -> Vec<(TaskId, Pin)>;
    /// Makes every pin recorded so far durable, where the store is durable at all. Called
    /// at shutdown.
    ///
    /// # Errors
    /// The store's I/O error.
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    /// Pins held now.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a pin says about its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin {
    /// The key that created it.
    pub key: KeyId,
    /// The caller token it belongs to; [`TokenId::NONE`]: none (made without tokens, or read
    /// from a journal written before pins stored tokens), so any caller may poll it.
    pub token: TokenId,
}

impl Pin {
    /// Whether a caller with `token` may poll and report this task: its own, or nobody's.
    pub fn belongs_to(&self, token: Option<TokenId>) -> bool {
        match token {
            None => true,
            Some(token) => self.token == TokenId::NONE || self.token == token,
        }
    }
}

/// How long an id no key owns is answered from memory instead of asking again.
pub const MISS_HOLD: Duration = Duration::from_secs(60);

/// What the remembered misses may cost at most. Ids are at most 64 bytes, so this is tens
/// of thousands of ids: more than the probe budget lets keyrelay find in one `MISS_HOLD`.
pub const MAX_MISS_BYTES: usize = 2 << 20;

/// What the probe keeps between requests, shared by the whole process.
pub struct ProbeState {
    /// Ids recently found to be nobody's.
    pub misses: ProbeMisses,
    /// Upstream probe requests that may be made now (`[pins] probe_rate`, `probe_burst`).
    pub budget: ProbeBudget,
}

impl Default for ProbeState {
    fn default() -> ProbeState {
        ProbeState {
            misses: ProbeMisses::new(MISS_HOLD, MAX_MISS_BYTES),
            budget: ProbeBudget::default(),
        }
    }
}

impl ProbeState {
    /// Drops remembered misses whose hold has ended; returns how many are left.
    pub fn sweep(&self, now: Instant) -> usize {
        self.misses.sweep(now)
    }
}
