//! Key health: whether each key is in rotation, and if not, why and until when.
//!
//! Health sits behind the narrow [`HealthStore`] interface so that a shared store (Redis, for
//! several replicas acting as one pool) can replace [`MemoryHealth`] without touching the
//! proxy. The store knows nothing of HTTP or of error codes: callers decide what an outcome
//! means (see `captcha::classify`) and tell the store to bench, cool or restore a key.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::fast_map::FastMap;
use crate::key_id::KeyId;

mod reason;
mod shared;

pub use reason::Reason;
pub use shared::{Announcement, NoSharedHealth, SharedHealth};

/// Where a key stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// In rotation.
    Active,
    /// Out of rotation until a deadline: full right now, or too many transient failures.
    Cooling,
    /// Out of rotation until a refresh shows the key usable again.
    Benched,
}

impl StateKind {
    /// Every state, for metric series that start at 0.
    pub const ALL: &'static [StateKind] =
        &[StateKind::Active, StateKind::Cooling, StateKind::Benched];

    /// Metric label and status text.
    pub fn label(self) -> &'static str {
        match self {
            StateKind::Active => "active",
            StateKind::Cooling => "cooling",
            StateKind::Benched => "benched",
        }
    }
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A key's health as seen at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthView {
    pub state: StateKind,
    /// The code or cause that took the key out; `None` while active.
    pub reason: Option<Reason>,
    /// When the key entered this state.
    pub since: Instant,
    /// End of a cooldown.
    pub until: Option<Instant>,
    /// When the key last came back into rotation after being out (a cooldown ended, or a
    /// refresh restored it); `None` if it never left. Slow start ramps a key's share from here.
    pub returned: Option<Instant>,
}

/// What a caller tells the store about a key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HealthEvent {
    /// The key answered normally: clears the run of transient failures.
    Success,
    /// A network error, 5xx or server error. After `threshold` in a row the key cools down:
    /// for `cooldown` the first time, doubling with each ejection that follows without a
    /// success in between, up to `max_cooldown`, times `jitter` (near 1, drawn by the caller)
    /// so that keys ejected together do not return together. A single one never takes a key
    /// out; `threshold: u32::MAX` only counts.
    Transient {
        threshold: u32,
        cooldown: Duration,
        max_cooldown: Duration,
        jitter: f64,
    },
    /// Take the key out for a while.
    Cool { reason: Reason, duration: Duration },
    /// Take the key out until a refresh restores it.
    Bench { reason: Reason },
    /// Put the key back in rotation.
    Restore,
}

/// A change of state, returned so the caller can log and count flips, and only flips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: StateKind,
    pub to: StateKind,
    pub reason: Option<Reason>,
}

/// The narrow interface to key health.
pub trait HealthStore: Send + Sync + 'static {
    /// The key's state at `now`. A cooldown that has run out reads as active.
    fn view(&self, key: KeyId, now: Instant) -> HealthView;
    /// Applies an event; returns the transition if the state changed.
    fn record(&self, key: KeyId, event: HealthEvent, now: Instant) -> Option<Transition>;
}

// === impl MemoryHealth ===

/// In-process health table.
///
/// Each key's entry is updated under the map's shard lock for the few instructions an event
/// takes; nothing is awaited while it is held.
#[derive(Debug)]
pub struct MemoryHealth {
    entries: FastMap<KeyId, Entry>,
    /// When the store was made: a key no event has touched has been active since then, so
    /// its `since` reads the same on every look (and after its first success).
    started: Instant,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    state: StateKind,
    reason: Option<Reason>,
    since: Instant,
    until: Option<Instant>,
    transient_run: u32,
    /// Transient ejections since the last success: each one doubles the next cooldown.
    ejections: u32,
    returned: Option<Instant>,
}

impl Entry {
    fn active(since: Instant) -> Entry {
        Entry {
            state: StateKind::Active,
            reason: None,
            since,
            until: None,
            transient_run: 0,
            ejections: 0,
            returned: None,
        }
    }

    /// Back in rotation at `at`, after being out. Ejections are remembered until the key
    /// proves itself with a success.
    fn back(&self, at: Instant) -> Entry {
        Entry {
            ejections: self.ejections,
            returned: Some(at),
            ..Entry::active(at)
        }
    }

    /// Folds an expired cooldown into the active state it has become.
    fn settle(&mut self, now: Instant) {
        if let (StateKind::Cooling, Some(until)) = (self.state, self.until) {
            if until <= now {
                *self = self.back(until);
            }
        }
    }

    fn view(&self) -> HealthView {
        HealthView {
            state: self.state,
            reason: self.reason,
            since: self.since,
            until: self.until,
            returned: self.returned,
        }
    }
}

impl MemoryHealth {
    pub fn new() -> MemoryHealth {
        MemoryHealth {
            entries: FastMap::default(),
            started: Instant::now(),
        }
    }
}

impl Default for MemoryHealth {
    fn default() -> MemoryHealth {
        MemoryHealth::new()
    }
}

impl HealthStore for MemoryHealth {
    fn view(&self, key: KeyId, now: Instant) -> HealthView {
        match self.entries.get(&key) {
            Some(entry) => {
                let mut entry = *entry;
                entry.settle(now);
                entry.view()
            }
            // Keys start active, as of the store's start.
            None => Entry::active(self.started.min(now)).view(),
        }
    }

    fn record(&self, key: KeyId, event: HealthEvent, now: Instant) -> Option<Transition> {
        let mut entry = self
            .entries
            .entry(key)
            .or_insert_with(|| Entry::active(self.started.min(now)));
        entry.settle(now);
        let before = entry.state;
        match event {
            HealthEvent::Success => {
                entry.transient_run = 0;
                if entry.state == StateKind::Active {
                    entry.ejections = 0;
                }
                return None;
            }
            HealthEvent::Transient {
                threshold,
                cooldown,
                max_cooldown,
                jitter,
            } => {
                entry.transient_run = entry.transient_run.saturating_add(1);
                if entry.state != StateKind::Active || entry.transient_run < threshold.max(1) {
                    return None;
                }
                let grown = cooldown
                    .saturating_mul(2u32.saturating_pow(entry.ejections))
                    .min(max_cooldown);
                let jittered = grown.mul_f64(jitter.clamp(0.0, 2.0)).min(max_cooldown);
                entry.transient_run = 0;
                entry.ejections = entry.ejections.saturating_add(1);
                set(&mut entry, StateKind::Cooling, Some(Reason::Transient), now);
                entry.until = Some(now + jittered);
            }
            HealthEvent::Cool { reason, duration } => {
                // A benched key stays benched: only a refresh may bring it back.
                if entry.state == StateKind::Benched {
                    return None;
                }
                set(&mut entry, StateKind::Cooling, Some(reason), now);
                entry.until = Some(now + duration);
            }
            HealthEvent::Bench { reason } => {
                if entry.state == StateKind::Benched && entry.reason == Some(reason) {
                    return None;
                }
                set(&mut entry, StateKind::Benched, Some(reason), now);
            }
            HealthEvent::Restore => {
                if entry.state == StateKind::Active {
                    return None;
                }
                *entry = entry.back(now);
            }
        }
        (entry.state != before || event_changes_reason(&event)).then_some(Transition {
            from: before,
            to: entry.state,
            reason: entry.reason,
        })
    }
}

/// Cooling again while cooling, or benching for a new reason, is a change worth reporting.
fn event_changes_reason(event: &HealthEvent) -> bool {
    matches!(event, HealthEvent::Cool { .. } | HealthEvent::Bench { .. })
}

fn set(entry: &mut Entry, state: StateKind, reason: Option<Reason>, now: Instant) {
    if entry.state != state {
        entry.since = now;
    }
    entry.state = state;
    entry.reason = reason;
    entry.until = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: KeyId = KeyId(0);

    fn code(code: &str) -> Reason {
        Reason::of_code(code)
    }
    const TRANSIENT: HealthEvent = HealthEvent::Transient {
        threshold: 3,
        cooldown: Duration::from_secs(30),
        max_cooldown: Duration::from_secs(300),
        jitter: 1.0,
    };

    #[tokio::test(start_paused = true)]
    async fn keys_start_active() {
        let health = MemoryHealth::new();
        assert_eq!(health.view(K, Instant::now()).state, StateKind::Active);
    }

    #[tokio::test(start_paused = true)]
    async fn bench_holds_until_restore() {
        let health = MemoryHealth::new();
        let now = Instant::now();
        let t = health
            .record(
                K,
                HealthEvent::Bench {
                    reason: code("ERROR_KEY_DOES_NOT_EXIST"),
                },
                now,
            )
            .expect("benching an active key is a flip");
        assert_eq!(
            (t.from, t.to, t.reason),
            (
                StateKind::Active,
                StateKind::Benched,
                Some(code("ERROR_KEY_DOES_NOT_EXIST"))
            )
        );
        tokio::time::advance(Duration::from_secs(3600)).await;
        let view = health.view(K, Instant::now());
        assert_eq!(view.state, StateKind::Benched);
        assert_eq!(view.since, now);
        // A cooldown cannot shorten a bench.
        let cool = HealthEvent::Cool {
            reason: code("ERROR_NO_SLOT_AVAILABLE"),
            duration: Duration::from_secs(1),
        };
        assert_eq!(health.record(K, cool, Instant::now()), None);
        assert_eq!(health.view(K, Instant::now()).state, StateKind::Benched);
        let t = health
            .record(K, HealthEvent::Restore, Instant::now())
            .unwrap();
        assert_eq!(t.to, StateKind::Active);
        assert_eq!(health.record(K, HealthEvent::Restore, Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_no_event_moved_has_been_active_since_the_start() {
        let health = MemoryHealth::new();
        let started = Instant::now();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(health.view(K, Instant::now()).since, started, "untouched");
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            health.view(K, Instant::now()).since,
            started,
            "looked at later"
        );
        // Events that leave the key active do not restart its clock either.
        assert_eq!(health.record(K, HealthEvent::Success, Instant::now()), None);
        assert_eq!(health.record(K, HealthEvent::Restore, Instant::now()), None);
        let view = health.view(K, Instant::now());
        assert_eq!((view.state, view.since), (StateKind::Active, started));
        // A real change does.
        let now = Instant::now();
        health.record(
            K,
            HealthEvent::Bench {
                reason: code("ERROR_WRONG_USER_KEY"),
            },
            now,
        );
        assert_eq!(health.view(K, Instant::now()).since, now);
    }

    #[tokio::test(start_paused = true)]
    async fn cooldown_ends_by_itself() {
        let health = MemoryHealth::new();
        let cool = HealthEvent::Cool {
            reason: code("MAX_USER_TURN"),
            duration: Duration::from_secs(10),
        };
        health.record(K, cool, Instant::now()).unwrap();
        tokio::time::advance(Duration::from_millis(9_999)).await;
        let view = health.view(K, Instant::now());
        assert_eq!(view.state, StateKind::Cooling);
        assert_eq!(view.reason, Some(code("MAX_USER_TURN")));
        tokio::time::advance(Duration::from_millis(1)).await;
        let view = health.view(K, Instant::now());
        assert_eq!(view.state, StateKind::Active);
        assert_eq!(view.reason, None);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_cool_only_after_a_run() {
        let health = MemoryHealth::new();
        let now = Instant::now();
        assert_eq!(health.record(K, TRANSIENT, now), None);
        assert_eq!(health.record(K, TRANSIENT, now), None);
        // A success in between resets the run.
        health.record(K, HealthEvent::Success, now);
        assert_eq!(health.record(K, TRANSIENT, now), None);
        assert_eq!(health.record(K, TRANSIENT, now), None);
        let t = health
            .record(K, TRANSIENT, now)
            .expect("third in a row cools");
        assert_eq!(
            (t.to, t.reason),
            (StateKind::Cooling, Some(Reason::Transient))
        );
        assert_eq!(
            health.view(K, now).until,
            Some(now + Duration::from_secs(30))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_never_bench() {
        let health = MemoryHealth::new();
        for _ in 0..100 {
            health.record(K, TRANSIENT, Instant::now());
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_ne!(health.view(K, Instant::now()).state, StateKind::Benched);
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_ejections_double_the_cooldown_up_to_the_cap() {
        let health = MemoryHealth::new();
        let mut seen = Vec::new();
        for _ in 0..6 {
            let now = Instant::now();
            for _ in 0..3 {
                health.record(K, TRANSIENT, now);
            }
            let until = health.view(K, now).until.expect("cooling");
            seen.push((until - now).as_secs());
            tokio::time::advance(until - now).await;
            assert_eq!(health.view(K, Instant::now()).state, StateKind::Active);
        }
        assert_eq!(seen, vec![30, 60, 120, 240, 300, 300]);
        // A success resets the growth.
        health.record(K, HealthEvent::Success, Instant::now());
        for _ in 0..3 {
            health.record(K, TRANSIENT, Instant::now());
        }
        let now = Instant::now();
        assert_eq!(
            health.view(K, now).until,
            Some(now + Duration::from_secs(30))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_scales_the_cooldown_within_the_cap() {
        let health = MemoryHealth::new();
        let event = |jitter| HealthEvent::Transient {
            threshold: 1,
            cooldown: Duration::from_secs(100),
            max_cooldown: Duration::from_secs(110),
            jitter,
        };
        let now = Instant::now();
        health.record(K, event(0.9), now);
        assert_eq!(
            health.view(K, now).until,
            Some(now + Duration::from_secs(90))
        );
        health.record(KeyId(1), event(1.2), now);
        assert_eq!(
            health.view(KeyId(1), now).until,
            Some(now + Duration::from_secs(110)),
            "capped after jitter"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_threshold_only_counts() {
        let health = MemoryHealth::new();
        let count_only = HealthEvent::Transient {
            threshold: u32::MAX,
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(300),
            jitter: 1.0,
        };
        for _ in 0..1000 {
            assert_eq!(health.record(K, count_only, Instant::now()), None);
        }
        assert_eq!(health.view(K, Instant::now()).state, StateKind::Active);
    }
}
