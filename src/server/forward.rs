//! The forward-proxy half of the plain listener, for scripts run with `HTTP_PROXY` /
//! `HTTPS_PROXY` pointing at keyrelay: `CONNECT` to a host that is not intercepted is
//! tunnelled byte for byte (or refused, with `[forward] tunnel = "none"`), and an
//! absolute-form request (`GET http://host/...`) to such a host is relayed as any forward
//! proxy relays it. Requests to intercepted hosts never come here: they are the pool's.
//!
//! When caller tokens are configured, nothing passes without one, in
//! `Proxy-Authorization: Basic` (the token as the password, or as the user with no
//! password), so that keyrelay is never an open proxy.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::authority::unbracket;
use super::connection::{Connections, ServerBody};
use crate::config::Tunnel;
use crate::metrics::ForwardOutcome;
use crate::proxy::{self, Caller};
use crate::upstream::{error_chain, open_tunnel};

/// `CONNECT host:port` to a host that is not intercepted.
pub(super) async fn connect(
    conns: Connections,
    caller: Caller,
    mut req: Request<Incoming>,
) -> Result<Response<ServerBody>, Infallible> {
    let config = conns.app().snapshot().config.clone();
    let metrics = conns.app().metrics();
    let Some(target) = req
        .uri()
        .authority()
        .map(|a| (unbracket(a.host()).to_owned(), a.port_u16()))
        .filter(|(host, _)| !host.is_empty())
    else {
        metrics.count_forward(ForwardOutcome::BadTarget);
        return Ok(text(
            StatusCode::BAD_REQUEST,
            "CONNECT needs a host and port, such as CONNECT example.com:443\n",
        ));
    };
    let (host, Some(port)) = target else {
        metrics.count_forward(ForwardOutcome::BadTarget);
        return Ok(text(
            StatusCode::BAD_REQUEST,
            "CONNECT needs a port from 1 to 65535, such as CONNECT example.com:443\n",
        ));
    };
    if conns.intercepts(&host) {
        // The requests inside are the pool's, and each presents its token as its `key`:
        // the tunnel itself needs none, so unchanged scripts work with tokens too.
        return Ok(super::intercept::connect(conns, caller, req, host));
    }
    if let Some(denied) = denied(&conns, req.headers()) {
        metrics.count_forward(ForwardOutcome::Unauthorized);
        return Ok(denied);
    }
    if config.forward.tunnel == Tunnel::None {
        metrics.count_forward(ForwardOutcome::Refused);
        return Ok(refused(&host));
    }
    let timeout = config.timeouts.connect;
    // Dialled before the 200, so that an unreachable host is a 502 the client can read.
    let proxy = config.upstream_proxy.as_ref();
    let upstream = match tokio::time::timeout(timeout, open_tunnel(&host, port, proxy)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            metrics.count_forward(ForwardOutcome::Unreachable);
            tracing::debug!(peer = %caller.peer, %host, port, error = %e, "tunnel target unreachable");
            return Ok(text(
                StatusCode::BAD_GATEWAY,
                format!("cannot reach {host}:{port}: {}\n", error_chain(e.as_ref())),
            ));
        }
        Err(_) => {
            metrics.count_forward(ForwardOutcome::Unreachable);
            return Ok(text(
                StatusCode::GATEWAY_TIMEOUT,
                format!("cannot reach {host}:{port} within {timeout:?}\n"),
            ));
        }
    };
    let _ = upstream.set_nodelay(true);
    metrics.count_forward(ForwardOutcome::Tunnelled);
    let upgrade = hyper::upgrade::on(&mut req);
    let tunnels = conns.clone();
    conns.track(async move {
        let client = match upgrade.await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!(peer = %caller.peer, error = %e, "CONNECT upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = upstream;
        tokio::select! {
            result = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                if let Err(e) = result {
                    tracing::debug!(peer = %caller.peer, %host, port, error = %e, "tunnel ended with an error");
                }
            }
            // A tunnel carries no request to finish: it closes when the drain starts.
            () = tunnels.shutting_down() => {}
        }
    });
    Ok(Response::new(empty()))
}

/// An absolute-form request (`GET http://host/path`) to a host that is not intercepted:
/// relayed to it with its body streamed both ways, as any forward proxy relays it.
pub(super) async fn relay(
    conns: Connections,
    caller: Caller,
    mut req: Request<Incoming>,
) -> Result<Response<ServerBody>, Infallible> {
    let config = conns.app().snapshot().config.clone();
    let metrics = conns.app().metrics();
    if let Some(denied) = denied(&conns, req.headers()) {
        metrics.count_forward(ForwardOutcome::Unauthorized);
        return Ok(denied);
    }
    let host = req.uri().host().unwrap_or_default().to_owned();
    if config.forward.tunnel == Tunnel::None {
        metrics.count_forward(ForwardOutcome::Refused);
        return Ok(refused(&host));
    }
    if req.uri().scheme() != Some(&hyper::http::uri::Scheme::HTTP) {
        metrics.count_forward(ForwardOutcome::BadTarget);
        return Ok(text(
            StatusCode::BAD_REQUEST,
            "only http:// URLs can be relayed; use CONNECT for https\n",
        ));
    }
    strip_hop_by_hop(req.headers_mut());
    let parent = config
        .upstream_proxy
        .as_ref()
        .filter(|proxy| !proxy.goes_direct(req.uri()));
    if let Some(auth) = parent.and_then(|proxy| proxy.auth()) {
        // The caller's credential was for keyrelay; the parent proxy gets keyrelay's own.
        req.headers_mut()
            .insert(header::PROXY_AUTHORIZATION, auth.clone());
    }
    match conns.relay_client().request(req).await {
        Ok(mut response) => {
            metrics.count_forward(ForwardOutcome::Relayed);
            strip_hop_by_hop(response.headers_mut());
            Ok(response.map(Either::Right))
        }
        Err(e) => {
            metrics.count_forward(ForwardOutcome::Unreachable);
            tracing::debug!(peer = %caller.peer, %host, error = %e, "relay failed");
            Ok(text(
                StatusCode::BAD_GATEWAY,
                format!("cannot relay to {host}: {}\n", error_chain(&e)),
            ))
        }
    }
}

/// With tokens configured, the answer to a request that presents none that is valid.
fn denied(conns: &Connections, headers: &HeaderMap) -> Option<Response<ServerBody>> {
    let snapshot = conns.app().snapshot();
    if snapshot.tokens.is_empty() || proxy::proxy_token(&snapshot.tokens, headers).is_some() {
        return None;
    }
    let mut response = text(
        StatusCode::PROXY_AUTHENTICATION_REQUIRED,
        "keyrelay needs a token: Proxy-Authorization: Basic with the token as the password\n",
    );
    response.headers_mut().insert(
        header::PROXY_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"keyrelay\""),
    );
    Some(response)
}

fn refused(host: &str) -> Response<ServerBody> {
    text(
        StatusCode::FORBIDDEN,
        format!(
            "keyrelay does not forward to {host}: it is not a captcha API host, and [forward] tunnel = \"none\"\n"
        ),
    )
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), and the proxy's own, are not passed on.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ServerBody> {
    let mut response = Response::new(full(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn full(body: Bytes) -> ServerBody {
    Either::Left(Full::new(body))
}

fn empty() -> ServerBody {
    full(Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_proxy_headers_are_not_passed_on() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "x-trace, close"),
            ("x-trace", "1"),
            ("proxy-authorization", "Basic abc"),
            ("proxy-connection", "keep-alive"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("user-agent", "python-requests"),
            ("host", "example.com"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "user-agent"]);
    }
}
