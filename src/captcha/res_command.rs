//! A `res.php` request read once into what it asks for ([`ResCommand`]): the action, and for
//! the actions tied to one task, the task or tasks named. Owns which spellings of an action
//! keyrelay has a rule for, and reads every param it decides on (`action`, `id`, `ids`)
//! strictly ([`ParsedRequest::single`]), refusing a request that gives one of them two values
//! or gives both `id` and `ids` ([`Conflict`]); does not validate task ids (that is
//! [`super::TaskId`]'s job) and says nothing about which key answers.
//!
//! Protocol facts (`docs/captcha-api.md` §3): `get`, `get2`, `reportbad` and `reportgood`
//! concern one task, named by `id`, and only its creating key knows it; `get` may instead
//! name several with `ids=a,b,c`. `getbalance` and `threadsinfo` concern the account, and
//! the pingback actions its callback addresses. A missing or empty `action` is
//! `ERROR_EMPTY_ACTION`.

use std::borrow::Cow;

use super::conflict::Conflict;
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
    /// Any other action: keyrelay has no rule for it. The action as read, trimmed, which is
    /// what goes upstream.
    Other(Cow<'a, str>),
}

/// A task-tied `res.php` command, with the id or ids as the caller sent them (decoded,
/// untrimmed, unvalidated), so the caller can both read them and tell how they were spelled.
///
/// What goes upstream is this and nothing else: the action and the `id` (or the `ids`), each
/// once and canonically named, and no spelling of the other one of `id` and `ids`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskCommand<'a> {
    /// One task, named by `id` (empty when `id` is absent; blank when it was blank).
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
    /// Reads `parsed` as a `res.php` request. The `action` is read strictly (one value under
    /// every spelling of the name), trimmed of whitespace, and then matched exactly, case
    /// included: `GET` is an action keyrelay has no rule for, and is forwarded as one.
    ///
    /// # Errors
    /// A [`Conflict`]: `action`, or for a task action `id` or `ids`, given two values; or a
    /// non-blank `id` and a non-blank `ids` together. Such a request is not the service's to
    /// read its own way: keyrelay would check one task and the service could act on another.
    pub fn of(parsed: &'a ParsedRequest) -> Result<ResCommand<'a>, Conflict> {
        let Some(action) = parsed.single("action")?.and_then(trimmed) else {
            return Ok(ResCommand::NoAction);
        };
        let task = match &*action {
            "get" => TaskAction::Get,
            "get2" => TaskAction::Get2,
            "reportbad" => TaskAction::ReportBad,
            "reportgood" => TaskAction::ReportGood,
            "getbalance" => return Ok(ResCommand::Balance),
            "threadsinfo" => return Ok(ResCommand::Threads),
            "add_pingback" => return Ok(ResCommand::Pingback(Pingback::Add)),
            "get_pingback" => return Ok(ResCommand::Pingback(Pingback::Get)),
            "del_pingback" => return Ok(ResCommand::Pingback(Pingback::Del)),
            _ => return Ok(ResCommand::Other(action)),
        };
        TaskCommand::of(parsed, task).map(ResCommand::Task)
    }

    /// The `action` the upstream request carries, once and canonically named: the action
    /// keyrelay matched (or, for one it has no rule for, read). `None` for the commands
    /// keyrelay answers itself.
    pub fn action(&self) -> Option<&str> {
        match self {
            ResCommand::Task(task) => Some(task.action().name()),
            ResCommand::Pingback(pingback) => Some(pingback.name()),
            ResCommand::Other(action) => Some(action),
            ResCommand::NoAction | ResCommand::Balance | ResCommand::Threads => None,
        }
    }
}

// === impl TaskCommand ===

impl<'a> TaskCommand<'a> {
    /// The task or tasks `action` names: `id` and `ids` read strictly, a blank one counted
    /// as absent (a blank `ids` is no list, and `id` counts).
    fn of(parsed: &'a ParsedRequest, action: TaskAction) -> Result<TaskCommand<'a>, Conflict> {
        let ids = parsed.single("ids")?.filter(|ids| !is_blank(ids));
        let id = parsed.single("id")?;
        let has_id = id.as_deref().is_some_and(|id| !is_blank(id));
        match ids {
            Some(_) if has_id => Err(Conflict::Both {
                one: "id",
                other: "ids",
            }),
            // Only `get` takes a list; any other action without an `id` names no task.
            Some(ids) if action == TaskAction::Get => Ok(TaskCommand::Many { ids }),
            _ => Ok(TaskCommand::One {
                action,
                id: id.unwrap_or_default(),
            }),
        }
    }

    /// The task action: `get` for a list.
    pub fn action(&self) -> TaskAction {
        match self {
            TaskCommand::One { action, .. } => *action,
            TaskCommand::Many { .. } => TaskAction::Get,
        }
    }
}

fn is_blank(value: &str) -> bool {
    value.trim().is_empty()
}

/// `value` trimmed of whitespace (as `str::trim` trims), borrowed as it came; `None` if
/// nothing is left.
fn trimmed(value: Cow<'_, str>) -> Option<Cow<'_, str>> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return None;
    }
    Some(match value {
        Cow::Borrowed(text) => Cow::Borrowed(text.trim()),
        Cow::Owned(text) if text.len() == trimmed.len() => Cow::Owned(text),
        Cow::Owned(text) => Cow::Owned(text.trim().to_owned()),
    })
}

// === impl Pingback ===

impl Pingback {
    /// The action's name on the wire, e.g. `"add_pingback"`.
    pub fn name(self) -> &'static str {
        match self {
            Pingback::Add => "add_pingback",
            Pingback::Get => "get_pingback",
            Pingback::Del => "del_pingback",
        }
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

    type Read<'a> = Result<ResCommand<'a>, Conflict>;

    fn query(query: &str) -> ParsedRequest {
        ParsedRequest::parse(Some(query), None, Bytes::new()).expect("a query always parses")
    }

    fn with_body(query: &str, content_type: &str, body: &[u8]) -> ParsedRequest {
        ParsedRequest::parse(
            Some(query),
            Some(content_type),
            Bytes::copy_from_slice(body),
        )
        .expect("parses")
    }

    fn command(request: &ParsedRequest) -> Read<'_> {
        ResCommand::of(request)
    }

    fn one(action: TaskAction, id: &str) -> Read<'static> {
        Ok(ResCommand::Task(TaskCommand::One {
            action,
            id: Cow::Owned(id.to_owned()),
        }))
    }

    fn many(ids: &str) -> Read<'static> {
        Ok(ResCommand::Task(TaskCommand::Many {
            ids: Cow::Owned(ids.to_owned()),
        }))
    }

    fn two_values(name: &'static str) -> Read<'static> {
        Err(Conflict::Values { name })
    }

    const BOTH: Read<'static> = Err(Conflict::Both {
        one: "id",
        other: "ids",
    });

    const FORM: &str = "application/x-www-form-urlencoded";
    const JSON: &str = "application/json";
    const MULTIPART: &str = "multipart/form-data; boundary=B";

    /// A multipart body of text parts, each with the Content-Disposition given.
    fn multipart(parts: &[(&str, &str)]) -> Vec<u8> {
        let mut body = String::new();
        for (disposition, value) in parts {
            body.push_str(&format!(
                "--B\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n"
            ));
        }
        body.push_str("--B--\r\n");
        body.into_bytes()
    }

    /// Every action keyrelay has a rule for, with what it reads as (given `id=7`).
    fn known() -> Vec<(&'static str, Read<'static>)> {
        let mut known: Vec<(&str, Read<'_>)> = TaskAction::ALL
            .iter()
            .map(|&action| (action.name(), one(action, "7")))
            .collect();
        known.extend([
            ("getbalance", Ok(ResCommand::Balance)),
            ("threadsinfo", Ok(ResCommand::Threads)),
            ("add_pingback", Ok(ResCommand::Pingback(Pingback::Add))),
            ("get_pingback", Ok(ResCommand::Pingback(Pingback::Get))),
            ("del_pingback", Ok(ResCommand::Pingback(Pingback::Del))),
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
        let bodies: [(&str, Vec<u8>); 3] = [
            (FORM, b"action=reportgood&id=7".to_vec()),
            (JSON, br#"{"action":"reportgood","id":7}"#.to_vec()),
            (
                MULTIPART,
                multipart(&[
                    ("form-data; name=\"action\"", "reportgood"),
                    ("form-data; name=\"id\"", "7"),
                ]),
            ),
        ];
        for (content_type, body) in &bodies {
            let request = with_body("json=1", content_type, body);
            assert_eq!(
                command(&request),
                one(TaskAction::ReportGood, "7"),
                "{content_type}"
            );
            // The same value in the query too is still one value.
            let request = with_body("action=reportgood&id=7", content_type, body);
            assert_eq!(
                command(&request),
                one(TaskAction::ReportGood, "7"),
                "{content_type}, query and body"
            );
            // A different one is refused: the service may read the query first, or the body.
            let request = with_body("action=getbalance", content_type, body);
            assert_eq!(command(&request), two_values("action"), "{content_type}");
            let request = with_body("action=reportgood&id=8", content_type, body);
            assert_eq!(command(&request), two_values("id"), "{content_type}");
        }
    }

    #[test]
    fn every_readers_spelling_of_a_decision_param_is_read() {
        for action in [
            "action",
            "ACTION",
            "Action",
            "action[]",
            "action[0]",
            "+action",
            "%20action",
            "%61ction",
            "action%00x",
            "action%5B%5D",
            "%E2%80%8Baction",
        ] {
            for id in ["id", "ID", "Id", "id[]", "+id", "i%64", "id%00x", "%69%64"] {
                let request = query(&format!("{action}=get&{id}=7"));
                assert_eq!(
                    command(&request),
                    one(TaskAction::Get, "7"),
                    "{action} {id}"
                );
            }
            let request = query(&format!("{action}=get&IDS=1,2"));
            assert_eq!(command(&request), many("1,2"), "{action} IDS");
        }
        // A JSON member and a multipart part named in any of those ways, too.
        let request = with_body("", JSON, br#"{"ACTION":"get"," Id":"7"}"#);
        assert_eq!(command(&request), one(TaskAction::Get, "7"));
        let body = multipart(&[
            ("form-data; NAME=\"action\"", "get"),
            ("form-data; name=\"id\"; name=\"other\"", "7"),
        ]);
        let request = with_body("", MULTIPART, &body);
        assert_eq!(command(&request), one(TaskAction::Get, "7"));
    }

    #[test]
    fn other_spellings_are_actions_without_a_rule_and_go_up_as_read() {
        for (action, read) in [
            ("GET", "GET"),
            ("Get", "Get"),
            ("GET2", "GET2"),
            ("getBalance", "getBalance"),
            ("GETBALANCE", "GETBALANCE"),
            ("ThreadsInfo", "ThreadsInfo"),
            ("ReportBad", "ReportBad"),
            ("get3", "get3"),
            ("get%202", "get 2"),
            ("report_bad", "report_bad"),
            ("reportbad2", "reportbad2"),
            ("getbalances", "getbalances"),
            ("pingback", "pingback"),
            ("add-pingback", "add-pingback"),
            ("+getstats+", "getstats"),
            // Not whitespace to `str::trim`, so not trimmed.
            ("%E2%80%8Bget", "\u{200b}get"),
            ("get%00", "get\0"),
        ] {
            let request = query(&format!("action={action}&id=7"));
            let read_as = command(&request);
            assert_eq!(
                read_as,
                Ok(ResCommand::Other(Cow::Borrowed(read))),
                "{action}"
            );
            assert_eq!(read_as.unwrap().action(), Some(read), "{action}");
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
            "actions=get",
            "xaction=get",
        ] {
            assert_eq!(command(&query(raw)), Ok(ResCommand::NoAction), "{raw}");
        }
    }

    #[test]
    fn two_values_of_one_param_are_refused_as_sent_byte_for_byte() {
        // The same decoded text is one value, however it was spelled or encoded.
        for same in [
            "action=get&action=get&id=7",
            "action=get&ACTION=g%65t&id=7",
            "action=get&id=7&ID=%37",
            "action=get&id=7&id[]=7&+id=7",
        ] {
            assert_eq!(command(&query(same)), one(TaskAction::Get, "7"), "{same}");
        }
        // Any other difference is two values, even one a trimming or numeric reader would
        // not see: keyrelay cannot know the service is such a reader.
        for (conflicting, name) in [
            ("action=get&action=", "action"),
            ("action=get&action=+get", "action"),
            ("action=get&ACTION=GET", "action"),
            ("action=getbalance&Action=get", "action"),
            ("action=get&id=1&id=2", "id"),
            ("action=get&id=7&ID=8", "id"),
            ("action=get&id=0123&id=123", "id"),
            ("action=get&id=7&id=+7", "id"),
            ("action=get&id=&id=7", "id"),
            ("action=get&ids=1,2&IDS=1,3", "ids"),
            ("action=get&ids=1,2&ids=", "ids"),
            ("action=get2&id=1&id=2", "id"),
        ] {
            assert_eq!(
                command(&query(conflicting)),
                two_values(name),
                "{conflicting}"
            );
        }
    }

    #[test]
    fn only_get_takes_a_list_and_only_a_non_blank_one() {
        assert_eq!(command(&query("action=get&ids=1,2,3")), many("1,2,3"));
        // As sent: splitting and trimming the list is the poll's business.
        assert_eq!(command(&query("action=get&ids=+1,+2+")), many(" 1, 2 "));
        assert_eq!(command(&query("action=get&ids=,")), many(","));
        // A blank `ids` is no list, and `id` counts; a blank `id` beside a list is no id.
        for blank in ["ids=", "ids=+", "ids=%09%20", "ids"] {
            let request = query(&format!("action=get&{blank}&id=9"));
            assert_eq!(command(&request), one(TaskAction::Get, "9"), "{blank}");
        }
        for blank in ["id=", "id=+", "id"] {
            let request = query(&format!("action=get&ids=1,2&{blank}"));
            assert_eq!(command(&request), many("1,2"), "{blank}");
        }
        for action in [
            TaskAction::Get2,
            TaskAction::ReportBad,
            TaskAction::ReportGood,
        ] {
            let request = query(&format!("action={}&ids=1,2", action.name()));
            assert_eq!(command(&request), one(action, ""), "{action:?}");
        }
    }

    #[test]
    fn an_id_and_a_list_together_are_refused_wherever_they_are() {
        for action in TaskAction::ALL {
            let request = query(&format!("action={}&ids=1,2&id=9", action.name()));
            assert_eq!(command(&request), BOTH, "{action:?}");
        }
        let request = with_body("action=get&ids=1,2", FORM, b"ID=9");
        assert_eq!(command(&request), BOTH);
        let request = with_body("action=get", JSON, br#"{"IDS":"1,2","id":9}"#);
        assert_eq!(command(&request), BOTH);
        let body = multipart(&[("form-data; name=\"id\"", "9")]);
        let request = with_body("action=get&ids=1,2", MULTIPART, &body);
        assert_eq!(command(&request), BOTH);
    }

    #[test]
    fn the_id_is_kept_as_sent_and_empty_when_absent() {
        assert_eq!(command(&query("action=get")), one(TaskAction::Get, ""));
        assert_eq!(
            command(&query("action=reportbad&id=+0123+")),
            one(TaskAction::ReportBad, " 0123 ")
        );
        assert_eq!(
            command(&query("action=get2&id=1&ID=1")),
            one(TaskAction::Get2, "1")
        );
    }

    #[test]
    fn params_an_action_does_not_read_are_not_its_business() {
        assert_eq!(
            command(&query("action=getbalance&id=1&id=2&ids=3")),
            Ok(ResCommand::Balance)
        );
        assert_eq!(
            command(&query("action=add_pingback&ids=1&ids=2")),
            Ok(ResCommand::Pingback(Pingback::Add))
        );
    }

    #[test]
    fn the_action_sent_upstream_is_the_one_read() {
        for (raw, upstream) in [
            ("action=+get+&id=7", Some("get")),
            ("action=get&ids=1,2", Some("get")),
            ("action=reportgood%0A&id=7", Some("reportgood")),
            ("action=+del_pingback", Some("del_pingback")),
            ("action=+foo+", Some("foo")),
            ("action=getbalance", None),
            ("action=threadsinfo", None),
            ("action=", None),
        ] {
            let request = query(raw);
            let read = command(&request).expect("no conflict");
            assert_eq!(read.action(), upstream, "{raw}");
        }
        for pingback in [Pingback::Add, Pingback::Get, Pingback::Del] {
            let request = query(&format!("action={}", pingback.name()));
            assert_eq!(command(&request), Ok(ResCommand::Pingback(pingback)));
        }
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

    /// What a strict reading of one name finds, written apart from `single`: the distinct
    /// values of every occurrence generated for it.
    fn model_read(values: &[String]) -> Result<Option<&str>, ()> {
        match values.first() {
            None => Ok(None),
            Some(first) if values.iter().all(|v| v == first) => Ok(Some(first)),
            Some(_) => Err(()),
        }
    }

    /// The command, by the rules as the issue states them: one value per decision param or
    /// a refusal; the action trimmed and matched exactly; for a task action, `id` or a
    /// non-blank `ids` (for `get` only) but never both non-blank. Where every param is given
    /// once this is how the dispatch read requests before the strict reading.
    fn model(action: &[String], ids: &[String], id: &[String]) -> String {
        let Ok(action) = model_read(action) else {
            return "conflict action".to_owned();
        };
        let action = action.map(str::trim).filter(|a| !a.is_empty());
        let task = match action {
            None => return "empty".to_owned(),
            Some(task @ ("get" | "get2" | "reportbad" | "reportgood")) => task,
            Some("getbalance") => return "balance".to_owned(),
            Some("threadsinfo") => return "threads".to_owned(),
            Some("add_pingback" | "get_pingback" | "del_pingback") => return "pingback".to_owned(),
            Some(other) => return format!("other {other}"),
        };
        let Ok(ids) = model_read(ids) else {
            return "conflict ids".to_owned();
        };
        let Ok(id) = model_read(id) else {
            return "conflict id".to_owned();
        };
        let ids = ids.filter(|ids| !ids.trim().is_empty());
        let has_id = id.is_some_and(|id| !id.trim().is_empty());
        match ids {
            Some(_) if has_id => "both".to_owned(),
            Some(ids) if task == "get" => format!("many {ids}"),
            _ => {
                let polls = matches!(task, "get" | "get2");
                format!("one {task} {polls} {}", id.unwrap_or_default())
            }
        }
    }

    fn after_the_command(parsed: &ParsedRequest) -> String {
        match ResCommand::of(parsed) {
            Err(Conflict::Values { name }) => format!("conflict {name}"),
            Err(Conflict::Both { .. }) => "both".to_owned(),
            Ok(ResCommand::NoAction) => "empty".to_owned(),
            Ok(ResCommand::Task(TaskCommand::Many { ids })) => format!("many {ids}"),
            Ok(ResCommand::Task(TaskCommand::One { action, id })) => {
                format!("one {} {} {id}", action.name(), action.polls())
            }
            Ok(ResCommand::Balance) => "balance".to_owned(),
            Ok(ResCommand::Threads) => "threads".to_owned(),
            Ok(ResCommand::Pingback(_)) => "pingback".to_owned(),
            Ok(ResCommand::Other(action)) => format!("other {action}"),
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

    /// One occurrence of a param: how its name is spelled (as sent, urlencoded), its value,
    /// and whether it is in the body.
    fn occurrences(
        name: &'static str,
        values: impl Strategy<Value = String>,
    ) -> impl Strategy<Value = Vec<(String, String, bool)>> {
        let upper = name.to_ascii_uppercase();
        let first = format!("%{:02X}", name.as_bytes()[0]);
        let spelled = prop::sample::select(vec![
            name.to_owned(),
            upper,
            format!("{name}[]"),
            format!("+{name}"),
            format!("{first}{}", &name[1..]),
        ]);
        prop::collection::vec((spelled, values, any::<bool>()), 0..=2)
    }

    fn values_of(list: &[(String, String, bool)]) -> Vec<String> {
        list.iter().map(|(_, value, _)| value.clone()).collect()
    }

    proptest! {
        #[test]
        fn the_command_reads_every_request_by_the_rules(
            action in occurrences("action", action_text()),
            ids in occurrences("ids", prop::sample::select(vec!["", " ", "1,2", " 3 ", ","]).prop_map(str::to_owned)),
            id in occurrences("id", prop::sample::select(vec!["", "7", " 0123 ", "123", "a b"]).prop_map(str::to_owned)),
        ) {
            let (mut in_query, mut in_body) = (vec!["json=1".to_owned()], Vec::new());
            for (name, value, body) in action.iter().chain(&ids).chain(&id) {
                let value: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
                let pair = format!("{name}={value}");
                if *body { in_body.push(pair) } else { in_query.push(pair) }
            }
            let request = ParsedRequest::parse(
                Some(&in_query.join("&")),
                Some(FORM),
                Bytes::from(in_body.join("&")),
            )
            .expect("urlencoded params always parse");
            prop_assert_eq!(
                after_the_command(&request),
                model(&values_of(&action), &values_of(&ids), &values_of(&id))
            );
        }
    }
}
