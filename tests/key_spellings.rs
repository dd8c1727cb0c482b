//! Rule 1 of hostile input: whatever spellings of `key` a request carries, in whatever
//! encoding, the upstream receives exactly one canonical `key=<pool key>` and none of the
//! caller's spellings. Property tests over generated spellings (case, padding, PHP array and
//! NUL suffixes, percent escapes, JSON escapes, every Content-Disposition form a multipart
//! reader accepts), checked by readers independent of keyrelay's.

#[path = "common/spellings.rs"]
mod spellings;

use bytes::Bytes;
use keyrelay::captcha::ParsedRequest;
use proptest::prelude::*;
use spellings::*;

/// No decoding (percent, JSON, lossy UTF-8) changes a byte of either.
const CALLER_KEY: &str = "ZQcallerKEY0123456789zyxwvutsrqp";
const POOL_KEY: &str = "POOLKEY0123456789abcdef012345678";
const BOUNDARY: &str = "----keyrelaySpellingBoundary1x9";

/// A spelling of `key` some reader takes for it ([`spellings::spelling`]).
fn spelling() -> impl Strategy<Value = String> {
    spellings::spelling("key")
}

fn looks_like_key(name: &str) -> bool {
    looks_like(name, "key")
}

fn multer_fields(body: Bytes) -> Vec<(String, Vec<u8>)> {
    spellings::multer_fields(body, BOUNDARY)
}

/// Where the caller's spellings go.
#[derive(Clone, Copy, Debug)]
enum Encoding {
    Query,
    Form,
    Multipart,
    Json,
}

/// A request: other params, and spellings of `key` holding the caller's key, in the query
/// and in the body.
#[derive(Debug)]
struct Hostile {
    encoding: Encoding,
    query: String,
    content_type: Option<String>,
    body: Vec<u8>,
}

fn hostile_request() -> impl Strategy<Value = Hostile> {
    let spellings = prop::collection::vec(
        (
            spelling(),
            prop::collection::vec(any::<bool>(), 1..4),
            0..9usize,
        ),
        1..4,
    );
    (
        prop::sample::select(vec![
            Encoding::Query,
            Encoding::Form,
            Encoding::Multipart,
            Encoding::Json,
        ]),
        spellings,
        prop::collection::vec(
            (spelling(), prop::collection::vec(any::<bool>(), 1..4)),
            0..3,
        ),
    )
        .prop_map(|(encoding, in_body, in_query)| {
            let mut query_pairs = vec!["method=post".to_owned()];
            for (name, escape) in &in_query {
                query_pairs.push(format!("{}={CALLER_KEY}", urlencode_name(name, escape)));
            }
            query_pairs.push("json=1".to_owned());
            let (content_type, body) = match encoding {
                Encoding::Query => {
                    for (name, escape, _) in &in_body {
                        query_pairs
                            .insert(1, format!("{}={CALLER_KEY}", urlencode_name(name, escape)));
                    }
                    (None, Vec::new())
                }
                Encoding::Form => {
                    let mut pairs = vec!["body=R0lGOD%2B%2F".to_owned()];
                    for (name, escape, _) in &in_body {
                        pairs.push(format!("{}={CALLER_KEY}", urlencode_name(name, escape)));
                    }
                    pairs.push("soft_id=1".to_owned());
                    (
                        Some("application/x-www-form-urlencoded".to_owned()),
                        pairs.join("&").into_bytes(),
                    )
                }
                Encoding::Multipart => {
                    let mut parts: Vec<(String, &[u8])> =
                        vec![("form-data; name=\"method\"".to_owned(), b"post")];
                    for (name, _, form) in &in_body {
                        parts.push((disposition(name, *form), CALLER_KEY.as_bytes()));
                    }
                    parts.push((
                        "form-data; name=\"file\"; filename=\"a.png\"".to_owned(),
                        b"\x89PNG\r\n\x1a\n\0key=x",
                    ));
                    multipart_body(BOUNDARY, &parts)
                }
                Encoding::Json => {
                    let mut members = vec!["\"method\":\"base64\"".to_owned()];
                    for (name, escape, _) in &in_body {
                        members.push(format!("{}:\"{CALLER_KEY}\"", json_name(name, escape)));
                    }
                    members.push("\"body\":\"R0lG\"".to_owned());
                    (
                        Some("application/json".to_owned()),
                        format!("{{{}}}", members.join(",")).into_bytes(),
                    )
                }
            };
            Hostile {
                encoding,
                query: query_pairs.join("&"),
                content_type,
                body,
            }
        })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn the_upstream_sees_one_canonical_pool_key_and_no_caller_spelling(hostile in hostile_request()) {
        let request = ParsedRequest::parse(
            Some(&hostile.query),
            hostile.content_type.as_deref(),
            Bytes::from(hostile.body.clone()),
        )
        .expect("a generated request is well-formed");
        let rewritten = request.rewrite(&[("key", POOL_KEY)]);
        let (query, body) = (rewritten.query.as_bytes(), &rewritten.body[..]);

        // Not a byte of the caller's key, and the pool key exactly once, anywhere.
        prop_assert_eq!(occurrences(query, CALLER_KEY) + occurrences(body, CALLER_KEY), 0);
        prop_assert_eq!(occurrences(query, POOL_KEY) + occurrences(body, POOL_KEY), 1);

        // Read back independently: one param that looks like a key, named canonically.
        let mut keys: Vec<(String, String)> = form_pairs(query)
            .into_iter()
            .filter(|(n, _)| looks_like_key(n))
            .collect();
        match hostile.encoding {
            Encoding::Query => {}
            Encoding::Form => keys.extend(form_pairs(body).into_iter().filter(|(n, _)| looks_like_key(n))),
            Encoding::Multipart => {
                for (name, value) in multer_fields(rewritten.body.clone()) {
                    if looks_like_key(&name) {
                        keys.push((name, String::from_utf8_lossy(&value).into_owned()));
                    }
                }
                // No Content-Disposition line other than the canonical one spells a key.
                let text = String::from_utf8_lossy(body);
                let named_key = text
                    .lines()
                    .filter(|l| l.to_ascii_lowercase().starts_with("content-disposition"))
                    .filter(|l| l.to_ascii_lowercase().contains("key"))
                    .collect::<Vec<_>>();
                prop_assert_eq!(named_key, vec!["Content-Disposition: form-data; name=\"key\""]);
            }
            Encoding::Json => {
                let object: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(body).expect("the rewritten body is JSON");
                for (name, value) in object {
                    if looks_like_key(&name) {
                        keys.push((name, value.as_str().unwrap_or_default().to_owned()));
                    }
                }
            }
        }
        prop_assert_eq!(keys, vec![("key".to_owned(), POOL_KEY.to_owned())]);

        // And keyrelay's own reading of what it sent agrees.
        let upstream = ParsedRequest::parse(
            Some(&rewritten.query),
            hostile.content_type.as_deref(),
            rewritten.body.clone(),
        )
        .expect("the rewritten request parses");
        let key = upstream.param("key");
        prop_assert_eq!(key.as_deref(), Some(POOL_KEY));
    }
}

#[test]
fn the_generators_make_spellings_keyrelay_reads_as_the_callers_key() {
    // Without this, the property could pass on requests whose spellings no reader takes for
    // `key` at all. PHP's reading (keyrelay's `param`) takes the plain lowercase forms.
    for (query, expected) in [
        (format!("key[]={CALLER_KEY}"), Some(CALLER_KEY)),
        (format!("+key={CALLER_KEY}"), Some(CALLER_KEY)),
        (format!("key%00x={CALLER_KEY}"), Some(CALLER_KEY)),
        (format!("KEY={CALLER_KEY}"), None),
    ] {
        let request = ParsedRequest::parse(Some(&query), None, Bytes::new()).expect("parses");
        assert_eq!(request.param("key").as_deref(), expected, "{query}");
    }
    // PHP's reading takes the first forms for the key; multer (first `name` wins, file
    // parts are fields too) takes two more; the RFC 5987/2231 forms are what mail-style
    // parsers read.
    let one_part = |form: usize| {
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: {}\r\n\r\n{CALLER_KEY}\r\n--{BOUNDARY}--\r\n",
            disposition("key", form)
        )
    };
    let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
    for form in 0..=3 {
        let request = ParsedRequest::parse(None, Some(&content_type), Bytes::from(one_part(form)))
            .expect("parses");
        assert_eq!(
            request.param("key").as_deref(),
            Some(CALLER_KEY),
            "form {form}"
        );
    }
    for form in [4, 6] {
        let fields = multer_fields(Bytes::from(one_part(form)));
        assert_eq!(fields[0].0, "key", "form {form}");
    }
    let forms: std::collections::HashSet<String> = (0..9).map(|f| disposition("key", f)).collect();
    assert_eq!(forms.len(), 9);
    assert_eq!(urlencode_name(" key[]", &[false]), "+key%5B%5D");
    assert_eq!(json_name("key", &[true]), "\"\\u006b\\u0065\\u0079\"");
}
