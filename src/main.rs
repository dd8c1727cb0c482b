//! The `keyrelay` command: parses the command line, sets up logging and the runtime, and
//! hands over to one subcommand (`cli/`, a file each). Everything testable lives in the
//! library.

mod cli;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use cli::ConfigPath;
use keyrelay::sim::SimKey;
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
    /// List every caller token's spend and thread-hours over its budget's period.
    Budgets,
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

async fn dispatch(cli: Cli, threads: usize) -> anyhow::Result<()> {
    let config = match cli.config {
        Some(path) => ConfigPath::Given(path),
        None => ConfigPath::Default,
    };
    match cli.command {
        None => cli::serve(&config, threads).await,
        Some(Command::Check { online }) => cli::check(&config, online).await,
        Some(Command::Simulate {
            listen,
            keys,
            polls_to_ready,
            providers,
        }) => cli::simulate(listen, keys, polls_to_ready, providers).await,
        Some(Command::Demo) => keyrelay::demo::run().await.map_err(|e| anyhow::anyhow!(e)),
        Some(Command::Ca { pem }) => cli::ca(&config, pem),
        Some(Command::Ctl { url, action }) => cli::ctl(&config, url.as_deref(), action).await,
    }
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
