//! Replacing a small file so that a crash (`kill -9`, power loss) leaves either the old
//! contents or the new, never a mix or nothing: the state files keyrelay keeps in `data_dir`
//! beside the pin journal (the fleet last seen, the operator's holds). Knows files only.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `contents` to `path`, durably: a temp file beside it is written and fsynced, then
/// renamed over `path`, and the directory is fsynced so that the rename itself survives a
/// crash. Returns only once all of that is on disk; on error `path` is as it was.
///
/// # Errors
/// Any step's I/O error (the directory missing or read-only, a directory where the file or
/// its temp file should be, a full disk).
pub fn replace(path: &Path, contents: &[u8]) -> io::Result<()> {
    let tmp = tmp_path(path);
    let written = File::create(&tmp).and_then(|mut file| {
        file.write_all(contents)?;
        file.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        // Best effort: a temp file left behind is overwritten by the next write anyway.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// The temp file `replace` writes first: the name with `.tmp` added, in the same directory,
/// so that the rename never crosses file systems.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Makes a rename in `dir` durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    // `parent` of a bare file name is "", which no system call takes as a directory.
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    File::open(dir)?.sync_all()
}

/// Directories cannot be opened as files here; the rename is as durable as the OS makes it.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_no_temp_file_stays() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("state");
        replace(&file, b"one").expect("first write");
        replace(&file, b"two").expect("second write");
        assert_eq!(std::fs::read(&file).expect("read"), b"two");
        assert!(!tmp_path(&file).exists());
        assert_eq!(tmp_path(&file), dir.path().join("state.tmp"));
    }

    #[test]
    fn a_failed_write_leaves_the_old_contents() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("state");
        replace(&file, b"old").expect("write");
        // A directory where the temp file goes: the write fails before the rename.
        std::fs::create_dir(tmp_path(&file)).expect("mkdir");
        assert!(replace(&file, b"new").is_err());
        assert_eq!(std::fs::read(&file).expect("read"), b"old");
        // A directory where the file itself goes: the rename fails.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir(&blocked).expect("mkdir");
        std::fs::write(blocked.join("inside"), b"x").expect("write");
        assert!(replace(&blocked, b"new").is_err());
        assert!(!tmp_path(&blocked).exists(), "the temp file is cleaned up");
    }
}
