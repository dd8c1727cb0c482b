//! Reading a caller's request body within the configured limit, and draining an oversized
//! one so the caller still reads keyrelay's answer instead of a reset connection.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONTENT_LENGTH};

/// An oversized body is read and discarded up to this many bytes past the limit, so that a
/// client still sending it is not reset before it reads the answer. Beyond it, the
/// connection is closed after the answer: the client is then sending something absurd.
const DRAIN_BYTES: usize = 64 * 1024 * 1024;

/// Time allowed for that draining.
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Larger than the limit. Carries what was read so far, for a best-effort look at `json`.
    TooLarge { prefix: Bytes },
    /// The caller went away or sent a broken body.
    Io(hyper::Error),
}

/// Reads the whole body if it fits within `limit` bytes; `headers` are its request's, whose
/// `Content-Length` may say at once that it cannot.
pub async fn read(
    mut body: Incoming,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, BodyError> {
    let declared: Option<u64> = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    if declared.is_some_and(|len| len > (limit + DRAIN_BYTES) as u64) {
        // Too absurd to read even in order to discard it; the connection closes after the answer.
        return Err(BodyError::TooLarge {
            prefix: Bytes::new(),
        });
    }
    // The first `limit` bytes are kept even when the body will not fit: they may say
    // whether the caller wants its answer in JSON.
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |l| l.min(limit as u64) as usize));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Io)?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                let room = limit - buf.len();
                buf.extend_from_slice(&data[..room]);
                let prefix = buf.freeze();
                drain(&mut body).await;
                return Err(BodyError::TooLarge { prefix });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

async fn drain(body: &mut Incoming) {
    let mut drained = 0usize;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                drained += data.len();
                if drained > DRAIN_BYTES {
                    break;
                }
            }
        }
    })
    .await;
}
