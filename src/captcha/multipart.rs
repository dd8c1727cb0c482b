//! `multipart/form-data` bodies split into byte ranges, so a part can be replaced or dropped
//! (and the values of the parts spelling a name read) while every other byte (preamble, part
//! headers, file bytes, epilogue) is copied exactly. Also owns header-parameter parsing
//! (`; boundary="x"`) for Content-Type.
//!
//! multer parses multipart well but does not expose byte offsets, hence this small splitter
//! (RFC 2046 §5.1.1): `--boundary` opens the first part, `CRLF--boundary` ends each part's
//! content, and `--` after a delimiter closes the body.
//!
//! The upstream most likely reads the body with PHP (php-src `main/rfc1867.c`), which is
//! looser than the RFC: it also ends a part at a bare `LF--boundary`, keeps looking for parts
//! after the close delimiter, cuts lines longer than 5 KiB into pieces it compares with
//! `--boundary`, and reads Content-Disposition its own way. Where PHP could see a
//! part this splitter does not, the body is refused; Content-Disposition is read as PHP
//! reads it.

use std::borrow::Cow;
use std::ops::Range;

use memchr::memmem;

use super::param_name::{php_name, spells};
use super::request_error::RequestError;

/// More headers than this on one part is not a form a client would send.
const MAX_PART_HEADERS: usize = 32;

/// One body part, as offsets into the body it was split from.
#[derive(Clone, Debug)]
pub(super) struct Part {
    /// Where the `--boundary` that opens the part starts: removing from here to just past
    /// the CRLF after its content removes the part and leaves a well-formed body, whether
    /// the part is the first or a later one.
    delimiter: usize,
    /// Where the part's headers start, just after the delimiter line.
    start: usize,
    /// The part's content: after the blank line that ends its headers, up to the CRLF that
    /// starts the next delimiter.
    content: Range<usize>,
    /// The `name` of its Content-Disposition as PHP keys it ([`php_name`]), if any.
    name: Option<String>,
    /// Whether Content-Disposition carries a `filename=` (even empty): then, as in PHP, the
    /// part is an upload and not a param. `filename*` alone does not count: PHP ignores it.
    is_file: bool,
    /// Every name some reader could take the part's for ([`all_names`]), raw: PHP's reading
    /// is only one of them. The rewrite replaces a part if any of these spells a name it sets.
    spellings: Vec<String>,
}

impl Part {
    /// The param name of a text part; `None` for file parts and unnamed parts.
    fn param_name(&self) -> Option<&str> {
        if self.is_file {
            return None;
        }
        self.name.as_deref()
    }

    /// Whether some reader could take this part, text or file, for a param named `canonical`.
    fn spells(&self, canonical: &str) -> bool {
        self.name
            .as_deref()
            .is_some_and(|name| spells(name, canonical))
            || self.spellings.iter().any(|name| spells(name, canonical))
    }
}

/// Splits `body` into parts.
///
/// # Errors
/// `MalformedMultipart` when a delimiter is missing or followed by junk, a part's headers
/// are not well-formed or not ended by a blank line, or PHP could split the body differently
/// (a bare `LF--boundary`, or `--boundary` in the preamble or after the close delimiter).
pub(super) fn split(body: &[u8], boundary: &str) -> Result<Vec<Part>, RequestError> {
    let dash_boundary = format!("--{boundary}");
    let delimiter = format!("\r\n--{boundary}");
    let finder = memmem::Finder::new(delimiter.as_bytes());
    refuse_bare_lf_delimiters(body, boundary)?;

    // `cursor` always points just past a `--boundary`. The first one opens the body or ends
    // a preamble line.
    let mut cursor = if body.starts_with(dash_boundary.as_bytes()) {
        dash_boundary.len()
    } else {
        let at = finder
            .find(body)
            .ok_or(RequestError::MalformedMultipart("no opening boundary"))?;
        // PHP reads the preamble line by line, and cuts a line longer than its 5 KiB buffer
        // into pieces that it compares with `--boundary` too.
        if memmem::find(&body[..at], dash_boundary.as_bytes()).is_some() {
            return Err(RequestError::MalformedMultipart("boundary in the preamble"));
        }
        at + delimiter.len()
    };

    let mut parts = Vec::new();
    loop {
        let after_boundary = &body[cursor..];
        if after_boundary.is_empty() {
            return Err(RequestError::MalformedMultipart("no closing boundary"));
        }
        if after_boundary.starts_with(b"--") {
            // The close delimiter; whatever follows is epilogue, copied verbatim. PHP does not
            // stop at it: it reads on for a `--boundary` line (or a 5 KiB piece of a longer
            // line) and parses a part after one.
            if memmem::find(&after_boundary[2..], dash_boundary.as_bytes()).is_some() {
                return Err(RequestError::MalformedMultipart(
                    "boundary after the close delimiter",
                ));
            }
            return Ok(parts);
        }
        let part_start = cursor
            + line_end_after_boundary(after_boundary)
                .ok_or(RequestError::MalformedMultipart("junk after a boundary"))?;
        let content_end = part_start
            + finder
                .find(&body[part_start..])
                .ok_or(RequestError::MalformedMultipart("no closing boundary"))?;
        let opened_at = cursor - dash_boundary.len();
        parts.push(parse_part(
            &body[part_start..content_end],
            opened_at,
            part_start,
        )?);
        cursor = content_end + delimiter.len();
    }
}

/// The value of every text part, in wire order.
pub(super) fn text_params(body: &[u8], parts: &[Part]) -> Vec<(String, String)> {
    parts
        .iter()
        .filter_map(|part| {
            let name = part.param_name()?;
            let value = body.get(part.content.clone()).unwrap_or_default();
            Some((name.to_owned(), String::from_utf8_lossy(value).into_owned()))
        })
        .collect()
}

/// The content of every part, text or file, that some reader could take for a param named
/// `canonical` ([`Part::spells`]: the parts [`splice`] replaces), in wire order. Lossy UTF-8,
/// borrowed unless a part is not UTF-8.
pub(super) fn spelled_values<'a>(
    body: &'a [u8],
    parts: &'a [Part],
    canonical: &'a str,
) -> impl Iterator<Item = Cow<'a, str>> + 'a {
    parts
        .iter()
        .filter(move |part| part.spells(canonical))
        .map(move |part| {
            String::from_utf8_lossy(body.get(part.content.clone()).unwrap_or_default())
        })
}

/// Replaces the first part that spells a name of `set` ([`Part::spells`], text or file part,
/// however its headers spell the name) with a canonical text part
/// (`Content-Disposition: form-data; name="<name>"` and the new value), and drops every later
/// part spelling it, delimiter included. A name already `placed` (written elsewhere, or one
/// the caller drops) has every part spelling it dropped. Marks in `placed` which names were
/// written; returns `None` when nothing matched.
pub(super) fn splice(
    body: &[u8],
    parts: &[Part],
    set: &[(&str, &str)],
    placed: &mut [bool],
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut copied_to = 0;
    let mut changed = false;
    for part in parts {
        if let Some(slot) = set.iter().position(|(n, _)| part.spells(n)) {
            changed = true;
            if placed[slot] {
                // The part from its `--boundary` through the CRLF after its content: what
                // follows is the next `--boundary` (or the close one), so the body stays
                // well-formed, the first part dropped as much as a later one.
                out.extend_from_slice(body.get(copied_to..part.delimiter)?);
                copied_to = part.content.end + 2;
            } else {
                placed[slot] = true;
                out.extend_from_slice(body.get(copied_to..part.start)?);
                out.extend_from_slice(b"Content-Disposition: form-data; name=\"");
                out.extend_from_slice(set[slot].0.as_bytes());
                out.extend_from_slice(b"\"\r\n\r\n");
                out.extend_from_slice(set[slot].1.as_bytes());
                copied_to = part.content.end;
            }
        }
    }
    if !changed {
        return None;
    }
    out.extend_from_slice(body.get(copied_to..)?);
    Some(out)
}

/// PHP ends a part's content at `LF--boundary` whether or not a CR comes first, so a bare one
/// can hide a part (or a whole body) from this splitter. Real clients always send CRLF.
fn refuse_bare_lf_delimiters(body: &[u8], boundary: &str) -> Result<(), RequestError> {
    let bare_delimiter = format!("\n--{boundary}");
    let bare = memmem::find_iter(body, bare_delimiter.as_bytes())
        .any(|at| at == 0 || body[at - 1] != b'\r');
    if bare {
        return Err(RequestError::MalformedMultipart("boundary after a bare LF"));
    }
    Ok(())
}

/// After `--boundary`: optional transport padding (spaces, tabs), then CRLF. Returns the
/// length up to and including the CRLF.
fn line_end_after_boundary(after_boundary: &[u8]) -> Option<usize> {
    let padding = after_boundary
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    after_boundary[padding..]
        .starts_with(b"\r\n")
        .then_some(padding + 2)
}

/// Parses one part (headers, blank line, content) found at `offset` in the body, after the
/// `--boundary` at `delimiter`.
fn parse_part(part: &[u8], delimiter: usize, offset: usize) -> Result<Part, RequestError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_PART_HEADERS];
    let (header_len, headers) = match httparse::parse_headers(part, &mut headers) {
        Ok(httparse::Status::Complete(parsed)) => parsed,
        Ok(httparse::Status::Partial) => {
            return Err(RequestError::MalformedMultipart(
                "part headers not ended by a blank line",
            ))
        }
        Err(_) => return Err(RequestError::MalformedMultipart("bad part headers")),
    };
    // httparse and PHP end a header line at a bare LF, but multer looks for CRLF CRLF, so it
    // would read the headers on into the next part and take that part (the key, say) for
    // content. Real clients always send CRLF.
    let head = &part[..header_len];
    if memchr::memchr_iter(b'\n', head).any(|at| at == 0 || head[at - 1] != b'\r') {
        return Err(RequestError::MalformedMultipart(
            "part header line ended by a bare LF",
        ));
    }
    // For the same reason, a part needs a header: after the delimiter's CRLF, multer looks
    // for CRLF CRLF, which an empty header block (a lone CRLF) is not.
    if headers.is_empty() {
        return Err(RequestError::MalformedMultipart("part without headers"));
    }
    let dispositions = || {
        headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("content-disposition"))
    };
    // The first one, as in PHP.
    let disposition = dispositions()
        .next()
        .map(|h| Disposition::read(h.value))
        .unwrap_or_default();
    Ok(Part {
        delimiter,
        start: offset,
        content: offset + header_len..offset + part.len(),
        name: disposition
            .name
            .map(|name| php_name(&String::from_utf8_lossy(&name)).to_owned()),
        is_file: disposition.is_file,
        spellings: dispositions().flat_map(|h| all_names(h.value)).collect(),
    })
}

/// Every value a reader of one Content-Disposition could take for the part's name: each
/// `name` parameter (any case, any quoting, the first or the last one), each RFC 2231/5987
/// `name*` (its `charset'lang'` prefix cut and its `%XX` decoded, so that [`spells`] decodes
/// once more as it does for every other name), and the `name*0`,
/// `name*1`, … continuations joined, with the parameters split two ways ([`split_names`]);
/// and every name a quote-blind scan finds
/// ([`scanned_names`]). Wider than any one parser on purpose: a name missed here is a
/// caller's `key` that some parser reads.
fn all_names(value: &[u8]) -> Vec<String> {
    // Parameters split as PHP splits them (`'` quotes too) and as RFC 2045 does (only `"`):
    // `x='; name*=UTF-8''key` hides a `name*` from the first reading, not the second.
    let mut names = split_names(value, b"\"'");
    names.extend(split_names(value, b"\""));
    names.extend(scanned_names(value));
    names
        .into_iter()
        .map(|name| String::from_utf8_lossy(&name).into_owned())
        .collect()
}

/// The `name`, `name*` and joined `name*N` values of one Content-Disposition value, its
/// parameters split at every `;` outside a string quoted with one of `quotes`.
fn split_names(value: &[u8], quotes: &[u8]) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    let mut continued: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut rest = trim_start_c_space(value);
    while !rest.is_empty() {
        let (word, after) = getword(rest, b';', quotes);
        rest = trim_start_c_space(after);
        let Some(eq) = word.iter().position(|&b| b == b'=') else {
            continue;
        };
        let key = trim_end_c_space(trim_start_c_space(&word[..eq])).to_ascii_lowercase();
        let raw = php_getword_conf(&word[eq + 1..]);
        // PHP ends an unquoted value at a space; Python's email parser takes the whole
        // parameter, trimmed, so `name*=x y''key` is `key` to it.
        let whole = trim_end_c_space(trim_start_c_space(&word[eq + 1..])).to_vec();
        let Some(ext) = key.strip_prefix(b"name") else {
            continue;
        };
        match ext {
            b"" => names.extend([raw, whole]),
            b"*" => names.extend([raw, whole].map(|v| percent_decoded(&strip_charset(v)))),
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
                let raw = match (encoded, index) {
                    (true, 0) => percent_decoded(&strip_charset(raw)),
                    (true, _) => percent_decoded(&raw),
                    (false, _) => raw,
                };
                continued.push((index, raw));
            }
        }
    }
    if !continued.is_empty() {
        continued.sort_by_key(|(index, _)| *index);
        names.push(continued.into_iter().flat_map(|(_, raw)| raw).collect());
    }
    names
}

/// The names a reader that does not split parameters finds: multer (behind axum's
/// `Multipart`) takes the first `name` at the start of the value or after whitespace or a
/// `;`, even inside another parameter (`form-data[ name="key"`, `filename=a name=key`,
/// `x='; name=key'`), then `=` and a `"`-quoted string or the text up to a `;` or space.
/// Every such `name`, in any case, is taken here, not only the first.
fn scanned_names(value: &[u8]) -> Vec<Vec<u8>> {
    let lower = value.to_ascii_lowercase();
    memmem::find_iter(&lower, b"name")
        .filter(|&at| at == 0 || is_c_space(value[at - 1]) || value[at - 1] == b';')
        .filter_map(|at| {
            let after = trim_start_c_space(&value[at + b"name".len()..]);
            let after = trim_start_c_space(after.strip_prefix(b"=")?);
            let end = match after.strip_prefix(b"\"") {
                Some(quoted) => {
                    let close = memchr::memchr(b'"', quoted).unwrap_or(quoted.len());
                    return Some(quoted[..close].to_vec());
                }
                None => after.iter().position(|&b| b == b';' || is_c_space(b)),
            };
            Some(after[..end.unwrap_or(after.len())].to_vec())
        })
        .collect()
}

/// An RFC 5987 / RFC 2231 encoded value with its `%XX` decoded, as its readers decode it.
fn percent_decoded(raw: &[u8]) -> Vec<u8> {
    percent_encoding::percent_decode(raw).collect()
}

/// An RFC 5987 value without its `charset'language'` prefix; a value without one as is.
fn strip_charset(raw: Vec<u8>) -> Vec<u8> {
    let mut quotes = raw.iter().enumerate().filter(|(_, &b)| b == b'\'');
    match (quotes.next(), quotes.next()) {
        (Some(_), Some((second, _))) => raw[second + 1..].to_vec(),
        _ => raw,
    }
}

/// What PHP takes from a part's Content-Disposition.
#[derive(Debug, Default, PartialEq, Eq)]
struct Disposition {
    /// The raw (not yet normalised) `name` value.
    name: Option<Vec<u8>>,
    is_file: bool,
}

impl Disposition {
    /// Reads a Content-Disposition value the way php-src `rfc1867.c` does: `;`-separated
    /// words (either quote kind protects a `;`), each `key=value`; every `name` overwrites
    /// the last; `filename` (and not `filename*`) makes an upload; a value is quoted with
    /// `"` or `'`, or runs to the next space. The disposition type is not checked.
    ///
    /// Two leniencies, kept because neither can hide a name PHP reads: `name =` (a space
    /// before `=`) counts only when PHP sees no `name` at all, and in a quoted value any
    /// character may be escaped. PHP only unescapes `\\` and the quote, so it reads `k\ey`
    /// where keyrelay reads `key`; the backslashes PHP keeps can never be what makes a name
    /// `key` to PHP.
    fn read(value: &[u8]) -> Disposition {
        let mut exact_name = None;
        let mut spaced_name = None;
        let mut is_file = false;
        let mut rest = trim_start_c_space(value);
        while !rest.is_empty() {
            let (word, after) = php_getword(rest, b';');
            rest = trim_start_c_space(after);
            if !word.contains(&b'=') {
                continue;
            }
            let (key, value) = php_getword(word, b'=');
            if key.eq_ignore_ascii_case(b"name") {
                exact_name = Some(value);
            } else if trim_end_c_space(key).eq_ignore_ascii_case(b"name") {
                spaced_name = Some(value);
            } else if key.eq_ignore_ascii_case(b"filename") {
                is_file = true;
            }
        }
        Disposition {
            name: exact_name.or(spaced_name).map(php_getword_conf),
            is_file,
        }
    }
}

/// php-src `php_ap_getword`: the text before the first `stop` outside quotes, and the rest
/// after that run of `stop`s.
fn php_getword(line: &[u8], stop: u8) -> (&[u8], &[u8]) {
    getword(line, stop, b"\"'")
}

/// [`php_getword`] with other quote characters.
fn getword<'a>(line: &'a [u8], stop: u8, quotes: &[u8]) -> (&'a [u8], &'a [u8]) {
    let mut pos = 0;
    while let Some(&byte) = line.get(pos).filter(|&&b| b != stop) {
        pos += 1;
        if quotes.contains(&byte) {
            while let Some(&inner) = line.get(pos) {
                pos += 1;
                if inner == byte {
                    break;
                }
                if inner == b'\\' && line.get(pos) == Some(&byte) {
                    pos += 1;
                }
            }
        }
    }
    let word = &line[..pos];
    let mut rest = &line[pos..];
    while let Some(after) = rest.strip_prefix(&[stop]) {
        rest = after;
    }
    (word, rest)
}

/// php-src `php_ap_getword_conf`: a value quoted with `"` or `'` (up to the closing quote),
/// or else up to the first space; with the escape leniency described in [`Disposition::read`].
fn php_getword_conf(value: &[u8]) -> Vec<u8> {
    let value = trim_start_c_space(value);
    let (quote, text) = match value.first() {
        Some(&quote @ (b'"' | b'\'')) => (Some(quote), &value[1..]),
        _ => {
            let end = value.iter().position(|&b| is_c_space(b));
            (None, &value[..end.unwrap_or(value.len())])
        }
    };
    let mut out = Vec::with_capacity(text.len());
    let mut at = 0;
    while let Some(&byte) = text.get(at).filter(|&&b| Some(b) != quote) {
        at += 1;
        match text.get(at) {
            Some(&next) if byte == b'\\' && (next == b'\\' || quote.is_some()) => {
                at += 1;
                out.push(next);
            }
            _ => out.push(byte),
        }
    }
    out
}

/// C's `isspace` in the C locale, which PHP uses to skip and end words.
fn is_c_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn trim_start_c_space(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| !is_c_space(b));
    &bytes[start.unwrap_or(bytes.len())..]
}

fn trim_end_c_space(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|&b| !is_c_space(b));
    &bytes[..end.map_or(0, |end| end + 1)]
}

/// The `; name=value` parameters after a header's first token (for Content-Type; a part's
/// Content-Disposition is read by [`Disposition::read`], as PHP reads it), names lowercased, values
/// unquoted (`"a\"b"` -> `a"b`). Lenient: an unclosed quote runs to the end, junk is skipped.
pub(super) fn header_parameters(header_value: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut rest = match header_value.find(';') {
        Some(at) => &header_value[at + 1..],
        None => return params,
    };
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        if rest.is_empty() {
            return params;
        }
        let name_end = rest.find(['=', ';']).unwrap_or(rest.len());
        let name = rest[..name_end].trim().to_ascii_lowercase();
        rest = &rest[name_end..];
        let value = match rest.strip_prefix('=') {
            None => String::new(),
            Some(after_eq) => {
                let after_eq = after_eq.trim_start();
                if let Some(quoted) = after_eq.strip_prefix('"') {
                    let (value, after_quote) = unquote(quoted);
                    rest = after_quote.find(';').map_or("", |at| &after_quote[at..]);
                    value
                } else {
                    let end = after_eq.find(';').unwrap_or(after_eq.len());
                    rest = &after_eq[end..];
                    after_eq[..end].trim().to_owned()
                }
            }
        };
        if !name.is_empty() {
            params.push((name, value));
        }
    }
}

/// Reads a quoted-string body (after the opening quote); returns it and the text after the
/// closing quote.
fn unquote(quoted: &str) -> (String, &str) {
    let mut value = String::new();
    let mut chars = quoted.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return (value, &quoted[at + 1..]),
            '\\' => {
                if let Some((_, escaped)) = chars.next() {
                    value.push(escaped);
                }
            }
            _ => value.push(c),
        }
    }
    (value, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(parts: &[Part]) -> Vec<(Option<&str>, bool)> {
        parts
            .iter()
            .map(|p| (p.name.as_deref(), p.is_file))
            .collect()
    }

    #[test]
    fn header_parameters_handle_quoted_unquoted_and_escaped_values() {
        let params = header_parameters(
            r#"form-data; name="key"; filename=a.png; X=  "semi;colon" ; odd="q\"uote\\"; flag"#,
        );
        let expected = [
            ("name", "key"),
            ("filename", "a.png"),
            ("x", "semi;colon"),
            ("odd", "q\"uote\\"),
            ("flag", ""),
        ];
        let got: Vec<(&str, &str)> = params
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn header_parameters_survive_junk() {
        assert!(header_parameters("form-data").is_empty());
        assert!(header_parameters("form-data;;; ;").is_empty());
        assert_eq!(
            header_parameters(r#"x; name="unclosed"#),
            [("name".to_owned(), "unclosed".to_owned())]
        );
        assert_eq!(
            header_parameters("x; =v; name=k"),
            [("name".to_owned(), "k".to_owned())]
        );
    }

    // === Content-Disposition as PHP reads it ===

    fn disposition(value: &str) -> (Option<String>, bool) {
        let read = Disposition::read(value.as_bytes());
        let name = read
            .name
            .map(|name| String::from_utf8(name).expect("test names are UTF-8"));
        (name, read.is_file)
    }

    #[test]
    fn disposition_name_is_read_as_php_reads_it() {
        let cases = [
            // The last `name` wins.
            (r#"form-data; name="x"; name="key""#, "key"),
            (r#"form-data; name="key"; name=x"#, "x"),
            // Single quotes are quotes, and either kind protects a `;`.
            ("form-data; name='key'", "key"),
            ("form-data; x='a;name=b'; name=c", "c"),
            (r#"form-data; x="a;name=b"; name=c"#, "c"),
            // The disposition type is not checked, nor required.
            (r#"name="key""#, "key"),
            (r#"attachment; name="key""#, "key"),
            // An unquoted value ends at a space; a run of `=` is skipped.
            ("form-data; name=key junk", "key"),
            (r#"form-data; name=="key""#, "key"),
            ("form-data;name=key;", "key"),
            // Escapes: PHP unescapes `\\` and the quote; any other escape is read leniently.
            (r#"form-data; name="a\"b""#, "a\"b"),
            (r#"form-data; name='it\'s'"#, "it's"),
            (r#"form-data; name="a\\b""#, "a\\b"),
            (r#"form-data; name="k\ey""#, "key"),
            (r"form-data; name=a\\b", "a\\b"),
            (r"form-data; name=a\b", "a\\b"),
            // An unclosed quote runs to the end; an empty value is an empty name.
            (r#"form-data; name="unclosed"#, "unclosed"),
            ("form-data; name=", ""),
            // `name =` counts only when PHP sees no `name` at all.
            (r#"form-data; NAME = "key"; charset=utf-8"#, "key"),
            (r#"form-data; name="x"; name ="key""#, "x"),
            (r#"form-data; name ="key"; name="x""#, "x"),
        ];
        for (value, name) in cases {
            assert_eq!(
                disposition(value),
                (Some(name.to_owned()), false),
                "{value}"
            );
        }
    }

    #[test]
    fn disposition_without_a_name() {
        for value in [
            "",
            "form-data",
            "form-data; name",
            "form-data;;; ;",
            r#"form-data; x="name=key""#,
            r#"form-data; namex="key""#,
        ] {
            assert_eq!(disposition(value), (None, false), "{value}");
        }
    }

    #[test]
    fn only_a_filename_parameter_with_a_value_makes_an_upload() {
        let cases = [
            (r#"form-data; name="f"; filename="a.png""#, true),
            (r#"form-data; name="f"; FileName="""#, true),
            ("form-data; name=f; filename=", true),
            // PHP ignores RFC 5987 `filename*`, a `filename` without `=` and `filename =`.
            ("form-data; name=\"f\"; filename*=UTF-8''k.txt", false),
            (r#"form-data; name="f"; filename"#, false),
            (r#"form-data; name="f"; filename ="a.png""#, false),
            (r#"form-data; name="f"; x="filename=a.png""#, false),
        ];
        for (value, is_file) in cases {
            assert_eq!(
                disposition(value),
                (Some("f".to_owned()), is_file),
                "{value}"
            );
        }
    }

    #[test]
    fn part_names_are_normalised_as_php_keys_them() {
        let body = b"--b\r\nContent-Disposition: form-data; name=\" key\"\r\n\r\n1\r\n\
            --b\r\nContent-Disposition: form-data; name=\"key[]\"\r\n\r\n2\r\n\
            --b\r\nContent-Disposition: form-data; name=\"key[\"\r\n\r\n3\r\n--b--";
        let parts = split(body, "b").expect("well-formed");
        assert_eq!(
            names(&parts),
            [
                (Some("key"), false),
                (Some("key"), false),
                (Some("key["), false)
            ]
        );
    }

    #[test]
    fn the_first_content_disposition_header_counts() {
        let body = b"--b\r\nContent-Disposition: form-data; name=key\r\n\
            content-disposition: form-data; name=x\r\n\r\nv\r\n--b--";
        let parts = split(body, "b").expect("well-formed");
        assert_eq!(names(&parts), [(Some("key"), false)]);
    }

    #[test]
    fn folded_or_nul_bearing_part_headers_are_refused() {
        // PHP would append a folded line to the previous header, and end a value at a NUL:
        // both could make a `name` keyrelay did not read, so neither may pass.
        for body in [
            &b"--b\r\nContent-Disposition: form-data;\r\n name=key\r\n\r\nv\r\n--b--"[..],
            b"--b\r\nContent-Disposition: form-data; name=x\0; name=key\r\n\r\nv\r\n--b--",
        ] {
            assert_eq!(
                split(body, "b").unwrap_err(),
                RequestError::MalformedMultipart("bad part headers"),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    // === bodies PHP would split differently ===

    #[test]
    fn a_bare_lf_boundary_anywhere_is_refused() {
        let bodies: [&[u8]; 6] = [
            // Inside a text part: PHP ends `x` there and reads a part `key`.
            b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\nhello\n\
              --b\nContent-Disposition: form-data; name=key\n\nK\r\n--b--",
            // Inside a file.
            b"--b\r\nContent-Disposition: form-data; name=f; filename=f\r\n\r\n\x00\n--b\r\n\r\n--b--",
            // In the preamble, at the very start, and as the only line ending of a delimiter.
            b"preamble\n--b\r\n\r\nv\r\n--b--",
            b"\n--b\r\n\r\nv\r\n--b--",
            b"--b\r\n\r\nv\n--b--",
            // In the epilogue.
            b"--b\r\n\r\nv\r\n--b--\r\nepilogue\n--b\r\n\r\nw\r\n--b--",
        ];
        for body in bodies {
            assert_eq!(
                split(body, "b").unwrap_err(),
                RequestError::MalformedMultipart("boundary after a bare LF"),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn lf_and_boundary_look_alikes_are_content() {
        // A CR before the LF, a shorter dash run, or another boundary are not delimiters.
        let body = b"--b\r\nContent-Disposition: form-data; name=f; filename=f\r\n\r\n\
            \n-b\n--c\n-\r\n-b\r\n--b--";
        let parts = split(body, "b").expect("well-formed");
        assert_eq!(&body[parts[0].content.clone()], b"\n-b\n--c\n-\r\n-b");
    }

    #[test]
    fn a_delimiter_after_the_close_delimiter_is_refused() {
        let body = b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--b--\r\n\
            --b\r\nContent-Disposition: form-data; name=key\r\n\r\nK\r\n--b--\r\n";
        assert_eq!(
            split(body, "b").unwrap_err(),
            RequestError::MalformedMultipart("boundary after the close delimiter")
        );
        // Right after the close marker, too.
        assert_eq!(
            split(b"--b\r\nX: 1\r\n\r\nv\r\n--b--\r\n--b--", "b").unwrap_err(),
            RequestError::MalformedMultipart("boundary after the close delimiter")
        );
    }

    #[test]
    fn a_boundary_mid_line_in_the_preamble_or_epilogue_is_refused() {
        // PHP reads a line longer than its 5 KiB buffer in 5 KiB pieces, so a `--b` after
        // 5120 bytes of one line starts a part for PHP; keyrelay sees no part there.
        let mut hidden = vec![b'A'; 5120];
        hidden.extend(b"--b\r\nContent-Disposition: form-data; name=key\r\n\r\nK\r\n--b--");
        assert_eq!(
            split(&hidden, "b").unwrap_err(),
            RequestError::MalformedMultipart("boundary in the preamble")
        );
        assert_eq!(
            split(b"pre --b-- amble\r\n--b\r\nX: 1\r\n\r\nv\r\n--b--", "b").unwrap_err(),
            RequestError::MalformedMultipart("boundary in the preamble")
        );
        let mut after_close = b"--b\r\nX: 1\r\n\r\nv\r\n--b--".to_vec();
        after_close.extend(&hidden);
        assert_eq!(
            split(&after_close, "b").unwrap_err(),
            RequestError::MalformedMultipart("boundary after the close delimiter")
        );
    }

    #[test]
    fn an_epilogue_without_a_delimiter_is_kept() {
        let body = b"--b\r\nX: 1\r\n\r\nv\r\n--b--\r\nepilogue -b --c\r\n";
        let parts = split(body, "b").expect("well-formed");
        assert_eq!(parts.len(), 1);
        assert_eq!(&body[parts[0].content.clone()], b"v");
    }

    #[test]
    fn split_finds_text_and_file_parts_with_preamble_and_padding() {
        let body = b"preamble\r\n--XY  \r\n\
            Content-Disposition: form-data; name=method\r\n\r\npost\r\n\
            --XY\r\ncontent-disposition: form-data; name=\"file\"; filename=\"\"\r\n\r\n\r\n\
            --XY\r\nX-Other: 1\r\n\r\nno disposition\r\n--XY--\r\nepilogue";
        let parts = split(body, "XY").expect("well-formed");
        assert_eq!(
            names(&parts),
            [(Some("method"), false), (Some("file"), true), (None, false)]
        );
        assert_eq!(&body[parts[0].content.clone()], b"post");
        assert_eq!(&body[parts[1].content.clone()], b"");
        assert_eq!(
            text_params(body, &parts),
            [("method".to_owned(), "post".to_owned())]
        );
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let cases: [(&[u8], &str); 6] = [
            (b"", "no opening boundary"),
            (b"no boundary at all", "no opening boundary"),
            (
                b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\ntruncated",
                "no closing boundary",
            ),
            (b"--bjunk\r\n\r\nx\r\n--b--", "junk after a boundary"),
            (b"--b\r\nX: 1\r\n\r\nx\r\n--b", "no closing boundary"),
            (
                b"--b\r\nno colon here\r\n\r\nx\r\n--b--",
                "bad part headers",
            ),
        ];
        for (body, reason) in cases {
            match split(body, "b") {
                Err(RequestError::MalformedMultipart(got)) => {
                    assert_eq!(got, reason, "{}", String::from_utf8_lossy(body))
                }
                other => panic!("{other:?} for {}", String::from_utf8_lossy(body)),
            }
        }
    }

    #[test]
    fn a_name_star_behind_a_single_quote_is_a_spelling() {
        // Found by the fuzz harness (request_multipart): PHP's split takes `'` for a quote
        // and hides the `name*`; a reader that quotes with `"` only (RFC 2045) reads it.
        let body = b"--b\r\nContent-Disposition: form-d\xfa'\x9e; name*=UTF-8''k%65y\r\n\r\n\
            K\r\n--b--\r\n";
        let parts = split(body, "b").expect("well-formed");
        let mut placed = [false];
        let spliced = splice(body, &parts, &[("key", "POOL")], &mut placed).expect("replaced");
        assert_eq!(
            spliced,
            b"--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nPOOL\r\n--b--\r\n"
        );
        for value in [
            "form-data; x='; name*=UTF-8''key",
            "form-data; x='; name*0=ke; name*1=y",
        ] {
            assert!(
                all_names(value.as_bytes()).iter().any(|n| n == "key"),
                "{value}"
            );
        }
    }

    #[test]
    fn a_part_without_headers_is_refused() {
        // Found by the fuzz harness (request_multipart, multer read-back): multer read the
        // headers of a part without any on to the next CRLF CRLF, the canonical key part's,
        // and took that part for content, so a multer upstream saw no key.
        let body = b"--b\r\n\r\nv\r\n\
            --b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nK\r\n--b--\r\n";
        assert_eq!(
            split(body, "b").unwrap_err(),
            RequestError::MalformedMultipart("part without headers")
        );
    }

    #[test]
    fn a_name_read_past_a_space_is_a_spelling() {
        // Found by the fuzz harness (request_multipart): PHP's reading cut the `name*`
        // value at the space, but a reader that takes the whole parameter finds the
        // `charset''` prefix after it and reads `key`.
        let value = b"foontent-Disposition: form-data; name*=UTF-9sition: form-d''k%65y";
        let names = all_names(value);
        assert!(names.iter().any(|n| spells(n, "key")), "{names:?}");
    }

    #[test]
    fn part_header_lines_ended_by_a_bare_lf_are_refused() {
        // Found by the fuzz harness (request_multipart, multer read-back): after a blank
        // line of a bare LF, multer read on to the next CRLF CRLF, so the key part became
        // part of `x` and a multer upstream saw no key at all.
        for body in [
            &b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\nv\r\n\
                --b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nK\r\n--b--\r\n"[..],
            b"--b\r\nContent-Disposition: form-data; name=x\n\r\nv\r\n--b--",
            b"--b\r\nX: 1\nContent-Disposition: form-data; name=x\r\n\r\nv\r\n--b--",
            b"--b\r\n\nv\r\n--b--",
        ] {
            assert_eq!(
                split(body, "b").unwrap_err(),
                RequestError::MalformedMultipart("part header line ended by a bare LF"),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn headers_not_ended_by_a_blank_line_are_an_error() {
        let body = b"--b\r\nContent-Disposition: form-data; name=a\r\n--b--";
        assert_eq!(
            split(body, "b").unwrap_err(),
            RequestError::MalformedMultipart("part headers not ended by a blank line")
        );
    }

    #[test]
    fn too_many_part_headers_is_an_error() {
        let mut body = b"--b\r\n".to_vec();
        for i in 0..=MAX_PART_HEADERS {
            body.extend(format!("X-{i}: v\r\n").bytes());
        }
        body.extend(b"\r\nx\r\n--b--");
        assert_eq!(
            split(&body, "b").unwrap_err(),
            RequestError::MalformedMultipart("bad part headers")
        );
    }

    #[test]
    fn every_prefix_of_a_body_is_handled_without_panic() {
        let body = b"pre\r\n--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nk\r\n\
            --b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n\r\n\x00\xff\r\n--b--\r\n";
        for end in 0..=body.len() {
            let prefix = &body[..end];
            if let Ok(parts) = split(prefix, "b") {
                let mut seen = [false];
                let _ = splice(prefix, &parts, &[("key", "v")], &mut seen);
            }
        }
    }
}
