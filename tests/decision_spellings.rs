//! Rule 1 of hostile input, for the params keyrelay decides on (issue 37 §3): whatever
//! spellings of `action`, `id` and `ids` a request carries, in the query and in whatever body
//! encoding, keyrelay reads one value of each or refuses the request, and the upstream
//! receives exactly the checked values, once and canonically named, and no other spelling
//! of those names. Property tests over generated spellings (case, padding, PHP array and NUL
//! suffixes, percent escapes, JSON escapes, every Content-Disposition form a multipart
//! reader accepts), checked by readers independent of keyrelay's.

#[path = "common/spellings.rs"]
mod spellings;

use bytes::Bytes;
use keyrelay::captcha::{Conflict, ParsedRequest};
use proptest::prelude::*;
use spellings::*;

const POOL_KEY: &str = "POOLKEY0123456789abcdef012345678";
const BOUNDARY: &str = "----keyrelayDecisionBoundary7q2";
/// The task the caller's `id` spellings name, and another one a conflicting spelling names.
/// Neither is a substring of the other, of the pool key or of any name.
const TASK: &str = "48151623";
const OTHER_TASK: &str = "90210777";
/// What the caller's `ids` spellings hold; they must all be gone upstream.
const LIST: &str = "31337313";

/// Where the body's spellings go.
#[derive(Clone, Copy, Debug)]
enum Encoding {
    Query,
    Form,
    Multipart,
    Json,
}

/// One spelling of a name: the name, how its bytes are escaped, which Content-Disposition
/// form names it in a multipart body.
type Spelled = (String, Vec<bool>, usize);

fn spelled(canonical: &'static str) -> impl Strategy<Value = Spelled> {
    (
        spelling(canonical),
        prop::collection::vec(any::<bool>(), 1..4),
        0..9usize,
    )
}

/// A request that polls `TASK`: `action=get` in some spellings in the query, `id` in some
/// spellings in the query and at least one in the body (or, for `Query`, more in the query),
/// maybe `ids` in either, and, if `conflict` names one, that `id` spelling naming
/// `OTHER_TASK` instead.
#[derive(Debug)]
struct Hostile {
    encoding: Encoding,
    query: String,
    content_type: Option<String>,
    body: Vec<u8>,
    /// Whether some `id` spelling names `OTHER_TASK`.
    conflict: bool,
}

fn hostile_request() -> impl Strategy<Value = Hostile> {
    (
        prop::sample::select(vec![
            Encoding::Query,
            Encoding::Form,
            Encoding::Multipart,
            Encoding::Json,
        ]),
        prop::collection::vec(spelled("action"), 1..3),
        prop::collection::vec(spelled("id"), 0..3),
        prop::collection::vec(spelled("id"), 1..3),
        prop::collection::vec(spelled("ids"), 0..2),
        prop::option::of(0..5usize),
    )
        .prop_map(
            |(encoding, actions, ids_in_query, ids_in_body, lists, conflict)| {
                let id_count = ids_in_query.len() + ids_in_body.len();
                // Two values need two spellings: one of them names the other task.
                let conflict = conflict.filter(|&at| at < id_count && id_count > 1);
                let value_of = |index: usize| {
                    if conflict == Some(index) {
                        OTHER_TASK
                    } else {
                        TASK
                    }
                };
                let mut query = vec!["json=1".to_owned()];
                for (name, escape, _) in &actions {
                    query.push(format!("{}=get", urlencode_name(name, escape)));
                }
                for (i, (name, escape, _)) in ids_in_query.iter().enumerate() {
                    query.push(format!("{}={}", urlencode_name(name, escape), value_of(i)));
                }
                // Lists go in the query for a query-only request, else one in each place.
                let (lists_in_query, lists_in_body) = match encoding {
                    Encoding::Query => (&lists[..], &[][..]),
                    _ => lists.split_at(lists.len() / 2),
                };
                for (name, escape, _) in lists_in_query {
                    query.push(format!("{}={LIST}", urlencode_name(name, escape)));
                }
                let body_ids: Vec<(&Spelled, &str)> = ids_in_body
                    .iter()
                    .enumerate()
                    .map(|(i, spelled)| (spelled, value_of(ids_in_query.len() + i)))
                    .collect();
                let body_lists: Vec<(&Spelled, &str)> = lists_in_body
                    .iter()
                    .map(|spelled| (spelled, LIST))
                    .collect();
                let in_body: Vec<(&Spelled, &str)> =
                    body_ids.into_iter().chain(body_lists).collect();
                let (content_type, body) = encode_body(encoding, &mut query, &in_body);
                Hostile {
                    encoding,
                    query: query.join("&"),
                    content_type,
                    body,
                    conflict: conflict.is_some(),
                }
            },
        )
}

/// The body holding `params` (for `Query`, they join the query instead), with a param and a
/// file part that are no decision param's around them.
fn encode_body(
    encoding: Encoding,
    query: &mut Vec<String>,
    params: &[(&Spelled, &str)],
) -> (Option<String>, Vec<u8>) {
    match encoding {
        Encoding::Query => {
            for ((name, escape, _), value) in params {
                query.insert(1, format!("{}={value}", urlencode_name(name, escape)));
            }
            (None, Vec::new())
        }
        Encoding::Form => {
            let mut pairs = vec!["soft_id=1".to_owned()];
            for ((name, escape, _), value) in params {
                pairs.push(format!("{}={value}", urlencode_name(name, escape)));
            }
            pairs.push("header_acao=1".to_owned());
            (
                Some("application/x-www-form-urlencoded".to_owned()),
                pairs.join("&").into_bytes(),
            )
        }
        Encoding::Multipart => {
            let mut parts: Vec<(String, &[u8])> =
                vec![("form-data; name=\"header_acao\"".to_owned(), b"1")];
            for ((name, _, form), value) in params {
                parts.push((disposition(name, *form), value.as_bytes()));
            }
            parts.push((
                "form-data; name=\"file\"; filename=\"a.png\"".to_owned(),
                b"\x89PNG\r\n\x1a\n\0x=y",
            ));
            multipart_body(BOUNDARY, &parts)
        }
        Encoding::Json => {
            let mut members = vec!["\"soft_id\":1".to_owned()];
            for ((name, escape, _), value) in params {
                members.push(format!("{}:\"{value}\"", json_name(name, escape)));
            }
            (
                Some("application/json".to_owned()),
                format!("{{{}}}", members.join(",")).into_bytes(),
            )
        }
    }
}

/// Every (name, value) an independent reader finds in `rewritten` whose name looks like
/// `canonical`: the query's pairs, and the body's pairs, fields or members.
fn found(encoding: Encoding, query: &str, body: &Bytes, canonical: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = form_pairs(query.as_bytes());
    match encoding {
        Encoding::Query => {}
        Encoding::Form => found.extend(form_pairs(body)),
        Encoding::Multipart => {
            for (name, value) in multer_fields(body.clone(), BOUNDARY) {
                found.push((name, String::from_utf8_lossy(&value).into_owned()));
            }
        }
        Encoding::Json => {
            let object: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(body).expect("the rewritten body is JSON");
            for (name, value) in object {
                let value = value
                    .as_str()
                    .map_or_else(|| value.to_string(), str::to_owned);
                found.push((name, value));
            }
        }
    }
    found.retain(|(name, _)| looks_like(name, canonical));
    found
}

/// The Content-Disposition lines of a multipart body that mention `word`: multer reads
/// one name of a part, and the other names a part carries are what other readers take.
fn disposition_lines(body: &[u8], word: &str) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("content-disposition"))
        .filter(|l| l.to_ascii_lowercase().contains(word))
        .map(str::to_owned)
        .collect()
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn one_value_is_read_or_the_request_refused_and_the_upstream_sees_only_it(
        hostile in hostile_request()
    ) {
        let request = ParsedRequest::parse(
            Some(&hostile.query),
            hostile.content_type.as_deref(),
            Bytes::from(hostile.body.clone()),
        )
        .expect("a generated request is well-formed");

        prop_assert_eq!(request.single("action"), Ok(Some("get".into())));
        let id = request.single("id");
        if hostile.conflict {
            prop_assert_eq!(id, Err(Conflict::Values { name: "id" }));
            return Ok(());
        }
        prop_assert_eq!(id, Ok(Some(TASK.into())));

        // What a poll of one task sends: the key, the action and the id it checked, no list.
        let rewritten = request.rewrite_dropping(
            &[("key", POOL_KEY), ("action", "get"), ("id", TASK)],
            &["ids"],
        );
        let (query, body) = (rewritten.query.as_str(), &rewritten.body);
        let everything = [query.as_bytes(), &body[..]].concat();
        prop_assert_eq!(occurrences(&everything, TASK), 1, "{:?} {:?}", query, body);
        prop_assert_eq!(occurrences(&everything, LIST), 0);

        let ids = found(hostile.encoding, query, body, "id");
        prop_assert_eq!(ids, vec![("id".to_owned(), TASK.to_owned())]);
        prop_assert_eq!(found(hostile.encoding, query, body, "ids"), vec![]);
        let actions = found(hostile.encoding, query, body, "action");
        prop_assert_eq!(actions, vec![("action".to_owned(), "get".to_owned())]);
        if let Encoding::Multipart = hostile.encoding {
            // The body had an id, so the one id is a canonical part there, and no other
            // part is named for an id or a list in any of its names.
            prop_assert_eq!(
                disposition_lines(body, "id"),
                vec!["Content-Disposition: form-data; name=\"id\"".to_owned()]
            );
        }

        // And keyrelay's own reading of what it sent agrees.
        let upstream = ParsedRequest::parse(
            Some(&rewritten.query),
            hostile.content_type.as_deref(),
            rewritten.body.clone(),
        )
        .expect("the rewritten request parses");
        prop_assert_eq!(upstream.single("id"), Ok(Some(TASK.into())));
        prop_assert_eq!(upstream.single("ids"), Ok(None));
        prop_assert_eq!(upstream.single("action"), Ok(Some("get".into())));
        let php = upstream.param("id");
        prop_assert_eq!(php.as_deref(), Some(TASK));
    }
}

#[test]
fn the_generators_make_spellings_some_reader_takes_for_the_name() {
    // Without this, the property could pass on requests whose spellings no reader takes
    // for the name at all. PHP's reading (keyrelay's `param`) takes the plain forms.
    for (query, name, expected) in [
        (format!("id[]={TASK}"), "id", Some(TASK)),
        (format!("+id={TASK}"), "id", Some(TASK)),
        (format!("id%00x={TASK}"), "id", Some(TASK)),
        (format!("ids[0]={LIST}"), "ids", Some(LIST)),
        ("%20action=get".to_owned(), "action", Some("get")),
        (format!("ID={TASK}"), "id", None),
    ] {
        let request = ParsedRequest::parse(Some(&query), None, Bytes::new()).expect("parses");
        assert_eq!(request.param(name).as_deref(), expected, "{query}");
        // Whatever PHP makes of it, the strict reading takes it.
        let strict = expected.or(Some(TASK)).map(Into::into);
        assert_eq!(request.single(name), Ok(strict), "{query}");
    }
    assert_eq!(urlencode_name(" id[]", &[false]), "+id%5B%5D");
    assert_eq!(json_name("id", &[true]), "\"\\u0069\\u0064\"");
}
