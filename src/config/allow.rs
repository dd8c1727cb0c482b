//! `[forward] allow`: destinations the forward proxy's policy lets through beyond its
//! defaults, as `host:port`, `ip:port`, `cidr:port` or `[ipv6-cidr]:port` (`*` for any
//! port). Parsing and matching only; the policy that consults them is the server's.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::problems::Problems;
use super::redact::quoted;

/// One `[forward] allow` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowEntry {
    target: AllowTarget,
    /// `None`: any port (`*`).
    port: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum AllowTarget {
    /// A host name, lowercase, without a final dot: matched against the name the caller
    /// wrote, never against what it resolves to.
    Name(String),
    /// An address or a network (an address alone is its /32 or /128): matched against the
    /// addresses a destination resolves to.
    Net(IpNet),
}

impl AllowEntry {
    /// Whether this entry names `host` (as the caller wrote it) at `port`.
    pub fn allows_name(&self, host: &str, port: u16) -> bool {
        let AllowTarget::Name(name) = &self.target else {
            return false;
        };
        self.port.is_none_or(|p| p == port) && name.eq_ignore_ascii_case(normal_name(host))
    }

    /// Whether this entry covers `ip` at `port`. IPv4-mapped IPv6 is compared as the IPv4
    /// address it carries, so one entry covers both notations.
    pub fn allows_addr(&self, ip: IpAddr, port: u16) -> bool {
        let AllowTarget::Net(net) = &self.target else {
            return false;
        };
        self.port.is_none_or(|p| p == port) && net.contains(&ip.to_canonical())
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            AllowTarget::Name(name) => f.write_str(name)?,
            AllowTarget::Net(IpNet::V6(net)) => write!(f, "[{net}]")?,
            AllowTarget::Net(net) => write!(f, "{net}")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => f.write_str(":*"),
        }
    }
}

/// A host as the caller wrote it, compared as names are: no brackets, no final dot.
fn normal_name(host: &str) -> &str {
    let host = host.strip_suffix('.').unwrap_or(host);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `[forward] allow`, each entry checked; a bad one is a problem naming its index.
pub(super) fn allow_list(p: &mut Problems, raw: Option<Vec<String>>) -> Vec<AllowEntry> {
    let mut list = Vec::new();
    for (i, text) in raw.unwrap_or_default().iter().enumerate() {
        match parse(text.trim()) {
            Ok(entry) if !list.contains(&entry) => list.push(entry),
            Ok(_) => {}
            Err(problem) => p.add(format!("forward.allow[{i}]"), problem),
        }
    }
    list
}

fn parse(text: &str) -> Result<AllowEntry, String> {
    let usage = || {
        format!(
            "{} is not host:port, ip:port, cidr:port or [ipv6-cidr]:port (port 1-65535, or * for any)",
            quoted(text)
        )
    };
    let (target, port) = match text.strip_prefix('[') {
        Some(rest) => {
            let (inner, port) = rest.split_once("]:").ok_or_else(usage)?;
            let net = parse_net(inner)
                .filter(|net| matches!(net, IpNet::V6(_)))
                .ok_or_else(usage)?;
            (AllowTarget::Net(net), port)
        }
        None => {
            let (host, port) = text.rsplit_once(':').ok_or_else(usage)?;
            // An IPv6 address without brackets cannot be told from its port.
            if host.contains(':') {
                return Err(usage());
            }
            let target = match parse_net(host) {
                Some(net) => AllowTarget::Net(net),
                None if is_host_name(host) => {
                    AllowTarget::Name(normal_name(host).to_ascii_lowercase())
                }
                None => return Err(usage()),
            };
            (target, port)
        }
    };
    let port = match port {
        "*" => None,
        digits => Some(
            digits
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(usage)?,
        ),
    };
    Ok(AllowEntry { target, port })
}

/// An address (its own /32 or /128) or a network in CIDR notation, host bits cleared.
fn parse_net(text: &str) -> Option<IpNet> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(IpNet::from(ip));
    }
    text.parse::<IpNet>().ok().map(|net| net.trunc())
}

fn is_host_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    !host.is_empty() && host.len() <= 253 && host.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(text: &str) -> AllowEntry {
        parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn every_form_parses_and_prints_back() {
        for (text, shown) in [
            ("example.com:8443", "example.com:8443"),
            ("Example.COM.:443", "example.com:443"),
            ("10.1.2.3:5432", "10.1.2.3/32:5432"),
            ("10.1.2.3/8:*", "10.0.0.0/8:*"),
            ("[2001:db8::1]:443", "[2001:db8::1/128]:443"),
            ("[fd00::/8]:22", "[fd00::/8]:22"),
            ("internal_host:80", "internal_host:80"),
        ] {
            assert_eq!(entry(text).to_string(), shown, "{text}");
        }
    }

    #[test]
    fn malformed_entries_are_refused() {
        for bad in [
            "",
            "example.com",
            "example.com:",
            "example.com:0",
            "example.com:65536",
            "example.com:http",
            "2001:db8::1:443",
            "[2001:db8::1]",
            "[10.0.0.1]:443",
            "[example.com]:443",
            "10.0.0.0/33:443",
            "http://example.com:443",
            "example.com/path:443",
            "exa mple.com:443",
            ":443",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_match_as_written_and_nets_by_address() {
        let name = entry("Internal.example:8443");
        assert!(name.allows_name("internal.example", 8443));
        assert!(name.allows_name("INTERNAL.example.", 8443));
        assert!(!name.allows_name("internal.example", 443));
        assert!(!name.allows_name("other.example", 8443));
        assert!(!name.allows_addr("10.0.0.1".parse().unwrap(), 8443));

        let net = entry("10.0.0.0/8:*");
        assert!(net.allows_addr("10.9.8.7".parse().unwrap(), 1));
        assert!(net.allows_addr("::ffff:10.9.8.7".parse().unwrap(), 65535));
        assert!(!net.allows_addr("11.0.0.1".parse().unwrap(), 443));
        assert!(
            !net.allows_name("10.9.8.7", 443),
            "a net matches addresses only"
        );

        let v6 = entry("[fd00::/8]:22");
        assert!(v6.allows_addr("fd12::1".parse().unwrap(), 22));
        assert!(!v6.allows_addr("fd12::1".parse().unwrap(), 23));
        assert!(!v6.allows_addr("fe80::1".parse().unwrap(), 22));
    }
}
