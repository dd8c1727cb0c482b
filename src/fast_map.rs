//! The concurrent map type of the request path: dashmap with foldhash instead of SipHash.
//!
//! Every request looks up key health, thread counts and task pins; SipHash showed at about
//! 2 % of a request's instructions. foldhash's `RandomState` is seeded per process, so a
//! caller polling made-up task ids still cannot aim them at one shard.

/// A `DashMap` hashed with foldhash; build it with `FastMap::default()`.
pub type FastMap<K, V> = dashmap::DashMap<K, V, foldhash::fast::RandomState>;
