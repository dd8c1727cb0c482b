//! TLS for keyrelay: the local certificate authority and the leaf certificates it issues
//! ([`LocalCa`]), the `[tls]` listener's certificate and its reload ([`ListenerCert`]), and
//! what a failed handshake is counted as ([`classify_handshake_error`]).
//!
//! Everything here runs on rustls with the ring provider, the same as the upstream client.

mod ca;
mod files;
mod handshake;
mod leaves;
mod listener;
#[cfg(test)]
mod test_support;

use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::ServerConfig;

pub use ca::{Issued, LeafPolicy, LocalCa};
pub use handshake::{accept, classify_handshake_error, HandshakeFailure};
pub use listener::{listener_config, ListenerCert};

/// Why a certificate or key could not be loaded, created or issued. Every message names
/// the file (or host) and the problem, and never carries key bytes.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file that could not be read, written or used.
    #[error("{}: {problem}", path.display())]
    File { path: PathBuf, problem: String },
    /// One file of a certificate and key pair exists and the other does not.
    #[error(
        "{} exists but {} does not; restore the missing file, or remove both to have \
         keyrelay generate a new CA (clients must then trust the new one)",
        present.display(),
        missing.display()
    )]
    HalfPair { present: PathBuf, missing: PathBuf },
    /// A certificate could not be made for a host.
    #[error("cannot issue a certificate for {host:?}: {problem}")]
    Issue { host: String, problem: String },
}

impl TlsError {
    fn file(path: impl Into<PathBuf>, problem: impl Into<String>) -> TlsError {
        TlsError::File {
            path: path.into(),
            problem: problem.into(),
        }
    }
}

/// The provider every keyrelay TLS config is built on.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config for keyrelay's listeners: TLS 1.2 and 1.3, ALPN `http/1.1` (the only
/// protocol keyrelay serves), the certificate from `resolver`.
fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("the ring provider supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}
