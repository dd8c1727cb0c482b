//! `[cluster]`: the Redis that several replicas share one pool through, this replica's
//! name, the prefix of every Redis key, and how quickly a silent replica or a slow Redis is
//! given up on.

use std::fmt;
use std::time::Duration;

use toml::Value;

use super::problems::{a_type, Problems};
use super::raw::RawCluster;
use super::units::{duration, Zero};

/// Default `replica_timeout`: a replica silent this long is dead and its leases go back.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_secs(15);
/// Default `timeout`: the most any one Redis call may hold a request.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(250);
/// Default `sync_interval`: how often shared health and readings are re-read, so that a
/// missed message costs at most this long.
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(500);
/// Default `prefix`.
pub const DEFAULT_PREFIX: &str = "keyrelay";

/// The validated `[cluster]` table.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// `redis://` or `rediss://` (or `redis+unix://`), password included: shown redacted.
    pub redis: RedisUrl,
    /// This replica's name, unique in the fleet; default: the host name.
    pub replica: String,
    /// Every Redis key keyrelay writes starts with `prefix:`.
    pub prefix: String,
    pub replica_timeout: Duration,
    /// Bound on each Redis call made on a request's behalf.
    pub timeout: Duration,
    pub sync_interval: Duration,
}

/// A Redis connection URL, which may carry a password: `Debug` and `Display` show it with
/// the user info masked.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    pub fn new(url: impl Into<String>) -> RedisUrl {
        RedisUrl(url.into())
    }

    /// The URL itself, password included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its user info (`user:password@`) and any `pass=` or `password=`
    /// query value (the unix-socket form's) replaced by `***`.
    pub fn redacted(&self) -> String {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return "<unparsable redis url>".to_owned();
        };
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        let authority_end = path.find('/').unwrap_or(path.len());
        let mut shown = match path[..authority_end].rfind('@') {
            Some(at) => format!("{scheme}://***@{}", &path[at + 1..]),
            None => format!("{scheme}://{path}"),
        };
        if let Some(query) = query {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if matches!(name, "pass" | "password") => format!("{name}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            shown.push('?');
            shown.push_str(&pairs.join("&"));
        }
        shown
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({})", self.redacted())
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

const SCHEMES: &[&str] = &["redis://", "rediss://", "redis+unix://", "unix://"];

pub(super) fn cluster(
    p: &mut Problems,
    raw: RawCluster,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<Cluster> {
    let redis = redis_url(p, raw.redis, env);
    let replica = match raw.replica {
        Some(name) => {
            if let Some(problem) = name_problem(&name) {
                p.add("cluster.replica", problem);
            }
            name
        }
        None => crate::host::name(64)
            .map(|host| host.chars().map(safe_char).collect())
            .unwrap_or_else(|| "keyrelay".to_owned()),
    };
    let prefix = raw.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
    if let Some(problem) = name_problem(&prefix) {
        p.add("cluster.prefix", problem);
    }
    let replica_timeout = duration(
        p,
        "cluster.replica_timeout",
        raw.replica_timeout,
        DEFAULT_REPLICA_TIMEOUT,
        Zero::Rejected,
    );
    if replica_timeout < Duration::from_secs(1) {
        p.add("cluster.replica_timeout", "must be at least 1s");
    }
    let timeout = duration(
        p,
        "cluster.timeout",
        raw.timeout,
        DEFAULT_REDIS_TIMEOUT,
        Zero::Rejected,
    );
    let sync_interval = duration(
        p,
        "cluster.sync_interval",
        raw.sync_interval,
        DEFAULT_SYNC_INTERVAL,
        Zero::Rejected,
    );
    if sync_interval > Duration::from_secs(1) {
        // A benched key must be out of rotation everywhere within a second even if the
        // message about it was missed.
        p.add("cluster.sync_interval", "must be at most 1s");
    }
    Some(Cluster {
        redis: redis?,
        replica,
        prefix,
        replica_timeout,
        timeout,
        sync_interval,
    })
}

fn redis_url(
    p: &mut Problems,
    raw: Option<Value>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<RedisUrl> {
    let template = match raw {
        None => {
            p.add(
                "cluster.redis",
                "missing; write redis = \"redis://127.0.0.1:6379/0\"",
            );
            return None;
        }
        Some(Value::String(template)) => template,
        Some(other) => {
            p.add(
                "cluster.redis",
                format!("must be a string, got {}", a_type(&other)),
            );
            return None;
        }
    };
    let (value, _) = super::keys::substitute(p, "cluster.redis", &template, env)?;
    let url = RedisUrl::new(value.trim());
    if !SCHEMES.iter().any(|s| url.expose().starts_with(s)) {
        p.add(
            "cluster.redis",
            format!(
                "{} must start with redis://, rediss:// or redis+unix://",
                url.redacted()
            ),
        );
        return None;
    }
    if let Err(e) = redis::Client::open(url.expose()) {
        // redis-rs names the problem, never the URL.
        p.add(
            "cluster.redis",
            format!(
                "{} is not a usable Redis URL: {}",
                url.redacted(),
                e.category()
            ),
        );
        return None;
    }
    Some(url)
}

/// Names that are safe inside a Redis key and a metric label.
fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".to_owned());
    }
    if name.len() > 64 {
        return Some(format!("must be at most 64 characters, got {}", name.len()));
    }
    if !name.chars().all(|c| safe_char(c) == c) {
        return Some("may only contain A-Z, a-z, 0-9, '.', '_' and '-'".to_owned());
    }
    None
}

fn safe_char(c: char) -> char {
    if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
        c
    } else {
        '-'
    }
}

#[cfg(test)]
mod tests {
    use super::RedisUrl;

    #[test]
    fn a_redis_url_never_shows_its_password() {
        for (url, shown) in [
            (
                "redis://:hunter2@10.0.0.5:6379/0",
                "redis://***@10.0.0.5:6379/0",
            ),
            (
                "rediss://kr:hunter2@redis.internal/1",
                "rediss://***@redis.internal/1",
            ),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=hunter2",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
            (
                "unix:///r.sock?password=hunter2",
                "unix:///r.sock?password=***",
            ),
        ] {
            let url = RedisUrl::new(url);
            assert_eq!(url.redacted(), shown);
            assert!(!format!("{url:?} {url}").contains("hunter2"));
        }
    }
}
