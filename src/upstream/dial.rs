//! How a new upstream connection is opened: a TCP connection straight to the upstream, or a
//! `CONNECT` tunnel through the configured `upstream_proxy` (hyper-util's `Tunnel`). TLS to
//! an https upstream runs inside either, end to end, so the proxy never sees the key.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::http::uri::{Authority, Scheme};
use hyper::Uri;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::Service;

use crate::config::UpstreamProxy;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The connector under rustls's: direct, or through the proxy.
#[derive(Clone)]
pub(super) enum Dial {
    Direct(HttpConnector),
    Proxied {
        // Boxed: the tunnel's URI and credential make it far larger than a direct dial.
        tunnel: Box<Tunnel<HttpConnector>>,
        /// The proxy as logs may show it, user info masked.
        shown: String,
    },
}

impl Dial {
    /// `tcp` straight to the upstream, or to `proxy` for a tunnel there.
    pub(super) fn new(tcp: HttpConnector, proxy: Option<&UpstreamProxy>) -> Dial {
        let Some(proxy) = proxy else {
            return Dial::Direct(tcp);
        };
        let mut tunnel = Tunnel::new(proxy.uri().clone(), tcp);
        if let Some(auth) = proxy.auth() {
            tunnel = tunnel.with_auth(auth.clone());
        }
        Dial::Proxied {
            tunnel: Box::new(tunnel),
            shown: proxy.to_string(),
        }
    }
}

/// A tunnel that could not be opened, naming the proxy (never its credential).
#[derive(Debug, thiserror::Error)]
#[error("through upstream_proxy {proxy}")]
struct ViaProxy {
    proxy: String,
    #[source]
    error: BoxError,
}

impl Service<Uri> for Dial {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    // Boxed: a new connection is rare (they are pooled), and one type serves both ways.
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Dial::Direct(tcp) => tcp.poll_ready(cx).map_err(Into::into),
            Dial::Proxied { tunnel, .. } => tunnel.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        match self {
            Dial::Direct(tcp) => {
                let connecting = tcp.call(dst);
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
            Dial::Proxied { tunnel, shown } => {
                let connecting = tunnel.call(with_port(dst));
                let proxy = shown.clone();
                Box::pin(async move {
                    connecting.await.map_err(|error| {
                        Box::new(ViaProxy {
                            proxy,
                            error: Box::new(error),
                        }) as BoxError
                    })
                })
            }
        }
    }
}

/// `dst` with its port spelled out: the tunnel asks the proxy for 443 when a URI has none,
/// which is wrong for `http://`.
fn with_port(dst: Uri) -> Uri {
    if dst.port().is_some() {
        return dst;
    }
    let port = if dst.scheme() == Some(&Scheme::HTTP) {
        80
    } else {
        443
    };
    let Some(authority) = dst
        .authority()
        .and_then(|a| Authority::try_from(format!("{}:{port}", a.as_str())).ok())
    else {
        return dst;
    };
    let mut parts = dst.into_parts();
    parts.authority = Some(authority);
    // The scheme and path are dst's own, so only a bad authority could fail, and it parsed.
    Uri::from_parts(parts).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_names_the_port_the_scheme_implies() {
        let port = |uri: &str| with_port(uri.parse().unwrap()).port_u16();
        assert_eq!(port("http://upstream.test/"), Some(80));
        assert_eq!(port("https://upstream.test/"), Some(443));
        assert_eq!(port("http://upstream.test:8080/"), Some(8080));
        assert_eq!(port("https://[::1]/"), Some(443));
        assert_eq!(
            with_port("http://[::1]/".parse().unwrap()).host(),
            Some("[::1]")
        );
    }
}
