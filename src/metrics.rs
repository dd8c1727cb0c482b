//! Prometheus metrics from an owned registry, so several proxies in one test process keep
//! separate counts. Labels are key names and closed enums only, never task ids or secrets.
//! Every metric is listed, with its labels and meaning, in `docs/metrics.md`.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

mod labels;
mod resolved;
mod scrape;

pub use labels::*;
pub use scrape::Scene;

use crate::captcha::{Endpoint, Outcome};
use crate::failover::CheckResult;
use crate::health::StateKind;
use crate::pool::KeyEntry;

/// Upstream and proxy latency buckets: loopback answers take a millisecond, real submits
/// tens of milliseconds, `solve.php` up to minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 180.0,
];

/// Typed handles to every metric keyrelay exports.
pub struct Metrics {
    registry: Registry,
    // Gauges recomputed from the pool at scrape time.
    keys_active: IntGauge,
    keys_configured: IntGauge,
    key_up: IntGaugeVec,
    key_state: IntGaugeVec,
    key_state_reason: IntGaugeVec,
    key_balance: GaugeVec,
    key_threads: IntGaugeVec,
    key_working_threads: IntGaugeVec,
    key_tasks_in_flight: IntGaugeVec,
    key_threads_in_use: IntGaugeVec,
    key_admin_hold: IntGaugeVec,
    tasks_pinned: IntGauge,
    queue_length: IntGauge,
    /// How long submits waited for a thread, by how the wait ended.
    pub queue_wait: HistogramVec,
    /// Submits answered "busy" because every key was full, by why the wait ended.
    pub pool_full: IntCounterVec,
    /// Threads given back by tasks, by [`Release`]; counted through `count_releases`.
    thread_releases: IntCounterVec,
    /// Submit attempts by key and how the key answered; counted through `count_submit`.
    key_submits: IntCounterVec,
    /// Upstream error codes (and transport failures) by key, its provider and code.
    pub key_errors: IntCounterVec,
    /// Upstream latency by key, its provider and endpoint; through `observe_upstream`.
    upstream_duration: HistogramVec,
    /// 1 while a provider of the pool answers, 0 while it is out (down, or on probation
    /// after an outage and not yet answered).
    provider_up: IntGaugeVec,
    /// Outages seen, by provider.
    pub provider_outages: IntCounterVec,
    /// Caller requests by endpoint and how they ended; through `observe_request`.
    request_duration: HistogramVec,
    /// The series of the three above, resolved as they are first used.
    resolved: resolved::Resolved,
    /// Answers keyrelay made itself, by [`LocalCode`]; counted through `count_local`.
    local_answers: IntCounterVec,
    /// Tasks moved to another key, by why the previous key failed.
    pub failovers: IntCounterVec,
    /// Key state changes by key and the state entered.
    pub key_transitions: IntCounterVec,
    /// Background refresh rounds.
    pub refresh_runs: IntCounter,
    /// Keys whose refresh read failed or was rejected.
    pub refresh_failures: IntCounterVec,
    /// Config reloads by [`ReloadResult`]; counted through `count_reload`.
    config_reloads: IntCounterVec,
    /// Connections closed at once because `limits.max_connections` were open.
    pub connections_rejected: IntCounter,
    /// Forward-proxy requests that were not the pool's, by [`ForwardOutcome`]; counted
    /// through `count_forward`.
    forward_requests: IntCounterVec,
    /// Destinations the forward proxy refused, by [`ForwardRefusal`]; counted through
    /// `count_forward_refused`.
    forward_refused: IntCounterVec,
    /// Failed TLS handshakes, by [`TlsFailure`]; counted through `count_tls_failure`.
    tls_handshake_failures: IntCounterVec,
    /// Retries not made because the retry budget was spent.
    pub retries_denied: IntCounter,
    /// Callers' polls of a task answered by keyrelay: too soon for the service to be asked
    /// again, or a final answer kept (`keyrelay_polls_total{answered="locally"}`).
    pub polls_locally: IntCounter,
    /// Callers' polls of a task relayed to the service (`{answered="upstream"}`).
    pub polls_upstream: IntCounter,
    /// keyrelay's own polls of tasks their callers stopped polling.
    pub orphan_polls: IntCounter,
    /// Unknown task ids by what became of them ([`ProbeResult`]); counted through `count_probe`.
    probes: IntCounterVec,
    /// keyrelay's own checks of a key-unusable verdict a caller's request drew, by result.
    pub key_checks: IntCounterVec,
    upstream_paused: IntGauge,
    /// Requests refused at the token check, by [`Denied`]; counted through `count_denied`.
    access_denied: IntCounterVec,
    /// Submits by caller token name and [`TokenSubmit`]; counted through `count_token_submit`.
    token_submits: IntCounterVec,
    /// Threads held by each caller token's tasks, set at scrape time.
    token_threads_in_use: IntGaugeVec,
    /// Each caller token's spend in its budget's period (30 days without a budget), set at
    /// scrape time.
    token_spend: GaugeVec,
    /// Each budgeted caller token's use of its budget (0 to 1), and the share at which
    /// `KeyrelayTokenBudgetSoft` fires; set at scrape time.
    token_budget_used_ratio: GaugeVec,
    token_budget_soft_ratio: GaugeVec,
    /// The mean solve time seen per provider and method (the last 50 solves or 10
    /// minutes), set at scrape time.
    solve_seconds: GaugeVec,
    /// `[cluster]` only: 1 while Redis is shared, 0 while degraded.
    cluster_up: IntGaugeVec,
    /// `[cluster]` only: failed Redis calls by operation, mirrored from the cluster's own
    /// counts at scrape time.
    cluster_errors: IntCounterVec,
    /// `[cluster]` only: Redis round trips by operation, mirrored at scrape time.
    cluster_round_trips: IntCounterVec,
    /// `[cluster]` only: each key's spares across the fleet (threads replicas took ahead
    /// for their next submits), as last synced; the same on every replica.
    cluster_spares: IntGaugeVec,
    /// `[cluster]` only: replicas seen alive at the last heartbeat.
    cluster_replicas: IntGaugeVec,
    /// `[cluster]` only: pins waiting for Redis to return.
    cluster_pin_backlog: IntGaugeVec,
    /// `[cluster]` only: each key's threads held across the fleet: the same figure on every
    /// replica (`scope="fleet"`), to be read with max(), never summed.
    cluster_threads_held: IntGaugeVec,
    /// Pool-wide figures for autoscalers, by `scope`: `fleet` in cluster mode (the same on
    /// every replica: use max()), `pool` for an instance alone.
    pool_threads: IntGaugeVec,
    pool_threads_in_use: IntGaugeVec,
    pool_threads_free: IntGaugeVec,
    pool_balance: GaugeVec,
    scaling_brake_balance: GaugeVec,
    /// Each key's spend an hour, and the seconds its balance lasts at that rate.
    key_spend_per_hour: GaugeVec,
    key_balance_runs_out: GaugeVec,
}

/// Registers each metric and returns its handle.
macro_rules! register {
    ($registry:expr, $metric:expr) => {{
        let metric = $metric;
        $registry.register(Box::new(metric.clone()))?;
        metric
    }};
}

impl Metrics {
    /// # Errors
    /// Only if two metrics were given the same name, which is a programming error.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let r = Registry::new();
        let build_info = register!(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "keyrelay_build_info",
                    "keyrelay's version and git commit; always 1."
                ),
                &["version", "commit"],
            )?
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), crate::BUILD_COMMIT])
            .set(1);
        let per_key = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["key"]);
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
                labels,
            )
        };
        let cluster = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels)
        };
        let polls = register!(
            r,
            counter(
                "keyrelay_polls_total",
                "Callers' polls of a task (res.php get/get2, one per id of an ids= list, getTaskResult), by how they were answered: locally (too soon to ask the service again, or a final answer kept) or upstream.",
                &["answered"],
            )?
        );
        Ok(Metrics {
            polls_locally: polls.with_label_values(&["locally"]),
            polls_upstream: polls.with_label_values(&["upstream"]),
            orphan_polls: register!(
                r,
                IntCounter::new(
                    "keyrelay_orphan_polls_total",
                    "keyrelay's own polls of tasks nobody polled for [polling] orphan_after."
                )?
            ),
            cluster_up: register!(
                r,
                cluster(
                    "keyrelay_cluster_up",
                    "1 while this replica shares the pool through Redis, 0 while degraded (its own share of each key).",
                    &["replica"]
                )?
            ),
            cluster_errors: register!(
                r,
                counter(
                    "keyrelay_cluster_errors_total",
                    "Redis calls that failed or timed out, by operation.",
                    &["op"]
                )?
            ),
            cluster_round_trips: register!(
                r,
                counter(
                    "keyrelay_cluster_round_trips_total",
                    "Round trips to Redis (one command or one pipeline each), by operation, failed ones included.",
                    &["op"]
                )?
            ),
            cluster_spares: register!(
                r,
                cluster(
                    "keyrelay_cluster_spares",
                    "Threads of the key the fleet's replicas took ahead for their next submits, as last synced: not in use, not free; the same on every replica: use max(), not sum().",
                    &["key"]
                )?
            ),
            cluster_replicas: register!(
                r,
                cluster(
                    "keyrelay_cluster_replicas",
                    "Replicas seen alive at this replica's last heartbeat.",
                    &["replica"]
                )?
            ),
            cluster_pin_backlog: register!(
                r,
                cluster(
                    "keyrelay_cluster_pin_backlog",
                    "Pins made while Redis was away, waiting to be written to it.",
                    &["replica"]
                )?
            ),
            cluster_threads_held: register!(
                r,
                cluster(
                    "keyrelay_cluster_threads_held",
                    "Threads of the key held across the whole fleet, as last synced; the same on every replica: use max(), not sum().",
                    &["key", "scope"]
                )?
            ),
            pool_threads: register!(
                r,
                cluster(
                    "keyrelay_pool_threads",
                    "Threads of the keys in rotation; scope=\"fleet\" in cluster mode (the same on every replica: use max(), not sum()).",
                    &["scope"]
                )?
            ),
            pool_threads_in_use: register!(
                r,
                cluster(
                    "keyrelay_pool_threads_in_use",
                    "Threads of the keys in rotation held by tasks; scope as keyrelay_pool_threads.",
                    &["scope"]
                )?
            ),
            pool_threads_free: register!(
                r,
                cluster(
                    "keyrelay_pool_threads_free",
                    "Threads of the keys in rotation free for a new task; scope as keyrelay_pool_threads.",
                    &["scope"]
                )?
            ),
            pool_balance: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_pool_balance",
                        "Total balance of the keys in rotation; absent while any of them is unknown. scope as keyrelay_pool_threads."
                    ),
                    &["scope"],
                )?
            ),
            scaling_brake_balance: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_scaling_brake_balance",
                        "[scaling] brake_balance: below this pool balance no new workers are wanted."
                    ),
                    &["scope"],
                )?
            ),
            key_spend_per_hour: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_key_spend_per_hour",
                        "The key's balance spent an hour over the last hour of readings; 0 while flat, absent while learning."
                    ),
                    &["key"],
                )?
            ),
            key_balance_runs_out: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_key_balance_runs_out_seconds",
                        "Seconds until the key's balance runs out at its spend rate; absent while flat or learning."
                    ),
                    &["key"],
                )?
            ),
            keys_active: register!(
                r,
                IntGauge::new(
                    "keyrelay_keys_active",
                    "Keys in rotation now: healthy and above min_balance."
                )?
            ),
            keys_configured: register!(
                r,
                IntGauge::new("keyrelay_keys_configured", "Keys in the configuration.")?
            ),
            key_up: register!(
                r,
                per_key("keyrelay_key_up", "1 while the key is in rotation, else 0.")?
            ),
            key_state: register!(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "keyrelay_key_state",
                        "1 for the key's current health state (active, cooling, benched), 0 for the others."
                    ),
                    &["key", "state"],
                )?
            ),
            key_state_reason: register!(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "keyrelay_key_state_reason",
                        "1 for the code that took the key out of rotation; reason=\"none\" while active."
                    ),
                    &["key", "reason"],
                )?
            ),
            key_balance: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_key_balance",
                        "Balance from the key's last successful getbalance; absent while unknown."
                    ),
                    &["key"],
                )?
            ),
            key_threads: register!(
                r,
                per_key(
                    "keyrelay_key_threads",
                    "The key's thread capacity: its threadsinfo figure, else the configured threads."
                )?
            ),
            key_working_threads: register!(
                r,
                per_key(
                    "keyrelay_key_working_threads",
                    "Working threads from the key's last threadsinfo; absent while unknown."
                )?
            ),
            key_tasks_in_flight: register!(
                r,
                per_key(
                    "keyrelay_key_tasks_in_flight",
                    "Tasks submitted through keyrelay with this key and not yet finished."
                )?
            ),
            key_threads_in_use: register!(
                r,
                per_key(
                    "keyrelay_key_threads_in_use",
                    "Threads of the key counted as in use: submits on their way, open tasks, and others' use seen by threadsinfo."
                )?
            ),
            key_admin_hold: register!(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "keyrelay_key_admin_hold",
                        "1 for the operator's hold on the key (disabled: no new tasks, no background reads; draining: no new tasks), 0 for the other."
                    ),
                    &["key", "hold"],
                )?
            ),
            queue_length: register!(
                r,
                IntGauge::new(
                    "keyrelay_queue_length",
                    "Submits waiting for a thread because every key that could take them is full."
                )?
            ),
            queue_wait: register!(
                r,
                histogram(
                    "keyrelay_queue_wait_seconds",
                    "Time submits waited for a thread, by result: admitted, refused, no_key.",
                    &["result"],
                )?
            ),
            pool_full: register!(
                r,
                counter(
                    "keyrelay_pool_full_total",
                    "Submits answered busy because every key was full, by reason: queue_timeout, queue_full, no_queue.",
                    &["reason"],
                )?
            ),
            thread_releases: register!(
                r,
                counter(
                    "keyrelay_thread_releases_total",
                    "Threads given back by tasks, by reason: final (answer polled), stale (never polled), reconciled (threadsinfo showed it done).",
                    &["reason"],
                )?
            ),
            tasks_pinned: register!(
                r,
                IntGauge::new(
                    "keyrelay_tasks_pinned",
                    "Task ids currently pinned to the key that created them."
                )?
            ),
            key_submits: register!(
                r,
                counter(
                    "keyrelay_key_submits_total",
                    "Submit attempts by key and outcome: ok, key_unusable, key_full, caller_error, transient.",
                    &["key", "outcome"],
                )?
            ),
            key_errors: register!(
                r,
                counter(
                    "keyrelay_key_errors_total",
                    "Upstream error codes and transport failures seen, by key, its provider and code.",
                    &["key", "provider", "code"],
                )?
            ),
            upstream_duration: register!(
                r,
                histogram(
                    "keyrelay_upstream_duration_seconds",
                    "Upstream request latency by key, its provider and endpoint.",
                    &["key", "provider", "endpoint"],
                )?
            ),
            provider_up: register!(
                r,
                cluster(
                    "keyrelay_provider_up",
                    "1 while a provider of the pool answers, 0 while it is out: down after transient failures across its keys, or not yet answered since.",
                    &["provider"]
                )?
            ),
            provider_outages: register!(
                r,
                counter(
                    "keyrelay_provider_outages_total",
                    "Times a provider was taken out for transient failures across its keys.",
                    &["provider"]
                )?
            ),
            request_duration: register!(
                r,
                histogram(
                    "keyrelay_request_duration_seconds",
                    "Caller request duration through the proxy, by endpoint and outcome.",
                    &["endpoint", "outcome"],
                )?
            ),
            local_answers: register!(
                r,
                counter(
                    "keyrelay_local_answers_total",
                    "Answers keyrelay made itself instead of relaying the upstream's, by code.",
                    &["code"],
                )?
            ),
            failovers: register!(
                r,
                counter(
                    "keyrelay_failovers_total",
                    "Tasks retried on another key, by why the previous key failed.",
                    &["reason"],
                )?
            ),
            key_transitions: register!(
                r,
                counter(
                    "keyrelay_key_transitions_total",
                    "Key state changes by key and the state entered.",
                    &["key", "state"],
                )?
            ),
            refresh_runs: register!(
                r,
                IntCounter::new(
                    "keyrelay_refresh_runs_total",
                    "Background refresh rounds over the pool."
                )?
            ),
            refresh_failures: register!(
                r,
                counter(
                    "keyrelay_refresh_failures_total",
                    "Refresh reads of a key's balance that failed or were rejected.",
                    &["key"],
                )?
            ),
            config_reloads: register!(
                r,
                counter(
                    "keyrelay_config_reloads_total",
                    "Config reloads by result: applied, or rejected (the running config stays).",
                    &["result"],
                )?
            ),
            connections_rejected: register!(
                r,
                IntCounter::new(
                    "keyrelay_connections_rejected_total",
                    "Connections closed at once because limits.max_connections were open."
                )?
            ),
            forward_requests: register!(
                r,
                counter(
                    "keyrelay_forward_requests_total",
                    "Forward-proxy requests for hosts that are not intercepted (CONNECT tunnels, absolute-form requests), by outcome.",
                    &["outcome"],
                )?
            ),
            forward_refused: register!(
                r,
                counter(
                    "keyrelay_forward_refused_total",
                    "Forward-proxy destinations refused by the destination policy or a token's max_tunnels, by reason.",
                    &["reason"],
                )?
            ),
            tls_handshake_failures: register!(
                r,
                counter(
                    "keyrelay_tls_handshake_failures_total",
                    "TLS handshakes that failed (on the [tls] listener and in intercepted CONNECT tunnels), by reason.",
                    &["reason"],
                )?
            ),
            retries_denied: register!(
                r,
                IntCounter::new(
                    "keyrelay_retries_denied_total",
                    "Retries not made because the retry budget was spent."
                )?
            ),
            probes: register!(
                r,
                counter(
                    "keyrelay_probes_total",
                    "Task ids keyrelay had no pin for, by what became of them: found, not_found, remembered, unsure, budget, invalid.",
                    &["result"],
                )?
            ),
            key_checks: register!(
                r,
                counter(
                    "keyrelay_key_checks_total",
                    "keyrelay's own getbalance checks of a key-unusable verdict that a caller's request drew, by result: confirmed (benched), refuted (kept), inconclusive, skipped (checked moments ago).",
                    &["result"],
                )?
            ),
            upstream_paused: register!(
                r,
                IntGauge::new(
                    "keyrelay_upstream_paused",
                    "1 while all upstream traffic is paused after an IP ban, else 0."
                )?
            ),
            access_denied: register!(
                r,
                counter(
                    "keyrelay_access_denied_total",
                    "Requests refused at the token check, by reason: missing (no token), wrong (not a configured token), rate_limited (not checked: the address presented too many wrong tokens lately).",
                    &["reason"],
                )?
            ),
            token_submits: register!(
                r,
                counter(
                    "keyrelay_token_submits_total",
                    "Submits by caller token (its name) and outcome: ok, full, no_key, caller_error, failed.",
                    &["token", "outcome"],
                )?
            ),
            token_threads_in_use: register!(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "keyrelay_token_threads_in_use",
                        "Threads held by the tasks of each caller token (its name), across keys."
                    ),
                    &["token"],
                )?
            ),
            token_spend: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_token_spend",
                        "What each caller token's tasks spent (settled and reserved, in the [prices] currency) over its budget's period, or 30 days without a budget."
                    ),
                    &["token"],
                )?
            ),
            token_budget_used_ratio: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_token_budget_used_ratio",
                        "Each budgeted caller token's spend (or thread-hours) over its budget, 0 to 1; at 1 its submits are refused with ERROR_ZERO_BALANCE."
                    ),
                    &["token"],
                )?
            ),
            token_budget_soft_ratio: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_token_budget_soft_ratio",
                        "Each budgeted caller token's soft share: KeyrelayTokenBudgetSoft fires when the used ratio reaches it."
                    ),
                    &["token"],
                )?
            ),
            solve_seconds: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "keyrelay_solve_seconds",
                        "Mean time from submit to the solution keyrelay saw, per provider and in.php method, over the last 50 solves or 10 minutes: what strategy = \"fastest\" compares."
                    ),
                    &["provider", "method"],
                )?
            ),
            resolved: resolved::Resolved::new(),
            registry: r,
        }
        .with_closed_sets_at_zero())
    }

    /// Starts every series whose labels are keyrelay's own fixed sets at 0. Per-key series
    /// follow in [`Metrics::admit_keys`], once the keys are known.
    fn with_closed_sets_at_zero(self) -> Metrics {
        for refusal in crate::capacity::Refusal::ALL {
            self.pool_full.with_label_values(&[refusal.label()]);
        }
        for release in Release::ALL {
            self.thread_releases.with_label_values(&[release.label()]);
        }
        for result in ProbeResult::ALL {
            self.probes.with_label_values(&[result.label()]);
        }
        for result in CheckResult::ALL {
            self.key_checks.with_label_values(&[result.label()]);
        }
        for result in ReloadResult::ALL {
            self.config_reloads.with_label_values(&[result.label()]);
        }
        for result in WaitResult::ALL {
            self.queue_wait.with_label_values(&[result.label()]);
        }
        for code in LocalCode::ALL {
            self.local_answers.with_label_values(&[code.label()]);
        }
        for reason in Denied::ALL {
            self.access_denied.with_label_values(&[reason.label()]);
        }
        for outcome in ForwardOutcome::ALL {
            self.forward_requests.with_label_values(&[outcome.label()]);
        }
        for reason in ForwardRefusal::ALL {
            self.forward_refused.with_label_values(&[reason.label()]);
        }
        for reason in TlsFailure::ALL {
            self.tls_handshake_failures
                .with_label_values(&[reason.label()]);
        }
        self
    }

    /// Starts the per-key counters of `keys` at 0, for every value of their other labels, so
    /// that `rate()` and ratios over them work before a key's first event. Called for the
    /// keys of every pool admitted, at start and on each reload; keys seen before keep their
    /// counts.
    pub fn admit_keys<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        for key in keys {
            for outcome in SubmitOutcome::ALL {
                self.key_submits.with_label_values(&[key, outcome.label()]);
            }
            for state in StateKind::ALL {
                self.key_transitions
                    .with_label_values(&[key, state.label()]);
            }
            self.refresh_failures.with_label_values(&[key]);
        }
    }

    /// Starts the outage count of each provider of a pool at 0, so `increase()` sees the
    /// first outage.
    pub fn admit_providers(&self, providers: impl IntoIterator<Item = crate::provider::Provider>) {
        for provider in providers {
            self.provider_outages.with_label_values(&[provider.name()]);
        }
    }

    /// Counts `released` threads given back for `reason`.
    pub fn count_releases(&self, reason: Release, released: u64) {
        self.thread_releases
            .with_label_values(&[reason.label()])
            .inc_by(released);
    }

    /// Counts one answer keyrelay made itself.
    pub fn count_local(&self, code: LocalCode) {
        self.local_answers.with_label_values(&[code.label()]).inc();
    }

    /// Counts one forward-proxy request that was not the pool's.
    pub fn count_forward(&self, outcome: ForwardOutcome) {
        self.forward_requests
            .with_label_values(&[outcome.label()])
            .inc();
    }

    /// Counts one destination the forward proxy refused.
    pub fn count_forward_refused(&self, reason: ForwardRefusal) {
        self.forward_refused
            .with_label_values(&[reason.label()])
            .inc();
    }

    /// Counts one failed TLS handshake.
    pub fn count_tls_failure(&self, reason: TlsFailure) {
        self.tls_handshake_failures
            .with_label_values(&[reason.label()])
            .inc();
    }

    /// Starts the per-token series of the tokens named `tokens` at 0; tokens seen before
    /// keep their counts. Called with every snapshot's tokens.
    pub fn admit_tokens<'a>(&self, tokens: impl IntoIterator<Item = &'a str>) {
        for token in tokens {
            for outcome in TokenSubmit::ALL {
                self.token_submits
                    .with_label_values(&[token, outcome.label()]);
            }
            self.token_threads_in_use.with_label_values(&[token]);
        }
    }

    /// Counts one request refused at the token check.
    pub fn count_denied(&self, reason: Denied) {
        self.access_denied
            .with_label_values(&[reason.label()])
            .inc();
    }

    /// Counts one submit of the token named `token`.
    pub fn count_token_submit(&self, token: &str, outcome: TokenSubmit) {
        self.token_submits
            .with_label_values(&[token, outcome.label()])
            .inc();
    }

    /// Sets the threads the token named `token` holds, for the next scrape.
    pub fn set_token_threads(&self, token: &str, threads: u32) {
        self.token_threads_in_use
            .with_label_values(&[token])
            .set(i64::from(threads));
    }

    /// Sets the token named `token`'s spend and, with a budget, its use of it and its soft
    /// share, for the next scrape.
    pub fn set_token_budget(&self, token: &str, spend: f64, budget: Option<(f64, f64)>) {
        self.token_spend.with_label_values(&[token]).set(spend);
        match budget {
            Some((used, soft)) => {
                self.token_budget_used_ratio
                    .with_label_values(&[token])
                    .set(used);
                self.token_budget_soft_ratio
                    .with_label_values(&[token])
                    .set(soft);
            }
            None => {
                let _ = self.token_budget_used_ratio.remove_label_values(&[token]);
                let _ = self.token_budget_soft_ratio.remove_label_values(&[token]);
            }
        }
    }

    /// Sets the solve times seen, for the next scrape; pairs with no solve in the window
    /// any more are dropped.
    pub fn set_solve_times(
        &self,
        times: &[(crate::provider::Provider, String, std::time::Duration)],
    ) {
        self.solve_seconds.reset();
        for (provider, method, took) in times {
            self.solve_seconds
                .with_label_values(&[provider.name(), method.as_str()])
                .set(took.as_secs_f64());
        }
    }

    /// Counts one probe for an unknown task id.
    pub fn count_probe(&self, result: ProbeResult) {
        self.probes.with_label_values(&[result.label()]).inc();
    }

    /// Counts one config reload.
    pub fn count_reload(&self, result: ReloadResult) {
        self.config_reloads
            .with_label_values(&[result.label()])
            .inc();
    }

    /// Counts one submit attempt under the five outcomes operators alert on.
    pub fn count_submit(&self, key: &KeyEntry, outcome: Outcome) {
        let label = match outcome {
            Outcome::Success => SubmitOutcome::Ok,
            Outcome::KeyUnusable => SubmitOutcome::KeyUnusable,
            // CaptchaAI documents this code as "no free thread".
            Outcome::KeyFull | Outcome::ZeroBalance => SubmitOutcome::KeyFull,
            Outcome::CallerError => SubmitOutcome::CallerError,
            // A ban or a server fault: temporary, and not the key's doing.
            Outcome::Transient | Outcome::IpBanned => SubmitOutcome::Transient,
        };
        self.resolved.count_submit(&self.key_submits, key, label);
    }

    /// Records how long a caller's request took, by its endpoint and how it ended.
    pub fn observe_request(&self, endpoint: Endpoint, outcome: RequestOutcome, seconds: f64) {
        self.resolved
            .request(&self.request_duration, endpoint, outcome)
            .observe(seconds);
    }

    /// Records how long an exchange with the upstream took, by key and endpoint.
    pub fn observe_upstream(&self, key: &KeyEntry, endpoint: Endpoint, seconds: f64) {
        self.resolved
            .observe_upstream(&self.upstream_duration, key, endpoint, seconds);
    }

    /// State changes of a key into `state` since start, for the status page.
    pub fn transitions(&self, key: &str, state: &str) -> u64 {
        self.key_transitions.with_label_values(&[key, state]).get()
    }

    /// Counter value of one submit series, for the status page.
    pub fn submits(&self, key: &str, outcome: &str) -> u64 {
        self.key_submits.with_label_values(&[key, outcome]).get()
    }
}
