//! Compaction: the journal rewritten with only the live pins (a temp file, fsync, rename,
//! fsync of the directory) without holding up `pin()`; also the repair after a failed write,
//! which is a compaction too. Knows the store's state and files; not the record bytes.
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

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, TryLockError};

use tokio::time::Instant;

use super::disk::{write_all, DiskWriter, Target};
use super::options::at;
use super::record::encode_pin_for;
use super::{Journal, JournalPins};
use crate::pins::memory::LivePin;
use crate::pins::PinStore;
use crate::pins::TokenId;

/// A compaction writes here, then renames over [`FILE_NAME`](super::FILE_NAME).
pub(super) const TMP_NAME: &str = "pins.journal.tmp";
/// Times a compaction catches up with the journal without its lock (copy, fsync) because a
/// sync completed meanwhile, before it fsyncs under the lock instead. A sync runs once a
/// second, so one round nearly always does.
const CATCH_UP_ROUNDS: u32 = 4;

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

    /// Whether the journal should be rewritten now. A repair is due at every call until one
    /// succeeds: acknowledged pins are missing from the disk, and each flush (every second)
    /// may be the first after space came back. A compaction due only to the file's size is
    /// retried after a failure by `sweep` alone (once a minute), since nothing is missing.
    pub(super) fn compaction_due(&self, journal: &Journal, from_sweep: bool) -> bool {
        let limit = (self.inner.len() as u64)
            .saturating_mul(2)
            .saturating_add(self.compact_slack);
        journal.needs_repair() || ((from_sweep || !journal.auto_failed) && journal.records > limit)
    }

    /// Compacts unless another compaction is under way; should that one not cover every
    /// change, the next flush finds the repair still due.
    pub(super) fn auto_compact(&self, now: Instant) {
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
        // Pins hold the journal lock across their append and their change in memory, so every
        // pin recorded in the first `mark.len` bytes is in memory by now, and the snapshot,
        // taken after the mark, holds it or a later pin of the same id. It may also hold pins
        // recorded after the mark, which `swap_in` copies after it anyway: replayed twice,
        // the same record changes nothing. So the snapshot is taken without the lock, and a
        // walk of a million pins stops no `pin()`.
        let mark = {
            let journal = self.lock();
            Mark {
                len: journal.len,
                records: journal.records,
                lost: journal.lost,
            }
        };
        let live = self.inner.live(now);
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
            let token = match pin.token {
                TokenId::NONE => None,
                id => self.tokens.name(id),
            };
            let token = token.as_deref().unwrap_or_default();
            let Some(record) = (self.key_name)(pin.key).and_then(|name| {
                encode_pin_for(&pin.task, &name, token, self.clock.unix_millis(pin.created)).ok()
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

#[cfg(test)]
mod tests;
