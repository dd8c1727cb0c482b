//! The `[tls]` listener end to end against the simulator: a rustls client that trusts the
//! local CA gets the answers the plain listener gives; garbage, a stalled handshake and a
//! client that does not trust the CA are counted and closed while another client is
//! served; a certificate file replaced on disk is picked up. An https upstream behind a
//! private CA is reached through `upstream_ca`, and refused without it. And the real
//! binary: it generates its CA at start and serves TLS with it, and refuses a corrupt CA
//! or an unusable `upstream_ca`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{config_for, metric, sim_with, CALLER_KEY, KEY_A, KEY_B};
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;
use keyrelay::config::{Config, PemFiles, Tls};
use keyrelay::server::TlsListener;
use keyrelay::sim::SimHandle;
use keyrelay::tls::{listener_config, ListenerCert};
use keyrelay::App;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::TlsConnector;

/// What a bounded wait for a connection or an answer allows.
const PATIENCE: Duration = Duration::from_secs(10);

/// keyrelay with a plain and a TLS listener in front of a simulator.
struct TlsProxy {
    _sim: SimHandle,
    app: App,
    plain: SocketAddr,
    tls: SocketAddr,
    cert: Arc<ListenerCert>,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl TlsProxy {
    async fn start(files: Option<PemFiles>, header_timeout: Duration) -> TlsProxy {
        let sim = sim_with(&[KEY_A, KEY_B]).await;
        let mut config: Config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
        config.limits.header_timeout = header_timeout;
        let tls = Tls {
            listen: "127.0.0.1:0".parse().unwrap(),
            files,
            names: vec!["keyrelay.test".to_owned()],
        };
        config.tls = Some(tls.clone());
        let app = App::with_seed(config, 7).expect("app builds");
        let cert = ListenerCert::new(&tls, app.ca().expect("an in-memory CA")).expect("cert");
        let plain_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tls_listener = TcpListener::bind(tls.listen).await.unwrap();
        let plain = plain_listener.local_addr().unwrap();
        let tls_addr = tls_listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let mut listeners = keyrelay::server::Listeners::new(plain_listener);
        listeners.tls = Some(TlsListener {
            listener: tls_listener,
            config: listener_config(cert.clone()),
        });
        let server = tokio::spawn(keyrelay::server::run_with(listeners, app.clone(), async {
            let _ = stopped.await;
        }));
        TlsProxy {
            _sim: sim,
            app,
            plain,
            tls: tls_addr,
            cert,
            stop: Some(stop),
            server,
        }
    }

    fn ca(&self) -> CertificateDer<'static> {
        self.app.ca().unwrap().cert_der().clone()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        tokio::time::timeout(PATIENCE, self.server)
            .await
            .expect("the server drains")
            .expect("server task")
            .expect("server ran");
    }
}

fn client_config(
    root: &CertificateDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection to `addr` as `name`, trusting `root` only.
async fn connect_tls(
    addr: SocketAddr,
    root: &CertificateDer<'static>,
    name: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> std::io::Result<TlsStream> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = TlsConnector::from(client_config(root, versions));
    let name = ServerName::try_from(name.to_owned()).unwrap();
    tokio::time::timeout(PATIENCE, connector.connect(name, tcp))
        .await
        .expect("the handshake ends")
}

/// Status, content type and body of `GET target` on `io`.
async fn get_on<I>(io: I, target: &str) -> (u16, String, String)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("http handshake");
    tokio::spawn(conn);
    let request = Request::get(target)
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, sender.send_request(request))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn tls_get(proxy: &TlsProxy, target: &str) -> (u16, String, String) {
    let stream = connect_tls(proxy.tls, &proxy.ca(), "localhost", rustls::ALL_VERSIONS)
        .await
        .expect("a TLS connection");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    get_on(stream, target).await
}

async fn plain_get(proxy: &TlsProxy, target: &str) -> (u16, String, String) {
    get_on(TcpStream::connect(proxy.plain).await.unwrap(), target).await
}

async fn metrics(proxy: &TlsProxy) -> String {
    plain_get(proxy, "/metrics").await.2
}

fn failures(text: &str, reason: &str) -> f64 {
    metric(
        text,
        &format!("keyrelay_tls_handshake_failures_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or_else(|| panic!("no {reason} series in:\n{text}"))
}

/// Polls `/metrics` until the `reason` count reaches `at_least`, within a bound.
async fn wait_for_failures(proxy: &TlsProxy, reason: &str, at_least: f64) {
    for _ in 0..500 {
        if failures(&metrics(proxy).await, reason) >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{reason} failures never reached {at_least}");
}

fn submit_target() -> String {
    format!(
        "/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=site&pageurl=https://x.test&json=1"
    )
}

fn task_id(body: &str) -> String {
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(json["status"], 1, "{body}");
    json["request"]
        .as_str()
        .map_or_else(|| json["request"].to_string(), str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_local_ca_submits_and_polls_over_tls() {
    let proxy = TlsProxy::start(None, Duration::from_secs(5)).await;

    // The answers that do not depend on a task are the plain listener's, byte for byte.
    for target in [
        "/healthz".to_owned(),
        format!("/res.php?key={CALLER_KEY}&action=getbalance"),
        format!("/in.php?key={CALLER_KEY}&json=1"),
        "/res.php?action=get&id=notanid".to_owned(),
        // The JSON task API too (issue 39): a balance, and a task-less createTask's error.
        "/getBalance".to_owned(),
        "/createTask".to_owned(),
    ] {
        assert_eq!(
            tls_get(&proxy, &target).await,
            plain_get(&proxy, &target).await,
            "{target}"
        );
    }

    let (_, content_type, balance) = tls_get(&proxy, "/getBalance").await;
    assert_eq!(content_type, "application/json");
    let balance: serde_json::Value = serde_json::from_str(&balance).unwrap();
    assert_eq!(balance["errorId"], 0, "{balance}");
    assert!(balance["balance"].is_number(), "{balance}");

    // A task submitted over TLS is solved over TLS, and is the same task over plain http.
    let (status, content_type, body) = tls_get(&proxy, &submit_target()).await;
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let id = task_id(&body);
    let poll = format!("/res.php?key={CALLER_KEY}&action=get&id={id}&json=1");
    let mut solved = None;
    for _ in 0..20 {
        let (status, _, body) = tls_get(&proxy, &poll).await;
        assert_eq!(status, 200);
        if !body.contains("CAPCHA_NOT_READY") {
            solved = Some(body);
            break;
        }
    }
    let solved = solved.expect("the task is solved within 20 polls");
    let json: serde_json::Value = serde_json::from_str(&solved).unwrap();
    assert_eq!(json["status"], 1, "{solved}");
    assert_eq!(plain_get(&proxy, &poll).await.2, solved);

    // TLS 1.2 clients are served too, and the configured name is on the certificate.
    let tls12 = connect_tls(
        proxy.tls,
        &proxy.ca(),
        "keyrelay.test",
        &[&rustls::version::TLS12],
    )
    .await
    .expect("a TLS 1.2 connection");
    assert_eq!(
        tls12.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert_eq!(get_on(tls12, "/healthz").await.0, 200);

    // The caller's key went nowhere; nothing failed.
    let text = metrics(&proxy).await;
    for reason in ["timeout", "not_tls", "protocol", "io"] {
        assert_eq!(failures(&text, reason), 0.0, "{reason}");
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_handshakes_are_counted_and_closed_while_others_are_served() {
    let header_timeout = Duration::from_millis(800);
    let proxy = TlsProxy::start(None, header_timeout).await;

    // A stalled handshake: half a TLS record header, then nothing.
    let mut stalled = TcpStream::connect(proxy.tls).await.unwrap();
    stalled.write_all(&[0x16, 0x03]).await.unwrap();

    // Plain HTTP to the TLS port.
    let mut garbage = TcpStream::connect(proxy.tls).await.unwrap();
    garbage
        .write_all(b"GET /in.php HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();

    // Meanwhile, a good client is served at once.
    let (status, _, body) = tls_get(&proxy, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    // The garbage is answered by a close (rustls may send an alert first), never HTTP.
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, garbage.read_to_end(&mut seen))
        .await
        .expect("the garbage connection is closed")
        .ok();
    assert!(
        !String::from_utf8_lossy(&seen).contains("HTTP/1.1"),
        "{seen:?}"
    );
    wait_for_failures(&proxy, "not_tls", 1.0).await;

    // A client that does not trust the certificate: its alert is a protocol failure.
    let stranger = keyrelay::tls::LocalCa::in_memory().unwrap();
    let refused = connect_tls(
        proxy.tls,
        stranger.cert_der(),
        "localhost",
        rustls::ALL_VERSIONS,
    )
    .await;
    assert!(
        refused.is_err(),
        "a client trusted a certificate of another CA"
    );
    wait_for_failures(&proxy, "protocol", 1.0).await;

    // The stalled handshake is closed at the header timeout and counted.
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, stalled.read_to_end(&mut rest))
        .await
        .expect("the stalled connection is closed")
        .ok();
    wait_for_failures(&proxy, "timeout", 1.0).await;

    // A client that connects and leaves before a handshake: an io failure.
    drop(TcpStream::connect(proxy.tls).await.unwrap());
    wait_for_failures(&proxy, "io", 1.0).await;

    // Still serving, on both listeners.
    assert_eq!(tls_get(&proxy, "/healthz").await.0, 200);
    assert_eq!(plain_get(&proxy, "/healthz").await.0, 200);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_does_not_hold_up_the_drain() {
    let proxy = TlsProxy::start(None, Duration::from_secs(60)).await;
    let mut stalled = TcpStream::connect(proxy.tls).await.unwrap();
    stalled.write_all(&[0x16, 0x03]).await.unwrap();
    // Served, so the stalled one has certainly been accepted before the stop.
    assert_eq!(tls_get(&proxy, "/healthz").await.0, 200);
    // Far under the 60 s header timeout.
    proxy.stop().await;
}

/// A CA made with rcgen (not keyrelay's) and leaves it signs, as an operator's own
/// certificate files would be.
struct OwnCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl OwnCa {
    fn new() -> OwnCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        OwnCa { issuer }
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A leaf for localhost written to `dir` as cert.pem / key.pem; returns its DER.
    fn write_leaf(&self, dir: &Path) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        // The key first: a poll between the two writes sees a mismatch, keeps the old
        // certificate, and takes the pair once the certificate follows.
        write_replacing(&dir.join("key.pem"), &key.serialize_pem());
        write_replacing(&dir.join("cert.pem"), &cert.pem());
        cert.der().clone()
    }
}

/// Replaces `path` by rename, as certificate renewers do.
fn write_replacing(path: &Path, text: &str) {
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, path).unwrap();
}

async fn served_cert(proxy: &TlsProxy, root: &CertificateDer<'static>) -> CertificateDer<'static> {
    let stream = connect_tls(proxy.tls, root, "localhost", rustls::ALL_VERSIONS)
        .await
        .expect("a TLS connection");
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_file_replaced_on_disk_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let own = OwnCa::new();
    let first = own.write_leaf(dir.path());
    let files = PemFiles {
        cert: dir.path().join("cert.pem"),
        key: dir.path().join("key.pem"),
    };
    let proxy = TlsProxy::start(Some(files.clone()), Duration::from_secs(5)).await;
    let watcher = tokio::spawn(proxy.cert.clone().watch());
    assert_eq!(served_cert(&proxy, &own.der()).await, first);

    // A broken file is not taken: the old certificate is still served.
    write_replacing(&files.cert, "-----BEGIN CERTIFICATE-----\nAAAA\n");
    let second = own.write_leaf(dir.path());
    assert_ne!(first, second);
    let mut picked_up = false;
    for _ in 0..300 {
        let served = served_cert(&proxy, &own.der()).await;
        if served == second {
            picked_up = true;
            break;
        }
        assert_eq!(
            served, first,
            "served neither the old nor the new certificate"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(picked_up, "the new certificate was not picked up");
    watcher.abort();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_replacement_keeps_the_old_certificate_being_served() {
    let dir = tempfile::tempdir().unwrap();
    let own = OwnCa::new();
    let first = own.write_leaf(dir.path());
    let files = PemFiles {
        cert: dir.path().join("cert.pem"),
        key: dir.path().join("key.pem"),
    };
    let proxy = TlsProxy::start(Some(files.clone()), Duration::from_secs(5)).await;
    write_replacing(&files.cert, "not a certificate\n");
    // The reload the watcher would make, made here so the test does not wait a poll.
    let e = proxy.cert.refresh().unwrap_err();
    assert!(
        e.to_string().contains(&files.cert.display().to_string()),
        "{e}"
    );
    assert_eq!(served_cert(&proxy, &own.der()).await, first);
    let stream = connect_tls(proxy.tls, &own.der(), "localhost", rustls::ALL_VERSIONS)
        .await
        .expect("a TLS connection");
    assert_eq!(get_on(stream, "/healthz").await.0, 200);
    proxy.stop().await;
}

/// A config for the real binary in `dir`: the plain and TLS listeners on ephemeral ports,
/// one key on `sim`, data_dir (so the CA) in `dir`.
fn write_binary_config(dir: &Path, sim: &SimHandle) -> String {
    let path = dir.join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\n\n[[keys]]\nname = \"a\"\nkey = \"{KEY_A}\"\n\n[tls]\nlisten = \"127.0.0.1:0\"\n",
            sim.url()
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyrelay_serves_tls_with_a_ca_it_generates_at_start() {
    let sim = sim_with(&[KEY_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_binary_config(dir.path(), &sim);
    let mut binary = common::Binary::spawn(&["--config", &config], &[]);
    let line = binary.wait_for_line("the TLS listener", |l| l.contains("keyrelay TLS listening"));
    let tls: SocketAddr = line
        .split("tls_addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("tls_addr field")
        .parse()
        .unwrap();
    use rustls::pki_types::pem::PemObject as _;
    let ca = CertificateDer::from_pem_file(dir.path().join("ca.pem")).expect("ca.pem at start");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let key = std::fs::metadata(dir.path().join("ca.key")).unwrap();
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
    }
    let stream = connect_tls(tls, &ca, "127.0.0.1", rustls::ALL_VERSIONS)
        .await
        .expect("a TLS connection trusting the generated CA");
    let (status, _, body) = get_on(stream, &submit_target()).await;
    assert_eq!(status, 200);
    task_id(&body);
    let log = binary.stop();
    assert!(!log.contains(KEY_A), "a key in the log:\n{log}");
    assert!(!log.contains("PRIVATE KEY"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyrelay_refuses_to_start_on_a_corrupt_ca_naming_the_file() {
    let sim = sim_with(&[KEY_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_binary_config(dir.path(), &sim);
    std::fs::write(dir.path().join("ca.pem"), "garbage\n").unwrap();
    std::fs::write(dir.path().join("ca.key"), "garbage\n").unwrap();
    let mut binary = common::Binary::spawn(&["--config", &config], &[]);
    let status = binary.wait_exit(PATIENCE);
    assert!(!status.success());
    let log = binary.stop();
    let cert = dir.path().join("ca.pem").display().to_string();
    assert!(log.contains(&cert), "{log}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ca.pem")).unwrap(),
        "garbage\n"
    );
}

/// keyrelay in front of `upstream` (an `https://` URL) with two keys, trusting `upstream_ca`
/// beside the Mozilla roots. Its own simulator is never asked: it only keeps the harness's
/// shape.
async fn front(upstream: &str, upstream_ca: Option<std::path::PathBuf>) -> common::Harness {
    front_via(upstream, upstream_ca, None).await
}

/// [`front`], its connections tunnelled through `proxy` (an `upstream_proxy` URL) if given.
async fn front_via(
    upstream: &str,
    upstream_ca: Option<std::path::PathBuf>,
    proxy: Option<&str>,
) -> common::Harness {
    let upstream = keyrelay::config::Upstream::parse(upstream).unwrap();
    let keys = [("front-a", KEY_A), ("front-b", KEY_B)]
        .iter()
        .map(|(name, value)| common::key(name, value, 1.0, &upstream))
        .collect();
    let mut config = Config::for_keys(upstream, keys);
    config.upstream_ca = upstream_ca;
    // Polls go upstream as they come: the test polls the moment the task exists.
    config.polling = keyrelay::config::Polling::off();
    config.upstream_proxy = proxy.map(|url| keyrelay::config::UpstreamProxy::parse(url).unwrap());
    config.failover.backoff_base = Duration::from_millis(1);
    config.failover.backoff_max = Duration::from_millis(5);
    let unused = sim_with(&[]).await;
    common::Harness::start_without_refresh_wait(unused, config).await
}

fn all_failures(text: &str) -> f64 {
    ["timeout", "not_tls", "protocol", "io"]
        .iter()
        .map(|reason| failures(text, reason))
        .sum()
}

/// An `https://` upstream whose certificate a private CA signed (here another keyrelay's
/// TLS listener, with its local CA): trusted once `upstream_ca` names that CA, refused
/// without it, and in neither case is a key benched for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_behind_a_private_ca_is_trusted_through_upstream_ca() {
    let behind = TlsProxy::start(None, Duration::from_secs(5)).await;
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("private-ca.pem");
    std::fs::write(&roots, behind.app.ca().unwrap().cert_pem()).unwrap();
    let upstream = format!("https://localhost:{}", behind.tls.port());

    // Without the CA, the handshake fails on the front's side: nothing reaches the
    // upstream's pool, the caller gets a well-formed error, and no key is benched.
    let untrusting = front(&upstream, None).await;
    let answer = untrusting.get(&submit_target()).await;
    let json = answer.json();
    assert_eq!(json["status"], 0, "{}", answer.text());
    assert!(
        json["request"].as_str().unwrap().starts_with("ERROR_"),
        "{}",
        answer.text()
    );
    // The far side counts the refused handshake as it reads the alert, which may be just
    // after the front has answered its caller.
    let mut counted = false;
    for _ in 0..500 {
        if all_failures(&metrics(&behind).await) >= 1.0 {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(counted, "the upstream saw no failed handshake");
    for name in ["front-a", "front-b"] {
        let (state, _) = untrusting.state_of(name);
        assert_ne!(state, keyrelay::health::StateKind::Benched, "{name}");
    }
    untrusting.stop().await;

    // With it, a task is submitted and solved through both, and its poll stays pinned.
    let trusting = front(&upstream, Some(roots)).await;
    let id = trusting.submit().await;
    let poll = format!("/res.php?key={CALLER_KEY}&action=get&id={id}&json=1");
    let mut solved = None;
    for _ in 0..20 {
        let answer = trusting.get(&poll).await;
        if !answer.text().contains("CAPCHA_NOT_READY") {
            solved = Some(answer);
            break;
        }
    }
    let solved = solved.expect("the task is solved within 20 polls");
    assert_eq!(solved.json()["status"], 1, "{}", solved.text());
    trusting.stop().await;
    behind.stop().await;
}

/// TLS to an https upstream runs end to end inside the `upstream_proxy` tunnel: the proxy
/// is asked for the upstream's name and port, and only ever relays ciphertext, so the pool
/// key it carries is not visible to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_reached_through_an_upstream_proxy_tunnel() {
    use common::connect_proxy::{ConnectProxy, Mode};
    let behind = TlsProxy::start(None, Duration::from_secs(5)).await;
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("private-ca.pem");
    std::fs::write(&roots, behind.app.ca().unwrap().cert_pem()).unwrap();
    let upstream = format!("https://localhost:{}", behind.tls.port());
    let proxy = ConnectProxy::start(Mode::Tunnel { require: None }).await;

    let front = front_via(&upstream, Some(roots), Some(&proxy.url(None))).await;
    let id = front.submit().await;
    let poll = front
        .get(&format!(
            "/res.php?key={CALLER_KEY}&action=get&id={id}&json=1"
        ))
        .await;
    assert_eq!(poll.status, 200, "{}", poll.text());
    assert!(poll.text().contains("\"status\""), "{}", poll.text());
    let seen = proxy.seen();
    assert!(!seen.is_empty(), "the tunnel was not used");
    let target = format!("localhost:{}", behind.tls.port());
    assert!(seen.iter().all(|c| c.target == target), "{seen:?}");
    front.stop().await;
    behind.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyrelay_refuses_to_start_on_an_unusable_upstream_ca_naming_the_file() {
    let sim = sim_with(&[KEY_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_binary_config(dir.path(), &sim);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replacen(
            "\n\n[[keys]]",
            "\nupstream_ca = \"roots.pem\"\n\n[[keys]]",
            1,
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("roots.pem"), "garbage\n").unwrap();
    let mut binary = common::Binary::spawn(&["--config", &config], &[]);
    let status = binary.wait_exit(PATIENCE);
    assert!(!status.success());
    let log = binary.stop();
    let roots = dir.path().join("roots.pem").display().to_string();
    assert!(
        log.contains(&format!("upstream_ca {roots}: no certificate in it")),
        "{log}"
    );
    assert!(!log.contains("garbage"), "the file is not quoted: {log}");
}
