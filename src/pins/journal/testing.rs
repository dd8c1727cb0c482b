//! Test helpers shared by the journal's test modules: a store opened on a temp directory with
//! keys named `k0`, `k1`, …, what it should recover, and what its file holds.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::disk::faulty::Faulty;
use super::disk::{Disk, RealDisk};
use super::options::Options;
use super::options::COMPACT_SLACK;
use super::record::Record;
use super::replay::decode;
use super::wall_clock::Clock;
use super::{JournalPins, KeyNames, Recovery, FILE_NAME};
use crate::captcha::TaskId;
use crate::key_id::KeyId;

pub(super) const TTL: Duration = Duration::from_secs(2 * 60 * 60);

/// A PIN2 record of a numeric id, a two-byte key name such as "k1" and no token.
pub(super) const NUM_PIN_BYTES: u64 = 30;

pub(super) fn id(n: u64) -> TaskId {
    TaskId::Num(n)
}

/// Key `KeyId(n)` is named `k{n}`, as a pool built from the same config would name it.
pub(super) fn names() -> KeyNames {
    Arc::new(|key: KeyId| Some(Arc::from(format!("k{}", key.0))))
}

pub(super) fn ids(name: &str) -> Option<KeyId> {
    name.strip_prefix('k')?.parse().ok().map(KeyId)
}

pub(super) fn options(max_pins: usize) -> Options {
    Options {
        ttl: TTL,
        max_pins,
        clock: Clock::now(),
        compact_slack: COMPACT_SLACK,
        disk: Arc::new(RealDisk),
        tokens: Arc::default(),
    }
}

/// Opens a store whose file operations fail or stall as the returned [`Faulty`] says.
pub(super) fn open_faulty(dir: &Path, options: Options) -> (JournalPins, Arc<Faulty>) {
    let faulty = Arc::new(Faulty::new());
    let disk: Arc<dyn Disk> = faulty.clone();
    let (pins, _) = open_with(dir, Options { disk, ..options });
    (pins, faulty)
}

pub(super) fn open(dir: &Path) -> (JournalPins, Recovery) {
    JournalPins::open(dir, TTL, 1_000, &ids, names()).expect("the journal opens")
}

pub(super) fn open_with(dir: &Path, options: Options) -> (JournalPins, Recovery) {
    JournalPins::open_with(dir, options, &ids, names()).expect("the journal opens")
}

/// Opens as a restart would `elapsed` after the store first opened. Paused tokio time does
/// not move the wall clock, so the wall-clock half of the anchor is moved by hand.
pub(super) fn reopen_after(dir: &Path, elapsed: Duration) -> (JournalPins, Recovery) {
    let clock = Clock {
        instant: Instant::now(),
        wall: SystemTime::now() + elapsed,
    };
    open_with(
        dir,
        Options {
            clock,
            ..options(1_000)
        },
    )
}

pub(super) fn recovery(loaded: usize) -> Recovery {
    Recovery {
        loaded,
        expired: 0,
        unknown_keys: 0,
        corrupt_bytes_skipped: 0,
        corrupt_regions: 0,
    }
}

/// What `open` reports for `loaded` pins after skipping `bytes` in `regions` places.
pub(super) fn damaged(loaded: usize, bytes: usize, regions: u64) -> Recovery {
    Recovery {
        corrupt_bytes_skipped: bytes as u64,
        corrupt_regions: regions,
        ..recovery(loaded)
    }
}

/// The (task, key name) of every PIN record in `bytes`, which must decode whole.
pub(super) fn pinned_in(bytes: &[u8]) -> Vec<(TaskId, String)> {
    decoded(bytes)
        .into_iter()
        .filter_map(|record| match record {
            Record::Pin { task, key, .. } => Some((task, key.to_owned())),
            Record::Finish => None,
        })
        .collect()
}

pub(super) fn journal_bytes(dir: &Path) -> Vec<u8> {
    fs::read(dir.join(FILE_NAME)).expect("the journal exists")
}

pub(super) fn decoded(bytes: &[u8]) -> Vec<Record<'_>> {
    let replay = decode(bytes);
    assert_eq!(replay.skipped, 0, "the whole file decodes");
    replay.records
}
