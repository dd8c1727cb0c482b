//! The floor under keyrelay's per-request cost: the same hyper server and upstream client,
//! relaying every request unchanged, with none of keyrelay's work (no parse, no key, no
//! pool, no pins, no metrics). docs/performance.md compares it with keyrelay and nginx.
//!
//! Not a criterion benchmark: `cargo bench --bench passthrough` only checks that it builds
//! and exits. To serve:
//!
//! ```sh
//! cargo bench --bench passthrough -- --serve 127.0.0.1:8081 http://127.0.0.1:8080
//! ```

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use keyrelay::upstream::{Outgoing, UpstreamClient};
use tokio::net::TcpListener;

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
    let listener = TcpListener::bind(&listen).await.expect("listen address");
    let client = UpstreamClient::new(Duration::from_secs(10)).expect("rustls defaults");
    println!("passthrough listening on {listen}, relaying to {upstream}");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (client, upstream) = (client.clone(), upstream.clone());
        let service = service_fn(move |req| relay(client.clone(), upstream.clone(), req));
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn relay(
    client: UpstreamClient,
    upstream: String,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("{upstream}{path}").parse::<Uri>() else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let sent = client
        .send(Outgoing {
            method: parts.method,
            uri,
            headers: &parts.headers,
            body,
            timeout: Duration::from_secs(60),
        })
        .await;
    Ok(match sent {
        Ok(answer) => {
            let mut response = Response::new(Full::new(answer.body));
            *response.status_mut() = answer.status;
            *response.headers_mut() = answer.headers;
            for hop in [hyper::header::CONNECTION, hyper::header::TRANSFER_ENCODING] {
                response.headers_mut().remove(hop);
            }
            response
        }
        Err(_) => status(StatusCode::BAD_GATEWAY),
    })
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = code;
    response
}
