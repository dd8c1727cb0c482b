//! Raw HTTP/1.1 on a TCP stream, for what a client library will not send: `CONNECT`
//! lines, absolute-form targets, tunnels held open. Also an echo server to tunnel to.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Sends `head` on a new connection to `addr`; the connection and the answer's head
/// (status line and headers) and whatever body bytes came with it.
pub async fn exchange(addr: SocketAddr, head: &str) -> (TcpStream, String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    let (answer, rest) = read_head(&mut stream).await;
    (stream, answer, rest)
}

pub async fn read_head(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            return (head, buf[end + 4..].to_vec());
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .expect("read");
        assert!(
            n > 0,
            "closed before a whole head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Reads until the body holds `len` bytes.
pub async fn read_body(stream: &mut TcpStream, mut body: Vec<u8>, len: usize) -> Vec<u8> {
    let mut chunk = [0u8; 4096];
    while body.len() < len {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("body within 10 s")
            .expect("read");
        assert!(n > 0, "closed early");
        body.extend_from_slice(&chunk[..n]);
    }
    body
}

pub fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// A TCP server on 127.0.0.1:0 that echoes whatever it reads.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A `Proxy-Authorization: Basic` credential's value for `user:password`.
pub fn basic(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}
