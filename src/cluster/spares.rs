//! Spares: threads of a key taken ahead, inside a pin's round trip, for this replica's next
//! submits, so that a submit on the success path costs one round trip, not two. How many
//! to ask for, the stock of each key, and giving back those no longer needed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{lock, Cluster};

/// The most spares (threads taken ahead for the next submits) a replica keeps of one key:
/// enough for the submits one replica has on their way at once, few enough that a replica
/// never sits on much of a key the others need.
const MAX_SPARES: usize = 8;

/// A pin asks Redis for spares of its key once the stock (ready and already asked for) is
/// down to this many, and then for a batch: the room check in Redis (six commands) is paid
/// once per batch, not once per submit.
const SPARES_LOW: usize = MAX_SPARES / 2;

/// A spare unused this long goes back: the replica's submits no longer need it. Checked at
/// every sync, so it goes back within this plus one `sync_interval`.
pub const SPARE_IDLE: Duration = Duration::from_secs(1);

/// A spare's lease member, and when it came into the stock.
type Spare = (String, Instant);

/// A key's spares: those ready for the next submits, newest last with when each came (so
/// that a stock larger than the demand ages at its front and is given back), and how many
/// the pins on their way have asked Redis for, so that concurrent pins never ask for more
/// than [`MAX_SPARES`] between them.
#[derive(Debug)]
pub(super) struct Stock {
    /// The key's name, shared by the leases made of its spares: taking a spare allocates
    /// no copy of it.
    pub(super) key: Arc<str>,
    pub(super) ready: Vec<Spare>,
    asked: usize,
    /// The key's pins in this [`SPARE_IDLE`] window and the one before, and when this one
    /// began: a batch is no larger than the demand, so that a replica with a trickle of
    /// submits never sits on threads other replicas could use.
    pins_now: usize,
    pins_before: usize,
    window: Option<Instant>,
}

/// Spares per key name. Hashed with foldhash, as the request path's other maps: a submit
/// looks its key up here two to four times. The names are the pool's, never a caller's.
pub(super) type Stocks = HashMap<Arc<str>, Stock, foldhash::fast::RandomState>;

impl Stock {
    pub(super) fn new(key: Arc<str>) -> Stock {
        Stock {
            key,
            ready: Vec::new(),
            asked: 0,
            pins_now: 0,
            pins_before: 0,
            window: None,
        }
    }

    /// Counts a pin at `now`; returns the pins of the last full window or of this one,
    /// whichever is more.
    fn count_pin(&mut self, now: Instant) -> usize {
        let age = self
            .window
            .map(|start| now.saturating_duration_since(start));
        match age {
            Some(age) if age < SPARE_IDLE => {}
            Some(age) if age < SPARE_IDLE * 2 => {
                self.pins_before = self.pins_now;
                self.pins_now = 0;
                self.window = Some(now);
            }
            _ => {
                self.pins_before = 0;
                self.pins_now = 0;
                self.window = Some(now);
            }
        }
        self.pins_now += 1;
        self.pins_now.max(self.pins_before)
    }
}

/// Spares a pin asked Redis for, counted in the key's stock until dropped. Dropped before
/// Redis's answer was read (the call failed or timed out, or the pin was cancelled at its
/// await), it also removes them from Redis, best effort, since Redis may have granted them
/// with nobody here to use or renew them: a lost answer never holds a batch of the key's
/// threads until they expire.
pub(super) struct Asked<'a> {
    cluster: &'a Arc<Cluster>,
    key: &'a str,
    pub(super) members: Vec<String>,
    pub(super) answered: bool,
}

impl<'a> Asked<'a> {
    pub(super) fn none(cluster: &'a Arc<Cluster>, key: &'a str) -> Asked<'a> {
        Asked {
            cluster,
            key,
            members: Vec::new(),
            answered: false,
        }
    }
}

impl Drop for Asked<'_> {
    fn drop(&mut self) {
        if self.members.is_empty() {
            return;
        }
        if let Some(stock) = lock(&self.cluster.spares).get_mut(self.key) {
            stock.asked = stock.asked.saturating_sub(self.members.len());
        }
        if self.answered {
            return;
        }
        let key: Arc<str> = Arc::from(self.key);
        let gone: Vec<(Arc<str>, String)> = self
            .members
            .drain(..)
            .map(|member| (key.clone(), member))
            .collect();
        let cluster = self.cluster.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { cluster.remove_members(&gone).await });
        }
    }
}

impl Cluster {
    /// Spares of `key` this replica has ready for its next submits.
    pub fn spares_ready(&self, key: &str) -> usize {
        lock(&self.spares)
            .get(key)
            .map_or(0, |stock| stock.ready.len())
    }

    /// How many spares of `key` this pin asks for: none while the stock, with what other
    /// pins asked for, is above [`SPARES_LOW`]; else as many as the key had pins in the
    /// last second, up to a stock of [`MAX_SPARES`]. Counted as asked until the guard is
    /// dropped.
    pub(super) fn ask_spares<'a>(self: &'a Arc<Self>, key: &'a str) -> Asked<'a> {
        let mut spares = lock(&self.spares);
        // The key's name is copied only the first time: `entry` would take an owned one.
        if !spares.contains_key(key) {
            let name: Arc<str> = Arc::from(key);
            spares.insert(name.clone(), Stock::new(name));
        }
        let stock = spares.get_mut(key).expect("inserted above");
        let demand = stock.count_pin(Instant::now());
        let have = stock.ready.len() + stock.asked;
        let count = if have <= SPARES_LOW {
            demand.min(MAX_SPARES - have)
        } else {
            0
        };
        stock.asked += count;
        drop(spares);
        Asked {
            cluster: self,
            key,
            members: (0..count).map(|_| self.next_member("s")).collect(),
            answered: false,
        }
    }

    /// Gives back the spares unused for [`SPARE_IDLE`], and every spare of the keys in
    /// `shrunk` (whose fleet count is above their limit now, or which left rotation), in one
    /// round trip. Run at each sync.
    pub async fn trim_spares(&self, shrunk: &[Arc<str>]) {
        let now = Instant::now();
        let mut gone: Vec<(Arc<str>, String)> = Vec::new();
        {
            let mut spares = lock(&self.spares);
            for (key, stock) in spares.iter_mut() {
                let ready = &mut stock.ready;
                let all = shrunk.contains(key);
                let keep_from = if all {
                    ready.len()
                } else {
                    ready
                        .iter()
                        .position(|(_, at)| now.saturating_duration_since(*at) < SPARE_IDLE)
                        .unwrap_or(ready.len())
                };
                gone.extend(ready.drain(..keep_from).map(|(m, _)| (key.clone(), m)));
            }
            // An empty stock keeps its pin count while that is recent.
            spares.retain(|_, stock| {
                let recent = stock
                    .window
                    .is_some_and(|start| now.saturating_duration_since(start) < SPARE_IDLE * 2);
                !stock.ready.is_empty() || stock.asked > 0 || recent
            });
        }
        if gone.is_empty() {
            return;
        }
        {
            let mut held = lock(&self.held);
            for (_, member) in &gone {
                held.remove(member);
            }
        }
        self.remove_members(&gone).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tests::cluster;

    #[tokio::test(start_paused = true)]
    async fn spares_are_asked_for_in_batches_no_larger_than_the_demand() {
        let c = Arc::new(cluster("r0"));
        // A trickle, a pin every 2 s: one spare at a time, never a batch.
        for _ in 0..3 {
            assert_eq!(c.ask_spares("a").members.len(), 1);
            tokio::time::advance(SPARE_IDLE * 2).await;
        }
        // A flow: each ask grows with the pins of the last second.
        let asks: Vec<Asked<'_>> = (0..3).map(|_| c.ask_spares("b")).collect();
        let counts: Vec<usize> = asks.iter().map(|a| a.members.len()).collect();
        assert_eq!(counts, [1, 2, 3], "the demand so far, nothing granted yet");
        drop(asks);
        // The next window remembers this one's demand.
        tokio::time::advance(SPARE_IDLE).await;
        assert_eq!(
            c.ask_spares("b").members.len(),
            3,
            "the last window's three pins"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn spares_are_asked_for_up_to_the_stock_and_an_ask_is_forgotten_when_its_pin_ends() {
        let c = Arc::new(cluster("r0"));
        for _ in 0..20 {
            drop(c.ask_spares("a"));
            drop(c.ask_spares("b"));
        }
        let first = c.ask_spares("a");
        assert_eq!(
            first.members.len(),
            MAX_SPARES,
            "a busy key's empty stock asks to be filled"
        );
        assert_eq!(
            c.ask_spares("a").members.len(),
            0,
            "asked for already: none more"
        );
        assert_eq!(
            c.ask_spares("b").members.len(),
            MAX_SPARES,
            "each key has its own stock"
        );
        // The pin is cancelled (or Redis granted nothing): the ask goes with its guard.
        drop(first);
        let again = c.ask_spares("a");
        assert_eq!(again.members.len(), MAX_SPARES);
        // Granted spares join the stock before the guard goes: a stock above the low
        // mark asks for nothing, one at it asks for the rest.
        let now = Instant::now();
        lock(&c.spares).get_mut("a").expect("a stock").ready =
            (0..=SPARES_LOW).map(|i| (format!("s:{i}"), now)).collect();
        drop(again);
        assert_eq!(
            c.ask_spares("a").members.len(),
            0,
            "{} ready",
            SPARES_LOW + 1
        );
        lock(&c.spares).get_mut("a").expect("a stock").ready.pop();
        assert_eq!(c.ask_spares("a").members.len(), MAX_SPARES - SPARES_LOW);
    }
}
