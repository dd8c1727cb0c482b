//! Keeps values typed into `proxy.toml` out of error messages: masks the parts of a TOML
//! document that may hold an API key, so that a parse error can quote its source line
//! without quoting a secret; rewrites toml's and serde's messages so they name the field and
//! the expected type but not the value; and decides how a string from the file may be
//! quoted in a validation message. A key typed into the wrong field (`keys_env = "0123…"`,
//! `listen = "0123…"`, `max_attempts = "0123…"`) would otherwise be printed, and on reload
//! logged.
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
    "tls",
    "cert",
    "forward",
    "tunnel",
    "ca",
    "access",
    "open",
    "max_threads",
    "admin",
    "cluster",
    "replica",
    "prefix",
    "replica_timeout",
    "timeout",
    "sync_interval",
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

/// `[section]` or `[[keys]]` whose names are all field-like: showing it tells the reader
/// which section broke, and a pasted key (`[0123…]`) is not field-like.
fn is_plain_header(trimmed: &str) -> bool {
    let Some(inner) = trimmed.trim_end().strip_prefix('[') else {
        return false;
    };
    let inner = inner.trim_start_matches('[');
    let Some(inner) = inner.strip_suffix(']') else {
        return false;
    };
    let inner = inner.trim_end_matches(']');
    !inner.trim().is_empty() && inner.split('.').all(|s| is_key_or_field_like(s.trim()))
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

// === values in messages ===

/// Strings shorter than this are quoted whole: no API key is that short (CaptchaAI's have
/// 32 characters), and a short typo such as `"5 minuts"` is best shown as typed.
const MAX_QUOTED: usize = 12;

/// How a string typed into the file appears in a validation message: quoted whole when it
/// cannot be a key (shorter than any key, or an upper-case variable name such as
/// `CAPTCHAAI_KEYS`, which keys, lower-case hex, are not), else as `a string ending …cdef`,
/// the fingerprint `ApiKey` shows, or just `a string` when too short for one.
pub(super) fn quoted(text: &str) -> String {
    if text.chars().count() < MAX_QUOTED || is_variable_name(text) {
        return format!("{text:?}");
    }
    match crate::ApiKey::new(text).fingerprint().as_str() {
        "…" => "a string".to_owned(),
        tail => format!("a string ending {tail}"),
    }
}

/// How an environment variable name from the file appears in a message: bare when
/// [`quoted`] would show it whole, else as its fingerprint.
pub(super) fn variable(name: &str) -> String {
    match quoted(name) {
        whole if whole.starts_with('"') => name.to_owned(),
        fingerprint => fingerprint.replacen("a string", "a name", 1),
    }
}

/// `A-Z`, `0-9` and `_`, with at least one `_` and one letter, not starting with a digit: the
/// shape environment variable names are given by convention.
fn is_variable_name(text: &str) -> bool {
    text.contains('_')
        && text.chars().any(|c| c.is_ascii_uppercase())
        && !text.starts_with(|c: char| c.is_ascii_digit())
        && text
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// A toml parse or type error as keyrelay shows it: toml's position and source line, from
/// a copy of the document with secrets (and the offending value) masked, and a message
/// that names no value. toml's own error is not kept: its `Display` and `Debug` carry
/// serde's message, which quotes the value (`invalid type: string "0123…", expected u32`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    shown: String,
    message: String,
    span: Option<std::ops::Range<usize>>,
}

impl ParseError {
    /// What went wrong, without any value from the file.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Byte range in the document that the error points at.
    pub fn span(&self) -> Option<std::ops::Range<usize>> {
        self.span.clone()
    }
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::error::Error for ParseError {}

/// `error`, raised while reading `text`, made safe to show.
pub(super) fn parse_error(text: &str, mut error: toml::de::Error) -> ParseError {
    let (message, value_at_fault) = safe_message(error.message());
    let span = error.span();
    let mut masked = mask_secrets(text).into_bytes();
    if let (true, Some(span)) = (value_at_fault, &span) {
        // The span of a type error is the value itself: its line shows the field, not it.
        for b in masked.get_mut(span.clone()).into_iter().flatten() {
            if !b.is_ascii_whitespace() {
                *b = MASK;
            }
        }
    }
    // Masking replaces whole UTF-8 sequences with ASCII or keeps them, except inside a span
    // cut mid-character, which from_utf8_lossy then shows as U+FFFD.
    let masked = String::from_utf8_lossy(&masked).into_owned();
    error.set_input(Some(&masked));
    let full = error.to_string();
    // toml prints the source excerpt, then its message; the excerpt is kept, the message
    // replaced. Without a span there is no excerpt, only the message and the field path.
    let shown = match (span.is_some(), full.rfind(error.message())) {
        (true, Some(at)) => format!("{}{message}", &full[..at]),
        _ => message.clone(),
    };
    ParseError {
        shown: shown.trim_end().to_owned(),
        message,
        span,
    }
}

/// toml's or serde's message with no value from the file in it, and whether it is about a
/// value (so the excerpt must hide that value too).
///
/// serde's type errors read `invalid type: <what> <value>, expected <type>` (and likewise
/// `invalid value` and `invalid length`), where `<value>` is the file's; they become
/// `invalid type: <what>, expected <type>`. Everything else keeps only the quoted names
/// that look like field names (`unknown field \`kee\``); any other quoted token, which could be
/// a pasted key, becomes its fingerprint.
fn safe_message(message: &str) -> (String, bool) {
    for prefix in ["invalid type: ", "invalid value: ", "invalid length "] {
        let Some(rest) = message.strip_prefix(prefix) else {
            continue;
        };
        // `<type>` comes from keyrelay's schema, so the last ", expected " is serde's own.
        let Some((found, expected)) = rest.rsplit_once(", expected ") else {
            return (format!("{}wrong type or value", prefix), true);
        };
        // `<what>` is serde's word for the kind (`string`, `floating point`, `sequence`);
        // the value, if any, starts at the first quote.
        let what = found
            .split(['`', '"', '\''])
            .next()
            .unwrap_or_default()
            .trim();
        let what = if what.is_empty() { "a value" } else { what };
        return (format!("{prefix}{what}, expected {expected}"), true);
    }
    (safe_quotes(message), false)
}

/// A serde message about one `[[keys]]` entry, made safe as [`parse_error`] does.
pub(super) fn safe(message: &str) -> String {
    safe_message(message).0
}

/// `message` with every token between backticks or double quotes that is not field-like
/// replaced by its fingerprint.
fn safe_quotes(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = rest[open..].chars().next().unwrap_or('`');
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            break;
        };
        let token = &after[..close];
        out.push_str(&rest[..open]);
        out.push(quote);
        if is_key_or_field_like(token) || token.chars().count() < MAX_QUOTED {
            out.push_str(token);
        } else {
            out.push_str(&crate::ApiKey::new(token).fingerprint());
        }
        out.push(quote);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
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
