//! Slowing down addresses that keep presenting wrong tokens: the answer to a denied request
//! waits longer the more denials its address had in the last minute, so guessing tokens
//! costs a guesser time while a caller with a typo barely notices.
//!
//! The table is bounded: at `MAX_ADDRESSES` it first drops the addresses whose minute is
//! over (at most once a second, so a flood of new addresses cannot make every denial scan
//! it), and an address that still finds no room is slowed down the most. Only denied
//! requests ever reach this table, so a full table costs callers with a right token nothing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How far back denials count.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Denials per window answered without delay: a typo, a rotated token, a script's retries.
pub const FREE_DENIALS: u32 = 5;
/// The delay of the first denial past the free ones; it doubles with each one after.
pub const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest a denial waits.
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// Addresses tracked at once.
pub const MAX_ADDRESSES: usize = 10_000;

/// Recent denials by address.
#[derive(Debug, Default)]
pub struct Denials(Mutex<Table>);

#[derive(Debug, Default)]
struct Table {
    by_address: HashMap<IpAddr, Recent>,
    last_sweep: Option<Instant>,
}

/// An address's denials since `since`, the start of its current window.
#[derive(Clone, Copy, Debug)]
struct Recent {
    since: Instant,
    denials: u32,
}

impl Denials {
    /// Counts a denial from `peer` at `now` and returns how long its answer should wait.
    pub fn deny(&self, peer: IpAddr, now: Instant) -> Duration {
        let address = source(peer);
        let mut table = self.0.lock().expect("denials lock poisoned");
        if !table.by_address.contains_key(&address) && table.by_address.len() >= MAX_ADDRESSES {
            let swept_lately = table
                .last_sweep
                .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1));
            if !swept_lately {
                table.last_sweep = Some(now);
                table
                    .by_address
                    .retain(|_, recent| now.saturating_duration_since(recent.since) < WINDOW);
            }
            if table.by_address.len() >= MAX_ADDRESSES {
                return MAX_DELAY;
            }
        }
        let recent = table.by_address.entry(address).or_insert(Recent {
            since: now,
            denials: 0,
        });
        if now.saturating_duration_since(recent.since) >= WINDOW {
            *recent = Recent {
                since: now,
                denials: 0,
            };
        }
        recent.denials = recent.denials.saturating_add(1);
        delay_after(recent.denials)
    }

    /// Addresses tracked now.
    pub fn len(&self) -> usize {
        self.0
            .lock()
            .expect("denials lock poisoned")
            .by_address
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The wait of the `n`th denial of a window: none for the first [`FREE_DENIALS`], then
/// [`FIRST_DELAY`] doubling, at most [`MAX_DELAY`].
pub fn delay_after(n: u32) -> Duration {
    let Some(past_free) = n.checked_sub(FREE_DENIALS + 1) else {
        return Duration::ZERO;
    };
    FIRST_DELAY
        .checked_mul(1_u32.checked_shl(past_free).unwrap_or(u32::MAX))
        .map_or(MAX_DELAY, |d| d.min(MAX_DELAY))
}

/// The address denials are counted by: an IPv4 address, or an IPv6 address's /64 (one
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

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_delay_is_free_for_five_then_doubles_from_100ms_to_5s() {
        let delays: Vec<Duration> = (1..=13).map(delay_after).collect();
        assert_eq!(
            delays,
            [0, 0, 0, 0, 0, 100, 200, 400, 800, 1600, 3200, 5000, 5000].map(|ms| ms * MS)
        );
        assert_eq!(delay_after(u32::MAX), MAX_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn denials_count_per_address_within_a_minute() {
        let denials = Denials::default();
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        for _ in 0..5 {
            assert_eq!(denials.deny(a, Instant::now()), Duration::ZERO);
        }
        assert_eq!(denials.deny(a, Instant::now()), 100 * MS);
        assert_eq!(denials.deny(a, Instant::now()), 200 * MS);
        assert_eq!(
            denials.deny(b, Instant::now()),
            Duration::ZERO,
            "b is not a"
        );
        tokio::time::advance(WINDOW).await;
        assert_eq!(
            denials.deny(a, Instant::now()),
            Duration::ZERO,
            "a new minute"
        );
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
    async fn the_table_is_bounded_and_a_new_address_finds_room_once_others_expire() {
        let denials = Denials::default();
        let address = |n: u32| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n));
        let max = u32::try_from(MAX_ADDRESSES).unwrap();
        for n in 0..max {
            denials.deny(address(n), Instant::now());
        }
        assert_eq!(denials.len(), MAX_ADDRESSES);
        // No room: the newcomer is slowed down the most, and not tracked.
        assert_eq!(denials.deny(address(max), Instant::now()), MAX_DELAY);
        assert_eq!(denials.len(), MAX_ADDRESSES);
        // A known address is still counted as before.
        assert_eq!(denials.deny(address(0), Instant::now()), Duration::ZERO);
        tokio::time::advance(WINDOW).await;
        assert_eq!(denials.deny(address(max), Instant::now()), Duration::ZERO);
        assert_eq!(denials.len(), 1, "the expired minute was swept");
    }
}
