//! Raw settings to a validated [`Config`]: defaults, ranges and units, every problem
//! collected with the path of its field. The key pool itself is checked in `keys`.

use std::net::SocketAddr;
use std::time::Duration;

use toml::Value;

use super::problems::{a_type, Problems};
use super::raw::{RawCapacity, RawConfig, RawFailover, RawLimits, RawPins, RawTimeouts};
use super::redact::quoted;
use super::units::{duration, Zero};
use super::*;

/// Raw config to [`Config`], or every problem found.
pub(super) fn validate(
    raw: RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, Vec<String>> {
    let mut problems = Problems::default();
    let p = &mut problems;
    let listen = listen(p, raw.listen);
    let strategy = strategy(p, raw.strategy);
    let capacity = capacity(p, raw.capacity);
    let upstream = upstream(p, raw.upstream);
    let refresh_interval = duration(
        p,
        "refresh_interval",
        raw.refresh_interval,
        DEFAULT_REFRESH_INTERVAL,
        Zero::Rejected,
    );
    let failover = failover(p, raw.failover);
    let pins = pins(p, raw.pins);
    let polling = super::polling::polling(p, raw.polling);
    let limits = limits(p, raw.limits);
    let timeouts = timeouts(p, raw.timeouts);
    let observability = Observability {
        key_headers: raw.observability.key_headers.unwrap_or(DEFAULT_KEY_HEADERS),
    };
    let scaling = Scaling {
        brake_balance: a_balance(
            p,
            "scaling.brake_balance",
            raw.scaling.brake_balance,
            DEFAULT_BRAKE_BALANCE,
        ),
    };
    let keys = super::keys::pool(p, raw.keys, raw.keys_env, &upstream, env);
    let tls = super::tls::tls(p, raw.tls, listen);
    let forward = super::tls::forward(p, raw.forward);
    let ca = super::tls::ca(p, raw.ca);
    let access = super::access::access(p, raw.access, &keys, env);
    let admin = super::access::admin(p, raw.admin, env);
    super::access::exposure(p, listen, tls.as_ref(), &access, &admin);
    let direct = raw
        .upstream_no_proxy
        .map(|list| super::upstream_proxy::no_proxy(p, list))
        .unwrap_or_default();
    let upstream_proxy = match raw.upstream_proxy.filter(|url| !url.trim().is_empty()) {
        Some(url) => super::upstream_proxy::upstream_proxy(p, &url, direct, env),
        None => {
            if !direct.is_empty() {
                p.add(
                    "upstream_no_proxy",
                    "lists hosts that bypass upstream_proxy, which is not set",
                );
            }
            None
        }
    };
    let cluster = raw
        .cluster
        .and_then(|raw| super::cluster::cluster(p, raw, env));
    let prices = super::budget::prices(p, raw.prices);
    problems.check()?;
    Ok(Config {
        listen,
        strategy,
        capacity,
        upstream,
        upstream_ca: raw
            .upstream_ca
            .filter(|c| !c.trim().is_empty())
            .map(PathBuf::from),
        upstream_proxy,
        refresh_interval,
        keys,
        failover,
        pins,
        polling,
        prices,
        limits,
        timeouts,
        observability,
        scaling,
        tls,
        forward,
        ca,
        access,
        admin,
        cluster,
        data_dir: raw.data_dir.filter(|d| !d.is_empty()).map(PathBuf::from),
    })
}

/// A balance threshold: a finite number, 0 or more; `default` when absent or invalid.
fn a_balance(p: &mut Problems, path: &str, raw: Option<f64>, default: f64) -> f64 {
    match raw {
        None => default,
        Some(b) if !b.is_finite() => {
            p.add(path, format!("must be a finite number, got {b}"));
            default
        }
        Some(b) if b < 0.0 => {
            p.add(path, format!("must be >= 0, got {b}"));
            default
        }
        // -0.0 passes `>= 0`; as 0 it never shows as "-0" in `check` or the gauges.
        Some(0.0) => 0.0,
        Some(b) => b,
    }
}

fn listen(p: &mut Problems, raw: Option<String>) -> SocketAddr {
    let default = || {
        DEFAULT_LISTEN
            .parse()
            .expect("the default listen address is valid")
    };
    let Some(text) = raw else {
        return default();
    };
    text.parse().unwrap_or_else(|_| {
        p.add(
            "listen",
            format!(
                "{} is not an IP address and port such as \"127.0.0.1:8080\"",
                quoted(&text)
            ),
        );
        default()
    })
}

fn strategy(p: &mut Problems, raw: Option<String>) -> Strategy {
    let Some(text) = raw else {
        return Strategy::default();
    };
    Strategy::parse(&text).unwrap_or_else(|| {
        let known: Vec<String> = Strategy::ALL
            .iter()
            .map(|s| format!("{:?}", s.label()))
            .collect();
        p.add(
            "strategy",
            format!(
                "{} is not a strategy; use one of {}",
                quoted(&text),
                known.join(", ")
            ),
        );
        Strategy::default()
    })
}

fn capacity(p: &mut Problems, raw: RawCapacity) -> Capacity {
    Capacity {
        queue_timeout: duration(
            p,
            "capacity.queue_timeout",
            raw.queue_timeout,
            DEFAULT_QUEUE_TIMEOUT,
            Zero::Allowed,
        ),
        max_queued: raw.max_queued.unwrap_or(DEFAULT_MAX_QUEUED),
        stale_after: duration(
            p,
            "capacity.stale_after",
            raw.stale_after,
            DEFAULT_STALE_AFTER,
            Zero::Rejected,
        ),
        slow_start: duration(
            p,
            "capacity.slow_start",
            raw.slow_start,
            DEFAULT_SLOW_START,
            Zero::Allowed,
        ),
    }
}

fn upstream(p: &mut Problems, raw: Option<String>) -> Upstream {
    let default = || Upstream::parse(DEFAULT_UPSTREAM).expect("the default upstream is valid");
    let Some(text) = raw else {
        return default();
    };
    // The value itself is not repeated: a URL with user info would carry a password.
    Upstream::parse(&text).unwrap_or_else(|message| {
        p.add("upstream", message);
        default()
    })
}

fn failover(p: &mut Problems, raw: RawFailover) -> Failover {
    let max_attempts = at_least_one(
        p,
        "failover.max_attempts",
        raw.max_attempts,
        DEFAULT_MAX_ATTEMPTS,
    );
    let min_balance = a_balance(
        p,
        "failover.min_balance",
        raw.min_balance,
        DEFAULT_MIN_BALANCE,
    );
    let transient_failures = at_least_one(
        p,
        "failover.transient_failures",
        raw.transient_failures,
        DEFAULT_TRANSIENT_FAILURES,
    );
    let cooldown =
        |p: &mut Problems, field, raw, default| duration(p, field, raw, default, Zero::Allowed);
    let busy_cooldown = cooldown(
        p,
        "failover.busy_cooldown",
        raw.busy_cooldown,
        DEFAULT_BUSY_COOLDOWN,
    );
    let transient_cooldown = cooldown(
        p,
        "failover.transient_cooldown",
        raw.transient_cooldown,
        DEFAULT_TRANSIENT_COOLDOWN,
    );
    let backoff_base = cooldown(
        p,
        "failover.backoff_base",
        raw.backoff_base,
        DEFAULT_BACKOFF_BASE,
    );
    let backoff_max = cooldown(
        p,
        "failover.backoff_max",
        raw.backoff_max,
        DEFAULT_BACKOFF_MAX,
    );
    not_below(
        p,
        ("failover.backoff_max", backoff_max),
        ("failover.backoff_base", backoff_base),
    );
    let transient_cooldown_max = cooldown(
        p,
        "failover.transient_cooldown_max",
        raw.transient_cooldown_max,
        DEFAULT_TRANSIENT_COOLDOWN_MAX,
    );
    not_below(
        p,
        ("failover.transient_cooldown_max", transient_cooldown_max),
        ("failover.transient_cooldown", transient_cooldown),
    );
    let share = |p: &mut Problems, field: &str, raw: Option<f64>, default: f64, max: f64| match raw
    {
        None => default,
        Some(v) if v.is_finite() && (0.0..=max).contains(&v) => v,
        Some(v) => {
            p.add(field, format!("must be between 0 and {max}, got {v}"));
            default
        }
    };
    Failover {
        max_attempts,
        retry_unsure_submits: raw
            .retry_unsure_submits
            .unwrap_or(DEFAULT_RETRY_UNSURE_SUBMITS),
        min_balance,
        busy_cooldown,
        transient_failures,
        transient_cooldown,
        backoff_base,
        backoff_max,
        max_transient_ejection: share(
            p,
            "failover.max_transient_ejection",
            raw.max_transient_ejection,
            DEFAULT_MAX_TRANSIENT_EJECTION,
            1.0,
        ),
        transient_cooldown_max,
        ip_ban_pause: duration(
            p,
            "failover.ip_ban_pause",
            raw.ip_ban_pause,
            DEFAULT_IP_BAN_PAUSE,
            Zero::Allowed,
        ),
        // tower's budget accepts up to 1000 retries per request; more than 10 is no budget.
        retry_budget: share(
            p,
            "failover.retry_budget",
            raw.retry_budget,
            DEFAULT_RETRY_BUDGET,
            10.0,
        ),
        retry_budget_min: raw.retry_budget_min.unwrap_or(DEFAULT_RETRY_BUDGET_MIN),
    }
}

fn pins(p: &mut Problems, raw: RawPins) -> Pins {
    let ttl = duration(p, "pins.ttl", raw.ttl, DEFAULT_PIN_TTL, Zero::Rejected);
    let max_pins = at_least_one(p, "pins.max_pins", raw.max_pins, DEFAULT_MAX_PINS);
    let probe_rate = match raw.probe_rate {
        None => DEFAULT_PROBE_RATE,
        Some(rate) if rate > 0.0 && rate <= MAX_PROBE_BUDGET => rate,
        Some(rate) => {
            p.add(
                "pins.probe_rate",
                format!("must be > 0 and <= {MAX_PROBE_BUDGET} requests a second, got {rate}"),
            );
            DEFAULT_PROBE_RATE
        }
    };
    let probe_burst = match raw.probe_burst {
        None => DEFAULT_PROBE_BURST,
        Some(burst) if burst >= MIN_PROBE_BURST && f64::from(burst) <= MAX_PROBE_BUDGET => burst,
        Some(burst) => {
            p.add(
                "pins.probe_burst",
                format!(
                    "must be >= {MIN_PROBE_BURST} (one probe of a full pool) and <= {MAX_PROBE_BUDGET}, got {burst}"
                ),
            );
            DEFAULT_PROBE_BURST
        }
    };
    Pins {
        ttl,
        max_pins,
        durable: raw.durable.unwrap_or(DEFAULT_DURABLE_PINS),
        probe_rate,
        probe_burst,
    }
}

fn limits(p: &mut Problems, raw: RawLimits) -> Limits {
    let max_connections = at_least_one(
        p,
        "limits.max_connections",
        raw.max_connections,
        DEFAULT_MAX_CONNECTIONS,
    );
    Limits {
        max_body: size(p, "limits.max_body", raw.max_body, DEFAULT_MAX_BODY),
        max_header: header_size(p, raw.max_header),
        header_timeout: duration(
            p,
            "limits.header_timeout",
            raw.header_timeout,
            DEFAULT_HEADER_TIMEOUT,
            Zero::Rejected,
        ),
        max_connections,
    }
}

/// Below this, ordinary clients' headers (user agent, cookies) would be refused.
const MIN_MAX_HEADER: usize = 1024;

fn header_size(p: &mut Problems, raw: Option<Value>) -> usize {
    let bytes = size(p, "limits.max_header", raw, DEFAULT_MAX_HEADER);
    if bytes < MIN_MAX_HEADER {
        p.add(
            "limits.max_header",
            format!("must be at least 1KiB ({MIN_MAX_HEADER} bytes), got {bytes}"),
        );
        return DEFAULT_MAX_HEADER;
    }
    bytes
}

fn timeouts(p: &mut Problems, raw: RawTimeouts) -> Timeouts {
    let mut timeout = |field, raw, default| duration(p, field, raw, default, Zero::Rejected);
    Timeouts {
        connect: timeout("timeouts.connect", raw.connect, DEFAULT_CONNECT_TIMEOUT),
        request: timeout("timeouts.request", raw.request, DEFAULT_REQUEST_TIMEOUT),
        solve: timeout("timeouts.solve", raw.solve, DEFAULT_SOLVE_TIMEOUT),
        refresh: timeout("timeouts.refresh", raw.refresh, DEFAULT_REFRESH_TIMEOUT),
        drain: timeout("timeouts.drain", raw.drain, DEFAULT_DRAIN_TIMEOUT),
        tunnel_idle: timeout("timeouts.tunnel_idle", raw.tunnel_idle, DEFAULT_TUNNEL_IDLE),
    }
}

/// A ceiling setting must not be below the setting it caps.
fn not_below(
    p: &mut Problems,
    (field, value): (&str, Duration),
    (floor_field, floor): (&str, Duration),
) {
    if value < floor {
        p.add(
            field,
            format!(
                "must be >= {floor_field} ({}), got {}",
                humantime::format_duration(floor),
                humantime::format_duration(value)
            ),
        );
    }
}

/// A count that must be at least 1 (zero is its type's `Default`).
fn at_least_one<T: Copy + Default + PartialEq>(
    p: &mut Problems,
    field: &str,
    raw: Option<T>,
    default: T,
) -> T {
    match raw {
        Some(zero) if zero == T::default() => {
            p.add(field, "must be >= 1, got 0");
            default
        }
        other => other.unwrap_or(default),
    }
}

/// A byte size: a string such as `"16MiB"` or an integer number of bytes, > 0.
fn size(p: &mut Problems, field: &str, raw: Option<Value>, default: usize) -> usize {
    let bytes = match raw {
        None => return default,
        Some(Value::Integer(n)) => u64::try_from(n).unwrap_or(0),
        Some(Value::String(text)) => {
            match text.parse::<bytesize::ByteSize>() {
                Ok(size) => size.as_u64(),
                // bytesize's message quotes the text, so it is shown only when the text may be.
                Err(e) => {
                    match quoted(&text) {
                    shown if shown.starts_with('"') => p.add(field, format!("invalid size: {e}")),
                    shown => p.add(
                        field,
                        format!("must be a size such as \"16MiB\" or a number of bytes, got {shown}"),
                    ),
                }
                    return default;
                }
            }
        }
        Some(other) => {
            p.add(
                field,
                format!(
                    "must be a size such as \"16MiB\" or a number of bytes, got {}",
                    a_type(&other)
                ),
            );
            return default;
        }
    };
    match usize::try_from(bytes) {
        Ok(0) => p.add(field, "must be greater than 0"),
        Ok(bytes) => return bytes,
        Err(_) => p.add(field, format!("{bytes} bytes does not fit in memory")),
    }
    default
}
