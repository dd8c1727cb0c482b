//! A cluster replica's background work: the heartbeat (liveness, lease renewal, the
//! refresher lease, and Redis's return), and the sync that adopts what other replicas
//! announced: key health, the refresher's readings and the IP-ban pause.
//!
//! Changes are written to Redis as they happen (`App::record_health`, `pause_upstream`,
//! the refresher's `publish_readings`) and read back here every `sync_interval`, so that a
//! benched key is out of rotation on every replica within one interval of the bench, with
//! no message to be missed.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::app::App;
use crate::cluster::{unix_ms, Cluster, HealthRecord, KeySync, DOWN_RETRY};
use crate::health::{HealthEvent, Reason, StateKind};
use crate::pool::{KeyEntry, KeyPool};
use crate::refresh;

/// How often, at most, a degraded replica with waiting submits asks the service what its
/// keys work on.
const DEGRADED_RECHECK: Duration = Duration::from_secs(2);

/// One heartbeat and one sync, awaited before the listeners accept: a replica that can
/// reach Redis starts in shared mode with the fleet's state, not on a share. Bounded by the
/// Redis timeouts; without Redis it returns at the first failed call.
pub async fn join(app: &App) -> Seen {
    let mut seen = Seen::new();
    let Some(cluster) = app.cluster().cloned() else {
        return seen;
    };
    heartbeat(app, &cluster).await;
    if cluster.is_shared() {
        sync_once(app, &cluster, &mut seen).await;
    }
    seen
}

/// The health version last adopted per key name.
pub type Seen = HashMap<String, u64>;

/// Runs the heartbeat and the sync until the task is dropped; nothing without `[cluster]`.
pub async fn run(app: App, seen: Seen) {
    let Some(cluster) = app.cluster().cloned() else {
        return;
    };
    tokio::join!(heartbeats(&app, &cluster), syncs(&app, &cluster, seen));
}

async fn heartbeats(app: &App, cluster: &Arc<Cluster>) {
    let mut checked: Option<Instant> = None;
    loop {
        let was_shared = cluster.is_shared();
        let ended = heartbeat(app, cluster).await;
        for task in &ended {
            app.finished_elsewhere(task);
        }
        let back = cluster.is_shared() && !was_shared;
        if back {
            // Outside load read while Redis was away counted the others' tasks, which the
            // fleet's count holds again: kept, it would count them twice until the next
            // degraded spell (a refresh in shared mode does not set it).
            for key in app.snapshot().pool.keys() {
                app.capacity().forget_external(key.id);
            }
        }
        // Submits queued while the fleet put its state back may go now.
        if !ended.is_empty() || back {
            app.capacity().nudge();
        }
        if !cluster.is_shared() {
            recheck_threads(app, &mut checked).await;
        }
        let period = if cluster.is_shared() {
            cluster.renew_period()
        } else {
            cluster.renew_period().min(DOWN_RETRY)
        };
        // A script that found Redis's state stale wakes the heartbeat, which puts this
        // replica's state back: until then it serves on its share.
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = cluster.lost() => {}
        }
    }
}

/// One heartbeat over the configured keys; the pins are read from this replica's own
/// store only if Redis lost the fleet's copy.
async fn heartbeat(app: &App, cluster: &Cluster) -> Vec<crate::captcha::TaskId> {
    let snapshot = app.snapshot();
    let keys = key_names(&snapshot.pool);
    let config = &snapshot.config;
    cluster
        .heartbeat(
            &keys,
            config.refresh_interval,
            config.capacity.stale_after,
            || app.pins_to_share(),
        )
        .await
}

/// While Redis is away, a task this replica created and another replica finished still
/// holds its thread here (the release cannot reach it), so its shares fill with tasks that
/// have ended. When submits wait for a thread, the service's own `threadsinfo` is asked
/// (at most every `DEGRADED_RECHECK`): what it no longer works on is given back.
async fn recheck_threads(app: &App, checked: &mut Option<Instant>) {
    let now = Instant::now();
    if app.capacity().queued() == 0
        || checked.is_some_and(|at| now.saturating_duration_since(at) < DEGRADED_RECHECK)
    {
        return;
    }
    *checked = Some(now);
    refresh::refresh_all(app).await;
}

async fn syncs(app: &App, cluster: &Arc<Cluster>, mut seen: Seen) {
    let changed = Notify::new();
    let sync = async {
        loop {
            tokio::select! {
                () = tokio::time::sleep(cluster.config().sync_interval) => {}
                () = changed.notified() => {}
            }
            if cluster.is_shared() {
                sync_once(app, cluster, &mut seen).await;
            }
        }
    };
    tokio::join!(sync, listen(cluster, &changed));
}

/// Wakes the sync whenever another replica announces a change, so that a bench reaches
/// this replica in a round trip rather than a `sync_interval`; resubscribes after any
/// disconnection. The periodic sync covers what is missed meanwhile.
async fn listen(cluster: &Cluster, changed: &Notify) {
    loop {
        if cluster.is_shared() {
            if let Ok(changes) = cluster.changes().await {
                let mut changes = std::pin::pin!(changes);
                while changes.next().await.is_some() {
                    changed.notify_one();
                }
            }
        }
        tokio::time::sleep(DOWN_RETRY).await;
    }
}

/// The configured keys' names, as the cluster's calls take them.
fn key_names(pool: &KeyPool) -> Vec<Arc<str>> {
    pool.keys()
        .iter()
        .map(|key| Arc::from(key.name.as_str()))
        .collect()
}

/// One read of the fleet's shared state, applied here. `seen` holds the health version last
/// adopted per key.
pub async fn sync_once(app: &App, cluster: &Cluster, seen: &mut Seen) {
    let snapshot = app.snapshot();
    let keys = snapshot.pool.keys();
    let names = key_names(&snapshot.pool);
    let Ok(synced) = cluster.sync(&names).await else {
        return;
    };
    let mut freed = false;
    let now = Instant::now();
    let mut shrunk = Vec::new();
    for (key, state) in keys.iter().zip(&synced.keys) {
        if let Some(health) = &state.health {
            let first = !seen.contains_key(&key.name);
            let newer = seen.get(&key.name).is_none_or(|&v| health.version > v);
            if newer {
                seen.insert(key.name.clone(), health.version);
                // This replica's own changes are already applied, except at its first
                // sync: a restarted replica has forgotten what it announced before.
                if health.by != cluster.replica() || first {
                    adopt_health(app, key, health);
                }
            }
        }
        freed |= adopt_counts(&snapshot.pool, cluster, key, state);
        // Spares are for a key that takes tasks and has room for them.
        let limit = snapshot.pool.shared_limit(key);
        if state.held.saturating_add(state.spares) > limit
            || app.health().view(key.id, now).state != StateKind::Active
        {
            shrunk.push(Arc::from(key.name.as_str()));
        }
    }
    cluster.trim_spares(&shrunk).await;
    if let Some(until) = synced.pause_until_ms {
        let left = until.saturating_sub(unix_ms(SystemTime::now()));
        if left > 0 && app.upstream_paused().is_none() {
            app.adopt_pause(Duration::from_millis(left));
        }
    }
    if freed {
        app.capacity().nudge();
    }
    app.sync_holds(cluster).await;
}

/// The refresher's readings, for every other replica; and whether a key the fleet had full
/// has a free thread again.
fn adopt_counts(pool: &KeyPool, cluster: &Cluster, key: &KeyEntry, state: &KeySync) -> bool {
    if !cluster.is_refresher() {
        adopt_readings(key, state);
    }
    key.stats.shared.held.store(state.held, Ordering::Relaxed);
    key.stats
        .shared
        .spares
        .store(state.spares, Ordering::Relaxed);
    let full = key.stats.shared.full_until().is_some();
    let taken = state.held.saturating_add(state.spares);
    if full && taken < pool.shared_limit(key) {
        key.stats.shared.set_full(None);
        return true;
    }
    false
}

/// The refresher's readings of `key`, as a sync found them. The sync finds the same
/// readings every `sync_interval` until the next refresh: only the first time is a new
/// balance reading for the forecast.
fn adopt_readings(key: &KeyEntry, state: &KeySync) {
    let Some(readings) = state.readings else {
        return;
    };
    let fleet = &key.stats.shared;
    let new = fleet.readings_at.swap(state.readings_at, Ordering::Relaxed) != state.readings_at;
    key.stats.adopt_balance(readings.balance, new);
    key.stats.set_threads(readings.threads);
    fleet.external.store(readings.external, Ordering::Relaxed);
}

/// Applies another replica's change of a key's state here, as if this replica had seen
/// the answer itself.
fn adopt_health(app: &App, key: &KeyEntry, shared: &HealthRecord) {
    let now = Instant::now();
    let reason = shared_reason(&shared.reason);
    let local = app.health().view(key.id, now).state;
    let event = match shared.state.as_str() {
        "benched" => HealthEvent::Bench { reason },
        "cooling" => {
            let left = shared.until_ms.saturating_sub(unix_ms(SystemTime::now()));
            if left == 0 {
                return;
            }
            HealthEvent::Cool {
                reason,
                duration: Duration::from_millis(left),
            }
        }
        "active" if local != StateKind::Active => HealthEvent::Restore,
        _ => return,
    };
    if let Some(transition) = app.adopt_health(key, event) {
        tracing::info!(
            key = %key.name,
            by = %shared.by,
            to = transition.to.label(),
            "key state adopted from the fleet"
        );
    }
}

/// The reason another replica wrote, read back; one this version does not write (a newer
/// replica's) still moves the key, as `fleet`.
fn shared_reason(label: &str) -> Reason {
    Reason::parse(label).unwrap_or(Reason::Fleet)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Readings;
    use crate::config::{KeyConfig, Upstream};
    use crate::forecast::Forecast;
    use crate::key_id::KeyId;

    const SYNC: Duration = Duration::from_millis(500);
    const MINUTE: Duration = Duration::from_secs(60);

    fn key() -> KeyEntry {
        let upstream = Upstream::parse("http://127.0.0.1:9").expect("literal");
        let config = KeyConfig::new("a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa0001", upstream);
        KeyEntry::from_config(KeyId(0), &config)
    }

    /// A minute of syncs, each finding the refresher's reading of `balance` published at
    /// `at_ms`, as they do until it reads again.
    async fn a_minute_of_syncs(key: &KeyEntry, balance: f64, at_ms: u64) {
        let state = KeySync {
            readings: Some(Readings {
                balance: Some(balance),
                threads: None,
                external: 0,
            }),
            readings_at: at_ms,
            ..KeySync::default()
        };
        for _ in 0..MINUTE.as_millis() / SYNC.as_millis() {
            adopt_readings(key, &state);
            assert_eq!(key.stats.balance(), Some(balance));
            tokio::time::advance(SYNC).await;
        }
    }

    /// A replica that does not refresh forecasts from the refresher's readings, one per
    /// refresh: recording each sync's copy would keep 64 readings half a second apart, and
    /// the forecast would stay `learning` on every replica but the refresher.
    #[tokio::test(start_paused = true)]
    async fn an_adopted_reading_counts_once_however_often_the_sync_finds_it() {
        let key = key();
        // A refresh a minute, 0.1 spent between each: 6 an hour.
        for minute in 0..=10u32 {
            let balance = 10.0 - 0.1 * f64::from(minute);
            a_minute_of_syncs(&key, balance, 1_000 + u64::from(minute) * 60_000).await;
        }
        let Forecast::Spending { per_hour, .. } = key.stats.forecast(Instant::now()) else {
            panic!(
                "expected spending, got {:?}",
                key.stats.forecast(Instant::now())
            );
        };
        assert!((per_hour - 6.0).abs() < 1e-9, "{per_hour}");

        // A balance that stays put, refresh after refresh, is flat, not learning.
        for minute in 11..=17u32 {
            a_minute_of_syncs(&key, 50.0, 1_000 + u64::from(minute) * 60_000).await;
        }
        assert_eq!(key.stats.forecast(Instant::now()), Forecast::Flat);
    }

    #[test]
    fn a_shared_reason_reads_back_as_written_and_an_unknown_one_as_fleet() {
        for label in ["ERROR_KEY_DOES_NOT_EXIST", "transient", "http_429", "fleet"] {
            assert_eq!(shared_reason(label).label(), label);
        }
        // A newer replica's reason, or none at all, still moves the key.
        assert_eq!(shared_reason("some_newer_reason"), Reason::Fleet);
        assert_eq!(shared_reason(""), Reason::Fleet);
    }
}
