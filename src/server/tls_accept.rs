//! The `[tls]` listener's accept loop: each connection's handshake runs on a task of its
//! own under the header timeout, so a slow or garbage handshake holds up nobody else; a
//! finished one is served exactly as a plain connection is. A failed one is counted by
//! reason and closed.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::connection::Connections;

/// A bound TLS listener and the server config its handshakes use.
pub struct TlsListener {
    pub listener: TcpListener,
    pub config: Arc<rustls::ServerConfig>,
}

/// Accepts on `tls.listener` until the drain starts.
pub(super) async fn accept_loop(tls: TlsListener, conns: Connections, pause: Duration) {
    let handshake_timeout = conns.header_timeout();
    let door = super::connection::Door::of(super::connection::Listener::Tls, &tls.listener);
    loop {
        let accepted = tokio::select! {
            accepted = tls.listener.accept() => accepted,
            () = conns.shutting_down() => break,
        };
        let Some((stream, caller, slot)) = conns.take(accepted, door, pause).await else {
            continue;
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
                    let peer = caller.peer;
                    let service = super::service(&served, caller, door, slot.clone(), None);
                    served.spawn(stream, service, peer, slot);
                }
                Err((reason, e)) => {
                    tracing::debug!(peer = %caller.peer, reason = reason.label(), error = %e, "TLS handshake failed");
                    served.app().metrics().count_tls_failure(reason.into());
                }
            }
        });
    }
}
