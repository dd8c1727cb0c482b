//! Shaped polling across the fleet, in Redis: a task's turn (`SET NX PX interval`: the one
//! replica whose poll goes upstream in the interval) and its kept final answer (`SET PX
//! keep_answers`), read together in one round trip, only where a replica would otherwise
//! poll the service.

use std::sync::Arc;
use std::time::Duration;

use super::conn::Op;
use super::Cluster;
use crate::captcha::TaskId;
use crate::polling::{self, Kept, SharedPolls, SharedTurn, TurnFuture};

/// Redis keeps times in milliseconds; an interval below one still takes a turn.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl SharedPolls for Arc<Cluster> {
    fn shares(&self) -> bool {
        true
    }

    fn turn<'a>(&'a self, task: &'a TaskId, interval: Option<Duration>) -> TurnFuture<'a> {
        let mine = match interval {
            Some(_) => SharedTurn::Go,
            None => SharedTurn::Wait,
        };
        Box::pin(async move {
            if !self.is_up() {
                return mine;
            }
            let task = task.to_string();
            let mut pipe = redis::pipe();
            pipe.cmd("GET").arg(self.layout.kept(&task));
            if let Some(interval) = interval {
                pipe.cmd("SET")
                    .arg(self.layout.turn(&task))
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(millis(interval));
            } else {
                // The same shape of answer: a turn not asked for is not taken.
                pipe.cmd("ECHO").arg("");
            }
            match self
                .call_pipe::<(Option<Vec<u8>>, Option<String>)>(Op::Poll, pipe)
                .await
            {
                Ok((Some(kept), _)) => polling::decode(&kept).map_or(mine, SharedTurn::Kept),
                Ok((None, Some(taken))) if interval.is_some() && taken == "OK" => SharedTurn::Go,
                Ok((None, _)) => SharedTurn::Wait,
                // Each replica shapes on its own meanwhile.
                Err(_) => mine,
            }
        })
    }

    fn keep(&self, task: &TaskId, kept: &Kept, keep_for: Duration) {
        if !self.is_up() || keep_for.is_zero() {
            return;
        }
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.layout.kept(&task.to_string()))
            .arg(polling::encode(kept))
            .arg("PX")
            .arg(millis(keep_for));
        let this = self.clone();
        tokio::spawn(async move {
            let _ = this.call::<()>(Op::Poll, cmd).await;
        });
    }
}
