//! Serving one accepted connection, whatever stream carries it (TCP, a TLS stream, a TLS
//! stream inside a `CONNECT` tunnel) with the service the server routes requests by: the
//! connection cap, hyper's HTTP/1 settings, upgrades for `CONNECT`, and the drain at
//! shutdown. Also the state the routing reads (the intercepted hosts, the relay client).

use std::sync::Arc;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::authority;
use super::destination::Policy;
use super::header_timer::HeaderTimer;
use crate::app::App;
use crate::config::{Limits, UpstreamProxy};
use crate::log_limit::{Throttle, INTERVAL};
use crate::proxy::{self, Caller, Hangup};
use crate::upstream::RelayConnector;

/// Connections the admin listener serves at once: a few operators and scrapers, kept apart
/// from the proxy's cap so that tunnels filling that never lock out `/healthz`,
/// `/metrics` and `keyrelay ctl`.
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// A connection's place under its listener's cap. Shared: a tunnel keeps the place of the
/// `CONNECT` connection it came on for as long as either lives.
pub(crate) type Slot = Arc<OwnedSemaphorePermit>;

/// Which of keyrelay's listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listener {
    /// `listen`, plain HTTP.
    Proxy,
    /// `tls.listen`.
    Tls,
    /// `admin.listen`: a cap of its own.
    Admin,
}

impl Listener {
    /// Its name in logs.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Listener::Proxy => "proxy",
            Listener::Tls => "tls",
            Listener::Admin => "admin",
        }
    }
}

/// The listener a connection came in on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Door {
    pub listener: Listener,
    /// Whether other machines can reach it (a non-loopback bind): the forward proxy's
    /// destination policy is stricter for its callers.
    pub exposed: bool,
}

impl Door {
    pub(crate) fn of(listener: Listener, bound: &tokio::net::TcpListener) -> Door {
        let exposed = bound
            .local_addr()
            .map_or(true, |addr| !addr.ip().to_canonical().is_loopback());
        Door { listener, exposed }
    }

    /// Its name in logs.
    pub(crate) const fn name(self) -> &'static str {
        self.listener.name()
    }
}

/// Where a forward-proxy request came from: its caller, the listener, and the connection's
/// place under the cap, which a tunnel keeps for its whole life.
pub(super) struct Inbound {
    pub(super) caller: Caller,
    pub(super) door: Door,
    pub(super) slot: Slot,
}

/// Failed accepts are logged at most once a minute per listener, with how many failed.
static ACCEPT_FAILED: Throttle = Throttle::new(INTERVAL);

/// Connections that could not be set up, likewise.
static SETUP_FAILED: Throttle = Throttle::new(INTERVAL);

/// What the server answers with: keyrelay's own buffered answers, or (for a request relayed
/// to another host as a forward proxy) that host's answer, streamed.
pub(crate) type ServerBody = http_body_util::Either<proxy::Body, Incoming>;

/// A client for relaying absolute-form requests to other hosts, bodies streamed.
pub(super) type RelayClient = Client<RelayConnector, Incoming>;

/// Every connection the server serves, on any of its listeners. Cheap to clone: the forward
/// proxy serves the requests inside an intercepted tunnel through it too.
#[derive(Clone)]
pub(crate) struct Connections(Arc<Inner>);

struct Inner {
    app: App,
    /// Read at start: the listener is the one thing a reload cannot rebuild.
    limits: Limits,
    header_timer: HeaderTimer,
    /// `[forward]`'s intercepted hosts, read at start like the limits.
    intercepted: Vec<String>,
    /// Relays through `upstream_proxy` when one is configured (its `upstream_no_proxy`
    /// hosts direct).
    relay: RelayClient,
    /// Relays dialled directly, to the address the destination policy checked: chosen by
    /// the forward proxy, which decided on the name, not on the address it dials.
    relay_direct: RelayClient,
    /// Where the forward proxy may go: keyrelay's own listeners, as bound.
    policy: Policy,
    permits: Arc<Semaphore>,
    admin_permits: Arc<Semaphore>,
    /// Cancelled at shutdown: every connection then finishes its request in flight and
    /// closes.
    shutdown: CancellationToken,
    open: TaskTracker,
}

impl Connections {
    pub(super) fn new(app: App, header_timer: HeaderTimer, policy: Policy) -> Connections {
        let config = app.snapshot().config.clone();
        let limits = config.limits.clone();
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        Connections(Arc::new(Inner {
            intercepted: config.forward.intercepted(config.upstream.host()),
            relay: relay_client(config.timeouts.connect, config.upstream_proxy.as_ref()),
            relay_direct: relay_client(config.timeouts.connect, None),
            app,
            limits,
            header_timer,
            policy,
            permits,
            admin_permits: Arc::new(Semaphore::new(ADMIN_MAX_CONNECTIONS)),
            shutdown: CancellationToken::new(),
            open: TaskTracker::new(),
        }))
    }

    pub(crate) fn app(&self) -> &App {
        &self.0.app
    }

    pub(super) fn header_timeout(&self) -> Duration {
        self.0.limits.header_timeout
    }

    /// The client for a relayed request: through `upstream_proxy`, or `direct`.
    pub(super) fn relay_client(&self, direct: bool) -> &RelayClient {
        if direct {
            &self.0.relay_direct
        } else {
            &self.0.relay
        }
    }

    pub(super) fn policy(&self) -> &Policy {
        &self.0.policy
    }

    /// Whether a request for `host` (from a request target or a `CONNECT`, any case) is
    /// the pool's: an intercepted API host.
    pub(super) fn intercepts(&self, host: &str) -> bool {
        authority::is_intercepted(&self.0.intercepted, host)
    }

    /// A place for one more connection through `door`, or `None` over its cap (counted):
    /// the caller closes it at once, so the client fails fast and retries instead of
    /// waiting in the backlog, and everyone already in is unaffected. The admin listener
    /// has a small cap of its own; every other listener shares `limits.max_connections`.
    pub(super) fn admit(&self, door: Door) -> Option<Slot> {
        let permits = if door.listener == Listener::Admin {
            &self.0.admin_permits
        } else {
            &self.0.permits
        };
        let permit = Arc::clone(permits).try_acquire_owned().ok();
        if permit.is_none() {
            self.0.app.metrics().connections_rejected.inc();
        }
        permit.map(Arc::new)
    }

    /// One accepted TCP connection made ready to serve: a place under the cap, no Nagle
    /// delay, and a watch on its caller's side. `None` when it is closed instead (logged,
    /// counted), or the accept failed (for example, out of file descriptors): then after
    /// `pause`, so that the accept loop does not spin, and the next accept takes the
    /// connection that waited in the backlog as soon as a descriptor is free.
    pub(super) async fn take(
        &self,
        accepted: std::io::Result<(TcpStream, SocketAddr)>,
        door: Door,
        pause: Duration,
    ) -> Option<(TcpStream, Caller, Slot)> {
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                if let Some(admitted) = ACCEPT_FAILED.admit_key(door.name()) {
                    tracing::warn!(
                        listener = door.name(),
                        error = %e,
                        held_back = admitted.suppressed,
                        "accept failed; retrying (logged once a minute)"
                    );
                }
                tokio::time::sleep(pause).await;
                return None;
            }
        };
        let Some(slot) = self.admit(door) else {
            tracing::debug!(listener = door.name(), %peer, "connection cap reached; connection closed");
            return None;
        };
        let _ = stream.set_nodelay(true);
        match Hangup::watch(&stream) {
            Ok(hangup) => Some((stream, Caller { hangup, peer }, slot)),
            Err(e) => {
                if let Some(admitted) = SETUP_FAILED.admit_key(door.name()) {
                    tracing::warn!(listener = door.name(), %peer, error = %e, held_back = admitted.suppressed, "cannot set up the connection; closed (logged once a minute)");
                }
                None
            }
        }
    }

    /// Serves HTTP/1.1 on `io` with `service` on a task of its own until the client closes
    /// it or the drain ends it. `slot` is the connection's place under the cap, held until
    /// it closes (a connection inside an intercepted tunnel holds the tunnel's).
    pub(super) fn spawn<I, S>(&self, io: I, service: S, peer: std::net::SocketAddr, slot: Slot)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: Service<Request<Incoming>, Response = Response<ServerBody>, Error = Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        let limits = &self.0.limits;
        let conn = http1::Builder::new()
            // The header-read timeout is armed for every request head, keep-alive
            // waits included: a coarse timer keeps that cheap (header_timer.rs).
            .timer(self.0.header_timer.clone())
            .header_read_timeout(limits.header_timeout)
            .max_header_size(limits.max_header)
            // A client may shut its write side once the request is sent (`nc -N`,
            // some HTTP/1.0 tools) and still read the answer.
            .half_close(true)
            // Head and body in one buffer and one write: an answer is a few hundred
            // bytes, cheaper copied than queued for writev.
            .writev(false)
            .serve_connection(TokioIo::new(io), service)
            // A CONNECT's stream is handed to the forward proxy once its 200 is sent.
            .with_upgrades();
        let shutdown = self.0.shutdown.clone();
        self.0.open.spawn(async move {
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                () = shutdown.cancelled() => {
                    // Finish the request in flight, then close; an idle connection closes
                    // at once.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }

    /// Tells every connection to finish its request in flight and close, and waits until
    /// all have (tunnels included, which close at once).
    pub(super) async fn drain(&self) {
        self.0.shutdown.cancel();
        self.0.open.close();
        self.0.open.wait().await;
    }

    /// Resolves when the drain starts: for tunnels, which carry no HTTP to finish.
    pub(crate) fn shutting_down(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.0.shutdown.cancelled()
    }

    /// Runs `work` as part of the server's connections, so that the drain waits for it.
    pub(crate) fn track<F>(&self, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.0.open.spawn(work);
    }
}

fn relay_client(connect_timeout: Duration, proxy: Option<&UpstreamProxy>) -> RelayClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(RelayConnector::new(http, proxy))
}
