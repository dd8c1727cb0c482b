//! The accept loop and graceful shutdown; the background tasks are `background`'s.

mod authority;
mod connection;
mod destination;
mod forward;
mod header_timer;
mod intercept;
mod tls_accept;
mod tunnel;

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use futures_util::future::{Either, FutureExt};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, PROXY_AUTHORIZATION};
use hyper::service::{service_fn, Service};
use hyper::{Method, Request, Response};

use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::app::App;
use crate::background::{self, Watchers};
use crate::fleet;
use crate::proxy::{self, Caller};
use connection::{Connections, Door, Listener, ServerBody, Slot};
use destination::Policy;
use header_timer::HeaderTimer;
pub use tls_accept::TlsListener;

/// After an accept error (for example, out of file descriptors), wait before retrying so the
/// loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves the proxy on `listener` until `shutdown` resolves, then drains.
///
/// The listener is bound by the caller, so tests can bind `127.0.0.1:0`.
///
/// # Errors
/// None today: accept errors are logged and retried. The `Result` leaves room for listeners
/// that can fail for good (TLS setup).
pub async fn run(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    run_with(Listeners::new(listener), app, shutdown).await
}

/// The listeners [`run_with`] serves, all bound by the caller.
pub struct Listeners {
    /// The proxy's plain listener.
    pub proxy: TcpListener,
    /// `[tls] listen`, bound, with its certificate: the same service, limits, connection
    /// cap and drain as the plain listener.
    pub tls: Option<TlsListener>,
    /// `[admin] listen`, bound: the listener of `/admin/`, `/metrics`, `/status`, `/healthz`
    /// and `/readyz`. The proxy's listeners answer 404 for those when the config sets
    /// `admin.listen` (which is what this is bound from), not because this is given.
    pub admin: Option<TcpListener>,
    /// The files the server reloads while it runs (`proxy.toml`, the `[tls]` certificate),
    /// watched among the background tasks; none unless set.
    pub watch: Watchers,
}

impl Listeners {
    /// The proxy's listener alone.
    pub fn new(proxy: TcpListener) -> Listeners {
        Listeners {
            proxy,
            tls: None,
            admin: None,
            watch: Watchers::default(),
        }
    }
}

/// [`run`] with every listener keyrelay can serve.
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    listeners: Listeners,
    app: App,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = listeners.proxy;
    let limits = app.snapshot().config.limits.clone();
    let header_timer = HeaderTimer::new();
    let seen = fleet::join(&app).await;
    let ticks = header_timer::resolution(limits.header_timeout);
    let background =
        background::start(&app, seen, header_timer.clone().run(ticks), listeners.watch);

    // Every address keyrelay listens on, as bound: the forward proxy never dials them.
    let own = std::iter::once(&listener)
        .chain(listeners.tls.as_ref().map(|tls| &tls.listener))
        .chain(listeners.admin.as_ref())
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let conns = Connections::new(app.clone(), header_timer, Policy::new(own));
    warn_if_open(&app, &listener, listeners.tls.as_ref());
    warn_if_few_descriptors(limits.max_connections);
    if let Some(tls) = listeners.tls {
        // Tracked, so the drain waits for it; it stops accepting when the drain starts.
        conns.track(tls_accept::accept_loop(
            tls,
            conns.clone(),
            ACCEPT_ERROR_PAUSE,
        ));
    }
    let admin = listeners
        .admin
        .map(|admin| tokio::spawn(accept_admin(admin, conns.clone())));
    let door = Door::of(Listener::Proxy, &listener);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Some((stream, caller, slot)) =
                    conns.take(accepted, door, ACCEPT_ERROR_PAUSE).await
                else {
                    continue;
                };
                let peer = caller.peer;
                let service = service(&conns, caller, door, slot.clone(), None);
                conns.spawn(stream, service, peer, slot);
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if let Some(admin) = admin {
        // Dropping its loop drops the admin listener; its connections drain with the rest.
        admin.abort();
    }
    let drain = app.snapshot().config.timeouts.drain;
    let deadline = Instant::now() + drain;
    tracing::info!(timeout = ?drain, "shutting down: draining requests in flight");
    // Connections first, then the requests whose callers left (they outlive their
    // connection), within one deadline.
    let requests = app.requests();
    requests.close();
    let drained = async {
        conns.drain().await;
        requests.wait().await;
    };
    tokio::select! {
        () = drained => tracing::info!("drained"),
        () = tokio::time::sleep_until(deadline) => {
            tracing::warn!(
                timeout = ?drain,
                requests = requests.len(),
                "drain timed out; abandoning the requests still in flight"
            );
        }
    }
    background.stop().await;
    Ok(())
}

/// The service of one connection: routes each request. Origin-form requests
/// (`GET /in.php`), the usual case, and absolute-form ones to an intercepted host are the
/// pool's; `CONNECT` and absolute-form requests to other hosts are forward-proxy work.
///
/// `door` is the listener the connection came in on, and `slot` its place under the cap,
/// which a tunnel opened on it keeps. `tunnel_credential` is the `Proxy-Authorization` of
/// the intercepted `CONNECT` whose requests this connection carries: a script that put its
/// token in its proxy URL sends it only there, so each request inside that has none of its
/// own is given it, for the token check. It never goes upstream: proxy headers are not
/// forwarded.
fn service(
    conns: &Connections,
    caller: Caller,
    door: Door,
    slot: Slot,
    tunnel_credential: Option<HeaderValue>,
) -> impl Service<
    Request<Incoming>,
    Response = Response<ServerBody>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Send
       + 'static {
    let conns = conns.clone();
    let app = conns.app().clone();
    service_fn(move |mut req: Request<Incoming>| {
        if let Some(credential) = &tunnel_credential {
            let headers = req.headers_mut();
            if !headers.contains_key(PROXY_AUTHORIZATION) {
                headers.insert(PROXY_AUTHORIZATION, credential.clone());
            }
        }
        let foreign = req.uri().host().is_some_and(|host| !conns.intercepts(host));
        // Built for forward-proxy requests only: an API request needs no slot of its own.
        let from = || connection::Inbound {
            caller: caller.clone(),
            door,
            slot: slot.clone(),
        };
        if req.method() == Method::CONNECT {
            Either::Left(Either::Left(forward::connect(conns.clone(), from(), req)))
        } else if foreign {
            Either::Left(Either::Right(forward::relay(conns.clone(), from(), req)))
        } else {
            Either::Right(
                proxy::handle(app.clone(), caller.clone(), req)
                    .map(|served| served.map(|response| response.map(ServerBody::Left))),
            )
        }
    })
}

/// Accepts connections on the admin listener until aborted: each is served the operator
/// endpoints and the admin API only (`proxy::operator`), under the same connection cap.
async fn accept_admin(listener: TcpListener, conns: Connections) {
    let door = Door::of(Listener::Admin, &listener);
    loop {
        let Some((stream, caller, slot)) = conns
            .take(listener.accept().await, door, ACCEPT_ERROR_PAUSE)
            .await
        else {
            continue;
        };
        let peer = caller.peer;
        let app = conns.app().clone();

        let service = service_fn(move |req: Request<Incoming>| {
            proxy::operator(app.clone(), caller.clone(), req)
                .map(|served| served.map(|response| response.map(ServerBody::Left)))
        });
        conns.spawn(stream, service, peer, slot);
    }
}

/// A raw tunnel takes two descriptors (the caller's and the far side's), so a process whose
/// descriptor limit is below twice `limits.max_connections` runs out before its cap, and new
/// connections then wait for one. keyrelay survives that (the accept loop pauses and
/// resumes), but the operator should know at start, not from the first `accept failed`.
fn warn_if_few_descriptors(max_connections: usize) {
    let Some(limit) = descriptor_limit() else {
        return;
    };
    // The listeners, the journal, upstream connections and the runtime's own need some.
    let wanted = max_connections.saturating_mul(2).saturating_add(64);
    if limit < wanted {
        tracing::warn!(
            open_files = limit,
            max_connections,
            wanted,
            "the open-file limit is below what limits.max_connections can use (two per tunnel): raise it (LimitNOFILE, ulimit -n) or lower max_connections"
        );
    }
}

/// The process's soft limit on open files, from `/proc/self/limits` (Linux; elsewhere, or
/// unlimited, `None`): read rather than asked of the kernel, which needs `unsafe`.
fn descriptor_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    soft_open_files(&limits)
}

fn soft_open_files(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `access.open = true` is a decision to serve whoever can reach the proxy: said at every
/// start, so that it is never forgotten in a config nobody reads.
fn warn_if_open(app: &App, proxy: &TcpListener, tls: Option<&TlsListener>) {
    let snapshot = app.snapshot();
    let access = &snapshot.config.access;
    if !access.open {
        return;
    }
    let listening: Vec<String> = std::iter::once(proxy)
        .chain(tls.map(|tls| &tls.listener))
        .filter_map(|l| l.local_addr().ok())
        .map(|addr| addr.to_string())
        .collect();
    if access.tokens.is_empty() {
        tracing::warn!(
            listening = listening.join(", "),
            "access.open = true: anyone who can reach these listeners may spend the pool's keys, without a token"
        );
    } else {
        tracing::warn!("access.open = true has no effect: [[access.tokens]] are configured, and every API request needs one");
    }
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM. The handlers are installed when this
/// is called, not when the future is first polled: a signal that arrives in between would
/// otherwise kill the process with the default action instead of draining it.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            match (interrupt, terminate) {
                (Ok(mut interrupt), Ok(mut terminate)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {},
                        _ = terminate.recv() => {},
                    }
                }
                (interrupt, terminate) => {
                    let error = interrupt.err().or(terminate.err());
                    tracing::error!(error = ?error, "cannot listen for SIGINT/SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(soft_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files(unlimited), None);
        assert_eq!(soft_open_files("nothing here"), None);
    }
}
