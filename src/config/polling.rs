//! `[polling]`: how often keyrelay asks the service about a task, how long it keeps final
//! answers, and when it polls a task its caller has left.

use std::time::Duration;

use serde::Deserialize;
use toml::Value;

use super::problems::{a_type, Problems};
use super::units::{duration, Zero};

pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_KEEP_ANSWERS: Duration = Duration::from_secs(10 * 60);
pub const DEFAULT_KEEP_ANSWERS_MAX: usize = 100_000;
pub const DEFAULT_ORPHAN_AFTER: Duration = Duration::from_secs(30);
pub const DEFAULT_ORPHAN_POLLS_PER_SECOND: f64 = 20.0;
/// More would be a flood of the service, whatever the pool's size.
const MAX_ORPHAN_POLLS_PER_SECOND: f64 = 10_000.0;

/// `[polling]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Polling {
    /// Per task, at most one upstream poll per interval; zero relays every caller's poll
    /// as it comes (`first` included), as keyrelay did before shaping.
    pub interval: Duration,
    /// No upstream poll before this long after the submit.
    pub first: FirstPoll,
    /// How long a final answer is kept for repeated polls.
    pub keep_answers: Duration,
    /// At most this many final answers are kept; the oldest go first.
    pub keep_answers_max: usize,
    /// A task nobody polled for this long is polled by keyrelay itself.
    pub orphan_after: Duration,
    /// keyrelay's own polls of orphans, on average, per second.
    pub orphan_polls_per_second: f64,
}

/// `first`: a fixed delay, or the provider profile's advice for the task's method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstPoll {
    Auto,
    After(Duration),
}

impl Polling {
    /// Whether polls are shaped at all (`interval` above zero).
    pub fn shapes(&self) -> bool {
        !self.interval.is_zero()
    }

    /// Every poll relayed as it comes, as keyrelay did before shaping.
    pub fn off() -> Polling {
        Polling {
            interval: Duration::ZERO,
            first: FirstPoll::After(Duration::ZERO),
            ..Polling::default()
        }
    }
}

impl Default for Polling {
    fn default() -> Polling {
        Polling {
            interval: DEFAULT_POLL_INTERVAL,
            first: FirstPoll::Auto,
            keep_answers: DEFAULT_KEEP_ANSWERS,
            keep_answers_max: DEFAULT_KEEP_ANSWERS_MAX,
            orphan_after: DEFAULT_ORPHAN_AFTER,
            orphan_polls_per_second: DEFAULT_ORPHAN_POLLS_PER_SECOND,
        }
    }
}

/// `[polling]` as serde sees it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolling {
    pub interval: Option<Value>,
    pub first: Option<Value>,
    pub keep_answers: Option<Value>,
    pub keep_answers_max: Option<usize>,
    pub orphan_after: Option<Value>,
    pub orphan_polls_per_second: Option<f64>,
}

pub(super) fn polling(p: &mut Problems, raw: RawPolling) -> Polling {
    let interval = duration(
        p,
        "polling.interval",
        raw.interval,
        DEFAULT_POLL_INTERVAL,
        Zero::Allowed,
    );
    let first = match raw.first {
        None => FirstPoll::Auto,
        Some(Value::String(text)) if text.trim() == "auto" => FirstPoll::Auto,
        Some(other @ Value::String(_)) => FirstPoll::After(duration(
            p,
            "polling.first",
            Some(other),
            Duration::ZERO,
            Zero::Allowed,
        )),
        Some(other) => {
            p.add(
                "polling.first",
                format!(
                    "must be \"auto\" or a duration such as \"5s\", got {}",
                    a_type(&other)
                ),
            );
            FirstPoll::Auto
        }
    };
    let keep_answers = duration(
        p,
        "polling.keep_answers",
        raw.keep_answers,
        DEFAULT_KEEP_ANSWERS,
        Zero::Allowed,
    );
    let keep_answers_max = raw.keep_answers_max.unwrap_or(DEFAULT_KEEP_ANSWERS_MAX);
    let orphan_after = duration(
        p,
        "polling.orphan_after",
        raw.orphan_after,
        DEFAULT_ORPHAN_AFTER,
        Zero::Rejected,
    );
    let orphan_polls_per_second = match raw.orphan_polls_per_second {
        None => DEFAULT_ORPHAN_POLLS_PER_SECOND,
        Some(rate) if rate > 0.0 && rate <= MAX_ORPHAN_POLLS_PER_SECOND => rate,
        Some(rate) => {
            p.add(
                "polling.orphan_polls_per_second",
                format!("must be > 0 and <= {MAX_ORPHAN_POLLS_PER_SECOND}, got {rate}"),
            );
            DEFAULT_ORPHAN_POLLS_PER_SECOND
        }
    };
    Polling {
        interval,
        first,
        keep_answers,
        keep_answers_max,
        orphan_after,
        orphan_polls_per_second,
    }
}
