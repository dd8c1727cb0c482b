//! Requests in each body encoding (urlencoded, multipart, JSON), and malformed bodies.

use super::*;

#[tokio::test]
async fn urlencoded_body_wins_over_query_and_is_recorded() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    let body = format!("key={KEY_A}&method=base64&body=aGk%3D");
    let answer = c
        .post(
            "/in.php?key=wrong&json=1",
            "application/x-www-form-urlencoded",
            body.clone(),
        )
        .await;
    assert_eq!(answer.body, r#"{"status":1,"request":"73000000001"}"#);

    let received = sim.received();
    assert_eq!(received.len(), 1);
    let r = &received[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/in.php");
    assert_eq!(r.query, "key=wrong&json=1");
    assert_eq!(
        r.content_type.as_deref(),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(r.body, Bytes::from(body));
    let expected: Vec<(String, String)> = [
        ("key", "wrong"),
        ("json", "1"),
        ("key", KEY_A),
        ("method", "base64"),
        ("body", "aGk="),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(r.params, expected);
    assert_eq!(r.key.as_deref(), Some(KEY_A));
    assert_eq!(r.action, None);
    assert!(r.files.is_empty());
}

fn multipart_body(boundary: &str, fields: &[(&str, &str)], file: Option<&[u8]>) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    if let Some(bytes) = file {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"captcha.png\"\r\nContent-Type: image/png\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

#[tokio::test]
async fn multipart_file_upload_keeps_the_bytes_exactly() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    // Every byte value, plus sequences that look like a boundary or a header end.
    let mut image: Vec<u8> = (0..=255u8).collect();
    image.extend_from_slice(b"\r\n--bound\r\n\r\n\x00\xff");
    let boundary = "bound42";
    let body = multipart_body(
        boundary,
        &[("key", KEY_A), ("method", "post"), ("json", "1")],
        Some(&image),
    );
    let answer = c
        .post(
            "/in.php",
            &format!("multipart/form-data; boundary={boundary}"),
            body,
        )
        .await;
    assert_eq!(answer.body, r#"{"status":1,"request":"73000000001"}"#);

    let received = sim.received();
    let r = &received[0];
    assert_eq!(r.key.as_deref(), Some(KEY_A));
    assert_eq!(
        r.files,
        vec![ReceivedFile {
            field: "file".to_owned(),
            filename: Some("captcha.png".to_owned()),
            content_type: Some("image/png".to_owned()),
            bytes: Bytes::from(image),
        }]
    );
    assert_eq!(
        r.params.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["key", "method", "json"]
    );

    // method=post without a file part.
    let body = multipart_body(boundary, &[("key", KEY_A), ("method", "post")], None);
    let answer = c
        .post(
            "/in.php",
            &format!("multipart/form-data; boundary={boundary}"),
            body,
        )
        .await;
    assert_eq!(answer.body, "ERROR_ZERO_CAPTCHA_FILESIZE");
    assert_eq!(sim.working_threads(KEY_A), 1);
}

#[tokio::test]
async fn json_bodies_as_application_json_and_as_text_plain() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    // @2captcha/captcha-solver: everything in a JSON body.
    let body = format!(
        r#"{{"key":"{KEY_A}","json":1,"header_acao":1,"soft_id":4587,"body":"aGk=","method":"base64"}}"#
    );
    let answer = c.post("/in.php", "application/json", body).await;
    assert_eq!(answer.content_type.as_deref(), Some(JSON));
    assert_eq!(answer.body, r#"{"status":1,"request":"73000000001"}"#);

    // npm `2captcha`: key and method in the query, the image as JSON text/plain.
    let answer = c
        .post(
            &format!("/in.php?key={KEY_A}&json=1&method=base64"),
            "text/plain;charset=UTF-8",
            r#"{"body":"aGk="}"#,
        )
        .await;
    assert_eq!(answer.body, r#"{"status":1,"request":"73000000002"}"#);
    assert_eq!(
        sim.received()[1].params.last(),
        Some(&("body".to_owned(), "aGk=".to_owned()))
    );

    // A text/plain body that is not JSON adds no parameters.
    let answer = c
        .post(
            &format!("/in.php?key={KEY_A}&method=base64"),
            "text/plain",
            "body=aGk=",
        )
        .await;
    assert_eq!(answer.body, "ERROR_ZERO_CAPTCHA_FILESIZE");

    // A POST with everything in the query and no body (a rucaptcha PHP client).
    let answer = c
        .try_send(Method::POST, &submit_base64(KEY_A), None, Bytes::new())
        .await
        .expect("answer");
    assert_eq!(answer.body, "OK|73000000003");
}

#[tokio::test]
async fn malformed_bodies_answer_bad_parameters() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    let answer = c
        .post(
            &format!("/in.php?key={KEY_A}&method=base64&body=x&json=1"),
            "application/json",
            "{\"key\":",
        )
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.body,
        r#"{"status":0,"request":"ERROR_BAD_PARAMETERS"}"#
    );
    let answer = c
        .post(
            &format!("/res.php?key={KEY_A}&action=getbalance"),
            "multipart/form-data; boundary=zz",
            "not multipart at all",
        )
        .await;
    assert_eq!(answer.body, "ERROR_BAD_PARAMETERS");
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(sim.received().len(), 2);
}
