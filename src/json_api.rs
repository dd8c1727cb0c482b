//! The JSON task API (`createTask`, `getTaskResult`, `getBalance`, the reports), pure: the
//! methods, the request bodies, the task types translated into `in.php` params, and the
//! answers in each client's shape. The proxy's JSON front (`proxy/json_front.rs`) serves
//! them through the same pool, pins and accounting as `in.php` / `res.php`.
//!
//! Layout: `tasks` (task types → `in.php`) and `shape` (answers per [`Dialect`]) over the
//! leaf `codes` ([`JsonError`], the shared error ids).

mod codes;
mod fields;
mod shape;
mod tasks;

pub use codes::{JsonError, UNMAPPED};
pub use fields::Fields;
pub use shape::{solution, Dialect};
pub use tasks::{translate, TaskType, Translated, TASK_TYPES};

use std::borrow::Cow;

use serde_json::value::RawValue;

use fields::{scalar, Scalar};

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

/// A JSON API request body, read, borrowing from it: the fields keyrelay uses. `softId`,
/// `callbackUrl`, `appId`, `languagePool` and any other field are accepted and ignored
/// (`null` included): tasks are polled.
#[derive(Debug)]
pub struct JsonRequest<'a> {
    /// `clientKey`, empty when absent.
    pub client_key: Cow<'a, str>,
    pub task: Option<Fields<'a>>,
    /// `taskId` as text: a number, or a string of one.
    pub task_id: Option<Cow<'a, str>>,
}

/// The body's members keyrelay reads, each as written. A member given twice is refused.
#[derive(serde::Deserialize)]
struct Body<'a> {
    #[serde(rename = "clientKey", default, borrow)]
    client_key: Option<&'a RawValue>,
    /// Read in the one pass over the body: a task's image is most of it.
    #[serde(default, borrow)]
    task: Option<Fields<'a>>,
    #[serde(rename = "taskId", default, borrow)]
    task_id: Option<&'a RawValue>,
}

impl<'a> JsonRequest<'a> {
    /// Reads a request body.
    ///
    /// # Errors
    /// A body that is not a JSON object, a member given twice, or a `clientKey`, `task` or
    /// `taskId` of the wrong shape: `ERROR_BAD_PARAMETERS`.
    pub fn parse(body: &'a [u8]) -> Result<JsonRequest<'a>, JsonError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonRequest {
                client_key: Cow::Borrowed(""),
                task: None,
                task_id: None,
            });
        }
        let text = std::str::from_utf8(body)
            .map_err(|_| JsonError::bad_parameters("the body is not UTF-8 JSON"))?;
        let body: Body<'a> = serde_json::from_str(text)
            .map_err(|e| JsonError::bad_parameters(&format!("the body cannot be read: {e}")))?;
        let client_key = match body.client_key.map(scalar) {
            None | Some(Scalar::Null) => Cow::Borrowed(""),
            Some(Scalar::Text(key)) => key,
            Some(_) => return Err(JsonError::bad_parameters("\"clientKey\" must be a string")),
        };
        let task_id = match body.task_id.map(scalar) {
            None | Some(Scalar::Null) => None,
            Some(Scalar::Number(n)) if n.parse::<u64>().is_ok() => Some(Cow::Borrowed(n)),
            Some(Scalar::Text(id)) if !id.trim().is_empty() => Some(match id {
                Cow::Borrowed(id) => Cow::Borrowed(id.trim()),
                Cow::Owned(id) => Cow::Owned(id.trim().to_owned()),
            }),
            Some(_) => {
                return Err(JsonError::bad_parameters(
                    "\"taskId\" must be a task id: a whole number, or a string of one",
                ))
            }
        };
        Ok(JsonRequest {
            client_key,
            task: body.task,
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
        let task = request.task.unwrap();
        assert_eq!(
            task.get("type").map(|t| t.get()),
            Some("\"ImageToTextTask\"")
        );
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
            br#"{"taskId":1,"taskId":2}"#,
            br#"{"clientKey":"a","clientKey":"b"}"#,
            br#"{"task":{"type":"ImageToTextTask","body":"a","body":"b"}}"#,
            b"\xff",
        ] {
            let error = JsonRequest::parse(body).unwrap_err();
            assert_eq!(error.code, "ERROR_BAD_PARAMETERS", "{body:?}");
        }
    }
}
