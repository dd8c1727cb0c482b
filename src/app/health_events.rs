//! Key health changes made visible: the one place where a key's state flips are applied,
//! logged, counted, announced on the event feed and, where replicas share the pool,
//! announced to the others (`SharedHealth`).

use tokio::time::Instant;

use super::{App, Event};
use crate::health::{Announcement, HealthEvent, Reason, StateKind, Transition};
use crate::pool::KeyEntry;

impl App {
    /// Applies a health event to a key, and logs, counts and announces the change if the
    /// key's state flipped. The one place where key state changes become visible.
    pub fn record_health(&self, key: &KeyEntry, event: HealthEvent) -> Option<Transition> {
        let transition = self.adopt_health(key, event)?;
        let now = Instant::now();
        // A cooldown's end goes by the wall clock: the replicas share no monotonic one.
        let until = self
            .0
            .health
            .view(key.id, now)
            .until
            .map(|until| std::time::SystemTime::now() + until.saturating_duration_since(now));
        let change = Announcement {
            state: transition.to,
            reason: transition.reason,
            until,
        };
        self.0.shared_health.announce(&key.name, change);
        Some(transition)
    }

    /// [`App::record_health`] for a change another replica announced: applied, logged and
    /// counted here, not announced again.
    pub fn adopt_health(&self, key: &KeyEntry, event: HealthEvent) -> Option<Transition> {
        let transition = self.0.health.record(key.id, event, Instant::now())?;
        let (from, to) = (transition.from.label(), transition.to.label());
        let reason = transition.reason.map_or("none", Reason::label);
        // One line per change, with both states and the reason: out of rotation is a warning.
        if transition.to == StateKind::Active {
            tracing::info!(key = %key.name, from, to, reason, "key state changed");
        } else {
            tracing::warn!(key = %key.name, from, to, reason, "key state changed");
        }
        self.0
            .metrics
            .key_transitions
            .with_label_values(&[key.name.as_str(), transition.to.label()])
            .inc();
        self.emit(|| Event::KeyState {
            key: key.name.clone(),
            from: transition.from,
            to: transition.to,
            reason: transition.reason,
        });
        Some(transition)
    }
}
