//! `upstream_proxy`: keyrelay's own upstream connections go through an HTTP proxy's
//! `CONNECT` tunnels, with the URL's credentials as `Proxy-Authorization`. Submits, polls
//! and the balance refresh all take the tunnel; a proxy that asks for credentials, refuses
//! or is down gets the caller a well-formed answer in its format, benches no key, and never
//! puts the proxy's password in an answer, a metric or `/status`.

mod common;

use common::connect_proxy::{ConnectProxy, Mode};
use common::{config_for, sim_with, Harness, CALLER_KEY, KEY_A, KEY_B};
use keyrelay::config::UpstreamProxy;
use keyrelay::health::StateKind;

/// `Basic base64("relay:pa55-w0rd")`.
const GOOD_AUTH: &str = "Basic cmVsYXk6cGE1NS13MHJk";
const PASSWORD: &str = "pa55-w0rd";

/// keyrelay with keys a and b in front of a simulator, dialling through `proxy`.
async fn through(proxy: &str, wait_for_refresh: bool) -> Harness {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.upstream_proxy = Some(UpstreamProxy::parse(proxy).expect("a valid proxy URL"));
    if wait_for_refresh {
        Harness::start(sim, config).await
    } else {
        Harness::start_without_refresh_wait(sim, config).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submits_polls_and_refreshes_go_through_the_proxy_with_its_credentials() {
    let proxy = ConnectProxy::start(Mode::Tunnel {
        require: Some(GOOD_AUTH.to_owned()),
    })
    .await;
    // The startup refresh (balance and threads of both keys) already needs the tunnel.
    let harness = through(&proxy.url(Some(&format!("relay:{PASSWORD}"))), true).await;
    let sim_addr = harness.sim.addr().to_string();

    let id = harness.submit().await;
    let owner = harness
        .sim
        .task_owner(id)
        .expect("the simulator made the task");
    assert_ne!(owner, CALLER_KEY);
    let poll = harness
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&id={id}&json=1"
        ))
        .await;
    assert_eq!(poll.status, 200);
    assert!(
        poll.text().contains("CAPCHA_NOT_READY") || poll.json()["status"] == 1,
        "{}",
        poll.text()
    );
    for received in harness.sim.received() {
        assert!(!received.query.contains(CALLER_KEY), "{}", received.query);
    }

    let seen = proxy.seen();
    assert!(!seen.is_empty(), "no CONNECT reached the proxy");
    for connect in &seen {
        assert_eq!(connect.target, sim_addr, "{connect:?}");
        assert_eq!(connect.host.as_deref(), Some(sim_addr.as_str()));
        assert_eq!(connect.auth.as_deref(), Some(GOOD_AUTH), "{connect:?}");
    }
    // Connections are pooled: far fewer tunnels than requests went through.
    let requests = harness.sim.received().len();
    assert!(
        seen.len() <= requests,
        "{} tunnels, {requests} requests",
        seen.len()
    );
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_without_credentials_in_the_url_is_sent_none() {
    let proxy = ConnectProxy::start(Mode::Tunnel { require: None }).await;
    let harness = through(&proxy.url(None), true).await;
    harness.submit().await;
    let seen = proxy.seen();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|c| c.auth.is_none()), "{seen:?}");
    harness.stop().await;
}

/// Every way the tunnel can fail: credentials refused (407), the target forbidden (403),
/// a proxy that answers 502, and no proxy listening at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_that_fails_gets_a_well_formed_answer_and_benches_no_key() {
    let wrong_password = ConnectProxy::start(Mode::Tunnel {
        require: Some("Basic c29tZW9uZTplbHNl".to_owned()),
    })
    .await;
    let forbidden = ConnectProxy::start(Mode::Refuse(403)).await;
    let bad_gateway = ConnectProxy::start(Mode::Refuse(502)).await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://relay:{PASSWORD}@{}", listener.local_addr().unwrap());
        drop(listener);
        url
    };
    let userinfo = format!("relay:{PASSWORD}");
    let cases = [
        ("407", wrong_password.url(Some(&userinfo))),
        ("403", forbidden.url(Some(&userinfo))),
        ("502", bad_gateway.url(Some(&userinfo))),
        ("closed port", closed),
    ];
    for (case, url) in cases {
        let harness = through(&url, false).await;
        let submit = format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=https://x.test"
        );
        let plain = harness.get(&submit).await;
        assert_eq!(plain.status, 200, "{case}");
        assert!(
            plain.text().starts_with("ERROR_"),
            "{case}: {}",
            plain.text()
        );
        let json = harness.get(&format!("{submit}&json=1")).await;
        assert_eq!(json.json()["status"], 0, "{case}: {}", json.text());
        assert!(
            json.json()["request"]
                .as_str()
                .unwrap()
                .starts_with("ERROR_"),
            "{case}: {}",
            json.text()
        );
        let status = harness.get("/status").await.text();
        let metrics = harness.metrics().await;
        for (what, text) in [
            ("plain", plain.text()),
            ("json", json.text()),
            ("status", status),
            ("metrics", metrics),
        ] {
            assert!(
                !text.contains(PASSWORD),
                "{case}: {what} shows the password"
            );
        }
        for name in ["a", "b"] {
            let (state, _) = harness.state_of(name);
            assert_ne!(state, StateKind::Benched, "{case}: {name}");
        }
        assert!(
            harness.sim.received().is_empty(),
            "{case}: nothing may reach the upstream past a failed tunnel"
        );
        harness.stop().await;
    }
    assert!(!wrong_password.seen().is_empty() && !forbidden.seen().is_empty());
}

/// The upstream's host in `upstream_no_proxy` is dialled directly: submits, polls and the
/// refresh all work although the proxy would refuse them, and it sees none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_in_upstream_no_proxy_is_dialled_directly() {
    let proxy = ConnectProxy::start(Mode::Refuse(403)).await;
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    let parsed = UpstreamProxy::parse(&proxy.url(None)).unwrap();
    config.upstream_proxy = Some(parsed.bypassing(&["127.0.0.1"]).unwrap());
    // The startup refresh must succeed for this to return.
    let harness = Harness::start(sim, config).await;
    let id = harness.submit().await;
    assert!(harness.sim.task_owner(id).is_some());
    assert!(proxy.seen().is_empty(), "{:?}", proxy.seen());
    harness.stop().await;
}
