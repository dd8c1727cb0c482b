//! A JSON object's members as they were written, borrowed from the request body: names
//! and raw values, read into scalars only where a value is used. A `createTask` runs for
//! every task, and building a `serde_json::Value` tree of it (and dropping it) cost more
//! than the rest of its translation.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::codes::JsonError;

/// An object's members in the order written. A name given twice is refused: which of the
/// two a service would read is its own choice.
#[derive(Debug, Default)]
pub struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

/// A value, read as far as a param needs it.
#[derive(Debug, PartialEq)]
pub enum Scalar<'a> {
    Null,
    Bool(bool),
    Text(Cow<'a, str>),
    /// A number, as written.
    Number(&'a str),
    /// An object or an array.
    Nested,
}

impl<'a> Fields<'a> {
    /// The members of the object `json`.
    ///
    /// # Errors
    /// Not an object, not JSON, or a name given twice: `ERROR_BAD_PARAMETERS`.
    pub fn parse(json: &'a str, what: &str) -> Result<Fields<'a>, JsonError> {
        serde_json::from_str(json)
            .map_err(|e| JsonError::bad_parameters(&format!("{what} is not a JSON object: {e}")))
    }

    /// The value of the member named `name`, in any case: CapMonster's client sends `Case`,
    /// anti-captcha's `case`. The exact name wins over another spelling.
    pub fn get(&self, name: &str) -> Option<&'a RawValue> {
        let exact = self.0.iter().find(|(n, _)| n == name);
        exact
            .or_else(|| self.0.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)))
            .map(|(_, value)| *value)
    }
}

/// What `raw` holds, strings unescaped (borrowed unless they had escapes).
pub fn scalar(raw: &RawValue) -> Scalar<'_> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => match serde_json::from_str::<&str>(text) {
            Ok(borrowed) => Scalar::Text(Cow::Borrowed(borrowed)),
            // Escapes: the unescaped text is a string of its own. RawValue checked the syntax.
            Err(_) => Scalar::Text(Cow::Owned(
                serde_json::from_str::<String>(text).unwrap_or_default(),
            )),
        },
        Some(b't') => Scalar::Bool(true),
        Some(b'f') => Scalar::Bool(false),
        Some(b'n') => Scalar::Null,
        Some(b'{' | b'[') => Scalar::Nested,
        _ => Scalar::Number(text),
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(FieldsVisitor(std::marker::PhantomData))
    }
}

struct FieldsVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for FieldsVisitor<'a> {
    type Value = Fields<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Fields<'a>, M::Error> {
        let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some(name) = map.next_key::<Name<'a>>()? {
            let value: &'a RawValue = map.next_value()?;
            if fields.iter().any(|(n, _)| *n == name.0) {
                return Err(serde::de::Error::custom(format!(
                    "\"{}\" is given twice",
                    name.0.chars().take(64).collect::<String>()
                )));
            }
            fields.push((name.0, value));
        }
        Ok(Fields(fields))
    }
}

/// A member's name: borrowed from the body unless it had escapes.
struct Name<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for NameVisitor<'a> {
            type Value = Name<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, name: &'de str) -> Result<Name<'a>, E> {
                Ok(Name(Cow::Borrowed(name)))
            }
            fn visit_str<E>(self, name: &str) -> Result<Name<'a>, E> {
                Ok(Name(Cow::Owned(name.to_owned())))
            }
        }
        deserializer.deserialize_str(NameVisitor(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_read_as_written_and_matched_in_any_case() {
        let json =
            r#"{"type":"ImageToTextTask","Case":true,"n":1.50,"s":"a\"b","z":null,"o":{"x":1}}"#;
        let fields = Fields::parse(json, "the task").unwrap();
        assert_eq!(fields.0.len(), 6);
        let get = |name| fields.get(name).map(scalar);
        assert_eq!(get("type"), Some(Scalar::Text("ImageToTextTask".into())));
        assert_eq!(get("case"), Some(Scalar::Bool(true)));
        assert_eq!(get("n"), Some(Scalar::Number("1.50")));
        assert_eq!(get("s"), Some(Scalar::Text("a\"b".into())));
        assert_eq!(get("z"), Some(Scalar::Null));
        assert_eq!(get("o"), Some(Scalar::Nested));
        assert_eq!(get("missing"), None);
    }

    #[test]
    fn the_exact_name_wins_over_another_spelling() {
        let fields = Fields::parse(r#"{"Comment":"b","comment":"a"}"#, "the task").unwrap();
        assert_eq!(
            fields.get("comment").map(scalar),
            Some(Scalar::Text("a".into()))
        );
    }

    #[test]
    fn a_name_given_twice_or_a_non_object_is_refused() {
        for json in [
            r#"{"body":"a","body":"b"}"#,
            r#"{"b\u006fdy":"a","body":"b"}"#,
            "[1]",
            "\"text\"",
            "{",
            "",
        ] {
            let error = Fields::parse(json, "the task").unwrap_err();
            assert_eq!(error.code, "ERROR_BAD_PARAMETERS", "{json}");
        }
    }
}
