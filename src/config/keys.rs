//! The key pool from `[[keys]]` and `keys_env`: `${VAR}` substitution, names, weights and
//! duplicate checks. Messages name keys by position and name, never by value.

use std::collections::HashMap;

use toml::Value;

use super::problems::{a_type, Problems};
use super::raw::RawKey;
use super::redact::{quoted, variable};
use super::{KeyConfig, Upstream, DEFAULT_TIER, DEFAULT_WEIGHT};
use crate::provider::Provider;
use crate::ApiKey;

/// Longest accepted key name; names become metric label values and log fields.
const MAX_NAME_LEN: usize = 64;

/// Far above any real pool; selection walks every key per pick, and key ids are 16-bit.
pub const MAX_KEYS: usize = 1000;

/// One pool entry on its way to a [`KeyConfig`]. `key` is `None` when it could not be
/// resolved; a problem has been recorded then, so no `Config` is built.
struct Entry {
    /// Where the entry came from: `keys[2]` or `keys_env[0]`.
    origin: String,
    /// The name the file gave, valid or not.
    given_name: Option<String>,
    key: Option<ApiKey>,
    weight: f64,
    threads: Option<u32>,
    tier: u32,
    provider: Provider,
    /// The key's own `upstream`, when it names one.
    upstream: Option<Upstream>,
}

impl Entry {
    /// `keys[0] ("client-a")`: the origin, and the name when there is one to show. A name
    /// that is not a valid one may be a key typed into the wrong field, so it is shown only
    /// as [`quoted`] allows.
    fn path(&self, name: Option<&str>) -> String {
        match name.or(self.given_name.as_deref()) {
            Some(name) if !name.is_empty() && name != self.origin => {
                let shown = match name_problem(name) {
                    None => format!("{name:?}"),
                    Some(_) => quoted(name),
                };
                format!("{} ({shown})", self.origin)
            }
            _ => self.origin.clone(),
        }
    }
}

/// The pool in order: `[[keys]]` entries, then the keys from `keys_env`'s variable.
pub(super) fn pool(
    p: &mut Problems,
    keys: Option<Value>,
    keys_env: Option<String>,
    upstream: &Upstream,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<KeyConfig> {
    let (mut entries, configured) = file_entries(p, keys, env);
    let env_state = env_entries(p, keys_env.as_deref(), env, &mut entries);
    if configured == 0 && entries.is_empty() {
        let mut message = "the pool is empty; add a [[keys]] entry or set keys_env".to_owned();
        match env_state {
            EnvKeys::NotConfigured | EnvKeys::Found => {}
            EnvKeys::Unset(var) => {
                message.push_str(&format!(
                    " (keys_env names {}, which is not set)",
                    variable(&var)
                ));
            }
            EnvKeys::Empty(var) => {
                message.push_str(&format!(
                    " (keys_env names {}, which holds no keys)",
                    variable(&var)
                ));
            }
        }
        p.add("keys", message);
    }
    if entries.len() > MAX_KEYS {
        p.add(
            "keys",
            format!(
                "the pool has {} keys; at most {MAX_KEYS} are supported",
                entries.len()
            ),
        );
    }
    let names = names(p, &entries);
    duplicate_keys(p, &entries, &names);
    entries
        .into_iter()
        .zip(names)
        .filter_map(|(entry, name)| {
            let upstream = entry
                .upstream
                .unwrap_or_else(|| provider_upstream(entry.provider, upstream));
            Some(KeyConfig {
                name,
                key: entry.key?,
                weight: entry.weight,
                threads: entry.threads,
                tier: entry.tier,
                provider: entry.provider,
                upstream,
            })
        })
        .collect()
}

/// The `[[keys]]` entries that could be read, and how many entries the file has in all
/// (so that a pool of broken entries is not also reported as empty).
fn file_entries(
    p: &mut Problems,
    keys: Option<Value>,
    env: &dyn Fn(&str) -> Option<String>,
) -> (Vec<Entry>, usize) {
    let items = match keys {
        None => return (Vec::new(), 0),
        Some(Value::Array(items)) => items,
        Some(other) => {
            p.add(
                "keys",
                format!(
                    "must be an array of tables ([[keys]] entries), got {}",
                    a_type(&other)
                ),
            );
            return (Vec::new(), 1);
        }
    };
    let configured = items.len();
    let mut entries = Vec::with_capacity(configured);
    for (index, item) in items.into_iter().enumerate() {
        let origin = format!("keys[{index}]");
        if !item.is_table() {
            p.add(
                &origin,
                format!("must be a table with key = \"...\", got {}", a_type(&item)),
            );
            continue;
        }
        // Every RawKey field is a raw Value, so this fails only on an unknown field; its
        // name could be a pasted key, so the message goes through `redact` too.
        let raw: RawKey = match item.try_into() {
            Ok(raw) => raw,
            Err(e) => {
                p.add(&origin, super::redact::safe(e.message()));
                continue;
            }
        };
        entries.push(file_entry(p, origin, raw, env));
    }
    (entries, configured)
}

fn file_entry(
    p: &mut Problems,
    origin: String,
    raw: RawKey,
    env: &dyn Fn(&str) -> Option<String>,
) -> Entry {
    let given_name = match raw.name {
        None => None,
        Some(Value::String(name)) => Some(name),
        Some(other) => {
            p.add(
                format!("{origin}.name"),
                format!("must be a string, got {}", a_type(&other)),
            );
            None
        }
    };
    let mut entry = Entry {
        origin,
        given_name,
        key: None,
        weight: DEFAULT_WEIGHT,
        threads: None,
        tier: DEFAULT_TIER,
        provider: Provider::default(),
        upstream: None,
    };
    let path = entry.path(None);
    entry.key = match raw.key {
        None => {
            p.add(
                format!("{path}.key"),
                "missing; write key = \"...\" or key = \"${VAR}\"",
            );
            None
        }
        Some(Value::String(template)) => resolve_key(p, &path, &template, env),
        Some(other) => {
            p.add(
                format!("{path}.key"),
                format!("must be a string, got {}", a_type(&other)),
            );
            None
        }
    };
    entry.weight = weight(p, &path, raw.weight);
    entry.threads = threads(p, &path, raw.threads);
    entry.tier = tier(p, &path, raw.tier);
    entry.provider = provider(p, &path, raw.provider);
    entry.upstream = key_upstream(p, &path, raw.upstream);
    entry
}

/// `provider = "..."`: one of the known services; CaptchaAI when absent.
fn provider(p: &mut Problems, path: &str, raw: Option<Value>) -> Provider {
    match raw {
        None => Provider::default(),
        Some(Value::String(name)) => Provider::from_name(&name).unwrap_or_else(|| {
            p.add(
                format!("{path}.provider"),
                format!(
                    "{} is not a known provider; use one of {}",
                    quoted(&name),
                    Provider::names()
                ),
            );
            Provider::default()
        }),
        Some(other) => {
            p.add(
                format!("{path}.provider"),
                format!("must be a string, got {}", a_type(&other)),
            );
            Provider::default()
        }
    }
}

/// A key's own `upstream = "https://..."`, checked as the global one is.
fn key_upstream(p: &mut Problems, path: &str, raw: Option<Value>) -> Option<Upstream> {
    match raw? {
        // The value itself is not repeated: a URL with user info would carry a password.
        Value::String(text) => Upstream::parse(&text)
            .map_err(|message| p.add(format!("{path}.upstream"), message))
            .ok(),
        other => {
            p.add(
                format!("{path}.upstream"),
                format!("must be a string, got {}", a_type(&other)),
            );
            None
        }
    }
}

/// Where a key without an `upstream` of its own sends its requests: the global `upstream`
/// for a CaptchaAI key (so today's files keep working, simulator tests included), its
/// provider's own host for any other.
fn provider_upstream(provider: Provider, global: &Upstream) -> Upstream {
    if provider == Provider::CaptchaAi {
        return global.clone();
    }
    Upstream::parse(provider.default_upstream()).expect("every provider's host is a valid URL")
}

/// What `keys_env` contributed, for the empty-pool message.
enum EnvKeys {
    NotConfigured,
    Unset(String),
    Empty(String),
    Found,
}

fn env_entries(
    p: &mut Problems,
    keys_env: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    entries: &mut Vec<Entry>,
) -> EnvKeys {
    let Some(var) = keys_env else {
        return EnvKeys::NotConfigured;
    };
    if !is_env_name(var) {
        p.add(
            "keys_env",
            format!(
                "{} is not an environment variable name (A-Z, a-z, 0-9 and '_')",
                quoted(var)
            ),
        );
        return EnvKeys::NotConfigured;
    }
    let Some(list) = env(var) else {
        return EnvKeys::Unset(var.to_owned());
    };
    let before = entries.len();
    let items = list.split(',').map(str::trim).filter(|k| !k.is_empty());
    for (index, key) in items.enumerate() {
        let origin = format!("keys_env[{index}]");
        let key = checked_key(p, &origin, ApiKey::new(key), &[]);
        entries.push(Entry {
            origin,
            given_name: None,
            key,
            weight: DEFAULT_WEIGHT,
            threads: None,
            tier: DEFAULT_TIER,
            provider: Provider::default(),
            upstream: None,
        });
    }
    if entries.len() == before {
        EnvKeys::Empty(var.to_owned())
    } else {
        EnvKeys::Found
    }
}

/// Substitutes every `${VAR}` in `template` and checks the result.
fn resolve_key(
    p: &mut Problems,
    path: &str,
    template: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<ApiKey> {
    let (value, vars) = substitute(p, &format!("{path}.key"), template, env)?;
    checked_key(p, path, ApiKey::new(value), &vars)
}

/// Substitutes every `${VAR}` in the secret `template` of `field`: the value and the
/// variables it used, or `None` after recording why not. No message quotes the template.
pub(super) fn substitute<'t>(
    p: &mut Problems,
    field: &str,
    template: &'t str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<(String, Vec<&'t str>)> {
    let mut value = String::with_capacity(template.len());
    let mut vars = Vec::new();
    let mut failed = false;
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        value.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            p.add(field, "\"${\" without a closing \"}\"");
            return None;
        };
        let var = &after[..end];
        // An invalid name is not echoed: it may be a piece of the key itself.
        if !is_env_name(var) {
            p.add(
                field,
                "\"${...}\" must hold an environment variable name (A-Z, a-z, 0-9 and '_')",
            );
            failed = true;
        } else if let Some(substitute) = env(var) {
            value.push_str(&substitute);
        } else {
            p.add(
                field,
                format!("environment variable {} is not set", variable(var)),
            );
            failed = true;
        }
        vars.push(var);
        rest = &after[end + 1..];
    }
    value.push_str(rest);
    (!failed).then_some((value, vars))
}

/// Refuses keys that cannot be what the user meant: empty, or with whitespace inside (an
/// environment file with two lines, a pasted sentence).
fn checked_key(p: &mut Problems, path: &str, key: ApiKey, vars: &[&str]) -> Option<ApiKey> {
    let field = format!("{path}.key");
    if key.is_empty() {
        match vars {
            [] => p.add(field, "must not be empty"),
            vars => p.add(
                field,
                format!("is empty after substituting ${{{}}}", vars.join("}, ${")),
            ),
        }
        return None;
    }
    if key
        .expose()
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        p.add(field, "must not contain whitespace or control characters");
        return None;
    }
    Some(key)
}

fn weight(p: &mut Problems, path: &str, raw: Option<Value>) -> f64 {
    let field = format!("{path}.weight");
    let weight = match raw {
        None => return DEFAULT_WEIGHT,
        Some(Value::Float(w)) => w,
        // Weights are relative shares, far below where i64 -> f64 loses precision.
        Some(Value::Integer(w)) => w as f64,
        Some(other) => {
            p.add(field, format!("must be a number, got {}", a_type(&other)));
            return DEFAULT_WEIGHT;
        }
    };
    if !weight.is_finite() {
        p.add(field, format!("must be a finite number, got {weight}"));
    } else if weight <= 0.0 {
        p.add(field, format!("must be > 0, got {weight}"));
    }
    weight
}

fn threads(p: &mut Problems, path: &str, raw: Option<Value>) -> Option<u32> {
    let field = format!("{path}.threads");
    match raw {
        None => None,
        Some(Value::Integer(n)) if n < 1 => {
            p.add(field, format!("must be >= 1, got {n}"));
            None
        }
        Some(Value::Integer(n)) => match u32::try_from(n) {
            Ok(n) => Some(n),
            Err(_) => {
                p.add(field, format!("must be at most {}, got {n}", u32::MAX));
                None
            }
        },
        Some(other) => {
            p.add(
                field,
                format!("must be a whole number, got {}", a_type(&other)),
            );
            None
        }
    }
}

fn tier(p: &mut Problems, path: &str, raw: Option<Value>) -> u32 {
    let field = format!("{path}.tier");
    match raw {
        None => DEFAULT_TIER,
        Some(Value::Integer(n)) => u32::try_from(n).unwrap_or_else(|_| {
            p.add(
                field,
                format!("must be between 0 and {}, got {n}", u32::MAX),
            );
            DEFAULT_TIER
        }),
        Some(other) => {
            p.add(
                field,
                format!("must be a whole number, got {}", a_type(&other)),
            );
            DEFAULT_TIER
        }
    }
}

/// Final names, one per entry. Given names are checked and must be unique. Entries without
/// one take the key's first eight characters when that is a valid name not used yet, and
/// `keys[N]` (their position in the pool) otherwise: keys that share a prefix, such as the
/// simulator's, must not make a `keys_env` list unusable.
fn names(p: &mut Problems, entries: &[Entry]) -> Vec<String> {
    let mut taken: HashMap<&str, &str> = HashMap::new();
    for entry in entries {
        let Some(name) = entry.given_name.as_deref() else {
            continue;
        };
        let field = format!("{}.name", entry.path(None));
        if let Some(problem) = name_problem(name) {
            p.add(field, problem);
        } else if let Some(first) = taken.get(name) {
            p.add(field, format!("duplicate name, {first} has it too"));
        } else {
            taken.insert(name, &entry.origin);
        }
    }
    let mut derived: Vec<String> = Vec::new();
    let mut names = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let name = match &entry.given_name {
            Some(name) => name.clone(),
            None => {
                let name = entry
                    .key
                    .as_ref()
                    .and_then(ApiKey::default_name)
                    .filter(|n| name_problem(n).is_none())
                    .filter(|n| !taken.contains_key(n.as_str()) && !derived.contains(n))
                    .unwrap_or_else(|| format!("keys[{index}]"));
                derived.push(name.clone());
                name
            }
        };
        names.push(name);
    }
    names
}

pub(super) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".to_owned());
    }
    let len = name.chars().count();
    if len > MAX_NAME_LEN {
        return Some(format!(
            "must be at most {MAX_NAME_LEN} characters, got {len}"
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !name.chars().all(allowed) {
        return Some("may only contain A-Z, a-z, 0-9, '.', '_' and '-'".to_owned());
    }
    None
}

/// The same key under two names would double its share and split its health; both are
/// named in the message, the key is not.
fn duplicate_keys(p: &mut Problems, entries: &[Entry], names: &[String]) {
    let mut seen: HashMap<&str, String> = HashMap::new();
    for (entry, name) in entries.iter().zip(names) {
        let Some(key) = &entry.key else {
            continue;
        };
        let path = entry.path(Some(name));
        match seen.get(key.expose()) {
            Some(first) => p.add(format!("{path}.key"), format!("same key as {first}")),
            None => {
                seen.insert(key.expose(), path);
            }
        }
    }
}

/// POSIX-style variable names; anything else is more likely a typo or a pasted key.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
