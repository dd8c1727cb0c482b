//! Answers keyrelay makes itself, in the caller's format (`json=1` or plain), always meant to
//! be sent with HTTP 200: real clients treat any other status as a network failure.

use bytes::Bytes;
use serde::Serialize;

const PLAIN: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// A response body and its Content-Type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub content_type: &'static str,
    pub body: Bytes,
}

/// Field order matters to byte-exact tests and to eyes used to the service's answers, and
/// serde_json's `json!` would sort the keys.
#[derive(Serialize)]
struct Success<'a> {
    status: u8,
    request: &'a str,
}

#[derive(Serialize)]
struct Failure<'a> {
    status: u8,
    request: &'a str,
    error_text: &'a str,
}

/// plain: `CODE`; json: `{"status":0,"request":"CODE","error_text":"<text>"}`.
pub fn error_answer(code: &str, text: &str, json: bool) -> Answer {
    if json {
        json_answer(&Failure {
            status: 0,
            request: code,
            error_text: text,
        })
    } else {
        plain_answer(code.to_owned())
    }
}

/// plain: `OK|value`; json: `{"status":1,"request":"value"}`.
pub fn ok_answer(value: &str, json: bool) -> Answer {
    if json {
        success(value)
    } else {
        plain_answer(format!("OK|{value}"))
    }
}

/// plain: `value` (no `OK|`, as getbalance answers); json: `{"status":1,"request":"value"}`.
pub fn value_answer(value: &str, json: bool) -> Answer {
    if json {
        success(value)
    } else {
        plain_answer(value.to_owned())
    }
}

/// plain: items joined by `|`; json: `{"status":1,"request":"a|b|c"}`.
pub fn ids_answer(items: &[String], json: bool) -> Answer {
    value_answer(&items.join("|"), json)
}

fn success(value: &str) -> Answer {
    json_answer(&Success {
        status: 1,
        request: value,
    })
}

fn plain_answer(body: String) -> Answer {
    Answer {
        content_type: PLAIN,
        body: Bytes::from(body),
    }
}

fn json_answer(value: &impl Serialize) -> Answer {
    let body = serde_json::to_vec(value).expect("structs of str and u8 always serialize");
    Answer {
        content_type: JSON,
        body: Bytes::from(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_answer(answer: Answer, content_type: &str, body: &str) {
        assert_eq!(answer.content_type, content_type);
        assert_eq!(std::str::from_utf8(&answer.body), Ok(body));
    }

    #[test]
    fn error_answers() {
        assert_answer(
            error_answer("ERROR_NO_SLOT_AVAILABLE", "all keys are busy", false),
            "text/plain; charset=utf-8",
            "ERROR_NO_SLOT_AVAILABLE",
        );
        assert_answer(
            error_answer("ERROR_NO_SLOT_AVAILABLE", "all keys are busy", true),
            "application/json",
            r#"{"status":0,"request":"ERROR_NO_SLOT_AVAILABLE","error_text":"all keys are busy"}"#,
        );
    }

    #[test]
    fn error_text_is_escaped_as_valid_json() {
        let text = "quote \" backslash \\ newline \n tab \t nul \u{0} é";
        let answer = error_answer("ERROR_BAD_PARAMETERS", text, true);
        assert_eq!(
            std::str::from_utf8(&answer.body),
            Ok(
                r#"{"status":0,"request":"ERROR_BAD_PARAMETERS","error_text":"quote \" backslash \\ newline \n tab \t nul \u0000 é"}"#
            )
        );
        let parsed: serde_json::Value = serde_json::from_slice(&answer.body).expect("valid JSON");
        assert_eq!(parsed["error_text"], text);
    }

    #[test]
    fn ok_answers() {
        assert_answer(ok_answer("73912", false), PLAIN, "OK|73912");
        assert_answer(
            ok_answer("73912", true),
            JSON,
            r#"{"status":1,"request":"73912"}"#,
        );
        assert_answer(
            ok_answer("a\"b|c", true),
            JSON,
            r#"{"status":1,"request":"a\"b|c"}"#,
        );
    }

    #[test]
    fn value_answers_have_no_ok_prefix_in_plain() {
        assert_answer(value_answer("12.5", false), PLAIN, "12.5");
        assert_answer(
            value_answer("12.5", true),
            JSON,
            r#"{"status":1,"request":"12.5"}"#,
        );
    }

    #[test]
    fn ids_answers_join_items() {
        let items = vec![
            "abc".to_owned(),
            "CAPCHA_NOT_READY".to_owned(),
            "ERROR_WRONG_CAPTCHA_ID".to_owned(),
        ];
        assert_answer(
            ids_answer(&items, false),
            PLAIN,
            "abc|CAPCHA_NOT_READY|ERROR_WRONG_CAPTCHA_ID",
        );
        assert_answer(
            ids_answer(&items, true),
            JSON,
            r#"{"status":1,"request":"abc|CAPCHA_NOT_READY|ERROR_WRONG_CAPTCHA_ID"}"#,
        );
        assert_answer(ids_answer(&["x".to_owned()], false), PLAIN, "x");
    }
}
