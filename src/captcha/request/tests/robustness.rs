//! Random bodies: parsing never panics, and a rewrite re-parses.

use super::*;

/// Builds bodies from fragments that matter to the parsers and checks that parsing never
/// panics and that a successful rewrite re-parses to the same params with the key set.
#[test]
fn random_bodies_never_panic_and_rewrites_reparse() {
    use rand::{Rng, SeedableRng};

    const FRAGMENTS: [&[u8]; 22] = [
        b"--b",
        b"\r\n",
        b"--",
        b"Content-Disposition: form-data; name=\"key\"",
        b"Content-Disposition: form-data; name=x; filename=f",
        b"\r\n\r\n",
        b"key",
        b"=",
        b"&",
        b"%",
        b"%2",
        b"+",
        b"{",
        b"}",
        b"\"key\"",
        b":",
        b",",
        b"\"v\"",
        b"[1]",
        b"\xff",
        b"\x00",
        b" ",
    ];
    let content_types = [
        None,
        FORM,
        JSON,
        Some("text/plain"),
        Some("multipart/form-data; boundary=b"),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6b65_7972);
    let mut accepted = 0;
    for _ in 0..4000 {
        let mut body = Vec::new();
        for _ in 0..rng.random_range(0..24) {
            body.extend(FRAGMENTS[rng.random_range(0..FRAGMENTS.len())]);
        }
        let content_type = content_types[rng.random_range(0..content_types.len())];
        let Ok(request) = ParsedRequest::parse(Some("a=1&key=q"), content_type, Bytes::from(body))
        else {
            continue;
        };
        accepted += 1;
        let rewritten = request.rewrite(&[("key", POOL)]);
        let reparsed =
            ParsedRequest::parse(Some(&rewritten.query), content_type, rewritten.body.clone())
                .expect("a rewritten request parses like its original");
        assert_eq!(reparsed.param("key").as_deref(), Some(POOL));
        let without_key = |r: &ParsedRequest| -> Vec<(String, String)> {
            r.params()
                .iter()
                .filter(|(n, _)| !spells(n, "key"))
                .cloned()
                .collect()
        };
        assert_eq!(without_key(&reparsed), without_key(&request));
    }
    assert!(accepted > 500, "only {accepted} random bodies parsed");
}
