//! Generated spellings of a param name, the encodings they travel in, and readers written
//! apart from keyrelay's: shared by the spelling properties (`tests/key_spellings.rs` for
//! `key`, `tests/decision_spellings.rs` for `action`, `id` and `ids`). Included with
//! `#[path]`, so the other test binaries do not build it.

#![allow(dead_code)]

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::FutureExt;
use proptest::prelude::*;
use proptest::test_runner::Config;

pub fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

pub fn occurrences(haystack: &[u8], needle: &str) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle.as_bytes())
        .count()
}

/// A spelling of `canonical` some reader takes for it: any ASCII case, padding a lenient
/// reader trims, and the suffixes PHP cuts (`[]`, `[x]`, a lone `[`, a NUL and what follows).
pub fn spelling(canonical: &'static str) -> impl Strategy<Value = String> {
    (
        prop::collection::vec(any::<bool>(), canonical.len()),
        prop::sample::select(vec!["", " ", "  ", "\t", "\u{feff}", "\u{200b}"]),
        prop::sample::select(vec![
            "", " ", "[]", "[0]", "[a][b]", "[", "\0", "\0junk", " []", "\u{a0}",
        ]),
    )
        .prop_map(move |(upper, prefix, suffix)| {
            let core: String = canonical
                .chars()
                .zip(upper)
                .map(|(c, up)| if up { c.to_ascii_uppercase() } else { c })
                .collect();
            format!("{prefix}{core}{suffix}")
        })
}

/// `name` urlencoded, each byte escaped or not as `escape` says, spaces maybe as `+`.
pub fn urlencode_name(name: &str, escape: &[bool]) -> String {
    name.bytes()
        .enumerate()
        .map(|(i, b)| {
            let escaped = escape
                .get(i % escape.len().max(1))
                .copied()
                .unwrap_or(false);
            match b {
                b' ' if !escaped => "+".to_owned(),
                b if b.is_ascii_alphanumeric() && !escaped => char::from(b).to_string(),
                b => format!("%{b:02X}"),
            }
        })
        .collect()
}

/// `name` as a JSON string, each character escaped as `\uXXXX` or not.
pub fn json_name(name: &str, escape: &[bool]) -> String {
    let mut out = String::from("\"");
    for (i, c) in name.chars().enumerate() {
        let escaped = escape
            .get(i % escape.len().max(1))
            .copied()
            .unwrap_or(false);
        if escaped || c.is_control() || c == '"' || c == '\\' {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// A Content-Disposition value naming the part `name` in one of the forms a multipart
/// reader accepts. Names with bytes a header cannot carry (NUL) are percent-escaped in
/// the RFC 5987 form only.
pub fn disposition(name: &str, form: usize) -> String {
    let header_safe = !name.contains(['\0', '"', '\'', '\\']) && !name.contains(char::is_control);
    let pct: String = name.bytes().map(|b| format!("%{b:02X}")).collect();
    if !header_safe {
        return format!("form-data; name*=UTF-8''{pct}");
    }
    // Halves for the continuation form, where the middle is a char boundary.
    let halves = name.split_at_checked(name.len() / 2);
    match (form % 9, halves) {
        (0, _) => format!("form-data; name=\"{name}\""),
        (1, _) => format!("form-data; name='{name}'"),
        (2, _) => format!("form-data; NAME=\"{name}\""),
        (3, _) => format!("form-data; name=\"other\"; name=\"{name}\""),
        (4, _) => format!("form-data; name=\"{name}\"; name=\"other\""),
        (5, _) => format!("form-data; name*=UTF-8''{pct}"),
        (6, _) => format!("form-data; name=\"{name}\"; filename=\"k.txt\""),
        (7, Some((first, rest))) => format!("form-data; name*0=\"{first}\"; name*1=\"{rest}\""),
        _ => {
            format!("form-data; name=\"other\"\r\nContent-Disposition: form-data; name=\"{name}\"")
        }
    }
}

/// Decoded urlencoded pairs, by the form_urlencoded crate.
pub fn form_pairs(raw: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(raw)
        .map(|(n, v)| (n.into_owned(), v.into_owned()))
        .collect()
}

/// Fields of a multipart body (file parts too), by multer.
pub fn multer_fields(body: Bytes, boundary: &str) -> Vec<(String, Vec<u8>)> {
    let stream = futures_util::stream::iter([Ok::<Bytes, Infallible>(body)]);
    let mut multipart = multer::Multipart::new(stream, boundary);
    async move {
        let mut fields = Vec::new();
        while let Some(field) = multipart.next_field().await.expect("multer reads a part") {
            let name = field.name().unwrap_or_default().to_owned();
            let bytes = field
                .bytes()
                .await
                .expect("multer reads its bytes")
                .to_vec();
            fields.push((name, bytes));
        }
        fields
    }
    .now_or_never()
    .expect("an in-memory body is read at once")
}

/// A reader's idea of "this is `canonical`", written apart from keyrelay's: case-insensitive
/// after trimming and cutting at `[` or NUL.
pub fn looks_like(name: &str, canonical: &str) -> bool {
    let cut = name.split(['[', '\0']).next().unwrap_or_default();
    let trimmed = cut.trim_matches(|c: char| {
        c.is_whitespace() || c.is_control() || matches!(c, '\u{feff}' | '\u{200b}')
    });
    trimmed.eq_ignore_ascii_case(canonical)
}

/// A multipart body of `parts` (each a Content-Disposition value and the part's bytes)
/// between `boundary`s, and its Content-Type.
pub fn multipart_body(boundary: &str, parts: &[(String, &[u8])]) -> (Option<String>, Vec<u8>) {
    let mut body = Vec::new();
    for (disposition, value) in parts {
        body.extend(format!("--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n").bytes());
        body.extend(*value);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{boundary}--\r\n").bytes());
    (
        Some(format!("multipart/form-data; boundary={boundary}")),
        body,
    )
}
