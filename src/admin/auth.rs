//! Who may call the admin API: with `[admin] token` set, a caller that presents it as
//! `Authorization: Bearer <token>`; without one, loopback callers only (the exposure rule
//! at config time keeps such an admin API on a loopback listener, and this is the check
//! behind it). Knows headers and addresses; does not know the routes.

use std::net::SocketAddr;

use hyper::header::{HeaderMap, AUTHORIZATION};

use crate::CallerToken;

/// How a caller got in, for the log line of what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granted {
    /// It presented the admin token.
    Token,
    /// No token is configured and it came from loopback.
    Loopback,
}

impl Granted {
    pub const fn label(self) -> &'static str {
        match self {
            Granted::Token => "token",
            Granted::Loopback => "loopback",
        }
    }
}

/// Why a caller was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer` header at all (401).
    Missing,
    /// A bearer token that is not the admin token (401).
    Wrong,
    /// No token is configured and the caller is not on loopback (403).
    NotLoopback,
    /// Not checked: the caller's address presented too many wrong tokens lately (429).
    Limited,
    /// No token is configured, and loopback cannot be trusted: tokens are configured or a
    /// listener is off loopback (403).
    NoAdminToken,
}

impl Denied {
    pub const fn label(self) -> &'static str {
        match self {
            Denied::Missing => "missing_token",
            Denied::Wrong => "wrong_token",
            Denied::NotLoopback => "not_loopback",
            Denied::Limited => "rate_limited",
            Denied::NoAdminToken => "no_admin_token",
        }
    }
}

/// Decides whether the request's caller may use the admin API. Without a token, loopback
/// callers get in only while `loopback_trusted` (`Config::loopback_trusted`): once others
/// can use keyrelay, a request its forward proxy relays comes from loopback too.
///
/// # Errors
/// [`Denied`] with why.
pub fn check(
    token: Option<&CallerToken>,
    loopback_trusted: bool,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Granted, Denied> {
    let Some(token) = token else {
        return if !loopback_trusted {
            Err(Denied::NoAdminToken)
        } else if peer.ip().to_canonical().is_loopback() {
            Ok(Granted::Loopback)
        } else {
            Err(Denied::NotLoopback)
        };
    };
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .ok_or(Denied::Missing)?;
    if same_secret(presented.as_bytes(), token.expose().as_bytes()) {
        Ok(Granted::Token)
    } else {
        Err(Denied::Wrong)
    }
}

/// The token of a `Bearer` credential (RFC 6750 §2.1; the scheme is case-insensitive).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares two secrets in time that depends on their lengths only, not on where they first
/// differ, so that timing cannot find the token a byte at a time.
fn same_secret(presented: &[u8], expected: &[u8]) -> bool {
    let mut differ = u8::from(presented.len() != expected.len());
    // Over the expected length either way: a short guess takes as long as a right one.
    for (i, e) in expected.iter().enumerate() {
        let p = presented.get(i).copied().unwrap_or(!e);
        differ |= p ^ e;
    }
    std::hint::black_box(differ) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    const TOKEN: &str = "admin-token-0123456789";

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    fn peer(addr: &str) -> SocketAddr {
        addr.parse().unwrap()
    }

    #[test]
    fn with_a_token_only_the_bearer_of_it_gets_in_from_anywhere() {
        let token = CallerToken::new(TOKEN);
        let remote = peer("10.1.2.3:5000");
        let t = Some(&token);
        assert_eq!(
            check(t, true, &headers(Some(&format!("Bearer {TOKEN}"))), remote),
            Ok(Granted::Token)
        );
        assert_eq!(
            check(
                t,
                true,
                &headers(Some(&format!("bearer  {TOKEN} "))),
                remote
            ),
            Ok(Granted::Token)
        );
        assert_eq!(
            check(t, true, &headers(None), peer("127.0.0.1:1")),
            Err(Denied::Missing),
            "loopback needs it too"
        );
        for wrong in [
            format!("Bearer {TOKEN}x"),
            format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
            "Bearer admin-token-0123456788".to_owned(),
        ] {
            assert_eq!(
                check(t, true, &headers(Some(&wrong)), remote),
                Err(Denied::Wrong),
                "{wrong}"
            );
        }
        for missing in [
            format!("Basic {TOKEN}"),
            "Bearer".to_owned(),
            "Bearer   ".to_owned(),
            TOKEN.to_owned(),
        ] {
            assert_eq!(
                check(t, true, &headers(Some(&missing)), remote),
                Err(Denied::Missing),
                "{missing}"
            );
        }
    }

    #[test]
    fn without_a_token_only_loopback_gets_in() {
        for addr in ["127.0.0.1:1", "[::1]:1", "[::ffff:127.0.0.1]:1"] {
            assert_eq!(
                check(None, true, &headers(None), peer(addr)),
                Ok(Granted::Loopback),
                "{addr}"
            );
        }
        for addr in ["10.0.0.1:1", "[2001:db8::1]:1", "[::ffff:10.0.0.1]:1"] {
            assert_eq!(
                check(None, true, &headers(None), peer(addr)),
                Err(Denied::NotLoopback),
                "{addr}"
            );
        }
    }

    #[test]
    fn without_a_token_loopback_is_not_trusted_once_others_can_use_keyrelay() {
        for addr in ["127.0.0.1:1", "[::1]:1", "10.0.0.1:1"] {
            assert_eq!(
                check(None, false, &headers(None), peer(addr)),
                Err(Denied::NoAdminToken),
                "{addr}"
            );
        }
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b"abc"));
        // A presented byte equal to !expected[i] must not read as the missing tail.
        assert!(!same_secret(&[b'a', b'b', !b'c'], b"abc"));
    }
}
