//! Why a caller's request could not be understood ([`RequestError`]), and how much of the
//! caller's input its messages may echo. A leaf: the request parser and the body codecs
//! (`multipart`, `json_body`) all report through it, and it imports none of them.

/// How much caller input an error message may echo.
const MAX_ECHO_BYTES: usize = 64;

/// Why a request could not be understood. Messages echo at most 64 bytes of input.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A non-empty body with a Content-Type keyrelay cannot parse (value cut to 64 bytes).
    #[error("unsupported content type {0:?}")]
    UnsupportedContentType(String),
    /// `multipart/form-data` without a usable `boundary` parameter.
    #[error("multipart/form-data content type without a boundary")]
    MissingBoundary,
    /// A `boundary` parameter PHP reads differently (a second `boundary`, spaces or a comma
    /// in the value), so PHP would split the body at other places than keyrelay.
    #[error("ambiguous multipart/form-data boundary parameter")]
    AmbiguousBoundary,
    /// A multipart body that does not follow its boundary structure.
    #[error("malformed multipart body: {0}")]
    MalformedMultipart(&'static str),
    /// A Content-Type header keyrelay cannot read as text (a byte that is not visible
    /// ASCII), so it cannot tell how the body is encoded or where its `key` is.
    #[error("unreadable content type: it holds bytes that are not ASCII")]
    UnreadableContentType,
    /// More than one Content-Type header: readers disagree on which one counts.
    #[error("more than one content type")]
    AmbiguousContentType,
    /// A body compressed or otherwise encoded (`Content-Encoding`), which keyrelay would have
    /// to forward without seeing the key inside (value cut to 64 bytes).
    #[error("unsupported content encoding {0:?}; send the body unencoded")]
    UnsupportedContentEncoding(String),
    /// A charset in which ASCII text is not ASCII bytes (UTF-16, UTF-7, EBCDIC, …): the
    /// names keyrelay looks for could hide in it (value cut to 64 bytes).
    #[error("unsupported charset {0:?}; send the body in UTF-8")]
    UnsupportedCharset(String),
    /// A JSON body that is not a single, well-formed JSON object.
    #[error("malformed JSON body: {reason} at line {line}, column {column}")]
    MalformedJson {
        reason: &'static str,
        line: usize,
        column: usize,
    },
}

impl RequestError {
    /// The 2captcha-style code keyrelay answers with.
    pub fn code(&self) -> &'static str {
        // Every variant is the caller sending something the service would not accept either.
        "ERROR_BAD_PARAMETERS"
    }
}

/// At most [`MAX_ECHO_BYTES`] of `input`, cut at a character boundary.
pub(super) fn echo(input: &str) -> &str {
    let mut end = input.len().min(MAX_ECHO_BYTES);
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    &input[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_keeps_the_longest_whole_prefix_within_the_bound() {
        // One-, two-, three- and four-byte characters, so every cut position is met.
        let text: String = "aé€😀".chars().cycle().take(80).collect();
        for end in (0..=text.len()).filter(|&end| text.is_char_boundary(end)) {
            let input = &text[..end];
            let shown = echo(input);
            assert!(input.starts_with(shown), "{input:?}");
            assert!(shown.len() <= MAX_ECHO_BYTES, "{input:?}");
            // Nothing more would have fitted: the next character crosses the bound.
            if let Some(next) = input[shown.len()..].chars().next() {
                assert!(shown.len() + next.len_utf8() > MAX_ECHO_BYTES, "{input:?}");
            }
        }
    }
}
