//! Shared by keyrelay's fuzz targets: the input format, and the checks every request target
//! makes on one round trip (parse, rewrite with a pool key, parse the rewrite again).

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::FutureExt;
use keyrelay::captcha::{BodyKind, ParsedRequest};

/// Stands for the caller's key: every `$K` in a fuzz input is replaced with it, so the fuzzer
/// can place the key anywhere with two bytes. It starts with two non-hex letters and holds
/// no `%`, `+`, `&`, `=`, `\`, `"` or CR/LF, so no decoding step (percent, form, JSON,
/// lossy UTF-8) can split an occurrence of it or make one out of neighbouring bytes.
pub const CALLER_KEY: &str = "ZQcallerKEY0123456789zyxwvutsrqp";

/// The key keyrelay puts in.
pub const POOL_KEY: &str = "POOLKEY0123456789abcdef012345678";

const MARKER: &[u8] = b"$K";

/// Splits an input at its first `\n`: the line before it and everything after it (the whole
/// input and nothing when there is no `\n`).
pub fn split_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[]),
    }
}

/// `raw` with every `$K` replaced by [`CALLER_KEY`].
pub fn with_caller_key(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = find(rest, MARKER) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(CALLER_KEY.as_bytes());
        rest = &rest[at + MARKER.len()..];
    }
    out.extend_from_slice(rest);
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Occurrences of the caller's key (it cannot overlap itself: `Z` occurs once in it).
fn caller_keys_in(bytes: &[u8]) -> usize {
    bytes
        .windows(CALLER_KEY.len())
        .filter(|w| *w == CALLER_KEY.as_bytes())
        .count()
}

/// A decoded `(name, value)` param, as [`ParsedRequest::params`] lists them.
type Param = (String, String);

fn is_key(pair: &&Param) -> bool {
    pair.0 == "key"
}

fn without_key(params: &[Param]) -> Vec<&Param> {
    params.iter().filter(|p| !is_key(p)).collect()
}

/// Caller keys that a location's non-key params account for. Decoding never removes an
/// occurrence (see [`CALLER_KEY`]), so this bounds what may survive in that location's
/// raw bytes once its key params are gone.
fn caller_keys_in_non_key_params(params: &[Param]) -> usize {
    without_key(params)
        .iter()
        .map(|(n, v)| caller_keys_in(n.as_bytes()) + caller_keys_in(v.as_bytes()))
        .sum()
}

/// The params that came from the query and those that came from the body.
fn split_params<'a>(request: &'a ParsedRequest, query: &str) -> (&'a [Param], &'a [Param]) {
    let query_only = ParsedRequest::parse(Some(query), None, Bytes::new())
        .expect("a request without a body never fails to parse");
    let query_len = query_only.params().len();
    let (from_query, from_body) = request.params().split_at(query_len);
    assert_eq!(from_query, query_only.params(), "query params come first");
    (from_query, from_body)
}

/// One round trip with every property the request targets share:
/// - parsing never panics, and a request that parses is rewritten and parses again as the
///   same kind of body;
/// - after the rewrite, every `key` param is the pool key, once in the query if the query
///   had one or if no location had one, once in the body if the body had one;
/// - every other param survives, in order, in its location;
/// - a location without a key is copied byte for byte (the query gets `key=` appended);
/// - the caller's key survives nowhere but where a non-key param (or, in multipart, a byte
///   that is not a text param's value) already carried it;
/// - Debug of a parsed request shows no caller key that is not a param name.
pub fn check_request(query: &str, content_type: Option<&str>, body: &[u8]) {
    let Ok(request) = ParsedRequest::parse(Some(query), content_type, Bytes::copy_from_slice(body))
    else {
        return;
    };
    if !request
        .params()
        .iter()
        .any(|(n, _)| caller_keys_in(n.as_bytes()) > 0)
    {
        assert_eq!(caller_keys_in(format!("{request:?}").as_bytes()), 0);
    }

    let (query_params, body_params) = split_params(&request, query);
    let query_had_key = query_params.iter().any(|p| is_key(&p));
    let body_had_key = body_params.iter().any(|p| is_key(&p));

    let rewritten = request.rewrite(&[("key", POOL_KEY)]);
    let reparsed =
        ParsedRequest::parse(Some(&rewritten.query), content_type, rewritten.body.clone())
            .expect("a rewritten request parses like its original");
    assert_eq!(reparsed.kind(), request.kind(), "the body keeps its kind");
    let (new_query_params, new_body_params) = split_params(&reparsed, &rewritten.query);

    for (name, value) in reparsed.params() {
        if name == "key" {
            assert_eq!(value, POOL_KEY, "a key param that is not the pool key");
        }
    }
    let keys_in = |params: &[Param]| params.iter().filter(is_key).count();
    let query_wants_key = query_had_key || !body_had_key;
    assert_eq!(keys_in(new_query_params), usize::from(query_wants_key));
    assert_eq!(keys_in(new_body_params), usize::from(body_had_key));

    assert_eq!(without_key(new_query_params), without_key(query_params));
    assert_eq!(without_key(new_body_params), without_key(body_params));

    if !query_had_key {
        let mut expected = query.to_owned();
        if !body_had_key {
            if !expected.is_empty() && !expected.ends_with('&') {
                expected.push('&');
            }
            expected.push_str("key=");
            expected.push_str(POOL_KEY);
        }
        assert_eq!(rewritten.query, expected);
    }
    if !body_had_key {
        assert_eq!(
            &rewritten.body[..],
            body,
            "a body without a key is untouched"
        );
    }

    assert!(
        caller_keys_in(rewritten.query.as_bytes()) <= caller_keys_in_non_key_params(query_params),
        "the caller's key survived in the query: {:?}",
        rewritten.query
    );
    match request.kind() {
        // Headers, file parts, preamble and epilogue are not params but may carry the key's
        // text: count exactly what the key parts took away (part values are raw bytes).
        BodyKind::Multipart { .. } => {
            let in_key_parts: usize = body_params
                .iter()
                .filter(is_key)
                .map(|(_, v)| caller_keys_in(v.as_bytes()))
                .sum();
            assert_eq!(
                caller_keys_in(&rewritten.body),
                caller_keys_in(body) - in_key_parts,
                "the caller's key survived in a multipart body"
            );
        }
        BodyKind::Empty | BodyKind::Form | BodyKind::Json => assert!(
            caller_keys_in(&rewritten.body) <= caller_keys_in_non_key_params(body_params),
            "the caller's key survived in the body"
        ),
    }
}

/// Whether the multer differential runs (`KEYRELAY_FUZZ_MULTER=1`). Off by default: multer
/// and keyrelay read some malformed bodies differently by design (multer takes the last of
/// two Content-Disposition headers, keyrelay and PHP the first), which would stop every run
/// on the same known disagreement; turn it on to hunt for new ones.
pub fn multer_differential_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("KEYRELAY_FUZZ_MULTER").is_some_and(|v| v == "1"))
}

/// A differential check against multer, an independent multipart parser: once rewritten,
/// no text field multer finds may be a `key` carrying the caller's key.
pub fn check_multipart_with_multer(query: &str, content_type: &str, body: &[u8]) {
    let Ok(request) = ParsedRequest::parse(
        Some(query),
        Some(content_type),
        Bytes::copy_from_slice(body),
    ) else {
        return;
    };
    let Ok(boundary) = multer::parse_boundary(content_type) else {
        return;
    };
    let rewritten = request.rewrite(&[("key", POOL_KEY)]);
    let Some(fields) = multer_fields(rewritten.body, &boundary) else {
        return;
    };
    for field in fields {
        if field.name.as_deref() == Some("key") && field.file_name.is_none() {
            assert_eq!(
                caller_keys_in(&field.bytes),
                0,
                "multer reads the caller's key from the rewritten body"
            );
        }
    }
}

/// One part as multer reads it.
pub struct MulterField {
    pub name: Option<String>,
    pub file_name: Option<String>,
    pub bytes: Bytes,
}

/// Every part of `body` as multer reads it; `None` if multer rejects the body.
pub fn multer_fields(body: Bytes, boundary: &str) -> Option<Vec<MulterField>> {
    let stream = futures_util::stream::iter([Ok::<Bytes, Infallible>(body)]);
    let mut multipart = multer::Multipart::new(stream, boundary);
    // The whole body is one ready chunk, so multer never waits: `now_or_never` cannot miss.
    async move {
        let mut fields = Vec::new();
        while let Some(field) = multipart.next_field().await.ok()? {
            let name = field.name().map(str::to_owned);
            let file_name = field.file_name().map(str::to_owned);
            let bytes = field.bytes().await.ok()?;
            fields.push(MulterField {
                name,
                file_name,
                bytes,
            });
        }
        Some(fields)
    }
    .now_or_never()
    .flatten()
}
