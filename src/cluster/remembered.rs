//! The fleet as this replica last saw it, kept in `data_dir`, so that a replica restarted
//! while Redis is away still takes only its share of each key, not every thread.

use std::path::{Path, PathBuf};

/// The file's name in `data_dir`.
pub const FILE: &str = "cluster-fleet";

/// More names than this are not a fleet this file wrote.
const MAX_REPLICAS: usize = 10_000;

/// Where the fleet is remembered, if there is a `data_dir`.
pub fn path(data_dir: Option<&Path>) -> Option<PathBuf> {
    data_dir.map(|dir| dir.join(FILE))
}

/// The replica names last saved, sorted; empty if there is no file or it is not one this
/// module wrote (a replica then starts as if alone, as it would without `data_dir`).
pub fn load(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    if names.len() > MAX_REPLICAS {
        return Vec::new();
    }
    names.sort();
    names.dedup();
    names
}

/// Saves the live replicas, atomically (a crash leaves the old file or the new one), off
/// the runtime's threads.
pub async fn save(path: &Path, live: &[String]) -> std::io::Result<()> {
    let mut text = live.join("\n");
    text.push('\n');
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || crate::atomic_file::replace(&path, text.as_bytes()))
        .await
        .map_err(std::io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_is_saved_is_loaded_sorted_and_a_missing_file_is_an_empty_fleet() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join(FILE);
        assert!(load(&file).is_empty());
        save(&file, &["kr-2".to_owned(), "kr-1".to_owned()])
            .await
            .expect("save");
        assert_eq!(load(&file), vec!["kr-1".to_owned(), "kr-2".to_owned()]);
        save(&file, &["kr-3".to_owned()]).await.expect("save");
        assert_eq!(load(&file), vec!["kr-3".to_owned()]);
        assert!(!file.with_extension("tmp").exists());
    }

    #[test]
    fn a_file_this_module_did_not_write_is_ignored() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join(FILE);
        std::fs::write(&file, "x\n".repeat(MAX_REPLICAS + 1)).expect("write");
        // Duplicates collapse, but too many lines is not a fleet.
        assert!(load(&file).is_empty());
        std::fs::write(&file, [0xffu8, 0xfe]).expect("write");
        assert!(load(&file).is_empty(), "not UTF-8");
    }
}
