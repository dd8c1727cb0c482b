//! End-to-end tests of the simulator over real HTTP/1.1 on ephemeral ports: the client and
//! helpers they share, and a file under `tests/` for each part of the simulator.

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

mod encodings;
mod injected_faults;
mod lifecycle;
mod providers_and_outages;
mod res_actions;
mod serving;
mod solve;
mod threads_and_balance;
mod validation;
