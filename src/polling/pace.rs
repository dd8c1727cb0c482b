//! How many orphan polls may go now: `orphan_polls_per_second` on average, and never more
//! than twice that in any one second (a bucket that holds one second's worth).

use tokio::time::Instant;

/// A token bucket refilled at `rate` a second, holding at most `rate` tokens (one, for a
/// rate below one).
#[derive(Debug)]
pub struct Pace {
    tokens: f64,
    last: Instant,
}

impl Pace {
    /// A bucket that starts empty: a restart does not begin with a burst.
    pub fn new(now: Instant) -> Pace {
        Pace {
            tokens: 0.0,
            last: now,
        }
    }

    /// How many polls may go at `now`, at `rate` a second; they are taken from the bucket.
    pub fn take(&mut self, rate: f64, now: Instant) -> usize {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        let room = rate.max(1.0);
        self.tokens = (self.tokens + elapsed * rate).min(room);
        let whole = self.tokens.floor();
        self.tokens -= whole;
        whole as usize
    }

    /// Gives back polls taken but not made (fewer orphans were due).
    pub fn give_back(&mut self, unused: usize, rate: f64) {
        self.tokens = (self.tokens + unused as f64).min(rate.max(1.0));
    }
}
