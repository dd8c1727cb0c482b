//! The operator's holds on Redis, so that a disable, drain or enable made through one
//! replica applies on every replica: one hash per key (`prefix:key:{name}:hold`: `state`,
//! `v`, `by`), written only by a change that supersedes the one there (a larger version, or
//! the same version and a larger replica name), and announced on the `changes` channel as
//! health is. A lift is written as `enabled`, not deleted, so that an older hold put back
//! later loses to it. Knows the wire format only; which record wins locally is `pool`'s.

use std::sync::Arc;

use redis::Value;

use super::conn::{from_value, ClusterError, Op};
use super::Cluster;

/// A key's hold as the fleet last recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedHold {
    /// The pool key's name.
    pub key: String,
    /// `disabled`, `draining`, or `enabled` for a lift.
    pub state: String,
    pub version: u64,
    /// The replica that made the change.
    pub by: String,
}

/// KEYS[1] the key's hold hash. ARGV: state, version, by. Writes the change only if it
/// supersedes the one recorded, so that changes arriving out of order, and copies put back
/// after Redis lost its data, never replace a newer one. Returns 1 if written.
///
/// Sent as `EVAL`, not `EVALSHA` with the other scripts: holds change at an operator's
/// pace, and a body sent whole is never one Redis has forgotten.
const PUT: &str = r"
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '-1')
local nv = tonumber(ARGV[2])
if v > nv then return 0 end
if v == nv and (redis.call('HGET', KEYS[1], 'by') or '') >= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'v', ARGV[2], 'by', ARGV[3])
return 1
";

impl Cluster {
    /// Records an operator's change for the fleet and wakes every replica's sync. Returns
    /// whether Redis took it (a newer change recorded meanwhile wins).
    ///
    /// # Errors
    /// Redis is away or did not answer in time: the change stays this replica's until its
    /// sync finds Redis again and puts it back ([`Cluster::restore_holds`]).
    pub async fn publish_hold(&self, hold: &SharedHold) -> Result<bool, ClusterError> {
        Ok(self.restore_holds(std::slice::from_ref(hold)).await? == 1)
    }

    /// Puts holds this replica knows back into Redis (after Redis lost its data, or ones
    /// set while it was away), each only where it supersedes the fleet's record; returns
    /// how many were written. Idempotent: safe to call at every sync.
    ///
    /// # Errors
    /// Redis is away or did not answer in time.
    pub async fn restore_holds(&self, holds: &[SharedHold]) -> Result<usize, ClusterError> {
        if holds.is_empty() {
            return Ok(0);
        }
        if !self.is_up() {
            return Err(ClusterError::Degraded);
        }
        let mut pipe = redis::pipe();
        for hold in holds {
            pipe.cmd("EVAL")
                .arg(PUT)
                .arg(1)
                .arg(self.layout.hold(&hold.key))
                .arg(&hold.state)
                .arg(hold.version)
                .arg(&hold.by)
                .cmd("PUBLISH")
                .arg(self.layout.changes())
                .arg(&hold.key)
                .ignore();
        }
        let written: Vec<u32> = self.call_pipe(Op::Health, pipe).await?;
        Ok(written.iter().filter(|&&w| w == 1).count())
    }

    /// The fleet's record of each named key's hold, in the order asked for; `None` where
    /// Redis has none (never held, or lost with Redis's data).
    ///
    /// # Errors
    /// Redis is away or did not answer in time.
    pub async fn read_holds(
        &self,
        keys: &[Arc<str>],
    ) -> Result<Vec<Option<SharedHold>>, ClusterError> {
        if !self.is_up() {
            return Err(ClusterError::Degraded);
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("HGETALL").arg(self.layout.hold(key));
        }
        let values: Vec<Value> = self.call_pipe(Op::Sync, pipe).await?;
        let mut values = values.into_iter();
        Ok(keys
            .iter()
            .map(|key| parse(key, &from_value(values.next())))
            .collect())
    }
}

fn parse(key: &str, fields: &std::collections::HashMap<String, String>) -> Option<SharedHold> {
    Some(SharedHold {
        key: key.to_owned(),
        state: fields.get("state")?.clone(),
        version: fields.get("v")?.parse().ok()?,
        by: fields.get("by").cloned().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_needs_a_state_and_a_version() {
        let fields = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            parse(
                "a",
                &fields(&[("state", "disabled"), ("v", "17"), ("by", "kr-1")])
            ),
            Some(SharedHold {
                key: "a".into(),
                state: "disabled".into(),
                version: 17,
                by: "kr-1".into(),
            })
        );
        assert_eq!(parse("a", &fields(&[("state", "disabled")])), None);
        assert_eq!(
            parse("a", &fields(&[("v", "x"), ("state", "enabled")])),
            None
        );
        assert_eq!(parse("a", &fields(&[])), None);
    }
}
