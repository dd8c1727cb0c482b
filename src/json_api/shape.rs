//! The JSON API's answers, in the shape each client reads: anti-captcha's (CapMonster's and
//! 2captcha's v2 are the same) on keyrelay's own listeners and those services' hosts, and
//! CapSolver's on its host, whose client rejects any field beyond its own few.

use serde_json::{json, Map, Value};

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
    pub fn created(self, task_id: &str) -> Value {
        match self {
            Dialect::AntiCaptcha => match task_id.parse::<u64>() {
                Ok(number) => json!({"errorId": 0, "taskId": number}),
                Err(_) => json!({"errorId": 0, "taskId": task_id}),
            },
            Dialect::CapSolver => json!({"errorId": 0, "status": "idle", "taskId": task_id}),
        }
    }

    /// `getTaskResult` of a task not solved yet.
    pub fn processing(self) -> Value {
        json!({"errorId": 0, "status": "processing"})
    }

    /// `getTaskResult` of a solved task. `times`: when the task was created and when its
    /// answer came, unix seconds, for the shape that carries them.
    pub fn ready(self, solution: Map<String, Value>, times: (u64, u64)) -> Value {
        match self {
            Dialect::AntiCaptcha => json!({
                "errorId": 0,
                "status": "ready",
                "solution": solution,
                // keyrelay does not know what the service charged.
                "cost": "0",
                "ip": "",
                "createTime": times.0,
                "endTime": times.1,
                "solveCount": 1,
            }),
            Dialect::CapSolver => json!({"errorId": 0, "status": "ready", "solution": solution}),
        }
    }

    /// `getBalance`: the pool's balance (CapSolver's also lists packages: none here).
    pub fn balance(self, balance: f64) -> Value {
        match self {
            Dialect::AntiCaptcha => json!({"errorId": 0, "balance": balance}),
            Dialect::CapSolver => json!({"errorId": 0, "balance": balance, "packages": []}),
        }
    }

    /// A report recorded.
    pub fn reported(self) -> Value {
        json!({"errorId": 0, "status": "success"})
    }

    /// An error. CapSolver's also says `"status": "failed"`: its client polls on past an
    /// error without it.
    pub fn error(self, error: &JsonError) -> Value {
        match self {
            Dialect::AntiCaptcha => json!({
                "errorId": error.id,
                "errorCode": error.code,
                "errorDescription": error.description,
            }),
            Dialect::CapSolver => json!({
                "errorId": 1,
                "errorCode": error.code,
                "errorDescription": error.description,
                "status": "failed",
            }),
        }
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
            Dialect::AntiCaptcha.created("7412"),
            json!({"errorId": 0, "taskId": 7412})
        );
        assert_eq!(
            Dialect::CapSolver.created("7412"),
            json!({"errorId": 0, "status": "idle", "taskId": "7412"})
        );
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
            Dialect::CapSolver.created("1"),
            Dialect::CapSolver.processing(),
            Dialect::CapSolver.ready(solution, (1, 2)),
            Dialect::CapSolver.error(&error),
        ] {
            for field in answer.as_object().unwrap().keys() {
                assert!(allowed.contains(&field.as_str()), "{field} in {answer}");
            }
        }
        assert_eq!(Dialect::CapSolver.error(&error)["errorId"], 1);
        assert_eq!(Dialect::AntiCaptcha.error(&error)["errorId"], 110);
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
