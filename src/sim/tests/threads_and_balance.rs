//! Thread caps, the busy code, peak concurrency, and a balance that runs out.

use super::*;

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
