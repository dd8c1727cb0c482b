//! `CONNECT` to an intercepted API host: answered `200`, then TLS is terminated on the
//! tunnel with a certificate for that host from the local CA, and the requests inside are
//! served exactly as direct ones (same key rewrite, pins, failover, metrics and headers).

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, PROXY_AUTHORIZATION};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::connection::{Connections, Inbound, ServerBody};
use crate::log_limit::Clip;
use crate::metrics::ForwardOutcome;

/// The answer to `CONNECT host:port` for an intercepted `host`.
pub(super) fn connect(
    conns: Connections,
    from: Inbound,
    mut req: Request<Incoming>,
    host: String,
) -> Response<ServerBody> {
    let Inbound { caller, door, slot } = from;
    let app = conns.app();
    // The certificate first: a CA that cannot issue one is an answer the client can read,
    // not a handshake that dies. A tunnel passed through uninspected instead would send the
    // caller's own key upstream.
    let config = match app.ca().and_then(|ca| ca.intercept_config(&host)) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!(host = %Clip(&host), error = %e, "cannot issue a certificate to intercept a CONNECT");
            app.metrics().count_forward(ForwardOutcome::Refused);
            return text(
                StatusCode::BAD_GATEWAY,
                format!(
                    "keyrelay cannot issue a certificate for {}: {e}\n",
                    Clip(&host)
                ),
            );
        }
    };
    app.metrics().count_forward(ForwardOutcome::Intercepted);
    let credential = req.headers().get(PROXY_AUTHORIZATION).cloned();
    let upgrade = hyper::upgrade::on(&mut req);
    let inner = conns.clone();
    conns.track(async move {
        let tunnel = match upgrade.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(e) => {
                tracing::debug!(peer = %caller.peer, error = %e, "CONNECT upgrade failed");
                return;
            }
        };
        let stream = match crate::tls::accept(config, tunnel, inner.header_timeout()).await {
            Ok(stream) => stream,
            Err((reason, e)) => {
                inner.app().metrics().count_tls_failure(reason.into());
                tracing::debug!(peer = %caller.peer, host = %Clip(&host), reason = reason.label(), error = %e, "TLS handshake inside CONNECT failed");
                return;
            }
        };
        let peer = caller.peer;
        // The connection inside keeps the CONNECT's place under the cap for its whole
        // life, and follows the plain listener's keep-alive rules.
        let service = super::service(&inner, caller, door, slot.clone(), credential);
        inner.spawn(stream, service, peer, slot);
    });
    Response::new(ServerBody::Left(Full::new(Bytes::new())))
}

fn text(status: StatusCode, body: String) -> Response<ServerBody> {
    let mut response = Response::new(ServerBody::Left(Full::new(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
