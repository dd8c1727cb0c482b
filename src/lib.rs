//! keyrelay: a local proxy that lets scripts written for CaptchaAI's 2captcha-compatible
//! `in.php` / `res.php` API share a pool of API keys.
//!
//! Layout:
//! - `api_key`: the redacted [`ApiKey`] secret type.
//! - `captcha`: the wire protocol, pure: request parsing, key rewriting, answer parsing and
//!   the one table that classifies upstream outcomes.
//! - `config`: `proxy.toml` from raw TOML to a validated [`Config`].
//! - `sim`: the built-in CaptchaAI simulator used by tests, benchmarks and `keyrelay demo`.

pub mod api_key;
pub mod captcha;
pub mod config;
pub mod sim;

pub use api_key::ApiKey;
pub use config::Config;
