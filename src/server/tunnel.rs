//! A raw tunnel's byte copy: both ways until either side closes, or until `tunnel_idle`
//! passes with no byte either way, so that a tunnel nobody uses gives its connection slot
//! and its two descriptors back.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// How a tunnel's copy ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// A side closed: the bytes each way.
    Closed { up: u64, down: u64 },
    /// No byte either way for the idle timeout.
    Idle,
}

/// Copies between `client` and `upstream` until one closes or `idle` passes with no
/// traffic either way.
///
/// # Errors
/// A read or write failed on either side.
pub(super) async fn copy_until_idle<A, B>(
    client: &mut A,
    upstream: &mut B,
    idle: Duration,
) -> io::Result<Ended>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity::new();
    let mut client = Watched {
        inner: client,
        activity: &activity,
    };
    let mut upstream = Watched {
        inner: upstream,
        activity: &activity,
    };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    loop {
        tokio::select! {
            copied = &mut copy => {
                let (up, down) = copied?;
                return Ok(Ended::Closed { up, down });
            }
            () = tokio::time::sleep_until(activity.last() + idle) => {
                if activity.last() + idle <= Instant::now() {
                    return Ok(Ended::Idle);
                }
            }
        }
    }
}

/// When a byte last moved: milliseconds since `base`, kept in an atomic because both
/// directions' reads touch it through shared references.
struct Activity {
    base: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A stream whose reads count as activity: every byte a tunnel moves is read first.
struct Watched<'a, T> {
    inner: &'a mut T,
    activity: &'a Activity,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<'_, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut *self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<'_, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const IDLE: Duration = Duration::from_secs(300);

    #[tokio::test(start_paused = true)]
    async fn a_silent_tunnel_closes_after_the_idle_timeout() {
        let (mut client, mut client_far) = tokio::io::duplex(64);
        let (mut upstream, mut upstream_far) = tokio::io::duplex(64);
        let started = Instant::now();
        let copy =
            tokio::spawn(
                async move { copy_until_idle(&mut client_far, &mut upstream_far, IDLE).await },
            );
        // Traffic one way only keeps it open: a download the client never answers.
        for _ in 0..10 {
            tokio::time::sleep(IDLE / 2).await;
            upstream.write_all(b"chunk").await.unwrap();
            let mut got = [0; 5];
            client.read_exact(&mut got).await.unwrap();
        }
        assert!(!copy.is_finished(), "still in use");
        let ended = copy.await.unwrap().unwrap();
        assert_eq!(ended, Ended::Idle);
        let lived = started.elapsed();
        assert!(
            lived >= IDLE * 5 + IDLE && lived < IDLE * 5 + IDLE + Duration::from_secs(1),
            "{lived:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_side_ends_the_copy_with_its_counts() {
        let (mut client, mut client_far) = tokio::io::duplex(64);
        let (mut upstream, mut upstream_far) = tokio::io::duplex(64);
        let copy =
            tokio::spawn(
                async move { copy_until_idle(&mut client_far, &mut upstream_far, IDLE).await },
            );
        client.write_all(b"hello").await.unwrap();
        let mut got = [0; 5];
        upstream.read_exact(&mut got).await.unwrap();
        upstream.write_all(b"hi").await.unwrap();
        client.read_exact(&mut got[..2]).await.unwrap();
        drop(client);
        drop(upstream);
        assert_eq!(
            copy.await.unwrap().unwrap(),
            Ended::Closed { up: 5, down: 2 }
        );
    }
}
