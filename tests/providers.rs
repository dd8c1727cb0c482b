//! Keys of different providers in one pool (`provider = "..."` on `[[keys]]`): the same
//! error code means what the key's own service means by it, `threadsinfo` goes only where
//! it exists, a method one service lacks goes to the others or is refused, a provider
//! that is down loses its new tasks to the others at once without a key of it cooled, a host
//! that refuses costs a submit one attempt however many keys and providers it serves, and
//! every task's polls and reports go to the provider that holds it.

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

/// A simulator playing `provider`, with `keys` valid.
async fn sim_of(provider: Provider, keys: &[&str]) -> SimHandle {
    keys.iter()
        .fold(Simulator::new().provider(provider), |sim, k| {
            sim.key(SimKey::valid(k))
        })
        .spawn()
        .await
        .expect("simulator starts")
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
    let twocaptcha = sim_of(Provider::TwoCaptcha, &[KEY_B]).await;
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
    let twocaptcha = sim_of(Provider::TwoCaptcha, &[KEY_B]).await;
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
    let twocaptcha = sim_of(Provider::TwoCaptcha, &[KEY_B]).await;
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

/// The params a simulator received over its `in.php` requests that a lenient reader takes
/// for `method` (case, padding, a PHP array suffix), with their names as sent.
fn methods_received(sim: &SimHandle) -> Vec<(String, String)> {
    sim.received()
        .iter()
        .filter(|r| r.path == "/in.php")
        .flat_map(|r| r.params.clone())
        .filter(|(name, _)| {
            let cut = name.split(['[', '\0']).next().unwrap_or_default();
            cut.trim().eq_ignore_ascii_case("method")
        })
        .collect()
}

#[tokio::test]
async fn a_method_that_picks_the_keys_is_read_once_and_goes_up_as_checked() {
    let captchaai = sim_with(&[KEY_C]).await;
    let twocaptcha = sim_of(Provider::TwoCaptcha, &[KEY_B]).await;
    let mut config = config_for(&captchaai, &[]);
    config.keys = vec![
        key_at("b", KEY_B, 10_000.0, Provider::TwoCaptcha, &twocaptcha),
        key_at("c", KEY_C, 1.0, Provider::CaptchaAi, &captchaai),
    ];
    let h = Harness::start(captchaai, config).await;
    h.sim.clear_received();
    twocaptcha.clear_received();
    // Two values: which one the service reads is its choice, so neither is sent.
    for (query, body) in [
        (
            "method=userrecaptcha&json=1",
            "METHOD=bls&pageurl=https://x.test",
        ),
        (
            "json=1",
            "method=bls&method%5B%5D=userrecaptcha&pageurl=https://x.test",
        ),
    ] {
        let answer = h
            .post(
                &format!("/in.php?key={CALLER_KEY}&{query}"),
                "application/x-www-form-urlencoded",
                body.to_owned(),
            )
            .await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.json()["request"], "ERROR_BAD_PARAMETERS", "{body}");
    }
    assert!(h.sim.received().is_empty(), "{:?}", h.sim.received());
    assert!(
        twocaptcha.received().is_empty(),
        "{:?}",
        twocaptcha.received()
    );
    // One value under other spellings picks the keys that serve it and goes up once.
    for spelled in ["METHOD=bls", "+method=bls&Method=bls", "method[]=bls"] {
        let answer = h
            .get(&format!(
                "/in.php?key={CALLER_KEY}&{spelled}&pageurl=https://x.test&json=1"
            ))
            .await;
        assert_eq!(answer.json()["status"], 1, "{spelled}: {}", answer.text());
        let methods = methods_received(&h.sim);
        assert_eq!(
            methods,
            vec![("method".to_owned(), "bls".to_owned())],
            "{spelled}"
        );
        h.sim.clear_received();
    }
    assert!(methods_received(&twocaptcha).is_empty());
    h.stop().await;
}

#[tokio::test]
async fn a_method_no_provider_of_the_pool_serves_is_refused_in_the_callers_format() {
    let twocaptcha = sim_of(Provider::TwoCaptcha, &[KEY_B]).await;
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
        .provider(Provider::TwoCaptcha)
        .key(SimKey {
            balance: 10.0,
            ..SimKey::valid(KEY_A)
        })
        .spawn()
        .await
        .unwrap();
    let roubles = Simulator::new()
        .provider(Provider::RuCaptcha)
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

/// A JSON submit, as `Harness::submit` sends it.
fn submit_path() -> String {
    format!(
        "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=site&pageurl=https://x.test&json=1"
    )
}

/// `X-Keyrelay-Key` of an answer: the key that served it.
fn served_by(answer: &Answer) -> Option<String> {
    answer
        .headers
        .get("x-keyrelay-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// CaptchaAI's a and c as the primary tier, 2captcha's b as the backup.
async fn captchaai_first_2captcha_backup(cooldown: Duration) -> (Harness, SimHandle) {
    let captchaai = sim_of(Provider::CaptchaAi, &[KEY_A, KEY_C]).await;
    // Threads for every task the tests leave open: a full backup would leave only the
    // dead provider's keys, which are then tried as the last resort.
    let twocaptcha = Simulator::new()
        .provider(Provider::TwoCaptcha)
        .key(SimKey {
            threads: 1000,
            ..SimKey::valid(KEY_B)
        })
        .spawn()
        .await
        .expect("simulator starts");
    let mut config = config_for(&captchaai, &[]);
    let mut backup = key_at("b", KEY_B, 1.0, Provider::TwoCaptcha, &twocaptcha);
    backup.tier = 1;
    config.keys = vec![
        key_at("a", KEY_A, 1.0, Provider::CaptchaAi, &captchaai),
        key_at("c", KEY_C, 1.0, Provider::CaptchaAi, &captchaai),
        backup,
    ];
    config.failover.backoff_base = Duration::from_millis(1);
    config.failover.backoff_max = Duration::from_millis(5);
    config.failover.transient_cooldown = cooldown;
    (Harness::start(captchaai, config).await, twocaptcha)
}

/// Takes the harness's CaptchaAI simulator down and submits three times, enough for the
/// outage to be seen; CaptchaAI's outage view after.
async fn take_captchaai_down(h: &Harness) -> keyrelay::outage::OutageView {
    h.sim.go_down().await;
    for _ in 0..3 {
        h.submit().await;
    }
    h.app
        .outages()
        .view(Provider::CaptchaAi, tokio::time::Instant::now())
}

fn errors_at(metrics: &str, provider: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("keyrelay_key_errors_total{"))
        .filter(|l| l.contains(&format!("provider=\"{provider}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_provider_that_refuses_connections_loses_its_new_tasks_at_once_and_no_key() {
    let (h, twocaptcha) = captchaai_first_2captcha_backup(Duration::from_secs(3600)).await;
    // Made before the outage and not yet polled: it stays CaptchaAI's.
    let before = h.submit().await;
    let creator = h.sim.task_owner(before).expect("a CaptchaAI task");
    h.sim.go_down().await;

    // Until the outage is seen, each submit makes one attempt at CaptchaAI: a and c share
    // its host:port, so the refusal takes both out of the walk and the task goes to
    // 2captcha at once. The outage needs `transient_failures` (3) refusals on both keys; a
    // key refused three times alone is cooled, so the fourth refusal is its partner's.
    let mut seen_within = None;
    for n in 1..=10 {
        let answer = h.get(&submit_path()).await;
        assert_eq!(served_by(&answer).as_deref(), Some("b"), "submit {n}");
        assert_eq!(attempts_of(&answer), Some(2), "submit {n}: one refused");
        if h.app
            .outages()
            .is_down(Provider::CaptchaAi, tokio::time::Instant::now())
        {
            seen_within = Some(n);
            break;
        }
    }
    let seen_within = seen_within.expect("the outage is seen within 10 submits");
    assert!(
        (3..=4).contains(&seen_within),
        "seen after {seen_within} submits"
    );
    let metrics = h.metrics().await;
    assert_eq!(errors_at(&metrics, "captchaai"), f64::from(seen_within));
    assert_eq!(
        metric(&metrics, "keyrelay_provider_up{provider=\"captchaai\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric(&metrics, "keyrelay_provider_up{provider=\"2captcha\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_provider_outages_total{provider=\"captchaai\"}"
        ),
        Some(1.0)
    );
    let status = h.get("/status").await.json();
    assert_eq!(status["providers"][0]["provider"], "captchaai");
    assert_eq!(status["providers"][0]["state"], "down");
    assert_eq!(status["providers"][1]["state"], "up");

    // From then on no attempt goes to the dead provider: each submit's first attempt
    // lands on 2captcha.
    let failed_before = errors_at(&metrics, "captchaai");
    for n in 0..10 {
        let id = h.submit().await;
        assert_eq!(
            twocaptcha.task_owner(id).as_deref(),
            Some(KEY_B),
            "after: {n}"
        );
    }
    let metrics = h.metrics().await;
    assert_eq!(errors_at(&metrics, "captchaai"), failed_before);
    assert_eq!(errors_at(&metrics, "2captcha"), 0.0);
    for name in ["a", "c"] {
        assert_eq!(h.state_of(name), (StateKind::Active, None), "{name}");
    }

    // Back: a refresh's answer brings the provider back before its cooldown ends, new
    // tasks go to the primary tier again, and the task made before is polled with the key
    // that made it.
    h.sim.come_back().await.expect("the same port again");
    let a = h.app.snapshot().pool.keys()[0].clone();
    keyrelay::refresh::refresh_key(&h.app, &a, Duration::from_secs(5)).await;
    assert!(
        !h.app
            .outages()
            .view(Provider::CaptchaAi, tokio::time::Instant::now())
            .out
    );
    let id = h.submit().await;
    assert!(
        h.sim.task_owner(id).is_some(),
        "new tasks go to CaptchaAI again"
    );
    let poll = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&id={before}&json=1"
        ))
        .await;
    let expected = if creator == KEY_A { "a" } else { "c" };
    assert_eq!(
        served_by(&poll).as_deref(),
        Some(expected),
        "{}",
        poll.text()
    );
    assert_ne!(poll.json()["request"], "ERROR_WRONG_CAPTCHA_ID");
    let metrics = h.metrics().await;
    assert_eq!(
        metric(&metrics, "keyrelay_provider_up{provider=\"captchaai\"}"),
        Some(1.0)
    );
    twocaptcha.shutdown().await;
    h.stop().await;
}

#[tokio::test]
async fn a_host_serving_two_providers_that_refuses_costs_a_submit_one_attempt_not_one_per_key() {
    // One host:port serves CaptchaAI at its root and 2captcha under /2captcha (as
    // `keyrelay simulate --provider 2captcha` does), and refuses connections; another
    // 2captcha host answers. a and b are picked first.
    let (_refusing, port) = refusing_port();
    let live = Simulator::new()
        .provider(Provider::TwoCaptcha)
        .key(SimKey {
            threads: 1000,
            ..SimKey::valid(KEY_C)
        })
        .spawn()
        .await
        .expect("simulator starts");
    let behind = |name, value, provider, url: String| {
        let mut k = key(name, value, 10_000.0, &Upstream::parse(&url).unwrap());
        k.provider = provider;
        k
    };
    let mut config = config_for(&live, &[]);
    config.keys = vec![
        behind("a", KEY_A, Provider::CaptchaAi, format!("http://{port}")),
        behind(
            "b",
            KEY_B,
            Provider::TwoCaptcha,
            format!("http://{port}/2captcha"),
        ),
        key_at("c", KEY_C, 1.0, Provider::TwoCaptcha, &live),
    ];
    config.failover.transient_cooldown = Duration::from_secs(3600);
    let h = Harness::start_without_refresh_wait(live, config).await;
    h.wait_for_refresh_of(&["c"]).await;

    let mut refused = 0;
    for n in 1..=8 {
        let answer = h.get(&submit_path()).await;
        assert_eq!(served_by(&answer).as_deref(), Some("c"), "submit {n}");
        let attempts = attempts_of(&answer).expect("a relayed answer says its attempts");
        assert!(
            (1..=2).contains(&attempts),
            "submit {n}: {attempts} attempts"
        );
        refused += attempts - 1;
    }
    // Each refusal still counts as before: against CaptchaAI, whose only key a is, until it
    // is down after three (its key then ranks last); and against b, whose provider answers
    // through c, until b is cooled after three. Then no submit meets the host at all.
    assert_eq!(refused, 6);
    let metrics = h.metrics().await;
    assert_eq!(errors_at(&metrics, "captchaai"), 3.0);
    assert_eq!(errors_at(&metrics, "2captcha"), 3.0);
    let now = tokio::time::Instant::now();
    assert!(h.app.outages().is_down(Provider::CaptchaAi, now));
    assert!(!h.app.outages().is_down(Provider::TwoCaptcha, now));
    assert_eq!(h.state_of("a"), (StateKind::Active, None));
    assert_eq!(h.state_of("b"), (StateKind::Cooling, Some("transient")));
    h.stop().await;
}

#[tokio::test]
async fn a_down_provider_is_tried_again_after_its_cooldown_and_its_first_answer_brings_it_back() {
    // The cooldown ends without a refresh: the provider is on probation, its keys are
    // tried again, and the first answer brings it back.
    let (h, twocaptcha) = captchaai_first_2captcha_backup(Duration::from_millis(500)).await;
    let view = take_captchaai_down(&h).await;
    let until = view.until.expect("down, until a deadline");
    h.sim.come_back().await.expect("the same port again");
    let mut landed = None;
    for _ in 0..200 {
        let id = h.submit().await;
        if h.sim.task_owner(id).is_some() {
            landed = Some(tokio::time::Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let landed = landed.expect("CaptchaAI takes tasks again after its cooldown");
    assert!(landed >= until, "not before the cooldown ended");
    assert!(!h.app.outages().view(Provider::CaptchaAi, landed).out);
    twocaptcha.shutdown().await;
    h.stop().await;
}

#[tokio::test]
async fn a_down_provider_that_recovers_is_found_by_keyrelays_own_probe_long_before_its_cooldown() {
    // An hour's cooldown and no refresh due for minutes: only keyrelay's own probe can
    // bring the provider back, and it must, soon after the provider answers again.
    let (h, twocaptcha) = captchaai_first_2captcha_backup(Duration::from_secs(3600)).await;
    let view = take_captchaai_down(&h).await;
    assert!(view.out, "the outage is seen");
    let asked_before = h.sim.received().len();
    h.sim.come_back().await.expect("the same port again");

    eventually("the probe brings CaptchaAI back", || {
        !h.app
            .outages()
            .view(Provider::CaptchaAi, tokio::time::Instant::now())
            .out
    })
    .await;
    let probes: Vec<_> = h.sim.received()[asked_before..]
        .iter()
        .map(|r| (r.key.clone(), r.action.clone()))
        .collect();
    assert!(
        probes
            .iter()
            .any(|(k, a)| matches!(k.as_deref(), Some(KEY_A | KEY_C))
                && a.as_deref() == Some("getbalance")),
        "a getbalance with a CaptchaAI key: {probes:?}"
    );
    let id = h.submit().await;
    assert!(
        h.sim.task_owner(id).is_some(),
        "new tasks go to CaptchaAI again"
    );
    for name in ["a", "c"] {
        assert_eq!(h.state_of(name), (StateKind::Active, None), "{name}");
    }
    twocaptcha.shutdown().await;
    h.stop().await;
}

#[tokio::test]
async fn polls_reports_and_ids_lists_reach_the_provider_that_holds_each_task() {
    let captchaai = sim_of(Provider::CaptchaAi, &[KEY_A]).await;
    let twocaptcha = sim_of(Provider::TwoCaptcha, &[KEY_B]).await;
    let mut config = config_for(&captchaai, &[]);
    config.keys = vec![
        key_at("a", KEY_A, 1.0, Provider::CaptchaAi, &captchaai),
        key_at("b", KEY_B, 1.0, Provider::TwoCaptcha, &twocaptcha),
    ];
    let h = Harness::start(captchaai, config).await;
    let (mut at_a, mut at_b) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        if at_a.len() >= 2 && at_b.len() >= 2 {
            break;
        }
        let id = h.submit().await;
        match (h.sim.task_owner(id), twocaptcha.task_owner(id)) {
            (Some(_), None) => at_a.push(id),
            (None, Some(_)) => at_b.push(id),
            other => panic!("task {id} at {other:?}"),
        }
    }
    assert!(at_a.len() >= 2 && at_b.len() >= 2, "{at_a:?} {at_b:?}");
    let sent_to = |sim: &SimHandle, id: u64, action: &str| {
        sim.received().iter().any(|r| {
            r.action.as_deref() == Some(action)
                && r.params.iter().any(|(k, v)| {
                    (k == "id" || k == "ids") && v.split(',').any(|x| x == id.to_string())
                })
        })
    };
    // One list of both providers' tasks, in an order that interleaves them.
    let ids = [at_a[0], at_b[0], at_a[1], at_b[1]];
    let list = ids.map(|id| id.to_string()).join(",");
    let answer = h
        .get(&format!("/res.php?key={CALLER_KEY}&action=get&ids={list}"))
        .await;
    let parts: Vec<String> = answer.text().split('|').map(str::to_owned).collect();
    assert_eq!(
        parts.len(),
        4,
        "one answer per id, in order: {}",
        answer.text()
    );
    assert!(
        parts.iter().all(|p| p != "ERROR_WRONG_CAPTCHA_ID"),
        "{}",
        answer.text()
    );
    for id in ids {
        let (own, other) = if at_a.contains(&id) {
            (&h.sim, &twocaptcha)
        } else {
            (&twocaptcha, &h.sim)
        };
        assert!(sent_to(own, id, "get"), "{id} listed at its provider");
        assert!(!sent_to(other, id, "get"), "{id} never listed at the other");
        // Polled one by one until solved, and reported, each at its own provider.
        for _ in 0..5 {
            let poll = h
                .get(&format!(
                    "/res.php?key={CALLER_KEY}&action=get&id={id}&json=1"
                ))
                .await;
            let expected = if at_a.contains(&id) { "a" } else { "b" };
            assert_eq!(served_by(&poll).as_deref(), Some(expected), "{id}");
            if poll.json()["status"] == 1 {
                break;
            }
        }
        let report = h
            .get(&format!(
                "/res.php?key={CALLER_KEY}&action=reportbad&id={id}"
            ))
            .await;
        assert_eq!(report.text(), "OK_REPORT_RECORDED", "{id}");
        assert!(sent_to(own, id, "reportbad"));
        assert!(!sent_to(other, id, "reportbad"));
    }
    twocaptcha.shutdown().await;
    h.stop().await;
}

#[tokio::test]
async fn threadsinfo_counts_the_providers_that_have_threads() {
    let captchaai = sim_of(Provider::CaptchaAi, &[KEY_A]).await;
    let twocaptcha = sim_of(Provider::TwoCaptcha, &[KEY_B, KEY_C]).await;
    let mut config = config_for(&captchaai, &[]);
    let mut sized = key_at("c", KEY_C, 1.0, Provider::TwoCaptcha, &twocaptcha);
    sized.threads = Some(3);
    config.keys = vec![
        key_at("a", KEY_A, 1.0, Provider::CaptchaAi, &captchaai),
        key_at("b", KEY_B, 1.0, Provider::TwoCaptcha, &twocaptcha),
        sized,
    ];
    let h = Harness::start(captchaai, config).await;
    let json = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=threadsinfo&json=1"
        ))
        .await
        .json();
    // a's plan (5, from its threadsinfo) and c's configured 3; b, pay per task, not at all.
    assert_eq!(json["threads"], 8, "{json}");
    assert_eq!(json["free_threads"], 8, "{json}");
    h.stop().await;

    // A pool of pay-per-task keys alone still answers threads, never "no plan".
    let alone = sim_of(Provider::TwoCaptcha, &[KEY_B]).await;
    let mut config = config_for(&alone, &[]);
    config.keys = vec![key_at("b", KEY_B, 1.0, Provider::TwoCaptcha, &alone)];
    let h = Harness::start(alone, config).await;
    let json = h
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=threadsinfo&json=1"
        ))
        .await
        .json();
    assert_eq!(
        (json["threads"].as_u64(), json["free_threads"].as_u64()),
        (Some(1), Some(1)),
        "{json}"
    );
    twocaptcha.shutdown().await;
    h.stop().await;
}
