//! Whether a caller closed its side of the connection before its answer was ready.
//!
//! A read that returns no bytes is all TCP says, and it means the same for a client that
//! only half-closed (`nc -N`, some HTTP/1.0 tools: they still read the answer) and one that
//! is gone. So the connection keeps serving (hyper's `half_close`), every request runs to
//! its end whether or not its caller waits, and this flag lets the request say, once its
//! answer is ready, that the caller closed before it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether the caller's side of one connection has reached end of stream. Shared by the
/// connection's IO and every request read from it.
#[derive(Clone, Debug, Default)]
pub struct Hangup(Arc<AtomicBool>);

impl Hangup {
    /// True once a read on the connection found end of stream.
    pub fn seen(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Called by the connection's IO when a read finds end of stream.
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
