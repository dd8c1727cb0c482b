//! Property tests (proptest) for the key rewrite: every non-key param, every file byte and the
//! order of fields survive in every body encoding, and no generated request gets the caller's
//! key to the upstream. Case counts are bounded so the file runs in seconds in CI.

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::FutureExt;
use keyrelay::captcha::ParsedRequest;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;

/// Distinctive enough that it cannot occur by chance in generated data, and with no byte
/// that any decoding (percent, JSON, lossy UTF-8) changes.
const CALLER_KEY: &str = "ZQcallerKEY0123456789zyxwvutsrqp";
const POOL_KEY: &str = "POOLKEY0123456789abcdef012345678";
const BOUNDARY: &str = "----keyrelayPropertyBoundary7MA4YWxkTrZu0gW";
const FORM: Option<&str> = Some("application/x-www-form-urlencoded");
static JSON_CONTENT_TYPES: [Option<&str>; 3] = [
    Some("application/json"),
    Some("text/plain;charset=UTF-8"),
    None,
];

fn multipart_content_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        // A failing case is printed, shrunk, by the runner; a regressions file would be a
        // file outside what this test owns.
        failure_persistence: None,
        ..Config::default()
    }
}

fn parse(query: &str, content_type: Option<&str>, body: impl Into<Bytes>) -> ParsedRequest {
    ParsedRequest::parse(Some(query), content_type, body.into())
        .expect("a generated request is well-formed")
}

fn rewrite(request: &ParsedRequest) -> (String, Bytes) {
    let rewritten = request.rewrite(&[("key", POOL_KEY)]);
    (rewritten.query, rewritten.body)
}

fn occurrences(haystack: &[u8], needle: &str) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle.as_bytes())
        .count()
}

// === generated params ===

type Pairs = Vec<(String, String)>;

/// Param names from a safe alphabet, never `key`.
fn name() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,9}".prop_filter("the key is placed separately", |n| n != "key")
}

/// Values that stress every encoding: separators, escapes, quotes, CR/LF, unicode.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[&=%+;#?/ a-zA-Z0-9\"\\\\\r\n\t\u{0}éß€😀]{0,16}",
        Just(String::new()),
    ]
}

/// Non-key params with the caller's key inserted 0 to 3 times at generated positions.
fn pairs_with_keys() -> impl Strategy<Value = Pairs> {
    (
        prop::collection::vec((name(), value()), 0..8),
        prop::collection::vec(any::<Index>(), 0..=3),
    )
        .prop_map(|(mut pairs, slots)| {
            for slot in slots {
                let at = slot.index(pairs.len() + 1);
                pairs.insert(at, ("key".to_owned(), CALLER_KEY.to_owned()));
            }
            pairs
        })
}

fn has_key(pairs: &[(String, String)]) -> bool {
    pairs.iter().any(|(n, _)| n == "key")
}

/// What `pairs` must become: the first key holds the pool key, later keys are gone.
fn rewritten_pairs(pairs: &[(String, String)]) -> Pairs {
    let mut seen_key = false;
    pairs
        .iter()
        .filter_map(|(name, value)| {
            if name != "key" {
                return Some((name.clone(), value.clone()));
            }
            if seen_key {
                return None;
            }
            seen_key = true;
            Some((name.clone(), POOL_KEY.to_owned()))
        })
        .collect()
}

fn without_key(pairs: &[(String, String)]) -> Pairs {
    pairs.iter().filter(|(n, _)| n != "key").cloned().collect()
}

// === encodings, built independently of keyrelay ===

fn urlencode(pairs: &[(String, String)]) -> String {
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        serializer.append_pair(name, value);
    }
    serializer.finish()
}

fn urldecode(raw: &str) -> Pairs {
    form_urlencoded::parse(raw.as_bytes())
        .map(|(n, v)| (n.into_owned(), v.into_owned()))
        .collect()
}

/// `query` with the pool key appended, as keyrelay does when no location had a key.
fn with_pool_key_appended(query: &str) -> String {
    let separator = if query.is_empty() { "" } else { "&" };
    format!("{query}{separator}key={POOL_KEY}")
}

fn json_object(pairs: &[(String, String)]) -> Vec<u8> {
    let members: Vec<String> = pairs
        .iter()
        .map(|(name, value)| format!("{}:{}", json_string(name), json_string(value)))
        .collect();
    format!("{{{}}}", members.join(",")).into_bytes()
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a str always serializes")
}

/// A multipart body part: a text param, or a file upload.
#[derive(Clone, Debug, PartialEq)]
enum Part {
    Text {
        name: String,
        value: Vec<u8>,
    },
    File {
        name: String,
        filename: String,
        bytes: Vec<u8>,
    },
}

fn text_parts(pairs: &[(String, String)]) -> Vec<Part> {
    pairs
        .iter()
        .map(|(name, value)| Part::Text {
            name: name.clone(),
            value: value.clone().into_bytes(),
        })
        .collect()
}

fn multipart_body(parts: &[Part]) -> Vec<u8> {
    let mut body = Vec::new();
    for part in parts {
        body.extend(format!("--{BOUNDARY}\r\n").bytes());
        match part {
            Part::Text { name, value } => {
                body.extend(
                    format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").bytes(),
                );
                body.extend(value);
            }
            Part::File {
                name,
                filename,
                bytes,
            } => {
                body.extend(
                    format!(
                        "Content-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n\
                         Content-Type: application/octet-stream\r\n\r\n"
                    )
                    .bytes(),
                );
                body.extend(bytes);
            }
        }
        body.extend(b"\r\n");
    }
    body.extend(format!("--{BOUNDARY}--\r\n").bytes());
    body
}

/// The parts of `body` as multer, a parser independent of keyrelay's, reads them.
fn multer_parts(body: Bytes) -> Vec<Part> {
    let stream = futures_util::stream::iter([Ok::<Bytes, Infallible>(body)]);
    let mut multipart = multer::Multipart::new(stream, BOUNDARY);
    let read = async move {
        let mut parts = Vec::new();
        while let Some(field) = multipart.next_field().await.expect("multer reads a part") {
            let name = field.name().expect("every part has a name").to_owned();
            let filename = field.file_name().map(str::to_owned);
            let bytes = field
                .bytes()
                .await
                .expect("multer reads a part's bytes")
                .to_vec();
            parts.push(match filename {
                Some(filename) => Part::File {
                    name,
                    filename,
                    bytes,
                },
                None => Part::Text { name, value: bytes },
            });
        }
        parts
    };
    // The body is one ready chunk, so multer never has to wait for more.
    read.now_or_never()
        .expect("multer completes on an in-memory body")
}

/// Any delimiter inside a part would end it early: no real client sends one (RFC 2046). PHP
/// also ends a part at a bare `\n--boundary`, so keyrelay refuses those: no LF either.
fn fits_in_a_part(bytes: &[u8]) -> bool {
    let delimiter = format!("\n--{BOUNDARY}");
    occurrences(bytes, &delimiter) == 0 && !bytes.starts_with(&delimiter.as_bytes()[1..])
}

// === 1. every non-key param survives, with its value, in its place ===

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn query_rewrite_keeps_other_params_in_order(pairs in pairs_with_keys()) {
        let query = urlencode(&pairs);
        let (new_query, new_body) = rewrite(&parse(&query, None, Bytes::new()));

        let expected = if has_key(&pairs) {
            urlencode(&rewritten_pairs(&pairs))
        } else {
            with_pool_key_appended(&query)
        };
        prop_assert_eq!(&new_query, &expected);
        prop_assert!(new_body.is_empty());
        prop_assert_eq!(without_key(&urldecode(&new_query)), without_key(&pairs));
    }

    #[test]
    fn form_rewrite_keeps_other_params_in_order(pairs in pairs_with_keys()) {
        let body = urlencode(&pairs);
        let (new_query, new_body) = rewrite(&parse("json=1", FORM, body.clone()));

        if has_key(&pairs) {
            prop_assert_eq!(&new_query, "json=1");
            let expected = urlencode(&rewritten_pairs(&pairs));
            prop_assert_eq!(&new_body[..], expected.as_bytes());
        } else {
            prop_assert_eq!(new_query, with_pool_key_appended("json=1"));
            prop_assert_eq!(&new_body[..], body.as_bytes());
        }
        let decoded = urldecode(std::str::from_utf8(&new_body).expect("urlencoded is ASCII"));
        prop_assert_eq!(without_key(&decoded), without_key(&pairs));
    }

    #[test]
    fn multipart_rewrite_keeps_other_params_in_order(
        pairs in pairs_with_keys()
            .prop_filter("no delimiter in a value", |p| p.iter().all(|(_, v)| fits_in_a_part(v.as_bytes())))
    ) {
        let content_type = multipart_content_type();
        let body = multipart_body(&text_parts(&pairs));
        let (new_query, new_body) = rewrite(&parse("", Some(&content_type), body.clone()));

        let expected_pairs = rewritten_pairs(&pairs);
        let expected_body = multipart_body(&text_parts(&expected_pairs));
        prop_assert_eq!(&new_body[..], &expected_body[..]);
        let expected_query = if has_key(&pairs) { String::new() } else { with_pool_key_appended("") };
        prop_assert_eq!(new_query, expected_query);
        prop_assert_eq!(multer_parts(new_body), text_parts(&expected_pairs));
    }

    #[test]
    fn json_rewrite_keeps_other_params_in_order(
        pairs in pairs_with_keys(),
        content_type in prop::sample::select(&JSON_CONTENT_TYPES[..]),
    ) {
        let body = json_object(&pairs);
        let request = parse("", content_type, body.clone());
        let (new_query, new_body) = rewrite(&request);

        let expected_pairs = rewritten_pairs(&pairs);
        prop_assert_eq!(&new_body[..], &json_object(&expected_pairs)[..]);
        let expected_query = if has_key(&pairs) { String::new() } else { with_pool_key_appended("") };
        prop_assert_eq!(&new_query, &expected_query);
        let reparsed = parse(&new_query, content_type, new_body);
        let body_params = &reparsed.params()[urldecode(&new_query).len()..];
        prop_assert_eq!(body_params, &expected_pairs[..]);
    }
}

// === 2. every file byte survives in multipart ===

/// Binary contents, half of them built from fragments that look like multipart structure.
fn file_bytes() -> impl Strategy<Value = Vec<u8>> {
    let fragments: Vec<Vec<u8>> = [
        &b"\r\n"[..],
        b"\r",
        b"\n",
        b"--",
        b"-",
        BOUNDARY.as_bytes(),
        &BOUNDARY.as_bytes()[..12],
        b"\r\n\r\n",
        b"Content-Disposition: form-data; name=\"key\"",
        b"key",
        b"\x00",
        b"\xff\xfe",
        b"\x89PNG",
    ]
    .iter()
    .map(|f| f.to_vec())
    .collect();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..2048),
        prop::collection::vec(prop::sample::select(fragments), 0..24).prop_map(|f| f.concat()),
    ]
    .prop_filter("no delimiter in a file", |bytes| fits_in_a_part(bytes))
}

fn file_part() -> impl Strategy<Value = Part> {
    (
        prop_oneof![Just("file".to_owned()), Just("key".to_owned()), name()],
        "[A-Za-z0-9 ._()-]{1,24}",
        file_bytes(),
    )
        .prop_map(|(name, filename, bytes)| Part::File {
            name,
            filename,
            bytes,
        })
}

/// Text params, caller keys and 1 to 3 files, interleaved.
fn parts_with_files() -> impl Strategy<Value = Vec<Part>> {
    (
        pairs_with_keys().prop_filter("no delimiter in a value", |p| {
            p.iter().all(|(_, v)| fits_in_a_part(v.as_bytes()))
        }),
        prop::collection::vec((file_part(), any::<Index>()), 1..=3),
    )
        .prop_map(|(pairs, files)| {
            let mut parts = text_parts(&pairs);
            for (file, slot) in files {
                let at = slot.index(parts.len() + 1);
                parts.insert(at, file);
            }
            parts
        })
}

/// What the parts must become: the first part named `key`, text or file, becomes a text part
/// holding the pool key, later ones are gone (a reader may take a file part named `key` for
/// the key), and every other file is untouched.
fn rewritten_parts(parts: &[Part]) -> Vec<Part> {
    let mut seen_key = false;
    parts
        .iter()
        .filter_map(|part| match part {
            Part::Text { name, .. } | Part::File { name, .. } if name == "key" => {
                if seen_key {
                    return None;
                }
                seen_key = true;
                Some(Part::Text {
                    name: name.clone(),
                    value: POOL_KEY.as_bytes().to_vec(),
                })
            }
            other => Some(other.clone()),
        })
        .collect()
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn multipart_rewrite_keeps_every_file_byte(parts in parts_with_files()) {
        let content_type = multipart_content_type();
        let body = multipart_body(&parts);
        let request = parse("json=1", Some(&content_type), body);
        let (_, new_body) = rewrite(&request);

        let expected = rewritten_parts(&parts);
        prop_assert_eq!(&new_body[..], &multipart_body(&expected)[..]);
        // Re-split by an independent parser: the exact bytes of each file, part by part.
        prop_assert_eq!(multer_parts(new_body), expected);
    }
}

// === 3. the caller's key never reaches the upstream ===

/// Spellings of the name `key` that every form decoder reads as `key`.
static URLENCODED_KEY_NAMES: [&str; 5] = ["key", "k%65y", "%6B%65%79", "%6bey", "ke%79"];

/// The caller's key as sent: plain, fully percent-encoded, or with one character encoded.
fn urlencoded_key_value() -> impl Strategy<Value = String> {
    let fully: String = CALLER_KEY.bytes().map(|b| format!("%{b:02X}")).collect();
    let one = format!("%5A{}", &CALLER_KEY[1..]);
    prop::sample::select(vec![CALLER_KEY.to_owned(), fully, one])
}

/// A raw `name=value` pair: a non-key param, or the caller's key in some spelling.
fn urlencoded_pair(is_key: bool) -> BoxedStrategy<String> {
    if is_key {
        (
            prop::sample::select(&URLENCODED_KEY_NAMES[..]),
            urlencoded_key_value(),
        )
            .prop_map(|(name, value)| format!("{name}={value}"))
            .boxed()
    } else {
        (name(), value())
            .prop_map(|(name, value)| urlencode(&[(name, value)]))
            .boxed()
    }
}

/// The caller's key as a JSON member: name and value in several spellings and types.
fn json_key_member() -> impl Strategy<Value = String> {
    let escaped_value = format!("\"\\u005A{}\"", &CALLER_KEY[1..]);
    (
        prop::sample::select(vec!["\"key\"", "\"k\\u0065y\"", "\"\\u006bey\""]),
        prop::sample::select(vec![
            json_string(CALLER_KEY),
            escaped_value,
            format!("[{}]", json_string(CALLER_KEY)),
            format!("{{\"v\":{}}}", json_string(CALLER_KEY)),
        ]),
    )
        .prop_map(|(name, value)| format!("{name} : {value}"))
}

fn json_member(is_key: bool) -> BoxedStrategy<String> {
    if is_key {
        json_key_member().boxed()
    } else {
        (name(), value())
            .prop_map(|(name, value)| format!("{}:{}", json_string(&name), json_string(&value)))
            .boxed()
    }
}

/// Content-Disposition lines that keyrelay must read as a text part named `key`.
static MULTIPART_KEY_DISPOSITIONS: [&str; 4] = [
    "Content-Disposition: form-data; name=\"key\"",
    "content-disposition: form-data; name=key",
    "Content-Disposition: form-data; NAME = \"key\"; charset=utf-8",
    "Content-Disposition: form-data; x=\"a;b\"; name=\"k\\ey\"",
];

/// A multipart body from raw (Content-Disposition line, content) parts.
fn raw_multipart_body(parts: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (disposition, content) in parts {
        body.extend(format!("--{BOUNDARY}\r\n{disposition}\r\n\r\n").bytes());
        body.extend(content);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{BOUNDARY}--\r\n").bytes());
    body
}

fn multipart_part(is_key: bool) -> BoxedStrategy<(String, Vec<u8>)> {
    if is_key {
        prop::sample::select(&MULTIPART_KEY_DISPOSITIONS[..])
            .prop_map(|disposition| (disposition.to_owned(), CALLER_KEY.as_bytes().to_vec()))
            .boxed()
    } else {
        (name(), "[a-zA-Z0-9 &=%]{0,12}")
            .prop_map(|(name, value)| {
                let disposition = format!("Content-Disposition: form-data; name=\"{name}\"");
                (disposition, value.into_bytes())
            })
            .boxed()
    }
}

/// `count` keys and some params, in generated order: `true` marks a key's position.
fn key_layout(count: usize) -> impl Strategy<Value = Vec<bool>> {
    (Just(count), 0..6usize, any::<u64>()).prop_map(|(keys, others, seed)| {
        let mut layout = vec![true; keys];
        layout.extend(vec![false; others]);
        // A cheap deterministic shuffle driven by the generated seed.
        let mut state = seed | 1;
        for i in (1..layout.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let j = usize::try_from(state % (i as u64 + 1)).expect("fits: at most i");
            layout.swap(i, j);
        }
        layout
    })
}

fn urlencoded_with_keys(count: usize) -> impl Strategy<Value = String> {
    key_layout(count).prop_flat_map(|layout| {
        layout
            .into_iter()
            .map(urlencoded_pair)
            .collect::<Vec<_>>()
            .prop_map(|pairs| pairs.join("&"))
    })
}

/// A request body: its Content-Type and bytes.
#[derive(Clone, Debug)]
struct Body {
    content_type: Option<String>,
    bytes: Vec<u8>,
}

fn body_with_keys(count: usize) -> BoxedStrategy<Body> {
    let form = urlencoded_with_keys(count).prop_map(|raw| Body {
        content_type: FORM.map(str::to_owned),
        bytes: raw.into_bytes(),
    });
    let json = (
        key_layout(count)
            .prop_flat_map(|layout| layout.into_iter().map(json_member).collect::<Vec<_>>()),
        prop::sample::select(&JSON_CONTENT_TYPES[..]),
    )
        .prop_map(|(members, content_type)| Body {
            content_type: content_type.map(str::to_owned),
            bytes: format!("{{ {} }}", members.join(" , ")).into_bytes(),
        });
    let multipart = key_layout(count)
        .prop_flat_map(|layout| layout.into_iter().map(multipart_part).collect::<Vec<_>>())
        .prop_map(|parts| Body {
            content_type: Some(multipart_content_type()),
            bytes: raw_multipart_body(&parts),
        });
    if count == 0 {
        // A body without params at all must also get the key appended to the query.
        let empty = Just(Body {
            content_type: None,
            bytes: Vec::new(),
        });
        prop_oneof![empty, form, json, multipart].boxed()
    } else {
        prop_oneof![form, json, multipart].boxed()
    }
}

/// A request with the caller's key 0 to 3 times in the query and 0 to 3 times in the body.
fn request_with_keys() -> impl Strategy<Value = (usize, String, usize, Body)> {
    (0..=3usize, 0..=3usize).prop_flat_map(|(in_query, in_body)| {
        (
            Just(in_query),
            urlencoded_with_keys(in_query),
            Just(in_body),
            body_with_keys(in_body),
        )
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn the_callers_key_never_reaches_the_upstream(
        (_in_query, query, in_body, body) in request_with_keys()
    ) {
        let request = parse(&query, body.content_type.as_deref(), body.bytes.clone());
        let (new_query, new_body) = rewrite(&request);

        prop_assert_eq!(occurrences(new_query.as_bytes(), CALLER_KEY), 0, "{}", new_query);
        prop_assert_eq!(occurrences(&new_body, CALLER_KEY), 0);
        // Exactly one key upstream: in the body if the body had one, else in the query.
        let query_keys = usize::from(in_body == 0);
        let body_keys = usize::from(in_body > 0);
        prop_assert_eq!(occurrences(new_query.as_bytes(), POOL_KEY), query_keys, "{}", new_query);
        prop_assert_eq!(occurrences(&new_body, POOL_KEY), body_keys);

        // Decoded, too: no spelling (percent, JSON escapes, nesting) hides the key upstream.
        let upstream = parse(&new_query, body.content_type.as_deref(), new_body);
        for (name, value) in upstream.params() {
            prop_assert!(!value.contains(CALLER_KEY), "{} holds the caller's key", name);
            if name == "key" {
                prop_assert_eq!(value, POOL_KEY);
            }
        }
        let key = upstream.param("key");
        prop_assert_eq!(key.as_deref(), Some(POOL_KEY));
    }
}

// === the generators themselves ===

#[test]
fn the_caller_key_survives_every_decoding_it_is_spelled_in() {
    // The properties above rely on these spellings decoding to the caller's key, or they
    // would prove nothing about the key.
    let fully: String = CALLER_KEY.bytes().map(|b| format!("%{b:02X}")).collect();
    for name in URLENCODED_KEY_NAMES {
        let request = parse(&format!("{name}={fully}"), None, Bytes::new());
        assert_eq!(request.param("key").as_deref(), Some(CALLER_KEY), "{name}");
    }
    let body = format!(
        r#"{{"k\u0065y":"\u005A{}","\u006bey":["{CALLER_KEY}"]}}"#,
        &CALLER_KEY[1..]
    );
    let request = parse("", Some("application/json"), body);
    let params = request.params();
    let keys: Vec<&str> = params
        .iter()
        .filter(|(n, _)| n == "key")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(keys, [CALLER_KEY, &format!("[\"{CALLER_KEY}\"]")]);

    for disposition in MULTIPART_KEY_DISPOSITIONS {
        let body = raw_multipart_body(&[(disposition.to_owned(), CALLER_KEY.into())]);
        let request = parse("", Some(&multipart_content_type()), body);
        assert_eq!(
            request.param("key").as_deref(),
            Some(CALLER_KEY),
            "{disposition}"
        );
    }
}

#[test]
fn multer_reads_back_what_the_multipart_builder_wrote() {
    let parts = vec![
        Part::Text {
            name: "key".to_owned(),
            value: CALLER_KEY.as_bytes().to_vec(),
        },
        Part::File {
            name: "file".to_owned(),
            filename: "a b.png".to_owned(),
            bytes: (0..=255u8).collect(),
        },
    ];
    assert_eq!(multer_parts(Bytes::from(multipart_body(&parts))), parts);
}

// === gaps found by reading the rewrite against PHP's request parsing ===
//
// keyrelay models the upstream as PHP's `$_REQUEST` (body beats query). PHP's own multipart
// and urlencoded readers (php-src `main/rfc1867.c`, `main/php_variables.c`) accept spellings
// that keyrelay reads differently. In each case below keyrelay forwards a part or pair that a
// PHP upstream reads as `key` holding the caller's key, and that body value beats the pool
// key keyrelay put in the query. Expected: the request is refused as malformed, or no byte
// of the caller's key is forwarded. `src/captcha` now reads these as PHP does, or refuses
// them.

/// Parses like the proxy does; refusing the request is an acceptable outcome.
fn forwarded(query: &str, content_type: Option<&str>, body: &[u8]) -> Option<(String, Bytes)> {
    ParsedRequest::parse(Some(query), content_type, Bytes::copy_from_slice(body))
        .ok()
        .map(|request| rewrite(&request))
}

fn assert_caller_key_not_forwarded(query: &str, content_type: Option<&str>, body: &[u8]) {
    if let Some((new_query, new_body)) = forwarded(query, content_type, body) {
        assert_eq!(
            occurrences(new_query.as_bytes(), CALLER_KEY),
            0,
            "caller key forwarded in the query: {new_query}"
        );
        assert_eq!(
            occurrences(&new_body, CALLER_KEY),
            0,
            "caller key forwarded in the body: {}",
            String::from_utf8_lossy(&new_body)
        );
    }
}

fn one_part_body(disposition: &str) -> Vec<u8> {
    raw_multipart_body(&[(disposition.to_owned(), CALLER_KEY.into())])
}

#[test]
fn multipart_repeated_name_parameter() {
    // keyrelay sees a param `x`, appends key=<pool> to the query and forwards the part;
    // PHP's rfc1867 overwrites `name` on each occurrence and reads $_POST['key'].
    let body = one_part_body(r#"Content-Disposition: form-data; name="x"; name="key""#);
    assert_caller_key_not_forwarded("json=1", Some(&multipart_content_type()), &body);
}

#[test]
fn multipart_single_quoted_name() {
    // keyrelay reads the name as `'key'`; PHP's getword_conf strips ' as well as ".
    let body = one_part_body("Content-Disposition: form-data; name='key'");
    assert_caller_key_not_forwarded("json=1", Some(&multipart_content_type()), &body);
}

#[test]
fn multipart_filename_star_without_filename() {
    // keyrelay treats the part as an upload and leaves it alone; PHP only looks for
    // `filename`, so for PHP this is the text param `key`.
    let body =
        one_part_body("Content-Disposition: form-data; name=\"key\"; filename*=UTF-8''k.txt");
    assert_caller_key_not_forwarded("json=1", Some(&multipart_content_type()), &body);
}

#[test]
fn multipart_bare_lf_delimiter_inside_a_part() {
    // keyrelay sees one part `x` whose value runs to the CRLF delimiter; PHP's reader looks
    // for "\n--boundary" and finds a second part, `key`.
    let body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nhello\n\
         --{BOUNDARY}\nContent-Disposition: form-data; name=\"key\"\n\n{CALLER_KEY}\r\n\
         --{BOUNDARY}--\r\n"
    );
    assert_caller_key_not_forwarded("json=1", Some(&multipart_content_type()), body.as_bytes());
}

#[test]
fn multipart_part_after_the_close_delimiter() {
    // After `--boundary--` keyrelay copies everything verbatim; PHP's find_boundary skips the
    // `--boundary--` line and parses the next `--boundary` line as the start of a part.
    let body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--{BOUNDARY}--\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\n{CALLER_KEY}\r\n\
         --{BOUNDARY}--\r\n"
    );
    assert_caller_key_not_forwarded("json=1", Some(&multipart_content_type()), body.as_bytes());
}

#[test]
fn urlencoded_names_php_reads_as_key() {
    // PHP drops leading spaces of a variable name and ends it at a NUL byte, so each of these
    // is $_POST['key'] (or a later $_GET['key'], which wins over the earlier one).
    for name in ["+key", "%20key", "key%00x"] {
        let pair = format!("{name}={CALLER_KEY}");
        assert_caller_key_not_forwarded("json=1", FORM, pair.as_bytes());
        assert_caller_key_not_forwarded(&format!("key=old&{pair}"), None, b"");
    }
}
