//! Shared by keyrelay's fuzz targets: the input formats, and the checks each target makes.
//!
//! The request checks state keyrelay's key-rewrite contract (one canonical `key=<pool key>`
//! upstream, none of the caller's spellings) with readers and a spelling rule of their own:
//! `form_urlencoded` for the query and form bodies, multer and a small splitter for
//! multipart, serde_json for JSON, and [`spells_key`]. None of keyrelay's parsing is reused,
//! so a reading keyrelay gets wrong is not also the harness's reading.
//!
//! Every target is a plain function here ([`targets`]), so the `cargo test` replay in this
//! crate runs the seeds and any corpus through exactly what the fuzzer runs.

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::FutureExt;
use keyrelay::captcha::{BodyKind, ParsedRequest};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// Stands for the caller's key: every `$K` in a fuzz input is replaced with it, so the fuzzer
/// can place the key anywhere with two bytes. It starts with two non-hex letters and holds
/// no `%`, `+`, `&`, `=`, `;`, `\`, `"`, `'`, space or CR/LF, so no decoding or splitting
/// step (percent, form, JSON, multipart, lossy UTF-8) can cut an occurrence of it or make
/// one out of neighbouring bytes.
pub const CALLER_KEY: &str = "ZQcallerKEY0123456789zyxwvutsrqp";

/// The key keyrelay puts in. Plain alphanumerics: no encoding changes it.
pub const POOL_KEY: &str = "POOLKEY0123456789abcdef012345678";

const MARKER: &[u8] = b"$K";

/// Splits an input at its first `\n`: the line before it and everything after it (the whole
/// input and nothing when there is no `\n`).
pub fn split_line(data: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memchr(b'\n', data) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[]),
    }
}

/// `raw` with every `$K` replaced by [`CALLER_KEY`].
pub fn with_caller_key(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = memchr::memmem::find(rest, MARKER) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(CALLER_KEY.as_bytes());
        rest = &rest[at + MARKER.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Occurrences of the caller's key (it cannot overlap itself: `Z` occurs once in it).
pub fn caller_keys_in(bytes: &[u8]) -> usize {
    memchr::memmem::find_iter(bytes, CALLER_KEY.as_bytes()).count()
}

// === what counts as a spelling of `key` ===

/// Whether some reader could take `name`, already decoded once by its own encoding, for the
/// param `key`. The harness's own statement of the contract: cut at a NUL and at the first
/// `[`, trim whitespace, control and invisible characters from both ends, fold ASCII case;
/// and, when the name holds a `%`, the same once more on its percent-decoding.
///
/// "Invisible" is Unicode's Default_Ignorable_Code_Point set plus the soft hyphen: the
/// characters a renderer draws as nothing.
pub fn spells_key(name: &str) -> bool {
    is_key_as_is(name)
        || (name.contains('%')
            && is_key_as_is(&percent_encoding::percent_decode_str(name).decode_utf8_lossy()))
}

fn is_key_as_is(name: &str) -> bool {
    let cut = name.find(['\0', '[']).map_or(name, |at| &name[..at]);
    cut.trim_matches(is_invisible).eq_ignore_ascii_case("key")
}

fn is_invisible(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || matches!(
            u32::from(c),
            0x00AD
                | 0x034F
                | 0x061C
                | 0x115F..=0x1160
                | 0x17B4..=0x17B5
                | 0x180B..=0x180F
                | 0x200B..=0x200F
                | 0x202A..=0x202E
                | 0x2060..=0x206F
                | 0x3164
                | 0xFE00..=0xFE0F
                | 0xFEFF
                | 0xFFA0
                | 0xFFF0..=0xFFF8
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0000..=0xE0FFF
        )
}

/// Whether a `charset` parameter of `content_type` names a charset in which ASCII text is
/// not ASCII bytes, so that `key`, `=` and `&` could hide in the body.
pub fn has_ascii_incompatible_charset(content_type: &str) -> bool {
    const WIDE_OR_SHIFTED: [&str; 16] = [
        "utf-16", "utf16", "utf_16", "utf-32", "utf32", "utf_32", "ucs-2", "ucs2", "ucs-4", "ucs4",
        "utf-7", "utf7", "cp037", "ibm037", "cp1047", "ibm1047",
    ];
    let Some((_, params)) = content_type.split_once(';') else {
        return false;
    };
    split_outside_quotes(params.as_bytes(), b';', b"\"")
        .into_iter()
        .filter_map(|param| {
            let param = std::str::from_utf8(param).ok()?;
            let (name, value) = param.split_once('=')?;
            name.trim().eq_ignore_ascii_case("charset").then(|| {
                let value = value.trim();
                let value = value
                    .strip_prefix('"')
                    .map_or(value, |v| v.split('"').next().unwrap_or_default());
                value.trim().to_ascii_lowercase()
            })
        })
        .any(|charset| WIDE_OR_SHIFTED.iter().any(|c| charset.starts_with(c)))
}

/// `raw` split at every `stop` that is not inside a quoted string (opened by one of
/// `quotes`, closed by the same byte, `\` escaping the next byte inside).
fn split_outside_quotes<'a>(raw: &'a [u8], stop: u8, quotes: &[u8]) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut at = 0;
    while at < raw.len() {
        let byte = raw[at];
        at += 1;
        if byte == stop {
            pieces.push(&raw[start..at - 1]);
            start = at;
        } else if quotes.contains(&byte) {
            while at < raw.len() {
                let inner = raw[at];
                at += 1;
                if inner == b'\\' {
                    at += 1;
                } else if inner == byte {
                    break;
                }
            }
        }
    }
    pieces.push(&raw[start.min(raw.len())..]);
    pieces
}

// === one param as the harness reads it ===

/// A param (a urlencoded pair, a multipart part, a JSON member) as one location holds it.
#[derive(Debug)]
struct Item {
    /// What must survive unchanged: the pair's bytes, the part's headers and content, the
    /// member's name and raw value.
    id: Vec<u8>,
    /// Some reader could take it for `key`.
    spelled: bool,
    /// It is exactly keyrelay's canonical key: `key` and the pool key, nothing else.
    canonical: bool,
    /// Caller keys it carries in what the rewrite copies of it.
    caller_keys: usize,
}

/// Where, if anywhere, a location must hold the one canonical key after the rewrite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    Nowhere,
    AtFirstSpelling,
    Appended,
}

/// Checks a location (query or body) across the rewrite: no spelling left but the canonical
/// key where `placement` says, and every other param kept, in order.
fn check_location(what: &str, before: &[Item], after: &[Item], placement: Placement) {
    let spelled: Vec<(usize, &Item)> = after
        .iter()
        .enumerate()
        .filter(|(_, i)| i.spelled)
        .collect();
    let wanted = usize::from(placement != Placement::Nowhere);
    assert_eq!(
        spelled.len(),
        wanted,
        "{what}: {} params spelled `key` after the rewrite, want {wanted} ({placement:?}): {after:?}",
        spelled.len()
    );
    let kept_before: Vec<&[u8]> = before
        .iter()
        .filter(|i| !i.spelled)
        .map(|i| &i.id[..])
        .collect();
    let kept_after: Vec<&[u8]> = after
        .iter()
        .filter(|i| !i.spelled)
        .map(|i| &i.id[..])
        .collect();
    assert_eq!(
        kept_after, kept_before,
        "{what}: a param that is not `key` was lost, changed or moved"
    );
    if let Some(&(at, key)) = spelled.first() {
        assert!(
            key.canonical,
            "{what}: a caller's spelling of `key` survived: {key:?}"
        );
        let expected_at = match placement {
            Placement::AtFirstSpelling => before.iter().take_while(|i| !i.spelled).count(),
            _ => before.len(),
        };
        assert_eq!(
            at, expected_at,
            "{what}: the key is not at the first spelling's place"
        );
    }
}

// === the readers ===

/// Every non-empty `&`-separated pair of a query or form body, decoded by form_urlencoded.
fn url_items(raw: &[u8]) -> Vec<Item> {
    let canonical = format!("key={POOL_KEY}");
    raw.split(|&b| b == b'&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = form_urlencoded::parse(pair)
                .next()
                .expect("form_urlencoded reads a non-empty pair");
            Item {
                id: pair.to_vec(),
                spelled: spells_key(&name),
                canonical: pair == canonical.as_bytes() && name == "key" && value == POOL_KEY,
                // The decoded pair copies every raw occurrence (see CALLER_KEY).
                caller_keys: caller_keys_in(name.as_bytes()) + caller_keys_in(value.as_bytes()),
            }
        })
        .collect()
}

/// The members of a JSON object in order, duplicates kept: (unescaped name, raw value).
struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
        deserializer.deserialize_map(MembersVisitor)
    }
}

fn json_items(what: &str, body: &[u8]) -> Vec<Item> {
    let Members(members) = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!("serde_json cannot read the {what} JSON body keyrelay took: {e}")
    });
    let pool = format!("\"{POOL_KEY}\"");
    members
        .into_iter()
        .map(|(name, raw)| {
            let mut id = name.clone().into_bytes();
            id.push(0xff); // no UTF-8 name holds it
            id.extend_from_slice(raw.get().as_bytes());
            Item {
                spelled: spells_key(&name),
                canonical: name == "key" && raw.get() == pool,
                caller_keys: caller_keys_in(name.as_bytes()) + caller_keys_in(raw.get().as_bytes()),
                id,
            }
        })
        .collect()
}

/// A multipart body as the harness splits it: RFC 2046 delimiters (`--boundary` opening the
/// body or `CRLF--boundary`, transport padding, then CRLF or `--`), headers ended by an
/// empty line (CRLF or bare LF, as httparse-based readers accept).
struct Multipart<'a> {
    preamble: &'a [u8],
    parts: Vec<RawPart<'a>>,
    epilogue: &'a [u8],
}

struct RawPart<'a> {
    /// Headers, the empty line and the content: what the rewrite keeps or replaces.
    raw: &'a [u8],
    headers: Vec<(&'a [u8], &'a [u8])>,
}

fn split_multipart<'a>(body: &'a [u8], boundary: &str) -> Option<Multipart<'a>> {
    let dash = format!("--{boundary}");
    let delimiter = format!("\r\n--{boundary}");
    let (preamble, mut cursor) = if body.starts_with(dash.as_bytes()) {
        (&body[..0], dash.len())
    } else {
        let at = memchr::memmem::find(body, delimiter.as_bytes())?;
        (&body[..at], at + delimiter.len())
    };
    let mut parts = Vec::new();
    loop {
        let rest = &body[cursor..];
        if let Some(epilogue) = rest.strip_prefix(b"--") {
            return Some(Multipart {
                preamble,
                parts,
                epilogue,
            });
        }
        let padding = rest
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        if !rest[padding..].starts_with(b"\r\n") {
            return None;
        }
        let start = cursor + padding + 2;
        let end = start + memchr::memmem::find(&body[start..], delimiter.as_bytes())?;
        let part = &body[start..end];
        let mut headers = Vec::new();
        let mut line_start = 0;
        loop {
            let line_end = line_start + memchr::memchr(b'\n', &part[line_start..])?;
            let line = &part[line_start..line_end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            line_start = line_end + 1;
            if line.is_empty() {
                break;
            }
            let colon = memchr::memchr(b':', line).unwrap_or(line.len());
            let value = line.get(colon + 1..).unwrap_or_default();
            headers.push((trim_ows(&line[..colon]), trim_ows(value)));
        }
        parts.push(RawPart { raw: part, headers });
        cursor = end + delimiter.len();
    }
}

fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| matches!(b, b' ' | b'\t');
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

/// Every name a reader could take from one Content-Disposition value: each `name`, each
/// RFC 5987 `name*` (charset prefix cut, percent-decoded), and the RFC 2231 `name*0`,
/// `name*1`, … continuations joined; the parameters split as RFC 2045 does (only `"`
/// quotes) and as PHP does (`'` quotes too); quoted values with and without their
/// backslash escapes undone, unquoted ones cut at a space and not; and every `name=` a
/// quote-blind scan finds ([`quote_blind_names`]).
pub fn disposition_names(value: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    for quotes in [&b"\""[..], &b"\"'"[..]] {
        let mut continued: Vec<(u32, Vec<u8>)> = Vec::new();
        for param in split_outside_quotes(value, b';', quotes) {
            let Some(eq) = memchr::memchr(b'=', param) else {
                continue;
            };
            let name = trim_c_space(&param[..eq]).to_ascii_lowercase();
            let Some(ext) = name.strip_prefix(b"name") else {
                continue;
            };
            // PHP's getword skips the whole run of `=`, so `name=="key"` is `key` to it.
            let value = &param[eq + 1..];
            let after_run = &value[value.iter().take_while(|&&b| b == b'=').count()..];
            // Values are unquoted with either quote set, whatever split found them: a reader
            // may split as the RFC does and still strip `'` quotes.
            let mut readings = Vec::new();
            for value_quotes in [quotes, &b"\"'"[..]] {
                readings.extend(value_readings(value, value_quotes));
                readings.extend(value_readings(after_run, value_quotes));
            }
            match ext {
                b"" => names.extend(readings),
                b"*" => names.extend(readings.iter().map(|r| ext_value(r, true))),
                _ => {
                    let Some(index) = ext.strip_prefix(b"*") else {
                        continue;
                    };
                    let (index, encoded) = match index.strip_suffix(b"*") {
                        Some(index) => (index, true),
                        None => (index, false),
                    };
                    let Some(index) = std::str::from_utf8(index).ok().and_then(|i| i.parse().ok())
                    else {
                        continue;
                    };
                    // The first reading (escapes undone, cut at a space) for continuations.
                    let raw = readings.into_iter().next().unwrap_or_default();
                    let raw = if encoded {
                        ext_value(&raw, index == 0)
                    } else {
                        raw
                    };
                    continued.push((index, raw));
                }
            }
        }
        if !continued.is_empty() {
            continued.sort_by_key(|(index, _)| *index);
            names.push(continued.into_iter().flat_map(|(_, raw)| raw).collect());
        }
    }
    names.extend(quote_blind_names(value));
    names
        .into_iter()
        .map(|name| String::from_utf8_lossy(&name).into_owned())
        .collect()
}

/// The names a reader that does not split parameters at all finds, as multer does: every
/// `name` (any case) at the start or after whitespace or `;`, even inside another
/// parameter's quotes, then `=` and a `"`-quoted value (up to the next quote, escapes
/// honoured or not) or the text up to a `;` or whitespace.
fn quote_blind_names(value: &[u8]) -> Vec<Vec<u8>> {
    let lower = value.to_ascii_lowercase();
    let mut names = Vec::new();
    for at in memchr::memmem::find_iter(&lower, b"name") {
        if at > 0 && !is_c_space(value[at - 1]) && value[at - 1] != b';' {
            continue;
        }
        let after = trim_c_space_start(&value[at + 4..]);
        let Some(after) = after.strip_prefix(b"=") else {
            continue;
        };
        let after = trim_c_space_start(after);
        if let Some(quoted) = after.strip_prefix(b"\"") {
            let close = memchr::memchr(b'"', quoted).unwrap_or(quoted.len());
            names.push(quoted[..close].to_vec());
            names.extend(value_readings(after, b"\"").into_iter().take(1));
        } else {
            let end = after
                .iter()
                .position(|&b| b == b';' || is_c_space(b))
                .unwrap_or(after.len());
            names.push(after[..end].to_vec());
        }
    }
    names
}

fn trim_c_space_start(bytes: &[u8]) -> &[u8] {
    &bytes[bytes
        .iter()
        .position(|&b| !is_c_space(b))
        .unwrap_or(bytes.len())..]
}

/// The ways a reader may take a parameter value: quoted (escapes undone, or kept), or
/// unquoted (cut at the first space, or trimmed only).
fn value_readings(raw: &[u8], quotes: &[u8]) -> Vec<Vec<u8>> {
    let raw = trim_c_space(raw);
    match raw.first() {
        Some(quote) if quotes.contains(quote) => {
            let (mut unescaped, mut kept) = (Vec::new(), Vec::new());
            let mut at = 1;
            while let Some(&byte) = raw.get(at).filter(|&b| b != quote) {
                at += 1;
                kept.push(byte);
                if byte == b'\\' {
                    if let Some(&next) = raw.get(at) {
                        at += 1;
                        kept.push(next);
                        unescaped.push(next);
                    }
                } else {
                    unescaped.push(byte);
                }
            }
            vec![unescaped, kept]
        }
        _ => {
            let cut = raw.iter().position(|&b| is_c_space(b)).unwrap_or(raw.len());
            vec![raw[..cut].to_vec(), raw.to_vec()]
        }
    }
}

/// An RFC 5987 value decoded: the `charset'language'` prefix cut (if `prefixed` and the
/// value has one), then `%XX` decoded.
fn ext_value(raw: &[u8], prefixed: bool) -> Vec<u8> {
    let mut text = raw;
    if prefixed {
        let mut quotes = raw.iter().enumerate().filter(|(_, &b)| b == b'\'');
        if let (Some(_), Some((second, _))) = (quotes.next(), quotes.next()) {
            text = &raw[second + 1..];
        }
    }
    percent_encoding::percent_decode(text).collect()
}

fn is_c_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn trim_c_space(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|&b| !is_c_space(b))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|&b| !is_c_space(b))
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

/// The multipart body read two ways: the harness's split (every Content-Disposition of a
/// part, every way of reading it) and multer's field names where multer reads the same
/// parts. A part is a key spelling if either reading says so.
fn multipart_items<'a>(what: &str, body: &'a [u8], boundary: &str) -> (Multipart<'a>, Vec<Item>) {
    let split = split_multipart(body, boundary)
        .unwrap_or_else(|| panic!("the harness cannot split the {what} multipart body"));
    let multer_names: Option<Vec<Option<String>>> =
        multer_fields(Bytes::copy_from_slice(body), boundary)
            .filter(|fields| fields.len() == split.parts.len())
            .map(|fields| fields.into_iter().map(|f| f.name).collect());
    let canonical = format!("Content-Disposition: form-data; name=\"key\"\r\n\r\n{POOL_KEY}");
    let items = split
        .parts
        .iter()
        .enumerate()
        .map(|(at, part)| {
            let by_headers = part
                .headers
                .iter()
                .filter(|(name, _)| name.eq_ignore_ascii_case(b"content-disposition"))
                .any(|(_, value)| disposition_names(value).iter().any(|n| spells_key(n)));
            let by_multer = multer_names
                .as_ref()
                .and_then(|names| names[at].as_deref())
                .is_some_and(spells_key);
            Item {
                id: part.raw.to_vec(),
                spelled: by_headers || by_multer,
                canonical: part.raw == canonical.as_bytes(),
                caller_keys: caller_keys_in(part.raw),
            }
        })
        .collect();
    (split, items)
}

// === the request round trip ===

/// One round trip: parse, rewrite with the pool key, and read the result back.
/// - A body in an ASCII-incompatible charset is refused. A request that parses is rewritten,
///   and keyrelay parses the rewrite as the same kind of body, reading the pool key.
/// - Across the query and the body, exactly one param is spelled `key` afterwards, and it is
///   exactly `key` with the pool key: in the body, at the first body spelling's place, if the
///   body had a spelling; else in the query, at its first spelling's place; else appended to
///   the query. None of the caller's spellings survive.
/// - Every other param survives, in order, in its location; a location without a spelling
///   is copied byte for byte (the query with `key=<pool>` appended if no location had one).
/// - The caller's key survives only where a non-key param already carried it; in multipart
///   the count is exact: the body's count less what the key parts (text or file, however
///   named) held, so keys in the preamble, the epilogue or other parts are accounted for.
/// - Debug of a parsed request shows no caller key, unless a param name holds it.
pub fn check_request(query: &str, content_type: Option<&str>, body: &[u8]) {
    let parsed = ParsedRequest::parse(Some(query), content_type, Bytes::copy_from_slice(body));
    if let Some(content_type) = content_type {
        if !body.is_empty() && has_ascii_incompatible_charset(content_type) {
            assert!(
                parsed.is_err(),
                "a body in an ASCII-incompatible charset was accepted: {content_type:?}"
            );
        }
    }
    let Ok(request) = parsed else {
        return;
    };
    if !request
        .params()
        .iter()
        .any(|(n, _)| caller_keys_in(n.as_bytes()) > 0)
    {
        assert_eq!(caller_keys_in(format!("{request:?}").as_bytes()), 0);
    }

    let rewritten = request.rewrite(&[("key", POOL_KEY)]);
    let reparsed =
        ParsedRequest::parse(Some(&rewritten.query), content_type, rewritten.body.clone())
            .expect("a rewritten request parses like its original");
    assert_eq!(reparsed.kind(), request.kind(), "the body keeps its kind");
    assert_eq!(
        reparsed.param("key").as_deref(),
        Some(POOL_KEY),
        "keyrelay reads its own key back"
    );

    let query_before = url_items(query.as_bytes());
    let query_after = url_items(rewritten.query.as_bytes());
    let new_body = &rewritten.body[..];
    let mut multipart = None;
    let (body_before, body_after) = match request.kind() {
        BodyKind::Empty => (Vec::new(), url_items(new_body)),
        BodyKind::Form => (url_items(body), url_items(new_body)),
        BodyKind::Json => (
            json_items("original", body),
            json_items("rewritten", new_body),
        ),
        BodyKind::Multipart { boundary } => {
            let (split_before, before) = multipart_items("original", body, boundary);
            let (split_after, after) = multipart_items("rewritten", new_body, boundary);
            assert_eq!(
                split_after.preamble, split_before.preamble,
                "the preamble is kept"
            );
            assert_eq!(
                split_after.epilogue, split_before.epilogue,
                "the epilogue is kept"
            );
            multipart = Some(boundary.clone());
            (before, after)
        }
    };

    let query_had_key = query_before.iter().any(|i| i.spelled);
    let body_had_key = body_before.iter().any(|i| i.spelled);
    let (query_placement, body_placement) = match (body_had_key, query_had_key) {
        (true, _) => (Placement::Nowhere, Placement::AtFirstSpelling),
        (false, true) => (Placement::AtFirstSpelling, Placement::Nowhere),
        (false, false) => (Placement::Appended, Placement::Nowhere),
    };
    let had = format!("spellings before: query {query_had_key}, body {body_had_key}");
    check_location(
        &format!("query ({had})"),
        &query_before,
        &query_after,
        query_placement,
    );
    check_location(
        &format!("body ({had})"),
        &body_before,
        &body_after,
        body_placement,
    );

    if !query_had_key {
        let mut expected = query.to_owned();
        if !body_had_key {
            if !expected.is_empty() && !expected.ends_with('&') {
                expected.push('&');
            }
            expected.push_str("key=");
            expected.push_str(POOL_KEY);
        }
        assert_eq!(
            rewritten.query, expected,
            "a query without a key spelling is kept"
        );
    }
    if !body_had_key {
        assert_eq!(new_body, body, "a body without a key spelling is untouched");
    }

    let carried = |items: &[Item]| -> usize {
        items
            .iter()
            .filter(|i| !i.spelled)
            .map(|i| i.caller_keys)
            .sum()
    };
    assert!(
        caller_keys_in(rewritten.query.as_bytes()) <= carried(&query_before),
        "the caller's key survived in the query: {:?}",
        rewritten.query
    );
    if let Some(boundary) = multipart {
        let in_key_parts: usize = body_before
            .iter()
            .filter(|i| i.spelled)
            .map(|i| i.caller_keys)
            .sum();
        assert_eq!(
            caller_keys_in(new_body),
            caller_keys_in(body) - in_key_parts,
            "the caller's key survived in a multipart body"
        );
        check_multer_reads_one_key(new_body, &boundary, body_had_key);
    } else {
        assert!(
            caller_keys_in(new_body) <= carried(&body_before),
            "the caller's key survived in the body"
        );
    }
}

/// multer, reading the rewritten body on its own, finds the pool key as the one text field
/// spelled `key` if the body is where the key goes, and no such field otherwise.
fn check_multer_reads_one_key(body: &[u8], boundary: &str, body_has_key: bool) {
    let Some(fields) = multer_fields(Bytes::copy_from_slice(body), boundary) else {
        return;
    };
    let keys: Vec<&MulterField> = fields
        .iter()
        .filter(|f| f.name.as_deref().is_some_and(spells_key))
        .collect();
    assert_eq!(
        keys.len(),
        usize::from(body_has_key),
        "multer reads {} fields spelled `key` in the rewritten body: {:?}",
        keys.len(),
        keys.iter()
            .map(|f| (&f.name, &f.file_name))
            .collect::<Vec<_>>()
    );
    if let Some(key) = keys.first() {
        assert_eq!(key.name.as_deref(), Some("key"));
        assert_eq!(key.file_name, None, "the key part is a text field");
        assert_eq!(&key.bytes[..], POOL_KEY.as_bytes());
    }
}

/// One part as multer reads it.
pub struct MulterField {
    pub name: Option<String>,
    pub file_name: Option<String>,
    pub bytes: Bytes,
}

/// Every part of `body` as multer reads it; `None` if multer rejects the body.
pub fn multer_fields(body: Bytes, boundary: &str) -> Option<Vec<MulterField>> {
    let stream = futures_util::stream::iter([Ok::<Bytes, Infallible>(body)]);
    let mut multipart = multer::Multipart::new(stream, boundary);
    // The whole body is one ready chunk, so multer never waits: `now_or_never` cannot miss.
    async move {
        let mut fields = Vec::new();
        while let Some(field) = multipart.next_field().await.ok()? {
            let name = field.name().map(str::to_owned);
            let file_name = field.file_name().map(str::to_owned);
            let bytes = field.bytes().await.ok()?;
            fields.push(MulterField {
                name,
                file_name,
                bytes,
            });
        }
        Some(fields)
    }
    .now_or_never()
    .flatten()
}

// === parse_http ===

/// `ParsedRequest::parse_http` with arbitrary Content-Type and Content-Encoding headers:
/// - it never panics, and a request without a body is never refused;
/// - with a body, it refuses a Content-Type holding a non-ASCII byte, two Content-Types,
///   and any Content-Encoding coding but `identity`;
/// - otherwise it answers exactly as `parse` with that Content-Type, and what it accepts
///   passes the round trip of [`check_request`].
pub fn check_http(query: &str, headers: &http::HeaderMap, body: &[u8]) {
    let result = ParsedRequest::parse_http(Some(query), headers, Bytes::copy_from_slice(body));
    if body.is_empty() {
        assert!(
            result.is_ok(),
            "a request without a body was refused: {result:?}"
        );
        return;
    }
    let types: Vec<&http::HeaderValue> =
        headers.get_all(http::header::CONTENT_TYPE).iter().collect();
    let non_ascii_type = types.iter().any(|v| !v.as_bytes().is_ascii());
    let encoded = headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(trim_ows)
        .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity"));
    if non_ascii_type || types.len() > 1 || encoded {
        assert!(
            result.is_err(),
            "accepted: a body with Content-Type {types:?}, Content-Encoding {:?}",
            headers
                .get_all(http::header::CONTENT_ENCODING)
                .iter()
                .collect::<Vec<_>>()
        );
        return;
    }
    let content_type = types
        .first()
        .map(|v| v.to_str().expect("a visible-ASCII header value is a str"));
    let plain = ParsedRequest::parse(Some(query), content_type, Bytes::copy_from_slice(body));
    match (&result, &plain) {
        (Ok(http), Ok(plain)) => {
            assert_eq!(http.kind(), plain.kind());
            assert_eq!(http.params(), plain.params());
        }
        (Err(http), Err(plain)) => assert_eq!(http, plain),
        _ => panic!("parse_http and parse disagree: {result:?} vs {plain:?}"),
    }
    if result.is_ok() {
        check_request(query, content_type, body);
    }
}

/// The fuzz targets, as plain functions of the input bytes.
pub mod targets {
    use keyrelay::captcha::{
        classify, parse_balance, parse_reply, parse_threads, split_ids_reply, Outcome, Reply,
    };

    use super::{check_http, check_request, split_line, with_caller_key};

    /// The whole input is the query (UTF-8 only, as hyper gives it), with no body.
    pub fn request_query(data: &[u8]) {
        let Ok(query) = String::from_utf8(with_caller_key(data)) else {
            return;
        };
        check_request(&query, None, b"");
    }

    /// `query\nbody`, sent labelled urlencoded and unlabelled (guessed as form or JSON).
    pub fn request_form(data: &[u8]) {
        let (query, body) = split_line(data);
        let Ok(query) = String::from_utf8(with_caller_key(query)) else {
            return;
        };
        let body = with_caller_key(body);
        check_request(&query, Some("application/x-www-form-urlencoded"), &body);
        check_request(&query, None, &body);
    }

    /// `content-type\nquery\nbody`: the Content-Type carries the boundary, so its spelling
    /// (quoted, padded, odd bytes) is fuzzed with the body.
    pub fn request_multipart(data: &[u8]) {
        with_content_type(data, |query, content_type, body| {
            check_request(query, Some(content_type), body)
        });
    }

    /// `content-type\nquery\nbody` for JSON; an empty first line is no Content-Type.
    pub fn request_json(data: &[u8]) {
        with_content_type(data, |query, content_type, body| {
            let content_type = Some(content_type).filter(|ct| !ct.is_empty());
            check_request(query, content_type, body)
        });
    }

    fn with_content_type(data: &[u8], check: impl FnOnce(&str, &str, &[u8])) {
        let (content_type, rest) = split_line(data);
        let (query, body) = split_line(rest);
        let (Ok(content_type), Ok(query)) = (
            std::str::from_utf8(content_type),
            String::from_utf8(with_caller_key(query)),
        ) else {
            return;
        };
        check(&query, content_type, &with_caller_key(body));
    }

    /// Header lines up to an empty line, then `query\nbody`. A header line's first byte
    /// picks its name (`T` Content-Type, `E` Content-Encoding, anything else an unrelated
    /// header) and the rest is its value, any bytes a header value may hold.
    pub fn request_http(data: &[u8]) {
        let mut headers = http::HeaderMap::new();
        let mut rest = data;
        while !rest.is_empty() {
            let (line, after) = split_line(rest);
            rest = after;
            let Some((&pick, value)) = line.split_first() else {
                break;
            };
            let name = match pick {
                b'T' => http::header::CONTENT_TYPE,
                b'E' => http::header::CONTENT_ENCODING,
                _ => http::header::HeaderName::from_static("x-other"),
            };
            if let Ok(value) = http::HeaderValue::from_bytes(value) {
                headers.append(name, value);
            }
        }
        let (query, body) = split_line(rest);
        let Ok(query) = String::from_utf8(with_caller_key(query)) else {
            return;
        };
        check_http(&query, &headers, &with_caller_key(body));
    }

    /// An upstream answer through every answer parser.
    pub fn reply(data: &[u8]) {
        let reply = parse_reply(data);
        if let Reply::Error(code) = &reply {
            assert_eq!(code.trim(), code, "error codes are trimmed");
        }
        for status in [200, 204, 301, 404, 429, 500, 502, 0, 999] {
            let outcome = classify(status, &reply);
            match status {
                429 => assert_eq!(outcome, Outcome::KeyFull),
                200..=299 => match reply {
                    Reply::Ok(_) | Reply::NotReady | Reply::Value(_) => {
                        assert_eq!(outcome, Outcome::Success)
                    }
                    Reply::Garbage => assert_eq!(outcome, Outcome::Transient),
                    Reply::Error(_) => {}
                },
                _ => assert_eq!(outcome, Outcome::Transient),
            }
        }
        if let Some(balance) = parse_balance(data) {
            assert!(balance.is_finite());
        }
        let _ = parse_threads(data);
        assert_eq!(split_ids_reply(data, 0), None);
        for expected in 1..=4 {
            if let Some(items) = split_ids_reply(data, expected) {
                assert_eq!(items.len(), expected, "one item per id");
            }
        }
    }

    /// What a target is: a check of one input.
    pub type Target = fn(&[u8]);

    /// Every target by name, for the replay.
    pub const ALL: [(&str, Target); 6] = [
        ("request_query", request_query),
        ("request_form", request_form),
        ("request_multipart", request_multipart),
        ("request_json", request_json),
        ("request_http", request_http),
        ("reply", reply),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_harness_spelling_rule() {
        for name in [
            "key",
            "KEY",
            "kEy",
            " key",
            "key ",
            "\tkey\r\n",
            "key[]",
            "key[0]",
            "key[",
            "key\0x",
            "key [ ]",
            "\u{feff}key",
            "key\u{200b}",
            "\u{a0}key",
            "\u{202e}key",
            "k%65y",
            "%6B%65%79",
            "%20key%5B%5D",
            "key%00",
            "key%00x",
        ] {
            assert!(spells_key(name), "{name:?}");
        }
        for name in [
            "", "ke", "keys", "k ey", "monkey", "key_", "key.", "xkey", "api_key", "k%", "[key]",
            "k\0ey", "k%2565y", "+key", "key%",
        ] {
            assert!(!spells_key(name), "{name:?}");
        }
    }

    #[test]
    fn disposition_names_read_every_form() {
        let has = |value: &str, name: &str| {
            disposition_names(value.as_bytes())
                .iter()
                .any(|n| n == name)
        };
        assert!(has(r#"form-data; name="key""#, "key"));
        assert!(has("form-data; name=key; filename=k.txt", "key"));
        assert!(has(r#"form-data; name="x"; name="key""#, "key"));
        assert!(has("form-data; name='key'", "key"));
        assert!(has("form-data; name*=UTF-8''k%65y", "key"));
        assert!(has(r#"form-data; name*0="ke"; name*1="y""#, "key"));
        assert!(has("form-data; name*0*=UTF-8''k; name*1*=%65y", "key"));
        assert!(has(r#"form-data; NAME = "k\ey""#, "key"));
        assert!(has(r#"form-data; name=="key""#, "key"));
        assert!(disposition_names(b"form-data; NAME='Keyta; NAME='Key '")
            .iter()
            .any(|n| spells_key(n)));
        // RFC quoting sees a `name` inside a single-quoted PHP value.
        assert!(has("form-data; x='; name=key; '", "key"));
        // A quote-blind scan (multer) sees one anywhere after a space or `;`.
        assert!(has(r#"form-data; x="; name=key ""#, "key"));
        assert!(has("form-data[ name=key", "key"));
        assert!(has(r#"form-data; filename="a name="key" b""#, "key"));
        assert!(!has(r#"form-data; filename="key""#, "key"));
        assert!(!has(r#"form-data; x="a;name =k" ; y=1"#, "key"));
        assert!(!has(r#"form-data; filename="my name=key.png""#, "key"));
    }

    #[test]
    fn ascii_incompatible_charsets() {
        assert!(has_ascii_incompatible_charset(
            "text/plain; charset=UTF-16LE"
        ));
        assert!(has_ascii_incompatible_charset(
            "application/x-www-form-urlencoded; Charset = \"utf-7\""
        ));
        assert!(!has_ascii_incompatible_charset("text/plain; charset=utf-8"));
        assert!(!has_ascii_incompatible_charset(
            "text/plain; x=\"; charset=utf-16\""
        ));
    }

    /// The seeds, and any corpus or crash files a fuzz run left, through every check the
    /// fuzzer makes: a stable-toolchain replay of the fuzz targets.
    #[test]
    fn replay_seeds_and_corpus() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut replayed = 0;
        for (target, run) in targets::ALL {
            for dir in ["seeds", "corpus", "artifacts"] {
                let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                    continue;
                };
                for entry in entries {
                    let path = entry.expect("a directory entry").path();
                    if !path.is_file() {
                        continue;
                    }
                    let data = std::fs::read(&path).expect("a readable input");
                    let outcome = std::panic::catch_unwind(|| run(&data));
                    assert!(outcome.is_ok(), "{target} fails on {}", path.display());
                    replayed += 1;
                }
            }
        }
        eprintln!("replayed {replayed} inputs");
        assert!(replayed > 0, "no seeds found");
    }
}
