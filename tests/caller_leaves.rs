//! A caller who leaves does not lose the task: once a submit has gone upstream, keyrelay
//! finishes the exchange, pins the task and counts its thread; a caller that half-closes its
//! side after sending (`nc -N`, some HTTP/1.0 tools) still gets its answer.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn submit_request(host: &str) -> String {
    format!(
        "GET /in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=https://x.test HTTP/1.1\r\n\
         Host: {host}\r\n\r\n"
    )
}

/// One key, so the task's key is known; a first task through keyrelay gives the id the
/// simulator will hand out next.
async fn one_key() -> (Harness, u64) {
    let sim = sim_with(&[KEY_A]).await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    let h = Harness::start(sim, config).await;
    let first = h.submit().await;
    (h, first + 1)
}

fn open_tasks(h: &Harness) -> u32 {
    let snapshot = h.app.snapshot();
    let key = &snapshot.pool.keys()[0];
    h.app.capacity().load(key.id).open
}

#[tokio::test]
async fn a_caller_that_closes_right_after_its_submit_still_gets_its_task_pinned() {
    for request in [
        |host: &str| submit_request(host),
        |host: &str| {
            let body = format!("key={CALLER_KEY}&method=base64&body=R0lGOD");
            format!(
                "POST /in.php HTTP/1.1\r\nHost: {host}\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        },
    ] {
        let (h, next_id) = one_key().await;
        // The upstream answers after the caller is gone: the request and the close leave
        // together, so the close always comes first.
        delay_next_submit(&h.sim, KEY_A, Duration::from_millis(50));
        send_and_leave(h.addr, &request(&h.addr.to_string()), Leave::Close).await;

        eventually("the departed caller's task is created upstream", || {
            h.sim.task_owner(next_id).is_some()
        })
        .await;
        eventually("the task is pinned and holds its thread", || {
            h.app.pins().len() == 2 && open_tasks(&h) == 2
        })
        .await;
        // Its poll goes straight to its key: no probe, so it was pinned.
        let answer = h
            .get(&format!(
                "/res.php?key={CALLER_KEY}&action=get&id={next_id}&json=1"
            ))
            .await;
        assert_eq!(
            answer.json()["request"],
            "CAPCHA_NOT_READY",
            "{}",
            answer.text()
        );
        let metrics = h.metrics().await;
        assert_eq!(
            metric(&metrics, "keyrelay_probes_total{result=\"found\"}").unwrap_or(0.0),
            0.0
        );
        h.stop().await;
    }
}

#[tokio::test]
async fn shutdown_waits_for_a_request_whose_caller_left() {
    let (h, next_id) = one_key().await;
    delay_next_submit(&h.sim, KEY_A, Duration::from_millis(300));
    send_and_leave(h.addr, &submit_request(&h.addr.to_string()), Leave::Close).await;
    let before = h.sim.received().len();
    eventually("the submit reached the upstream", || {
        h.sim.received().len() > before
    })
    .await;
    let app = h.app.clone();
    // The caller's connection is gone, so only the request's own task keeps it alive.
    h.stop().await;
    assert_eq!(app.pins().len(), 2, "shutdown finished the exchange first");
    assert!(h_sim_owner(&app, next_id));
}

fn h_sim_owner(app: &keyrelay::App, id: u64) -> bool {
    let task = keyrelay::captcha::TaskId::parse(&id.to_string()).expect("numeric id");
    app.pins()
        .owner(&task, tokio::time::Instant::now())
        .is_some()
}

/// Sends `request`, shuts the write side, and reads the whole answer.
async fn half_closed(h: &Harness, request: &str) -> String {
    let mut stream = TcpStream::connect(h.addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    stream.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("keyrelay answers and closes")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_caller_that_half_closes_after_sending_gets_its_answer() {
    let (h, next_id) = one_key().await;
    let host = h.addr.to_string();
    let answer = half_closed(&h, &submit_request(&host)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(&format!("OK|{next_id}")), "{answer}");

    let poll = format!(
        "GET /res.php?key={CALLER_KEY}&action=get&id={next_id} HTTP/1.1\r\nHost: {host}\r\n\r\n"
    );
    let answer = half_closed(&h, &poll).await;
    assert!(answer.ends_with("CAPCHA_NOT_READY"), "{answer}");

    // HTTP/1.0, as the tools that half-close speak it, and a local answer.
    let balance =
        format!("GET /res.php?key={CALLER_KEY}&action=getbalance HTTP/1.0\r\nHost: {host}\r\n\r\n");
    let answer = half_closed(&h, &balance).await;
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n10"), "{answer}");
    h.stop().await;
}
