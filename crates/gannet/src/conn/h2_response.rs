//! HTTP/2 answers: a gannet `Response` as an HTTP/2 head (the fields the HTTP/1.x head has,
//! less the connection-specific ones RFC 9113 8.2.2 forbids), the body in DATA frames of at
//! most `http2_chunk_size` as the client's flow-control window opens (each wait bounded by
//! `send_timeout`, after which the stream is reset) and as `limit_rate` allows (each stream
//! is paced on its own, as nginx limits requests), then the access-log line.

use super::exchange::Compress;
use super::h2_priority;
use super::pace::Pace;
use super::source::Source;
use crate::http::request::Request;
use crate::http::response::{
    head_fields, server, Body, Field, FileRange, HeadCtx, Hop, Part, Response,
};
use crate::modules::limit_rate;
use crate::runtime::clock;
use crate::runtime::worker::Worker;
use bytes::Bytes;
use h2::server::SendResponse;
use h2::SendStream;
use http::header::{
    HeaderName, HeaderValue, InvalidHeaderValue, ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_TYPE, DATE,
    ETAG, LAST_MODIFIED, LOCATION, SERVER,
};
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// The head, and about how many bytes it stands for (name, value and separators, as the
/// HTTP/1.x head would count them; HPACK makes the real frames smaller). The fields are
/// HTTP/1.x's ([`head_fields`]) less the connection-specific ones.
pub(super) fn head(
    resp: &Response,
    body_len: u64,
    server_tokens: bool,
) -> (http::Response<()>, u64) {
    let mut out = http::Response::new(());
    *out.status_mut() =
        http::StatusCode::from_u16(resp.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut len = 15u64;
    let headers = out.headers_mut();
    let mut put = |n: HeaderName, v: Result<HeaderValue, InvalidHeaderValue>| {
        // A value HTTP/2 cannot carry (an application's odd header) is left out.
        if let Ok(v) = v {
            len += (n.as_str().len() + v.len() + 4) as u64;
            headers.append(n, v);
        }
    };
    clock::with_date(|date| {
        let ctx = HeadCtx {
            hop: Hop::None,
            server_tokens,
            date,
        };
        head_fields(resp, body_len, &ctx, |field| match field {
            Field::ServerDate(tokens, date) => {
                put(SERVER, Ok(HeaderValue::from_static(server(tokens))));
                put(DATE, HeaderValue::from_bytes(date));
            }
            Field::Server(tokens) => put(SERVER, Ok(HeaderValue::from_static(server(tokens)))),
            Field::Date(date) => put(DATE, HeaderValue::from_bytes(date)),
            Field::ContentType(ct) => put(CONTENT_TYPE, HeaderValue::from_str(ct)),
            Field::ContentLength(n) => put(CONTENT_LENGTH, Ok(HeaderValue::from(n))),
            Field::LastModified(lm) => put(
                LAST_MODIFIED,
                clock::with_http_date(lm, HeaderValue::from_str),
            ),
            Field::Location(l) => put(LOCATION, HeaderValue::from_str(l)),
            Field::ETag(e) => put(ETAG, HeaderValue::from_str(e)),
            Field::AcceptRanges => put(ACCEPT_RANGES, Ok(HeaderValue::from_static("bytes"))),
            Field::Other(n, v) => {
                // A name HTTP/2 cannot carry is left out too.
                if let Ok(n) = HeaderName::from_bytes(n.as_bytes()) {
                    put(n, HeaderValue::from_str(v));
                }
            }
            // Connection-specific: not chosen without a `Hop`.
            Field::Chunked | Field::Upgrade | Field::KeepAlive(_) | Field::Close => {}
        });
    });
    (out, len + 2)
}

/// An answer made ready to send (HTTP/2 and HTTP/3 alike): its body's source when it is
/// streamed (an application's, or one compressed while sent), its head, whether the head
/// alone ends the stream, and whether trailers (`add_trailer`) follow the body.
pub(super) struct Prepared {
    pub(super) src: Option<Source>,
    pub(super) head: http::Response<()>,
    /// The head's size as an HTTP/1.x head would count it (`$bytes_sent`).
    pub(super) head_len: u64,
    pub(super) end: bool,
    pub(super) trailing: bool,
}

pub(super) fn prepare(req: &Request, resp: &mut Response, src: Option<Source>) -> Prepared {
    let send_body = !req.is_head() && resp.status_has_body();
    // A compressed-while-sent answer is streamed from its own parts.
    let src = match src {
        Some(s) => Some(s),
        None => Source::from_body(resp),
    }
    .map(|s| s.filtered(resp));
    if src.is_some() && resp.content_length.is_none() {
        resp.length_unknown = true;
    }
    let body_len = resp.body.len();
    if !send_body && src.is_none() && resp.status_has_body() && resp.content_length.is_none() {
        resp.content_length = Some(body_len);
    }
    let (head, head_len) = head(resp, body_len, req.conf.core.server_tokens());
    // `add_trailer`'s, or a server's passed on (`proxy_pass_trailers`).
    let trailing = crate::modules::headers::sends_trailers(req, resp)
        || crate::modules::headers::may_trail(req, resp);
    let end = !send_body || (src.is_none() && body_len == 0 && !trailing);
    Prepared {
        src,
        head,
        head_len,
        end,
        trailing,
    }
}

/// Send the body of a prepared answer that does not end with its head: from `src`, else
/// from `resp.body`. Returns false when it broke off (the stream is to be reset).
pub(super) async fn body(
    w: &Worker,
    req: &Request,
    resp: &Response,
    src: Option<Source>,
    out: &mut impl BodyOut,
) -> bool {
    match src {
        Some(src) => streamed(w, req, resp, src, out).await,
        None => whole_body(&resp.body, out).await,
    }
}

/// Send the answer (from `src` when it is streamed, else from `resp.body`) and log it.
pub async fn send(
    w: &Worker,
    req: &Request,
    mut resp: Response,
    src: Option<Source>,
    respond: &mut SendResponse<Bytes>,
) {
    let core = &req.conf.core;
    let timeout = core.send_timeout();
    let chunk = req.conf.http2.chunk_size() as usize;
    let p = prepare(req, &mut resp, src);
    let mut stream = match respond.send_response(p.head, p.end) {
        Ok(s) => s,
        Err(_) => {
            super::log::access(w, req, &resp, 0, 0, false);
            return;
        }
    };
    let mut out = Out {
        stream: &mut stream,
        sent: 0,
        chunk,
        timeout,
        ended: false,
        trailers: p.trailing.then_some((req, &resp)),
        pace: if p.end {
            None
        } else {
            limit_rate::pace(req, &resp)
        },
    };
    let whole = p.end || body(w, req, &resp, p.src, &mut out).await;
    if !whole {
        out.stream.send_reset(h2::Reason::CANCEL);
    }
    let sent = out.sent;
    super::log::access(w, req, &resp, p.head_len, sent, whole);
}

/// `add_trailer`'s fields, as HTTP/2 and HTTP/3 send them.
pub(super) fn trailer_fields(req: &Request, resp: &Response) -> http::HeaderMap {
    let fields = crate::modules::headers::trailers(req, resp);
    let mut map = http::HeaderMap::new();
    for (n, v) in fields {
        // A name or value HTTP/2 cannot carry is left out.
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            map.append(n, v);
        }
    }
    map
}

/// Where an answer's body goes, piece by piece: an HTTP/2 or an HTTP/3 stream.
#[allow(async_fn_in_trait)] // futures stay on the worker's thread: no Send bound wanted
pub(super) trait BodyOut {
    /// Send `data`; `end`: it is the last (trailers, if any, follow it and end the
    /// stream). False when the stream broke.
    async fn data(&mut self, data: Bytes, end: bool) -> bool;
    /// The stream has been ended.
    fn ended(&self) -> bool;
    /// Send a file's range, read in pieces; `end` as for [`BodyOut::data`].
    async fn file(&mut self, f: &FileRange, end: bool) -> bool {
        let mut off = f.offset;
        let stop = f.offset + f.len;
        while off < stop {
            let mut buf = vec![0u8; ((stop - off) as usize).min(FILE_READ)];
            match f.file.read_at(&mut buf, off) {
                Ok(n) if n > 0 => {
                    buf.truncate(n);
                    off += n as u64;
                    if !self.data(Bytes::from(buf), end && off == stop).await {
                        return false;
                    }
                }
                // The file shrank (or failed) under us: the promised length cannot be sent.
                _ => return false,
            }
        }
        true
    }
}

impl BodyOut for Out<'_> {
    async fn data(&mut self, data: Bytes, end: bool) -> bool {
        Out::data(self, data, end).await
    }
    fn ended(&self) -> bool {
        self.ended
    }
    /// Read as the window opens, as much as it has room for: a frame is never cut where a
    /// read ended (nginx frames a file as one run of bytes).
    async fn file(&mut self, f: &FileRange, end: bool) -> bool {
        let mut feed = FileFeed {
            f,
            read: Bytes::new(),
            off: f.offset,
            stop: f.offset + f.len,
        };
        self.frames(&mut feed, end && self.trailers.is_none()).await && self.finish(end)
    }
}

/// The most of a file read at once.
const FILE_READ: usize = 64 * 1024;

/// Frames of `http2_chunk_size` asked for per wait for window capacity.
const FRAMES_PER_WAIT: usize = 4;

/// The most window capacity asked for per wait (a large `http2_chunk_size` would ask for
/// more than the codec gives a stream at once anyway).
const WANT_MAX: usize = 4 * FILE_READ;

/// What DATA frames are cut from: bytes at hand, or a file read as they are sent.
pub(super) trait Feed {
    fn left(&self) -> usize;
    /// The next `n` bytes (`n` at most [`Feed::left`]); `None` if they cannot be had.
    fn take(&mut self, n: usize) -> Option<Bytes>;
}

impl Feed for Bytes {
    fn left(&self) -> usize {
        self.len()
    }
    fn take(&mut self, n: usize) -> Option<Bytes> {
        Some(self.split_to(n))
    }
}

/// A file range, read [`FILE_READ`] at a time (as before frames were cut by the window: a
/// window that opens 16k at a time costs no more reads), what a frame leaves of a read
/// carried over to the next.
struct FileFeed<'a> {
    f: &'a FileRange,
    /// Read, not yet taken.
    read: Bytes,
    /// Where the file's next read starts, and where the range ends.
    off: u64,
    stop: u64,
}

impl Feed for FileFeed<'_> {
    fn left(&self) -> usize {
        let unread = usize::try_from(self.stop - self.off).unwrap_or(usize::MAX);
        self.read.len().saturating_add(unread)
    }
    fn take(&mut self, n: usize) -> Option<Bytes> {
        if self.read.len() < n {
            let have = self.read.len();
            let unread = self.left() - have;
            let more = (n - have).max(FILE_READ.min(unread));
            let mut buf = Vec::with_capacity(have + more);
            buf.extend_from_slice(&self.read);
            buf.resize(have + more, 0);
            // A file that shrank (or failed) under us: the promised length cannot be sent.
            self.f.file.read_exact_at(&mut buf[have..], self.off).ok()?;
            self.off += more as u64;
            self.read = Bytes::from(buf);
        }
        Some(self.read.split_to(n))
    }
}

/// The sending half of a stream, with what was sent and the frame size.
pub(super) struct Out<'a> {
    pub(super) stream: &'a mut SendStream<Bytes>,
    pub(super) sent: u64,
    pub(super) chunk: usize,
    pub(super) timeout: Duration,
    /// The frame that ends the stream has been sent.
    pub(super) ended: bool,
    /// `add_trailer`'s fields end the stream, after the last DATA frame.
    pub(super) trailers: Option<(&'a Request, &'a Response)>,
    pub(super) pace: Option<Pace>,
}

impl Out<'_> {
    /// Send `data` in frames of at most `chunk`, as the window has room for them. Capacity
    /// is asked for several frames at a time and every frame it covers is queued at once:
    /// one frame per wait would cost a round trip through the connection's task for each
    /// `chunk` of a large body.
    async fn data(&mut self, mut data: Bytes, end: bool) -> bool {
        self.frames(&mut data, end && self.trailers.is_none()).await && self.finish(end)
    }

    /// After the last DATA (`end`): the trailers, if any, end the stream.
    fn finish(&mut self, end: bool) -> bool {
        match self.trailers.filter(|_| end) {
            Some((req, resp)) => {
                let map = trailer_fields(req, resp);
                self.ended = if map.is_empty() {
                    // Nothing to send after all: an empty DATA frame ends the stream.
                    self.stream.send_data(Bytes::new(), true).is_ok()
                } else {
                    self.stream.send_trailers(map).is_ok()
                };
                self.ended
            }
            None => true,
        }
    }

    /// [`Out::data`]'s DATA frames; `end`: the last one ends the stream.
    pub(super) async fn data_frames(&mut self, mut data: Bytes, end: bool) -> bool {
        self.frames(&mut data, end).await
    }

    /// DATA frames of what `src` has, each as large as `http2_chunk_size`, the window and
    /// the client's frame size allow (the codec cuts frames to the latter); `end`: the
    /// last one ends the stream. Queued in turn with the connection's other streams
    /// (`conn::h2_priority`).
    pub(super) async fn frames(&mut self, src: &mut impl Feed, end: bool) -> bool {
        let _sending = h2_priority::sending();
        while src.left() > 0 {
            let mut want = src
                .left()
                .min(self.chunk.saturating_mul(FRAMES_PER_WAIT))
                .min(WANT_MAX);
            if let Some(p) = &mut self.pace {
                want = want.min(p.allowance().await as usize);
            }
            self.stream.reserve_capacity(want);
            let cap = tokio::time::timeout(
                self.timeout,
                std::future::poll_fn(|cx| self.stream.poll_capacity(cx)),
            )
            .await;
            let mut room = match cap {
                Ok(Some(Ok(n))) => n.min(want),
                // A timeout (a client that never opens its window), a reset or a closed
                // connection.
                _ => return false,
            };
            if let Some(p) = &mut self.pace {
                p.wrote(room as u64);
            }
            // The stream's turn among the connection's (`conn::h2_priority`); from there
            // no wait until its DATA is queued.
            let _turn = h2_priority::turn().await;
            let Some(mut got) = src.take(room) else {
                return false;
            };
            while room > 0 {
                let n = room.min(self.chunk);
                room -= n;
                let piece = got.split_to(n);
                let last = end && room == 0 && src.left() == 0;
                if self.stream.send_data(piece, last).is_err() {
                    return false;
                }
                self.sent += n as u64;
                if last {
                    self.ended = true;
                    return true;
                }
            }
        }
        if end {
            self.ended = self.stream.send_data(Bytes::new(), true).is_ok();
            return self.ended;
        }
        true
    }
}

/// A body held in memory or in files; the last frame ends the stream.
async fn whole_body(body: &Body, out: &mut impl BodyOut) -> bool {
    let Body::Parts(parts) = body else {
        return out.data(Bytes::new(), true).await;
    };
    for (i, p) in parts.iter().enumerate() {
        let last_part = i + 1 == parts.len();
        let ok = match p {
            Part::Bytes(b) => out.data(b.clone(), last_part).await,
            // Read and framed in pieces: sendfile cannot put a file into frames.
            Part::File(f) => out.file(f, last_part).await,
        };
        if !ok {
            return false;
        }
    }
    // A last part with nothing in it (an empty file) sent no frame to end the stream.
    out.ended() || out.data(Bytes::new(), true).await
}

/// A body of unknown length: an application's, or one compressed while sent.
async fn streamed(
    w: &Worker,
    req: &Request,
    resp: &Response,
    mut src: Source,
    out: &mut impl BodyOut,
) -> bool {
    let Some(mut encoder) = Compress::new(req, resp) else {
        return false;
    };
    loop {
        let Ok(data) = src.next(w, req).await else {
            return false;
        };
        let more = data.is_some();
        let Some(piece) = encoder.piece(req, data, src.may_pause()) else {
            return false;
        };
        // A buffered answer is read ahead while the client takes what came.
        if !src.alongside(w, req, out.data(piece, !more)).await {
            return false;
        }
        if !more {
            src.finish(w);
            return true;
        }
    }
}
