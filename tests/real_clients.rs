//! The real, unchanged client libraries through keyrelay's forward-proxy mode: with only
//! `HTTPS_PROXY` pointing at keyrelay and its CA trusted, `2captcha-python` (default
//! server `2captcha.com`, requests) and the official `captchaai` SDK (default base URL
//! `https://ocr.captchaai.com`, httpx) each solve a multipart image task and a token task
//! against the simulator, and no caller key reaches it; and `curl -x` reaches the pool for
//! an https URL (an intercepted CONNECT) and an http one (absolute form).
//!
//! Needs a Python with both packages: `KEYRELAY_TEST_PYTHON`, else `python3`. `.ci/run`
//! makes one (a venv with pinned versions); elsewhere the test skips when the packages are
//! missing, unless `CI` is set.

mod common;

use std::process::Command;

use common::python::{python_with, run_script, PNG};
use common::*;

async fn solves_through_the_forward_proxy(script: &str) {
    let Some(python) = python_with("KEYRELAY_TEST_PYTHON", &["twocaptcha", "captchaai"]) else {
        return;
    };
    let sim = keyrelay::sim::Simulator::new()
        .key(keyrelay::sim::SimKey::valid(KEY_A))
        .key(keyrelay::sim::SimKey::valid(KEY_B))
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
    let (ca, image) = (ca.to_str().unwrap(), image.to_str().unwrap());
    let env = [
        ("CALLER_KEY", CALLER_KEY),
        ("HTTPS_PROXY", proxy.as_str()),
        ("https_proxy", proxy.as_str()),
        ("REQUESTS_CA_BUNDLE", ca),
        ("SSL_CERT_FILE", ca),
    ];
    let solved = run_script(&python, script, &[image], &env).await;
    let kinds: Vec<&str> = solved.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["normal", "token"], "{solved:?}");
    for s in &solved {
        assert!(!s["code"].as_str().unwrap_or_default().is_empty(), "{s}");
    }
    let received = h.sim.received();
    let submits: Vec<_> = received.iter().filter(|r| r.path == "/in.php").collect();
    assert_eq!(submits.len(), 2, "one submit per task");
    // The image went up as the client sent it (a multipart `file` part, or base64).
    assert!(
        received.iter().any(|r| r.path == "/res.php"),
        "polled through the pool"
    );
    for r in &received {
        let seen = format!("{} {}", r.query, String::from_utf8_lossy(&r.body));
        assert!(
            !seen.contains(CALLER_KEY),
            "the caller's key reached the upstream: {seen}"
        );
    }
    assert_connects_intercepted(&h).await;
    h.stop().await;
}

#[tokio::test]
async fn twocaptcha_python_with_its_default_server_solves_through_https_proxy() {
    solves_through_the_forward_proxy("twocaptcha_via_proxy.py").await;
}

#[tokio::test]
async fn the_captchaai_sdk_with_its_default_base_url_solves_through_https_proxy() {
    solves_through_the_forward_proxy("captchaai_via_proxy.py").await;
}

/// `curl -x` with keyrelay as its proxy, for an https URL (CONNECT, intercepted) and an
/// http one (absolute form): both answered from the pool. `.ci/run` installs curl.
#[tokio::test]
async fn curl_through_the_proxy_reaches_the_pool_for_http_and_https() {
    let found = Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but curl is missing"
        );
        eprintln!("skipped: no curl");
        return;
    }
    let h = Harness::three_keys().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, h.app.ca().expect("the local CA").cert_pem()).unwrap();
    let proxy = format!("http://{}", h.addr);
    for url in [
        format!("https://ocr.captchaai.com/res.php?key={CALLER_KEY}&action=getbalance"),
        format!("http://ocr.captchaai.com/res.php?key={CALLER_KEY}&action=getbalance"),
    ] {
        let mut command = Command::new("curl");
        command
            .args([
                "--silent",
                "--show-error",
                "--max-time",
                "20",
                "--noproxy",
                "",
            ])
            .arg("-x")
            .arg(&proxy)
            .arg("--cacert")
            .arg(&ca)
            .arg(&url)
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy");
        let out = tokio::task::spawn_blocking(move || command.output())
            .await
            .unwrap()
            .expect("curl runs");
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The pool's balance: the sum of the simulator's keys, as keyrelay answers it.
        assert!(body.parse::<f64>().is_ok_and(|b| b > 0.0), "{url}: {body}");
    }
    for r in h.sim.received() {
        assert!(
            !r.query.contains(CALLER_KEY),
            "the caller's key went upstream"
        );
    }
    h.stop().await;
}
