//! Task ids as the service issues them, and which spellings of one keyrelay accepts from a
//! caller: a protocol fact, kept here so every store and handler reads ids the same way.

/// Longest task id keyrelay accepts, in bytes. CaptchaAI's ids are 11-digit integers; the
/// bound leaves room for other 2captcha-compatible services' forms (a UUID is 36) while
/// keeping every id short enough to remember, log and send without a second thought.
pub const MAX_TASK_ID_LEN: usize = 64;

/// Characters a task id may hold besides ASCII letters and digits. None of them separates
/// anything in the protocol (`,` splits `ids=` lists, `|` joins answers) or needs escaping.
pub const TASK_ID_PUNCTUATION: &[u8] = b"-_.";

/// A task id as the upstream issued it. Ids are numeric on CaptchaAI, so they are kept as
/// integers (8 bytes, no allocation); anything else is kept verbatim, so another
/// 2captcha-compatible upstream with text ids still works.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TaskId {
    Num(u64),
    Text(Box<str>),
}

/// Why a caller's id cannot name any task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadTaskId {
    /// Empty or only whitespace.
    Blank,
    /// Longer than [`MAX_TASK_ID_LEN`].
    TooLong,
    /// A character outside ASCII letters, digits and [`TASK_ID_PUNCTUATION`].
    Alphabet,
}

impl TaskId {
    /// Reads an id from a caller's parameter or an upstream answer; `None` if it is blank or
    /// cannot be a task id (see [`TaskId::read`]).
    pub fn parse(raw: &str) -> Option<TaskId> {
        TaskId::read(raw).ok()
    }

    /// Reads an id, saying why it cannot be one. Surrounding whitespace is ignored. A
    /// decimal id names the same task with or without leading zeros ("0123" is 123), as the
    /// service reads it as a number: one task must not get two pins, or a poll of one
    /// spelling would miss the thread the other holds.
    ///
    /// # Errors
    /// [`BadTaskId`]: blank, longer than [`MAX_TASK_ID_LEN`] bytes, or outside the alphabet.
    pub fn read(raw: &str) -> Result<TaskId, BadTaskId> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(BadTaskId::Blank);
        }
        if raw.len() > MAX_TASK_ID_LEN {
            return Err(BadTaskId::TooLong);
        }
        if !raw.bytes().all(is_id_byte) {
            return Err(BadTaskId::Alphabet);
        }
        if !raw.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(TaskId::Text(raw.into()));
        }
        let digits = match raw.trim_start_matches('0') {
            "" => "0",
            digits => digits,
        };
        // Digits only, so the one way parsing fails is a number beyond u64: kept as text,
        // still without its leading zeros.
        Ok(match digits.parse::<u64>() {
            Ok(n) => TaskId::Num(n),
            Err(_) => TaskId::Text(digits.into()),
        })
    }

    /// Whether `raw` is already this id's canonical spelling (what [`Display`] prints), so
    /// it can go upstream as sent; otherwise the canonical form is sent instead.
    ///
    /// [`Display`]: std::fmt::Display
    pub fn spelled_as(&self, raw: &str) -> bool {
        match self {
            TaskId::Num(_) => {
                raw.bytes().all(|b| b.is_ascii_digit()) && (raw.len() == 1 || !raw.starts_with('0'))
            }
            TaskId::Text(text) => **text == *raw,
        }
    }

    /// The id as [`Display`] prints it, without a `String`: a numeric id is written into
    /// `digits`. A cluster submit names its task three times, on every submit.
    ///
    /// [`Display`]: std::fmt::Display
    pub fn text<'a>(&'a self, digits: &'a mut itoa::Buffer) -> &'a str {
        match self {
            TaskId::Num(n) => digits.format(*n),
            TaskId::Text(text) => text,
        }
    }
}

fn is_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || TASK_ID_PUNCTUATION.contains(&b)
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskId::Num(n) => write!(f, "{n}"),
            TaskId::Text(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    #[test]
    fn task_ids_parse_numbers_and_keep_text() {
        assert_eq!(
            TaskId::parse(" 73000000001 "),
            Some(TaskId::Num(73000000001))
        );
        assert_eq!(TaskId::parse("abc-1"), Some(TaskId::Text("abc-1".into())));
        assert_eq!(TaskId::parse("  "), None);
        assert_eq!(TaskId::parse("0"), Some(TaskId::Num(0)));
        assert_eq!(
            TaskId::parse("18446744073709551615"),
            Some(TaskId::Num(u64::MAX))
        );
        assert_eq!(
            TaskId::parse("18446744073709551616"),
            Some(TaskId::Text("18446744073709551616".into()))
        );
        let uuid = "3f2b8c1e-0d4a-4e6b-9a7c-1b2d3e4f5a6b";
        assert_eq!(TaskId::parse(uuid), Some(TaskId::Text(uuid.into())));
    }

    #[test]
    fn leading_zeros_name_the_same_task() {
        assert_eq!(TaskId::parse("0123"), TaskId::parse("123"));
        assert_eq!(TaskId::parse("007"), Some(TaskId::Num(7)));
        assert_eq!(TaskId::parse("00"), Some(TaskId::Num(0)));
        assert_eq!(
            TaskId::parse("0018446744073709551616"),
            TaskId::parse("18446744073709551616")
        );
        assert_eq!(TaskId::parse("0123").unwrap().to_string(), "123");
        // Text ids are not numbers: their zeros are part of the id.
        assert_eq!(TaskId::parse("0a1"), Some(TaskId::Text("0a1".into())));
    }

    #[test]
    fn ids_outside_the_alphabet_or_too_long_are_refused() {
        assert_eq!(TaskId::read(""), Err(BadTaskId::Blank));
        assert_eq!(TaskId::read(" \t"), Err(BadTaskId::Blank));
        let longest = "1".repeat(MAX_TASK_ID_LEN);
        assert!(TaskId::read(&longest).is_ok());
        assert_eq!(
            TaskId::read(&format!("{longest}1")),
            Err(BadTaskId::TooLong)
        );
        assert_eq!(TaskId::read(&"9".repeat(4 << 20)), Err(BadTaskId::TooLong));
        for raw in [
            "+7", "1,2", "1|2", "1 2", "a/b", "%31", "1e3!", "٣", "é", "1\u{0}", "<x>",
        ] {
            assert!(TaskId::read(raw).is_err(), "{raw:?}");
        }
    }

    proptest! {
        /// Every accepted id is short, in the alphabet, and prints back to a spelling that
        /// reads as the same id and is its own canonical form.
        #[test]
        fn accepted_ids_round_trip_canonically(raw in "\\PC{0,80}") {
            if let Ok(id) = TaskId::read(&raw) {
                let shown = id.to_string();
                prop_assert!(shown.len() <= MAX_TASK_ID_LEN);
                prop_assert!(shown.bytes().all(is_id_byte));
                prop_assert_eq!(TaskId::read(&shown), Ok(id.clone()));
                prop_assert!(id.spelled_as(&shown));
                prop_assert_eq!(id.spelled_as(&raw), raw == shown);
                let mut digits = itoa::Buffer::new();
                prop_assert_eq!(id.text(&mut digits), shown.as_str());
            } else {
                let trimmed = raw.trim();
                prop_assert!(
                    trimmed.is_empty()
                        || trimmed.len() > MAX_TASK_ID_LEN
                        || !trimmed.bytes().all(is_id_byte)
                );
            }
        }

        /// Any number of leading zeros names the same task as none.
        #[test]
        fn zeros_before_a_number_do_not_change_the_task(n: u64, zeros in 0usize..20) {
            let padded = format!("{}{n}", "0".repeat(zeros));
            prop_assume!(padded.len() <= MAX_TASK_ID_LEN);
            prop_assert_eq!(TaskId::parse(&padded), Some(TaskId::Num(n)));
            prop_assert_eq!(TaskId::Num(n).spelled_as(&padded), zeros == 0);
            let (id, mut digits) = (TaskId::Num(n), itoa::Buffer::new());
            prop_assert_eq!(id.text(&mut digits), n.to_string());
        }

        /// Ids in the alphabet within the bound are accepted and kept as sent when not numbers.
        #[test]
        fn text_ids_in_the_alphabet_are_kept_verbatim(raw in "[A-Za-z._-][A-Za-z0-9._-]{0,63}") {
            prop_assert_eq!(TaskId::read(&raw), Ok(TaskId::Text(raw.as_str().into())));
        }
    }
}
