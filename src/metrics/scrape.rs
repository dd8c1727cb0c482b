//! The scrape: the text exposition, with the pool's gauges computed at scrape time (a
//! cooldown ends by the clock, not by an event that could update them), and the fleet's,
//! the forecast's and the scaling figures beside them.

use prometheus::{Encoder, IntGaugeVec, TextEncoder};
use tokio::time::Instant;

use super::Metrics;
use crate::cluster::{Cluster, Op as ClusterOp};
use crate::forecast::Forecast;
use crate::health::{Reason, StateKind};
use crate::pins::PinStore;
use crate::pool::{AdminHold, KeyPool};
use crate::scaling::Scaling;

/// What a scrape shows beside the pool's own figures.
pub struct Scene<'a> {
    /// The pool-wide figures and their recommendation, as `/scaling` answers them.
    pub scaling: Scaling,
    pub brake_balance: f64,
    /// All upstream traffic paused after an IP ban.
    pub paused: bool,
    pub cluster: Option<&'a Cluster>,
    pub now: Instant,
}

impl Metrics {
    /// The text exposition. Pool gauges are computed here, at scrape time, because a cooldown
    /// ends by the clock rather than by an event that could update them.
    pub fn render(&self, pool: &KeyPool, pins: &dyn PinStore, scene: Scene<'_>) -> String {
        let Scene {
            scaling,
            brake_balance,
            paused,
            cluster,
            now,
        } = scene;
        self.upstream_paused.set(i64::from(paused));
        if let Some(cluster) = cluster {
            self.render_cluster(cluster, pool);
        }
        self.render_scaling(&scaling, brake_balance, cluster.is_some());
        self.queue_length.set(scaling.queued as i64);
        self.keys_configured.set(pool.keys().len() as i64);
        self.keys_active.set(pool.active_count(now) as i64);
        self.tasks_pinned.set(pins.len() as i64);
        // Only the providers of the running pool: one whose keys all left has no state.
        self.provider_up.reset();
        for provider in pool.providers() {
            let out = pool.outages().view(provider, now).out;
            self.provider_up
                .with_label_values(&[provider.name()])
                .set(i64::from(!out));
        }
        // Reasons change with the state; stale series would claim two reasons at once.
        self.key_state_reason.reset();
        // Only the keys of the running pool: a removed key's hold is gone with it.
        self.key_admin_hold.reset();
        for key in pool.keys() {
            let name = key.name.as_str();
            let view = pool.health(key, now);
            self.key_up
                .with_label_values(&[name])
                .set(i64::from(pool.in_rotation(key, now)));
            for &state in StateKind::ALL {
                self.key_state
                    .with_label_values(&[name, state.label()])
                    .set(i64::from(view.state == state));
            }
            self.key_state_reason
                .with_label_values(&[name, view.reason.map_or("none", Reason::label)])
                .set(1);
            let hold = pool.admin_hold(key);
            for &each in AdminHold::ALL {
                self.key_admin_hold
                    .with_label_values(&[name, each.label()])
                    .set(i64::from(hold == Some(each)));
            }
            // Absent, not zero, while unknown: a failed read must not look like an empty
            // account or an idle key.
            match key.stats.balance() {
                Some(balance) => self.key_balance.with_label_values(&[name]).set(balance),
                None => {
                    let _ = self.key_balance.remove_label_values(&[name]);
                }
            }
            match key.thread_capacity() {
                Some(threads) => self
                    .key_threads
                    .with_label_values(&[name])
                    .set(i64::from(threads)),
                None => {
                    let _ = self.key_threads.remove_label_values(&[name]);
                }
            }
            match key.stats.threads() {
                Some((_, working)) => self
                    .key_working_threads
                    .with_label_values(&[name])
                    .set(i64::from(working)),
                None => {
                    let _ = self.key_working_threads.remove_label_values(&[name]);
                }
            }
            self.render_forecast(name, key.stats.forecast(now));
            let load = pool.load(key);
            self.key_tasks_in_flight
                .with_label_values(&[name])
                .set(i64::from(load.open));
            self.key_threads_in_use
                .with_label_values(&[name])
                .set(i64::from(load.in_use()));
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("the text encoder writes to a Vec, which cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }

    fn render_scaling(&self, scaling: &Scaling, brake_balance: f64, fleet: bool) {
        let scope = [if fleet { "fleet" } else { "pool" }];
        let gauge = |vec: &IntGaugeVec, value: u64| {
            vec.with_label_values(&scope)
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        gauge(&self.pool_threads, scaling.threads_total);
        gauge(&self.pool_threads_in_use, scaling.threads_in_use);
        gauge(&self.pool_threads_free, scaling.threads_free);
        self.scaling_brake_balance
            .with_label_values(&scope)
            .set(brake_balance);
        // Absent while unknown, as each key's balance: a missing figure must not brake.
        match scaling.balance_total {
            Some(balance) => self.pool_balance.with_label_values(&scope).set(balance),
            None => {
                let _ = self.pool_balance.remove_label_values(&scope);
            }
        }
    }

    fn render_forecast(&self, key: &str, forecast: Forecast) {
        let (spend, runs_out) = match forecast {
            Forecast::Learning => (None, None),
            Forecast::Flat => (Some(0.0), None),
            Forecast::Spending {
                per_hour,
                runs_out_in,
            } => (Some(per_hour), Some(runs_out_in.as_secs_f64())),
        };
        for (vec, value) in [
            (&self.key_spend_per_hour, spend),
            (&self.key_balance_runs_out, runs_out),
        ] {
            match value {
                Some(value) => vec.with_label_values(&[key]).set(value),
                None => {
                    let _ = vec.remove_label_values(&[key]);
                }
            }
        }
    }

    fn render_cluster(&self, cluster: &Cluster, pool: &KeyPool) {
        let replica = [cluster.replica()];
        self.cluster_up
            .with_label_values(&replica)
            .set(i64::from(cluster.is_shared()));
        self.cluster_replicas
            .with_label_values(&replica)
            .set(cluster.live_replicas().len() as i64);
        self.cluster_pin_backlog
            .with_label_values(&replica)
            .set(cluster.backlog_len() as i64);
        for &op in ClusterOp::ALL {
            let counter = self.cluster_errors.with_label_values(&[op.label()]);
            counter.inc_by(cluster.errors(op).saturating_sub(counter.get()));
            let counter = self.cluster_round_trips.with_label_values(&[op.label()]);
            counter.inc_by(cluster.round_trips(op).saturating_sub(counter.get()));
        }
        for key in pool.keys() {
            self.cluster_threads_held
                .with_label_values(&[key.name.as_str(), "fleet"])
                .set(i64::from(
                    key.stats
                        .shared
                        .held
                        .load(std::sync::atomic::Ordering::Relaxed),
                ));
            self.cluster_spares
                .with_label_values(&[key.name.as_str()])
                .set(i64::from(
                    key.stats
                        .shared
                        .spares
                        .load(std::sync::atomic::Ordering::Relaxed),
                ));
        }
    }
}
