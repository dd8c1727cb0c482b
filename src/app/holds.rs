//! The operator's holds as `App` serves them: read and changed by name against the running
//! config.

use crate::pool::{AdminHold, HoldError};

use super::App;

impl App {
    /// The operator's hold on the key named `name`, if any.
    pub fn admin_hold(&self, name: &str) -> Option<AdminHold> {
        self.0.holds.get(name)
    }

    /// Puts `hold` on the configured key named `name`, or lifts its hold (`None`); returns
    /// the hold it replaced. Kept (in `data_dir`, when there is one) before it applies, and
    /// lasts through reloads and restarts until lifted, or until a reload removes the key.
    ///
    /// # Errors
    /// [`HoldError::NoSuchKey`] when no key of the running config has that name;
    /// [`HoldError::Persist`] when the change could not be saved (nothing changed).
    pub fn set_admin_hold(
        &self,
        name: &str,
        hold: Option<AdminHold>,
    ) -> Result<Option<AdminHold>, HoldError> {
        let exists = |name: &str| self.snapshot().pool.keys().iter().any(|k| k.name == name);
        let change = self.0.holds.set(name, hold, &exists)?;
        if hold.is_none() {
            // A key back in rotation may take the submits waiting for a thread.
            self.0.capacity.nudge();
        }
        Ok(change.previous)
    }
}
