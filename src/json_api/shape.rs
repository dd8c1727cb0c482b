//! The JSON API's answers, in the shape each client reads: anti-captcha's (CapMonster's and
//! 2captcha's v2 are the same) on keyrelay's own listeners and those services' hosts, and
//! CapSolver's on its host, whose client rejects any field beyond its own few.

use serde_json::{Map, Value};

use super::codes::JsonError;

/// Whose answer shape to give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// anti-captcha, CapMonster Cloud, 2captcha's v2, rucaptcha's: numeric task ids, the
    /// shared error ids, and `cost`, `ip` and times with a solution.
    AntiCaptcha,
    /// CapSolver: text task ids, `errorId` 0 or 1, `status` on `createTask`, and nothing
    /// but `errorId`, `errorCode`, `errorDescription`, `taskId`, `status`, `solution`.
    CapSolver,
}

impl Dialect {
    /// The shape a request to `host` (as the caller named it) is answered in.
    pub fn of_host(host: Option<&str>) -> Dialect {
        let host = host.unwrap_or_default();
        let name = host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        });
        if name.eq_ignore_ascii_case("api.capsolver.com") {
            Dialect::CapSolver
        } else {
            Dialect::AntiCaptcha
        }
    }

    /// `createTask` accepted: the task's id.
    pub fn created(self, task_id: &str) -> String {
        let task_id = match (self, task_id.parse::<u64>()) {
            // Every createTask of anti-captcha's clients: written without the serializer.
            (Dialect::AntiCaptcha, Ok(number)) => {
                let mut text = String::with_capacity(48);
                text.push_str(r#"{"errorId":0,"taskId":"#);
                text.push_str(itoa::Buffer::new().format(number));
                text.push('}');
                return text;
            }
            _ => task_id,
        };
        let status = (self == Dialect::CapSolver).then_some("idle");
        Answer {
            task_id: Some(task_id),
            status,
            ..Answer::OK
        }
        .text()
    }

    /// `getTaskResult` of a task not solved yet: the answer most polls get.
    pub fn processing(self) -> String {
        r#"{"errorId":0,"status":"processing"}"#.to_owned()
    }

    /// `getTaskResult` of a solved task. `times`: when the task was created and when its
    /// answer came, unix seconds, for the shape that carries them.
    pub fn ready(self, solution: &Map<String, Value>, times: (u64, u64)) -> String {
        let answer = Answer {
            status: Some("ready"),
            solution: Some(solution),
            ..Answer::OK
        };
        match self {
            Dialect::AntiCaptcha => Answer {
                // keyrelay does not know what the service charged.
                cost: Some("0"),
                ip: Some(""),
                create_time: Some(times.0),
                end_time: Some(times.1),
                solve_count: Some(1),
                ..answer
            },
            Dialect::CapSolver => answer,
        }
        .text()
    }

    /// `getBalance`: the pool's balance (CapSolver's also lists packages: none here).
    pub fn balance(self, balance: f64) -> String {
        Answer {
            balance: Some(balance),
            packages: (self == Dialect::CapSolver).then_some(&[]),
            ..Answer::OK
        }
        .text()
    }

    /// A report recorded.
    pub fn reported(self) -> String {
        r#"{"errorId":0,"status":"success"}"#.to_owned()
    }

    /// An error. CapSolver's also says `"status": "failed"`: its client polls on past an
    /// error without it.
    pub fn error(self, error: &JsonError) -> String {
        let (id, status) = match self {
            Dialect::AntiCaptcha => (error.id, None),
            Dialect::CapSolver => (1, Some("failed")),
        };
        Answer {
            error_id: id,
            error_code: Some(&error.code),
            error_description: Some(&error.description),
            status,
            ..Answer::OK
        }
        .text()
    }
}

/// Every answer's fields, in the order clients expect to read them; those of `None` are
/// left out. Written straight to text, with no `Value` tree in between.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    error_id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_code: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_description: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    solution: Option<&'a Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    create_time: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_time: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    solve_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    balance: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    packages: Option<&'static [u8; 0]>,
}

impl Answer<'_> {
    const OK: Answer<'static> = Answer {
        error_id: 0,
        error_code: None,
        error_description: None,
        task_id: None,
        status: None,
        solution: None,
        cost: None,
        ip: None,
        create_time: None,
        end_time: None,
        solve_count: None,
        balance: None,
        packages: None,
    };

    fn text(&self) -> String {
        serde_json::to_string(self).expect("an answer of strings and numbers serializes")
    }
}

/// The solution in a solved `res.php` answer (`{"status":1,"request":…}` or `OK|…`), in
/// the fields clients read. keyrelay keeps no task type beside a pin, so a text answer
/// fills every field a client of any text-answered type reads: `text` (images),
/// `gRecaptchaResponse` (reCAPTCHA, hCaptcha) and `token` (Turnstile, and reCAPTCHA for
/// some clients). An object answer (GeeTest's) gives its fields, `geetest_` dropped. Every
/// value is a string, as clients check.
pub fn solution(body: &[u8]) -> Option<Map<String, Value>> {
    let text = std::str::from_utf8(body).ok()?.trim();
    let (answer, reply) = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(reply)) => (reply.get("request")?.clone(), Some(reply)),
        _ => (Value::String(text.strip_prefix("OK|")?.to_owned()), None),
    };
    let mut solution = Map::new();
    match answer {
        Value::Object(fields) => {
            for (name, value) in fields {
                let name = name.strip_prefix("geetest_").unwrap_or(&name).to_owned();
                solution.insert(name, Value::String(as_text(&value)));
            }
        }
        Value::Null => return None,
        other => {
            let answer = Value::String(as_text(&other));
            for field in ["text", "gRecaptchaResponse", "token"] {
                solution.insert(field.to_owned(), answer.clone());
            }
        }
    }
    let user_agent = reply.as_ref().and_then(|reply| {
        ["useragent", "user_agent", "userAgent"]
            .iter()
            .find_map(|name| reply.get(*name)?.as_str())
    });
    if let Some(agent) = user_agent {
        solution.insert("userAgent".to_owned(), Value::String(agent.to_owned()));
    }
    Some(solution)
}

fn as_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v(text: String) -> Value {
        serde_json::from_str(&text).expect("an answer is JSON")
    }

    #[test]
    fn the_host_picks_the_shape() {
        assert_eq!(
            Dialect::of_host(Some("api.capsolver.com")),
            Dialect::CapSolver
        );
        assert_eq!(
            Dialect::of_host(Some("API.CapSolver.com:443")),
            Dialect::CapSolver
        );
        for host in [
            None,
            Some("127.0.0.1:8080"),
            Some("api.anti-captcha.com"),
            Some("api.capmonster.cloud"),
            Some("api.capsolver.com.evil.test"),
        ] {
            assert_eq!(Dialect::of_host(host), Dialect::AntiCaptcha, "{host:?}");
        }
    }

    #[test]
    fn task_ids_are_numbers_for_anti_captcha_and_text_for_capsolver() {
        assert_eq!(
            v(Dialect::AntiCaptcha.created("7412")),
            json!({"errorId": 0, "taskId": 7412})
        );
        assert_eq!(
            v(Dialect::CapSolver.created("7412")),
            json!({"errorId": 0, "status": "idle", "taskId": "7412"})
        );
        // A text id stays text in either shape.
        assert_eq!(v(Dialect::AntiCaptcha.created("a-1"))["taskId"], "a-1");
    }

    #[test]
    fn capsolver_answers_carry_only_its_fields() {
        let allowed = [
            "errorId",
            "errorCode",
            "errorDescription",
            "taskId",
            "status",
            "solution",
        ];
        let solution = solution(b"OK|abc").unwrap();
        let error = JsonError::bad_parameters("why");
        for answer in [
            v(Dialect::CapSolver.created("1")),
            v(Dialect::CapSolver.processing()),
            v(Dialect::CapSolver.ready(&solution, (1, 2))),
            v(Dialect::CapSolver.error(&error)),
        ] {
            for field in answer.as_object().unwrap().keys() {
                assert!(allowed.contains(&field.as_str()), "{field} in {answer}");
            }
        }
        assert_eq!(v(Dialect::CapSolver.error(&error))["errorId"], 1);
        assert_eq!(v(Dialect::CapSolver.error(&error))["status"], "failed");
        assert_eq!(v(Dialect::AntiCaptcha.error(&error))["errorId"], 110);
        assert_eq!(
            v(Dialect::AntiCaptcha.error(&error))["errorCode"],
            "ERROR_BAD_PARAMETERS"
        );
        assert_eq!(
            v(Dialect::AntiCaptcha.error(&error))["errorDescription"],
            "why"
        );
    }

    #[test]
    fn ready_balance_and_report_answers_carry_their_fields() {
        let solution = solution(b"OK|abc").unwrap();
        let ready = v(Dialect::AntiCaptcha.ready(&solution, (10, 12)));
        assert_eq!(ready["status"], "ready");
        assert_eq!(ready["solution"]["text"], "abc");
        assert_eq!(
            (ready["createTime"].as_u64(), ready["endTime"].as_u64()),
            (Some(10), Some(12))
        );
        assert_eq!(ready["cost"], "0");
        assert_eq!(
            v(Dialect::AntiCaptcha.balance(12.5)),
            json!({"errorId": 0, "balance": 12.5})
        );
        assert_eq!(
            v(Dialect::CapSolver.balance(12.5)),
            json!({"errorId": 0, "balance": 12.5, "packages": []})
        );
        assert_eq!(
            v(Dialect::AntiCaptcha.reported()),
            json!({"errorId": 0, "status": "success"})
        );
        assert_eq!(
            v(Dialect::AntiCaptcha.processing()),
            json!({"errorId": 0, "status": "processing"})
        );
    }

    #[test]
    fn a_text_answer_fills_every_text_field() {
        for body in [
            &b"OK|03AGdBq24"[..],
            br#"{"status":1,"request":"03AGdBq24"}"#,
        ] {
            let solution = solution(body).unwrap();
            for field in ["text", "gRecaptchaResponse", "token"] {
                assert_eq!(solution[field], "03AGdBq24");
            }
        }
        // A numeric answer (an image of digits) is text too.
        assert_eq!(
            solution(br#"{"status":1,"request":4021}"#).unwrap()["text"],
            "4021"
        );
    }

    #[test]
    fn an_object_answer_gives_string_fields_and_the_user_agent() {
        let body = br#"{"status":1,"request":{"geetest_challenge":"c","geetest_validate":"v","geetest_seccode":"s","n":5},"useragent":"UA"}"#;
        let solution = solution(body).unwrap();
        assert_eq!(solution["challenge"], "c");
        assert_eq!(solution["validate"], "v");
        assert_eq!(solution["seccode"], "s");
        assert_eq!(solution["n"], "5");
        assert_eq!(solution["userAgent"], "UA");
        assert!(solution.values().all(Value::is_string));
    }

    #[test]
    fn no_solution_in_anything_else() {
        for body in [
            &b"CAPCHA_NOT_READY"[..],
            b"",
            b"<html>",
            br#"{"status":1}"#,
            br#"{"status":1,"request":null}"#,
            b"\xff\xfe",
        ] {
            assert_eq!(solution(body), None, "{body:?}");
        }
    }
}
