//! Live reload of `proxy.toml`, on SIGHUP and when the file changes: the new pool is built
//! off to the side and swapped in at once; an invalid file is logged and changes nothing.
//!
//! The file is polled rather than watched with inotify: editors replace files by rename,
//! and Kubernetes swaps ConfigMaps through symlinks, both of which inotify watches on the
//! file itself miss. Reading a small file once a second costs nothing.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::app::App;
use crate::config::{Config, ConfigError};
use crate::metrics::ReloadResult;
use crate::registry::RegistryFull;

/// How often the file is checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub struct Applied {
    /// Key names new to the pool, kept (possibly with new settings), and removed.
    pub added: Vec<String>,
    pub kept: Vec<String>,
    pub removed: Vec<String>,
    /// Settings that changed in the file but only take effect after a restart.
    pub needs_restart: Vec<&'static str>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Registry(#[from] RegistryFull),
}

/// Reads, validates and applies the file at `path`.
///
/// # Errors
/// The file is unreadable or invalid, or the key registry is full; the running config is
/// then untouched.
pub fn reload_file(app: &App, path: &Path) -> Result<Applied, ReloadError> {
    let config = Config::load(path)?;
    Ok(app.apply_config(config)?)
}

/// Reloads on SIGHUP and whenever the file's content changes, until the task is dropped.
/// The file's content is taken as the baseline when this is called, not when the returned
/// future first runs, so a change made right after spawning it is not missed.
/// SIGHUP is handled from the moment this returns (it must run inside the runtime), so a
/// signal sent right after start cannot kill the process with the default action.
pub fn watch(app: App, path: PathBuf) -> impl std::future::Future<Output = ()> + Send {
    let last = fingerprint(&path);
    let hangup = hangup_signal();
    watch_from(app, path, last, hangup)
}

async fn watch_from(app: App, path: PathBuf, mut last: Option<u64>, mut hangup: Hangup) {
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let cause = tokio::select! {
            _ = tick.tick() => {
                let now = fingerprint(&path);
                if now == last {
                    continue;
                }
                last = now;
                "file changed"
            }
            () = next_hangup(&mut hangup) => {
                last = fingerprint(&path);
                "SIGHUP"
            }
        };
        reload_and_report(&app, &path, cause);
    }
}

/// Applies the file and says what happened, in logs and metrics.
pub fn reload_and_report(app: &App, path: &Path, cause: &'static str) {
    let result = match reload_file(app, path) {
        Ok(applied) => {
            tracing::info!(
                cause,
                added = ?applied.added,
                removed = ?applied.removed,
                kept = applied.kept.len(),
                "config reloaded"
            );
            if !applied.needs_restart.is_empty() {
                tracing::warn!(
                    settings = ?applied.needs_restart,
                    "changed settings take effect only after a restart"
                );
            }
            ReloadResult::Applied
        }
        Err(e) => {
            tracing::warn!(cause, error = %e, "config reload rejected; keeping the running config");
            ReloadResult::Rejected
        }
    };
    app.metrics().count_reload(result);
}

/// A cheap content fingerprint; `None` while the file cannot be read (mid-rename, say), so
/// its reappearance counts as a change.
fn fingerprint(path: &Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    Some(hasher.finish())
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = ();

#[cfg(unix)]
fn hangup_signal() -> Hangup {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; reloading on file changes only");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangup_signal() -> Hangup {}

#[cfg(unix)]
async fn next_hangup(hangup: &mut Hangup) {
    match hangup {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn next_hangup(_: &mut Hangup) {
    std::future::pending().await
}
