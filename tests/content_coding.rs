//! Content codings between keyrelay and the upstream: every upstream request asks for an
//! uncompressed answer whatever the caller accepts, since keyrelay must read each answer to
//! pin its task and classify its errors. An answer that comes compressed anyway cannot be
//! read: the caller gets a well-formed answer of keyrelay's own and no key is benched. And
//! a readable answer that only says it is compressed reaches the caller without the label,
//! as the text it is.

mod common;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use hyper::header::{ACCEPT_ENCODING, CONTENT_ENCODING};
use hyper::Method;
use keyrelay::config::{Config, Upstream};
use keyrelay::health::StateKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Bytes labelled gzip, as an upstream that compresses unasked would send them.
const COMPRESSED: &[u8] = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03not-really-deflated";

/// An upstream that records each request head and answers every request with `body`,
/// labelled `Content-Encoding: gzip` when `gzip`.
async fn upstream(body: &'static [u8], gzip: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    // One request at a time: the head, then the answer (the requests here
                    // carry no body).
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let end = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let head: Vec<u8> = request.drain(..end).collect();
                    seen.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let coding = if gzip {
                        "Content-Encoding: gzip\r\n"
                    } else {
                        ""
                    };
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{coding}Content-Length: {}\r\n\r\n",
                        body.len()
                    );
                    if socket.write_all(answer.as_bytes()).await.is_err()
                        || socket.write_all(body).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (url, heads)
}

async fn keyrelay_before(url: &str) -> Harness {
    let upstream = Upstream::parse(url).expect("valid url");
    let mut config = Config::for_keys(
        upstream.clone(),
        vec![
            key("a", KEY_A, 1.0, &upstream),
            key("b", KEY_B, 1.0, &upstream),
        ],
    );
    // A poll right after the submit goes upstream, with its key.
    config.polling = keyrelay::config::Polling::off();
    // No simulator: this test's upstream is the raw server above.
    Harness::start_without_refresh_wait(sim_with(&[]).await, config).await
}

/// `GET target` with the caller's `Accept-Encoding`.
async fn get_accepting(harness: &Harness, target: &str, accept: &str) -> Answer {
    let headers = [(ACCEPT_ENCODING.as_str(), accept)];
    harness
        .send_with_headers(Method::GET, target, &headers, Bytes::new())
        .await
}

/// The `accept-encoding` lines of a request head, lowercase.
fn accept_lines(head: &str) -> Vec<String> {
    head.lines()
        .map(str::to_ascii_lowercase)
        .filter(|l| l.starts_with("accept-encoding:"))
        .collect()
}

#[tokio::test]
async fn every_upstream_request_asks_for_identity_whatever_the_caller_accepts() {
    let (url, heads) = upstream(b"OK|73000000001", false).await;
    let harness = keyrelay_before(&url).await;
    let submit = format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p");
    for accept in ["gzip, deflate, br", "*", "identity;q=0, gzip", "zstd"] {
        let answer = get_accepting(&harness, &submit, accept).await;
        assert_eq!(answer.text(), "OK|73000000001", "{accept}");
    }
    let heads = heads.lock().unwrap().clone();
    // The submits, and whatever refreshes went up meanwhile.
    assert!(heads.len() >= 4, "{heads:?}");
    for head in &heads {
        assert_eq!(accept_lines(head), ["accept-encoding: identity"], "{head}");
    }
    harness.stop().await;
}

#[tokio::test]
async fn a_readable_answer_labelled_compressed_reaches_the_caller_as_text() {
    let (url, _) = upstream(b"OK|73000000001", true).await;
    let harness = keyrelay_before(&url).await;
    let submit = format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p");
    let answer = get_accepting(&harness, &submit, "gzip").await;
    assert_eq!(answer.text(), "OK|73000000001");
    assert_eq!(answer.headers.get(CONTENT_ENCODING), None);
    // It was read: the task is pinned to the key that created it.
    let key = answer
        .headers
        .get("x-keyrelay-key")
        .cloned()
        .expect("a key");
    let poll = harness
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&id=73000000001"
        ))
        .await;
    assert_eq!(poll.headers.get("x-keyrelay-key"), Some(&key));
    harness.stop().await;
}

#[tokio::test]
async fn answers_that_come_compressed_get_well_formed_answers_and_bench_no_key() {
    let (url, _) = upstream(COMPRESSED, true).await;
    let harness = keyrelay_before(&url).await;
    for target in [
        "/in.php?method=userrecaptcha&googlekey=g&pageurl=p",
        "/in.php?method=userrecaptcha&googlekey=g&pageurl=p&json=1",
        "/res.php?action=userinfo",
        "/res.php?action=userinfo&json=1",
        "/res.php?action=get&id=73000000009",
    ] {
        let target = format!("{target}&key={CALLER_KEY}");
        let answer = get_accepting(&harness, &target, "gzip").await;
        assert_eq!(answer.status, 200, "{target}: {}", answer.text());
        assert_eq!(answer.headers.get(CONTENT_ENCODING), None, "{target}");
        let text = answer.text();
        if target.contains("json=1") {
            let json: serde_json::Value = serde_json::from_str(&text).expect(&text);
            assert_eq!(json["status"], 0, "{target}: {text}");
        } else {
            assert!(
                text.starts_with("ERROR_") || text == "CAPCHA_NOT_READY",
                "{target}: {text}"
            );
        }
    }
    for name in ["a", "b"] {
        assert_ne!(harness.state_of(name).0, StateKind::Benched, "{name}");
    }
    harness.stop().await;
}
