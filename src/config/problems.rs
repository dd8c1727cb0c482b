//! The problem collector every validation step reports into ([`Problems`]), and the
//! wording its messages share. A leaf: `validate` and `keys` both write into it, and it
//! imports neither.

use std::fmt;

use toml::Value;

/// Validation problems in the order found, each `path: message`.
#[derive(Default)]
pub(super) struct Problems(Vec<String>);

impl Problems {
    pub(super) fn add(&mut self, path: impl fmt::Display, message: impl fmt::Display) {
        self.0.push(format!("{path}: {message}"));
    }

    /// Every problem found, in order, or `Ok` if there was none.
    pub(super) fn check(self) -> Result<(), Vec<String>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

/// The type of a TOML value with its article, for "got a string" messages.
pub(super) fn a_type(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date-time",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

/// `value` as an array of strings; a problem for it, or for each item that is not one,
/// naming its type and never its text.
pub(super) fn string_list(p: &mut Problems, field: &str, value: Value) -> Option<Vec<String>> {
    let Value::Array(items) = value else {
        p.add(
            field,
            format!("must be an array of names, got {}", a_type(&value)),
        );
        return None;
    };
    let mut names = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Value::String(name) => names.push(name),
            other => p.add(
                format!("{field}[{i}]"),
                format!("must be a string, got {}", a_type(&other)),
            ),
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_come_back_in_the_order_found_with_their_paths() {
        assert_eq!(Problems::default().check(), Ok(()));
        let mut p = Problems::default();
        p.add("listen", "first");
        p.add(format_args!("keys[{}]", 2), "second");
        assert_eq!(
            p.check(),
            Err(vec![
                "listen: first".to_owned(),
                "keys[2]: second".to_owned()
            ])
        );
    }

    #[test]
    fn every_toml_type_has_its_article() {
        let values: [(&str, &str); 7] = [
            ("\"x\"", "a string"),
            ("1", "an integer"),
            ("1.5", "a float"),
            ("true", "a boolean"),
            ("1979-05-27T07:32:00Z", "a date-time"),
            ("[1]", "an array"),
            ("{ a = 1 }", "a table"),
        ];
        for (text, expected) in values {
            let doc: toml::Table = toml::from_str(&format!("v = {text}")).expect("valid TOML");
            assert_eq!(a_type(&doc["v"]), expected, "{text}");
        }
    }
}
