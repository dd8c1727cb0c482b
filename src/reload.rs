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
use crate::pool::KeyPool;
use crate::refresh;
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
    Ok(apply(app, config)?)
}

/// Swaps in a new configuration: the pool is built off to the side, keys that keep their
/// name, value and upstream keep their id, health and learned figures, and one atomic
/// store makes the change. Requests in flight finish on the snapshot they loaded.
/// Settings that only take effect at start keep their running values and are reported.
///
/// # Errors
/// [`RegistryFull`]; the running configuration is then untouched.
pub fn apply(app: &App, mut config: Config) -> Result<Applied, RegistryFull> {
    let old = app.snapshot();
    let needs_restart = keep_start_only_settings(&old.config, &mut config);
    let pool = app.build_pool(&config)?;
    let names =
        |pool: &KeyPool| -> Vec<String> { pool.keys().iter().map(|k| k.name.clone()).collect() };
    let (before, after) = (names(&old.pool), names(&pool));
    let applied = Applied {
        added: after
            .iter()
            .filter(|n| !before.contains(n))
            .cloned()
            .collect(),
        kept: after
            .iter()
            .filter(|n| before.contains(n))
            .cloned()
            .collect(),
        removed: before
            .iter()
            .filter(|n| !after.contains(n))
            .cloned()
            .collect(),
        needs_restart,
    };
    app.install(app.snapshot_of(config, pool));
    if !applied.added.is_empty() {
        // New keys have no balance yet; read it now rather than at the next round.
        tokio::spawn(refresh::refresh_all_owned(app.clone()));
    }
    Ok(applied)
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

/// Settings fixed at start (the listener, the connection pool, the pin store): the new
/// config gets the running values back, so what `/status` and the pool report is what runs.
/// Returns the names of those that the file changed.
fn keep_start_only_settings(running: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if new.listen != running.listen {
        changed.push("listen");
        new.listen = running.listen;
    }
    if new.admin.listen != running.admin.listen {
        changed.push("admin.listen");
        new.admin.listen = running.admin.listen;
    }
    // Bound, issued or read once at start: the TLS listener, the CA, the hosts the forward
    // proxy intercepts, and whether an open listener is allowed (checked against the
    // listeners, which a reload cannot move either).
    if format!("{:?}", new.tls) != format!("{:?}", running.tls) {
        changed.push("tls");
        new.tls = running.tls.clone();
    }
    if new.ca.files != running.ca.files {
        changed.push("ca");
        new.ca = running.ca.clone();
    }
    if new.forward.intercept != running.forward.intercept {
        changed.push("forward.intercept");
        new.forward.intercept = running.forward.intercept.clone();
    }
    if new.access.open != running.access.open {
        changed.push("access.open");
        new.access.open = running.access.open;
    }
    // The cluster's connection, name and timings are the process's for its life.
    if new.cluster != running.cluster {
        changed.push("cluster");
        new.cluster = running.cluster.clone();
    }
    // The upstream client's trust roots are read once, when it is built.
    if new.upstream_ca != running.upstream_ca {
        changed.push("upstream_ca");
        new.upstream_ca = running.upstream_ca.clone();
    }
    // So are its connector and the proxy it dials through.
    if new.upstream_proxy != running.upstream_proxy {
        let (new_proxy, old_proxy) = (new.upstream_proxy.as_ref(), running.upstream_proxy.as_ref());
        let same_proxy = match (new_proxy, old_proxy) {
            (Some(a), Some(b)) => a.same_proxy(b),
            _ => false,
        };
        changed.push(if same_proxy {
            "upstream_no_proxy"
        } else {
            "upstream_proxy"
        });
        new.upstream_proxy = running.upstream_proxy.clone();
    }
    if new.timeouts.connect != running.timeouts.connect {
        changed.push("timeouts.connect");
        new.timeouts.connect = running.timeouts.connect;
    }
    if new.pins.ttl != running.pins.ttl || new.pins.max_pins != running.pins.max_pins {
        changed.push("pins");
        // The probe budget is read on every probe, so it applies live.
        let probe = (new.pins.probe_rate, new.pins.probe_burst);
        new.pins = running.pins.clone();
        (new.pins.probe_rate, new.pins.probe_burst) = probe;
    }
    changed
}
