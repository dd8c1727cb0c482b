//! Idle upstream connections, per origin: reused last-in first-out, dialled through the
//! rustls connector when none is idle.
//!
//! hyper-util's pooled client spawns a task for every request to put its connection back,
//! and rebuilds every URI; a request that reads its whole answer (as every keyrelay request
//! does) can hand the connection back itself, so this pool is a list under a lock.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::poll_fn;
use http_body_util::Full;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, InvalidHeaderValue};
use hyper::http::uri::{Authority, Scheme};
use hyper::Uri;
use hyper_rustls::HttpsConnector;

use super::dial::Dial;
use tokio::time::{Instant, Sleep};
use tower::Service;

/// The sending half of one upstream connection; its connection runs in a task of its own.
pub(super) type Sender = SendRequest<Full<Bytes>>;

/// More idle connections than this to one origin are closed: far above what one upstream
/// needs between bursts, and a bound on file descriptors.
const MAX_IDLE_PER_ORIGIN: usize = 512;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a connection goes.
#[derive(Clone, Debug)]
pub(super) struct Origin {
    pub https: bool,
    pub authority: Authority,
}

// `Authority` hashes and compares byte by byte, ignoring case, which cost about 1k
// instructions per request in the two pool lookups. Upstream authorities are lowercased when
// the config is parsed, so their exact bytes identify them.
impl PartialEq for Origin {
    fn eq(&self, other: &Origin) -> bool {
        self.https == other.https && self.authority.as_str() == other.authority.as_str()
    }
}

impl Eq for Origin {}

impl std::hash::Hash for Origin {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.https.hash(state);
        self.authority.as_str().hash(state);
    }
}

impl Origin {
    /// The URI a new connection is dialled with.
    fn uri(&self) -> Result<Uri, hyper::http::Error> {
        let scheme = if self.https {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        };
        Uri::builder()
            .scheme(scheme)
            .authority(self.authority.clone())
            .path_and_query("/")
            .build()
    }
}

/// An idle connection, and the timer of its last exchange, kept for the next one (see
/// `UpstreamClient::send`).
pub(super) struct Idle {
    pub sender: Sender,
    since: Instant,
    pub timer: Pin<Box<Sleep>>,
}

/// What the pool keeps per origin.
struct Known {
    /// The `Host` header value of every request to it, built once rather than per request.
    host: HeaderValue,
    /// Newest last.
    idle: Vec<Idle>,
}

pub(super) struct Pool {
    connector: HttpsConnector<Dial>,
    /// Held for a push or a pop, never across an await. foldhash, because every request
    /// hashes its origin here and SipHash cost 2.6 % of a request's instructions.
    /// Origins come from the config, so the map is as small as the set of upstreams.
    idle: Mutex<HashMap<Origin, Known, foldhash::fast::RandomState>>,
    idle_timeout: Duration,
}

impl Pool {
    pub(super) fn new(connector: HttpsConnector<Dial>, idle_timeout: Duration) -> Pool {
        Pool {
            connector,
            idle: Mutex::new(HashMap::default()),
            idle_timeout,
        }
    }

    /// The `Host` value for `origin`, and its most recently used idle connection that is
    /// still open, if any, as of `now`. Connections idle too long are dropped (which closes
    /// them) on the way.
    ///
    /// # Errors
    /// An authority a header cannot carry, which a parsed `Authority` never is.
    pub(super) fn checkout(
        &self,
        origin: &Origin,
        now: Instant,
    ) -> Result<(HeaderValue, Option<Idle>), InvalidHeaderValue> {
        let mut idle = self.idle.lock().expect("upstream pool lock poisoned");
        let known = match idle.get_mut(origin) {
            Some(known) => known,
            None => idle.entry(origin.clone()).or_insert(Known {
                host: HeaderValue::from_str(origin.authority.as_str())?,
                idle: Vec::new(),
            }),
        };
        while let Some(entry) = known.idle.pop() {
            if !entry.sender.is_closed() && now.duration_since(entry.since) < self.idle_timeout {
                return Ok((known.host.clone(), Some(entry)));
            }
        }
        Ok((known.host.clone(), None))
    }

    /// Puts a connection whose exchange is complete back for the next request, with the
    /// timer that exchange ran under.
    pub(super) fn checkin(&self, origin: Origin, sender: Sender, timer: Pin<Box<Sleep>>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock().expect("upstream pool lock poisoned");
        // Every connection was checked out first, which made its origin known.
        let Some(known) = idle.get_mut(&origin) else {
            return;
        };
        let list = &mut known.idle;
        // The oldest are at the front: an origin used less than before sheds them here.
        let expired = list
            .iter()
            .take_while(|entry| now.duration_since(entry.since) >= self.idle_timeout)
            .count();
        list.drain(..expired);
        if list.len() < MAX_IDLE_PER_ORIGIN {
            list.push(Idle {
                sender,
                since: now,
                timer,
            });
        }
    }

    /// A new connection to `origin` (TCP, and TLS for https), its connection task spawned.
    ///
    /// # Errors
    /// The connector's or the handshake's error; nothing was sent.
    pub(super) async fn connect(&self, origin: &Origin) -> Result<Sender, BoxError> {
        let uri = origin.uri()?;
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx)).await?;
        let io = connector.call(uri).await?;
        // One write per request, head and body copied together: a request is a few hundred
        // bytes, cheaper flattened than queued for writev.
        let (sender, connection) = http1::Builder::new().writev(false).handshake(io).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "upstream connection ended");
            }
        });
        Ok(sender)
    }
}
