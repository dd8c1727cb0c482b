//! The store: pins survive a reopen and a `kill -9`, and every pin acknowledged while the disk
//! failed reaches the file once it works again.

use std::collections::HashMap;

use super::disk::faulty::Op;
use super::record::encode_pin;
use super::testing::*;
use super::*;

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

/// The bytes a pin appends are the record `encode_pin` makes of it, whatever came before,
/// and each key's name is asked of `key_name` once, not at every pin.
#[tokio::test(start_paused = true)]
async fn pins_append_their_records_and_ask_each_name_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&asked);
    let key_name: KeyNames = Arc::new(move |key: KeyId| {
        counted.fetch_add(1, Ordering::Relaxed);
        Some(Arc::from(format!("key-{}", key.0)))
    });
    let (pins, _) = JournalPins::open(dir.path(), TTL, 1_000, &ids, key_name).unwrap();
    let mut expected = Vec::new();
    for n in 0..60u64 {
        let task = match n % 3 {
            0 => id(n),
            1 => TaskId::Text(format!("t-{n}").into()),
            _ => TaskId::Text("x".repeat(64).into()),
        };
        let key = KeyId((n % 4) as u16 * 300);
        tokio::time::advance(Duration::from_millis(777)).await;
        let now = Instant::now();
        pins.pin(task.clone(), key, now);
        let name = format!("key-{}", key.0);
        expected.extend(encode_pin(&task, &name, pins.clock.unix_millis(now)).unwrap());
        assert_eq!(journal_bytes(dir.path()), expected, "after pin {n}");
    }
    assert_eq!(asked.load(Ordering::Relaxed), 4, "one lookup per key");
}

/// Pins keep their caller token across a restart, by the token's name (ids are handed out
/// per process); a version-1 journal, written before pins stored tokens, loads with every
/// pin belonging to no token (the next compaction writes them in version 2).
#[tokio::test(start_paused = true)]
async fn a_pins_token_survives_a_restart_by_name_and_old_pins_belong_to_no_token() {
    use super::record::encode_pin_v1;
    let dir = tempfile::tempdir().unwrap();
    let now_ms = Clock::now().unix_millis(Instant::now());
    fs::write(
        dir.path().join(FILE_NAME),
        encode_pin_v1(&id(1), "k0", now_ms).unwrap(),
    )
    .unwrap();
    let first_run = Arc::new(TokenCounters::default());
    let (pins, recovered) = open_with(
        dir.path(),
        Options {
            tokens: first_run.clone(),
            ..options(1_000)
        },
    );
    assert_eq!(recovered, recovery(1));
    let old = pins.pinned(&id(1), Instant::now()).unwrap();
    assert_eq!(old.token, TokenId::NONE, "an old pin is nobody's");
    let client_a = first_run.id_of("client-a");
    pins.pin_for(id(2), KeyId(1), client_a, Instant::now());
    drop(pins);

    // The next run hands out ids in another order.
    let second_run = Arc::new(TokenCounters::default());
    let other = second_run.id_of("other");
    let (pins, recovered) = open_with(
        dir.path(),
        Options {
            tokens: second_run.clone(),
            ..options(1_000)
        },
    );
    assert_eq!(recovered, recovery(2));
    let owned = pins.pinned(&id(2), Instant::now()).unwrap();
    assert_eq!(owned.key, KeyId(1));
    assert_eq!(owned.token, second_run.id_of("client-a"));
    assert_ne!(owned.token, other);
    assert_eq!(
        pins.pinned(&id(1), Instant::now()).unwrap().token,
        TokenId::NONE
    );
    let on_disk: Vec<(TaskId, String)> = decoded(&journal_bytes(dir.path()))
        .into_iter()
        .filter_map(|record| match record {
            super::record::Record::Pin { task, token, .. } => Some((task, token.to_owned())),
            super::record::Record::Finish => None,
        })
        .collect();
    assert!(
        on_disk.contains(&(id(2), "client-a".to_owned())),
        "{on_disk:?}"
    );
    assert!(on_disk.contains(&(id(1), String::new())), "{on_disk:?}");
}
