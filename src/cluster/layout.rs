//! The name of every Redis key keyrelay writes, all under one prefix. A pool key's own state
//! carries its name as a hash tag (`{name}`), so that on Redis Cluster each key's leases,
//! health and readings live in one slot and its scripts never cross slots.

use std::fmt;
use std::io::Write;

use redis::{RedisWrite, ToRedisArgs};

/// One command argument given as its pieces, and written into the command piece by piece.
/// A submit's call names four Redis keys and a pin value: built as strings first, each
/// cost an allocation, a copy and a free, about 0.1k instructions a name.
#[derive(Clone, Copy, Debug)]
pub struct Joined<'a, const N: usize>(pub [&'a str; N]);

impl<const N: usize> ToRedisArgs for Joined<'_, N> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        for piece in self.0 {
            arg.write_all(piece.as_bytes())
                .expect("a command's buffer is memory: writing to it cannot fail");
        }
    }
}

impl<const N: usize> fmt::Display for Joined<'_, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|piece| f.write_str(piece))
    }
}

/// Redis key names for one prefix. docs/cluster.md lists each with its type and lifetime.
#[derive(Clone, Debug)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    pub fn new(prefix: &str) -> Layout {
        Layout {
            prefix: prefix.to_owned(),
        }
    }

    /// Sorted set: the key's thread leases, scored by expiry.
    pub fn leases<'a>(&'a self, key: &'a str) -> Joined<'a, 5> {
        self.key_state(key, "leases")
    }

    /// Sorted set: the key's spares (threads a replica took ahead for its next submits),
    /// scored by expiry.
    pub fn spares<'a>(&'a self, key: &'a str) -> Joined<'a, 5> {
        self.key_state(key, "spares")
    }

    /// Sorted set: tasks of the key whose final answer was seen, scored by when (Redis time,
    /// ms), kept for the pin TTL.
    pub fn released<'a>(&'a self, key: &'a str) -> Joined<'a, 5> {
        self.key_state(key, "released")
    }

    /// Hash: the key's generation, `e` (the fleet's epoch it was started in) and `n` (a
    /// counter every lease script advances), checked by every script that takes or renews
    /// a lease.
    pub fn generation<'a>(&'a self, key: &'a str) -> Joined<'a, 5> {
        self.key_state(key, "gen")
    }

    /// Hash: the key's shared health (`state`, `reason`, `until`, `by`, `v`).
    pub fn health<'a>(&'a self, key: &'a str) -> Joined<'a, 5> {
        self.key_state(key, "health")
    }

    /// Hash: the operator's hold on the key (`state`, `v`, `by`), a lift (`enabled`)
    /// included; see `cluster::holds`.
    pub fn hold<'a>(&'a self, key: &'a str) -> Joined<'a, 5> {
        self.key_state(key, "hold")
    }

    /// Hash: the refresher's last reading of the key (`balance`, `threads`, `working`,
    /// `external`, `at`).
    pub fn readings<'a>(&'a self, key: &'a str) -> Joined<'a, 5> {
        self.key_state(key, "readings")
    }

    /// String, with the pin TTL: `key name \t token name` of a task.
    pub fn pin<'a>(&'a self, task: &'a str) -> Joined<'a, 3> {
        Joined([&self.prefix, ":pin:", task])
    }

    /// String, for `[polling] keep_answers`: a task's final answer (`polling::encode`).
    pub fn kept<'a>(&'a self, task: &'a str) -> Joined<'a, 3> {
        Joined([&self.prefix, ":kept:", task])
    }

    /// String, for one `[polling] interval`: set by the replica whose poll of the task
    /// goes upstream.
    pub fn turn<'a>(&'a self, task: &'a str) -> Joined<'a, 3> {
        Joined([&self.prefix, ":turn:", task])
    }

    /// `prefix:key:{name}:what`. Named on every submit: the pieces go straight into the
    /// command, with no string built for them and no formatting machinery.
    fn key_state<'a>(&'a self, key: &'a str, what: &'static str) -> Joined<'a, 5> {
        Joined([&self.prefix, ":key:{", key, "}:", what])
    }

    /// Sorted set: live replicas, scored by their last heartbeat (Redis time, ms).
    pub fn replicas(&self) -> String {
        format!("{}:replicas", self.prefix)
    }

    /// Hash: per replica, `<ms> <epoch>`: the Redis time of its last heartbeat that had all
    /// its leases and pins in Redis, and the fleet's epoch then; fields of replicas no longer
    /// alive are removed.
    pub fn synced(&self) -> String {
        format!("{}:synced", self.prefix)
    }

    /// String with a TTL: the replica that runs the balance and thread refresh.
    pub fn refresher(&self) -> String {
        format!("{}:refresher", self.prefix)
    }

    /// String with a TTL: the end (unix ms) of the IP-ban pause.
    pub fn pause(&self) -> String {
        format!("{}:pause", self.prefix)
    }

    /// Pub/sub channel: a replica announced a change (a key's name, or `pause`).
    pub fn changes(&self) -> String {
        format!("{}:changes", self.prefix)
    }

    /// String: set once by the first replica to find it missing; a different or missing
    /// value later means Redis lost its data.
    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.prefix)
    }

    /// The lease member of a task once created: any replica can release it by task id.
    pub fn task_lease(task: &str) -> String {
        ["t:", task].concat()
    }

    /// Whether a member is a spare (`s:`), which lives in the spare set, not the leases.
    pub fn is_spare(member: &str) -> bool {
        member.starts_with("s:")
    }

    /// The sorted set of `key` that holds `member`: its spares or its leases.
    pub fn set_of<'a>(&'a self, key: &'a str, member: &str) -> Joined<'a, 5> {
        if Layout::is_spare(member) {
            self.spares(key)
        } else {
            self.leases(key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_starts_with_the_prefix_and_key_state_carries_a_hash_tag() {
        let layout = Layout::new("kr");
        for name in [
            layout.leases("a").to_string(),
            layout.spares("a").to_string(),
            layout.released("a").to_string(),
            layout.health("a").to_string(),
            layout.generation("a").to_string(),
            layout.hold("a").to_string(),
            layout.readings("a").to_string(),
            layout.pin("123").to_string(),
            layout.replicas(),
            layout.synced(),
            layout.refresher(),
            layout.pause(),
            layout.epoch(),
            layout.changes(),
        ] {
            assert!(name.starts_with("kr:"), "{name}");
        }
        assert_eq!(
            layout.leases("client-a").to_string(),
            "kr:key:{client-a}:leases"
        );
        assert_eq!(
            layout.health("client-a").to_string(),
            "kr:key:{client-a}:health"
        );
        // The names docs/cluster.md lists, spelled out: replicas of different versions
        // must agree on them.
        assert_eq!(
            layout.spares("client-a").to_string(),
            "kr:key:{client-a}:spares"
        );
        assert_eq!(layout.released("b").to_string(), "kr:key:{b}:released");
        assert_eq!(layout.readings("b").to_string(), "kr:key:{b}:readings");
        assert_eq!(layout.generation("b").to_string(), "kr:key:{b}:gen");
        assert_eq!(layout.hold("b").to_string(), "kr:key:{b}:hold");
        assert_eq!(layout.pin("123").to_string(), "kr:pin:123");
        assert_eq!(Layout::task_lease("123"), "t:123");
        assert_eq!(
            layout.set_of("b", "s:kr-1:x:7").to_string(),
            "kr:key:{b}:spares"
        );
        assert_eq!(layout.set_of("b", "t:123").to_string(), "kr:key:{b}:leases");
    }

    #[test]
    fn a_joined_name_is_one_argument_spelled_as_its_string() {
        let layout = Layout::new("kr");
        assert_eq!(
            layout.generation("client-a").to_redis_args(),
            [b"kr:key:{client-a}:gen".to_vec()]
        );
        let mut cmd = redis::cmd("SET");
        cmd.arg(layout.pin("123")).arg(Joined(["a", "\t", ""]));
        let mut by_strings = redis::cmd("SET");
        by_strings.arg("kr:pin:123").arg("a\t");
        assert_eq!(cmd.get_packed_command(), by_strings.get_packed_command());
    }
}
