//! The caller token table: `[[access.tokens]]` resolved against one pool, built with each
//! snapshot, so a reload that changes tokens takes effect as one that changes keys does.
//!
//! A lookup hashes the presented bytes once and compares them with at most the entries of
//! one bucket; nothing is allocated per request. The table is seeded per process
//! (foldhash's `RandomState`), so a caller timing wrong guesses learns nothing about which
//! bucket a real token sits in, and cannot aim guesses at one.
//!
//! The threads a token holds are counted in a [`TokenThreads`] that outlives snapshots (one
//! per token name, in [`TokenCounters`]), as key thread counts do: a reload must neither
//! forget a token's running tasks nor let it start a second allowance.
//!
//! [`Denials`] rate-limits the wrong tokens each address presents, for every token check.

mod denials;

pub use denials::Denials;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{KeyConfig, TokenConfig};
use crate::key_id::KeyId;

/// The tokens of one configuration, by value.
#[derive(Default)]
pub struct TokenTable {
    by_value: HashMap<Box<str>, Arc<Token>, foldhash::fast::RandomState>,
    /// In config order, for metrics and status.
    tokens: Vec<Arc<Token>>,
}

/// A caller token's number, stable for the life of the process (one per name, as
/// [`TokenCounters`] hands them out): what a pin stores in two bytes. [`TokenId::NONE`] is a
/// pin of no token (made without tokens, or read from an older journal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenId(pub u16);

impl TokenId {
    pub const NONE: TokenId = TokenId(0);
}

/// One caller token as a request uses it: never its value.
pub struct Token {
    /// The label in logs, metrics and pins.
    pub name: Arc<str>,
    /// What its pins store.
    pub id: TokenId,
    /// The keys that may serve this token's tasks, sorted; `None`: every key.
    keys: Option<Box<[KeyId]>>,
    /// Threads this token's tasks may hold at once across keys; `None`: no cap.
    pub max_threads: Option<u32>,
    /// Raw tunnels it may hold open at once.
    pub max_tunnels: u32,
    /// What its tasks may spend over a rolling period; `None`: no budget.
    pub budget: Option<crate::config::Budget>,
    /// The threads its tasks hold now, and its open tunnels; shared with the same-named
    /// token of other snapshots.
    pub threads: Arc<TokenThreads>,
}

impl Token {
    /// Whether `key` may serve this token's tasks.
    pub fn may_use(&self, key: KeyId) -> bool {
        match &self.keys {
            None => true,
            Some(keys) => keys.binary_search(&key).is_ok(),
        }
    }

    /// Whether the token is limited to some of the keys.
    pub fn is_limited(&self) -> bool {
        self.keys.is_some()
    }

    /// Takes one thread of this token's allowance if it has one left (always, without a
    /// cap); the check and the increment are one atomic step.
    pub fn try_hold(&self) -> Option<TokenHold> {
        self.threads
            .try_take(self.max_threads)
            .then(|| TokenHold(self.threads.clone()))
    }

    /// Takes one of its `max_tunnels` if it has one left; the check and the increment are
    /// one atomic step, so parallel `CONNECT`s cannot pass the cap together.
    pub fn try_tunnel(&self) -> Option<TunnelHold> {
        self.threads
            .tunnels
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_tunnels).then_some(n + 1)
            })
            .is_ok()
            .then(|| TunnelHold(self.threads.clone()))
    }

    /// Whether every thread of its allowance is held.
    pub fn is_full(&self) -> bool {
        self.max_threads
            .is_some_and(|cap| self.threads.in_use() >= cap)
    }

    /// Takes one thread of the allowance, waiting until `deadline` for one to be given back
    /// while all are held; `None` if none came. Waiters of one token wait on that token's
    /// own signal, not in the pool's queue, so a token at its cap never holds up another
    /// token's submits that have keys to go to.
    pub async fn hold_until(&self, deadline: tokio::time::Instant) -> Option<TokenHold> {
        loop {
            let freed = self.threads.freed.notified();
            let mut freed = std::pin::pin!(freed);
            // Registered before the look, so a thread given back in between is not missed.
            freed.as_mut().enable();
            if let Some(hold) = self.try_hold() {
                return Some(hold);
            }
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep_until(deadline) => return self.try_hold(),
            }
        }
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("keys", &self.keys)
            .field("max_threads", &self.max_threads)
            .finish_non_exhaustive()
    }
}

impl TokenTable {
    /// The table for `tokens`, with `keys` the pool's keys as (id, config) pairs; each
    /// token's counter comes from `counters`, by name.
    pub fn new<'a>(
        tokens: &[TokenConfig],
        keys: impl IntoIterator<Item = (KeyId, &'a KeyConfig)> + Clone,
        counters: &TokenCounters,
    ) -> TokenTable {
        let mut table = TokenTable::default();
        for config in tokens {
            let limited = config.keys.is_some() || config.tiers.is_some();
            let keys = limited.then(|| {
                let mut ids: Vec<KeyId> = keys
                    .clone()
                    .into_iter()
                    .filter(|(_, key)| config.may_use(key))
                    .map(|(id, _)| id)
                    .collect();
                ids.sort_unstable();
                ids.into_boxed_slice()
            });
            let (id, threads) = counters.get(&config.name);
            let token = Arc::new(Token {
                name: Arc::from(config.name.as_str()),
                id,
                keys,
                max_threads: config.max_threads,
                max_tunnels: config.max_tunnels,
                budget: config.budget.clone(),
                threads,
            });
            table
                .by_value
                .insert(config.token.expose().into(), token.clone());
            table.tokens.push(token);
        }
        table
    }

    /// No tokens configured: every caller is served, as before tokens existed.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The token whose value is exactly `presented`.
    pub fn lookup(&self, presented: &str) -> Option<&Arc<Token>> {
        self.by_value.get(presented)
    }

    /// Every token, in config order.
    pub fn tokens(&self) -> &[Arc<Token>] {
        &self.tokens
    }
}

/// The threads one token's tasks hold at once, across keys and snapshots, and the raw
/// tunnels it holds open.
#[derive(Debug, Default)]
pub struct TokenThreads {
    in_use: AtomicU32,
    tunnels: AtomicU32,
    /// Signalled whenever a thread is given back, for submits waiting at the cap.
    freed: tokio::sync::Notify,
}

impl TokenThreads {
    pub fn in_use(&self) -> u32 {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Raw tunnels open now.
    pub fn tunnels(&self) -> u32 {
        self.tunnels.load(Ordering::Relaxed)
    }

    fn try_take(&self, cap: Option<u32>) -> bool {
        let limit = cap.unwrap_or(u32::MAX);
        self.in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }
}

/// One thread of a token's allowance; dropped, it is given back.
#[must_use = "a token hold gives its thread back when dropped"]
#[derive(Debug)]
pub struct TokenHold(Arc<TokenThreads>);

impl Drop for TokenHold {
    fn drop(&mut self) {
        self.0.in_use.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

/// One of a token's `max_tunnels`, held by an open tunnel; dropped with it.
#[must_use = "a tunnel hold gives its place back when dropped"]
#[derive(Debug)]
pub struct TunnelHold(Arc<TokenThreads>);

impl Drop for TunnelHold {
    fn drop(&mut self) {
        self.0.tunnels.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Each token name's id and thread counter, kept for the life of the process.
#[derive(Debug, Default)]
pub struct TokenCounters(Mutex<Counters>);

#[derive(Debug, Default)]
struct Counters {
    by_name: HashMap<Arc<str>, (TokenId, Arc<TokenThreads>)>,
    /// Names by id, from `TokenId(1)`.
    names: Vec<Arc<str>>,
}

impl TokenCounters {
    /// The id and counter of the token named `name`, made on first use. Taken only when a
    /// table is built (start and reloads) or a journal read, never per request. Past 65,535
    /// names (no config has that many), further names share the last id.
    pub fn get(&self, name: &str) -> (TokenId, Arc<TokenThreads>) {
        let mut counters = self.0.lock().expect("token counters lock poisoned");
        if let Some(known) = counters.by_name.get(name) {
            return known.clone();
        }
        let id = TokenId(u16::try_from(counters.names.len() + 1).unwrap_or(u16::MAX));
        let name: Arc<str> = Arc::from(name);
        let entry = (id, Arc::new(TokenThreads::default()));
        counters.names.push(name.clone());
        counters.by_name.insert(name, entry.clone());
        entry
    }

    /// The id of the token named `name`, made on first use.
    pub fn id_of(&self, name: &str) -> TokenId {
        self.get(name).0
    }

    /// The name of the token with this id; `None` for [`TokenId::NONE`].
    pub fn name(&self, id: TokenId) -> Option<Arc<str>> {
        let counters = self.0.lock().expect("token counters lock poisoned");
        let index = usize::from(id.0).checked_sub(1)?;
        counters.names.get(index).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Upstream;
    use crate::{ApiKey, CallerToken};

    fn key(name: &str, tier: u32) -> KeyConfig {
        KeyConfig {
            name: name.into(),
            key: ApiKey::new(format!("{name:0>32}")),
            weight: 1.0,
            threads: None,
            tier,
            provider: crate::provider::Provider::default(),
            upstream: Upstream::parse("http://127.0.0.1:9").unwrap(),
        }
    }

    fn token(name: &str, value: &str) -> TokenConfig {
        TokenConfig {
            name: name.into(),
            token: CallerToken::new(value),
            keys: None,
            tiers: None,
            max_threads: None,
            max_tunnels: crate::config::DEFAULT_MAX_TUNNELS,
            budget: None,
        }
    }

    fn ids(keys: &[KeyConfig]) -> Vec<(KeyId, &KeyConfig)> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| (KeyId(u16::try_from(i).unwrap() + 10), k))
            .collect()
    }

    #[test]
    fn a_token_is_found_by_its_exact_value_only() {
        let keys = [key("a", 0)];
        let table = TokenTable::new(
            &[token("one", "secret-one"), token("two", "secret-two")],
            ids(&keys),
            &TokenCounters::default(),
        );
        assert_eq!(&*table.lookup("secret-one").unwrap().name, "one");
        assert_eq!(&*table.lookup("secret-two").unwrap().name, "two");
        for wrong in ["", "secret-on", "secret-one ", "SECRET-ONE", "secret-one\0"] {
            assert!(table.lookup(wrong).is_none(), "{wrong:?}");
        }
        assert!(!table.is_empty());
        assert!(TokenTable::new(&[], ids(&keys), &TokenCounters::default()).is_empty());
    }

    #[test]
    fn keys_are_the_union_of_names_and_tiers_and_no_list_is_every_key() {
        let keys = [key("a", 0), key("b", 0), key("spare", 1), key("c", 2)];
        let mut by_name = token("by-name", "t1");
        by_name.keys = Some(vec!["b".into()]);
        let mut both = token("both", "t2");
        both.keys = Some(vec!["a".into()]);
        both.tiers = Some(vec![1]);
        let mut nothing = token("nothing", "t3");
        nothing.keys = Some(vec![]);
        let table = TokenTable::new(
            &[by_name, both, nothing, token("any", "t4")],
            ids(&keys),
            &TokenCounters::default(),
        );
        let may = |t: &str| -> Vec<u16> {
            (10..14)
                .filter(|&i| table.lookup(t).unwrap().may_use(KeyId(i)))
                .collect()
        };
        assert_eq!(may("t1"), [11]);
        assert_eq!(may("t2"), [10, 12]);
        assert_eq!(may("t3"), Vec::<u16>::new());
        assert_eq!(may("t4"), [10, 11, 12, 13]);
        assert!(!table.lookup("t4").unwrap().is_limited());
        assert!(table.lookup("t3").unwrap().is_limited());
    }

    #[test]
    fn the_tunnel_cap_holds_apart_from_threads_and_outlives_a_table() {
        let keys = [key("a", 0)];
        let counters = TokenCounters::default();
        let mut capped = token("capped", "t1");
        capped.max_tunnels = 2;
        capped.max_threads = Some(1);
        let table = TokenTable::new(&[capped.clone()], ids(&keys), &counters);
        let t = table.lookup("t1").unwrap();
        let first = t.try_tunnel().expect("one of two");
        let _second = t.try_tunnel().expect("two of two");
        assert!(t.try_tunnel().is_none());
        assert_eq!(t.threads.tunnels(), 2, "a refused tunnel changes no count");
        let _thread = t.try_hold().expect("tunnels take no thread");
        let reloaded = TokenTable::new(&[capped], ids(&keys), &counters);
        let t2 = reloaded.lookup("t1").unwrap();
        assert!(t2.try_tunnel().is_none(), "a reload shares the count");
        drop(first);
        assert!(t2.try_tunnel().is_some());
    }

    #[test]
    fn the_thread_cap_holds_and_counters_outlive_a_table() {
        let keys = [key("a", 0)];
        let counters = TokenCounters::default();
        let mut capped = token("capped", "t1");
        capped.max_threads = Some(2);
        let table = TokenTable::new(&[capped.clone()], ids(&keys), &counters);
        let t = table.lookup("t1").unwrap();
        let first = t.try_hold().expect("one of two");
        let _second = t.try_hold().expect("two of two");
        assert!(t.try_hold().is_none() && t.is_full());
        assert_eq!(t.threads.in_use(), 2, "a refused hold changes no count");
        // A reload builds a new table: the same name shares the count.
        let reloaded = TokenTable::new(&[capped], ids(&keys), &counters);
        let t2 = reloaded.lookup("t1").unwrap();
        assert!(t2.try_hold().is_none());
        drop(first);
        assert!(t2.try_hold().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_submit_at_the_cap_waits_for_a_thread_or_its_deadline() {
        let keys = [key("a", 0)];
        let mut capped = token("capped", "t1");
        capped.max_threads = Some(1);
        let table = TokenTable::new(&[capped], ids(&keys), &TokenCounters::default());
        let t = table.lookup("t1").unwrap().clone();
        let held = t.try_hold().unwrap();
        let start = tokio::time::Instant::now();
        let deadline = start + std::time::Duration::from_secs(5);
        assert!(t.hold_until(deadline).await.is_none(), "none came");
        assert_eq!(start.elapsed(), std::time::Duration::from_secs(5));
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move {
                t.hold_until(deadline + std::time::Duration::from_secs(5))
                    .await
                    .is_some()
            })
        };
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        drop(held);
        assert!(waiter.await.unwrap(), "woken by the thread given back");
        assert_eq!(start.elapsed(), std::time::Duration::from_secs(6));
    }

    #[test]
    fn debug_shows_the_name_never_the_value() {
        let keys = [key("a", 0)];
        let table = TokenTable::new(
            &[token("client-a", "the-secret-value-123456")],
            ids(&keys),
            &TokenCounters::default(),
        );
        let debug = format!("{:?}", table.tokens());
        assert!(debug.contains("client-a"), "{debug}");
        assert!(!debug.contains("the-secret-value"), "{debug}");
    }
}
