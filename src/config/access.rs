//! `[access]` and `[admin]`: the caller tokens, the admin token, and the rule that keeps a
//! keyrelay nobody has to authenticate to on loopback. Messages name tokens by position and
//! name, never by value.

use std::collections::HashMap;
use std::net::SocketAddr;

use toml::Value;

use super::keys::{name_problem, substitute};
use super::problems::{a_type, string_list, Problems};
use super::raw::{RawAccess, RawAdmin, RawToken};
use super::tls::Tls;
use super::KeyConfig;
use crate::CallerToken;

/// `[access]`: who may send requests to the proxy.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Allow a non-loopback listener without tokens (logged as a warning at every start).
    pub open: bool,
    /// `[[access.tokens]]`, in file order; none: every caller is served, as before tokens.
    pub tokens: Vec<TokenConfig>,
}

/// One `[[access.tokens]]` entry.
#[derive(Clone, Debug)]
pub struct TokenConfig {
    /// Label in logs and metrics; never the token itself.
    pub name: String,
    /// The secret the caller sends as its `key`.
    pub token: CallerToken,
    /// Names of the keys that may serve this token's tasks; `None`: any key.
    pub keys: Option<Vec<String>>,
    /// Tiers whose keys may serve this token's tasks, besides `keys`; `None`: no limit by
    /// tier.
    pub tiers: Option<Vec<u32>>,
    /// Threads this token's tasks may hold at once; `None`: no cap beyond the keys' own.
    pub max_threads: Option<u32>,
    /// Raw tunnels (`CONNECT` to hosts that are not intercepted) this token may hold open
    /// at once.
    pub max_tunnels: u32,
    /// What this token's tasks may spend over a rolling period; `None`: no budget.
    pub budget: Option<super::Budget>,
}

impl TokenConfig {
    /// Whether `key` may serve this token's tasks: listed by name or by tier, or no list at
    /// all.
    pub fn may_use(&self, key: &KeyConfig) -> bool {
        match (&self.keys, &self.tiers) {
            (None, None) => true,
            (names, tiers) => {
                names.as_ref().is_some_and(|n| n.contains(&key.name))
                    || tiers.as_ref().is_some_and(|t| t.contains(&key.tier))
            }
        }
    }
}

/// A token's `max_tunnels` when not set: a browser-like client opens a few per host, and a
/// script that needs more is leaking them.
pub const DEFAULT_MAX_TUNNELS: u32 = 64;

/// `[admin]`: the operator API.
#[derive(Clone, Debug, Default)]
pub struct Admin {
    /// A listener of its own for `/admin/`, `/metrics`, `/status`, `/healthz` and `/readyz`;
    /// `None`: they are served on the proxy's listeners.
    pub listen: Option<SocketAddr>,
    /// Needed by every admin call once set.
    pub token: Option<CallerToken>,
}

pub(super) fn access(
    p: &mut Problems,
    raw: RawAccess,
    keys: &[KeyConfig],
    env: &dyn Fn(&str) -> Option<String>,
) -> Access {
    let items = match raw.tokens {
        None => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(other) => {
            p.add(
                "access.tokens",
                format!(
                    "must be an array of tables ([[access.tokens]] entries), got {}",
                    a_type(&other)
                ),
            );
            Vec::new()
        }
    };
    let mut tokens: Vec<TokenConfig> = Vec::with_capacity(items.len());
    let mut names: HashMap<String, String> = HashMap::new();
    let mut values: HashMap<String, String> = HashMap::new();
    for (index, item) in items.into_iter().enumerate() {
        let origin = format!("access.tokens[{index}]");
        if !item.is_table() {
            p.add(
                &origin,
                format!(
                    "must be a table with name = \"...\" and token = \"...\", got {}",
                    a_type(&item)
                ),
            );
            continue;
        }
        // Every field is a raw Value, so this fails only on an unknown field.
        let raw: RawToken = match item.try_into() {
            Ok(raw) => raw,
            Err(e) => {
                p.add(&origin, super::redact::safe(e.message()));
                continue;
            }
        };
        let Some(token) = token_entry(p, &origin, raw, keys, env) else {
            continue;
        };
        let path = format!("{origin} ({:?})", token.name);
        if let Some(first) = names.get(&token.name) {
            p.add(
                format!("{path}.name"),
                format!("duplicate name, {first} has it too"),
            );
            continue;
        }
        if let Some(first) = values.get(token.token.expose()) {
            p.add(format!("{path}.token"), format!("same token as {first}"));
            continue;
        }
        // A token that is a pool key would hand the key to whoever holds the token, and be
        // forwarded by any older keyrelay that does not know tokens.
        if let Some(key) = keys.iter().find(|k| k.key.expose() == token.token.expose()) {
            p.add(
                format!("{path}.token"),
                format!(
                    "is the API key of keys {:?}; a token must be a secret of its own",
                    key.name
                ),
            );
            continue;
        }
        names.insert(token.name.clone(), path.clone());
        values.insert(token.token.expose().to_owned(), path);
        tokens.push(token);
    }
    Access {
        open: raw.open.unwrap_or(false),
        tokens,
    }
}

fn token_entry(
    p: &mut Problems,
    origin: &str,
    raw: RawToken,
    keys: &[KeyConfig],
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<TokenConfig> {
    let name = match raw.name {
        None => {
            p.add(
                format!("{origin}.name"),
                "missing; every token needs a name",
            );
            None
        }
        Some(Value::String(name)) => match name_problem(&name) {
            Some(problem) => {
                p.add(format!("{origin}.name"), problem);
                None
            }
            None => Some(name),
        },
        Some(other) => {
            p.add(
                format!("{origin}.name"),
                format!("must be a string, got {}", a_type(&other)),
            );
            None
        }
    };
    let path = match &name {
        Some(name) => format!("{origin} ({name:?})"),
        None => origin.to_owned(),
    };
    let token = secret(p, &format!("{path}.token"), raw.token, env, true);
    let key_names = raw
        .keys
        .and_then(|v| string_list(p, &format!("{path}.keys"), v));
    if let Some(listed) = &key_names {
        for (i, listed) in listed.iter().enumerate() {
            if !keys.iter().any(|k| &k.name == listed) {
                p.add(
                    format!("{path}.keys[{i}]"),
                    format!("{listed:?} is not the name of a configured key"),
                );
            }
        }
    }
    let tiers = raw
        .tiers
        .and_then(|v| tier_list(p, &format!("{path}.tiers"), v));
    let max_threads = raw
        .max_threads
        .and_then(|v| at_least_one(p, &format!("{path}.max_threads"), v));
    let max_tunnels = raw
        .max_tunnels
        .and_then(|v| at_least_one(p, &format!("{path}.max_tunnels"), v))
        .unwrap_or(DEFAULT_MAX_TUNNELS);
    let budget = raw
        .budget
        .and_then(|v| super::budget::budget(p, &format!("{path}.budget"), v));
    Some(TokenConfig {
        name: name?,
        token: token?,
        keys: key_names,
        tiers,
        max_threads,
        max_tunnels,
        budget,
    })
}

pub(super) fn admin(
    p: &mut Problems,
    raw: RawAdmin,
    env: &dyn Fn(&str) -> Option<String>,
) -> Admin {
    let listen = raw
        .listen
        .and_then(|text| match text.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                p.add(
                    "admin.listen",
                    format!(
                        "{} is not an IP address and port such as \"127.0.0.1:9090\"",
                        super::redact::quoted(&text)
                    ),
                );
                None
            }
        });
    let token = raw
        .token
        .and_then(|value| secret(p, "admin.token", Some(value), env, true));
    Admin { listen, token }
}

/// Refuses listeners that anyone could reach without a secret: the proxy's (plain and TLS)
/// on a non-loopback address with no tokens, unless `access.open`; and an admin API with
/// no admin token once callers are not all trusted, which is whenever tokens are
/// configured or any listener is off loopback. Loopback proves nothing then: a request the
/// forward proxy relays or tunnels reaches the admin listener from keyrelay's own
/// loopback address.
pub(super) fn exposure(
    p: &mut Problems,
    listen: SocketAddr,
    tls: Option<&Tls>,
    access: &Access,
    admin: &Admin,
) {
    let protected = !access.tokens.is_empty() || access.open;
    let proxy_listeners = std::iter::once(("listen", listen))
        .chain(tls.map(|tls| ("tls.listen", tls.listen)))
        .collect::<Vec<_>>();
    if !protected {
        for (field, addr) in &proxy_listeners {
            if !addr.ip().is_loopback() {
                p.add(
                    field,
                    format!(
                        "{addr} is not a loopback address, and no [[access.tokens]] are configured: \
                         anyone who can reach it could spend the pool's keys; add tokens, \
                         listen on 127.0.0.1, or set access.open = true to allow it anyway"
                    ),
                );
            }
        }
    }
    if admin.token.is_some() || loopback_trusted(listen, tls, access, admin) {
        return;
    }
    let exposed = admin
        .listen
        .map(|addr| ("admin.listen", addr))
        .into_iter()
        .chain(proxy_listeners.iter().copied())
        .find(|(_, addr)| !addr.ip().is_loopback());
    let why = match exposed {
        Some((field, addr)) => format!("{field} {addr} is not a loopback address"),
        None => "[[access.tokens]] are configured".to_owned(),
    };
    p.add(
        "admin.token",
        format!(
            "missing; {why}, so the admin API cannot trust a caller for being on loopback \
             (the forward proxy's tunnels and relays come from keyrelay's own loopback \
             address): set admin.token = \"${{KEYRELAY_ADMIN_TOKEN}}\" and give it to \
             `keyrelay ctl`"
        ),
    );
}

/// Whether a caller may be trusted for being on loopback: only while every listener is on
/// loopback and no tokens are configured, so that every caller is a user of this host. Once
/// others can send requests, one that keyrelay's forward proxy relays or tunnels arrives
/// from keyrelay's own loopback address.
pub(super) fn loopback_trusted(
    listen: SocketAddr,
    tls: Option<&Tls>,
    access: &Access,
    admin: &Admin,
) -> bool {
    access.tokens.is_empty()
        && std::iter::once(listen)
            .chain(tls.map(|tls| tls.listen))
            .chain(admin.listen)
            .all(|addr| addr.ip().is_loopback())
}

/// A secret field (`token = "..."`, `${VAR}` substituted), checked as keys are.
fn secret(
    p: &mut Problems,
    field: &str,
    raw: Option<Value>,
    env: &dyn Fn(&str) -> Option<String>,
    required: bool,
) -> Option<CallerToken> {
    let template = match raw {
        None => {
            if required {
                p.add(
                    field,
                    "missing; write token = \"...\" or token = \"${VAR}\"",
                );
            }
            return None;
        }
        Some(Value::String(template)) => template,
        Some(other) => {
            p.add(field, format!("must be a string, got {}", a_type(&other)));
            return None;
        }
    };
    let (value, vars) = substitute(p, field, &template, env)?;
    let token = CallerToken::new(value);
    if token.is_empty() {
        match vars.as_slice() {
            [] => p.add(field, "must not be empty"),
            vars => p.add(
                field,
                format!("is empty after substituting ${{{}}}", vars.join("}, ${")),
            ),
        }
        return None;
    }
    if token
        .expose()
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        p.add(field, "must not contain whitespace or control characters");
        return None;
    }
    Some(token)
}

fn tier_list(p: &mut Problems, field: &str, value: Value) -> Option<Vec<u32>> {
    let Value::Array(items) = value else {
        p.add(
            field,
            format!("must be an array of tiers, got {}", a_type(&value)),
        );
        return None;
    };
    let mut tiers = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Value::Integer(t) => match u32::try_from(t) {
                Ok(t) => tiers.push(t),
                Err(_) => p.add(
                    format!("{field}[{i}]"),
                    format!("must be 0 or more, got {t}"),
                ),
            },
            other => p.add(
                format!("{field}[{i}]"),
                format!("must be a tier number, got {}", a_type(&other)),
            ),
        }
    }
    Some(tiers)
}

fn at_least_one(p: &mut Problems, field: &str, value: Value) -> Option<u32> {
    match value {
        Value::Integer(n) if n >= 1 && n <= i64::from(u32::MAX) => u32::try_from(n).ok(),
        Value::Integer(n) => {
            p.add(field, format!("must be at least 1, got {n}"));
            None
        }
        other => {
            p.add(field, format!("must be an integer, got {}", a_type(&other)));
            None
        }
    }
}
