//! Replay: damage anywhere costs only the records it touches, legacy records load, and pins of
//! removed keys or past their TTL are dropped, at load and from the disk.

use rand::{Rng, SeedableRng};

use super::super::record::*;
use super::super::testing::*;
use super::super::*;

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
                ..
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
        (any::<usize>(), garbage.clone()).prop_map(|(at, bytes)| Damage::Overwrite { at, bytes }),
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
                    HEADER + 1 + 1 + 1 + key.len() + 1 + 8 + match task {
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
    assert_eq!(full.len(), good + 29);
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
        seal(&mut record);
        record
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
