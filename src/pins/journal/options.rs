//! Leaf: what the journal's parts share: how a store is opened ([`Options`]), the slack
//! before an automatic compaction, and the I/O error context every file operation adds. Kept
//! apart so that the store, its compaction and its replay each import it, not one another.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::disk::Disk;
use super::wall_clock::Clock;
use crate::tokens::TokenCounters;

/// Records allowed beyond twice the live pins before an automatic compaction.
pub(super) const COMPACT_SLACK: u64 = 10_000;

/// How a store is opened; tests set the clock, the slack and the disk.
#[derive(Clone)]
pub(super) struct Options {
    pub(super) ttl: Duration,
    pub(super) max_pins: usize,
    pub(super) clock: Clock,
    pub(super) compact_slack: u64,
    pub(super) disk: Arc<dyn Disk>,
    pub(super) tokens: Arc<TokenCounters>,
}

/// Adds the path and what was being done to an I/O error, keeping its kind.
pub(super) fn at<'a>(path: &'a Path, doing: &'a str) -> impl FnOnce(io::Error) -> io::Error + 'a {
    move |e| io::Error::new(e.kind(), format!("{doing} {}: {e}", path.display()))
}
