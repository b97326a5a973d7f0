//! Request bodies: read whole (up to `client_max_body_size`) for an application, or read and
//! dropped for static content, so the next request on the connection is framed right.

use super::transport::Transport;
use bytes::BytesMut;
use gannet_proto::h1::chunked::{Chunk, ChunkedDecoder};
use gannet_proto::h1::BodyKind;
use std::time::Duration;

/// Why a body could not be read to its end; the connection must then close.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    TooLarge,
    Malformed,
    /// Timeout, reset or end of stream.
    Io,
}

/// Read the body, into `keep` if given, else dropping it. `limit` 0 means no limit.
/// Returns the body's length.
pub async fn read<S: Transport>(
    stream: &mut S,
    buf: &mut BytesMut,
    kind: BodyKind,
    limit: u64,
    timeout: Duration,
    mut keep: Option<&mut Vec<u8>>,
) -> Result<u64, BodyError> {
    match kind {
        BodyKind::None => Ok(0),
        BodyKind::Length(n) => {
            if limit > 0 && n > limit {
                return Err(BodyError::TooLarge);
            }
            let mut left = n;
            loop {
                let take = (buf.len() as u64).min(left) as usize;
                let data = buf.split_to(take);
                if let Some(k) = keep.as_deref_mut() {
                    k.extend_from_slice(&data);
                }
                left -= take as u64;
                if left == 0 {
                    return Ok(n);
                }
                read_more(stream, buf, timeout).await?;
            }
        }
        BodyKind::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let mut total = 0u64;
            loop {
                match dec.decode(buf).map_err(|_| BodyError::Malformed)? {
                    Chunk::Data(d) => {
                        total += d.len() as u64;
                        if limit > 0 && total > limit {
                            return Err(BodyError::TooLarge);
                        }
                        if let Some(k) = keep.as_deref_mut() {
                            k.extend_from_slice(&d);
                        }
                    }
                    Chunk::NeedMore => read_more(stream, buf, timeout).await?,
                    Chunk::Done => return Ok(total),
                }
            }
        }
    }
}

async fn read_more<S: Transport>(
    stream: &mut S,
    buf: &mut BytesMut,
    timeout: Duration,
) -> Result<(), BodyError> {
    buf.reserve(16 * 1024);
    match tokio::time::timeout(timeout, stream.read_wait(buf)).await {
        Ok(Ok(n)) if n > 0 => Ok(()),
        _ => Err(BodyError::Io),
    }
}
