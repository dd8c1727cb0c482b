//! The proxy's own limits, each against a misbehaving client, while everyone else is served:
//! request head size, a slow-loris that never finishes its headers, and the connection cap.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn with_limits(edit: impl FnOnce(&mut keyrelay::config::Limits)) -> Harness {
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    edit(&mut config.limits);
    Harness::start(sim, config).await
}

/// Reads until the server closes the connection, within a bound; returns what it sent.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection");
    seen
}

async fn still_serves(h: &Harness) {
    let answer = h.get("/res.php?action=getbalance").await;
    assert_eq!(answer.text(), "10");
}

#[tokio::test]
async fn an_oversized_request_head_gets_431() {
    let h = with_limits(|_| {}).await;
    let mut stream = TcpStream::connect(h.addr).await.unwrap();
    let big = "x".repeat(100 * 1024);
    let request =
        format!("GET /res.php?action=getbalance HTTP/1.1\r\nHost: k\r\nX-Big: {big}\r\n\r\n");
    // The server may stop reading once the limit is passed; a failed write is fine.
    let _ = stream.write_all(request.as_bytes()).await;
    let seen = read_to_close(&mut stream).await;
    let head = String::from_utf8_lossy(&seen);
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
    still_serves(&h).await;
    h.stop().await;
}

#[tokio::test]
async fn a_slow_loris_is_disconnected_after_the_header_timeout() {
    let h = with_limits(|l| l.header_timeout = Duration::from_millis(300)).await;
    let mut stream = TcpStream::connect(h.addr).await.unwrap();
    stream
        .write_all(b"GET /res.php?action=getbalance HTTP/1.1\r\nHost: k\r\n")
        .await
        .unwrap();
    // Everyone else is served meanwhile.
    still_serves(&h).await;
    let seen = read_to_close(&mut stream).await;
    let text = String::from_utf8_lossy(&seen);
    assert!(
        seen.is_empty() || text.starts_with("HTTP/1.1 408"),
        "a clean close or a 408, got: {text}"
    );
    h.stop().await;
}

/// One request on a fresh connection; returns everything the server sent before closing.
async fn exchange(addr: std::net::SocketAddr, request: &str) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // A refused connection may be closed before the request is even written.
    let _ = stream.write_all(request.as_bytes()).await;
    read_to_close(&mut stream).await
}

const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn connections_over_the_cap_are_closed_and_the_rest_served() {
    let h = with_limits(|l| l.max_connections = 2).await;
    let held_a = TcpStream::connect(h.addr).await.unwrap();
    let held_b = TcpStream::connect(h.addr).await.unwrap();
    // The server accepts in arrival order, so the third connection finds both slots taken.
    let refused = exchange(h.addr, HEALTHZ).await;
    assert!(refused.is_empty(), "closed without an answer: {refused:?}");
    // The held connections are still served.
    let mut held_a = held_a;
    held_a.write_all(HEALTHZ.as_bytes()).await.unwrap();
    let answer = read_to_close(&mut held_a).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    // Its slot is free once the server sees it closed: a new client is served again.
    let mut served = false;
    for _ in 0..500 {
        let seen = exchange(h.addr, HEALTHZ).await;
        if String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(served, "a freed slot was never reused");
    drop(held_b);
    let metrics = h.metrics().await;
    assert!(metric(&metrics, "keyrelay_connections_rejected_total").unwrap() >= 1.0);
    h.stop().await;
}
