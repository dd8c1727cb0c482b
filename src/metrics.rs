//! Prometheus metrics from an owned registry, so several proxies in one test process keep
//! separate counts. Labels are key names and closed enums only, never task ids or secrets.

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use tokio::time::Instant;

use crate::pool::KeyPool;

/// Typed handles to every metric keyrelay exports.
pub struct Metrics {
    registry: Registry,
    keys_active: IntGauge,
    keys_configured: IntGauge,
    key_up: IntGaugeVec,
    key_balance: GaugeVec,
    tasks_pinned: IntGauge,
    /// Caller requests by endpoint and how they ended.
    pub requests: IntCounterVec,
    /// Upstream exchanges by key and classified outcome.
    pub upstream_outcomes: IntCounterVec,
    /// Upstream latency by endpoint.
    pub upstream_duration: HistogramVec,
    /// Tasks moved to another key, by the reason the first key failed.
    pub failovers: IntCounterVec,
    /// Key state changes by key and new state.
    pub key_transitions: IntCounterVec,
}

impl Metrics {
    /// # Errors
    /// Only if two metrics were given the same name, which is a programming error.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let keys_active = IntGauge::new(
            "keyrelay_keys_active",
            "Keys in rotation now: healthy and above min_balance.",
        )?;
        let keys_configured =
            IntGauge::new("keyrelay_keys_configured", "Keys in the configuration.")?;
        let key_up = IntGaugeVec::new(
            Opts::new("keyrelay_key_up", "1 while the key is in rotation, else 0."),
            &["key"],
        )?;
        let key_balance = GaugeVec::new(
            Opts::new(
                "keyrelay_key_balance",
                "Balance from the key's last successful getbalance; absent while unknown.",
            ),
            &["key"],
        )?;
        let tasks_pinned = IntGauge::new(
            "keyrelay_tasks_pinned",
            "Task ids currently pinned to the key that created them.",
        )?;
        let requests = IntCounterVec::new(
            Opts::new(
                "keyrelay_requests_total",
                "Caller requests by endpoint and outcome.",
            ),
            &["endpoint", "outcome"],
        )?;
        let upstream_outcomes = IntCounterVec::new(
            Opts::new(
                "keyrelay_upstream_outcomes_total",
                "Upstream exchanges by key and classified outcome.",
            ),
            &["key", "outcome"],
        )?;
        let upstream_duration = HistogramVec::new(
            HistogramOpts::new(
                "keyrelay_upstream_duration_seconds",
                "Upstream request latency by endpoint.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
            ]),
            &["endpoint"],
        )?;
        let failovers = IntCounterVec::new(
            Opts::new(
                "keyrelay_failovers_total",
                "Tasks retried on another key, by why the previous key failed.",
            ),
            &["reason"],
        )?;
        let key_transitions = IntCounterVec::new(
            Opts::new(
                "keyrelay_key_transitions_total",
                "Key state changes by key and the state entered.",
            ),
            &["key", "state"],
        )?;
        registry.register(Box::new(keys_active.clone()))?;
        registry.register(Box::new(keys_configured.clone()))?;
        registry.register(Box::new(key_up.clone()))?;
        registry.register(Box::new(key_balance.clone()))?;
        registry.register(Box::new(tasks_pinned.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(upstream_outcomes.clone()))?;
        registry.register(Box::new(upstream_duration.clone()))?;
        registry.register(Box::new(failovers.clone()))?;
        registry.register(Box::new(key_transitions.clone()))?;
        Ok(Metrics {
            registry,
            keys_active,
            keys_configured,
            key_up,
            key_balance,
            tasks_pinned,
            requests,
            upstream_outcomes,
            upstream_duration,
            failovers,
            key_transitions,
        })
    }

    /// The text exposition. Pool gauges are computed here, at scrape time, because a cooldown
    /// ends by the clock rather than by an event that could update them.
    pub fn render(&self, pool: &KeyPool, pins_len: usize, now: Instant) -> String {
        self.keys_configured.set(pool.keys().len() as i64);
        self.keys_active.set(pool.active_count(now) as i64);
        self.tasks_pinned.set(pins_len as i64);
        for key in pool.keys() {
            let name = key.name.as_str();
            self.key_up
                .with_label_values(&[name])
                .set(i64::from(pool.in_rotation(key, now)));
            match key.stats.balance() {
                Some(balance) => self.key_balance.with_label_values(&[name]).set(balance),
                None => {
                    // Absent, not zero: a failed read must not look like an empty account.
                    let _ = self.key_balance.remove_label_values(&[name]);
                }
            }
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("the text encoder writes to a Vec, which cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}
