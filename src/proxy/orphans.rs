//! keyrelay's own polls of orphaned tasks: tasks this process created that nobody has
//! polled for `[polling] orphan_after`. Each goes out as a poll of its caller's would, with
//! the task's own key; its final answer frees the task's thread and is kept for a caller
//! who comes back (`polling`).

use bytes::Bytes;
use hyper::header::HeaderMap;
use hyper::Method;
use tokio::time::Instant;

use super::poll::ended;
use super::{Checked, Ctx};
use crate::app::App;
use crate::captcha::{Endpoint, ParsedRequest, TaskAction, TaskId};

/// Polls the orphan `task` once with its pinned key. A task whose pin is gone (expired, or
/// its key removed from every config since) cannot be asked about by anyone: its turn is
/// dropped, and the stale sweep frees its thread.
pub async fn poll_orphan(app: &App, task: &TaskId) {
    let snapshot = app.snapshot();
    let now = Instant::now();
    let polling = &snapshot.config.polling;
    let key = app
        .pins()
        .pinned(task, now)
        .and_then(|pin| app.registry().get(pin.key));
    let Some(key) = key else {
        app.polling().forget(task);
        return;
    };
    app.polling().orphan_polled(polling, task, now);
    let parsed = ParsedRequest::parse(Some("json=1"), None, Bytes::new())
        .expect("a fixed query always parses");
    let id = task.to_string();
    let set = [("action", TaskAction::Get.name()), ("id", id.as_str())];
    let checked = Checked {
        set: &set,
        drop: &["ids"],
    };
    let ctx = Ctx {
        app: app.clone(),
        snapshot,
        endpoint: Endpoint::Res,
        method: Method::GET,
        headers: HeaderMap::new(),
        token: None,
    };
    app.metrics().orphan_polls.inc();
    let attempt = ctx.attempt(&key, &parsed, checked).await;
    if !attempt.ends_task() {
        return;
    }
    let answer = attempt.deliverable();
    ended(
        &ctx,
        task,
        TaskAction::Get,
        answer.as_ref().map(|a| &a.body),
    );
    tracing::info!(key = %key.name, task_id = %task, "orphaned task polled to its final answer");
}
