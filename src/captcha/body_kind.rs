//! The encoding of a request body ([`BodyKind`]), chosen from its Content-Type and, when
//! that is missing or `text/plain`, from the body's first byte. Decides which codec reads
//! the body; refuses what keyrelay could misread (a charset that hides ASCII, a boundary PHP
//! reads differently), and reads no body itself.

use super::multipart;
use super::request_error::{echo, RequestError};

/// The encoding of a request body, chosen from its Content-Type (and, when that is missing
/// or `text/plain`, from the body's first byte).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// No body bytes at all, whatever the Content-Type said.
    Empty,
    /// `application/x-www-form-urlencoded`, or an unlabelled body that is not JSON.
    Form,
    /// `multipart/form-data` with its (unquoted) boundary.
    Multipart { boundary: String },
    /// `application/json`, or a JSON object sent as `text/plain` or without a Content-Type.
    Json,
}

/// Picks the body encoding. Lenient where real clients are sloppy (no Content-Type, JSON as
/// `text/plain`), strict where guessing could forward a body keyrelay did not understand.
pub(super) fn body_kind(content_type: Option<&str>, body: &[u8]) -> Result<BodyKind, RequestError> {
    if body.is_empty() {
        return Ok(BodyKind::Empty);
    }
    let Some(content_type) = content_type.map(str::trim).filter(|ct| !ct.is_empty()) else {
        // curl -d and some scripts send no Content-Type at all.
        return Ok(if starts_like_json_object(body) {
            BodyKind::Json
        } else {
            BodyKind::Form
        });
    };
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    // Every `charset`, not only the first: a reader that takes the last one would decode
    // `charset=utf-8; charset=utf-16` as UTF-16.
    let charset = multipart::header_parameters(content_type)
        .into_iter()
        .find(|(name, charset)| name == "charset" && !ascii_compatible(charset));
    if let Some((_, charset)) = charset {
        return Err(RequestError::UnsupportedCharset(echo(&charset).to_owned()));
    }
    match mime.as_str() {
        "application/x-www-form-urlencoded" => Ok(BodyKind::Form),
        "multipart/form-data" => {
            let boundary = multipart::header_parameters(content_type)
                .into_iter()
                .find(|(name, _)| name == "boundary")
                .map(|(_, value)| value)
                .filter(|boundary| !boundary.is_empty())
                .ok_or(RequestError::MissingBoundary)?;
            if php_boundary(content_type) != Some(boundary.as_str()) {
                return Err(RequestError::AmbiguousBoundary);
            }
            Ok(BodyKind::Multipart { boundary })
        }
        "application/json" => Ok(BodyKind::Json),
        // The npm `2captcha` client posts its JSON body as text/plain;charset=UTF-8.
        "text/plain" if starts_like_json_object(body) => Ok(BodyKind::Json),
        _ => Err(RequestError::UnsupportedContentType(
            echo(content_type).to_owned(),
        )),
    }
}

/// The boundary PHP's rfc1867 handler takes from a Content-Type: it looks for the text
/// `boundary` anywhere (exact case first, then any case) and the first `=` after it, and
/// reads a `"`-quoted value up to the next `"`, or else up to a `,` or `;`. So in
/// `xboundary=P; boundary=K` PHP splits the body on `P`. `None` where PHP finds no boundary.
fn php_boundary(content_type: &str) -> Option<&str> {
    // ASCII lowercasing keeps every byte offset.
    let at = content_type
        .find("boundary")
        .or_else(|| content_type.to_ascii_lowercase().find("boundary"))?;
    let after = &content_type[at..];
    let value = &after[after.find('=')? + 1..];
    match value.strip_prefix('"') {
        Some(quoted) => quoted.find('"').map(|end| &quoted[..end]),
        None => Some(value.find([',', ';']).map_or(value, |end| &value[..end])),
    }
}

/// Whether text in `charset` keeps ASCII characters as their ASCII bytes, so that `key`, `=`
/// and `&` can be found as bytes. UTF-8, Latin and the other single-byte sets do; the wide
/// Unicode forms, UTF-7 and EBCDIC do not. An unknown name passes: nearly every charset in
/// use is a superset of ASCII.
fn ascii_compatible(charset: &str) -> bool {
    let charset = charset.trim().to_ascii_lowercase().replace('_', "-");
    let wide_or_shifted = [
        "utf-16",
        "utf16",
        "utf-32",
        "utf32",
        "ucs-2",
        "ucs2",
        "ucs-4",
        "ucs4",
        "utf-7",
        "utf7",
        "unicodefffe",
        "unicodefeff",
        "ebcdic",
        "cp037",
        "ibm037",
        "cp500",
        "ibm500",
        "cp875",
        "cp1026",
        "cp1047",
        "ibm1047",
        "cp1140",
        "ibm1140",
        "iso-2022",
        "hz-gb",
    ];
    !wide_or_shifted
        .iter()
        .any(|prefix| charset.starts_with(prefix))
}

fn starts_like_json_object(body: &[u8]) -> bool {
    body.iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn php_boundary_reads_like_rfc1867() {
        let cases = [
            ("multipart/form-data; boundary=K", Some("K")),
            ("multipart/form-data; charset=utf-8; boundary=K", Some("K")),
            ("multipart/form-data; boundary=K; charset=utf-8", Some("K")),
            (r#"multipart/form-data; boundary="K; x""#, Some("K; x")),
            (
                r#"Multipart/Form-Data; BOUNDARY="=_Part 1; x""#,
                Some("=_Part 1; x"),
            ),
            // The first `boundary` text wins, exact case before any case.
            ("multipart/form-data; xboundary=P; boundary=K", Some("P")),
            ("multipart/form-data; BOUNDARY=P; boundary=K", Some("K")),
            // No trimming, no escapes, a comma ends an unquoted value.
            ("multipart/form-data; boundary = K", Some(" K")),
            ("multipart/form-data; boundary=K ;x=y", Some("K ")),
            ("multipart/form-data; boundary=a,b", Some("a")),
            (r#"multipart/form-data; boundary="a\"b""#, Some("a\\")),
            // Missing, or a quote never closed.
            ("multipart/form-data", None),
            ("multipart/form-data; boundary", None),
            (r#"multipart/form-data; boundary="K"#, None),
        ];
        for (content_type, expected) in cases {
            assert_eq!(php_boundary(content_type), expected, "{content_type}");
        }
    }
}
