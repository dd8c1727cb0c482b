//! The rewrite of JSON bodies.

use super::*;

#[test]
fn json_rewrite_keeps_values_byte_exact() {
    let body = br#"{ "key" : "CALLER", "body":"R0lG\/\u00e9\"", "json": 1, "n": -1.50E+3,
        "nested": {"a": [1, 2, {"b": null}]}, "t": true }"#;
    let request = parse("", JSON, body);
    let (query, rewritten) = rewrite_key(&request);
    assert_eq!(query, "");
    assert_eq!(
        String::from_utf8(rewritten).expect("utf-8"),
        format!(
            r#"{{"key":"{POOL}","body":"R0lG\/\u00e9\"","json":1,"n":-1.50E+3,"nested":{{"a": [1, 2, {{"b": null}}]}},"t":true}}"#
        )
    );
}

#[test]
fn json_rewrite_drops_duplicates_and_replaces_non_strings() {
    let request = parse("", JSON, br#"{"key":123,"x":"1","key":"b","key":null}"#);
    let rewritten = request.rewrite(&[("key", "a\"b\\c")]);
    assert_eq!(
        std::str::from_utf8(&rewritten.body),
        Ok(r#"{"key":"a\"b\\c","x":"1"}"#)
    );
    assert_eq!(rewritten.query, "");
}

#[test]
fn json_key_in_query_only_leaves_the_body_untouched() {
    let body = b"{ \"body\" : \"R0lG\" }\n";
    let request = parse("key=CALLER&json=1", Some("text/plain;charset=UTF-8"), body);
    assert_eq!(
        rewrite_key(&request),
        (format!("key={POOL}&json=1"), body.to_vec())
    );
}

#[test]
fn json_key_in_query_and_body_goes_to_the_body_only() {
    let request = parse("key=Q", JSON, br#"{"key":"B","method":"base64"}"#);
    assert_eq!(
        rewrite_key(&request),
        (
            String::new(),
            format!(r#"{{"key":"{POOL}","method":"base64"}}"#).into_bytes()
        )
    );
}

#[test]
fn json_absent_key_is_appended_to_the_query() {
    let body = br#"{"method":"base64"}"#;
    let request = parse("", JSON, body);
    assert_eq!(
        rewrite_key(&request),
        (format!("key={POOL}"), body.to_vec())
    );
}

#[test]
fn json_names_are_compared_unescaped() {
    let request = parse("", JSON, br#"{"k\u0065y":"old","a":1}"#);
    assert_eq!(request.param("key").as_deref(), Some("old"));
    let (_, body) = rewrite_key(&request);
    assert_eq!(body, format!(r#"{{"key":"{POOL}","a":1}}"#).into_bytes());
}
