//! `upstream_proxy`: an HTTP proxy that keyrelay's own upstream connections go through
//! (a `CONNECT` tunnel each), for a network whose only way out is a corporate proxy. The
//! URL may carry a user and password, so it is a type that never shows them.

use std::fmt;

use hyper::header::HeaderValue;
use hyper::Uri;
use hyper_util::client::proxy::matcher::Matcher;

use super::problems::Problems;

/// The proxy every upstream connection is tunnelled through.
#[derive(Clone)]
pub struct UpstreamProxy {
    /// `http://host:port/`, the user info taken out.
    uri: Uri,
    /// `Proxy-Authorization: Basic …`, from the URL's user info; marked sensitive.
    auth: Option<HeaderValue>,
    /// What logs, errors and `keyrelay check` show: `http://***@host:port` or `http://host:port`.
    shown: String,
}

impl UpstreamProxy {
    /// Parses a proxy URL as the config does, for a config built in code; `${VAR}`s are
    /// not filled. The error is the config's message, the URL in it masked.
    ///
    /// # Errors
    /// Anything but `http://[user:password@]host[:port]`.
    pub fn parse(url: &str) -> Result<UpstreamProxy, String> {
        let mut p = Problems::default();
        let proxy = upstream_proxy(&mut p, url, &|_| None);
        p.check().map_err(|problems| problems.join("; "))?;
        proxy.ok_or_else(|| format!("{FIELD}: not a usable proxy URL"))
    }

    /// The proxy's address, without credentials: where the tunnels are dialled.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The `Proxy-Authorization` value each `CONNECT` carries, if the URL named a user.
    pub fn auth(&self) -> Option<&HeaderValue> {
        self.auth.as_ref()
    }
}

impl PartialEq for UpstreamProxy {
    fn eq(&self, other: &UpstreamProxy) -> bool {
        self.uri == other.uri && self.auth == other.auth
    }
}

impl fmt::Display for UpstreamProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for UpstreamProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UpstreamProxy({})", self.shown)
    }
}

const FIELD: &str = "upstream_proxy";

/// `upstream_proxy = "http://[user:password@]host:port"`, `${VAR}`s filled from the
/// environment. `None` (and a problem) if it is not such a URL; messages show the URL with
/// its user info masked, never the password.
pub(super) fn upstream_proxy(
    p: &mut Problems,
    template: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<UpstreamProxy> {
    let (value, _) = super::keys::substitute(p, FIELD, template, env)?;
    let value = value.trim();
    let shown = redacted(value);
    let Some(rest) = value.strip_prefix("http://") else {
        let why = if value.starts_with("https://") {
            "a TLS connection to the proxy itself is not supported; write http://host:port (the upstream's own TLS still runs end to end inside the tunnel)"
        } else if value.starts_with("socks") {
            "SOCKS proxies are not supported; write the URL of an HTTP proxy that allows CONNECT"
        } else {
            "must be an http:// URL, such as \"http://proxy.internal:3128\""
        };
        p.add(FIELD, format!("{shown}: {why}"));
        return None;
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        p.add(
            FIELD,
            format!("{shown}: takes only a host and port, no path or query"),
        );
        return None;
    }
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if host_port.is_empty() || host_port.starts_with(':') {
        p.add(FIELD, format!("{shown}: names no host"));
        return None;
    }
    if let Some(problem) = port_problem(host_port) {
        p.add(FIELD, format!("{shown}: {problem}"));
        return None;
    }
    // Parsed, and its user info turned into a Basic credential, by hyper-util's own proxy
    // matcher: the rules every hyper-based client applies to a proxy URL.
    let intercept = Matcher::builder()
        .all(value.to_owned())
        .build()
        .intercept(&Uri::from_static("https://upstream.invalid/"));
    let Some(intercept) = intercept else {
        p.add(FIELD, format!("{shown}: is not a usable proxy URL"));
        return None;
    };
    Some(UpstreamProxy {
        uri: intercept.uri().clone(),
        auth: intercept.basic_auth().cloned(),
        shown,
    })
}

/// What is wrong with the port of `host[:port]`, if anything: `http::Uri` takes any
/// characters there, and the dial would fail only when a request came.
fn port_problem(host_port: &str) -> Option<&'static str> {
    let after_host = match host_port.rfind(']') {
        Some(end) => &host_port[end + 1..],
        None => host_port.find(':').map_or("", |colon| &host_port[colon..]),
    };
    let port = after_host.strip_prefix(':')?;
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Some("the port must be a number from 1 to 65535"),
        Ok(_) => None,
    }
}

/// `url` with everything before the authority's last `@` masked. A value without `://` is
/// not shown at all: it is no URL, and might be a key typed into the wrong field.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "the value (not shown)".to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => format!("***@{}", &authority[at + 1..]),
        None => authority.to_owned(),
    };
    // The tail is shown only up to its first character, enough to say what is wrong with it
    // without quoting a query that could hold a secret too.
    let tail = tail
        .chars()
        .next()
        .map_or(String::new(), |c| format!("{c}…"));
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Result<UpstreamProxy, Vec<String>> {
        parse_with(value, &|_| None)
    }

    fn parse_with(
        value: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<UpstreamProxy, Vec<String>> {
        let mut p = Problems::default();
        let proxy = upstream_proxy(&mut p, value, env);
        p.check()?;
        Ok(proxy.expect("no problem, so a proxy"))
    }

    #[test]
    fn a_plain_proxy_has_no_credential() {
        let proxy = parse("http://proxy.internal:3128").unwrap();
        assert_eq!(proxy.uri().host(), Some("proxy.internal"));
        assert_eq!(proxy.uri().port_u16(), Some(3128));
        assert!(proxy.auth().is_none());
        assert_eq!(proxy.to_string(), "http://proxy.internal:3128");
    }

    #[test]
    fn user_info_becomes_a_sensitive_basic_credential_and_is_never_shown() {
        for url in [
            "http://alice:s3cr%40t@proxy.internal:3128",
            "http://alice:s3cr%40t@proxy.internal:3128/",
        ] {
            let proxy = parse(url).unwrap();
            let auth = proxy.auth().expect("a credential");
            // base64("alice:s3cr@t"): the password percent-decoded, as RFC 3986 encodes it.
            assert_eq!(auth, "Basic YWxpY2U6czNjckB0");
            assert!(auth.is_sensitive());
            assert_eq!(proxy.uri().host(), Some("proxy.internal"));
            assert!(!proxy.uri().to_string().contains("alice"));
            for shown in [proxy.to_string(), format!("{proxy:?}")] {
                assert!(shown.contains("***@proxy.internal:3128"), "{shown}");
                assert!(
                    !shown.contains("alice") && !shown.contains("s3cr"),
                    "{shown}"
                );
            }
        }
    }

    #[test]
    fn the_password_can_come_from_the_environment() {
        let env = |name: &str| (name == "PROXY_PASS").then(|| "hunter2".to_owned());
        let proxy = parse_with("http://bob:${PROXY_PASS}@10.0.0.1:8080", &env).unwrap();
        // base64("bob:hunter2")
        assert_eq!(proxy.auth().unwrap(), "Basic Ym9iOmh1bnRlcjI=");
        assert_eq!(proxy.uri().port_u16(), Some(8080));
        let missing = parse("http://bob:${PROXY_PASS}@10.0.0.1:8080").unwrap_err();
        assert!(missing[0].contains("PROXY_PASS"), "{missing:?}");
    }

    #[test]
    fn an_ipv6_proxy_is_dialled_by_its_literal() {
        let proxy = parse("http://[::1]:3128").unwrap();
        assert_eq!(proxy.uri().host(), Some("[::1]"));
        assert_eq!(proxy.uri().port_u16(), Some(3128));
    }

    #[test]
    fn anything_but_an_http_proxy_url_is_refused_saying_why_and_without_the_password() {
        let cases = [
            ("https://u:pw1@proxy:3128", "TLS connection to the proxy"),
            ("socks5://u:pw1@proxy:1080", "SOCKS"),
            ("proxy:3128", "http:// URL"),
            ("ftp://proxy", "http:// URL"),
            ("http://u:pw1@proxy:3128/path", "no path or query"),
            ("http://proxy:3128?pw1", "no path or query"),
            ("http://", "names no host"),
            ("http://u:pw1@", "names no host"),
            ("http://:3128", "names no host"),
            ("http://proxy:notaport", "the port must be"),
            ("http://proxy:0", "the port must be"),
            ("http://proxy:70000", "the port must be"),
            ("http://[::1]:x", "the port must be"),
            ("0123456789abcdef0123456789abcdef", "http:// URL"),
            ("http://pro xy:3128", "not a usable proxy URL"),
        ];
        for (url, why) in cases {
            let problems = parse(url).expect_err(url);
            assert_eq!(problems.len(), 1, "{url}: {problems:?}");
            assert!(problems[0].starts_with("upstream_proxy: "), "{problems:?}");
            assert!(problems[0].contains(why), "{url}: {problems:?}");
            assert!(!problems[0].contains("pw1"), "{url}: {problems:?}");
            assert!(!problems[0].contains("0123456789abcdef"), "{problems:?}");
        }
    }

    #[test]
    fn redaction_masks_user_info_and_cuts_the_tail() {
        assert_eq!(redacted("http://a:b@h:1/x?y"), "http://***@h:1/…");
        assert_eq!(redacted("http://h:1"), "http://h:1");
        assert_eq!(redacted("a:b@h:1"), "the value (not shown)");
        assert_eq!(redacted("http://a@b@h"), "http://***@h");
    }
}
