//! `res.php`'s actions: polls of own and other keys' tasks, `ids`, `get2`, reports,
//! pingbacks, and unknown actions and paths.

use super::*;

#[tokio::test]
async fn polling_another_keys_task_is_a_wrong_id_and_does_not_count() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B))
        .polls_to_ready(1);
    let (sim, c) = spawn(sim).await;
    c.plain(&submit_base64(KEY_A)).await;
    assert_eq!(
        c.plain(&poll(KEY_B, FIRST_ID)).await,
        "ERROR_WRONG_CAPTCHA_ID"
    );
    assert_eq!(
        c.plain(&format!("/res.php?key={KEY_B}&action=get2&id={FIRST_ID}"))
            .await,
        "ERROR_WRONG_CAPTCHA_ID"
    );
    assert_eq!(sim.working_threads(KEY_A), 1);
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");

    assert_eq!(c.plain(&poll(KEY_A, 999)).await, "ERROR_WRONG_CAPTCHA_ID");
    assert_eq!(
        c.plain(&format!("/res.php?key={KEY_A}&action=get&id=12ab"))
            .await,
        "ERROR_WRONG_ID_FORMAT"
    );
    assert_eq!(c.plain(&res(KEY_A, "get")).await, "ERROR_WRONG_CAPTCHA_ID");
}

#[tokio::test]
async fn ids_polls_each_id_in_the_callers_order() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B))
        .polls_to_ready(2);
    let (sim, c) = spawn(sim).await;
    c.plain(&submit_base64(KEY_A)).await; // FIRST_ID
    c.plain(&submit_base64(KEY_A)).await; // FIRST_ID + 1
    c.plain(&submit_base64(KEY_B)).await; // FIRST_ID + 2
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "CAPCHA_NOT_READY");

    let ids = format!(
        "/res.php?key={KEY_A}&action=get&ids={},{},{},abc,999",
        FIRST_ID,
        FIRST_ID + 1,
        FIRST_ID + 2
    );
    assert_eq!(
        c.plain(&ids).await,
        "tok-73000000001|CAPCHA_NOT_READY|ERROR_WRONG_CAPTCHA_ID|ERROR_WRONG_ID_FORMAT|ERROR_WRONG_CAPTCHA_ID"
    );
    assert_eq!(sim.working_threads(KEY_A), 1);
    assert_eq!(
        c.json(&ids).await,
        r#"{"status":1,"request":"tok-73000000001|tok-73000000002|ERROR_WRONG_CAPTCHA_ID|ERROR_WRONG_ID_FORMAT|ERROR_WRONG_CAPTCHA_ID"}"#
    );
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(sim.working_threads(KEY_B), 1);
}

#[tokio::test]
async fn get2_adds_the_price() {
    let (_sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A)).polls_to_ready(2)).await;
    c.plain(&submit_base64(KEY_A)).await;
    let get2 = format!("/res.php?key={KEY_A}&action=get2&id={FIRST_ID}");
    assert_eq!(c.plain(&get2).await, "CAPCHA_NOT_READY");
    assert_eq!(c.plain(&get2).await, "OK|tok-73000000001|0.001");
    assert_eq!(
        c.json(&get2).await,
        r#"{"status":1,"request":"tok-73000000001","price":"0.001"}"#
    );
}

#[tokio::test]
async fn unsolvable_tasks_answer_the_code_and_free_the_thread() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    c.plain(&submit_base64(KEY_A)).await;
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "CAPCHA_NOT_READY");
    sim.make_unsolvable(FIRST_ID);
    sim.make_unsolvable(12345); // unknown ids are ignored
    assert_eq!(
        c.plain(&poll(KEY_A, FIRST_ID)).await,
        "ERROR_CAPTCHA_UNSOLVABLE"
    );
    assert_eq!(sim.working_threads(KEY_A), 0);
    assert_eq!(
        c.json(&poll(KEY_A, FIRST_ID)).await,
        r#"{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}"#
    );
    assert_eq!(sim.working_threads(KEY_A), 0);
}

#[tokio::test]
async fn reports_are_recorded_only_for_the_keys_own_tasks() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B));
    let (_sim, c) = spawn(sim).await;
    c.plain(&submit_base64(KEY_A)).await;
    for action in ["reportbad", "reportgood"] {
        let own = format!("/res.php?key={KEY_A}&action={action}&id={FIRST_ID}");
        assert_eq!(c.plain(&own).await, "OK_REPORT_RECORDED");
        assert_eq!(
            c.json(&own).await,
            r#"{"status":1,"request":"OK_REPORT_RECORDED"}"#
        );
        for other in [
            format!("/res.php?key={KEY_B}&action={action}&id={FIRST_ID}"),
            format!("/res.php?key={KEY_A}&action={action}&id=abc"),
            format!("/res.php?key={KEY_A}&action={action}"),
        ] {
            assert_eq!(c.plain(&other).await, "ERROR_WRONG_CAPTCHA_ID", "{other}");
        }
    }
}

#[tokio::test]
async fn pingbacks_are_kept_per_key() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B));
    let (_sim, c) = spawn(sim).await;
    let add = |addr: &str| format!("{}&addr={addr}", res(KEY_A, "add_pingback"));
    assert_eq!(c.plain(&add("http%3A%2F%2Fh%2Fa")).await, "OK");
    assert_eq!(
        c.json(&add("http%3A%2F%2Fh%2Fb")).await,
        r#"{"status":1,"request":"OK"}"#
    );
    assert_eq!(c.plain(&add("http%3A%2F%2Fh%2Fa")).await, "OK");
    assert_eq!(
        c.plain(&res(KEY_A, "get_pingback")).await,
        "OK|http://h/a|http://h/b"
    );
    assert_eq!(
        c.json(&res(KEY_A, "get_pingback")).await,
        r#"{"status":1,"request":["http://h/a","http://h/b"]}"#
    );
    assert_eq!(c.plain(&res(KEY_B, "get_pingback")).await, "OK");

    let del = |addr: &str| format!("{}&addr={addr}", res(KEY_A, "del_pingback"));
    assert_eq!(c.plain(&del("http%3A%2F%2Fh%2Fa")).await, "OK");
    assert_eq!(c.plain(&res(KEY_A, "get_pingback")).await, "OK|http://h/b");
    assert_eq!(c.plain(&add("http%3A%2F%2Fh%2Fc")).await, "OK");
    assert_eq!(c.plain(&del("all")).await, "OK");
    assert_eq!(c.plain(&res(KEY_A, "get_pingback")).await, "OK");
    assert_eq!(
        c.json(&res(KEY_A, "get_pingback")).await,
        r#"{"status":1,"request":[]}"#
    );
    assert_eq!(
        c.plain(&res(KEY_A, "add_pingback")).await,
        "ERROR_BAD_PARAMETERS"
    );
    assert_eq!(
        c.plain(&res(KEY_A, "del_pingback")).await,
        "ERROR_BAD_PARAMETERS"
    );
}

#[tokio::test]
async fn missing_and_unknown_actions() {
    let (_sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    assert_eq!(
        c.plain(&format!("/res.php?key={KEY_A}")).await,
        "ERROR_EMPTY_ACTION"
    );
    assert_eq!(c.plain(&res(KEY_A, "")).await, "ERROR_EMPTY_ACTION");
    assert_eq!(
        c.json(&res(KEY_A, "")).await,
        r#"{"status":0,"request":"ERROR_EMPTY_ACTION"}"#
    );
    assert_eq!(
        c.plain(&res(KEY_A, "getstats")).await,
        "ERROR_BAD_PARAMETERS"
    );
}

#[tokio::test]
async fn unknown_paths_are_404_and_recorded() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    for path in ["/", "/nope", "/in.php/", "/IN.PHP"] {
        let answer = c.get(&format!("{path}?key={KEY_A}")).await;
        assert_eq!(answer.status, 404, "{path}");
        assert_eq!(answer.content_type.as_deref(), Some(PLAIN));
        assert_eq!(answer.body, "Not Found");
    }
    let received = sim.received();
    assert_eq!(received.len(), 4);
    assert_eq!(received[1].path, "/nope");
    assert_eq!(received[1].key.as_deref(), Some(KEY_A));
    sim.clear_received();
    assert!(sim.received().is_empty());
}
