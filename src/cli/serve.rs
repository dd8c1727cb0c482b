//! A bare `keyrelay`: binds every listener the config names, tells the service manager,
//! and serves until SIGINT or SIGTERM.

use anyhow::Context as _;
use keyrelay::server::TlsListener;
use keyrelay::tls::ListenerCert;
use keyrelay::App;
use tokio::net::TcpListener;

use super::{load_config, ConfigPath};

/// Serves the config's pool on every listener it names until SIGINT or SIGTERM, then
/// drains.
pub async fn serve(source: &ConfigPath, threads: usize) -> anyhow::Result<()> {
    let path = source.path();
    let config = load_config(source)?;
    let listen = config.listen;
    let upstream = config.upstream.as_str().to_owned();
    // Masked: the URL's user info never reaches the log.
    let via = config
        .upstream_proxy
        .as_ref()
        .map_or_else(|| "direct".to_owned(), ToString::to_string);
    let keys = config.keys.len();
    let tls = config.tls.clone();
    let app = App::new(config)?;
    // Made (or checked) at start, so that a broken CA file stops keyrelay here rather
    // than failing the first intercepted CONNECT, and a new CA exists to be trusted.
    let ca = app.ca()?;
    let admin_listen = app.snapshot().config.admin.listen;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // The bound address, not the configured one: with port 0 only this says where to connect.
    let addr = listener.local_addr()?;
    let tls = match tls {
        Some(tls) => {
            let cert = ListenerCert::new(&tls, ca)?;
            let listener = TcpListener::bind(tls.listen)
                .await
                .with_context(|| format!("cannot listen on {} (tls.listen)", tls.listen))?;
            Some((listener, cert))
        }
        None => None,
    };
    let mut listeners = keyrelay::server::Listeners::new(listener);
    if let Some(admin) = admin_listen {
        let admin = TcpListener::bind(admin)
            .await
            .with_context(|| format!("cannot listen on admin.listen {admin}"))?;
        listeners.admin = Some(admin);
    }
    let admin_addr = match &listeners.admin {
        Some(admin) => Some(admin.local_addr()?),
        None => None,
    };
    // Signal handlers go in before the "listening" line, so every signal sent once anyone
    // can know we run is handled rather than killing the process.
    let watcher = keyrelay::reload::watch(app.clone(), path.to_owned());
    let shutdown = keyrelay::server::shutdown_signal();
    let shutdown = async {
        shutdown.await;
        tell_service_manager(Lifecycle::Stopping);
    };
    tracing::info!(%addr, %upstream, %via, keys, threads, "keyrelay listening");
    if let Some(admin) = admin_addr {
        // Its own line, after the one above, and not as `addr`: scripts read that one.
        tracing::info!(%admin, "admin API listening");
    }
    listeners.watch.config = Some(Box::pin(watcher));
    if let Some((listener, cert)) = tls {
        let tls_addr = listener.local_addr()?;
        tracing::info!(%tls_addr, certificate = ?cert, "keyrelay TLS listening");
        listeners.watch.cert = Some(cert.clone());
        let config = keyrelay::tls::listener_config(cert);
        listeners.tls = Some(TlsListener { listener, config });
    }
    // Every socket is bound and every signal handled: from here a connection is queued
    // and served, which is what systemd's Type=notify waits for.
    tell_service_manager(Lifecycle::Ready);
    keyrelay::server::run_with(listeners, app, shutdown).await?;
    Ok(())
}

/// Tells systemd (under `Type=notify`) that keyrelay is ready or is draining. Without
/// `NOTIFY_SOCKET` (a shell, a container, `Type=simple`) this does nothing, and a failed
/// send is only logged: the service manager's bookkeeping must never stop the proxy.
fn tell_service_manager(state: Lifecycle) {
    #[cfg(unix)]
    {
        let state = match state {
            Lifecycle::Ready => sd_notify::NotifyState::Ready,
            Lifecycle::Stopping => sd_notify::NotifyState::Stopping,
        };
        if let Err(e) = sd_notify::notify(&[state]) {
            tracing::warn!(error = %e, "cannot notify the service manager");
        }
    }
    #[cfg(not(unix))]
    let _ = state;
}

/// What `tell_service_manager` reports.
enum Lifecycle {
    /// Listening, with every signal handled.
    Ready,
    /// Draining after SIGTERM or SIGINT.
    Stopping,
}
