//! Background refresh: every `refresh_interval`, read each key's balance and thread usage,
//! bench keys the service rejects, and bring benched keys back once they prove usable.
//! A failed read makes a figure unknown; it never reads as a zero balance. Keys the operator
//! disabled are left alone; draining keys are read like the others.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use std::sync::atomic::Ordering;

use crate::app::App;
use crate::captcha::ThreadsInfo;
use crate::cluster::{Cluster, Readings};
use crate::failover::{self, ReadError};
use crate::pool::KeyEntry;

/// Runs refreshes until the task is dropped: one now, then one per interval.
pub async fn run(app: App) {
    loop {
        // In a cluster one replica reads for the fleet (the refresher lease); the others
        // adopt its readings. Without Redis every replica reads for itself.
        if app.cluster().is_none_or(|cluster| cluster.is_refresher()) {
            refresh_all(&app).await;
        }
        let interval = app.snapshot().config.refresh_interval;
        tokio::time::sleep(interval).await;
    }
}

/// [`refresh_all`] for a spawned task.
pub async fn refresh_all_owned(app: App) {
    refresh_all(&app).await;
}

/// Reads every key of the current pool concurrently and applies what was learned.
pub async fn refresh_all(app: &App) {
    if app.upstream_paused().is_some() {
        tracing::debug!("refresh skipped: upstream traffic is paused after an IP ban");
        return;
    }
    let snapshot = app.snapshot();
    let timeout = snapshot.config.timeouts.refresh;
    app.metrics().refresh_runs.inc();
    let pool = &snapshot.pool;
    join_all(pool.askable().map(|key| refresh_key(app, key, timeout))).await;
    // New capacity figures or restored keys may give queued submits somewhere to go.
    app.capacity().nudge();
    let active = snapshot.pool.active_count(Instant::now());
    tracing::debug!(
        active,
        configured = snapshot.pool.keys().len(),
        "refresh done"
    );
}

/// The refresher's readings of a key, for the fleet: the service's threads, and what it
/// works on beyond the fleet's own leases (counted just after the read, so it errs low).
async fn share_readings(
    cluster: &Cluster,
    key: &KeyEntry,
    balance: Option<f64>,
    threads: Option<ThreadsInfo>,
) {
    let mut external = 0;
    if let (Some(info), Ok(held)) = (threads, cluster.held(&key.name).await) {
        external = info.working_threads.saturating_sub(held);
    }
    key.stats.shared.external.store(external, Ordering::Relaxed);
    let readings = Readings {
        balance,
        threads: threads.map(|t| (t.threads, t.working_threads)),
        external,
    };
    cluster.publish_readings(&key.name, readings).await;
}

/// Reads one key's balance and threads and applies what was learned: the background round's
/// work for one key, and what an operator's forced refresh runs.
pub async fn refresh_key(app: &App, key: &KeyEntry, timeout: Duration) {
    let client = app.client();
    let balance = client.read_balance(key.account(), timeout).await;
    // Any answer shows the service reachable: a provider that was down is back, even
    // before a caller's request tries it.
    if !matches!(balance, Err(ReadError::Unavailable)) {
        app.provider_answered(key.provider);
    }
    if balance.is_err() {
        app.metrics()
            .refresh_failures
            .with_label_values(&[key.name.as_str()])
            .inc();
    }
    key.stats.set_balance(balance.as_ref().ok().copied());
    let mut threads = None;
    if !matches!(balance, Err(ReadError::KeyRejected(_))) {
        // threadsinfo is CaptchaAI's own action; other services may not answer it. The mark
        // notes what keyrelay has in flight before the service is asked.
        let mark = app.capacity().mark(key.id);
        threads = client.read_threads(key.account(), timeout).await.ok();
        key.stats
            .set_threads(threads.map(|t| (t.threads, t.working_threads)));
        match (threads, app.cluster()) {
            // The service's `working` counts every replica's tasks: in shared mode only
            // the fleet's lease count can be taken from it.
            (info, Some(cluster)) if cluster.is_shared() => {
                // A reading taken while Redis was away counted the others' tasks as outside
                // load: the shared count has them now.
                app.capacity().forget_external(key.id);
                share_readings(cluster, key, balance.as_ref().ok().copied(), info).await;
            }
            // Alone, or degraded: a replica whose tasks outnumber everything the service
            // works on learns that some of them ended (their final answers may have been
            // polled on other replicas, which cannot say so while Redis is away).
            (Some(info), cluster) => {
                app.reconcile_threads(key, info.working_threads, mark);
                if let Some(cluster) = cluster {
                    cluster.forget_others(&key.name);
                    // Submits waiting for that reading may take the share now.
                    app.capacity().nudge();
                }
            }
            (None, Some(cluster)) => cluster.cannot_read(&key.name),
            (None, None) => {}
        }
    } else if let Some(cluster) = app.cluster().filter(|c| c.is_shared()) {
        share_readings(cluster, key, None, None).await;
    }
    let snapshot = app.snapshot();
    let state = app.health().view(key.id, Instant::now()).state;
    if let Some(event) = failover::on_refresh(state, &balance, threads, &snapshot.config.failover) {
        app.record_health(key, event);
    }
}
