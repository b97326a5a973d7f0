//! Request bodies. Static content does not use them, but they must still be read off the
//! connection (up to `client_max_body_size`) so the next request on it is framed right.

use bytes::BytesMut;
use gannet_proto::h1::chunked::{Chunk, ChunkedDecoder};
use gannet_proto::h1::BodyKind;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Why a body could not be read to its end; the connection must then close.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    TooLarge,
    Malformed,
    /// Timeout, reset or end of stream.
    Io,
}

/// Read and drop the body. `limit` 0 means no limit. Returns the body's length.
pub async fn discard(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    kind: BodyKind,
    limit: u64,
    timeout: Duration,
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
                let _ = buf.split_to(take);
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
                    }
                    Chunk::NeedMore => read_more(stream, buf, timeout).await?,
                    Chunk::Done => return Ok(total),
                }
            }
        }
    }
}

async fn read_more(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    timeout: Duration,
) -> Result<(), BodyError> {
    buf.reserve(16 * 1024);
    match tokio::time::timeout(timeout, stream.read_buf(buf)).await {
        Ok(Ok(n)) if n > 0 => Ok(()),
        _ => Err(BodyError::Io),
    }
}
