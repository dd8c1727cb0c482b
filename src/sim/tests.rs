//! End-to-end tests of the simulator over real HTTP/1.1 on ephemeral ports.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::*;

const KEY_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1";
const KEY_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2";
const FIRST_ID: u64 = 73_000_000_001;
const PLAIN: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// One HTTP answer, read whole.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: Option<String>,
    body: String,
}

struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl TestClient {
    fn new(sim: &SimHandle) -> TestClient {
        TestClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: sim.url(),
        }
    }

    async fn try_send(
        &self,
        method: Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Answer, hyper_util::client::legacy::Error> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path_and_query}", self.base));
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type);
        }
        let request = request
            .body(Full::new(body))
            .expect("test requests are well formed");
        let response = self.client.request(request).await?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .map(|value| value.to_str().expect("ascii content type").to_owned());
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the simulator sends whole bodies")
            .to_bytes();
        Ok(Answer {
            status,
            content_type,
            body: String::from_utf8(body.to_vec()).expect("the simulator answers UTF-8"),
        })
    }

    async fn get(&self, path_and_query: &str) -> Answer {
        self.try_send(Method::GET, path_and_query, None, Bytes::new())
            .await
            .expect("the simulator answers")
    }

    async fn post(
        &self,
        path_and_query: &str,
        content_type: &str,
        body: impl Into<Bytes>,
    ) -> Answer {
        self.try_send(
            Method::POST,
            path_and_query,
            Some(content_type),
            body.into(),
        )
        .await
        .expect("the simulator answers")
    }

    /// The body of a GET, asserting the service's 200 and plain content type.
    async fn plain(&self, path_and_query: &str) -> String {
        let answer = self.get(path_and_query).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.content_type.as_deref(), Some(PLAIN), "{answer:?}");
        answer.body
    }

    /// The body of a GET with `json=1` appended, asserting 200 and the JSON content type.
    async fn json(&self, path_and_query: &str) -> String {
        let answer = self.get(&format!("{path_and_query}&json=1")).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.content_type.as_deref(), Some(JSON), "{answer:?}");
        answer.body
    }
}

async fn spawn(sim: Simulator) -> (SimHandle, TestClient) {
    let handle = sim.spawn().await.expect("bind 127.0.0.1:0");
    let client = TestClient::new(&handle);
    (handle, client)
}

fn submit_base64(key: &str) -> String {
    format!("/in.php?key={key}&method=base64&body=aGVsbG8")
}

fn poll(key: &str, id: u64) -> String {
    format!("/res.php?key={key}&action=get&id={id}")
}

fn res(key: &str, action: &str) -> String {
    format!("/res.php?key={key}&action={action}")
}

fn with_threads(key: &str, threads: u32) -> SimKey {
    SimKey {
        threads,
        ..SimKey::valid(key)
    }
}

/// Yields (never sleeps, so paused time does not auto-advance) until `condition` holds.
async fn yield_until(mut condition: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if condition() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition not reached");
}

// === lifecycle and formats ===

#[test]
fn default_keys_are_real_length() {
    for key in DEFAULT_KEYS {
        assert_eq!(key.len(), 32, "{key}");
    }
}

#[tokio::test]
async fn submit_then_poll_until_ready_frees_the_thread() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A)).polls_to_ready(3)).await;
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000001");
    assert_eq!(sim.working_threads(KEY_A), 1);
    assert_eq!(sim.task_owner(FIRST_ID).as_deref(), Some(KEY_A));
    assert_eq!(sim.task_owner(FIRST_ID + 1), None);
    assert_eq!(sim.balance(KEY_A), Some(9.999));

    for _ in 0..2 {
        assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "CAPCHA_NOT_READY");
        assert_eq!(sim.working_threads(KEY_A), 1);
    }
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");
    assert_eq!(sim.working_threads(KEY_A), 0);
    // Later polls repeat the answer and free nothing more.
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");
    assert_eq!(sim.working_threads(KEY_A), 0);

    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000002");
    assert_eq!(sim.balance(KEY_A), Some(9.998));
}

#[tokio::test]
async fn json_answers_and_integer_ids_for_recaptcha() {
    let (_sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    assert_eq!(
        c.json(&submit_base64(KEY_A)).await,
        r#"{"status":1,"request":"73000000001"}"#
    );
    let recaptcha =
        format!("/in.php?key={KEY_A}&method=userrecaptcha&googlekey=6Le&pageurl=https%3A%2F%2Fa.b");
    assert_eq!(
        c.json(&recaptcha).await,
        r#"{"status":1,"request":73000000002}"#
    );
    assert_eq!(c.plain(&recaptcha).await, "OK|73000000003");

    assert_eq!(
        c.json(&poll(KEY_A, FIRST_ID)).await,
        r#"{"status":0,"request":"CAPCHA_NOT_READY"}"#
    );
    let answer = c.get(&format!("{}&json=true", poll(KEY_A, FIRST_ID))).await;
    assert_eq!(answer.content_type.as_deref(), Some(JSON));
    assert_eq!(answer.body, r#"{"status":1,"request":"tok-73000000001"}"#);
    // Anything but 1/true is plain.
    assert_eq!(
        c.plain(&format!("{}&json=0", poll(KEY_A, FIRST_ID))).await,
        "OK|tok-73000000001"
    );
    assert_eq!(
        c.json(&poll("short", FIRST_ID)).await,
        r#"{"status":0,"request":"ERROR_WRONG_USER_KEY"}"#
    );
}

#[tokio::test]
async fn enterprise_answers_carry_result_and_user_agent() {
    let (_sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A)).polls_to_ready(1)).await;
    let submit = format!(
        "/in.php?key={KEY_A}&method=userrecaptcha&googlekey=6Le&pageurl=https%3A%2F%2Fa.b&enterprise=1"
    );
    assert_eq!(c.plain(&submit).await, "OK|73000000001");
    assert_eq!(
        c.json(&poll(KEY_A, FIRST_ID)).await,
        r#"{"status":1,"request":"tok-73000000001","result":"tok-73000000001","user_agent":"Mozilla/5.0 (keyrelay-sim)"}"#
    );
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");
}

// === encodings ===

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

// === validation and keys ===

#[tokio::test]
async fn submit_validation_codes_cost_nothing() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    let cases = [
        ("", "ERROR_BAD_PARAMETERS"),
        ("&method=", "ERROR_BAD_PARAMETERS"),
        ("&method=userrecaptcha&pageurl=u", "ERROR_GOOGLEKEY"),
        ("&method=userrecaptcha&googlekey=g", "ERROR_PAGEURL"),
        ("&method=base64", "ERROR_ZERO_CAPTCHA_FILESIZE"),
        ("&method=base64&body=", "ERROR_ZERO_CAPTCHA_FILESIZE"),
        ("&method=post", "ERROR_ZERO_CAPTCHA_FILESIZE"),
    ];
    for (params, code) in cases {
        for endpoint in ["in.php", "solve.php"] {
            let path = format!("/{endpoint}?key={KEY_A}{params}");
            assert_eq!(c.plain(&path).await, code, "{path}");
        }
    }
    assert_eq!(sim.balance(KEY_A), Some(10.0));
    assert_eq!(sim.peak_threads(KEY_A), 0);
    // Methods the simulator does not model are accepted as they are.
    assert_eq!(
        c.plain(&format!("/in.php?key={KEY_A}&method=turnstile"))
            .await,
        "OK|73000000001"
    );
}

#[tokio::test]
async fn key_checks_on_every_endpoint() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey {
            state: SimKeyState::Unknown,
            ..SimKey::valid("unknown-state-key")
        })
        .key(SimKey {
            state: SimKeyState::IpNotAllowed,
            ..SimKey::valid(KEY_B)
        });
    let (_sim, c) = spawn(sim).await;
    let unregistered = "cccccccccccccccccccccccccccccccc";
    let cases = [
        ("", "ERROR_WRONG_USER_KEY"),
        ("short", "ERROR_WRONG_USER_KEY"),
        (unregistered, "ERROR_KEY_DOES_NOT_EXIST"),
        ("unknown-state-key", "ERROR_KEY_DOES_NOT_EXIST"),
        (KEY_B, "ERROR_IP_NOT_ALLOWED"),
    ];
    for (key, code) in cases {
        for path in [
            submit_base64(key),
            format!("/solve.php?key={key}&method=base64&body=x"),
            poll(key, FIRST_ID),
            res(key, "getbalance"),
            res(key, "threadsinfo"),
        ] {
            assert_eq!(c.plain(&path).await, code, "{path}");
        }
    }
    // No key parameter at all.
    assert_eq!(
        c.plain("/in.php?method=base64&body=x").await,
        "ERROR_WRONG_USER_KEY"
    );
}

#[tokio::test]
async fn zero_balance_keys_can_still_poll_and_read_the_account() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A)).polls_to_ready(1)).await;
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000001");
    sim.set_state(KEY_A, SimKeyState::ZeroBalance);

    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "ERROR_ZERO_BALANCE");
    assert_eq!(
        c.plain(&format!("/solve.php?key={KEY_A}&method=base64&body=x"))
            .await,
        "ERROR_ZERO_BALANCE"
    );
    // threadsinfo shows free threads (the SDK reads that as "no plan"), in JSON even
    // without json=1.
    let info = c.get(&res(KEY_A, "threadsinfo")).await;
    assert_eq!(info.content_type.as_deref(), Some(JSON));
    assert_eq!(
        info.body,
        r#"{"status":1,"threads":5,"working_threads":0,"free_threads":5}"#
    );
    assert_eq!(sim.working_threads(KEY_A), 1);
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "9.999");
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");

    sim.set_state(KEY_A, SimKeyState::Valid);
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000002");
}

// === capacity and balance ===

#[tokio::test]
async fn full_threads_answer_the_busy_code_until_a_task_ends() {
    let (sim, c) = spawn(
        Simulator::new()
            .key(with_threads(KEY_A, 2))
            .polls_to_ready(1),
    )
    .await;
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000001");
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000002");
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "ERROR_ZERO_BALANCE");
    assert_eq!(
        c.json(&submit_base64(KEY_A)).await,
        r#"{"status":0,"request":"ERROR_ZERO_BALANCE"}"#
    );
    assert_eq!(
        c.plain(&format!("/solve.php?key={KEY_A}&method=base64&body=x"))
            .await,
        "ERROR_ZERO_BALANCE"
    );
    assert_eq!(
        c.json(&res(KEY_A, "threadsinfo")).await,
        r#"{"status":1,"threads":2,"working_threads":2,"free_threads":0}"#
    );
    // Refused submits cost nothing.
    assert_eq!(sim.balance(KEY_A), Some(9.998));

    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000003");
    assert_eq!(sim.working_threads(KEY_A), 2);
    assert_eq!(sim.peak_threads(KEY_A), 2);
}

#[tokio::test]
async fn busy_code_is_configurable() {
    let (_sim, c) = spawn(
        Simulator::new()
            .key(with_threads(KEY_A, 1))
            .busy_code("ERROR_NO_SLOT_AVAILABLE"),
    )
    .await;
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000001");
    assert_eq!(
        c.plain(&submit_base64(KEY_A)).await,
        "ERROR_NO_SLOT_AVAILABLE"
    );
}

#[tokio::test]
async fn peak_threads_remembers_the_highest_concurrency() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A)).polls_to_ready(1)).await;
    for _ in 0..3 {
        c.plain(&submit_base64(KEY_A)).await;
    }
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");
    assert_eq!(sim.working_threads(KEY_A), 2);
    c.plain(&submit_base64(KEY_A)).await;
    assert_eq!(sim.working_threads(KEY_A), 3);
    for id in FIRST_ID + 1..FIRST_ID + 4 {
        assert_eq!(c.plain(&poll(KEY_A, id)).await, format!("OK|tok-{id}"));
    }
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(sim.peak_threads(KEY_A), 3);
    assert_eq!(sim.working_threads("not-a-key"), 0);
    assert_eq!(sim.peak_threads("not-a-key"), 0);
}

#[tokio::test]
async fn balance_runs_out_then_refills() {
    let key: SimKey = format!("{KEY_A},balance=0.0025,cost=0.001")
        .parse()
        .expect("valid key spec");
    let (sim, c) = spawn(Simulator::new().key(key)).await;
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000001");
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000002");
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "ERROR_ZERO_BALANCE");
    assert_eq!(sim.balance(KEY_A), Some(0.0005));
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "0.0005");
    assert_eq!(
        c.json(&res(KEY_A, "getbalance")).await,
        r#"{"status":1,"request":"0.0005"}"#
    );

    sim.set_balance(KEY_A, 10.5);
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "10.5");
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000003");
    assert_eq!(sim.balance(KEY_A), Some(10.499));
    assert_eq!(sim.balance("not-a-key"), None);
}

// === res.php actions ===

#[tokio::test]
async fn polling_another_keys_task_is_a_wrong_id_and_does_not_count() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B))
        .polls_to_ready(1);
    let (sim, c) = spawn(sim).await;
    c.plain(&submit_base64(KEY_A)).await;
    assert_eq!(
        c.plain(&poll(KEY_B, FIRST_ID)).await,
        "ERROR_WRONG_CAPTCHA_ID"
    );
    assert_eq!(
        c.plain(&format!("/res.php?key={KEY_B}&action=get2&id={FIRST_ID}"))
            .await,
        "ERROR_WRONG_CAPTCHA_ID"
    );
    assert_eq!(sim.working_threads(KEY_A), 1);
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");

    assert_eq!(c.plain(&poll(KEY_A, 999)).await, "ERROR_WRONG_CAPTCHA_ID");
    assert_eq!(
        c.plain(&format!("/res.php?key={KEY_A}&action=get&id=12ab"))
            .await,
        "ERROR_WRONG_ID_FORMAT"
    );
    assert_eq!(c.plain(&res(KEY_A, "get")).await, "ERROR_WRONG_CAPTCHA_ID");
}

#[tokio::test]
async fn ids_polls_each_id_in_the_callers_order() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B))
        .polls_to_ready(2);
    let (sim, c) = spawn(sim).await;
    c.plain(&submit_base64(KEY_A)).await; // FIRST_ID
    c.plain(&submit_base64(KEY_A)).await; // FIRST_ID + 1
    c.plain(&submit_base64(KEY_B)).await; // FIRST_ID + 2
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "CAPCHA_NOT_READY");

    let ids = format!(
        "/res.php?key={KEY_A}&action=get&ids={},{},{},abc,999",
        FIRST_ID,
        FIRST_ID + 1,
        FIRST_ID + 2
    );
    assert_eq!(
        c.plain(&ids).await,
        "tok-73000000001|CAPCHA_NOT_READY|ERROR_WRONG_CAPTCHA_ID|ERROR_WRONG_ID_FORMAT|ERROR_WRONG_CAPTCHA_ID"
    );
    assert_eq!(sim.working_threads(KEY_A), 1);
    assert_eq!(
        c.json(&ids).await,
        r#"{"status":1,"request":"tok-73000000001|tok-73000000002|ERROR_WRONG_CAPTCHA_ID|ERROR_WRONG_ID_FORMAT|ERROR_WRONG_CAPTCHA_ID"}"#
    );
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(sim.working_threads(KEY_B), 1);
}

#[tokio::test]
async fn get2_adds_the_price() {
    let (_sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A)).polls_to_ready(2)).await;
    c.plain(&submit_base64(KEY_A)).await;
    let get2 = format!("/res.php?key={KEY_A}&action=get2&id={FIRST_ID}");
    assert_eq!(c.plain(&get2).await, "CAPCHA_NOT_READY");
    assert_eq!(c.plain(&get2).await, "OK|tok-73000000001|0.001");
    assert_eq!(
        c.json(&get2).await,
        r#"{"status":1,"request":"tok-73000000001","price":"0.001"}"#
    );
}

#[tokio::test]
async fn unsolvable_tasks_answer_the_code_and_free_the_thread() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    c.plain(&submit_base64(KEY_A)).await;
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "CAPCHA_NOT_READY");
    sim.make_unsolvable(FIRST_ID);
    sim.make_unsolvable(12345); // unknown ids are ignored
    assert_eq!(
        c.plain(&poll(KEY_A, FIRST_ID)).await,
        "ERROR_CAPTCHA_UNSOLVABLE"
    );
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(
        c.json(&poll(KEY_A, FIRST_ID)).await,
        r#"{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}"#
    );
    assert_eq!(sim.working_threads(KEY_A), 0);
}

#[tokio::test]
async fn reports_are_recorded_only_for_the_keys_own_tasks() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B));
    let (_sim, c) = spawn(sim).await;
    c.plain(&submit_base64(KEY_A)).await;
    for action in ["reportbad", "reportgood"] {
        let own = format!("/res.php?key={KEY_A}&action={action}&id={FIRST_ID}");
        assert_eq!(c.plain(&own).await, "OK_REPORT_RECORDED");
        assert_eq!(
            c.json(&own).await,
            r#"{"status":1,"request":"OK_REPORT_RECORDED"}"#
        );
        for other in [
            format!("/res.php?key={KEY_B}&action={action}&id={FIRST_ID}"),
            format!("/res.php?key={KEY_A}&action={action}&id=abc"),
            format!("/res.php?key={KEY_A}&action={action}"),
        ] {
            assert_eq!(c.plain(&other).await, "ERROR_WRONG_CAPTCHA_ID", "{other}");
        }
    }
}

#[tokio::test]
async fn pingbacks_are_kept_per_key() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B));
    let (_sim, c) = spawn(sim).await;
    let add = |addr: &str| format!("{}&addr={addr}", res(KEY_A, "add_pingback"));
    assert_eq!(c.plain(&add("http%3A%2F%2Fh%2Fa")).await, "OK");
    assert_eq!(
        c.json(&add("http%3A%2F%2Fh%2Fb")).await,
        r#"{"status":1,"request":"OK"}"#
    );
    assert_eq!(c.plain(&add("http%3A%2F%2Fh%2Fa")).await, "OK");
    assert_eq!(
        c.plain(&res(KEY_A, "get_pingback")).await,
        "OK|http://h/a|http://h/b"
    );
    assert_eq!(
        c.json(&res(KEY_A, "get_pingback")).await,
        r#"{"status":1,"request":["http://h/a","http://h/b"]}"#
    );
    assert_eq!(c.plain(&res(KEY_B, "get_pingback")).await, "OK");

    let del = |addr: &str| format!("{}&addr={addr}", res(KEY_A, "del_pingback"));
    assert_eq!(c.plain(&del("http%3A%2F%2Fh%2Fa")).await, "OK");
    assert_eq!(c.plain(&res(KEY_A, "get_pingback")).await, "OK|http://h/b");
    assert_eq!(c.plain(&add("http%3A%2F%2Fh%2Fc")).await, "OK");
    assert_eq!(c.plain(&del("all")).await, "OK");
    assert_eq!(c.plain(&res(KEY_A, "get_pingback")).await, "OK");
    assert_eq!(
        c.json(&res(KEY_A, "get_pingback")).await,
        r#"{"status":1,"request":[]}"#
    );
    assert_eq!(
        c.plain(&res(KEY_A, "add_pingback")).await,
        "ERROR_BAD_PARAMETERS"
    );
    assert_eq!(
        c.plain(&res(KEY_A, "del_pingback")).await,
        "ERROR_BAD_PARAMETERS"
    );
}

#[tokio::test]
async fn missing_and_unknown_actions() {
    let (_sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    assert_eq!(
        c.plain(&format!("/res.php?key={KEY_A}")).await,
        "ERROR_EMPTY_ACTION"
    );
    assert_eq!(c.plain(&res(KEY_A, "")).await, "ERROR_EMPTY_ACTION");
    assert_eq!(
        c.json(&res(KEY_A, "")).await,
        r#"{"status":0,"request":"ERROR_EMPTY_ACTION"}"#
    );
    assert_eq!(
        c.plain(&res(KEY_A, "getstats")).await,
        "ERROR_BAD_PARAMETERS"
    );
}

#[tokio::test]
async fn unknown_paths_are_404_and_recorded() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    for path in ["/", "/nope", "/in.php/", "/IN.PHP"] {
        let answer = c.get(&format!("{path}?key={KEY_A}")).await;
        assert_eq!(answer.status, 404, "{path}");
        assert_eq!(answer.content_type.as_deref(), Some(PLAIN));
        assert_eq!(answer.body, "Not Found");
    }
    let received = sim.received();
    assert_eq!(received.len(), 4);
    assert_eq!(received[1].path, "/nope");
    assert_eq!(received[1].key.as_deref(), Some(KEY_A));
    sim.clear_received();
    assert!(sim.received().is_empty());
}

// === solve.php ===

#[tokio::test(start_paused = true)]
async fn solve_holds_a_thread_while_solving_then_answers_directly() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    sim.add_fault(
        KEY_A,
        Fault {
            target: FaultTarget::Submit,
            kind: FaultKind::Delay(Duration::from_secs(60)),
            times: Some(1),
        },
    );
    let started = Instant::now();
    let solving = tokio::spawn(async move {
        c.get(&format!(
            "/solve.php?key={KEY_A}&method=base64&body=x&json=1"
        ))
        .await
    });
    let probe = sim.clone();
    yield_until(|| probe.working_threads(KEY_A) == 1).await;
    assert_eq!(sim.balance(KEY_A), Some(9.999));

    let answer = solving.await.expect("client task");
    assert!(started.elapsed() >= Duration::from_secs(60));
    assert_eq!(answer.body, r#"{"status":1,"request":"tok-73000000001"}"#);
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(sim.peak_threads(KEY_A), 1);
    assert_eq!(sim.task_owner(FIRST_ID).as_deref(), Some(KEY_A));

    // Without a fault the solve is immediate; plain answers carry OK|.
    let c = TestClient::new(&sim);
    assert_eq!(
        c.plain(&format!("/solve.php?key={KEY_A}&method=base64&body=x"))
            .await,
        "OK|tok-73000000002"
    );
    // The solved task polls as answered.
    assert_eq!(
        c.plain(&poll(KEY_A, FIRST_ID + 1)).await,
        "OK|tok-73000000002"
    );
    assert_eq!(sim.working_threads(KEY_A), 0);
}

// === faults ===

#[tokio::test]
async fn status_fault_answers_the_status_and_is_consumed() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B));
    let (sim, c) = spawn(sim).await;
    sim.add_fault(
        KEY_A,
        Fault {
            target: FaultTarget::Submit,
            kind: FaultKind::Status(502),
            times: Some(1),
        },
    );
    // Other targets and other keys are unaffected.
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "10");
    assert_eq!(c.plain(&submit_base64(KEY_B)).await, "OK|73000000001");

    let answer = c.get(&format!("{}&json=1", submit_base64(KEY_A))).await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.content_type.as_deref(), Some(PLAIN));
    assert_eq!(answer.body, "Bad Gateway");
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(sim.balance(KEY_A), Some(10.0));

    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000002");

    for impossible in [101, 42, 1000] {
        sim.add_fault(
            "*",
            Fault {
                target: FaultTarget::Any,
                kind: FaultKind::Status(impossible),
                times: Some(1),
            },
        );
        let answer = c.get(&res(KEY_A, "getbalance")).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (500, "Internal Server Error"),
            "{impossible}"
        );
    }
}

#[tokio::test]
async fn code_fault_answers_in_the_callers_format_until_cleared() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    sim.add_fault(
        "*",
        Fault {
            target: FaultTarget::Poll,
            kind: FaultKind::Code("ERROR_SERVER_ERROR".to_owned()),
            times: None,
        },
    );
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000001");
    for _ in 0..3 {
        assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "ERROR_SERVER_ERROR");
    }
    // Even requests the service would reject otherwise.
    assert_eq!(c.plain(&poll("", FIRST_ID)).await, "ERROR_SERVER_ERROR");
    assert_eq!(
        c.json(&poll(KEY_A, FIRST_ID)).await,
        r#"{"status":0,"request":"ERROR_SERVER_ERROR"}"#
    );
    sim.clear_faults();
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "CAPCHA_NOT_READY");
}

#[tokio::test]
async fn reset_fault_closes_the_connection_without_an_answer() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    let reset = Fault {
        target: FaultTarget::Any,
        kind: FaultKind::Reset,
        times: Some(1),
    };
    sim.add_fault(KEY_A, reset.clone());
    let result = c
        .try_send(Method::GET, &submit_base64(KEY_A), None, Bytes::new())
        .await;
    assert!(result.is_err(), "{result:?}");

    // At the socket level: the request is read, then the connection ends with no byte sent.
    sim.add_fault(KEY_A, reset);
    let mut stream = TcpStream::connect(sim.addr()).await.expect("connect");
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: sim\r\n\r\n",
        res(KEY_A, "getbalance")
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write request");
    let mut answer = Vec::new();
    // Either a clean EOF or a reset: both leave nothing read.
    let _ = stream.read_to_end(&mut answer).await;
    assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));

    // Both requests were read and recorded; nothing was submitted.
    let received = sim.received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[1].action.as_deref(), Some("getbalance"));
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "10");
}

#[tokio::test(start_paused = true)]
async fn delay_fault_waits_then_behaves_normally() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    sim.add_fault(
        KEY_A,
        Fault {
            target: FaultTarget::Poll,
            kind: FaultKind::Delay(Duration::from_secs(30)),
            times: Some(1),
        },
    );
    let started = Instant::now();
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "10");
    assert!(started.elapsed() >= Duration::from_secs(30));

    let started = Instant::now();
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "10");
    assert!(started.elapsed() < Duration::from_secs(30));
}

// === serving ===

/// Sends one request on an open connection and reads exactly one response.
async fn exchange(stream: &mut TcpStream, request: &str) -> String {
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write request");
    let mut buffer = Vec::new();
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut response = httparse::Response::new(&mut headers);
        if let Ok(httparse::Status::Complete(head_len)) = response.parse(&buffer) {
            let length: usize = response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                .expect("content-length");
            if buffer.len() >= head_len + length {
                return String::from_utf8_lossy(&buffer[head_len..head_len + length]).into_owned();
            }
        }
        let mut chunk = [0u8; 1024];
        let read = stream.read(&mut chunk).await.expect("read response");
        assert!(read > 0, "connection closed mid-response");
        buffer.extend_from_slice(&chunk[..read]);
    }
}

#[tokio::test]
async fn connections_are_kept_alive() {
    let (_sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    let mut stream = TcpStream::connect(c.base.trim_start_matches("http://"))
        .await
        .expect("connect");
    let request = |path: String| format!("GET {path} HTTP/1.1\r\nHost: sim\r\n\r\n");
    assert_eq!(
        exchange(&mut stream, &request(submit_base64(KEY_A))).await,
        "OK|73000000001"
    );
    assert_eq!(
        exchange(&mut stream, &request(poll(KEY_A, FIRST_ID))).await,
        "CAPCHA_NOT_READY"
    );
}

#[tokio::test]
async fn dropping_every_handle_keeps_serving() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    drop(sim);
    tokio::task::yield_now().await;
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "10");
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_in_flight_requests_finish_then_refuses_connections() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    sim.add_fault(
        KEY_A,
        Fault {
            target: FaultTarget::Poll,
            kind: FaultKind::Delay(Duration::from_secs(30)),
            times: Some(1),
        },
    );
    let addr = sim.addr();
    let in_flight = tokio::spawn(async move { c.plain(&res(KEY_A, "getbalance")).await });
    let probe = sim.clone();
    yield_until(|| probe.received().len() == 1).await;

    sim.clone().shutdown().await;
    assert_eq!(in_flight.await.expect("client task"), "10");
    assert!(TcpStream::connect(addr).await.is_err());
    // A second shutdown (from another clone) returns at once.
    sim.shutdown().await;
}

#[tokio::test]
async fn serve_runs_on_a_given_listener_until_shutdown() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(Simulator::new().key(SimKey::valid(KEY_A)).serve(
        listener,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: sim\r\n\r\n",
        res(KEY_A, "getbalance")
    );
    assert_eq!(exchange(&mut stream, &request).await, "10");
    drop(stream);
    stop.send(()).expect("server still running");
    server
        .await
        .expect("serve task")
        .expect("serve ends cleanly");
}

// === other providers, routes and outages ===

#[tokio::test]
async fn a_2captcha_sim_speaks_as_2captcha_does() {
    let sim = Simulator::new()
        .provider(Provider::TwoCaptcha)
        .key(SimKey {
            threads: 1,
            ..SimKey::valid(KEY_A)
        })
        .spawn()
        .await
        .unwrap();
    let client = TestClient::new(&sim);
    // CaptchaAI's own methods are no method here (and take no thread).
    for method in ["bls", "cloudflare_challenge"] {
        let answer = client
            .get(&format!("/in.php?key={KEY_A}&method={method}"))
            .await
            .body;
        assert_eq!(answer, "ERROR_NO_SUCH_METHOD", "{method}");
    }
    let submit = format!("/in.php?key={KEY_A}&method=userrecaptcha&googlekey=g&pageurl=p");
    let first = client.get(&submit).await.body;
    let id: u64 = first.strip_prefix("OK|").unwrap().parse().unwrap();
    assert!(id > FIRST_ID, "a range of its own: {id}");
    // Full: "no free slot", not CaptchaAI's ERROR_ZERO_BALANCE.
    assert_eq!(client.get(&submit).await.body, "ERROR_NO_SLOT_AVAILABLE");
    // No money: ERROR_ZERO_BALANCE.
    sim.set_balance(KEY_A, 0.0);
    assert_eq!(client.get(&submit).await.body, "ERROR_ZERO_BALANCE");
    sim.set_balance(KEY_A, 5.0);
    let threads = client
        .get(&format!("/res.php?key={KEY_A}&action=threadsinfo&json=1"))
        .await
        .body;
    assert!(threads.contains("ERROR_BAD_PARAMETERS"), "{threads}");
    sim.shutdown().await;
}

#[tokio::test]
async fn several_providers_share_a_listener_under_their_prefixes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sims = vec![
        (String::new(), Simulator::new().key(SimKey::valid(KEY_A))),
        (
            "/2captcha".to_owned(),
            Simulator::new()
                .provider(Provider::TwoCaptcha)
                .key(SimKey::valid(KEY_A)),
        ),
    ];
    let server = tokio::spawn(Simulator::serve_many(sims, listener, async {
        let _ = stopped.await;
    }));
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let get = |path: String| {
        let client = client.clone();
        async move {
            let response = client
                .get(format!("http://{addr}{path}").parse().unwrap())
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let threads = format!("/res.php?key={KEY_A}&action=threadsinfo&json=1");
    assert!(
        get(threads.clone()).await.1.contains("\"threads\""),
        "CaptchaAI at the root"
    );
    let (_, at_2captcha) = get(format!("/2captcha{threads}")).await;
    assert!(
        at_2captcha.contains("ERROR_BAD_PARAMETERS"),
        "{at_2captcha}"
    );
    // Separate accounts: a task of one is unknown to the other.
    let (_, made) = get(format!(
        "/2captcha/in.php?key={KEY_A}&method=userrecaptcha&googlekey=g&pageurl=p"
    ))
    .await;
    let id = made.strip_prefix("OK|").unwrap();
    let (_, there) = get(format!("/2captcha/res.php?key={KEY_A}&action=get&id={id}")).await;
    assert_eq!(there, "CAPCHA_NOT_READY");
    let (_, here) = get(format!("/res.php?key={KEY_A}&action=get&id={id}")).await;
    assert_eq!(here, "ERROR_WRONG_CAPTCHA_ID");
    assert_eq!(get("/nowhere/in.php".to_owned()).await.0, 404);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_sim_that_goes_down_refuses_connections_and_comes_back_with_its_tasks() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .spawn()
        .await
        .unwrap();
    let client = TestClient::new(&sim);
    let made = client
        .get(&format!(
            "/in.php?key={KEY_A}&method=userrecaptcha&googlekey=g&pageurl=p"
        ))
        .await
        .body;
    let id = made.strip_prefix("OK|").unwrap().to_owned();
    sim.go_down().await;
    let refused = TcpStream::connect(sim.addr()).await;
    assert_eq!(
        refused.map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
    sim.go_down().await; // twice is once
    sim.come_back().await.unwrap();
    sim.come_back().await.unwrap();
    let poll = TestClient::new(&sim)
        .get(&format!("/res.php?key={KEY_A}&action=get&id={id}"))
        .await
        .body;
    assert_eq!(poll, "CAPCHA_NOT_READY", "the same task, still open");
    sim.shutdown().await;
}
