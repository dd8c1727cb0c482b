//! Test helpers: an in-memory handshake between a rustls client that trusts one CA and a
//! server config, and certificate verification at a chosen time.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

fn roots(ca: &CertificateDer<'static>) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).expect("the CA certificate parses");
    Arc::new(roots)
}

/// The server's certificate and the ALPN protocol agreed, after a full handshake with a
/// client that trusts only `ca` and asks for `name`; or the first error either side met.
pub(crate) fn handshake(
    server: Arc<ServerConfig>,
    ca: &CertificateDer<'static>,
    name: &str,
) -> Result<(CertificateDer<'static>, Option<Vec<u8>>), rustls::Error> {
    let mut config = ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(name.to_owned()).expect("a valid server name");
    let mut client = ClientConnection::new(Arc::new(config), name)?;
    let mut server = ServerConnection::new(server)?;
    for _ in 0..20 {
        let mut wire = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut wire).expect("writes to a Vec");
        }
        if !wire.is_empty() {
            server.read_tls(&mut &wire[..]).expect("reads from a slice");
            server.process_new_packets()?;
        }
        let mut wire = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut wire).expect("writes to a Vec");
        }
        if !wire.is_empty() {
            client.read_tls(&mut &wire[..]).expect("reads from a slice");
            client.process_new_packets()?;
        }
        if !client.is_handshaking() && !server.is_handshaking() {
            let cert = client.peer_certificates().expect("a server certificate")[0].clone();
            return Ok((cert, client.alpn_protocol().map(<[u8]>::to_vec)));
        }
    }
    panic!("the handshake did not finish");
}

/// Whether `leaf` verifies for `name` at `now` against `ca` alone.
pub(crate) fn verify(
    ca: &CertificateDer<'static>,
    leaf: &CertificateDer<'static>,
    name: &str,
    now: SystemTime,
) -> Result<(), rustls::Error> {
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots(ca), super::provider())
            .build()
            .expect("a verifier with one root");
    let name = ServerName::try_from(name.to_owned()).expect("a valid server name");
    let now = UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).expect("after 1970"));
    verifier
        .verify_server_cert(leaf, &[], &name, &[], now)
        .map(|_| ())
}
