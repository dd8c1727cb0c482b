//! What a failed TLS handshake is counted as: a closed set of reasons, the same for the
//! `[tls]` listener and the forward proxy's interception of `CONNECT`.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Why a handshake failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// It did not finish within the header timeout.
    Timeout,
    /// The first bytes were not a TLS record: plain HTTP to the TLS port, or garbage.
    NotTls,
    /// A TLS peer that failed the protocol: an alert, no shared version or cipher, a
    /// malformed handshake message.
    Protocol,
    /// The connection broke or closed before the handshake ended.
    Io,
}

impl HandshakeFailure {
    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::NotTls => "not_tls",
            HandshakeFailure::Protocol => "protocol",
            HandshakeFailure::Io => "io",
        }
    }
}

/// The reason of a failed `accept` (tokio-rustls wraps rustls' errors in an `io::Error`).
pub fn classify_handshake_error(e: &io::Error) -> HandshakeFailure {
    if e.kind() == io::ErrorKind::TimedOut {
        return HandshakeFailure::Timeout;
    }
    let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return HandshakeFailure::Io;
    };
    match tls {
        // A record header that is not TLS's: the peer does not speak TLS at all.
        rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType
            | rustls::InvalidMessage::UnknownProtocolVersion
            | rustls::InvalidMessage::MessageTooLarge,
        ) => HandshakeFailure::NotTls,
        _ => HandshakeFailure::Protocol,
    }
}

/// The server side of a handshake on `io` with `config`, within `timeout`: the stream, or
/// why it failed (with the error, for a debug log). The `[tls]` listener and the forward
/// proxy's interception of `CONNECT` both accept this way, so both count alike.
///
/// # Errors
/// The handshake failed or did not finish in time.
pub async fn accept<IO>(
    config: Arc<rustls::ServerConfig>,
    io: IO,
    timeout: Duration,
) -> Result<TlsStream<IO>, (HandshakeFailure, io::Error)>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, TlsAcceptor::from(config).accept(io)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err((classify_handshake_error(&e), e)),
        Err(_) => Err((
            HandshakeFailure::Timeout,
            io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_by_what_the_peer_did() {
        let wrap = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
        let not_tls = wrap(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert_eq!(classify_handshake_error(&not_tls), HandshakeFailure::NotTls);
        let alert = wrap(rustls::Error::AlertReceived(
            rustls::AlertDescription::UnknownCA,
        ));
        assert_eq!(classify_handshake_error(&alert), HandshakeFailure::Protocol);
        let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof");
        assert_eq!(classify_handshake_error(&eof), HandshakeFailure::Io);
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(classify_handshake_error(&reset), HandshakeFailure::Io);
        let slow = io::Error::from(io::ErrorKind::TimedOut);
        assert_eq!(classify_handshake_error(&slow), HandshakeFailure::Timeout);
    }

    fn config() -> Arc<rustls::ServerConfig> {
        crate::tls::LocalCa::in_memory()
            .unwrap()
            .intercept_config("x.test")
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_and_garbage_is_not_tls() {
        let (_client, server) = tokio::io::duplex(4096);
        let Err((reason, e)) = accept(config(), server, Duration::from_secs(10)).await else {
            panic!("no handshake from a silent peer");
        };
        assert_eq!(reason, HandshakeFailure::Timeout);
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);

        use tokio::io::AsyncWriteExt as _;
        let (mut client, server) = tokio::io::duplex(4096);
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let Err((reason, _)) = accept(config(), server, Duration::from_secs(10)).await else {
            panic!("no handshake from plain HTTP");
        };
        assert_eq!(reason, HandshakeFailure::NotTls);

        let (client, server) = tokio::io::duplex(4096);
        drop(client);
        let Err((reason, _)) = accept(config(), server, Duration::from_secs(10)).await else {
            panic!("no handshake from a closed peer");
        };
        assert_eq!(reason, HandshakeFailure::Io);
    }

    #[test]
    fn labels_are_distinct_and_snake_case() {
        let all = [
            HandshakeFailure::Timeout,
            HandshakeFailure::NotTls,
            HandshakeFailure::Protocol,
            HandshakeFailure::Io,
        ];
        let labels: std::collections::BTreeSet<_> = all.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), all.len());
        assert!(labels
            .iter()
            .all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_')));
    }
}
