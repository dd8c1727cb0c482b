//! No key value, pool or caller, appears in logs, metrics or answers: the real binary runs
//! at debug level against the simulator, through success and failure paths, and everything
//! it printed or answered is scanned.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::sim::{SimKey, SimKeyState, Simulator};

const DEAD_KEY: &str = "deaddeaddeaddeaddeaddeaddead0005";

#[tokio::test]
async fn no_key_appears_in_logs_metrics_or_answers() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .key(SimKey::valid(KEY_B))
        .key(SimKey {
            state: SimKeyState::Unknown,
            ..SimKey::valid(DEAD_KEY)
        })
        .spawn()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            r#"
listen = "127.0.0.1:0"
upstream = "{}"
refresh_interval = "1h"
keys_env = "KEYRELAY_TEST_EXTRA_KEYS"

[[keys]]
name = "alpha"
key = "{KEY_A}"

[[keys]]
key = "${{KEYRELAY_TEST_KEY_B}}"

[failover]
backoff_base = "1ms"
backoff_max = "2ms"
"#,
            sim.url()
        ),
    )
    .unwrap();
    let mut proxy = Binary::spawn(
        &["--config", config.to_str().unwrap(), "--log", "debug"],
        &[
            ("KEYRELAY_TEST_KEY_B", KEY_B),
            ("KEYRELAY_TEST_EXTRA_KEYS", DEAD_KEY),
        ],
    );
    let addr = proxy.wait_for_addr();
    let base = format!("http://{addr}");
    let client = reqwest_like::Client::new();
    let mut answers = String::new();
    // Wait for the startup refresh to bench the dead key, so its rejection is in the logs.
    for _ in 0..500 {
        let metrics = client.get(&format!("{base}/metrics")).await;
        if metrics.contains("keyrelay_key_up{key=\"deaddead\"} 0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for path in [
        format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"),
        format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"),
        format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&pageurl=p&json=1"),
        format!("/res.php?key={CALLER_KEY}&action=get&id=1&json=1"),
        format!("/res.php?key={CALLER_KEY}&action=getbalance"),
        format!("/res.php?key={CALLER_KEY}&action=threadsinfo"),
        format!("/res.php?key={CALLER_KEY}&action=bogus"),
        format!("/res.php?key={CALLER_KEY}"),
        "/metrics".to_owned(),
        "/nope".to_owned(),
    ] {
        answers.push_str(&client.get(&format!("{base}{path}")).await);
    }
    let submitted = client
        .get(&format!(
            "{base}/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"
        ))
        .await;
    let id: serde_json::Value = serde_json::from_str(&submitted).unwrap();
    answers.push_str(
        &client
            .get(&format!(
                "{base}/res.php?action=get&id={}&json=1",
                id["request"]
            ))
            .await,
    );
    answers.push_str(
        &client
            .post(
                &format!("{base}/in.php?json=1"),
                "application/json",
                format!(r#"{{"key":"{CALLER_KEY}","method":"base64""#),
            )
            .await,
    );
    sim.set_state(KEY_A, SimKeyState::IpNotAllowed);
    sim.set_state(KEY_B, SimKeyState::Unknown);
    answers.push_str(
        &client
            .get(&format!(
                "{base}/in.php?key={CALLER_KEY}&method=base64&body=QQ"
            ))
            .await,
    );
    let metrics = client.get(&format!("{base}/metrics")).await;

    let logs = proxy.stop();

    // Each key state change is one line with the key, both states and the reason.
    let change = logs
        .lines()
        .find(|l| l.contains("key state changed") && l.contains("key=deaddead"))
        .unwrap_or_else(|| panic!("no state change logged for the dead key:\n{logs}"));
    for field in [
        "WARN",
        "from=\"active\"",
        "to=\"benched\"",
        "reason=\"ERROR_KEY_DOES_NOT_EXIST\"",
    ] {
        assert!(change.contains(field), "{field} missing from: {change}");
    }
    assert!(metrics.contains("keyrelay_key_up{key=\"alpha\"}"));
    for secret in [KEY_A, KEY_B, DEAD_KEY, CALLER_KEY] {
        for (what, text) in [
            ("logs", &logs),
            ("metrics", &metrics),
            ("answers", &answers),
        ] {
            assert!(!text.contains(secret), "a key appears in {what}:\n{text}");
            // Not even most of it.
            assert!(
                !text.contains(&secret[..16]),
                "a key prefix appears in {what}:\n{text}"
            );
        }
    }
}

/// Just enough of an HTTP client for this test, on hyper-util.
mod reqwest_like {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::Request;
    use hyper_util::client::legacy::{connect::HttpConnector, Client as Inner};
    use hyper_util::rt::TokioExecutor;

    pub struct Client(Inner<HttpConnector, Full<Bytes>>);

    impl Client {
        pub fn new() -> Client {
            Client(Inner::builder(TokioExecutor::new()).build_http())
        }

        pub async fn get(&self, url: &str) -> String {
            let response = self.0.get(url.parse().unwrap()).await.unwrap();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8_lossy(&body).into_owned()
        }

        pub async fn post(&self, url: &str, content_type: &str, body: String) -> String {
            let request = Request::post(url)
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let response = self.0.request(request).await.unwrap();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8_lossy(&body).into_owned()
        }
    }
}

/// The `upstream_proxy` password, from the environment, stays out of the logs (debug level),
/// `/status`, metrics and answers, through a working tunnel and through one the proxy refuses;
/// the start-up line names the proxy masked.
#[tokio::test]
async fn no_upstream_proxy_password_appears_in_logs_status_metrics_or_answers() {
    use common::connect_proxy::{ConnectProxy, Mode};
    const PROXY_PASSWORD: &str = "proxy-pw-Zq81x";
    let sim = sim_with(&[KEY_A]).await;
    let working = ConnectProxy::start(Mode::Tunnel { require: None }).await;
    let refusing = ConnectProxy::start(Mode::Refuse(407)).await;
    for (case, proxy) in [("working", &working), ("refusing", &refusing)] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("proxy.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\nupstream_proxy = \"http://relay:${{KR_TEST_PROXY_PW}}@{}\"\n[[keys]]\nname = \"alpha\"\nkey = \"{KEY_A}\"\n[failover]\nbackoff_base = \"1ms\"\nbackoff_max = \"2ms\"\n",
                sim.url(),
                proxy.addr
            ),
        )
        .unwrap();
        let mut binary = Binary::spawn(
            &["--config", config.to_str().unwrap(), "--log", "debug"],
            &[("KR_TEST_PROXY_PW", PROXY_PASSWORD)],
        );
        let addr = binary.wait_for_addr();
        let base = format!("http://{addr}");
        let client = reqwest_like::Client::new();
        let mut answers = String::new();
        for path in [
            format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p&json=1"),
            format!("/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=p"),
            format!("/res.php?key={CALLER_KEY}&action=getbalance"),
            "/status".to_owned(),
            "/metrics".to_owned(),
        ] {
            answers.push_str(&client.get(&format!("{base}{path}")).await);
        }
        let logs = binary.stop();
        assert!(!proxy.seen().is_empty(), "{case}: the proxy was not used");
        let listening = logs
            .lines()
            .find(|l| l.contains("keyrelay listening"))
            .unwrap_or_else(|| panic!("{case}: no start-up line:\n{logs}"));
        assert!(
            listening.contains(&format!("via=http://***@{}", proxy.addr)),
            "{listening}"
        );
        if case == "refusing" {
            assert!(logs.contains("proxy authorization required"), "{logs}");
        }
        for (what, text) in [("logs", &logs), ("answers", &answers)] {
            assert!(
                !text.contains(PROXY_PASSWORD),
                "{case}: the proxy password is in the {what}"
            );
        }
    }
}
