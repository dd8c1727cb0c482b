//! The forward-proxy half of the plain listener, for scripts run with `HTTP_PROXY` /
//! `HTTPS_PROXY` pointing at keyrelay: `CONNECT` to a host that is not intercepted is
//! tunnelled byte for byte (or refused, with `[forward] tunnel = "none"`), and an
//! absolute-form request (`GET http://host/...`) to such a host is relayed as any forward
//! proxy relays it. Requests to intercepted hosts never come here: they are the pool's.
//!
//! When caller tokens are configured, nothing passes without one, in
//! `Proxy-Authorization: Basic` (the token as the password, or as the user with no
//! password), so that keyrelay is never an open proxy. Every destination is resolved once
//! and passes the destination policy (`destination.rs`) before the checked address is
//! dialled; a tunnel keeps its connection's place under the cap and its token's
//! `max_tunnels` for its whole life, and closes when idle (`tunnel.rs`).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::uri::{Authority, Scheme};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;

use super::authority::unbracket;
use super::connection::{Connections, Inbound, ServerBody, Slot};
use super::destination::{self, Via};
use super::tunnel::{self, Ended};
use crate::config::Tunnel;
use crate::log_limit::{Clip, Throttle, INTERVAL};
use crate::metrics::{Denied, ForwardOutcome, ForwardRefusal};
use crate::proxy::{self, Asker};
use crate::tokens::{Token, TunnelHold};
use crate::upstream::{error_chain, open_tunnel};

/// An answer that ends a forward-proxy request before it is sent anywhere; boxed, as a
/// response is large for an error.
type Refused = Box<Response<ServerBody>>;

/// Refused destinations are logged at most once a minute each.
static REFUSED: Throttle = Throttle::new(INTERVAL);

/// `CONNECT host:port` to a host that is not intercepted.
pub(super) async fn connect(
    conns: Connections,
    from: Inbound,
    mut req: Request<Incoming>,
) -> Result<Response<ServerBody>, Infallible> {
    let config = conns.app().snapshot().config.clone();
    let metrics = conns.app().metrics();
    // The target is checked before any credential: a malformed one is the same 400 for all.
    let (host, port) = match connect_target(req.uri()) {
        Ok(target) => target,
        Err(problem) => {
            metrics.count_forward(ForwardOutcome::BadTarget);
            return Ok(text(StatusCode::BAD_REQUEST, problem));
        }
    };
    if conns.intercepts(&host) {
        // The requests inside are the pool's, and each presents its token as its `key`:
        // the tunnel itself needs none, so unchanged scripts work with tokens too.
        return Ok(super::intercept::connect(conns, from, req, host));
    }
    let token = match credential(&conns, &from, req.headers()) {
        Ok(token) => token,
        Err(answer) => return Ok(*answer),
    };
    if config.forward.tunnel == Tunnel::None {
        return Ok(refuse(
            &conns,
            &from,
            &host,
            port,
            ForwardRefusal::TunnelNone,
        ));
    }
    let proxy = config.upstream_proxy.as_ref();
    let timeout = config.timeouts.connect;
    let dialled = tokio::time::timeout(timeout, async {
        let addrs = checked(&conns, &from, &host, port, Via::Tunnel, proxy.is_some()).await?;
        // Taken after the policy, so a refused destination never counts against it.
        let hold = match token.as_deref().map(Token::try_tunnel) {
            Some(None) => {
                let refusal = ForwardRefusal::TooManyTunnels;
                return Err(Box::new(refuse(&conns, &from, &host, port, refusal)));
            }
            Some(Some(hold)) => Some(hold),
            None => None,
        };
        // Dialled before the 200, so that an unreachable host is a 502 the client can read.
        match open_tunnel(&host, port, &addrs, proxy).await {
            Ok(stream) => Ok((stream, hold)),
            Err(e) => {
                metrics.count_forward(ForwardOutcome::Unreachable);
                tracing::debug!(peer = %from.caller.peer, host = %Clip(&host), port, error = %e, "tunnel target unreachable");
                Err(Box::new(text(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "cannot reach {}:{port}: {}\n",
                        Clip(&host),
                        error_chain(e.as_ref())
                    ),
                )))
            }
        }
    })
    .await;
    let (upstream, hold) = match dialled {
        Ok(Ok(dialled)) => dialled,
        Ok(Err(answer)) => return Ok(*answer),
        Err(_) => return Ok(timed_out(&conns, "reach", &host, timeout)),
    };
    let _ = upstream.set_nodelay(true);
    metrics.count_forward(ForwardOutcome::Tunnelled);
    let upgrade = hyper::upgrade::on(&mut req);
    let tunnels = conns.clone();
    let idle = config.timeouts.tunnel_idle;
    let Inbound { caller, slot, .. } = from;
    conns.track(async move {
        // Both live as long as the tunnel: its place under the connection cap, and under
        // its token's max_tunnels.
        let _held: (Slot, Option<TunnelHold>) = (slot, hold);
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
            ended = tunnel::copy_until_idle(&mut client, &mut upstream, idle) => match ended {
                Ok(Ended::Idle) => {
                    tracing::debug!(peer = %caller.peer, host = %Clip(&host), port, ?idle, "tunnel closed after tunnel_idle without traffic");
                }
                Ok(Ended::Closed { .. }) => {}
                Err(e) => {
                    tracing::debug!(peer = %caller.peer, host = %Clip(&host), port, error = %e, "tunnel ended with an error");
                }
            },
            // A tunnel carries no request to finish: it closes when the drain starts.
            () = tunnels.shutting_down() => {}
        }
    });
    Ok(Response::new(empty()))
}

/// The host and port of a `CONNECT`'s authority-form target (RFC 9110 §9.3.6): nothing
/// else, no scheme or path, a port from 1 to 65535, a host that is not empty.
fn connect_target(uri: &Uri) -> Result<(String, u16), &'static str> {
    const USAGE: &str =
        "CONNECT needs host:port and nothing else, such as CONNECT example.com:443\n";
    let authority = match (uri.scheme(), uri.path_and_query(), uri.authority()) {
        (None, None, Some(authority)) => authority,
        _ => return Err(USAGE),
    };
    if authority.as_str().contains('@') {
        return Err(USAGE);
    }
    let host = unbracket(authority.host());
    if host.is_empty() {
        return Err(USAGE);
    }
    match authority.port_u16() {
        Some(port) if port != 0 => Ok((host.to_owned(), port)),
        _ => Err("CONNECT needs a port from 1 to 65535, such as CONNECT example.com:443\n"),
    }
}

/// An absolute-form request (`GET http://host/path`) to a host that is not intercepted:
/// relayed to it with its body streamed both ways, as any forward proxy relays it.
pub(super) async fn relay(
    conns: Connections,
    from: Inbound,
    mut req: Request<Incoming>,
) -> Result<Response<ServerBody>, Infallible> {
    let config = conns.app().snapshot().config.clone();
    let metrics = conns.app().metrics();
    if let Err(answer) = credential(&conns, &from, req.headers()) {
        return Ok(*answer);
    }
    let host = unbracket(req.uri().host().unwrap_or_default()).to_owned();
    let port = req.uri().port_u16().unwrap_or(80);
    if config.forward.tunnel == Tunnel::None {
        return Ok(refuse(
            &conns,
            &from,
            &host,
            port,
            ForwardRefusal::TunnelNone,
        ));
    }
    if req.uri().scheme() != Some(&Scheme::HTTP) || host.is_empty() || port == 0 {
        metrics.count_forward(ForwardOutcome::BadTarget);
        return Ok(text(
            StatusCode::BAD_REQUEST,
            "only http:// URLs with a host and a port from 1 to 65535 can be relayed; use CONNECT for https\n",
        ));
    }
    let parent = config
        .upstream_proxy
        .as_ref()
        .filter(|proxy| !proxy.goes_direct(req.uri()));
    let timeout = config.timeouts.connect;
    let addrs = match tokio::time::timeout(
        timeout,
        checked(&conns, &from, &host, port, Via::Relay, parent.is_some()),
    )
    .await
    {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(answer)) => return Ok(*answer),
        Err(_) => return Ok(timed_out(&conns, "resolve", &host, timeout)),
    };
    strip_hop_by_hop(req.headers_mut());
    match parent {
        Some(proxy) => {
            if let Some(auth) = proxy.auth() {
                // The caller's credential was for keyrelay; the parent proxy gets keyrelay's
                // own.
                req.headers_mut()
                    .insert(header::PROXY_AUTHORIZATION, auth.clone());
            }
        }
        // Sent to the address the policy checked, never resolved again: the Host header
        // keeps the name.
        None => pin_address(&mut req, addrs.first().copied()),
    }
    match conns.relay_client(parent.is_none()).request(req).await {
        Ok(mut response) => {
            metrics.count_forward(ForwardOutcome::Relayed);
            strip_hop_by_hop(response.headers_mut());
            Ok(response.map(Either::Right))
        }
        Err(e) => {
            metrics.count_forward(ForwardOutcome::Unreachable);
            tracing::debug!(peer = %from.caller.peer, host = %Clip(&host), error = %e, "relay failed");
            Ok(text(
                StatusCode::BAD_GATEWAY,
                format!("cannot relay to {}: {}\n", Clip(&host), error_chain(&e)),
            ))
        }
    }
}

/// The `504` for a destination that could not be resolved or dialled (`what`) within
/// `timeouts.connect`, counted as unreachable.
fn timed_out(
    conns: &Connections,
    what: &str,
    host: &str,
    timeout: std::time::Duration,
) -> Response<ServerBody> {
    conns
        .app()
        .metrics()
        .count_forward(ForwardOutcome::Unreachable);
    text(
        StatusCode::GATEWAY_TIMEOUT,
        format!("cannot {what} {} within {timeout:?}\n", Clip(host)),
    )
}

/// Points `req` at `addr` (the checked address), keeping its name in `Host`.
fn pin_address(req: &mut Request<Incoming>, addr: Option<SocketAddr>) {
    let Some(addr) = addr else { return };
    if !req.headers().contains_key(header::HOST) {
        if let Some(value) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(header::HOST, value);
        }
    }
    let Ok(authority) = Authority::try_from(addr.to_string()) else {
        return;
    };
    let mut parts = req.uri().clone().into_parts();
    parts.authority = Some(authority);
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
}

/// Resolves `host` once and checks every address it named against the destination policy;
/// the addresses to dial, or the answer that refuses. With a parent proxy (`proxied`), a
/// name that does not resolve here may still resolve there: only its name and port are
/// checked, and the parent dials it.
async fn checked(
    conns: &Connections,
    from: &Inbound,
    host: &str,
    port: u16,
    via: Via,
    proxied: bool,
) -> Result<Vec<SocketAddr>, Refused> {
    let addrs = match destination::resolve(host, port).await {
        Ok(addrs) => addrs,
        Err(_) if proxied => Vec::new(),
        Err(e) => {
            conns
                .app()
                .metrics()
                .count_forward(ForwardOutcome::Unreachable);
            return Err(Box::new(text(
                StatusCode::BAD_GATEWAY,
                format!("cannot resolve {}: {e}\n", Clip(host)),
            )));
        }
    };
    let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    let snapshot = conns.app().snapshot();
    match conns.policy().check(
        &snapshot.config.forward.allow,
        host,
        &ips,
        port,
        via,
        from.door.exposed,
    ) {
        Ok(()) => Ok(addrs),
        Err(reason) => Err(Box::new(refuse(conns, from, host, port, reason))),
    }
}

/// With tokens configured, the caller's token from `Proxy-Authorization` (within its
/// address's wrong-token limit), or the `407` that refuses it.
fn credential(
    conns: &Connections,
    from: &Inbound,
    headers: &HeaderMap,
) -> Result<Option<std::sync::Arc<Token>>, Refused> {
    let app = conns.app();
    let snapshot = app.snapshot();
    let asker = Asker {
        peer: from.caller.peer.ip(),
        denials: app.denials(),
    };
    match proxy::proxy_token(&snapshot.tokens, asker, headers) {
        Ok(token) => Ok(token),
        Err(denied) => {
            app.metrics().count_denied(denied);
            app.metrics().count_forward(ForwardOutcome::Unauthorized);
            let why = match denied {
                Denied::Limited => "too many wrong tokens from this address lately; wait",
                Denied::Missing | Denied::Wrong => {
                    "keyrelay needs a token: Proxy-Authorization: Basic with the token as the password"
                }
            };
            let mut response = text(
                StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                format!("{why}\n"),
            );
            response.headers_mut().insert(
                header::PROXY_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"keyrelay\""),
            );
            Err(Box::new(response))
        }
    }
}

/// The answer to a refused destination: `403` with the reason (`429` for a token at its
/// `max_tunnels`), counted, and logged at most once a minute per destination.
fn refuse(
    conns: &Connections,
    from: &Inbound,
    host: &str,
    port: u16,
    reason: ForwardRefusal,
) -> Response<ServerBody> {
    let metrics = conns.app().metrics();
    metrics.count_forward(ForwardOutcome::Refused);
    metrics.count_forward_refused(reason);
    let destination = format!("{}:{port}", Clip(host));
    if let Some(admitted) = REFUSED.admit_key(&destination) {
        tracing::info!(
            peer = %from.caller.peer,
            listener = from.door.name(),
            %destination,
            reason = reason.label(),
            held_back = admitted.suppressed,
            "forward proxy refused a destination (logged once a minute per destination)"
        );
    }
    let (status, why) = match reason {
        ForwardRefusal::Listener => (StatusCode::FORBIDDEN, "it is one of keyrelay's own listeners"),
        ForwardRefusal::Address => (
            StatusCode::FORBIDDEN,
            "it is a loopback, link-local or private address, which callers of this listener may not reach; see [forward] allow",
        ),
        ForwardRefusal::Port => (
            StatusCode::FORBIDDEN,
            "only port 443 (CONNECT) and ports 80 and 443 (http:// requests) are forwarded for callers of this listener; see [forward] allow",
        ),
        ForwardRefusal::TunnelNone => (
            StatusCode::FORBIDDEN,
            "it is not a captcha API host, and [forward] tunnel = \"none\"",
        ),
        ForwardRefusal::TooManyTunnels => (
            StatusCode::TOO_MANY_REQUESTS,
            "this token holds its max_tunnels open tunnels; close one first",
        ),
    };
    text(
        status,
        format!("keyrelay does not forward to {destination}: {why}\n"),
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
