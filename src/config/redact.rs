//! Masks the parts of a TOML document that may hold an API key, so that a parse error can
//! quote its source line without quoting a secret.
//!
//! toml's error display shows the whole line the error points at. A syntax error in
//! `key = 0123…` (unquoted), a duplicate `key` line, a typo'd field (`kee = "0123…"`) or a key
//! pasted on a line of its own would all print the key. The masked copy keeps the byte length
//! and every newline, so toml's spans and line numbers still point at the right place.

/// Fields whose whole line can be shown: none of them holds a key.
const PLAIN_FIELDS: &[&str] = &[
    "listen",
    "upstream",
    "refresh_interval",
    "keys_env",
    "name",
    "weight",
    "threads",
    "failover",
    "max_attempts",
    "retry_unsure_submits",
    "min_balance",
    "busy_cooldown",
    "transient_failures",
    "transient_cooldown",
    "backoff_base",
    "backoff_max",
    "pins",
    "ttl",
    "max_pins",
    "limits",
    "max_body",
    "timeouts",
    "connect",
    "request",
    "solve",
    "refresh",
];

/// What stands in for each masked byte.
const MASK: u8 = b'*';

/// A copy of `text` in which every part of a line that could hold a key is replaced by `*`,
/// byte for byte. Shown unchanged: blank lines, plain table headers, and the first value
/// assigned to a known non-secret field. Any other assignment (`key`, `keys`, an unknown
/// field) keeps its field name and loses its value. Everything else (comments, stray text,
/// continuation lines of multi-line strings) is masked whole: there is no telling what it
/// holds.
pub(super) fn mask_secrets(text: &str) -> String {
    let masked: Vec<String> = text.split('\n').map(mask_line).collect();
    masked.join("\n")
}

fn mask_line(line: &str) -> String {
    let trimmed = line.trim_start();
    if trimmed.trim_end().is_empty() || is_plain_header(trimmed) {
        return line.to_owned();
    }
    match assignment_field(line) {
        Some((field, eq)) if all_segments_in(field, PLAIN_FIELDS) => {
            // Only the first value is known to belong to the plain field: in
            // `name = "a", key = "0123…"` the rest of the line is another field.
            let end = eq + 1 + scalar_len(&line[eq + 1..]);
            let (shown, rest) = line.split_at(end);
            if rest.trim().is_empty() {
                line.to_owned()
            } else {
                format!("{shown}{}", mask_bytes(rest))
            }
        }
        // toml's message names an unknown field anyway; only its value is withheld. A left
        // side that could be a pasted key (`0123…ef==` splits at its padding) is not shown.
        Some((field, eq)) if is_key_or_field_like(field) => {
            let (shown, value) = line.split_at(eq + 1);
            format!("{shown}{}", mask_bytes(value))
        }
        _ => mask_bytes(line),
    }
}

/// `[section]` or `[[keys]]` made only of bare-key characters: nothing there can be a secret
/// that toml would accept, and showing it tells the reader which section broke.
fn is_plain_header(trimmed: &str) -> bool {
    trimmed.starts_with('[')
        && trimmed.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '[' | ']' | '_' | '-' | '.' | ' ' | '\t' | '\r')
        })
}

/// The dotted field name left of the first `=` and the `=`'s byte index, when that left
/// side is made only of bare-key characters.
fn assignment_field(line: &str) -> Option<(&str, usize)> {
    let eq = line.find('=')?;
    let field = line[..eq].trim();
    let bare = !field.is_empty()
        && field
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ' | '\t'));
    bare.then_some((field, eq))
}

/// Byte length of the leading whitespace and first scalar value of `s`. Arrays and inline
/// tables count as nothing, so they are masked.
fn scalar_len(s: &str) -> usize {
    let value = s.trim_start();
    let lead = s.len() - value.len();
    let bytes = value.as_bytes();
    let len = match bytes.first() {
        Some(b'"') => {
            let mut escaped = false;
            let close = bytes.iter().enumerate().skip(1).find(|&(_, &b)| {
                let closes = b == b'"' && !escaped;
                escaped = b == b'\\' && !escaped;
                closes
            });
            close.map_or(value.len(), |(i, _)| i + 1)
        }
        Some(b'\'') => value[1..].find('\'').map_or(value.len(), |i| i + 2),
        Some(b'[' | b'{') => 0,
        _ => value
            .find(|c: char| c.is_whitespace() || c == '#' || c == ',')
            .unwrap_or(value.len()),
    };
    lead + len
}

/// Longest unknown field name shown: longer than every real field, shorter than API keys.
const MAX_SHOWN_UNKNOWN_FIELD: usize = 24;

/// `key`, `keys`, or a plausible misspelt field: short, lowercase letters and `_` only.
/// API keys have digits or capitals and are longer.
fn is_key_or_field_like(field: &str) -> bool {
    matches!(field, "key" | "keys")
        || (field.len() <= MAX_SHOWN_UNKNOWN_FIELD
            && field
                .chars()
                .all(|c| c.is_ascii_lowercase() || matches!(c, '_' | '.')))
}

fn all_segments_in(field: &str, names: &[&str]) -> bool {
    field.split('.').all(|s| names.contains(&s.trim()))
}

fn mask_bytes(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_whitespace() {
                b as char
            } else {
                MASK as char
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn keeps_plain_lines() {
        let text = "listen = \"127.0.0.1:8080\"\n\n[[keys]]\nname = \"a\\\"b\"\n[failover]\nmax_attempts = 0  \nupstream = 'http://h/?a=b'\n";
        assert_eq!(mask_secrets(text), text);
    }

    #[test]
    fn unknown_fields_keep_their_name_and_lose_their_value() {
        let text = format!("kee = \"{SECRET}\"\nmax_attempt = 3\n");
        assert_eq!(
            mask_secrets(&text),
            format!("kee = {}\nmax_attempt = *\n", "*".repeat(34))
        );
    }

    #[test]
    fn masks_what_follows_a_plain_value() {
        let text = format!("name = \"a\", key = \"{SECRET}\"\nweight = 2 # {SECRET}");
        let masked = mask_secrets(&text);
        assert_eq!(
            masked,
            format!(
                "name = \"a\"* *** * {}\nweight = 2 * {}",
                "*".repeat(34),
                "*".repeat(32)
            )
        );
    }

    #[test]
    fn masks_key_values_but_not_the_field_name() {
        let text = format!("[[keys]]\nkey = \"{SECRET}\"\n  key=x{SECRET}\n");
        let masked = mask_secrets(&text);
        assert_eq!(
            masked,
            format!(
                "[[keys]]\nkey = {}\n  key={}\n",
                "*".repeat(34),
                "*".repeat(33)
            )
        );
    }

    #[test]
    fn masks_inline_key_tables_unknown_fields_comments_and_stray_text() {
        let lines = [
            format!("keys = [{{ name = \"a\", key = \"{SECRET}\" }}]"),
            format!("kee = \"{SECRET}\""),
            format!("# key = \"{SECRET}\""),
            SECRET.to_owned(),
            format!("\"key\" = \"{SECRET}\""),
            format!("[[keys]] # {SECRET}"),
            format!("name = \"a\"; {SECRET} = 1"),
            format!("{SECRET}=="),
            format!("{SECRET} = \"x\""),
        ];
        for line in lines {
            let masked = mask_secrets(&line);
            assert_eq!(masked.len(), line.len(), "{line}");
            assert!(!masked.contains("0123456789"), "{line} -> {masked}");
        }
    }

    #[test]
    fn keeps_byte_offsets_and_newlines_with_multibyte_text() {
        let text = "kee = \"ключ\"\r\nlisten = \"x\"\n";
        let masked = mask_secrets(text);
        assert_eq!(masked.len(), text.len());
        assert_eq!(masked.find('\n'), text.find('\n'));
        assert!(masked.ends_with("\r\nlisten = \"x\"\n"));
    }
}
