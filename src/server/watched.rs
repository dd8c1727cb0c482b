//! The connection IO that notices a caller closing its side: it sets the connection's
//! [`Hangup`] when a read finds end of stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::proxy::Hangup;

/// An IO stream that sets its [`Hangup`] when a read finds end of stream.
pub(super) struct Watched<T> {
    inner: T,
    hangup: Hangup,
}

impl<T> Watched<T> {
    pub(super) fn new(inner: T) -> (Watched<T>, Hangup) {
        let hangup = Hangup::default();
        let watched = Watched {
            inner,
            hangup: hangup.clone(),
        };
        (watched, hangup)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && room && buf.filled().len() == before {
            self.hangup.set();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn end_of_stream_is_seen_and_data_is_not() {
        let (client, server) = tokio::io::duplex(64);
        let (mut watched, hangup) = Watched::new(server);
        let mut client = client;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        let n = watched.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n");
        assert!(!hangup.seen(), "data is not a hangup");
        // A zero-length read into a full buffer is not end of stream either.
        let n = watched.read(&mut [0u8; 0]).await.unwrap();
        assert_eq!(n, 0);
        assert!(!hangup.seen());
        client.shutdown().await.unwrap();
        assert_eq!(watched.read(&mut buf).await.unwrap(), 0);
        assert!(hangup.seen(), "end of stream is a hangup");
        // The write side still works after the caller half-closed.
        watched.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        let n = client.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"HTTP/1.1 200 OK\r\n");
    }
}
