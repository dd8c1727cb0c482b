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

use crate::health::KeyId;

/// A task id as the upstream issued it. Ids are numeric on CaptchaAI, so they are kept as
/// integers (8 bytes, no allocation); anything else is kept verbatim, so another
/// 2captcha-compatible upstream with text ids still works.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TaskId {
    Num(u64),
    Text(Box<str>),
}

impl TaskId {
    /// Reads an id from a caller's parameter or an upstream answer; `None` if blank.
    pub fn parse(raw: &str) -> Option<TaskId> {
        let raw = raw.trim();
        if raw.is_empty() {
            return None;
        }
        // "007" and "+7" must round-trip as sent, so only canonical integers become numbers:
        // digits only, and no leading zero unless the id is "0".
        let canonical =
            raw.bytes().all(|b| b.is_ascii_digit()) && (raw == "0" || !raw.starts_with('0'));
        Some(match raw.parse::<u64>() {
            Ok(n) if canonical => TaskId::Num(n),
            _ => TaskId::Text(raw.into()),
        })
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskId::Num(n) => write!(f, "{n}"),
            TaskId::Text(s) => f.write_str(s),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_parse_numbers_and_keep_text() {
        assert_eq!(
            TaskId::parse(" 73000000001 "),
            Some(TaskId::Num(73000000001))
        );
        assert_eq!(TaskId::parse("007"), Some(TaskId::Text("007".into())));
        assert_eq!(TaskId::parse("abc-1"), Some(TaskId::Text("abc-1".into())));
        assert_eq!(TaskId::parse("  "), None);
        assert_eq!(TaskId::parse("007").unwrap().to_string(), "007");
        assert_eq!(TaskId::parse("0"), Some(TaskId::Num(0)));
        assert_eq!(
            TaskId::parse("18446744073709551615"),
            Some(TaskId::Num(u64::MAX))
        );
        // Whatever does not print back as sent stays text.
        for raw in ["+7", "00", "18446744073709551616", "1e3", "٣"] {
            assert_eq!(TaskId::parse(raw), Some(TaskId::Text(raw.into())), "{raw}");
            assert_eq!(TaskId::parse(raw).unwrap().to_string(), raw);
        }
    }
}
