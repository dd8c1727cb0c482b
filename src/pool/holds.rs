//! Operator holds on keys, by key name: a disabled key takes no new task and no background
//! read; a draining key takes no new task but is still refreshed. Kept outside every pool
//! snapshot (shared by all of them, as health is), so that a hold lasts through refreshes
//! and reloads until the operator lifts it. Knows names only; which names exist is the
//! caller's business.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// What an operator put on a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdminHold {
    /// No new tasks, no background refresh or verdict checks. Its pinned tasks are still
    /// polled and reported with it: a task the service accepted is never lost.
    Disabled,
    /// No new tasks; pinned tasks still served, and still refreshed.
    Draining,
}

impl AdminHold {
    /// Every hold, for metric series that start at 0.
    pub const ALL: &'static [AdminHold] = &[AdminHold::Disabled, AdminHold::Draining];

    /// Metric label and status text.
    pub const fn label(self) -> &'static str {
        match self {
            AdminHold::Disabled => "disabled",
            AdminHold::Draining => "draining",
        }
    }
}

/// The holds in force, by key name.
#[derive(Debug, Default)]
pub struct AdminHolds {
    /// A std `RwLock`: read on every pick while any hold exists, written only by an admin
    /// call or a reload, never held across an await.
    held: RwLock<HashMap<String, AdminHold>>,
    /// Whether any hold exists: the usual case is none, and a pick then pays one atomic load
    /// instead of a lock per key.
    any: AtomicBool,
}

impl AdminHolds {
    /// The hold on the key named `name`, if any.
    pub fn get(&self, name: &str) -> Option<AdminHold> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.read().get(name).copied()
    }

    /// Puts `hold` on `name` (`None` lifts it), if `exists(name)` holds at that moment;
    /// returns the hold it replaced, or `Err(())` for a name `exists` refuses. The check and
    /// the change are made under one lock, which [`AdminHolds::retain`] takes too, so a
    /// reload that removes the key cannot leave its hold behind.
    #[allow(clippy::result_unit_err)]
    pub fn set(
        &self,
        name: &str,
        hold: Option<AdminHold>,
        exists: impl FnOnce(&str) -> bool,
    ) -> Result<Option<AdminHold>, ()> {
        let mut held = self.write();
        if !exists(name) {
            return Err(());
        }
        let previous = match hold {
            Some(hold) => held.insert(name.to_owned(), hold),
            None => held.remove(name),
        };
        self.any.store(!held.is_empty(), Ordering::Release);
        Ok(previous)
    }

    /// Drops the holds of names `keep` refuses (keys a reload removed); returns them.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let mut held = self.write();
        let dropped: Vec<String> = held.keys().filter(|n| !keep(n)).cloned().collect();
        for name in &dropped {
            held.remove(name);
        }
        self.any.store(!held.is_empty(), Ordering::Release);
        dropped
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, AdminHold>> {
        self.held
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, AdminHold>> {
        self.held
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_set_replaced_and_lifted_by_name() {
        let holds = AdminHolds::default();
        let any = |_: &str| true;
        assert_eq!(holds.get("a"), None);
        assert_eq!(holds.set("a", Some(AdminHold::Draining), any), Ok(None));
        assert_eq!(holds.get("a"), Some(AdminHold::Draining));
        assert_eq!(holds.get("b"), None);
        assert_eq!(
            holds.set("a", Some(AdminHold::Disabled), any),
            Ok(Some(AdminHold::Draining))
        );
        assert_eq!(holds.get("a"), Some(AdminHold::Disabled));
        assert_eq!(holds.set("a", None, any), Ok(Some(AdminHold::Disabled)));
        assert_eq!(holds.get("a"), None);
        assert_eq!(
            holds.set("a", None, any),
            Ok(None),
            "lifting nothing is fine"
        );
    }

    #[test]
    fn a_name_that_does_not_exist_is_refused_and_changes_nothing() {
        let holds = AdminHolds::default();
        assert_eq!(
            holds.set("ghost", Some(AdminHold::Disabled), |n| n == "a"),
            Err(())
        );
        assert_eq!(holds.get("ghost"), None);
        assert!(!holds.any.load(Ordering::Relaxed));
    }

    #[test]
    fn retain_drops_the_holds_of_removed_keys_only() {
        let holds = AdminHolds::default();
        holds.set("a", Some(AdminHold::Disabled), |_| true).unwrap();
        holds.set("b", Some(AdminHold::Draining), |_| true).unwrap();
        assert_eq!(holds.retain(|n| n == "b"), vec!["a".to_owned()]);
        assert_eq!(holds.get("a"), None);
        assert_eq!(holds.get("b"), Some(AdminHold::Draining));
        holds.retain(|_| false);
        assert!(!holds.any.load(Ordering::Relaxed), "the fast path is back");
    }
}
