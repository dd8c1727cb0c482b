//! The HTTP client that talks to the captcha service: pooled HTTP/1 connections over rustls,
//! per-request timeouts, and errors that say whether the request may have arrived.

mod account;
mod dial;
mod pool;
pub mod roots;

pub use account::Account;
pub use dial::{open_tunnel, RelayConnector};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderMap};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;

use pool::{Origin, Pool};
use smallvec::SmallVec;

/// Answers from the service are a few hundred bytes; this only stops a broken or hostile
/// upstream from making keyrelay buffer without limit.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Idle upstream connections are kept this long so steady traffic skips TLS handshakes.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Why an upstream exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made, so the request was certainly not delivered.
    #[error("cannot connect to the upstream: {0}")]
    Connect(String),
    /// The request may have been delivered, but no complete answer came back.
    #[error("the upstream did not answer: {0}")]
    NoAnswer(String),
    /// No answer within the configured timeout.
    #[error("the upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The answer was larger than any real answer can be.
    #[error("the upstream answer exceeded {MAX_ANSWER_BYTES} bytes")]
    AnswerTooLarge,
}

impl UpstreamError {
    /// Whether the upstream may have received and acted on the request. A submit that fails
    /// this way may already have created a task.
    pub fn may_have_arrived(&self) -> bool {
        !self.never_connected()
    }

    /// Whether the upstream's host:port refused the connection or could not be reached (a
    /// name that does not resolve, a failed TLS handshake, a tunnel the upstream proxy
    /// refused) before the request was written: a fact about that host:port, which every
    /// key sent there would meet as well.
    pub fn never_connected(&self) -> bool {
        matches!(self, UpstreamError::Connect(_))
    }

    /// Closed set of labels for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect",
            UpstreamError::NoAnswer(_) => "no_answer",
            UpstreamError::Timeout(_) => "timeout",
            UpstreamError::AnswerTooLarge => "too_large",
        }
    }
}

/// A complete answer from the upstream.
#[derive(Debug)]
pub struct UpstreamAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A request ready to send.
pub struct Outgoing<'a> {
    pub method: Method,
    pub uri: Uri,
    /// End-to-end headers of the caller's request worth forwarding (content type, user agent).
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    pub timeout: Duration,
}

/// Cheap to clone: the connection pool is shared.
#[derive(Clone)]
pub struct UpstreamClient {
    pool: Arc<Pool>,
}

impl UpstreamClient {
    /// A client that checks https upstreams against `roots` (from [`roots::configured`]),
    /// and opens every connection through `proxy` if there is one.
    ///
    /// # Errors
    /// Fails only if rustls cannot set up its TLS defaults.
    pub fn new(
        connect_timeout: Duration,
        roots: rustls::RootCertStore,
        proxy: Option<&crate::config::UpstreamProxy>,
    ) -> Result<UpstreamClient, rustls::Error> {
        let mut http = HttpConnector::new();
        // The https connector below decides the scheme; HttpConnector must accept both.
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(roots::client_config(provider, roots)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(dial::Dial::new(http, proxy));
        Ok(UpstreamClient {
            pool: Arc::new(Pool::new(https, POOL_IDLE_TIMEOUT)),
        })
    }

    /// Sends one request and reads the whole answer.
    ///
    /// # Errors
    /// See [`UpstreamError`]; every failure says whether the request may have arrived.
    pub async fn send(&self, out: Outgoing<'_>) -> Result<UpstreamAnswer, UpstreamError> {
        let timeout = out.timeout;
        let now = Instant::now();
        let deadline = now + timeout;
        let (origin, request, idle) = self.request_for(out, now)?;
        // An idle connection brings the timer its last exchange ran under, still
        // registered: moving its deadline later is an atomic store, where a new timer
        // is a registration in the timer wheel and a removal again after.
        let (idle, mut timer) = match idle {
            Some(pool::Idle { sender, timer, .. }) => {
                let mut timer = timer;
                timer.as_mut().reset(deadline);
                (Some(sender), timer)
            }
            None => (None, Box::pin(tokio::time::sleep_until(deadline))),
        };
        let result = {
            let exchange = std::pin::pin!(self.exchange(&origin, request, idle));
            before(exchange, timer.as_mut()).await
        };
        let Some(result) = result else {
            return Err(UpstreamError::Timeout(timeout));
        };
        let (answer, sender) = result?;
        // The whole answer is read, so the connection can take the next request.
        self.pool.checkin(origin, sender, timer);
        Ok(answer)
    }

    async fn exchange(
        &self,
        origin: &Origin,
        mut request: Request<Full<Bytes>>,
        mut idle: Option<pool::Sender>,
    ) -> Result<(UpstreamAnswer, pool::Sender), UpstreamError> {
        loop {
            let reused = idle.is_some();
            let mut sender = match idle.take() {
                Some(sender) => sender,
                None => Box::pin(self.pool.connect(origin))
                    .await
                    .map_err(|e| UpstreamError::Connect(error_chain(&*e)))?,
            };
            if let Err(e) = sender.ready().await {
                // An idle connection the upstream closed meanwhile: dial a new one.
                if reused {
                    continue;
                }
                return Err(UpstreamError::Connect(error_chain(&e)));
            }
            let response = match sender.try_send_request(request).await {
                Ok(response) => response,
                Err(mut e) => match e.take_message() {
                    // Not written to the connection, so certainly not delivered: an idle
                    // connection closing under it is retried once on a fresh one.
                    Some(unsent) if reused => {
                        request = unsent;
                        continue;
                    }
                    Some(_) => return Err(UpstreamError::Connect(error_chain(e.error()))),
                    None => return Err(UpstreamError::NoAnswer(error_chain(e.error()))),
                },
            };
            let (parts, body) = response.into_parts();
            let body = read_answer(body).await?;
            let answer = UpstreamAnswer {
                status: parts.status,
                headers: parts.headers,
                body,
            };
            return Ok((answer, sender));
        }
    }
}

/// `work`'s output, or `None` if `timer` ends first: `tokio::time::timeout` with a timer
/// owned by the caller, so that it can be used again. As there, `work` is polled first, and
/// the timer is polled even when `work` spent the task's budget, so a busy exchange still
/// times out.
async fn before<F: Future>(
    mut work: Pin<&mut F>,
    mut timer: Pin<&mut tokio::time::Sleep>,
) -> Option<F::Output> {
    use std::task::Poll;
    use tokio::task::coop;
    futures_util::future::poll_fn(move |cx| {
        let had_budget = coop::has_budget_remaining();
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        let ended = if had_budget && !coop::has_budget_remaining() {
            Pin::new(&mut coop::unconstrained(timer.as_mut())).poll(cx)
        } else {
            timer.as_mut().poll(cx)
        };
        ended.map(|()| None)
    })
    .await
}

/// Reads a whole answer body, up to [`MAX_ANSWER_BYTES`]. An answer comes in one frame, kept
/// as it is; only an answer in several is copied into one buffer.
async fn read_answer<B>(mut body: B) -> Result<Bytes, UpstreamError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| UpstreamError::NoAnswer(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.len() > MAX_ANSWER_BYTES - len {
            return Err(UpstreamError::AnswerTooLarge);
        }
        len += data.len();
        match (&mut joined, first.take()) {
            (Some(joined), _) => joined.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(earlier)) => {
                let mut buf = BytesMut::with_capacity(earlier.len() + data.len());
                buf.extend_from_slice(&earlier);
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
        }
    }
    Ok(match joined {
        Some(joined) => joined.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// The request in origin form (`/in.php?…`) with a Host header, where it goes, and an
/// idle connection there if the pool has one.
type Prepared = (Origin, Request<Full<Bytes>>, Option<pool::Idle>);

impl UpstreamClient {
    fn request_for(&self, out: Outgoing<'_>, now: Instant) -> Result<Prepared, UpstreamError> {
        let parts = out.uri.into_parts();
        let (Some(authority), Some(path)) = (parts.authority, parts.path_and_query) else {
            return Err(UpstreamError::Connect(
                "the upstream URL has no host".to_owned(),
            ));
        };
        let origin = Origin {
            https: parts.scheme.as_ref() == Some(&hyper::http::uri::Scheme::HTTPS),
            authority,
        };
        let (host, idle) = self
            .pool
            .checkout(&origin, now)
            .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        let mut request = Request::new(Full::new(out.body));
        *request.method_mut() = out.method;
        *request.uri_mut() = Uri::from(path);
        let headers = request.headers_mut();
        headers.insert(header::HOST, host);
        // Without the field any coding is acceptable (RFC 9110 §12.5.3); an answer must come
        // back readable, for its task id to be pinned and its error code to be classified.
        headers.insert(header::ACCEPT_ENCODING, IDENTITY);
        copy_request_headers(out.headers, headers);
        Ok((origin, request, idle))
    }
}

/// The `Accept-Encoding` of every upstream request: answers uncompressed only.
const IDENTITY: header::HeaderValue = header::HeaderValue::from_static("identity");

/// Hop-by-hop headers (RFC 9110 §7.6.1) and those the client recomputes must not be copied.
/// The caller's `accept-encoding` gives way to keyrelay's own, [`IDENTITY`].
fn is_forwardable(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host"
            | "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "proxy-authenticate"
            | "te"
            | "trailer"
            | "upgrade"
            | "expect"
            | "accept-encoding"
            // The API takes no cookies, and a PHP upstream whose request_order includes
            // them would read a `key` cookie over the pool key keyrelay put in.
            | "cookie"
    )
}

/// Whether a caller's header may carry a credential: the API takes its key as a param and
/// nothing else, so such a header is at best useless upstream and at worst the caller's key
/// (or a keyrelay token) handed to the service. Matched by what the name says rather than a
/// list of known names, so `X-Api-Key`, `Api-Key`, `X-Auth-Token`, `X-Captcha-Key` and
/// whatever a client invents next all stay behind.
fn is_credential(name: &header::HeaderName) -> bool {
    // What clients send on nearly every request, none of them a credential: answered
    // without the substring scan, nine `contains` per header (2.6k instructions a request).
    !PLAIN_HEADERS.contains(name) && names_a_credential(name.as_str())
}

/// Whether a (lowercase) header name says it holds a credential.
fn names_a_credential(name: &str) -> bool {
    const HINTS: [&str; 9] = [
        "auth",
        "key",
        "token",
        "secret",
        "passw",
        "cookie",
        "session",
        "credential",
        "signature",
    ];
    HINTS.iter().any(|hint| name.contains(hint))
}

/// Standard headers that carry no credential, compared as `HeaderName`s (an integer
/// compare for a standard name).
const PLAIN_HEADERS: [header::HeaderName; 9] = [
    header::USER_AGENT,
    header::ACCEPT,
    header::ACCEPT_LANGUAGE,
    header::CONTENT_TYPE,
    header::CACHE_CONTROL,
    header::PRAGMA,
    header::ORIGIN,
    header::REFERER,
    header::DATE,
];

/// The header names a message's `Connection` headers list: hop-by-hop for that message
/// alone, so a proxy drops them along with `Connection` itself (RFC 9110 §7.6.1). Every
/// `Connection` header counts, each a comma-separated list; names are case-insensitive
/// (`HeaderName` lowercases them) and empty or malformed elements name nothing.
fn connection_options(headers: &HeaderMap) -> Vec<header::HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        // The options nearly every message carries name no header but those already
        // dropped; skipping them spares a parse and an allocation per message.
        .filter(|option| {
            !option.eq_ignore_ascii_case(b"keep-alive") && !option.eq_ignore_ascii_case(b"close")
        })
        .filter_map(|option| header::HeaderName::from_bytes(option).ok())
        .collect()
}

fn copy_request_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let listed = connection_options(from);
    for (name, value) in from {
        if is_forwardable(name) && !is_credential(name) && !listed.contains(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// An upstream answer's headers, cut down to those that pass back to the caller. In place:
/// an answer carries a handful of headers and one or two to drop, so editing its map is
/// cheaper than building another. `content-encoding` goes too: an answer is relayed only
/// once keyrelay has read it as text, so whatever its label said, it is not compressed.
pub fn answer_headers(mut headers: HeaderMap) -> HeaderMap {
    let listed = connection_options(&headers);
    // An answer drops two or three (content-length, connection, keep-alive): room for them
    // on the stack spares an allocation per answer.
    let dropped: SmallVec<[header::HeaderName; 4]> = headers
        .keys()
        .filter(|name| {
            !is_forwardable(name) || *name == header::CONTENT_ENCODING || listed.contains(name)
        })
        .cloned()
        .collect();
    for name in dropped {
        headers.remove(name);
    }
    headers
}

/// hyper's errors keep the useful part in their sources.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn every_request_carries_its_own_upstreams_host_first() {
        let client = UpstreamClient::new(
            Duration::from_secs(1),
            roots::configured(None).unwrap(),
            None,
        )
        .unwrap();
        let caller = header_map(&[
            ("user-agent", "python-requests"),
            ("host", "caller"),
            ("accept-encoding", "gzip, deflate"),
        ]);
        for (uri, host) in [
            ("http://127.0.0.1:9/in.php?a=1", "127.0.0.1:9"),
            ("https://ocr.example:8443/res.php", "ocr.example:8443"),
            // A second request to a known origin takes the value built for the first.
            ("http://127.0.0.1:9/res.php?id=1", "127.0.0.1:9"),
            ("http://[::1]:9/in.php", "[::1]:9"),
        ] {
            let (origin, request, idle) = client
                .request_for(
                    Outgoing {
                        method: Method::POST,
                        uri: uri.parse().unwrap(),
                        headers: &caller,
                        body: Bytes::new(),
                        timeout: Duration::from_secs(1),
                    },
                    Instant::now(),
                )
                .unwrap();
            assert_eq!(origin.authority.as_str(), host);
            assert!(idle.is_none(), "nothing was dialled");
            let names: Vec<&str> = request.headers().keys().map(|n| n.as_str()).collect();
            assert_eq!(names, ["host", "accept-encoding", "user-agent"], "{uri}");
            assert_eq!(request.headers()[header::HOST], host, "{uri}");
            assert_eq!(
                request.headers()[header::ACCEPT_ENCODING],
                "identity",
                "{uri}"
            );
            assert_eq!(request.uri().authority(), None, "origin form: {uri}");
        }
    }

    /// A body of the given frames, as the connection would hand them over.
    fn frames(
        chunks: &[&'static [u8]],
    ) -> impl hyper::body::Body<Data = Bytes, Error = std::convert::Infallible> + Unpin {
        let frames: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|chunk| Ok(hyper::body::Frame::data(Bytes::from_static(chunk))))
            .collect();
        http_body_util::StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn answers_in_any_number_of_frames_read_whole() {
        for chunks in [&[][..], &[&b"OK|123"[..]], &[b"OK", b"|", b"", b"123"]] {
            let body = read_answer(frames(chunks)).await.unwrap();
            assert_eq!(body, chunks.concat(), "{chunks:?}");
        }
        // One frame is passed on as it came, not copied.
        let chunk: &'static [u8] = b"OK|1";
        let body = read_answer(frames(&[chunk])).await.unwrap();
        assert_eq!(body.as_ptr(), chunk.as_ptr());
    }

    #[tokio::test]
    async fn answers_over_the_limit_are_refused_whatever_their_framing() {
        static BIG: [u8; MAX_ANSWER_BYTES] = [b'a'; MAX_ANSWER_BYTES];
        assert_eq!(
            read_answer(frames(&[&BIG])).await.unwrap().len(),
            MAX_ANSWER_BYTES
        );
        for chunks in [
            &[&BIG[..], b"a"][..],
            &[b"a", &BIG[..]],
            &[&BIG[1..], b"ab"],
        ] {
            assert!(matches!(
                read_answer(frames(chunks)).await,
                Err(UpstreamError::AnswerTooLarge)
            ));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_used_again_ends_at_its_new_deadline_and_never_before() {
        let start = tokio::time::Instant::now();
        let mut timer = Box::pin(tokio::time::sleep_until(start + Duration::from_secs(1)));
        // The first exchange ends in time, with its timer registered and not fired.
        let quick = std::pin::pin!(async { 7 });
        assert_eq!(before(quick, timer.as_mut()).await, Some(7));
        // Used again later, with a deadline past the one it was registered for: the old
        // deadline passes without ending the new exchange.
        tokio::time::advance(Duration::from_millis(500)).await;
        timer
            .as_mut()
            .reset(tokio::time::Instant::now() + Duration::from_secs(1));
        let never = std::pin::pin!(std::future::pending::<()>());
        assert_eq!(before(never, timer.as_mut()).await, None);
        assert_eq!(start.elapsed(), Duration::from_millis(1500));
        // And with an earlier deadline than before, too.
        timer
            .as_mut()
            .reset(tokio::time::Instant::now() + Duration::from_secs(5));
        let quick = std::pin::pin!(async { 8 });
        assert_eq!(before(quick, timer.as_mut()).await, Some(8));
        timer
            .as_mut()
            .reset(tokio::time::Instant::now() + Duration::from_millis(10));
        let never = std::pin::pin!(std::future::pending::<()>());
        assert_eq!(before(never, timer.as_mut()).await, None);
        assert_eq!(start.elapsed(), Duration::from_millis(1510));
    }

    // Real time: a task that never stops working never lets paused time move on.
    #[tokio::test]
    async fn the_timer_ends_an_exchange_that_spends_the_task_budget() {
        // Always ready to do more work and never done: tokio's coop budget runs out on
        // every poll, which must not keep the timer from being looked at.
        let busy = std::pin::pin!(async {
            loop {
                tokio::task::consume_budget().await;
            }
        });
        let mut timer = Box::pin(tokio::time::sleep(Duration::from_millis(100)));
        // tokio's own timeout looks past a spent budget, so it stops a timer that does not.
        let ended: Option<()> =
            tokio::time::timeout(Duration::from_secs(10), before(busy, timer.as_mut()))
                .await
                .expect("the timer ended the exchange");
        assert_eq!(ended, None);
    }

    #[test]
    fn the_plain_headers_shortcut_agrees_with_the_name_scan() {
        for name in &PLAIN_HEADERS {
            assert!(!names_a_credential(name.as_str()), "{name}");
            assert!(!is_credential(name), "{name}");
        }
        // The shortcut is by name: a credential-looking name still takes the scan.
        assert!(is_credential(&header::AUTHORIZATION));
        assert!(is_credential(&header::HeaderName::from_static("x-api-key")));
    }

    #[test]
    fn credential_headers_never_go_upstream() {
        let mut caller = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/x-www-form-urlencoded"),
            ("user-agent", "python-requests/2.32"),
            ("accept", "*/*"),
            ("accept-language", "en"),
            ("authorization", "Bearer CALLERSECRET"),
            ("proxy-authorization", "Basic CALLERSECRET"),
            ("x-api-key", "CALLERSECRET"),
            ("api-key", "CALLERSECRET"),
            ("apikey", "CALLERSECRET"),
            ("x-captcha-key", "CALLERSECRET"),
            ("x-auth-token", "CALLERSECRET"),
            ("x-access-token", "CALLERSECRET"),
            ("x-keyrelay-token", "CALLERSECRET"),
            ("cookie", "key=CALLERSECRET"),
            ("x-session-id", "CALLERSECRET"),
            ("x-client-secret", "CALLERSECRET"),
            ("x-password", "CALLERSECRET"),
            ("x-amz-signature", "CALLERSECRET"),
            ("x-credentials", "CALLERSECRET"),
        ] {
            caller.append(
                header::HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let mut sent = HeaderMap::new();
        copy_request_headers(&caller, &mut sent);
        let names: Vec<&str> = sent.keys().map(|n| n.as_str()).collect();
        assert_eq!(
            names,
            ["content-type", "user-agent", "accept", "accept-language"]
        );
        assert!(sent.values().all(|v| v.as_bytes() != b"CALLERSECRET"));
    }

    #[test]
    fn answers_keep_end_to_end_headers_and_lose_hop_by_hop_ones() {
        let mut upstream = HeaderMap::new();
        for (name, value) in [
            ("content-type", "text/plain"),
            ("server", "nginx"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("x-request-id", "r1"),
            ("connection", "keep-alive"),
            ("keep-alive", "timeout=5"),
            ("content-length", "12"),
            ("transfer-encoding", "chunked"),
            ("content-encoding", "gzip"),
            ("upgrade", "h2c"),
        ] {
            upstream.append(
                header::HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let kept = answer_headers(upstream);
        let listed: Vec<(&str, &str)> = kept
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            listed,
            [
                ("content-type", "text/plain"),
                ("server", "nginx"),
                ("set-cookie", "a=1"),
                ("set-cookie", "b=2"),
                ("x-request-id", "r1"),
            ]
        );
    }

    fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn names(map: &HeaderMap) -> Vec<&str> {
        let mut names: Vec<&str> = map.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn answer_headers_named_in_connection_are_dropped() {
        let upstream = header_map(&[
            ("content-type", "text/plain"),
            ("x-trace", "t1"),
            ("x-debug", "d"),
            ("server", "nginx"),
            ("Connection", " X-Trace ,close,, x-DEBUG"),
        ]);
        assert_eq!(names(&answer_headers(upstream)), ["content-type", "server"]);
    }

    #[test]
    fn caller_headers_named_in_connection_do_not_go_upstream() {
        let caller = header_map(&[
            ("user-agent", "python-requests"),
            ("x-forward-me", "1"),
            ("x-hop", "h"),
            ("connection", "keep-alive"),
            ("connection", "X-Hop"),
        ]);
        let mut sent = HeaderMap::new();
        copy_request_headers(&caller, &mut sent);
        assert_eq!(names(&sent), ["user-agent", "x-forward-me"]);
    }

    #[test]
    fn malformed_connection_options_name_nothing() {
        let upstream = header_map(&[
            ("x-kept", "1"),
            ("connection", "bad name, ,\"x-kept\", x-kept;q=1"),
        ]);
        assert_eq!(names(&answer_headers(upstream)), ["x-kept"]);
    }

    proptest::proptest! {
        /// Any set of end-to-end headers, any subset of them listed in one to three
        /// Connection headers in any case, with padding and empty elements: exactly the
        /// listed ones are dropped, on answers and on requests alike.
        #[test]
        fn exactly_the_listed_headers_are_dropped(
            headers in proptest::collection::btree_set("x-[a-z0-9]{1,8}", 1..8),
            listed_mask in proptest::collection::vec(proptest::prelude::any::<bool>(), 8),
            split in 1usize..4,
            upper in proptest::prelude::any::<bool>(),
        ) {
            let headers: Vec<String> = headers.into_iter().collect();
            let listed: Vec<&String> = headers
                .iter()
                .zip(&listed_mask)
                .filter_map(|(name, &on)| on.then_some(name))
                .collect();
            let mut pairs: Vec<(String, String)> =
                headers.iter().map(|n| (n.clone(), "v".to_owned())).collect();
            pairs.push(("content-type".to_owned(), "text/plain".to_owned()));
            let spelled: Vec<String> = listed
                .iter()
                .map(|n| if upper { n.to_ascii_uppercase() } else { (*n).clone() })
                .collect();
            for chunk in spelled.chunks(spelled.len().div_ceil(split).max(1)) {
                pairs.push(("connection".to_owned(), format!(" {}, ,", chunk.join(" ,"))));
            }
            let pairs: Vec<(&str, &str)> =
                pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let mut want: Vec<&str> = headers
                .iter()
                .filter(|n| !listed.contains(n))
                .map(String::as_str)
                .chain(["content-type"])
                .collect();
            want.sort_unstable();

            let kept = answer_headers(header_map(&pairs));
            proptest::prop_assert_eq!(names(&kept), want.clone());
            // A request also drops what may carry a credential (`x-key`, `x-token`, ...),
            // which the generator can spell.
            want.retain(|name| !is_credential(&header::HeaderName::from_bytes(name.as_bytes()).unwrap()));
            let mut sent = HeaderMap::new();
            copy_request_headers(&header_map(&pairs), &mut sent);
            proptest::prop_assert_eq!(names(&sent), want);
        }
    }
}
