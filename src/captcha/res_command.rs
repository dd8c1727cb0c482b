//! A `res.php` request read once into what it asks for ([`ResCommand`]): the action, and for
//! the actions tied to one task, the task or tasks named. Owns which spellings of an action
//! keyrelay has a rule for; does not validate task ids (that is [`super::TaskId`]'s job) and
//! says nothing about which key answers.
//!
//! Protocol facts (`docs/captcha-api.md` §3): `get`, `get2`, `reportbad` and `reportgood`
//! concern one task, named by `id`, and only its creating key knows it; `get` may instead
//! name several with `ids=a,b,c`. `getbalance` and `threadsinfo` concern the account, and
//! the pingback actions its callback addresses. A missing or empty `action` is
//! `ERROR_EMPTY_ACTION`.

use std::borrow::Cow;

use super::request::ParsedRequest;

/// What a `res.php` request asks for, read once from its params.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResCommand<'a> {
    /// No `action` param, or one that is only whitespace.
    NoAction,
    /// An action about one task or a list of tasks: it must go out with the key that created
    /// each one.
    Task(TaskCommand<'a>),
    /// `getbalance`: the account's balance.
    Balance,
    /// `threadsinfo`: the account's threads and how many are working.
    Threads,
    /// `add_pingback`, `get_pingback` or `del_pingback`: the account's callback addresses.
    Pingback(Pingback),
    /// Any other action: keyrelay has no rule for it.
    Other,
}

/// A task-tied `res.php` command, with the id or ids as the caller sent them (decoded,
/// untrimmed, unvalidated), so the caller can both read them and tell how they were spelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskCommand<'a> {
    /// One task, named by `id` (empty when `id` is absent).
    One {
        action: TaskAction,
        id: Cow<'a, str>,
    },
    /// `get` with a non-blank `ids=` list, which it asks about instead of `id`.
    Many { ids: Cow<'a, str> },
}

/// The `res.php` actions tied to one task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskAction {
    /// `get`: the task's result.
    Get,
    /// `get2`: the task's result with its price.
    Get2,
    /// `reportbad`: the result was wrong.
    ReportBad,
    /// `reportgood`: the result was right.
    ReportGood,
}

/// The pingback actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pingback {
    /// `add_pingback`.
    Add,
    /// `get_pingback`.
    Get,
    /// `del_pingback`.
    Del,
}

// === impl ResCommand ===

impl<'a> ResCommand<'a> {
    /// Reads `parsed` as a `res.php` request. The `action` is trimmed of whitespace
    /// ([`ParsedRequest::action`]) and then matched exactly, case included: `GET` is an
    /// action keyrelay has no rule for, and is forwarded as one.
    pub fn of(parsed: &'a ParsedRequest) -> ResCommand<'a> {
        let Some(action) = parsed.action() else {
            return ResCommand::NoAction;
        };
        let task = match &*action {
            "get" => TaskAction::Get,
            "get2" => TaskAction::Get2,
            "reportbad" => TaskAction::ReportBad,
            "reportgood" => TaskAction::ReportGood,
            "getbalance" => return ResCommand::Balance,
            "threadsinfo" => return ResCommand::Threads,
            "add_pingback" => return ResCommand::Pingback(Pingback::Add),
            "get_pingback" => return ResCommand::Pingback(Pingback::Get),
            "del_pingback" => return ResCommand::Pingback(Pingback::Del),
            _ => return ResCommand::Other,
        };
        // Only `get` takes a list; a blank `ids` is no list, and `id` counts.
        let ids = parsed
            .param("ids")
            .filter(|ids| task == TaskAction::Get && !ids.trim().is_empty());
        ResCommand::Task(match ids {
            Some(ids) => TaskCommand::Many { ids },
            None => TaskCommand::One {
                action: task,
                id: parsed.param("id").unwrap_or_default(),
            },
        })
    }
}

// === impl TaskAction ===

impl TaskAction {
    /// Every task action.
    pub const ALL: [TaskAction; 4] = [
        TaskAction::Get,
        TaskAction::Get2,
        TaskAction::ReportBad,
        TaskAction::ReportGood,
    ];

    /// The action's name on the wire, e.g. `"reportbad"`.
    pub fn name(self) -> &'static str {
        match self {
            TaskAction::Get => "get",
            TaskAction::Get2 => "get2",
            TaskAction::ReportBad => "reportbad",
            TaskAction::ReportGood => "reportgood",
        }
    }

    /// Whether it asks for the task's result (`get`, `get2`), so that a final answer ends the
    /// task and "not ready" is an honest answer when there is none; a report is neither.
    pub fn polls(self) -> bool {
        matches!(self, TaskAction::Get | TaskAction::Get2)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;

    fn query(query: &str) -> ParsedRequest {
        ParsedRequest::parse(Some(query), None, Bytes::new()).expect("a query always parses")
    }

    fn command(request: &ParsedRequest) -> ResCommand<'_> {
        ResCommand::of(request)
    }

    fn one(action: TaskAction, id: &str) -> ResCommand<'static> {
        ResCommand::Task(TaskCommand::One {
            action,
            id: Cow::Owned(id.to_owned()),
        })
    }

    /// Every action keyrelay has a rule for, with what it reads as (given `id=7`).
    fn known() -> Vec<(&'static str, ResCommand<'static>)> {
        let mut known: Vec<(&str, ResCommand<'_>)> = TaskAction::ALL
            .iter()
            .map(|&action| (action.name(), one(action, "7")))
            .collect();
        known.extend([
            ("getbalance", ResCommand::Balance),
            ("threadsinfo", ResCommand::Threads),
            ("add_pingback", ResCommand::Pingback(Pingback::Add)),
            ("get_pingback", ResCommand::Pingback(Pingback::Get)),
            ("del_pingback", ResCommand::Pingback(Pingback::Del)),
        ]);
        known
    }

    #[test]
    fn every_known_action_reads_as_its_command_however_it_is_padded() {
        // Urlencoded spaces, tabs and newlines, and Unicode spaces (no-break, ideographic):
        // the action is trimmed as `str::trim` trims.
        let pads = [
            "",
            "+",
            "%20",
            "%09",
            "%0D%0A",
            "+%20+",
            "%C2%A0",
            "%E3%80%80",
        ];
        for (name, expected) in known() {
            for before in pads {
                for after in pads {
                    let request = query(&format!("action={before}{name}{after}&id=7"));
                    assert_eq!(command(&request), expected, "{before}{name}{after}");
                }
            }
        }
    }

    #[test]
    fn the_action_is_read_wherever_the_params_are() {
        let bodies: [(Option<&str>, &[u8]); 3] = [
            (
                Some("application/x-www-form-urlencoded"),
                b"action=reportgood&id=7",
            ),
            (
                Some("application/json"),
                br#"{"action":"reportgood","id":7}"#,
            ),
            (
                Some("multipart/form-data; boundary=B"),
                b"--B\r\nContent-Disposition: form-data; name=\"action\"\r\n\r\nreportgood\r\n\
                  --B\r\nContent-Disposition: form-data; name=\"id\"\r\n\r\n7\r\n--B--\r\n",
            ),
        ];
        for (content_type, body) in bodies {
            // The body's action wins over the query's, as every param does.
            let request = ParsedRequest::parse(
                Some("action=getbalance"),
                content_type,
                Bytes::copy_from_slice(body),
            )
            .expect("parses");
            assert_eq!(
                command(&request),
                one(TaskAction::ReportGood, "7"),
                "{content_type:?}"
            );
        }
    }

    #[test]
    fn other_spellings_are_actions_without_a_rule() {
        for action in [
            "GET",
            "Get",
            "GET2",
            "getBalance",
            "GETBALANCE",
            "ThreadsInfo",
            "ReportBad",
            "get3",
            "get%202",
            "report_bad",
            "reportbad2",
            "getbalances",
            "pingback",
            "add-pingback",
            "getstats",
            // Not whitespace to `str::trim`, so not trimmed.
            "%E2%80%8Bget",
            "get%00",
        ] {
            let request = query(&format!("action={action}&id=7"));
            assert_eq!(command(&request), ResCommand::Other, "{action}");
        }
    }

    #[test]
    fn a_missing_or_blank_action_is_no_action() {
        for raw in [
            "",
            "id=7",
            "action=",
            "action",
            "action=+",
            "action=%20%09%0A",
            "action=%E3%80%80",
            "ACTION=get",
        ] {
            assert_eq!(command(&query(raw)), ResCommand::NoAction, "{raw}");
        }
        // The last `action` counts, so a blank one after a real one is none.
        assert_eq!(command(&query("action=get&action=")), ResCommand::NoAction);
    }

    #[test]
    fn only_get_takes_a_list_and_only_a_non_blank_one() {
        let many = |ids: &str| {
            ResCommand::Task(TaskCommand::Many {
                ids: Cow::Owned(ids.to_owned()),
            })
        };
        assert_eq!(command(&query("action=get&ids=1,2,3")), many("1,2,3"));
        // As sent: splitting and trimming the list is the poll's business.
        assert_eq!(
            command(&query("action=get&ids=+1,+2+&id=9")),
            many(" 1, 2 ")
        );
        assert_eq!(command(&query("action=get&ids=,")), many(","));
        for blank in ["ids=", "ids=+", "ids=%09%20", "ids"] {
            let request = query(&format!("action=get&{blank}&id=9"));
            assert_eq!(command(&request), one(TaskAction::Get, "9"), "{blank}");
        }
        for action in [
            TaskAction::Get2,
            TaskAction::ReportBad,
            TaskAction::ReportGood,
        ] {
            let request = query(&format!("action={}&ids=1,2&id=9", action.name()));
            assert_eq!(command(&request), one(action, "9"), "{action:?}");
        }
    }

    #[test]
    fn the_id_is_kept_as_sent_and_empty_when_absent() {
        assert_eq!(command(&query("action=get")), one(TaskAction::Get, ""));
        assert_eq!(
            command(&query("action=reportbad&id=+0123+")),
            one(TaskAction::ReportBad, " 0123 ")
        );
        assert_eq!(
            command(&query("action=get2&id=1&id=2")),
            one(TaskAction::Get2, "2")
        );
    }

    #[test]
    fn task_actions_name_themselves_and_only_gets_poll() {
        for action in TaskAction::ALL {
            let request = query(&format!("action={}", action.name()));
            assert_eq!(command(&request), one(action, ""));
            assert_eq!(
                action.polls(),
                matches!(action, TaskAction::Get | TaskAction::Get2)
            );
        }
        assert!(TaskAction::Get.polls() && TaskAction::Get2.polls());
        assert!(!TaskAction::ReportBad.polls() && !TaskAction::ReportGood.polls());
    }

    /// How the dispatch read a `res.php` request before there was a command, kept verbatim
    /// as the model the command must agree with: where it went, and (for a single-task
    /// action) which action it logged and whether it counted as a get.
    fn before_the_command(parsed: &ParsedRequest) -> String {
        match parsed.action().as_deref() {
            None => "empty".to_owned(),
            Some("get" | "get2" | "reportbad" | "reportgood") => {
                let is_get = parsed.action().as_deref() == Some("get");
                match parsed
                    .param("ids")
                    .filter(|ids| is_get && !ids.trim().is_empty())
                {
                    Some(ids) => format!("many {ids}"),
                    None => {
                        let action = parsed.action().as_deref().unwrap_or("").to_owned();
                        let polls = matches!(parsed.action().as_deref(), Some("get" | "get2"));
                        let id = parsed.param("id").unwrap_or_default();
                        format!("one {action} {polls} {id}")
                    }
                }
            }
            Some("getbalance") => "balance".to_owned(),
            Some("threadsinfo") => "threads".to_owned(),
            Some("add_pingback" | "get_pingback" | "del_pingback") => "pingback".to_owned(),
            Some(_) => "other".to_owned(),
        }
    }

    fn after_the_command(parsed: &ParsedRequest) -> String {
        match ResCommand::of(parsed) {
            ResCommand::NoAction => "empty".to_owned(),
            ResCommand::Task(TaskCommand::Many { ids }) => format!("many {ids}"),
            ResCommand::Task(TaskCommand::One { action, id }) => {
                format!("one {} {} {id}", action.name(), action.polls())
            }
            ResCommand::Balance => "balance".to_owned(),
            ResCommand::Threads => "threads".to_owned(),
            ResCommand::Pingback(_) => "pingback".to_owned(),
            ResCommand::Other => "other".to_owned(),
        }
    }

    /// Near-misses of every action name: padding, case, extra characters.
    fn action_text() -> impl Strategy<Value = String> {
        let names = prop::sample::select(vec![
            "get",
            "get2",
            "reportbad",
            "reportgood",
            "getbalance",
            "threadsinfo",
            "add_pingback",
            "get_pingback",
            "del_pingback",
            "GET",
            "Get2",
            "",
        ]);
        let pad = prop::sample::select(vec!["", " ", "\t", "\n", "\u{a0}", "\u{200b}", "x", "\0"]);
        prop_oneof![
            (pad.clone(), names, pad).prop_map(|(a, name, b)| format!("{a}{name}{b}")),
            ".{0,12}",
        ]
    }

    proptest! {
        #[test]
        fn the_command_reads_every_request_as_the_dispatch_did(
            action in prop::option::of(action_text()),
            ids in prop::option::of(prop::sample::select(vec!["", " ", "1,2", " 3 ", ",", "\u{a0}"])),
            id in prop::option::of(prop::sample::select(vec!["", "7", " 0123 ", "a b"])),
            in_body in any::<bool>(),
        ) {
            let mut pairs = form_urlencoded::Serializer::new(String::new());
            if let Some(action) = &action {
                pairs.append_pair("action", action);
            }
            if let Some(ids) = ids {
                pairs.append_pair("ids", ids);
            }
            if let Some(id) = id {
                pairs.append_pair("id", id);
            }
            let encoded = pairs.finish();
            let request = if in_body {
                ParsedRequest::parse(
                    Some("action=getbalance&id=1"),
                    Some("application/x-www-form-urlencoded"),
                    Bytes::from(encoded),
                )
            } else {
                ParsedRequest::parse(Some(&encoded), None, Bytes::new())
            }
            .expect("urlencoded params always parse");
            prop_assert_eq!(after_the_command(&request), before_the_command(&request));
        }
    }
}
