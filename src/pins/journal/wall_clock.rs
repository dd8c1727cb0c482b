//! The journal's dates: tokio instants in memory, wall-clock unix milliseconds on disk, mapped
//! through one anchor taken when the store opens. Knows time, not records or files.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Maps tokio instants to wall-clock time and back, through one anchor taken at open. Pins
/// written later are dated by the monotonic clock's distance from the anchor, so a wall-clock
/// step while running does not reorder them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock {
    pub(super) instant: Instant,
    pub(super) wall: SystemTime,
}

impl Clock {
    pub(super) fn now() -> Clock {
        Clock {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Unix milliseconds at `at` (0 before 1970, saturating far in the future).
    pub(super) fn unix_millis(&self, at: Instant) -> u64 {
        let wall = if at >= self.instant {
            self.wall
                .checked_add(at.saturating_duration_since(self.instant))
        } else {
            self.wall
                .checked_sub(self.instant.saturating_duration_since(at))
        };
        wall.and_then(|wall| wall.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            })
    }

    /// Age at the anchor of a pin created at `created_ms`. A pin from the future (the wall
    /// clock was stepped back) counts as brand new.
    pub(super) fn age(&self, created_ms: u64) -> Duration {
        Duration::from_millis(self.unix_millis(self.instant).saturating_sub(created_ms))
    }

    /// The instant `age` before the anchor. Should it precede what the monotonic clock can
    /// express (shortly after boot), the pin counts as new: it lives up to one TTL longer.
    pub(super) fn instant_aged(&self, age: Duration) -> Instant {
        self.instant.checked_sub(age).unwrap_or(self.instant)
    }
}
