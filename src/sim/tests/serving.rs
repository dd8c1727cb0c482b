//! Serving: keep-alive, handles dropped, shutdown, and a listener given by the caller.

use super::*;

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
