//! The floor under keyrelay's per-request cost: hyper's HTTP/1 server and client on tokio,
//! relaying every request unchanged, with as little glue as hyper 1.x allows and none of
//! keyrelay's work (no parse, key, pool, pins, metrics, timers or header edits).
//! docs/performance.md compares it with keyrelay and nginx.
//!
//! What it leaves out is on purpose, so that it shows what hyper itself costs: the caller's
//! request goes upstream as hyper parsed it (origin-form URI, headers, streamed body), and
//! the upstream's answer comes back the same way; each caller connection has one upstream
//! connection of its own, dialled on its first request, so there is no shared pool either;
//! no header-read timer and no per-request timeout. An upstream failure closes the caller's
//! connection rather than answering 502: it is a benchmark target, not a proxy.
//!
//! Not a criterion benchmark: `cargo bench --bench passthrough` only checks that it builds
//! and exits. To serve:
//!
//! ```sh
//! cargo bench --bench passthrough -- --serve 127.0.0.1:8081 http://127.0.0.1:8080
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream connection of one caller connection. The server serves a connection's
/// requests one after another, so it is free whenever a request takes it.
type Upstream = Arc<Mutex<Option<SendRequest<Incoming>>>>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|a| a == "--serve") else {
        println!("passthrough: pass --serve LISTEN UPSTREAM to run it");
        return;
    };
    let (Some(listen), Some(upstream)) = (args.get(at + 1), args.get(at + 2)) else {
        eprintln!("usage: passthrough --serve LISTEN UPSTREAM");
        std::process::exit(2);
    };
    // As keyrelay does on one CPU (see main.rs): a current-thread runtime.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(serve(listen.clone(), upstream.clone()));
}

async fn serve(listen: String, upstream: String) {
    let uri: Uri = upstream.parse().expect("an upstream URL");
    let authority = uri
        .authority()
        .expect("an upstream URL with a host:port")
        .as_str();
    let upstream = tokio::net::lookup_host(authority)
        .await
        .expect("an upstream address")
        .next()
        .expect("an upstream address");
    let listener = TcpListener::bind(&listen).await.expect("listen address");
    println!("passthrough listening on {listen}, relaying to {upstream}");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn: Upstream = Arc::default();
        let service = service_fn(move |req| relay(upstream, conn.clone(), req));
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                // One write of head and body, as keyrelay does: a small answer is cheaper
                // flattened than queued for writev.
                .writev(false)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn relay(
    upstream: SocketAddr,
    conn: Upstream,
    req: Request<Incoming>,
) -> Result<Response<Incoming>, BoxError> {
    let idle = conn.lock().expect("not poisoned").take();
    let mut sender = match idle {
        Some(sender) if !sender.is_closed() => sender,
        _ => dial(upstream).await?,
    };
    sender.ready().await?;
    let response = sender.send_request(req).await?;
    *conn.lock().expect("not poisoned") = Some(sender);
    Ok(response)
}

async fn dial(upstream: SocketAddr) -> Result<SendRequest<Incoming>, BoxError> {
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .writev(false)
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(connection);
    Ok(sender)
}
