//! The series every relayed request adds to, resolved to handles once.
//!
//! `with_label_values` hashes each label value and looks its series up under a lock: 160 to
//! 210 instructions a call, and a relayed submit made three. A resolved series is an atomic
//! load away. Each is resolved on its first use, not up front, so that `/metrics` shows the
//! series it always did: one appears with its first event (per-key submits excepted, which
//! `Metrics::admit_keys` starts at 0 as before).

use std::sync::OnceLock;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

use super::{RequestOutcome, SubmitOutcome};
use crate::captcha::Endpoint;
use crate::fast_map::FastMap;
use crate::key_id::KeyId;
use crate::pool::KeyEntry;

const ENDPOINTS: usize = Endpoint::ALL.len();
const OUTCOMES: usize = RequestOutcome::ALL.len();
const SUBMIT_OUTCOMES: usize = SubmitOutcome::ALL.len();

/// Handles of `keyrelay_request_duration_seconds`, `keyrelay_key_submits_total` and
/// `keyrelay_upstream_duration_seconds`, by their labels.
pub(super) struct Resolved {
    requests: [[OnceLock<Histogram>; OUTCOMES]; ENDPOINTS],
    /// By key id: an id always names the same key name and provider (`registry`), the
    /// labels of its series.
    keys: FastMap<KeyId, KeySeries>,
}

struct KeySeries {
    submits: [OnceLock<IntCounter>; SUBMIT_OUTCOMES],
    upstream: [OnceLock<Histogram>; ENDPOINTS],
}

impl KeySeries {
    fn new() -> KeySeries {
        KeySeries {
            submits: [const { OnceLock::new() }; SUBMIT_OUTCOMES],
            upstream: [const { OnceLock::new() }; ENDPOINTS],
        }
    }
}

impl Resolved {
    pub(super) fn new() -> Resolved {
        Resolved {
            requests: [const { [const { OnceLock::new() }; OUTCOMES] }; ENDPOINTS],
            keys: FastMap::default(),
        }
    }

    /// The `{endpoint, outcome}` series of `vec`, `keyrelay_request_duration_seconds`.
    pub(super) fn request<'a>(
        &'a self,
        vec: &HistogramVec,
        endpoint: Endpoint,
        outcome: RequestOutcome,
    ) -> &'a Histogram {
        self.requests[endpoint as usize][outcome as usize]
            .get_or_init(|| vec.with_label_values(&[endpoint.label(), outcome.label()]))
    }

    /// Adds one to `key`'s `{key, outcome}` series of `vec`, `keyrelay_key_submits_total`.
    pub(super) fn count_submit(&self, vec: &IntCounterVec, key: &KeyEntry, outcome: SubmitOutcome) {
        self.with_key(key, |series| {
            series.submits[outcome as usize]
                .get_or_init(|| vec.with_label_values(&[key.name.as_str(), outcome.label()]))
                .inc();
        });
    }

    /// Records `seconds` in `key`'s `{key, provider, endpoint}` series of `vec`,
    /// `keyrelay_upstream_duration_seconds`.
    pub(super) fn observe_upstream(
        &self,
        vec: &HistogramVec,
        key: &KeyEntry,
        endpoint: Endpoint,
        seconds: f64,
    ) {
        self.with_key(key, |series| {
            series.upstream[endpoint as usize]
                .get_or_init(|| {
                    vec.with_label_values(&[
                        key.name.as_str(),
                        key.provider.name(),
                        endpoint.label(),
                    ])
                })
                .observe(seconds);
        });
    }

    fn with_key(&self, key: &KeyEntry, add: impl FnOnce(&KeySeries)) {
        if let Some(series) = self.keys.get(&key.id) {
            return add(&series);
        }
        let series = self.keys.entry(key.id).or_insert_with(KeySeries::new);
        add(&series.downgrade());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeyConfig, Upstream};
    use prometheus::core::Collector;
    use prometheus::{HistogramOpts, Opts};

    fn key(id: u16, name: &str) -> KeyEntry {
        let upstream = Upstream::parse("http://127.0.0.1:9").expect("literal");
        let config = KeyConfig::new(name, "aaaaaaaaaaaaaaaaaaaaaaaaaaaa0001", upstream);
        KeyEntry::from_config(KeyId(id), &config)
    }

    fn histograms(labels: &[&str]) -> HistogramVec {
        HistogramVec::new(HistogramOpts::new("h", "h"), labels).expect("valid")
    }

    /// The series of a vector, as a scrape would list them.
    fn series(vec: &impl Collector) -> usize {
        vec.collect()
            .iter()
            .map(|family| family.get_metric().len())
            .sum()
    }

    #[test]
    fn request_series_are_the_labelled_ones_and_appear_with_their_first_event() {
        let vec = histograms(&["endpoint", "outcome"]);
        let resolved = Resolved::new();
        assert_eq!(series(&vec), 0);
        for (endpoint, outcome, times) in [
            (Endpoint::In, RequestOutcome::Success, 3),
            (Endpoint::Res, RequestOutcome::Success, 1),
            (Endpoint::In, RequestOutcome::PoolFull, 2),
            (Endpoint::Solve, RequestOutcome::Denied, 1),
        ] {
            for _ in 0..times {
                resolved.request(&vec, endpoint, outcome).observe(0.5);
            }
        }
        assert_eq!(series(&vec), 4, "only the series used");
        let count = |endpoint: &str, outcome: &str| {
            vec.with_label_values(&[endpoint, outcome])
                .get_sample_count()
        };
        assert_eq!(count("in", "success"), 3);
        assert_eq!(count("res", "success"), 1);
        assert_eq!(count("in", "pool_full"), 2);
        assert_eq!(count("solve", "denied"), 1);
    }

    #[test]
    fn per_key_series_are_kept_apart_by_key_and_label() {
        let submits = IntCounterVec::new(Opts::new("c", "c"), &["key", "outcome"]).expect("valid");
        let upstream = histograms(&["key", "provider", "endpoint"]);
        let resolved = Resolved::new();
        let (a, b) = (key(0, "a"), key(1, "b"));
        for _ in 0..3 {
            resolved.count_submit(&submits, &a, SubmitOutcome::Ok);
        }
        resolved.count_submit(&submits, &a, SubmitOutcome::Transient);
        resolved.count_submit(&submits, &b, SubmitOutcome::Ok);
        resolved.observe_upstream(&upstream, &a, Endpoint::In, 0.1);
        resolved.observe_upstream(&upstream, &a, Endpoint::Res, 0.1);
        resolved.observe_upstream(&upstream, &b, Endpoint::Res, 0.1);
        resolved.observe_upstream(&upstream, &b, Endpoint::Res, 0.1);

        let submitted = |key: &str, outcome: &str| submits.with_label_values(&[key, outcome]).get();
        assert_eq!(submitted("a", "ok"), 3);
        assert_eq!(submitted("a", "transient"), 1);
        assert_eq!(submitted("b", "ok"), 1);
        let provider = a.provider.name();
        let timed = |key: &str, endpoint: &str| {
            upstream
                .with_label_values(&[key, provider, endpoint])
                .get_sample_count()
        };
        assert_eq!(timed("a", "in"), 1);
        assert_eq!(timed("a", "res"), 1);
        assert_eq!(timed("b", "res"), 2);
        assert_eq!(timed("b", "in"), 0);
    }
}
