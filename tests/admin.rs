//! Operator holds and the admin API end to end, against the simulator: a disabled or
//! draining key takes no new task but its pinned tasks are still polled with it; holds last
//! through refreshes and reloads; `/admin/` lists, holds and refreshes keys, behind its
//! token or on loopback only; `[admin] listen` takes the operator endpoints off the proxy's
//! listeners.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{metric, Harness, CALLER_KEY, KEY_A, KEY_B, KEY_C};
use http_body_util::{BodyExt, Full};
use hyper::header::{ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrelay::config::Config;
use keyrelay::pool::{AdminHold, HoldError};
use keyrelay::reload;
use keyrelay::server::Listeners;
use keyrelay::sim::{FaultKind, FaultTarget, SimHandle};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Notify};

/// Polls a task through keyrelay until its final answer, and returns it.
async fn poll_to_the_end(h: &Harness, id: u64) -> serde_json::Value {
    for _ in 0..100 {
        let json = h
            .get(&format!(
                "/res.php?key={CALLER_KEY}&action=get&id={id}&json=1"
            ))
            .await
            .json();
        if json["request"] != "CAPCHA_NOT_READY" {
            return json;
        }
    }
    panic!("task {id} never finished");
}

/// The names of the keys that served `n` submits, each polled to the end.
async fn serving_keys(h: &Harness, n: usize) -> Vec<String> {
    let mut served = Vec::new();
    for _ in 0..n {
        let id = h.submit().await;
        assert_eq!(poll_to_the_end(h, id).await["status"], 1);
        let owner = h.sim.task_owner(id).expect("the simulator knows the task");
        served.push(owner);
    }
    served
}

fn set(h: &Harness, name: &str, hold: Option<AdminHold>) {
    h.app.set_admin_hold(name, hold).expect("a configured key");
}

// === holds ===

#[tokio::test]
async fn held_keys_take_no_new_tasks_but_their_pinned_tasks_are_still_polled() {
    let h = Harness::three_keys().await;
    // A task on each key, then a, b held: their tasks must still finish with their keys.
    let mut pinned = Vec::new();
    while pinned.len() < 6 {
        pinned.push(h.submit().await);
    }
    set(&h, "a", Some(AdminHold::Disabled));
    set(&h, "b", Some(AdminHold::Draining));
    h.sim.clear_received();
    for id in &pinned {
        let answer = poll_to_the_end(&h, *id).await;
        assert_eq!(answer["status"], 1, "task {id}: {answer}");
    }
    let polled_with: Vec<String> = h
        .sim
        .received()
        .iter()
        .filter(|r| r.action.as_deref() == Some("get"))
        .filter_map(|r| r.key.clone())
        .collect();
    assert!(
        polled_with.iter().any(|k| k == KEY_A),
        "a's tasks polled with a"
    );
    assert!(
        polled_with.iter().any(|k| k == KEY_B),
        "b's tasks polled with b"
    );

    let served = serving_keys(&h, 10).await;
    assert!(served.iter().all(|k| k == KEY_C), "{served:?}");

    // /status and /metrics show the holds; /readyz is still ready with c.
    let status = h.get("/status").await.json();
    let hold_of = |name: &str| {
        status["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == name)
            .map(|k| (k["hold"].clone(), k["in_rotation"].clone()))
            .unwrap()
    };
    assert_eq!(hold_of("a"), ("disabled".into(), false.into()));
    assert_eq!(hold_of("b"), ("draining".into(), false.into()));
    assert_eq!(hold_of("c"), (serde_json::Value::Null, true.into()));
    let metrics = h.metrics().await;
    for (series, value) in [
        (r#"keyrelay_key_admin_hold{hold="disabled",key="a"}"#, 1.0),
        (r#"keyrelay_key_admin_hold{hold="draining",key="a"}"#, 0.0),
        (r#"keyrelay_key_admin_hold{hold="draining",key="b"}"#, 1.0),
        (r#"keyrelay_key_admin_hold{hold="disabled",key="c"}"#, 0.0),
        (r#"keyrelay_key_admin_hold{hold="draining",key="c"}"#, 0.0),
        ("keyrelay_keys_active", 1.0),
    ] {
        assert_eq!(metric(&metrics, series), Some(value), "{series}\n{metrics}");
    }
    let ready = h.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.text());

    // c held too: not ready, and submits are refused as with no key in rotation.
    set(&h, "c", Some(AdminHold::Draining));
    let ready = h.get("/readyz").await;
    assert_eq!(ready.status, 503);
    assert!(
        ready.text().contains("3 held by the operator"),
        "{}",
        ready.text()
    );
    let refused = h
        .get(&format!(
            "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=s&pageurl=https://x.test&json=1"
        ))
        .await
        .json();
    assert_eq!(refused["status"], 0, "{refused}");

    // Enabling lifts either hold.
    set(&h, "a", None);
    set(&h, "c", None);
    let served = serving_keys(&h, 12).await;
    assert!(served.iter().any(|k| k == KEY_A), "{served:?}");
    assert!(
        !served.iter().any(|k| k == KEY_B),
        "b still drains: {served:?}"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_disabled_key_is_not_refreshed_and_a_draining_key_is() {
    let h = Harness::three_keys().await;
    set(&h, "a", Some(AdminHold::Disabled));
    set(&h, "b", Some(AdminHold::Draining));
    h.sim.clear_received();
    keyrelay::refresh::refresh_all(&h.app).await;
    let read_with: Vec<String> = h
        .sim
        .received()
        .iter()
        .filter_map(|r| r.key.clone())
        .collect();
    assert!(!read_with.iter().any(|k| k == KEY_A), "{read_with:?}");
    assert!(read_with.iter().any(|k| k == KEY_B), "{read_with:?}");
    assert!(read_with.iter().any(|k| k == KEY_C), "{read_with:?}");
    h.stop().await;
}

#[tokio::test]
async fn holds_last_through_reloads_and_go_with_a_removed_key() {
    let h = Harness::three_keys().await;
    set(&h, "a", Some(AdminHold::Disabled));
    set(&h, "b", Some(AdminHold::Draining));
    assert!(matches!(
        h.app.set_admin_hold("nobody", Some(AdminHold::Disabled)),
        Err(HoldError::NoSuchKey)
    ));
    // The same keys, with a new weight: both holds stay.
    let mut config = h.app.snapshot().config.clone();
    config.keys[0].weight = 3.0;
    reload::apply(&h.app, config.clone()).unwrap();
    assert_eq!(h.app.admin_hold("a"), Some(AdminHold::Disabled));
    assert_eq!(h.app.admin_hold("b"), Some(AdminHold::Draining));
    // b removed: its hold goes, and a key named b that comes back later is not held.
    let without_b: Vec<_> = config
        .keys
        .iter()
        .filter(|k| k.name != "b")
        .cloned()
        .collect();
    let mut smaller = config.clone();
    smaller.keys = without_b;
    reload::apply(&h.app, smaller).unwrap();
    assert_eq!(h.app.admin_hold("b"), None);
    assert!(
        matches!(
            h.app.set_admin_hold("b", Some(AdminHold::Disabled)),
            Err(HoldError::NoSuchKey)
        ),
        "b is not configured now"
    );
    reload::apply(&h.app, config).unwrap();
    assert_eq!(h.app.admin_hold("b"), None);
    assert_eq!(h.app.admin_hold("a"), Some(AdminHold::Disabled));
    let served = serving_keys(&h, 8).await;
    assert!(!served.iter().any(|k| k == KEY_A), "{served:?}");
    h.stop().await;
}

// === the admin API ===

/// keyrelay with its admin API, in front of a simulator: on the proxy's listener, or on an
/// admin listener of its own when `separate`.
struct Admin {
    sim: SimHandle,
    app: keyrelay::App,
    proxy: SocketAddr,
    /// Where the admin API is: the proxy's listener unless `separate`.
    admin: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// A call's answer: status, headers, and the body as JSON (or text, if not JSON).
struct Reply {
    status: StatusCode,
    headers: hyper::HeaderMap,
    text: String,
}

impl Reply {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

const ADMIN_TOKEN: &str = "admin-secret-token-5f1e";

impl Admin {
    async fn start(token: Option<&str>, separate: bool, tune: impl FnOnce(&mut Config)) -> Admin {
        let sim = common::sim_with(&[KEY_A, KEY_B, KEY_C]).await;
        let mut config = common::config_for(
            &sim,
            &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
        );
        config.admin.token = token.map(keyrelay::CallerToken::new);
        let proxy_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = proxy_listener.local_addr().unwrap();
        let mut listeners = Listeners::new(proxy_listener);
        let mut admin = proxy;
        if separate {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            admin = listener.local_addr().unwrap();
            config.admin.listen = Some(admin);
            listeners.admin = Some(listener);
        }
        tune(&mut config);
        let app = keyrelay::App::with_seed(config, 7).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(keyrelay::server::run_with(listeners, app.clone(), async {
            let _ = stopped.await;
        }));
        let harness = Admin {
            sim,
            app,
            proxy,
            admin,
            client: Client::builder(TokioExecutor::new()).build_http(),
            stop: Some(stop),
            server: Some(server),
        };
        let app = harness.app.clone();
        common::eventually("startup refresh", move || {
            app.snapshot()
                .pool
                .keys()
                .iter()
                .all(|k| k.stats.balance().is_some() && k.stats.threads().is_some())
        })
        .await;
        harness
    }

    /// `method path` on `addr`, with `Authorization: Bearer token` if given.
    async fn call_at(
        &self,
        addr: SocketAddr,
        method: Method,
        path: &str,
        token: Option<&str>,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = self
            .client
            .request(request.body(Full::new(Bytes::new())).unwrap())
            .await
            .expect("keyrelay answers");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            text: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    async fn call(&self, method: Method, path: &str, token: Option<&str>) -> Reply {
        self.call_at(self.admin, method, path, token).await
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.server.take().unwrap().await.unwrap().unwrap();
    }
}

fn row<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    list["keys"]
        .as_array()
        .expect("a key list")
        .iter()
        .find(|k| k["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

#[tokio::test]
async fn keys_are_listed_with_their_state_and_never_their_value() {
    let h = Admin::start(None, false, |_| {}).await;
    h.app
        .set_admin_hold("b", Some(AdminHold::Draining))
        .unwrap();
    let reply = h.call(Method::GET, "/admin/keys", None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.headers[CONTENT_TYPE], "application/json");
    let list = reply.json();
    assert_eq!(list["keys"].as_array().unwrap().len(), 3);
    let a = row(&list, "a");
    assert_eq!(a["state"], "active");
    assert_eq!(a["in_rotation"], true);
    assert_eq!(a["hold"], serde_json::Value::Null);
    assert_eq!(a["balance"], 10.0);
    assert_eq!(a["threads"], 5);
    assert_eq!(a["threads_in_use"], 0);
    assert_eq!(a["tier"], 0);
    assert_eq!(a["weight"], 1.0);
    assert_eq!(a["fingerprint"], keyrelay::ApiKey::new(KEY_A).fingerprint());
    let b = row(&list, "b");
    assert_eq!(
        (b["hold"].as_str(), b["in_rotation"].as_bool()),
        (Some("draining"), Some(false))
    );
    for key in [KEY_A, KEY_B, KEY_C] {
        assert!(
            !reply.text.contains(key),
            "a key in the list: {}",
            reply.text
        );
    }
    // A key out of rotation shows its state and reason.
    h.sim.set_state(KEY_C, keyrelay::sim::SimKeyState::Unknown);
    let refreshed = h
        .call(Method::POST, "/admin/keys/c/refresh", None)
        .await
        .json();
    assert_eq!(refreshed["key"]["state"], "benched", "{refreshed}");
    assert_eq!(
        refreshed["key"]["reason"], "ERROR_KEY_DOES_NOT_EXIST",
        "{refreshed}"
    );
    h.stop().await;
}

#[tokio::test]
async fn disable_drain_and_enable_change_which_keys_take_new_tasks() {
    let h = Admin::start(Some(ADMIN_TOKEN), false, |_| {}).await;
    let t = Some(ADMIN_TOKEN);
    let disabled = h.call(Method::POST, "/admin/keys/a/disable", t).await;
    assert_eq!(disabled.status, StatusCode::OK, "{}", disabled.text);
    let answer = disabled.json();
    assert_eq!(answer["key"]["name"], "a");
    assert_eq!(answer["key"]["hold"], "disabled");
    assert_eq!(answer["previous_hold"], serde_json::Value::Null);
    let drained = h.call(Method::POST, "/admin/keys/b/drain", t).await.json();
    assert_eq!(drained["key"]["hold"], "draining");
    assert_eq!(h.app.admin_hold("a"), Some(AdminHold::Disabled));
    assert_eq!(h.app.admin_hold("b"), Some(AdminHold::Draining));
    // Draining a disabled key replaces the hold, and says what it replaced.
    let replaced = h.call(Method::POST, "/admin/keys/a/drain", t).await.json();
    assert_eq!(replaced["previous_hold"], "disabled");
    let enabled = h.call(Method::POST, "/admin/keys/a/enable", t).await.json();
    assert_eq!(enabled["previous_hold"], "draining");
    assert_eq!(enabled["key"]["hold"], serde_json::Value::Null);
    assert_eq!(enabled["key"]["in_rotation"], true);
    assert_eq!(h.app.admin_hold("a"), None);
    h.stop().await;
}

#[tokio::test]
async fn bad_calls_get_json_errors_with_proper_statuses() {
    let h = Admin::start(None, false, |_| {}).await;
    for (method, path, status, says) in [
        (
            Method::POST,
            "/admin/keys/nobody/disable",
            StatusCode::NOT_FOUND,
            "no configured key is named \"nobody\"",
        ),
        (
            Method::POST,
            "/admin/keys/nobody/refresh",
            StatusCode::NOT_FOUND,
            "nobody",
        ),
        (
            Method::POST,
            "/admin/keys/a/explode",
            StatusCode::NOT_FOUND,
            "no such admin endpoint",
        ),
        (
            Method::GET,
            "/admin/",
            StatusCode::NOT_FOUND,
            "no such admin endpoint",
        ),
        (
            Method::GET,
            "/admin/keys/a/disable",
            StatusCode::METHOD_NOT_ALLOWED,
            "use POST",
        ),
        (
            Method::POST,
            "/admin/keys",
            StatusCode::METHOD_NOT_ALLOWED,
            "use GET",
        ),
    ] {
        let reply = h.call(method.clone(), path, None).await;
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.text);
        assert_eq!(reply.headers[CONTENT_TYPE], "application/json", "{path}");
        let error = reply.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(error.contains(says), "{method} {path}: {error}");
    }
    let reply = h.call(Method::GET, "/admin/keys/a/disable", None).await;
    assert_eq!(reply.headers[ALLOW], "POST");
    // Nothing was held by any of them.
    for name in ["a", "b", "c"] {
        assert_eq!(h.app.admin_hold(name), None);
    }
    h.stop().await;
}

#[tokio::test]
async fn with_caller_tokens_and_no_admin_token_loopback_is_not_trusted() {
    // A config built in code skips the exposure check: the admin API holds the rule itself.
    // A token holder's request relayed by the forward proxy would come from loopback.
    let h = Admin::start(None, true, |config| {
        config.access.tokens.push(common::caller_token(
            "client",
            "client-token-0123456789abcdef012",
        ));
    })
    .await;
    for (method, path) in [
        (Method::GET, "/admin/keys"),
        (Method::POST, "/admin/keys/a/disable"),
        (Method::POST, "/admin/refresh"),
    ] {
        let reply = h.call(method.clone(), path, None).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{method} {path}");
        assert!(reply.text.contains("admin.token"), "{}", reply.text);
    }
    assert_eq!(h.app.admin_hold("a"), None);
    h.stop().await;
}

#[tokio::test]
async fn with_a_token_every_admin_call_needs_it() {
    let h = Admin::start(Some(ADMIN_TOKEN), false, |_| {}).await;
    for (method, path) in [
        (Method::GET, "/admin/keys"),
        (Method::POST, "/admin/keys/a/disable"),
        (Method::POST, "/admin/refresh"),
        (Method::POST, "/admin/keys/nobody/disable"),
        (Method::GET, "/admin/nothing"),
    ] {
        for token in [None, Some("wrong"), Some(&ADMIN_TOKEN[1..])] {
            let reply = h.call(method.clone(), path, token).await;
            assert_eq!(
                reply.status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {token:?}"
            );
            assert_eq!(
                reply.headers[WWW_AUTHENTICATE],
                "Bearer realm=\"keyrelay admin\""
            );
            assert!(reply.json()["error"].is_string());
            assert!(!reply.text.contains(ADMIN_TOKEN), "{}", reply.text);
        }
    }
    assert_eq!(
        h.app.admin_hold("a"),
        None,
        "no call without the token took effect"
    );
    // Those were ten wrong tokens from one address, its whole burst: until its allowance
    // refills (5 a second), even the right token is refused, then it is served.
    let mut reply = h.call(Method::GET, "/admin/keys", Some(ADMIN_TOKEN)).await;
    for _ in 0..100 {
        if reply.status != StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        reply = h.call(Method::GET, "/admin/keys", Some(ADMIN_TOKEN)).await;
    }
    assert_eq!(reply.status, StatusCode::OK);
    // The token is a secret like the keys: never in /metrics or /status.
    for path in ["/metrics", "/status"] {
        let text = h.call(Method::GET, path, None).await.text;
        assert!(!text.contains(ADMIN_TOKEN), "{path}");
    }
    h.stop().await;
}

#[tokio::test]
async fn a_refresh_answers_with_the_new_figures() {
    let h = Admin::start(None, false, |_| {}).await;
    h.sim.set_balance(KEY_A, 42.5);
    let one = h.call(Method::POST, "/admin/keys/a/refresh", None).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text);
    assert_eq!(one.json()["key"]["balance"], 42.5);
    h.sim.set_balance(KEY_B, 7.25);
    h.sim.set_balance(KEY_C, 3.0);
    let all = h.call(Method::POST, "/admin/refresh", None).await.json();
    assert_eq!(row(&all, "b")["balance"], 7.25);
    assert_eq!(row(&all, "c")["balance"], 3.0);
    // A disabled key is left out of a refresh of all, but refreshed when named.
    h.app
        .set_admin_hold("a", Some(AdminHold::Disabled))
        .unwrap();
    h.sim.set_balance(KEY_A, 1.5);
    let all = h.call(Method::POST, "/admin/refresh", None).await.json();
    assert_eq!(row(&all, "a")["balance"], 42.5, "not read: {all}");
    let one = h
        .call(Method::POST, "/admin/keys/a/refresh", None)
        .await
        .json();
    assert_eq!(one["key"]["balance"], 1.5);
    h.stop().await;
}

#[tokio::test]
async fn a_refresh_that_outlasts_its_timeout_is_answered_504() {
    let h = Admin::start(None, false, |c| {
        c.timeouts.refresh = Duration::from_millis(300)
    })
    .await;
    let gate = Arc::new(Notify::new());
    h.sim.add_fault(
        KEY_A,
        common::fault(FaultTarget::Poll, FaultKind::Hold(gate.clone()), None),
    );
    let started = std::time::Instant::now();
    let reply = h.call(Method::POST, "/admin/keys/a/refresh", None).await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT, "{}", reply.text);
    assert!(reply.json()["error"]
        .as_str()
        .unwrap()
        .contains("timeouts.refresh"));
    assert!(started.elapsed() < Duration::from_secs(5), "bounded");
    h.sim.clear_faults();
    gate.notify_waiters();
    h.stop().await;
}

#[tokio::test]
async fn an_admin_listener_takes_the_operator_endpoints_off_the_proxy() {
    let h = Admin::start(Some(ADMIN_TOKEN), true, |_| {}).await;
    assert_ne!(h.admin, h.proxy);
    let t = Some(ADMIN_TOKEN);
    for path in ["/metrics", "/status", "/healthz", "/readyz", "/admin/keys"] {
        let on_proxy = h.call_at(h.proxy, Method::GET, path, t).await;
        assert_eq!(
            on_proxy.status,
            StatusCode::NOT_FOUND,
            "{path} on the proxy: {}",
            on_proxy.text
        );
        let on_admin = h.call_at(h.admin, Method::GET, path, t).await;
        assert_eq!(
            on_admin.status,
            StatusCode::OK,
            "{path} on the admin listener: {}",
            on_admin.text
        );
    }
    let on_proxy = h
        .call_at(h.proxy, Method::POST, "/admin/keys/a/disable", t)
        .await;
    assert_eq!(on_proxy.status, StatusCode::NOT_FOUND);
    assert_eq!(h.app.admin_hold("a"), None);
    // The captcha API stays on the proxy, and only there.
    let submit = format!(
        "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=s&pageurl=https://x.test&json=1"
    );
    let on_admin = h.call_at(h.admin, Method::GET, &submit, None).await;
    assert_eq!(on_admin.status, StatusCode::NOT_FOUND);
    let on_proxy = h.call_at(h.proxy, Method::GET, &submit, None).await;
    assert_eq!(on_proxy.json()["status"], 1, "{}", on_proxy.text);
    let held = h
        .call_at(h.admin, Method::POST, "/admin/keys/a/disable", t)
        .await;
    assert_eq!(held.status, StatusCode::OK);
    assert_eq!(h.app.admin_hold("a"), Some(AdminHold::Disabled));
    h.stop().await;
}

#[tokio::test]
async fn a_reload_cannot_move_the_admin_listener() {
    let h = Admin::start(None, true, |_| {}).await;
    let mut config = h.app.snapshot().config.clone();
    let running = config.admin.listen;
    config.admin.listen = Some("127.0.0.1:1".parse().unwrap());
    let applied = reload::apply(&h.app, config).unwrap();
    assert_eq!(applied.needs_restart, vec!["admin.listen"]);
    assert_eq!(
        h.app.snapshot().config.admin.listen,
        running,
        "what runs is reported"
    );
    let on_admin = h.call(Method::GET, "/admin/keys", None).await;
    assert_eq!(on_admin.status, StatusCode::OK);
    h.stop().await;
}
