//! `res.php` actions tied to a task (`get`, `get2`, `reportbad`, `reportgood`): each goes out
//! with the key that created the task, and `ids=` lists are split per key and re-joined.
//! Every request sent upstream names its action and its task or tasks once, canonically,
//! as keyrelay checked them ([`Checked`]): no other spelling of `action`, `id` or `ids` goes
//! with it, so the service answers about the task whose owner keyrelay checked, and a final
//! answer frees that task's thread and no other's.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::probe::{self, Probed};
use super::{Attempt, Checked, Ctx, Handled, Local, NoVerdict};
use crate::budgets::{self, Settle};
use crate::captcha::{self, BadTaskId, ParsedRequest, TaskAction, TaskCommand, TaskId};
use crate::failover::{self, Next};
use crate::log_limit::{Throttle, INTERVAL};
use crate::metrics::{LocalCode, RequestOutcome};
use crate::pins::SharedLookup;
use crate::polling::{Gate, Kept, Origin, SharedTurn, Verdict};
use crate::pool::KeyEntry;

// The codes an `ids=` slot answers with when keyrelay answers it itself.
const WRONG_ID: &str = LocalCode::WrongCaptchaId.label();
const NOT_READY: &str = LocalCode::NotReady.label();

// What a request about one task, or about a list, must not carry beside what it names.
const NO_IDS: &[&str] = &["ids"];
const NO_ID: &[&str] = &["id"];

pub(super) async fn poll(ctx: &Ctx, parsed: &ParsedRequest, task: TaskCommand<'_>) -> Handled {
    if let Some(paused) = ctx.paused() {
        return paused;
    }
    match task {
        // Boxed: the `ids=` form is rare, and its future, inline, would make every poll's
        // larger (see `admission::Admission::next`).
        TaskCommand::Many { ids } => Box::pin(poll_many(ctx, parsed, &ids)).await,
        TaskCommand::One { action, id } => poll_one(ctx, parsed, action, &id).await,
    }
}

async fn poll_one(ctx: &Ctx, parsed: &ParsedRequest, action: TaskAction, raw: &str) -> Handled {
    let started = Instant::now();
    let task = match TaskId::read(raw) {
        Ok(task) => task,
        Err(BadTaskId::Blank) => return Local::NoTaskId.into(),
        // Definite without asking anyone: no key can own what is not a task id.
        Err(_) => {
            probe::count(ctx, crate::metrics::ProbeResult::Invalid);
            return Local::NotATaskId.into();
        }
    };
    // The upstream gets the id as keyrelay reads it, so "0123" polls task 123 there too;
    // spelled so already (the usual case), it is sent as it came, with nothing allocated.
    let canonical = (!task.spelled_as(raw)).then(|| task.to_string());
    let set = [
        ("action", action.name()),
        ("id", canonical.as_deref().unwrap_or(raw)),
    ];
    let checked = Checked {
        set: &set,
        drop: NO_IDS,
    };
    let key = match owner(ctx, &task).await {
        Owner::Key(key) => Some(key),
        // Another token's task is answered as an unknown one: whether it exists is not
        // this caller's business.
        Owner::NotYours => {
            return Local::UnknownTask {
                task,
                remembered: false,
            }
            .into()
        }
        Owner::NoPin => None,
    };
    let Some(key) = key else {
        match unpinned_for_a_token(ctx) {
            Some(Unpinned::MaybeLater) => return no_verdict(action, NoVerdict::OwnerUnknown),
            Some(Unpinned::Never) => {
                return Local::UnknownTask {
                    task,
                    remembered: false,
                }
                .into()
            }
            None => {}
        }
        return match probe::probe(ctx, parsed, &task, checked).await {
            Probed::Owner {
                key,
                answer,
                outcome,
                ends_task,
            } => {
                // In a cluster the task may hold a thread its creator counts: whoever sees
                // the final answer gives it back, here as on a pinned poll.
                if action.polls() && ends_task {
                    ended(ctx, &task, action, Some(&answer.body));
                }
                Handled::relayed(answer, RequestOutcome::relayed(outcome), &key, 1)
            }
            Probed::Nobody { remembered } => Local::UnknownTask { task, remembered }.into(),
            Probed::Unsure => no_verdict(action, NoVerdict::ProbeUnsure),
            Probed::NoBudget => no_verdict(action, NoVerdict::ProbeBudget),
        };
    };
    if action.polls() {
        if let Some(local) = answered_locally(ctx, &task, action).await {
            return local.into();
        }
    }
    let (attempt, tries) = with_retries(ctx, &key, parsed, checked).await;
    let outcome = RequestOutcome::relayed(attempt.outcome());
    tracing::info!(
        action = action.name(),
        key = %key.name,
        task_id = %task,
        outcome = outcome.label(),
        latency_ms = started.elapsed().as_millis() as u64,
        "poll"
    );
    let ends = action.polls() && attempt.ends_task();
    match attempt.deliverable() {
        Some(answer) => {
            if ends {
                ended(ctx, &task, action, Some(&answer.body));
            }
            Handled::relayed(answer, outcome, &key, tries)
        }
        None => {
            if ends {
                ended(ctx, &task, action, None);
            }
            no_verdict(action, NoVerdict::Unanswered)
        }
    }
}

/// What keyrelay answers itself to a caller's poll of `task` (see `polling`): not ready
/// while it is too soon to ask the service again (here, or anywhere in the fleet), or the
/// final answer kept (by any replica). `None`: the poll goes upstream. Either way the poll
/// is counted.
async fn answered_locally(ctx: &Ctx, task: &TaskId, action: TaskAction) -> Option<Local> {
    let polling = &ctx.snapshot.config.polling;
    let fleet = polling.shapes() && ctx.app.shared_polls().shares();
    let local = match ctx.app.polling().gate(polling, task, Instant::now()) {
        Gate::Upstream if fleet => fleet_turn(ctx, task, action, true).await,
        Gate::Upstream => None,
        // Too soon here; but another replica may have kept the answer meanwhile.
        Gate::NotYet if fleet => fleet_turn(ctx, task, action, false).await,
        Gate::NotYet => Some(Local::Shaped),
        Gate::Kept(kept) => same_action(kept, action),
    };
    let metrics = ctx.app.metrics();
    match local {
        Some(_) => metrics.polls_locally.inc(),
        None => metrics.polls_upstream.inc(),
    }
    local
}

/// A kept answer for a poll of `action`. A `get2` wants the cost beside the solution,
/// which a kept `get` answer lacks: that poll asks the service, which still knows the task.
fn same_action(kept: Arc<Kept>, action: TaskAction) -> Option<Local> {
    (kept.get2 == (action == TaskAction::Get2)).then_some(Local::Kept(kept))
}

/// Where replicas share the pool, the fleet's word on a caller's poll: an answer another
/// replica kept (taken as this replica's own final answer); else, where this replica
/// would ask the service (`may_go`), whether another replica did within the interval.
async fn fleet_turn(ctx: &Ctx, task: &TaskId, action: TaskAction, may_go: bool) -> Option<Local> {
    let polling = &ctx.snapshot.config.polling;
    let interval = may_go.then_some(polling.interval);
    match ctx.app.shared_polls().turn(task, interval).await {
        SharedTurn::Go => None,
        SharedTurn::Wait => Some(Local::Shaped),
        SharedTurn::Kept(kept) => {
            // The task ended on another replica: a thread this one holds for it comes back,
            // and a caller token's reservation here is settled.
            settle(ctx, task, Some(&kept));
            let kept = Arc::new(kept);
            ctx.app
                .polling()
                .finished(polling, task, (*kept).clone(), Instant::now());
            same_action(kept, action)
        }
    }
}

/// An upstream poll of `task` (a `get` or `get2`, `action`) got its final answer, `body`
/// where it was delivered: see [`end`].
pub(super) fn ended(ctx: &Ctx, task: &TaskId, action: TaskAction, body: Option<&bytes::Bytes>) {
    let kept = body.and_then(|body| Kept::of(body.clone(), action == TaskAction::Get2));
    end(ctx, task, kept);
}

/// The one place a task ends: its thread comes back, its caller token's reservation is
/// settled, and its answer (where it could be read) is kept for the polls that may follow,
/// here and, where replicas share the pool, on every replica.
fn end(ctx: &Ctx, task: &TaskId, kept: Option<Kept>) {
    settle(ctx, task, kept.as_ref());
    let solved = kept
        .as_ref()
        .is_some_and(|kept| matches!(kept.verdict, Verdict::Solved(_)));
    let origin = match kept {
        Some(kept) => keep(ctx, task, kept),
        // Nothing to keep, but nothing to poll either: not even as an orphan.
        None => ctx.app.polling().forget(task),
    };
    // A task this process submitted and saw solved: its solve time, for `fastest`.
    if let (true, Some(origin)) = (solved, origin) {
        let now = Instant::now();
        let took = now.saturating_duration_since(origin.submitted);
        (ctx.snapshot.pool.solve_times()).record(origin.provider, &origin.method, took, now);
    }
}

/// Gives back the thread `task` held, and settles its caller token's reservation: at the
/// cost a `get2` answer reports, nothing for a task that was not solved, else as reserved.
fn settle(ctx: &Ctx, task: &TaskId, kept: Option<&Kept>) {
    ctx.app.finish_task(task);
    let how = match kept.map(|kept| (&kept.verdict, kept.get2)) {
        Some((Verdict::Failed(_), _)) => Settle::Free,
        Some((Verdict::Solved(solution), true)) => solution
            .rsplit_once('|')
            .and_then(|(_, cost)| cost.trim().parse().ok())
            .map_or(Settle::AsReserved, Settle::Cost),
        _ => Settle::AsReserved,
    };
    ctx.app.budgets().settle(task, how, budgets::now());
}

/// Keeps `task`'s final answer; where the task began, if this process created it.
fn keep(ctx: &Ctx, task: &TaskId, kept: Kept) -> Option<Origin> {
    let polling = &ctx.snapshot.config.polling;
    if polling.shapes() {
        ctx.app
            .shared_polls()
            .keep(task, &kept, polling.keep_answers);
    }
    ctx.app
        .polling()
        .finished(polling, task, kept, Instant::now())
}

/// Finishes every task of an `ids=` answer whose item is final, and keeps its answer.
fn finish_items(ctx: &Ctx, ids: &[&str], items: &[String]) {
    for (id, item) in ids.iter().zip(items) {
        if item != NOT_READY && item != "CAPTCHA_NOT_READY" {
            if let Some(task) = TaskId::parse(id) {
                end(ctx, &task, Some(Kept::of_item(item)));
            }
        }
    }
}

/// A task action keyrelay has no verdict for, because `why` ([`Local::NoVerdict`]).
fn no_verdict(action: TaskAction, why: NoVerdict) -> Handled {
    Local::NoVerdict {
        why,
        get: action.polls(),
    }
    .into()
}

/// Sends with the task's own key, retrying transient failures on that same key.
async fn with_retries(
    ctx: &Ctx,
    key: &Arc<KeyEntry>,
    parsed: &ParsedRequest,
    checked: Checked<'_>,
) -> (Attempt, u32) {
    let policy = ctx.policy();
    let mut rng = ctx.app.rng();
    let mut tries = 0;
    ctx.app.deposit_retry();
    loop {
        tries += 1;
        let attempt = ctx.attempt(key, parsed, checked).await;
        let (outcome, reason, reach) = (attempt.outcome(), attempt.reason(), attempt.reach());
        let decision = ctx.decide(key, outcome, &mut rng, |ejection| {
            failover::on_poll(outcome, reason, reach, policy, ejection)
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

/// What a caller with a token is told of a task with no pin. A probe would find the key
/// but not the token that created the task, and hand the task to whichever token asked
/// first; so with tokens no probe runs, and a task is answered only to the token its pin
/// names.
enum Unpinned {
    /// The fleet is putting its pins back (Redis lost them, or is away): the creating
    /// replica may yet say whose it is. No verdict: poll again.
    MaybeLater,
    /// Nobody can say whose it is any more: answered as an unknown task.
    Never,
}

/// `None` without tokens: then there are no owners, and the probe finds the key.
fn unpinned_for_a_token(ctx: &Ctx) -> Option<Unpinned> {
    ctx.token.as_ref()?;
    Some(if ctx.app.shared_pins().owners_may_return() {
        Unpinned::MaybeLater
    } else {
        Unpinned::Never
    })
}

/// Whose a task is, as far as this caller may know.
enum Owner {
    /// The key that created it, even if a reload has since taken it out of the pool.
    Key(Arc<KeyEntry>),
    /// Pinned for another caller token.
    NotYours,
    /// No pin (or one whose key is gone): the probe may find it.
    NoPin,
}

async fn owner(ctx: &Ctx, task: &TaskId) -> Owner {
    let pin = match ctx.app.pins().pinned(task, Instant::now()) {
        Some(pin) => pin,
        None => match shared_pin(ctx, task).await {
            Some(pin) => pin,
            None => return Owner::NoPin,
        },
    };
    if !pin.belongs_to(ctx.token.as_ref().map(|t| t.id)) {
        return Owner::NotYours;
    }
    ctx.app
        .registry()
        .get(pin.key)
        .map_or(Owner::NoPin, Owner::Key)
}

/// The pin another replica wrote, read from the shared copy before any probe and cached
/// here. Without one (or with the copy unreadable) the probe may still find the owner.
async fn shared_pin(ctx: &Ctx, task: &TaskId) -> Option<crate::pins::Pin> {
    match ctx.app.shared_pins().lookup(task).await {
        SharedLookup::Found(shared) => ctx.app.adopt_pin(task, &shared),
        SharedLookup::Missing => None,
        SharedLookup::Unreadable(error) => {
            tracing::warn!(task_id = %task, error = %error, "cannot read the shared pin; probing");
            None
        }
    }
}

/// What one slot of an `ids=` list answers, decided before anything goes to the owners.
#[derive(Clone)]
enum Slot {
    /// Asked of this key, with the other ids it owns.
    Key(Arc<KeyEntry>),
    /// Answered by keyrelay: `ERROR_WRONG_CAPTCHA_ID` when the id cannot be a task or no key
    /// owns it; `CAPCHA_NOT_READY` when there is no verdict yet (a probe that could not be
    /// sure, a spent probe budget, or an id past the probe limit) or it is too soon to ask
    /// the service again (`polling`).
    Local(&'static str),
    /// The task's final answer, kept from an earlier poll: its item.
    Kept(String),
}

/// `get` with `ids=a,b,c`: ids of one key go out together; the answers are re-joined in the
/// caller's order. Unknown ids are probed; see [`Slot`] for what answers in their slot.
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
    let mut slots: Vec<Option<Slot>> = Vec::with_capacity(tasks.len());
    for task in &tasks {
        slots.push(match task {
            None => Some(Slot::Local(WRONG_ID)),
            Some(task) => match owner(ctx, task).await {
                Owner::Key(key) => Some(Slot::Key(key)),
                Owner::NotYours => Some(Slot::Local(WRONG_ID)),
                Owner::NoPin => match unpinned_for_a_token(ctx) {
                    Some(Unpinned::MaybeLater) => Some(Slot::Local(NOT_READY)),
                    Some(Unpinned::Never) => Some(Slot::Local(WRONG_ID)),
                    None => None,
                },
            },
        });
    }
    let unknown = slots.iter().filter(|slot| slot.is_none()).count();
    // Ids without a pin are looked for across the pool, each distinct id once and a bounded
    // number per request; a found id is pinned and joins its key's group below, which asks
    // for it once more (one extra poll, the first time only). Ids past the bound get no
    // verdict: not ready, so the client polls again and they are looked for then.
    let mut distinct = HashSet::new();
    let probed: Vec<&TaskId> = slots
        .iter()
        .zip(&tasks)
        .filter(|(slot, _)| slot.is_none())
        .filter_map(|(_, task)| task.as_ref())
        .filter(|task| distinct.insert(*task))
        .take(probe::MAX_PROBED_IDS)
        .collect();
    let found = join_all(probed.iter().map(|task| async move {
        let spelled = task.to_string();
        let set = [("action", TaskAction::Get.name()), ("ids", &spelled)];
        let checked = Checked {
            set: &set,
            drop: NO_ID,
        };
        match probe::probe(ctx, parsed, task, checked).await {
            Probed::Owner { key, .. } => Slot::Key(key),
            Probed::Nobody { .. } => Slot::Local(WRONG_ID),
            Probed::Unsure | Probed::NoBudget => Slot::Local(NOT_READY),
        }
    }))
    .await;
    let found: HashMap<&TaskId, Slot> = probed.into_iter().zip(found).collect();
    for (slot, task) in slots.iter_mut().zip(&tasks) {
        if slot.is_none() {
            let verdict = task.as_ref().and_then(|task| found.get(task));
            *slot = Some(verdict.cloned().unwrap_or(Slot::Local(NOT_READY)));
        }
    }
    let mut slots: Vec<Slot> = slots.into_iter().flatten().collect();
    // Each task a key owns is shaped as a poll of it alone would be.
    for (slot, task) in slots.iter_mut().zip(&tasks) {
        if let (Slot::Key(_), Some(task)) = (&*slot, task) {
            match answered_locally(ctx, task, TaskAction::Get).await {
                None => {}
                Some(Local::Kept(kept)) => *slot = Slot::Kept(kept.item()),
                Some(_) => *slot = Slot::Local(NOT_READY),
            }
        }
    }

    // Groups in order of first appearance, so requests go out in a stable order.
    let mut groups: Vec<(Arc<KeyEntry>, Vec<usize>)> = Vec::new();
    for (index, slot) in slots.iter().enumerate() {
        let Slot::Key(key) = slot else { continue };
        match groups.iter_mut().find(|(k, _)| k.id == key.id) {
            Some((_, indexes)) => indexes.push(index),
            None => groups.push((key.clone(), vec![index])),
        }
    }
    let all_known = slots.iter().all(|slot| matches!(slot, Slot::Key(_)));
    if groups.len() == 1 && all_known {
        // One key owns them all: forward the whole list, as keyrelay read it, and pass the
        // answer through verbatim.
        let key = groups[0].0.clone();
        let list = spelled.join(",");
        let set = [("action", TaskAction::Get.name()), ("ids", &list)];
        let checked = Checked {
            set: &set,
            drop: NO_ID,
        };
        let (attempt, tries) = with_retries(ctx, &key, parsed, checked).await;
        let outcome = RequestOutcome::relayed(attempt.outcome());
        return match attempt.deliverable() {
            Some(answer) => {
                if let Some(items) = captcha::split_ids_reply(&answer.body, ids.len()) {
                    finish_items(ctx, &ids, &items);
                }
                Handled::relayed(answer, outcome, &key, tries)
            }
            None => no_verdict(TaskAction::Get, NoVerdict::Unanswered),
        };
    }

    let mut items: Vec<String> = slots
        .iter()
        .map(|slot| match slot {
            Slot::Local(code) => (*code).to_owned(),
            Slot::Kept(item) => item.clone(),
            Slot::Key(_) => NOT_READY.to_owned(),
        })
        .collect();
    let answers = join_all(groups.iter().map(|(key, slots)| {
        let joined = slots
            .iter()
            .map(|s| spelled[*s].as_str())
            .collect::<Vec<_>>()
            .join(",");
        async move {
            let set = [("action", TaskAction::Get.name()), ("ids", joined.as_str())];
            let checked = Checked {
                set: &set,
                drop: NO_ID,
            };
            let (attempt, _) = with_retries(ctx, key, parsed, checked).await;
            attempt
                .deliverable()
                .and_then(|answer| captcha::split_ids_reply(&answer.body, slots.len()))
        }
    }))
    .await;
    for ((key, slots), split) in groups.iter().zip(answers) {
        let Some(parts) = split else {
            static UNUSABLE: Throttle = Throttle::new(INTERVAL);
            if let Some(admitted) = UNUSABLE.admit() {
                tracing::warn!(key = %key.name, held_back = admitted.suppressed, "ids= answer unusable; its slots answered not ready (logged once a minute)");
            }
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
        unknown,
        latency_ms = started.elapsed().as_millis() as u64,
        "poll"
    );
    Local::Ids {
        items,
        asked: !groups.is_empty(),
    }
    .into()
}
