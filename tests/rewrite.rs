//! The key rewrite in every encoding real clients use, checked on the simulator's side of
//! the wire: the pool key replaces the caller's, and every other byte arrives unchanged.

mod common;

use bytes::Bytes;
use common::*;
use keyrelay::sim::Received;

/// A one-key pool, so the expected upstream key is known.
async fn one_key() -> Harness {
    let sim = sim_with(&[KEY_A]).await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    Harness::start(sim, config).await
}

/// The one submit the simulator received (refresh traffic is on res.php).
fn last_submit(h: &Harness) -> Received {
    h.sim
        .received()
        .into_iter()
        .rfind(|r| r.path == "/in.php")
        .expect("the simulator received a submit")
}

fn assert_no_caller_key(r: &Received) {
    assert!(
        !r.query.contains(CALLER_KEY),
        "caller key in query: {}",
        r.query
    );
    let body = String::from_utf8_lossy(&r.body);
    assert!(!body.contains(CALLER_KEY), "caller key in body");
}

#[tokio::test]
async fn query_string_key_is_replaced_in_place() {
    let h = one_key().await;
    let answer = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=6Le-x_Y&pageurl=https%3A%2F%2Fa.test%2Fp%3Fq%3D1&json=1"
        ))
        .await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    let r = last_submit(&h);
    assert_eq!(r.method, "GET");
    assert_eq!(
        r.query,
        format!("key={KEY_A}&method=userrecaptcha&googlekey=6Le-x_Y&pageurl=https%3A%2F%2Fa.test%2Fp%3Fq%3D1&json=1")
    );
    assert_eq!(r.key.as_deref(), Some(KEY_A));
    h.stop().await;
}

#[tokio::test]
async fn urlencoded_body_key_is_replaced_and_the_rest_is_byte_identical() {
    let h = one_key().await;
    let body =
        format!("method=base64&key={CALLER_KEY}&body=iVBOR%2Bw0K%2F%3D%3D&soft_id=4580&json=1");
    let answer = h
        .post("/in.php", "application/x-www-form-urlencoded", body)
        .await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    let r = last_submit(&h);
    assert_eq!(r.query, "");
    assert_eq!(
        r.body,
        Bytes::from(format!(
            "method=base64&key={KEY_A}&body=iVBOR%2Bw0K%2F%3D%3D&soft_id=4580&json=1"
        ))
    );
    assert_eq!(
        r.content_type.as_deref(),
        Some("application/x-www-form-urlencoded")
    );
    h.stop().await;
}

#[tokio::test]
async fn key_in_query_and_body_reaches_the_upstream_once_in_the_body() {
    let h = one_key().await;
    let answer = h
        .post(
            &format!("/in.php?key={CALLER_KEY}&json=1"),
            "application/x-www-form-urlencoded",
            format!("key={CALLER_KEY}&method=base64&body=QUJD&key=second"),
        )
        .await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    let r = last_submit(&h);
    assert_eq!(r.query, "json=1");
    assert_eq!(
        r.body,
        Bytes::from(format!("key={KEY_A}&method=base64&body=QUJD"))
    );
    assert_no_caller_key(&r);
    h.stop().await;
}

#[tokio::test]
async fn a_request_without_key_gets_one_appended_to_the_query() {
    let h = one_key().await;
    let answer = h
        .post(
            "/in.php?json=1",
            "application/x-www-form-urlencoded",
            "method=base64&body=QUJD",
        )
        .await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    let r = last_submit(&h);
    assert_eq!(r.query, format!("json=1&key={KEY_A}"));
    assert_eq!(r.body, Bytes::from_static(b"method=base64&body=QUJD"));
    h.stop().await;
}

/// Every byte value, a delimiter-like line, and the boundary itself where it is not a
/// delimiter (no CRLF before it), to catch a splicer that searches too loosely or re-encodes.
fn nasty_file() -> Vec<u8> {
    let mut file: Vec<u8> = (0..=255u8).collect();
    file.extend_from_slice(b"\r\n--not-the-boundary\r\nx--XyZ\r\n\r\n");
    file.extend((0..=255u8).rev());
    file
}

fn multipart(boundary: &str, key: &str, file: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    let text = |body: &mut Vec<u8>, name: &str, value: &str| {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
        );
    };
    text(&mut body, "soft_id", "2721");
    text(&mut body, "method", "post");
    text(&mut body, "key", key);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"cap tcha.png\"\r\nContent-Type: image/png\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(file);
    body.extend_from_slice(b"\r\n");
    text(&mut body, "json", "1");
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

#[tokio::test]
async fn multipart_key_part_is_replaced_and_file_bytes_arrive_exactly() {
    let h = one_key().await;
    let boundary = "XyZ";
    let file = nasty_file();
    let answer = h
        .post(
            "/in.php",
            &format!("multipart/form-data; boundary={boundary}"),
            multipart(boundary, CALLER_KEY, &file),
        )
        .await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    let r = last_submit(&h);
    assert_eq!(r.body, Bytes::from(multipart(boundary, KEY_A, &file)));
    // The simulator's own multipart parser (multer) sees the file intact.
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.files[0].field, "file");
    assert_eq!(r.files[0].filename.as_deref(), Some("cap tcha.png"));
    assert_eq!(r.files[0].bytes, Bytes::from(file));
    assert_eq!(r.key.as_deref(), Some(KEY_A));
    h.stop().await;
}

#[tokio::test]
async fn multipart_polls_like_python_rucaptcha_use_the_pinned_key() {
    let h = one_key().await;
    let id = h.submit().await;
    let boundary = "----rucaptcha";
    let mut body = Vec::new();
    for (name, value) in [
        ("key", CALLER_KEY),
        ("action", "get"),
        ("id", &id.to_string()),
        ("json", "1"),
    ] {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
        );
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let answer = h
        .post(
            "/res.php",
            &format!("multipart/form-data; boundary={boundary}"),
            body,
        )
        .await;
    assert_eq!(
        answer.json()["request"],
        "CAPCHA_NOT_READY",
        "{}",
        answer.text()
    );
    let r = h.sim.received().into_iter().next_back().unwrap();
    assert_eq!(r.key.as_deref(), Some(KEY_A));
    assert_no_caller_key(&r);
    h.stop().await;
}

#[tokio::test]
async fn json_body_key_is_replaced_and_values_stay_byte_identical() {
    let h = one_key().await;
    let body = format!(
        r#"{{"key":"{CALLER_KEY}","json":1,"header_acao":1,"soft_id":4587,"body":"iVBOR\/w0K+==","method":"base64","extra":{{"a":[1,2.50,"\u00e9"]}}}}"#
    );
    let answer = h.post("/in.php", "application/json", body).await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    let r = last_submit(&h);
    assert_eq!(
        r.body,
        Bytes::from(format!(
            r#"{{"key":"{KEY_A}","json":1,"header_acao":1,"soft_id":4587,"body":"iVBOR\/w0K+==","method":"base64","extra":{{"a":[1,2.50,"\u00e9"]}}}}"#
        ))
    );
    h.stop().await;
}

#[tokio::test]
async fn json_as_text_plain_with_key_in_query_like_npm_2captcha() {
    let h = one_key().await;
    let body = r#"{"body":"QUJDRA=="}"#;
    let answer = h
        .post(
            &format!("/in.php?key={CALLER_KEY}&json=1&header_acao=1&soft_id=3316&method=base64"),
            "text/plain;charset=UTF-8",
            body,
        )
        .await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    let r = last_submit(&h);
    assert_eq!(
        r.query,
        format!("key={KEY_A}&json=1&header_acao=1&soft_id=3316&method=base64")
    );
    assert_eq!(r.body, Bytes::from_static(body.as_bytes()));
    assert_eq!(r.content_type.as_deref(), Some("text/plain;charset=UTF-8"));
    h.stop().await;
}

#[tokio::test]
async fn no_request_in_any_encoding_lets_the_caller_key_through() {
    let h = one_key().await;
    h.get(&format!(
        "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
    ))
    .await;
    h.post(
        "/in.php",
        "application/x-www-form-urlencoded",
        format!("key={CALLER_KEY}&key={CALLER_KEY}&method=base64&body=QQ"),
    )
    .await;
    h.post(
        "/in.php",
        "application/json",
        format!(r#"{{"key":"{CALLER_KEY}","key":"{CALLER_KEY}","method":"base64","body":"QQ"}}"#),
    )
    .await;
    h.post(
        "/in.php",
        "multipart/form-data; boundary=b",
        multipart("b", CALLER_KEY, b"png"),
    )
    .await;
    let received = h.sim.received();
    assert!(received.iter().filter(|r| r.path == "/in.php").count() >= 4);
    for r in &received {
        assert_no_caller_key(r);
    }
    h.stop().await;
}
