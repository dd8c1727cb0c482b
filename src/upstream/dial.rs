//! How a new outgoing connection is opened: straight to its host (so for the hosts of
//! `upstream_no_proxy`), or through the configured `upstream_proxy`. keyrelay's own upstream connections and the forward proxy's tunnels to
//! other hosts are `CONNECT` tunnels through it (hyper-util's `Tunnel`), so TLS runs inside,
//! end to end, and the proxy never sees a key; the forward proxy's plain-http relays are
//! handed to it in absolute form, as any proxy chain does.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::http::uri::{Authority, Scheme};
use hyper::Uri;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::Service;

use crate::config::UpstreamProxy;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The connector under rustls's: direct, or through the proxy.
#[derive(Clone)]
pub(super) enum Dial {
    Direct(HttpConnector),
    // Boxed: the tunnel's URI and credential make it far larger than a direct dial.
    Proxied(Box<Proxied>),
}

#[derive(Clone)]
pub(super) struct Proxied {
    tunnel: Tunnel<HttpConnector>,
    /// For the hosts of `upstream_no_proxy`.
    direct: HttpConnector,
    proxy: UpstreamProxy,
}

impl Dial {
    /// `tcp` straight to the upstream, or to `proxy` for a tunnel there.
    pub(super) fn new(tcp: HttpConnector, proxy: Option<&UpstreamProxy>) -> Dial {
        let Some(proxy) = proxy else {
            return Dial::Direct(tcp);
        };
        let mut tunnel = Tunnel::new(proxy.uri().clone(), tcp.clone());
        if let Some(auth) = proxy.auth() {
            tunnel = tunnel.with_auth(auth.clone());
        }
        Dial::Proxied(Box::new(Proxied {
            tunnel,
            direct: tcp,
            proxy: proxy.clone(),
        }))
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
            // The direct connector beside it is always ready, as HttpConnector is.
            Dial::Proxied(proxied) => proxied.tunnel.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let tcp = match self {
            Dial::Proxied(proxied) if !proxied.proxy.goes_direct(&dst) => {
                let connecting = proxied.tunnel.call(with_port(dst));
                let proxy = proxied.proxy.to_string();
                return Box::pin(async move {
                    connecting.await.map_err(|error| {
                        Box::new(ViaProxy {
                            proxy,
                            error: Box::new(error),
                        }) as BoxError
                    })
                });
            }
            Dial::Proxied(proxied) => &mut proxied.direct,
            Dial::Direct(tcp) => tcp,
        };
        let connecting = tcp.call(dst);
        Box::pin(async move { connecting.await.map_err(Into::into) })
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

/// A TCP stream to `host:port` for a byte-for-byte tunnel: dialled directly to `addrs`
/// (what `host` resolved to, as the caller checked them: never resolved again here), or a
/// `CONNECT` tunnel for `host` through `proxy`. The caller bounds it in time, so that it
/// can tell a timeout from a refusal.
///
/// # Errors
/// The dial or the tunnel failed; the message names the proxy masked, never its credential.
pub async fn open_tunnel(
    host: &str,
    port: u16,
    addrs: &[std::net::SocketAddr],
    proxy: Option<&UpstreamProxy>,
) -> Result<TcpStream, BoxError> {
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let dst = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(authority)
        .path_and_query("/")
        .build()?;
    let Some(proxy) = proxy.filter(|proxy| !proxy.goes_direct(&dst)) else {
        if addrs.is_empty() {
            return Err(format!("{host} resolved to no address").into());
        }
        return Ok(TcpStream::connect(addrs).await?);
    };
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    let mut dial = Dial::new(tcp, Some(proxy));
    std::future::poll_fn(|cx| dial.poll_ready(cx)).await?;
    Ok(dial.call(dst).await?.into_inner())
}

/// The connector of the forward proxy's client for absolute-form `http://` requests to
/// other hosts: straight to each host, or to `upstream_proxy` (unless the host is in
/// `upstream_no_proxy`), marked as a proxy so that the client sends the request in
/// absolute form for it to relay.
#[derive(Clone)]
pub struct RelayConnector {
    tcp: HttpConnector,
    proxy: Option<UpstreamProxy>,
}

impl RelayConnector {
    pub fn new(tcp: HttpConnector, proxy: Option<&UpstreamProxy>) -> RelayConnector {
        RelayConnector {
            tcp,
            proxy: proxy.cloned(),
        }
    }
}

/// A relay connection, which knows whether it goes to a proxy.
pub struct RelayStream {
    io: TokioIo<TcpStream>,
    proxied: bool,
}

impl Connection for RelayStream {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.proxied)
    }
}

impl hyper::rt::Read for RelayStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for RelayStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Service<Uri> for RelayConnector {
    type Response = RelayStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<RelayStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let Some(proxy) = self.proxy.as_ref().filter(|p| !p.goes_direct(&dst)) else {
            let connecting = self.tcp.call(dst);
            return Box::pin(async move {
                let io = connecting.await?;
                Ok(RelayStream { io, proxied: false })
            });
        };
        let connecting = self.tcp.call(proxy.uri().clone());
        let proxy = proxy.to_string();
        Box::pin(async move {
            let io = connecting.await.map_err(|error| ViaProxy {
                proxy,
                error: Box::new(error),
            })?;
            Ok(RelayStream { io, proxied: true })
        })
    }
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
