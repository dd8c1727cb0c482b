//! `upstream_proxy`: an HTTP proxy that keyrelay's outgoing connections go through (a
//! `CONNECT` tunnel each), for a network whose only way out is a corporate proxy, and
//! `upstream_no_proxy`, the hosts dialled directly all the same. The URL may carry a user
//! and password, so it is a type that never shows them.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use hyper::header::HeaderValue;
use hyper::Uri;
use hyper_util::client::proxy::matcher::Matcher;

use super::problems::{string_list, Problems};
use toml::Value;

/// The proxy every upstream connection is tunnelled through.
#[derive(Clone)]
pub struct UpstreamProxy {
    /// `http://host:port/`, the user info taken out.
    uri: Uri,
    /// `Proxy-Authorization: Basic …`, from the URL's user info; marked sensitive.
    auth: Option<HeaderValue>,
    /// What logs, errors and `keyrelay check` show: `http://***@host:port` or `http://host:port`.
    shown: String,
    /// `upstream_no_proxy`, normalised: the hosts, addresses and ranges dialled directly.
    direct: Vec<String>,
    /// hyper-util's matcher for the same list, with curl's `NO_PROXY` rules.
    routes: Arc<Matcher>,
}

impl UpstreamProxy {
    /// Parses a proxy URL as the config does, for a config built in code; `${VAR}`s are
    /// not filled. The error is the config's message, the URL in it masked.
    ///
    /// # Errors
    /// Anything but `http://[user:password@]host[:port]`.
    pub fn parse(url: &str) -> Result<UpstreamProxy, String> {
        let mut p = Problems::default();
        let proxy = upstream_proxy(&mut p, url, Vec::new(), &|_| None);
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

    /// This proxy, with `hosts` dialled directly (`upstream_no_proxy`), for a config built
    /// in code.
    ///
    /// # Errors
    /// An entry that is not a host name, an IP address, a range or `*`.
    pub fn bypassing(self, hosts: &[&str]) -> Result<UpstreamProxy, String> {
        let mut p = Problems::default();
        let list = Value::Array(hosts.iter().map(|h| Value::from(*h)).collect());
        let direct = no_proxy(&mut p, list);
        p.check().map_err(|problems| problems.join("; "))?;
        Ok(self.with_direct(direct))
    }

    /// The hosts dialled directly, as `upstream_no_proxy` listed them (normalised).
    pub fn direct(&self) -> &[String] {
        &self.direct
    }

    /// Whether a connection to `dst` skips the proxy: its host is in `upstream_no_proxy`.
    pub fn goes_direct(&self, dst: &Uri) -> bool {
        dst.host().is_some() && self.routes.intercept(dst).is_none()
    }

    /// Whether `other` dials the same proxy with the same credential (whatever it bypasses).
    pub fn same_proxy(&self, other: &UpstreamProxy) -> bool {
        self.uri == other.uri && self.auth == other.auth
    }

    fn with_direct(mut self, direct: Vec<String>) -> UpstreamProxy {
        self.routes = Arc::new(
            Matcher::builder()
                .all(self.uri.to_string())
                .no(direct.join(","))
                .build(),
        );
        self.direct = direct;
        self
    }
}

impl PartialEq for UpstreamProxy {
    fn eq(&self, other: &UpstreamProxy) -> bool {
        self.same_proxy(other) && self.direct == other.direct
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
/// environment, bypassed for the `direct` hosts ([`no_proxy`]). `None` (and a problem) if
/// it is not such a URL; messages show the URL with its user info masked, never the
/// password.
pub(super) fn upstream_proxy(
    p: &mut Problems,
    template: &str,
    direct: Vec<String>,
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
    let proxy = UpstreamProxy {
        uri: intercept.uri().clone(),
        auth: intercept.basic_auth().cloned(),
        shown,
        direct: Vec::new(),
        routes: Arc::new(Matcher::builder().build()),
    };
    Some(proxy.with_direct(direct))
}

const NO_PROXY_FIELD: &str = "upstream_no_proxy";

/// `upstream_no_proxy = ["localhost", ".corp.internal", "10.0.0.0/8", …]`: host names (each
/// with its subdomains; `*.corp` is read as `.corp`), IP addresses, CIDR ranges, or `*` for
/// every host, lowercased. A bad entry is a problem naming its place in the list, not its
/// text: the field sits beside others that hold secrets.
pub(super) fn no_proxy(p: &mut Problems, value: Value) -> Vec<String> {
    let Some(entries) = string_list(p, NO_PROXY_FIELD, value) else {
        return Vec::new();
    };
    let mut direct = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        match no_proxy_entry(entry) {
            Ok(entry) => direct.push(entry),
            Err(why) => p.add(format!("{NO_PROXY_FIELD}[{i}]"), why),
        }
    }
    direct
}

fn no_proxy_entry(entry: &str) -> Result<String, &'static str> {
    let entry = entry.trim().to_ascii_lowercase();
    if entry.is_empty() {
        return Err("is empty; write a host name, an IP address or a range such as 10.0.0.0/8");
    }
    if entry == "*" {
        return Ok(entry);
    }
    if entry.contains("://") {
        return Err("is a URL: write only its host, such as corp.internal");
    }
    let unbracketed = entry
        .strip_prefix('[')
        .and_then(|e| e.strip_suffix(']'))
        .unwrap_or(&entry);
    if unbracketed.parse::<IpAddr>().is_ok() {
        return Ok(unbracketed.to_owned());
    }
    if let Some((address, bits)) = entry.split_once('/') {
        let max = match address.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => 32,
            Ok(IpAddr::V6(_)) => 128,
            Err(_) => return Err("is not an address range such as 10.0.0.0/8 or fd00::/8"),
        };
        return match bits.parse::<u8>() {
            Ok(bits) if bits <= max => Ok(entry),
            _ => Err("has a prefix length beyond its address's (32 for IPv4, 128 for IPv6)"),
        };
    }
    // `*.corp` is a common way to write `.corp`, the only form the matcher knows.
    let domain = match entry.strip_prefix("*.") {
        Some(rest) => format!(".{rest}"),
        None => entry.clone(),
    };
    let name = domain.strip_prefix('.').unwrap_or(&domain);
    if name.contains(':') {
        return Err("takes no port: a host is dialled directly on every port");
    }
    let valid = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err("must be a host name (.corp.internal covers its subdomains), an IP address, a range such as 10.0.0.0/8, or *");
    }
    Ok(domain)
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
        let proxy = upstream_proxy(&mut p, value, Vec::new(), env);
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

    fn direct(entries: &[&str]) -> Result<Vec<String>, Vec<String>> {
        let mut p = Problems::default();
        let list = Value::Array(entries.iter().map(|e| Value::from(*e)).collect());
        let direct = no_proxy(&mut p, list);
        p.check()?;
        Ok(direct)
    }

    #[test]
    fn no_proxy_entries_are_normalised() {
        let list = direct(&[
            " LocalHost ",
            "*.Corp.Internal",
            ".svc",
            "10.0.0.0/8",
            "[::1]",
            "fd00::/8",
            "192.168.1.7",
            "*",
        ])
        .unwrap();
        assert_eq!(
            list,
            [
                "localhost",
                ".corp.internal",
                ".svc",
                "10.0.0.0/8",
                "::1",
                "fd00::/8",
                "192.168.1.7",
                "*"
            ]
        );
    }

    #[test]
    fn a_bad_no_proxy_entry_is_named_by_its_place_and_not_echoed() {
        let cases = [
            ("", "is empty"),
            ("proxy.internal:3128", "takes no port"),
            ("10.0.0.0/33", "prefix length"),
            ("::/129", "prefix length"),
            ("corp/8", "not an address range"),
            ("secret value", "must be a host name"),
            ("a..b", "must be a host name"),
            ("http://corp", "is a URL"),
            ("*corp", "must be a host name"),
        ];
        for (entry, why) in cases {
            let problems = direct(&["localhost", entry]).expect_err(entry);
            assert_eq!(problems.len(), 1, "{entry}: {problems:?}");
            assert!(
                problems[0].starts_with("upstream_no_proxy[1]: "),
                "{entry}: {problems:?}"
            );
            assert!(problems[0].contains(why), "{entry}: {problems:?}");
            if entry.len() > 3 {
                assert!(!problems[0].contains(entry), "{entry}: {problems:?}");
            }
        }
        let not_a_list = direct_value(Value::from("0123456789abcdef0123456789abcdef"));
        assert!(not_a_list[0].contains("must be an array"), "{not_a_list:?}");
        assert!(
            !not_a_list[0].contains("0123456789abcdef"),
            "{not_a_list:?}"
        );
    }

    fn direct_value(value: Value) -> Vec<String> {
        let mut p = Problems::default();
        no_proxy(&mut p, value);
        p.check().expect_err("a problem")
    }

    #[test]
    fn listed_hosts_go_direct_with_curls_rules_and_others_through_the_proxy() {
        let proxy = parse("http://u:pw@proxy.internal:3128")
            .unwrap()
            .bypassing(&["localhost", ".corp.internal", "10.0.0.0/8", "::1"])
            .unwrap();
        let goes_direct = |uri: &str| proxy.goes_direct(&uri.parse::<Uri>().unwrap());
        for uri in [
            "http://localhost/",
            "https://LOCALHOST:8443/",
            "http://corp.internal/",
            "https://api.corp.internal/",
            "http://10.1.2.3:8080/",
            "http://[::1]:80/",
        ] {
            assert!(goes_direct(uri), "{uri}");
        }
        for uri in [
            "https://ocr.captchaai.com/",
            "http://notcorp.internal/",
            "http://localhost.example/",
            "http://11.0.0.1/",
            "http://[::2]/",
        ] {
            assert!(!goes_direct(uri), "{uri}");
        }
        let everything = parse("http://proxy:1").unwrap().bypassing(&["*"]).unwrap();
        assert!(everything.goes_direct(&Uri::from_static("https://ocr.captchaai.com/")));
        let nothing = parse("http://proxy:1").unwrap();
        assert!(!nothing.goes_direct(&Uri::from_static("http://localhost/")));
        // The list is part of what a reload compares, apart from the proxy itself.
        assert!(nothing.same_proxy(&everything) && nothing != everything);
    }
}
