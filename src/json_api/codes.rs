//! The JSON API's errors: the numeric ids anti-captcha and 2captcha's v2 share, and which
//! of them each `in.php` error code becomes, in one table.

/// An error as the JSON API answers it: `errorId`, `errorCode`, `errorDescription`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    pub id: u32,
    pub code: String,
    /// Always a string: some clients join it to the code.
    pub description: String,
}

/// `errorId` of a service code with no JSON-API counterpart: its `errorCode` is the code as
/// the service gave it. Any non-zero id is an error to every client.
pub const UNMAPPED: u32 = 100;

/// `in.php` / `res.php` code (and the spellings that mean the same) → JSON id and code.
const TABLE: &[(&[&str], u32, &str)] = &[
    (
        &["ERROR_WRONG_USER_KEY", "ERROR_KEY_DOES_NOT_EXIST"],
        1,
        "ERROR_KEY_DOES_NOT_EXIST",
    ),
    (&["ERROR_NO_SLOT_AVAILABLE"], 2, "ERROR_NO_SLOT_AVAILABLE"),
    (
        &["ERROR_ZERO_CAPTCHA_FILESIZE", "ERROR_UPLOAD"],
        3,
        "ERROR_ZERO_CAPTCHA_FILESIZE",
    ),
    (
        &["ERROR_TOO_BIG_CAPTCHA_FILESIZE"],
        4,
        "ERROR_TOO_BIG_CAPTCHA_FILESIZE",
    ),
    (&["ERROR_ZERO_BALANCE"], 10, "ERROR_ZERO_BALANCE"),
    (&["ERROR_IP_NOT_ALLOWED"], 11, "ERROR_IP_NOT_ALLOWED"),
    (
        &["ERROR_CAPTCHA_UNSOLVABLE"],
        12,
        "ERROR_CAPTCHA_UNSOLVABLE",
    ),
    (&["ERROR_BAD_DUPLICATES"], 13, "ERROR_BAD_DUPLICATES"),
    (&["ERROR_NO_SUCH_METHOD"], 14, "ERROR_NO_SUCH_METHOD"),
    (
        &[
            "ERROR_IMAGE_TYPE_NOT_SUPPORTED",
            "ERROR_WRONG_FILE_EXTENSION",
        ],
        15,
        "ERROR_IMAGE_TYPE_NOT_SUPPORTED",
    ),
    (
        &[
            "ERROR_WRONG_CAPTCHA_ID",
            "ERROR_NO_SUCH_CAPCHA_ID",
            "ERROR_WRONG_ID_FORMAT",
        ],
        16,
        "ERROR_NO_SUCH_CAPCHA_ID",
    ),
    (
        &["IP_BANNED", "ERROR_IP_BANNED", "ERROR_IP_BLOCKED"],
        21,
        "ERROR_IP_BLOCKED",
    ),
    (&["ERROR_TASK_ABSENT"], 22, "ERROR_TASK_ABSENT"),
    (
        &["ERROR_TASK_NOT_SUPPORTED"],
        23,
        "ERROR_TASK_NOT_SUPPORTED",
    ),
    (
        &["ERROR_ACCOUNT_SUSPENDED", "ERROR_USER_BLOCKED"],
        55,
        "ERROR_ACCOUNT_SUSPENDED",
    ),
    (
        &[
            "ERROR_BAD_PARAMETERS",
            "ERROR_GOOGLEKEY",
            "ERROR_PAGEURL",
            "ERROR_BAD_TOKEN_OR_PAGEURL",
            "ERROR_WRONG_GOOGLEKEY",
            "ERROR_EMPTY_ACTION",
        ],
        110,
        "ERROR_BAD_PARAMETERS",
    ),
    (&["ERROR_BAD_PROXY"], 130, "ERROR_BAD_PROXY"),
];

impl JsonError {
    fn new(id: u32, code: &str, description: &str) -> JsonError {
        JsonError {
            id,
            code: code.to_owned(),
            description: description.to_owned(),
        }
    }

    /// What the service's `code` (an `in.php` / `res.php` error) is in the JSON API, with
    /// `description` to explain it.
    pub fn from_service(code: &str, description: &str) -> JsonError {
        let code = code.trim();
        match TABLE.iter().find(|(codes, _, _)| codes.contains(&code)) {
            Some((_, id, json_code)) => JsonError::new(*id, json_code, description),
            None => JsonError::new(UNMAPPED, code, description),
        }
    }

    pub fn bad_parameters(description: &str) -> JsonError {
        JsonError::new(110, "ERROR_BAD_PARAMETERS", description)
    }

    pub fn task_not_supported(task_type: &str) -> JsonError {
        let shown: String = task_type.chars().take(64).collect();
        JsonError::new(
            23,
            "ERROR_TASK_NOT_SUPPORTED",
            &format!("keyrelay cannot translate the task type \"{shown}\""),
        )
    }

    /// A task keyrelay translates, into a `method` no provider of the pool serves.
    pub fn not_served(method: &str) -> JsonError {
        JsonError::new(
            23,
            "ERROR_TASK_NOT_SUPPORTED",
            &format!("no key of this pool is at a provider that solves this task (in.php method {method})"),
        )
    }

    pub fn no_such_method() -> JsonError {
        JsonError::new(
            14,
            "ERROR_NO_SUCH_METHOD",
            "keyrelay serves createTask, getTaskResult, getBalance and the report methods",
        )
    }

    pub fn no_such_task() -> JsonError {
        JsonError::new(
            16,
            "ERROR_NO_SUCH_CAPCHA_ID",
            "no task of this client key has this taskId",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_maps_to_its_shared_id() {
        for (code, id, json) in [
            ("ERROR_WRONG_USER_KEY", 1, "ERROR_KEY_DOES_NOT_EXIST"),
            ("ERROR_NO_SLOT_AVAILABLE", 2, "ERROR_NO_SLOT_AVAILABLE"),
            ("ERROR_ZERO_BALANCE", 10, "ERROR_ZERO_BALANCE"),
            ("ERROR_CAPTCHA_UNSOLVABLE", 12, "ERROR_CAPTCHA_UNSOLVABLE"),
            ("ERROR_WRONG_CAPTCHA_ID", 16, "ERROR_NO_SUCH_CAPCHA_ID"),
            ("IP_BANNED", 21, "ERROR_IP_BLOCKED"),
            (" ERROR_PAGEURL ", 110, "ERROR_BAD_PARAMETERS"),
        ] {
            let error = JsonError::from_service(code, "why");
            assert_eq!((error.id, error.code.as_str()), (id, json), "{code}");
            assert_eq!(error.description, "why");
        }
    }

    #[test]
    fn an_unknown_code_keeps_its_text_under_the_unmapped_id() {
        let error = JsonError::from_service("ERROR_SOMETHING_NEW", "");
        assert_eq!(error.id, UNMAPPED);
        assert_eq!(error.code, "ERROR_SOMETHING_NEW");
    }

    #[test]
    fn no_two_rows_share_a_code_or_an_id() {
        let mut codes = std::collections::HashSet::new();
        let mut ids = std::collections::HashSet::new();
        for (spellings, id, _) in TABLE {
            assert!(ids.insert(*id), "id {id} twice");
            assert_ne!(*id, UNMAPPED);
            for code in *spellings {
                assert!(codes.insert(*code), "{code} twice");
            }
        }
    }
}
