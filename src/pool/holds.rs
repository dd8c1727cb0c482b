//! Operator holds on keys, by key name: a disabled key takes no new task and no background
//! read; a draining key takes no new task but is still refreshed. Kept outside every pool
//! snapshot (shared by all of them, as health is), so that a hold lasts through refreshes
//! and reloads until the operator lifts it. Knows names only; which names exist is the
//! caller's business.
//!
//! Holds sit behind the narrow [`HoldStore`] interface, chosen when `App` is built:
//! [`MemoryHolds`] for a config built in code (no `data_dir`), [`FileHolds`] to keep them
//! in `data_dir` across restarts and crashes. Every change is a versioned [`HoldRecord`],
//! a lift included, so that copies of the holds kept elsewhere (a store shared by
//! replicas, another replica's file) can be merged: the newer record wins, whichever copy
//! arrives last.

mod file;

pub use file::{FileHolds, HoldsFileError};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// What an operator put on a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdminHold {
    /// No new tasks, no background refresh or verdict checks. Its pinned tasks are still
    /// polled and reported with it: a task the service accepted is never lost.
    Disabled,
    /// No new tasks; pinned tasks still served, and still refreshed.
    Draining,
}

impl AdminHold {
    /// Every hold, for metric series that start at 0.
    pub const ALL: &'static [AdminHold] = &[AdminHold::Disabled, AdminHold::Draining];

    /// Metric label and status text.
    pub const fn label(self) -> &'static str {
        match self {
            AdminHold::Disabled => "disabled",
            AdminHold::Draining => "draining",
        }
    }
}

/// The state a record gives a key: its label, `enabled` for a lift.
pub fn state_label(hold: Option<AdminHold>) -> &'static str {
    hold.map_or(LIFTED, AdminHold::label)
}

/// The state of a [`state_label`]: `Some(None)` for a lift, `None` for no state at all.
pub fn parse_state(label: &str) -> Option<Option<AdminHold>> {
    match label {
        LIFTED => Some(None),
        _ => AdminHold::ALL
            .iter()
            .find(|hold| hold.label() == label)
            .map(|hold| Some(*hold)),
    }
}

/// The label of a lifted hold.
const LIFTED: &str = "enabled";

/// One change of a key's hold: the hold it left (`None`: lifted), when, and by whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldRecord {
    /// The key's name.
    pub name: String,
    /// `None`: lifted. A lift is recorded, not just forgotten, so that an older copy of the
    /// hold put back later (after a shared store lost its data, say) cannot undo it.
    pub hold: Option<AdminHold>,
    /// Grows with every change: unix ms, or one more than the newest version this store
    /// knew if that is more (a clock that stepped back never makes a change look older).
    pub version: u64,
    /// Who made the change (the replica's name; empty on a single instance): of two
    /// changes with one version, the larger name wins, the same on every replica.
    pub by: String,
}

impl HoldRecord {
    /// Whether this record wins over `other`: a larger version, or the same and a larger `by`.
    pub fn supersedes(&self, other: &HoldRecord) -> bool {
        (self.version, &self.by) > (other.version, &other.by)
    }
}

/// What an operator's change did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldChange {
    /// The hold it replaced.
    pub previous: Option<AdminHold>,
    /// The change as recorded, for sharing with other replicas.
    pub record: HoldRecord,
}

/// Why a hold was not changed.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    /// No key of the running config has the name given.
    #[error("no configured key has that name")]
    NoSuchKey,
    /// The store could not keep the change where it survives a crash; nothing changed.
    #[error("cannot save the holds to {}: {source}", file.display())]
    Persist {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the operator's holds live. `get` is called on every pick and must stay cheap when
/// no key is held; changes are rare (an operator's call, a reload, a sync with other replicas).
pub trait HoldStore: Send + Sync + 'static {
    /// The hold on the key named `name`, if any.
    fn get(&self, name: &str) -> Option<AdminHold>;

    /// Every record kept, lifts included.
    fn records(&self) -> Vec<HoldRecord>;

    /// Puts `hold` on `name` (`None` lifts it), if `exists(name)` holds at that moment, and
    /// keeps the change before it takes effect. The check and the change are made under one
    /// lock, which [`HoldStore::retain`] takes too, so a reload that removes the key cannot
    /// leave its hold behind.
    ///
    /// # Errors
    /// [`HoldError::NoSuchKey`] for a name `exists` refuses; [`HoldError::Persist`] when the
    /// change could not be kept (it is then not applied either).
    fn set(
        &self,
        name: &str,
        hold: Option<AdminHold>,
        exists: &dyn Fn(&str) -> bool,
    ) -> Result<HoldChange, HoldError>;

    /// Takes the records made elsewhere that supersede this store's, for names `exists`
    /// accepts; returns those taken. They apply even if they cannot be kept (logged): the
    /// copy they came from still has them.
    fn adopt(&self, records: Vec<HoldRecord>, exists: &dyn Fn(&str) -> bool) -> Vec<HoldRecord>;

    /// Drops the records of names `keep` refuses (keys a reload removed); returns the names
    /// whose hold that dropped.
    fn retain(&self, keep: &dyn Fn(&str) -> bool) -> Vec<String>;
}

/// Holds in memory only: what a config built in code (no `data_dir`) gets, and the table
/// [`FileHolds`] keeps its file's copy in.
#[derive(Debug, Default)]
pub struct MemoryHolds {
    /// The last record per name. A std `RwLock`: read on every pick while any hold exists,
    /// written only by a change, never held across an await or a disk write.
    records: RwLock<HashMap<String, HoldRecord>>,
    /// Whether any record holds a key: the usual case is none, and a pick then pays one
    /// atomic load instead of a lock per key.
    any: AtomicBool,
    /// Serialises changes, so that each is checked, kept and applied before the next
    /// begins, without blocking picks while a change is written to disk.
    changes: Mutex<()>,
    /// This process's name in the records it makes (the replica's).
    origin: String,
}

/// Keeps a table of records somewhere; `Ok` only once it is there.
type Save<'a> = &'a dyn Fn(&HashMap<String, HoldRecord>) -> Result<(), HoldError>;

fn kept_nowhere(_: &HashMap<String, HoldRecord>) -> Result<(), HoldError> {
    Ok(())
}

impl MemoryHolds {
    /// An empty table whose changes are recorded as made by `origin`.
    pub fn new(origin: &str) -> MemoryHolds {
        MemoryHolds {
            origin: origin.to_owned(),
            ..MemoryHolds::default()
        }
    }

    /// A table holding `records` (read back from a file), as made by `origin` from now on.
    fn with_records(origin: &str, records: Vec<HoldRecord>) -> MemoryHolds {
        let table = MemoryHolds::new(origin);
        table.install(records.into_iter().map(|r| (r.name.clone(), r)).collect());
        table
    }

    fn set_with(
        &self,
        name: &str,
        hold: Option<AdminHold>,
        exists: &dyn Fn(&str) -> bool,
        save: Save<'_>,
    ) -> Result<HoldChange, HoldError> {
        let _change = lock(&self.changes);
        if !exists(name) {
            return Err(HoldError::NoSuchKey);
        }
        let mut next = self.read().clone();
        let newest = next.values().map(|r| r.version).max().unwrap_or(0);
        let record = HoldRecord {
            name: name.to_owned(),
            hold,
            version: unix_ms().max(newest + 1),
            by: self.origin.clone(),
        };
        let previous = next
            .insert(name.to_owned(), record.clone())
            .and_then(|r| r.hold);
        save(&next)?;
        self.install(next);
        Ok(HoldChange { previous, record })
    }

    fn adopt_with(
        &self,
        records: Vec<HoldRecord>,
        exists: &dyn Fn(&str) -> bool,
        save: Save<'_>,
    ) -> Vec<HoldRecord> {
        let _change = lock(&self.changes);
        let mut next = self.read().clone();
        let mut taken = Vec::new();
        for record in records {
            let newer = next.get(&record.name).is_none_or(|r| record.supersedes(r));
            if newer && exists(&record.name) {
                next.insert(record.name.clone(), record.clone());
                taken.push(record);
            }
        }
        if taken.is_empty() {
            return taken;
        }
        if let Err(e) = save(&next) {
            tracing::warn!(
                error = %e,
                "holds adopted from other replicas apply, but could not be saved"
            );
        }
        self.install(next);
        taken
    }

    fn retain_with(&self, keep: &dyn Fn(&str) -> bool, save: Save<'_>) -> Vec<String> {
        let _change = lock(&self.changes);
        let mut next = self.read().clone();
        let mut dropped = Vec::new();
        next.retain(|name, record| {
            let kept = keep(name);
            if !kept && record.hold.is_some() {
                dropped.push(name.clone());
            }
            kept
        });
        if next.len() == self.read().len() {
            return dropped;
        }
        if let Err(e) = save(&next) {
            // The file keeps holds of removed keys, which the next load drops again.
            tracing::warn!(error = %e, "the holds of removed keys could not be dropped from disk");
        }
        self.install(next);
        dropped
    }

    /// Makes `next` the table picks read, in one short write lock.
    fn install(&self, next: HashMap<String, HoldRecord>) {
        let any = next.values().any(|r| r.hold.is_some());
        let mut records = self.records.write().unwrap_or_else(PoisonError::into_inner);
        *records = next;
        self.any.store(any, Ordering::Release);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, HoldRecord>> {
        self.records.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl HoldStore for MemoryHolds {
    fn get(&self, name: &str) -> Option<AdminHold> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.read().get(name).and_then(|r| r.hold)
    }

    fn records(&self) -> Vec<HoldRecord> {
        self.read().values().cloned().collect()
    }

    fn set(
        &self,
        name: &str,
        hold: Option<AdminHold>,
        exists: &dyn Fn(&str) -> bool,
    ) -> Result<HoldChange, HoldError> {
        self.set_with(name, hold, exists, &kept_nowhere)
    }

    fn adopt(&self, records: Vec<HoldRecord>, exists: &dyn Fn(&str) -> bool) -> Vec<HoldRecord> {
        self.adopt_with(records, exists, &kept_nowhere)
    }

    fn retain(&self, keep: &dyn Fn(&str) -> bool) -> Vec<String> {
        self.retain_with(keep, &kept_nowhere)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(_: &str) -> bool {
        true
    }

    fn previous(holds: &MemoryHolds, name: &str, hold: Option<AdminHold>) -> Option<AdminHold> {
        holds.set(name, hold, &any).expect("a known key").previous
    }

    #[test]
    fn a_hold_is_set_replaced_and_lifted_by_name() {
        let holds = MemoryHolds::new("");
        assert_eq!(holds.get("a"), None);
        assert_eq!(previous(&holds, "a", Some(AdminHold::Draining)), None);
        assert_eq!(holds.get("a"), Some(AdminHold::Draining));
        assert_eq!(holds.get("b"), None);
        assert_eq!(
            previous(&holds, "a", Some(AdminHold::Disabled)),
            Some(AdminHold::Draining)
        );
        assert_eq!(holds.get("a"), Some(AdminHold::Disabled));
        assert_eq!(previous(&holds, "a", None), Some(AdminHold::Disabled));
        assert_eq!(holds.get("a"), None);
        assert_eq!(previous(&holds, "a", None), None, "lifting nothing is fine");
        assert!(!holds.any.load(Ordering::Relaxed), "the fast path is back");
    }

    #[test]
    fn every_change_gets_a_larger_version_and_a_lift_is_recorded() {
        let holds = MemoryHolds::new("kr-1");
        let first = holds.set("a", Some(AdminHold::Disabled), &any).unwrap();
        let second = holds.set("b", Some(AdminHold::Draining), &any).unwrap();
        let lift = holds.set("a", None, &any).unwrap();
        assert!(first.record.version >= unix_ms() - 60_000, "unix ms");
        assert!(second.record.version > first.record.version);
        assert!(lift.record.version > second.record.version);
        assert_eq!(lift.record.by, "kr-1");
        let mut records = holds.records();
        records.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(records, [lift.record, second.record]);
    }

    #[test]
    fn a_name_that_does_not_exist_is_refused_and_changes_nothing() {
        let holds = MemoryHolds::new("");
        assert!(matches!(
            holds.set("ghost", Some(AdminHold::Disabled), &|n| n == "a"),
            Err(HoldError::NoSuchKey)
        ));
        assert_eq!(holds.get("ghost"), None);
        assert!(holds.records().is_empty());
        assert!(!holds.any.load(Ordering::Relaxed));
    }

    #[test]
    fn a_change_that_cannot_be_kept_is_not_applied() {
        let holds = MemoryHolds::new("");
        let full = |_: &HashMap<String, HoldRecord>| {
            Err(HoldError::Persist {
                file: PathBuf::from("holds"),
                source: std::io::Error::other("disk full"),
            })
        };
        let result = holds.set_with("a", Some(AdminHold::Disabled), &any, &full);
        assert!(matches!(result, Err(HoldError::Persist { .. })));
        assert_eq!(holds.get("a"), None);
        assert!(holds.records().is_empty());
    }

    #[test]
    fn retain_drops_the_holds_of_removed_keys_only() {
        let holds = MemoryHolds::new("");
        holds.set("a", Some(AdminHold::Disabled), &any).unwrap();
        holds.set("b", Some(AdminHold::Draining), &any).unwrap();
        holds.set("c", None, &any).unwrap();
        assert_eq!(
            holds.retain(&|n| n == "b"),
            vec!["a".to_owned()],
            "c's lift goes too, unreported"
        );
        assert_eq!(holds.get("a"), None);
        assert_eq!(holds.get("b"), Some(AdminHold::Draining));
        assert_eq!(holds.records().len(), 1);
        holds.retain(&|_| false);
        assert!(!holds.any.load(Ordering::Relaxed), "the fast path is back");
    }

    fn record(name: &str, hold: Option<AdminHold>, version: u64, by: &str) -> HoldRecord {
        HoldRecord {
            name: name.to_owned(),
            hold,
            version,
            by: by.to_owned(),
        }
    }

    #[test]
    fn adopting_takes_newer_records_only_and_a_newer_lift_beats_an_older_hold() {
        let holds = MemoryHolds::new("kr-1");
        let disabled = record("a", Some(AdminHold::Disabled), 100, "kr-2");
        assert_eq!(
            holds.adopt(vec![disabled.clone()], &any),
            vec![disabled.clone()]
        );
        assert_eq!(holds.get("a"), Some(AdminHold::Disabled));
        // The same record again (every sync finds it): nothing new.
        assert!(holds.adopt(vec![disabled.clone()], &any).is_empty());
        // A lift made later wins; the older hold put back after it does not.
        let lift = record("a", None, 200, "kr-3");
        assert_eq!(holds.adopt(vec![lift.clone()], &any), vec![lift]);
        assert_eq!(holds.get("a"), None);
        assert!(holds.adopt(vec![disabled], &any).is_empty());
        assert_eq!(holds.get("a"), None);
        // One version, two replicas: the larger name wins wherever they meet.
        let tie = record("a", Some(AdminHold::Draining), 200, "kr-9");
        assert_eq!(holds.adopt(vec![tie], &any).len(), 1);
        assert_eq!(holds.get("a"), Some(AdminHold::Draining));
        // A name this replica does not configure is not taken.
        let other = record("z", Some(AdminHold::Disabled), 300, "kr-2");
        assert!(holds.adopt(vec![other], &|n| n == "a").is_empty());
        assert_eq!(holds.get("z"), None);
        // A change made here after an adopted one is newer than it, whatever the clock says.
        let future = record("b", Some(AdminHold::Disabled), u64::MAX / 2, "kr-2");
        holds.adopt(vec![future.clone()], &any);
        let change = holds.set("b", None, &any).unwrap();
        assert!(change.record.supersedes(&future));
    }

    #[test]
    fn states_have_labels_a_lift_included() {
        for hold in [None, Some(AdminHold::Disabled), Some(AdminHold::Draining)] {
            assert_eq!(parse_state(state_label(hold)), Some(hold));
        }
        assert_eq!(state_label(None), "enabled");
        assert_eq!(parse_state("paused"), None);
    }
}
