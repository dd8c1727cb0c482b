//! The Redis connection and every call on it: each bounded by `[cluster] timeout`, counted
//! as a round trip of its [`Op`], and judged, so that one that fails or times out puts this
//! replica in degraded mode. Knows the scripts only to load them again when Redis forgot
//! them; knows nothing of what the calls read or write.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::Value;

use super::membership::{ServiceReadings, Settle};
use super::scripts;
use super::{lock, Cluster};

/// A Redis operation, for error counts and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Acquire,
    Pin,
    Lookup,
    Release,
    Renew,
    Heartbeat,
    Health,
    Sync,
    Refresher,
    Pause,
    Poll,
}

impl Op {
    pub const ALL: &'static [Op] = &[
        Op::Acquire,
        Op::Pin,
        Op::Lookup,
        Op::Release,
        Op::Renew,
        Op::Heartbeat,
        Op::Health,
        Op::Sync,
        Op::Refresher,
        Op::Pause,
        Op::Poll,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Pin => "pin",
            Op::Lookup => "lookup",
            Op::Release => "release",
            Op::Renew => "renew",
            Op::Heartbeat => "heartbeat",
            Op::Health => "health",
            Op::Sync => "sync",
            Op::Refresher => "refresher",
            Op::Pause => "pause",
            Op::Poll => "poll",
        }
    }
}

/// Why a Redis call did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("redis {op} timed out after {after:?}")]
    Timeout { op: &'static str, after: Duration },
    #[error("redis {op} failed: {category}")]
    Redis { op: &'static str, category: String },
    #[error("redis is unavailable; serving on this replica's share")]
    Degraded,
    #[error("redis lost the fleet's state; serving on this replica's share until it is put back")]
    Stale,
}

impl Cluster {
    pub(super) fn mark_up(&self) {
        self.up.store(true, Ordering::Release);
        *lock(&self.down_reason) = None;
    }

    pub(super) fn mark_down(&self, op: Op, error: &ClusterError) {
        self.errors[op as usize].fetch_add(1, Ordering::Relaxed);
        let was_up = self.up.swap(false, Ordering::AcqRel);
        *lock(&self.settle) = Settle::Down;
        *lock(&self.down_reason) = Some(error.to_string());
        self.refresher.store(false, Ordering::Release);
        if was_up {
            // What the service said of the others before this outage is stale now.
            *lock(&self.readings) = ServiceReadings::default();
            tracing::warn!(op = op.label(), error = %error, "redis unavailable; serving on this replica's share of each key once the service's thread count is read");
        }
    }

    pub(super) async fn call<T: redis::FromRedisValue>(
        &self,
        op: Op,
        cmd: redis::Cmd,
    ) -> Result<T, ClusterError> {
        self.send(op, Query::Cmd(&cmd)).await
    }

    pub(super) async fn call_pipe<T: redis::FromRedisValue>(
        &self,
        op: Op,
        pipe: redis::Pipeline,
    ) -> Result<T, ClusterError> {
        self.send(op, Query::Pipe(&pipe)).await
    }

    /// One command or pipeline, bounded by the timeout, counted as a round trip of `op`.
    /// A Redis that forgot the scripts has them loaded again and the call retried once; a
    /// pipeline's other commands ran before the retry too, so each one keyrelay pipelines
    /// (SET, ZREM, PUBLISH, reads) may run twice.
    async fn send<T: redis::FromRedisValue>(
        &self,
        op: Op,
        query: Query<'_>,
    ) -> Result<T, ClusterError> {
        let mut conn = self.conn.clone();
        self.round_trips[op as usize].fetch_add(1, Ordering::Relaxed);
        let result = tokio::time::timeout(self.config.timeout, async {
            match query.run::<T>(&mut conn).await {
                Err(e) if forgot_scripts(&e) => {
                    self.load_scripts(op, &mut conn).await?;
                    query.run::<T>(&mut conn).await
                }
                other => other,
            }
        })
        .await;
        self.judge(op, result)
    }

    /// Loads every script again, in one round trip: Redis restarted or flushed its scripts.
    async fn load_scripts(&self, op: Op, conn: &mut ConnectionManager) -> redis::RedisResult<()> {
        self.round_trips[op as usize].fetch_add(2, Ordering::Relaxed);
        let mut pipe = redis::pipe();
        for script in scripts::ALL {
            pipe.add_command(script.load()).ignore();
        }
        pipe.query_async::<()>(conn).await
    }

    fn judge<T>(
        &self,
        op: Op,
        result: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> Result<T, ClusterError> {
        let error = match result {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => redis_error(op, &e),
            Err(_) => ClusterError::Timeout {
                op: op.label(),
                after: self.config.timeout,
            },
        };
        self.mark_down(op, &error);
        Err(error)
    }
}

/// A command or a pipeline, for [`Cluster::send`].
enum Query<'a> {
    Cmd(&'a redis::Cmd),
    Pipe(&'a redis::Pipeline),
}

impl Query<'_> {
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut ConnectionManager,
    ) -> redis::RedisResult<T> {
        match self {
            Query::Cmd(cmd) => cmd.query_async(conn).await,
            Query::Pipe(pipe) => pipe.query_async(conn).await,
        }
    }
}

/// Redis answered that it does not know a script's SHA1 (it restarted without its data, or
/// was told `SCRIPT FLUSH`).
fn forgot_scripts(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

pub(super) fn redis_error(op: Op, e: &redis::RedisError) -> ClusterError {
    // The category only: a connection error's text can quote the URL, password included.
    ClusterError::Redis {
        op: op.label(),
        category: e.category().to_owned(),
    }
}

pub(super) fn from_value<T: redis::FromRedisValue + Default>(value: Option<Value>) -> T {
    value
        .and_then(|v| redis::from_redis_value(v).ok())
        .unwrap_or_default()
}

/// Where and how to connect. TCP_NODELAY is set (redis-rs leaves Nagle on): a submit's
/// call is one small write, and with Nagle on, a call sent while another's segment waits
/// for its ACK would wait too, on every submit that overlaps another.
pub(super) fn connection_info(url: &str) -> Result<redis::ConnectionInfo, ClusterError> {
    use redis::IntoConnectionInfo;
    let info = url
        .into_connection_info()
        .map_err(|e| redis_error(Op::Heartbeat, &e))?;
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    Ok(info.set_tcp_settings(tcp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tests::cluster;

    #[tokio::test]
    async fn the_redis_connection_sends_each_call_at_once() {
        // Nagle would hold a call written while an earlier one is unacknowledged.
        let c = cluster("r0");
        assert!(c.client.get_connection_info().tcp_settings().nodelay());
        for url in [
            "redis://:secret@10.0.0.7:6380/2",
            "rediss://redis.internal/0",
        ] {
            let info = connection_info(url).expect("valid url");
            assert!(info.tcp_settings().nodelay(), "{url}");
            assert_eq!(
                info.redis_settings().db(),
                if url.ends_with("/2") { 2 } else { 0 },
                "the rest of the URL is kept: {url}"
            );
        }
    }

    #[test]
    fn redis_errors_never_quote_the_url() {
        let e =
            redis::RedisError::from((redis::ErrorKind::Io, "connect to redis://:hunter2@x failed"));
        let shown = redis_error(Op::Acquire, &e).to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
