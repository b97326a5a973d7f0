//! The exchange with an upstream server, the I/O side of `proxy_pass`, `fastcgi_pass`,
//! `scgi_pass` and `uwsgi_pass`: connect (TCP or a unix socket, then the TLS handshake for
//! `proxy_pass https://`, see `tls::client`), send the request in the
//! protocol's encoding with its body, read the answer, and turn it into an [`Outcome`] for
//! the request phases. The four differ only in framing:
//!
//! - HTTP (`proxy_pass`): a request head built by `modules::proxy`, then the body; the
//!   answer's head says how its body ends (length, chunked, or the close) and whether the
//!   connection can carry another request, which it does when the group has `keepalive N`
//!   and the request did not ask for `Connection: close`. With `proxy_http_version 2` each
//!   attempt is a stream instead (`conn::proxy_h2`), whose answer is read through the same
//!   [`Link`] (a [`Wire::H2`]) and goes through the same steps after its head.
//!
//! - FastCGI: BEGIN_REQUEST, PARAMS and the body as STDIN records; the answer comes in
//!   STDOUT / STDERR records and ends with END_REQUEST, so the connection can carry the
//!   next request: with `fastcgi_keep_conn on` plus the group's `keepalive N` it is kept
//!   (`upstream` module).
//! - SCGI and uwsgi: a header block, then the body as is; the answer is a plain byte stream
//!   that ends when the application closes the connection (or after the Content-Length it
//!   announced). Their connections are never kept, as in nginx.
//!
//! The request body has been read whole (in memory, or in a temporary file past
//! `client_body_buffer_size`: see `conn::request_body`), or (`*_request_buffering off`, see
//! [`streams`]) is read from the client piece by piece after the request's head is sent,
//! each piece framed for the protocol (as is, HTTP chunks, FastCGI STDIN records); once a
//! piece has gone, the request cannot go to another server. The answer is read once the
//! body is sent.
//!
//! An answer that has come whole by the time its last byte is read (the usual small one, in
//! one or a few reads with no wait between them), up to `*_buffers` (32 KiB by default: the
//! memory nginx would give it), is sent whole: the application is released at once and the
//! client gets a Content-Length. As soon as the application pauses (a read would wait), or
//! past `*_buffers`, the answer is streamed ([`Streaming`]): what came goes to the client at
//! once and the rest as it comes (with the application's Content-Length if it gave one, else
//! chunked to HTTP/1.1 clients and close-delimited to HTTP/1.0 ones), so nothing is held
//! while an application thinks; meanwhile the rest is read ahead of a slow client into
//! `*_buffers` and a temporary file (`conn::spool`), freeing the application early.
//! `*_buffering off`, or the application's `X-Accel-Buffering: no`, streams from the head
//! on, each read handed on as it is read and the application read only as fast as the
//! client takes it. If the application dies mid-way the client connection is closed, so
//! the client sees the answer is incomplete. With an `upstream` group, the server is picked
//! by the group's balancing method and failed servers are skipped per `*_next_upstream`; a
//! plain address gets a new connection per request, as in nginx.
//!
//! Failures map to nginx's statuses and log lines: refused or unreachable -> 502, a failed
//! TLS handshake or certificate check -> 502 (retried as `error`: nothing was sent), a
//! timeout -> 504, malformed records or head -> 502, an application that closes before the
//! answer's head has gone to the client -> 502, parameters the
//! protocol cannot carry (uwsgi's 64 KiB block) -> 500. A streamed answer that fails is cut
//! short and the client connection closed.
//!
//! A client that leaves while the exchange is under way (its connection closes, or its
//! HTTP/2 stream is reset) ends it there, as nginx's `*_ignore_client_abort off`: the
//! upstream connection is closed, not pooled, and the request is logged 499
//! ([`unless_client_leaves`]). With `*_ignore_client_abort on` the exchange runs to its end.

use super::body::{BodyError, BodySource};
use super::request_body::{BodyFile, RequestBody};
use super::spool::Spool;
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::request::UpstreamTry;
use crate::http::response::{Body, Response};
use crate::modules::gateway::{self, Answer, Backend, Field, GatewayConf, Proto, Streamed};
use crate::modules::{memcached, proxy, proxy_cookie};
use crate::runtime::clock;
use crate::runtime::metrics::Key as MetricsKey;
use crate::runtime::read_timers::ReadTimers;
use crate::runtime::worker::Worker;
use crate::tls::client as tls_client;
use crate::upstream::{Addr, Conn, Key, Lease, Pick, Slot, Tried, Upstream};
use bytes::{Bytes, BytesMut};
use gannet_proto::cgi::{self, CgiHead, HeaderValue, ParamError};
use gannet_proto::fastcgi::{self, Record};
use gannet_proto::h1::{parse_response, BodyKind, Chunk, ChunkedDecoder, Framing, Method};
use gannet_proto::{scgi, uwsgi};
use rustls::pki_types::ServerName;
use std::borrow::Cow;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// The most one read from an application takes.
const READ_MAX: usize = 16 * 1024;

/// FastCGI: the room read past a STDOUT record's content when the rest of it is read
/// straight into the body's buffer: its padding (up to 7 bytes), and what PHP-FPM sends
/// after its last one (a short record of at most 7 bytes and its padding, an empty STDOUT,
/// END_REQUEST) - 53 bytes at most - so the end of the answer usually comes in that read.
const RECORD_SLACK: usize = 64;

pub(super) const CONNECTING: &str = "connecting to upstream";
const HANDSHAKING: &str = "SSL handshaking to upstream";
pub(super) const SENDING: &str = "sending request to upstream";
pub(super) const READING_HEAD: &str = "reading response header from upstream";
pub(super) const READING: &str = "reading upstream";
const READING_BODY_FILE: &str = "reading request body from its temporary file";

/// Why an exchange failed, with nginx's wording for the error log.
pub(super) enum Failure {
    Connect(std::io::Error),
    /// The TLS handshake failed (nginx's wording of why).
    Handshake(String),
    Timeout(&'static str),
    Io(std::io::Error, &'static str),
    Protocol(String),
    /// The body's framing is broken (a bad chunk).
    Body(&'static str),
    /// The connection closed after part of the answer.
    Premature(Proto),
    /// The connection closed before any answer (a kept connection may simply be stale).
    ClosedEarly,
    /// The client's body, passed on as it arrived, could not be read to its end.
    Client(BodyError),
    /// What was read ahead could not be read back from its temporary file.
    Spool(std::io::Error),
}

impl Failure {
    pub(super) fn status(&self) -> u16 {
        match self {
            Failure::Timeout(_) => 504,
            Failure::Client(BodyError::TooLarge) => 413,
            Failure::Client(BodyError::Malformed) => 400,
            // nginx's code for a client gone (nothing is sent to it).
            Failure::Client(BodyError::Io) => 499,
            _ => 502,
        }
    }

    /// What a kept connection that the application closed meanwhile runs into.
    fn stale(&self) -> bool {
        matches!(self, Failure::ClosedEarly | Failure::Io(..))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) => write!(
                f,
                "connect() failed ({}) while {CONNECTING}",
                crate::errlog::errno_text(e)
            ),
            Failure::Handshake(why) => write!(f, "{why} while {HANDSHAKING}"),
            Failure::Timeout(phase) => write!(f, "upstream timed out while {phase}"),
            // nginx's form: the call, then `(errno: text)`.
            Failure::Io(e, phase) => {
                let call = match *phase {
                    SENDING => "writev()",
                    READING_BODY_FILE => "pread()",
                    _ => "recv()",
                };
                let text = crate::errlog::errno_text(e);
                write!(f, "{call} failed ({text}) while {phase}")
            }
            Failure::Protocol(why) => write!(f, "{why} while {READING_HEAD}"),
            Failure::Body(why) => write!(f, "{why} while {READING}"),
            Failure::Premature(Proto::FastCgi) => {
                write!(
                    f,
                    "upstream prematurely closed FastCGI stdout while {READING}"
                )
            }
            Failure::Premature(_) => {
                write!(f, "upstream prematurely closed connection while {READING}")
            }
            Failure::ClosedEarly => {
                write!(
                    f,
                    "upstream prematurely closed connection while {READING_HEAD}"
                )
            }
            Failure::Client(BodyError::TooLarge) => {
                write!(f, "client intended to send too large body while {SENDING}")
            }
            Failure::Client(BodyError::Malformed) => {
                write!(f, "client sent invalid chunked body while {SENDING}")
            }
            Failure::Client(BodyError::Io) => write!(
                f,
                "client prematurely closed connection or timed out while {SENDING}"
            ),
            Failure::Spool(e) => write!(
                f,
                "{} while reading the buffered response from its temporary file",
                crate::errlog::failed("pread()", std::path::Path::new("temp file"), e)
            ),
        }
    }
}

/// What one step of reading the answer gave.
enum Event {
    /// Answer bytes (FastCGI's STDOUT).
    Data(Bytes),
    /// FastCGI's STDERR.
    Stderr(Bytes),
    /// The answer is complete.
    End,
}

/// What a [`Link`] reads: the connection to the application, or an HTTP/2 stream on one
/// (`proxy_http_version 2`, `conn::proxy_h2`), whose connection is the pool's.
pub(super) enum Wire {
    Socket(Conn),
    H2(super::proxy_h2::Download),
}

impl tokio::io::AsyncRead for Wire {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Wire::Socket(c) => std::pin::Pin::new(&mut **c).poll_read(cx, buf),
            Wire::H2(d) => std::pin::Pin::new(d).poll_read(cx, buf),
        }
    }
}

/// The connection to the application and how its answer is framed.
pub(super) struct Link {
    conn: Wire,
    proto: Proto,
    /// How the log names the upstream (`http`, `https`, `fastcgi`...).
    scheme: &'static str,
    /// Bytes read but not taken yet.
    input: BytesMut,
    /// SCGI / uwsgi / HTTP with a Content-Length: the body bytes still to come.
    left: Option<u64>,
    /// HTTP with a chunked body.
    chunked: Option<ChunkedDecoder>,
    /// Where its trailer fields go (`proxy_pass_trailers`).
    trailers: Option<super::proxy_h2::Trailers>,
    /// HTTP: the server keeps the connection after this answer.
    keep_alive: bool,
    /// Whether anything came: a FastCGI close before that is what a stale kept connection
    /// does, after it an answer cut short.
    got_any: bool,
    /// The worker's deadlines, for the send and read timeouts.
    timers: Rc<ReadTimers>,
    /// The most one read takes: [`READ_MAX`], or `*_buffer_size` for an unbuffered
    /// answer (nginx holds no more than that of it).
    read_max: usize,
    /// memcached: how much of the `\r\nEND\r\n` after the value is still to come.
    trailer: usize,
    /// FastCGI: STDOUT taken out of the records as they were read (see [`Link::demux`]),
    /// to go before anything in `input`.
    stdout: BytesMut,
    /// FastCGI: END_REQUEST came last in a read, nothing after it.
    ended: bool,
    /// FastCGI: the content of the STDOUT record under way still to come (read straight
    /// into `stdout`, see [`Link::poll_record`]), and its padding still to skip.
    rec_left: usize,
    pad_left: usize,
    /// The request's body was cut short (the answer came first): the connection is not
    /// kept, as nginx keeps none whose request body was not all sent.
    cut: bool,
}

impl Link {
    fn new(conn: Conn, via: &Via) -> Link {
        Link::on(Wire::Socket(conn), via)
    }

    pub(super) fn on(conn: Wire, via: &Via) -> Link {
        Link {
            conn,
            proto: via.proto,
            scheme: via.scheme(),
            input: BytesMut::new(),
            left: None,
            chunked: None,
            trailers: None,
            keep_alive: false,
            got_any: false,
            timers: via.timers.clone(),
            read_max: READ_MAX,
            trailer: 0,
            stdout: BytesMut::new(),
            ended: false,
            rec_left: 0,
            pad_left: 0,
            cut: false,
        }
    }

    /// One read from the application (0: the end of the stream).
    fn poll_read(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.proto != Proto::FastCgi {
            return poll_read_into(&mut self.conn, (&mut self.input, self.read_max), cx);
        }
        if self.rec_left > 0 {
            // (Never with anything in `input`: see `demux`.)
            return self.poll_record(cx);
        }
        let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); READ_MAX];
        let n = self.read_max.clamp(1, READ_MAX);
        let mut rb = tokio::io::ReadBuf::uninit(&mut chunk[..n]);
        std::task::ready!(tokio::io::AsyncRead::poll_read(
            std::pin::Pin::new(&mut self.conn),
            cx,
            &mut rb
        ))?;
        if self.input.is_empty() {
            self.demux(rb.filled());
        } else {
            // What is left of an earlier read (a cut header, STDERR) goes first: demultiplexed
            // again with this read after it.
            let mut pending = std::mem::take(&mut self.input);
            pending.extend_from_slice(rb.filled());
            self.demux(&pending);
        }
        std::task::Poll::Ready(Ok(rb.filled().len()))
    }

    /// FastCGI, with no STDOUT record under way: the whole STDOUT records of what was just
    /// read go into `stdout` as they are copied out of the read's buffer, and so does the
    /// part that came of a STDOUT record the read cut (the rest of it is read straight into
    /// `stdout`, [`Link::poll_record`]); anything else (a header cut by the read's end,
    /// STDERR, or anything after END_REQUEST) goes into `input`, decoded from there in order
    /// after them. Hand-written for the usual answer, a few records in one read or a long
    /// one over several: their content is copied once, into a buffer of its size that
    /// becomes the answer's body as it is. (Through `input`, each record was copied there,
    /// split off it - an allocation for the buffer's shared count - and copied again into
    /// the body, since the rest of `input` still shared the buffer.)
    fn demux(&mut self, mut got: &[u8]) {
        // The padding of the record whose content ended the last read.
        let skip = self.pad_left.min(got.len());
        self.pad_left -= skip;
        got = &got[skip..];
        // Room for exactly the STDOUT that came or is under way: a buffer whose length is
        // its capacity becomes a `Bytes` and back (the body) without an allocation of its
        // own.
        let mut room = 0;
        let mut rest = got;
        loop {
            match fastcgi::peek(rest) {
                Ok(Some((r, used))) => {
                    match r {
                        fastcgi::RecordRef::Stdout(c) => room += c.len(),
                        fastcgi::RecordRef::Skip => {}
                        _ => break,
                    }
                    rest = &rest[used..];
                }
                Ok(None) => {
                    if let Some((len, _)) = fastcgi::stdout_header(rest) {
                        room += len + RECORD_SLACK;
                    }
                    break;
                }
                Err(_) => break,
            }
        }
        self.stdout.reserve(room);
        loop {
            match fastcgi::peek(got) {
                Ok(Some((fastcgi::RecordRef::Stdout(c), used))) => {
                    self.stdout.extend_from_slice(c);
                    got = &got[used..];
                }
                Ok(Some((fastcgi::RecordRef::Skip, used))) => got = &got[used..],
                Ok(Some((fastcgi::RecordRef::End { .. }, used))) if used == got.len() => {
                    self.ended = true;
                    got = &[];
                }
                Ok(None) => {
                    if let Some((len, pad)) = fastcgi::stdout_header(got) {
                        // A STDOUT record cut by the read's end: its part that came, and
                        // what is left of it and of its padding.
                        let came = &got[fastcgi::HEADER_LEN..];
                        let content = came.len().min(len);
                        self.stdout.extend_from_slice(&came[..content]);
                        self.rec_left = len - content;
                        self.pad_left = pad - (came.len() - content);
                        got = &[];
                    }
                    break;
                }
                _ => break,
            }
        }
        if !got.is_empty() {
            self.input.extend_from_slice(got);
        }
    }

    /// FastCGI, in the middle of a STDOUT record: read the rest of its content straight
    /// into `stdout`, where its start is (no copy but the kernel's), with a little room
    /// past it for the records that usually follow (its padding, END_REQUEST), which are
    /// taken out again and demultiplexed.
    fn poll_record(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        let want = (self.rec_left + RECORD_SLACK).min(self.read_max.max(1));
        // A buffered answer's record is read whole into one buffer: room for all of it at
        // once, not grown (and copied) read by read.
        let room = if self.read_max >= READ_MAX {
            self.rec_left + RECORD_SLACK
        } else {
            want
        };
        self.stdout.reserve(room);
        let len = self.stdout.len();
        let mut rb = tokio::io::ReadBuf::uninit(&mut self.stdout.spare_capacity_mut()[..want]);
        std::task::ready!(tokio::io::AsyncRead::poll_read(
            std::pin::Pin::new(&mut self.conn),
            cx,
            &mut rb
        ))?;
        let n = rb.filled().len();
        // SAFETY: the read initialised the first `n` bytes of the spare capacity (`filled`),
        // which are the `n` bytes after the current length.
        unsafe { self.stdout.set_len(len + n) };
        if n > self.rec_left {
            // The record's end and what followed it (at most RECORD_SLACK bytes).
            let mut tail = [0u8; RECORD_SLACK];
            let extra = n - self.rec_left;
            let at = self.stdout.len() - extra;
            tail[..extra].copy_from_slice(&self.stdout[at..]);
            self.stdout.truncate(at);
            self.rec_left = 0;
            self.demux(&tail[..extra]);
        } else {
            self.rec_left -= n;
        }
        std::task::Poll::Ready(Ok(n))
    }

    /// FastCGI: part of a STDOUT record has come and the rest is being read (buffered
    /// answers: an unbuffered one hands on each read as it comes).
    fn holding(&self) -> bool {
        self.rec_left > 0 && !self.stdout.is_empty() && self.read_max >= READ_MAX
    }

    /// What of a held record has come, once the application pauses in its middle.
    fn release_held(&mut self) -> Result<Option<Event>, Failure> {
        let rec_left = std::mem::take(&mut self.rec_left);
        let ev = self.buffered();
        self.rec_left = rec_left;
        ev
    }

    /// The next piece of the answer, reading when none is buffered.
    async fn next(&mut self, timeout: Duration, in_body: bool) -> Result<Event, Failure> {
        loop {
            if let Some(ev) = self.buffered()? {
                return Ok(ev);
            }
            let phase = if in_body { READING } else { READING_HEAD };
            if self.holding() {
                // A record held: read on while the rest has come, else hand on what came.
                match self.read_now().await {
                    Some(Ok(0)) => return self.closed(in_body),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(Failure::Io(e, phase)),
                    None => {
                        if let Some(ev) = self.release_held()? {
                            return Ok(ev);
                        }
                    }
                }
            }
            let timers = self.timers.clone();
            let read = read_more(
                &timers,
                std::future::poll_fn(|cx| self.poll_read(cx)),
                timeout,
                phase,
            );
            if read.await? == 0 {
                return self.closed(in_body);
            }
            self.got_any = true;
        }
    }

    /// The next piece of the body if the application has sent it already; `None` when it
    /// must be waited for (the answer is then streamed: nothing is held while the
    /// application pauses). One poll of the socket, no timer: an answer that came whole
    /// costs no deadline.
    async fn next_ready(&mut self) -> Option<Result<Event, Failure>> {
        loop {
            match self.buffered() {
                Ok(Some(ev)) => return Some(Ok(ev)),
                Err(f) => return Some(Err(f)),
                Ok(None) => {}
            }
            match self.read_now().await {
                None if self.holding() => return self.release_held().transpose(),
                None => return None,
                Some(Err(e)) => return Some(Err(Failure::Io(e, READING))),
                Some(Ok(0)) => return Some(self.closed(true)),
                Some(Ok(_)) => {}
            }
        }
    }

    /// One read if the application has sent something, without waiting (`None`: nothing
    /// came yet; the socket's readiness is watched by the task from now on).
    async fn read_now(&mut self) -> Option<std::io::Result<usize>> {
        let r = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match self.poll_read(cx) {
                std::task::Poll::Ready(r) => Some(r),
                std::task::Poll::Pending => None,
            })
        })
        .await;
        if matches!(r, Some(Ok(n)) if n > 0) {
            self.got_any = true;
        }
        r
    }

    /// The next piece that the bytes already read make, if they make one.
    fn buffered(&mut self) -> Result<Option<Event>, Failure> {
        if self.proto == Proto::Memcached {
            return Ok(self.memcached_piece());
        }
        if self.proto == Proto::FastCgi {
            // What `demux` took out goes first; it came before anything in `input`. A record
            // under way is held until its end (one piece, not one per read) while the rest
            // comes at once (see `next`).
            let record = if self.holding() {
                None
            } else if !self.stdout.is_empty() {
                Some(Record::Stdout(std::mem::take(&mut self.stdout).freeze()))
            } else if self.ended && self.input.is_empty() {
                self.ended = false;
                Some(Record::End {
                    app_status: 0,
                    protocol_status: 0,
                })
            } else {
                fastcgi::decode(&mut self.input).map_err(|e| Failure::Protocol(e.to_string()))?
            };
            return match record {
                Some(Record::Stdout(mut b)) => {
                    if let Some(left) = &mut self.left {
                        // nginx's rule: an answer ends at its Content-Length; the rest of
                        // STDOUT is dropped.
                        if b.len() as u64 > *left {
                            errlog::warn(format_args!(
                                "upstream sent more data than specified in \"Content-Length\" header while {READING}"
                            ));
                            b.truncate(usize::try_from(*left).unwrap_or(usize::MAX));
                        }
                        *left -= b.len() as u64;
                    }
                    Ok(Some(Event::Data(b)))
                }
                Some(Record::Stderr(b)) => Ok(Some(Event::Stderr(b))),
                Some(Record::End { .. }) if self.left.is_some_and(|n| n > 0) => {
                    Err(Failure::Premature(Proto::FastCgi))
                }
                Some(Record::End { .. }) => Ok(Some(Event::End)),
                None => Ok(None),
            };
        }
        if let Some(dec) = &mut self.chunked {
            let chunk = dec
                .decode(&mut self.input)
                .map_err(|_| Failure::Body("upstream sent invalid chunked response"))?;
            return Ok(match chunk {
                Chunk::Data(b) => Some(Event::Data(b)),
                Chunk::Done => {
                    if let Some(slot) = &self.trailers {
                        super::proxy_h2::keep_trailers(slot, dec.take_trailers());
                    }
                    Some(Event::End)
                }
                Chunk::NeedMore => None,
            });
        }
        // An HTTP/2 stream is read to its end all the same: trailer fields may follow.
        if self.left == Some(0) && !matches!(self.conn, Wire::H2(_)) {
            return Ok(Some(Event::End));
        }
        if self.input.is_empty() {
            return Ok(None);
        }
        // Taken whole, not split: a split would make the buffer shared (an allocation for
        // its count).
        let mut b = std::mem::take(&mut self.input);
        if let Some(left) = &mut self.left {
            // Bytes past the announced length are not part of the answer.
            b.truncate(usize::try_from(*left).unwrap_or(usize::MAX));
            *left -= b.len() as u64;
        }
        Ok(Some(Event::Data(b.freeze())))
    }

    /// memcached: the next piece of the value, then its trailer checked (nginx's
    /// `ngx_http_memcached_filter`: a wrong trailer is logged and ends the answer, the
    /// connection not kept).
    fn memcached_piece(&mut self) -> Option<Event> {
        const END: &[u8] = b"\r\nEND\r\n";
        let Some(left) = self.left else {
            // The first line is still to come: what came goes to `memcached_head`.
            return (!self.input.is_empty())
                .then(|| Event::Data(std::mem::take(&mut self.input).freeze()));
        };
        if left > 0 {
            if self.input.is_empty() {
                return None;
            }
            let n = usize::try_from(left).map_or(self.input.len(), |l| l.min(self.input.len()));
            self.left = Some(left - n as u64);
            return Some(Event::Data(self.input.split_to(n).freeze()));
        }
        if self.trailer > 0 {
            let want = &END[END.len() - self.trailer..];
            let n = self.input.len().min(self.trailer);
            if self.input[..n] != want[..n] {
                errlog::error(format_args!(
                    "memcached sent invalid trailer while {READING}"
                ));
                self.trailer = 0;
                self.keep_alive = false;
                return Some(Event::End);
            }
            let _ = self.input.split_to(n);
            self.trailer -= n;
            if self.trailer > 0 {
                return None;
            }
            self.keep_alive = true;
        }
        Some(Event::End)
    }

    /// What the application closing its connection means here.
    fn closed(&self, in_body: bool) -> Result<Event, Failure> {
        let delimited = self.left.is_some() || self.chunked.is_some();
        match self.proto {
            Proto::FastCgi if self.got_any => Err(Failure::Premature(self.proto)),
            Proto::FastCgi => Err(Failure::ClosedEarly),
            // A stream's end is the answer's end, once its head has come and unless it
            // announced a length or chunks.
            _ if in_body && (!delimited || self.complete()) => Ok(Event::End),
            _ if in_body => Err(Failure::Premature(self.proto)),
            _ => Err(Failure::ClosedEarly),
        }
    }

    /// After the head of a stream: where its body ends, given the part of it already in
    /// `body`. Read to the close for HEAD (the length is the entity's, not this answer's),
    /// nothing for 204 and 304, else the Content-Length if there is one. A FastCGI answer
    /// ends with its END_REQUEST record, but no later than its Content-Length (so the
    /// client, which gets that length, is never sent more). A HEAD whose answer goes to a
    /// cache entry is framed as the others: as nginx's, one that came short (a body-less
    /// answer to HEAD) or longer than its Content-Length is not kept.
    pub(super) fn frame(&mut self, req: &Request, head: &CgiHead, body: &mut BytesMut) {
        if req.is_head() && req.cache.borrow().is_none() {
            return;
        }
        let framing = match head.status {
            Some(204 | 304) => Framing::Empty,
            _ => head
                .get("content-length")
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(Framing::Close, Framing::Length),
        };
        if self.proto == Proto::FastCgi && !matches!(framing, Framing::Length(_)) {
            return;
        }
        if let (true, Framing::Length(n)) = (req.is_head(), framing) {
            // More than announced in answer to HEAD: nginx keeps no entry of it.
            if body.len() as u64 > n {
                super::gateway_cache::no_store(req);
            }
        }
        self.set_framing(framing, false, body);
    }

    /// After the head: how the body ends, given the part of it already in `body` (moved
    /// back to the input for a chunked one, which is decoded from there), and whether the
    /// connection stays open after it (HTTP only).
    fn set_framing(&mut self, framing: Framing, keep_alive: bool, body: &mut BytesMut) {
        self.keep_alive = keep_alive;
        match framing {
            Framing::Empty | Framing::Length(_) => {
                let n = if let Framing::Length(n) = framing {
                    n
                } else {
                    0
                };
                if body.len() as u64 > n {
                    // More than announced: the connection is out of step.
                    body.truncate(n as usize);
                    self.keep_alive = false;
                }
                self.left = Some(n - body.len() as u64);
            }
            Framing::Chunked => {
                let mut raw = body.split();
                raw.extend_from_slice(&self.input);
                self.input = raw;
                self.chunked = Some(ChunkedDecoder::new());
            }
            Framing::Close => {}
        }
    }

    /// An HTTP answer's body has all come (its length, or its last chunk).
    fn complete(&self) -> bool {
        self.left == Some(0) || self.chunked.as_ref().is_some_and(|d| d.is_done())
    }

    /// Whether the connection can carry another request: after a FastCGI END_REQUEST, or
    /// an HTTP answer read to its end on a kept-alive connection, with nothing after it.
    fn reusable(&self) -> bool {
        if self.cut {
            return false;
        }
        let complete = self.complete();
        match self.proto {
            Proto::FastCgi => self.input.is_empty() && self.rec_left == 0 && self.pad_left == 0,
            Proto::Http | Proto::Memcached => self.keep_alive && complete && self.input.is_empty(),
            Proto::Scgi | Proto::Uwsgi | Proto::Grpc => false,
        }
    }
}

/// The application's answer: its head and body, whole (`done`), or what came of it before
/// it paused (at most about `*_buffers`) and the connection to read on.
pub(super) struct Answered {
    head: CgiHead,
    body: BytesMut,
    done: bool,
    link: Link,
    /// `*_buffering` or `X-Accel-Buffering` for this answer: read it ahead of the client.
    buffering: bool,
    /// The exchange failed after the head: the answer ends after `body`, cut short.
    failed: Option<Failure>,
}

/// What the request phases go on with.
pub enum Outcome {
    Flow(Flow),
    /// Send this response's head, then the body as [`Streaming::next`] gives it.
    Stream(Response, Box<Streaming>),
    /// The server switched protocols (101): send this head, then relay both ways.
    Upgrade(Response, Box<Tunnel>),
}

/// An upstream connection that switched protocols, and what it sent after its 101 head.
pub struct Tunnel {
    pub conn: Conn,
    pub early: BytesMut,
}

/// The rest of a streamed answer, read from the application while it is sent on. When
/// the answer is buffered it is also read ahead of the client into a [`Spool`] while the
/// client takes what it has ([`Streaming::alongside`]), and the application's connection is
/// let go as soon as the answer has come whole.
pub struct Streaming {
    /// `None` once the answer has come whole and the connection was let go.
    link: Option<Link>,
    scheme: &'static str,
    first: Option<Bytes>,
    addr: Addr,
    done: bool,
    /// What was read ahead of the client (buffered answers only).
    spool: Option<Spool>,
    /// A failure met while reading ahead: the answer is cut once what came before it is sent.
    failed: Option<Failure>,
    /// Where the connection goes back when the answer ended cleanly.
    pool: Option<Pooled>,
    lease: Option<Lease>,
    /// The cache entry the answer is written to as it goes (`conn::gateway_cache`).
    tee: Option<super::gateway_cache::Tee>,
    /// `proxy_limit_rate`: how fast the answer is read.
    pace: Option<ReadPace>,
    /// `*_read_timeout`, for reading the rest into the entry once the client is gone.
    read_timeout: Duration,
}

/// `proxy_limit_rate` (buffered answers only, as nginx's): after each read from the server,
/// wait until no more than `rate` bytes a second have been read since the answer's head, the first second's worth
/// allowed at once (nginx's formula in its event pipe).
struct ReadPace {
    rate: u64,
    start: Instant,
    read: u64,
}

impl ReadPace {
    fn new(req: &Request, proto: Proto, read: usize) -> Option<ReadPace> {
        let rate = if proto == Proto::Http {
            req.conf.proxy.limit_rate()
        } else {
            0
        };
        (rate > 0).then(|| ReadPace {
            rate,
            start: Instant::now(),
            read: read as u64,
        })
    }

    async fn after(&mut self, n: usize) {
        self.read += n as u64;
        let allowed = self.rate as f64 * (self.start.elapsed().as_secs_f64() + 1.0);
        let ahead = self.read as f64 - allowed;
        if ahead > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(ahead / self.rate as f64)).await;
        }
    }
}

impl Streaming {
    /// The next piece of the body; `Ok(None)` at its end. An error is logged and means the
    /// answer is cut short.
    pub async fn next(&mut self, req: &Request) -> Result<Option<Bytes>, ()> {
        let r = self.pull(req).await;
        if let Some(t) = &mut self.tee {
            match &r {
                Ok(Some(b)) => t.write(b),
                Ok(None) => {
                    if let Some(t) = self.tee.take() {
                        t.finish(req).await;
                    }
                }
                Err(_) => self.tee = None,
            }
        }
        match r {
            Ok(b) => Ok(b),
            Err(f) => {
                req.upstream.borrow_mut().body_done();
                log_failure(req, self.scheme, &self.addr, &f);
                Err(())
            }
        }
    }

    async fn pull(&mut self, req: &Request) -> Result<Option<Bytes>, Failure> {
        if let Some(b) = self.first.take() {
            return Ok(Some(b));
        }
        if let Some(spool) = &mut self.spool {
            match spool.pop() {
                Ok(Some(b)) => return Ok(Some(b)),
                Ok(None) => {}
                Err(e) => return Err(Failure::Spool(e)),
            }
        }
        if let Some(f) = self.failed.take() {
            return Err(f);
        }
        let Some(link) = self.link.as_mut().filter(|_| !self.done) else {
            return Ok(None);
        };
        let timeout = gateway::conf(&req.conf, link.proto).read_timeout();
        loop {
            match link.next(timeout, true).await? {
                Event::Data(b) => {
                    req.upstream.borrow_mut().add_body(b.len(), false);
                    if let Some(p) = &mut self.pace {
                        p.after(b.len()).await;
                    }
                    return Ok(Some(b));
                }
                Event::Stderr(b) => log_stderr(req, &self.addr, &b, true),
                Event::End => {
                    self.done = true;
                    req.upstream.borrow_mut().body_done();
                    return Ok(None);
                }
            }
        }
    }

    /// A HEAD whose answer (asked for as a GET) is being cached: read the answer to its end
    /// into the entry, as nginx does; the client gets the head alone. False when nothing
    /// is being cached.
    pub async fn cache_rest(&mut self, req: &Request) -> bool {
        if self.tee.is_none() {
            return false;
        }
        while let Ok(Some(_)) = self.next(req).await {}
        true
    }

    /// Whether a piece is at hand without waiting for the application.
    pub fn at_hand(&self) -> bool {
        self.first.is_some() || self.spool.as_ref().is_some_and(|s| !s.is_empty())
    }

    /// Run `send` (a write to the client) to its end; meanwhile, for a buffered answer,
    /// read the application's answer ahead into the spool while it has room. One driver
    /// for HTTP/1.x and HTTP/2: each wraps its writes in it.
    pub async fn alongside<T>(
        &mut self,
        w: &Worker,
        req: &Request,
        send: impl std::future::Future<Output = T>,
    ) -> T {
        let mut send = std::pin::pin!(send);
        if self.spool.is_none() {
            return send.await;
        }
        let mut fill = std::pin::pin!(self.fill(w, req));
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(out) = std::future::Future::poll(send.as_mut(), cx) {
                return std::task::Poll::Ready(out);
            }
            // Never ends by itself: it waits once the spool is full or the answer is in.
            let _ = std::future::Future::poll(fill.as_mut(), cx);
            std::task::Poll::Pending
        })
        .await
    }

    /// Read the application's answer into the spool while it has room; then wait for ever
    /// (the caller drops this once its write is done). Safe to drop at any wait: a read
    /// that has not completed has taken nothing.
    async fn fill(&mut self, w: &Worker, req: &Request) {
        while let (Some(link), Some(spool)) = (&mut self.link, &mut self.spool) {
            if self.done || self.failed.is_some() || !spool.has_room() {
                break;
            }
            let timeout = gateway::conf(&req.conf, link.proto).read_timeout();
            match link.next(timeout, true).await {
                Ok(Event::Data(b)) => {
                    req.upstream.borrow_mut().add_body(b.len(), false);
                    let n = b.len();
                    spool.push(req, b);
                    if let Some(p) = &mut self.pace {
                        p.after(n).await;
                    }
                }
                Ok(Event::Stderr(b)) => log_stderr(req, &self.addr, &b, true),
                Ok(Event::End) => {
                    self.done = true;
                    self.release(w);
                }
                Err(f) => self.failed = Some(f),
            }
        }
        std::future::pending::<()>().await;
    }

    /// The answer has come whole: its connection goes back to the pool if it may be
    /// reused (else it closes), and the server's slot is freed, even while the client is
    /// still being sent what came.
    fn release(&mut self, w: &Worker) {
        if let Some(link) = self.link.take() {
            if let (true, Some(p), Wire::Socket(conn)) =
                (link.reusable(), self.pool.take(), link.conn)
            {
                w.upstreams.put_idle(&p.up, p.slot, conn, clock::now());
            }
        }
        self.lease = None;
    }

    /// The answer was sent whole: keep the connection if it may be reused.
    pub fn finish(mut self, w: &Worker) {
        if self.done {
            self.release(w);
        }
    }
}

/// The client went away before the answer's end while the answer is being cached: as
/// nginx (whose `u->cacheable` keeps the upstream going after the client closed), the rest
/// is read into the entry, which is then stored; the requests waiting on `*_cache_lock`
/// go on with it. What was read ahead goes first; the rest is written as it comes, no
/// faster than the entry's file takes it (see `Tee::write_paced`).
impl Drop for Streaming {
    fn drop(&mut self) {
        let Some(tee) = self.tee.take() else {
            return;
        };
        let Some(w) = crate::runtime::worker::current() else {
            return;
        };
        let rest = Streaming {
            link: self.link.take(),
            scheme: self.scheme,
            first: self.first.take(),
            addr: self.addr.clone(),
            done: self.done,
            spool: self.spool.take(),
            failed: self.failed.take(),
            pool: self.pool.take(),
            lease: self.lease.take(),
            tee: None,
            pace: None,
            read_timeout: self.read_timeout,
        };
        tokio::task::spawn_local(rest.store_rest(w, tee));
    }
}

impl Streaming {
    async fn store_rest(mut self, w: Rc<Worker>, mut tee: super::gateway_cache::Tee) {
        if let Some(b) = self.first.take() {
            tee.write_paced(&b).await;
        }
        while let Some(spool) = &mut self.spool {
            match spool.pop() {
                Ok(Some(b)) => tee.write_paced(&b).await,
                Ok(None) => break,
                Err(e) => {
                    self.failed = Some(Failure::Spool(e));
                    break;
                }
            }
        }
        while let (Some(link), None, false) = (&mut self.link, &self.failed, self.done) {
            match link.next(self.read_timeout, true).await {
                Ok(Event::Data(b)) => tee.write_paced(&b).await,
                Ok(Event::Stderr(_)) => {}
                Ok(Event::End) => self.done = true,
                Err(f) => self.failed = Some(f),
            }
        }
        if let Some(f) = &self.failed {
            // The entry is given up (dropping the tee removes its temp file).
            errlog::log(
                Level::Error,
                format_args!(
                    "{f} after the client closed, upstream: \"{}://{}\"",
                    self.scheme, self.addr
                ),
            );
            return;
        }
        self.release(&w);
        tee.commit().await;
    }
}

/// Where a kept connection goes back when its streamed answer ended cleanly.
pub struct Pooled {
    up: Arc<Upstream>,
    slot: Slot,
}

/// How a request reaches its upstream: the protocol, and TLS for `https://`.
pub(super) struct Via {
    pub(super) proto: Proto,
    pub(super) tls: Option<UpTls>,
    pub(super) timers: Rc<ReadTimers>,
}

/// The TLS side of an `https://` upstream for one request.
pub(super) struct UpTls {
    config: Arc<rustls::ClientConfig>,
    /// `proxy_ssl_name`: checked against the certificate, sent as SNI if enabled.
    name: ServerName<'static>,
    /// Tells pooled connections made with this setup and name from others.
    kind: u64,
}

impl Via {
    pub(super) fn scheme(&self) -> &'static str {
        match (self.proto, &self.tls) {
            (Proto::Http, Some(_)) => "https",
            (Proto::Grpc, Some(_)) => "grpcs",
            (Proto::Uwsgi, Some(_)) => "suwsgi",
            (p, _) => p.scheme(),
        }
    }

    /// What pooled connections this request may use (`upstream::Idle`'s kind).
    pub(super) fn kind(&self) -> u64 {
        self.tls.as_ref().map_or(0, |t| t.kind)
    }
}

/// The TLS side of a request to `dest`, if it is `https://`; `Err` with the reason for the
/// log when it cannot be had.
fn up_tls(w: &Worker, req: &Request, dest: &proxy::Dest) -> Result<Option<UpTls>, String> {
    if !dest.tls {
        return Ok(None);
    }
    let p = &req.conf.proxy;
    tls_for(
        w,
        req,
        p.client_tls.as_ref(),
        &p.ssl,
        "proxy_ssl_name",
        || dest.host.clone(),
    )
    .map(Some)
}

/// The TLS side of a request to `uwsgi_pass suwsgi://`: named by `uwsgi_ssl_name`, else
/// the host of the pass (the group's name, or the host of its address), as nginx names it.
fn uwsgi_tls(w: &Worker, req: &Request, pass: &Backend) -> Result<UpTls, String> {
    let u = &req.conf.uwsgi;
    tls_for(
        w,
        req,
        u.client_tls.as_ref(),
        &u.ssl,
        "uwsgi_ssl_name",
        || {
            let value = match pass {
                Backend::Vars(v) => v.value.eval(req, None),
                Backend::Group(up) => return up.name.clone(),
                Backend::Addr(a) => a.to_string(),
                Backend::Dynamic => String::new(),
            };
            match value.rsplit_once(':') {
                Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host.to_string(),
                _ => value,
            }
        },
    )
}

/// A request's TLS to its upstream from a location's setup (the proxy's, grpc's or
/// uwsgi's): the name from `*_ssl_name` (`directive`, for the log) or `default_name`, and
/// the worker's copy of the setup.
pub(super) fn tls_for(
    w: &Worker,
    req: &Request,
    setup: Option<&Arc<tls_client::ClientTls>>,
    ssl: &crate::modules::proxy_ssl::ProxySslConf,
    directive: &str,
    default_name: impl FnOnce() -> String,
) -> Result<UpTls, String> {
    let Some(setup) = setup else {
        return Err("no TLS setup for an https upstream".into());
    };
    let value = match &ssl.name {
        Some(t) => t.eval(req, None),
        None => default_name(),
    };
    let name = tls_client::server_name(&value)
        .ok_or_else(|| format!("invalid {directive} \"{value}\""))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let config = match &setup.dynamic {
        None => w.tls_sessions.config(setup),
        // A client certificate named per request (nginx 1.21+): an empty name sends none.
        Some(d) => match d.cert.path(req) {
            None => setup.config(),
            Some(cert) => {
                let key = d
                    .key
                    .path(req)
                    .ok_or_else(|| format!("no certificate key for \"{}\"", cert.path.display()))?;
                // Pooled connections carry the certificate they were made with.
                std::hash::Hash::hash(&cert.path, &mut h);
                setup.with_certificate(&cert, &key)?
            }
        },
    };
    std::hash::Hash::hash(&(Arc::as_ptr(setup) as usize), &mut h);
    std::hash::Hash::hash(&name.to_str(), &mut h);
    // Nonzero: 0 is a plain connection's kind.
    let kind = std::hash::Hasher::finish(&h) | 1;
    Ok(UpTls { config, name, kind })
}

/// The request as it goes out: what is encoded whole, then the body still to come from the
/// client when it is passed on as it arrives.
pub(super) struct Outgoing<'a> {
    pub(super) out: Vec<u8>,
    pub(super) body: Option<StreamBody<'a>>,
}

thread_local! {
    /// The buffer the last request on this thread encoded its request in, kept for the
    /// next: an allocation and a free fewer per request (a proxied request's head is a few
    /// hundred bytes; a request that ran at once with another gets a new one).
    static SPARE_OUT: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The most of a request buffer kept for the next request (one that carried a body
/// encoded with its head may be much larger).
const SPARE_OUT_MAX: usize = 16 * 1024;

/// An empty buffer to encode a request in, with room for a usual request head (and
/// FastCGI's params) without growing it in steps.
fn request_buffer() -> Vec<u8> {
    let mut out = SPARE_OUT.take();
    out.reserve(1024);
    out
}

impl Drop for Outgoing<'_> {
    fn drop(&mut self) {
        if self.out.capacity() <= SPARE_OUT_MAX {
            let mut out = std::mem::take(&mut self.out);
            out.clear();
            SPARE_OUT.set(out);
        }
    }
}

impl Outgoing<'_> {
    /// Body bytes were taken from the client: the request can go nowhere else (nginx's
    /// rule with `*_request_buffering off`).
    pub(super) fn started(&self) -> bool {
        self.body.as_ref().is_some_and(|b| b.started)
    }
}

/// A body sent after the request's head, and how each piece is framed upstream.
pub(super) struct StreamBody<'a> {
    from: BodyFrom<'a>,
    frame: BodyFrame,
    /// Client bytes were taken for this attempt (never for a file, which is sent again from
    /// its start to the next server tried).
    started: bool,
}

/// Where a body sent in pieces comes from.
pub(super) enum BodyFrom<'a> {
    /// The client, as it arrives (`*_request_buffering off`).
    Client(&'a mut dyn BodySource),
    /// A body read whole into a temporary file.
    File(&'a BodyFile),
}

/// The most of a file body read into memory at once: one FastCGI record's worth (a multiple
/// of 8, so the record needs no padding).
const FILE_PIECE: usize = 64 * 1024 - 8;

#[derive(Clone, Copy)]
pub(super) enum BodyFrame {
    /// As it is (after a Content-Length, or SCGI's / uwsgi's header).
    Raw,
    /// HTTP/1.1 chunks.
    Chunked,
    /// FastCGI STDIN records.
    FastCgi,
}

/// Whether this request's body is passed on as it arrives, and how: with
/// `*_request_buffering off`, a body to pass, a Content-Length or (to an HTTP/1.1 upstream)
/// chunks; else it is read whole first, as nginx does (FastCGI, SCGI and uwsgi need a
/// length up front; HTTP/1.0 has no chunks), and so is a mirrored one (the copies need it).
pub fn streams(req: &Request) -> Option<Streamed> {
    let proto = unbuffered(req)?;
    match req.head.body {
        BodyKind::Length(n) if n > 0 => Some(Streamed::Length(n)),
        // FastCGI ends a body with an empty STDIN record, which for a body declared empty
        // on an HTTP/2 stream still open goes at the stream's end, as nginx's (a body at
        // hand is not streamed at all).
        BodyKind::Length(0) if proto == Proto::FastCgi => Some(Streamed::Length(0)),
        BodyKind::Chunked if proto == Proto::Http && req.conf.proxy.http11() => {
            Some(Streamed::Chunked)
        }
        // FastCGI frames the body in records whatever its length, so one of unknown length
        // (chunked, or an HTTP/2 body without Content-Length) is passed on as it comes too,
        // as nginx's fastcgi module does.
        BodyKind::Chunked if proto == Proto::FastCgi => Some(Streamed::Chunked),
        _ => None,
    }
}

/// The location's gateway when it passes a request body on as it comes (`*_request_buffering
/// off`, the body passed, no mirror): with what framing is [`streams`]' question.
pub fn unbuffered(req: &Request) -> Option<Proto> {
    let proto = gateway::active(&req.conf)?;
    let c = gateway::conf(&req.conf, proto);
    if c.request_buffering()
        || !c.pass_request_body()
        || req.method_override.is_some()
        || !req.conf.mirror.uris().is_empty()
    {
        return None;
    }
    if proto == Proto::Http && req.conf.proxy.body.is_some() {
        return None;
    }
    Some(proto)
}

/// `*_ignore_client_abort on`: the exchange runs to its end whatever the client does.
pub fn ignores_client_abort(req: &Request) -> bool {
    gateway::active(&req.conf).is_none_or(|p| gateway::conf(&req.conf, p).ignore_client_abort())
}

/// Run `exchange` unless `gone` (the client left: the connection ended, or the HTTP/2
/// stream was reset) comes first, in which case the exchange is dropped - its upstream
/// connection closed - and the request gets nginx's info line and a 499 for the access
/// log (`None`). Callers skip this when [`ignores_client_abort`], awaiting the exchange
/// itself. Both futures are raced where the caller pinned them: taken by value, the
/// exchange (over 2 KiB) was copied twice per request, into this future and into the race.
pub async fn unless_client_leaves<F: std::future::Future>(
    req: &Request,
    mut exchange: std::pin::Pin<&mut F>,
    mut gone: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Option<F::Output> {
    let raced = std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(out) = exchange.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(out));
        }
        gone.as_mut().poll(cx).map(|()| None)
    })
    .await;
    if raced.is_none() {
        errlog::request(
            Level::Info,
            req,
            format_args!("client prematurely closed connection, so upstream connection is closed too while {READING_HEAD}"),
        );
        abandoned(req);
    }
    raced
}

/// The client left during an attempt: the attempt is noted with the times it got to (its
/// connect time if it connected, no header time, its time until now) and no status, as
/// nginx logs it (`$upstream_status` `-`).
fn abandoned(req: &Request) {
    let mut tries = req.upstream.borrow_mut();
    let Some((addr, since)) = tries.under_way.take() else {
        return;
    };
    let connect = tries.connected.take().map(|t| t.duration_since(since));
    tries.head_read = None;
    let (sent, received) = (
        std::mem::take(&mut tries.sent),
        std::mem::take(&mut tries.received),
    );
    tries.pending = false;
    tries.push(UpstreamTry {
        addr,
        status: 0,
        time: clock::now().duration_since(since),
        connect,
        header: None,
        sent,
        received,
        body: 0,
        started: since,
    });
}

/// The body read whole that goes to an application: none on an error page's or a local
/// redirect's GET (it stays in `req.body` all the same, for their `$request_body`).
pub fn passed_body(req: &Request) -> Option<&RequestBody> {
    req.body
        .as_deref()
        .filter(|_| req.method_override.is_none())
}

/// Pass the request (with its body, already read into `req.body`) to the location's
/// upstream.
pub async fn run(w: &Worker, req: &Request) -> Outcome {
    run_with(w, req, None).await
}

/// Pass the request to the location's upstream with its body read from `src` as it
/// arrives (see [`streams`]).
pub async fn run_streaming(
    w: &Worker,
    req: &Request,
    src: &mut dyn BodySource,
    how: Streamed,
) -> Outcome {
    run_with(w, req, Some((src, how))).await
}

async fn run_with(
    w: &Worker,
    req: &Request,
    streamed: Option<(&mut dyn BodySource, Streamed)>,
) -> Outcome {
    // A location without `*_cache` pays for this test only.
    let cached = gateway::active(&req.conf)
        .map(|p| gateway::conf(&req.conf, p))
        .filter(|c| c.cache.enabled());
    if let Some(c) = cached {
        use super::gateway_cache::Looked;
        let zone = match super::gateway_cache::before(req, c).await {
            Looked::Answer(flow) => return Outcome::Flow(flow),
            Looked::Fetch(zone) => zone,
        };
        let o = fetch(w, req, streamed).await;
        return super::gateway_cache::after(req, c, zone.as_deref(), o).await;
    }
    fetch(w, req, streamed).await
}

/// The exchange with the upstream (see the module's header).
async fn fetch(
    w: &Worker,
    req: &Request,
    streamed: Option<(&mut dyn BodySource, Streamed)>,
) -> Outcome {
    let Some(proto) = gateway::active(&req.conf) else {
        return Outcome::Flow(Flow::Status(500));
    };
    let c = gateway::conf(&req.conf, proto);
    let Some(pass) = &c.pass else {
        return Outcome::Flow(Flow::Status(500));
    };
    if proto == Proto::Memcached && !matches!(req.method(), Method::Get | Method::Head) {
        return Outcome::Flow(Flow::Status(405));
    }
    if proto == Proto::Grpc {
        // HTTP/1.x clients (HTTP/2 ones are served by `conn::grpc::serve_h2` directly).
        return Outcome::Flow(super::grpc::run_whole(w, req).await);
    }
    // A body read whole: one in memory is encoded with the head, one in a file follows it
    // in pieces (when it is passed at all: not with `*_pass_request_body off`, nor in place
    // of `proxy_set_body`, nor on an error page's GET).
    let kept = passed_body(req);
    let (body, file): (&[u8], Option<&BodyFile>) = match kept {
        Some(RequestBody::Memory(v)) => (v, None),
        Some(RequestBody::File(f)) => (&[], Some(f)),
        None => (&[], None),
    };
    let file = file.filter(|_| {
        c.pass_request_body() && !(proto == Proto::Http && req.conf.proxy.body.is_some())
    });
    let how = match (&streamed, file) {
        (Some((_, h)), _) => Some(*h),
        (None, Some(f)) => Some(Streamed::Length(f.len())),
        (None, None) => None,
    };
    // The length the parameters announce (`CONTENT_LENGTH`), passed or not.
    let len = match how {
        Some(Streamed::Length(n)) => n,
        _ => kept.map_or(0, RequestBody::len),
    };
    let mut out = request_buffer();
    // HTTP: whether the request lets the server keep the connection.
    let mut sent_keep = false;
    // `proxy_http_version 2`: the request's head for HTTP/2 (`out` holds the body).
    let mut h2 = None;
    let mut via = Via {
        proto,
        tls: None,
        timers: w.timers.clone(),
    };
    // The proxy's destination is evaluated per request (its URL may have variables).
    let backend = if proto == Proto::Http {
        let dest = req
            .conf
            .proxy
            .target
            .as_deref()
            .ok_or_else(|| "no proxy_pass".to_string())
            .and_then(|t| t.dest(req));
        let dest = match dest {
            Ok(d) => d,
            Err(why) => {
                errlog::request(Level::Error, req, format_args!("{why}"));
                return Outcome::Flow(Flow::Status(500));
            }
        };
        via.tls = match up_tls(w, req, &dest) {
            Ok(t) => t,
            Err(why) => {
                errlog::request(Level::Error, req, format_args!("{why}"));
                return Outcome::Flow(Flow::Status(502));
            }
        };
        if req.conf.proxy.http2() {
            match super::proxy_h2::head(req, &dest, body, how, &mut out) {
                Ok(h) => h2 = Some(h),
                Err(why) => {
                    errlog::request(Level::Error, req, format_args!("{why}"));
                    return Outcome::Flow(Flow::Status(500));
                }
            }
        } else {
            sent_keep = proxy::encode_request(req, &dest, body, how, &mut out);
        }
        dest.backend.clone()
    } else if proto == Proto::Memcached {
        if let Err(why) = memcached::request_line(req, &mut out) {
            errlog::request(Level::Error, req, format_args!("{why}"));
            return Outcome::Flow(Flow::Status(500));
        }
        pass.clone()
    } else if let Err(e) = encode(req, proto, c, body, len, how.is_some(), &mut out) {
        errlog::request(
            Level::Error,
            req,
            format_args!("{} request cannot be sent: {e}", proto.scheme()),
        );
        return Outcome::Flow(Flow::Status(500));
    } else {
        pass.clone()
    };
    if proto == Proto::Uwsgi && req.conf.uwsgi.tls {
        via.tls = match uwsgi_tls(w, req, &backend) {
            Ok(t) => Some(t),
            Err(why) => {
                errlog::request(Level::Error, req, format_args!("{why}"));
                return Outcome::Flow(Flow::Status(502));
            }
        };
    }
    // A destination with variables: its group, address, or a name to resolve now.
    let backend = match backend {
        Backend::Vars(v) => match v.eval(req) {
            Ok(b) => dynamic(req, b).await,
            Err((status, why)) => {
                errlog::request(Level::Error, req, format_args!("{why}"));
                return Outcome::Flow(Flow::Status(status));
            }
        },
        b if proto == Proto::Http
            && req
                .conf
                .proxy
                .target
                .as_deref()
                .is_some_and(proxy::Target::vars) =>
        {
            dynamic(req, b).await
        }
        b => Ok((b, Vec::new())),
    };
    let (backend, spare) = match backend {
        Ok(b) => b,
        Err(flow) => return Outcome::Flow(flow),
    };
    let from = match streamed {
        Some((src, _)) => Some(BodyFrom::Client(src)),
        None => file.map(BodyFrom::File),
    };
    let mut out = Outgoing {
        out,
        body: from.zip(how).map(|(from, how)| StreamBody {
            from,
            frame: match (proto, how) {
                (Proto::FastCgi, _) => BodyFrame::FastCgi,
                // HTTP/2 frames it itself.
                _ if h2.is_some() => BodyFrame::Raw,
                (_, Streamed::Chunked) => BodyFrame::Chunked,
                (_, Streamed::Length(_)) => BodyFrame::Raw,
            },
            started: false,
        }),
    };
    let up = match backend {
        Backend::Addr(mut addr) => {
            // One address, or those a name resolved to: the next is tried after a failure
            // as nginx's round robin over them does (`spare` is empty otherwise).
            let start = clock::now();
            let mut t0 = start;
            let mut spare = spare.into_iter();
            let mut tries = 1u64;
            loop {
                req.upstream.borrow_mut().under_way = Some((addr.clone(), t0));
                let r = match &h2 {
                    Some(h) => {
                        super::proxy_h2::exchange(req, &via, c, &addr, false, h, &mut out).await
                    }
                    None => fresh(req, &via, &addr, &mut out).await,
                };
                let peer = crate::modules::metrics::direct_peer(req, &addr);
                let now = record(req, &addr, peer, attempt_status(r.as_ref()), t0);
                let more = !out.started()
                    && !spare.as_slice().is_empty()
                    && c.next_upstream_tries.is_none_or(|n| n == 0 || tries < n)
                    && c.next_upstream_timeout
                        .is_none_or(|t| t.is_zero() || now.duration_since(start) < t);
                match r {
                    // An answer `*_next_upstream http_NNN` names goes to the next address.
                    Ok(a) if more && retry_status(a.head.status.unwrap_or(200), c, req) => {}
                    Ok(a) => return outcome(req, c, a, addr, None, None).await,
                    Err(f) => {
                        let flow = failed(req, via.scheme(), &addr, &f);
                        if !more || matches!(f, Failure::Client(_)) || !retryable(&f, c, req) {
                            return Outcome::Flow(flow);
                        }
                    }
                }
                let Some(next) = spare.next() else {
                    return Outcome::Flow(Flow::Status(502));
                };
                addr = next;
                t0 = now;
                tries += 1;
            }
        }
        Backend::Group(up) => up,
        // A URL with variables was evaluated above into an address or a group.
        Backend::Dynamic | Backend::Vars(_) => return Outcome::Flow(Flow::Status(500)),
    };
    let keep = match proto {
        Proto::FastCgi => req.conf.fastcgi.keep_conn(),
        Proto::Http => sent_keep && up.keepalive > 0,
        // A HEAD request's value is not read (nginx finalizes it at the header): its
        // connection is closed rather than drained for reuse.
        Proto::Memcached => up.keepalive > 0 && req.method() != Method::Head,
        Proto::Scgi | Proto::Uwsgi | Proto::Grpc => false,
    };
    let hash = up.hash_key(req);
    let key = Key {
        // A unix client has no address: ip_hash hashes it as nginx does one without.
        ip: (!req.unix_client()).then(|| req.client().ip()),
        hash: hash.as_deref().map(str::as_bytes),
    };
    let mut tried = Tried::default();
    // One clock read per attempt: each attempt's end (see `record`) is the next one's start.
    // The turn's time (`runtime::clock`), as nginx times upstreams with its cached time.
    let start = clock::now();
    let mut now = start;
    let mut queue_deadline = None;
    // Peers tried: servers, and each address of a `server NAME resolve` (a peer of its own
    // to nginx), whose addresses not tried yet (`same`) go before another server's.
    let mut attempts = 0usize;
    let mut same: Option<(usize, Lease, std::vec::IntoIter<Addr>)> = None;
    loop {
        let next_of_same = same.take().and_then(|(i, lease, mut rest)| {
            let a = rest.next()?;
            Some((i, lease, Some(a), rest))
        });
        let (i, lease, resolved, rest) = match next_of_same {
            Some(next) => next,
            None => {
                let at = (&mut now, &mut queue_deadline);
                let Some((i, lease)) = next_server(w, req, &up, &key, &tried, at, &via).await
                else {
                    return Outcome::Flow(Flow::Status(502));
                };
                tried.push(i);
                // `server NAME resolve`: its current addresses; none while the name has
                // none, and the next server is tried (nginx has no peer for it then).
                match &up.servers[i].resolve {
                    None => (i, lease, None, Vec::new().into_iter()),
                    Some(r) => {
                        let mut all = r.addrs().await.into_iter();
                        match all.next() {
                            Some(a) => (i, lease, Some(a), all),
                            None => continue,
                        }
                    }
                }
            }
        };
        let addr = resolved.as_ref().unwrap_or(&up.servers[i].addr);
        attempts += 1;
        req.upstream.borrow_mut().under_way = Some((addr.clone(), now));
        // A request that will not leave its connection kept (`Connection: close` set by
        // `proxy_set_header`) still takes a kept one, as nginx's keepalive balancer hands
        // out its cached connections whatever the request: that one then closes, rather
        // than staying in the pool while a new connection is opened and closed.
        let pooled = keep || (proto == Proto::Http && up.keepalive > 0);
        let idle = if pooled {
            w.upstreams.take_idle(&up, i, via.kind(), now)
        } else {
            None
        };
        // With the answer: the requests its connection carried before, and when the
        // connection was made (for `keepalive_requests` and `keepalive_time`).
        let result = match (idle, &h2) {
            (_, Some(h)) => {
                let keep = up.keepalive > 0;
                let r = super::proxy_h2::exchange(req, &via, c, addr, keep, h, &mut out).await;
                r.map(|a| (a, (0, now)))
            }
            // A kept connection the server closed meanwhile is no failure of the server:
            // try once more on a new one.
            (Some((conn, n, born)), None) => {
                match exchange(req, addr, Link::new(conn, &via), &mut out).await {
                    Err(f) if f.stale() && !out.started() => fresh(req, &via, addr, &mut out)
                        .await
                        .map(|a| (a, (0, now))),
                    r => r.map(|a| (a, (n, born))),
                }
            }
            (None, None) => fresh(req, &via, addr, &mut out)
                .await
                .map(|a| (a, (0, now))),
        };
        now = record(
            req,
            addr,
            up.servers[i].metrics,
            attempt_status(result.as_ref().map(|(a, _)| a)),
            now,
        );
        // Another server may be tried if there is one, within the tries and time allowed,
        // and if no body has been taken from the client for this one.
        let more = !out.started()
            && attempts < up.tries()
            && c.next_upstream_tries
                .is_none_or(|n| n == 0 || (attempts as u64) < n)
            && c.next_upstream_timeout
                .is_none_or(|t| t.is_zero() || now.duration_since(start) < t);
        match result {
            Ok((a, (n, born))) => {
                let status = a.head.status.unwrap_or(200);
                if more && retry_status(status, c, req) {
                    // nginx counts these against the server, except 403 and 404.
                    if status != 403 && status != 404 {
                        w.upstreams.failed(&up, i, now);
                    }
                    same = Some((i, lease, rest));
                    continue;
                }
                w.upstreams.succeeded(&up, i);
                let slot = Slot {
                    server: i,
                    kind: via.kind(),
                    requests: n + 1,
                    born,
                    linger: via.proto == Proto::Http,
                };
                if keep && a.done && a.link.reusable() {
                    let Answered {
                        head,
                        body,
                        link,
                        buffering,
                        ..
                    } = a;
                    if let Wire::Socket(conn) = link.conn {
                        w.upstreams.put_idle(&up, slot, conn, now);
                    }
                    let cacheable = super::gateway_cache::cacheable(req);
                    super::gateway_cache::store_whole(req, c, &head, &body, buffering).await;
                    return Outcome::Flow(whole(req, c, head, body, cacheable));
                }
                let pool = keep.then(|| Pooled {
                    up: up.clone(),
                    slot,
                });
                return outcome(req, c, a, addr.clone(), pool, Some(lease)).await;
            }
            Err(f) => {
                let flow = failed(req, via.scheme(), addr, &f);
                if matches!(f, Failure::Client(_)) {
                    // The client's fault, not the server's.
                    return Outcome::Flow(flow);
                }
                w.upstreams.failed(&up, i, now);
                if !more || !retryable(&f, c, req) {
                    return Outcome::Flow(flow);
                }
                same = Some((i, lease, rest));
            }
        }
    }
}

/// The next server of `up` for this request, waiting in the group's `queue` while every
/// usable one is at `max_conns` (`now` is then read again); `None`, logged, when none is
/// left.
async fn next_server(
    w: &Worker,
    req: &Request,
    up: &Arc<Upstream>,
    key: &Key<'_>,
    tried: &Tried,
    (now, queue_deadline): (&mut Instant, &mut Option<Instant>),
    via: &Via,
) -> Option<(usize, Lease)> {
    loop {
        let pick = match w.upstreams.pick(up, key, tried, *now) {
            Pick::Full => {
                let wait = up.queue.map_or(Duration::ZERO, |(_, t)| t);
                let deadline = *queue_deadline.get_or_insert_with(|| *now + wait);
                if w.upstreams.wait_for_slot(up, &w.timers, deadline).await {
                    // The turn's time, as every upstream time here.
                    *now = clock::now();
                    continue;
                }
                Pick::Full
            }
            pick => pick,
        };
        if let Pick::Server(i, lease) = pick {
            return Some((i, lease));
        }
        no_live(req, via, &up.name, *now);
        return None;
    }
}

/// A backend named by variables: a `host:port` whose host is a name is looked up through
/// the location's `resolver` (nginx's `ngx_http_upstream_init_request`); the first address
/// found is used, the others (returned apart) are tried after it fails. A name without a
/// resolver, or one that does not resolve, is a 502.
pub(super) async fn dynamic(req: &Request, b: Backend) -> Result<(Backend, Vec<Addr>), Flow> {
    let Backend::Addr(Addr::Tcp(a)) = &b else {
        return Ok((b, Vec::new()));
    };
    let Some((host, port)) = a.rsplit_once(':') else {
        return Ok((b, Vec::new()));
    };
    if crate::resolver::is_literal(host) {
        return Ok((b, Vec::new()));
    }
    let Some(resolver) = &req.conf.core.resolver else {
        errlog::request(
            Level::Error,
            req,
            format_args!("no resolver defined to resolve {host}"),
        );
        return Err(Flow::Status(502));
    };
    match resolver
        .lookup(host, req.conf.core.resolver_timeout())
        .await
    {
        Ok((ips, _)) => {
            let port: u16 = port.parse().unwrap_or(80);
            let mut addrs = ips
                .into_iter()
                .map(|ip| Addr::Tcp(std::net::SocketAddr::new(ip, port).to_string().into()));
            match addrs.next() {
                Some(first) => Ok((Backend::Addr(first), addrs.collect())),
                None => Err(Flow::Status(502)),
            }
        }
        Err(f) => {
            errlog::request(
                Level::Error,
                req,
                format_args!("{host} could not be resolved ({f})"),
            );
            Err(Flow::Status(502))
        }
    }
}

/// The status one attempt ended with, for `$upstream_status`: what the server answered,
/// or what its failure maps to.
fn attempt_status(r: Result<&Answered, &Failure>) -> u16 {
    match r {
        Ok(a) => a.head.status.unwrap_or(200),
        Err(f) => f.status(),
    }
}

/// Note an attempt for the `$upstream_*` variables; returns when it ended.
/// Also counted for `metrics` in the server's key `peer`.
/// "no live upstreams": logged as nginx logs it, and still counted as an attempt, its peer
/// named for the group (`$upstream_addr` ends in the upstream's name, `$upstream_status`
/// in 502).
pub(super) fn no_live(req: &Request, via: &Via, group: &str, since: Instant) {
    errlog::request(
        Level::Error,
        req,
        format_args!(
            "no live upstreams while {CONNECTING}, upstream: \"{}://{group}\"",
            via.scheme()
        ),
    );
    let mut tries = req.upstream.borrow_mut();
    tries.pending = false;
    tries.push(UpstreamTry {
        addr: Addr::Tcp(group.into()),
        status: 502,
        time: since.elapsed(),
        connect: None,
        header: None,
        sent: 0,
        received: 0,
        body: 0,
        started: since,
    });
}

pub(super) fn record(
    req: &Request,
    addr: &Addr,
    peer: MetricsKey,
    status: u16,
    since: Instant,
) -> Instant {
    let end = clock::now();
    let mut tries = req.upstream.borrow_mut();
    tries.under_way = None;
    let connect = tries.connected.take().map(|t| t.duration_since(since));
    let header = tries.head_read.take().map(|t| t.duration_since(since));
    let time = end.duration_since(since);
    crate::modules::metrics::attempt(peer, status, header.is_some(), time);
    let (sent, received) = (
        std::mem::take(&mut tries.sent),
        std::mem::take(&mut tries.received),
    );
    tries.pending = header.is_some();
    tries.push(UpstreamTry {
        addr: addr.clone(),
        status,
        time,
        connect,
        header,
        sent,
        received,
        body: 0,
        started: since,
    });
    end
}

/// Whether `*_next_upstream http_NNN` sends a request that got this answer on to the next
/// server (idempotent requests only, unless `non_idempotent` is listed).
pub(super) fn retry_status(status: u16, c: &GatewayConf, req: &Request) -> bool {
    let Some(list) = c.next_upstream.as_deref() else {
        return false;
    };
    let name = format!("http_{status}");
    list.contains(&name) && (idempotent(req) || list.iter().any(|x| x == "non_idempotent"))
}

/// The request in the protocol's encoding: parameters, then the body (unless
/// `*_pass_request_body off`).
/// `len` is the body's length, `follows` says it is sent after this (from the client as
/// it arrives, or from a file) rather than being `body`.
fn encode(
    req: &Request,
    proto: Proto,
    c: &GatewayConf,
    body: &[u8],
    len: u64,
    follows: bool,
    out: &mut Vec<u8>,
) -> Result<(), ParamError> {
    let streamed = follows;
    let body = if c.pass_request_body() { body } else { &[] };
    out.reserve(1024 + body.len() + body.len() / 8);
    match proto {
        Proto::FastCgi => {
            fastcgi::begin_request(out, req.conf.fastcgi.keep_conn());
            let mut p = fastcgi::Params::new(out);
            gateway::build_params(req, c, len, &mut p)?;
            p.finish();
            if !streamed {
                fastcgi::stdin(out, body);
                fastcgi::stdin_end(out);
            }
        }
        Proto::Scgi => {
            let mut h = scgi::Headers::new();
            gateway::build_params(req, c, len, &mut h)?;
            // The length of what is sent: none with `scgi_pass_request_body off`.
            let sent = if streamed {
                usize::try_from(len).unwrap_or(usize::MAX)
            } else {
                body.len()
            };
            scgi::request(out, sent, &h);
            out.extend_from_slice(body);
        }
        Proto::Uwsgi => {
            let mut v = uwsgi::Vars::new();
            gateway::build_params(req, c, len, &mut v)?;
            let u = &req.conf.uwsgi;
            uwsgi::request(out, u.modifier1.unwrap_or(0), u.modifier2.unwrap_or(0), &v);
            out.extend_from_slice(body);
        }
        // Built by `modules::proxy::encode_request` and `modules::memcached::request_line`.
        Proto::Http | Proto::Memcached | Proto::Grpc => {}
    }
    Ok(())
}

fn log_failure(req: &Request, scheme: &str, addr: &Addr, f: &Failure) {
    errlog::request(
        Level::Error,
        req,
        format_args!("{f}, upstream: \"{scheme}://{addr}\""),
    );
}

pub(super) fn failed(req: &Request, scheme: &str, addr: &Addr, f: &Failure) -> Flow {
    log_failure(req, scheme, addr, f);
    match f {
        // The client is gone or stalled: there is no one to answer.
        Failure::Client(BodyError::Io) => Flow::Close,
        f => Flow::Status(f.status()),
    }
}

/// Read what the application sent next into `input`; 0 is the end of the stream.
///
/// Read into the stack and appended to `input`: `input` holds what came, not a 16 KiB
/// buffer reserved per exchange for an answer of a few hundred bytes (an allocation large
/// enough to make the allocator consolidate its small free chunks each time).
async fn read_more(
    timers: &ReadTimers,
    read: impl std::future::Future<Output = std::io::Result<usize>>,
    timeout: Duration,
    phase: &'static str,
) -> Result<usize, Failure> {
    match timers.within(timeout, read).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(Failure::Io(e, phase)),
        Err(()) => Err(Failure::Timeout(phase)),
    }
}

/// One read of at most `max` bytes from `s` appended to `input`: the byte count, 0 at the
/// end of the stream.
fn poll_read_into(
    s: &mut Wire,
    (input, max): (&mut BytesMut, usize),
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<std::io::Result<usize>> {
    let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); READ_MAX];
    let n = max.clamp(1, READ_MAX);
    let mut rb = tokio::io::ReadBuf::uninit(&mut chunk[..n]);
    std::task::ready!(tokio::io::AsyncRead::poll_read(
        std::pin::Pin::new(s),
        cx,
        &mut rb
    ))?;
    input.extend_from_slice(rb.filled());
    std::task::Poll::Ready(Ok(rb.filled().len()))
}

/// Whether `*_next_upstream` (default `error timeout`) sends the request on to the next
/// server after this failure. A request already sent is retried only if it is idempotent
/// or `non_idempotent` is listed, as in nginx.
pub(super) fn retryable(f: &Failure, c: &GatewayConf, req: &Request) -> bool {
    let list = c.next_upstream.as_deref();
    let has = |k: &str| match list {
        Some(l) => l.iter().any(|x| x == k),
        None => k == "error" || k == "timeout",
    };
    if has("off") {
        return false;
    }
    let (kind, sent) = match f {
        Failure::Connect(_) | Failure::Handshake(_) => ("error", false),
        Failure::Timeout(phase) => ("timeout", *phase != CONNECTING && *phase != HANDSHAKING),
        Failure::Io(..) | Failure::Premature(_) | Failure::ClosedEarly => ("error", true),
        Failure::Protocol(_) => ("invalid_header", true),
        Failure::Body(_) => ("error", true),
        Failure::Client(_) | Failure::Spool(_) => return false,
    };
    has(kind) && (!sent || idempotent(req) || has("non_idempotent"))
}

/// RFC 9110's idempotent methods; nginx retries only these unless told otherwise.
fn idempotent(req: &Request) -> bool {
    matches!(
        req.method(),
        Method::Get | Method::Head | Method::Put | Method::Delete | Method::Options | Method::Trace
    )
}

/// A new connection to `addr`, with its TLS handshake for an `https://` upstream; both
/// within `proxy_connect_timeout`, as in nginx.
pub(super) async fn connect(
    addr: &Addr,
    via: &Via,
    c: &GatewayConf,
    from: Option<(SocketAddr, bool)>,
) -> Result<Conn, Failure> {
    let deadline = tokio::time::Instant::now() + c.connect_timeout();
    let plain = connect_plain(addr, c.socket_keepalive(), from);
    let conn = match tokio::time::timeout_at(deadline, plain).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(Failure::Connect(e)),
        Err(_) => return Err(Failure::Timeout(CONNECTING)),
    };
    let Some(t) = &via.tls else {
        return Ok(conn);
    };
    let shake = tls_client::handshake(conn, t.config.clone(), t.name.clone());
    match tokio::time::timeout_at(deadline, shake).await {
        Ok(Ok(s)) => Ok(Box::new(s)),
        Ok(Err(e)) => Err(Failure::Handshake(tls_client::describe(&e, &t.name))),
        Err(_) => Err(Failure::Timeout(HANDSHAKING)),
    }
}

/// A new connection to `addr` (TCP with Nagle off, and with keep-alive probes when asked,
/// or a unix socket), without a deadline; from the local address `from` (`proxy_bind`,
/// with IP_TRANSPARENT when its flag says) when there is one.
pub async fn connect_plain(
    addr: &Addr,
    keepalive: bool,
    from: Option<(SocketAddr, bool)>,
) -> std::io::Result<Conn> {
    Ok(match addr {
        Addr::Tcp(a) => {
            let s = match from {
                None => tokio::net::TcpStream::connect(&**a).await?,
                Some((local, transparent)) => connect_from(a, local, transparent).await?,
            };
            let _ = s.set_nodelay(true);
            if keepalive {
                socket2::SockRef::from(&s).set_keepalive(true)?;
            }
            Box::new(s)
        }
        Addr::Unix(p) => Box::new(tokio::net::UnixStream::connect(p).await?),
    })
}

/// `proxy_bind`: a TCP connection to `to` (a name is looked up first) made from `local`.
async fn connect_from(
    to: &str,
    local: SocketAddr,
    transparent: bool,
) -> std::io::Result<tokio::net::TcpStream> {
    let mut last = None;
    for remote in tokio::net::lookup_host(to).await? {
        let sock = if local.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        let r = socket2::SockRef::from(&sock);
        if transparent {
            if local.is_ipv4() {
                r.set_ip_transparent_v4(true)?;
            } else {
                r.set_ip_transparent_v6(true)?;
            }
        }
        // As nginx: a port of its own may be one a connection closed a moment ago.
        if local.port() != 0 {
            sock.set_reuseaddr(true)?;
        }
        sock.bind(local)?;
        match sock.connect(remote).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no address to connect to")))
}

/// A whole answer as the next flow.
fn whole(req: &Request, c: &GatewayConf, head: CgiHead, body: BytesMut, cacheable: bool) -> Flow {
    match answer(req, c, head) {
        Flow::Done(mut resp) => {
            allow_ranges(c, &mut resp, cacheable);
            if !body.is_empty() {
                resp.body = Body::bytes(body.freeze());
            }
            Flow::Done(resp)
        }
        flow => flow,
    }
}

/// A whole answer goes on as a flow; the head of a big one as a stream.
async fn outcome(
    req: &Request,
    c: &GatewayConf,
    a: Answered,
    addr: Addr,
    pool: Option<Pooled>,
    lease: Option<Lease>,
) -> Outcome {
    if a.head.status == Some(101) {
        return upgrade(req, c, a);
    }
    // Whether the answer may be stored, before storing it takes the request's entry.
    let cacheable = super::gateway_cache::cacheable(req);
    req.upstream.borrow_mut().add_body(a.body.len(), true);
    if a.done {
        super::gateway_cache::store_whole(req, c, &a.head, &a.body, a.buffering).await;
        return Outcome::Flow(whole(req, c, a.head, a.body, cacheable));
    }
    let tee = super::gateway_cache::tee(req, c, &a.head, a.buffering, a.body.len());
    match answer(req, c, a.head) {
        Flow::Done(mut resp) => {
            allow_ranges(c, &mut resp, cacheable);
            // A length the application announced goes to the client as is (nginx's way),
            // not turned into chunks.
            if let (Some(left), false) = (a.link.left, req.is_head()) {
                resp.content_length = Some(a.body.len() as u64 + left);
            }
            let mut link = a.link;
            if !a.buffering {
                link.read_max = c.buffer_size();
            }
            // As nginx's, only a buffered answer is paced.
            let pace = a
                .buffering
                .then(|| ReadPace::new(req, link.proto, a.body.len()))
                .flatten();
            let body = a.body.freeze();
            // A buffered answer's first bytes count against its spool's memory.
            let (spool, first) = if a.buffering {
                (Some(Spool::new(c, body)), None)
            } else {
                (None, (!body.is_empty()).then_some(body))
            };
            Outcome::Stream(
                resp,
                Box::new(Streaming {
                    scheme: link.scheme,
                    spool,
                    link: Some(link),
                    first,
                    addr,
                    done: false,
                    failed: a.failed,
                    pool,
                    lease,
                    tee,
                    pace,
                    read_timeout: c.read_timeout(),
                }),
            )
        }
        // A redirect or an intercepted error: the rest of the answer is not wanted.
        flow => Outcome::Flow(flow),
    }
}

/// A 101 answer: the client gets its head, then the tunnel, if it asked to upgrade at all.
/// A 101 nobody asked for is passed on as nginx does: its head alone, no body and nothing
/// switched, the connection closed after it.
fn upgrade(req: &Request, c: &GatewayConf, a: Answered) -> Outcome {
    if req.head.header("upgrade").is_none() {
        return match answer(req, c, a.head) {
            Flow::Done(mut resp) => {
                resp.body = Body::Empty;
                resp.close = true;
                Outcome::Flow(Flow::Done(resp))
            }
            flow => Outcome::Flow(flow),
        };
    }
    let Answered {
        head, body, link, ..
    } = a;
    let mut early = body;
    early.extend_from_slice(&link.input);
    // HTTP/2 has no 101 (the `h2` crate takes none): only a connection switches.
    let Wire::Socket(conn) = link.conn else {
        return Outcome::Flow(Flow::Status(502));
    };
    match answer(req, c, head) {
        Flow::Done(resp) => Outcome::Upgrade(resp, Box::new(Tunnel { conn, early })),
        flow => Outcome::Flow(flow),
    }
}

/// One exchange on a new connection.
async fn fresh(
    req: &Request,
    via: &Via,
    addr: &Addr,
    out: &mut Outgoing<'_>,
) -> Result<Answered, Failure> {
    let c = gateway::conf(&req.conf, via.proto);
    let from = match &req.conf.proxy.bind {
        Some(Some(b)) if via.proto == Proto::Http => b.local(req).map(|a| (a, b.transparent)),
        _ => None,
    };
    let conn = connect(addr, via, c, from).await?;
    exchange(req, addr, Link::new(conn, via), out).await
}

/// Send the request and read the answer: whole, or up to where the application pauses (see
/// the module's header).
async fn exchange(
    req: &Request,
    addr: &Addr,
    mut link: Link,
    out: &mut Outgoing<'_>,
) -> Result<Answered, Failure> {
    let c = gateway::conf(&req.conf, link.proto);
    req.upstream.borrow_mut().mark_connected();
    let Wire::Socket(conn) = &mut link.conn else {
        return Err(Failure::ClosedEarly);
    };
    match &mut out.body {
        Some(b) => {
            let mut watched = Watched {
                conn,
                input: &mut link.input,
            };
            let whole = send_body(&link.timers, &mut watched, &out.out, b, c.send_timeout());
            link.cut = !whole.await?;
        }
        None => send(&link.timers, conn, &out.out, c.send_timeout()).await?,
    }
    req.upstream.borrow_mut().sent += out.out.len() as u64;
    read_answer(req, addr, link, (None, BytesMut::new()), &out.out).await
}

/// Read the answer: whole, or up to where the application pauses. `known`: its head when
/// the wire gave it apart (HTTP/2) with what came of the body, else `None` and nothing.
/// `sent` is the request as sent (memcached's answer names its key).
pub(super) async fn read_answer(
    req: &Request,
    addr: &Addr,
    mut link: Link,
    (known, mut body): (Option<CgiHead>, BytesMut),
    sent: &[u8],
) -> Result<Answered, Failure> {
    let c = gateway::conf(&req.conf, link.proto);
    // Whether the answer is held until it is whole (or `*_buffers` are full): `*_buffering`,
    // or the application's `X-Accel-Buffering`. Known once the head has come.
    let mut buffering = known.as_ref().is_none_or(|h| buffers(c, h));
    let mut head = known;
    let mut failed = None;
    loop {
        let event = if head.is_none() {
            link.next(c.read_timeout(), false).await?
        } else {
            match link.next_ready().await {
                Some(Ok(ev)) => ev,
                // The head has come: it goes to the client with what came of the body,
                // and the answer is cut short after it (nginx sends no last chunk then).
                Some(Err(f)) => {
                    failed = Some(f);
                    break;
                }
                // The application pauses: what came goes to the client now, the rest as
                // it comes.
                None => break,
            }
        };
        match event {
            Event::Data(b) => {
                req.upstream.borrow_mut().received += b.len() as u64;
                if body.is_empty() {
                    // Usually the whole answer: taken as it is rather than copied.
                    body = BytesMut::from(b);
                } else {
                    body.extend_from_slice(&b);
                }
                if head.is_none() {
                    head = read_head(req, c, &mut link, &mut body, sent)?;
                    buffering = head.as_ref().is_some_and(|h| buffers(c, h));
                    if head.is_some() {
                        req.upstream.borrow_mut().head_read = Some(clock::now());
                    }
                }
                // Under `proxy_limit_rate` nothing is read ahead of the head: the reads
                // that follow are paced.
                // An answer that has all come (a HEAD's, a 304's) is taken whole even
                // unbuffered, so its connection goes back to the keepalive pool.
                if head.is_some()
                    && !link.complete()
                    && (!buffering
                        || body.len() >= c.buffers_total()
                        || (link.proto == Proto::Http && req.conf.proxy.limit_rate() > 0))
                {
                    break;
                }
            }
            Event::Stderr(b) => {
                log_stderr(req, addr, &b, head.is_some());
                if head.is_none() && link.proto == Proto::FastCgi && req.conf.fastcgi.catches(&b) {
                    return Err(Failure::Protocol("upstream sent invalid header".into()));
                }
            }
            Event::End => {
                return match head {
                    Some(head) => Ok(Answered {
                        head,
                        body,
                        done: true,
                        link,
                        buffering,
                        failed: None,
                    }),
                    None if body.is_empty() => Err(Failure::Protocol(
                        "upstream sent no valid FastCGI stdout".into(),
                    )),
                    None => Err(Failure::Protocol("upstream sent invalid header".into())),
                };
            }
        }
    }
    let head = head.ok_or_else(|| Failure::Protocol("upstream sent invalid header".into()))?;
    Ok(Answered {
        head,
        body,
        done: false,
        link,
        buffering,
        failed,
    })
}

/// Whether an answer is buffered: `*_buffering`, unless the application's
/// `X-Accel-Buffering: yes|no` says otherwise (and `*_ignore_headers` does not list it), as
/// nginx.
fn buffers(c: &GatewayConf, head: &CgiHead) -> bool {
    match head.get("x-accel-buffering") {
        Some(v) if v.eq_ignore_ascii_case("yes") && !c.ignores("x-accel-buffering") => true,
        Some(v) if v.eq_ignore_ascii_case("no") && !c.ignores("x-accel-buffering") => false,
        _ => c.buffering(),
    }
}

/// Write `data` within `timeout`. The flush sends what TLS still holds when the socket was
/// full (plain sockets hold nothing).
pub(super) async fn send(
    timers: &ReadTimers,
    conn: &mut (impl tokio::io::AsyncWrite + Unpin),
    data: &[u8],
    timeout: Duration,
) -> Result<(), Failure> {
    let write = async {
        conn.write_all(data).await?;
        conn.flush().await
    };
    match timers.within(timeout, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Failure::Io(e, SENDING)),
        Err(()) => Err(Failure::Timeout(SENDING)),
    }
}

/// Where a body goes as it arrives, and whether the upstream has answered meanwhile.
pub(super) trait BodySink: tokio::io::AsyncWrite + Unpin {
    /// Ready once the upstream has sent something (kept for the answer's reading) or
    /// closed; never where its answer is watched otherwise (HTTP/2's stream).
    fn poll_answer(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Pending
    }
}

/// An upstream connection and the buffer its answer is read into: what came while the
/// client's body was awaited waits there for [`read_answer`].
struct Watched<'a> {
    conn: &'a mut Conn,
    input: &'a mut BytesMut,
}

impl BodySink for Watched<'_> {
    fn poll_answer(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if !self.input.is_empty() {
            return std::task::Poll::Ready(());
        }
        let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); READ_MAX];
        let mut rb = tokio::io::ReadBuf::uninit(&mut chunk);
        // An error or the end of the stream shows again to the answer's reading.
        let _ = std::task::ready!(tokio::io::AsyncRead::poll_read(
            std::pin::Pin::new(&mut *self.conn),
            cx,
            &mut rb
        ));
        self.input.extend_from_slice(rb.filled());
        std::task::Poll::Ready(())
    }
}

impl tokio::io::AsyncWrite for Watched<'_> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.get_mut().conn).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.get_mut().conn).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.get_mut().conn).poll_shutdown(cx)
    }
}

/// Send the request's `head` and the body that follows it, framed for the upstream, then
/// the end of the body: the client's as it arrives (each read waits at most
/// `client_body_timeout`, in the body source), or a file's from its start. As nginx, what
/// has come already goes in one write with the head, and after each wait all that has come
/// by then goes in one write (one chunk, one STDIN record), up to [`FILE_PIECE`] bytes.
/// Each write waits at most `*_send_timeout`. Returns false when the upstream answered
/// while the client's body was awaited: the rest is not sent (nginx reads an answer as it
/// comes, and sends no more of the body once it has one).
pub(super) async fn send_body(
    timers: &ReadTimers,
    conn: &mut impl BodySink,
    head: &[u8],
    b: &mut StreamBody<'_>,
    timeout: Duration,
) -> Result<bool, Failure> {
    let src = match &mut b.from {
        BodyFrom::Client(src) => &mut **src,
        BodyFrom::File(f) => {
            send(timers, conn, head, timeout).await?;
            send_file(timers, conn, f, b.frame, timeout).await?;
            return Ok(true);
        }
    };
    let mut frame = head.to_vec();
    let mut data = Vec::new();
    let mut first = true;
    loop {
        data.clear();
        let mut end = false;
        if !first {
            let piece = tokio::select! {
                biased;
                p = src.next_piece() => p.map_err(Failure::Client)?,
                () = std::future::poll_fn(|cx| conn.poll_answer(cx)) => return Ok(false),
            };
            match piece {
                Some(d) => data.extend_from_slice(&d),
                None => end = true,
            }
        }
        first = false;
        while !end && data.len() < FILE_PIECE {
            match ready_piece(src).map_err(Failure::Client)? {
                Some(Some(d)) => data.extend_from_slice(&d),
                Some(None) => end = true,
                None => break,
            }
        }
        if !data.is_empty() {
            b.started = true;
            match b.frame {
                BodyFrame::Raw => frame.extend_from_slice(&data),
                BodyFrame::Chunked => {
                    gannet_proto::h1::encode::chunk_size(&mut frame, data.len());
                    frame.extend_from_slice(&data);
                    frame.extend_from_slice(b"\r\n");
                }
                BodyFrame::FastCgi => fastcgi::stdin(&mut frame, &data),
            }
        }
        if end {
            match b.frame {
                BodyFrame::Raw => {}
                BodyFrame::Chunked => frame.extend_from_slice(b"0\r\n\r\n"),
                BodyFrame::FastCgi => fastcgi::stdin_end(&mut frame),
            }
        }
        if !frame.is_empty() {
            send(timers, conn, &frame, timeout).await?;
            frame.clear();
        }
        if end {
            return Ok(true);
        }
    }
}

/// The body's next piece if it has come already (`Some(None)`: the body's end), without
/// waiting: `None` when the next piece is still to come.
fn ready_piece(src: &mut dyn BodySource) -> Result<Option<Option<Bytes>>, BodyError> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match src.next_piece().as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => r.map(Some),
        std::task::Poll::Pending => Ok(None),
    }
}

/// Send a body kept in a temporary file, [`FILE_PIECE`] bytes at a time, framed for the
/// upstream (as is after a Content-Length or an SCGI / uwsgi header, or as FastCGI STDIN
/// records). A failed read of the file is reported as a failed send: the request cannot
/// be completed.
async fn send_file(
    timers: &ReadTimers,
    conn: &mut (impl tokio::io::AsyncWrite + Unpin),
    f: &BodyFile,
    frame: BodyFrame,
    timeout: Duration,
) -> Result<(), Failure> {
    let fastcgi = matches!(frame, BodyFrame::FastCgi);
    // A FastCGI record's header goes before the piece and its padding after it, so the
    // piece is read in after room for the header.
    let room = if fastcgi { 8 } else { 0 };
    let mut buf = vec![0u8; room + FILE_PIECE + room];
    let mut at = 0;
    loop {
        let n = f
            .piece(at, &mut buf[room..room + FILE_PIECE])
            .map_err(|e| Failure::Io(e, READING_BODY_FILE))?;
        if n == 0 {
            break;
        }
        at += n as u64;
        let mut end = room + n;
        if fastcgi {
            let (head, pad) = fastcgi::stdin_header(n);
            buf[..8].copy_from_slice(&head);
            buf[end..end + pad].fill(0);
            end += pad;
        }
        send(timers, conn, &buf[..end], timeout).await?;
    }
    if fastcgi {
        let mut last = Vec::with_capacity(8);
        fastcgi::stdin_end(&mut last);
        send(timers, conn, &last, timeout).await?;
    }
    Ok(())
}

/// The answer's head off the front of `body` once it has all come, with the body's
/// framing noted in the link.
/// `sent` is the request as sent (memcached's answer must name its key).
fn read_head(
    req: &Request,
    c: &GatewayConf,
    link: &mut Link,
    body: &mut BytesMut,
    sent: &[u8],
) -> Result<Option<CgiHead>, Failure> {
    let max = c.buffer_size();
    let bad = |e: &dyn std::fmt::Display| Failure::Protocol(e.to_string());
    let head = match link.proto {
        Proto::Memcached => return memcached_head(req, link, body, sent, max),
        Proto::Http => {
            let Some(h) = parse_response(
                body,
                max,
                req.is_head() && !super::gateway_cache::head_as_get(req),
            )
            .map_err(|e| bad(&e))?
            else {
                return Ok(None);
            };
            if h.status == 101 {
                // What follows the head is the new protocol's: kept whole for the tunnel.
                link.left = Some(0);
            } else {
                link.set_framing(h.framing, h.keep_alive, body);
                if let Some(dec) = link
                    .chunked
                    .as_mut()
                    .filter(|_| req.conf.proxy.pass_trailers())
                {
                    dec.keep_trailers();
                    link.trailers = Some(super::proxy_h2::trailer_slot(req));
                }
            }
            return Ok(Some(CgiHead {
                status: Some(h.status),
                headers: h.headers,
            }));
        }
        Proto::FastCgi => cgi::parse_head(body, max),
        // nginx also takes an HTTP status line from SCGI and uwsgi applications (uWSGI
        // sends one over uwsgi).
        Proto::Scgi | Proto::Uwsgi | Proto::Grpc => cgi::parse_head_or_status_line(body, max),
    };
    let head = head.map_err(|e| bad(&e))?;
    if let Some(h) = &head {
        link.frame(req, h, body);
    }
    Ok(head)
}

/// memcached's first line off the front of `body`, once it has come: a value is a 200 with
/// its length (and `Content-Encoding: gzip` per `memcached_gzip_flag`), a miss a 404. What
/// follows the line goes back to the link's input, to be read as the value and its trailer.
fn memcached_head(
    req: &Request,
    link: &mut Link,
    body: &mut BytesMut,
    sent: &[u8],
    max: usize,
) -> Result<Option<CgiHead>, Failure> {
    let Some(lf) = body.iter().position(|&b| b == b'\n') else {
        if body.len() >= max {
            return Err(Failure::Protocol("upstream sent too big header".into()));
        }
        return Ok(None);
    };
    let line = body.split_to(lf + 1);
    let mut rest = std::mem::take(body);
    rest.extend_from_slice(&link.input);
    link.input = rest;
    let line = &line[..lf];
    let Some(line) = line.strip_suffix(b"\r") else {
        return Err(Failure::Protocol(format!(
            "memcached sent invalid response: \"{}\"",
            String::from_utf8_lossy(line)
        )));
    };
    let key = sent
        .strip_prefix(b"get ")
        .and_then(|k| k.strip_suffix(b"\r\n"))
        .unwrap_or(b"");
    let reply = memcached::parse_reply(line, key, req.conf.memcached.gzip_flag());
    let reply = reply.map_err(Failure::Protocol)?;
    Ok(Some(match reply {
        memcached::Reply::Miss => {
            errlog::request(
                Level::Info,
                req,
                format_args!(
                    "key: \"{}\" was not found by memcached",
                    String::from_utf8_lossy(key)
                ),
            );
            link.left = Some(0);
            link.keep_alive = true;
            CgiHead {
                status: Some(404),
                headers: cgi::Fields::from_pairs(&[]),
            }
        }
        memcached::Reply::Value { len, gzip } => {
            link.left = Some(len);
            link.trailer = 7;
            let n = len.to_string();
            let mut pairs = vec![("Content-Length", n.as_str())];
            if gzip {
                pairs.push(("Content-Encoding", "gzip"));
            }
            CgiHead {
                status: Some(200),
                headers: cgi::Fields::from_pairs(&pairs),
            }
        }
    }))
}

/// Each FastCGI STDERR line goes to the error log, as nginx logs them.
fn log_stderr(req: &Request, addr: &Addr, msg: &[u8], in_body: bool) {
    let text = String::from_utf8_lossy(msg);
    let text = text.trim_end_matches(['\r', '\n']);
    let phase = if in_body { READING } else { READING_HEAD };
    errlog::request(
        Level::Error,
        req,
        format_args!(
            "FastCGI sent in stderr: \"{text}\" while {phase}, upstream: \"fastcgi://{addr}\""
        ),
    );
}

/// memcached's answer: a miss is always gannet's own 404 (or the location's `error_page`,
/// nginx's `intercept_404`); a value gets the type of the URI's extension, as a static file.
fn memcached_answer(req: &Request, head: CgiHead) -> Flow {
    let status = head.status.unwrap_or(200);
    if status != 200 {
        return Flow::Status(status);
    }
    let mut resp = Response::new(200);
    resp.content_type = Some(req.conf.types.lookup(&req.uri));
    if req.is_head() {
        // No body is read for the client: the value's length is the only one (a body at
        // hand gives its own, which ranges then cut).
        resp.content_length = head.get("content-length").and_then(|v| v.parse().ok());
    }
    // nginx's `force_ranges`: a value is cut into ranges as a file is (when it came whole).
    resp.accept_ranges = true;
    if head.get("content-encoding").is_some() {
        resp.headers
            .push((Cow::Borrowed("Content-Encoding"), HeaderValue::from("gzip")));
    }
    Flow::Done(resp)
}

/// Whether the range filter may cut an application's answer (nginx's `allow_ranges`):
/// with `*_force_ranges` (memcached always), or when it said `Accept-Ranges` and is being
/// cached (the client's Range was not passed then). Its own `Accept-Ranges` is then
/// dropped for gannet's, and one range only is cut (`single_range`); otherwise the header
/// passes and the range was the application's to answer.
fn allow_ranges(c: &GatewayConf, resp: &mut Response, cacheable: bool) {
    let said = resp
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("accept-ranges"));
    let allowed = c.force_ranges() || resp.accept_ranges || (said && cacheable);
    resp.accept_ranges = allowed;
    resp.single_range = allowed;
    if allowed && said {
        resp.headers
            .retain(|(n, _)| !n.eq_ignore_ascii_case("accept-ranges"));
    }
}

thread_local! {
    /// The Content-Type the last answer on this thread had.
    static LAST_TYPE: std::cell::RefCell<Option<Arc<str>>> = const { std::cell::RefCell::new(None) };
}

/// An answer's Content-Type as the response holds it: the last one's shared when it is
/// the same (a back end's answers nearly all have one or two types), else a new one kept
/// for the next. Each answer made its own `Arc<str>` before, an allocation, a copy and a
/// free (about 140 user instructions per proxied request; docs/bench/cost-per-request.md).
fn content_type(value: &str) -> Arc<str> {
    LAST_TYPE.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some(t) if **t == *value => t.clone(),
            _ => {
                let t: Arc<str> = Arc::from(value);
                *last = Some(t.clone());
                t
            }
        }
    })
}

/// The answer's head as the next step of the request phases (the caller adds the body).
pub(super) fn answer(req: &Request, c: &GatewayConf, head: CgiHead) -> Flow {
    if gateway::active(&req.conf) == Some(Proto::Memcached) {
        return memcached_answer(req, head);
    }
    if crate::http::variables::keeps_upstream_headers() {
        // `$upstream_http_NAME`: the text is shared, only the list is copied. Kept for an
        // X-Accel-Redirect's or an intercepted error's internal redirect too, as nginx.
        *req.upstream_headers.borrow_mut() = Some(head.headers.clone());
    }
    let (status, head) = match gateway::classify(c, head) {
        Answer::LocalRedirect(uri) => return Flow::Redirect(uri),
        Answer::AccelRedirect(uri, carried, rate) => {
            if rate.is_some() {
                req.limit_rate.set(rate);
            }
            return Flow::Accel(uri, carried);
        }
        Answer::Respond(s, h) => (s, h),
    };
    if status >= 300 && c.intercept_errors() && req.conf.error_page.find(status).is_some() {
        let fields = &head.headers;
        let challenges: Vec<String> = fields
            .list
            .iter()
            .filter(|(n, _)| status == 401 && n.eq_ignore_ascii_case("www-authenticate"))
            .map(|(_, at)| fields.value(at).to_string())
            .collect();
        if !challenges.is_empty() {
            return Flow::Intercepted(Box::new((status, challenges)));
        }
        return Flow::Status(status);
    }
    let proxied = gateway::active(&req.conf) == Some(Proto::Http);
    let mut resp = Response::new(status);
    if req.is_head() {
        // The application answered HEAD without a body: its Content-Length, if it gave
        // one, is the only true one.
        resp.content_length = head.get("content-length").and_then(|v| v.parse().ok());
        resp.length_unknown = resp.content_length.is_none();
    }
    // Only the values the client gets are made into values of their own.
    let mut fields = head.headers;
    let mut charset = None;
    for (name, at) in std::mem::take(&mut fields.list) {
        let value = fields.value(&at);
        // Each name classified once (see `Field::of`).
        let kind = Field::of(&name);
        if kind == Field::LimitRate && !c.ignores("x-accel-limit-rate") {
            // nginx takes a number of bytes per second and ignores anything else.
            if let Some(n) = gannet_conf::setters::num(value.trim()) {
                resp.limit_rate = Some(u32::try_from(n).unwrap_or(u32::MAX));
            }
        }
        if kind == Field::ContentType {
            resp.content_type = Some(content_type(value));
        } else if kind == Field::Charset && !c.ignores("x-accel-charset") {
            charset = Some(value);
        } else if kind == Field::Location {
            let rewritten = proxied.then(|| proxy::rewrite_location(req, value));
            resp.location = Some(rewritten.flatten().unwrap_or_else(|| value.to_string()));
        } else if proxied && kind == Field::Refresh {
            // `Refresh: 5; url=URL`: the URL is rewritten as a Location would be.
            let at = value.to_ascii_lowercase().find("url=").map(|i| i + 4);
            let v = at
                .and_then(|i| proxy::rewrite_location(req, &value[i..]).map(|u| (i, u)))
                .map_or_else(
                    || fields.keep(value),
                    |(i, u)| format!("{}{u}", &value[..i]).into(),
                );
            resp.headers.push((name, v));
        } else if proxied && kind == Field::SetCookie && gateway::passes_field(c, &name, kind) {
            let v = proxy_cookie::rewrite(req, value)
                .map_or_else(|| fields.keep(value), HeaderValue::from);
            resp.headers.push((name, v));
        } else if gateway::passes_field(c, &name, kind) {
            resp.headers.push((name, fields.keep(value)));
        }
    }
    if c.pass_headers.is_some() {
        // A passed `Server`/`Date` replaces gannet's own; nginx's proxy sends none at all
        // when the server sent none, the other modules their own then.
        let passed = |name: &str| {
            gateway::pass_lists(c, name)
                && (proxied
                    || resp
                        .headers
                        .iter()
                        .any(|(n, _)| n.eq_ignore_ascii_case(name)))
        };
        resp.passed_server_date = (passed("server"), passed("date"));
    }
    // `X-Accel-Charset`: the charset the answer is to be sent in (`charset::start`).
    *req.override_charset.borrow_mut() = charset.filter(|cs| !cs.is_empty()).map(Arc::from);
    Flow::Done(resp)
}
