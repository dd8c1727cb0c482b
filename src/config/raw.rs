//! The `proxy.toml` schema as serde sees it: every field optional, unknown fields rejected.
//! Turning these into a validated [`super::Config`] is `validate`'s job.

use serde::Deserialize;
use toml::Value;

/// The whole file. Durations and sizes stay raw [`Value`]s so that validation can tell a
/// missing unit (`300`) from a typo (`"5 minuts"`) and say which field it was. No `Debug`:
/// it holds key values.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub listen: Option<String>,
    pub strategy: Option<String>,
    pub upstream: Option<String>,
    pub refresh_interval: Option<Value>,
    pub keys_env: Option<String>,
    pub data_dir: Option<String>,
    pub upstream_ca: Option<String>,
    pub upstream_proxy: Option<String>,
    /// Kept raw: a type error would quote the value ([`super::problems::string_list`]).
    pub upstream_no_proxy: Option<Value>,
    /// Kept raw, not `Vec<RawKey>`: serde's type errors quote the offending value, and in
    /// `keys = ["0123…"]` that value is a secret. See `RawKey`.
    pub keys: Option<Value>,
    #[serde(default)]
    pub failover: RawFailover,
    #[serde(default)]
    pub capacity: RawCapacity,
    #[serde(default)]
    pub pins: RawPins,
    #[serde(default)]
    pub polling: super::polling::RawPolling,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub timeouts: RawTimeouts,
    #[serde(default)]
    pub observability: RawObservability,
    #[serde(default)]
    pub scaling: RawScaling,
    pub tls: Option<RawTls>,
    #[serde(default)]
    pub forward: RawForward,
    #[serde(default)]
    pub ca: RawCa,
    #[serde(default)]
    pub access: RawAccess,
    #[serde(default)]
    pub admin: RawAdmin,
    pub cluster: Option<RawCluster>,
    /// `[prices.<provider>]`: kept raw, checked in `budget`.
    pub prices: Option<Value>,
}

/// One `[[keys]]` entry. All fields are raw values so that the only error serde can raise
/// here is an unknown field, whose message names the field and never the value; types are
/// checked in `validate`, which can name the key the problem belongs to. No `Debug`, as above.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKey {
    pub name: Option<Value>,
    pub key: Option<Value>,
    pub weight: Option<Value>,
    pub threads: Option<Value>,
    pub tier: Option<Value>,
    pub provider: Option<Value>,
    pub upstream: Option<Value>,
}

/// `[failover]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFailover {
    pub max_attempts: Option<u32>,
    pub retry_unsure_submits: Option<bool>,
    pub min_balance: Option<f64>,
    pub busy_cooldown: Option<Value>,
    pub transient_failures: Option<u32>,
    pub transient_cooldown: Option<Value>,
    pub backoff_base: Option<Value>,
    pub backoff_max: Option<Value>,
    pub max_transient_ejection: Option<f64>,
    pub transient_cooldown_max: Option<Value>,
    pub ip_ban_pause: Option<Value>,
    pub retry_budget: Option<f64>,
    pub retry_budget_min: Option<u32>,
}

/// `[capacity]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCapacity {
    pub queue_timeout: Option<Value>,
    pub max_queued: Option<usize>,
    pub stale_after: Option<Value>,
    pub slow_start: Option<Value>,
}

/// `[pins]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPins {
    pub ttl: Option<Value>,
    pub max_pins: Option<usize>,
    pub durable: Option<bool>,
    pub probe_rate: Option<f64>,
    pub probe_burst: Option<u32>,
}

/// `[limits]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub max_body: Option<Value>,
    pub max_header: Option<Value>,
    pub header_timeout: Option<Value>,
    pub max_connections: Option<usize>,
}

/// `[timeouts]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTimeouts {
    pub connect: Option<Value>,
    pub request: Option<Value>,
    pub solve: Option<Value>,
    pub refresh: Option<Value>,
    pub drain: Option<Value>,
    pub tunnel_idle: Option<Value>,
}

/// `[observability]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawObservability {
    pub key_headers: Option<bool>,
}

/// `[scaling]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScaling {
    pub brake_balance: Option<f64>,
}

/// `[tls]`: a TLS listener beside the plain one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub listen: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub names: Option<Vec<String>>,
}

/// `[forward]`: the forward-proxy mode of the plain listener.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawForward {
    pub intercept: Option<Vec<String>>,
    pub tunnel: Option<String>,
    pub allow: Option<Vec<String>>,
}

/// `[ca]`: the local certificate authority.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCa {
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// `[access]`. Tokens are kept raw for the reason `keys` is: serde would quote a secret.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccess {
    pub open: Option<bool>,
    pub tokens: Option<Value>,
}

/// One `[[access.tokens]]` entry, every field raw as in [`RawKey`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawToken {
    pub name: Option<Value>,
    pub token: Option<Value>,
    pub keys: Option<Value>,
    pub tiers: Option<Value>,
    pub max_threads: Option<Value>,
    pub max_tunnels: Option<Value>,
    pub budget: Option<Value>,
}

/// `[admin]`. The token is raw for the same reason.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub listen: Option<String>,
    pub token: Option<Value>,
}

/// `[cluster]`: several replicas sharing one pool through Redis. `redis` is a raw value, as
/// it may carry a password.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub redis: Option<Value>,
    pub replica: Option<String>,
    pub prefix: Option<String>,
    pub replica_timeout: Option<Value>,
    pub timeout: Option<Value>,
    pub sync_interval: Option<Value>,
}
