//! Task pins: which key created each task, so polls and reports go out with that key.
//!
//! Pins sit behind the narrow [`PinStore`] interface so that a shared store can later let
//! several keyrelay replicas poll each other's tasks. [`MemoryPins`] bounds its memory two
//! ways: pins expire after a TTL, and past a size cap the oldest pins are evicted first.
//! [`JournalPins`] wraps a `MemoryPins` with an append-only journal on disk, so pins survive
//! a restart and a `kill -9`.

mod journal;
mod memory;

pub use journal::{JournalPins, Recovery};
pub use memory::MemoryPins;

use tokio::time::Instant;

use crate::captcha::TaskId;
use crate::key_id::KeyId;

/// The narrow interface to task pins: which key created each task, until the pin expires or
/// is evicted. Whether a task is still running is not the store's business: thread accounting
/// belongs to the capacity ledger.
pub trait PinStore: Send + Sync + 'static {
    /// Records that `key` created `task`.
    fn pin(&self, task: TaskId, key: KeyId, now: Instant);
    /// The key that created `task`, if the pin is known and not expired.
    fn owner(&self, task: &TaskId, now: Instant) -> Option<KeyId>;
    /// Drops expired pins; returns how many were dropped.
    fn sweep(&self, now: Instant) -> usize;
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
