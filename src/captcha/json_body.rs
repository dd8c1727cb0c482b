//! JSON request bodies: a top-level object read as ordered `(name, raw value)` members, so a
//! member can be replaced while every other value is re-emitted byte for byte.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::param_name::spells;
use super::request_error::RequestError;

/// One member of the body object: its (unescaped) name and its value exactly as sent.
pub(super) type Member = (String, Box<RawValue>);

/// Parses a body that must be a single JSON object. Duplicate names are all kept, in order.
///
/// # Errors
/// `MalformedJson` for invalid or truncated JSON and for any top-level value but an object.
pub(super) fn parse(body: &[u8]) -> Result<Vec<Member>, RequestError> {
    match serde_json::from_slice::<Members>(body) {
        Ok(Members(members)) => Ok(members),
        Err(e) => Err(RequestError::MalformedJson {
            // serde's own message is not used: it can quote the input, which may hold a key.
            reason: match e.classify() {
                serde_json::error::Category::Data => "not a JSON object",
                serde_json::error::Category::Eof => "truncated",
                serde_json::error::Category::Syntax | serde_json::error::Category::Io => {
                    "syntax error"
                }
            },
            line: e.line(),
            column: e.column(),
        }),
    }
}

/// Members as params: strings unescaped, `null` as empty, everything else as its JSON text
/// (`1`, `true`, `[1,2]`), which is what a form-encoding client would have sent.
pub(super) fn params(members: &[Member]) -> Vec<(String, String)> {
    members
        .iter()
        .map(|(name, raw)| (name.clone(), param_value(raw)))
        .collect()
}

fn param_value(raw: &RawValue) -> String {
    let text = raw.get();
    if text.starts_with('"') {
        // RawValue checks the string's syntax but not its escapes, so a lone surrogate
        // (`"\ud800"`) fails here and reads as empty.
        serde_json::from_str(text).unwrap_or_default()
    } else if text == "null" {
        String::new()
    } else {
        text.to_owned()
    }
}

/// Re-emits the object with the first member that spells a name of `set` ([`spells`]:
/// `"Key"`, `" key"`, `"key[]"`, …) given that canonical name and the new value (as a JSON
/// string), and every later member spelling it dropped. Untouched values are copied byte for
/// byte; names are re-escaped by serde_json and whitespace between members is not kept,
/// which no JSON reader can tell apart. Marks in `placed` which names were written; returns
/// `None` when nothing matched, so the caller keeps the original bytes.
pub(super) fn splice(
    members: &[Member],
    set: &[(&str, &str)],
    placed: &mut [bool],
) -> Option<Vec<u8>> {
    let slots: Vec<Option<usize>> = members
        .iter()
        .map(|(name, _)| set.iter().position(|(n, _)| spells(name, n)))
        .collect();
    if slots.iter().all(Option::is_none) {
        return None;
    }
    let mut out = String::from("{");
    for ((name, raw), slot) in members.iter().zip(slots) {
        let (name, value) = match slot {
            None => (name.as_str(), raw.get().to_owned()),
            Some(slot) if !placed[slot] => {
                placed[slot] = true;
                (set[slot].0, json_string(set[slot].1))
            }
            Some(_) => continue,
        };
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&json_string(name));
        out.push(':');
        out.push_str(&value);
    }
    out.push('}');
    Some(out.into_bytes())
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("serializing a str to JSON cannot fail")
}

/// A JSON object read as an ordered list, which `serde_json::Map` (sorted, deduplicated)
/// cannot give.
struct Members(Vec<Member>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MembersVisitor)
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry::<String, Box<RawValue>>()? {
            members.push(member);
        }
        Ok(Members(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn malformed(body: &str) -> &'static str {
        match parse(body.as_bytes()) {
            Err(RequestError::MalformedJson { reason, .. }) => reason,
            other => panic!("{body:?} gave {other:?}"),
        }
    }

    #[test]
    fn members_keep_order_duplicates_and_raw_values() {
        let members =
            parse(br#" {"b": [1, {"x":"y"}] ,"a":1.50e1,"b":"\u00e9\n","n":null,"t":true} "#)
                .expect("valid object");
        let raw: Vec<(&str, &str)> = members.iter().map(|(n, v)| (n.as_str(), v.get())).collect();
        assert_eq!(
            raw,
            [
                ("b", r#"[1, {"x":"y"}]"#),
                ("a", "1.50e1"),
                ("b", r#""\u00e9\n""#),
                ("n", "null"),
                ("t", "true"),
            ]
        );
        let params = params(&members);
        let params: Vec<(&str, &str)> = params
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            params,
            [
                ("b", r#"[1, {"x":"y"}]"#),
                ("a", "1.50e1"),
                ("b", "é\n"),
                ("n", ""),
                ("t", "true"),
            ]
        );
    }

    #[test]
    fn malformed_bodies_say_why_without_quoting_input() {
        assert_eq!(malformed(r#"["key-1234567890"]"#), "not a JSON object");
        assert_eq!(malformed(r#""secret-key-value""#), "not a JSON object");
        assert_eq!(malformed("42"), "not a JSON object");
        assert_eq!(malformed(r#"{"key":"abc""#), "truncated");
        assert_eq!(malformed(r#"{"key":"#), "truncated");
        assert_eq!(malformed(r#"{"key" "abc"}"#), "syntax error");
        assert_eq!(malformed(r#"{"key":"abc"} trailing"#), "syntax error");
        assert_eq!(malformed(r#"{"a":1}{"b":2}"#), "syntax error");
        assert_eq!(malformed(r#"{"\ud800":1}"#), "syntax error");
        assert_eq!(malformed("\u{feff}{}"), "syntax error");
        let err = parse(br#"{"key":"secret-key-value" x}"#).expect_err("invalid");
        assert!(!err.to_string().contains("secret"), "{err}");
        assert_eq!(
            err.to_string(),
            "malformed JSON body: syntax error at line 1, column 27"
        );
    }

    #[test]
    fn a_lone_surrogate_value_reads_as_empty_and_is_kept_raw() {
        let members = parse(br#"{"k":"\ud800"}"#).expect("RawValue accepts it");
        assert_eq!(params(&members), [("k".to_owned(), String::new())]);
        assert_eq!(members[0].1.get(), r#""\ud800""#);
    }

    #[test]
    fn invalid_utf8_is_malformed_not_a_panic() {
        assert!(parse(b"{\"k\":\"\xff\"}").is_err());
        assert!(parse(b"{\"\xc3\":1}").is_err());
    }

    #[test]
    fn splice_without_a_match_changes_nothing() {
        let members = parse(br#"{"a":1}"#).expect("valid");
        let mut seen = [false];
        assert_eq!(splice(&members, &[("key", "k")], &mut seen), None);
        assert_eq!(seen, [false]);
    }

    #[test]
    fn splice_of_an_empty_object_is_none() {
        let members = parse(b"{ }").expect("valid");
        assert!(members.is_empty());
        assert_eq!(splice(&members, &[("key", "k")], &mut [false]), None);
    }

    #[test]
    fn deeply_nested_values_are_kept_raw_without_overflowing_the_stack() {
        let depth = 100_000;
        let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let body = format!(r#"{{"key":"old","deep":{nested}}}"#);
        let members = parse(body.as_bytes()).expect("RawValue skips nesting iteratively");
        let mut seen = [false];
        let spliced = splice(&members, &[("key", "new")], &mut seen).expect("key present");
        assert_eq!(
            spliced,
            format!(r#"{{"key":"new","deep":{nested}}}"#).into_bytes()
        );
    }
}
