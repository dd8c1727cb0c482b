//! The cache of issued leaf certificates, by host: bounded, since `CONNECT` hosts come
//! from callers, with the oldest issued dropped first.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

struct Entry<V> {
    value: V,
    not_after: SystemTime,
    /// When it was issued, in insertion order: which `order` record is current.
    seq: u64,
}

pub(super) struct LeafCache<V> {
    entries: HashMap<String, Entry<V>>,
    /// `(seq, host)` in the order issued; a record whose seq is not the entry's is stale
    /// (the host was renewed since) and skipped.
    order: VecDeque<(u64, String)>,
    next_seq: u64,
    capacity: usize,
}

impl<V: Clone> LeafCache<V> {
    pub(super) fn new(capacity: usize) -> LeafCache<V> {
        LeafCache {
            entries: HashMap::new(),
            order: VecDeque::new(),
            next_seq: 0,
            capacity: capacity.max(1),
        }
    }

    /// The value for `host` if it is still valid for more than `renew_before` at `now`.
    pub(super) fn fresh(&self, host: &str, now: SystemTime, renew_before: Duration) -> Option<V> {
        let entry = self.entries.get(host)?;
        (now + renew_before < entry.not_after).then(|| entry.value.clone())
    }

    pub(super) fn insert(&mut self, host: &str, value: V, not_after: SystemTime) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let entry = Entry {
            value,
            not_after,
            seq,
        };
        self.entries.insert(host.to_owned(), entry);
        self.order.push_back((seq, host.to_owned()));
        while self.entries.len() > self.capacity {
            let Some((seq, host)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&host).is_some_and(|e| e.seq == seq) {
                self.entries.remove(&host);
            }
        }
        // Renewals leave stale records behind; drop them before they outgrow the entries.
        if self.order.len() > 2 * self.capacity {
            let entries = &self.entries;
            self.order
                .retain(|(seq, host)| entries.get(host).is_some_and(|e| e.seq == *seq));
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn an_entry_is_fresh_until_within_renew_before_of_its_end() {
        let t0 = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let mut cache = LeafCache::new(10);
        cache.insert("a.test", 1, t0 + 7 * DAY);
        assert_eq!(cache.fresh("a.test", t0, DAY), Some(1));
        assert_eq!(cache.fresh("a.test", t0 + 5 * DAY, DAY), Some(1));
        assert_eq!(cache.fresh("a.test", t0 + 6 * DAY, DAY), None);
        assert_eq!(cache.fresh("b.test", t0, DAY), None);
    }

    #[test]
    fn the_oldest_issued_is_dropped_and_a_renewal_counts_as_new() {
        let end = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let now = end - 2 * DAY;
        let mut cache = LeafCache::new(2);
        cache.insert("a", 1, end);
        cache.insert("b", 2, end);
        // a renewed: b is now the oldest.
        cache.insert("a", 3, end);
        cache.insert("c", 4, end);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.fresh("b", now, DAY), None);
        assert_eq!(cache.fresh("a", now, DAY), Some(3));
        assert_eq!(cache.fresh("c", now, DAY), Some(4));
    }

    #[test]
    fn renewals_do_not_grow_the_order_without_bound() {
        let end = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let mut cache = LeafCache::new(3);
        for i in 0..1000 {
            cache.insert("same", i, end);
        }
        assert_eq!(cache.len(), 1);
        assert!(cache.order.len() <= 6, "{}", cache.order.len());
    }
}
