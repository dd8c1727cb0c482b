//! Whether a caller closed its side of the connection before its answer was ready.
//!
//! TCP says only that a read found end of stream, and that means the same for a client that
//! only half-closed (`nc -N`, some HTTP/1.0 tools: they still read the answer) as for one
//! that is gone. So the connection keeps serving (hyper's `half_close`), every request runs
//! to its end whether or not its caller waits, and this flag lets the request say, once its
//! answer is ready, that the caller closed first.
//!
//! hyper does not read a connection while a request on it is being served, so the flag
//! looks for itself: it peeks at a duplicate of the connection's socket. A peek is a plain
//! non-blocking syscall on the duplicate and takes nothing from hyper's reads or wake-ups.

use std::io;
use std::net::TcpStream as StdTcpStream;
use std::os::fd::AsFd;
use std::sync::Arc;

use tokio::net::TcpStream;

/// A look at whether the caller's side of one connection has reached end of stream.
/// Cheap to clone: every request on the connection carries one.
#[derive(Clone, Debug, Default)]
pub struct Hangup {
    /// A duplicate of the connection's socket (same connection, own descriptor), non-blocking
    /// like the original; `None` when there is none to look at.
    socket: Option<Arc<StdTcpStream>>,
}

impl Hangup {
    /// A `Hangup` that watches `stream`.
    ///
    /// # Errors
    /// If the socket cannot be duplicated (out of file descriptors); the connection is then
    /// lost, as if the accept had failed.
    pub fn watch(stream: &TcpStream) -> io::Result<Hangup> {
        // Duplicated in place: the runtime keeps its registration of the original (taking
        // the stream out of the runtime and back cost two `epoll_ctl` calls a connection).
        // The duplicate shares the original's non-blocking flag, and the runtime never
        // sees it, so its peeks arm no wake-up.
        let duplicate = StdTcpStream::from(stream.as_fd().try_clone_to_owned()?);
        Ok(Hangup {
            socket: Some(Arc::new(duplicate)),
        })
    }

    /// True if the caller has closed (or reset) its side: nothing left to read but the end
    /// of the stream. Data still unread (a pipelined request) means the caller is there.
    pub fn seen(&self) -> bool {
        let Some(socket) = &self.socket else {
            return false;
        };
        match socket.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_close_is_seen_and_data_or_silence_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let hangup = Hangup::watch(&server).unwrap();
        assert!(!hangup.seen(), "silence is not a hangup");

        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n");
        client.write_all(b"more").await.unwrap();
        // Unread data: the caller is still there, even after it half-closes behind it.
        client.shutdown().await.unwrap();
        let mut unread = [0u8; 4];
        server.read_exact(&mut unread).await.unwrap();
        assert_eq!(&unread, b"more");
        assert!(hangup.seen(), "end of stream after the data is a hangup");

        // The original still works both ways after the peeks: the duplicate took nothing.
        server.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        let n = client.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"HTTP/1.1 200 OK\r\n");
        assert_eq!(server.read(&mut buf).await.unwrap(), 0);
    }

    #[test]
    fn without_a_socket_nothing_is_seen() {
        assert!(!Hangup::default().seen());
    }
}
