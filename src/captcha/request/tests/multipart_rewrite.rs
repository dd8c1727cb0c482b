//! The rewrite of multipart bodies, and the part spellings PHP and other readers take for
//! `key`.

use super::*;

/// Every byte value, plus sequences that look like a delimiter but are not one (not even
/// to PHP, which also splits on a bare `\n--XBOUNDARY`).
fn binary_file() -> Vec<u8> {
    let mut file: Vec<u8> = (0..=255u8).collect();
    file.extend(b"\r\n--\r\n--XBOUNDAR\r\n-XBOUNDARY\n-XBOUNDARY\n--XBOUNDAR\r--XBOUNDARY\r\n");
    file.extend((0..=255u8).rev());
    file
}

fn multipart_body(parts: &[(&str, &[u8])], file: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, value) in parts {
        body.extend(b"--XBOUNDARY\r\nContent-Disposition: form-data; name=\"");
        body.extend(name.as_bytes());
        body.extend(b"\"\r\n\r\n");
        body.extend(*value);
        body.extend(b"\r\n");
    }
    body.extend(
        b"--XBOUNDARY\r\nContent-Disposition: form-data; name=\"file\"; filename=\"captcha.png\"\r\n\
          Content-Type: image/png\r\n\r\n",
    );
    body.extend(file);
    body.extend(b"\r\n--XBOUNDARY--\r\n");
    body
}

const MULTIPART: Option<&str> = Some("multipart/form-data; boundary=XBOUNDARY");

#[test]
fn multipart_text_parts_are_params_and_file_parts_are_not() {
    let file = binary_file();
    let body = multipart_body(
        &[
            ("soft_id", b"4580"),
            ("method", b"post"),
            ("key", b"CALLER"),
        ],
        &file,
    );
    let request = parse("", MULTIPART, &body);
    assert_eq!(
        request.kind(),
        &BodyKind::Multipart {
            boundary: "XBOUNDARY".to_owned()
        }
    );
    assert_eq!(
        pairs(&request),
        [("soft_id", "4580"), ("method", "post"), ("key", "CALLER")]
    );
    assert_eq!(request.param("file").as_deref(), None);
}

#[test]
fn multipart_rewrite_replaces_the_key_part_and_copies_the_file_exactly() {
    let file = binary_file();
    let body = multipart_body(
        &[
            ("soft_id", b"4580"),
            ("key", b"CALLER"),
            ("method", b"post"),
        ],
        &file,
    );
    let request = parse("json=1", MULTIPART, &body);
    let (query, rewritten) = rewrite_key(&request);
    assert_eq!(query, "json=1");
    let expected = multipart_body(
        &[
            ("soft_id", b"4580"),
            ("key", POOL.as_bytes()),
            ("method", b"post"),
        ],
        &file,
    );
    assert_eq!(rewritten, expected);
}

#[test]
fn multipart_rewrite_drops_later_key_parts() {
    let file = binary_file();
    let body = multipart_body(
        &[
            ("key", b"first"),
            ("method", b"post"),
            ("key", b"second"),
            ("key", b""),
        ],
        &file,
    );
    let request = parse("", MULTIPART, &body);
    assert_eq!(request.param("key").as_deref(), Some(""));
    let (_, rewritten) = rewrite_key(&request);
    let expected = multipart_body(&[("key", POOL.as_bytes()), ("method", b"post")], &file);
    assert_eq!(rewritten, expected);
}

#[test]
fn multipart_key_in_query_only_leaves_the_body_untouched() {
    let file = binary_file();
    let body = multipart_body(&[("method", b"post")], &file);
    let request = parse("key=CALLER&json=1", MULTIPART, &body);
    assert_eq!(
        rewrite_key(&request),
        (format!("key={POOL}&json=1"), body.clone())
    );
    let request = parse("json=1", MULTIPART, &body);
    assert_eq!(rewrite_key(&request), (format!("json=1&key={POOL}"), body));
}

#[test]
fn multipart_key_in_query_and_body_goes_to_the_body_only() {
    let file = binary_file();
    let body = multipart_body(&[("key", b"B")], &file);
    let request = parse("key=Q", MULTIPART, &body);
    let expected = multipart_body(&[("key", POOL.as_bytes())], &file);
    assert_eq!(rewrite_key(&request), (String::new(), expected));
}

#[test]
fn multipart_file_part_named_key_is_not_a_param_but_is_replaced() {
    // PHP files it as an upload, but a reader that takes any part named `key` for the
    // key would read the caller's bytes: it becomes the one canonical key part.
    let body =
        b"--b\r\nContent-Disposition: form-data; name=key; filename=k.txt\r\n\r\nFILE\r\n--b--";
    let request = parse("", Some("multipart/form-data; boundary=b"), body);
    assert_eq!(request.param("key").as_deref(), None);
    let expected =
        format!("--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\n{POOL}\r\n--b--");
    assert_eq!(
        rewrite_key(&request),
        (String::new(), expected.into_bytes())
    );
}

#[test]
fn multipart_quoted_boundary_with_preamble_epilogue_and_padding() {
    let body = b"This is a preamble.\r\n--=_Part 1; x\t \r\n\
        Content-Disposition: form-data; name=\"key\"\r\n\r\nCALLER\r\n\
        --=_Part 1; x\r\nContent-Disposition: form-data; name=\"json\"\r\n\r\n1\r\n\
        --=_Part 1; x--\r\nepilogue \r\n";
    let content_type = r#"Multipart/Form-Data; charset=utf-8; BOUNDARY="=_Part 1; x""#;
    let request = parse("", Some(content_type), body);
    assert_eq!(
        request.kind(),
        &BodyKind::Multipart {
            boundary: "=_Part 1; x".to_owned()
        }
    );
    assert_eq!(pairs(&request), [("key", "CALLER"), ("json", "1")]);
    let (_, rewritten) = rewrite_key(&request);
    let expected = String::from_utf8_lossy(body).replace("CALLER", POOL);
    assert_eq!(String::from_utf8(rewritten).expect("ascii"), expected);
}

#[test]
fn multipart_part_values_are_raw_bytes() {
    let body = b"--b\r\nContent-Disposition: form-data; name=\"pageurl\"\r\n\r\nhttps://a.test/?x=%41+b\r\n--b--";
    let request = parse("", Some("multipart/form-data; boundary=b"), body);
    assert_eq!(
        request.param("pageurl").as_deref(),
        Some("https://a.test/?x=%41+b")
    );
    let rewritten = request.rewrite(&[("pageurl", "a b")]);
    assert_eq!(
        &rewritten.body[..],
        &b"--b\r\nContent-Disposition: form-data; name=\"pageurl\"\r\n\r\na b\r\n--b--"[..]
    );
}

fn one_part(disposition: &str) -> Vec<u8> {
    format!("--b\r\nContent-Disposition: {disposition}\r\n\r\nCALLER\r\n--b--\r\n").into_bytes()
}

/// [`one_part`] as the rewrite leaves it: one canonical part holding the pool key.
fn canonical_key_part() -> String {
    format!("--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\n{POOL}\r\n--b--\r\n")
}

#[test]
fn multipart_dispositions_php_reads_as_a_key_part_are_rewritten() {
    let canonical = canonical_key_part();
    for disposition in [
        r#"form-data; name="x"; name="key""#,
        "form-data; name='key'",
        "form-data; name=\"key\"; filename*=UTF-8''k.txt",
        r#"form-data; name="key"; filename ="k.txt""#,
        r#"form-data; name=" key""#,
        r#"form-data; name="key[]""#,
        r#"name="key""#,
    ] {
        let request = parse("json=1", MULTIPART_B, &one_part(disposition));
        assert_eq!(
            request.param("key").as_deref(),
            Some("CALLER"),
            "{disposition}"
        );
        assert_eq!(
            rewrite_key(&request),
            ("json=1".to_owned(), canonical.clone().into_bytes()),
            "{disposition}"
        );
    }
}

#[test]
fn multipart_dispositions_other_readers_take_for_key_are_rewritten() {
    // PHP reads none of these as `key`, but some parser does: the first `name` of two,
    // an RFC 5987 `name*`, RFC 2231 continuations, case, a second Content-Disposition.
    let canonical = canonical_key_part();
    for disposition in [
        r#"form-data; name="key"; name="x""#,
        "form-data; name*=UTF-8''key",
        "form-data; name*=UTF-8''%6B%65%79",
        "form-data; name=\"x\"; name*=utf-8'en'key",
        r#"form-data; name*0="ke"; name*1="y""#,
        "form-data; name*0*=UTF-8''k; name*1*=%65y",
        r#"form-data; NAME="KEY""#,
        r#"form-data; name="Key ""#,
        r#"form-data; name="k%65y""#,
        "form-data; name=\"x\"\r\nContent-Disposition: form-data; name=\"key\"",
    ] {
        let request = parse("json=1", MULTIPART_B, &one_part(disposition));
        assert_eq!(
            rewrite_key(&request),
            ("json=1".to_owned(), canonical.clone().into_bytes()),
            "{disposition}"
        );
    }
    for not_key in [r#"form-data; name="x""#, r#"form-data; filename="key""#] {
        let body = one_part(not_key);
        let request = parse("", MULTIPART_B, &body);
        assert_eq!(
            rewrite_key(&request),
            (format!("key={POOL}"), body),
            "{not_key}"
        );
    }
}

#[test]
fn multipart_names_a_quote_blind_reader_finds_are_rewritten() {
    // Found by the fuzz harness (multer read-back of request_multipart): multer, behind
    // axum's `Multipart`, takes a `name=` after any space or `;`, even where PHP sees no
    // `name` parameter, so it read each of these parts as the caller's `key`.
    let canonical =
        format!("--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\n{POOL}\r\n--b--\r\n");
    for disposition in [
        r#"form-data[ name="key""#,
        "form-data; filename=a name=key",
        "form-data; x='; name=key; '",
        r#"form-data; filename="a name=key b""#,
    ] {
        let request = parse("json=1", MULTIPART_B, &one_part(disposition));
        assert_eq!(
            rewrite_key(&request),
            ("json=1".to_owned(), canonical.clone().into_bytes()),
            "{disposition}"
        );
    }
}

#[test]
fn multipart_encoded_names_are_decoded_before_the_second_decoding() {
    // Found with the fuzz harness's spelling rule: a `name*` value is percent-encoded by
    // its own encoding, so a reader that decodes names twice reads `k%2565y` as `key`,
    // as it does `k%2565y=` in a query.
    let canonical =
        format!("--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\n{POOL}\r\n--b--\r\n");
    for disposition in [
        "form-data; name*=UTF-8''k%2565y",
        "form-data; name*0*=UTF-8''k%25; name*1*=65y",
    ] {
        let request = parse("json=1", MULTIPART_B, &one_part(disposition));
        assert_eq!(
            rewrite_key(&request),
            ("json=1".to_owned(), canonical.clone().into_bytes()),
            "{disposition}"
        );
    }
}

#[test]
fn multipart_bodies_php_splits_differently_are_refused() {
    let bare_lf = b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nhello\n\
        --b\nContent-Disposition: form-data; name=\"key\"\n\nCALLER\r\n--b--\r\n";
    assert_eq!(
        parse_err(MULTIPART_B, bare_lf),
        RequestError::MalformedMultipart("boundary after a bare LF")
    );
    let after_close = b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--b--\r\n\
        --b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nCALLER\r\n--b--\r\n";
    let err = parse_err(MULTIPART_B, after_close);
    assert_eq!(
        err,
        RequestError::MalformedMultipart("boundary after the close delimiter")
    );
    assert_eq!(
        err.to_string(),
        "malformed multipart body: boundary after the close delimiter"
    );
    assert_eq!(err.code(), "ERROR_BAD_PARAMETERS");
}
