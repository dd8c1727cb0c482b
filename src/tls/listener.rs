//! The `[tls]` listener's certificate: from PEM files, re-read when they change, or issued
//! by the local CA for the loopback names and `tls.names`, renewed before it expires. The
//! current one sits in an `ArcSwap`, so a handshake never waits for a reload.
//!
//! The files are polled once a second, as `proxy.toml` is and for the same reasons:
//! certificate renewers and Kubernetes secrets replace files by rename or symlink swap.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use super::{files, LocalCa, TlsError};
use crate::config::{PemFiles, Tls};

/// How often the certificate files (or the issued certificate's expiry) are checked.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The names an issued listener certificate always carries.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

enum Source {
    Files(PemFiles),
    Issued {
        ca: Arc<LocalCa>,
        names: Vec<String>,
    },
}

/// What was last loaded: the files' fingerprint, or when the issued certificate ends.
struct Loaded {
    fingerprint: Option<u64>,
    not_after: Option<SystemTime>,
}

/// The listener's current certificate, as rustls asks for it on every handshake.
pub struct ListenerCert {
    current: ArcSwap<CertifiedKey>,
    source: Source,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for ListenerCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            Source::Files(files) => format!("files {}", files.cert.display()),
            Source::Issued { names, .. } => format!("issued for {names:?}"),
        };
        f.debug_struct("ListenerCert")
            .field("source", &source)
            .finish_non_exhaustive()
    }
}

impl ListenerCert {
    /// The certificate of `[tls]`: its files if it names them, else one `ca` issues.
    ///
    /// # Errors
    /// The files are unreadable or invalid, or issuing failed.
    pub fn new(tls: &Tls, ca: Arc<LocalCa>) -> Result<Arc<ListenerCert>, TlsError> {
        ListenerCert::new_at(tls, ca, SystemTime::now())
    }

    fn new_at(tls: &Tls, ca: Arc<LocalCa>, now: SystemTime) -> Result<Arc<ListenerCert>, TlsError> {
        let (source, current, loaded) = match &tls.files {
            Some(pem) => {
                // The fingerprint before the read: a change in between is seen next poll.
                let fingerprint = files::fingerprint(pem);
                let key = files::certified_key(pem)?;
                let loaded = Loaded {
                    fingerprint,
                    not_after: None,
                };
                (Source::Files(pem.clone()), Arc::new(key), loaded)
            }
            None => {
                let names = issued_names(tls);
                let issued = ca.issue(&names, now)?;
                let loaded = Loaded {
                    fingerprint: None,
                    not_after: Some(issued.not_after),
                };
                (Source::Issued { ca, names }, issued.key, loaded)
            }
        };
        Ok(Arc::new(ListenerCert {
            current: ArcSwap::new(current),
            source,
            loaded: Mutex::new(loaded),
        }))
    }

    /// The certificate handshakes get now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// Re-reads the files if they changed, or renews an issued certificate near its end.
    /// Returns whether the certificate was replaced.
    ///
    /// # Errors
    /// The changed files are unreadable or invalid; the current certificate is kept, and
    /// the same files are not retried until they change again.
    pub fn refresh(&self) -> Result<bool, TlsError> {
        self.refresh_at(SystemTime::now())
    }

    /// [`ListenerCert::refresh`] as of `now`.
    ///
    /// # Errors
    /// As for [`ListenerCert::refresh`].
    pub fn refresh_at(&self, now: SystemTime) -> Result<bool, TlsError> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        match &self.source {
            Source::Files(pem) => {
                let fingerprint = files::fingerprint(pem);
                if fingerprint.is_some() && fingerprint == loaded.fingerprint {
                    return Ok(false);
                }
                // Recorded before the load, so a bad file is reported once, not every poll.
                loaded.fingerprint = fingerprint;
                let key = files::certified_key(pem)?;
                self.current.store(Arc::new(key));
                Ok(true)
            }
            Source::Issued { ca, names } => {
                let renew_at = loaded
                    .not_after
                    .and_then(|end| end.checked_sub(ca.policy().renew_before));
                if renew_at.is_some_and(|at| now < at) {
                    return Ok(false);
                }
                let issued = ca.issue(names, now)?;
                loaded.not_after = Some(issued.not_after);
                self.current.store(issued.key);
                Ok(true)
            }
        }
    }

    /// Polls [`ListenerCert::refresh`] once a second, logging what changed and why a bad
    /// file was not taken, until the task is dropped.
    pub async fn watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            match self.refresh() {
                Ok(false) => {}
                Ok(true) => tracing::info!(source = ?self, "TLS certificate reloaded"),
                Err(e) => tracing::warn!(
                    error = %e,
                    "TLS certificate not reloaded; keeping the current one"
                ),
            }
        }
    }
}

impl ResolvesServerCert for ListenerCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The `[tls]` listener's server config: TLS 1.2 and 1.3, ALPN `http/1.1`, and whatever
/// certificate `cert` holds at each handshake.
pub fn listener_config(cert: Arc<ListenerCert>) -> Arc<ServerConfig> {
    super::server_config(cert)
}

/// `localhost`, `127.0.0.1`, `::1` and the configured names, each once.
fn issued_names(tls: &Tls) -> Vec<String> {
    let mut names: Vec<String> = LOOPBACK_NAMES.iter().map(|n| (*n).to_owned()).collect();
    for name in &tls.names {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

#[cfg(test)]
mod tests;
