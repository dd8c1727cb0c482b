//! `res.php` actions tied to a task (`get`, `get2`, `reportbad`, `reportgood`): each goes out
//! with the key that created the task, and `ids=` lists are split per key and re-joined.

use std::sync::Arc;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::{probe, Attempt, Ctx, Handled};
use crate::captcha::{self, Outcome, ParsedRequest, Reply};
use crate::failover::{self, Next};
use crate::pins::{BadTaskId, TaskId, MAX_TASK_ID_LEN, TASK_ID_PUNCTUATION};
use crate::pool::KeyEntry;

const WRONG_ID: &str = "ERROR_WRONG_CAPTCHA_ID";
const NOT_READY: &str = "CAPCHA_NOT_READY";

pub(super) async fn poll(ctx: &Ctx, parsed: &ParsedRequest) -> Handled {
    if let Some(paused) = ctx.paused() {
        return paused;
    }
    let is_get = parsed.action().as_deref() == Some("get");
    match parsed
        .param("ids")
        .filter(|ids| is_get && !ids.trim().is_empty())
    {
        Some(ids) => poll_many(ctx, parsed, &ids).await,
        None => poll_one(ctx, parsed).await,
    }
}

async fn poll_one(ctx: &Ctx, parsed: &ParsedRequest) -> Handled {
    let started = Instant::now();
    let raw = parsed.param("id").unwrap_or_default();
    let task = match TaskId::read(&raw) {
        Ok(task) => task,
        Err(BadTaskId::Blank) => {
            return ctx.local_error(
                WRONG_ID,
                "no task id given: pass id=<task id>",
                "unknown_task",
            )
        }
        // Definite without asking anyone: no key can own what is not a task id. The id is
        // not echoed: it may be megabytes.
        Err(_) => {
            probe::count(ctx, "invalid");
            return ctx.local_error(WRONG_ID, &not_an_id(), "bad_request");
        }
    };
    // The upstream gets the id as keyrelay reads it, so "0123" polls task 123 there too.
    let canonical = (!task.spelled_as(&raw)).then(|| task.to_string());
    let respelled: Vec<(&str, &str)> = canonical.iter().map(|id| ("id", id.as_str())).collect();
    let Some(key) = owner(ctx, &task) else {
        return probe::probe(ctx, parsed, &task, &respelled)
            .await
            .into_handled(ctx, &task);
    };
    let (attempt, tries) = with_retries(ctx, &key, parsed, &respelled).await;
    let outcome = attempt.outcome.label();
    tracing::info!(
        action = parsed.action().as_deref().unwrap_or(""),
        key = %key.name,
        task_id = %task,
        outcome,
        latency_ms = started.elapsed().as_millis() as u64,
        "poll"
    );
    let is_get = matches!(parsed.action().as_deref(), Some("get" | "get2"));
    if is_get && is_final(&attempt) {
        ctx.app.finish_task(&task);
    }
    match attempt.deliverable() {
        Some(answer) => Handled::upstream(answer, outcome, &key, tries),
        None => unanswered(ctx, parsed),
    }
}

/// What an id that cannot be a task id is told.
fn not_an_id() -> String {
    let punctuation = String::from_utf8_lossy(TASK_ID_PUNCTUATION);
    format!(
        "not a task id: ids are at most {MAX_TASK_ID_LEN} ASCII letters, digits or any of {punctuation}"
    )
}

/// Whether a poll's answer ends its task: a solution, or a verdict on the task itself
/// (unsolvable, unknown id). "Not ready" and failures of the key or the service do not.
fn is_final(attempt: &Attempt) -> bool {
    match attempt.outcome {
        Outcome::Success => attempt.reply != Reply::NotReady,
        Outcome::CallerError => true,
        _ => false,
    }
}

/// Finishes every task of an `ids=` answer whose item is final.
fn finish_items(ctx: &Ctx, ids: &[&str], items: &[String]) {
    for (id, item) in ids.iter().zip(items) {
        if item != NOT_READY && item != "CAPTCHA_NOT_READY" {
            if let Some(task) = TaskId::parse(id) {
                ctx.app.finish_task(&task);
            }
        }
    }
}

/// A poll the upstream did not answer after every retry. For `get`/`get2` the honest answer
/// is "not ready (as far as keyrelay knows)": every client polls again, and gives up on its
/// own timeout if the outage lasts. A report cannot be answered that way.
fn unanswered(ctx: &Ctx, parsed: &ParsedRequest) -> Handled {
    match parsed.action().as_deref() {
        Some("get" | "get2") => ctx.local_error(
            NOT_READY,
            "the upstream did not answer this poll; poll again",
            "upstream_failed",
        ),
        _ => ctx.local_error(
            "ERROR_SERVER_ERROR",
            "the upstream did not answer; retry later",
            "upstream_failed",
        ),
    }
}

/// Sends with the task's own key, retrying transient failures on that same key.
async fn with_retries(
    ctx: &Ctx,
    key: &KeyEntry,
    parsed: &ParsedRequest,
    extra: &[(&str, &str)],
) -> (Attempt, u32) {
    let policy = ctx.policy();
    let mut rng = ctx.app.rng();
    let mut tries = 0;
    ctx.app.deposit_retry();
    loop {
        tries += 1;
        let attempt = ctx.attempt(key, parsed, extra).await;
        let decision = ctx.decide(key, attempt.outcome, &mut rng, |ejection| {
            failover::on_poll(attempt.outcome, attempt.code, policy, ejection)
        });
        if decision.next != Next::Backoff
            || tries >= policy.max_attempts
            || !ctx.app.withdraw_retry()
        {
            return (attempt, tries);
        }
        tokio::time::sleep(failover::backoff(tries, policy, &mut rng)).await;
    }
}

/// The key that created `task`, even if a reload has since taken it out of the pool.
fn owner(ctx: &Ctx, task: &TaskId) -> Option<Arc<KeyEntry>> {
    let id = ctx.app.pins().owner(task, Instant::now())?;
    ctx.app.registry().get(id)
}

/// `get` with `ids=a,b,c`: ids of one key go out together; the answers are re-joined in the
/// caller's order. Unknown ids answer `ERROR_WRONG_CAPTCHA_ID` in their slot.
async fn poll_many(ctx: &Ctx, parsed: &ParsedRequest, ids: &str) -> Handled {
    let started = Instant::now();
    let ids: Vec<&str> = ids
        .split(',')
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .collect();
    // Ids that cannot be task ids are answered in their slot and never go upstream; the
    // rest go out in their canonical spelling.
    let tasks: Vec<Option<TaskId>> = ids.iter().map(|raw| TaskId::parse(raw)).collect();
    let spelled: Vec<String> = ids
        .iter()
        .zip(&tasks)
        .map(|(raw, task)| match task {
            Some(task) if !task.spelled_as(raw) => task.to_string(),
            _ => (*raw).to_owned(),
        })
        .collect();
    let mut owners: Vec<Option<Arc<KeyEntry>>> = tasks
        .iter()
        .map(|task| task.as_ref().and_then(|task| owner(ctx, task)))
        .collect();
    // Ids without a pin are looked for across the pool, a bounded number per request; a
    // found id is pinned and joins its key's group below, which asks for it once more (one
    // extra poll, the first time only).
    let unknown: Vec<usize> = (0..ids.len())
        .filter(|slot| owners[*slot].is_none() && tasks[*slot].is_some())
        .take(probe::MAX_PROBED_IDS)
        .collect();
    let probes = join_all(unknown.iter().map(|slot| {
        let (task, id) = (&tasks[*slot], spelled[*slot].as_str());
        async move {
            let task = task.as_ref()?;
            match probe::probe(ctx, parsed, task, &[("ids", id)]).await {
                probe::Probed::Owner { key, .. } => Some(key),
                probe::Probed::Nobody { .. } => None,
            }
        }
    }))
    .await;
    for (slot, found) in unknown.into_iter().zip(probes) {
        owners[slot] = found;
    }

    // Groups in order of first appearance, so requests go out in a stable order.
    let mut groups: Vec<(Arc<KeyEntry>, Vec<usize>)> = Vec::new();
    for (slot, key) in owners.iter().enumerate() {
        let Some(key) = key else { continue };
        match groups.iter_mut().find(|(k, _)| k.id == key.id) {
            Some((_, slots)) => slots.push(slot),
            None => groups.push((key.clone(), vec![slot])),
        }
    }
    let all_known = owners.iter().all(Option::is_some);
    if groups.len() == 1 && all_known {
        // One key owns them all: forward as is (respelled if need be) and pass the answer
        // through verbatim.
        let key = groups[0].0.clone();
        let respelled = ids
            .iter()
            .zip(&spelled)
            .any(|(raw, spelled)| raw != spelled)
            .then(|| spelled.join(","));
        let extra: Vec<(&str, &str)> = respelled.iter().map(|l| ("ids", l.as_str())).collect();
        let (attempt, tries) = with_retries(ctx, &key, parsed, &extra).await;
        let outcome = attempt.outcome.label();
        return match attempt.deliverable() {
            Some(answer) => {
                if let Some(items) = captcha::split_ids_reply(&answer.body, ids.len()) {
                    finish_items(ctx, &ids, &items);
                }
                Handled::upstream(answer, outcome, &key, tries)
            }
            None => unanswered(ctx, parsed),
        };
    }

    let mut items: Vec<String> = vec![WRONG_ID.to_owned(); ids.len()];
    let answers = join_all(groups.iter().map(|(key, slots)| {
        let joined = slots
            .iter()
            .map(|s| spelled[*s].as_str())
            .collect::<Vec<_>>()
            .join(",");
        async move {
            let (attempt, _) = with_retries(ctx, key, parsed, &[("ids", &joined)]).await;
            attempt
                .deliverable()
                .and_then(|answer| captcha::split_ids_reply(&answer.body, slots.len()))
        }
    }))
    .await;
    for ((key, slots), split) in groups.iter().zip(answers) {
        let Some(parts) = split else {
            tracing::warn!(key = %key.name, "ids= answer unusable; its slots answered not ready");
            for slot in slots {
                items[*slot] = NOT_READY.to_owned();
            }
            continue;
        };
        let group_ids: Vec<&str> = slots.iter().map(|s| ids[*s]).collect();
        finish_items(ctx, &group_ids, &parts);
        for (slot, part) in slots.iter().zip(parts) {
            items[*slot] = part;
        }
    }
    tracing::info!(
        action = "get",
        ids = ids.len(),
        keys = groups.len(),
        unknown = owners.iter().filter(|o| o.is_none()).count(),
        latency_ms = started.elapsed().as_millis() as u64,
        "poll"
    );
    let outcome = if groups.is_empty() {
        "unknown_task"
    } else {
        "success"
    };
    Handled::local(captcha::ids_answer(&items, ctx.json), "OK", outcome)
}
