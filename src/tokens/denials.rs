//! Rate-limiting wrong tokens per client address: each address has a bucket of
//! [`BURST`] wrong tokens that refills at [`RATE`] a second. While its bucket is empty, an
//! address's requests are refused at once, without their token being checked, a valid one
//! included: so guessing in parallel gains nothing over guessing in turn, and no request
//! waits (and holds a connection) for its answer.
//!
//! The table is bounded: at [`MAX_ADDRESSES`] it first drops the addresses whose buckets
//! have refilled (at most once a second, so a flood of new addresses cannot make every
//! denial scan it), and addresses that still find no room share one overflow bucket. Only
//! wrong tokens put an address in the table, and while it is empty a request's check
//! costs one atomic load.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Wrong tokens an address may present a second, sustained.
pub const RATE: u64 = 5;
/// Wrong tokens an address may present at once: a typo, a rotated token, a script's
/// retries.
pub const BURST: u64 = 10;
/// A bucket's level is kept in millionths of a token, so that refilling is exact integer
/// arithmetic: [`RATE`] millionths a microsecond.
const UNIT: u64 = 1_000_000;
/// Addresses tracked at once.
pub const MAX_ADDRESSES: usize = 10_000;

/// Recent wrong tokens by address.
#[derive(Debug, Default)]
pub struct Denials {
    table: Mutex<Table>,
    /// Addresses in the table (the overflow bucket included while it is in use): zero
    /// means nobody is limited, and nothing needs the lock.
    tracked: AtomicUsize,
}

#[derive(Debug, Default)]
struct Table {
    by_address: HashMap<IpAddr, Bucket>,
    /// For addresses that found the table full.
    overflow: Option<Bucket>,
    last_sweep: Option<Instant>,
}

/// What is left of an address's allowance of wrong tokens (in [`UNIT`]s), as of `at`.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    level: u64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant) -> Bucket {
        Bucket {
            level: BURST * UNIT,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let micros = now.saturating_duration_since(self.at).as_micros();
        let gained = u64::try_from(micros)
            .unwrap_or(u64::MAX)
            .saturating_mul(RATE);
        self.level = self.level.saturating_add(gained).min(BURST * UNIT);
        self.at = now;
    }

    /// Whether one more wrong token fits.
    fn has_room(&self) -> bool {
        self.level >= UNIT
    }

    fn take_one(&mut self) {
        self.level = self.level.saturating_sub(UNIT);
    }

    fn is_full_by(&self, now: Instant) -> bool {
        let missing = BURST * UNIT - self.level;
        now.saturating_duration_since(self.at) >= Duration::from_micros(missing / RATE)
    }
}

impl Denials {
    /// Whether a request from `peer` may have its token checked now: `false` while the
    /// address has used up its allowance of wrong tokens.
    pub fn admits(&self, peer: IpAddr, now: Instant) -> bool {
        if self.tracked.load(Ordering::Acquire) == 0 {
            return true;
        }
        let address = source(peer);
        let mut guard = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let table = &mut *guard;
        let full = table.by_address.len() >= MAX_ADDRESSES;
        let bucket = match table.by_address.get_mut(&address) {
            Some(bucket) => bucket,
            None => match &mut table.overflow {
                // Addresses past the bound are limited together.
                Some(overflow) if full => overflow,
                _ => return true,
            },
        };
        bucket.refill(now);
        bucket.has_room()
    }

    /// Runs a token `check` for `peer` within its allowance: `None` while the allowance is
    /// used up (the check is not run); else the check's result, which uses one up when
    /// `wrong` says it found a wrong token. The one place every token check (the API's
    /// `key`, a proxy credential, the admin bearer token) goes through the limit.
    pub fn within<T>(
        &self,
        peer: IpAddr,
        check: impl FnOnce() -> T,
        wrong: impl FnOnce(&T) -> bool,
    ) -> Option<T> {
        let now = Instant::now();
        if !self.admits(peer, now) {
            return None;
        }
        let result = check();
        if wrong(&result) {
            self.deny(peer, now);
        }
        Some(result)
    }

    /// Counts a wrong token from `peer` at `now`: one less in its allowance.
    pub fn deny(&self, peer: IpAddr, now: Instant) {
        let address = source(peer);
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if !table.by_address.contains_key(&address) && table.by_address.len() >= MAX_ADDRESSES {
            let swept_lately = table
                .last_sweep
                .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1));
            if !swept_lately {
                table.last_sweep = Some(now);
                table.by_address.retain(|_, bucket| !bucket.is_full_by(now));
            }
        }
        let bucket =
            if table.by_address.contains_key(&address) || table.by_address.len() < MAX_ADDRESSES {
                table
                    .by_address
                    .entry(address)
                    .or_insert_with(|| Bucket::full(now))
            } else {
                table.overflow.get_or_insert_with(|| Bucket::full(now))
            };
        bucket.refill(now);
        bucket.take_one();
        let tracked = table.by_address.len() + usize::from(table.overflow.is_some());
        self.tracked.store(tracked, Ordering::Release);
    }

    /// Addresses tracked now.
    pub fn len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_address
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The address wrong tokens are counted by: an IPv4 address, or an IPv6 address's /64 (one
/// host's usual allocation, which it can walk at will). IPv4-mapped IPv6 is IPv4.
fn source(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1_u128 << 64) - 1);
                IpAddr::V6(bits.into())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

    /// Denies `peer` while it is admitted, up to `n` times; how many were admitted.
    fn guess(denials: &Denials, peer: IpAddr, n: usize) -> usize {
        (0..n)
            .filter(|_| {
                let now = Instant::now();
                let admitted = denials.admits(peer, now);
                if admitted {
                    denials.deny(peer, now);
                }
                admitted
            })
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_ten_then_five_a_second() {
        let denials = Denials::default();
        assert!(denials.admits(A, Instant::now()), "nobody is limited yet");
        assert_eq!(guess(&denials, A, 200), 10, "the burst");
        assert!(denials.admits(B, Instant::now()), "b is not a");
        // 200 guesses a second for ten seconds get 5 a second checked.
        let mut checked = 0;
        for _ in 0..2000 {
            tokio::time::advance(Duration::from_millis(5)).await;
            checked += guess(&denials, A, 1);
        }
        assert_eq!(checked, 50);
        // Idle, the bucket refills to its burst and no further.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(guess(&denials, A, 50), 10);
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64() {
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let other: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let elsewhere: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source(one), source(other));
        assert_ne!(source(one), source(elsewhere));
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped());
        assert_eq!(source(mapped), IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
        assert_eq!(
            source(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded_and_the_addresses_past_it_share_one_bucket() {
        let denials = Denials::default();
        let address = |n: u32| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n));
        let max = u32::try_from(MAX_ADDRESSES).unwrap();
        for n in 0..max {
            denials.deny(address(n), Instant::now());
        }
        assert_eq!(denials.len(), MAX_ADDRESSES);
        // Newcomers share the overflow bucket: ten between them, from any address.
        let admitted: usize = (max..max + 100)
            .map(|n| guess(&denials, address(n), 1))
            .sum();
        assert_eq!(admitted, 10);
        assert_eq!(denials.len(), MAX_ADDRESSES);
        // A known address keeps its own bucket (nine left of ten).
        assert_eq!(guess(&denials, address(0), 20), 9);
        // Once the others' buckets have refilled, a newcomer finds room of its own.
        tokio::time::advance(Duration::from_secs(3)).await;
        denials.deny(address(max + 500), Instant::now());
        assert!(denials.len() < MAX_ADDRESSES, "refilled buckets were swept");
        assert_eq!(guess(&denials, address(max + 500), 20), 9);
    }
}
