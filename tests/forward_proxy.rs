//! The plain listener as an HTTP forward proxy: absolute-form requests to an intercepted
//! API host are the pool's; `CONNECT` to any other host is tunnelled byte for byte (or
//! refused with `tunnel = "none"`), absolute-form requests to one are relayed; with tokens,
//! neither passes without one; and bad `CONNECT`s get a clear answer.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::connect_proxy::{ConnectProxy, Mode};
use common::raw::*;
use common::*;
use keyrelay::config::Tunnel;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "client-token-0123456789abcdef012";

/// A proxy in front of the simulator (keys a, b) whose forward mode intercepts only the
/// real service's host, so that other servers on 127.0.0.1 count as "other hosts".
async fn proxy(edit: impl FnOnce(&mut keyrelay::Config)) -> Harness {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.forward.intercept = Some(vec!["ocr.captchaai.com".to_owned()]);
    edit(&mut config);
    Harness::start(sim, config).await
}

/// A one-answer HTTP server on 127.0.0.1:0: answers every request `hello`, and sends the
/// head of each request it got on the channel.
async fn http_server() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let (head, _) = read_head(&mut stream).await;
                let _ = tx.send(head);
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-origin: yes\r\n\r\nhello",
                    )
                    .await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn absolute_form_requests_to_an_api_host_are_served_by_the_pool() {
    let h = proxy(|_| {}).await;
    // The script names the real service; keyrelay serves it from the pool (the simulator)
    // and never looks the name up.
    let (mut stream, head, rest) = exchange(
        h.addr,
        &format!(
            "GET http://ocr.captchaai.com/in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=https://x.test&json=1 HTTP/1.1\r\nHost: ocr.captchaai.com\r\n\r\n"
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("x-keyrelay-key:"),
        "{head}"
    );
    let body = read_body(&mut stream, rest, content_length(&head)).await;
    let answer: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(answer["status"], 1, "{answer}");
    let submits: Vec<_> = h
        .sim
        .received()
        .into_iter()
        .filter(|r| r.path == "/in.php")
        .collect();
    assert_eq!(submits.len(), 1);
    assert!(
        !submits[0].query.contains(CALLER_KEY),
        "the caller's key went upstream"
    );
    h.stop().await;
}

#[tokio::test]
async fn connect_to_another_host_is_tunnelled_byte_for_byte() {
    let h = proxy(|_| {}).await;
    let echo = echo_server().await;
    let (mut stream, head, rest) = exchange(
        h.addr,
        &format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(rest.is_empty());
    // Bytes that are no HTTP at all, both ways, unchanged.
    let payload: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    stream.write_all(&payload).await.unwrap();
    let echoed = read_body(&mut stream, Vec::new(), payload.len()).await;
    assert_eq!(echoed, payload);
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_forward_requests_total{outcome=\"tunnelled\"}"
        ),
        Some(1.0)
    );
    drop(stream);
    h.stop().await;
}

/// A tunnel to an IPv6 literal dials the address inside the brackets. Skipped where the
/// machine has no IPv6 loopback.
#[tokio::test]
async fn connect_to_an_ipv6_literal_is_tunnelled() {
    let Ok(listener) = TcpListener::bind("[::1]:0").await else {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    };
    let echo = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let h = proxy(|_| {}).await;
    // `echo` displays as `[::1]:PORT`, as a CONNECT line spells it.
    let (mut stream, head, _) = exchange(
        h.addr,
        &format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream.write_all(b"ping over v6").await.unwrap();
    assert_eq!(
        read_body(&mut stream, Vec::new(), 12).await,
        b"ping over v6"
    );
    drop(stream);
    h.stop().await;
}

#[tokio::test]
async fn absolute_form_requests_to_another_host_are_relayed_without_proxy_headers() {
    let h = proxy(|_| {}).await;
    let (origin, mut heads) = http_server().await;
    let (mut stream, head, rest) = exchange(
        h.addr,
        &format!(
            "GET http://{origin}/page?q=1 HTTP/1.1\r\nHost: {origin}\r\nProxy-Connection: keep-alive\r\nX-Script: s\r\n\r\n"
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("x-origin: yes"), "{head}");
    let body = read_body(&mut stream, rest, content_length(&head)).await;
    assert_eq!(body, b"hello");
    let seen = heads.recv().await.expect("the origin got the request");
    assert!(seen.starts_with("GET /page?q=1 HTTP/1.1"), "{seen}");
    assert!(seen.to_ascii_lowercase().contains("x-script: s"), "{seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("proxy-connection"),
        "{seen}"
    );
    h.stop().await;
}

#[tokio::test]
async fn tunnel_none_refuses_other_hosts_with_a_reason() {
    let h = proxy(|config| config.forward.tunnel = Tunnel::None).await;
    let echo = echo_server().await;
    for request in [
        format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n"),
        format!("GET http://{echo}/ HTTP/1.1\r\nHost: {echo}\r\n\r\n"),
    ] {
        let (mut stream, head, rest) = exchange(h.addr, &request).await;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
        let body = read_body(&mut stream, rest, content_length(&head)).await;
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("tunnel = \"none\""), "{body}");
    }
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_forward_requests_total{outcome=\"refused\"}"
        ),
        Some(2.0)
    );
    // The API host is still the pool's.
    let (_, head, _) = exchange(
        h.addr,
        "GET http://ocr.captchaai.com/res.php?key=k&action=getbalance HTTP/1.1\r\nHost: ocr.captchaai.com\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    h.stop().await;
}

#[tokio::test]
async fn bad_connect_targets_get_a_clear_answer_and_others_are_unaffected() {
    let h = proxy(|_| {}).await;
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let cases = [
        (
            "CONNECT example.test HTTP/1.1\r\nHost: example.test\r\n\r\n".to_owned(),
            "400",
        ),
        (
            format!("CONNECT {closed} HTTP/1.1\r\nHost: {closed}\r\n\r\n"),
            "502",
        ),
        (
            "GET https://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n".to_owned(),
            "400",
        ),
        // No host: nothing to look up, so no lookup's error either.
        (
            "CONNECT :443 HTTP/1.1\r\nHost: :443\r\n\r\n".to_owned(),
            "400",
        ),
        ("CONNECT []:443 HTTP/1.1\r\n\r\n".to_owned(), "400"),
        // A port out of range is no port.
        (
            "CONNECT example.test:99999 HTTP/1.1\r\n\r\n".to_owned(),
            "400",
        ),
    ];
    for (request, status) in cases {
        let (_, head, _) = exchange(h.addr, &request).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status}")),
            "{request:?} -> {head}"
        );
    }
    // A CONNECT line far over the header limit is refused by hyper, not a panic.
    let huge = format!("CONNECT {}:443 HTTP/1.1\r\n\r\n", "a".repeat(100_000));
    let mut stream = TcpStream::connect(h.addr).await.unwrap();
    let _ = stream.write_all(huge.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    // The pool still answers.
    assert_eq!(h.get("/res.php?key=k&action=getbalance").await.status, 200);
    h.stop().await;
}

#[tokio::test]
async fn with_tokens_nothing_is_forwarded_without_one() {
    let h = proxy(|config| {
        config.access.tokens.push(caller_token("client", TOKEN));
    })
    .await;
    let echo = echo_server().await;
    for auth in [
        String::new(),
        format!("Proxy-Authorization: Basic {}\r\n", basic("u", "wrong")),
    ] {
        let (_, head, _) = exchange(
            h.addr,
            &format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n{auth}\r\n"),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 407"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("proxy-authenticate: basic"),
            "{head}"
        );
        assert!(!head.contains(TOKEN));
    }
    // The token as the password, or as the user with no password.
    for (user, password) in [("anyone", TOKEN), (TOKEN, "")] {
        let (mut stream, head, _) = exchange(
            h.addr,
            &format!(
                "CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\nProxy-Authorization: Basic {}\r\n\r\n",
                basic(user, password)
            ),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        stream.write_all(b"ping").await.unwrap();
        assert_eq!(read_body(&mut stream, Vec::new(), 4).await, b"ping");
    }
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_forward_requests_total{outcome=\"unauthorized\"}"
        ),
        Some(2.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn shutdown_closes_open_tunnels() {
    let h = proxy(|_| {}).await;
    let echo = echo_server().await;
    let (mut stream, head, _) = exchange(
        h.addr,
        &format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // `stop` waits for the server to finish draining: it would hang on an open tunnel.
    tokio::time::timeout(Duration::from_secs(20), h.stop())
        .await
        .expect("the drain closes the tunnel");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
}

// === CONNECT to an intercepted API host ===

/// A TLS client trusting only keyrelay's local CA, over an already open tunnel.
async fn tls_over(
    h: &Harness,
    tunnel: TcpStream,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let ca = h.app.ca().expect("the local CA");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tunnel))
        .await
        .expect("the handshake ends")
}

/// Writes a request on `io` and reads its answer: head and body.
async fn request_on<I>(io: &mut I, request: &str) -> (String, Vec<u8>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    io.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len = content_length(&head);
            let mut body = buf[end + 4..].to_vec();
            while body.len() < len {
                let n = io.read(&mut chunk).await.unwrap();
                assert!(n > 0, "closed early");
                body.extend_from_slice(&chunk[..n]);
            }
            return (head, body);
        }
        let n = tokio::time::timeout(Duration::from_secs(10), io.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "closed before an answer");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn connect_to_an_api_host_is_intercepted_and_served_by_the_pool() {
    let h = proxy(|_| {}).await;
    let (tunnel, head, rest) = exchange(
        h.addr,
        "CONNECT ocr.captchaai.com:443 HTTP/1.1\r\nHost: ocr.captchaai.com:443\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(rest.is_empty());
    let mut tls = tls_over(&h, tunnel, "ocr.captchaai.com")
        .await
        .expect("keyrelay presents a certificate for the host, signed by its CA");
    let host = "Host: ocr.captchaai.com\r\n";
    let (head, body) = request_on(
        &mut tls,
        &format!("GET /in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=https://x.test&json=1 HTTP/1.1\r\n{host}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("x-keyrelay-key:"),
        "{head}"
    );
    let submitted: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let id = submitted["request"]
        .to_string()
        .trim_matches('"')
        .to_owned();
    // The poll on the same connection goes to the key that took the task.
    let (head, body) = request_on(
        &mut tls,
        &format!("GET /res.php?key={CALLER_KEY}&action=get&id={id} HTTP/1.1\r\n{host}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let answer = String::from_utf8_lossy(&body);
    assert!(
        answer == "CAPCHA_NOT_READY" || answer.starts_with("OK|"),
        "{answer}"
    );
    // The task's requests; the pool's own balance and thread reads come and go meanwhile.
    let received: Vec<_> = (h.sim.received().into_iter())
        .filter(|r| r.path == "/in.php" || r.query.contains("action=get&"))
        .collect();
    assert_eq!(
        received.len(),
        2,
        "one submit, one poll upstream: {received:?}"
    );
    let owner = h
        .sim
        .task_owner(id.parse().unwrap())
        .expect("the task exists");
    for r in &received {
        assert!(
            !r.query.contains(CALLER_KEY),
            "the caller's key went upstream"
        );
        assert!(
            r.query.contains(&owner),
            "every request used the task's key"
        );
    }
    let metrics = h.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "keyrelay_forward_requests_total{outcome=\"intercepted\"}"
        ),
        Some(1.0)
    );
    h.stop().await;
}

#[tokio::test]
async fn a_bad_handshake_inside_an_intercepted_tunnel_is_counted_and_harms_nobody() {
    let h = proxy(|_| {}).await;
    let (mut tunnel, head, _) = exchange(
        h.addr,
        "CONNECT ocr.captchaai.com:443 HTTP/1.1\r\nHost: ocr.captchaai.com:443\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Plain HTTP where the TLS handshake should be.
    tunnel
        .write_all(b"GET /in.php HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tunnel.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the tunnel is closed");
    let counted = || async {
        metric(
            &h.metrics().await,
            "keyrelay_tls_handshake_failures_total{reason=\"not_tls\"}",
        )
    };
    for _ in 0..500 {
        if counted().await == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        counted().await,
        Some(1.0),
        "{}",
        h.metrics()
            .await
            .lines()
            .filter(|l| l.contains("tls_handshake"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A client that trusts another name than the one asked for: the certificate is the
    // host's, so a check for a different name fails.
    let (tunnel, head, rest) = exchange(
        h.addr,
        "CONNECT ocr.captchaai.com:443 HTTP/1.1\r\nHost: ocr.captchaai.com:443\r\n\r\n",
    )
    .await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{head} {}",
        String::from_utf8_lossy(&rest)
    );
    assert!(tls_over(&h, tunnel, "example.com").await.is_err());
    // The pool still answers.
    assert_eq!(h.get("/res.php?key=k&action=getbalance").await.status, 200);
    h.stop().await;
}

#[tokio::test]
async fn a_token_in_the_proxy_url_serves_the_requests_inside_an_intercepted_tunnel() {
    let h = proxy(|config| {
        config.access.tokens.push(caller_token("client", TOKEN));
    })
    .await;
    let submit = format!(
        "GET /in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=https://x.test HTTP/1.1\r\nHost: ocr.captchaai.com\r\n\r\n"
    );
    // The script's own key is no token; the tunnel's credential is.
    for (auth, expect) in [
        (
            format!("Proxy-Authorization: Basic {}\r\n", basic("script", TOKEN)),
            "OK|",
        ),
        (String::new(), "ERROR_WRONG_USER_KEY"),
    ] {
        let (tunnel, head, _) = exchange(
            h.addr,
            &format!("CONNECT ocr.captchaai.com:443 HTTP/1.1\r\nHost: ocr.captchaai.com:443\r\n{auth}\r\n"),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut tls = tls_over(&h, tunnel, "ocr.captchaai.com").await.unwrap();
        let (head, body) = request_on(&mut tls, &submit).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let body = String::from_utf8_lossy(&body);
        assert!(body.starts_with(expect), "{auth:?}: {body}");
    }
    for r in h.sim.received() {
        assert!(!r.query.contains(TOKEN), "the token went upstream");
        assert!(
            !r.query.contains(CALLER_KEY),
            "the caller's key went upstream"
        );
    }
    h.stop().await;
}

// === Through `upstream_proxy` ===

/// `Basic base64("relay:pa55-w0rd")`, keyrelay's own credential for the parent proxy.
const PARENT_AUTH: &str = "Basic cmVsYXk6cGE1NS13MHJk";
const PARENT_PASSWORD: &str = "pa55-w0rd";

/// A proxy (as `proxy` makes it) whose outgoing connections go through `parent`, with
/// tokens on, so that the caller's own `Proxy-Authorization` is there to be dropped. A
/// parent that fails fails the startup refresh too, so that is only awaited when asked.
async fn behind(parent: &str, wait_for_refresh: bool) -> Harness {
    behind_bypassing(parent, wait_for_refresh, &[]).await
}

/// [`behind`], with `direct` in `upstream_no_proxy`.
async fn behind_bypassing(parent: &str, wait_for_refresh: bool, direct: &[&str]) -> Harness {
    let sim = sim_with(&[KEY_A, KEY_B]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0), ("b", KEY_B, 1.0)]);
    config.forward.intercept = Some(vec!["ocr.captchaai.com".to_owned()]);
    let parent = keyrelay::config::UpstreamProxy::parse(parent).expect("a valid proxy URL");
    config.upstream_proxy = Some(parent.bypassing(direct).expect("valid hosts"));
    config.access.tokens.push(caller_token("client", TOKEN));
    if wait_for_refresh {
        Harness::start(sim, config).await
    } else {
        Harness::start_without_refresh_wait(sim, config).await
    }
}

/// A parent proxy that tunnels for keyrelay's credential, and a proxy behind it.
async fn behind_a_working_parent() -> (ConnectProxy, Harness) {
    let parent = ConnectProxy::start(Mode::Tunnel {
        require: Some(PARENT_AUTH.to_owned()),
    })
    .await;
    let h = behind(&parent.url(Some(&format!("relay:{PARENT_PASSWORD}"))), true).await;
    (parent, h)
}

/// Opens a tunnel to `echo` through the proxy at `addr` with the caller's token, and checks
/// that `payload` comes back through it; the open tunnel.
async fn tunnel_with_token(addr: SocketAddr, echo: SocketAddr, payload: &[u8]) -> TcpStream {
    let (mut stream, head, _) = exchange(
        addr,
        &format!(
            "CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n{}\r\n",
            caller_auth()
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream.write_all(payload).await.unwrap();
    assert_eq!(
        read_body(&mut stream, Vec::new(), payload.len()).await,
        payload
    );
    stream
}

fn caller_auth() -> String {
    format!("Proxy-Authorization: Basic {}\r\n", basic("script", TOKEN))
}

/// With no direct way out, a script's other sites are reached through the parent proxy
/// too: a tunnel is a `CONNECT` there with keyrelay's credential, never the caller's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_another_host_is_tunnelled_through_the_upstream_proxy() {
    let (parent, h) = behind_a_working_parent().await;
    let echo = echo_server().await;
    let stream = tunnel_with_token(h.addr, echo, b"through the parent").await;
    let to_echo: Vec<_> = parent
        .seen()
        .into_iter()
        .filter(|c| c.target == echo.to_string())
        .collect();
    assert_eq!(to_echo.len(), 1, "{:?}", parent.seen());
    assert_eq!(to_echo[0].method, "CONNECT");
    assert_eq!(to_echo[0].auth.as_deref(), Some(PARENT_AUTH));
    drop(stream);
    h.stop().await;
}

/// A plain-http relay is handed to the parent in absolute form, as a proxy chain does,
/// with keyrelay's credential in place of the caller's; the parent's answer is relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_requests_to_another_host_are_relayed_through_the_upstream_proxy() {
    let (parent, h) = behind_a_working_parent().await;
    // Never reached: the parent answers for it.
    let (origin, mut heads) = http_server().await;
    let (mut stream, head, rest) = exchange(
        h.addr,
        &format!(
            "GET http://{origin}/page?q=1 HTTP/1.1\r\nHost: {origin}\r\n{}\r\n",
            caller_auth()
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let body = read_body(&mut stream, rest, content_length(&head)).await;
    assert_eq!(body, b"relayed");
    let relayed: Vec<_> = parent
        .seen()
        .into_iter()
        .filter(|c| c.method == "GET")
        .collect();
    assert_eq!(relayed.len(), 1, "{:?}", parent.seen());
    assert_eq!(relayed[0].target, format!("http://{origin}/page?q=1"));
    assert_eq!(relayed[0].auth.as_deref(), Some(PARENT_AUTH));
    assert!(heads.try_recv().is_err(), "keyrelay went around the parent");
    drop(stream);
    h.stop().await;
}

/// A parent that refuses, asks for other credentials or is not there: the caller gets a
/// well-formed answer that names the parent without its password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_proxy_that_fails_gets_the_caller_a_clear_answer_without_its_password() {
    let userinfo = format!("relay:{PARENT_PASSWORD}");
    let forbidden = ConnectProxy::start(Mode::Refuse(403)).await;
    let wrong_password = ConnectProxy::start(Mode::Tunnel {
        require: Some("Basic c29tZW9uZTplbHNl".to_owned()),
    })
    .await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{userinfo}@{}", listener.local_addr().unwrap());
        drop(listener);
        url
    };
    let echo = echo_server().await;
    for (case, url, relay_status) in [
        ("403", forbidden.url(Some(&userinfo)), "403"),
        ("407", wrong_password.url(Some(&userinfo)), "407"),
        ("closed port", closed, "502"),
    ] {
        let h = behind(&url, false).await;
        // A relayed request gets the parent's own answer; it is the origin, to the caller.
        for (request, status) in [
            (
                format!(
                    "CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n{}\r\n",
                    caller_auth()
                ),
                "502",
            ),
            (
                format!(
                    "GET http://{echo}/ HTTP/1.1\r\nHost: {echo}\r\n{}\r\n",
                    caller_auth()
                ),
                relay_status,
            ),
        ] {
            let (mut stream, head, rest) = exchange(h.addr, &request).await;
            assert!(
                head.starts_with(&format!("HTTP/1.1 {status}")),
                "{case}: {head}"
            );
            let body = read_body(&mut stream, rest, content_length(&head)).await;
            let body = String::from_utf8_lossy(&body);
            assert!(!head.contains(PARENT_PASSWORD), "{case}: {head}");
            assert!(!body.contains(PARENT_PASSWORD), "{case}: {body}");
            assert!(
                !head.to_ascii_lowercase().contains("proxy-authenticate"),
                "{case}: the parent's challenge is not the caller's: {head}"
            );
            if status == "502" {
                assert!(body.starts_with("cannot "), "{case}: {body}");
                assert!(body.contains("upstream_proxy"), "{case}: {body}");
            }
        }
        h.stop().await;
    }
}

/// Hosts in `upstream_no_proxy` are dialled directly: the parent (which would refuse) sees
/// nothing, and a relayed request carries no credential of the parent's to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_in_upstream_no_proxy_are_reached_directly_without_the_parents_credential() {
    let parent = ConnectProxy::start(Mode::Refuse(403)).await;
    let url = parent.url(Some(&format!("relay:{PARENT_PASSWORD}")));
    // The simulator is on 127.0.0.1 too, so the startup refresh goes direct as well.
    let h = behind_bypassing(&url, true, &["localhost", "127.0.0.0/8"]).await;
    let echo = echo_server().await;
    drop(tunnel_with_token(h.addr, echo, b"direct").await);

    let (origin, mut heads) = http_server().await;
    let (mut stream, head, rest) = exchange(
        h.addr,
        &format!(
            "GET http://{origin}/page HTTP/1.1\r\nHost: {origin}\r\n{}\r\n",
            caller_auth()
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        read_body(&mut stream, rest, content_length(&head)).await,
        b"hello"
    );
    let seen = heads.recv().await.expect("the origin got the request");
    assert!(seen.starts_with("GET /page HTTP/1.1"), "{seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("proxy-authorization"),
        "{seen}"
    );
    assert!(parent.seen().is_empty(), "{:?}", parent.seen());
    h.stop().await;
}
