//! The leases and spares this replica holds, by member, with a running count per key, so
//! that the sync every `sync_interval` reads how many threads of a key are this replica's
//! without walking every open task while submits wait for the lock.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use crate::captcha::TaskId;

/// A lease (or spare) this replica holds, for renewal.
#[derive(Clone, Debug)]
pub struct Held {
    pub key: Arc<str>,
    pub task: Option<TaskId>,
    pub opened: Instant,
    /// False for a task admitted while Redis was away: added when it returns.
    pub in_redis: bool,
}

/// Hashed with foldhash, as the request path's other maps: a submit inserts and removes a
/// member here, and SipHash of its name cost about 0.3k instructions a time. The members
/// are keyrelay's own names, never a caller's.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
pub struct HeldLeases {
    by_member: Map<String, Held>,
    per_key: Map<Arc<str>, usize>,
}

impl HeldLeases {
    pub fn insert(&mut self, member: String, held: Held) {
        let key = held.key.clone();
        if let Some(old) = self.by_member.insert(member, held) {
            self.uncount(&old.key);
        }
        *self.per_key.entry(key).or_default() += 1;
    }

    pub fn remove(&mut self, member: &str) -> Option<Held> {
        let held = self.by_member.remove(member)?;
        self.uncount(&held.key);
        Some(held)
    }

    fn uncount(&mut self, key: &Arc<str>) {
        if let Some(count) = self.per_key.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                self.per_key.remove(key);
            }
        }
    }

    /// Marks `member` as written to Redis, if it is still held.
    pub fn mark_in_redis(&mut self, member: &str) {
        if let Some(held) = self.by_member.get_mut(member) {
            held.in_redis = true;
        }
    }

    /// Leases and spares of `key` held here.
    pub fn count(&self, key: &str) -> usize {
        self.per_key.get(key).copied().unwrap_or(0)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Held)> {
        self.by_member.iter()
    }

    /// The keys with a lease or spare held here, each once: from the counts, so that the
    /// heartbeat does not walk every open task to name them.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.per_key.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(key: &str) -> Held {
        Held {
            key: Arc::from(key),
            task: None,
            opened: Instant::now(),
            in_redis: true,
        }
    }

    #[test]
    fn counts_follow_every_insert_replace_and_remove() {
        let mut leases = HeldLeases::default();
        leases.insert("s:1".into(), held("a"));
        leases.insert("s:2".into(), held("a"));
        leases.insert("s:3".into(), held("b"));
        assert_eq!((leases.count("a"), leases.count("b")), (2, 1));
        // The same member again, now of another key: counted once, under its new key.
        leases.insert("s:2".into(), held("b"));
        assert_eq!((leases.count("a"), leases.count("b")), (1, 2));
        assert!(leases.remove("s:1").is_some());
        assert!(leases.remove("s:1").is_none(), "removed twice");
        assert_eq!((leases.count("a"), leases.count("b")), (0, 2));
        assert_eq!(leases.iter().count(), 2);
        assert!(!leases.per_key.contains_key("a"), "no empty counts kept");
        assert_eq!(
            leases.keys().map(|key| &**key).collect::<Vec<_>>(),
            ["b"],
            "a key is named while it holds anything, and once"
        );
        for member in ["s:2", "s:3"] {
            leases.remove(member);
        }
        assert_eq!(leases.iter().count(), 0);
        assert_eq!(leases.count("b"), 0);
    }

    #[test]
    fn marking_in_redis_touches_only_a_held_member() {
        let mut leases = HeldLeases::default();
        let mut pending = held("a");
        pending.in_redis = false;
        leases.insert("t:1".into(), pending);
        leases.mark_in_redis("t:1");
        leases.mark_in_redis("t:2");
        assert!(leases.iter().all(|(_, h)| h.in_redis));
        assert_eq!(leases.iter().count(), 1);
    }
}
