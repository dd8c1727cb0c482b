//! Holds kept in `data_dir` (`admin-holds.json`), so that a restart, even after `kill -9`,
//! keeps every disable and drain the operator was told succeeded. The whole table is
//! rewritten at each change (one small file; changes are an operator's calls), through
//! `atomic_file::replace`: a crash leaves the old table or the new one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{
    parse_state, state_label, AdminHold, HoldChange, HoldError, HoldRecord, HoldStore, MemoryHolds,
};

/// The file's name in `data_dir`.
pub const FILE: &str = "admin-holds.json";

/// Why the holds file could not be read at start.
#[derive(Debug, thiserror::Error)]
pub enum HoldsFileError {
    #[error("cannot read the holds in {}: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not started without them: a disabled key would silently go back into rotation.
    #[error("the holds in {} are not valid ({reason}); fix or remove the file", file.display())]
    Invalid { file: PathBuf, reason: String },
}

/// Holds in memory, with every change written to a file first.
#[derive(Debug)]
pub struct FileHolds {
    table: MemoryHolds,
    file: PathBuf,
}

/// The file's contents.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Contents {
    holds: Vec<Line>,
}

/// One record in the file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    key: String,
    /// `disabled`, `draining`, or `enabled` for a lift.
    state: String,
    version: u64,
    #[serde(default)]
    by: String,
}

impl FileHolds {
    /// The holds kept in `dir`, if any, for changes made by `origin` from now on. Those of
    /// keys `configured` refuses are dropped, each with a log line, as a reload drops them.
    ///
    /// # Errors
    /// The file exists but cannot be read or is not one this module wrote.
    pub fn open(
        dir: &Path,
        origin: &str,
        configured: &dyn Fn(&str) -> bool,
    ) -> Result<FileHolds, HoldsFileError> {
        let file = dir.join(FILE);
        let records = match std::fs::read(&file) {
            Ok(bytes) => parse(&bytes).map_err(|reason| HoldsFileError::Invalid {
                file: file.clone(),
                reason,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(HoldsFileError::Read { file, source }),
        };
        let read = records.len();
        let mut kept = Vec::with_capacity(read);
        for record in records {
            if configured(&record.name) {
                kept.push(record);
            } else if let Some(hold) = record.hold {
                tracing::info!(key = %record.name, hold = hold.label(), "the key is no longer configured; its admin hold is dropped");
            }
        }
        let held = kept.iter().filter(|r| r.hold.is_some()).count();
        if held > 0 {
            tracing::info!(held, file = %file.display(), "admin holds read back");
        }
        let holds = FileHolds {
            table: MemoryHolds::with_records(origin, kept),
            file,
        };
        if holds.table.read().len() < read {
            // Written back without them: a key of that name added back later, before any
            // other change, must not find the old hold in the file.
            if let Err(e) = holds.save(&holds.table.read()) {
                tracing::warn!(error = %e, "the holds of removed keys could not be dropped from disk");
            }
        }
        Ok(holds)
    }

    /// Where the holds are kept.
    pub fn file(&self) -> &Path {
        &self.file
    }

    fn save(&self, records: &HashMap<String, HoldRecord>) -> Result<(), HoldError> {
        let mut holds: Vec<Line> = records
            .values()
            .map(|r| Line {
                key: r.name.clone(),
                state: state_label(r.hold).to_owned(),
                version: r.version,
                by: r.by.clone(),
            })
            .collect();
        // Sorted, so the same holds always make the same file.
        holds.sort_by(|a, b| a.key.cmp(&b.key));
        let text = serde_json::to_vec_pretty(&Contents { holds }).expect("holds serialise");
        crate::atomic_file::replace(&self.file, &text).map_err(|source| HoldError::Persist {
            file: self.file.clone(),
            source,
        })
    }
}

fn parse(bytes: &[u8]) -> Result<Vec<HoldRecord>, String> {
    let contents: Contents = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    contents
        .holds
        .into_iter()
        .map(|line| {
            let hold = parse_state(&line.state)
                .ok_or_else(|| format!("key {:?}: unknown state {:?}", line.key, line.state))?;
            Ok(HoldRecord {
                name: line.key,
                hold,
                version: line.version,
                by: line.by,
            })
        })
        .collect()
}

impl HoldStore for FileHolds {
    fn get(&self, name: &str) -> Option<AdminHold> {
        self.table.get(name)
    }

    fn records(&self) -> Vec<HoldRecord> {
        self.table.records()
    }

    fn set(
        &self,
        name: &str,
        hold: Option<AdminHold>,
        exists: &dyn Fn(&str) -> bool,
    ) -> Result<HoldChange, HoldError> {
        self.table
            .set_with(name, hold, exists, &|records| self.save(records))
    }

    fn adopt(&self, records: Vec<HoldRecord>, exists: &dyn Fn(&str) -> bool) -> Vec<HoldRecord> {
        self.table
            .adopt_with(records, exists, &|records| self.save(records))
    }

    fn retain(&self, keep: &dyn Fn(&str) -> bool) -> Vec<String> {
        self.table.retain_with(keep, &|records| self.save(records))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(_: &str) -> bool {
        true
    }

    #[test]
    fn holds_and_lifts_are_read_back_as_they_were_written() {
        let dir = tempfile::tempdir().expect("temp dir");
        let holds = FileHolds::open(dir.path(), "kr-1", &any).expect("no file yet");
        holds.set("a", Some(AdminHold::Disabled), &any).unwrap();
        holds.set("b", Some(AdminHold::Draining), &any).unwrap();
        holds.set("c", Some(AdminHold::Draining), &any).unwrap();
        holds.set("c", None, &any).unwrap();
        let mut before = holds.records();
        drop(holds);
        let again = FileHolds::open(dir.path(), "kr-1", &any).expect("the file");
        assert_eq!(again.get("a"), Some(AdminHold::Disabled));
        assert_eq!(again.get("b"), Some(AdminHold::Draining));
        assert_eq!(again.get("c"), None);
        let mut after = again.records();
        before.sort_by(|x, y| x.name.cmp(&y.name));
        after.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(before, after, "versions and lifts too");
        assert!(!crate::atomic_file::tmp_path(again.file()).exists());
    }

    #[test]
    fn the_holds_of_keys_no_longer_configured_are_dropped_at_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let holds = FileHolds::open(dir.path(), "", &any).unwrap();
        holds.set("a", Some(AdminHold::Disabled), &any).unwrap();
        holds.set("gone", Some(AdminHold::Disabled), &any).unwrap();
        drop(holds);
        let again = FileHolds::open(dir.path(), "", &|n| n == "a").unwrap();
        assert_eq!(again.get("a"), Some(AdminHold::Disabled));
        assert_eq!(again.get("gone"), None);
        assert_eq!(again.records().len(), 1);
        // Gone from the file too: configured again, the key starts without its old hold.
        drop(again);
        let later = FileHolds::open(dir.path(), "", &any).unwrap();
        assert_eq!(later.get("gone"), None);
        assert_eq!(later.get("a"), Some(AdminHold::Disabled));
    }

    #[test]
    fn a_change_that_cannot_be_written_is_refused_and_not_applied() {
        let dir = tempfile::tempdir().expect("temp dir");
        let holds = FileHolds::open(dir.path(), "", &any).unwrap();
        holds.set("a", Some(AdminHold::Draining), &any).unwrap();
        // A directory where the file goes: the rename over it fails.
        std::fs::remove_file(holds.file()).unwrap();
        std::fs::create_dir(holds.file()).unwrap();
        std::fs::write(holds.file().join("x"), b"x").unwrap();
        let refused = holds.set("a", Some(AdminHold::Disabled), &any);
        assert!(
            matches!(&refused, Err(HoldError::Persist { file, .. }) if file == holds.file()),
            "{refused:?}"
        );
        assert_eq!(holds.get("a"), Some(AdminHold::Draining), "unchanged");
        assert!(holds.set("b", None, &any).is_err());
        assert_eq!(holds.records().len(), 1);
    }

    #[test]
    fn a_file_this_module_did_not_write_stops_the_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join(FILE);
        for bad in [
            &b"not json"[..],
            br#"{"holds":[{"key":"a","state":"paused","version":1}]}"#,
            br#"{"holds":[],"extra":1}"#,
        ] {
            std::fs::write(&file, bad).unwrap();
            let error = FileHolds::open(dir.path(), "", &any).expect_err("invalid");
            assert!(matches!(error, HoldsFileError::Invalid { .. }), "{error:?}");
        }
        std::fs::write(&file, br#"{"holds":[]}"#).unwrap();
        assert!(FileHolds::open(dir.path(), "", &any).is_ok());
    }
}
