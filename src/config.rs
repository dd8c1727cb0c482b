//! `proxy.toml` from raw TOML to a validated [`Config`]. Owns the schema, the defaults and
//! every validation message; does not watch the file or build the key pool.
//!
//! Two stages: serde reads the text into `raw` types (every field optional, unknown fields
//! rejected), then `validate` turns them into [`Config`], collecting every problem with
//! the path of the field it concerns. Key values never appear in an error: toml's own
//! parse errors are shown against a copy of the document with secrets masked (`redact`).

mod access;
mod allow;
mod budget;
mod cluster;
mod keys;
mod polling;
mod problems;
mod raw;
mod redact;
mod summary;
mod tls;
mod units;
mod upstream;
mod upstream_proxy;
mod validate;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::provider::Provider;
use crate::ApiKey;

pub use access::{Access, Admin, TokenConfig, DEFAULT_MAX_TUNNELS};
pub use allow::AllowEntry;
pub use budget::{Budget, BudgetLimit, Prices, DEFAULT_BUDGET_PERIOD, DEFAULT_BUDGET_SOFT};
pub use cluster::{Cluster, RedisUrl};
pub use polling::{FirstPoll, Polling, DEFAULT_POLL_INTERVAL};
pub use redact::ParseError;
pub use tls::{Ca, Forward, PemFiles, Tls, Tunnel, KNOWN_API_HOSTS};
pub use upstream::{BadTarget, Target, Upstream};
pub use upstream_proxy::UpstreamProxy;

/// Loopback, so that a fresh install is not an open relay spending the pool's keys.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The service whose API keyrelay speaks.
pub const DEFAULT_UPSTREAM: &str = "https://ocr.captchaai.com";
/// Balances and thread counts change slowly; one request per key every five minutes keeps
/// them fresh and revives benched keys without adding noticeable load.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// Every key gets an equal share unless told otherwise.
pub const DEFAULT_WEIGHT: f64 = 1.0;
/// One try and two failovers route around a dead or full key without stalling the caller.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// A submit that got no answer may have created a task; sending it again could start (and
/// bill) the same captcha twice, so it is only done when asked for.
pub const DEFAULT_RETRY_UNSURE_SUBMITS: bool = false;
/// Keeps keys with nothing left out of rotation, while a key with any real balance stays in.
pub const DEFAULT_MIN_BALANCE: f64 = 0.01;
/// `MAX_USER_TURN` bans a key for about ten seconds, and a full thread pool frees up on
/// the same time scale.
pub const DEFAULT_BUSY_COOLDOWN: Duration = Duration::from_secs(10);
/// One network hiccup should not bench a key; three in a row suggest something is wrong.
pub const DEFAULT_TRANSIENT_FAILURES: u32 = 3;
/// Long enough for a transient upstream fault to clear, short enough not to starve the pool.
pub const DEFAULT_TRANSIENT_COOLDOWN: Duration = Duration::from_secs(30);
/// Short enough that a retry is barely noticed when the fault was a one-off.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Caps the doubling so that a caller's total wait stays within a few seconds.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Envoy's 10 % would let no key of a small pool cool at all; half keeps at least half of
/// any pool in rotation through a network blip.
pub const DEFAULT_MAX_TRANSIENT_EJECTION: f64 = 0.5;
/// Doubling from 30 s reaches this after four ejections in a row.
pub const DEFAULT_TRANSIENT_COOLDOWN_MAX: Duration = Duration::from_secs(300);
/// CaptchaAI asks to wait about five minutes after an IP ban.
pub const DEFAULT_IP_BAN_PAUSE: Duration = Duration::from_secs(300);
/// One retry per five requests: an upstream outage multiplies traffic by at most 1.2.
pub const DEFAULT_RETRY_BUDGET: f64 = 0.2;
/// Enough for a quiet pool's occasional failover.
pub const DEFAULT_RETRY_BUDGET_MIN: u32 = 10;
/// Clients poll a task for a few minutes at most; two hours covers slow pollers with room.
pub const DEFAULT_PIN_TTL: Duration = Duration::from_secs(2 * 60 * 60);
/// About a hundred bytes each, so the cap bounds the pin table near 100 MB in the worst case.
pub const DEFAULT_MAX_PINS: usize = 1_000_000;
/// Upstream requests a second the owner probe may make: a fraction of what a busy pool's
/// polls send, so unknown ids cannot multiply traffic into an IP ban.
pub const DEFAULT_PROBE_RATE: f64 = 50.0;
/// Probe requests that may go at once after a quiet spell: a restart that lost its pins
/// finds a few hundred tasks at once, then at `probe_rate`.
pub const DEFAULT_PROBE_BURST: u32 = 500;
/// The smallest burst allowed: one probe of a full-size pool (`MAX_PROBED_KEYS` keys).
pub const MIN_PROBE_BURST: u32 = 16;
/// The largest rate or burst accepted: beyond, the budget would bound nothing.
pub const MAX_PROBE_BUDGET: f64 = 1_000_000.0;
/// Nine base64 images (a BLS grid) plus fields fit with room; larger bodies are not captchas.
pub const DEFAULT_MAX_BODY: usize = 16 * 1024 * 1024;
/// Real clients send a few hundred bytes of headers; hyper's own default is 400 KiB.
pub const DEFAULT_MAX_HEADER: usize = 64 * 1024;
/// Long enough for any real client on a slow link, short enough to shed slow-loris.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Far above what one team's scripts open, well below a default file descriptor limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Polls answer in milliseconds; a solve.php in flight may be cut short, and its caller
/// retries.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// A healthy upstream accepts a connection well within this, even across continents.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// `in.php` and `res.php` answer at once; a minute means the upstream is in trouble.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// `solve.php` answers only when solved; the official SDK gives up polling after 180 s.
pub const DEFAULT_SOLVE_TIMEOUT: Duration = Duration::from_secs(180);
/// A refresh is background work and must not hang around until the next round.
pub const DEFAULT_REFRESH_TIMEOUT: Duration = Duration::from_secs(15);
/// A tunnel nobody uses for five minutes holds a connection slot and two file descriptors
/// for nothing; HTTPS clients reopen one in a round trip.
pub const DEFAULT_TUNNEL_IDLE: Duration = Duration::from_secs(300);

/// Which key served a request is what users ask first when something looks off; the key's
/// name is not a secret.
pub const DEFAULT_KEY_HEADERS: bool = true;
/// `[scaling] brake_balance`: 0, so the brake never engages until an operator sets one.
pub const DEFAULT_BRAKE_BALANCE: f64 = 0.0;

/// A lost pin turns a poll into ERROR_WRONG_CAPTCHA_ID; disk is cheap.
pub const DEFAULT_DURABLE_PINS: bool = true;

/// Backup keys are opt-in: every key is a primary unless it says otherwise.
pub const DEFAULT_TIER: u32 = 0;
/// Long enough to ride out a burst (a task frees a thread every few seconds on a busy key),
/// short enough that a caller still hears "busy" in time to back off by itself.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);
/// Far above one team's concurrency; bounds the memory queued submits hold.
pub const DEFAULT_MAX_QUEUED: usize = 1000;
/// Solves take up to two minutes and the official SDK stops polling after three; a task
/// still unpolled after five is abandoned, and its thread is free upstream again.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(5 * 60);
/// A key back from a cooldown (often: it was full) takes its full share over half a minute
/// instead of the whole backlog at once.
pub const DEFAULT_SLOW_START: Duration = Duration::from_secs(30);

/// The validated configuration the proxy runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where scripts connect to keyrelay.
    pub listen: SocketAddr,
    /// How a new task's key is chosen.
    pub strategy: Strategy,
    /// Thread accounting, the queue for a full pool, and slow start.
    pub capacity: Capacity,
    /// The service requests are forwarded to.
    pub upstream: Upstream,
    /// A PEM file of CA certificates trusted for `https://` upstreams beside the Mozilla
    /// roots: for a firewall that inspects outgoing TLS, or a service behind a private CA.
    pub upstream_ca: Option<PathBuf>,
    /// An HTTP proxy every upstream connection is tunnelled through (`CONNECT`), for a
    /// network whose only way out is a proxy; `None`: connections go direct.
    pub upstream_proxy: Option<UpstreamProxy>,
    /// How often balances and thread counts are refreshed and benched keys re-probed.
    pub refresh_interval: Duration,
    /// The pool, in file order, then the `keys_env` keys.
    pub keys: Vec<KeyConfig>,
    /// How requests move between keys when one fails.
    pub failover: Failover,
    /// The task id -> key table that keeps polls on the submitting key.
    pub pins: Pins,
    /// `[polling]`: how often tasks are asked about, and what is kept of their answers.
    pub polling: Polling,
    /// Request size limits.
    pub limits: Limits,
    /// Upstream timeouts.
    pub timeouts: Timeouts,
    /// What keyrelay tells callers and operators about itself.
    pub observability: Observability,
    /// `[scaling]`: what `/scaling` and the pool gauges tell an autoscaler.
    pub scaling: Scaling,
    /// `[tls]`: a TLS listener beside `listen`, if configured.
    pub tls: Option<Tls>,
    /// `[forward]`: the forward-proxy mode of the plain listener.
    pub forward: Forward,
    /// `[ca]`: the local certificate authority that issues keyrelay's certificates.
    pub ca: Ca,
    /// `[access]`: caller tokens.
    pub access: Access,
    /// `[admin]`: the operator API.
    pub admin: Admin,
    /// `[cluster]`: several replicas sharing one pool through Redis; `None`: this
    /// instance alone.
    pub cluster: Option<Cluster>,
    /// `[prices.<provider>]`: what a task of each method costs, for budgets.
    pub prices: Prices,
    /// Where durable state (the pin journal, the operator's holds) lives. `load` defaults it
    /// to the config file's directory; a config built in code has none, and keeps pins and
    /// holds in memory only.
    pub data_dir: Option<PathBuf>,
}

/// One key of the pool.
#[derive(Clone, Debug)]
pub struct KeyConfig {
    /// Label in logs and metrics; never the key itself.
    pub name: String,
    /// The secret.
    pub key: ApiKey,
    /// Share of new tasks relative to the other keys (> 0).
    pub weight: f64,
    /// The plan's thread count, if known.
    pub threads: Option<u32>,
    /// Priority tier: keys of tier N+1 take tasks only while every key of tiers <= N is
    /// out of rotation or full. 0, the default, is the primary tier.
    pub tier: u32,
    /// The service the key belongs to: what its answers mean (`captcha::Profile`).
    pub provider: Provider,
    /// Where the key's requests go: its own `upstream`, else the global one for a
    /// CaptchaAI key and its provider's own host for any other.
    pub upstream: Upstream,
}

/// `[failover]`: how requests move between keys.
#[derive(Clone, Debug)]
pub struct Failover {
    /// Attempts per task across keys (>= 1).
    pub max_attempts: u32,
    /// Re-send a submit that may have reached the upstream unanswered.
    pub retry_unsure_submits: bool,
    /// Keys at or below this balance are left out of rotation.
    pub min_balance: f64,
    /// How long a full key (`NO_SLOT`, `MAX_USER_TURN`, 429) rests.
    pub busy_cooldown: Duration,
    /// Consecutive transient failures before a key cools down (>= 1).
    pub transient_failures: u32,
    /// How long a key rests after `transient_failures` failures in a row.
    pub transient_cooldown: Duration,
    /// First retry delay after a transient failure; doubles, with jitter.
    pub backoff_base: Duration,
    /// The most a retry delay grows to (>= `backoff_base`).
    pub backoff_max: Duration,
    /// Largest share of the pool that transient faults may cool down at once (0 to 1). A
    /// lone key is never cooled for transient faults.
    pub max_transient_ejection: f64,
    /// The most a transient cooldown grows to when a key is ejected again and again.
    pub transient_cooldown_max: Duration,
    /// How long all upstream traffic pauses after the service bans keyrelay's IP.
    pub ip_ban_pause: Duration,
    /// Retries allowed as a share of recent first attempts, on top of `retry_budget_min`.
    pub retry_budget: f64,
    /// Retries per second always allowed, however few requests there were.
    pub retry_budget_min: u32,
}

/// How a new task's key is chosen among the keys of the lowest tier that has room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// At random, in proportion to weight × balance.
    #[default]
    Weighted,
    /// The lowest share of threads in use; the higher weight among equals.
    LeastLoaded,
    /// Each usable key in turn.
    RoundRobin,
    /// The lowest `[prices]` price for the task's method (a thread-billed key without a
    /// price costs 0, another without one the most); weight × balance among equals.
    Cheapest,
    /// The lowest observed solve time for the task's method at the key's provider (the last
    /// 50 solves or 10 minutes, once 5 were seen; weight × balance before that).
    Fastest,
}

impl Strategy {
    /// Every strategy, for messages.
    pub const ALL: [Strategy; 5] = [
        Strategy::Weighted,
        Strategy::LeastLoaded,
        Strategy::RoundRobin,
        Strategy::Cheapest,
        Strategy::Fastest,
    ];

    /// The name `proxy.toml` and logs use.
    pub fn label(self) -> &'static str {
        match self {
            Strategy::Weighted => "weighted",
            Strategy::LeastLoaded => "least-loaded",
            Strategy::RoundRobin => "round-robin",
            Strategy::Cheapest => "cheapest",
            Strategy::Fastest => "fastest",
        }
    }

    pub fn parse(text: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.label() == text)
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// `[capacity]`: thread accounting and what happens when every key is full.
#[derive(Clone, Debug)]
pub struct Capacity {
    /// How long a submit may wait for a thread when every key is full; zero answers at once.
    pub queue_timeout: Duration,
    /// Submits allowed to wait at once; more are answered at once.
    pub max_queued: usize,
    /// An accepted task with no final answer after this long no longer holds a thread.
    pub stale_after: Duration,
    /// A key back in rotation ramps its share up over this long; zero gives it its full
    /// share at once.
    pub slow_start: Duration,
}

/// `[pins]`: the task id -> key table.
#[derive(Clone, Debug)]
pub struct Pins {
    /// How long a pin lives (> 0).
    pub ttl: Duration,
    /// Size cap; the oldest pins are evicted first (>= 1).
    pub max_pins: usize,
    /// Keep pins on disk (in `data_dir`) so they survive restarts and crashes.
    pub durable: bool,
    /// Upstream requests per second the owner probe may make for ids without a pin (> 0).
    pub probe_rate: f64,
    /// Probe requests that may go at once (>= `MIN_PROBE_BURST`).
    pub probe_burst: u32,
}

/// `[observability]`: what keyrelay tells callers and operators about itself.
#[derive(Clone, Debug)]
pub struct Observability {
    /// Add `X-Keyrelay-Key` and `X-Keyrelay-Attempts` to proxied answers.
    pub key_headers: bool,
}

/// `[scaling]`: the signals a worker autoscaler reads (`docs/scaling.md`).
#[derive(Clone, Copy, Debug)]
pub struct Scaling {
    /// While the pool's total balance is below this, no new workers are wanted.
    pub brake_balance: f64,
}

impl Default for Scaling {
    fn default() -> Scaling {
        Scaling {
            brake_balance: DEFAULT_BRAKE_BALANCE,
        }
    }
}

/// `[limits]`: request size limits.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body accepted, in bytes (> 0).
    pub max_body: usize,
    /// Largest request head (request line and headers) accepted, in bytes.
    pub max_header: usize,
    /// Time a client has to send its request head (slow-loris defence).
    pub header_timeout: Duration,
    /// Connections served at once; more are closed at once.
    pub max_connections: usize,
}

/// `[timeouts]`: upstream timeouts, all > 0.
#[derive(Clone, Debug)]
pub struct Timeouts {
    /// Establishing a connection (TCP and TLS).
    pub connect: Duration,
    /// A whole `in.php` / `res.php` exchange.
    pub request: Duration,
    /// A whole `solve.php` exchange, which answers only when solved.
    pub solve: Duration,
    /// Each request of the background refresh.
    pub refresh: Duration,
    /// At shutdown, how long requests in flight may take to finish.
    pub drain: Duration,
    /// A raw tunnel (`CONNECT` to a host that is not intercepted) with no traffic either
    /// way for this long is closed.
    pub tunnel_idle: Duration,
}

/// Why a configuration could not be loaded. No variant ever shows a key value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file that was asked for.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The text is not TOML, or a field has the wrong type or name: toml's line, column and
    /// source line, with any line that could hold a key masked with `*`, and a message that
    /// names the field and the expected type but never the value.
    #[error("{0}")]
    Parse(#[source] ParseError),
    /// One or more validation problems, each naming its field (e.g.
    /// `keys[1] ("client-b").weight: must be > 0, got -1`).
    #[error("{}", invalid_message(.0))]
    Invalid(Vec<String>),
}

fn invalid_message(problems: &[String]) -> String {
    match problems {
        [one] => format!("invalid configuration: {one}"),
        many => {
            let mut text = format!("invalid configuration ({} problems):", many.len());
            for problem in many {
                text.push_str("\n  ");
                text.push_str(problem);
            }
            text
        }
    }
}

// === impl Config ===

impl Config {
    /// Parse + validate. `env` resolves `${VAR}` and `keys_env` (tests inject a map; `load`
    /// passes `std::env::var`).
    ///
    /// # Errors
    /// [`ConfigError::Parse`] for TOML syntax, unknown fields and wrong types;
    /// [`ConfigError::Invalid`] with every validation problem found.
    pub fn from_toml_str(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let raw: raw::RawConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(redact::parse_error(text, e)))?;
        validate::validate(raw, env).map_err(ConfigError::Invalid)
    }

    /// Reads and validates a `proxy.toml`, resolving variables from the process environment.
    ///
    /// # Errors
    /// [`ConfigError::Io`] if the file cannot be read, otherwise as [`Config::from_toml_str`].
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Config::from_toml_str(&text, &|name| std::env::var(name).ok())?;
        config.data_dir = Some(data_dir_for(path, config.data_dir.take()));
        // Certificate files are named relative to the file, as data_dir is.
        if let Some(ca) = config.upstream_ca.take() {
            config.upstream_ca = Some(data_dir_for(path, Some(ca)));
        }
        let files = (config.tls.as_mut().and_then(|tls| tls.files.as_mut()))
            .into_iter()
            .chain(config.ca.files.as_mut());
        for files in files {
            files.cert = data_dir_for(path, Some(std::mem::take(&mut files.cert)));
            files.key = data_dir_for(path, Some(std::mem::take(&mut files.key)));
        }
        Ok(config)
    }

    /// Whether the admin API may trust a caller for being on loopback: only while every
    /// listener is on loopback and no tokens are configured (`config::access`'s rule, which
    /// the exposure check enforces for files; configs built in code are held to it here).
    pub fn loopback_trusted(&self) -> bool {
        access::loopback_trusted(self.listen, self.tls.as_ref(), &self.access, &self.admin)
    }

    /// A config for tests/demo built in code: given keys, everything else default, listen
    /// 127.0.0.1:0.
    pub fn for_keys(upstream: Upstream, keys: Vec<KeyConfig>) -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            strategy: Strategy::default(),
            capacity: Capacity::default(),
            upstream,
            upstream_ca: None,
            upstream_proxy: None,
            refresh_interval: DEFAULT_REFRESH_INTERVAL,
            keys,
            failover: Failover::default(),
            pins: Pins::default(),
            polling: Polling::default(),
            prices: Prices::default(),
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            observability: Observability::default(),
            scaling: Scaling::default(),
            tls: None,
            forward: Forward::default(),
            ca: Ca::default(),
            access: Access::default(),
            admin: Admin::default(),
            cluster: None,
            data_dir: None,
        }
    }

    /// Human-readable pool description for `keyrelay check`: settings lines and a table with
    /// name, weight, threads (`-` if unset), fingerprint. Never a key value.
    pub fn summary(&self) -> String {
        summary::render(self)
    }
}

/// Where the durable state of the config file at `path` lives (and, with a path given,
/// where a file it names is). A relative `data_dir`, or none, is taken relative to the
/// file, which is where an operator looks for it. The result
/// is absolute: a bare `proxy.toml` has the parent `""`, which no system call accepts as a
/// directory, and an absolute path also says plainly in logs where the journal is.
fn data_dir_for(path: &Path, configured: Option<PathBuf>) -> PathBuf {
    let base = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        // `proxy.toml` (parent "") or `/` (no parent): the file's directory is the current one.
        _ => Path::new("."),
    };
    let dir = match configured {
        Some(dir) if dir.is_absolute() => dir,
        Some(dir) => base.join(dir),
        None => base.to_owned(),
    };
    // Only fails for an empty path, which `base` never is; the relative path still works then.
    std::path::absolute(&dir).unwrap_or(dir)
}

// === impl KeyConfig ===

impl KeyConfig {
    /// A key with weight 1, tier 0 and no thread count.
    pub fn new(name: &str, key: &str, upstream: Upstream) -> KeyConfig {
        KeyConfig {
            name: name.to_owned(),
            key: ApiKey::new(key),
            weight: DEFAULT_WEIGHT,
            threads: None,
            tier: DEFAULT_TIER,
            provider: Provider::default(),
            upstream,
        }
    }
}

// === defaults ===

impl Default for Failover {
    fn default() -> Failover {
        Failover {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry_unsure_submits: DEFAULT_RETRY_UNSURE_SUBMITS,
            min_balance: DEFAULT_MIN_BALANCE,
            busy_cooldown: DEFAULT_BUSY_COOLDOWN,
            transient_failures: DEFAULT_TRANSIENT_FAILURES,
            transient_cooldown: DEFAULT_TRANSIENT_COOLDOWN,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            max_transient_ejection: DEFAULT_MAX_TRANSIENT_EJECTION,
            transient_cooldown_max: DEFAULT_TRANSIENT_COOLDOWN_MAX,
            ip_ban_pause: DEFAULT_IP_BAN_PAUSE,
            retry_budget: DEFAULT_RETRY_BUDGET,
            retry_budget_min: DEFAULT_RETRY_BUDGET_MIN,
        }
    }
}

impl Default for Capacity {
    fn default() -> Capacity {
        Capacity {
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            max_queued: DEFAULT_MAX_QUEUED,
            stale_after: DEFAULT_STALE_AFTER,
            slow_start: DEFAULT_SLOW_START,
        }
    }
}

impl Default for Pins {
    fn default() -> Pins {
        Pins {
            ttl: DEFAULT_PIN_TTL,
            max_pins: DEFAULT_MAX_PINS,
            durable: DEFAULT_DURABLE_PINS,
            probe_rate: DEFAULT_PROBE_RATE,
            probe_burst: DEFAULT_PROBE_BURST,
        }
    }
}

impl Default for Observability {
    fn default() -> Observability {
        Observability {
            key_headers: DEFAULT_KEY_HEADERS,
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body: DEFAULT_MAX_BODY,
            max_header: DEFAULT_MAX_HEADER,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            connect: DEFAULT_CONNECT_TIMEOUT,
            request: DEFAULT_REQUEST_TIMEOUT,
            solve: DEFAULT_SOLVE_TIMEOUT,
            refresh: DEFAULT_REFRESH_TIMEOUT,
            drain: DEFAULT_DRAIN_TIMEOUT,
            tunnel_idle: DEFAULT_TUNNEL_IDLE,
        }
    }
}
