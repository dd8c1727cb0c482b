//! Build script: stamps the git commit keyrelay was built from into `KEYRELAY_COMMIT`, for
//! `--version` and the `keyrelay_build_info` metric. Plain `git` rather than a crate such
//! as vergen: one short call is all this needs. A packaged copy (`cargo package`, and so
//! `cargo install` from a registry) has no `.git`, but cargo records the commit it was
//! packaged from in `.cargo_vcs_info.json`, which is read instead.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable a build without `.git` (a tarball, a Docker context) passes the commit in.
const COMMIT_VAR: &str = "KEYRELAY_GIT_COMMIT";

/// Where `cargo package` records, in the packaged copy, the commit it packaged.
const VCS_INFO: &str = ".cargo_vcs_info.json";

fn main() {
    println!("cargo:rerun-if-env-changed={COMMIT_VAR}");
    let commit = from_package()
        .or_else(from_git)
        .or_else(from_env)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=KEYRELAY_COMMIT={commit}");
}

/// The commit `cargo package` recorded in the packaged copy. Read before asking git: a
/// packaged copy is no checkout, and git run there answers for whatever repository happens
/// to enclose it (the checkout around `target/package/`, a home directory under version
/// control), which need not be the commit packaged. The file is cargo's small JSON
/// (`{"git": {"sha1": "…"}, …}`), read without a JSON parser; only a plain hex id is taken.
///
/// Watched by its path relative to the package, which cargo resolves in whichever copy
/// builds next: `cargo package` verifies its copy under the same artifact names as the
/// checkout's own build, and a checkout, which lacks the file, must then rerun this script
/// rather than keep the packaged copy's commit.
fn from_package() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let info = std::fs::read_to_string(dir.join(VCS_INFO)).ok()?;
    println!("cargo:rerun-if-changed={VCS_INFO}");
    let value = info.split("\"sha1\"").nth(1)?.split('"').nth(1)?;
    let hex =
        !value.is_empty() && value.len() <= 40 && value.chars().all(|c| c.is_ascii_hexdigit());
    hex.then(|| value[..value.len().min(12)].to_ascii_lowercase())
}

/// `git rev-parse --short=12 HEAD`, and reruns when HEAD moves: `HEAD` itself (a checkout)
/// and the ref it names (a commit), wherever a worktree keeps them.
fn from_git() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]).map(PathBuf::from) {
        watch(&git_dir.join("HEAD"));
    }
    let common = git(&["rev-parse", "--git-common-dir"]).map(PathBuf::from);
    if let (Some(common), Some(reference)) = (common, git(&["symbolic-ref", "-q", "HEAD"])) {
        // The branch's loose ref, where a commit writes; after `git gc` it may live only in
        // packed-refs, and then its directory is watched for the loose file's return.
        let loose = common.join(&reference);
        match loose.parent().filter(|_| !loose.exists()) {
            Some(directory) => watch(directory),
            None => watch(&loose),
        }
        let packed = common.join("packed-refs");
        if packed.exists() {
            watch(&packed);
        }
    }
    Some(commit)
}

/// Reruns the script when `path` changes. Only paths that exist: cargo takes a missing one
/// for changed on every build, which would rebuild (and, in release, relink) keyrelay each
/// time.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// The commit handed in by the builder; anything but a plain hex id is ignored, since it
/// ends up in a metric label.
fn from_env() -> Option<String> {
    let value = std::env::var(COMMIT_VAR).ok()?;
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.len() > 40 || !value.chars().all(|c| c.is_ascii_hexdigit()) {
        println!("cargo:warning={COMMIT_VAR}={value:?} is not a git commit id; ignored");
        return None;
    }
    Some(value[..value.len().min(12)].to_ascii_lowercase())
}

/// One git command's trimmed output, or `None` where git or a repository is missing.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}
