//! A small HTTP `CONNECT` proxy on an ephemeral loopback port, standing in for the
//! corporate proxy of `upstream_proxy`: it records every request it is sent, then tunnels
//! (a `CONNECT`) or answers `relayed` itself (an absolute-form request), asks for
//! credentials or refuses, as told.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy does with a `CONNECT`.
#[derive(Clone, Debug)]
pub enum Mode {
    /// Opens the tunnel, if the request carries this `Proxy-Authorization` (when `Some`);
    /// otherwise answers 407.
    Tunnel { require: Option<String> },
    /// Answers with this status and closes, as a proxy whose policy forbids the target.
    Refuse(u16),
}

/// One request as the proxy read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    /// The request line's method: `CONNECT`, or that of a request to relay.
    pub method: String,
    /// The request line's target: `host:port` for a `CONNECT`, else the absolute URL.
    pub target: String,
    /// Its `Proxy-Authorization` value, if any.
    pub auth: Option<String>,
    /// Its `Host` value, if any.
    pub host: Option<String>,
}

pub struct ConnectProxy {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Connect>>>,
    task: JoinHandle<()>,
}

impl ConnectProxy {
    pub async fn start(mode: Mode) -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, mode.clone(), recorded.clone()));
            }
        });
        ConnectProxy { addr, seen, task }
    }

    /// `http://[userinfo@]127.0.0.1:port`, for `upstream_proxy`.
    pub fn url(&self, userinfo: Option<&str>) -> String {
        match userinfo {
            Some(userinfo) => format!("http://{userinfo}@{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// Every request read so far, in order.
    pub fn seen(&self) -> Vec<Connect> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut caller: TcpStream, mode: Mode, seen: Arc<Mutex<Vec<Connect>>>) {
    let Some(connect) = read_request(&mut caller).await else {
        return;
    };
    seen.lock().unwrap().push(connect.clone());
    let refusal = match &mode {
        Mode::Refuse(status) => Some(format!("HTTP/1.1 {status} Refused\r\n")),
        Mode::Tunnel { require: Some(want) } if connect.auth.as_deref() != Some(want) => Some(
            "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test\"\r\n"
                .to_owned(),
        ),
        Mode::Tunnel { .. } => None,
    };
    if let Some(status) = refusal {
        let _ = caller
            .write_all(format!("{status}Content-Length: 0\r\n\r\n").as_bytes())
            .await;
        return;
    }
    if connect.method != "CONNECT" {
        // Stands in for the origin: enough to show that the request came this way.
        let _ = caller
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nrelayed")
            .await;
        return;
    }
    let Ok(mut target) = TcpStream::connect(&connect.target).await else {
        let _ = caller
            .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            .await;
        return;
    };
    if caller
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut caller, &mut target).await;
}

/// The request head, up to its blank line (8 KiB at most, 5 s at most).
async fn read_request(stream: &mut TcpStream) -> Option<Connect> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 || head.len() > 8192 {
                return None;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Some(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()??;
    let text = String::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let target = request_line.next()?.to_owned();
    let mut connect = Connect {
        method,
        target,
        auth: None,
        host: None,
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        match name.trim().to_ascii_lowercase().as_str() {
            "proxy-authorization" => connect.auth = Some(value.trim().to_owned()),
            "host" => connect.host = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    Some(connect)
}
