//! The admin API's view of a key: one row per key, with what an operator acts on (state,
//! hold, balance, threads), named and fingerprinted, never the key itself. The same type
//! is read back by `keyrelay ctl`.

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::pool::{KeyEntry, KeyPool};

/// One key, as `GET /admin/keys` lists it and every other call answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyRow {
    pub name: String,
    pub tier: u32,
    pub weight: f64,
    /// `active`, `cooling` or `benched` (out until a refresh restores it).
    pub state: String,
    /// The code or cause that took the key out; `null` while active.
    pub reason: Option<String>,
    /// Whether new tasks may go to it: active, above `min_balance`, and not held.
    pub in_rotation: bool,
    /// The operator's hold: `disabled`, `draining`, or `null`.
    pub hold: Option<String>,
    /// Last balance read; `null` while unknown.
    pub balance: Option<f64>,
    /// Threads counted in use against the capacity.
    pub threads_in_use: u32,
    /// The thread capacity (threadsinfo's figure, else the config's); `null`: no limit known.
    pub threads: Option<u32>,
    /// Tasks accepted through keyrelay with this key and not yet finished.
    pub tasks_in_flight: u32,
    /// The key's last four characters, never more.
    pub fingerprint: String,
}

impl KeyRow {
    /// The row of `key` in `pool`, as it stands at `now`.
    pub fn of(pool: &KeyPool, key: &KeyEntry, now: Instant) -> KeyRow {
        let view = pool.health(key, now);
        let load = pool.load(key);
        KeyRow {
            name: key.name.clone(),
            tier: key.tier,
            weight: key.weight,
            state: view.state.label().to_owned(),
            reason: view.reason.map(|r| r.label().to_owned()),
            in_rotation: pool.in_rotation_by(key, &view),
            hold: pool.admin_hold(key).map(|hold| hold.label().to_owned()),
            balance: key.stats.balance(),
            threads_in_use: load.in_use(),
            threads: key.thread_capacity(),
            tasks_in_flight: load.open,
            fingerprint: key.key.fingerprint(),
        }
    }
}

/// `GET /admin/keys` and `POST /admin/refresh`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyList {
    pub keys: Vec<KeyRow>,
}

/// A call about one key: the key as it stands after the call, and (for disable, enable and
/// drain) the hold it replaced, `null` for none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyAnswer {
    pub key: KeyRow,
    #[serde(default)]
    pub previous_hold: Option<String>,
}

/// Every admin error body: `{"error": "..."}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}
