//! Final answers kept for repeated polls, by task, for `keep_answers` and at most
//! `keep_answers_max` of them (oldest dropped first), behind the narrow [`KeptAnswers`]
//! interface.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::captcha::{self, Answer, Reply, TaskId};
use crate::fast_map::FastMap;

/// What a final answer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The solution (and, for `get2`, its cost): what follows `OK|`.
    Solved(String),
    /// The code that ended the task (`ERROR_CAPTCHA_UNSOLVABLE`, say).
    Failed(String),
}

/// A task's final answer, as the service sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    /// The body, byte for byte: a poll in the same format gets exactly this.
    pub body: Bytes,
    /// Whether `body` is JSON (`json=1`) rather than plain text.
    pub json: bool,
    /// The answer read.
    pub verdict: Verdict,
    /// Whether it answered `get2` (solution and cost) rather than `get`.
    pub get2: bool,
}

impl Kept {
    /// The answer of a final poll: `None` if `body` is not a final answer (not ready, or
    /// nothing the API would send).
    pub fn of(body: Bytes, get2: bool) -> Option<Kept> {
        let verdict = match captcha::parse_reply(&body) {
            Reply::Ok(solution) => Verdict::Solved(solution),
            Reply::Error(code) => Verdict::Failed(code),
            _ => return None,
        };
        let json = body.trim_ascii_start().starts_with(b"{");
        Some(Kept {
            body,
            json,
            verdict,
            get2,
        })
    }

    /// The answer of one task in an `ids=` answer, `item`: a solution or an error code.
    pub fn of_item(item: &str) -> Kept {
        let item = item.trim();
        let failed = item
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case("ERROR"));
        let (verdict, body) = if failed {
            (Verdict::Failed(item.to_owned()), item.to_owned())
        } else {
            (Verdict::Solved(item.to_owned()), format!("OK|{item}"))
        };
        Kept {
            body: Bytes::from(body),
            json: false,
            verdict,
            get2: false,
        }
    }

    /// This answer as one item of an `ids=` answer.
    pub fn item(&self) -> String {
        match &self.verdict {
            Verdict::Solved(solution) | Verdict::Failed(solution) => solution.clone(),
        }
    }

    /// The answer for a poll in the caller's format: the body as kept when the formats
    /// agree, else the same verdict written in the caller's.
    pub fn answer(&self, json: bool) -> Answer {
        if json == self.json {
            return Answer {
                content_type: if json {
                    "application/json"
                } else {
                    "text/plain; charset=utf-8"
                },
                body: self.body.clone(),
            };
        }
        match &self.verdict {
            Verdict::Solved(solution) => captcha::ok_answer(solution, json),
            Verdict::Failed(code) => captcha::error_answer(code, "", json),
        }
    }
}

/// Where final answers are kept: this process's memory, or a store the replicas share.
pub trait KeptAnswers: Send + Sync + 'static {
    /// Keeps `task`'s final answer from `now`, dropping the oldest beyond `max` answers.
    fn keep(&self, task: TaskId, kept: Arc<Kept>, max: usize, now: Instant);
    /// `task`'s final answer, if kept less than `keep_for` ago.
    fn get(&self, task: &TaskId, keep_for: Duration, now: Instant) -> Option<Arc<Kept>>;
    /// Drops answers kept `keep_for` ago or longer.
    fn sweep(&self, keep_for: Duration, now: Instant);
    /// Answers kept now.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Answers in this process's memory.
#[derive(Default)]
pub struct MemoryKept {
    answers: FastMap<TaskId, (Arc<Kept>, Instant)>,
    /// Tasks in the order their answers were kept, to drop the oldest first. A task kept
    /// twice is here twice; the older entry is skipped when its turn comes.
    order: Mutex<VecDeque<(TaskId, Instant)>>,
}

impl MemoryKept {
    /// Drops the oldest answers while `drop` says so, given how many are kept and the
    /// oldest's time.
    fn drop_oldest(&self, drop: impl Fn(usize, Instant) -> bool) {
        let mut order = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((task, at)) = order.front() {
            if !drop(self.answers.len(), *at) {
                break;
            }
            self.answers
                .remove_if(task, |_, (_, kept_at)| kept_at == at);
            order.pop_front();
        }
    }
}

impl KeptAnswers for MemoryKept {
    fn keep(&self, task: TaskId, kept: Arc<Kept>, max: usize, now: Instant) {
        self.answers.insert(task.clone(), (kept, now));
        self.order
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back((task, now));
        self.drop_oldest(|len, _| len > max);
    }

    fn get(&self, task: &TaskId, keep_for: Duration, now: Instant) -> Option<Arc<Kept>> {
        let entry = self.answers.get(task)?;
        let (kept, at) = &*entry;
        (now.saturating_duration_since(*at) < keep_for).then(|| kept.clone())
    }

    fn sweep(&self, keep_for: Duration, now: Instant) {
        self.drop_oldest(|_, at| now.saturating_duration_since(at) >= keep_for);
    }

    fn len(&self) -> usize {
        self.answers.len()
    }
}
