//! Durable pins: [`JournalPins`] answers from a [`MemoryPins`] and appends every pin to
//! `<dir>/pins.journal`, so pins survive a restart and a `kill -9`.
//!
//! # File format
//!
//! The file is a sequence of records and nothing else (no header). Integers are little-endian.
//!
//! ```text
//! record  = len: u32 | crc: u32 | payload (len bytes)    crc = CRC-32 (IEEE) of payload
//! payload = 0x01 PIN    | task | name_len: u8 | key name (UTF-8) | created: u64 (unix millis)
//!         | 0x02 FINISH | task                      legacy: read and ignored, never written
//! task    = 0x00 | id: u64                          TaskId::Num
//!         | 0x01 | id_len: u16 | id bytes (UTF-8)   TaskId::Text
//! ```
//!
//! Keys are stored by name, not by `KeyId`, because ids are positions in the config and may
//! change between runs. Replay applies records in order: a PIN (re)pins its id. A FINISH is a
//! legacy record: older versions wrote one when a task got its final answer, for thread
//! accounting, which is not the pin store's job any more. Replay checks a FINISH like any
//! record and then ignores it, so an older journal loads with all its pins, and the
//! compaction at open leaves the FINISH records out.
//!
//! A record that is cut short, fails its CRC, claims a length of 0 or more than the largest
//! possible payload, or does not decode to exactly its length (unknown type, bad UTF-8,
//! trailing bytes) is skipped, and replay *resynchronises*: it moves forward one byte at a
//! time to the next offset where a whole record checks out, and goes on from there. One bad
//! byte thus costs the one record it falls in, a torn tail costs the record being written,
//! and every later valid record is kept. A false resync needs a length within bounds, a
//! payload that decodes to exactly that length, and a matching CRC-32 at the same offset:
//! of the rare offsets where stray bytes pass the first two, the CRC lets one in 2³² through. The bytes skipped are counted in
//! `corrupt_bytes_skipped` and logged (warn). The file is not cut at the damage, which would
//! destroy the good records after it: the compaction at open rewrites it with the pins just
//! loaded. Should that compaction fail, appends go on after the damage, and the next replay
//! resyncs past it again. Pins of keys no longer configured and expired pins are dropped at
//! load, and the same compaction takes them off the disk too.
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
//!
//! # Disk bound
//!
//! The journal is rewritten with only the live pins (a temp file, fsync, rename, fsync of the
//! directory) by [`JournalPins::compact`], and automatically once it holds more than twice as
//! many records as there are pins plus a slack of 10 000 records. That check runs in
//! `flush()`, which the server calls every second on the blocking pool, and in `sweep()`;
//! never inside `pin()`, because a compaction of a million pins takes a noticeable fraction
//! of a second and a request must not wait for it. So the file holds at most
//! `2 × pins + 10 000` records plus one second of appends while compactions succeed. Expired
//! pins leave the disk at the first compaction after their sweep, or at the next open. A
//! compaction due only to the size that fails is retried by the next `sweep()`, not every
//! second, since no pin is missing from the file.
//!
//! # Locking
//!
//! One `std::sync::Mutex` guards the file. `pin()` holds it across its append and its change
//! in memory, never across an await, so a pin is never visible before its record is written,
//! and a compaction's snapshot of memory matches a known journal offset. No fsync ever runs
//! under it. A compaction writes and fsyncs the snapshot without it, then copies and fsyncs
//! the records appended meanwhile without it too (reading below the journal's length, which
//! does not change), and takes it only to copy the last few records and rename. The fsyncs
//! after the rename (new file, directory) run in `sync()`, without it. So a `pin()` waits at
//! most for a small `write` and a rename, never for a disk flush; the crash guarantees above
//! hold across a compaction, as `swap_in` explains.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use self::disk::{write_all, Disk, DiskWriter, RealDisk, Target};
use super::memory::{LivePin, MemoryPins};
use super::PinStore;
use crate::captcha::TaskId;
use crate::key_id::KeyId;

mod disk;

/// The journal's file name inside the data directory.
const FILE_NAME: &str = "pins.journal";
/// A compaction writes here, then renames over [`FILE_NAME`].
const TMP_NAME: &str = "pins.journal.tmp";
/// Records allowed beyond twice the live pins before an automatic compaction.
const COMPACT_SLACK: u64 = 10_000;
/// Times a compaction catches up with the journal without its lock (copy, fsync) because a
/// sync completed meanwhile, before it fsyncs under the lock instead. A sync runs once a
/// second, so one round nearly always does.
const CATCH_UP_ROUNDS: u32 = 4;

const HEADER: usize = 8;
const PIN: u8 = 0x01;
const FINISH: u8 = 0x02;
const NUM_ID: u8 = 0x00;
const TEXT_ID: u8 = 0x01;
/// The largest payload a writer can produce: a PIN with the longest text id and key name.
const MAX_PAYLOAD: usize = 1 + 1 + 2 + u16::MAX as usize + 1 + u8::MAX as usize + 8;

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
}

impl Journal {
    /// Some change acknowledged to a caller may be missing from the file.
    fn needs_repair(&self) -> bool {
        self.lost != self.lost_covered
    }
}

/// The journal's state when a compaction took its snapshot.
#[derive(Clone, Copy)]
struct Mark {
    len: u64,
    records: u64,
    lost: u64,
}

/// A compaction's temp file with the snapshot written to it.
struct Rewritten {
    file: File,
    len: u64,
    records: u64,
}

// === impl JournalPins ===

impl JournalPins {
    /// Opens (creating) `<dir>/pins.journal`, replays it into memory and returns what it kept.
    /// `key_id` maps a key NAME in the journal to the current pool's KeyId (None = key no longer
    /// configured: the pin is dropped and counted in `unknown_keys`). `key_name` maps a KeyId to its
    /// name when writing. Wall-clock time (SystemTime) is stored on disk; in memory pins keep
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
        let options = Options {
            ttl,
            max_pins,
            clock: Clock::now(),
            compact_slack: COMPACT_SLACK,
            disk: Arc::new(RealDisk),
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
            }),
            compacting: Mutex::new(()),
            key_name,
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

    /// Rewrites the journal with only live pins (write temp file, fsync, rename, fsync dir).
    ///
    /// # Errors
    /// When the temp file cannot be written, synced or renamed (the journal is then unchanged),
    /// or when the new journal or the directory cannot be synced after the rename (the new
    /// journal is in use, and the next sync tries again).
    pub fn compact(&self, now: Instant) -> io::Result<()> {
        let _one = self
            .compacting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.rewrite(now)?;
        self.lock().auto_failed = false;
        Ok(())
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

    /// The PIN record for `task`, or `None` (logged) if it cannot be written.
    fn pin_record(&self, task: &TaskId, key: KeyId, now: Instant) -> Option<Vec<u8>> {
        let Some(name) = (self.key_name)(key) else {
            tracing::error!(key_id = key.0, task = %task, "pin not journaled: its key has no name; it is kept in memory only");
            return None;
        };
        match encode_pin(task, &name, self.clock.unix_millis(now)) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::error!(key = %name, task = %task, error = %e, "pin not journaled; it is kept in memory only");
                None
            }
        }
    }

    /// Whether the journal should be rewritten now. A repair is due at every call until one
    /// succeeds: acknowledged pins are missing from the disk, and each flush (every second)
    /// may be the first after space came back. A compaction due only to the file's size is
    /// retried after a failure by `sweep` alone (once a minute), since nothing is missing.
    fn compaction_due(&self, journal: &Journal, from_sweep: bool) -> bool {
        let limit = (self.inner.len() as u64)
            .saturating_mul(2)
            .saturating_add(self.compact_slack);
        journal.needs_repair() || ((from_sweep || !journal.auto_failed) && journal.records > limit)
    }

    /// Compacts unless another compaction is under way; should that one not cover every
    /// change, the next flush finds the repair still due.
    fn auto_compact(&self, now: Instant) {
        let _one = match self.compacting.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let result = self.rewrite(now);
        let (was_failing, repair) = {
            let mut journal = self.lock();
            let was_failing = journal.auto_failed;
            journal.auto_failed = result.is_err();
            (was_failing, journal.needs_repair())
        };
        // One line per run of failures, not one a second while the disk is full.
        match result {
            Err(e) if !was_failing => tracing::error!(
                error = %e,
                repair,
                "cannot compact the pin journal; retried every second while pins are missing from it, by the sweep otherwise"
            ),
            Ok(()) if was_failing => tracing::info!("pin journal compaction works again"),
            _ => {}
        }
    }

    /// One compaction; the caller holds `compacting`.
    fn rewrite(&self, now: Instant) -> io::Result<()> {
        let tmp = self.dir.join(TMP_NAME);
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(at(&tmp, "cannot remove a stale compaction file")(e));
            }
            _ => {}
        }
        // Pins hold the journal lock across their append and their change in memory, so this
        // snapshot is exactly what the first `mark.len` bytes replay to.
        let (live, mark) = {
            let journal = self.lock();
            let mark = Mark {
                len: journal.len,
                records: journal.records,
                lost: journal.lost,
            };
            (self.inner.live(now), mark)
        };
        let result = self
            .write_snapshot(&tmp, &live)
            .and_then(|rewritten| self.swap_in(&tmp, rewritten, mark));
        if result.is_err() {
            // After a successful rename there is nothing left to remove, which is fine.
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Writes and fsyncs the snapshot to the temp file, without holding the journal lock.
    fn write_snapshot(&self, tmp: &Path, live: &[LivePin]) -> io::Result<Rewritten> {
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(tmp)
            .map_err(at(tmp, "cannot create the compaction file"))?;
        let mut out = BufWriter::new(DiskWriter {
            disk: &*self.disk,
            file: &file,
            target: Target::Compaction,
        });
        let (mut len, mut records, mut unwritable) = (0u64, 0u64, 0usize);
        for pin in live {
            let Some(record) = (self.key_name)(pin.key).and_then(|name| {
                encode_pin(&pin.task, &name, self.clock.unix_millis(pin.created)).ok()
            }) else {
                unwritable += 1;
                continue;
            };
            out.write_all(&record)
                .map_err(at(tmp, "cannot write the compaction file"))?;
            len += record.len() as u64;
            records += 1;
        }
        out.flush()
            .map_err(at(tmp, "cannot write the compaction file"))?;
        drop(out);
        self.disk
            .sync_data(&file, Target::Compaction)
            .map_err(at(tmp, "cannot fsync the compaction file"))?;
        if unwritable > 0 {
            tracing::warn!(
                pins = unwritable,
                "pins whose key has no name were left out of the compacted journal; they stay in memory"
            );
        }
        Ok(Rewritten { file, len, records })
    }

    /// Brings the temp file up to date with the records appended since the snapshot, renames
    /// it over the journal, and makes both durable. The journal lock is held only for the
    /// last few records' copy and the rename, never across an fsync, so that `pin()` on the
    /// request path never waits for one.
    ///
    /// Why no pin is lost, whenever the process or the machine stops:
    /// - Until the rename, the old file is the journal and gets every append; the bytes below
    ///   its `len` never change while it is in use, so they can be copied without the lock.
    /// - The final copy and the rename happen under the lock, so a record is appended either
    ///   to the old file before that copy (and copied) or to the new file after the rename.
    /// - A completed `sync()` promised its records durable, and the rename may reach the disk
    ///   any time after it is made, before the directory fsync. So every byte a completed
    ///   sync covered is fsynced in the new file before the rename: the copy and fsync
    ///   without the lock are repeated while a sync completes meanwhile
    ///   (`CATCH_UP_ROUNDS`, then once under the lock). Records copied but not fsynced were
    ///   promised by no sync yet, as the module docs allow.
    /// - After the rename, `sync()` fsyncs the new file and then the directory
    ///   (`dir_unsynced`); a sync running across the swap starts again on the new file. So a
    ///   sync that completes covers the appends made before it began, in whichever file.
    fn swap_in(&self, tmp: &Path, rewritten: Rewritten, mark: Mark) -> io::Result<()> {
        // `copied`: the old file's bytes up to here are in the temp file; `durable`: fsynced
        // there too. The snapshot itself was fsynced by `write_snapshot`.
        let (mut copied, mut durable) = (mark.len, mark.len);
        let mut rounds = 0;
        let mut journal = loop {
            let (old, end) = {
                let journal = self.lock();
                (Arc::clone(&journal.file), journal.len)
            };
            self.copy_tail(&old, copied..end, &rewritten.file, tmp)?;
            copied = end;
            if durable < copied {
                (self.disk.sync_data(&rewritten.file, Target::Compaction))
                    .map_err(at(tmp, "cannot fsync the compaction file"))?;
                durable = copied;
            }
            let journal = self.lock();
            if journal.synced <= durable || rounds == CATCH_UP_ROUNDS {
                break journal;
            }
            rounds += 1;
        };
        let end = journal.len;
        self.copy_tail(&journal.file, copied..end, &rewritten.file, tmp)?;
        if journal.synced > durable {
            // Syncs kept completing: rare enough that this one fsync under the lock is fine.
            (self.disk.sync_data(&rewritten.file, Target::Compaction))
                .map_err(at(tmp, "cannot fsync the compaction file"))?;
            durable = end;
        }
        (self.disk.rename(tmp, &self.path))
            .map_err(at(tmp, "cannot rename the compaction file"))?;
        // The new file is the journal from here on, even if a sync below fails.
        let tail = end - mark.len;
        journal.file = Arc::new(rewritten.file);
        journal.len = rewritten.len + tail;
        journal.records = rewritten.records + journal.records.saturating_sub(mark.records);
        journal.lost_covered = mark.lost;
        journal.generation += 1;
        journal.synced = rewritten.len + (durable - mark.len);
        journal.dir_unsynced = true;
        drop(journal);
        self.sync()
    }

    /// Appends the old file's bytes in `range` to the temp file.
    fn copy_tail(
        &self,
        old: &File,
        range: std::ops::Range<u64>,
        new: &File,
        tmp: &Path,
    ) -> io::Result<()> {
        if range.is_empty() {
            return Ok(());
        }
        let size = usize::try_from(range.end - range.start)
            .map_err(|_| io::Error::other("journal tail larger than memory"))?;
        let mut tail = vec![0; size];
        read_at(old, &self.path, range.start, &mut tail).map_err(at(
            &self.path,
            "cannot read the pin journal's newest records",
        ))?;
        write_all(&*self.disk, new, &tail, Target::Compaction)
            .map_err(|(e, _)| at(tmp, "cannot write the compaction file")(e))
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

    fn pin(&self, task: TaskId, key: KeyId, now: Instant) {
        let record = self.pin_record(&task, key, now);
        let mut journal = self.lock();
        if let Some(record) = &record {
            self.append(&mut journal, record);
        }
        self.inner.pin(task, key, now);
    }

    fn owner(&self, task: &TaskId, now: Instant) -> Option<KeyId> {
        self.inner.owner(task, now)
    }

    fn sweep(&self, now: Instant) -> usize {
        let dropped = self.inner.sweep(now);
        let due = self.compaction_due(&self.lock(), true);
        if due {
            self.auto_compact(now);
        }
        dropped
    }

    fn len(&self) -> usize {
        self.inner.len()
    }
}

/// Adds the path and what was being done to an I/O error, keeping its kind.
fn at<'a>(path: &'a Path, doing: &'a str) -> impl FnOnce(io::Error) -> io::Error + 'a {
    move |e| io::Error::new(e.kind(), format!("{doing} {}: {e}", path.display()))
}

/// Reads `buf.len()` bytes of `file` from `offset`, without its cursor: appends from
/// `pin()` move that cursor (`O_APPEND` writes set it to the end) while a compaction copies
/// its tail without the journal lock.
#[cfg(unix)]
fn read_at(file: &File, _path: &Path, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Elsewhere, a handle of its own (the journal at `path` is `file` while a compaction runs,
/// because only a compaction renames over it, one at a time) has a cursor of its own.
#[cfg(not(unix))]
fn read_at(_file: &File, path: &Path, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut own = File::open(path)?;
    own.seek(SeekFrom::Start(offset))?;
    own.read_exact(buf)
}

// === replay ===

/// How a store is opened; tests set the clock, the slack and the disk.
#[derive(Clone)]
struct Options {
    ttl: Duration,
    max_pins: usize,
    clock: Clock,
    compact_slack: u64,
    disk: Arc<dyn Disk>,
}

/// What replay kept and dropped.
struct Loaded {
    loaded: usize,
    expired: usize,
    unknown_keys: usize,
    evicted: usize,
}

/// A task's PIN record, kept if no later PIN supersedes it.
struct Candidate {
    task: TaskId,
    key: Option<KeyId>,
    created_ms: u64,
}

/// Applies decoded records to an empty `inner`.
fn load(
    inner: &MemoryPins,
    records: Vec<Record<'_>>,
    key_id: &dyn Fn(&str) -> Option<KeyId>,
    options: &Options,
) -> Loaded {
    let mut names: HashMap<&str, Option<KeyId>> = HashMap::new();
    let mut latest: HashMap<TaskId, usize> = HashMap::new();
    let mut candidates: Vec<Candidate> = Vec::with_capacity(records.len());
    for record in records {
        match record {
            Record::Pin {
                task,
                key,
                created_ms,
            } => {
                let key = *names.entry(key).or_insert_with(|| key_id(key));
                latest.insert(task.clone(), candidates.len());
                candidates.push(Candidate {
                    task,
                    key,
                    created_ms,
                });
            }
            Record::Finish => {}
        }
    }

    let (mut expired, mut unknown_keys) = (0, 0);
    let mut kept = Vec::with_capacity(latest.len());
    for (at, candidate) in candidates.into_iter().enumerate() {
        if latest.get(&candidate.task) != Some(&at) {
            continue; // re-pinned later
        }
        let Some(key) = candidate.key else {
            unknown_keys += 1;
            continue;
        };
        let age = options.clock.age(candidate.created_ms);
        if age >= options.ttl {
            expired += 1;
            continue;
        }
        kept.push((candidate, key, options.clock.instant_aged(age)));
    }
    // The newest pins win, as they would have if the cap had evicted while running.
    let evicted = kept.len().saturating_sub(options.max_pins.max(1));
    for (candidate, key, created) in kept.into_iter().skip(evicted) {
        inner.pin(candidate.task, key, created);
    }
    Loaded {
        loaded: inner.len(),
        expired,
        unknown_keys,
        evicted,
    }
}

/// Maps tokio instants to wall-clock time and back, through one anchor taken at open. Pins
/// written later are dated by the monotonic clock's distance from the anchor, so a wall-clock
/// step while running does not reorder them.
#[derive(Clone, Copy, Debug)]
struct Clock {
    instant: Instant,
    wall: SystemTime,
}

impl Clock {
    fn now() -> Clock {
        Clock {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Unix milliseconds at `at` (0 before 1970, saturating far in the future).
    fn unix_millis(&self, at: Instant) -> u64 {
        let wall = if at >= self.instant {
            self.wall
                .checked_add(at.saturating_duration_since(self.instant))
        } else {
            self.wall
                .checked_sub(self.instant.saturating_duration_since(at))
        };
        wall.and_then(|wall| wall.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            })
    }

    /// Age at the anchor of a pin created at `created_ms`. A pin from the future (the wall
    /// clock was stepped back) counts as brand new.
    fn age(&self, created_ms: u64) -> Duration {
        Duration::from_millis(self.unix_millis(self.instant).saturating_sub(created_ms))
    }

    /// The instant `age` before the anchor. Should it precede what the monotonic clock can
    /// express (shortly after boot), the pin counts as new: it lives up to one TTL longer.
    fn instant_aged(&self, age: Duration) -> Instant {
        self.instant.checked_sub(age).unwrap_or(self.instant)
    }
}

// === record format ===

/// One decoded record; the key name borrows from the file's bytes.
#[derive(Debug, PartialEq, Eq)]
enum Record<'a> {
    Pin {
        task: TaskId,
        key: &'a str,
        created_ms: u64,
    },
    /// A legacy FINISH: checked like any record, then skipped.
    Finish,
}

/// The valid records of a file, and the damage replay stepped over to reach them.
struct Replay<'a> {
    records: Vec<Record<'a>>,
    /// Bytes that are part of no valid record: corrupt records, garbage, a torn tail.
    skipped: usize,
    /// Separate runs of such bytes: how many places are damaged.
    regions: usize,
}

#[derive(Debug, thiserror::Error)]
enum EncodeError {
    #[error("key name is {0} bytes; the journal stores at most 255")]
    LongName(usize),
    #[error("task id is {0} bytes; the journal stores at most 65535")]
    LongId(usize),
}

fn encode_pin(task: &TaskId, key: &str, created_ms: u64) -> Result<Vec<u8>, EncodeError> {
    let name_len = u8::try_from(key.len()).map_err(|_| EncodeError::LongName(key.len()))?;
    let mut record = new_record(PIN);
    put_task(&mut record, task)?;
    record.push(name_len);
    record.extend_from_slice(key.as_bytes());
    record.extend_from_slice(&created_ms.to_le_bytes());
    Ok(seal(record))
}

/// A legacy FINISH record, which only tests still write: to build an older version's journal.
#[cfg(test)]
fn encode_finish(task: &TaskId) -> Result<Vec<u8>, EncodeError> {
    let mut record = new_record(FINISH);
    put_task(&mut record, task)?;
    Ok(seal(record))
}

/// A record with its header left blank for [`seal`].
fn new_record(kind: u8) -> Vec<u8> {
    let mut record = Vec::with_capacity(64);
    record.extend_from_slice(&[0; HEADER]);
    record.push(kind);
    record
}

fn put_task(record: &mut Vec<u8>, task: &TaskId) -> Result<(), EncodeError> {
    match task {
        TaskId::Num(n) => {
            record.push(NUM_ID);
            record.extend_from_slice(&n.to_le_bytes());
        }
        TaskId::Text(text) => {
            let len = u16::try_from(text.len()).map_err(|_| EncodeError::LongId(text.len()))?;
            record.push(TEXT_ID);
            record.extend_from_slice(&len.to_le_bytes());
            record.extend_from_slice(text.as_bytes());
        }
    }
    Ok(())
}

/// Fills in the header: payload length and CRC.
fn seal(mut record: Vec<u8>) -> Vec<u8> {
    let payload = &record[HEADER..];
    let len = u32::try_from(payload.len()).expect("encoders bound the payload by MAX_PAYLOAD");
    let crc = crc32fast::hash(payload);
    record[..4].copy_from_slice(&len.to_le_bytes());
    record[4..HEADER].copy_from_slice(&crc.to_le_bytes());
    record
}

/// Every valid record in `bytes`, in file order. After a bad record the scan resynchronises:
/// it moves forward a byte at a time to the next offset where a whole record checks out, so
/// one damaged spot costs the records it touches and no others.
fn decode(bytes: &[u8]) -> Replay<'_> {
    let mut replay = Replay {
        records: Vec::new(),
        skipped: 0,
        regions: 0,
    };
    let mut at = 0;
    while at < bytes.len() {
        if let Some((record, next)) = decode_at(bytes, at) {
            replay.records.push(record);
            at = next;
            continue;
        }
        let resync = (at + 1..bytes.len())
            .find(|&start| decode_at(bytes, start).is_some())
            .unwrap_or(bytes.len());
        replay.skipped += resync - at;
        replay.regions += 1;
        at = resync;
    }
    replay
}

/// The record starting at `start` and where the next one starts; `None` if it is bad.
/// During a resync this is tried at every offset, so what it accepts must rarely be there by
/// chance: a length within the largest payload a writer makes, a payload that decodes to
/// exactly that length, and its CRC-32. The cheap structural checks go first.
fn decode_at(bytes: &[u8], start: usize) -> Option<(Record<'_>, usize)> {
    let mut header = Reader(bytes.get(start..)?);
    let len = usize::try_from(header.u32()?).ok()?;
    let crc = header.u32()?;
    if len == 0 || len > MAX_PAYLOAD {
        return None;
    }
    let payload = header.take(len)?;
    let record = decode_payload(payload)?;
    (crc32fast::hash(payload) == crc).then_some((record, start + HEADER + len))
}

fn decode_payload(payload: &[u8]) -> Option<Record<'_>> {
    let mut r = Reader(payload);
    let record = match r.u8()? {
        PIN => {
            let task = r.task()?;
            let name_len = usize::from(r.u8()?);
            let key = std::str::from_utf8(r.take(name_len)?).ok()?;
            Record::Pin {
                task,
                key,
                created_ms: r.u64()?,
            }
        }
        FINISH => {
            r.task()?;
            Record::Finish
        }
        _ => return None,
    };
    r.0.is_empty().then_some(record)
}

/// Reads fields off the front of a byte slice; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn task(&mut self) -> Option<TaskId> {
        match self.u8()? {
            NUM_ID => Some(TaskId::Num(self.u64()?)),
            TEXT_ID => {
                let len = usize::from(self.u16()?);
                let text = std::str::from_utf8(self.take(len)?).ok()?;
                Some(TaskId::Text(text.into()))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use rand::{Rng, SeedableRng};

    use super::disk::faulty::{Faulty, Op};
    use super::*;

    const TTL: Duration = Duration::from_secs(2 * 60 * 60);
    /// A PIN record of a numeric id and a two-byte key name such as "k1".
    const NUM_PIN_BYTES: u64 = 29;
    /// A FINISH record of a numeric id.
    const NUM_FINISH_BYTES: u64 = 18;

    fn id(n: u64) -> TaskId {
        TaskId::Num(n)
    }

    /// Key `KeyId(n)` is named `k{n}`, as a pool built from the same config would name it.
    fn names() -> KeyNames {
        Arc::new(|key: KeyId| Some(Arc::from(format!("k{}", key.0))))
    }

    fn ids(name: &str) -> Option<KeyId> {
        name.strip_prefix('k')?.parse().ok().map(KeyId)
    }

    fn options(max_pins: usize) -> Options {
        Options {
            ttl: TTL,
            max_pins,
            clock: Clock::now(),
            compact_slack: COMPACT_SLACK,
            disk: Arc::new(RealDisk),
        }
    }

    /// Opens a store whose file operations fail or stall as the returned [`Faulty`] says.
    fn open_faulty(dir: &Path, options: Options) -> (JournalPins, Arc<Faulty>) {
        let faulty = Arc::new(Faulty::new());
        let disk: Arc<dyn Disk> = faulty.clone();
        let (pins, _) = open_with(dir, Options { disk, ..options });
        (pins, faulty)
    }

    fn open(dir: &Path) -> (JournalPins, Recovery) {
        JournalPins::open(dir, TTL, 1_000, &ids, names()).expect("the journal opens")
    }

    fn open_with(dir: &Path, options: Options) -> (JournalPins, Recovery) {
        JournalPins::open_with(dir, options, &ids, names()).expect("the journal opens")
    }

    /// Opens as a restart would `elapsed` after the store first opened. Paused tokio time does
    /// not move the wall clock, so the wall-clock half of the anchor is moved by hand.
    fn reopen_after(dir: &Path, elapsed: Duration) -> (JournalPins, Recovery) {
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

    fn recovery(loaded: usize) -> Recovery {
        Recovery {
            loaded,
            expired: 0,
            unknown_keys: 0,
            corrupt_bytes_skipped: 0,
            corrupt_regions: 0,
        }
    }

    /// What `open` reports for `loaded` pins after skipping `bytes` in `regions` places.
    fn damaged(loaded: usize, bytes: usize, regions: u64) -> Recovery {
        Recovery {
            corrupt_bytes_skipped: bytes as u64,
            corrupt_regions: regions,
            ..recovery(loaded)
        }
    }

    /// The (task, key name) of every PIN record in `bytes`, which must decode whole.
    fn pinned_in(bytes: &[u8]) -> Vec<(TaskId, String)> {
        decoded(bytes)
            .into_iter()
            .filter_map(|record| match record {
                Record::Pin { task, key, .. } => Some((task, key.to_owned())),
                Record::Finish => None,
            })
            .collect()
    }

    fn journal_bytes(dir: &Path) -> Vec<u8> {
        fs::read(dir.join(FILE_NAME)).expect("the journal exists")
    }

    fn decoded(bytes: &[u8]) -> Vec<Record<'_>> {
        let replay = decode(bytes);
        assert_eq!(replay.skipped, 0, "the whole file decodes");
        replay.records
    }

    // --- format ---

    #[test]
    fn records_have_the_documented_bytes() {
        let pin = encode_pin(&id(0x0102_0304_0506_0708), "k1", 1_700_000_000_123).unwrap();
        let mut expected = vec![21, 0, 0, 0, 0xd3, 0x31, 0xcc, 0xf1, PIN, NUM_ID];
        expected.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1, 2, b'k', b'1']);
        expected.extend_from_slice(&1_700_000_000_123u64.to_le_bytes());
        assert_eq!(pin, expected);
        assert_eq!(pin.len() as u64, NUM_PIN_BYTES);

        let text = encode_pin(&TaskId::Text("abc-1".into()), "k7", 42).unwrap();
        let mut expected = vec![20, 0, 0, 0, 0xc1, 0xc7, 0xd4, 0xfc, PIN, TEXT_ID, 5, 0];
        expected.extend_from_slice(b"abc-1\x02k7");
        expected.extend_from_slice(&42u64.to_le_bytes());
        assert_eq!(text, expected);

        let finish = encode_finish(&id(9)).unwrap();
        let mut expected = vec![10, 0, 0, 0, 0x60, 0xa3, 0x30, 0xf8, FINISH, NUM_ID];
        expected.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(finish, expected);
        assert_eq!(finish.len() as u64, NUM_FINISH_BYTES);

        let both = [pin, text, finish].concat();
        assert_eq!(
            decoded(&both),
            vec![
                Record::Pin {
                    task: id(0x0102_0304_0506_0708),
                    key: "k1",
                    created_ms: 1_700_000_000_123
                },
                Record::Pin {
                    task: TaskId::Text("abc-1".into()),
                    key: "k7",
                    created_ms: 42
                },
                Record::Finish,
            ]
        );
    }

    #[test]
    fn names_and_ids_too_long_for_the_format_are_refused() {
        let long_name = "n".repeat(256);
        assert_eq!(
            encode_pin(&id(1), &long_name, 0).unwrap_err().to_string(),
            "key name is 256 bytes; the journal stores at most 255"
        );
        assert!(encode_pin(&id(1), &long_name[..255], 0).is_ok());
        let long_id = TaskId::Text("i".repeat(65_536).into());
        assert_eq!(
            encode_pin(&long_id, "k1", 0).unwrap_err().to_string(),
            "task id is 65536 bytes; the journal stores at most 65535"
        );
        // The longest record a writer can produce is still accepted by replay.
        let longest = TaskId::Text("i".repeat(65_535).into());
        let record = encode_pin(&longest, &long_name[..255], 0).unwrap();
        assert_eq!(record.len(), HEADER + MAX_PAYLOAD);
        assert_eq!(decoded(&record).len(), 1);
    }

    // --- restart ---

    #[tokio::test(start_paused = true)]
    async fn pins_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, first) = open(dir.path());
        assert_eq!(first, recovery(0), "a missing file is an empty store");
        let now = Instant::now();
        pins.pin(id(1), KeyId(0), now);
        pins.pin(id(2), KeyId(0), now);
        pins.pin(TaskId::Text("abc-1".into()), KeyId(3), now);
        drop(pins);

        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(3));
        let now = Instant::now();
        assert_eq!(pins.owner(&id(1), now), Some(KeyId(0)));
        assert_eq!(pins.owner(&id(2), now), Some(KeyId(0)));
        assert_eq!(
            pins.owner(&TaskId::Text("abc-1".into()), now),
            Some(KeyId(3))
        );
        assert_eq!(pins.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn re_pinning_moves_the_task_to_its_new_key_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open(dir.path());
        pins.pin(id(1), KeyId(0), Instant::now());
        pins.pin(id(1), KeyId(1), Instant::now());
        drop(pins);

        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(1));
        assert_eq!(pins.owner(&id(1), Instant::now()), Some(KeyId(1)));
        // The superseded records were compacted away at open.
        assert_eq!(pins.disk_bytes(), NUM_PIN_BYTES);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_dropped_without_sync_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open(dir.path());
        for n in 0..50 {
            pins.pin(id(n), KeyId((n % 5) as u16), Instant::now());
        }
        // What kill -9 leaves: no destructor, no sync; only what write_all handed the kernel.
        std::mem::forget(pins);

        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(50));
        let now = Instant::now();
        for n in 0..50 {
            assert_eq!(
                pins.owner(&id(n), now),
                Some(KeyId((n % 5) as u16)),
                "task {n}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pins_of_keys_no_longer_configured_are_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open(dir.path());
        pins.pin(id(1), KeyId(0), Instant::now());
        pins.pin(id(2), KeyId(1), Instant::now());
        pins.pin(id(3), KeyId(1), Instant::now());
        pins.pin(id(4), KeyId(2), Instant::now());
        drop(pins);

        let without_k1 = |name: &str| ids(name).filter(|key| *key != KeyId(1));
        let (pins, recovered) =
            JournalPins::open(dir.path(), TTL, 1_000, &without_k1, names()).unwrap();
        assert_eq!(
            recovered,
            Recovery {
                unknown_keys: 2,
                ..recovery(2)
            }
        );
        let now = Instant::now();
        assert_eq!(pins.owner(&id(1), now), Some(KeyId(0)));
        assert_eq!(pins.owner(&id(2), now), None);
        assert_eq!(pins.owner(&id(4), now), Some(KeyId(2)));
        assert_eq!(
            pins.disk_bytes(),
            2 * NUM_PIN_BYTES,
            "dropped pins leave the disk"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pin_whose_key_has_no_name_is_served_from_memory_only() {
        let dir = tempfile::tempdir().unwrap();
        let only_k0: KeyNames = Arc::new(|key: KeyId| (key == KeyId(0)).then(|| Arc::from("k0")));
        let (pins, _) =
            JournalPins::open(dir.path(), TTL, 1_000, &ids, only_k0).expect("the journal opens");
        pins.pin(id(1), KeyId(0), Instant::now());
        pins.pin(id(2), KeyId(9), Instant::now());
        assert_eq!(pins.owner(&id(2), Instant::now()), Some(KeyId(9)));
        assert_eq!(pins.disk_bytes(), NUM_PIN_BYTES);
    }

    #[tokio::test(start_paused = true)]
    async fn a_journal_with_legacy_finish_records_loads_every_pin_and_drops_them_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let now_ms = Clock::now().unix_millis(Instant::now());
        let text = TaskId::Text("abc-1".into());
        let pin = |task: &TaskId, key: &str| encode_pin(task, key, now_ms).unwrap();
        let finish = |task: &TaskId| encode_finish(task).unwrap();
        // As an older version wrote it: a FINISH after each final answer, also for a task
        // pinned again later and for one whose pin had already gone.
        let legacy = [
            pin(&id(1), "k0"),
            pin(&id(2), "k1"),
            finish(&id(1)),
            pin(&text, "k2"),
            finish(&text),
            finish(&id(9)),
            pin(&id(3), "k0"),
            finish(&id(3)),
            pin(&id(3), "k1"),
        ]
        .concat();
        fs::write(dir.path().join(FILE_NAME), &legacy).unwrap();

        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(4), "no record is taken for corruption");
        let now = Instant::now();
        assert_eq!(pins.owner(&id(1), now), Some(KeyId(0)));
        assert_eq!(pins.owner(&id(2), now), Some(KeyId(1)));
        assert_eq!(pins.owner(&text, now), Some(KeyId(2)));
        assert_eq!(pins.owner(&id(3), now), Some(KeyId(1)));
        assert_eq!(pins.owner(&id(9), now), None);
        // Oldest first; within one second the store lists numeric ids before text ones.
        // Memory keeps whole seconds, rounded up, so a rewritten pin may come out up to a
        // second younger than it went in, never older.
        let on_disk = journal_bytes(dir.path());
        let listed: Vec<(TaskId, &str)> = decoded(&on_disk)
            .into_iter()
            .map(|record| match record {
                Record::Pin {
                    task,
                    key,
                    created_ms,
                } => {
                    assert!(
                        (now_ms..now_ms + 1_000).contains(&created_ms),
                        "{created_ms} against {now_ms}"
                    );
                    (task, key)
                }
                Record::Finish => panic!("only PIN records are left on disk"),
            })
            .collect();
        assert_eq!(
            listed,
            [(id(1), "k0"), (id(2), "k1"), (id(3), "k1"), (text, "k2")]
        );
        assert_eq!(pins.disk_bytes(), on_disk.len() as u64);
        drop(pins);

        let (_, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(4));
        assert_eq!(journal_bytes(dir.path()), on_disk, "nothing to rewrite now");
    }

    // --- expiry and disk bound ---

    #[tokio::test(start_paused = true)]
    async fn expired_pins_are_not_loaded_and_loaded_pins_keep_their_age() {
        let dir = tempfile::tempdir().unwrap();
        let start = Instant::now();
        let (pins, _) = open(dir.path());
        pins.pin(id(1), KeyId(0), Instant::now());
        tokio::time::advance(Duration::from_secs(90 * 60)).await;
        pins.pin(id(2), KeyId(1), Instant::now());
        tokio::time::advance(Duration::from_secs(30 * 60)).await;
        drop(pins);

        // Task 1 is exactly one TTL old, task 2 half an hour.
        let (pins, recovered) = reopen_after(dir.path(), start.elapsed());
        assert_eq!(
            recovered,
            Recovery {
                expired: 1,
                ..recovery(1)
            }
        );
        assert_eq!(pins.owner(&id(1), Instant::now()), None);
        assert_eq!(pins.owner(&id(2), Instant::now()), Some(KeyId(1)));
        let bytes = journal_bytes(dir.path());
        assert!(
            matches!(decoded(&bytes)[..], [Record::Pin { ref task, key: "k1", .. }] if *task == id(2)),
            "the expired pin left the disk at open"
        );
        // Task 2 expires 90 minutes after the restart, as it would have without one.
        tokio::time::advance(Duration::from_secs(90 * 60 - 1)).await;
        assert_eq!(pins.owner(&id(2), Instant::now()), Some(KeyId(1)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(pins.owner(&id(2), Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn sweep_compacts_once_the_journal_outgrows_its_live_pins() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open_with(
            dir.path(),
            Options {
                compact_slack: 4,
                ..options(1_000)
            },
        );
        for n in 0..10 {
            pins.pin(id(n), KeyId(0), Instant::now());
        }
        assert_eq!(pins.disk_bytes(), 10 * NUM_PIN_BYTES);
        tokio::time::advance(Duration::from_secs(3600)).await;
        pins.pin(id(10), KeyId(0), Instant::now());
        pins.pin(id(11), KeyId(0), Instant::now());
        assert_eq!(pins.sweep(Instant::now()), 0);
        assert_eq!(
            pins.disk_bytes(),
            12 * NUM_PIN_BYTES,
            "12 records for 12 pins: no rewrite"
        );

        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(pins.sweep(Instant::now()), 10);
        // 12 records > 2 × 2 live + 4: rewritten with the two live pins.
        assert_eq!(pins.disk_bytes(), 2 * NUM_PIN_BYTES);
        assert_eq!(journal_bytes(dir.path()).len() as u64, 2 * NUM_PIN_BYTES);

        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(pins.sweep(Instant::now()), 2);
        assert_eq!(
            pins.disk_bytes(),
            2 * NUM_PIN_BYTES,
            "2 records <= 2 × 0 live + 4"
        );
        pins.compact(Instant::now()).unwrap();
        assert_eq!(pins.disk_bytes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn sweep_leaves_a_small_journal_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open(dir.path());
        for n in 0..10 {
            pins.pin(id(n), KeyId(0), Instant::now());
        }
        tokio::time::advance(TTL).await;
        assert_eq!(pins.sweep(Instant::now()), 10);
        assert_eq!(
            pins.disk_bytes(),
            10 * NUM_PIN_BYTES,
            "within the slack: rewriting would cost more than it saves"
        );
        drop(pins);
        let (_, recovered) = reopen_after(dir.path(), TTL);
        assert_eq!(
            recovered,
            Recovery {
                expired: 10,
                ..recovery(0)
            }
        );
        assert_eq!(journal_bytes(dir.path()), b"", "the next open removes them");
    }

    #[test]
    fn the_cap_keeps_the_disk_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open_with(dir.path(), options(1_000));
        let mut largest = 0;
        for n in 0..100_000 {
            pins.pin(id(n), KeyId((n % 10) as u16), Instant::now());
            largest = largest.max(pins.disk_bytes());
            // The server flushes every second; say a thousand pins arrive in one.
            if n % 1_000 == 999 {
                pins.flush().unwrap();
            }
        }
        let bound = (2 * 1_000 + COMPACT_SLACK + 1_000) * NUM_PIN_BYTES;
        assert!(largest <= bound, "{largest} bytes on disk, bound {bound}");
        assert!(
            largest > 2 * 1_000 * NUM_PIN_BYTES,
            "the journal did grow between compactions"
        );
        drop(pins);

        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered.loaded, 1_000);
        assert_eq!(pins.owner(&id(98_999), Instant::now()), None);
        assert_eq!(pins.owner(&id(99_000), Instant::now()), Some(KeyId(0)));
        assert_eq!(pins.disk_bytes(), 1_000 * NUM_PIN_BYTES);
    }

    #[tokio::test(start_paused = true)]
    async fn compaction_writes_exactly_the_live_pins() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open(dir.path());
        pins.pin(id(100), KeyId(0), Instant::now());
        tokio::time::advance(Duration::from_secs(3600)).await;
        for n in 1..=20 {
            pins.pin(id(n), KeyId((n % 4) as u16), Instant::now());
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        pins.pin(id(5), KeyId(3), Instant::now());
        tokio::time::advance(Duration::from_secs(3600)).await;
        // Task 100 has expired but is not swept: it must not be written.
        assert_eq!(pins.len(), 21);
        pins.compact(Instant::now()).unwrap();

        assert!(!dir.path().join(TMP_NAME).exists());
        let bytes = journal_bytes(dir.path());
        assert_eq!(pins.disk_bytes(), bytes.len() as u64);
        let records = decoded(&bytes);
        let mut expected_order: Vec<u64> = (1..=20).filter(|n| *n != 5).collect();
        expected_order.push(5);
        let pinned: Vec<TaskId> = records
            .iter()
            .filter_map(|r| match r {
                Record::Pin { task, .. } => Some(task.clone()),
                Record::Finish => None,
            })
            .collect();
        assert_eq!(
            pinned,
            expected_order.iter().map(|n| id(*n)).collect::<Vec<_>>()
        );
        assert_eq!(
            records.len(),
            20,
            "one PIN record per live pin, nothing else"
        );

        let before: Vec<_> = (1..=20)
            .map(|n| pins.owner(&id(n), Instant::now()))
            .collect();
        // The expired task 100 still counts in memory until a sweep; it is not on disk.
        assert_eq!(pins.sweep(Instant::now()), 1);
        drop(pins);
        let (pins, recovered) = reopen_after(dir.path(), Duration::from_secs(2 * 3600));
        assert_eq!(recovered, recovery(20));
        let after: Vec<_> = (1..=20)
            .map(|n| pins.owner(&id(n), Instant::now()))
            .collect();
        assert_eq!(after, before);
        assert_eq!(
            journal_bytes(dir.path()),
            bytes,
            "nothing left to compact at open"
        );
    }

    #[test]
    fn pins_written_during_a_compaction_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open_with(dir.path(), options(100_000));
        let done = AtomicBool::new(false);
        let compactions = std::thread::scope(|scope| {
            scope.spawn(|| {
                for n in 0..20_000 {
                    pins.pin(id(n), KeyId((n % 3) as u16), Instant::now());
                }
                done.store(true, Ordering::Release);
            });
            let mut compactions = 0;
            while !done.load(Ordering::Acquire) {
                pins.compact(Instant::now()).expect("compaction succeeds");
                compactions += 1;
            }
            compactions
        });
        assert!(compactions > 0);
        std::mem::forget(pins);

        let (pins, recovered) = open_with(dir.path(), options(100_000));
        assert_eq!(recovered, recovery(20_000));
        for n in (0..20_000).step_by(997) {
            assert_eq!(
                pins.owner(&id(n), Instant::now()),
                Some(KeyId((n % 3) as u16))
            );
        }
        assert_eq!(pins.disk_bytes(), 20_000 * NUM_PIN_BYTES);
    }

    // --- corruption and I/O errors ---

    /// A journal of task 1 on k0, task 2 on k1, then `last` on k2.
    fn three_pins(last: TaskId) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open(dir.path());
        pins.pin(id(1), KeyId(0), Instant::now());
        pins.pin(id(2), KeyId(1), Instant::now());
        pins.pin(last, KeyId(2), Instant::now());
        drop(pins);
        journal_bytes(dir.path())
    }

    fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, JournalPins, Recovery) {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE_NAME), bytes).unwrap();
        let (pins, recovered) = open(dir.path());
        (dir, pins, recovered)
    }

    /// Pin `n` of a test journal: every fifth id is text, keys `k0`..`k3` in turn.
    fn nth_pin(n: usize) -> (TaskId, KeyId) {
        let task = if n % 5 == 4 {
            TaskId::Text(format!("t-{n}").into())
        } else {
            id(1_000 + n as u64)
        };
        (task, KeyId((n % 4) as u16))
    }

    /// A journal of `n` pins created now, and the byte range of each record.
    fn journal_of(n: usize) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        let now_ms = Clock::now().unix_millis(Instant::now());
        let (mut bytes, mut spans) = (Vec::new(), Vec::new());
        for i in 0..n {
            let (task, key) = nth_pin(i);
            let record = encode_pin(&task, &format!("k{}", key.0), now_ms).unwrap();
            spans.push(bytes.len()..bytes.len() + record.len());
            bytes.extend_from_slice(&record);
        }
        (bytes, spans)
    }

    /// Checks that `pins` holds pin `n` of [`journal_of`] for every `n` but `lost`.
    fn holds_all_but(pins: &JournalPins, n: usize, lost: usize, what: &str) {
        for i in 0..n {
            let (task, key) = nth_pin(i);
            let expected = (i != lost).then_some(key);
            assert_eq!(
                pins.owner(&task, Instant::now()),
                expected,
                "pin {i}: {what}"
            );
        }
    }

    #[test]
    fn one_bad_byte_at_offset_300_costs_one_pin_of_187() {
        let (mut bytes, spans) = journal_of(187);
        bytes[300] ^= 0x01;
        let hit = spans.iter().position(|s| s.contains(&300)).unwrap();
        let (dir, pins, recovered) = open_bytes(&bytes);
        assert_eq!(recovered, damaged(186, spans[hit].len(), 1));
        holds_all_but(&pins, 187, hit, "offset 300");
        drop(pins);
        // The compaction at open rewrote the file without the damage.
        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(186));
        holds_all_but(&pins, 187, hit, "after a second open");
    }

    #[test]
    fn a_bad_byte_in_each_record_in_turn_costs_that_record_only() {
        let (full, spans) = journal_of(40);
        for (hit, span) in spans.iter().enumerate() {
            // A different byte of each record: length, CRC, type, id, name and time all get hit.
            let offset = span.start + (hit * 7) % span.len();
            let mut bytes = full.clone();
            bytes[offset] ^= 0x5a;
            let what = format!("record {hit}, byte {offset}");
            let (dir, pins, recovered) = open_bytes(&bytes);
            assert_eq!(recovered, damaged(39, span.len(), 1), "{what}");
            holds_all_but(&pins, 40, hit, &what);
            drop(pins);
            let (pins, recovered) = open(dir.path());
            assert_eq!(recovered, recovery(39), "{what}: the file was rewritten");
            holds_all_but(&pins, 40, hit, &what);
        }
    }

    #[test]
    fn replay_resyncs_after_any_bad_byte_of_any_record() {
        let (full, spans) = journal_of(25);
        let all = decoded(&full);
        assert_eq!(all.len(), 25);
        for (hit, span) in spans.iter().enumerate() {
            for offset in span.clone() {
                for flip in [0x01, 0x80, 0xff] {
                    let mut bytes = full.clone();
                    bytes[offset] ^= flip;
                    let replay = decode(&bytes);
                    let expected: Vec<_> = (0..all.len())
                        .filter(|i| *i != hit)
                        .map(|i| &all[i])
                        .collect();
                    let records: Vec<_> = replay.records.iter().collect();
                    assert_eq!(records, expected, "byte {offset} ^ {flip:#x}");
                    assert_eq!(
                        (replay.skipped, replay.regions),
                        (span.len(), 1),
                        "byte {offset} ^ {flip:#x}"
                    );
                }
            }
        }
    }

    /// Damage done to a journal in the property test below.
    #[derive(Debug, Clone)]
    enum Damage {
        Flip { at: usize, mask: u8 },
        Overwrite { at: usize, bytes: Vec<u8> },
        Insert { at: usize, bytes: Vec<u8> },
        Zero { at: usize, len: usize },
        Cut { at: usize },
    }

    impl Damage {
        /// Applies itself; returns the damaged file and the bytes of the original it touched
        /// (an insertion touches the record it splits, if any).
        fn apply(&self, bytes: &[u8]) -> (Vec<u8>, std::ops::Range<usize>) {
            let mut out = bytes.to_vec();
            let n = bytes.len();
            match self {
                Damage::Flip { at, mask } => {
                    let at = at % n;
                    out[at] ^= mask;
                    (out, at..at + 1)
                }
                Damage::Overwrite { at, bytes } => {
                    let at = at % n;
                    let end = (at + bytes.len()).min(n);
                    out[at..end].copy_from_slice(&bytes[..end - at]);
                    (out, at..end)
                }
                Damage::Insert { at, bytes } => {
                    let at = at % (n + 1);
                    out.splice(at..at, bytes.iter().copied());
                    (out, at..at)
                }
                Damage::Zero { at, len } => {
                    let at = at % n;
                    let end = (at + len).min(n);
                    out[at..end].fill(0);
                    (out, at..end)
                }
                Damage::Cut { at } => {
                    let at = at % n;
                    out.truncate(at);
                    (out, at..n)
                }
            }
        }
    }

    fn any_damage() -> impl proptest::strategy::Strategy<Value = Damage> {
        use proptest::prelude::*;
        let garbage = proptest::collection::vec(any::<u8>(), 1..80);
        prop_oneof![
            (any::<usize>(), 1..=u8::MAX).prop_map(|(at, mask)| Damage::Flip { at, mask }),
            (any::<usize>(), garbage.clone())
                .prop_map(|(at, bytes)| Damage::Overwrite { at, bytes }),
            (any::<usize>(), garbage).prop_map(|(at, bytes)| Damage::Insert { at, bytes }),
            (any::<usize>(), 1..600usize).prop_map(|(at, len)| Damage::Zero { at, len }),
            any::<usize>().prop_map(|at| Damage::Cut { at }),
        ]
    }

    fn any_record() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let task = prop_oneof![
            any::<u64>().prop_map(TaskId::Num),
            "[a-z0-9-]{1,40}".prop_map(|text| TaskId::Text(text.into())),
        ];
        (task, "[a-z]{1,20}", any::<u64>())
            .prop_map(|(task, name, created)| encode_pin(&task, &name, created).unwrap())
    }

    proptest::proptest! {
        // Failures are printed shrunk; no regressions file is written outside src/.
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        /// Whatever one spot of damage does, replay returns every record it did not touch,
        /// in order, invents none, and accounts for every byte.
        #[test]
        fn replay_keeps_every_record_the_damage_did_not_touch(
            records in proptest::collection::vec(any_record(), 1..40),
            damage in any_damage(),
        ) {
            let full = records.concat();
            let (bytes, hit) = damage.apply(&full);
            let mut spans = Vec::new();
            let mut start = 0;
            for record in &records {
                spans.push(start..start + record.len());
                start += record.len();
            }
            let touched = |span: &std::ops::Range<usize>| {
                if hit.is_empty() {
                    span.start < hit.start && hit.start < span.end
                } else {
                    span.start < hit.end && hit.start < span.end
                }
            };
            let originals = decode(&full).records;
            let replay = decode(&bytes);
            // Every decoded record is an original, in the original order...
            let mut rest = originals.iter();
            for record in &replay.records {
                proptest::prop_assert!(
                    rest.any(|original| original == record),
                    "invented or reordered: {:?}", record
                );
            }
            // ...and every one the damage left whole is among them.
            let mut rest = replay.records.iter();
            for (original, span) in originals.iter().zip(&spans) {
                if !touched(span) {
                    proptest::prop_assert!(
                        rest.any(|record| record == original),
                        "lost an untouched record at {:?}", span
                    );
                }
            }
            let kept: usize = replay
                .records
                .iter()
                .map(|record| match record {
                    Record::Pin { task, key, .. } => {
                        HEADER + 1 + 1 + 1 + key.len() + 8 + match task {
                            TaskId::Num(_) => 8,
                            TaskId::Text(text) => 2 + text.len(),
                        }
                    }
                    Record::Finish => unreachable!("only PIN records are written"),
                })
                .sum();
            proptest::prop_assert_eq!(kept + replay.skipped, bytes.len());
            proptest::prop_assert_eq!(replay.skipped == 0, replay.regions == 0);
        }
    }

    #[test]
    fn a_last_record_cut_at_any_byte_is_skipped_and_the_file_repaired() {
        let last = TaskId::Text("abc-1".into());
        let full = three_pins(last.clone());
        let good = 2 * NUM_PIN_BYTES as usize;
        assert_eq!(full.len(), good + 28);
        for cut in good + 1..full.len() {
            let (dir, pins, recovered) = open_bytes(&full[..cut]);
            assert_eq!(recovered, damaged(2, cut - good, 1), "cut at {cut}");
            assert_eq!(
                pinned_in(&journal_bytes(dir.path())),
                [(id(1), "k0".to_owned()), (id(2), "k1".to_owned())],
                "cut at {cut}: the torn record left the file"
            );
            assert_eq!(pins.owner(&id(2), Instant::now()), Some(KeyId(1)));
            assert_eq!(pins.owner(&last, Instant::now()), None);

            pins.pin(last.clone(), KeyId(2), Instant::now());
            drop(pins);
            let (pins, recovered) = open(dir.path());
            assert_eq!(recovered, recovery(3), "cut at {cut}");
            assert_eq!(pins.owner(&last, Instant::now()), Some(KeyId(2)));
        }
        let (_dir, _, recovered) = open_bytes(&full);
        assert_eq!(recovered, recovery(3));
    }

    #[test]
    fn records_after_a_torn_one_are_kept() {
        // A crash cut a record short, and a later run (whose compaction at open failed)
        // appended after it.
        let (first, _) = journal_of(3);
        let torn = &encode_pin(&id(77), "k1", 0).unwrap()[..13];
        let later = encode_pin(&id(78), "k2", Clock::now().unix_millis(Instant::now())).unwrap();
        let bytes = [&first[..], torn, &later].concat();
        let (_dir, pins, recovered) = open_bytes(&bytes);
        assert_eq!(recovered, damaged(4, torn.len(), 1));
        assert_eq!(pins.owner(&id(78), Instant::now()), Some(KeyId(2)));
        assert_eq!(pins.owner(&id(77), Instant::now()), None);
    }

    #[test]
    fn a_damaged_record_costs_only_itself() {
        let full = [three_pins(id(3)), three_pins(id(4))].concat();
        let bad = 2 * NUM_PIN_BYTES as usize;
        let cases = [
            ("length low byte", bad, 0x01),
            ("length beyond any payload", bad + 3, 0x40),
            ("crc", bad + 5, 0x10),
            ("type byte", bad + HEADER, 0x07),
            ("task id", bad + HEADER + 2, 0x01),
            ("key name", bad + HEADER + 11, 0x20),
            ("created", bad + HEADER + 18, 0x80),
        ];
        for (what, offset, flip) in cases {
            let mut bytes = full.clone();
            bytes[offset] ^= flip;
            let (dir, pins, recovered) = open_bytes(&bytes);
            // Tasks 1 and 2 were pinned twice: three pins are left of five records.
            assert_eq!(recovered, damaged(3, NUM_PIN_BYTES as usize, 1), "{what}");
            assert_eq!(pins.owner(&id(1), Instant::now()), Some(KeyId(0)), "{what}");
            assert_eq!(pins.owner(&id(3), Instant::now()), None, "{what}");
            assert_eq!(pins.owner(&id(4), Instant::now()), Some(KeyId(2)), "{what}");
            assert_eq!(
                pinned_in(&journal_bytes(dir.path())),
                [
                    (id(1), "k0".to_owned()),
                    (id(2), "k1".to_owned()),
                    (id(4), "k2".to_owned())
                ],
                "{what}"
            );
        }
    }

    #[test]
    fn a_well_sealed_record_that_does_not_decode_is_skipped() {
        let good = three_pins(id(3));
        let sealed = |payload: &[u8]| {
            let mut record = vec![0; HEADER];
            record.extend_from_slice(payload);
            seal(record)
        };
        let mut trailing = encode_finish(&id(1)).unwrap()[HEADER..].to_vec();
        trailing.push(0);
        let cases = [
            (
                "unknown type",
                sealed(&[0x09, NUM_ID, 0, 0, 0, 0, 0, 0, 0, 0]),
            ),
            (
                "unknown task kind",
                sealed(&[FINISH, 0x05, 0, 0, 0, 0, 0, 0, 0, 0]),
            ),
            ("trailing bytes", sealed(&trailing)),
            (
                "text id not UTF-8",
                sealed(&[FINISH, TEXT_ID, 2, 0, 0xff, 0xfe]),
            ),
            (
                "short name",
                sealed(&[PIN, NUM_ID, 1, 0, 0, 0, 0, 0, 0, 0, 9, b'k']),
            ),
            ("zeros, as a crash can leave", vec![0; 512]),
        ];
        let now_ms = Clock::now().unix_millis(Instant::now());
        for (what, bad) in cases {
            let after = encode_pin(&id(7), "k0", now_ms).unwrap();
            let bytes = [good.clone(), bad.clone(), after.clone()].concat();
            let (dir, pins, recovered) = open_bytes(&bytes);
            assert_eq!(recovered, damaged(4, bad.len(), 1), "{what}");
            assert_eq!(pins.owner(&id(7), Instant::now()), Some(KeyId(0)), "{what}");
            assert_eq!(pinned_in(&journal_bytes(dir.path())).len(), 4, "{what}");
        }
    }

    #[test]
    fn a_garbage_file_opens_empty_and_is_reused() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let garbage: Vec<u8> = (0..4096).map(|_| rng.random()).collect();
        let (dir, pins, recovered) = open_bytes(&garbage);
        assert_eq!(recovered, damaged(0, 4096, 1));
        assert_eq!(journal_bytes(dir.path()), b"");
        pins.pin(id(1), KeyId(0), Instant::now());
        drop(pins);
        let (_, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(1));
    }

    #[test]
    fn a_directory_that_cannot_hold_the_journal_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        fs::write(&not_a_dir, b"x").unwrap();
        let Err(e) = JournalPins::open(&not_a_dir, TTL, 1_000, &ids, names()) else {
            panic!("a regular file is not a data directory");
        };
        let message = e.to_string();
        assert!(
            message.starts_with(&format!(
                "cannot create the pin directory {}: ",
                not_a_dir.display()
            )),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn appends_never_compact_the_flush_does() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open_with(
            dir.path(),
            Options {
                compact_slack: 4,
                ..options(1_000)
            },
        );
        // One id pinned over and over: one live pin, a growing journal.
        for _ in 0..50 {
            pins.pin(id(7), KeyId(0), Instant::now());
        }
        assert_eq!(
            pins.disk_bytes(),
            50 * NUM_PIN_BYTES,
            "no rewrite inside pin()"
        );
        pins.flush().unwrap();
        assert_eq!(pins.disk_bytes(), NUM_PIN_BYTES, "the flush compacted");
        assert_eq!(pins.owner(&id(7), Instant::now()), Some(KeyId(0)));
    }

    #[test]
    fn a_failed_append_keeps_serving_and_the_next_compaction_writes_the_pin() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, disk) = open_faulty(dir.path(), options(1_000));
        pins.pin(id(1), KeyId(0), Instant::now());
        disk.fail(Op::Write(Target::Journal), true);
        disk.fail(Op::SetLen, true);
        pins.pin(id(2), KeyId(1), Instant::now());
        disk.heal();
        assert_eq!(pins.owner(&id(2), Instant::now()), Some(KeyId(1)));
        assert!(pins.lock().needs_repair(), "the record is missing on disk");
        // The next flush (the server's, within a second) rewrites the journal from memory.
        pins.flush().unwrap();
        assert!(!pins.lock().needs_repair(), "the flush rewrote the journal");
        pins.pin(id(3), KeyId(1), Instant::now());
        drop(pins);
        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(3));
        assert_eq!(pins.owner(&id(2), Instant::now()), Some(KeyId(1)));
    }

    #[test]
    fn an_append_the_disk_took_only_part_of_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, disk) = open_faulty(dir.path(), options(1_000));
        pins.pin(id(1), KeyId(0), Instant::now());
        // The disk fills up 10 bytes into the next record.
        disk.fail(Op::Write(Target::Journal), true);
        disk.room(10);
        pins.pin(id(2), KeyId(1), Instant::now());
        assert_eq!(
            pins.disk_bytes(),
            NUM_PIN_BYTES,
            "the partial record was cut off"
        );
        disk.heal();
        pins.pin(id(3), KeyId(1), Instant::now());
        let on_disk = journal_bytes(dir.path());
        assert_eq!(
            pinned_in(&on_disk),
            [(id(1), "k0".to_owned()), (id(3), "k1".to_owned())]
        );
        assert_eq!(pins.owner(&id(2), Instant::now()), Some(KeyId(1)));
    }

    #[test]
    fn pins_acknowledged_while_the_disk_was_full_are_written_by_the_first_flush_after() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, disk) = open_faulty(dir.path(), options(1_000));
        for n in 0..10 {
            pins.pin(id(n), KeyId(0), Instant::now());
        }
        // The disk is full: appends and the repairing compactions fail, for several flushes.
        disk.fail(Op::Write(Target::Journal), true);
        disk.fail(Op::Write(Target::Compaction), true);
        for n in 10..50 {
            pins.pin(id(n), KeyId((n % 3) as u16), Instant::now());
            if n % 10 == 0 {
                let _ = pins.flush();
            }
        }
        assert_eq!(
            pins.owner(&id(30), Instant::now()),
            Some(KeyId(0)),
            "still served"
        );
        // Space comes back; one flush later, a kill -9 loses nothing.
        disk.heal();
        pins.flush().unwrap();
        std::mem::forget(pins);
        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(50));
        for n in 10..50 {
            assert_eq!(
                pins.owner(&id(n), Instant::now()),
                Some(KeyId((n % 3) as u16))
            );
        }
    }

    /// One step of a store's life on a disk that fails on demand.
    #[derive(Debug, Clone)]
    enum Step {
        Pin { task: u64, key: u16 },
        Fail(Op),
        Heal(Op),
        Room(usize),
        Flush,
        Sweep,
        Compact,
    }

    fn any_step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let op = proptest::sample::select(Op::ALL.to_vec());
        prop_oneof![
            6 => (0..40u64, 0..4u16).prop_map(|(task, key)| Step::Pin { task, key }),
            2 => op.clone().prop_map(Step::Fail),
            1 => op.prop_map(Step::Heal),
            1 => (0..60usize).prop_map(Step::Room),
            2 => Just(Step::Flush),
            1 => Just(Step::Sweep),
            1 => Just(Step::Compact),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 48,
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        /// Whatever fails and for however long, every pin acknowledged meanwhile is on disk
        /// after the first flush once the disk works again: a kill -9 then loses none.
        #[test]
        fn after_any_outage_one_flush_puts_every_acknowledged_pin_on_disk(
            steps in proptest::collection::vec(any_step(), 1..60),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (pins, disk) = open_faulty(dir.path(), Options { compact_slack: 8, ..options(1_000) });
            let mut acknowledged = HashMap::new();
            for step in &steps {
                match *step {
                    Step::Pin { task, key } => {
                        pins.pin(id(task), KeyId(key), Instant::now());
                        acknowledged.insert(task, KeyId(key));
                    }
                    Step::Fail(op) => disk.fail(op, true),
                    Step::Heal(op) => disk.fail(op, false),
                    Step::Room(bytes) => disk.room(bytes),
                    Step::Flush => {
                        let _ = pins.flush();
                    }
                    Step::Sweep => {
                        pins.sweep(Instant::now());
                    }
                    Step::Compact => {
                        let _ = pins.compact(Instant::now());
                    }
                }
            }
            disk.heal();
            pins.flush().unwrap();
            std::mem::forget(pins);

            let (pins, recovered) = open(dir.path());
            proptest::prop_assert_eq!(recovered, recovery(acknowledged.len()));
            for (task, key) in acknowledged {
                proptest::prop_assert_eq!(pins.owner(&id(task), Instant::now()), Some(key), "task {}", task);
            }
        }
    }

    /// Bounds a wait that would otherwise hang a failing test; it measures nothing.
    const HANG: Duration = Duration::from_secs(10);

    /// Runs `f` on a thread of `scope`; whether it finished within [`HANG`].
    fn finishes<'s>(scope: &'s std::thread::Scope<'s, '_>, f: impl FnOnce() + Send + 's) -> bool {
        let (done, finished) = std::sync::mpsc::channel();
        scope.spawn(move || {
            f();
            let _ = done.send(());
        });
        finished.recv_timeout(HANG).is_ok()
    }

    #[test]
    fn pins_do_not_wait_for_a_compactions_fsyncs() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, disk) = open_faulty(dir.path(), options(1_000));
        for n in 0..10 {
            pins.pin(id(n), KeyId(0), Instant::now());
        }
        let fsyncs = [
            Op::Sync(Target::Compaction),
            Op::Sync(Target::Journal),
            Op::SyncDir,
        ];
        for op in fsyncs {
            disk.stall(op);
        }
        let mut stalled = Vec::new();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                pins.compact(Instant::now())
                    .expect("the compaction succeeds");
                disk.finished();
            });
            // Each time the compaction waits in an fsync, a pin from another thread must get
            // through: the first ones land in the old file's tail, the last in the new file.
            let mut next = 10;
            while let Some(op) = disk.entered(HANG) {
                let task = next;
                let pins = &pins;
                let pinned = finishes(scope, move || pins.pin(id(task), KeyId(1), Instant::now()));
                if !pinned {
                    disk.give_up();
                    panic!("pin {task} waited for the compaction's {op:?}");
                }
                disk.release();
                stalled.push(op);
                next += 1;
            }
        });
        for op in fsyncs {
            assert!(stalled.contains(&op), "{op:?} not among {stalled:?}");
        }
        std::mem::forget(pins);
        let (pins, recovered) = open(dir.path());
        let pinned = 10 + stalled.len();
        assert_eq!(recovered, recovery(pinned));
        for n in 10..pinned as u64 {
            assert_eq!(
                pins.owner(&id(n), Instant::now()),
                Some(KeyId(1)),
                "pin {n}"
            );
        }
    }

    #[test]
    fn what_a_sync_made_durable_is_fsynced_in_the_new_file_before_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, disk) = open_faulty(dir.path(), options(1_000));
        for n in 0..10 {
            pins.pin(id(n), KeyId(0), Instant::now());
        }
        let compaction_fsync = Op::Sync(Target::Compaction);
        disk.stall(compaction_fsync);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                pins.compact(Instant::now())
                    .expect("the compaction succeeds");
                disk.finished();
            });
            // The snapshot's fsync; the pin lands in the old file's tail.
            assert_eq!(disk.entered(HANG), Some(compaction_fsync));
            pins.pin(id(10), KeyId(1), Instant::now());
            disk.release();
            // The tail's fsync, without the lock. Meanwhile a pin, and a sync that promises it.
            assert_eq!(disk.entered(HANG), Some(compaction_fsync));
            let synced = finishes(scope, || {
                pins.pin(id(11), KeyId(2), Instant::now());
                pins.sync().unwrap();
            });
            if !synced {
                disk.give_up();
                panic!("pin() or sync() waited for the compaction's fsync");
            }
            disk.unstall(compaction_fsync);
            disk.release();
            assert_eq!(disk.entered(HANG), None);
        });
        // Pin 11 was promised durable in the old file before the swap, so the new file must
        // have been fsynced after it was copied there, and before the rename.
        let log = disk.log();
        let promise = log
            .iter()
            .position(|op| *op == Op::Sync(Target::Journal))
            .expect("the sync ran");
        let rename = log.iter().position(|op| *op == Op::Rename).unwrap();
        assert!(promise < rename, "{log:?}");
        assert!(
            log[promise..rename].contains(&compaction_fsync),
            "no fsync of the new file between the promise and the rename: {log:?}"
        );
        assert_eq!(log[rename + 1..], [Op::Sync(Target::Journal), Op::SyncDir]);
        std::mem::forget(pins);
        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(12));
        assert_eq!(pins.owner(&id(11), Instant::now()), Some(KeyId(2)));
    }

    #[test]
    fn a_sync_overtaken_by_a_swap_syncs_the_new_file_and_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, disk) = open_faulty(dir.path(), options(1_000));
        pins.pin(id(1), KeyId(0), Instant::now());
        // A sync that took the old file, then stalls in its fsync while a compaction swaps.
        disk.stall(Op::Sync(Target::Journal));
        std::thread::scope(|scope| {
            scope.spawn(|| {
                pins.sync().expect("the sync succeeds");
                disk.finished();
            });
            assert_eq!(disk.entered(HANG), Some(Op::Sync(Target::Journal)));
            disk.unstall(Op::Sync(Target::Journal));
            let compacted = finishes(scope, || pins.compact(Instant::now()).unwrap());
            if !compacted {
                disk.give_up();
                panic!("the compaction waited for the sync");
            }
            pins.pin(id(2), KeyId(1), Instant::now());
            disk.release();
            assert_eq!(disk.entered(HANG), None);
        });
        // The stalled sync went round again: the new file, then the directory of its rename.
        let log = disk.log();
        let rename = log.iter().position(|op| *op == Op::Rename).unwrap();
        let after: Vec<_> = log[rename..].to_vec();
        assert_eq!(
            after.iter().filter(|op| **op == Op::SyncDir).count(),
            1,
            "{log:?}"
        );
        let journal = pins.lock();
        assert!(!journal.dir_unsynced, "{log:?}");
        assert_eq!(journal.synced, journal.len, "pin 2 is covered too: {log:?}");
    }

    #[test]
    fn a_partial_record_that_cannot_be_cut_off_does_not_hide_later_appends() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, disk) = open_faulty(dir.path(), options(1_000));
        pins.pin(id(1), KeyId(0), Instant::now());
        disk.fail(Op::Write(Target::Journal), true);
        disk.fail(Op::SetLen, true);
        disk.room(10);
        pins.pin(id(2), KeyId(1), Instant::now());
        disk.heal();
        pins.pin(id(3), KeyId(2), Instant::now());
        assert_eq!(pins.disk_bytes(), 2 * NUM_PIN_BYTES + 10);
        // A kill -9 before the repair: pin 2 existed in memory only, pin 3 is found past the
        // partial record.
        std::mem::forget(pins);
        let (pins, recovered) = open(dir.path());
        assert_eq!(recovered, damaged(2, 10, 1));
        assert_eq!(pins.owner(&id(3), Instant::now()), Some(KeyId(2)));
        assert_eq!(pins.owner(&id(2), Instant::now()), None);
    }

    #[test]
    fn a_failed_compaction_leaves_the_journal_in_service() {
        let dir = tempfile::tempdir().unwrap();
        let (pins, _) = open(dir.path());
        pins.pin(id(1), KeyId(0), Instant::now());
        // A directory where the temp file should go makes every compaction fail.
        fs::create_dir(dir.path().join(TMP_NAME)).unwrap();
        fs::write(dir.path().join(TMP_NAME).join("x"), b"x").unwrap();
        let e = pins.compact(Instant::now()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot remove a stale compaction file"),
            "{e}"
        );
        pins.pin(id(2), KeyId(1), Instant::now());
        assert_eq!(pins.disk_bytes(), 2 * NUM_PIN_BYTES);
        pins.sync().unwrap();
        drop(pins);
        let (_, recovered) = open(dir.path());
        assert_eq!(recovered, recovery(2));
    }
}
