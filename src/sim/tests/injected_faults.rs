//! Injected faults: a status, a code, a reset connection, a delay.

use super::*;

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
