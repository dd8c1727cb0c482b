//! Keys of different providers in one pool (`provider = "..."` on `[[keys]]`): the same
//! error code means what the key's own service means by it, `threadsinfo` goes only where
//! it exists, and a method one service lacks goes to the others or is refused.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::config::Upstream;
use keyrelay::health::StateKind;
use keyrelay::provider::Provider;
use keyrelay::sim::{FaultKind, FaultTarget, SimHandle, SimKey, Simulator};

/// A key of `provider` at `sim`.
fn key_at(
    name: &str,
    value: &str,
    weight: f64,
    provider: Provider,
    sim: &SimHandle,
) -> keyrelay::config::KeyConfig {
    let upstream = Upstream::parse(&sim.url()).expect("simulator url is valid");
    let mut k = key(name, value, weight, &upstream);
    k.provider = provider;
    k
}

/// Whether `sim` was asked anything with `action` by `key`.
fn asked(sim: &SimHandle, key: &str, action: &str) -> bool {
    sim.received()
        .iter()
        .any(|r| r.key.as_deref() == Some(key) && r.action.as_deref() == Some(action))
}

#[tokio::test]
async fn zero_balance_cools_a_captchaai_key_and_benches_a_2captcha_key_without_money() {
    // CaptchaAI: key A's only thread is busy, so it answers ERROR_ZERO_BALANCE ("no free
    // thread"), and key C takes the tasks. 2captcha: key B's money runs out.
    let captchaai = Simulator::new()
        .key(SimKey {
            threads: 1,
            ..SimKey::valid(KEY_A)
        })
        .key(SimKey::valid(KEY_C))
        .spawn()
        .await
        .unwrap();
    let twocaptcha = sim_with(&[KEY_B]).await;
    let mut config = config_for(&captchaai, &[]);
    config.keys = vec![
        key_at("a", KEY_A, 10_000.0, Provider::CaptchaAi, &captchaai),
        key_at("b", KEY_B, 10_000.0, Provider::TwoCaptcha, &twocaptcha),
        key_at("c", KEY_C, 1.0, Provider::CaptchaAi, &captchaai),
    ];
    config.failover.max_attempts = 3;
    config.failover.busy_cooldown = Duration::from_secs(3600);
    let h = Harness::start(captchaai, config).await;
    assert!(
        !asked(&twocaptcha, KEY_B, "threadsinfo"),
        "2captcha has no threadsinfo: the startup refresh must not ask it"
    );
    h.submit_past_keyrelay(KEY_A).await;
    // The simulator answers ERROR_ZERO_BALANCE once the balance cannot pay for a task.
    twocaptcha.set_balance(KEY_B, 0.0);

    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_C));
    eventually("a cooling as full, b benched for money", || {
        h.state_of("a") == (StateKind::Cooling, Some("ERROR_ZERO_BALANCE"))
            && h.state_of("b") == (StateKind::Benched, Some("ERROR_ZERO_BALANCE"))
    })
    .await;
    assert!(
        asked(&h.sim, KEY_A, "threadsinfo"),
        "CaptchaAI's code is settled by threadsinfo"
    );
    assert!(
        asked(&twocaptcha, KEY_B, "getbalance"),
        "2captcha's by getbalance"
    );
    assert!(!asked(&twocaptcha, KEY_B, "threadsinfo"));

    // Topped up: the next refresh reads the money and brings b back, with no threadsinfo.
    twocaptcha.set_balance(KEY_B, 5.0);
    let b = h.app.snapshot().pool.keys()[1].clone();
    keyrelay::refresh::refresh_key(&h.app, &b, Duration::from_secs(5)).await;
    assert_eq!(h.state_of("b").0, StateKind::Active);
    assert!(!asked(&twocaptcha, KEY_B, "threadsinfo"));
    twocaptcha.shutdown().await;
    h.stop().await;
}

#[tokio::test]
async fn a_2captcha_key_with_money_left_after_zero_balance_is_not_benched() {
    // The balance read after the verdict shows money (topped up meanwhile, or a stray
    // answer): the key is not benched, only held back by the verdict's short cooldown.
    let captchaai = sim_with(&[KEY_C]).await;
    let twocaptcha = sim_with(&[KEY_B]).await;
    let mut config = config_for(&captchaai, &[]);
    config.keys = vec![
        key_at("b", KEY_B, 10_000.0, Provider::TwoCaptcha, &twocaptcha),
        key_at("c", KEY_C, 1.0, Provider::CaptchaAi, &captchaai),
    ];
    let h = Harness::start(captchaai, config).await;
    twocaptcha.add_fault(
        KEY_B,
        fault(
            FaultTarget::Submit,
            FaultKind::Code("ERROR_ZERO_BALANCE".into()),
            Some(1),
        ),
    );
    twocaptcha.set_balance(KEY_B, 30.0);
    let id = h.submit().await;
    assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_C));
    // The check keeps the balance it read once its verdict is applied.
    eventually("b's balance read after the verdict", || {
        h.app.snapshot().pool.keys()[0].stats.balance() == Some(30.0)
    })
    .await;
    assert_eq!(
        h.state_of("b"),
        (StateKind::Cooling, Some("ERROR_ZERO_BALANCE"))
    );
    assert!(!asked(&twocaptcha, KEY_B, "threadsinfo"));
    h.stop().await;
}

#[tokio::test]
async fn a_method_one_provider_lacks_goes_to_the_other_and_never_reaches_it() {
    let captchaai = sim_with(&[KEY_C]).await;
    let twocaptcha = sim_with(&[KEY_B]).await;
    let mut config = config_for(&captchaai, &[]);
    config.keys = vec![
        key_at("b", KEY_B, 10_000.0, Provider::TwoCaptcha, &twocaptcha),
        key_at("c", KEY_C, 1.0, Provider::CaptchaAi, &captchaai),
    ];
    let h = Harness::start(captchaai, config).await;
    for method in ["bls", "cloudflare_challenge", "BLS"] {
        let answer = h
            .get(&format!(
                "/in.php?key={CALLER_KEY}&method={method}&pageurl=https://x.test&json=1"
            ))
            .await;
        let json = answer.json();
        assert_eq!(json["status"], 1, "{method}: {}", answer.text());
        let id: u64 = json["request"]
            .as_str()
            .map(|s| s.parse().unwrap())
            .or(json["request"].as_u64())
            .unwrap();
        assert_eq!(h.sim.task_owner(id).as_deref(), Some(KEY_C), "{method}");
    }
    // A method both serve goes by weight, to 2captcha.
    let id = h.submit().await;
    assert_eq!(twocaptcha.task_owner(id).as_deref(), Some(KEY_B));
    assert!(
        !twocaptcha.received().iter().any(|r| r
            .params
            .iter()
            .any(|(k, v)| k == "method" && v.eq_ignore_ascii_case("bls"))),
        "no bls submit reached 2captcha"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_method_no_provider_of_the_pool_serves_is_refused_in_the_callers_format() {
    let twocaptcha = sim_with(&[KEY_B]).await;
    let mut config = config_for(&twocaptcha, &[]);
    config.keys = vec![key_at("b", KEY_B, 1.0, Provider::TwoCaptcha, &twocaptcha)];
    let h = Harness::start(twocaptcha, config).await;
    let json = h
        .get(&format!("/in.php?key={CALLER_KEY}&method=bls&json=1"))
        .await
        .json();
    assert_eq!(json["status"], 0);
    assert_eq!(json["request"], "ERROR_NO_SUCH_METHOD");
    assert!(json["error_text"].as_str().unwrap().contains("provider"));
    let plain = h.get(&format!("/in.php?key={CALLER_KEY}&method=bls")).await;
    assert_eq!(plain.text(), "ERROR_NO_SUCH_METHOD");
    assert!(
        !h.sim.received().iter().any(|r| r.action.is_none()),
        "no submit reached the service"
    );
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_local_answers_total{code=\"ERROR_NO_SUCH_METHOD\"}"
        ),
        Some(2.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn getbalance_adds_up_only_the_first_usable_keys_currency() {
    let dollars = Simulator::new()
        .key(SimKey {
            balance: 10.0,
            ..SimKey::valid(KEY_A)
        })
        .spawn()
        .await
        .unwrap();
    let roubles = Simulator::new()
        .key(SimKey {
            balance: 900.0,
            ..SimKey::valid(KEY_B)
        })
        .key(SimKey {
            balance: 100.0,
            ..SimKey::valid(KEY_C)
        })
        .spawn()
        .await
        .unwrap();
    for (order, expected) in [(["a", "b", "c"], "10"), (["b", "a", "c"], "1000")] {
        let all = [
            key_at("a", KEY_A, 1.0, Provider::TwoCaptcha, &dollars),
            key_at("b", KEY_B, 1.0, Provider::RuCaptcha, &roubles),
            key_at("c", KEY_C, 1.0, Provider::RuCaptcha, &roubles),
        ];
        let sim = sim_with(&[]).await;
        let mut config = config_for(&sim, &[]);
        config.keys = order
            .iter()
            .map(|name| all.iter().find(|k| k.name == *name).unwrap().clone())
            .collect();
        let h = Harness::start(sim, config).await;
        let answer = h
            .get(&format!("/res.php?key={CALLER_KEY}&action=getbalance"))
            .await;
        assert_eq!(answer.text(), expected, "{order:?}");
        h.stop().await;
    }
}
