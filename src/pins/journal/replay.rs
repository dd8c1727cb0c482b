//! Replay: a journal's bytes read back into pins. Finds every valid record, resyncing past
//! damage, and loads the latest pin of each task whose key is still configured and whose TTL
//! has not passed. Knows records and pins; not the file, which the store reads and rewrites.
//!
//! A record that is cut short, fails its CRC, claims a length of 0 or more than the largest
//! possible payload, or does not decode to exactly its length (unknown type, bad UTF-8,
//! trailing bytes) is skipped, and replay *resynchronises*: it moves forward one byte at a
//! time to the next offset where a whole record checks out, and goes on from there. One bad
//! byte thus costs the one record it falls in, a torn tail costs the record being written,
//! and every later valid record is kept. A false resync needs a length within bounds, a
//! payload that decodes to exactly that length, and a matching CRC-32 at the same offset:
//! of the rare offsets where stray bytes pass the first two, the CRC lets one in 2³²
//! through. The bytes skipped are counted in `corrupt_bytes_skipped` and logged (warn). The
//! file is not cut at the damage, which would destroy the good records after it: the
//! compaction at open rewrites it with the pins just loaded. Should that compaction fail, appends go on after the damage, and the next replay
//! resyncs past it again. Pins of keys no longer configured and expired pins are dropped at
//! load, and the same compaction takes them off the disk too.

use std::collections::HashMap;

use super::options::Options;
use super::record::{decode_at, Record};
use crate::captcha::TaskId;
use crate::key_id::KeyId;
use crate::pins::memory::MemoryPins;
use crate::pins::{PinStore, TokenId};

/// The valid records of a file, and the damage replay stepped over to reach them.
pub(super) struct Replay<'a> {
    pub(super) records: Vec<Record<'a>>,
    /// Bytes that are part of no valid record: corrupt records, garbage, a torn tail.
    pub(super) skipped: usize,
    /// Separate runs of such bytes: how many places are damaged.
    pub(super) regions: usize,
}

/// Every valid record in `bytes`, in file order. After a bad record the scan resynchronises:
/// it moves forward a byte at a time to the next offset where a whole record checks out, so
/// one damaged spot costs the records it touches and no others.
pub(super) fn decode(bytes: &[u8]) -> Replay<'_> {
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

/// What replay kept and dropped.
pub(super) struct Loaded {
    pub(super) loaded: usize,
    pub(super) expired: usize,
    pub(super) unknown_keys: usize,
    pub(super) evicted: usize,
}

/// A task's PIN record, kept if no later PIN supersedes it.
struct Candidate {
    task: TaskId,
    key: Option<KeyId>,
    token: TokenId,
    created_ms: u64,
}

/// Applies decoded records to an empty `inner`.
pub(super) fn load(
    inner: &MemoryPins,
    records: Vec<Record<'_>>,
    key_id: &dyn Fn(&str) -> Option<KeyId>,
    options: &Options,
) -> Loaded {
    let mut names: HashMap<&str, Option<KeyId>> = HashMap::new();
    let mut tokens: HashMap<&str, TokenId> = HashMap::new();
    let mut latest: HashMap<TaskId, usize> = HashMap::new();
    let mut candidates: Vec<Candidate> = Vec::with_capacity(records.len());
    for record in records {
        match record {
            Record::Pin {
                task,
                key,
                token,
                created_ms,
            } => {
                let key = *names.entry(key).or_insert_with(|| key_id(key));
                // A token no longer configured keeps its name's id: its tasks stay its own
                // if it comes back, and no other token's.
                let token = match token {
                    "" => TokenId::NONE,
                    name => *tokens
                        .entry(name)
                        .or_insert_with(|| options.tokens.id_of(name)),
                };
                latest.insert(task.clone(), candidates.len());
                candidates.push(Candidate {
                    task,
                    key,
                    token,
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
        inner.pin_for(candidate.task, key, candidate.token, created);
    }
    Loaded {
        loaded: inner.len(),
        expired,
        unknown_keys,
        evicted,
    }
}

#[cfg(test)]
mod tests;
