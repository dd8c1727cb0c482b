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

use std::path::Path;
use std::process::Command;

use common::*;

/// A 1×1 PNG: what the scripts upload as the image task.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0d, 0x0a, 0x2d, 0xb4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae,
    0x42, 0x60, 0x82,
];

fn python() -> Option<String> {
    let python = std::env::var("KEYRELAY_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let found = Command::new(&python)
        .args(["-c", "import twocaptcha, captchaai"])
        .output()
        .is_ok_and(|out| out.status.success());
    if found {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but {python} cannot import twocaptcha and captchaai (.ci/run installs them)"
    );
    eprintln!(
        "skipped: {python} has no twocaptcha / captchaai (pip install 2captcha-python captchaai)"
    );
    None
}

/// Runs `script` with only the proxy and CA variables set for it; its JSON lines.
async fn run(
    python: &str,
    script: &str,
    proxy: &str,
    ca: &Path,
    image: &Path,
) -> Vec<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let mut command = Command::new(python);
    command
        .arg(&script)
        .arg(image)
        .env("CALLER_KEY", CALLER_KEY)
        .env("HTTPS_PROXY", proxy)
        .env("https_proxy", proxy)
        .env("REQUESTS_CA_BUNDLE", ca)
        .env("SSL_CERT_FILE", ca)
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's thread")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

async fn solves_through_the_forward_proxy(script: &str) {
    let Some(python) = python() else {
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

    let solved = run(&python, script, &format!("http://{}", h.addr), &ca, &image).await;
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
    let metrics = h.metrics().await;
    let intercepted = metric(
        &metrics,
        "keyrelay_forward_requests_total{outcome=\"intercepted\"}",
    );
    assert!(
        intercepted.is_some_and(|n| n >= 1.0),
        "the CONNECTs were intercepted: {intercepted:?}"
    );
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
