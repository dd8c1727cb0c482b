//! Every long-running background task of a serving keyrelay, started in one place
//! ([`start`]) and stopped in one ([`Background::stop`]). Work a request or an event starts
//! and that ends by itself (a verdict's check, a publish to Redis, a reload's refresh, an
//! admin call's reads) is spawned where it arises, not here.
//!
//! The tasks, each for as long as the server runs:
//!
//! - `refresh::run`: reads every key's balance and threads (`[refresh] interval`).
//! - `fleet::run`: a cluster replica's heartbeat and sync; returns at once without one.
//! - [`sweep_pins`]: drops expired pins and the probe's expired misses, compacting the pin
//!   journal as it goes (`PIN_SWEEP_INTERVAL`).
//! - [`sync_pins`]: forces recorded pins to disk (`PIN_SYNC_INTERVAL`), and once more at
//!   the stop.
//! - [`release_stale`]: gives back the threads of tasks nobody polled to the end, and drops
//!   kept answers past their time.
//! - [`save_budgets`]: saves what caller tokens spent in `data_dir`
//!   (`BUDGET_SAVE_INTERVAL`), and once more at the stop.
//! - [`poll_orphans`]: polls the tasks their callers left, so that their threads come back
//!   when the service is done with them (`[polling] orphan_after`).
//! - the server's header timer, the coarse clock of `limits.header_timeout`.
//! - with [`Watchers::config`], `reload::watch`: reloads `proxy.toml` on change and SIGHUP.
//! - with [`Watchers::cert`], `ListenerCert::watch`: reloads the `[tls]` certificate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::app::App;
use crate::fleet::{self, Seen};
use crate::polling::Pace;
use crate::proxy::poll_orphan;
use crate::refresh;
use crate::tls::ListenerCert;

/// How often recorded pins are forced to disk: the power-loss window.
const PIN_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// How often expired pins are dropped.
const PIN_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// How often tasks past `capacity.stale_after` give their threads back: a small fraction of
/// the default five minutes, and a cheap look at the front of a queue.
const STALE_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// How often the orphans due are looked for: their polls follow the shaped cadence in
/// seconds, and a look walks every open task.
const ORPHAN_TICK: Duration = Duration::from_secs(1);

/// How often a changed budgets ledger is saved.
const BUDGET_SAVE_INTERVAL: Duration = Duration::from_secs(2);

/// The files a server started from them keeps reloading; none for one a test builds.
#[derive(Default)]
pub struct Watchers {
    /// `proxy.toml`'s watcher, made with `reload::watch` before the "listening" line, since
    /// making it installs the SIGHUP handler.
    pub config: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// The `[tls]` listener's certificate.
    pub cert: Option<Arc<ListenerCert>>,
}

/// The running tasks.
pub struct Background {
    app: App,
    tasks: JoinSet<()>,
}

/// Starts every background task (see the module's list). `seen` is what `fleet::join` found
/// before the listeners opened; `header_timer` is the server's timer loop.
pub fn start(
    app: &App,
    seen: Seen,
    header_timer: impl Future<Output = ()> + Send + 'static,
    watchers: Watchers,
) -> Background {
    let mut tasks = JoinSet::new();
    tasks.spawn(refresh::run(app.clone()));
    tasks.spawn(fleet::run(app.clone(), seen));
    tasks.spawn(sweep_pins(app.clone()));
    tasks.spawn(sync_pins(app.clone()));
    tasks.spawn(release_stale(app.clone()));
    tasks.spawn(poll_orphans(app.clone()));
    tasks.spawn(save_budgets(app.clone()));
    tasks.spawn(header_timer);
    if let Some(config) = watchers.config {
        tasks.spawn(config);
    }
    if let Some(cert) = watchers.cert {
        tasks.spawn(cert.watch());
    }
    Background {
        app: app.clone(),
        tasks,
    }
}

impl Background {
    /// Stops every task, then makes the last pins durable.
    pub async fn stop(mut self) {
        self.tasks.shutdown().await;
        flush_pins(&self.app).await;
        let app = self.app.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || app.save_budgets()).await {
            tracing::error!(error = %e, "cannot save the budgets at the stop");
        }
    }
}

/// Drops expired pins (and the probe's expired misses) now and then. A durable store may
/// compact its journal while sweeping, which is blocking file I/O, so it runs on the
/// blocking pool.
async fn sweep_pins(app: App) {
    let mut tick = tokio::time::interval(PIN_SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        let store = app.clone();
        let now = Instant::now();
        // The probe's misses expire on every probe too; this frees them after a burst of
        // bad ids when no probe follows.
        app.probe().sweep(now);
        if let Ok(dropped) = tokio::task::spawn_blocking(move || store.pins().sweep(now)).await {
            if dropped > 0 {
                tracing::debug!(dropped, "expired pins dropped");
            }
        }
    }
}

/// Gives back the threads of tasks nobody polled to the end: after `capacity.stale_after`
/// (read each round, so a reload applies) an open task no longer counts against its key.
pub async fn release_stale(app: App) {
    let mut tick = tokio::time::interval(STALE_SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        let config = &app.snapshot().config;
        let stale_after = config.capacity.stale_after;
        // Kept answers past their time go, and so do the turns of tasks nobody asked about
        // for as long as their threads are held.
        app.polling()
            .sweep(&config.polling, stale_after, Instant::now());
        let wall = crate::budgets::now();
        let stale_ms = u64::try_from(stale_after.as_millis()).unwrap_or(u64::MAX);
        app.budgets()
            .settle_stale(wall.saturating_sub(stale_ms), wall);
        let Some(cutoff) = Instant::now().checked_sub(stale_after) else {
            continue;
        };
        let released = app.release_stale_threads(cutoff);
        if released.is_empty() {
            continue;
        }
        let snapshot = app.snapshot();
        for key in snapshot.pool.keys() {
            let count = released.iter().filter(|id| **id == key.id).count();
            if count > 0 {
                tracing::info!(key = %key.name, tasks = count, ?stale_after, "stale tasks no longer hold threads");
            }
        }
    }
}

/// Saves the budgets' ledger in `data_dir` every `BUDGET_SAVE_INTERVAL` when it changed (a
/// blocking write, off the request path): the most a crash can take is the interval's
/// counts.
async fn save_budgets(app: App) {
    let mut tick = tokio::time::interval(BUDGET_SAVE_INTERVAL);
    loop {
        tick.tick().await;
        let saver = app.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || saver.save_budgets()).await {
            tracing::warn!(error = %e, "cannot save the budgets; trying again");
        }
    }
}

/// Polls the tasks this process created that nobody has polled for `[polling]
/// orphan_after`, at `orphan_polls_per_second` on average (read each round, so a reload
/// applies), each with its own key, until its final answer. Not while the service bans
/// keyrelay's IP: a poll then would only prolong the ban.
pub async fn poll_orphans(app: App) {
    let mut tick = tokio::time::interval(ORPHAN_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pace = Pace::new(Instant::now());
    loop {
        tick.tick().await;
        let now = Instant::now();
        let snapshot = app.snapshot();
        let polling = &snapshot.config.polling;
        let rate = polling.orphan_polls_per_second;
        let allowed = pace.take(rate, now);
        let due = if app.upstream_paused().is_some() {
            Vec::new()
        } else {
            app.polling().orphans_due(polling, now, allowed)
        };
        pace.give_back(allowed - due.len(), rate);
        for task in due {
            let app = app.clone();
            tokio::spawn(async move { poll_orphan(&app, &task).await });
        }
    }
}

/// Makes recorded pins durable every `PIN_SYNC_INTERVAL` (fsync, off the request path):
/// the most a power loss can take is the pins of the last interval.
async fn sync_pins(app: App) {
    let mut tick = tokio::time::interval(PIN_SYNC_INTERVAL);
    loop {
        tick.tick().await;
        flush_pins(&app).await;
    }
}

async fn flush_pins(app: &App) {
    let store = app.clone();
    match tokio::task::spawn_blocking(move || store.pins().flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "pins could not be synced to disk"),
        Err(e) => tracing::error!(error = %e, "the pin sync task failed"),
    }
}
