//! A task's life (submit, poll until ready, the thread freed) and the answer formats.

use super::*;

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
