//! Parsing a request: params from the query and each body encoding, what is refused, and
//! names as PHP keys them.

use super::*;

#[test]
fn query_only_request() {
    let request = ParsedRequest::parse(
        Some("key=CALLER&method=userrecaptcha&googlekey=6Le&pageurl=https%3A%2F%2Fa.test%2F%3Fx%3D1&json=1"),
        None,
        Bytes::new(),
    )
    .expect("parses");
    assert_eq!(request.kind(), &BodyKind::Empty);
    assert_eq!(
        pairs(&request),
        [
            ("key", "CALLER"),
            ("method", "userrecaptcha"),
            ("googlekey", "6Le"),
            ("pageurl", "https://a.test/?x=1"),
            ("json", "1"),
        ]
    );
    assert!(request.wants_json());
    assert_eq!(request.single("action"), Ok(None));
}

#[test]
fn no_query_and_no_body() {
    let request = ParsedRequest::parse(None, None, Bytes::new()).expect("parses");
    assert!(request.params().is_empty());
    assert_eq!(request.param("key").as_deref(), None);
    assert!(!request.wants_json());
    assert_eq!(
        request.rewrite(&[("key", POOL)]).query,
        format!("key={POOL}")
    );
}

#[test]
fn query_decoding_is_lenient() {
    let request = parse("a=%FF%zz&b=x+y%20z&&=v&flag&c=1=2", None, b"");
    assert_eq!(
        pairs(&request),
        [
            ("a", "\u{fffd}%zz"),
            ("b", "x y z"),
            ("", "v"),
            ("flag", ""),
            ("c", "1=2"),
        ]
    );
}

#[test]
fn form_body_params_follow_query_params() {
    let request = parse(
        "json=1",
        Some("Application/X-WWW-Form-Urlencoded; Charset=UTF-8"),
        b"key=CALLER&method=base64&body=R0lG%2B%2F%3D%3D",
    );
    assert_eq!(request.kind(), &BodyKind::Form);
    assert_eq!(
        pairs(&request),
        [
            ("json", "1"),
            ("key", "CALLER"),
            ("method", "base64"),
            ("body", "R0lG+/=="),
        ]
    );
}

#[test]
fn body_wins_over_query_and_last_duplicate_wins() {
    let request = parse("json=1&action=get&id=1&id=2", FORM, b"json=0&key=a&key=b");
    assert_eq!(request.param("json").as_deref(), Some("0"));
    assert!(!request.wants_json());
    assert_eq!(request.param("id").as_deref(), Some("2"));
    assert_eq!(request.param("key").as_deref(), Some("b"));
    assert_eq!(request.param("action").as_deref(), Some("get"));
    assert_eq!(request.param("missing").as_deref(), None);

    let json = parse("json=0&key=q", JSON, br#"{"json":1,"key":"a","key":"b"}"#);
    assert!(json.wants_json());
    assert_eq!(json.param("key").as_deref(), Some("b"));
}

#[test]
fn wants_json_accepts_1_and_true_only() {
    for (query, expected) in [
        ("json=1", true),
        ("json=true", true),
        ("json=TRUE", true),
        ("json=%201%20", true),
        ("json=0", false),
        ("json=", false),
        ("json=yes", false),
        ("JSON=1", false),
        ("", false),
    ] {
        assert_eq!(parse(query, None, b"").wants_json(), expected, "{query}");
    }
}

#[test]
fn json_body_params() {
    let request = parse(
        "",
        Some("application/json;charset=utf-8"),
        br#"{"key":"CALLER","json":1,"soft_id":4587,"header_acao":true,"body":"R0lG\/\u00e9","proxy":null,"coords":[1,2],"extra":{"a":"b"},"f":1.5}"#,
    );
    assert_eq!(request.kind(), &BodyKind::Json);
    assert_eq!(
        pairs(&request),
        [
            ("key", "CALLER"),
            ("json", "1"),
            ("soft_id", "4587"),
            ("header_acao", "true"),
            ("body", "R0lG/é"),
            ("proxy", ""),
            ("coords", "[1,2]"),
            ("extra", r#"{"a":"b"}"#),
            ("f", "1.5"),
        ]
    );
    assert!(request.wants_json());
}

#[test]
fn text_plain_json_body_is_json() {
    // npm `2captcha` 3.0.7: key and method in the query, the image as JSON text/plain.
    let request = parse(
        "key=CALLER&json=1&method=base64",
        Some("text/plain;charset=UTF-8"),
        b"\r\n {\"body\":\"R0lG\"}",
    );
    assert_eq!(request.kind(), &BodyKind::Json);
    assert_eq!(request.param("body").as_deref(), Some("R0lG"));
    assert_eq!(request.param("key").as_deref(), Some("CALLER"));
}

#[test]
fn text_plain_that_is_not_json_is_rejected() {
    assert_eq!(
        parse_err(Some("text/plain; charset=UTF-8"), b"key=abc"),
        RequestError::UnsupportedContentType("text/plain; charset=UTF-8".to_owned())
    );
    assert!(matches!(
        parse_err(Some("text/plain"), b"{\"key\":"),
        RequestError::MalformedJson {
            reason: "truncated",
            ..
        }
    ));
}

#[test]
fn missing_content_type_is_guessed_from_the_body() {
    let json = parse("", None, b"  {\"a\":\"1\"}");
    assert_eq!(json.kind(), &BodyKind::Json);
    assert_eq!(json.param("a").as_deref(), Some("1"));
    let form = parse("", Some("  "), b"a=1&b=2");
    assert_eq!(form.kind(), &BodyKind::Form);
    assert_eq!(form.param("b").as_deref(), Some("2"));
}

#[test]
fn empty_body_is_empty_whatever_the_content_type() {
    for content_type in [
        None,
        FORM,
        JSON,
        Some("text/plain"),
        Some("multipart/form-data"),
        Some("image/png"),
    ] {
        let request = parse("a=1", content_type, b"");
        assert_eq!(request.kind(), &BodyKind::Empty, "{content_type:?}");
        assert_eq!(pairs(&request), [("a", "1")]);
    }
}

#[test]
fn unsupported_content_type_is_rejected_and_echo_is_bounded() {
    let err = parse_err(Some("image/png"), b"\x89PNG");
    assert_eq!(
        err,
        RequestError::UnsupportedContentType("image/png".to_owned())
    );
    assert_eq!(err.to_string(), r#"unsupported content type "image/png""#);
    assert_eq!(err.code(), "ERROR_BAD_PARAMETERS");

    let long = format!("application/{}", "é".repeat(100));
    let RequestError::UnsupportedContentType(echoed) = parse_err(Some(&long), b"x") else {
        panic!("wrong variant");
    };
    assert_eq!(echoed.len(), 64);
    assert!(long.starts_with(&echoed));

    assert!(matches!(
        parse_err(Some("multipart/mixed; boundary=x"), b"--x--"),
        RequestError::UnsupportedContentType(_)
    ));
}

#[test]
fn multipart_without_boundary_is_rejected() {
    for content_type in [
        "multipart/form-data",
        "multipart/form-data; charset=utf-8",
        "multipart/form-data; boundary=",
        "multipart/form-data; boundary=\"\"",
    ] {
        let err = parse_err(Some(content_type), b"--x\r\n\r\n\r\n--x--");
        assert_eq!(err, RequestError::MissingBoundary, "{content_type}");
        assert_eq!(err.code(), "ERROR_BAD_PARAMETERS");
    }
}

#[test]
fn a_boundary_php_reads_differently_is_refused() {
    // PHP splits this body on `P` and reads a part `key` that keyrelay, splitting on `K`,
    // sees as the content of part `x`.
    let body = b"--K\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\
        --P\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nCALLER\r\n--P--\r\n\
        \r\n--K--\r\n";
    for content_type in [
        "multipart/form-data; xboundary=P; boundary=K",
        "multipart/form-data; boundary = K",
        "multipart/form-data; boundary=K ;charset=utf-8",
        "multipart/form-data; boundary=K,P",
        r#"multipart/form-data; boundary="K\"""#,
    ] {
        let err = parse_err(Some(content_type), body);
        assert_eq!(err, RequestError::AmbiguousBoundary, "{content_type}");
        assert_eq!(
            err.to_string(),
            "ambiguous multipart/form-data boundary parameter"
        );
        assert_eq!(err.code(), "ERROR_BAD_PARAMETERS");
    }
    let request = parse(
        "",
        Some("multipart/form-data; charset=utf-8; boundary=K"),
        body,
    );
    assert_eq!(pairs(&request)[0].0, "x");
}

#[test]
fn malformed_bodies_give_their_error() {
    assert_eq!(
        parse_err(
            Some("multipart/form-data; boundary=b"),
            b"--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nabc"
        ),
        RequestError::MalformedMultipart("no closing boundary")
    );
    assert_eq!(
        parse_err(JSON, b"[1,2]"),
        RequestError::MalformedJson {
            reason: "not a JSON object",
            line: 1,
            column: 0
        }
    );
    assert!(matches!(
        parse_err(JSON, b"{\"a\":}"),
        RequestError::MalformedJson {
            reason: "syntax error",
            ..
        }
    ));
    let err = parse_err(JSON, b"{\"key\":\"SECRETKEY\"");
    assert_eq!(
        err.to_string(),
        "malformed JSON body: truncated at line 1, column 18"
    );
}

#[test]
fn debug_shows_names_not_values() {
    let request = parse("key=CALLERSECRET", FORM, b"body=IMAGEBYTES");
    let debug = format!("{request:?}");
    assert!(!debug.contains("CALLERSECRET"), "{debug}");
    assert!(!debug.contains("IMAGEBYTES"), "{debug}");
    assert_eq!(
        debug,
        r#"ParsedRequest { kind: Form, params: ["key", "body"], query_len: 16, body_len: 15 }"#
    );
}

#[test]
fn urlencoded_names_php_reads_as_key_are_keys() {
    let query = "+key=A&%20%20key=B&key%00x=C&key[]=D&k%65y[x]=E&json=1&key[=F&key_=G";
    let request = parse(query, None, b"");
    assert_eq!(
        pairs(&request),
        [
            ("key", "A"),
            ("key", "B"),
            ("key", "C"),
            ("key", "D"),
            ("key", "E"),
            ("json", "1"),
            ("key[", "F"),
            ("key_", "G"),
        ]
    );
    assert_eq!(request.param("key").as_deref(), Some("E"));
    // Every spelling goes and one canonical `key` takes the first one's place; only
    // look-alikes no reader takes for `key` stay.
    assert_eq!(rewrite_key(&request).0, format!("key={POOL}&json=1&key_=G"));

    let request = parse("json=1", FORM, b"a=1&key%00=CALLER&b=2&+key=CALLER2");
    assert_eq!(request.param("key").as_deref(), Some("CALLER2"));
    assert_eq!(
        rewrite_key(&request),
        (
            "json=1".to_owned(),
            format!("a=1&key={POOL}&b=2").into_bytes()
        )
    );
}

#[test]
fn a_php_spelling_of_key_in_the_query_is_replaced_when_the_body_has_none() {
    let request = parse("key[]=CALLER&json=1", FORM, b"method=post");
    let rewritten = request.rewrite(&[("key", POOL)]);
    assert_eq!(rewritten.query, format!("key={POOL}&json=1"));
    assert_eq!(&rewritten.body[..], b"method=post");
}

#[test]
fn param_lookups_see_the_names_php_sees() {
    let request = parse("+action=get&id[]=7&json%00x=1", FORM, b"%20ids=1,2");
    assert_eq!(request.param("action").as_deref(), Some("get"));
    assert_eq!(request.param("id").as_deref(), Some("7"));
    assert_eq!(request.param("ids").as_deref(), Some("1,2"));
    assert!(request.wants_json());
    assert_eq!(request.param(" ids").as_deref(), None);
}

#[test]
fn json_member_names_are_not_php_names() {
    // A JSON body is not read by PHP's form parser, so its names are kept as sent.
    let request = parse("", JSON, br#"{" key":"a","key[]":"b"}"#);
    assert_eq!(pairs(&request), [(" key", "a"), ("key[]", "b")]);
    assert_eq!(request.param("key").as_deref(), None);
}
