//! `multipart/form-data` bodies split into byte ranges, so a text part can be replaced while
//! every other byte (preamble, part headers, file bytes, epilogue) is copied exactly. Also
//! owns header-parameter parsing (`; name="x"`), shared with Content-Type.
//!
//! multer parses multipart well but does not expose byte offsets, hence this small splitter
//! (RFC 2046 §5.1.1): `--boundary` opens the first part, `CRLF--boundary` ends each part's
//! content, and `--` after a delimiter closes the body.

use std::ops::Range;

use memchr::memmem;

use super::request::RequestError;

/// More headers than this on one part is not a form a client would send.
const MAX_PART_HEADERS: usize = 32;

/// One body part, as offsets into the body it was split from.
#[derive(Clone, Debug)]
pub(super) struct Part {
    /// The part's content: after the blank line that ends its headers, up to the CRLF that
    /// starts the next delimiter.
    content: Range<usize>,
    /// The `name` of its Content-Disposition, if any.
    name: Option<String>,
    /// Whether Content-Disposition carries a `filename` (even empty): then, as in PHP, the
    /// part is an upload and not a param.
    is_file: bool,
}

impl Part {
    /// The param name of a text part; `None` for file parts and unnamed parts.
    fn param_name(&self) -> Option<&str> {
        if self.is_file {
            return None;
        }
        self.name.as_deref()
    }
}

/// Splits `body` into parts.
///
/// # Errors
/// `MalformedMultipart` when a delimiter is missing or followed by junk, or a part's headers
/// are not well-formed or not ended by a blank line.
pub(super) fn split(body: &[u8], boundary: &str) -> Result<Vec<Part>, RequestError> {
    let dash_boundary = format!("--{boundary}");
    let delimiter = format!("\r\n--{boundary}");
    let finder = memmem::Finder::new(delimiter.as_bytes());

    // `cursor` always points just past a `--boundary`. The first one opens the body or ends
    // a preamble line.
    let mut cursor = if body.starts_with(dash_boundary.as_bytes()) {
        dash_boundary.len()
    } else {
        let at = finder
            .find(body)
            .ok_or(RequestError::MalformedMultipart("no opening boundary"))?;
        at + delimiter.len()
    };

    let mut parts = Vec::new();
    loop {
        let after_boundary = &body[cursor..];
        if after_boundary.is_empty() {
            return Err(RequestError::MalformedMultipart("no closing boundary"));
        }
        if after_boundary.starts_with(b"--") {
            // The close delimiter; whatever follows is epilogue, copied verbatim.
            return Ok(parts);
        }
        let part_start = cursor
            + line_end_after_boundary(after_boundary)
                .ok_or(RequestError::MalformedMultipart("junk after a boundary"))?;
        let content_end = part_start
            + finder
                .find(&body[part_start..])
                .ok_or(RequestError::MalformedMultipart("no closing boundary"))?;
        parts.push(parse_part(&body[part_start..content_end], part_start)?);
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

/// Replaces the content of the first text part named in `set` (its headers stay) and drops
/// later text parts of that name, delimiter included. Marks in `seen` which names were
/// present; returns `None` when nothing matched.
pub(super) fn splice(
    body: &[u8],
    parts: &[Part],
    set: &[(&str, &str)],
    seen: &mut [bool],
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut copied_to = 0;
    let mut previous_content_end = 0;
    let mut changed = false;
    for part in parts {
        let slot = part
            .param_name()
            .and_then(|name| set.iter().position(|(n, _)| *n == name));
        if let Some(slot) = slot {
            changed = true;
            if seen[slot] {
                // A later duplicate is never the first part, so the delimiter before it starts
                // right where the previous part's content ended.
                out.extend_from_slice(body.get(copied_to..previous_content_end)?);
            } else {
                seen[slot] = true;
                out.extend_from_slice(body.get(copied_to..part.content.start)?);
                out.extend_from_slice(set[slot].1.as_bytes());
            }
            copied_to = part.content.end;
        }
        previous_content_end = part.content.end;
    }
    if !changed {
        return None;
    }
    out.extend_from_slice(body.get(copied_to..)?);
    Some(out)
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

/// Parses one part (headers, blank line, content) found at `offset` in the body.
fn parse_part(part: &[u8], offset: usize) -> Result<Part, RequestError> {
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
    let disposition = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-disposition"))
        .map(|h| String::from_utf8_lossy(h.value));
    let params = disposition
        .as_deref()
        .map(header_parameters)
        .unwrap_or_default();
    let name = params
        .iter()
        .find(|(n, _)| n == "name")
        .map(|(_, v)| v.clone());
    let is_file = params
        .iter()
        .any(|(n, _)| n == "filename" || n == "filename*");
    Ok(Part {
        content: offset + header_len..offset + part.len(),
        name,
        is_file,
    })
}

/// The `; name=value` parameters after a header's first token, names lowercased, values
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
    fn a_part_without_headers_is_allowed() {
        let body = b"--b\r\n\r\ncontent\r\n--b--";
        let parts = split(body, "b").expect("well-formed");
        assert_eq!(names(&parts), [(None, false)]);
        assert_eq!(&body[parts[0].content.clone()], b"content");
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
            (b"--b\r\n\r\nx\r\n--b", "no closing boundary"),
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
