//! Shared test harness: a simulator and a keyrelay proxy on ephemeral ports, and a small
//! HTTP client that returns status, headers and exact body bytes.
//!
//! Helpers only some crates use have modules of their own: `redis_server` and `replicas`
//! for the cluster tests, `fault_load` and `fault_script` for the fault tests.

#![allow(dead_code)]

pub mod connect_proxy;
pub mod fault_load;
pub mod fault_script;
pub mod logs;
pub mod python;
pub mod raw;
pub mod redis_server;
pub mod replicas;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyrelay::config::{Config, KeyConfig, Upstream};
use keyrelay::health::{Reason, StateKind};
use keyrelay::sim::{Fault, FaultKind, FaultTarget, SimHandle, SimKey, Simulator};
use keyrelay::App;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// 32-character fake keys, one per pool slot.
pub const KEY_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaa0001";
pub const KEY_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbb0002";
pub const KEY_C: &str = "cccccccccccccccccccccccccccc0003";
pub const KEY_D: &str = "dddddddddddddddddddddddddddd0004";
/// What the caller's script sends; it must never reach the upstream.
pub const CALLER_KEY: &str = "callercallercallercallercaller99";

/// A running proxy in front of a running simulator.
pub struct Harness {
    pub sim: SimHandle,
    pub app: App,
    pub addr: SocketAddr,
    pub client: Client<HttpConnector, Full<Bytes>>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

/// An answer as the caller sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {}", self.text()))
    }

    pub fn content_type(&self) -> Option<&str> {
        self.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok())
    }
}

/// A pool key for a config: (name, key value, weight).
pub fn key(name: &str, value: &str, weight: f64, upstream: &Upstream) -> KeyConfig {
    let mut k = KeyConfig::new(name, value, upstream.clone());
    k.weight = weight;
    k
}

/// A caller token named `name` with value `value`, limited by nothing beyond the defaults:
/// any key, no thread cap, the default `max_tunnels`.
pub fn caller_token(name: &str, value: &str) -> keyrelay::config::TokenConfig {
    keyrelay::config::TokenConfig {
        name: name.to_owned(),
        token: keyrelay::CallerToken::new(value),
        keys: None,
        tiers: None,
        max_threads: None,
        max_tunnels: keyrelay::config::DEFAULT_MAX_TUNNELS,
        budget: None,
    }
}

/// A config for `sim` with fast retries so failure tests run quickly.
pub fn config_for(sim: &SimHandle, keys: &[(&str, &str, f64)]) -> Config {
    let upstream = Upstream::parse(&sim.url()).expect("simulator url is valid");
    let keys = keys
        .iter()
        .map(|(name, value, weight)| key(name, value, *weight, &upstream))
        .collect();
    let mut config = Config::for_keys(upstream, keys);
    config.failover.backoff_base = Duration::from_millis(1);
    config.failover.backoff_max = Duration::from_millis(5);
    config.timeouts.request = Duration::from_secs(5);
    config.timeouts.refresh = Duration::from_secs(5);
    // Every poll relayed: the tests of other rules poll the moment a task exists, and count
    // what reaches the simulator. tests/polling.rs shapes them.
    config.polling = keyrelay::config::Polling::off();
    config
}

/// Starts a simulator with the given keys (all valid, balance 10, 5 threads).
pub async fn sim_with(keys: &[&str]) -> SimHandle {
    let mut sim = Simulator::new();
    for k in keys {
        sim = sim.key(SimKey::valid(k));
    }
    sim.spawn().await.expect("simulator binds 127.0.0.1:0")
}

impl Harness {
    /// Simulator with keys A, B, C; proxy with them as a, b, c at weight 1.
    pub async fn three_keys() -> Harness {
        let sim = sim_with(&[KEY_A, KEY_B, KEY_C]).await;
        let config = config_for(
            &sim,
            &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0), ("c", KEY_C, 1.0)],
        );
        Harness::start(sim, config).await
    }

    /// Starts the proxy for `config` in front of `sim`, and waits for the startup refresh.
    pub async fn start(sim: SimHandle, config: Config) -> Harness {
        let harness = Harness::start_without_refresh_wait(sim, config).await;
        harness.wait_for_refresh().await;
        harness
    }

    pub async fn start_without_refresh_wait(sim: SimHandle, config: Config) -> Harness {
        // Seeded: key picks are the same on every run, so no test depends on luck.
        let app = App::with_seed(config, 7).expect("app builds");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(keyrelay::server::run(listener, app.clone(), async {
            let _ = stopped.await;
        }));
        Harness {
            sim,
            app,
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
            stop: Some(stop),
            server: Some(server),
        }
    }

    /// Waits until the startup refresh is through with every key: both its reads answered
    /// (balance and threads known), or the key out of rotation. Waiting for the balance
    /// alone would let a key's `threadsinfo` reach the simulator after a test began
    /// counting what went upstream.
    pub async fn wait_for_refresh(&self) {
        let app = self.app.clone();
        eventually("startup refresh", || {
            let snapshot = app.snapshot();
            snapshot.pool.keys().iter().all(|k| {
                // A service without threadsinfo has no thread figure to wait for.
                (k.stats.balance().is_some()
                    && (k.stats.threads().is_some() || !k.profile().threadsinfo))
                    || app.health().view(k.id, tokio::time::Instant::now()).state
                        != StateKind::Active
            })
        })
        .await;
    }

    /// [`Harness::wait_for_refresh`] for the keys named alone: for pools where the others sit
    /// behind an upstream that never answers, whose reads can only fail.
    pub async fn wait_for_refresh_of(&self, names: &[&str]) {
        let app = self.app.clone();
        eventually("startup refresh of the reachable keys", || {
            let snapshot = app.snapshot();
            snapshot
                .pool
                .keys()
                .iter()
                .filter(|k| names.contains(&k.name.as_str()))
                .all(|k| {
                    k.stats.balance().is_some()
                        && (k.stats.threads().is_some() || !k.profile().threadsinfo)
                })
        })
        .await;
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("http://{}{}", self.addr, path_and_query)
    }

    pub async fn get(&self, path_and_query: &str) -> Answer {
        self.send(Method::GET, path_and_query, None, Bytes::new())
            .await
    }

    pub async fn post(
        &self,
        path_and_query: &str,
        content_type: &str,
        body: impl Into<Bytes>,
    ) -> Answer {
        self.send(
            Method::POST,
            path_and_query,
            Some(content_type),
            body.into(),
        )
        .await
    }

    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Answer {
        let headers: Vec<(&str, &str)> = content_type
            .map(|ct| (CONTENT_TYPE.as_str(), ct))
            .into_iter()
            .collect();
        self.send_with_headers(method, path_and_query, &headers, body)
            .await
    }

    /// Sends a request with the given headers (name, value), in order.
    pub async fn send_with_headers(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Answer {
        let mut request = Request::builder()
            .method(method)
            .uri(self.url(path_and_query));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body)).expect("valid request");
        let response = self.client.request(request).await.expect("proxy answers");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("whole body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// Submits a reCAPTCHA task through the proxy (json=1) and returns its task id.
    pub async fn submit(&self) -> u64 {
        let answer = self
            .get(&format!(
                "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=site&pageurl=https://x.test&json=1"
            ))
            .await;
        let json = answer.json();
        assert_eq!(json["status"], 1, "submit failed: {}", answer.text());
        match &json["request"] {
            serde_json::Value::Number(n) => n.as_u64().expect("numeric id"),
            serde_json::Value::String(s) => s.parse().expect("numeric id"),
            other => panic!("no task id in {other}"),
        }
    }

    /// A key's health state and reason, by name.
    pub fn state_of(&self, name: &str) -> (StateKind, Option<&'static str>) {
        let snapshot = self.app.snapshot();
        let key = snapshot
            .pool
            .keys()
            .iter()
            .find(|k| k.name == name)
            .expect("key exists");
        let view = self.app.health().view(key.id, tokio::time::Instant::now());
        (view.state, view.reason.map(Reason::label))
    }

    /// Submits a task straight to the simulator with `key`, past keyrelay (so no pin exists),
    /// and returns its id.
    pub async fn submit_past_keyrelay(&self, key: &str) -> u64 {
        let url = format!(
            "{}/in.php?key={key}&method=userrecaptcha&googlekey=g&pageurl=p",
            self.sim.url()
        );
        let response = self
            .client
            .get(url.parse().expect("valid url"))
            .await
            .expect("sim answers");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("whole body")
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        text.strip_prefix("OK|")
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("the simulator refused the task: {text}"))
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("server task").expect("server ran");
        }
    }
}

/// A loopback port that refuses every connection for as long as the socket lives: bound but
/// never listening, so no other test's listener can take it meanwhile (as it could a port
/// bound and closed again).
pub fn refusing_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind 127.0.0.1:0");
    let addr = socket.local_addr().expect("a bound socket has an address");
    (socket, addr)
}

/// `X-Keyrelay-Attempts` of a relayed answer: how many upstream attempts it took.
pub fn attempts_of(answer: &Answer) -> Option<u32> {
    answer
        .headers
        .get("x-keyrelay-attempts")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A simulator fault.
pub fn fault(target: FaultTarget, kind: FaultKind, times: Option<u32>) -> Fault {
    Fault {
        target,
        kind,
        times,
    }
}

/// Holds the next submit made with `key` back for `delay` before the simulator answers it,
/// so that a caller can be gone by the time the answer comes.
pub fn delay_next_submit(sim: &SimHandle, key: &str, delay: Duration) {
    sim.add_fault(
        key,
        fault(FaultTarget::Submit, FaultKind::Delay(delay), Some(1)),
    );
}

/// How a raw caller leaves after writing its request.
#[derive(Clone, Copy, Debug)]
pub enum Leave {
    /// Closes the socket: the FIN goes out right behind the request.
    Close,
    /// Resets the connection (zero linger).
    Reset,
}

/// Writes `request` to keyrelay on a connection of its own, then leaves as `how` says.
pub async fn send_and_leave(addr: SocketAddr, request: &str, how: Leave) {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    if let Leave::Reset = how {
        stream.set_zero_linger().expect("zero linger");
    }
    drop(stream);
}

/// Polls `condition` until it holds, failing the test after a generous bound. For state that
/// changes in a background task; never a guess at how long something takes.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Asserts that `h`'s forward proxy intercepted at least one `CONNECT` (the clients went
/// through `HTTPS_PROXY`, not around it).
pub async fn assert_connects_intercepted(h: &Harness) {
    let metrics = h.metrics().await;
    let intercepted = metric(
        &metrics,
        "keyrelay_forward_requests_total{outcome=\"intercepted\"}",
    );
    assert!(
        intercepted.is_some_and(|n| n >= 1.0),
        "the CONNECTs were intercepted: {intercepted:?}"
    );
}

/// The value of a metric line (`name{labels} value`), if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The real `keyrelay` binary running in the background, with its stderr lines on a
/// channel so waits for a log line are bounded. Killed when dropped.
pub struct Binary {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every line read so far.
    pub log: String,
}

impl Binary {
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Binary {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_keyrelay"));
        command.args(args);
        for (name, value) in env {
            command.env(name, value);
        }
        Binary::start(command)
    }

    /// Starts `command` (keyrelay, or a wrapper that runs it, such as `setpriv`), with
    /// RUST_LOG cleared and stderr on the channel.
    pub fn start(mut command: std::process::Command) -> Binary {
        use std::io::{BufRead, BufReader};
        command
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = command.spawn().expect("keyrelay starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Binary {
            child,
            lines,
            log: String::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to 20 s for a stderr line matching `predicate`, and returns it.
    pub fn wait_for_line(&mut self, what: &str, predicate: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push_str(&line);
                    self.log.push('\n');
                    if predicate(&line) {
                        return line;
                    }
                }
                Err(_) => panic!("no log line for {what}; log so far:\n{}", self.log),
            }
        }
    }

    /// The address from the "keyrelay listening" line.
    pub fn wait_for_addr(&mut self) -> String {
        let line = self.wait_for_line("the listening address", |l| l.contains("addr="));
        let rest = line.split("addr=").nth(1).expect("addr field");
        rest.split_whitespace()
            .next()
            .expect("addr value")
            .to_owned()
    }

    /// Waits, boundedly, for the process to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait on the child") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "keyrelay did not exit; log:\n{}",
                self.log
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the process and collects the rest of its log.
    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The reader thread ends at EOF; take what it read.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.log.push_str(&line);
            self.log.push('\n');
        }
        std::mem::take(&mut self.log)
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
