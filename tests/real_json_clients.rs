//! The real, unchanged clients of the JSON task API (issue 39) through keyrelay's forward
//! proxy, against the simulator: `anticaptchaofficial` and `python3-capsolver` with only
//! `HTTPS_PROXY` (and the CA) set, `capmonstercloudclient` through its own proxy option
//! (its aiohttp ignores `HTTPS_PROXY`). Each solves an image task and a reCAPTCHA v2 task,
//! reads the balance, and reads an unsolvable task's error; no caller key reaches the
//! service. Needs a Python with the three packages: `KEYRELAY_TEST_JSON_PYTHON`, else
//! `python3` (`.ci/run` pins them in a venv of their own).

mod common;

use common::python::{python_with, run_script, PNG};
use common::*;
use keyrelay::sim::{FaultKind, FaultTarget, SimKey, Simulator};

const MODULES: &[&str] = &[
    "anticaptchaofficial",
    "capmonstercloudclient",
    "python3_capsolver",
];

async fn solves_and_reads_errors(script: &str) {
    let Some(python) = python_with("KEYRELAY_TEST_JSON_PYTHON", MODULES) else {
        return;
    };
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B))
        .polls_to_ready(1)
        .spawn()
        .await
        .expect("simulator");
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    // As users run it: polls shaped by the default [polling], so each client's own
    // cadence meets keyrelay's "not yet" before the solution.
    config.polling = keyrelay::config::Polling::default();
    let h = Harness::start(sim, config).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, h.app.ca().expect("the local CA").cert_pem()).unwrap();
    let image = dir.path().join("captcha.png");
    std::fs::write(&image, PNG).unwrap();
    let proxy = format!("http://{}", h.addr);
    let port = h.addr.port().to_string();
    let (ca, image) = (ca.to_str().unwrap(), image.to_str().unwrap());
    let env = [
        ("CALLER_KEY", CALLER_KEY),
        ("HTTPS_PROXY", proxy.as_str()),
        ("https_proxy", proxy.as_str()),
        ("REQUESTS_CA_BUNDLE", ca),
        ("SSL_CERT_FILE", ca),
        ("KEYRELAY_PROXY_PORT", port.as_str()),
    ];

    let solved = run_script(&python, script, &["solve", image], &env).await;
    let kinds: Vec<&str> = solved.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["image", "token", "balance"], "{solved:?}");
    for s in &solved[..2] {
        let code = s["code"].as_str().unwrap_or_default();
        assert!(code.starts_with("tok-"), "the simulator's answer: {s}");
    }
    let balance = &solved[2]["balance"];
    let balance = balance.as_f64().or_else(|| balance["balance"].as_f64());
    assert_eq!(balance, Some(20.0), "two keys of 10: {}", solved[2]);
    let received = h.sim.received();
    let methods: Vec<_> = received
        .iter()
        .filter(|r| r.path == "/in.php")
        .filter_map(|r| r.params.iter().find(|(n, _)| n == "method"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(methods, ["base64", "userrecaptcha"], "one submit per task");
    for r in &received {
        let seen = format!("{} {}", r.query, String::from_utf8_lossy(&r.body));
        assert!(
            !seen.contains(CALLER_KEY),
            "the caller's key reached the upstream: {seen}"
        );
    }

    h.sim.add_fault(
        "*",
        fault(
            FaultTarget::Poll,
            FaultKind::Code("ERROR_CAPTCHA_UNSOLVABLE".into()),
            None,
        ),
    );
    let failed = run_script(&python, script, &["unsolvable", image], &env).await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    let code = failed[0]["code"].as_str().unwrap_or_default();
    assert!(code.contains("ERROR_CAPTCHA_UNSOLVABLE"), "{}", failed[0]);
    // keyrelay's description, not one the client made up after giving up on its own.
    assert!(
        failed[0]
            .to_string()
            .contains("the service answered ERROR_CAPTCHA_UNSOLVABLE"),
        "the client read keyrelay's error: {}",
        failed[0]
    );
    assert_connects_intercepted(&h).await;
    h.stop().await;
}

#[tokio::test]
async fn anticaptchaofficial_with_its_own_host_solves_through_https_proxy() {
    solves_and_reads_errors("anticaptcha_via_proxy.py").await;
}

#[tokio::test]
async fn python3_capsolver_with_its_own_host_solves_through_https_proxy() {
    solves_and_reads_errors("capsolver_via_proxy.py").await;
}

#[tokio::test]
async fn capmonstercloudclient_solves_through_its_proxy_option() {
    solves_and_reads_errors("capmonster_via_proxy.py").await;
}
