//! The file operations the pin journal makes once it is open, behind [`Disk`], so that tests
//! can make any of them fail or stall (a full disk, a failing or slow fsync) and the journal's
//! repair and locking can be tested against them. Knows files, not records or pins.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Which file an operation is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Target {
    /// The journal that pins are appended to.
    Journal,
    /// A compaction's temp file, before it is renamed over the journal.
    Compaction,
}

/// The journal's I/O after open. [`RealDisk`] is the only implementation outside tests.
pub(super) trait Disk: Send + Sync + 'static {
    /// One `write(2)`: may write only part of `buf`, as a disk filling up does.
    fn write(&self, file: &File, buf: &[u8], target: Target) -> io::Result<usize>;
    /// Cuts `file` back to `len` bytes.
    fn set_len(&self, file: &File, len: u64) -> io::Result<()>;
    /// fdatasync.
    fn sync_data(&self, file: &File, target: Target) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes a rename or a file creation in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's files.
pub(super) struct RealDisk;

impl Disk for RealDisk {
    fn write(&self, file: &File, buf: &[u8], _: Target) -> io::Result<usize> {
        (&*file).write(buf)
    }

    fn set_len(&self, file: &File, len: u64) -> io::Result<()> {
        file.set_len(len)
    }

    fn sync_data(&self, file: &File, _: Target) -> io::Result<()> {
        file.sync_data()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    #[cfg(unix)]
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    /// Directories cannot be opened as files here; the rename is as durable as the OS makes it.
    #[cfg(not(unix))]
    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}

/// Writes all of `buf` with as many [`Disk::write`] calls as it takes. On error, also says
/// how many bytes did reach the file, so that the caller can cut them off again.
pub(super) fn write_all(
    disk: &dyn Disk,
    file: &File,
    mut buf: &[u8],
    target: Target,
) -> Result<(), (io::Error, usize)> {
    let mut written = 0;
    while !buf.is_empty() {
        match disk.write(file, buf, target) {
            Ok(0) => {
                let e = io::Error::new(io::ErrorKind::WriteZero, "the file took no more bytes");
                return Err((e, written));
            }
            Ok(n) => {
                written += n;
                buf = &buf[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((e, written)),
        }
    }
    Ok(())
}

/// An `io::Write` over a [`Disk`], for a `BufWriter` in front of a compaction's temp file.
pub(super) struct DiskWriter<'a> {
    pub disk: &'a dyn Disk,
    pub file: &'a File,
    pub target: Target,
}

impl Write for DiskWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.disk.write(self.file, buf, self.target)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod faulty {
    //! A [`Disk`] whose operations fail or stall on demand, and that logs what it did.

    use std::collections::HashSet;
    use std::sync::mpsc::{self, Receiver, Sender};
    use std::sync::{Mutex, PoisonError};
    use std::time::Duration;

    use super::*;

    /// One kind of operation, to fail or stall.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub(in crate::pins) enum Op {
        Write(Target),
        SetLen,
        Sync(Target),
        Rename,
        SyncDir,
    }

    impl Op {
        /// Every operation, for tests that try each.
        pub const ALL: [Op; 7] = [
            Op::Write(Target::Journal),
            Op::Write(Target::Compaction),
            Op::SetLen,
            Op::Sync(Target::Journal),
            Op::Sync(Target::Compaction),
            Op::Rename,
            Op::SyncDir,
        ];
    }

    /// Real files, except that the operations in `failing` return an error (failing writes
    /// first use up `room` bytes, as a disk that fills up mid-record does), and those in
    /// `stalled` wait for [`Faulty::release`] after announcing themselves to
    /// [`Faulty::entered`].
    pub(in crate::pins) struct Faulty {
        failing: Mutex<HashSet<Op>>,
        room: Mutex<usize>,
        stalled: Mutex<HashSet<Op>>,
        /// `Some(op)`: `op` is stalled now; `None`: [`Faulty::finished`] was called.
        entered: Channel<Option<Op>>,
        release: Channel<()>,
        /// Every operation begun, in order.
        log: Mutex<Vec<Op>>,
    }

    /// Both ends of a channel, shareable between the test and the threads it stalls.
    type Channel<T> = (Mutex<Sender<T>>, Mutex<Receiver<T>>);

    fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(PoisonError::into_inner)
    }

    impl Faulty {
        pub fn new() -> Faulty {
            let (entered_tx, entered_rx) = mpsc::channel();
            let (release_tx, release_rx) = mpsc::channel();
            Faulty {
                failing: Mutex::default(),
                room: Mutex::new(0),
                stalled: Mutex::default(),
                entered: (Mutex::new(entered_tx), Mutex::new(entered_rx)),
                release: (Mutex::new(release_tx), Mutex::new(release_rx)),
                log: Mutex::default(),
            }
        }

        /// Makes `op` fail from now on, or work again.
        pub fn fail(&self, op: Op, failing: bool) {
            let mut set = lock(&self.failing);
            if failing {
                set.insert(op);
            } else {
                set.remove(&op);
            }
        }

        /// Makes every operation work again.
        pub fn heal(&self) {
            lock(&self.failing).clear();
        }

        /// How many bytes failing writes still take, all together, before they fail.
        pub fn room(&self, bytes: usize) {
            *lock(&self.room) = bytes;
        }

        /// Makes `op` stall until released, from now on.
        pub fn stall(&self, op: Op) {
            lock(&self.stalled).insert(op);
        }

        /// Stops stalling `op`; one already waiting still needs its release.
        pub fn unstall(&self, op: Op) {
            lock(&self.stalled).remove(&op);
        }

        /// The next stalled operation, once it waits, or `None` after [`Faulty::finished`].
        /// Panics if neither comes within `limit`, which only bounds a test that would
        /// otherwise hang.
        pub fn entered(&self, limit: Duration) -> Option<Op> {
            lock(&self.entered.1)
                .recv_timeout(limit)
                .expect("a stalled operation or the end of the work under test")
        }

        /// Tells [`Faulty::entered`] that nothing more will stall.
        pub fn finished(&self) {
            let _ = lock(&self.entered.0).send(None);
        }

        /// Lets one stalled operation go on.
        pub fn release(&self) {
            let _ = lock(&self.release.0).send(());
        }

        /// Stops stalling anything and lets every waiting operation go, so that a failing
        /// test unwinds instead of hanging.
        pub fn give_up(&self) {
            lock(&self.stalled).clear();
            for _ in 0..64 {
                self.release();
            }
        }

        /// Every operation begun so far, in order.
        pub fn log(&self) -> Vec<Op> {
            lock(&self.log).clone()
        }

        fn check(&self, op: Op) -> io::Result<()> {
            lock(&self.log).push(op);
            if lock(&self.stalled).contains(&op) {
                let _ = lock(&self.entered.0).send(Some(op));
                let _ = lock(&self.release.1).recv();
            }
            if lock(&self.failing).contains(&op) {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("injected failure of {op:?}"),
                ));
            }
            Ok(())
        }
    }

    impl Disk for Faulty {
        fn write(&self, file: &File, buf: &[u8], target: Target) -> io::Result<usize> {
            let op = Op::Write(target);
            if let Err(e) = self.check(op) {
                let mut room = lock(&self.room);
                let n = (*room).min(buf.len());
                if n == 0 {
                    return Err(e);
                }
                *room -= n;
                return RealDisk.write(file, &buf[..n], target);
            }
            RealDisk.write(file, buf, target)
        }

        fn set_len(&self, file: &File, len: u64) -> io::Result<()> {
            self.check(Op::SetLen)?;
            RealDisk.set_len(file, len)
        }

        fn sync_data(&self, file: &File, target: Target) -> io::Result<()> {
            self.check(Op::Sync(target))?;
            RealDisk.sync_data(file, target)
        }

        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            self.check(Op::Rename)?;
            RealDisk.rename(from, to)
        }

        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            self.check(Op::SyncDir)?;
            RealDisk.sync_dir(dir)
        }
    }
}
