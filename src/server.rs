//! The accept loop, the background tasks, and graceful shutdown.

mod header_timer;

use std::future::Future;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::app::App;
use crate::proxy::Hangup;
use crate::{proxy, refresh};
use header_timer::HeaderTimer;

/// How often recorded pins are forced to disk: the power-loss window.
const PIN_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// How often expired pins are dropped.
const PIN_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// How often tasks past `capacity.stale_after` give their threads back: a small fraction of
/// the default five minutes, and a cheap look at the front of a queue.
const STALE_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

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
    // Limits are read at start: the listener is the one thing a reload cannot rebuild.
    let limits = app.snapshot().config.limits.clone();
    let header_timer = HeaderTimer::new();
    let mut background = JoinSet::new();
    background.spawn(refresh::run(app.clone()));
    background.spawn(sweep_pins(app.clone()));
    background.spawn(sync_pins(app.clone()));
    background.spawn(release_stale(app.clone()));
    background.spawn(
        header_timer
            .clone()
            .run(header_timer::resolution(limits.header_timeout)),
    );

    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        continue;
                    }
                };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    // Over the cap: close at once, so the client fails fast and retries
                    // instead of waiting in the backlog; everyone already in is unaffected.
                    app.metrics().connections_rejected.inc();
                    tracing::debug!(%peer, "connection cap reached; connection closed");
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                let (stream, hangup) = match Hangup::watch(stream) {
                    Ok(watched) => watched,
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "cannot set up the connection; closed");
                        continue;
                    }
                };
                let service =
                    service_fn(move |req| proxy::handle(app.clone(), hangup.clone(), req));
                let conn = http1::Builder::new()
                    // The header-read timeout is armed for every request head, keep-alive
                    // waits included: a coarse timer keeps that cheap (header_timer.rs).
                    .timer(header_timer.clone())
                    .header_read_timeout(limits.header_timeout)
                    .max_header_size(limits.max_header)
                    // A client may shut its write side once the request is sent (`nc -N`,
                    // some HTTP/1.0 tools) and still read the answer.
                    .half_close(true)
                    // Head and body in one buffer and one write: an answer is a few hundred
                    // bytes, cheaper copied than queued for writev.
                    .writev(false)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    drop(permit);
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let drain = app.snapshot().config.timeouts.drain;
    let deadline = Instant::now() + drain;
    tracing::info!(timeout = ?drain, "shutting down: draining requests in flight");
    // Connections first, then the requests whose callers left (they outlive their
    // connection), within one deadline.
    let requests = app.requests();
    requests.close();
    let drained = async {
        graceful.shutdown().await;
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
    background.shutdown().await;
    flush_pins(&app).await;
    Ok(())
}

/// Drops expired pins (and the probe's expired misses) now and then. A durable store may compact its journal while
/// sweeping, which is blocking file I/O, so it runs on the blocking pool.
async fn sweep_pins(app: App) {
    let mut tick = tokio::time::interval(PIN_SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        let store = app.clone();
        let now = Instant::now();
        // The probe's misses expire on every probe too; this frees them after a burst of
        // bad ids when no probe follows.
        app.probe().sweep(now);
        if let Ok(dropped) = tokio::task::spawn_blocking(move || store.pins().sweep(now)).await {
            if dropped > 0 {
                tracing::debug!(dropped, "expired pins dropped");
            }
        }
    }
}

/// Gives back the threads of tasks nobody polled to the end: after `capacity.stale_after`
/// (read each round, so a reload applies) an open task no longer counts against its key.
pub async fn release_stale(app: App) {
    let mut tick = tokio::time::interval(STALE_SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        let stale_after = app.snapshot().config.capacity.stale_after;
        let Some(cutoff) = Instant::now().checked_sub(stale_after) else {
            continue;
        };
        let released = app.release_stale_threads(cutoff);
        if released.is_empty() {
            continue;
        }
        let snapshot = app.snapshot();
        for key in snapshot.pool.keys() {
            let count = released.iter().filter(|id| **id == key.id).count();
            if count > 0 {
                tracing::info!(key = %key.name, tasks = count, ?stale_after, "stale tasks no longer hold threads");
            }
        }
    }
}

/// Makes recorded pins durable every `PIN_SYNC_INTERVAL` (fsync, off the request path):
/// the most a power loss can take is the pins of the last interval.
async fn sync_pins(app: App) {
    let mut tick = tokio::time::interval(PIN_SYNC_INTERVAL);
    loop {
        tick.tick().await;
        flush_pins(&app).await;
    }
}

async fn flush_pins(app: &App) {
    let store = app.clone();
    match tokio::task::spawn_blocking(move || store.pins().flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "pins could not be synced to disk"),
        Err(e) => tracing::error!(error = %e, "the pin sync task failed"),
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
