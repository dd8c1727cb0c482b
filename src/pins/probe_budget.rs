//! The owner probe's budget: a token bucket of upstream requests, shared by the whole process, so
//! that ids without a pin cannot multiply upstream traffic. Knows counts and time only.
//!
//! Hand-written rather than `governor`: it must run on tokio's clock, so that paused-time
//! tests can show the refill, and read its rate and burst from the live config on each
//! take; it is a dozen lines under one lock.

use std::sync::Mutex;

use tokio::time::Instant;

/// Upstream probe requests that may be made now; refilled at a rate, up to a burst.
#[derive(Default)]
pub struct ProbeBudget {
    /// A std `Mutex`: a few arithmetic instructions, never across an await.
    bucket: Mutex<Option<Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl ProbeBudget {
    /// Takes `requests` tokens if there are that many, refilled at `rate` a second up to
    /// `burst` since the last take; all or none, so a probe never asks only some keys.
    /// The bucket starts full.
    pub(crate) fn try_take(&self, requests: u32, rate: f64, burst: u32, now: Instant) -> bool {
        let burst = f64::from(burst);
        let mut bucket = self.bucket.lock().expect("probe budget lock poisoned");
        let bucket = bucket.get_or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.at = bucket.at.max(now);
        let wanted = f64::from(requests);
        if bucket.tokens >= wanted {
            bucket.tokens -= wanted;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokio::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_refills_at_its_rate_up_to_its_burst() {
        let budget = ProbeBudget::default();
        let (rate, burst) = (10.0, 30);
        assert!(budget.try_take(16, rate, burst, Instant::now()));
        assert!(budget.try_take(14, rate, burst, Instant::now()));
        assert!(!budget.try_take(1, rate, burst, Instant::now()), "spent");
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert!(
            !budget.try_take(16, rate, burst, Instant::now()),
            "15 back, all or none"
        );
        assert!(budget.try_take(15, rate, burst, Instant::now()));
        // A long quiet spell refills no more than the burst.
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(budget.try_take(30, rate, burst, Instant::now()));
        assert!(!budget.try_take(1, rate, burst, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_smaller_burst_from_a_reload_caps_what_is_left() {
        let budget = ProbeBudget::default();
        assert!(budget.try_take(0, 1.0, 500, Instant::now()));
        assert!(budget.try_take(16, 1.0, 16, Instant::now()));
        assert!(!budget.try_take(1, 1.0, 16, Instant::now()));
    }

    proptest! {
        /// Over any sequence of takes and waits, what was granted never exceeds the burst
        /// plus the rate times the time passed.
        #[test]
        fn grants_never_exceed_burst_plus_rate_times_time(
            steps in proptest::collection::vec((1u32..40, 0u64..2_000), 1..200),
            rate in 0.5f64..100.0,
            burst in 16u32..200,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let budget = ProbeBudget::default();
                let start = Instant::now();
                let mut granted = 0u64;
                for (requests, wait_ms) in steps {
                    tokio::time::advance(Duration::from_millis(wait_ms)).await;
                    if budget.try_take(requests, rate, burst, Instant::now()) {
                        granted += u64::from(requests);
                    }
                    let allowed = f64::from(burst) + rate * start.elapsed().as_secs_f64();
                    prop_assert!(granted as f64 <= allowed + 1e-6);
                }
                Ok(())
            })?;
        }
    }
}
