//! Upstream answers: parsed leniently (plain or JSON, whatever the caller asked for, since the
//! service sometimes answers plain text to `json=1`), and the one table that says what an
//! answer means for the key that got it.

use serde_json::{Map, Value};

/// The codes that say "not ready yet"; the service spells it without the T.
const NOT_READY: [&str; 2] = ["CAPCHA_NOT_READY", "CAPTCHA_NOT_READY"];

/// Error codes that do not start with `ERROR`.
const BARE_ERROR_CODES: [&str; 3] = ["IP_BANNED", "MAX_USER_TURN", "TOO_MANY_BAD_IMAGES"];

/// An upstream answer body, classified by shape.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `OK|<x>` (x is everything after the first `|`) or `{"status":1,"request":x}`, x a
    /// string or an integer (rendered as decimal text): a task id or a solved answer.
    Ok(String),
    /// `CAPCHA_NOT_READY` (or `CAPTCHA_NOT_READY`), plain or as the JSON `request`.
    NotReady,
    /// An error code, trimmed: `ERROR_*`, `IP_BANNED`, `MAX_USER_TURN`, `ERROR: 1001`, plain
    /// or as the `request` of `{"status":0,...}`.
    Error(String),
    /// Any other well-formed answer: a balance (`12.5`), `OK_REPORT_RECORDED`, `OK`, a JSON
    /// object without `status`/`request` (threadsinfo).
    Value(String),
    /// Empty, HTML, truncated JSON: nothing the API would send.
    Garbage,
}

/// Parses an upstream answer body.
pub fn parse_reply(body: &[u8]) -> Reply {
    let Ok(text) = std::str::from_utf8(body) else {
        return Reply::Garbage;
    };
    let text = text.trim();
    if text.starts_with('{') {
        return match serde_json::from_str::<Map<String, Value>>(text) {
            Ok(object) => json_reply(&object, text),
            Err(_) => Reply::Garbage,
        };
    }
    plain_reply(text)
}

/// Plain text: `OK|x`, a not-ready or error code, or a one-line value.
fn plain_reply(text: &str) -> Reply {
    if let Some(rest) = text.strip_prefix("OK|") {
        return Reply::Ok(rest.to_owned());
    }
    if NOT_READY.contains(&text) {
        return Reply::NotReady;
    }
    // Any casing of the prefix is an error; only the exact upper-case codes map to key health.
    let error_prefix = text
        .get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case("ERROR"));
    if error_prefix || BARE_ERROR_CODES.contains(&text) {
        return Reply::Error(text.to_owned());
    }
    // The API's plain answers are one short line: anything else is an HTML error page, a
    // stray JSON fragment or binary noise from something in between.
    let looks_like_noise =
        text.is_empty() || text.starts_with(['<', '[', '"']) || text.chars().any(char::is_control);
    if looks_like_noise {
        return Reply::Garbage;
    }
    Reply::Value(text.to_owned())
}

/// A JSON object: `{"status":1|0,"request":...}`, possibly with extra fields, or another
/// object (threadsinfo), which is a `Value` holding the whole text.
fn json_reply(object: &Map<String, Value>, text: &str) -> Reply {
    let status = object.get("status").and_then(status_code);
    let request = object.get("request").and_then(request_text);
    match (status, request) {
        (_, Some(request)) if NOT_READY.contains(&request.trim()) => Reply::NotReady,
        (Some(1), Some(request)) if is_value_not_task(&request) => Reply::Value(request),
        (Some(1), Some(request)) => Reply::Ok(request),
        (Some(_), Some(request)) => Reply::Error(request.trim().to_owned()),
        // A failure without a code says nothing usable about the request or the key.
        (Some(status), None) if status != 1 => Reply::Garbage,
        // No status: read `request` as the plain answer it would have been.
        (None, Some(request)) => plain_reply(request.trim()),
        (_, None) => Reply::Value(text.to_owned()),
    }
}

/// `{"status":1,...}` also answers getbalance and reports, which in plain text come without
/// `OK|`. Task ids are integers and tokens are long, so a decimal number with a fraction (a
/// balance) and the bare `OK`/`OK_*` words (report, pingback) are values, not tasks.
fn is_value_not_task(request: &str) -> bool {
    let is_decimal = request.contains('.')
        && request.parse::<f64>().is_ok_and(f64::is_finite)
        && request
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-');
    let is_ok_word = request == "OK"
        || request
            .strip_prefix("OK_")
            .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'));
    is_decimal || is_ok_word
}

/// `status` as the API sends it (a number), or as a sloppy server might (a numeric string).
fn status_code(status: &Value) -> Option<i64> {
    match status {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// `request` as text: strings as-is, numbers as their decimal text; nothing for null.
fn request_text(request: &Value) -> Option<String> {
    match request {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        other => Some(other.to_string()),
    }
}

// === what an outcome means for a key ===

/// What an upstream outcome means for the key that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The key worked (whatever the task's fate).
    Success,
    /// The key is rejected: wrong, unknown or not allowed from this IP.
    KeyUnusable,
    /// `ERROR_ZERO_BALANCE`: no plan, or every thread busy; only threadsinfo can tell.
    ZeroBalance,
    /// The key is at capacity or rate-limited right now.
    KeyFull,
    /// keyrelay's egress IP is banned: every key will fail for a while.
    IpBanned,
    /// The service failed; another try may work.
    Transient,
    /// The caller's request is at fault; passed through with no penalty to the key.
    CallerError,
}

// The codes that say something about a key or keyrelay's IP, by class (protocol notes §4).
// Every other code is the caller's business. Codes are compared exactly: the service sends
// them in upper case.

/// Wrong format, unknown key or account without a plan, IP not in the key's allow-list.
const KEY_UNUSABLE: &[&str] = &[
    "ERROR_WRONG_USER_KEY",
    "ERROR_KEY_DOES_NOT_EXIST",
    "ERROR_IP_NOT_ALLOWED",
];
/// "No available threads": full now, or no plan at all; only threadsinfo can tell.
const ZERO_BALANCE: &[&str] = &["ERROR_ZERO_BALANCE"];
/// All threads busy, per-account queue or request-rate limits, 2captcha's temporary blocks
/// (1001/1003 no-slot, 1002 zero-balance, 1005 poll rate).
const KEY_FULL: &[&str] = &[
    "ERROR_NO_SLOT_AVAILABLE",
    "MAX_USER_TURN",
    "ERROR_TOO_MUCH_REQUESTS",
    "ERROR: 1001",
    "ERROR: 1002",
    "ERROR: 1003",
    "ERROR: 1005",
];
/// Too many bad keys from this IP: rotating keys would only extend the ban.
const IP_BANNED: &[&str] = &["IP_BANNED", "ERROR_IP_BLOCKED", "ERROR: 1004"];
/// The service's own "retry in ~10 s".
const SERVER_ERROR: &[&str] = &["ERROR_SERVER_ERROR", "ERROR_INTERNAL_SERVER_ERROR"];

/// The caller's own problems, named so they can be counted by code; like any code missing
/// from the lists above, they are caller errors.
const CALLER_ERRORS: &[&str] = &[
    "ERROR_PAGEURL",
    "ERROR_GOOGLEKEY",
    "ERROR_WRONG_GOOGLEKEY",
    "ERROR_BAD_TOKEN_OR_PAGEURL",
    "ERROR_BAD_PARAMETERS",
    "ERROR_TOO_BIG_CAPTCHA_FILESIZE",
    "ERROR_ZERO_CAPTCHA_FILESIZE",
    "ERROR_WRONG_FILE_EXTENSION",
    "ERROR_IMAGE_TYPE_NOT_SUPPORTED",
    "ERROR_IMAGE_DIMENSIONS_TOO_LARGE",
    "ERROR_UPLOAD",
    "ERROR_CAPTCHAIMAGE_BLOCKED",
    "TOO_MANY_BAD_IMAGES",
    "ERROR_BAD_PROXY",
    "ERROR_PROXY_CONNECTION_FAILED",
    "ERROR_NO_SUCH_METHOD",
    "ERROR_DOMAIN_NOT_ALLOWED",
    "ERROR_TOKEN_EXPIRED",
    "ERROR_BAD_DUPLICATES",
    "ERROR_CAPTCHA_UNSOLVABLE",
    "ERROR_WRONG_CAPTCHA_ID",
    "ERROR_WRONG_ID_FORMAT",
    "ERROR_EMPTY_ACTION",
    "ERROR_DUPLICATE_REPORT",
    "ERROR_REPORT_NOT_RECORDED",
    "ERROR_IP_ADDRES",
];

/// The one table from upstream answers to key health.
pub fn classify(http_status: u16, reply: &Reply) -> Outcome {
    match (http_status, reply) {
        // Rate limiting, as the service's blog describes it: this key must slow down.
        (429, _) => Outcome::KeyFull,
        // API errors come with 200, so any other status is the service (or a hop) failing.
        (status, _) if !(200..=299).contains(&status) => Outcome::Transient,
        // A task id, an answer, "keep polling", a balance: the key did its job.
        (_, Reply::Ok(_) | Reply::NotReady | Reply::Value(_)) => Outcome::Success,
        // A 2xx body that no API answer looks like: a proxy or server fault in between.
        (_, Reply::Garbage) => Outcome::Transient,
        (_, Reply::Error(code)) => {
            let code = code.as_str();
            if KEY_UNUSABLE.contains(&code) {
                Outcome::KeyUnusable
            } else if ZERO_BALANCE.contains(&code) {
                Outcome::ZeroBalance
            } else if KEY_FULL.contains(&code) {
                Outcome::KeyFull
            } else if IP_BANNED.contains(&code) {
                Outcome::IpBanned
            } else if SERVER_ERROR.contains(&code) {
                Outcome::Transient
            } else {
                // Page/sitekey/image/params problems, unknown task ids, unsolvable captchas
                // and codes we do not know: the caller's business, not the key's.
                Outcome::CallerError
            }
        }
    }
}

/// A code of the service's that the lists above know, by its static spelling: what health
/// reasons and metric labels may name, a closed set so that an upstream cannot grow label
/// sets without bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServiceCode(&'static str);

impl ServiceCode {
    /// "No available threads" (see `ZERO_BALANCE`), which keyrelay's own reads settle.
    pub const ZERO_BALANCE: ServiceCode = ServiceCode("ERROR_ZERO_BALANCE");

    /// `code` if the lists above know it, else `None`.
    pub fn known(code: &str) -> Option<ServiceCode> {
        known_code(code).map(ServiceCode)
    }

    /// The code as the service spells it.
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

/// The static spelling of a code the lists above know.
fn known_code(code: &str) -> Option<&'static str> {
    [
        KEY_UNUSABLE,
        ZERO_BALANCE,
        KEY_FULL,
        IP_BANNED,
        SERVER_ERROR,
        CALLER_ERRORS,
    ]
    .into_iter()
    .flatten()
    .find(|known| **known == code)
    .copied()
}

// === account answers ===

/// A getbalance answer: plain `12.5` or `{"status":1,"request":"12.5"|12.5}`. `None` for
/// errors, garbage and non-finite numbers.
pub fn parse_balance(body: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(body).ok()?.trim();
    let number = if text.starts_with('{') {
        let object: Map<String, Value> = serde_json::from_str(text).ok()?;
        if object.get("status").and_then(status_code) != Some(1) {
            return None;
        }
        match object.get("request")? {
            Value::Number(n) => n.as_f64()?,
            Value::String(s) => s.trim().parse().ok()?,
            _ => return None,
        }
    } else {
        text.parse().ok()?
    };
    number.is_finite().then_some(number)
}

/// A threadsinfo answer's thread cap and threads in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadsInfo {
    pub threads: u32,
    pub working_threads: u32,
}

/// A threadsinfo answer: top-level `threads` and `working_threads`, numbers or numeric
/// strings. Since the exact shape is undocumented, an object under `request` is read too.
pub fn parse_threads(body: &[u8]) -> Option<ThreadsInfo> {
    let object: Map<String, Value> = serde_json::from_slice(body).ok()?;
    let read = |object: &Map<String, Value>| {
        Some(ThreadsInfo {
            threads: count(object.get("threads")?)?,
            working_threads: count(object.get("working_threads")?)?,
        })
    };
    read(&object).or_else(|| match object.get("request") {
        Some(Value::Object(inner)) => read(inner),
        _ => None,
    })
}

fn count(value: &Value) -> Option<u32> {
    match value {
        Value::Number(n) => u32::try_from(n.as_u64()?).ok(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

// === batch polls ===

/// A key's answer to `res.php?action=get&ids=a,b,c`, one item per id in order: plain
/// `x|CAPCHA_NOT_READY|y` or `{"status":1,"request":"x|CAPCHA_NOT_READY|y"}`. A single error
/// or not-ready code stands for every id. `None` if the count is not `expected`.
pub fn split_ids_reply(body: &[u8], expected: usize) -> Option<Vec<String>> {
    if expected == 0 {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?.trim();
    let list = if text.starts_with('{') {
        let object: Map<String, Value> = serde_json::from_str(text).ok()?;
        object.get("request").and_then(request_text)?
    } else {
        text.to_owned()
    };

    if !list.contains('|') {
        return match plain_reply(list.trim()) {
            Reply::Error(code) => Some(vec![code; expected]),
            Reply::NotReady => Some(vec![list.trim().to_owned(); expected]),
            Reply::Garbage => None,
            Reply::Ok(_) | Reply::Value(_) => (expected == 1).then(|| vec![list]),
        };
    }
    let items: Vec<String> = list.split('|').map(str::to_owned).collect();
    if items.len() == expected {
        return Some(items);
    }
    // Tolerate a 2captcha-style `OK|` in front of the list.
    let items = list
        .strip_prefix("OK|")?
        .split('|')
        .map(str::to_owned)
        .collect::<Vec<_>>();
    (items.len() == expected).then_some(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(body: &str) -> Reply {
        parse_reply(body.as_bytes())
    }

    fn ok(x: &str) -> Reply {
        Reply::Ok(x.to_owned())
    }

    fn error(code: &str) -> Reply {
        Reply::Error(code.to_owned())
    }

    fn value(x: &str) -> Reply {
        Reply::Value(x.to_owned())
    }

    // === parse_reply ===

    #[test]
    fn plain_replies() {
        assert_eq!(reply("OK|73912345"), ok("73912345"));
        assert_eq!(reply("OK|03AGdBq|x|y\r\n"), ok("03AGdBq|x|y"));
        assert_eq!(reply("OK|"), ok(""));
        assert_eq!(reply("CAPCHA_NOT_READY"), Reply::NotReady);
        assert_eq!(reply(" CAPTCHA_NOT_READY\n"), Reply::NotReady);
        assert_eq!(reply("ERROR_WRONG_USER_KEY"), error("ERROR_WRONG_USER_KEY"));
        assert_eq!(reply("ERROR: 1001 \n"), error("ERROR: 1001"));
        assert_eq!(reply("IP_BANNED"), error("IP_BANNED"));
        assert_eq!(reply("MAX_USER_TURN"), error("MAX_USER_TURN"));
        assert_eq!(reply("TOO_MANY_BAD_IMAGES"), error("TOO_MANY_BAD_IMAGES"));
        assert_eq!(reply("12.5"), value("12.5"));
        assert_eq!(reply("OK_REPORT_RECORDED"), value("OK_REPORT_RECORDED"));
        assert_eq!(reply("OK"), value("OK"));
    }

    #[test]
    fn json_replies() {
        assert_eq!(
            reply(r#"{"status":1,"request":"73912345"}"#),
            ok("73912345")
        );
        assert_eq!(reply(r#"{"status":1,"request":73912345}"#), ok("73912345"));
        assert_eq!(reply(r#"{"status":"1","request":"tok"}"#), ok("tok"));
        assert_eq!(
            reply(r#"{"status":0,"request":"CAPCHA_NOT_READY"}"#),
            Reply::NotReady
        );
        assert_eq!(
            reply(r#"{"status":1,"request":"CAPTCHA_NOT_READY"}"#),
            Reply::NotReady
        );
        assert_eq!(
            reply(r#"{"status":0,"request":" ERROR_ZERO_BALANCE ","error_text":"No threads"}"#),
            error("ERROR_ZERO_BALANCE")
        );
        assert_eq!(
            reply(r#"{"status":0,"request":"ERROR: 1004"}"#),
            error("ERROR: 1004")
        );
        assert_eq!(
            reply(r#"{"status":2,"request":"IP_BANNED"}"#),
            error("IP_BANNED")
        );
    }

    #[test]
    fn json_replies_with_extra_fields() {
        let enterprise =
            r#"{"status":1,"request":"03AGdBq","result":"03AGdBq","user_agent":"Mozilla/5.0"}"#;
        assert_eq!(reply(enterprise), ok("03AGdBq"));
        let geetest = r#"{"status":1,"request":{"challenge":"c","validate":"v"},"cost":"0"}"#;
        assert_eq!(reply(geetest), ok(r#"{"challenge":"c","validate":"v"}"#));
    }

    #[test]
    fn json_status_1_values_are_not_tasks() {
        assert_eq!(reply(r#"{"status":1,"request":"12.5"}"#), value("12.5"));
        assert_eq!(reply(r#"{"status":1,"request":12.5}"#), value("12.5"));
        assert_eq!(reply(r#"{"status":1,"request":"-0.75"}"#), value("-0.75"));
        assert_eq!(
            reply(r#"{"status":1,"request":"OK_REPORT_RECORDED"}"#),
            value("OK_REPORT_RECORDED")
        );
        assert_eq!(reply(r#"{"status":1,"request":"OK"}"#), value("OK"));
        // Integers are task ids; a decimal needs its fraction to be a value.
        assert_eq!(reply(r#"{"status":1,"request":"10"}"#), ok("10"));
        assert_eq!(reply(r#"{"status":1,"request":"1.2.3"}"#), ok("1.2.3"));
        assert_eq!(
            reply(r#"{"status":1,"request":"OK_lower"}"#),
            ok("OK_lower")
        );
    }

    #[test]
    fn json_without_status_or_request() {
        let threads = r#"{"threads":5,"working_threads":2,"free_threads":3}"#;
        assert_eq!(reply(&format!(" {threads}\n")), value(threads));
        assert_eq!(reply(r#"{"status":1}"#), value(r#"{"status":1}"#));
        assert_eq!(reply(r#"{"request":"ERROR_X"}"#), error("ERROR_X"));
        assert_eq!(reply(r#"{"request":"OK|5"}"#), ok("5"));
        assert_eq!(reply(r#"{"status":0,"request":null}"#), Reply::Garbage);
        assert_eq!(reply(r#"{"status":0,"error_text":"x"}"#), Reply::Garbage);
    }

    #[test]
    fn garbage() {
        for body in [
            "",
            " \r\n",
            "<html><body>502 Bad Gateway</body></html>",
            r#"{"status":1,"request":"#,
            r#"{"status":1} trailing"#,
            "[1,2]",
            r#""OK|1""#,
            "12.5\nmore",
            "nul\u{0}byte",
        ] {
            assert_eq!(reply(body), Reply::Garbage, "{body:?}");
        }
        assert_eq!(parse_reply(b"OK|\xff\xfe"), Reply::Garbage);
        let deep = format!(
            r#"{{"request":{}{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert_eq!(
            reply(&deep),
            Reply::Garbage,
            "past serde_json's recursion limit"
        );
    }

    // === classify: every row of the table ===

    #[test]
    fn successes() {
        for r in [ok("1"), Reply::NotReady, value("12.5")] {
            assert_eq!(classify(200, &r), Outcome::Success, "{r:?}");
            assert_eq!(classify(204, &r), Outcome::Success, "{r:?}");
        }
    }

    #[test]
    fn error_codes() {
        let table = [
            ("ERROR_WRONG_USER_KEY", Outcome::KeyUnusable),
            ("ERROR_KEY_DOES_NOT_EXIST", Outcome::KeyUnusable),
            ("ERROR_IP_NOT_ALLOWED", Outcome::KeyUnusable),
            ("ERROR_ZERO_BALANCE", Outcome::ZeroBalance),
            ("ERROR_NO_SLOT_AVAILABLE", Outcome::KeyFull),
            ("MAX_USER_TURN", Outcome::KeyFull),
            ("ERROR_TOO_MUCH_REQUESTS", Outcome::KeyFull),
            ("ERROR: 1001", Outcome::KeyFull),
            ("ERROR: 1002", Outcome::KeyFull),
            ("ERROR: 1003", Outcome::KeyFull),
            ("ERROR: 1005", Outcome::KeyFull),
            ("IP_BANNED", Outcome::IpBanned),
            ("ERROR_IP_BLOCKED", Outcome::IpBanned),
            ("ERROR: 1004", Outcome::IpBanned),
            ("ERROR_SERVER_ERROR", Outcome::Transient),
            ("ERROR_INTERNAL_SERVER_ERROR", Outcome::Transient),
            ("ERROR_WRONG_CAPTCHA_ID", Outcome::CallerError),
            ("ERROR_CAPTCHA_UNSOLVABLE", Outcome::CallerError),
            ("ERROR_PAGEURL", Outcome::CallerError),
            ("ERROR_GOOGLEKEY", Outcome::CallerError),
            ("ERROR_BAD_PARAMETERS", Outcome::CallerError),
            ("ERROR_ZERO_CAPTCHA_FILESIZE", Outcome::CallerError),
            ("ERROR_EMPTY_ACTION", Outcome::CallerError),
            ("TOO_MANY_BAD_IMAGES", Outcome::CallerError),
            ("ERROR_SOMETHING_NEW", Outcome::CallerError),
            ("error_wrong_user_key", Outcome::CallerError),
        ];
        for (code, outcome) in table {
            assert_eq!(classify(200, &error(code)), outcome, "{code}");
            // The plain and JSON shapes reach the same row.
            let json = format!(r#"{{"status":0,"request":"{code}"}}"#);
            assert_eq!(classify(200, &reply(&json)), outcome, "{json}");
            assert_eq!(classify(200, &reply(code)), outcome, "{code} plain");
        }
    }

    #[test]
    fn http_statuses() {
        for r in [ok("1"), error("ERROR_WRONG_USER_KEY"), Reply::Garbage] {
            assert_eq!(classify(429, &r), Outcome::KeyFull, "{r:?}");
            for status in [100, 301, 400, 403, 404, 500, 502, 503, 599, 0, 999] {
                assert_eq!(classify(status, &r), Outcome::Transient, "{status} {r:?}");
            }
        }
        assert_eq!(classify(200, &Reply::Garbage), Outcome::Transient);
    }

    // === parse_balance / parse_threads ===

    #[test]
    fn balances() {
        let cases: [(&str, Option<f64>); 14] = [
            ("12.5", Some(12.5)),
            (" 10\r\n", Some(10.0)),
            ("0", Some(0.0)),
            (r#"{"status":1,"request":"12.5"}"#, Some(12.5)),
            (r#"{"status":1,"request":12.5}"#, Some(12.5)),
            (r#"{"status":1,"request":10}"#, Some(10.0)),
            (r#"{"status":"1","request":" 3.25 "}"#, Some(3.25)),
            (r#"{"status":0,"request":"ERROR_WRONG_USER_KEY"}"#, None),
            (r#"{"request":"12.5"}"#, None),
            ("ERROR_KEY_DOES_NOT_EXIST", None),
            ("NaN", None),
            ("inf", None),
            ("<html>", None),
            ("", None),
        ];
        for (body, expected) in cases {
            assert_eq!(parse_balance(body.as_bytes()), expected, "{body:?}");
        }
        assert_eq!(parse_balance(b"1\xff"), None);
    }

    #[test]
    fn threads() {
        let info = |threads, working_threads| {
            Some(ThreadsInfo {
                threads,
                working_threads,
            })
        };
        let cases = [
            (
                r#"{"threads":5,"working_threads":2,"free_threads":3}"#,
                info(5, 2),
            ),
            (
                r#"{"status":1,"threads":"50","working_threads":" 0 "}"#,
                info(50, 0),
            ),
            (
                r#"{"status":1,"request":{"threads":15,"working_threads":15}}"#,
                info(15, 15),
            ),
            (r#"{"threads":5}"#, None),
            (r#"{"threads":-1,"working_threads":0}"#, None),
            (r#"{"threads":5.5,"working_threads":0}"#, None),
            (r#"{"threads":4294967296,"working_threads":0}"#, None),
            (r#"{"threads":null,"working_threads":0}"#, None),
            (r#"{"status":0,"request":"ERROR_WRONG_USER_KEY"}"#, None),
            ("ERROR_WRONG_USER_KEY", None),
            ("[5,2]", None),
            ("", None),
        ];
        for (body, expected) in cases {
            assert_eq!(parse_threads(body.as_bytes()), expected, "{body}");
        }
    }

    // === split_ids_reply ===

    fn items(list: &[&str]) -> Option<Vec<String>> {
        Some(list.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn ids_replies_split_in_order() {
        let plain = b"abc|CAPCHA_NOT_READY|ERROR_CAPTCHA_UNSOLVABLE";
        let expected = items(&["abc", "CAPCHA_NOT_READY", "ERROR_CAPTCHA_UNSOLVABLE"]);
        assert_eq!(split_ids_reply(plain, 3), expected);
        let json = br#"{"status":1,"request":"abc|CAPCHA_NOT_READY|ERROR_CAPTCHA_UNSOLVABLE"}"#;
        assert_eq!(split_ids_reply(json, 3), expected);
        let all_waiting = br#"{"status":0,"request":"CAPCHA_NOT_READY|CAPCHA_NOT_READY"}"#;
        assert_eq!(
            split_ids_reply(all_waiting, 2),
            items(&["CAPCHA_NOT_READY", "CAPCHA_NOT_READY"])
        );
        assert_eq!(split_ids_reply(b"a||c", 3), items(&["a", "", "c"]));
        assert_eq!(split_ids_reply(b"OK|a|b", 2), items(&["a", "b"]));
    }

    #[test]
    fn ids_reply_with_one_code_stands_for_every_id() {
        let json = br#"{"status":0,"request":"ERROR_WRONG_CAPTCHA_ID"}"#;
        assert_eq!(
            split_ids_reply(json, 3),
            items(&["ERROR_WRONG_CAPTCHA_ID"; 3])
        );
        assert_eq!(
            split_ids_reply(b"ERROR_KEY_DOES_NOT_EXIST", 2),
            items(&["ERROR_KEY_DOES_NOT_EXIST"; 2])
        );
        assert_eq!(
            split_ids_reply(b"CAPCHA_NOT_READY", 2),
            items(&["CAPCHA_NOT_READY"; 2])
        );
    }

    #[test]
    fn ids_reply_with_one_answer_fits_one_id_only() {
        assert_eq!(split_ids_reply(b"abc", 1), items(&["abc"]));
        assert_eq!(
            split_ids_reply(br#"{"status":1,"request":7}"#, 1),
            items(&["7"])
        );
        assert_eq!(split_ids_reply(b"abc", 2), None);
    }

    #[test]
    fn ids_reply_count_mismatch_is_none() {
        assert_eq!(split_ids_reply(b"a|b|c", 2), None);
        assert_eq!(split_ids_reply(b"a|b", 3), None);
        assert_eq!(split_ids_reply(b"OK|a|b", 4), None);
        assert_eq!(split_ids_reply(b"a", 0), None);
        assert_eq!(split_ids_reply(b"", 1), None);
        assert_eq!(split_ids_reply(b"<html>", 1), None);
        assert_eq!(split_ids_reply(br#"{"status":1,"request":"a|b""#, 2), None);
        assert_eq!(split_ids_reply(br#"{"status":1}"#, 1), None);
    }

    #[test]
    fn random_answers_never_panic() {
        use rand::{Rng, SeedableRng};

        const FRAGMENTS: [&str; 16] = [
            "{",
            "}",
            "\"status\"",
            "\"request\"",
            ":",
            ",",
            "1",
            "0",
            "\"",
            "|",
            "OK",
            "ERROR",
            "CAPCHA_NOT_READY",
            ".",
            "é",
            "\u{0}",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..4000 {
            let mut body = String::new();
            for _ in 0..rng.random_range(0..16) {
                body.push_str(FRAGMENTS[rng.random_range(0..FRAGMENTS.len())]);
            }
            let parsed = parse_reply(body.as_bytes());
            let _ = classify(200, &parsed);
            let _ = parse_balance(body.as_bytes());
            let _ = parse_threads(body.as_bytes());
            for expected in 0..4 {
                if let Some(items) = split_ids_reply(body.as_bytes(), expected) {
                    assert_eq!(items.len(), expected, "{body:?}");
                }
            }
        }
    }

    #[test]
    fn known_codes_name_the_documented_codes_and_nothing_else() {
        for code in [
            "ERROR_KEY_DOES_NOT_EXIST",
            "MAX_USER_TURN",
            "ERROR: 1004",
            "ERROR_SERVER_ERROR",
            "ERROR_ZERO_BALANCE",
        ] {
            assert_eq!(known_code(code), Some(code));
            assert_ne!(
                classify(200, &Reply::Error(code.to_owned())),
                Outcome::CallerError
            );
        }
        for code in ["ERROR_PAGEURL", "ERROR_CAPTCHA_UNSOLVABLE"] {
            assert_eq!(known_code(code), Some(code));
            assert_eq!(
                classify(200, &Reply::Error(code.to_owned())),
                Outcome::CallerError
            );
        }
        assert_eq!(
            ServiceCode::known("ERROR_ZERO_BALANCE"),
            Some(ServiceCode::ZERO_BALANCE)
        );
        for code in ["error_key_does_not_exist", "ERROR_NEW"] {
            assert_eq!(known_code(code), None);
            assert_eq!(
                classify(200, &Reply::Error(code.to_owned())),
                Outcome::CallerError
            );
        }
    }
}
