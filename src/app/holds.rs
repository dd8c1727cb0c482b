//! The operator's holds as `App` serves them: read and changed by name against the running
//! config, and, in a cluster, shared with the fleet: each change is written to Redis as it
//! is made, and each sync adopts the fleet's newer changes and puts back the ones Redis
//! lacks (lost with its data, or made while it was away).

use std::sync::Arc;

use crate::cluster::{Cluster, SharedHold};
use crate::pool::{parse_state, state_label, AdminHold, HoldError, HoldRecord};

use super::App;

impl App {
    /// The operator's hold on the key named `name`, if any.
    pub fn admin_hold(&self, name: &str) -> Option<AdminHold> {
        self.0.holds.get(name)
    }

    /// Puts `hold` on the configured key named `name`, or lifts its hold (`None`); returns
    /// the hold it replaced. Kept (in `data_dir`, when there is one) before it applies, and
    /// lasts through reloads and restarts until lifted, or until a reload removes the key.
    /// In a cluster it is written to Redis too, for every replica; with Redis away, when it
    /// returns.
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
        if let Some(cluster) = self.0.cluster.clone() {
            let shared = shared(&change.record);
            tokio::spawn(async move {
                match cluster.publish_hold(&shared).await {
                    Ok(true) => {}
                    Ok(false) => tracing::warn!(
                        key = %shared.key,
                        "the fleet recorded a newer change of the key's hold meanwhile; the next sync applies it here"
                    ),
                    // Put back by the first sync after Redis returns.
                    Err(_) => tracing::info!(
                        key = %shared.key,
                        "redis is away: the hold applies on this replica, and reaches the others when redis returns"
                    ),
                }
            });
        }
        Ok(change.previous)
    }

    /// One exchange of holds with the fleet, run at each sync: the fleet's changes newer
    /// than this replica's apply here, and this replica's newer than the fleet's (or that
    /// Redis no longer has) are put back, so that no change is lost with Redis's data and
    /// none made while it was away stays on one replica. Idempotent.
    pub async fn sync_holds(&self, cluster: &Cluster) {
        let names: Vec<Arc<str>> = self
            .snapshot()
            .pool
            .keys()
            .iter()
            .map(|k| Arc::from(k.name.as_str()))
            .collect();
        let Ok(fleet) = cluster.read_holds(&names).await else {
            return;
        };
        let theirs: Vec<HoldRecord> = fleet.iter().flatten().filter_map(record).collect();
        let exists = |name: &str| self.snapshot().pool.keys().iter().any(|k| k.name == name);
        let taken = self.0.holds.adopt(theirs, &exists);
        for record in &taken {
            tracing::info!(
                key = %record.name,
                hold = state_label(record.hold),
                by = %record.by,
                "admin hold adopted from the fleet"
            );
        }
        if taken.iter().any(|r| r.hold.is_none()) {
            self.0.capacity.nudge();
        }
        let behind: Vec<SharedHold> = self
            .0
            .holds
            .records()
            .iter()
            .filter(|mine| {
                let Some(at) = names.iter().position(|n| **n == *mine.name) else {
                    return false;
                };
                fleet[at]
                    .as_ref()
                    .is_none_or(|theirs| (mine.version, &mine.by) > (theirs.version, &theirs.by))
            })
            .map(shared)
            .collect();
        if let Ok(written @ 1..) = cluster.restore_holds(&behind).await {
            tracing::info!(written, "admin holds put back into redis");
        }
    }
}

fn shared(record: &HoldRecord) -> SharedHold {
    SharedHold {
        key: record.name.clone(),
        state: state_label(record.hold).to_owned(),
        version: record.version,
        by: record.by.clone(),
    }
}

/// The fleet's record as this replica's; `None` for a state this version does not know.
fn record(shared: &SharedHold) -> Option<HoldRecord> {
    Some(HoldRecord {
        name: shared.key.clone(),
        hold: parse_state(&shared.state)?,
        version: shared.version,
        by: shared.by.clone(),
    })
}
