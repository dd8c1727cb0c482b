//! `[tls]`, `[forward]` and `[ca]`: the TLS listener, the forward-proxy mode and the local
//! certificate authority, from raw TOML to their validated form. Paths are kept as written;
//! `Config::load` makes relative ones relative to the config file.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::allow::AllowEntry;
use super::problems::Problems;
use super::raw::{RawCa, RawForward, RawTls};
use super::redact::quoted;

/// The 2captcha-compatible services whose API hosts scripts name; with the configured
/// upstream's host, the default `[forward] intercept` list.
pub const KNOWN_API_HOSTS: &[&str] = &[
    "ocr.captchaai.com",
    "captchaai.com",
    "2captcha.com",
    "api.2captcha.com",
    "rucaptcha.com",
    "api.rucaptcha.com",
    "api.capmonster.cloud",
    "api.anti-captcha.com",
    // The JSON task API's own (`json_api::JSON_API_HOSTS`).
    "api.capsolver.com",
];

/// A certificate and its private key, as PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `[tls]`: a TLS listener that serves what the plain listener serves.
#[derive(Clone, Debug)]
pub struct Tls {
    pub listen: SocketAddr,
    /// The certificate to present; `None`: one issued by the local CA.
    pub files: Option<PemFiles>,
    /// Names the issued certificate carries besides `localhost`, `127.0.0.1` and `::1`.
    pub names: Vec<String>,
}

/// What `CONNECT` to a host that is not intercepted gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tunnel {
    /// Tunnelled byte for byte, as any forward proxy does.
    #[default]
    All,
    /// Refused with `403 Forbidden`.
    None,
}

impl Tunnel {
    pub fn label(self) -> &'static str {
        match self {
            Tunnel::All => "all",
            Tunnel::None => "none",
        }
    }
}

/// `[forward]`: the forward-proxy mode of the plain listener.
#[derive(Clone, Debug)]
pub struct Forward {
    /// Hosts whose captcha API traffic is served by the pool, lowercase, without port.
    /// `None`: [`KNOWN_API_HOSTS`] and the upstream's host.
    pub intercept: Option<Vec<String>>,
    pub tunnel: Tunnel,
    /// Destinations the forward proxy may reach beyond its defaults (`[forward] allow`).
    pub allow: Vec<AllowEntry>,
}

impl Default for Forward {
    fn default() -> Forward {
        Forward {
            intercept: None,
            tunnel: Tunnel::All,
            allow: Vec::new(),
        }
    }
}

impl Forward {
    /// The hosts intercepted: the configured list, or the known API hosts and `upstream_host`.
    pub fn intercepted(&self, upstream_host: &str) -> Vec<String> {
        match &self.intercept {
            Some(hosts) => hosts.clone(),
            None => {
                let mut hosts: Vec<String> =
                    KNOWN_API_HOSTS.iter().map(|h| (*h).to_owned()).collect();
                let upstream = upstream_host.to_ascii_lowercase();
                if !hosts.contains(&upstream) {
                    hosts.push(upstream);
                }
                hosts
            }
        }
    }
}

/// `[ca]`: the local certificate authority.
#[derive(Clone, Debug, Default)]
pub struct Ca {
    /// The CA's certificate and key; `None`: generated into `data_dir` on first start.
    pub files: Option<PemFiles>,
}

pub(super) fn tls(p: &mut Problems, raw: Option<RawTls>, plain: SocketAddr) -> Option<Tls> {
    let raw = raw?;
    let listen = match raw.listen {
        None => {
            p.add(
                "tls.listen",
                "missing; [tls] needs an address such as \"127.0.0.1:8443\"",
            );
            return None;
        }
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                p.add(
                    "tls.listen",
                    format!(
                        "{} is not an IP address and port such as \"127.0.0.1:8443\"",
                        quoted(&text)
                    ),
                );
                return None;
            }
        },
    };
    if listen == plain && listen.port() != 0 {
        p.add("tls.listen", "must differ from listen");
    }
    let files = pem_files(p, "tls", raw.cert, raw.key);
    let mut names = Vec::new();
    for (i, name) in raw.names.unwrap_or_default().into_iter().enumerate() {
        let name = name.trim().to_ascii_lowercase();
        match host_problem(&name) {
            Some(problem) => p.add(format!("tls.names[{i}]"), problem),
            None if !names.contains(&name) => names.push(name),
            None => {}
        }
    }
    Some(Tls {
        listen,
        files,
        names,
    })
}

pub(super) fn forward(p: &mut Problems, raw: RawForward) -> Forward {
    let tunnel = match raw.tunnel.as_deref() {
        None | Some("all") => Tunnel::All,
        Some("none") => Tunnel::None,
        Some(other) => {
            p.add(
                "forward.tunnel",
                format!("{} is not \"all\" or \"none\"", quoted(other)),
            );
            Tunnel::All
        }
    };
    let intercept = raw.intercept.map(|hosts| {
        let mut list = Vec::new();
        for (i, host) in hosts.into_iter().enumerate() {
            let host = host.trim().to_ascii_lowercase();
            match host_problem(&host) {
                Some(problem) => p.add(format!("forward.intercept[{i}]"), problem),
                None if !list.contains(&host) => list.push(host),
                None => {}
            }
        }
        list
    });
    let allow = super::allow::allow_list(p, raw.allow);
    Forward {
        intercept,
        tunnel,
        allow,
    }
}

pub(super) fn ca(p: &mut Problems, raw: RawCa) -> Ca {
    Ca {
        files: pem_files(p, "ca", raw.cert, raw.key),
    }
}

/// `cert` and `key` of `section`: both or neither.
fn pem_files(
    p: &mut Problems,
    section: &str,
    cert: Option<String>,
    key: Option<String>,
) -> Option<PemFiles> {
    let cert = cert.filter(|c| !c.trim().is_empty());
    let key = key.filter(|k| !k.trim().is_empty());
    match (cert, key) {
        (Some(cert), Some(key)) => Some(PemFiles {
            cert: PathBuf::from(cert),
            key: PathBuf::from(key),
        }),
        (None, None) => None,
        (Some(_), None) => {
            p.add(
                format!("{section}.key"),
                format!("missing; {section}.cert needs the file of its private key"),
            );
            None
        }
        (None, Some(_)) => {
            p.add(
                format!("{section}.cert"),
                format!("missing; {section}.key needs the file of its certificate"),
            );
            None
        }
    }
}

/// Why `host` (trimmed, lowercase) is not a host name or IP address a certificate or a
/// `CONNECT` can name, if it is not.
fn host_problem(host: &str) -> Option<String> {
    if host.is_empty() {
        return Some("must not be empty".to_owned());
    }
    if host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if host.len() > 253 || !host.split('.').all(label_ok) {
        return Some(format!(
            "{} is not a host name such as \"ocr.captchaai.com\" (no scheme, port or path)",
            quoted(host)
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_ips_pass_and_urls_do_not() {
        for ok in [
            "ocr.captchaai.com",
            "localhost",
            "127.0.0.1",
            "::1",
            "a-b.c",
        ] {
            assert_eq!(host_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "https://ocr.captchaai.com",
            "ocr.captchaai.com:443",
            "ocr.captchaai.com/in.php",
            "a..b",
            "-a.b",
            "a b",
        ] {
            assert!(host_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn the_default_intercept_list_adds_the_upstream_host_once() {
        let forward = Forward::default();
        let hosts = forward.intercepted("OCR.captchaai.com");
        assert_eq!(
            hosts.iter().filter(|h| *h == "ocr.captchaai.com").count(),
            1
        );
        let hosts = forward.intercepted("captcha.internal");
        assert!(hosts.contains(&"captcha.internal".to_owned()));
        assert!(hosts.contains(&"2captcha.com".to_owned()));
        let own = Forward {
            intercept: Some(vec!["x.test".to_owned()]),
            tunnel: Tunnel::None,
            allow: Vec::new(),
        };
        assert_eq!(own.intercepted("ocr.captchaai.com"), ["x.test"]);
    }
}
