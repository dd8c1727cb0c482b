//! Durable pins: [`JournalPins`] answers from a [`MemoryPins`] and appends every pin to
//! `<dir>/pins.journal`, so pins survive a restart and a `kill -9`.
//!
//! The journal is split by what each part holds: [`record`] the bytes of one record,
//! [`replay`] reading a journal back (resync past damage, what is loaded), [`compaction`]
//! rewriting it with the live pins (and the repair after a failed write), [`wall_clock`] the
//! dates on disk, and [`disk`] the file operations, behind a trait so that tests can fail
//! them. This file is the store: opening, appending, syncing, and the state they share.
//!
//! # Durability: fsync policy and crash window
//!
//! `pin()` appends its record with one `write_all` to an unbuffered file opened in append
//! mode, before the change is made in memory. When `pin()` returns, the record is in the
//! kernel's page cache, so a `kill -9`, a panic or an OOM kill of keyrelay loses no
//! acknowledged pin. fsync is kept off the request path: [`JournalPins::sync`]
//! (fdatasync) is meant to be called every second and at shutdown, and a compaction fsyncs its
//! new file before renaming it over the journal and fsyncs the directory after. A power loss
//! or kernel crash can therefore lose only the records appended since the start of the last
//! `sync()` that completed: about the last second of pins. A lost pin makes polls of its task
//! answer `ERROR_WRONG_CAPTCHA_ID`. A record torn by the crash is skipped at the next open.
//! Creation times are stored as wall-clock unix milliseconds, so a wall clock stepped
//! between two runs makes the pins loaded by the second run expire early or late by the step.
//!
//! # When the disk fails: what "acknowledged" means
//!
//! `pin()` cannot fail. It is called after the upstream created the task and before the
//! caller is answered with its id, and a task the service created (and bills) must stay
//! pollable, so every pin is *acknowledged*: it is served from memory from the moment
//! `pin()` returns, whatever the disk did. When its append fails (a full disk, an I/O error)
//! or an fsync fails (the kernel may then have dropped pages it had accepted), the change is
//! counted as missing from the file, and a part of a record that reached the file is cut off
//! again. From then on every `flush()`, which the server calls every second, rewrites the
//! journal from memory (a compaction), and keeps trying every second while that fails; a
//! failed repair never stops appends, which go on as soon as the disk takes them. So every pin
//! acknowledged during an outage is on disk by the first flush after the disk works again,
//! within a second of it. Only during the outage itself can a `kill -9` lose pins: those the
//! disk refused, which exist in memory alone. Repeated failures log one line per run.
//! [`compaction`] says how the journal stays bounded on disk.
//!
//! # Locking
//!
//! One `std::sync::Mutex` guards the file. `pin()` holds it across its append and its change
//! in memory, never across an await, so a pin is never visible before its record is written,
//! and every pin recorded below a journal offset read under it is in memory from then on. No
//! fsync ever runs under it. A compaction reads that offset (its mark) under it, takes its
//! snapshot of memory after it, without it (walking a million pins takes a while), writes and
//! fsyncs the snapshot without it, then copies and fsyncs
//! the records appended meanwhile without it too (reading below the journal's length, which
//! does not change), and takes it only to copy the last few records and rename. The fsyncs
//! after the rename (new file, directory) run in `sync()`, without it. So a `pin()` waits at
//! most for a small `write` and a rename, never for a disk flush; the crash guarantees above
//! hold across a compaction, as `swap_in` explains.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use self::disk::{write_all, Disk, RealDisk, Target};
use self::options::{at, Options, COMPACT_SLACK};
use self::record::put_pin;
use self::replay::{decode, load};
use self::wall_clock::Clock;
use super::memory::MemoryPins;
use super::{Pin, PinStore, TokenId};
use crate::captcha::TaskId;
use crate::key_id::KeyId;
use crate::tokens::TokenCounters;

mod compaction;
mod disk;
mod options;
mod record;
mod replay;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
mod wall_clock;

/// The journal's file name inside the data directory.
const FILE_NAME: &str = "pins.journal";

/// Names by id, as a journal asks them once each and keeps them.
type Names = Vec<Option<Arc<str>>>;

/// Maps a key id to the name written to the journal.
type KeyNames = Arc<dyn Fn(KeyId) -> Option<Arc<str>> + Send + Sync>;

/// Pins in memory, backed by an append-only journal file (see the module docs).
pub struct JournalPins {
    inner: MemoryPins,
    journal: Mutex<Journal>,
    /// Serialises compactions. Held across a compaction's bulk I/O, which the journal lock is
    /// not, so pins keep being appended meanwhile.
    compacting: Mutex<()>,
    key_name: KeyNames,
    /// Caller token names by id, for the records of pins that have one.
    tokens: Arc<TokenCounters>,
    /// Every file operation after open goes through here, so that tests can fail or stall it.
    disk: Arc<dyn Disk>,
    clock: Clock,
    dir: PathBuf,
    path: PathBuf,
    compact_slack: u64,
}

/// What `open` found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Pins loaded into memory.
    pub loaded: usize,
    /// Pins dropped because their TTL had passed.
    pub expired: usize,
    /// Pins dropped because their key is no longer configured.
    pub unknown_keys: usize,
    /// Bytes that were part of no valid record (corrupt records, garbage, a torn tail): replay
    /// stepped over them, and the compaction at open left them out of the file.
    pub corrupt_bytes_skipped: u64,
    /// Separate runs of such bytes: how many places of the file were damaged.
    pub corrupt_regions: u64,
}

/// The open journal file and what is known about its contents.
struct Journal {
    /// An `Arc` so that `sync` can fsync without holding the lock.
    file: Arc<File>,
    /// Where the next record starts: the file's length, as far as the journal's own writes
    /// made it (bytes of a partial record that could not be cut off again count too).
    len: u64,
    /// Records in the file, for the compaction threshold.
    records: u64,
    /// Changes whose record may be missing from the file (a write or an fsync failed).
    lost: u64,
    /// `lost` as of the snapshot of the last compaction, which wrote those changes.
    lost_covered: u64,
    /// The last automatic compaction failed. A repair is retried by every flush anyway; a
    /// compaction that is only due to the file's size waits for the next sweep.
    auto_failed: bool,
    /// Appends failed in a row; only the first of a run is logged, so a full disk does not
    /// log once per request.
    failing: u64,
    /// Bytes of `file` that a completed `sync()` made durable: a compaction must fsync them
    /// in its new file before its rename.
    synced: u64,
    /// Counts the compactions' swaps, so that a sync can tell that its file was replaced.
    generation: u64,
    /// A compaction renamed its file over the journal, and no directory fsync has completed
    /// since.
    dir_unsynced: bool,
    /// Key names by `KeyId`, as `key_name` gave them (see [`JournalPins::open`]).
    names: Vec<Option<Arc<str>>>,
    /// Token names by `TokenId`, asked of `tokens` once each.
    token_names: Vec<Option<Arc<str>>>,
    /// The buffer every pin's record is encoded into, kept so that a pin allocates nothing.
    record: Vec<u8>,
}

impl Journal {
    /// Some change acknowledged to a caller may be missing from the file.
    fn needs_repair(&self) -> bool {
        self.lost != self.lost_covered
    }
}

// === impl JournalPins ===

impl JournalPins {
    /// Opens (creating) `<dir>/pins.journal`, replays it into memory and returns what it kept.
    /// `key_id` maps a key NAME in the journal to the current pool's KeyId (None = key no longer
    /// configured: the pin is dropped and counted in `unknown_keys`). `key_name` maps a KeyId to its
    /// name when writing; it must give an id the same name for as long as the store is open,
    /// because the name is asked once per id and kept (a `KeyRegistry` never renames an id).
    /// Wall-clock time (SystemTime) is stored on disk; in memory pins keep
    /// tokio Instants computed as `now - (wall_now - created_wall)`.
    ///
    /// # Errors
    /// When `dir` cannot be created or the journal cannot be opened or read. A
    /// corrupt or truncated journal is not an error: its good records are kept.
    pub fn open(
        dir: &Path,
        ttl: Duration,
        max_pins: usize,
        key_id: &dyn Fn(&str) -> Option<KeyId>,
        key_name: Arc<dyn Fn(KeyId) -> Option<Arc<str>> + Send + Sync>,
    ) -> io::Result<(JournalPins, Recovery)> {
        let tokens = Arc::default();
        JournalPins::open_for_tokens(dir, ttl, max_pins, key_id, key_name, tokens)
    }

    /// [`JournalPins::open`], with the caller tokens' ids from `tokens`: the same registry
    /// the token tables are built with, so that a pin read back belongs to the token of its
    /// name. A pin of a token is journaled with the token's name.
    ///
    /// # Errors
    /// As [`JournalPins::open`].
    pub fn open_for_tokens(
        dir: &Path,
        ttl: Duration,
        max_pins: usize,
        key_id: &dyn Fn(&str) -> Option<KeyId>,
        key_name: KeyNames,
        tokens: Arc<TokenCounters>,
    ) -> io::Result<(JournalPins, Recovery)> {
        let options = Options {
            ttl,
            max_pins,
            clock: Clock::now(),
            compact_slack: COMPACT_SLACK,
            disk: Arc::new(RealDisk),
            tokens,
        };
        JournalPins::open_with(dir, options, key_id, key_name)
    }

    fn open_with(
        dir: &Path,
        options: Options,
        key_id: &dyn Fn(&str) -> Option<KeyId>,
        key_name: KeyNames,
    ) -> io::Result<(JournalPins, Recovery)> {
        fs::create_dir_all(dir).map_err(at(dir, "cannot create the pin directory"))?;
        let path = dir.join(FILE_NAME);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(at(&path, "cannot open the pin journal"))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(at(&path, "cannot read the pin journal"))?;
        let replay = decode(&bytes);
        let skipped = replay.skipped as u64;
        if skipped > 0 {
            // The file is left as it is until the compaction below rewrites it from the pins
            // just loaded: cutting it at the first bad record would destroy the good ones
            // after it, and appends after damage are still found by the next replay's resync.
            tracing::warn!(
                path = %path.display(),
                skipped_bytes = skipped,
                damaged_regions = replay.regions,
                "pin journal has corrupt or torn records; skipped them and kept every valid record"
            );
        }
        // A journal created just now must survive a power loss too.
        (options.disk.sync_dir(dir)).map_err(at(dir, "cannot fsync the pin directory"))?;

        let records = replay.records.len();
        let inner = MemoryPins::new(options.ttl, options.max_pins);
        let loaded = load(&inner, replay.records, key_id, &options);
        let recovery = Recovery {
            loaded: loaded.loaded,
            expired: loaded.expired,
            unknown_keys: loaded.unknown_keys,
            corrupt_bytes_skipped: skipped,
            corrupt_regions: replay.regions as u64,
        };
        let store = JournalPins {
            inner,
            journal: Mutex::new(Journal {
                file: Arc::new(file),
                len: bytes.len() as u64,
                records: records as u64,
                lost: 0,
                lost_covered: 0,
                auto_failed: false,
                failing: 0,
                // Nothing was promised durable by this run yet.
                synced: 0,
                generation: 0,
                dir_unsynced: false,
                names: Vec::new(),
                token_names: Vec::new(),
                record: Vec::with_capacity(64),
            }),
            compacting: Mutex::new(()),
            key_name,
            tokens: Arc::clone(&options.tokens),
            disk: Arc::clone(&options.disk),
            clock: options.clock,
            dir: dir.to_path_buf(),
            path,
            compact_slack: options.compact_slack,
        };
        tracing::info!(
            path = %store.path.display(),
            loaded = recovery.loaded,
            expired = recovery.expired,
            unknown_keys = recovery.unknown_keys,
            evicted_by_cap = loaded.evicted,
            corrupt_bytes_skipped = skipped,
            "pin journal replayed"
        );
        // Each kept pin is one PIN record; anything more (legacy FINISH records, damage) is dead.
        if records != recovery.loaded || skipped > 0 {
            if let Err(e) = store.compact(options.clock.instant) {
                tracing::error!(error = %e, "cannot compact the pin journal after replay; it stays as it is");
            }
        }
        Ok((store, recovery))
    }

    /// Forces written records to stable storage (fsync). Called on shutdown and periodically.
    /// When it returns `Ok`, every record appended before it began is durable, in whichever
    /// file is the journal now: a sync that a compaction's swap overtook starts again on the
    /// new file, and after a swap the directory is fsynced too, so that the rename is durable.
    ///
    /// # Errors
    /// When an fsync fails. After a failed fsync of the journal the next flush rewrites every
    /// pin from memory, because the kernel may have dropped the unwritten pages and would not
    /// report it twice; a failed directory fsync is retried by the next sync.
    pub fn sync(&self) -> io::Result<()> {
        loop {
            let (file, len, generation, dir_unsynced) = {
                let journal = self.lock();
                let file = Arc::clone(&journal.file);
                (file, journal.len, journal.generation, journal.dir_unsynced)
            };
            self.disk.sync_data(&file, Target::Journal).map_err(|e| {
                self.lock().lost += 1;
                at(&self.path, "cannot fsync the pin journal")(e)
            })?;
            if dir_unsynced {
                (self.disk.sync_dir(&self.dir))
                    .map_err(at(&self.dir, "cannot fsync the pin directory"))?;
            }
            let mut journal = self.lock();
            if journal.generation == generation {
                journal.synced = journal.synced.max(len);
                if dir_unsynced {
                    journal.dir_unsynced = false;
                }
                return Ok(());
            }
            // A compaction swapped the file meanwhile: what this sync was to make durable
            // may now sit in the new file only. Each round follows a whole compaction, so
            // this ends.
        }
    }

    /// Bytes the journal takes on disk now.
    pub fn disk_bytes(&self) -> u64 {
        let journal = self.lock();
        journal
            .file
            .metadata()
            .map_or(journal.len, |meta| meta.len())
    }

    /// The journal lock. A panic while it was held may have cost a record or left part of
    /// one, so a repair is then due, and the length is taken from the file again.
    fn lock(&self) -> MutexGuard<'_, Journal> {
        match self.journal.lock() {
            Ok(journal) => journal,
            Err(poisoned) => {
                let mut journal = poisoned.into_inner();
                journal.lost += 1;
                if let Ok(meta) = journal.file.metadata() {
                    journal.len = meta.len();
                }
                self.journal.clear_poison();
                journal
            }
        }
    }

    /// Appends one record, or logs why it could not. Never fails the caller.
    fn append(&self, journal: &mut Journal, record: &[u8]) {
        let Err((e, written)) = write_all(&*self.disk, &journal.file, record, Target::Journal)
        else {
            journal.len += record.len() as u64;
            journal.records += 1;
            if journal.failing > 0 {
                tracing::info!(
                    path = %self.path.display(),
                    failed_appends = journal.failing,
                    "pin journal appends work again"
                );
                journal.failing = 0;
            }
            return;
        };
        // The change stays accepted and served from memory; the next flush's repair writes it.
        journal.lost += 1;
        journal.failing += 1;
        // A partial record is cut off to keep the file clean. Should that fail too, replay
        // skips it (it resyncs at the next record), so appends go on after it.
        let cut = match written {
            0 => Ok(()),
            _ => self.disk.set_len(&journal.file, journal.len),
        };
        if cut.is_err() {
            journal.len += written as u64;
        }
        if journal.failing > 1 {
            return;
        }
        match cut {
            Ok(()) => tracing::error!(
                path = %self.path.display(),
                error = %e,
                "cannot append to the pin journal; the change is served from memory and written by the next flush that can"
            ),
            Err(cut) => tracing::error!(
                path = %self.path.display(),
                error = %e,
                truncate_error = %cut,
                "cannot append to the pin journal nor cut off the partial record; the change is served from memory and written by the next flush that can"
            ),
        }
    }

    /// Encodes the PIN record for `task` into `record`; false (logged) if it cannot be
    /// written. A key's name is asked of `key_name` once and kept in `names`: the lookup
    /// (a registry read and a fresh `Arc<str>`) cost more than the encoding.
    fn pin_record(
        &self,
        (names, token_names): (&mut Names, &mut Names),
        record: &mut Vec<u8>,
        task: &TaskId,
        (key, token): (KeyId, TokenId),
        created_ms: u64,
    ) -> bool {
        let slot = usize::from(key.0);
        if names.get(slot).is_none_or(Option::is_none) {
            let Some(name) = (self.key_name)(key) else {
                tracing::error!(key_id = key.0, task = %task, "pin not journaled: its key has no name; it is kept in memory only");
                return false;
            };
            if names.len() <= slot {
                names.resize(slot + 1, None);
            }
            names[slot] = Some(name);
        }
        let name = names[slot].as_deref().unwrap_or_default();
        let token_slot = usize::from(token.0);
        if token != TokenId::NONE && token_names.get(token_slot).is_none_or(Option::is_none) {
            if token_names.len() <= token_slot {
                token_names.resize(token_slot + 1, None);
            }
            token_names[token_slot] = self.tokens.name(token);
        }
        let token_name = token_names
            .get(token_slot)
            .and_then(Option::as_deref)
            .unwrap_or_default();
        match put_pin(record, task, name, token_name, created_ms) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(key = %name, task = %task, error = %e, "pin not journaled; it is kept in memory only");
                false
            }
        }
    }
}

impl PinStore for JournalPins {
    /// Compacts if the appends since the last compaction call for one, then syncs. The
    /// server calls this every second on the blocking pool: a compaction rewrites every live
    /// pin and fsyncs, which must not stall a request (on one core, a current-thread runtime
    /// would stall them all).
    fn flush(&self) -> std::io::Result<()> {
        let due = self.compaction_due(&self.lock(), false);
        if due {
            self.auto_compact(Instant::now());
        }
        self.sync()
    }

    fn pin_for(&self, task: TaskId, key: KeyId, token: TokenId, now: Instant) {
        let created_ms = self.clock.unix_millis(now);
        let mut journal = self.lock();
        // The buffer is taken out and put back so that `append` can have the journal too.
        let mut record = std::mem::take(&mut journal.record);
        record.clear();
        let Journal {
            names, token_names, ..
        } = &mut *journal;
        let written = self.pin_record(
            (names, token_names),
            &mut record,
            &task,
            (key, token),
            created_ms,
        );
        if written {
            self.append(&mut journal, &record);
        }
        journal.record = record;
        self.inner.pin_for(task, key, token, now);
    }

    fn pinned(&self, task: &TaskId, now: Instant) -> Option<Pin> {
        self.inner.pinned(task, now)
    }

    fn sweep(&self, now: Instant) -> usize {
        let dropped = self.inner.sweep(now);
        let due = self.compaction_due(&self.lock(), true);
        if due {
            self.auto_compact(now);
        }
        dropped
    }

    fn live_pins(&self, now: Instant) -> Vec<(TaskId, Pin)> {
        self.inner.live_pins(now)
    }

    fn len(&self) -> usize {
        self.inner.len()
    }
}
