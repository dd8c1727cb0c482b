//! Operator endpoints beside `/metrics`: `/healthz` (liveness), `/readyz` (at least one key
//! in rotation) and `/status` (every key's state, as JSON or a self-contained HTML page).
//! Keys appear by name and fingerprint only.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

use crate::app::App;
use crate::forecast::ForecastStatus;
use crate::health::{Reason, StateKind};

/// The `/status` document.
#[derive(Debug, Serialize)]
pub struct PoolStatus {
    pub version: &'static str,
    pub uptime_seconds: u64,
    pub keys_active: usize,
    pub keys_configured: usize,
    pub tasks_pinned: usize,
    /// How new tasks' keys are chosen.
    pub strategy: &'static str,
    /// Submits waiting for a thread now.
    pub queued: usize,
    /// `[cluster]` only: this replica, the fleet and whether Redis is shared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    /// Each provider of the pool, and whether it answers.
    pub providers: Vec<ProviderStatus>,
    pub keys: Vec<KeyStatus>,
}

/// A provider of the pool as this replica sees it.
#[derive(Debug, Serialize)]
pub struct ProviderStatus {
    pub provider: &'static str,
    /// `up`, `down` (its keys take no new task while another provider's can), or
    /// `probation` (tried again after an outage, not yet answered).
    pub state: &'static str,
    /// When the outage began (RFC 3339, UTC); `null` while up.
    pub since: Option<String>,
    /// When it is tried again; `null` unless down.
    pub until: Option<String>,
    pub keys: usize,
}

/// The fleet as this replica sees it.
#[derive(Debug, Serialize)]
pub struct ClusterStatus {
    pub replica: String,
    /// `shared` (Redis counts for the fleet) or `degraded` (this replica's share).
    pub mode: &'static str,
    /// Why degraded; `null` while shared.
    pub degraded_reason: Option<String>,
    /// Replicas seen alive at the last heartbeat, by name.
    pub replicas: Vec<String>,
    /// Whether this replica runs the fleet's balance and thread refresh.
    pub refresher: bool,
    /// Pins waiting for Redis to return.
    pub pin_backlog: usize,
}

/// One key's line in `/status`.
#[derive(Debug, Serialize)]
pub struct KeyStatus {
    pub name: String,
    /// The key's last four characters, never more.
    pub fingerprint: String,
    /// The service the key belongs to (`provider` in the config).
    pub provider: &'static str,
    /// Its balance's currency at that service.
    pub currency: &'static str,
    pub state: &'static str,
    /// The code that took the key out of rotation; `null` while active.
    pub reason: Option<&'static str>,
    /// When the key entered its state (RFC 3339, UTC).
    pub since: String,
    /// End of a cooldown.
    pub until: Option<String>,
    /// Whether new tasks may go to it: active, above `min_balance`, and not held.
    pub in_rotation: bool,
    /// The operator's hold (`disabled` or `draining`, see `/admin/`); `null`: none.
    pub hold: Option<&'static str>,
    pub weight: f64,
    /// Last balance read; `null` while unknown.
    pub balance: Option<f64>,
    /// The balance's trend over the last hour: spend rate and when it runs out, or `flat`
    /// where the balance does not move with use (a thread plan), with no date then.
    pub forecast: ForecastStatus,
    pub threads: Option<u32>,
    pub working_threads: Option<u32>,
    /// Tasks accepted through keyrelay and not yet finished.
    pub tasks_in_flight: u32,
    /// Threads counted against the key's capacity: submits on their way, open tasks, and
    /// others' use that threadsinfo showed.
    pub threads_in_use: u32,
    /// `[cluster]` only: threads held across the fleet at the last sync.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet_threads_in_use: Option<u32>,
    /// `[cluster]` only: threads the replicas took ahead for their next submits at the last
    /// sync (held, so not free, but not in use).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet_spares: Option<u32>,
    pub tier: u32,
    pub last_error: Option<LastError>,
    pub counts: Counts,
}

/// The most recent error a key answered.
#[derive(Debug, Serialize)]
pub struct LastError {
    pub code: &'static str,
    pub at: String,
}

/// Submit attempts by outcome, and state changes, since start.
#[derive(Debug, Serialize)]
pub struct Counts {
    pub submits_ok: u64,
    pub submits_key_unusable: u64,
    pub submits_key_full: u64,
    pub submits_caller_error: u64,
    pub submits_transient: u64,
    pub transitions: u64,
}

/// Builds the status document from the current pool.
pub fn pool_status(app: &App) -> PoolStatus {
    let snapshot = app.snapshot();
    let pool = &snapshot.pool;
    let now = Instant::now();
    let wall = SystemTime::now();
    let metrics = app.metrics();
    let keys = pool
        .keys()
        .iter()
        .map(|key| {
            let view = pool.health(key, now);
            let load = pool.load(key);
            let name = key.name.as_str();
            let transitions = ["active", "cooling", "benched"]
                .iter()
                .map(|state| metrics.transitions(name, state))
                .sum();
            KeyStatus {
                name: key.name.clone(),
                fingerprint: key.key.fingerprint(),
                provider: key.provider.name(),
                currency: key.profile().currency.code(),
                state: view.state.label(),
                reason: view.reason.map(Reason::label),
                since: rfc3339(wall_time(view.since, now, wall)),
                until: view
                    .until
                    .filter(|_| view.state == StateKind::Cooling)
                    .map(|until| rfc3339(wall + until.saturating_duration_since(now))),
                in_rotation: pool.in_rotation(key, now),
                hold: pool.admin_hold(key).map(|hold| hold.label()),
                weight: key.weight,
                balance: key.stats.balance(),
                forecast: key.stats.forecast(now).into(),
                threads: key.thread_capacity(),
                working_threads: key.stats.threads().map(|(_, working)| working),
                tasks_in_flight: load.open,
                threads_in_use: load.in_use(),
                fleet_threads_in_use: app.cluster().map(|_| {
                    key.stats
                        .shared
                        .held
                        .load(std::sync::atomic::Ordering::Relaxed)
                }),
                fleet_spares: app.cluster().map(|_| {
                    key.stats
                        .shared
                        .spares
                        .load(std::sync::atomic::Ordering::Relaxed)
                }),
                tier: key.tier,
                last_error: key.stats.last_error().map(|(code, at)| LastError {
                    code,
                    at: rfc3339(at),
                }),
                counts: Counts {
                    submits_ok: metrics.submits(name, "ok"),
                    submits_key_unusable: metrics.submits(name, "key_unusable"),
                    submits_key_full: metrics.submits(name, "key_full"),
                    submits_caller_error: metrics.submits(name, "caller_error"),
                    submits_transient: metrics.submits(name, "transient"),
                    transitions,
                },
            }
        })
        .collect();
    let providers = pool
        .providers()
        .map(|provider| {
            let view = pool.outages().view(provider, now);
            ProviderStatus {
                provider: provider.name(),
                state: match (view.out, view.until) {
                    (false, _) => "up",
                    (true, Some(_)) => "down",
                    (true, None) => "probation",
                },
                since: view.since.map(|at| rfc3339(wall_time(at, now, wall))),
                until: view
                    .until
                    .map(|until| rfc3339(wall + until.saturating_duration_since(now))),
                keys: pool.keys_of(provider),
            }
        })
        .collect();
    PoolStatus {
        version: env!("CARGO_PKG_VERSION"),
        uptime_seconds: app.uptime().as_secs(),
        keys_active: pool.active_count(now),
        keys_configured: pool.keys().len(),
        tasks_pinned: app.pins().len(),
        strategy: pool.strategy().label(),
        queued: app.capacity().queued(),
        cluster: app.cluster().map(|cluster| ClusterStatus {
            replica: cluster.replica().to_owned(),
            mode: if cluster.is_shared() {
                "shared"
            } else {
                "degraded"
            },
            degraded_reason: cluster.degraded_reason(),
            replicas: cluster.live_replicas(),
            refresher: cluster.is_shared() && cluster.is_refresher(),
            pin_backlog: cluster.backlog_len(),
        }),
        providers,
        keys,
    }
}

/// A monotonic instant as wall-clock time, for display.
fn wall_time(at: Instant, now: Instant, wall: SystemTime) -> SystemTime {
    wall.checked_sub(now.saturating_duration_since(at))
        .unwrap_or(wall)
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// The status document as JSON.
pub fn to_json(status: &PoolStatus) -> String {
    serde_json::to_string_pretty(status).expect("the status document serialises")
}

/// How often the HTML page reloads itself.
const HTML_REFRESH: Duration = Duration::from_secs(5);

/// A forecast for the HTML page: the rate and the time left, or why there is no date.
fn forecast_text(forecast: &ForecastStatus) -> String {
    match (forecast.spend_per_hour, forecast.runs_out_in_seconds) {
        (Some(rate), Some(left)) => {
            let hours = left as f64 / 3600.0;
            format!("{rate:.2}/h, runs out in {hours:.1} h")
        }
        (Some(_), None) => "flat: does not move with use".to_owned(),
        _ => "learning".to_owned(),
    }
}

/// The status document as a small HTML page: no external assets, reloads itself.
pub fn to_html(status: &PoolStatus) -> String {
    let mut rows = String::new();
    for key in &status.keys {
        // What admission compares: threads counted in use against the capacity.
        let threads = match key.threads {
            Some(t) => format!("{} / {t}", key.threads_in_use),
            None => format!("{} / -", key.threads_in_use),
        };
        let last_error = key
            .last_error
            .as_ref()
            .map_or("-".to_owned(), |e| format!("{} at {}", e.code, e.at));
        let state_class = if key.in_rotation { "active" } else { key.state };
        let state_text = match key.hold {
            Some(hold) => format!("{} ({hold})", key.state),
            None if key.state == "active" && !key.in_rotation => "active (low balance)".to_owned(),
            None => key.state.to_owned(),
        };
        let _ = writeln!(
            rows,
            "<tr><td>{name}</td><td>{provider}</td><td class=\"num\">{tier}</td><td><code>{fp}</code></td>\
             <td><span class=\"badge {state_class}\">{state}</span></td>\
             <td>{reason}</td><td>{since}</td><td class=\"num\">{balance}</td>\
             <td>{forecast}</td><td class=\"num\">{threads}</td><td class=\"num\">{in_flight}</td>\
             <td class=\"num\">{ok} / {failed}</td><td>{last_error}</td></tr>",
            name = escape(&key.name),
            provider = key.provider,
            tier = key.tier,
            fp = escape(&key.fingerprint),
            state = escape(&state_text),
            reason = escape(key.reason.unwrap_or("-")),
            since = escape(&key.since),
            balance = key.balance.map_or("?".to_owned(), |b| format!("{b:.2}")),
            forecast = forecast_text(&key.forecast),
            in_flight = key.tasks_in_flight,
            ok = key.counts.submits_ok,
            failed = key.counts.submits_key_unusable
                + key.counts.submits_key_full
                + key.counts.submits_transient,
            last_error = escape(&last_error),
        );
    }
    let pool_class = match status.keys_active {
        0 => "benched",
        1 => "cooling",
        _ => "active",
    };
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh}">
<title>keyrelay status</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ padding: .35em .8em; border-bottom: 1px solid #ddd; text-align: left; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.badge {{ padding: .1em .6em; border-radius: .8em; font-weight: 600; }}
.active {{ background: #d8f5d8; color: #145214; }}
.cooling {{ background: #fff1c2; color: #6b4e00; }}
.benched {{ background: #ffd6d6; color: #7a1010; }}
</style></head><body>
<h1>keyrelay {version}</h1>
<p><span class="badge {pool_class}">{active} of {configured} keys in rotation</span>
 &middot; strategy {strategy} &middot; {queued} submits waiting for a thread
 &middot; {pinned} tasks pinned &middot; up {uptime}s &middot; this page reloads every {refresh}s</p>
{cluster}{providers}
<table>
<tr><th>Key</th><th>Provider</th><th>Tier</th><th>Fingerprint</th><th>State</th><th>Reason</th><th>Since</th><th>Balance</th><th>Forecast</th><th>Threads used</th><th>In flight</th><th>Submits ok / failed</th><th>Last error</th></tr>
{rows}</table>
</body></html>
"#,
        refresh = HTML_REFRESH.as_secs(),
        version = status.version,
        active = status.keys_active,
        configured = status.keys_configured,
        pinned = status.tasks_pinned,
        strategy = status.strategy,
        queued = status.queued,
        uptime = status.uptime_seconds,
        cluster = status.cluster.as_ref().map_or(String::new(), cluster_line),
        providers = providers_line(&status.providers),
    )
}

/// One line naming each provider and whether it answers; none for a pool of one that does.
fn providers_line(providers: &[ProviderStatus]) -> String {
    if providers.len() < 2 && providers.iter().all(|p| p.state == "up") {
        return String::new();
    }
    let each: Vec<String> = providers
        .iter()
        .map(|p| {
            let class = if p.state == "up" { "active" } else { "benched" };
            let until = p
                .until
                .as_ref()
                .map_or(String::new(), |u| format!(" until {}", escape(u)));
            format!(
                "<span class=\"badge {class}\">{} {}</span>{until}",
                p.provider, p.state
            )
        })
        .collect();
    format!("<p>providers: {}</p>\n", each.join(" &middot; "))
}

fn cluster_line(cluster: &ClusterStatus) -> String {
    let mode = match &cluster.degraded_reason {
        Some(why) => format!(
            "<span class=\"badge cooling\">degraded</span> ({})",
            escape(why)
        ),
        None => "<span class=\"badge active\">shared</span>".to_owned(),
    };
    format!(
        "<p>replica <code>{}</code> &middot; {mode} &middot; {} replicas alive: {}{}</p>\n",
        escape(&cluster.replica),
        cluster.replicas.len(),
        escape(&cluster.replicas.join(", ")),
        if cluster.refresher {
            " &middot; refreshes for the fleet"
        } else {
            ""
        },
    )
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_neutralises_markup() {
        assert_eq!(
            escape("<b>\"x\" & 'y'</b>"),
            "&lt;b&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/b&gt;"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn wall_time_steps_back_by_the_elapsed_monotonic_time() {
        let at = Instant::now();
        tokio::time::advance(Duration::from_secs(90)).await;
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            wall_time(at, Instant::now(), wall),
            SystemTime::UNIX_EPOCH + Duration::from_secs(999_910)
        );
    }
}
