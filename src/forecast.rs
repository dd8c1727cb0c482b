//! A key's balance trend: a small ring of `(time, balance)` readings over the last hour,
//! and what they say about its spend rate and when it runs out. Pure: the pool's key stats
//! feed it each reading; `/status` and the metrics read the [`Forecast`].

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// The window the spend rate is measured over.
pub const WINDOW: Duration = Duration::from_secs(3600);
/// The shortest span of readings a rate is drawn from: two reads a refresh apart say
/// too little, and a date drawn from them would swing with each one.
pub const MIN_SPAN: Duration = Duration::from_secs(300);
/// Readings kept; with a fast refresh the oldest go first, and the window shrinks to what
/// they span. Sixty a minute apart cover the hour.
const CAPACITY: usize = 64;
/// A balance change smaller than this is no movement (the service rounds to 1e-5).
const EPSILON: f64 = 1e-6;

/// The readings of one key.
#[derive(Debug, Default)]
pub struct BalanceHistory {
    samples: VecDeque<(Instant, f64)>,
}

/// What a key's readings say about its balance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Forecast {
    /// Too few readings, or too short a span since the first or since a top-up.
    Learning,
    /// The balance has not moved over the window while it was read: a thread plan, or an
    /// idle key. No date is given, because none follows.
    Flat,
    /// The balance falls by `per_hour` an hour and, at that rate, is gone in `runs_out_in`.
    Spending {
        per_hour: f64,
        runs_out_in: Duration,
    },
}

impl BalanceHistory {
    /// Adds a reading taken at `now`. A balance higher than the last is a top-up: the
    /// spending before it says nothing about the new balance's end, so the ring starts
    /// again from it.
    pub fn record(&mut self, now: Instant, balance: f64) {
        if !balance.is_finite() {
            return;
        }
        if self
            .samples
            .back()
            .is_some_and(|&(_, last)| balance > last + EPSILON)
        {
            self.samples.clear();
        }
        self.samples.push_back((now, balance));
        while self.samples.len() > CAPACITY {
            self.samples.pop_front();
        }
        self.forget_before(now);
    }

    /// Readings older than the window go, but one is kept from before it so that the
    /// window stays covered from end to end.
    fn forget_before(&mut self, now: Instant) {
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|&(at, _)| now.saturating_duration_since(at) >= WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// The trend at `now` from the readings in the window.
    pub fn forecast(&self, now: Instant) -> Forecast {
        let in_window = |&&(at, _): &&(Instant, f64)| now.saturating_duration_since(at) <= WINDOW;
        let (Some(&(first_at, first)), Some(&(last_at, last))) =
            (self.samples.iter().find(in_window), self.samples.back())
        else {
            return Forecast::Learning;
        };
        let span = last_at.saturating_duration_since(first_at);
        if span < MIN_SPAN {
            return Forecast::Learning;
        }
        let spent = first - last;
        if spent <= EPSILON {
            return Forecast::Flat;
        }
        let per_second = spent / span.as_secs_f64();
        let left = last.max(0.0) / per_second;
        Forecast::Spending {
            per_hour: per_second * 3600.0,
            runs_out_in: Duration::try_from_secs_f64(left).unwrap_or(Duration::MAX),
        }
    }
}

/// A forecast as `/status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ForecastStatus {
    /// `learning`, `flat` or `spending`.
    pub trend: &'static str,
    /// Balance spent an hour at the window's rate; 0 while flat, `null` while learning.
    pub spend_per_hour: Option<f64>,
    /// Seconds until the balance runs out at that rate; `null` unless spending.
    pub runs_out_in_seconds: Option<u64>,
}

impl From<Forecast> for ForecastStatus {
    fn from(forecast: Forecast) -> ForecastStatus {
        match forecast {
            Forecast::Learning => ForecastStatus {
                trend: "learning",
                spend_per_hour: None,
                runs_out_in_seconds: None,
            },
            Forecast::Flat => ForecastStatus {
                trend: "flat",
                spend_per_hour: Some(0.0),
                runs_out_in_seconds: None,
            },
            Forecast::Spending {
                per_hour,
                runs_out_in,
            } => ForecastStatus {
                trend: "spending",
                spend_per_hour: Some(per_hour),
                runs_out_in_seconds: Some(runs_out_in.as_secs()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    /// Readings a minute apart from `start`, one per balance.
    fn read(history: &mut BalanceHistory, start: Instant, balances: &[f64]) -> Instant {
        let mut at = start;
        for (i, &balance) in balances.iter().enumerate() {
            at = start + MINUTE * i as u32;
            history.record(at, balance);
        }
        at
    }

    #[test]
    fn a_steady_spend_gives_its_rate_and_the_time_left() {
        let mut history = BalanceHistory::default();
        // 0.1 a minute for ten minutes: 6 an hour, 9 left, so 90 minutes.
        let balances: Vec<f64> = (0..=10).map(|i| 10.0 - 0.1 * f64::from(i)).collect();
        let now = read(&mut history, Instant::now(), &balances);
        let Forecast::Spending {
            per_hour,
            runs_out_in,
        } = history.forecast(now)
        else {
            panic!("expected spending, got {:?}", history.forecast(now));
        };
        assert!((per_hour - 6.0).abs() < 1e-9, "{per_hour}");
        assert_eq!(runs_out_in.as_secs(), 90 * 60);
    }

    #[test]
    fn a_balance_that_does_not_move_is_flat_not_a_date() {
        let mut history = BalanceHistory::default();
        let now = read(&mut history, Instant::now(), &[25.0; 11]);
        assert_eq!(history.forecast(now), Forecast::Flat);
        let status = ForecastStatus::from(Forecast::Flat);
        assert_eq!((status.trend, status.runs_out_in_seconds), ("flat", None));
    }

    #[test]
    fn too_short_a_span_is_still_learning() {
        let mut history = BalanceHistory::default();
        assert_eq!(history.forecast(Instant::now()), Forecast::Learning);
        let now = read(&mut history, Instant::now(), &[10.0, 9.0, 8.0, 7.0]);
        assert_eq!(history.forecast(now), Forecast::Learning, "three minutes");
    }

    #[test]
    fn a_top_up_starts_the_trend_again() {
        let mut history = BalanceHistory::default();
        let start = Instant::now();
        let now = read(&mut history, start, &[10.0, 9.0, 8.0, 7.0, 6.0, 5.0]);
        assert!(matches!(history.forecast(now), Forecast::Spending { .. }));
        history.record(now + MINUTE, 50.0);
        assert_eq!(history.forecast(now + MINUTE), Forecast::Learning);
        // The new balance's own trend, from the top-up on: 1 a minute.
        for i in 2..=7 {
            history.record(now + MINUTE * i, 51.0 - f64::from(i));
        }
        let Forecast::Spending { per_hour, .. } = history.forecast(now + MINUTE * 7) else {
            panic!("expected spending after the top-up");
        };
        assert!((per_hour - 60.0).abs() < 1e-9, "{per_hour}");
    }

    #[test]
    fn only_the_last_hour_counts() {
        let mut history = BalanceHistory::default();
        let start = Instant::now();
        // A fast spend long ago, then an hour and more of none.
        history.record(start, 100.0);
        history.record(start + MINUTE * 10, 50.0);
        for i in 0..=70 {
            history.record(start + MINUTE * (20 + i), 50.0);
        }
        assert_eq!(history.forecast(start + MINUTE * 90), Forecast::Flat);
    }

    #[test]
    fn a_spent_balance_runs_out_now() {
        let mut history = BalanceHistory::default();
        let now = read(
            &mut history,
            Instant::now(),
            &[3.0, 2.0, 1.0, 0.5, 0.2, 0.0],
        );
        let Forecast::Spending { runs_out_in, .. } = history.forecast(now) else {
            panic!("expected spending");
        };
        assert_eq!(runs_out_in, Duration::ZERO);
    }
}
