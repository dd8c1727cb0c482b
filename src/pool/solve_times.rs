//! Observed solve times per provider and method: how long after its submit a task's
//! solution was seen, over the last 50 solves or 10 minutes, whichever is fewer. The
//! `fastest` strategy reads it once a pair has 5 solves; `keyrelay_solve_seconds` shows it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::provider::Provider;

/// Solves kept per provider and method.
pub const WINDOW: usize = 50;
/// And none older than this.
pub const MAX_AGE: Duration = Duration::from_secs(600);
/// Solves a pair needs before the `fastest` strategy trusts its time.
pub const MIN_SOLVES: usize = 5;
/// Pairs tracked at most: methods are the caller's words, and each pair is a metric series.
const MAX_PAIRS: usize = 128;

/// One pair's solves: when each was seen, and how long it took.
type Solves = VecDeque<(Instant, Duration)>;

/// Solve times, shared by every pool as health is.
#[derive(Default)]
pub struct SolveTimes {
    by_pair: Mutex<HashMap<(Provider, String), Solves>>,
}

impl SolveTimes {
    /// A task of `method` at `provider` was solved `took` after its submit, seen at `now`.
    pub fn record(&self, provider: Provider, method: &str, took: Duration, now: Instant) {
        let method = method.trim().to_ascii_lowercase();
        let mut by_pair = self.by_pair.lock().unwrap_or_else(PoisonError::into_inner);
        let full = by_pair.len() >= MAX_PAIRS;
        let solves = match by_pair.get_mut(&(provider, method.clone())) {
            Some(solves) => solves,
            None if full => return,
            None => by_pair.entry((provider, method)).or_default(),
        };
        solves.push_back((now, took));
        if solves.len() > WINDOW {
            solves.pop_front();
        }
    }

    /// The mean solve time of `method` at `provider` over the window ending at `now`, once
    /// it holds [`MIN_SOLVES`] solves.
    pub fn typical(&self, provider: Provider, method: &str, now: Instant) -> Option<Duration> {
        let method = method.trim().to_ascii_lowercase();
        let mut by_pair = self.by_pair.lock().unwrap_or_else(PoisonError::into_inner);
        let solves = by_pair.get_mut(&(provider, method))?;
        prune(solves, now);
        mean(solves, MIN_SOLVES)
    }

    /// Every pair with a solve in the window, and its mean: for the metric.
    pub fn all(&self, now: Instant) -> Vec<(Provider, String, Duration)> {
        let mut by_pair = self.by_pair.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<(Provider, String, Duration)> = by_pair
            .iter_mut()
            .filter_map(|((provider, method), solves)| {
                prune(solves, now);
                Some((*provider, method.clone(), mean(solves, 1)?))
            })
            .collect();
        all.sort_by(|a, b| (a.0.name(), &a.1).cmp(&(b.0.name(), &b.1)));
        all
    }
}

fn prune(solves: &mut Solves, now: Instant) {
    while solves
        .front()
        .is_some_and(|(at, _)| now.saturating_duration_since(*at) > MAX_AGE)
    {
        solves.pop_front();
    }
}

fn mean(solves: &Solves, at_least: usize) -> Option<Duration> {
    if solves.len() < at_least.max(1) {
        return None;
    }
    let total: Duration = solves.iter().map(|(_, took)| *took).sum();
    Some(total / u32::try_from(solves.len()).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_pair_is_trusted_from_its_fifth_solve_and_averages_its_window() {
        let times = SolveTimes::default();
        let t0 = Instant::now();
        for n in 1..=4u32 {
            times.record(Provider::TwoCaptcha, "userrecaptcha", n * 10 * S, t0);
            assert_eq!(
                times.typical(Provider::TwoCaptcha, "userrecaptcha", t0),
                None
            );
        }
        times.record(Provider::TwoCaptcha, "UserReCaptcha", 50 * S, t0);
        assert_eq!(
            times.typical(Provider::TwoCaptcha, "userrecaptcha", t0),
            Some(30 * S)
        );
        assert_eq!(
            times.typical(Provider::RuCaptcha, "userrecaptcha", t0),
            None
        );
        assert_eq!(times.typical(Provider::TwoCaptcha, "base64", t0), None);
        assert_eq!(
            times.all(t0),
            vec![(Provider::TwoCaptcha, "userrecaptcha".to_owned(), 30 * S)]
        );
    }

    #[test]
    fn the_window_keeps_the_last_50_solves_of_the_last_10_minutes() {
        let times = SolveTimes::default();
        let t0 = Instant::now();
        for _ in 0..60 {
            times.record(Provider::CaptchaAi, "base64", 100 * S, t0);
        }
        for _ in 0..50 {
            times.record(Provider::CaptchaAi, "base64", 2 * S, t0 + S);
        }
        assert_eq!(
            times.typical(Provider::CaptchaAi, "base64", t0 + S),
            Some(2 * S)
        );
        assert_eq!(
            times.typical(Provider::CaptchaAi, "base64", t0 + S + MAX_AGE),
            Some(2 * S)
        );
        assert_eq!(
            times.typical(Provider::CaptchaAi, "base64", t0 + 2 * S + MAX_AGE),
            None
        );
        assert!(times.all(t0 + 2 * S + MAX_AGE).is_empty());
    }

    #[test]
    fn methods_past_the_cap_are_not_tracked() {
        let times = SolveTimes::default();
        let t0 = Instant::now();
        for n in 0..MAX_PAIRS + 10 {
            for _ in 0..MIN_SOLVES {
                times.record(Provider::CaptchaAi, &format!("m{n}"), S, t0);
            }
        }
        assert_eq!(times.all(t0).len(), MAX_PAIRS);
        assert_eq!(times.typical(Provider::CaptchaAi, "m0", t0), Some(S));
        assert_eq!(
            times.typical(Provider::CaptchaAi, &format!("m{MAX_PAIRS}"), t0),
            None
        );
    }
}
