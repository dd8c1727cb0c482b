//! The upstream base URL: a validated http(s) origin with an optional path prefix, the one
//! place endpoint URIs are built from it, and which upstreams share an origin (scheme, host,
//! port). Knows nothing about keys or the wire format.

use std::fmt;

use bytes::Bytes;
use hyper::http::uri::{Authority, PathAndQuery, Scheme};
use hyper::Uri;

/// A validated base URL of a 2captcha-compatible service: http or https, host, optional port,
/// optional path prefix (no query, no fragment). Debug/Display show the URL.
#[derive(Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `scheme://authority[/prefix]`, with scheme and host lowercased and no trailing `/`.
    /// Kept as text because every request appends to it; it parsed as a `Uri` once already.
    base: Box<str>,
    https: bool,
    /// The parts every endpoint URI shares, parsed once so that a request parses only its
    /// own path and query (that was 2 % of a relayed request's instructions).
    authority: Authority,
    /// The port connections go to, explicit or the scheme's default: with `https` and the
    /// host, the origin ([`Upstream::same_origin`]).
    port: u16,
    prefix: Box<str>,
}

impl Upstream {
    /// Validates and normalises a base URL such as `https://ocr.captchaai.com`.
    ///
    /// # Errors
    /// A message saying what is wrong with `s` (scheme, host, port, query, fragment, ...).
    pub fn parse(s: &str) -> Result<Upstream, String> {
        if s.is_empty() {
            return Err("must not be empty".to_owned());
        }
        // `Uri` silently drops a fragment, so it has to be caught before parsing.
        if s.contains('#') {
            return Err("must not have a fragment (\"#...\")".to_owned());
        }
        let uri: Uri = s.parse().map_err(|e| format!("not a valid URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some(scheme) if scheme.eq_ignore_ascii_case("https") => true,
            Some(scheme) if scheme.eq_ignore_ascii_case("http") => false,
            Some(other) => {
                return Err(format!(
                    "scheme must be http or https, got {}",
                    super::redact::quoted(other)
                ))
            }
            None => return Err("must start with http:// or https://".to_owned()),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| "has no host".to_owned())?
            .as_str();
        // Credentials in the URL would be logged with it; keys belong in [[keys]].
        if authority.contains('@') {
            return Err("must not contain user info (\"user@\")".to_owned());
        }
        let host = uri.host().unwrap_or_default();
        if host.is_empty() {
            return Err("has no host".to_owned());
        }
        // `Uri` accepts an out-of-range port and then reports none at all.
        if let Some(port) = authority[host.len()..].strip_prefix(':') {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {}
                _ => {
                    return Err(format!(
                        "invalid port {}; expected 1-65535",
                        super::redact::quoted(port)
                    ))
                }
            }
        }
        if uri.query().is_some() {
            return Err("must not have a query (\"?...\"); it is a base URL".to_owned());
        }
        let scheme = if https { "https" } else { "http" };
        let prefix = uri.path().trim_end_matches('/');
        let authority = authority.to_ascii_lowercase();
        let base = format!("{scheme}://{authority}{prefix}");
        let authority =
            Authority::try_from(authority.as_str()).map_err(|e| format!("not a valid URL: {e}"))?;
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        Ok(Upstream {
            base: base.into(),
            https,
            authority,
            port,
            prefix: prefix.into(),
        })
    }

    /// Whether requests to this upstream need TLS.
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// Full URI for an endpoint path (`"/in.php"`) and a raw query (`""` = none):
    /// base `https://h:1/x` + `/in.php` + `a=b` -> `https://h:1/x/in.php?a=b`.
    ///
    /// # Errors
    /// [`BadTarget`] if `path` or `query` holds bytes a URI cannot carry unescaped (a space,
    /// a control character, `"`, ...) or a `#`, which would cut the query short. The query
    /// is the caller's, so this is the caller's mistake, never a panic.
    pub fn endpoint(&self, path: &str, query: &str) -> Result<Uri, BadTarget> {
        let mut target = self.target(path, query.len());
        target.query().extend_from_slice(query.as_bytes());
        self.uri(target)
    }

    /// The start of a request target for an endpoint path: the prefix, the path and a `?`,
    /// in a buffer with room for `query_room` bytes of query, which the caller appends to
    /// [`Target::query`] before [`Upstream::uri`] makes the URI of it. One buffer from the
    /// prefix to the last byte of the query, which the URI takes without a copy.
    pub fn target(&self, path: &str, query_room: usize) -> Target {
        let mut bytes = Vec::with_capacity(self.prefix.len() + path.len() + 2 + query_room);
        bytes.extend_from_slice(self.prefix.as_bytes());
        // Without the slash, "in.php" would glue onto the prefix or the host name.
        if !path.starts_with('/') {
            bytes.push(b'/');
        }
        bytes.extend_from_slice(path.as_bytes());
        bytes.push(b'?');
        Target {
            query_start: bytes.len(),
            bytes,
        }
    }

    /// The full URI of a [`Target`] of this upstream: `?` and the query only if the query
    /// is not empty.
    ///
    /// # Errors
    /// As [`Upstream::endpoint`].
    pub fn uri(&self, target: Target) -> Result<Uri, BadTarget> {
        let Target {
            mut bytes,
            query_start,
        } = target;
        // `Uri` would silently drop everything from a `#` on, sending a shorter query than
        // the caller's. (The prefix has none: the base URL was refused with one.)
        if memchr::memchr(b'#', bytes.get(self.prefix.len()..).unwrap_or_default()).is_some() {
            return Err(BadTarget);
        }
        if bytes.len() == query_start {
            bytes.pop();
        }
        let mut parts = hyper::http::uri::Parts::default();
        parts.scheme = Some(if self.https {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        });
        parts.authority = Some(self.authority.clone());
        parts.path_and_query =
            Some(PathAndQuery::from_maybe_shared(Bytes::from(bytes)).map_err(|_| BadTarget)?);
        // Scheme, authority and path are all set, so only a bad part could fail here.
        Uri::from_parts(parts).map_err(|_| BadTarget)
    }

    /// The upstream's host name or IP address, lowercase, without port or brackets.
    pub fn host(&self) -> &str {
        self.authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
    }

    /// Whether connections to `self` and `other` go to one place: the same scheme, host and
    /// port (a default port written out or not), whatever their path prefixes. A refused
    /// connection is about that place, so it holds for every upstream that shares it. Hosts
    /// are compared as written (lowercased), not resolved: `localhost` is not `127.0.0.1`.
    pub fn same_origin(&self, other: &Upstream) -> bool {
        self.https == other.https && self.port == other.port && self.host() == other.host()
    }

    /// The normalised base without trailing `/`.
    pub fn as_str(&self) -> &str {
        &self.base
    }
}

/// A request target being written for [`Upstream::uri`]: the prefix, the endpoint path and a
/// `?` (from [`Upstream::target`]), then the query.
pub struct Target {
    bytes: Vec<u8>,
    /// Where the query starts: if nothing is appended there, the `?` is dropped.
    query_start: usize,
}

impl Target {
    /// The buffer the query is appended to. Everything in it so far is the target's start,
    /// which must stay as it is: append only.
    pub fn query(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }
}

/// A path or query that cannot be sent as a URI. Says nothing of the bytes: a query holds
/// the caller's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the request's query holds characters a URL cannot carry unescaped")]
pub struct BadTarget;

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Upstream({:?})", self.base)
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(s: &str) -> Upstream {
        Upstream::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn normalises_scheme_host_and_trailing_slash() {
        assert_eq!(
            parsed("https://ocr.captchaai.com").as_str(),
            "https://ocr.captchaai.com"
        );
        assert_eq!(
            parsed("HTTPS://OCR.CaptchaAI.com/").as_str(),
            "https://ocr.captchaai.com"
        );
        assert_eq!(
            parsed("http://127.0.0.1:9000/api/v1/").as_str(),
            "http://127.0.0.1:9000/api/v1"
        );
        assert_eq!(parsed("http://[::1]:9000").as_str(), "http://[::1]:9000");
    }

    #[test]
    fn knows_its_scheme() {
        assert!(parsed("https://h").is_https());
        assert!(!parsed("http://h").is_https());
    }

    #[test]
    fn an_origin_is_scheme_host_and_port_whatever_the_prefix() {
        let same = [
            ("http://h:9000/captchaai", "http://h:9000/2captcha"),
            ("http://H:9000", "http://h:9000/"),
            ("http://h", "http://h:80/x"),
            ("https://h", "https://h:443"),
            ("http://[::1]:9000", "http://[::1]:9000/x"),
        ];
        for (a, b) in same {
            assert!(parsed(a).same_origin(&parsed(b)), "{a} and {b}");
            assert!(parsed(b).same_origin(&parsed(a)), "{b} and {a}");
        }
        let different = [
            ("http://h:9000", "http://h:9001"),
            ("http://h:443", "https://h:443"),
            ("http://h", "https://h"),
            ("http://h", "http://g"),
            ("http://localhost:9000", "http://127.0.0.1:9000"),
        ];
        for (a, b) in different {
            assert!(!parsed(a).same_origin(&parsed(b)), "{a} and {b}");
        }
    }

    #[test]
    fn debug_and_display_show_the_url() {
        let up = parsed("https://h:8443/x/");
        assert_eq!(format!("{up}"), "https://h:8443/x");
        assert_eq!(format!("{up:?}"), "Upstream(\"https://h:8443/x\")");
    }

    #[test]
    fn endpoint_joins_base_path_and_query() {
        let up = parsed("https://h:1/x");
        assert_eq!(
            up.endpoint("/in.php", "a=b").unwrap().to_string(),
            "https://h:1/x/in.php?a=b"
        );
        assert_eq!(
            up.endpoint("/res.php", "").unwrap().to_string(),
            "https://h:1/x/res.php"
        );
        assert_eq!(
            up.endpoint("in.php", "").unwrap().to_string(),
            "https://h:1/x/in.php"
        );
        let root = parsed("http://127.0.0.1:9000/");
        assert_eq!(
            root.endpoint("/res.php", "key=k&action=get&id=1")
                .unwrap()
                .to_string(),
            "http://127.0.0.1:9000/res.php?key=k&action=get&id=1"
        );
    }

    #[test]
    fn endpoint_authorities_are_lowercase() {
        // The upstream pool keys connections by the authority's exact bytes.
        let up = parsed("HTTP://OCR.CaptchaAI.com:8080/Prefix");
        let uri = up.endpoint("/in.php", "").unwrap();
        assert_eq!(uri.authority().unwrap().as_str(), "ocr.captchaai.com:8080");
        assert_eq!(uri.scheme_str(), Some("http"));
        assert_eq!(uri.path(), "/Prefix/in.php", "the path keeps its case");
    }

    #[test]
    fn endpoint_keeps_urlencoded_query_bytes() {
        let up = parsed("https://h");
        let uri = up.endpoint("/in.php", "body=a%2Bb%3D&json=1").unwrap();
        assert_eq!(uri.query(), Some("body=a%2Bb%3D&json=1"));
    }

    #[test]
    fn rejects_what_is_not_a_base_url() {
        let cases = [
            ("", "must not be empty"),
            ("ftp://h", "scheme must be http or https, got \"ftp\""),
            ("ocr.captchaai.com", "must start with http:// or https://"),
            (
                "ocr.captchaai.com:443",
                "must start with http:// or https://",
            ),
            ("/in.php", "must start with http:// or https://"),
            (
                "http://h/?a=b",
                "must not have a query (\"?...\"); it is a base URL",
            ),
            (
                "http://h?",
                "must not have a query (\"?...\"); it is a base URL",
            ),
            ("http://h/#top", "must not have a fragment (\"#...\")"),
            ("http://u:p@h", "must not contain user info (\"user@\")"),
            ("http://:80", "has no host"),
            ("http://h:99999", "invalid port \"99999\"; expected 1-65535"),
            ("http://h:0", "invalid port \"0\"; expected 1-65535"),
            ("http://h:/", "invalid port \"\"; expected 1-65535"),
        ];
        for (input, want) in cases {
            assert_eq!(Upstream::parse(input), Err(want.to_owned()), "{input:?}");
        }
        let spaces = Upstream::parse("http://h /x").expect_err("space");
        assert!(spaces.starts_with("not a valid URL: "), "{spaces}");
    }

    #[test]
    fn unsendable_queries_are_errors() {
        let up = parsed("https://h/x");
        for query in ["a=b c", "a=\"b\"", "a=\n", "a=\u{7f}", "a=b#frag", "a=<b>"] {
            assert_eq!(up.endpoint("/in.php", query), Err(BadTarget), "{query:?}");
        }
        assert_eq!(up.endpoint("/in php", ""), Err(BadTarget));
    }

    proptest::proptest! {
        /// Any query at all, as a caller could send it: an error or a URI, never a panic, and
        /// a URI carries the query byte for byte.
        #[test]
        fn endpoint_never_panics_on_caller_queries(query in proptest::prelude::any::<String>()) {
            let up = parsed("http://127.0.0.1:9000/api");
            match up.endpoint("/in.php", &query) {
                Ok(uri) => {
                    proptest::prop_assert_eq!(uri.path(), "/api/in.php");
                    proptest::prop_assert_eq!(uri.query().unwrap_or(""), query.as_str());
                }
                Err(e) => proptest::prop_assert_eq!(e, BadTarget),
            }
        }

        /// Queries made of URI-safe bytes, as a client's urlencoding produces: always sent.
        #[test]
        fn urlencoded_queries_are_always_sent(query in "[A-Za-z0-9%=&_.~+*-]{0,200}") {
            let uri = parsed("https://h").endpoint("/res.php", &query);
            proptest::prop_assert!(uri.is_ok(), "{:?}", query);
        }
    }
}
