//! `CONNECT` to an intercepted API host: answered `200`, then TLS is terminated on the
//! tunnel with a certificate for that host from the local CA, and the requests inside are
//! served exactly as direct ones.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::connection::{Connections, ServerBody};
use crate::metrics::ForwardOutcome;
use crate::proxy::Caller;

/// The answer to `CONNECT host:port` for an intercepted `host`.
pub(super) fn connect(
    conns: Connections,
    _caller: Caller,
    _req: Request<Incoming>,
    host: String,
) -> Response<ServerBody> {
    // Until the local CA issues certificates, a tunnel to an API host is refused rather
    // than passed through uninspected, which would send the caller's own key upstream.
    conns.app().metrics().count_forward(ForwardOutcome::Refused);
    let mut response = Response::new(ServerBody::Left(http_body_util::Full::new(
        format!("keyrelay cannot intercept {host} yet: no local CA\n").into(),
    )));
    *response.status_mut() = StatusCode::NOT_IMPLEMENTED;
    response
}
