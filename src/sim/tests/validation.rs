//! Submit validation codes, and the key checks on every endpoint.

use super::*;

#[tokio::test]
async fn submit_validation_codes_cost_nothing() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A))).await;
    let cases = [
        ("", "ERROR_BAD_PARAMETERS"),
        ("&method=", "ERROR_BAD_PARAMETERS"),
        ("&method=userrecaptcha&pageurl=u", "ERROR_GOOGLEKEY"),
        ("&method=userrecaptcha&googlekey=g", "ERROR_PAGEURL"),
        ("&method=base64", "ERROR_ZERO_CAPTCHA_FILESIZE"),
        ("&method=base64&body=", "ERROR_ZERO_CAPTCHA_FILESIZE"),
        ("&method=post", "ERROR_ZERO_CAPTCHA_FILESIZE"),
    ];
    for (params, code) in cases {
        for endpoint in ["in.php", "solve.php"] {
            let path = format!("/{endpoint}?key={KEY_A}{params}");
            assert_eq!(c.plain(&path).await, code, "{path}");
        }
    }
    assert_eq!(sim.balance(KEY_A), Some(10.0));
    assert_eq!(sim.peak_threads(KEY_A), 0);
    // Methods the simulator does not model are accepted as they are.
    assert_eq!(
        c.plain(&format!("/in.php?key={KEY_A}&method=turnstile"))
            .await,
        "OK|73000000001"
    );
}

#[tokio::test]
async fn key_checks_on_every_endpoint() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey {
            state: SimKeyState::Unknown,
            ..SimKey::valid("unknown-state-key")
        })
        .key(SimKey {
            state: SimKeyState::IpNotAllowed,
            ..SimKey::valid(KEY_B)
        });
    let (_sim, c) = spawn(sim).await;
    let unregistered = "cccccccccccccccccccccccccccccccc";
    let cases = [
        ("", "ERROR_WRONG_USER_KEY"),
        ("short", "ERROR_WRONG_USER_KEY"),
        (unregistered, "ERROR_KEY_DOES_NOT_EXIST"),
        ("unknown-state-key", "ERROR_KEY_DOES_NOT_EXIST"),
        (KEY_B, "ERROR_IP_NOT_ALLOWED"),
    ];
    for (key, code) in cases {
        for path in [
            submit_base64(key),
            format!("/solve.php?key={key}&method=base64&body=x"),
            poll(key, FIRST_ID),
            res(key, "getbalance"),
            res(key, "threadsinfo"),
        ] {
            assert_eq!(c.plain(&path).await, code, "{path}");
        }
    }
    // No key parameter at all.
    assert_eq!(
        c.plain("/in.php?method=base64&body=x").await,
        "ERROR_WRONG_USER_KEY"
    );
}

#[tokio::test]
async fn zero_balance_keys_can_still_poll_and_read_the_account() {
    let (sim, c) = spawn(Simulator::new().key(SimKey::valid(KEY_A)).polls_to_ready(1)).await;
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000001");
    sim.set_state(KEY_A, SimKeyState::ZeroBalance);

    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "ERROR_ZERO_BALANCE");
    assert_eq!(
        c.plain(&format!("/solve.php?key={KEY_A}&method=base64&body=x"))
            .await,
        "ERROR_ZERO_BALANCE"
    );
    // threadsinfo shows free threads (the SDK reads that as "no plan"), in JSON even
    // without json=1.
    let info = c.get(&res(KEY_A, "threadsinfo")).await;
    assert_eq!(info.content_type.as_deref(), Some(JSON));
    assert_eq!(
        info.body,
        r#"{"status":1,"threads":5,"working_threads":0,"free_threads":5}"#
    );
    assert_eq!(sim.working_threads(KEY_A), 1);
    assert_eq!(c.plain(&res(KEY_A, "getbalance")).await, "9.999");
    assert_eq!(c.plain(&poll(KEY_A, FIRST_ID)).await, "OK|tok-73000000001");

    sim.set_state(KEY_A, SimKeyState::Valid);
    assert_eq!(c.plain(&submit_base64(KEY_A)).await, "OK|73000000002");
}
