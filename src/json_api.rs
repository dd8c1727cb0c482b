//! The JSON task API (`createTask`, `getTaskResult`, `getBalance`, the reports), pure: the
//! methods, the request bodies, the task types translated into `in.php` params, and the
//! answers in each client's shape. The proxy's JSON front (`proxy/json_front.rs`) serves
//! them through the same pool, pins and accounting as `in.php` / `res.php`.
//!
//! Layout: `tasks` (task types → `in.php`) and `shape` (answers per [`Dialect`]) over the
//! leaf `codes` ([`JsonError`], the shared error ids).

mod codes;
mod shape;
mod tasks;

pub use codes::{JsonError, UNMAPPED};
pub use shape::{solution, Dialect};
pub use tasks::{translate, TaskType, Translated, TASK_TYPES};

use serde_json::{Map, Value};

/// A method of the JSON API, by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JsonMethod {
    CreateTask,
    GetTaskResult,
    GetBalance,
    /// `reportIncorrectImageCaptcha`, `reportIncorrectRecaptcha` and
    /// `reportIncorrectHcaptcha`: `reportbad`.
    ReportIncorrect,
    /// `reportCorrectRecaptcha`: `reportgood`.
    ReportCorrect,
}

impl JsonMethod {
    /// The method `path` names, if it is one of the JSON API's; `None` for paths that are
    /// not the JSON API's at all (the `in.php` generation's, the operator's).
    pub fn from_path(path: &str) -> Option<JsonMethod> {
        let name = path.strip_prefix('/')?.trim_end_matches('/');
        Some(match name {
            "createTask" => JsonMethod::CreateTask,
            "getTaskResult" => JsonMethod::GetTaskResult,
            "getBalance" => JsonMethod::GetBalance,
            "reportIncorrectImageCaptcha"
            | "reportIncorrectRecaptcha"
            | "reportIncorrectHcaptcha" => JsonMethod::ReportIncorrect,
            "reportCorrectRecaptcha" => JsonMethod::ReportCorrect,
            _ => return None,
        })
    }

    /// Metric and log label.
    pub fn label(self) -> &'static str {
        match self {
            JsonMethod::CreateTask => "createTask",
            JsonMethod::GetTaskResult => "getTaskResult",
            JsonMethod::GetBalance => "getBalance",
            JsonMethod::ReportIncorrect => "reportIncorrect",
            JsonMethod::ReportCorrect => "reportCorrect",
        }
    }
}

/// The hosts of the services that speak the JSON API: a path there that is none of its
/// methods is answered `ERROR_NO_SUCH_METHOD` in the JSON shape.
pub const JSON_API_HOSTS: &[&str] = &[
    "api.anti-captcha.com",
    "api.capmonster.cloud",
    "api.capsolver.com",
    "api.2captcha.com",
    "api.rucaptcha.com",
];

/// Whether `host` (as a request names it, perhaps with a port) is a JSON API service's.
pub fn is_json_api_host(host: &str) -> bool {
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    let name = name.trim_end_matches('.');
    JSON_API_HOSTS.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// A JSON API request body, read: the fields keyrelay uses. `softId`, `callbackUrl`,
/// `appId`, `languagePool` and any other field are accepted and ignored (`null` included):
/// tasks are polled.
#[derive(Debug, PartialEq)]
pub struct JsonRequest {
    /// `clientKey`, empty when absent.
    pub client_key: String,
    pub task: Option<Map<String, Value>>,
    /// `taskId` as text: a number, or a string of one.
    pub task_id: Option<String>,
}

impl JsonRequest {
    /// Reads a request body.
    ///
    /// # Errors
    /// A body that is not a JSON object, or a `clientKey`, `task` or `taskId` of the wrong
    /// shape: `ERROR_BAD_PARAMETERS`.
    pub fn parse(body: &[u8]) -> Result<JsonRequest, JsonError> {
        let fields = match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(fields)) => fields,
            Ok(_) => return Err(JsonError::bad_parameters("the body is not a JSON object")),
            Err(_) if body.iter().all(u8::is_ascii_whitespace) => Map::new(),
            Err(e) => {
                return Err(JsonError::bad_parameters(&format!(
                    "the body is not JSON: {e}"
                )))
            }
        };
        let client_key = match fields.get("clientKey") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(key)) => key.clone(),
            Some(_) => return Err(JsonError::bad_parameters("\"clientKey\" must be a string")),
        };
        let task = match fields.get("task") {
            None | Some(Value::Null) => None,
            Some(Value::Object(task)) => Some(task.clone()),
            Some(_) => return Err(JsonError::bad_parameters("\"task\" must be an object")),
        };
        let task_id = match fields.get("taskId") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.is_u64() => Some(n.to_string()),
            Some(Value::String(id)) if !id.trim().is_empty() => Some(id.trim().to_owned()),
            Some(_) => {
                return Err(JsonError::bad_parameters(
                    "\"taskId\" must be a task id: a whole number, or a string of one",
                ))
            }
        };
        Ok(JsonRequest {
            client_key,
            task,
            task_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_methods() {
        assert_eq!(
            JsonMethod::from_path("/createTask"),
            Some(JsonMethod::CreateTask)
        );
        assert_eq!(
            JsonMethod::from_path("/getTaskResult/"),
            Some(JsonMethod::GetTaskResult)
        );
        assert_eq!(
            JsonMethod::from_path("/reportIncorrectRecaptcha"),
            Some(JsonMethod::ReportIncorrect)
        );
        for path in ["/in.php", "/res.php", "/metrics", "/", "createTask", ""] {
            assert_eq!(JsonMethod::from_path(path), None, "{path}");
        }
    }

    #[test]
    fn a_body_gives_its_key_task_and_id() {
        let request = JsonRequest::parse(
            br#"{"clientKey":"tok","task":{"type":"ImageToTextTask","body":"QQ=="},"softId":0,"callbackUrl":null,"appId":"x"}"#,
        )
        .unwrap();
        assert_eq!(request.client_key, "tok");
        assert_eq!(request.task.unwrap()["type"], "ImageToTextTask");
        for (body, id) in [
            (&br#"{"taskId":7412}"#[..], Some("7412")),
            (br#"{"taskId":"7412"}"#, Some("7412")),
            (br#"{"taskId":null}"#, None),
            (b"", None),
        ] {
            assert_eq!(
                JsonRequest::parse(body).unwrap().task_id.as_deref(),
                id,
                "{body:?}"
            );
        }
    }

    #[test]
    fn a_malformed_body_is_bad_parameters() {
        for body in [
            &b"{"[..],
            b"[1,2]",
            b"\"text\"",
            br#"{"clientKey":5}"#,
            br#"{"task":"ImageToTextTask"}"#,
            br#"{"taskId":-1}"#,
            br#"{"taskId":1.5}"#,
            br#"{"taskId":{}}"#,
            br#"{"taskId":""}"#,
            b"\xff",
        ] {
            let error = JsonRequest::parse(body).unwrap_err();
            assert_eq!(error.code, "ERROR_BAD_PARAMETERS", "{body:?}");
        }
    }
}
