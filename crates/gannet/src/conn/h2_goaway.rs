//! HTTP/2 connection errors, GOAWAY frames and header timeouts as nginx's (its
//! ngx_http_v2_connection_error, ngx_http_v2_send_goaway, ngx_http_v2_state_headers_save),
//! where the h2 crate says otherwise or waits:
//!
//! - A control frame of the wrong size (PING not 8 bytes, SETTINGS not a multiple of 6, a
//!   GOAWAY under 8...) is a FRAME_SIZE_ERROR (the codec says PROTOCOL_ERROR); a
//!   PUSH_PROMISE from a client is a PROTOCOL_ERROR as soon as its frame header comes (the
//!   codec waits for a payload the client may never send); a header block nginx's decoder
//!   stops on is a COMPRESSION_ERROR (a field longer than `large_client_header_buffers`:
//!   ENHANCE_YOUR_CALM; one cut short: FRAME_SIZE_ERROR), with its own stream as the last
//!   (the codec names the one before). `conn::h2_mend`, which sees the frames before the
//!   codec, finds these ([`Wire::screen`], [`hpack_fault`]) and gives the codec, instead of
//!   the frame, one it ends the connection on at once ([`TRIGGER`]); the codec's GOAWAY is
//!   then written with nginx's code and last stream by [`GoawayWriter`].
//! - A graceful GOAWAY names the last stream taken, as nginx's, and frames on streams
//!   after it are dropped unread (nginx ignores them): the codec's first GOAWAY names
//!   2^31-1 and it takes new streams until its PING comes back (RFC 9113 6.8's two-step
//!   shutdown), which nginx's own clients and tests do not expect.
//! - A request whose header block has not come whole within `client_header_timeout` is
//!   reset (RST_STREAM PROTOCOL_ERROR) and the connection goes on: the mend gives the codec
//!   an empty header block for that stream ([`empty_headers`]), which it resets as
//!   malformed; the rest, when it comes, is decoded (the HPACK table stays in step) and
//!   ignored on the reset stream.

use super::h2_mend::{frame_len, frame_sid};
use super::h2_window::Windows;
use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const FRAME_SIZE_ERROR: u32 = 0x6;
pub const COMPRESSION_ERROR: u32 = 0x9;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const ACK: u8 = 0x1;

/// A frame the codec ends the connection on as soon as it reads it: a PING without its
/// eight bytes (a connection error, RFC 9113 6.7). Given in place of a frame nginx ends the
/// connection for; its GOAWAY is then rewritten to nginx's.
pub const TRIGGER: [u8; 9] = [0, 0, 0, PING, 0, 0, 0, 0, 0];

/// The largest HPACK table a client may ask for (nginx's NGX_HTTP_V2_TABLE_SIZE, the
/// codec's default SETTINGS_HEADER_TABLE_SIZE).
const TABLE_SIZE: u64 = 4096;

/// What a client's connection shares between the mend (reading) and the GOAWAY writer.
#[derive(Default)]
pub struct Wire {
    /// The highest stream a request came on (nginx's `last_sid`).
    last_sid: Cell<u32>,
    /// The error code the codec's next GOAWAY is to carry instead of its own.
    verdict: Cell<Option<u32>>,
    /// The last stream a GOAWAY sent named: frames on streams above it are dropped.
    gone: Cell<Option<u32>>,
    /// A GOAWAY's fields have been written out.
    sent: Cell<bool>,
}

/// The mend's part on a client's connection (`conn::h2_mend` holds one).
pub struct Guard {
    pub wire: Rc<Wire>,
    header_timeout: Duration,
    /// The longest header string nginx takes (`large_client_header_buffers`' size).
    pub field_max: usize,
    /// The request whose header block is waited for, and its timer.
    timer: Option<(u32, Pin<Box<Sleep>>)>,
    /// Bytes of a dropped frame still to come.
    pub drop: usize,
    /// A connection error was given to the codec: nothing more is read.
    pub ended: bool,
}

impl Guard {
    pub fn new(wire: Rc<Wire>, header_timeout: Duration, field_max: usize) -> Guard {
        Guard {
            wire,
            header_timeout,
            field_max,
            timer: None,
            drop: 0,
            ended: false,
        }
    }

    /// Stream `sid`'s header block has begun to come, not whole: it has
    /// `client_header_timeout` from now (nginx's ngx_http_v2_state_headers_save).
    pub fn waiting(&mut self, sid: u32) {
        if self.timer.as_ref().is_none_or(|(s, _)| *s != sid) {
            let sleep = tokio::time::sleep(self.header_timeout);
            self.timer = Some((sid, Box::pin(sleep)));
        }
    }

    /// Stream `sid`'s header block came whole.
    pub fn whole(&mut self, sid: u32) {
        if self.timer.as_ref().is_some_and(|(s, _)| *s == sid) {
            self.timer = None;
        }
    }

    /// The stream whose header block has not come in time, if it is now.
    pub fn poll_late(&mut self, cx: &mut Context<'_>) -> Option<u32> {
        let (sid, sleep) = self.timer.as_mut()?;
        let sid = *sid;
        sleep.as_mut().poll(cx).is_ready().then(|| {
            self.timer = None;
            sid
        })
    }
}

/// What becomes of a client's frame, by its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Pass,
    /// On a stream opened after a GOAWAY: the codec does not see it.
    Drop,
    /// A connection error with this code.
    Abort(u32),
}

impl Wire {
    /// A request's header block came on stream `sid`.
    pub fn started(&self, sid: u32) {
        if sid % 2 == 1 && sid > self.last_sid.get() {
            self.last_sid.set(sid);
        }
    }

    /// The connection is to end with this code (the codec is about to be given
    /// [`TRIGGER`]).
    pub fn condemn(&self, code: u32) {
        self.verdict.set(Some(code));
    }

    /// Whether a GOAWAY has gone out (to the transport).
    pub fn goaway_sent(&self) -> bool {
        self.sent.get()
    }

    /// The client's frame with header `h` (9 bytes), as nginx would take it.
    pub fn screen(&self, h: &[u8]) -> Screen {
        let len = frame_len(h);
        let sid = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
        if sid != 0 && self.gone.get().is_some_and(|last| sid > last) {
            return Screen::Drop;
        }
        let sized = match h[3] {
            PRIORITY => len == 5,
            RST_STREAM | WINDOW_UPDATE => len == 4,
            SETTINGS if h[4] == ACK => len == 0,
            SETTINGS => len.is_multiple_of(6),
            PING => len == 8,
            GOAWAY => len >= 8,
            PUSH_PROMISE => return Screen::Abort(PROTOCOL_ERROR),
            _ => true,
        };
        if sized {
            Screen::Pass
        } else {
            Screen::Abort(FRAME_SIZE_ERROR)
        }
    }

    /// A GOAWAY's last stream and code as the codec wrote them, as nginx would write them.
    fn rewrite(&self, last: u32, code: u32) -> (u32, u32) {
        let (last, code) = match self.verdict.get() {
            Some(v) => (self.last_sid.get(), v),
            // The first of the codec's graceful pair.
            None if last == 0x7fff_ffff && code == NO_ERROR => (self.last_sid.get(), code),
            None => (last, code),
        };
        let gone = self.gone.get().map_or(last, |g| g.min(last));
        self.gone.set(Some(gone));
        (last, code)
    }
}

/// An empty header block (a HEADERS frame with END_HEADERS only) on stream `sid`: a
/// request without pseudo-headers, which the codec resets with PROTOCOL_ERROR.
pub fn empty_headers(sid: u32) -> [u8; 9] {
    let s = sid.to_be_bytes();
    [0, 0, 0, 0x1, 0x4, s[0] & 0x7f, s[1], s[2], s[3]]
}

/// Where nginx's decoder stops on a header block: its error code. `block` is the block
/// (or as much of it as has come) and `total` its full length; `field_max` is the longest
/// string (as coded) nginx takes (`large_client_header_buffers`' size). Only what needs no
/// HPACK table is judged (an index past the table is the codec's to find); `None` also when
/// more is needed to tell.
pub fn hpack_fault(block: &[u8], total: usize, field_max: usize) -> Option<u32> {
    let mut at = 0;
    while at < block.len() {
        let b = block[at];
        let prefix = match b {
            _ if b & 0x80 != 0 => 7,
            _ if b & 0xc0 == 0x40 => 6,
            _ if b & 0xe0 == 0x20 => 5,
            _ => 4,
        };
        let (value, n) = match int(&block[at..], total - at, prefix) {
            Ok(v) => v,
            Err(code) => return code,
        };
        at += n;
        let strings = match prefix {
            // Index 0 is no field (RFC 7541 6.1); a table larger than allowed.
            7 if value == 0 => return Some(COMPRESSION_ERROR),
            5 if value > TABLE_SIZE => return Some(COMPRESSION_ERROR),
            7 | 5 => 0,
            _ if value == 0 => 2,
            _ => 1,
        };
        for _ in 0..strings {
            if at >= total {
                return Some(FRAME_SIZE_ERROR);
            }
            if at >= block.len() {
                return None;
            }
            let (len, n) = match int(&block[at..], total - at, 7) {
                Ok(v) => v,
                Err(code) => return code,
            };
            if len > field_max as u64 {
                return Some(ENHANCE_YOUR_CALM);
            }
            at += n;
            let Some(end) = usize::try_from(len).ok().and_then(|l| at.checked_add(l)) else {
                return Some(FRAME_SIZE_ERROR);
            };
            if end > total {
                return Some(FRAME_SIZE_ERROR);
            }
            at = end;
        }
    }
    None
}

/// nginx's ngx_http_v2_parse_int: an HPACK integer (RFC 7541 5.1) of at most four octets,
/// `rest` bytes of the block left from `b`'s start. `Err(Some(code))`: it runs past the
/// block (FRAME_SIZE_ERROR) or is longer (COMPRESSION_ERROR); `Err(None)`: not all come.
fn int(b: &[u8], rest: usize, prefix: u32) -> Result<(u64, usize), Option<u32>> {
    let max = (1u64 << prefix) - 1;
    let mut v = u64::from(b[0]) & max;
    if v < max {
        return Ok((v, 1));
    }
    for i in 1..rest.min(4) {
        let Some(&c) = b.get(i) else {
            return Err(None);
        };
        v += u64::from(c & 0x7f) << (7 * (i - 1));
        if c & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err(Some(if rest <= 4 {
        FRAME_SIZE_ERROR
    } else {
        COMPRESSION_ERROR
    }))
}

/// The codec's header list cap for nginx's `limit` on a request's names and values: the
/// codec counts 32 bytes more a field (RFC 9113 6.5.2), so its cap leaves room for that over
/// `max_fields` fields; nginx's own limit is checked on each request taken
/// ([`header_list_len`]).
pub fn codec_header_cap(limit: u32, max_fields: usize) -> u32 {
    let room = u32::try_from(max_fields.saturating_mul(32)).unwrap_or(u32::MAX);
    limit.saturating_add(room)
}

/// A request's header list as nginx counts it against `large_client_header_buffers`' total
/// (ngx_http_v2_state_process_header): names and values, pseudo-headers included.
pub fn header_list_len<B>(req: &http::Request<B>) -> usize {
    let uri = req.uri();
    let pseudo = |name: &str, value: Option<&str>| value.map_or(0, |v| name.len() + v.len());
    pseudo(":method", Some(req.method().as_str()))
        + pseudo(":scheme", uri.scheme_str())
        + pseudo(":path", uri.path_and_query().map(|p| p.as_str()))
        + pseudo(":authority", uri.authority().map(|a| a.as_str()))
        + req
            .headers()
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len())
            .sum::<usize>()
}

/// The server's side of a client's connection, under the codec: each GOAWAY it writes is
/// given nginx's code and last stream ([`Wire`]). The frames are followed by their headers;
/// only a GOAWAY's first eight payload bytes are held back (and written rewritten), all
/// else passes as it is written.
pub struct GoawayWriter<IO> {
    io: IO,
    wire: Rc<Wire>,
    scan: Scan,
    /// A GOAWAY's rewritten last stream and code, still to be written.
    out: [u8; 8],
    out_from: usize,
    /// Request bodies' windows (`conn::h2_window`): the codec's WINDOW_UPDATE and
    /// RST_STREAM frames are reported, and nginx's WINDOW_UPDATEs written between frames.
    windows: Option<Rc<Windows>>,
    /// WINDOW_UPDATE frames of ours still to be written (from `inject_from`).
    inject: Vec<u8>,
    inject_from: usize,
}

/// Where the outgoing bytes are in their frames.
#[derive(Clone, Copy)]
struct Scan {
    /// Payload bytes to pass before the next frame header.
    skip: usize,
    head: [u8; 9],
    have: usize,
    /// A GOAWAY's last stream and code, as they come (`held` of 8).
    fields: [u8; 8],
    held: usize,
    in_goaway: bool,
    /// A stream's WINDOW_UPDATE or RST_STREAM (its type), whose four payload bytes are
    /// gathered as they pass (`word`, `word_have` of them) for `conn::h2_window`.
    word_of: u8,
    word: [u8; 4],
    word_have: usize,
}

impl Scan {
    /// How many of `data`'s first bytes pass unchanged (up to a GOAWAY's fields), the
    /// scan moved past them; with `seen`, the bytes were written, and a stream's
    /// WINDOW_UPDATE or RST_STREAM is told to it.
    fn pass(&mut self, data: &[u8], seen: Option<&Windows>) -> usize {
        let mut at = 0;
        while at < data.len() {
            if self.in_goaway {
                return at;
            }
            if self.skip > 0 {
                let n = self.skip.min(data.len() - at);
                if self.word_of != 0 {
                    let k = n.min(4 - self.word_have);
                    self.word[self.word_have..self.word_have + k]
                        .copy_from_slice(&data[at..at + k]);
                    self.word_have += k;
                    if self.word_have == 4 {
                        if let Some(w) = seen {
                            let sid = frame_sid(&self.head);
                            match self.word_of {
                                WINDOW_UPDATE => {
                                    w.codec_update(sid, u32::from_be_bytes(self.word) & 0x7fff_ffff)
                                }
                                _ => w.forget(sid),
                            }
                        }
                        self.word_of = 0;
                    }
                }
                self.skip -= n;
                at += n;
                continue;
            }
            let n = (9 - self.have).min(data.len() - at);
            self.head[self.have..self.have + n].copy_from_slice(&data[at..at + n]);
            self.have += n;
            at += n;
            if self.have == 9 {
                self.have = 0;
                let len = frame_len(&self.head);
                if self.head[3] == GOAWAY && len >= 8 {
                    self.in_goaway = true;
                    self.held = 0;
                    self.skip = len - 8;
                } else {
                    self.skip = len;
                    let stream = frame_sid(&self.head) != 0;
                    if matches!(self.head[3], WINDOW_UPDATE | RST_STREAM) && len == 4 && stream {
                        self.word_of = self.head[3];
                        self.word_have = 0;
                    }
                }
            }
        }
        at
    }
}

impl<IO> GoawayWriter<IO> {
    pub fn new(io: IO, wire: Rc<Wire>) -> GoawayWriter<IO> {
        GoawayWriter {
            io,
            wire,
            scan: Scan {
                skip: 0,
                head: [0; 9],
                have: 0,
                fields: [0; 8],
                held: 0,
                in_goaway: false,
                word_of: 0,
                word: [0; 4],
                word_have: 0,
            },
            out: [0; 8],
            out_from: 8,
            windows: None,
            inject: Vec::new(),
            inject_from: 0,
        }
    }

    /// Request bodies' windows are kept as nginx's (`conn::h2_window`).
    pub fn with_windows(mut self, windows: Rc<Windows>) -> GoawayWriter<IO> {
        self.windows = Some(windows);
        self
    }

    /// Take (some of) a GOAWAY's fields from `data`; once all eight are in, they are
    /// rewritten, to be written first. Returns how many bytes were taken.
    fn take_fields(&mut self, data: &[u8]) -> usize {
        let s = &mut self.scan;
        let n = (8 - s.held).min(data.len());
        s.fields[s.held..s.held + n].copy_from_slice(&data[..n]);
        s.held += n;
        if s.held == 8 {
            s.in_goaway = false;
            let f = s.fields;
            let last = u32::from_be_bytes([f[0] & 0x7f, f[1], f[2], f[3]]);
            let code = u32::from_be_bytes([f[4], f[5], f[6], f[7]]);
            let (last, code) = self.wire.rewrite(last, code);
            self.out[..4].copy_from_slice(&last.to_be_bytes());
            self.out[4..].copy_from_slice(&code.to_be_bytes());
            self.out_from = 0;
        }
        n
    }
}

impl<IO: AsyncWrite + Unpin> GoawayWriter<IO> {
    /// Write out the rewritten GOAWAY fields, if any are left, then (between frames) the
    /// WINDOW_UPDATEs `conn::h2_window` wants written.
    fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.out_from < self.out.len() {
            while self.out_from < self.out.len() {
                let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.out_from..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.out_from += n;
            }
            self.wire.sent.set(true);
        }
        let Some(w) = &self.windows else {
            return Poll::Ready(Ok(()));
        };
        // Woken when there is one to write (the codec flushes on each of its turns).
        w.wait_writer(cx.waker());
        let s = &self.scan;
        if self.inject_from == self.inject.len() && s.skip == 0 && s.have == 0 && !s.in_goaway {
            self.inject.clear();
            self.inject_from = 0;
            w.updates(&mut self.inject);
        }
        while self.inject_from < self.inject.len() {
            let rest = &self.inject[self.inject_from..];
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.inject_from += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for GoawayWriter<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for GoawayWriter<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_out(cx))?;
        let mut probe = this.scan;
        let plain = probe.pass(buf, None);
        if plain == 0 && !buf.is_empty() {
            return Poll::Ready(Ok(this.take_fields(buf)));
        }
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, &buf[..plain]))?;
        this.scan.pass(&buf[..n], this.windows.as_deref());
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_out(cx))?;
        // All of it passes unchanged (the usual case): written as it is.
        let mut probe = this.scan;
        let whole = bufs.iter().all(|b| probe.pass(b, None) == b.len());
        if !whole {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return Pin::new(this).poll_write(cx, first);
        }
        let written = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        let mut n = written;
        for b in bufs {
            if n == 0 {
                break;
            }
            let k = n.min(b.len());
            this.scan.pass(&b[..k], this.windows.as_deref());
            n -= k;
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_out(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_out(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn frame(kind: u8, flags: u8, sid: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(sid.to_be_bytes());
        f.extend(payload);
        f
    }

    fn goaway(last: u32, code: u32) -> Vec<u8> {
        frame(
            GOAWAY,
            0,
            0,
            &[&last.to_be_bytes()[..], &code.to_be_bytes(), b"dbg"].concat(),
        )
    }

    /// `frames` written through a GoawayWriter `piece` bytes at a time.
    fn written(wire: Rc<Wire>, frames: &[u8], piece: usize) -> Vec<u8> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut w = GoawayWriter::new(Vec::new(), wire);
            for c in frames.chunks(piece) {
                w.write_all(c).await.unwrap();
            }
            w.flush().await.unwrap();
            w.io
        })
    }

    #[test]
    fn goaway_is_written_as_nginx_would() {
        let head = [frame(0x4, 0, 0, &[]), frame(0x0, 0, 1, &[7u8; 30])].concat();
        for piece in [1, 5, 1000] {
            // The codec's graceful GOAWAY names the last stream taken.
            let wire = Rc::new(Wire::default());
            wire.started(5);
            let out = written(
                wire.clone(),
                &[&head[..], &goaway(0x7fff_ffff, 0)].concat(),
                piece,
            );
            assert_eq!(out, [&head[..], &goaway(5, 0)].concat(), "{piece}");
            // Then streams above it are dropped.
            assert_eq!(wire.screen(&frame(0x1, 0x5, 7, &[])), Screen::Drop);
            assert_eq!(wire.screen(&frame(0x0, 0, 5, &[])), Screen::Pass);
            // A connection error's code and last stream, once condemned.
            let wire = Rc::new(Wire::default());
            wire.started(3);
            wire.condemn(COMPRESSION_ERROR);
            let out = written(
                wire,
                &[&head[..], &goaway(1, PROTOCOL_ERROR)].concat(),
                piece,
            );
            assert_eq!(out, [&head[..], &goaway(3, COMPRESSION_ERROR)].concat());
            // Else as it was.
            let wire = Rc::new(Wire::default());
            let g = goaway(0, PROTOCOL_ERROR);
            assert_eq!(
                written(wire, &[&head[..], &g].concat(), piece),
                [&head[..], &g].concat()
            );
        }
    }

    #[test]
    fn frames_nginx_ends_the_connection_for() {
        let w = Wire::default();
        let size = Screen::Abort(FRAME_SIZE_ERROR);
        assert_eq!(w.screen(&frame(PING, 0, 0, &[0; 4])), size);
        assert_eq!(w.screen(&frame(PING, 0, 0, &[0; 8])), Screen::Pass);
        assert_eq!(w.screen(&frame(GOAWAY, 0, 0, &[])), size);
        assert_eq!(w.screen(&frame(SETTINGS, 0, 0, &[0; 5])), size);
        assert_eq!(w.screen(&frame(SETTINGS, ACK, 0, &[0; 6])), size);
        assert_eq!(w.screen(&frame(SETTINGS, 0, 0, &[0; 12])), Screen::Pass);
        assert_eq!(w.screen(&frame(PRIORITY, 0, 1, &[0; 4])), size);
        assert_eq!(w.screen(&frame(RST_STREAM, 0, 1, &[0; 5])), size);
        assert_eq!(w.screen(&frame(WINDOW_UPDATE, 0, 0, &[0; 3])), size);
        assert_eq!(
            w.screen(&frame(PUSH_PROMISE, 0, 1, &[])),
            Screen::Abort(PROTOCOL_ERROR)
        );
    }

    #[test]
    fn header_blocks_nginx_stops_on() {
        let max = 512;
        let get = b"\x82\x86\x84\x01\x09localhost";
        assert_eq!(hpack_fault(get, get.len(), max), None);
        let whole = |b: &[u8]| hpack_fault(b, b.len(), max);
        assert_eq!(whole(b"\x80"), Some(COMPRESSION_ERROR));
        assert_eq!(whole(b"\x3f\xe1\x1f"), None); // table size 4096
        assert_eq!(whole(b"\x3f\xe2\x1f"), Some(COMPRESSION_ERROR)); // 4097
        assert_eq!(whole(b"\xff"), Some(FRAME_SIZE_ERROR));
        assert_eq!(whole(b"\xff\xff\xff\xff"), Some(FRAME_SIZE_ERROR));
        assert_eq!(whole(b"\xff\xff\xff\xff\x01"), Some(COMPRESSION_ERROR));
        assert_eq!(whole(b"\x01\x09local"), Some(FRAME_SIZE_ERROR));
        assert_eq!(whole(b"\x00"), Some(FRAME_SIZE_ERROR));
        let long = [&b"\x00\x01a\x7f\x81\x03"[..], &[b'v'; 512]].concat();
        assert_eq!(whole(&long), None);
        let longer = [&b"\x00\x01a\x7f\x82\x04"[..], &[b'v'; 641]].concat();
        assert_eq!(whole(&longer), Some(ENHANCE_YOUR_CALM));
        // Not all come: judged once it can be.
        assert_eq!(hpack_fault(b"\xff\xff", 5, max), None);
        assert_eq!(
            hpack_fault(b"\xff\xff\xff\xff", 5, max),
            Some(COMPRESSION_ERROR)
        );
        assert_eq!(hpack_fault(b"\x01\x09local", 14, max), None);
    }
}
