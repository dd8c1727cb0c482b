//! What callers get back: upstream answers verbatim, and well-formed answers of keyrelay's
//! own for bad input, in the caller's format, never a panic or a dropped connection.

mod common;

use bytes::Bytes;
use common::*;
use hyper::Method;

#[tokio::test]
async fn upstream_answers_pass_through_verbatim_with_extra_fields_and_integer_ids() {
    let h = Harness::three_keys().await;
    let submit = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&enterprise=1&googlekey=g&pageurl=p&json=1"
        ))
        .await;
    assert_eq!(submit.content_type(), Some("application/json"));
    let id = submit.json()["request"]
        .as_u64()
        .expect("integer id passes through as an integer");
    assert_eq!(submit.text(), format!(r#"{{"status":1,"request":{id}}}"#));
    h.get(&format!("/res.php?action=get&id={id}&json=1")).await;
    let solved = h
        .get(&format!("/res.php?action=get&id={id}&json=1"))
        .await
        .json();
    assert_eq!(solved["request"], format!("tok-{id}"));
    assert_eq!(solved["result"], format!("tok-{id}"));
    assert_eq!(solved["user_agent"], "Mozilla/5.0 (keyrelay-sim)");
    h.stop().await;
}

#[tokio::test]
async fn upstream_http_status_and_content_type_are_kept_on_final_answers() {
    let h = Harness::three_keys().await;
    let plain = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
        ))
        .await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.content_type(), Some("text/plain; charset=utf-8"));
    assert!(plain.text().starts_with("OK|"), "{}", plain.text());
    h.stop().await;
}

#[tokio::test]
async fn unknown_paths_are_404_and_other_methods_405() {
    let h = Harness::three_keys().await;
    // `/createTask` is the JSON task API's (tests/json_api.rs); an unknown path is not.
    let answer = h.get("/submit.php").await;
    assert_eq!(answer.status, 404);
    let answer = h.send(Method::PUT, "/in.php", None, Bytes::new()).await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.headers.get("allow").unwrap(), "GET, POST");
    h.stop().await;
}

#[tokio::test]
async fn a_missing_action_is_answered_locally() {
    let h = Harness::three_keys().await;
    assert_eq!(h.get("/res.php?id=1").await.text(), "ERROR_EMPTY_ACTION");
    let json = h.get("/res.php?id=1&json=1&action=").await.json();
    assert_eq!(json["status"], 0);
    assert_eq!(json["request"], "ERROR_EMPTY_ACTION");
    assert!(json["error_text"].is_string());
    h.stop().await;
}

#[tokio::test]
async fn malformed_bodies_get_bad_parameters_in_the_callers_format() {
    let h = Harness::three_keys().await;
    let cases: [(&str, &str, &[u8]); 5] = [
        (
            "/in.php?json=1",
            "application/json",
            b"{\"method\":\"base64\",\"body\":",
        ),
        ("/in.php?json=1", "application/json", b"[1,2,3]"),
        (
            "/in.php?json=1",
            "application/xml",
            b"<method>base64</method>",
        ),
        ("/in.php?json=1", "multipart/form-data", b"--x\r\n"),
        (
            "/in.php?json=1",
            "multipart/form-data; boundary=x",
            b"--x\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nno end",
        ),
    ];
    for (path, content_type, body) in cases {
        let answer = h.post(path, content_type, Bytes::from_static(body)).await;
        assert_eq!(answer.status, 200, "{content_type}");
        let json = answer.json();
        assert_eq!(json["status"], 0, "{content_type}");
        assert_eq!(json["request"], "ERROR_BAD_PARAMETERS", "{content_type}");
        assert!(!json["error_text"].as_str().unwrap().is_empty());
    }
    let plain = h
        .post("/in.php", "text/plain", Bytes::from_static(b"{oops"))
        .await;
    assert_eq!(plain.text(), "ERROR_BAD_PARAMETERS");
    assert!(
        h.sim.received().iter().all(|r| r.path != "/in.php"),
        "nothing malformed was forwarded"
    );
    h.stop().await;
}

#[tokio::test]
async fn oversized_bodies_are_refused_and_the_connection_still_answers() {
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.limits.max_body = 1024;
    let h = Harness::start(sim, config).await;
    let big = format!("method=base64&json=1&body={}", "A".repeat(64 * 1024));
    let answer = h
        .post("/in.php", "application/x-www-form-urlencoded", big)
        .await;
    assert_eq!(answer.status, 200);
    let json = answer.json();
    assert_eq!(json["request"], "ERROR_TOO_BIG_CAPTCHA_FILESIZE");
    assert!(json["error_text"].as_str().unwrap().contains("1024"));
    // The same client (and pooled connection) keeps working.
    let ok = h
        .post(
            "/in.php?json=1",
            "application/x-www-form-urlencoded",
            "method=base64&body=QUJD",
        )
        .await;
    assert_eq!(ok.json()["status"], 1);
    h.stop().await;
}

#[tokio::test]
async fn the_default_body_limit_fits_nine_base64_images() {
    let h = Harness::three_keys().await;
    // BLS: nine 1 MiB images as data URIs, base64 (4/3 larger).
    let image = "A".repeat(1024 * 1024 * 4 / 3);
    let mut body = String::from("method=bls&instructions=cats&json=1");
    for i in 1..=9 {
        body.push_str(&format!(
            "&image_base64_{i}=data%3Aimage%2Fpng%3Bbase64%2C{image}"
        ));
    }
    let answer = h
        .post("/in.php", "application/x-www-form-urlencoded", body.clone())
        .await;
    assert_eq!(answer.json()["status"], 1, "{}", answer.text());
    let received = h
        .sim
        .received()
        .into_iter()
        .rfind(|r| r.path == "/in.php")
        .unwrap();
    assert_eq!(received.body, Bytes::from(body));
    assert_eq!(
        received.query,
        format!("key={}", received.key.as_deref().unwrap())
    );
    h.stop().await;
}

#[tokio::test]
async fn unknown_actions_are_forwarded_and_failures_answered_in_format() {
    let h = Harness::three_keys().await;
    let answer = h.get("/res.php?action=getstats&json=1").await;
    assert_eq!(
        answer.json()["request"],
        "ERROR_BAD_PARAMETERS",
        "the simulator's own answer"
    );
    assert!(h
        .sim
        .received()
        .iter()
        .any(|r| r.action.as_deref() == Some("getstats")));
    h.sim.add_fault(
        "*",
        fault(
            keyrelay::sim::FaultTarget::Poll,
            keyrelay::sim::FaultKind::Status(500),
            None,
        ),
    );
    let failed = h.get("/res.php?action=getstats&json=1").await;
    assert_eq!(failed.status, 200);
    assert_eq!(failed.json()["request"], "ERROR_SERVER_ERROR");
    h.stop().await;
}
