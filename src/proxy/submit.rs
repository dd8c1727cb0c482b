//! `in.php` and `solve.php`: weighted failover across keys, and pinning of accepted tasks.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Attempt, Ctx, Handled};
use crate::app::{App, Event};
use crate::captcha::{Endpoint, Outcome, ParsedRequest, Reply};
use crate::failover::{self, Next};
use crate::health::HealthEvent;
use crate::pins::TaskId;
use crate::pool::KeyEntry;
use crate::refresh;

/// The most meaningful failure seen so far, kept to answer the caller if every attempt fails.
struct Failure<'a> {
    rank: u8,
    attempt: Attempt,
    key: &'a KeyEntry,
}

pub(super) async fn submit(ctx: &Ctx, parsed: &ParsedRequest) -> Handled {
    if let Some(paused) = ctx.paused() {
        return paused;
    }
    let started = Instant::now();
    let policy = ctx.policy();
    let pool = &ctx.snapshot.pool;
    let mut rng = ctx.app.rng();
    let mut candidates = pool.candidates(ctx.app.rng(), started);
    let mut worst: Option<Failure<'_>> = None;
    let mut attempts = 0u32;
    let mut previous: Option<(&Arc<KeyEntry>, &'static str)> = None;
    // After a transient failure with no other key left to try, the same key is tried again:
    // a lone key must still get its retries.
    let mut retry_same: Option<&Arc<KeyEntry>> = None;

    while attempts < policy.max_attempts {
        candidates.at(Instant::now());
        let now = Instant::now();
        let Some(key) = candidates
            .next()
            .or_else(|| retry_same.take().filter(|k| pool.in_rotation(k, now)))
        else {
            break;
        };
        if attempts == 0 {
            ctx.app.deposit_retry();
        } else if !ctx.app.withdraw_retry() {
            // The budget is spent: retries are what would multiply traffic to a failing
            // upstream, so the caller gets the best failure so far instead.
            tracing::warn!(attempts, "retry budget spent; not retrying this submit");
            break;
        }
        if let Some((from, reason)) = previous.take() {
            if from.id != key.id {
                note_failover(&ctx.app, from, reason);
            }
        }
        retry_same = None;
        attempts += 1;
        let attempt = ctx.attempt(key, parsed, &[]).await;
        ctx.app.metrics().count_submit(&key.name, attempt.outcome);

        // A transport failure classifies as transient: the decision below counts it against
        // the key and backs off, like a 5xx.
        let decision = ctx.decide(key, attempt.outcome, &mut rng, |ejection| {
            failover::on_submit(attempt.outcome, attempt.code, policy, ejection)
        });
        if let Err(error) = &attempt.result {
            tracing::warn!(key = %key.name, error = %error, "submit attempt failed");
            if error.may_have_arrived() && !policy.retry_unsure_submits {
                // The first attempt may already have created a task; a second would cost
                // another thread. The caller decides whether to submit again.
                let text = format!(
                    "the upstream did not answer ({}); the task may have been created, so keyrelay did not send it again",
                    error.label()
                );
                log_submit(ctx, key, None, "upstream_unsure", attempts, started);
                return ctx.local_error("ERROR_SERVER_ERROR", &text, "upstream_failed");
            }
        }
        if decision.check_threads {
            tokio::spawn(settle_zero_balance(ctx.app.clone(), key.clone()));
        }
        match decision.next {
            Next::Answer => return answer(ctx, key, attempt, attempts, started),
            Next::Failover => {
                previous = Some((key, attempt.code));
                keep_worst(&mut worst, attempt, key);
            }
            Next::Backoff => {
                previous = Some((key, attempt.code));
                retry_same = Some(key);
                keep_worst(&mut worst, attempt, key);
                tokio::time::sleep(failover::backoff(attempts, policy, &mut rng)).await;
            }
        }
    }
    exhausted(ctx, worst, attempts, started)
}

fn answer(ctx: &Ctx, key: &KeyEntry, attempt: Attempt, attempts: u32, started: Instant) -> Handled {
    let task_id = match (&attempt.reply, attempt.outcome, ctx.endpoint) {
        // solve.php answers the solution itself: there is no task to pin.
        (Reply::Ok(id), Outcome::Success, Endpoint::In) => TaskId::parse(id),
        _ => None,
    };
    if let Some(id) = &task_id {
        ctx.app.pins().pin(id.clone(), key.id, Instant::now());
        ctx.app.emit(Event::Pinned {
            key: key.name.clone(),
            task_id: id.to_string(),
        });
    } else if attempt.outcome == Outcome::Success && ctx.endpoint == Endpoint::In {
        tracing::warn!(key = %key.name, "accepted submit carried no task id; nothing pinned");
    }
    if attempt.outcome == Outcome::IpBanned {
        tracing::warn!(key = %key.name, code = attempt.code, "the upstream bans keyrelay's IP; key health untouched");
    }
    let outcome = attempt.outcome.label();
    log_submit(ctx, key, task_id.as_ref(), outcome, attempts, started);
    let answer = attempt
        .result
        .expect("only answered attempts reach a decision");
    Handled::upstream(answer, outcome, key, attempts)
}

fn keep_worst<'a>(worst: &mut Option<Failure<'a>>, attempt: Attempt, key: &'a KeyEntry) {
    let rank = failover::meaning_rank(attempt.outcome);
    if worst.as_ref().is_none_or(|w| rank >= w.rank) {
        *worst = Some(Failure { rank, attempt, key });
    }
}

/// Every attempt failed, or no key could be tried. Busy answers are passed on as the service
/// gave them (clients know to wait and resubmit); otherwise keyrelay says whether keys remain.
fn exhausted(ctx: &Ctx, worst: Option<Failure<'_>>, attempts: u32, started: Instant) -> Handled {
    let in_rotation = ctx.snapshot.pool.active_count(Instant::now());
    tracing::warn!(
        endpoint = ctx.endpoint.label(),
        attempts,
        in_rotation,
        latency_ms = started.elapsed().as_millis() as u64,
        "submit failed on every key tried"
    );
    if let Some(Failure {
        rank: 3,
        attempt,
        key,
    }) = worst
    {
        let code = attempt.code;
        return match attempt.result {
            Ok(answer) if answer.status.is_success() => {
                Handled::upstream(answer, "pool_busy", key, attempts)
            }
            // A busy HTTP status (429) is turned into the service's own busy code.
            _ => {
                let text = format!("every key tried is busy ({code}); retry later");
                ctx.local_error("ERROR_NO_SLOT_AVAILABLE", &text, "pool_busy")
            }
        };
    }
    // No attempt at all means no key was in rotation when the walk began, even if a
    // cooldown has ended since: say so, rather than report "0 attempts failed".
    if in_rotation == 0 || attempts == 0 {
        // With threadsinfo then reporting no free thread, the official SDK waits and resubmits.
        let text = format!(
            "keyrelay has no key in rotation ({} configured); retry later",
            ctx.snapshot.pool.keys().len()
        );
        return ctx.local_error("ERROR_ZERO_BALANCE", &text, "pool_exhausted");
    }
    let text = format!("all {attempts} attempts failed upstream; retry later");
    ctx.local_error("ERROR_SERVER_ERROR", &text, "upstream_failed")
}

fn note_failover(app: &App, from: &KeyEntry, reason: &'static str) {
    app.metrics().failovers.with_label_values(&[reason]).inc();
    tracing::info!(key = %from.name, reason, "failing over to another key");
    app.emit(Event::Failover {
        key: from.name.clone(),
        reason,
    });
}

fn log_submit(
    ctx: &Ctx,
    key: &KeyEntry,
    task_id: Option<&TaskId>,
    outcome: &'static str,
    attempts: u32,
    started: Instant,
) {
    tracing::info!(
        endpoint = ctx.endpoint.label(),
        key = %key.name,
        task_id = task_id.map(|t| t.to_string()).unwrap_or_default(),
        outcome,
        attempts,
        latency_ms = started.elapsed().as_millis() as u64,
        "submit"
    );
}

/// `ERROR_ZERO_BALANCE` means either "no plan or balance" or "no free thread right now".
/// The key's `threadsinfo` tells which: all threads working means full (a short cooldown),
/// anything else means benched until a refresh sees the key usable.
async fn settle_zero_balance(app: App, key: Arc<KeyEntry>) {
    let snapshot = app.snapshot();
    let policy = &snapshot.config.failover;
    let info = refresh::read_threads(&app, &key, snapshot.config.timeouts.refresh).await;
    let event = match info {
        Ok(info) if info.threads > 0 && info.working_threads >= info.threads => {
            key.stats
                .set_threads(Some((info.threads, info.working_threads)));
            HealthEvent::Cool {
                reason: "ERROR_ZERO_BALANCE",
                duration: policy.busy_cooldown,
            }
        }
        _ => HealthEvent::Bench {
            reason: "ERROR_ZERO_BALANCE",
        },
    };
    app.record_health(&key, event);
}
