//! The strict reading of a decision param (`ParsedRequest::single`) and the rewrite that
//! leaves one canonical value, over every spelling and encoding.

use super::*;

/// A spelling of `id` in each encoding: (what it is, query, content type, body), each naming
/// `id` once with `value`, the way a caller could. Every one is a param some reader takes
/// for `id`, so [`ParsedRequest::single`] must read it and the rewrite must replace it.
fn id_spellings(value: &str) -> Vec<(String, String, Option<&'static str>, Vec<u8>)> {
    let mut cases = Vec::new();
    for name in [
        "id",
        "ID",
        "Id",
        "id[]",
        "id%5B%5D",
        "id[0]",
        "+id",
        "%20id",
        "i%64",
        "%69%64",
        "id%00x",
        "%09id",
        "id+",
        "%E2%80%8Bid",
    ] {
        cases.push((
            format!("query {name}"),
            format!("{name}={value}"),
            None,
            Vec::new(),
        ));
        cases.push((
            format!("form {name}"),
            String::new(),
            FORM,
            format!("{name}={value}").into_bytes(),
        ));
    }
    for disposition in [
        r#"form-data; name="id""#,
        r#"form-data; name="ID""#,
        r#"form-data; name="id[]""#,
        r#"form-data; name=" id""#,
        r#"form-data; NAME="id""#,
        "form-data; name='id'",
        r#"form-data; name="other"; name="id""#,
        r#"form-data; name="id"; name="other""#,
        "form-data; name*=UTF-8''id",
        r#"form-data; name="id"; filename="id.txt""#,
        "form-data; name=\"other\"\r\nContent-Disposition: form-data; name=\"id\"",
    ] {
        cases.push((
            format!("multipart {disposition}"),
            String::new(),
            MULTIPART_B,
            format!("--b\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n--b--\r\n")
                .into_bytes(),
        ));
    }
    for name in ["id", "ID", " id", "id[]", "\\u0069d", "i\\u0064"] {
        cases.push((
            format!("json {name}"),
            String::new(),
            JSON,
            format!(r#"{{"{name}":"{value}"}}"#).into_bytes(),
        ));
    }
    cases
}

#[test]
fn a_strict_reading_sees_every_spelling_in_every_encoding() {
    for (what, query, content_type, body) in id_spellings("7") {
        let request = parse(&query, content_type, &body);
        assert_eq!(request.single("id"), Ok(Some("7".into())), "{what}");
        // Beside the same value in the query, still one value.
        let request = parse(&format!("{query}&id=7"), content_type, &body);
        assert_eq!(request.single("id"), Ok(Some("7".into())), "{what}, twice");
    }
}

#[test]
fn a_strict_reading_refuses_two_values_in_any_two_spellings_or_places() {
    for (what, query, content_type, body) in id_spellings("8") {
        let request = parse(&format!("{query}&id=7"), content_type, &body);
        assert_eq!(
            request.single("id"),
            Err(Conflict::Values { name: "id" }),
            "{what}"
        );
        // Other names are not involved.
        assert_eq!(request.single("ids"), Ok(None), "{what}");
        assert_eq!(request.single("action"), Ok(None), "{what}");
    }
}

#[test]
fn a_strict_reading_pairs_every_spelling_with_every_other() {
    let spellings = id_spellings("7");
    for (first, query, content_type, body) in &spellings {
        for (second, other_query, _, _) in spellings.iter().filter(|s| s.2.is_none()) {
            let mixed = format!("{query}&{}", other_query.replace('7', "9"));
            let request = parse(&mixed, *content_type, body);
            assert_eq!(
                request.single("id"),
                Err(Conflict::Values { name: "id" }),
                "{first} with {second}"
            );
            let mixed = format!("{query}&{other_query}");
            let request = parse(&mixed, *content_type, body);
            assert_eq!(
                request.single("id"),
                Ok(Some("7".into())),
                "{first} with {second}"
            );
        }
    }
}

#[test]
fn the_same_value_is_the_same_decoded_text() {
    for (raw, content_type, body, expected) in [
        // However it was encoded, the text is what counts.
        ("id=7&ID=%37", None, &b""[..], Ok(Some("7"))),
        ("action=get&ACTION=g%65t", None, b"", Ok(Some("get"))),
        ("id=7", JSON, br#"{"id":7}"#, Ok(Some("7"))),
        ("id=7", JSON, br#"{"id":"\u0037"}"#, Ok(Some("7"))),
        ("id=7", FORM, b"ID=7&id[]=7", Ok(Some("7"))),
        // Text a trimming, case-blind or numeric reader would equate is still two values.
        ("id=0123&id=123", None, b"", Err(())),
        ("id=7", JSON, br#"{"id":"07"}"#, Err(())),
        ("id=7", JSON, br#"{"id":7.0}"#, Err(())),
        ("action=get&action=+get", None, b"", Err(())),
        ("action=get&action=GET", None, b"", Err(())),
        // A blank value is a value: which one the service reads is its choice.
        ("id=&id=7", None, b"", Err(())),
        ("id=7", JSON, br#"{"id":null}"#, Err(())),
    ] {
        let name = if raw.starts_with("id") {
            "id"
        } else {
            "action"
        };
        let request = parse(raw, content_type, body);
        let expected = expected
            .map(|value| value.map(Cow::Borrowed))
            .map_err(|()| Conflict::Values { name });
        assert_eq!(request.single(name), expected, "{raw} {body:?}");
    }
}

#[test]
fn names_that_are_not_a_spelling_are_not_read() {
    let request = parse(
        "ids=1,2&idx=3&pid=4&i+d=5&%5Bid%5D=6&_id=7",
        JSON,
        br#"{"ids":"1","id_":"2"}"#,
    );
    assert_eq!(request.single("id"), Ok(None));
    assert_eq!(request.single("ids"), Err(Conflict::Values { name: "ids" }));
    let request = parse("id=1", None, b"");
    assert_eq!(request.single("ids"), Ok(None));
}

#[test]
fn a_file_part_named_so_counts_though_php_files_it_apart() {
    // The rewrite replaces it, and a reader that takes file parts for fields (multer) would
    // read it: its content is a value like any other.
    let body =
        b"--b\r\nContent-Disposition: form-data; name=\"id\"; filename=\"x\"\r\n\r\n8\r\n--b--\r\n";
    let request = parse("id=7", MULTIPART_B, body);
    assert_eq!(request.param("id").as_deref(), Some("7"));
    assert_eq!(request.single("id"), Err(Conflict::Values { name: "id" }));
}

#[test]
fn a_strict_reading_of_a_plain_query_borrows_its_value() {
    let request = parse("key=k&action=get&id=123&json=1", None, b"");
    assert!(matches!(
        request.single("id"),
        Ok(Some(Cow::Borrowed("123")))
    ));
    assert!(matches!(
        request.single("action"),
        Ok(Some(Cow::Borrowed("get")))
    ));
}

/// Every param of a request that some reader could take for `name`, with its value: the
/// urlencoded and JSON ones by name, and a multipart body's parts (text or file, under any
/// name a reader gives them) as `<part>`.
fn spelled(request: &ParsedRequest, name: &str) -> Vec<(String, String)> {
    let parts = match &request.layout {
        Layout::Multipart(parts) => Some(parts),
        _ => None,
    };
    let mut found: Vec<(String, String)> = request
        .params
        .iter()
        .filter(|param| param.wire.is_some() || parts.is_none())
        .filter(|param| request.spells(param, name))
        .map(|param| {
            let name = request.text(param.name).into_owned();
            (name, request.text(param.value).into_owned())
        })
        .collect();
    if let Some(parts) = parts {
        for value in multipart::spelled_values(&request.body, parts, name) {
            found.push(("<part>".to_owned(), value.into_owned()));
        }
    }
    found
}

#[test]
fn the_rewrite_leaves_one_canonical_value_and_no_dropped_spelling_in_any_encoding() {
    for (what, query, content_type, body) in id_spellings("7") {
        for (extra, list) in [("ids=1,2", "ids"), ("IDS=3", "ids"), ("+ids[]=", "ids")] {
            let request = parse(&format!("{query}&{extra}&ID=7&json=1"), content_type, &body);
            let rewritten = request.rewrite_dropping(&[("key", POOL), ("id", "7")], &[list]);
            let after =
                ParsedRequest::parse(Some(&rewritten.query), content_type, rewritten.body.clone())
                    .expect("the rewrite parses");
            // In a multipart body, the one part left must be the canonical one PHP reads.
            let canonical = if content_type == MULTIPART_B && !body.is_empty() {
                assert_eq!(after.param("id").as_deref(), Some("7"), "{what}");
                "<part>"
            } else {
                "id"
            };
            assert_eq!(
                spelled(&after, "id"),
                vec![(canonical.to_owned(), "7".to_owned())],
                "{what} with {extra}: {:?} {:?}",
                rewritten.query,
                String::from_utf8_lossy(&rewritten.body)
            );
            assert_eq!(spelled(&after, "ids"), vec![], "{what} with {extra}");
            assert_eq!(after.single("id"), Ok(Some("7".into())), "{what}");
            assert_eq!(after.param("json").as_deref(), Some("1"), "{what}");
        }
    }
}

#[test]
fn a_dropped_name_is_removed_wherever_it_is_and_never_written() {
    let request = parse("ids=1&action=get&IDS=2", FORM, b"ids%5B%5D=3&x=1");
    let rewritten = request.rewrite_dropping(&[("key", POOL)], &["ids"]);
    assert_eq!(rewritten.query, format!("action=get&key={POOL}"));
    assert_eq!(&rewritten.body[..], b"x=1");
    // Nothing to drop: the bytes are kept.
    let request = parse("action=get&id=7", JSON, br#"{"a" : 1}"#);
    let rewritten = request.rewrite_dropping(&[], &["ids"]);
    assert_eq!(rewritten.query, "action=get&id=7");
    assert_eq!(&rewritten.body[..], br#"{"a" : 1}"#);
    // In a multipart body, text and file parts alike.
    let body = b"--b\r\nContent-Disposition: form-data; name=\"IDS\"\r\n\r\n1,2\r\n\
                 --b\r\nContent-Disposition: form-data; name=\"ids\"; filename=\"f\"\r\n\r\nx\r\n\
                 --b\r\nContent-Disposition: form-data; name=\"m\"\r\n\r\nv\r\n--b--\r\n";
    let request = parse("", MULTIPART_B, body);
    let rewritten = request.rewrite_dropping(&[], &["ids"]);
    assert_eq!(
        &rewritten.body[..],
        &b"--b\r\nContent-Disposition: form-data; name=\"m\"\r\n\r\nv\r\n--b--\r\n"[..]
    );
    // A JSON member.
    let request = parse("", JSON, br#"{"Ids":"1","a":2,"ids":"3"}"#);
    let rewritten = request.rewrite_dropping(&[("id", "7")], &["ids"]);
    assert_eq!(rewritten.query, "id=7");
    assert_eq!(&rewritten.body[..], br#"{"a":2}"#);
}

#[test]
fn set_names_go_where_the_body_had_them_and_dropped_ones_leave_no_trace() {
    // The checked id goes in the body, where the caller's was (the service reads the body
    // over the query), and the query's spelling of it goes.
    let request = parse("action=get&id=7", FORM, b"ID=7&ids=");
    let rewritten = request.rewrite_dropping(&[("action", "get"), ("id", "7")], &["ids"]);
    assert_eq!(rewritten.query, "action=get");
    assert_eq!(&rewritten.body[..], b"id=7");
}
