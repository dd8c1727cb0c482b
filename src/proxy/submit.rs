//! `in.php` and `solve.php`: a thread of a key for each attempt (waiting in the queue when every
//! key is full), failover across keys (at once, and past every key behind it, off a host:port
//! that refused the connection), and pinning of accepted tasks. Where a provider does not
//! serve every method, the submit's `method` picks the keys: it is then read strictly, and
//! each attempt sends that one value.

use std::borrow::Cow;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::time::Instant;

use super::{Answered, Attempt, Checked, Ctx, Handled, Local};
use crate::admission::{Admission, Ticket};
use crate::app::{App, Event};
use crate::capacity::{Refusal, Waited};
use crate::captcha::TaskId;
use crate::captcha::{Endpoint, Outcome, ParsedRequest, Reply};
use crate::failover::{self, Next};
use crate::log_limit::{Throttle, INTERVAL};
use crate::metrics::RequestOutcome;
use crate::pool::KeyEntry;

/// `failover::meaning_rank` of a "busy, retry later" answer.
const BUSY: u8 = 3;

/// The most meaningful failure seen so far, kept to answer the caller if every attempt fails.
struct Failure<'a> {
    rank: u8,
    attempt: Attempt,
    key: &'a KeyEntry,
}

pub(super) async fn submit(ctx: &Ctx, parsed: &ParsedRequest) -> Handled {
    let pool = &ctx.snapshot.pool;
    // Read only where it can matter: a pool of one provider that serves everything never
    // looks at it. Where it picks the keys, it is read strictly, before any thread is
    // taken, and goes upstream as it was checked.
    let method = match pool.restricts_methods().then(|| parsed.single("method")) {
        None => None,
        Some(Ok(method)) => method,
        Some(Err(conflict)) => return Local::ConflictingParams(conflict).into(),
    };
    let method_set = method.as_deref().map(|method| [("method", method)]);
    let checked = Checked {
        set: method_set.as_ref().map_or(&[], |set| &set[..]),
        drop: &[],
    };
    if let Some(paused) = ctx.paused() {
        return paused;
    }
    if let Some(spent) = budget_spent(ctx) {
        return spent;
    }
    let started = Instant::now();
    let policy = ctx.policy();
    let mut rng = ctx.app.rng();
    // The pick's own generator, seeded from this one: seeding from the thread's generator
    // twice per submit cost more than the pick.
    let pick_rng = SmallRng::from_rng(&mut rng);
    let candidates = pool
        .candidates(pick_rng, started)
        .for_method(method.as_deref());
    let token = ctx.token.as_deref();
    let mut admission = match Admission::begin(
        &ctx.app,
        pool,
        &ctx.snapshot.config,
        token,
        candidates,
        started,
    )
    .await
    {
        Ok(admission) => admission,
        Err(refusal) => return pool_full(ctx, refusal, None, 0, started),
    };
    let mut worst: Option<Failure<'_>> = None;
    let mut attempts = 0u32;
    let mut previous: Option<(&Arc<KeyEntry>, &'static str)> = None;

    while attempts < policy.max_attempts {
        let (key, ticket) = match admission.next().await {
            Waited::Got(admitted) => admitted,
            Waited::NoKey => break,
            Waited::Refused(refusal) => {
                return pool_full(ctx, refusal, worst, attempts, started);
            }
        };
        if attempts == 0 {
            ctx.app.deposit_retry();
        } else if !ctx.app.withdraw_retry() {
            // The budget is spent: retries are what would multiply traffic to a failing
            // upstream, so the caller gets the best failure so far instead.
            static SPENT: Throttle = Throttle::new(INTERVAL);
            if let Some(admitted) = SPENT.admit() {
                tracing::warn!(
                    attempts,
                    held_back = admitted.suppressed,
                    "retry budget spent; not retrying this submit (logged once a minute)"
                );
            }
            break;
        }
        if let Some((from, reason)) = previous.take() {
            if from.id != key.id {
                note_failover(&ctx.app, from, reason);
            }
        }
        attempts += 1;
        let attempt = ctx.attempt(key, parsed, checked).await;
        let (outcome, code, reach) = (attempt.outcome(), attempt.code(), attempt.reach());
        let reason = attempt.reason();
        ctx.app.metrics().count_submit(key, outcome);

        // A transport failure classifies as transient: the decision below counts it against
        // the key (and its provider), like a 5xx, and backs off, unless the connection was
        // refused, which moves the task off that host:port at once.
        let decision = ctx.decide(key, outcome, &mut rng, |ejection| {
            failover::on_submit(outcome, reason, reach, policy, ejection)
        });
        if let Attempt::Failed(error) = &attempt {
            static FAILED: Throttle = Throttle::new(INTERVAL);
            if let Some(admitted) = FAILED.admit_key(error.label()) {
                tracing::warn!(
                    key = %key.name,
                    error = %error,
                    held_back = admitted.suppressed,
                    "submit attempt failed (logged once a minute per kind of failure)"
                );
            }
            if error.may_have_arrived() && !policy.retry_unsure_submits {
                // The first attempt may already have created a task; a second would cost
                // another thread. The caller decides whether to submit again.
                let local = Local::SubmitMayHaveArrived {
                    error: error.label(),
                };
                log_submit(ctx, key, None, local.outcome(), attempts, started);
                return local.into();
            }
        }
        match (decision.next, attempt) {
            (Next::Answer, Attempt::Answered(answered)) => {
                let submitted = Submitted {
                    parsed,
                    method: method.as_deref(),
                };
                return answer(
                    ctx, submitted, key, admission, ticket, answered, attempts, started,
                )
                .await;
            }
            // No answer came to give: a failed exchange fails over whatever the policy says.
            (Next::Answer | Next::Failover, attempt) => {
                drop(ticket);
                previous = Some((key, code));
                keep_worst(&mut worst, attempt, key);
            }
            (Next::OtherUpstream, attempt) => {
                drop(ticket);
                // A lone key is not tried again either: its host:port is the one refusing.
                admission.shun_origin_of(key);
                previous = Some((key, code));
                keep_worst(&mut worst, attempt, key);
            }
            (Next::Backoff, attempt) => {
                // The thread is not held while backing off: another task may use it.
                drop(ticket);
                previous = Some((key, code));
                admission.may_retry(key);
                keep_worst(&mut worst, attempt, key);
                tokio::time::sleep(failover::backoff(attempts, policy, &mut rng)).await;
            }
        }
    }
    if attempts == 0 && method.as_deref().is_some_and(|m| !pool.serves_method(m)) {
        return Local::MethodNotServed.into();
    }
    exhausted(ctx, worst, attempts, started)
}

/// Every key that could take the task is full, and the wait for a thread was refused or
/// ran out. The answer is the one the official SDK treats as "all threads busy, wait and
/// resubmit", and keyrelay's `threadsinfo` says the same for a while after it.
fn pool_full(
    ctx: &Ctx,
    refusal: Refusal,
    worst: Option<Failure<'_>>,
    attempts: u32,
    started: Instant,
) -> Handled {
    ctx.app
        .metrics()
        .pool_full
        .with_label_values(&[refusal.label()])
        .inc();
    // Callers decide how often this happens: once a minute, with the count since.
    static FULL: Throttle = Throttle::new(INTERVAL);
    if let Some(admitted) = FULL.admit() {
        tracing::warn!(
            endpoint = ctx.endpoint.label(),
            reason = refusal.label(),
            attempts,
            queued = ctx.app.capacity().queued(),
            latency_ms = started.elapsed().as_millis() as u64,
            held_back = admitted.suppressed,
            "submit refused: every key's threads are in use (logged once a minute)"
        );
    }
    if let Some(busy) = worst.filter(|w| w.rank == BUSY) {
        return busy_answer(busy, attempts);
    }
    let limits = &ctx.snapshot.config.capacity;
    Local::PoolFull {
        refusal,
        max_queued: limits.max_queued,
        queue_timeout: limits.queue_timeout,
    }
    .into()
}

/// A caller token whose budget is spent gets no new task: `ERROR_ZERO_BALANCE`, the answer
/// every client stops on, before any thread is taken or anything goes upstream.
fn budget_spent(ctx: &Ctx) -> Option<Handled> {
    let token = ctx.token.as_deref()?;
    let budget = token.budget.as_ref()?;
    if ctx
        .app
        .budgets()
        .allows(&token.name, budget, crate::budgets::now())
    {
        return None;
    }
    Some(
        Local::BudgetSpent {
            token: token.name.clone(),
        }
        .into(),
    )
}

/// The caller's submit, and its `method` where the pick read it (strictly) already.
struct Submitted<'p> {
    parsed: &'p ParsedRequest,
    method: Option<&'p str>,
}

impl<'p> Submitted<'p> {
    /// The submit's `method`: as the pick read it, or read now, once per answer.
    fn method(&self) -> Option<Cow<'p, str>> {
        match self.method {
            Some(method) => Some(Cow::Borrowed(method)),
            None => self.parsed.param("method"),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn answer<'a, R: rand::Rng>(
    ctx: &'a Ctx,
    submitted: Submitted<'_>,
    key: &Arc<KeyEntry>,
    admission: Admission<'a, R>,
    ticket: Ticket<'a>,
    attempt: Answered,
    attempts: u32,
    started: Instant,
) -> Handled {
    let task_id = match (&attempt.reply, attempt.outcome, ctx.endpoint) {
        // solve.php answers the solution itself: there is no task to pin, and its thread
        // is given back with the answer.
        (Reply::Ok(id), Outcome::Success, Endpoint::In) => TaskId::parse(id),
        _ => None,
    };
    if let Some(id) = &task_id {
        // Not boxed, as the seat: the shared count's step is boxed by its store.
        // The first poll's delay, a token's price and the solve time follow the method.
        let method = submitted.method();
        admission.open(ticket, key, id, method.as_deref()).await;
        ctx.app.emit(|| Event::Pinned {
            key: key.name.clone(),
            task_id: id.to_string(),
        });
    } else if attempt.outcome == Outcome::Success && ctx.endpoint == Endpoint::In {
        tracing::warn!(key = %key.name, "accepted submit carried no task id; nothing pinned");
    } else if let (Some(token), Reply::Ok(_), Endpoint::Solve) =
        (ctx.token.as_deref(), &attempt.reply, ctx.endpoint)
    {
        // solve.php's task began and ended in this request: spent at once.
        let method = submitted.method();
        let price = (ctx.snapshot.config.prices)
            .per_task(key.provider, method.as_deref().unwrap_or(""))
            .unwrap_or(0.0);
        let now = crate::budgets::now();
        let held = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        ctx.app
            .budgets()
            .charge(&token.name, price, now.saturating_sub(held), now);
    }
    if attempt.outcome == Outcome::IpBanned {
        tracing::warn!(key = %key.name, code = attempt.code(), "the upstream bans keyrelay's IP; key health untouched");
    }
    let outcome = RequestOutcome::relayed(attempt.outcome);
    log_submit(ctx, key, task_id.as_ref(), outcome, attempts, started);
    Handled::relayed(attempt.answer, outcome, key, attempts)
}

fn keep_worst<'a>(worst: &mut Option<Failure<'a>>, attempt: Attempt, key: &'a KeyEntry) {
    let rank = failover::meaning_rank(attempt.outcome());
    if worst.as_ref().is_none_or(|w| rank >= w.rank) {
        *worst = Some(Failure { rank, attempt, key });
    }
}

/// Every attempt failed, or no key could be tried. Busy answers are passed on as the service
/// gave them (clients know to wait and resubmit); otherwise keyrelay says whether keys remain.
fn exhausted(ctx: &Ctx, worst: Option<Failure<'_>>, attempts: u32, started: Instant) -> Handled {
    let pool = &ctx.snapshot.pool;
    let now = Instant::now();
    // A token limited to some keys: whether any of those is left is what matters.
    let in_rotation = match ctx.token.as_deref().filter(|t| t.is_limited()) {
        None => pool.active_count(now),
        Some(token) => pool
            .keys()
            .iter()
            .filter(|k| token.may_use(k.id) && pool.in_rotation(k, now))
            .count(),
    };
    static EXHAUSTED: Throttle = Throttle::new(INTERVAL);
    if let Some(admitted) = EXHAUSTED.admit() {
        tracing::warn!(
            endpoint = ctx.endpoint.label(),
            attempts,
            in_rotation,
            latency_ms = started.elapsed().as_millis() as u64,
            held_back = admitted.suppressed,
            "submit failed on every key tried (logged once a minute)"
        );
    }
    if let Some(busy) = worst.filter(|w| w.rank == BUSY) {
        return busy_answer(busy, attempts);
    }
    // No attempt at all means no key was in rotation when the walk began, even if a
    // cooldown has ended since: say so, rather than report "0 attempts failed".
    if in_rotation == 0 || attempts == 0 {
        // With threadsinfo then reporting no free thread, the official SDK waits and resubmits.
        let configured = ctx.snapshot.pool.keys().len();
        return Local::NoKeyInRotation { configured }.into();
    }
    Local::AllAttemptsFailed { attempts }.into()
}

/// The upstream's own "busy" answer, relayed: clients know to wait and resubmit.
fn busy_answer(busy: Failure<'_>, attempts: u32) -> Handled {
    let code = busy.attempt.code();
    match busy.attempt {
        Attempt::Answered(Answered { answer, .. }) if answer.status.is_success() => {
            Handled::relayed(answer, RequestOutcome::PoolBusy, busy.key, attempts)
        }
        // A busy HTTP status (429) is turned into the service's own busy code.
        _ => Local::AllBusy { code }.into(),
    }
}

fn note_failover(app: &App, from: &KeyEntry, reason: &'static str) {
    app.metrics().failovers.with_label_values(&[reason]).inc();
    tracing::info!(key = %from.name, reason, "failing over to another key");
    app.emit(|| Event::Failover {
        key: from.name.clone(),
        reason,
    });
}

fn log_submit(
    ctx: &Ctx,
    key: &KeyEntry,
    task_id: Option<&TaskId>,
    outcome: RequestOutcome,
    attempts: u32,
    started: Instant,
) {
    tracing::info!(
        endpoint = ctx.endpoint.label(),
        key = %key.name,
        task_id = task_id.map(|t| t.to_string()).unwrap_or_default(),
        outcome = outcome.label(),
        attempts,
        latency_ms = started.elapsed().as_millis() as u64,
        "submit"
    );
}
