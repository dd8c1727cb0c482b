//! The forward proxy's doors, tried as a hostile caller would: where a tunnel or a relay
//! may go (never to keyrelay's own listeners; from an exposed listener, not to loopback,
//! private or link-local addresses nor odd ports, in any notation, unless `[forward]
//! allow` says so), how long tunnels keep their place under the connection cap and a
//! token's `max_tunnels`, and what a malformed `CONNECT` gets.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::raw::*;
use common::*;
use keyrelay::config::{Config, TokenConfig, DEFAULT_MAX_TUNNELS};
use keyrelay::server::Listeners;
use keyrelay::sim::SimHandle;
use keyrelay::App;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const TOKEN: &str = "client-token-0123456789abcdef012";

/// keyrelay on a listener bound to `bind` (`127.0.0.1:0`, or `0.0.0.0:0` for one other
/// machines can reach), with an admin listener on loopback.
struct Running {
    /// Where to connect to the proxy listener (its port, on 127.0.0.1).
    addr: SocketAddr,
    admin: SocketAddr,
    app: App,
    _sim: SimHandle,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn start(bind: &str, edit: impl FnOnce(&mut Config)) -> Running {
        let sim = sim_with(&[KEY_A, KEY_B]).await;
        let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
        config.forward.intercept = Some(vec!["ocr.captchaai.com".to_owned()]);
        config.access.tokens.push(token(DEFAULT_MAX_TUNNELS));
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        config.admin.listen = Some(admin.local_addr().unwrap());
        edit(&mut config);
        let app = App::with_seed(config, 7).expect("app builds");
        let proxy = TcpListener::bind(bind).await.expect("bind");
        let addr = SocketAddr::from(([127, 0, 0, 1], proxy.local_addr().unwrap().port()));
        let admin_addr = admin.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let mut listeners = Listeners::new(proxy);
        listeners.admin = Some(admin);
        let server = tokio::spawn(keyrelay::server::run_with(listeners, app.clone(), async {
            let _ = stopped.await;
        }));
        Running {
            addr,
            admin: admin_addr,
            app,
            _sim: sim,
            stop,
            server,
        }
    }

    fn refused(&self, reason: &str) -> Option<f64> {
        metric(
            &self.app.render_metrics(),
            &format!("keyrelay_forward_refused_total{{reason=\"{reason}\"}}"),
        )
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(30), self.server).await;
    }
}

fn token(max_tunnels: u32) -> TokenConfig {
    TokenConfig {
        max_tunnels,
        budget: None,
        ..caller_token("client", TOKEN)
    }
}

fn auth() -> String {
    format!("Proxy-Authorization: Basic {}\r\n", basic("script", TOKEN))
}

fn connect_line(target: &str) -> String {
    format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
        auth()
    )
}

/// The status code of the answer to `request`, and its body.
async fn status_of(addr: SocketAddr, request: &str) -> (u16, String) {
    let (mut stream, head, rest) = exchange(addr, request).await;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let body = if status == 200 && request.starts_with("CONNECT") {
        Vec::new()
    } else {
        read_body(&mut stream, rest, content_length(&head)).await
    };
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Opens a tunnel to `target` and checks that bytes come back through it (an echo server).
async fn open_tunnel(addr: SocketAddr, target: &str) -> TcpStream {
    let (mut stream, head, _) = exchange(addr, &connect_line(target)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{target}: {head}");
    stream.write_all(b"ping").await.unwrap();
    assert_eq!(read_body(&mut stream, Vec::new(), 4).await, b"ping");
    stream
}

/// Whether a new connection to `addr` is served: an API request answered at all.
async fn served(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return false;
    };
    let request = format!("GET /res.php?key={TOKEN}&action=getbalance HTTP/1.1\r\nHost: x\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await,
        Ok(Ok(n)) if n > 0 && buf.starts_with(b"HTTP/1.1 200")
    )
}

/// Polls `served` until it is `expected`, within a bound.
async fn until_served(addr: SocketAddr, expected: bool) {
    for _ in 0..200 {
        if served(addr).await == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "a new connection was never {}",
        if expected { "served" } else { "refused" }
    );
}

// === where a tunnel or a relay may go ===

#[tokio::test]
async fn an_exposed_listener_refuses_loopback_and_private_destinations_in_every_notation() {
    let k = Running::start("0.0.0.0:0", |_| {}).await;
    let echo = echo_server().await;
    let port = echo.port();
    let private = [
        format!("127.0.0.1:{port}"),
        format!("127.1:{port}"),
        format!("127.0.1:{port}"),
        format!("2130706433:{port}"),
        format!("0x7f000001:{port}"),
        format!("0x7f.1:{port}"),
        format!("0177.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::ffff:7f00:1]:{port}"),
        format!("[::1]:{port}"),
        format!("localhost:{port}"),
        format!("0.0.0.0:{port}"),
        format!("[::]:{port}"),
        "169.254.169.254:443".to_owned(),
        "0xa9fea9fe:443".to_owned(),
        "[::ffff:169.254.169.254]:443".to_owned(),
        "10.0.0.1:443".to_owned(),
        "172.16.5.4:443".to_owned(),
        "192.168.1.1:443".to_owned(),
        "100.64.0.1:443".to_owned(),
        "[fd00::1]:443".to_owned(),
        "[fe80::1]:443".to_owned(),
        "[64:ff9b::a00:1]:443".to_owned(),
    ];
    for target in &private {
        let (status, body) = status_of(k.addr, &connect_line(target)).await;
        assert_eq!(status, 403, "CONNECT {target}: {body}");
        assert!(body.contains("private address"), "{target}: {body}");
        let relay = format!(
            "GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
            auth()
        );
        let (status, body) = status_of(k.addr, &relay).await;
        assert_eq!(status, 403, "GET http://{target}/: {body}");
    }
    let count = private.len() as f64 * 2.0;
    assert_eq!(k.refused("private_address"), Some(count));
    // Ports other than 443 (CONNECT) and 80 and 443 (relays) are refused before any dial:
    // 203.0.113.0/24 is documentation space, which nothing answers.
    for (request, what) in [
        (connect_line("203.0.113.9:22"), "CONNECT to 22"),
        (connect_line("203.0.113.9:80"), "CONNECT to 80"),
        (
            format!(
                "GET http://203.0.113.9:8080/ HTTP/1.1\r\nHost: 203.0.113.9:8080\r\n{}\r\n",
                auth()
            ),
            "a relay to 8080",
        ),
    ] {
        let (status, body) = status_of(k.addr, &request).await;
        assert_eq!(status, 403, "{what}: {body}");
        assert!(body.contains("port 443"), "{what}: {body}");
    }
    assert_eq!(k.refused("port"), Some(3.0));
    k.stop().await;
}

#[tokio::test]
async fn a_loopback_listener_may_reach_this_hosts_services_but_not_keyrelay() {
    let k = Running::start("127.0.0.1:0", |_| {}).await;
    let echo = echo_server().await;
    for target in [
        echo.to_string(),
        format!("localhost:{}", echo.port()),
        format!("2130706433:{}", echo.port()),
    ] {
        drop(open_tunnel(k.addr, &target).await);
    }
    assert_eq!(k.refused("private_address"), Some(0.0));
    k.stop().await;
}

#[tokio::test]
async fn allow_opens_a_destination_by_address_or_by_the_name_written() {
    let by_net = echo_server().await.port();
    let by_name = echo_server().await.port();
    let k = Running::start("0.0.0.0:0", |config| {
        let text = format!(
            "[forward]\nallow = [\"127.0.0.0/8:{by_net}\", \"Localhost:{by_name}\"]\n[[keys]]\nname = \"x\"\nkey = \"{KEY_A}\"\n"
        );
        config.forward.allow = Config::from_toml_str(&text, &|_| None).unwrap().forward.allow;
    })
    .await;
    // A network entry covers every notation of its addresses, at its port.
    for host in ["127.0.0.1", "127.1", "2130706433", "[::ffff:127.0.0.1]"] {
        drop(open_tunnel(k.addr, &format!("{host}:{by_net}")).await);
    }
    let (status, _) = status_of(k.addr, &connect_line(&format!("127.0.0.1:{}", by_net + 1))).await;
    assert_eq!(status, 403, "the same address on another port");
    // A name entry opens that name as written (any case), and not its address written
    // another way.
    drop(open_tunnel(k.addr, &format!("LOCALHOST:{by_name}")).await);
    let (status, _) = status_of(k.addr, &connect_line(&format!("127.0.0.1:{by_name}"))).await;
    assert_eq!(status, 403, "127.0.0.1 is not the name localhost");
    k.stop().await;
}

#[tokio::test]
async fn keyrelays_own_listeners_are_refused_by_any_name_even_when_allowed() {
    for bind in ["127.0.0.1:0", "0.0.0.0:0"] {
        let k = Running::start(bind, |config| {
            let text = format!(
                "[forward]\nallow = [\"127.0.0.0/8:*\", \"localhost:*\", \"[::/0]:*\", \"0.0.0.0/0:*\"]\n[[keys]]\nname = \"x\"\nkey = \"{KEY_A}\"\n"
            );
            config.forward.allow = Config::from_toml_str(&text, &|_| None).unwrap().forward.allow;
        })
        .await;
        let mut refused = 0.0;
        for port in [k.addr.port(), k.admin.port()] {
            for host in [
                "127.0.0.1",
                "127.1",
                "2130706433",
                "0x7f.0.0.1",
                "[::ffff:127.0.0.1]",
                "localhost",
                "0.0.0.0",
            ] {
                let target = format!("{host}:{port}");
                let (status, body) = status_of(k.addr, &connect_line(&target)).await;
                assert_eq!(status, 403, "{bind}: CONNECT {target}: {body}");
                assert!(body.contains("keyrelay's own listeners"), "{body}");
                refused += 1.0;
            }
        }
        // The admin API is not reachable through a relay either: the key stays in rotation.
        let disable = format!(
            "POST http://127.0.0.1:{}/admin/keys/a/disable HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n{}\r\n",
            k.admin.port(),
            auth()
        );
        let (status, _) = status_of(k.addr, &disable).await;
        assert_eq!(status, 403, "{bind}");
        refused += 1.0;
        assert_eq!(
            k.app.admin_hold("a"),
            None,
            "{bind}: a relay disabled a key"
        );
        assert_eq!(k.refused("keyrelay_listener"), Some(refused), "{bind}");
        k.stop().await;
    }
}

// === every connection counts ===

#[tokio::test]
async fn tunnels_raw_and_intercepted_keep_their_place_under_the_connection_cap() {
    let k = Running::start("127.0.0.1:0", |config| config.limits.max_connections = 4).await;
    let echo = echo_server().await;
    let mut tunnels = Vec::new();
    for _ in 0..2 {
        tunnels.push(open_tunnel(k.addr, &echo.to_string()).await);
    }
    // Intercepted CONNECTs hold places too, before and after their handshake.
    for _ in 0..2 {
        let (stream, head, _) = exchange(k.addr, &connect_line("ocr.captchaai.com:443")).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        tunnels.push(stream);
    }
    until_served(k.addr, false).await;
    // The admin listener has a cap of its own: tunnels never lock the operator out.
    let mut admin = TcpStream::connect(k.admin).await.unwrap();
    admin
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = read_head(&mut admin).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // One tunnel closed gives its place back.
    drop(tunnels.remove(0));
    until_served(k.addr, true).await;
    k.stop().await;
}

#[tokio::test]
async fn a_token_holds_at_most_max_tunnels_and_intercepted_connects_do_not_count() {
    let k = Running::start("127.0.0.1:0", |config| {
        config.access.tokens = vec![token(2)];
    })
    .await;
    let echo = echo_server().await;
    let first = open_tunnel(k.addr, &echo.to_string()).await;
    let _second = open_tunnel(k.addr, &echo.to_string()).await;
    let (status, body) = status_of(k.addr, &connect_line(&echo.to_string())).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("max_tunnels"), "{body}");
    assert_eq!(k.refused("max_tunnels"), Some(1.0));
    let (_intercepted, head, _) = exchange(k.addr, &connect_line("ocr.captchaai.com:443")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(first);
    let mut reopened = false;
    for _ in 0..200 {
        let (status, _) = status_of(k.addr, &connect_line(&echo.to_string())).await;
        if status == 200 {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(reopened, "a closed tunnel never gave its place back");
    k.stop().await;
}

#[tokio::test]
async fn a_silent_tunnel_closes_after_tunnel_idle_and_gives_its_place_back() {
    let k = Running::start("127.0.0.1:0", |config| {
        config.limits.max_connections = 1;
        config.timeouts.tunnel_idle = Duration::from_millis(300);
    })
    .await;
    let echo = echo_server().await;
    let mut tunnel = open_tunnel(k.addr, &echo.to_string()).await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), tunnel.read_to_end(&mut rest))
        .await
        .expect("the idle tunnel is closed");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    until_served(k.addr, true).await;
    k.stop().await;
}

// === malformed CONNECTs ===

#[tokio::test]
async fn connect_targets_with_a_scheme_a_path_or_port_0_are_400_before_any_credential() {
    let k = Running::start("0.0.0.0:0", |_| {}).await;
    for target in [
        "ocr.captchaai.com:0",
        "example.test:0",
        "http://ocr.captchaai.com:443/",
        "https://example.test:443",
        "example.test:443/path",
        "user@example.test:443",
        "example.test:65536",
        "example.test",
    ] {
        // No credential at all: the malformed target is what is answered.
        let request = format!("CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        let (mut stream, head, rest) = exchange(k.addr, &request).await;
        let head_ok = head.starts_with("HTTP/1.1 400");
        let body = read_body(&mut stream, rest, content_length(&head)).await;
        assert!(
            head_ok,
            "CONNECT {target}: {head} {}",
            String::from_utf8_lossy(&body)
        );
    }
    k.stop().await;
}
