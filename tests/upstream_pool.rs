//! The upstream connection pool against an upstream that closes every connection right
//! after its answer, though keep-alive was not refused: keyrelay must never send a request
//! on such a connection, so every submit takes one attempt and no error is counted against
//! the key. (A close that races with the next request is the keep-alive race every HTTP/1
//! client has; the pool retries only a request the connection never wrote.)

mod common;

use common::*;
use keyrelay::config::{Config, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Answers one request per connection with `OK|<n>`, then closes it.
async fn one_answer_per_connection() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let mut next = 73_000_000_001u64;
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let body = format!("OK|{next}");
            next += 1;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(answer.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (url, task)
}

#[tokio::test]
async fn an_upstream_that_closes_idle_connections_costs_no_submit() {
    let (url, upstream) = one_answer_per_connection().await;
    let upstream_url = Upstream::parse(&url).expect("valid url");
    let config = Config::for_keys(
        upstream_url.clone(),
        vec![key("a", KEY_A, 1.0, &upstream_url)],
    );
    // No simulator: this test's upstream is the raw server above.
    let sim = sim_with(&[]).await;
    let harness = Harness::start_without_refresh_wait(sim, config).await;
    for n in 0..10 {
        let answer = harness
            .get(&format!(
                "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"
            ))
            .await;
        let text = answer.text();
        assert!(text.starts_with("OK|"), "submit {n} answered {text}");
        // Not a failure retried by the failover, but a fresh connection from the start.
        assert_eq!(answer.headers["x-keyrelay-attempts"], "1", "submit {n}");
    }
    let metrics = harness.metrics().await;
    assert!(
        !metrics.contains("keyrelay_key_errors_total{"),
        "no error was counted against the key:\n{metrics}"
    );
    upstream.abort();
}
