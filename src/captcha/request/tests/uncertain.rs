//! What keyrelay cannot read with certainty: odd Content-Types, encodings and charsets,
//! refused rather than guessed at.

use super::*;

fn http_headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            hyper::header::HeaderValue::from_bytes(value).expect("value"),
        );
    }
    headers
}

fn parse_http(pairs: &[(&str, &[u8])], body: &[u8]) -> Result<ParsedRequest, RequestError> {
    ParsedRequest::parse_http(
        Some("json=1"),
        &http_headers(pairs),
        Bytes::copy_from_slice(body),
    )
}

const KEY_PART: &[u8] =
    b"--X\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nCALLER\r\n--X--\r\n";

#[test]
fn a_content_type_with_non_ascii_bytes_is_refused_not_guessed() {
    for value in [
        &b"multipart/form-data; boundary=X; charset=\xe9"[..],
        b"multipart/form-data; boundary=\xffX",
        b"application/x-www-form-urlencoded\x80",
        b"\xc3\xa9",
    ] {
        let err = parse_http(&[("content-type", value)], KEY_PART)
            .expect_err("an unreadable content type must be refused");
        assert_eq!(err, RequestError::UnreadableContentType, "{value:?}");
        assert_eq!(err.code(), "ERROR_BAD_PARAMETERS");
    }
    // Without a body there is nothing to misread.
    assert!(parse_http(&[("content-type", b"x/\xe9")], b"").is_ok());
}

#[test]
fn two_content_types_are_refused() {
    let err = parse_http(
        &[
            ("content-type", b"multipart/form-data; boundary=X"),
            ("content-type", b"application/x-www-form-urlencoded"),
        ],
        KEY_PART,
    )
    .expect_err("ambiguous");
    assert_eq!(err, RequestError::AmbiguousContentType);
}

#[test]
fn an_encoded_body_is_refused_and_identity_is_not_an_encoding() {
    let form = &[("content-type", &b"application/x-www-form-urlencoded"[..])];
    for coding in [
        &b"gzip"[..],
        b"deflate",
        b"br",
        b"identity, gzip",
        b"x-custom",
    ] {
        let headers = [form[0], ("content-encoding", coding)];
        let err = parse_http(&headers, b"key=CALLER").expect_err("encoded");
        assert!(
            matches!(err, RequestError::UnsupportedContentEncoding(_)),
            "{coding:?}: {err:?}"
        );
    }
    // Found by probing the request_http fuzz target: `str::trim` took a trailing no-break
    // space (and other Unicode spaces) for HTTP whitespace.
    for coding in [
        &b"identity\xc2\xa0"[..],
        b"\xe2\x80\x83identity",
        b"identity\xc2\x85",
    ] {
        let headers = [form[0], ("content-encoding", coding)];
        let err = parse_http(&headers, b"key=CALLER").expect_err("not identity");
        assert!(
            matches!(err, RequestError::UnsupportedContentEncoding(_)),
            "{coding:?}: {err:?}"
        );
    }
    for coding in [&b"identity"[..], b"IDENTITY", b"", b" identity\t, identity"] {
        let headers = [form[0], ("content-encoding", coding)];
        assert!(parse_http(&headers, b"key=CALLER").is_ok(), "{coding:?}");
    }
}

#[test]
fn charsets_that_hide_ascii_are_refused() {
    for charset in [
        "utf-16",
        "UTF-16LE",
        "utf-16be",
        "utf-32",
        "UCS-2",
        "utf-7",
        "\"utf-16\"",
        "IBM037",
        "cp500",
        "ISO-2022-JP",
        // Found by the request_http fuzz target: a second charset used to be ignored.
        "utf-8; charset=utf-16",
    ] {
        let content_type = format!("application/x-www-form-urlencoded; charset={charset}");
        let err =
            ParsedRequest::parse(None, Some(&content_type), Bytes::from_static(b"key=CALLER"))
                .expect_err("wide charset");
        assert!(
            matches!(err, RequestError::UnsupportedCharset(_)),
            "{charset}: {err:?}"
        );
    }
    for charset in [
        "utf-8",
        "UTF8",
        "iso-8859-1",
        "windows-1251",
        "us-ascii",
        "koi8-r",
    ] {
        let content_type = format!("application/x-www-form-urlencoded; charset={charset}");
        assert!(
            ParsedRequest::parse(None, Some(&content_type), Bytes::from_static(b"a=1")).is_ok(),
            "{charset}"
        );
    }
}
