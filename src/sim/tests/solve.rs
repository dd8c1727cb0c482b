//! `solve.php`: a thread held while solving, then the answer directly.

use super::*;

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
