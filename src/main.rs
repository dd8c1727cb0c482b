//! The `keyrelay` command: parses the command line, sets up logging, and hands over to the
//! library. Everything testable lives in the library.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use keyrelay::config::ConfigError;
use keyrelay::server::TlsListener;
use keyrelay::sim::{SimKey, Simulator, DEFAULT_KEYS};
use keyrelay::tls::{ListenerCert, LocalCa};
use keyrelay::{App, Config};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// The version `--version` prints: the crate's, and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("KEYRELAY_COMMIT"),
    ")"
);

/// A key-rotating proxy for CaptchaAI's 2captcha-compatible in.php / res.php API.
///
/// Point a script's base URL at keyrelay instead of https://ocr.captchaai.com; keyrelay puts
/// a key from its pool on every request, fails over between keys, and polls each task with
/// the key that created it.
#[derive(Parser)]
#[command(version = VERSION, about, long_about)]
struct Cli {
    /// The configuration file [default: proxy.toml in the current directory].
    #[arg(long, short, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter, for example `info` or `keyrelay=debug`; RUST_LOG works too.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,
    /// Threads that serve requests. Defaults to the CPUs keyrelay may run on; with 1, one
    /// thread does everything, which is the cheapest way to serve from a single core.
    #[arg(long, global = true, env = "KEYRELAY_THREADS", value_name = "N")]
    threads: Option<NonZeroUsize>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and print the pool (never the keys themselves).
    Check {
        /// Also ask the upstream about every key (balance, threads) and fail unless at
        /// least two are usable.
        #[arg(long)]
        online: bool,
    },
    /// Run the built-in CaptchaAI simulator, to try scripts without spending real threads.
    Simulate {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
        /// A simulated key: VALUE[,balance=F][,threads=N][,state=valid|unknown|ip-not-allowed|zero-balance][,cost=F].
        /// Without any, the simulator serves the two keys of the shipped proxy.toml.
        #[arg(long = "key", value_name = "SPEC")]
        keys: Vec<SimKey>,
        /// Polls a task needs before its answer is ready.
        #[arg(long, default_value_t = 2)]
        polls_to_ready: u32,
        /// Also play another 2captcha-compatible service under /NAME (for example
        /// `--provider 2captcha` serves http://ADDR/2captcha/in.php), with its own error
        /// semantics and the same keys as separate accounts. CaptchaAI stays at the root.
        #[arg(long = "provider", value_name = "NAME", value_parser = parse_provider)]
        providers: Vec<keyrelay::provider::Provider>,
    },
    /// Show keyrelay at work on the built-in simulator: no keys or config needed.
    Demo,
    /// Say where keyrelay's local CA certificate is and how to make clients trust it;
    /// the CA is generated first if there is none yet.
    Ca {
        /// Write the CA certificate alone, in PEM, to stdout.
        #[arg(long)]
        pem: bool,
    },
    /// Call a running keyrelay's admin API: list keys, disable, enable or drain one, refresh.
    ///
    /// The address is --url, else the config's admin.listen, else its listen; the token is
    /// the config's admin.token, else KEYRELAY_ADMIN_TOKEN.
    Ctl {
        /// The admin API's address, as http://HOST:PORT, instead of the config's.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        #[command(subcommand)]
        action: CtlAction,
    },
}

#[derive(Subcommand)]
enum CtlAction {
    /// List every key with its state, hold, balance and threads.
    Keys,
    /// No new tasks and no background reads for the key; its tasks are still polled.
    Disable { name: String },
    /// Lift a disable or a drain.
    Enable { name: String },
    /// No new tasks for the key; its tasks are still polled, and it is still refreshed.
    Drain { name: String },
    /// Read balances and threads now: of the named key, or of every key.
    Refresh { name: Option<String> },
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        // The demo narrates on stdout; logs would only repeat it.
        Some(Command::Demo) => "off",
        // A client: its output is the answer, and only trouble is worth a log line.
        Some(Command::Ctl { .. }) => "warn",
        _ => "info",
    };
    init_logging(cli.log.as_deref(), default_level, cli.log_format);
    let threads = cli
        .threads
        .or_else(|| std::thread::available_parallelism().ok())
        .map_or(1, NonZeroUsize::get);
    let runtime = match build_runtime(threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli, threads)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A multi-threaded runtime hands work between threads through shared queues and wakeups,
/// which only pays when there is a second core to run them: on one core, a current-thread
/// runtime relayed about 20 % more requests per second (docs/performance.md).
fn build_runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// The file a bare `keyrelay` (or `keyrelay check`) reads: the README's first run starts
/// from the directory that holds the shipped `proxy.toml`.
const DEFAULT_CONFIG: &str = "proxy.toml";

/// Where the config comes from: `--config`, or the default file, which may well be missing
/// for someone who just installed keyrelay.
enum ConfigPath {
    Given(PathBuf),
    Default,
}

impl ConfigPath {
    fn path(&self) -> &Path {
        match self {
            ConfigPath::Given(path) => path,
            ConfigPath::Default => Path::new(DEFAULT_CONFIG),
        }
    }
}

async fn dispatch(cli: Cli, threads: usize) -> anyhow::Result<()> {
    let config = match cli.config {
        Some(path) => ConfigPath::Given(path),
        None => ConfigPath::Default,
    };
    match cli.command {
        None => serve(&config, threads).await,
        Some(Command::Check { online }) => {
            let loaded = load_config(&config)?;
            // Read as keyrelay reads it at start, so that a bad bundle fails here first.
            keyrelay::upstream::roots::configured(loaded.upstream_ca.as_deref())?;
            println!("{} is valid", config.path().display());
            print!("{}", loaded.summary());
            if online {
                check_online(&loaded).await?;
            }
            Ok(())
        }
        Some(Command::Simulate {
            listen,
            keys,
            polls_to_ready,
            providers,
        }) => simulate(listen, keys, polls_to_ready, providers).await,
        Some(Command::Demo) => keyrelay::demo::run().await.map_err(|e| anyhow::anyhow!(e)),
        Some(Command::Ca { pem }) => ca(&config, pem),
        Some(Command::Ctl { url, action }) => ctl(&config, url.as_deref(), action).await,
    }
}

/// `keyrelay check --online`: the upstream's table of the keys, and an error (so a
/// non-zero exit) when fewer than two are usable.
async fn check_online(config: &Config) -> anyhow::Result<()> {
    use keyrelay::online_check::{self, MIN_USABLE};
    let report = online_check::run(config).await?;
    println!();
    print!("{}", report.render());
    anyhow::ensure!(
        report.passes(),
        "only {} usable key(s) of {}: keyrelay needs at least {MIN_USABLE} to fail over \
         (the KeyrelayFewerThanTwoKeysActive alert's threshold)",
        report.usable(),
        report.rows.len()
    );
    Ok(())
}

/// `keyrelay ca`: the CA certificate's path and, for each client family, how to trust
/// it; with `--pem`, the certificate alone. Creating the CA here lets a user trust it
/// before keyrelay first starts.
fn ca(source: &ConfigPath, pem: bool) -> anyhow::Result<()> {
    let config = load_config(source)?;
    let ca = LocalCa::load_or_create(&config.ca, config.data_dir.as_deref())?;
    if pem {
        print!("{}", ca.cert_pem());
        return Ok(());
    }
    let cert = ca.cert_path().map_or_else(
        || "(in memory)".to_owned(),
        |path| path.display().to_string(),
    );
    let state = if ca.was_created() {
        "generated just now"
    } else {
        "existing"
    };
    println!("keyrelay's local CA certificate ({state}):\n  {cert}\n");
    println!("Trust it in the clients that talk to keyrelay over TLS:");
    for (who, how) in [
        ("Python requests", format!("export REQUESTS_CA_BUNDLE={cert}")),
        ("httpx, Go, OpenSSL, curl", format!("export SSL_CERT_FILE={cert}")),
        ("Node.js", format!("export NODE_EXTRA_CA_CERTS={cert}")),
        (
            "the system store (Debian, Ubuntu)",
            format!(
                "sudo cp {cert} /usr/local/share/ca-certificates/keyrelay-ca.crt \\\n      && sudo update-ca-certificates"
            ),
        ),
    ] {
        println!("  {who}:\n    {how}");
    }
    println!(
        "\nREQUESTS_CA_BUNDLE and SSL_CERT_FILE replace the default roots: for a script that \
         also reaches\nother HTTPS sites, point them at a bundle holding both, for example\n    \
         cat \"$(python3 -m certifi)\" {cert} > keyrelay-bundle.pem\n\
         `keyrelay ca --pem` writes the certificate alone to stdout."
    );
    if let Some(key) = ca.key_path() {
        println!(
            "\nKeep the CA's private key secret: {}\nAnyone who has it can impersonate any \
             HTTPS site to every client that trusts this CA.",
            key.display()
        );
    }
    Ok(())
}

async fn ctl(source: &ConfigPath, url: Option<&str>, action: CtlAction) -> anyhow::Result<()> {
    use keyrelay::ctl::{Action, Target};
    let env = |name: &str| std::env::var(name).ok();
    let target = match (url, source) {
        (Some(url), ConfigPath::Given(path)) => Target::from_url(url, Some(path), &env)?,
        (Some(url), ConfigPath::Default) => Target::from_url(url, None, &env)?,
        (None, source) => Target::from_config(source.path(), &env)?,
    };
    let action = match action {
        CtlAction::Keys => Action::Keys,
        CtlAction::Disable { name } => Action::Disable(name),
        CtlAction::Enable { name } => Action::Enable(name),
        CtlAction::Drain { name } => Action::Drain(name),
        CtlAction::Refresh { name } => Action::Refresh(name),
    };
    print!("{}", keyrelay::ctl::run(&target, &action).await?);
    Ok(())
}

async fn serve(source: &ConfigPath, threads: usize) -> anyhow::Result<()> {
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
    let watcher = tokio::spawn(watcher);
    let tls = match tls {
        Some((listener, cert)) => {
            let tls_addr = listener.local_addr()?;
            tracing::info!(%tls_addr, certificate = ?cert, "keyrelay TLS listening");
            let cert_watcher = tokio::spawn(cert.clone().watch());
            let config = keyrelay::tls::listener_config(cert);
            Some((TlsListener { listener, config }, cert_watcher))
        }
        None => None,
    };
    let (tls, cert_watcher) = tls.unzip();
    listeners.tls = tls;
    // Every socket is bound and every signal handled: from here a connection is queued
    // and served, which is what systemd's Type=notify waits for.
    tell_service_manager(Lifecycle::Ready);
    keyrelay::server::run_with(listeners, app, shutdown).await?;
    watcher.abort();
    if let Some(cert_watcher) = cert_watcher {
        cert_watcher.abort();
    }
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

/// Loads the config, with an error that names the file once. `ConfigError`'s messages
/// already carry their cause, so it is flattened rather than chained, which would print the
/// cause twice. A missing default file gets a hint instead of a bare "No such file": that is
/// what a new user running `keyrelay` outside the repository meets first.
fn load_config(source: &ConfigPath) -> anyhow::Result<Config> {
    let path = source.path();
    Config::load(path).map_err(|e| match (&e, source) {
        (ConfigError::Io { source: io, .. }, ConfigPath::Default)
            if io.kind() == std::io::ErrorKind::NotFound =>
        {
            let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            anyhow::anyhow!(
                "no {DEFAULT_CONFIG} in {}: pass --config PATH, start keyrelay where its \
                 {DEFAULT_CONFIG} is, or try `keyrelay demo`, which needs no config",
                here.display()
            )
        }
        (ConfigError::Io { .. }, _) => anyhow::anyhow!("{e}"),
        _ => anyhow::anyhow!("{}: {e}", path.display()),
    })
}

async fn simulate(
    listen: SocketAddr,
    keys: Vec<SimKey>,
    polls_to_ready: u32,
    providers: Vec<keyrelay::provider::Provider>,
) -> anyhow::Result<()> {
    use keyrelay::provider::Provider;
    let keys = if keys.is_empty() {
        DEFAULT_KEYS.iter().map(|k| SimKey::valid(k)).collect()
    } else {
        keys
    };
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // The bound address, so that `--listen 127.0.0.1:0` says where the simulator is.
    let addr = listener.local_addr()?;
    let mut served = vec![Provider::CaptchaAi];
    for provider in providers {
        if !served.contains(&provider) {
            served.push(provider);
        }
    }
    let mut sims = Vec::new();
    for provider in served {
        let prefix = if provider == Provider::CaptchaAi {
            String::new()
        } else {
            format!("/{}", provider.name())
        };
        let label = if provider == Provider::CaptchaAi {
            "CaptchaAI".to_owned()
        } else {
            provider.name().to_owned()
        };
        println!("simulated {label} on http://{addr}{prefix} with keys:");
        let mut sim = Simulator::new()
            .polls_to_ready(polls_to_ready)
            .provider(provider);
        for key in &keys {
            println!(
                "  {}  balance {}  threads {}  {:?}",
                key.key, key.balance, key.threads, key.state
            );
            sim = sim.key(key.clone());
        }
        sims.push((prefix, sim));
    }
    Simulator::serve_many(sims, listener, keyrelay::server::shutdown_signal()).await?;
    Ok(())
}

fn parse_provider(name: &str) -> Result<keyrelay::provider::Provider, String> {
    keyrelay::provider::Provider::from_name(name).ok_or_else(|| {
        format!(
            "unknown provider {name:?}; expected one of {}",
            keyrelay::provider::Provider::names()
        )
    })
}

fn init_logging(flag: Option<&str>, default_level: &str, format: LogFormat) {
    let filter = match flag {
        Some(f) => EnvFilter::new(f),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
