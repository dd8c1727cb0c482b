//! The `[tls]` listener's accept loop: each connection's handshake runs on a task of its
//! own under the header timeout, so a slow or garbage handshake holds up nobody else; a
//! finished one is served exactly as a plain connection is. A failed one is counted by
//! reason and closed.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::connection::Connections;
use crate::proxy::{Caller, Hangup};

/// A bound TLS listener and the server config its handshakes use.
pub struct TlsListener {
    pub listener: TcpListener,
    pub config: Arc<rustls::ServerConfig>,
}

/// Accepts on `tls.listener` until the drain starts.
pub(super) async fn accept_loop(tls: TlsListener, conns: Connections, pause: Duration) {
    let handshake_timeout = conns.header_timeout();
    loop {
        let accepted = tokio::select! {
            accepted = tls.listener.accept() => accepted,
            () = conns.shutting_down() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "TLS accept failed");
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let Some(permit) = conns.admit() else {
            tracing::debug!(%peer, "connection cap reached; TLS connection closed");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (stream, hangup) = match Hangup::watch(stream) {
            Ok(watched) => watched,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot set up the connection; closed");
                continue;
            }
        };
        let config = tls.config.clone();
        let served = conns.clone();
        conns.track(async move {
            let handshake = crate::tls::accept(config, stream, handshake_timeout);
            let result = tokio::select! {
                result = handshake => result,
                // A handshake in progress is not a request in flight: the drain closes it.
                () = served.shutting_down() => return,
            };
            match result {
                Ok(stream) => {
                    let service = super::service(&served, Caller { hangup, peer }, None);
                    served.spawn(stream, service, peer, Some(permit));
                }
                Err((reason, e)) => {
                    tracing::debug!(%peer, reason = reason.label(), error = %e, "TLS handshake failed");
                    served.app().metrics().count_tls_failure(reason.into());
                }
            }
        });
    }
}
