//! Where the forward proxy may open a tunnel or relay a request: the destination policy.
//!
//! A destination is resolved once, the policy is checked on every address it resolved to,
//! and those checked addresses are what is dialled, so no name, notation or second lookup
//! can reach what the check refused. Always refused, whatever `[forward] allow` says:
//! keyrelay's own listeners. From a listener other machines can reach, refused by default
//! as well: loopback, link-local, private, unique-local and unspecified addresses (with
//! IPv4 inside IPv6 read as the IPv4 address it carries), and ports other than 443 for
//! `CONNECT` and 80 and 443 for relayed requests, as forward proxies such as Squid refuse
//! them by default. On a loopback listener, whose callers can reach all of that themselves,
//! only keyrelay's own listeners are refused.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use crate::config::AllowEntry;
use crate::metrics::ForwardRefusal;

/// What the destination is for: the ports allowed by default differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    /// `CONNECT host:port`: TLS, so 443.
    Tunnel,
    /// An absolute-form `http://` request: 80, or 443 for a client that sends plain HTTP
    /// there.
    Relay,
}

/// The policy of one server: its bound listeners. The `allow` list comes with each check,
/// from the snapshot, so a reload changes it.
#[derive(Debug)]
pub(super) struct Policy {
    /// Every address keyrelay listens on, as bound (the real port when 0 was configured).
    own: Vec<SocketAddr>,
}

impl Policy {
    pub(super) fn new(own: Vec<SocketAddr>) -> Policy {
        Policy { own }
    }

    /// Whether `host` (as the caller wrote it), resolved to `addrs`, may be reached at
    /// `port` by a caller of a listener that is `exposed` (not loopback). `addrs` empty
    /// means it could not be resolved here (a name only `upstream_proxy` knows): the name
    /// and the port are still checked.
    ///
    /// # Errors
    /// The first reason a destination is refused; one refused address refuses the name.
    pub(super) fn check(
        &self,
        allow: &[AllowEntry],
        host: &str,
        addrs: &[IpAddr],
        port: u16,
        via: Via,
        exposed: bool,
    ) -> Result<(), ForwardRefusal> {
        if addrs.iter().any(|ip| self.reaches_listener(*ip, port)) {
            return Err(ForwardRefusal::Listener);
        }
        if !exposed || allow.iter().any(|e| e.allows_name(host, port)) {
            return Ok(());
        }
        let default_port = match via {
            Via::Tunnel => port == 443,
            Via::Relay => port == 80 || port == 443,
        };
        if addrs.is_empty() && !default_port {
            return Err(ForwardRefusal::Port);
        }
        for ip in addrs {
            if allow.iter().any(|e| e.allows_addr(*ip, port)) {
                continue;
            }
            if restricted(*ip) {
                return Err(ForwardRefusal::Address);
            }
            if !default_port {
                return Err(ForwardRefusal::Port);
            }
        }
        Ok(())
    }

    /// Whether a connection to `ip:port` would reach one of keyrelay's own listeners.
    fn reaches_listener(&self, ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_canonical();
        self.own
            .iter()
            .any(|own| own.port() == port && covers(own.ip().to_canonical(), ip))
    }
}

/// Whether a listener bound to `bound` accepts a connection made to `ip` from this host.
fn covers(bound: IpAddr, ip: IpAddr) -> bool {
    // A connection to 0.0.0.0 or :: goes to this host itself.
    if ip.is_unspecified() {
        return true;
    }
    if !bound.is_unspecified() {
        return bound == ip;
    }
    // A wildcard bind takes every address of the host: 0.0.0.0 the IPv4 ones, :: both
    // (dual stack, Linux's default).
    if bound.is_ipv4() && !ip.is_ipv4() {
        return false;
    }
    ip.is_loopback() || is_local(ip)
}

/// Whether `ip` is an address of one of this host's interfaces: only such an address can
/// be bound, so the answer is the kernel's own, current with any interface change.
fn is_local(ip: IpAddr) -> bool {
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Whether `ip` is one of the addresses an exposed listener's callers may not reach by
/// default: not a public unicast address.
pub(super) fn restricted(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => restricted_v4(v4),
        IpAddr::V6(v6) => restricted_v6(v6),
    }
}

fn restricted_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    a == 0 // "this network", 0.0.0.0 included
        || a == 10
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier NAT)
        || a == 127
        || (a == 169 && b == 254) // link-local: cloud metadata at 169.254.169.254
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || a >= 224 // multicast, reserved, broadcast
}

fn restricted_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    ip.is_unspecified()
        || ip.is_loopback()
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local, deprecated but routed by some
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xff00) == 0xff00 // multicast
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) // NAT64 for local use
        || embedded_v4(ip).is_some_and(restricted_v4)
}

/// The IPv4 address an IPv6 address carries in the forms a stack or a gateway turns back
/// into IPv4 (IPv4-mapped is `to_canonical`'s): IPv4-compatible `::a.b.c.d`, NAT64's
/// `64:ff9b::a.b.c.d`, and 6to4's `2002:aabb:ccdd::`.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if s[..6] == [0; 6] {
        return Some(v4(s[6], s[7]));
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
        return Some(v4(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(v4(s[1], s[2]));
    }
    None
}

/// The addresses `host` names, each at `port`: an IP literal as the address it is (IPv6
/// with or without brackets, and IPv4 in the legacy forms `inet_aton` reads, `127.1`,
/// `0x7f.0.0.1`, `2130706433`, so no resolver is asked what they mean), else the
/// system resolver's answer.
///
/// # Errors
/// The name could not be resolved, or resolved to nothing.
pub(super) async fn resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    if let Some(ip) = literal(host) {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the name resolved to no address",
        ));
    }
    Ok(addrs)
}

/// `host` as an IP address, if it is one in any notation.
pub(super) fn literal(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>()
        .ok()
        .or_else(|| legacy_ipv4(bare).map(IpAddr::V4))
}

/// IPv4 as `inet_aton` reads it: one to four parts, each decimal, octal (a leading 0) or
/// hexadecimal (`0x`), the last filling the bytes the others left.
fn legacy_ipv4(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<u32> = text.split('.').map(number).collect::<Option<Vec<u32>>>()?;
    let (last, leading) = parts.split_last()?;
    if leading.len() > 3 || leading.iter().any(|&p| p > 255) {
        return None;
    }
    let room = 32 - 8 * u32::try_from(leading.len()).ok()?;
    if room < 32 && *last >> room != 0 {
        return None;
    }
    let head = leading
        .iter()
        .fold(0_u32, |acc, &p| (acc << 8) | p)
        .checked_shl(room)
        .unwrap_or(0);
    Some(Ipv4Addr::from(head | last))
}

fn number(part: &str) -> Option<u32> {
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if (digits.is_empty() && radix != 16) || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if digits.is_empty() {
        // `0x` alone is 0 to inet_aton.
        return Some(0);
    }
    u32::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ipv4_is_read_in_every_notation_inet_aton_knows() {
        for (text, expected) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("127.0.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0x7f000001", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("0177.0.0.01", "127.0.0.1"),
            ("169.254.43518", "169.254.169.254"),
            ("0xa9fea9fe", "169.254.169.254"),
            ("0", "0.0.0.0"),
            ("10.0x10.0.1", "10.16.0.1"),
            ("[::1]", "::1"),
            ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
            ("[::ffff:7f00:1]", "::ffff:127.0.0.1"),
        ] {
            assert_eq!(literal(text), Some(ip(expected)), "{text}");
        }
        for name in [
            "example.com",
            "127.0.0.1.example",
            "256.0.0.1",
            "1.2.3.4.5",
            "08.0.0.1",
            "0x1g",
            "4294967296",
            "127.0.0.256",
            "1.2.65536",
            "",
            ".",
            "1..2",
        ] {
            assert_eq!(literal(name), None, "{name}");
        }
    }

    #[test]
    fn private_and_special_ranges_are_restricted_in_every_notation() {
        for text in [
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::a9fe:a9fe",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
        ] {
            assert!(restricted(ip(text)), "{text}");
        }
        for text in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "172.15.255.255",
            "192.169.0.1",
            "100.128.0.1",
            "169.253.0.1",
            "2001:4860:4860::8888",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::",
        ] {
            assert!(!restricted(ip(text)), "{text}");
        }
    }

    struct Checker(Policy, Vec<AllowEntry>);

    impl Checker {
        fn check(
            &self,
            host: &str,
            addrs: &[IpAddr],
            port: u16,
            via: Via,
            exposed: bool,
        ) -> Result<(), ForwardRefusal> {
            self.0.check(&self.1, host, addrs, port, via, exposed)
        }
    }

    fn policy(own: &[&str], allow: &[&str]) -> Checker {
        let allow = allow
            .iter()
            .map(|a| {
                let text = format!("[forward]\nallow = [\"{a}\"]\n[[keys]]\nname = \"a\"\nkey = \"0123456789abcdef0123456789abcdef\"\n");
                crate::config::Config::from_toml_str(&text, &|_| None)
                    .unwrap()
                    .forward
                    .allow
                    .remove(0)
            })
            .collect();
        Checker(
            Policy::new(own.iter().map(|a| a.parse().unwrap()).collect()),
            allow,
        )
    }

    #[test]
    fn own_listeners_are_refused_in_every_notation_and_never_allowed() {
        let p = policy(
            &["127.0.0.1:8080", "[::1]:8443", "0.0.0.0:9090"],
            &["127.0.0.0/8:*", "localhost:8080", "[::/0]:*"],
        );
        for exposed in [false, true] {
            for (text, port) in [
                ("127.0.0.1", 8080),
                ("::ffff:127.0.0.1", 8080),
                ("0.0.0.0", 8080),
                ("::", 8080),
                ("::1", 8443),
                ("127.0.0.1", 9090),
                ("127.0.0.2", 9090),
                ("::ffff:127.0.0.9", 9090),
            ] {
                assert_eq!(
                    p.check("localhost", &[ip(text)], port, Via::Tunnel, exposed),
                    Err(ForwardRefusal::Listener),
                    "{text}:{port} exposed={exposed}"
                );
            }
            // One refused address among several refuses the name.
            assert_eq!(
                p.check(
                    "two.example",
                    &[ip("8.8.8.8"), ip("127.0.0.1")],
                    8080,
                    Via::Relay,
                    exposed
                ),
                Err(ForwardRefusal::Listener)
            );
        }
        // The same host on another port is not a listener, and ::1 is not 127.0.0.1.
        assert_eq!(
            p.check("x", &[ip("127.0.0.1")], 8081, Via::Tunnel, false),
            Ok(())
        );
        assert_eq!(p.check("x", &[ip("::1")], 8080, Via::Tunnel, false), Ok(()));
        // A 0.0.0.0 bind takes IPv4 only.
        assert_eq!(p.check("x", &[ip("::1")], 9090, Via::Tunnel, false), Ok(()));
    }

    #[test]
    fn an_exposed_listener_refuses_private_addresses_and_odd_ports_unless_allowed() {
        let p = policy(&["0.0.0.0:8080"], &[]);
        let public = [ip("93.184.216.34")];
        assert_eq!(
            p.check("e.example", &public, 443, Via::Tunnel, true),
            Ok(())
        );
        assert_eq!(
            p.check("e.example", &public, 80, Via::Tunnel, true),
            Err(ForwardRefusal::Port)
        );
        assert_eq!(p.check("e.example", &public, 80, Via::Relay, true), Ok(()));
        assert_eq!(p.check("e.example", &public, 443, Via::Relay, true), Ok(()));
        assert_eq!(
            p.check("e.example", &public, 8443, Via::Relay, true),
            Err(ForwardRefusal::Port)
        );
        assert_eq!(
            p.check("meta", &[ip("169.254.169.254")], 443, Via::Tunnel, true),
            Err(ForwardRefusal::Address)
        );
        // Unresolved here (a name only upstream_proxy knows): the port still counts.
        assert_eq!(p.check("far", &[], 443, Via::Tunnel, true), Ok(()));
        assert_eq!(
            p.check("far", &[], 22, Via::Tunnel, true),
            Err(ForwardRefusal::Port)
        );
        // On loopback, all of it stays allowed.
        assert_eq!(
            p.check("meta", &[ip("169.254.169.254")], 80, Via::Tunnel, false),
            Ok(())
        );

        let p = policy(
            &["0.0.0.0:8080"],
            &["10.0.0.0/8:5432", "db.internal:*", "[fd00::/8]:443"],
        );
        assert_eq!(
            p.check("x", &[ip("10.1.2.3")], 5432, Via::Tunnel, true),
            Ok(())
        );
        assert_eq!(
            p.check("x", &[ip("10.1.2.3")], 5433, Via::Tunnel, true),
            Err(ForwardRefusal::Address)
        );
        assert_eq!(
            p.check(
                "DB.internal.",
                &[ip("192.168.0.5")],
                6379,
                Via::Tunnel,
                true
            ),
            Ok(())
        );
        assert_eq!(
            p.check("fd.example", &[ip("fd00::5")], 443, Via::Tunnel, true),
            Ok(())
        );
        assert_eq!(
            p.check("db.internal", &[ip("0.0.0.0")], 8080, Via::Tunnel, true),
            Err(ForwardRefusal::Listener),
            "allow never opens a listener"
        );
    }
}
