//! Compaction: the disk stays bounded, a compaction writes exactly the live pins and loses none
//! appended meanwhile, and `pin()` never waits for its fsyncs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::super::disk::faulty::Op;
use super::super::record::Record;
use super::super::testing::*;
use super::super::*;
use super::*;

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
