//! Running an API request to its end whatever its caller does: a submit that went upstream
//! created (and billed) a task at the service, so keyrelay must pin it and count its thread
//! even if the caller is gone by the time the answer comes.
//!
//! The request is polled where it always was, inside its connection, so the usual path
//! costs one box and no task switch. Only if the connection drops the request before it
//! finished (its caller went away) does the drop hand the half-done request, still boxed
//! and pinned where it was, to a task of its own on `App::requests`, which shutdown waits
//! for.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::Response;
use tokio_util::task::TaskTracker;

use super::{Body, Hangup};
use crate::captcha::Endpoint;
use crate::log_limit::{Throttle, INTERVAL};
use crate::metrics::RequestOutcome;

/// What an API request yields: its response and the outcome label of its metric.
pub(super) type Served = (Response<Body>, RequestOutcome);

/// An API request that outlives its caller if it has to.
pub(super) struct ToTheEnd<F: Future<Output = Served> + Send + 'static> {
    /// `None` once the request has finished.
    work: Option<Pin<Box<F>>>,
    endpoint: Endpoint,
    requests: TaskTracker,
    hangup: Hangup,
}

impl<F: Future<Output = Served> + Send + 'static> ToTheEnd<F> {
    pub(super) fn new(work: F, endpoint: Endpoint, requests: TaskTracker, hangup: Hangup) -> Self {
        ToTheEnd {
            work: Some(Box::pin(work)),
            endpoint,
            requests,
            hangup,
        }
    }
}

impl<F: Future<Output = Served> + Send + 'static> Future for ToTheEnd<F> {
    type Output = Response<Body>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response<Body>> {
        // Every field is Unpin: the request itself is pinned in its box.
        let this = self.get_mut();
        let Some(work) = this.work.as_mut() else {
            panic!("ToTheEnd polled after it finished");
        };
        let (response, outcome) = std::task::ready!(work.as_mut().poll(cx));
        this.work = None;
        // Only a submit can leave a task behind, so only a submit pays for the look (one
        // syscall): a caller that closed first is told of in the log.
        let submit = matches!(this.endpoint, Endpoint::In | Endpoint::Solve);
        if submit && this.hangup.seen() {
            caller_left(this.endpoint, outcome, false);
        }
        Poll::Ready(response)
    }
}

impl<F: Future<Output = Served> + Send + 'static> Drop for ToTheEnd<F> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        let endpoint = self.endpoint;
        // Dropped unfinished outside a runtime means the runtime itself is going away;
        // there is nowhere left to finish the request.
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!(
                endpoint = endpoint.label(),
                "a request was cut off by the runtime shutting down"
            );
            return;
        }
        self.requests.spawn(async move {
            let (_, outcome) = work.await;
            caller_left(endpoint, outcome, true);
        });
    }
}

/// Logs a request whose caller closed its connection before the answer was ready. `gone`:
/// the connection dropped the request, so the answer is lost; otherwise it was sent, which
/// a caller that only half-closed reads.
pub(super) fn caller_left(endpoint: Endpoint, outcome: RequestOutcome, gone: bool) {
    let delivery = if gone {
        "the answer could not be delivered"
    } else {
        "the answer was sent in case it only half-closed"
    };
    let bad_request = outcome == RequestOutcome::BadRequest;
    let outcome = outcome.label();
    if bad_request {
        // Nothing was accepted: most likely the caller left while sending its request.
        tracing::debug!(
            endpoint = endpoint.label(),
            outcome,
            delivery,
            "the caller left before the answer"
        );
        return;
    }
    // A caller can leave on purpose as often as it likes: once a minute per endpoint.
    static LEFT: Throttle = Throttle::new(INTERVAL);
    let Some(admitted) = LEFT.admit_key(endpoint.label()) else {
        return;
    };
    tracing::warn!(
        endpoint = endpoint.label(),
        outcome,
        delivery,
        held_back = admitted.suppressed,
        "the caller left before the answer; keyrelay finished the exchange (a task it created is pinned and holds its thread)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use http_body_util::Full;
    use tokio::sync::Notify;

    /// A request that waits for `go`, then records that it finished.
    async fn request(go: Arc<Notify>, finished: Arc<AtomicBool>) -> Served {
        go.notified().await;
        finished.store(true, Ordering::SeqCst);
        (
            Response::new(Full::new("OK|1".into())),
            RequestOutcome::Success,
        )
    }

    #[tokio::test]
    async fn a_request_dropped_half_done_finishes_in_the_tracker() {
        let (go, finished) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let requests = TaskTracker::new();
        let mut served = Box::pin(ToTheEnd::new(
            request(go.clone(), finished.clone()),
            Endpoint::In,
            requests.clone(),
            Hangup::default(),
        ));
        // Started, not finished: the connection drops it, as a departed caller's would be.
        assert!(futures_util::poll!(served.as_mut()).is_pending());
        drop(served);
        assert_eq!(requests.len(), 1, "handed to the tracker");
        go.notify_one();
        requests.close();
        requests.wait().await;
        assert!(
            finished.load(Ordering::SeqCst),
            "the request ran to its end"
        );
    }

    #[tokio::test]
    async fn a_request_served_to_its_caller_leaves_nothing_behind() {
        let (go, finished) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let requests = TaskTracker::new();
        go.notify_one();
        let response = ToTheEnd::new(
            request(go, finished.clone()),
            Endpoint::Res,
            requests.clone(),
            Hangup::default(),
        )
        .await;
        assert_eq!(response.status(), 200);
        assert!(finished.load(Ordering::SeqCst));
        assert!(requests.is_empty(), "nothing was spawned");
    }
}
