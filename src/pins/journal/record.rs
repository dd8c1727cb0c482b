//! The journal's record format: the bytes of one record, encoded for a pin and decoded at any
//! offset. Knows bytes, task ids and key names; not files, replay order or pins in memory.
//!
//! # File format
//!
//! The file is a sequence of records and nothing else (no header). Integers are little-endian.
//!
//! ```text
//! record  = len: u32 | crc: u32 | payload (len bytes)    crc = CRC-32 (IEEE) of payload
//! payload = 0x03 PIN2   | task | name_len: u8 | key name (UTF-8)
//!                       | token_len: u8 | token name (UTF-8) | created: u64 (unix millis)
//!         | 0x01 PIN    | task | name_len: u8 | key name (UTF-8) | created: u64 (unix millis)
//!                                                   version 1: read, never written
//!         | 0x02 FINISH | task                      legacy: read and ignored, never written
//! task    = 0x00 | id: u64                          TaskId::Num
//!         | 0x01 | id_len: u16 | id bytes (UTF-8)   TaskId::Text
//! ```
//!
//! The format's version is its pin record's type: version 2 writes PIN2, which adds the name
//! of the caller token the task belongs to (empty: none). A version-1 PIN, from a journal
//! written before pins stored tokens, reads as a pin of no token, which any caller may poll;
//! the next compaction writes it as a PIN2.
//!
//! Keys and tokens are stored by name, not by `KeyId`, because ids are positions in the config and may
//! change between runs. Replay applies records in order: a PIN (re)pins its id. A FINISH is a
//! legacy record: older versions wrote one when a task got its final answer, for thread
//! accounting, which is not the pin store's job any more. Replay checks a FINISH like any
//! record and then ignores it, so an older journal loads with all its pins, and the
//! compaction at open leaves the FINISH records out.

use crate::captcha::TaskId;

pub(super) const HEADER: usize = 8;
pub(super) const PIN: u8 = 0x01;
pub(super) const PIN2: u8 = 0x03;
pub(super) const FINISH: u8 = 0x02;
pub(super) const NUM_ID: u8 = 0x00;
pub(super) const TEXT_ID: u8 = 0x01;
/// The largest payload a writer can produce: a PIN with the longest text id and key name.
pub(super) const MAX_PAYLOAD: usize =
    1 + 1 + 2 + u16::MAX as usize + 1 + u8::MAX as usize + 1 + u8::MAX as usize + 8;

/// One decoded record; the key name borrows from the file's bytes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Record<'a> {
    Pin {
        task: TaskId,
        key: &'a str,
        /// The caller token's name; empty for none (and for every version-1 record).
        token: &'a str,
        created_ms: u64,
    },
    /// A legacy FINISH: checked like any record, then skipped.
    Finish,
}

#[derive(Debug, thiserror::Error)]
#[allow(clippy::enum_variant_names)] // each is a field too long for the format
pub(super) enum EncodeError {
    #[error("key name is {0} bytes; the journal stores at most 255")]
    LongName(usize),
    #[error("token name is {0} bytes; the journal stores at most 255")]
    LongTokenName(usize),
    #[error("task id is {0} bytes; the journal stores at most 65535")]
    LongId(usize),
}

/// The PIN2 record of a pin of no token.
#[cfg(test)]
pub(super) fn encode_pin(
    task: &TaskId,
    key: &str,
    created_ms: u64,
) -> Result<Vec<u8>, EncodeError> {
    encode_pin_for(task, key, "", created_ms)
}

/// The PIN2 record of a pin of the token named `token` (empty: none).
pub(super) fn encode_pin_for(
    task: &TaskId,
    key: &str,
    token: &str,
    created_ms: u64,
) -> Result<Vec<u8>, EncodeError> {
    let mut record = Vec::with_capacity(64);
    put_pin(&mut record, task, key, token, created_ms)?;
    Ok(record)
}

/// A version-1 PIN record, which only tests still write: to build an older journal.
#[cfg(test)]
pub(super) fn encode_pin_v1(
    task: &TaskId,
    key: &str,
    created_ms: u64,
) -> Result<Vec<u8>, EncodeError> {
    let name_len = u8::try_from(key.len()).map_err(|_| EncodeError::LongName(key.len()))?;
    let mut out = vec![0; HEADER];
    out.push(PIN);
    put_task(&mut out, task)?;
    out.push(name_len);
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&created_ms.to_le_bytes());
    seal(&mut out);
    Ok(out)
}

/// Appends the PIN2 record of `task` to `out`, leaving `out` as it was on error. The store
/// encodes every pin into one buffer it keeps, so that a pin allocates nothing.
pub(super) fn put_pin(
    out: &mut Vec<u8>,
    task: &TaskId,
    key: &str,
    token: &str,
    created_ms: u64,
) -> Result<(), EncodeError> {
    let name_len = u8::try_from(key.len()).map_err(|_| EncodeError::LongName(key.len()))?;
    let token_len =
        u8::try_from(token.len()).map_err(|_| EncodeError::LongTokenName(token.len()))?;
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    out.push(PIN2);
    if let Err(e) = put_task(out, task) {
        out.truncate(start);
        return Err(e);
    }
    out.push(name_len);
    out.extend_from_slice(key.as_bytes());
    out.push(token_len);
    out.extend_from_slice(token.as_bytes());
    out.extend_from_slice(&created_ms.to_le_bytes());
    seal(&mut out[start..]);
    Ok(())
}

/// A legacy FINISH record, which only tests still write: to build an older version's journal.
#[cfg(test)]
pub(super) fn encode_finish(task: &TaskId) -> Result<Vec<u8>, EncodeError> {
    let mut record = vec![0; HEADER];
    record.push(FINISH);
    put_task(&mut record, task)?;
    seal(&mut record);
    Ok(record)
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
pub(super) fn seal(record: &mut [u8]) {
    let payload = &record[HEADER..];
    let len = u32::try_from(payload.len()).expect("encoders bound the payload by MAX_PAYLOAD");
    let crc = crc32fast::hash(payload);
    record[..4].copy_from_slice(&len.to_le_bytes());
    record[4..HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// The record starting at `start` and where the next one starts; `None` if it is bad.
/// During a resync this is tried at every offset, so what it accepts must rarely be there by
/// chance: a length within the largest payload a writer makes, a payload that decodes to
/// exactly that length, and its CRC-32. The cheap structural checks go first.
pub(super) fn decode_at(bytes: &[u8], start: usize) -> Option<(Record<'_>, usize)> {
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
        kind @ (PIN | PIN2) => {
            let task = r.task()?;
            let name_len = usize::from(r.u8()?);
            let key = std::str::from_utf8(r.take(name_len)?).ok()?;
            let token = if kind == PIN2 {
                let token_len = usize::from(r.u8()?);
                std::str::from_utf8(r.take(token_len)?).ok()?
            } else {
                ""
            };
            Record::Pin {
                task,
                key,
                token,
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
    use super::super::testing::*;
    use super::*;

    /// A FINISH record of a numeric id.
    const NUM_FINISH_BYTES: u64 = 18;

    #[test]
    fn records_have_the_documented_bytes() {
        let pin = encode_pin_v1(&id(0x0102_0304_0506_0708), "k1", 1_700_000_000_123).unwrap();
        let mut expected = vec![21, 0, 0, 0, 0xd3, 0x31, 0xcc, 0xf1, PIN, NUM_ID];
        expected.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1, 2, b'k', b'1']);
        expected.extend_from_slice(&1_700_000_000_123u64.to_le_bytes());
        assert_eq!(pin, expected);
        assert_eq!(
            pin.len() as u64 + 1,
            NUM_PIN_BYTES,
            "a version-1 PIN is one byte less"
        );

        let text = encode_pin_v1(&TaskId::Text("abc-1".into()), "k7", 42).unwrap();
        let mut expected = vec![20, 0, 0, 0, 0xc1, 0xc7, 0xd4, 0xfc, PIN, TEXT_ID, 5, 0];
        expected.extend_from_slice(b"abc-1\x02k7");
        expected.extend_from_slice(&42u64.to_le_bytes());
        assert_eq!(text, expected);

        let finish = encode_finish(&id(9)).unwrap();
        let mut expected = vec![10, 0, 0, 0, 0x60, 0xa3, 0x30, 0xf8, FINISH, NUM_ID];
        expected.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(finish, expected);
        assert_eq!(finish.len() as u64, NUM_FINISH_BYTES);

        // Version 2: the token's name after the key's.
        let owned = encode_pin_for(&id(9), "k1", "client-a", 42).unwrap();
        let mut payload = vec![PIN2, NUM_ID];
        payload.extend_from_slice(&9u64.to_le_bytes());
        payload.extend_from_slice(b"\x02k1\x08client-a");
        payload.extend_from_slice(&42u64.to_le_bytes());
        let mut expected = (payload.len() as u32).to_le_bytes().to_vec();
        expected.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        expected.extend_from_slice(&payload);
        assert_eq!(owned, expected);
        let nobodys = encode_pin(&id(9), "k1", 42).unwrap();
        assert_eq!(nobodys.len() as u64, NUM_PIN_BYTES);

        let all = [pin, text, finish, owned, nobodys].concat();
        assert_eq!(
            decoded(&all),
            vec![
                Record::Pin {
                    task: id(0x0102_0304_0506_0708),
                    key: "k1",
                    token: "",
                    created_ms: 1_700_000_000_123
                },
                Record::Pin {
                    task: TaskId::Text("abc-1".into()),
                    key: "k7",
                    token: "",
                    created_ms: 42
                },
                Record::Finish,
                Record::Pin {
                    task: id(9),
                    key: "k1",
                    token: "client-a",
                    created_ms: 42
                },
                Record::Pin {
                    task: id(9),
                    key: "k1",
                    token: "",
                    created_ms: 42
                },
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
        assert_eq!(
            encode_pin_for(&id(1), "k1", &long_name, 0)
                .unwrap_err()
                .to_string(),
            "token name is 256 bytes; the journal stores at most 255"
        );
        let record = encode_pin_for(&longest, &long_name[..255], &long_name[..255], 0).unwrap();
        assert_eq!(record.len(), HEADER + MAX_PAYLOAD);
        assert_eq!(decoded(&record).len(), 1);
    }

    /// A record appended to a buffer that already holds bytes (the store's, reused across
    /// pins) is the record `encode_pin` makes, and decodes where it was put; one that cannot
    /// be encoded leaves the buffer as it was.
    #[test]
    fn a_record_put_after_other_bytes_is_the_same_record() {
        let long_name = "n".repeat(256);
        let long_id = TaskId::Text("i".repeat(65_536).into());
        let refused = [
            (id(1), long_name.as_str()),
            (long_id.clone(), "k1"),
            (long_id, long_name.as_str()),
        ];
        for (task, key) in refused {
            let mut buffer = b"earlier".to_vec();
            assert!(put_pin(&mut buffer, &task, key, "", 1).is_err());
            assert_eq!(buffer, b"earlier", "nothing of a refused record is left");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        #[test]
        fn put_pin_appends_exactly_what_encode_pin_makes(
            prefix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            num in proptest::prelude::any::<Option<u64>>(),
            text in "[a-zA-Z0-9._-]{1,64}",
            key in "[a-z0-9-]{0,40}",
            created_ms in proptest::prelude::any::<u64>(),
        ) {
            let task = num.map_or_else(|| TaskId::Text(text.into()), TaskId::Num);
            let mut buffer = prefix.clone();
            put_pin(&mut buffer, &task, &key, "", created_ms).unwrap();
            let record = encode_pin(&task, &key, created_ms).unwrap();
            proptest::prop_assert_eq!(&buffer[..prefix.len()], &prefix[..]);
            proptest::prop_assert_eq!(&buffer[prefix.len()..], &record[..]);
            let (decoded, end) = decode_at(&buffer, prefix.len()).expect("the record decodes");
            proptest::prop_assert_eq!(end, buffer.len());
            proptest::prop_assert_eq!(decoded, Record::Pin { task, key: &key, token: "", created_ms });
        }
    }
}
