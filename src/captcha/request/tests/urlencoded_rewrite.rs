//! The rewrite of urlencoded queries and form bodies.

use super::*;

#[test]
fn rewrite_key_in_query_only() {
    let request = parse("key=CALLER&method=post&json=1", None, b"");
    assert_eq!(
        rewrite_key(&request),
        (format!("key={POOL}&method=post&json=1"), vec![])
    );
}

#[test]
fn rewrite_key_in_form_body_only() {
    let body = b"pageurl=https%3a%2F%2Fa.test%2F&key=CALLER&soft_id=4580";
    let request = parse("json=1", FORM, body);
    let (query, body) = rewrite_key(&request);
    assert_eq!(query, "json=1");
    assert_eq!(
        String::from_utf8(body).expect("ascii"),
        format!("pageurl=https%3a%2F%2Fa.test%2F&key={POOL}&soft_id=4580")
    );
}

#[test]
fn rewrite_key_in_query_and_form_body_goes_to_the_body_only() {
    let request = parse("key=Q&json=1", FORM, b"method=base64&key=B");
    let (query, body) = rewrite_key(&request);
    assert_eq!(query, "json=1");
    assert_eq!(body, format!("method=base64&key={POOL}").into_bytes());
}

#[test]
fn rewrite_absent_key_appends_to_query() {
    for (query, expected) in [
        ("", format!("key={POOL}")),
        ("a=1", format!("a=1&key={POOL}")),
        ("a=1&", format!("a=1&key={POOL}")),
    ] {
        let request = parse(query, FORM, b"b=2");
        let rewritten = request.rewrite(&[("key", POOL)]);
        assert_eq!(rewritten.query, expected);
        assert_eq!(&rewritten.body[..], b"b=2");
    }
}

#[test]
fn rewrite_drops_duplicates_and_keeps_everything_else_verbatim() {
    let request = parse(
        "key=a&x=%41+b&&k%65y=b&flag&key&z=%zz&",
        FORM,
        b"key=c&KEY=upper&key=d&tail=1",
    );
    let (query, body) = rewrite_key(&request);
    assert_eq!(query, "x=%41+b&&flag&z=%zz&");
    assert_eq!(body, format!("key={POOL}&tail=1").into_bytes());
}

#[test]
fn a_key_behind_an_invisible_format_character_is_replaced() {
    // A right-to-left override before `key` shows as `key` and is dropped by readers
    // that strip format characters; it used to pass as some other param.
    let request = parse("%E2%80%AEkey=CALLER&json=1", None, b"");
    assert_eq!(rewrite_key(&request).0, format!("key={POOL}&json=1"));
}

#[test]
fn rewrite_spells_the_name_canonically() {
    for query in [
        "x=1&k%65y=old",
        "x=1&KEY=old",
        "x=1&key%5B%5D=old",
        "x=1&%20key%20=old",
    ] {
        let request = parse(query, None, b"");
        assert_eq!(
            rewrite_key(&request).0,
            format!("x=1&key={POOL}"),
            "{query}"
        );
    }
}

#[test]
fn rewrite_form_encodes_new_values() {
    let request = parse("key=a&action=get&ids=9", FORM, b"json=1");
    let rewritten = request.rewrite(&[("key", "k y&z=é"), ("ids", "1,3")]);
    assert_eq!(rewritten.query, "key=k+y%26z%3D%C3%A9&action=get&ids=1%2C3");
    assert_eq!(&rewritten.body[..], b"json=1");
    let reparsed = parse(&rewritten.query, None, b"");
    assert_eq!(reparsed.param("key").as_deref(), Some("k y&z=é"));
    assert_eq!(reparsed.param("ids").as_deref(), Some("1,3"));
}

#[test]
fn rewrite_sets_several_names_across_locations() {
    let request = parse("ids=1,2,3&json=1", FORM, b"key=old&action=get");
    let rewritten = request.rewrite(&[("key", POOL), ("ids", "1,3"), ("new", "v")]);
    assert_eq!(rewritten.query, "ids=1%2C3&json=1&new=v");
    assert_eq!(
        rewritten.body,
        Bytes::from(format!("key={POOL}&action=get"))
    );
}

#[test]
fn rewrite_uses_the_first_value_of_a_name_set_twice() {
    let request = parse("a=1", None, b"");
    assert_eq!(request.rewrite(&[("k", "x"), ("k", "y")]).query, "a=1&k=x");
    let request = parse("k=0", None, b"");
    assert_eq!(request.rewrite(&[("k", "x"), ("k", "y")]).query, "k=x");
}

#[test]
fn rewrite_with_nothing_to_set_is_the_identity() {
    let request = parse("a=%41&b", FORM, b"c=+&d");
    let rewritten = request.rewrite(&[]);
    assert_eq!(rewritten.query, "a=%41&b");
    assert_eq!(&rewritten.body[..], b"c=+&d");
}

/// The splice as first written: split on `&`, replace or drop pairs, join with `&`.
/// Slower, but plainly right, so the in-place splice is checked against it.
fn split_join_splice(raw: &str, set: &[(&str, &str)]) -> Option<String> {
    let mut seen = vec![false; set.len()];
    let mut changed = false;
    let mut kept = Vec::new();
    for pair in raw.split('&') {
        let raw_name = pair.split('=').next().unwrap_or_default();
        let name: String = form_urlencoded::parse(raw_name.as_bytes())
            .next()
            .map(|(n, _)| n.into_owned())
            .unwrap_or_default();
        let slot = (!raw_name.is_empty())
            .then(|| set.iter().position(|(n, _)| spells(php_name(&name), n)))
            .flatten();
        match slot {
            None => kept.push(pair.to_owned()),
            Some(slot) if !seen[slot] => {
                seen[slot] = true;
                changed = true;
                let value: String =
                    form_urlencoded::byte_serialize(set[slot].1.as_bytes()).collect();
                kept.push(format!("{}={value}", set[slot].0));
            }
            Some(_) => changed = true,
        }
    }
    changed.then(|| kept.join("&"))
}

#[test]
fn in_place_splice_matches_split_and_join_on_every_short_query() {
    const PIECES: [&str; 10] = [
        "key=1", "key", "&", "=", "x=2", "key[]=3", "+key=4", "%6Bey=5", "id=9", "k",
    ];
    let set = [("key", "P&Q"), ("id", "7")];
    let mut checked = 0;
    for a in PIECES {
        for b in PIECES {
            for c in PIECES {
                for d in PIECES {
                    for sep in ["", "&"] {
                        let raw = [a, b, c, d].join(sep);
                        let mut seen = [false; 2];
                        let fast = parse(&raw, None, b"")
                            .splice_pairs(Source::Query, &set, &mut seen)
                            .map(|out| String::from_utf8(out).unwrap());
                        assert_eq!(fast, split_join_splice(&raw, &set), "{raw:?}");
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 20_000);
}

#[test]
fn params_read_in_place_decode_only_when_read() {
    let request = parse(
        "key=a&pageurl=https%3A%2F%2Fx.test%2F%3Fq%3D1&text=a+b&%6Bey=b&id[]=5",
        None,
        b"",
    );
    // The last spelling of `key` wins, whatever its escapes.
    assert_eq!(request.param("key").as_deref(), Some("b"));
    assert_eq!(
        request.param("pageurl").as_deref(),
        Some("https://x.test/?q=1")
    );
    assert_eq!(request.param("text").as_deref(), Some("a b"));
    assert_eq!(request.param("id").as_deref(), Some("5"));
    // Nothing to decode: the value is borrowed from the query, not copied.
    assert!(matches!(request.param("id"), Some(Cow::Borrowed("5"))));
    assert!(matches!(request.param("pageurl"), Some(Cow::Owned(_))));
    let form = parse("", FORM, b"method=post&json=1");
    assert!(matches!(form.param("method"), Some(Cow::Borrowed("post"))));
    assert!(form.wants_json());
}

#[test]
fn invalid_utf8_in_a_form_body_is_replaced_not_refused() {
    let request = parse("", FORM, b"a=\xff\xfe&\xff=b&c=%C3%A9");
    assert_eq!(
        pairs(&request),
        [
            ("a", "\u{fffd}\u{fffd}"),
            ("\u{fffd}", "b"),
            ("c", "\u{e9}")
        ]
    );
}
