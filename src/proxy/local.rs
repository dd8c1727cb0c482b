//! Every answer keyrelay makes itself, in one table: each [`Local`] variant has its code, its
//! outcome label and its text here and nowhere else, in the manner of linkerd2-proxy's
//! error-to-response mapping. `docs/failover.md` lists the same table, and a test holds the
//! two together.
//!
//! All of them go out with HTTP 200 in the caller's format, as the service answers its own
//! errors: clients read any other status as a network failure.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::capacity::Refusal;
use crate::captcha::{
    self, Answer, Conflict, RequestError, TaskId, MAX_TASK_ID_LEN, TASK_ID_PUNCTUATION,
};
use crate::metrics::{LocalCode, RequestOutcome};
use crate::polling::Kept;

/// An answer of keyrelay's own.
#[derive(Debug)]
pub(crate) enum Local {
    /// The body is larger than `limits.max_body`.
    BodyTooLarge { limit: usize },
    /// The body could not be read to its end (the caller broke off, say).
    BodyUnreadable,
    /// A request keyrelay cannot read with certainty, so does not forward.
    Unreadable(RequestError),
    /// A param keyrelay decides on (`action`, `id`, `ids`, a routing `method`) given two
    /// values, or `id` and `ids` together: never forwarded, nothing held or freed.
    ConflictingParams(Conflict),
    /// `res.php` without an `action`.
    EmptyAction,
    /// All upstream traffic is paused after an IP ban, until `until`.
    IpBanPause { until: Instant },
    /// No key is in rotation (or none was, when the request began).
    NoKeyInRotation { configured: usize },
    /// A submit of a `method` that no key's provider serves (`captcha::Profile`).
    MethodNotServed,
    /// Every key that could take a submit is full, and waiting for a thread was refused.
    PoolFull {
        refusal: Refusal,
        max_queued: usize,
        queue_timeout: Duration,
    },
    /// Every key tried is busy, and the busy answer was an HTTP status (429), not the
    /// service's own code, so it is turned into that code.
    AllBusy { code: &'static str },
    /// Every submit attempt failed upstream.
    AllAttemptsFailed { attempts: u32 },
    /// A submit got no answer after it may have reached the service (`error`), and
    /// `retry_unsure_submits` is off: sending it again could create a second task.
    SubmitMayHaveArrived { error: &'static str },
    /// A pool-wide action (pingbacks, actions keyrelay has no rule for) got no answer.
    NoUpstreamAnswer,
    /// A task action without an `id`.
    NoTaskId,
    /// An `id` that cannot be a task id; not echoed, as it may be megabytes.
    NotATaskId,
    /// No key of the pool owns the task; `remembered`: it was asked moments ago.
    UnknownTask { task: TaskId, remembered: bool },
    /// A task action keyrelay has no verdict for (see [`NoVerdict`]). For `get`/`get2` the
    /// honest answer is "not ready, as far as keyrelay knows": clients poll again and give up
    /// on their own timeout, where `ERROR_WRONG_CAPTCHA_ID` would make them drop a task that
    /// may exist. A report cannot be answered that way: "retry later".
    NoVerdict { why: NoVerdict, get: bool },
    /// A poll too soon after the submit, or after the last upstream poll of the task
    /// (`[polling]`): not ready, without asking the service.
    Shaped,
    /// A poll of a task whose final answer keyrelay kept (`[polling] keep_answers`).
    Kept(Arc<Kept>),
    /// `getbalance`: the pool's total, already formatted.
    Balance(String),
    /// `threadsinfo`: pool totals, always JSON as the service answers it.
    Threads(ThreadsAnswer),
    /// `get` with `ids=`, answered slot by slot; `asked`: at least one key was asked.
    Ids { items: Vec<String>, asked: bool },
    /// The handler panicked: a well-formed answer instead of a dropped connection.
    Panicked,
    /// The caller token's budget is spent (reserved and settled spend, or thread-hours, at
    /// its limit): the submit is not sent upstream.
    BudgetSpent { token: Arc<str> },
    /// Tokens are configured and the request presents none.
    NoToken,
    /// Tokens are configured and the request's `key` (or proxy credential) is none of them.
    WrongToken,
}

/// Why a task action has no verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoVerdict {
    /// The task's key did not answer after every retry.
    Unanswered,
    /// No key claimed an unpinned task, but not every key could answer.
    ProbeUnsure,
    /// An unpinned task, and the probe budget is spent.
    ProbeBudget,
    /// An unpinned task asked for with a token while the fleet puts its pins back: whose
    /// it is may be known in a moment.
    OwnerUnknown,
}

/// The `threadsinfo` answer, fields in the order the service's clients expect to read them.
#[derive(Debug, serde::Serialize)]
pub(crate) struct ThreadsAnswer {
    pub status: u8,
    pub threads: u64,
    pub working_threads: u64,
    pub free_threads: u64,
}

impl Local {
    /// The code the caller reads: the service's own, so clients act on it as they would on
    /// the service's answer.
    pub fn code(&self) -> LocalCode {
        match self {
            Local::BodyTooLarge { .. } => LocalCode::TooBig,
            Local::BodyUnreadable | Local::Unreadable(_) | Local::ConflictingParams(_) => {
                LocalCode::BadParameters
            }
            Local::EmptyAction => LocalCode::EmptyAction,
            Local::IpBanPause { .. } => LocalCode::IpBanned,
            Local::NoKeyInRotation { .. } | Local::PoolFull { .. } | Local::BudgetSpent { .. } => {
                LocalCode::ZeroBalance
            }
            Local::MethodNotServed => LocalCode::NoSuchMethod,
            Local::AllBusy { .. } => LocalCode::NoSlot,
            Local::AllAttemptsFailed { .. }
            | Local::SubmitMayHaveArrived { .. }
            | Local::NoUpstreamAnswer
            | Local::Panicked => LocalCode::ServerError,
            Local::NoTaskId | Local::NotATaskId | Local::UnknownTask { .. } => {
                LocalCode::WrongCaptchaId
            }
            Local::NoVerdict { get: true, .. } | Local::Shaped => LocalCode::NotReady,
            Local::NoVerdict { get: false, .. } => LocalCode::ServerError,
            Local::Balance(_) | Local::Threads(_) | Local::Ids { .. } | Local::Kept(_) => {
                LocalCode::Ok
            }
            Local::NoToken | Local::WrongToken => LocalCode::WrongUserKey,
        }
    }

    /// How the request ended, for `keyrelay_request_duration_seconds`.
    pub fn outcome(&self) -> RequestOutcome {
        match self {
            Local::BodyTooLarge { .. }
            | Local::BodyUnreadable
            | Local::Unreadable(_)
            | Local::ConflictingParams(_)
            | Local::EmptyAction
            | Local::NotATaskId
            | Local::MethodNotServed => RequestOutcome::BadRequest,
            Local::IpBanPause { .. } => RequestOutcome::IpBanned,
            Local::NoKeyInRotation { .. } => RequestOutcome::PoolExhausted,
            Local::PoolFull { .. } => RequestOutcome::PoolFull,
            Local::AllBusy { .. } => RequestOutcome::PoolBusy,
            Local::AllAttemptsFailed { .. }
            | Local::SubmitMayHaveArrived { .. }
            | Local::NoUpstreamAnswer => RequestOutcome::UpstreamFailed,
            Local::NoTaskId | Local::UnknownTask { .. } => RequestOutcome::UnknownTask,
            Local::NoVerdict { why, .. } => match why {
                NoVerdict::Unanswered | NoVerdict::ProbeUnsure => RequestOutcome::UpstreamFailed,
                NoVerdict::ProbeBudget => RequestOutcome::ProbeBudget,
                NoVerdict::OwnerUnknown => RequestOutcome::UnknownTask,
            },
            Local::Balance(_) | Local::Threads(_) | Local::Shaped | Local::Kept(_) => {
                RequestOutcome::Success
            }
            Local::Ids { asked: true, .. } => RequestOutcome::Success,
            Local::Ids { asked: false, .. } => RequestOutcome::UnknownTask,
            Local::Panicked => RequestOutcome::InternalError,
            Local::NoToken | Local::WrongToken => RequestOutcome::Denied,
            Local::BudgetSpent { .. } => RequestOutcome::BudgetSpent,
        }
    }

    /// The `error_text` of a JSON error answer: what happened and what to do.
    pub fn text(&self) -> Cow<'static, str> {
        match self {
            Local::BodyTooLarge { limit } => {
                format!("the request body exceeds keyrelay's limits.max_body of {limit} bytes")
                    .into()
            }
            Local::BodyUnreadable => "the request body could not be read".into(),
            Local::Unreadable(e) => e.to_string().into(),
            Local::ConflictingParams(conflict) => conflict.to_string().into(),
            Local::EmptyAction => "res.php needs an action parameter".into(),
            Local::IpBanPause { until } => {
                let left = until.saturating_duration_since(Instant::now()).as_secs() + 1;
                format!("the service banned keyrelay's IP; all upstream traffic is paused for {left} more seconds").into()
            }
            Local::NoKeyInRotation { configured } => {
                format!("keyrelay has no key in rotation ({configured} configured); retry later")
                    .into()
            }
            Local::MethodNotServed => {
                "no key of this pool is at a provider that serves this method".into()
            }
            Local::PoolFull {
                refusal,
                max_queued,
                queue_timeout,
            } => match refusal {
                Refusal::NoQueue => "every key's threads are in use; retry later".into(),
                Refusal::QueueFull => format!(
                    "every key's threads are in use and {max_queued} submits already wait; retry later"
                )
                .into(),
                Refusal::TimedOut => format!(
                    "every key's threads are in use; no thread came free within {}; retry later",
                    humantime::format_duration(*queue_timeout)
                )
                .into(),
            },
            Local::AllBusy { code } => {
                format!("every key tried is busy ({code}); retry later").into()
            }
            Local::AllAttemptsFailed { attempts } => {
                format!("all {attempts} attempts failed upstream; retry later").into()
            }
            Local::SubmitMayHaveArrived { error } => format!(
                "the upstream did not answer ({error}); the task may have been created, so keyrelay did not send it again"
            )
            .into(),
            Local::NoUpstreamAnswer => "the upstream did not answer; retry later".into(),
            Local::NoTaskId => "no task id given: pass id=<task id>".into(),
            Local::NotATaskId => {
                let punctuation = String::from_utf8_lossy(TASK_ID_PUNCTUATION);
                format!(
                    "not a task id: ids are at most {MAX_TASK_ID_LEN} ASCII letters, digits or any of {punctuation}"
                )
                .into()
            }
            Local::UnknownTask { task, remembered } => {
                let moments_ago = if *remembered {
                    " (asked moments ago)"
                } else {
                    ""
                };
                format!("no key of the pool owns task {task}{moments_ago}").into()
            }
            Local::NoVerdict { why, get } => {
                let why = match why {
                    NoVerdict::Unanswered => "the upstream did not answer this poll",
                    NoVerdict::ProbeUnsure => {
                        "no key claimed this task, but not every key could answer"
                    }
                    NoVerdict::ProbeBudget => {
                        "keyrelay has no pin for this task and its probe budget is spent"
                    }
                    NoVerdict::OwnerUnknown => {
                        "keyrelay cannot tell yet whose task this is while the fleet puts its pins back"
                    }
                };
                let then = if *get { "poll again" } else { "retry later" };
                format!("{why}; {then}").into()
            }
            Local::Shaped => {
                "keyrelay asked the service about this task moments ago; poll again in a few seconds"
                    .into()
            }
            Local::Balance(_) | Local::Threads(_) | Local::Ids { .. } | Local::Kept(_) => "".into(),
            Local::Panicked => "keyrelay failed to serve this request; retry".into(),
            Local::BudgetSpent { token } => format!(
                "the budget of token {token:?} is spent for its period; no new task is sent until its window has room"
            )
            .into(),
            Local::NoToken => {
                "keyrelay needs an access token: send it as the key parameter".into()
            }
            Local::WrongToken => "the key parameter is not a keyrelay access token".into(),
        }
    }

    /// The answer in the caller's format (`json`: the caller asked with `json=1`).
    pub fn answer(&self, json: bool) -> Answer {
        match self {
            Local::Balance(total) => captcha::value_answer(total, json),
            Local::Ids { items, .. } => captcha::ids_answer(items, json),
            Local::Kept(kept) => kept.answer(json),
            Local::Threads(figures) => Answer {
                content_type: "application/json",
                body: serde_json::to_vec(figures)
                    .expect("a struct of integers always serialises")
                    .into(),
            },
            // Nothing is known of the request any more, not even its format.
            Local::Panicked => captcha::error_answer(self.code().label(), "", false),
            _ => captcha::error_answer(self.code().label(), &self.text(), json),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One or more of every variant: the cases the table in docs/failover.md must list.
    fn examples() -> Vec<(&'static str, Local)> {
        let no_verdict = |why, get| Local::NoVerdict { why, get };
        vec![
            ("BodyTooLarge", Local::BodyTooLarge { limit: 1 << 20 }),
            ("BodyUnreadable", Local::BodyUnreadable),
            (
                "Unreadable",
                Local::Unreadable(RequestError::UnsupportedCharset("utf-16".into())),
            ),
            (
                "ConflictingParams",
                Local::ConflictingParams(Conflict::Values { name: "id" }),
            ),
            (
                "ConflictingParams",
                Local::ConflictingParams(Conflict::Both {
                    one: "id",
                    other: "ids",
                }),
            ),
            ("EmptyAction", Local::EmptyAction),
            (
                "IpBanPause",
                Local::IpBanPause {
                    until: Instant::now(),
                },
            ),
            ("NoKeyInRotation", Local::NoKeyInRotation { configured: 3 }),
            ("MethodNotServed", Local::MethodNotServed),
            (
                "PoolFull",
                Local::PoolFull {
                    refusal: Refusal::TimedOut,
                    max_queued: 1000,
                    queue_timeout: Duration::from_secs(5),
                },
            ),
            ("AllBusy", Local::AllBusy { code: "http_429" }),
            (
                "AllAttemptsFailed",
                Local::AllAttemptsFailed { attempts: 3 },
            ),
            (
                "SubmitMayHaveArrived",
                Local::SubmitMayHaveArrived { error: "timeout" },
            ),
            ("NoUpstreamAnswer", Local::NoUpstreamAnswer),
            ("NoTaskId", Local::NoTaskId),
            ("NotATaskId", Local::NotATaskId),
            (
                "UnknownTask",
                Local::UnknownTask {
                    task: TaskId::Num(7),
                    remembered: false,
                },
            ),
            ("NoVerdict", no_verdict(NoVerdict::Unanswered, true)),
            ("NoVerdict", no_verdict(NoVerdict::Unanswered, false)),
            ("NoVerdict", no_verdict(NoVerdict::ProbeUnsure, true)),
            ("NoVerdict", no_verdict(NoVerdict::OwnerUnknown, true)),
            ("NoVerdict", no_verdict(NoVerdict::ProbeBudget, true)),
            ("NoVerdict", no_verdict(NoVerdict::ProbeBudget, false)),
            ("Shaped", Local::Shaped),
            (
                "Kept",
                Local::Kept(Arc::new(crate::polling::Kept::of_item("abc"))),
            ),
            ("Balance", Local::Balance("1.5".into())),
            (
                "Threads",
                Local::Threads(ThreadsAnswer {
                    status: 1,
                    threads: 5,
                    working_threads: 1,
                    free_threads: 4,
                }),
            ),
            (
                "Ids",
                Local::Ids {
                    items: vec!["OK|x".into()],
                    asked: true,
                },
            ),
            (
                "Ids",
                Local::Ids {
                    items: vec!["ERROR_WRONG_CAPTCHA_ID".into()],
                    asked: false,
                },
            ),
            ("Panicked", Local::Panicked),
            (
                "BudgetSpent",
                Local::BudgetSpent {
                    token: Arc::from("client-a"),
                },
            ),
            ("NoToken", Local::NoToken),
            ("WrongToken", Local::WrongToken),
        ]
    }

    /// The name `examples` gives a variant; a new variant fails to compile here until it
    /// has a name, and then fails the tests below until it has an example and a doc row.
    fn name(local: &Local) -> &'static str {
        match local {
            Local::BodyTooLarge { .. } => "BodyTooLarge",
            Local::BodyUnreadable => "BodyUnreadable",
            Local::Unreadable(_) => "Unreadable",
            Local::ConflictingParams(_) => "ConflictingParams",
            Local::EmptyAction => "EmptyAction",
            Local::IpBanPause { .. } => "IpBanPause",
            Local::NoKeyInRotation { .. } => "NoKeyInRotation",
            Local::MethodNotServed => "MethodNotServed",
            Local::PoolFull { .. } => "PoolFull",
            Local::AllBusy { .. } => "AllBusy",
            Local::AllAttemptsFailed { .. } => "AllAttemptsFailed",
            Local::SubmitMayHaveArrived { .. } => "SubmitMayHaveArrived",
            Local::NoUpstreamAnswer => "NoUpstreamAnswer",
            Local::NoTaskId => "NoTaskId",
            Local::NotATaskId => "NotATaskId",
            Local::UnknownTask { .. } => "UnknownTask",
            Local::NoVerdict { .. } => "NoVerdict",
            Local::Shaped => "Shaped",
            Local::Kept(_) => "Kept",
            Local::Balance(_) => "Balance",
            Local::Threads(_) => "Threads",
            Local::Ids { .. } => "Ids",
            Local::Panicked => "Panicked",
            Local::BudgetSpent { .. } => "BudgetSpent",
            Local::NoToken => "NoToken",
            Local::WrongToken => "WrongToken",
        }
    }

    /// The values a cell lists: comma-separated, each with an optional `(note)`.
    fn listed(cell: &str) -> Vec<String> {
        let mut depth = 0;
        let bare: String = cell
            .chars()
            .filter(|c| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => return depth == 0,
                }
                false
            })
            .collect();
        bare.split(',').map(|v| v.trim().to_owned()).collect()
    }

    /// The rows of the local-answer table in docs/failover.md: variant, codes, outcomes.
    fn doc_rows() -> Vec<(String, Vec<String>, Vec<String>)> {
        let doc = include_str!("../../docs/failover.md");
        let section = doc
            .split("## Answers keyrelay makes itself")
            .nth(1)
            .expect("docs/failover.md has the local-answer table");
        section
            .lines()
            .skip_while(|l| !l.starts_with("| variant"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|row| {
                let cells: Vec<String> = row
                    .trim_matches('|')
                    .split(" | ")
                    .map(|c| c.trim().replace('`', ""))
                    .collect();
                assert!(
                    cells.len() >= 3,
                    "row {row:?} has variant, code and outcome"
                );
                (cells[0].clone(), listed(&cells[1]), listed(&cells[2]))
            })
            .collect()
    }

    #[test]
    fn the_doc_table_lists_every_answer_with_its_code_and_outcome() {
        let rows = doc_rows();
        for (named, local) in examples() {
            assert_eq!(name(&local), named);
            let (_, code, outcome) = rows
                .iter()
                .find(|(variant, _, _)| variant == named)
                .unwrap_or_else(|| panic!("docs/failover.md lists no row for {named}"));
            let (want_code, want_outcome) = (local.code().label(), local.outcome().label());
            assert!(
                code.iter().any(|c| c == want_code),
                "{named}: the doc's codes {code:?} lack {want_code}"
            );
            assert!(
                outcome.iter().any(|o| o == want_outcome),
                "{named}: the doc's outcomes {outcome:?} lack {want_outcome}"
            );
        }
        let named: Vec<&str> = examples().iter().map(|(n, _)| *n).collect();
        for (variant, _, _) in &rows {
            assert!(
                named.contains(&variant.as_str()),
                "docs/failover.md lists {variant}, which is no answer keyrelay makes"
            );
        }
    }

    #[test]
    fn every_code_and_outcome_in_the_table_is_one_an_example_gives() {
        // The converse of the test above: no code or outcome in a row that no case has.
        let examples = examples();
        for (variant, code, outcome) in doc_rows() {
            let cases: Vec<&Local> = examples
                .iter()
                .filter(|(n, _)| *n == variant)
                .map(|(_, l)| l)
                .collect();
            for listed in &code {
                assert!(
                    cases.iter().any(|l| l.code().label() == listed.as_str()),
                    "{variant}: the doc lists code {listed}, which no case answers"
                );
            }
            for listed in &outcome {
                assert!(
                    cases.iter().any(|l| l.outcome().label() == listed.as_str()),
                    "{variant}: the doc lists outcome {listed}, which no case has"
                );
            }
        }
    }

    #[test]
    fn error_answers_are_well_formed_in_both_formats() {
        for (named, local) in examples() {
            let code = local.code().label();
            let plain = local.answer(false);
            if let Local::Panicked = local {
                assert_eq!(
                    local.answer(true),
                    plain,
                    "the format is not known any more"
                );
                assert_eq!(plain.body, code.as_bytes());
                continue;
            }
            let json = local.answer(true);
            let json_value: serde_json::Value = serde_json::from_slice(&json.body)
                .unwrap_or_else(|e| panic!("{named}: JSON answer does not parse: {e}"));
            if code == "OK" {
                assert_eq!(json_value["status"], 1, "{named}");
                continue;
            }
            assert_eq!(
                plain.body,
                code.as_bytes(),
                "{named}: plain is the bare code"
            );
            assert_eq!(json_value["status"], 0, "{named}");
            assert_eq!(json_value["request"], code, "{named}");
            let text = json_value["error_text"].as_str().unwrap_or_default();
            assert!(!text.is_empty(), "{named}: an error says why");
        }
    }

    #[test]
    fn texts_carry_the_figures_that_explain_them() {
        assert!(Local::BodyTooLarge { limit: 123 }
            .text()
            .contains("123 bytes"));
        assert!(Local::AllAttemptsFailed { attempts: 4 }
            .text()
            .contains("all 4 attempts"));
        let full = Local::PoolFull {
            refusal: Refusal::QueueFull,
            max_queued: 77,
            queue_timeout: Duration::from_secs(5),
        };
        assert!(full.text().contains("77 submits already wait"));
        let timed_out = Local::PoolFull {
            refusal: Refusal::TimedOut,
            max_queued: 77,
            queue_timeout: Duration::from_secs(5),
        };
        assert!(timed_out.text().contains("within 5s"));
        let remembered = Local::UnknownTask {
            task: TaskId::Num(42),
            remembered: true,
        };
        assert_eq!(
            remembered.text(),
            "no key of the pool owns task 42 (asked moments ago)"
        );
        let get = Local::NoVerdict {
            why: NoVerdict::ProbeBudget,
            get: true,
        };
        assert!(get.text().ends_with("; poll again"));
        let report = Local::NoVerdict {
            why: NoVerdict::ProbeBudget,
            get: false,
        };
        assert!(report.text().ends_with("; retry later"));
    }
}
