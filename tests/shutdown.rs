//! Shutdown: SIGTERM and Ctrl-C stop accepting, let requests in flight finish within the
//! drain timeout, and exit 0.

mod common;

use std::time::Duration;

use common::*;
use keyrelay::sim::{FaultKind, FaultTarget};

#[tokio::test]
async fn a_slow_poll_in_flight_finishes_while_shutdown_is_under_way() {
    let sim = sim_with(&[KEY_A]).await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    let h = Harness::start(sim, config).await;
    let id = h.submit().await;
    h.sim.add_fault(
        KEY_A,
        fault(
            FaultTarget::Poll,
            FaultKind::Delay(Duration::from_millis(500)),
            Some(1),
        ),
    );
    let client = h.client.clone();
    let url = h.url(&format!("/res.php?action=get&id={id}&json=1"));
    let poll = tokio::spawn(async move {
        let response = client.get(url.parse().unwrap()).await.expect("answered");
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("whole body")
            .to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    });
    // The poll is in flight once the simulator has it (it then waits 500 ms to answer).
    let sim = h.sim.clone();
    eventually("the poll reached the upstream", || {
        sim.received()
            .iter()
            .any(|r| r.action.as_deref() == Some("get"))
    })
    .await;
    let addr = h.addr;
    h.stop().await;
    assert_eq!(
        poll.await.unwrap(),
        r#"{"status":0,"request":"CAPCHA_NOT_READY"}"#,
        "the poll in flight got its real answer"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn sigterm_and_sigint_exit_zero() {
    let sim = sim_with(&[KEY_A]).await;
    for signal in ["-TERM", "-INT"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.toml");
        std::fs::write(
            &path,
            format!(
                "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\n[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n",
                sim.url()
            ),
        )
        .unwrap();
        let mut proxy = Binary::spawn(&["--config", path.to_str().unwrap()], &[]);
        proxy.wait_for_addr();
        let sent = std::process::Command::new("kill")
            .args([signal, &proxy.pid().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        proxy.wait_for_line("the drain", |l| l.contains("drained"));
        let status = proxy.wait_exit(Duration::from_secs(20));
        assert_eq!(status.code(), Some(0), "{signal}");
    }
}
