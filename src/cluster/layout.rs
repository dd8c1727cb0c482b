//! The name of every Redis key keyrelay writes, all under one prefix. A pool key's own state
//! carries its name as a hash tag (`{name}`), so that on Redis Cluster each key's leases,
//! health and readings live in one slot and its scripts never cross slots.

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
    pub fn leases(&self, key: &str) -> String {
        self.key_state(key, "leases")
    }

    /// Sorted set: the key's spares (threads a replica took ahead for its next submits),
    /// scored by expiry.
    pub fn spares(&self, key: &str) -> String {
        self.key_state(key, "spares")
    }

    /// Sorted set: tasks of the key whose final answer was seen, scored by when (Redis time,
    /// ms), kept for the pin TTL.
    pub fn released(&self, key: &str) -> String {
        self.key_state(key, "released")
    }

    /// Hash: the key's generation, `e` (the fleet's epoch it was started in) and `n` (a
    /// counter every lease script advances), checked by every script that takes or renews
    /// a lease.
    pub fn generation(&self, key: &str) -> String {
        self.key_state(key, "gen")
    }

    /// Hash: the key's shared health (`state`, `reason`, `until`, `by`, `v`).
    pub fn health(&self, key: &str) -> String {
        self.key_state(key, "health")
    }

    /// Hash: the operator's hold on the key (`state`, `v`, `by`), a lift (`enabled`)
    /// included; see `cluster::holds`.
    pub fn hold(&self, key: &str) -> String {
        self.key_state(key, "hold")
    }

    /// Hash: the refresher's last reading of the key (`balance`, `threads`, `working`,
    /// `external`, `at`).
    pub fn readings(&self, key: &str) -> String {
        self.key_state(key, "readings")
    }

    /// String, with the pin TTL: `key name \t token name` of a task.
    pub fn pin(&self, task: &str) -> String {
        [&self.prefix, ":pin:", task].concat()
    }

    /// `prefix:key:{name}:what`. Names are built on every submit: one `concat` sizes and
    /// fills the string at once, where `format!` goes through the formatting machinery.
    fn key_state(&self, key: &str, what: &str) -> String {
        [&self.prefix, ":key:{", key, "}:", what].concat()
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
    pub fn set_of(&self, key: &str, member: &str) -> String {
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
            layout.leases("a"),
            layout.spares("a"),
            layout.released("a"),
            layout.health("a"),
            layout.generation("a"),
            layout.hold("a"),
            layout.readings("a"),
            layout.pin("123"),
            layout.replicas(),
            layout.synced(),
            layout.refresher(),
            layout.pause(),
            layout.epoch(),
            layout.changes(),
        ] {
            assert!(name.starts_with("kr:"), "{name}");
        }
        assert_eq!(layout.leases("client-a"), "kr:key:{client-a}:leases");
        assert_eq!(layout.health("client-a"), "kr:key:{client-a}:health");
        // The names docs/cluster.md lists, spelled out: replicas of different versions
        // must agree on them.
        assert_eq!(layout.spares("client-a"), "kr:key:{client-a}:spares");
        assert_eq!(layout.released("b"), "kr:key:{b}:released");
        assert_eq!(layout.readings("b"), "kr:key:{b}:readings");
        assert_eq!(layout.generation("b"), "kr:key:{b}:gen");
        assert_eq!(layout.hold("b"), "kr:key:{b}:hold");
        assert_eq!(layout.pin("123"), "kr:pin:123");
        assert_eq!(Layout::task_lease("123"), "t:123");
        assert_eq!(layout.set_of("b", "s:kr-1:x:7"), "kr:key:{b}:spares");
        assert_eq!(layout.set_of("b", "t:123"), "kr:key:{b}:leases");
    }
}
