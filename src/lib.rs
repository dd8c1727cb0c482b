//! keyrelay: a local proxy that lets scripts written for CaptchaAI's 2captcha-compatible
//! `in.php` / `res.php` API share a pool of API keys.
//!
//! Request flow: `server` → `proxy::handle` → `captcha::ParsedRequest` (and, for `res.php`,
//! `captcha::ResCommand`) → `pool::candidates` → `upstream` → `captcha::classify` →
//! `failover` → `App::record_health` → `metrics`; every answer keyrelay makes itself is a
//! `proxy::Local`.
//!
//! Arrows point one way (`tests/module_arrows.rs` holds it): `server` → `proxy` → `app` →
//! `pool`, `capacity`, `pins`, `upstream` → `captcha`, `failover`, `health`, `config`. No
//! module calls back up; the background tasks (`refresh`, `reload`) and `status` sit beside
//! `proxy`, above `app`.
//!
//! Layout:
//! - [`api_key`]: the redacted [`ApiKey`] secret type; [`key_id`]: the id every store knows
//!   a key by.
//! - [`captcha`]: the wire protocol, pure: request parsing, key rewriting, task ids, the
//!   typed `res.php` command, answer parsing and the one table that classifies upstream
//!   outcomes.
//! - [`config`]: `proxy.toml` from raw TOML to a validated [`Config`].
//! - [`health`] and [`pins`]: key health and task pins, each behind a narrow store interface;
//!   [`capacity`]: threads in use per key (behind a third), leases and the queue for a full
//!   pool.
//! - [`pool`]: the keys, what is known about them, tiers and the selection strategies;
//!   [`registry`]: every key ever configured, under an id stable across reloads.
//! - [`failover`]: the policy, pure: what each outcome and each of keyrelay's own account
//!   reads does to a key and to the task.
//! - [`upstream`]: the pooled rustls client and the account reads (`getbalance`,
//!   `threadsinfo`) keyrelay makes itself.
//! - [`tls`]: the local CA and the leaves it issues, the `[tls]` listener's certificate
//!   and its reload, and the reasons a handshake fails.
//! - [`proxy`]: one request end to end; [`server`]: accept loop, connections, the
//!   forward-proxy mode (`CONNECT`, absolute-form requests to other hosts) and shutdown.
//! - [`background`]: every long-running background task, started in one place and
//!   listed there; [`refresh`]: background balance and thread reads, and re-probing
//!   benched keys;
//!   [`reload`]: live reload of `proxy.toml` on SIGHUP or when the file changes, and the
//!   diff-and-apply of a new config.
//! - [`metrics`]: Prometheus metrics from an owned registry; [`status`]: `/status`,
//!   `/healthz` and `/readyz`; [`admin`]: the admin API under `/admin/` (list keys, hold
//!   them, refresh them now), served by `proxy`; [`ctl`]: `keyrelay ctl`, its client.
//! - [`tokens`]: the caller token table built with each snapshot, and the threads each
//!   token holds.
//! - [`task_table`]: the compact per-task maps and queues behind pins and the ledger.
//! - [`log_limit`]: bounds on the log lines a caller can cause (length and rate);
//!   [`atomic_file`]: the crash-safe replace of the small state files in `data_dir`.
//! - [`app`]: the shared handle tying these together, the bottom of the request path.
//! - [`sim`]: the built-in CaptchaAI simulator used by tests, benchmarks and [`demo`].

/// The git commit keyrelay was built from (12 hex digits), or `unknown` for a build with
/// neither `.git` nor `KEYRELAY_GIT_COMMIT` (build.rs).
pub const BUILD_COMMIT: &str = env!("KEYRELAY_COMMIT");

pub mod admin;
pub mod admission;
pub mod api_key;
pub mod app;
pub mod atomic_file;
pub mod background;
pub mod budgets;
pub mod capacity;
pub mod captcha;
pub mod cluster;
pub mod config;
pub mod ctl;
pub mod demo;
pub mod failover;
pub mod fast_map;
pub mod fleet;
pub mod forecast;
pub mod health;
pub mod host;
pub mod json_api;
pub mod key_id;
pub mod log_limit;
pub mod metrics;
pub mod online_check;
pub mod outage;
pub mod pins;
pub mod polling;
pub mod pool;
pub mod provider;
pub mod proxy;
pub mod refresh;
pub mod registry;
pub mod reload;
pub mod scaling;
pub mod server;
pub mod sim;
pub mod status;
pub mod task_table;
pub mod tls;
pub mod tokens;
pub mod upstream;

pub use api_key::{ApiKey, CallerToken};
pub use app::App;
pub use config::Config;
