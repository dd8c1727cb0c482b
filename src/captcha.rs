//! The CaptchaAI (2captcha-compatible) wire protocol, pure: no I/O, no state, no keys held.
//!
//! The proxy calls this module to parse a caller's request ([`ParsedRequest`]), read what a
//! `res.php` request asks for ([`ResCommand`], each decision param read as one value or
//! refused), rewrite it for the upstream with a pool key and those values
//! ([`ParsedRequest::rewrite`]), parse and classify what the upstream answered
//! ([`parse_reply`], [`classify`]), and build the answers keyrelay makes itself
//! ([`error_answer`] and friends).
//!
//! Protocol facts this module relies on (`docs/captcha-api.md` in the shared notes):
//! - Parameters come from the query string and the body together, like PHP's `$_REQUEST`:
//!   a body value wins over a query value of the same name. Bodies are urlencoded, multipart
//!   (file uploads in a part named `file`), or JSON (sometimes labelled `text/plain`).
//! - A success is `OK|<id or answer>`, or `{"status":1,"request":...}` with `json=1`, where
//!   `request` may be a JSON integer.
//! - "Not ready yet" is spelled `CAPCHA_NOT_READY` (sic).
//! - API errors come with HTTP 200 and the code in the body, and the service sometimes answers
//!   plain text to a `json=1` request, so answers are parsed in both shapes whatever was asked.
//!
//! Layout, arrows pointing one way (each module imports only those after it):
//! - `res_command`: [`ResCommand`], a `res.php` request's action read once, over
//! - `request`: [`ParsedRequest`], the params it reads (strictly, for a decision param) and
//!   the rewrite, over
//! - `body_kind` (which encoding a body has), `multipart` (byte-exact part splitting and
//!   splicing), `json_body` (JSON member splicing) and `urlencoded` (the query and form
//!   codec), over the leaves `param_name` (names as PHP and other readers see them),
//!   `request_error` ([`RequestError`]) and `conflict` ([`Conflict`], what a strict reading
//!   refuses).
//! - `reply` (upstream answers and the outcome table), `answer` (answers keyrelay makes) and
//!   `task_id` ([`TaskId`]) stand alone.

mod answer;
mod body_kind;
mod conflict;
mod json_body;
mod multipart;
mod param_name;
mod profile;
mod reply;
mod request;
mod request_error;
mod res_command;
mod task_id;
mod urlencoded;

pub use answer::{error_answer, ids_answer, ok_answer, value_answer, Answer};
pub use body_kind::BodyKind;
pub use conflict::Conflict;
pub use profile::{Currency, PollAdvice, Profile, ZeroBalance};
pub use reply::{
    classify, parse_balance, parse_reply, parse_threads, split_ids_reply, Outcome, Reply,
    ServiceCode, ThreadsInfo,
};
pub use request::{ParsedRequest, Rewritten};
pub use request_error::RequestError;
pub use res_command::{Pingback, ResCommand, TaskAction, TaskCommand};
pub use task_id::{BadTaskId, TaskId, MAX_TASK_ID_LEN, TASK_ID_PUNCTUATION};

/// The three API endpoints keyrelay serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `/in.php`: submit a task.
    In,
    /// `/res.php`: poll a task, or an account action (`getbalance`, `threadsinfo`, ...).
    Res,
    /// `/solve.php`: submit and wait for the answer in one request.
    Solve,
}

impl Endpoint {
    /// Every endpoint, in declaration order (so `endpoint as usize` indexes it).
    pub const ALL: [Endpoint; 3] = [Endpoint::In, Endpoint::Res, Endpoint::Solve];

    /// `"/in.php"` -> `In`, `"/res.php"` -> `Res`, `"/solve.php"` -> `Solve`; anything else `None`.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        match path {
            "/in.php" => Some(Endpoint::In),
            "/res.php" => Some(Endpoint::Res),
            "/solve.php" => Some(Endpoint::Solve),
            _ => None,
        }
    }

    /// The request path, e.g. `"/in.php"`.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::In => "/in.php",
            Endpoint::Res => "/res.php",
            Endpoint::Solve => "/solve.php",
        }
    }

    /// The metric label: `"in"`, `"res"` or `"solve"`.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::In => "in",
            Endpoint::Res => "res",
            Endpoint::Solve => "solve",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn endpoint_round_trips_through_its_path() {
        for (i, endpoint) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(endpoint as usize, i, "ALL is in declaration order");
            assert_eq!(Endpoint::from_path(endpoint.path()), Some(endpoint));
        }
        assert_eq!(Endpoint::In.label(), "in");
        assert_eq!(Endpoint::Res.label(), "res");
        assert_eq!(Endpoint::Solve.label(), "solve");
    }

    #[test]
    fn unknown_paths_are_not_endpoints() {
        for path in [
            "/",
            "",
            "/in.php/",
            "/IN.PHP",
            "in.php",
            "/res.php?x=1",
            "/load.php",
        ] {
            assert_eq!(Endpoint::from_path(path), None, "{path}");
        }
    }
}
