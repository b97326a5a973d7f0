//! Request bodies off an HTTP/1.x connection, piece by piece as they arrive
//! ([`BodyStream`]): kept whole for an application (by `conn::request_body`, in memory or
//! a temporary file), read and dropped for static content (so the next request on the
//! connection is framed right, [`discard`]), or handed on as they come
//! (`*_request_buffering off`). The size limit and `client_body_timeout` apply the same
//! way to all three.

use super::transport::Transport;
use bytes::{Bytes, BytesMut};
use gannet_proto::h1::chunked::{Chunk, ChunkedDecoder};
use gannet_proto::h1::BodyKind;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Why a body could not be read to its end; the connection must then close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    TooLarge,
    Malformed,
    /// Timeout, reset or end of stream.
    Io,
}

/// Read a body nobody wants off the wire and drop it (the connection is then framed for
/// the next request). `limit` 0 means no limit. Returns the body's length.
pub async fn discard<S: Transport>(
    stream: &mut S,
    buf: &mut BytesMut,
    kind: BodyKind,
    limit: u64,
    timeout: Duration,
) -> Result<u64, BodyError> {
    let mut body = BodyStream::new(stream, buf, kind, limit, timeout)?;
    while body.next().await?.is_some() {}
    Ok(body.total())
}

/// Where a body's framing has got to.
enum State {
    /// Content-Length: the bytes still to come.
    Length(u64),
    Chunked(ChunkedDecoder),
    Done,
}

/// A request body read as it comes: each [`next`](BodyStream::next) gives what has
/// arrived, waiting (up to the timeout) only when nothing has.
pub struct BodyStream<'a, S: Transport> {
    stream: &'a mut S,
    buf: &'a mut BytesMut,
    state: State,
    limit: u64,
    timeout: Duration,
    total: u64,
}

impl<'a, S: Transport> BodyStream<'a, S> {
    /// `limit` 0 means no limit; a Content-Length over it fails here, before any byte.
    pub fn new(
        stream: &'a mut S,
        buf: &'a mut BytesMut,
        kind: BodyKind,
        limit: u64,
        timeout: Duration,
    ) -> Result<Self, BodyError> {
        let state = match kind {
            BodyKind::None => State::Done,
            BodyKind::Length(n) if limit > 0 && n > limit => return Err(BodyError::TooLarge),
            BodyKind::Length(n) => State::Length(n),
            BodyKind::Chunked => State::Chunked(ChunkedDecoder::new()),
        };
        Ok(BodyStream {
            stream,
            buf,
            state,
            limit,
            timeout,
            total: 0,
        })
    }

    /// The next piece of the body (never empty); `Ok(None)` at its end.
    pub async fn next(&mut self) -> Result<Option<Bytes>, BodyError> {
        loop {
            match &mut self.state {
                State::Done => return Ok(None),
                State::Length(0) => {
                    self.state = State::Done;
                    return Ok(None);
                }
                State::Length(left) => {
                    if !self.buf.is_empty() {
                        let take = (self.buf.len() as u64).min(*left) as usize;
                        *left -= take as u64;
                        self.total += take as u64;
                        return Ok(Some(self.buf.split_to(take).freeze()));
                    }
                }
                State::Chunked(dec) => {
                    match dec.decode(self.buf).map_err(|_| BodyError::Malformed)? {
                        Chunk::Data(d) => {
                            self.total += d.len() as u64;
                            if self.limit > 0 && self.total > self.limit {
                                return Err(BodyError::TooLarge);
                            }
                            if !d.is_empty() {
                                return Ok(Some(d));
                            }
                            continue;
                        }
                        Chunk::Done => {
                            self.state = State::Done;
                            return Ok(None);
                        }
                        Chunk::NeedMore => {}
                    }
                }
            }
            read_more(self.stream, self.buf, self.timeout).await?;
        }
    }

    /// The body's bytes taken so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether the body was read to its end (the connection is framed for the next one).
    pub fn finished(&self) -> bool {
        matches!(self.state, State::Done)
    }
}

/// A body read as it comes, as the gateways see it (they are not generic over the
/// client's transport).
pub trait BodySource {
    /// The next piece; `Ok(None)` at the end.
    fn next_piece(
        &mut self,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Bytes>, BodyError>> + '_>>;
}

impl<S: Transport> BodySource for BodyStream<'_, S> {
    fn next_piece(
        &mut self,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Bytes>, BodyError>> + '_>> {
        Box::pin(self.next())
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

/// nginx's test before it passes a body on as it arrives (`*_request_buffering off`,
/// `ngx_http_read_client_request_body`): when all of it has come already - with the head,
/// or to the read it makes at once into its body buffer (`buffer`, nginx's
/// `client_body_buffer_size`, a quarter more for a Content-Length body that fits in that) -
/// the body is kept whole instead, as if buffered (so `$request_body` has it, and the
/// upstream gets it with a length). Reads only what has arrived, never waiting.
pub fn arrived_whole<S: Transport>(
    stream: &mut S,
    buf: &mut BytesMut,
    kind: BodyKind,
    buffer: usize,
) -> bool {
    match kind {
        BodyKind::None => true,
        BodyKind::Length(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            let rest = n.saturating_sub(buf.len());
            if rest > 0 && rest >= buffer.saturating_add(buffer >> 2) {
                return false;
            }
            while buf.len() < n {
                buf.reserve(n - buf.len());
                if !matches!(stream.read_now(buf), Ok(k) if k > 0) {
                    return false;
                }
            }
            true
        }
        BodyKind::Chunked => {
            let limit = buf.len().saturating_add(buffer);
            loop {
                if chunked_complete(buf) {
                    return true;
                }
                if buf.len() >= limit {
                    return false;
                }
                buf.reserve(limit - buf.len());
                if !matches!(stream.read_now(buf), Ok(k) if k > 0) {
                    return false;
                }
            }
        }
    }
}

/// Whether `buf` starts with a whole chunked body (a copy is decoded; `buf` is untouched).
fn chunked_complete(buf: &BytesMut) -> bool {
    let mut copy = BytesMut::from(&buf[..]);
    let mut dec = ChunkedDecoder::new();
    loop {
        match dec.decode(&mut copy) {
            Ok(Chunk::Done) => return true,
            Ok(Chunk::Data(_)) => {}
            Ok(Chunk::NeedMore) | Err(_) => return false,
        }
    }
}
