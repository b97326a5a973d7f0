//! The HTTP/1.x connection loop: read, parse every complete (pipelined) request in the
//! buffer, answer them in order into one output buffer, write it when the input runs dry.
//!
//! Memory: a connection idle for a second leaves its task for the worker's parking lot
//! (`runtime::parking`), which is what lets ten thousand idle keep-alive connections cost
//! little; until then it keeps its buffers for the next request.
//!
//! Timeouts: `client_header_timeout` for a whole request head (from the accept for a
//! connection's first request, from the request's first byte after that; a head still
//! incomplete then is closed unanswered and logged as 408), `keepalive_timeout` between
//! requests, `client_body_timeout` between two body reads, `send_timeout` between two
//! writes. Framing errors are answered (400/413/414/501/505, and nginx's 400 "Request
//! Header Or Cookie Too Large" for a head over the limits) and the connection is closed,
//! since what follows can no longer be trusted.
//!
//! On a `listen ... ssl` address the TLS handshake comes first (`tls::handshake`), and the
//! loop then runs over the encrypted stream (`conn::tls_stream`); a client speaking plain
//! HTTP to such an address has its request refused with nginx's code 497 (which
//! `error_page` may redirect; nginx's 400 page otherwise), and the connection closed. The loop is compiled once per stream
//! kind (`conn::transport`), so cleartext pays nothing for TLS.

use super::body::{self, BodyError};
use super::exchange::{self, Compress, Exchange, Reset};
use super::gateway::{Outcome, Tunnel};
use super::pace::Pace;
use super::request_body::Failed;
use super::source::Source;
use super::tls_stream::TlsStream;
use super::transport::{Plain, Transport};
use super::ConnInfo;
use crate::errlog::Level;
use crate::http::flow::{Flow, Handled};
use crate::http::request::Request;
use crate::http::response::{encode_head, Body, HeadCtx, Hop, Part, Response};
use crate::modules::gateway::Streamed;
use crate::modules::{headers, limit_rate};
use crate::runtime::clock;
use crate::runtime::parking::{Parked, PARK_AFTER};
use crate::runtime::read_timers::{ReadTimers, TICK};
use crate::runtime::worker::Worker;
use crate::tls::handshake::{self, Accepted};
use bytes::BytesMut;
use gannet_proto::h1::{parse_request, BodyKind, Limits, ParseError, RequestHead, Version};
use gannet_proto::uri::parse_target_into;
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// The most read-buffer capacity kept between requests.
const BUF_KEEP: usize = 16 * 1024;
/// Output is written once this much is pending even if more requests are queued.
const FLUSH_AT: usize = 64 * 1024;
/// Body parts up to this size are copied into the output buffer; larger ones are written
/// from where they are with writev.
const COPY_MAX: usize = 8 * 1024;
/// Body parts up to this size are always copied. A larger one (up to `COPY_MAX`) is copied
/// only when the copy saves a write: pipelined requests are waiting (their answers then go
/// out together) or the connection closes after it (the answer then leaves with the FIN,
/// `Transport::try_write_last`). Else it goes with the head in one writev from where it
/// is (a cache entry's or a small file's kept bytes, shared by every connection): the copy
/// wrote up to 8 KiB into each connection's output buffer, which then kept that size
/// (docs/bench/cache-report.md: the cache's PHP pages, 3.6 KiB on average).
const COPY_ALWAYS: usize = 1024;
/// Output buffer room for a usual response head.
const HEAD_ROOM: usize = 512;
/// The longest a draining worker reads off a closing connection (`Conn::linger`).
const LINGER: Duration = Duration::from_secs(2);
/// How long the rest of a body is read off after its temporary file failed (nginx's
/// `lingering_time` default).
const STORE_FAILED_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

struct Conn<S: Transport> {
    w: Rc<Worker>,
    stream: S,
    group: usize,
    info: ConnInfo,
    buf: BytesMut,
    out: Vec<u8>,
    /// The last answer's location's `keepalive_timeout` (nginx waits for the next request
    /// as long as the location of the one before says); `None`: the default server's.
    keepalive: Option<Duration>,
    /// TCP_NODELAY is set (lazily, as nginx does: only a kept-alive connection can have a
    /// small write waiting behind an unacknowledged one, so a one-shot connection never
    /// pays the setsockopt).
    nodelay: bool,
    /// Whether the socket keeps little unsent yet (`send::limit_unsent`, kept connections).
    unsent_limited: bool,
    /// The default server's until an answer's location says otherwise ([`Conn::head`]).
    send_timeout: Duration,
    /// Plain HTTP arrived on a TLS address: every request is answered 400.
    plain_on_tls: bool,
    /// Closed by a worker out of connections, to make room (`Worker::reuse_connections`).
    reused: bool,
    /// The last request answered came without a body (so none of it is left unread).
    bodiless: bool,
    /// `keepalive_time` from the connection's start (`info.born`), for each answer's check.
    ka_time: clock::Within,
}

/// How a connection's loop ended.
enum End {
    Close,
    /// Closed after an answer to a client that asked for the close, with nothing unread:
    /// it sends no more, so a draining worker need not linger on it (nginx lingers only
    /// where input is pending).
    Asked,
    /// The client opened with the HTTP/2 preface (h2c with prior knowledge).
    H2c,
    /// Idle long enough to park until this keep-alive deadline; idle since the second.
    Park(Instant, Instant),
}

/// Serve one accepted connection until it closes or parks. Each poll of its task is one
/// turn of the clock (`runtime::clock::Turns`): the clocks are read once per turn.
pub fn serve(
    w: Rc<Worker>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    group: usize,
) -> clock::Turns<impl std::future::Future<Output = ()>> {
    clock::Turns::new(serve_conn(w, stream, peer, group, None))
}

/// [`serve`] for a connection a stream server's `pass` hands over (`stream::pass`), with
/// the address it was passed to as its local one (nginx sets the connection's).
pub fn serve_passed(
    w: Rc<Worker>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    group: usize,
    local: SocketAddr,
) -> clock::Turns<impl std::future::Future<Output = ()>> {
    clock::Turns::new(serve_conn(w, stream, peer, group, Some(local)))
}

/// A connection whose TLS a stream server terminated before its `pass`: HTTP/1.x over
/// that session, whatever the listener's own `ssl` (as nginx, which keeps the
/// connection's TLS when it hands it over).
pub fn serve_passed_tls(
    w: Rc<Worker>,
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    tls: crate::tls::TlsInfo,
    peer: SocketAddr,
    group: usize,
    local: SocketAddr,
) -> clock::Turns<impl std::future::Future<Output = ()>> {
    let info = ConnInfo {
        peer,
        local,
        id: Worker::next_conn_id(),
        requests: 0,
        tls: Some(std::sync::Arc::new(tls)),
        proxy: None,
        unix: w.config.listens[group].listen.unix.clone(),
        born: clock::now(),
        pipelined: false,
    };
    let (tcp, conn) = stream.into_inner();
    clock::Turns::new(run_conn(w, TlsStream::new(tcp, conn), info, group, false))
}

async fn serve_conn(
    w: Rc<Worker>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    group: usize,
    local: Option<SocketAddr>,
) {
    let g = &w.config.listens[group];
    let local = local.unwrap_or_else(|| g.listen.local_of(&stream));
    // client_header_timeout runs from here, through a PROXY protocol header and a TLS
    // handshake, to the end of the first request's head, as nginx's one timer does.
    let born = clock::now();
    let mut info = ConnInfo {
        peer,
        local,
        id: Worker::next_conn_id(),
        requests: 0,
        tls: None,
        proxy: None,
        unix: g.listen.unix.clone(),
        born,
        pipelined: false,
    };
    let plain = !g.listen.proxy_protocol && !g.listen.ssl && !g.listen.http2;
    if plain {
        // Cleartext HTTP/1.x: the loop registers the socket only if it has to wait.
        return run_conn(w, Plain::Raw(stream), info, group, false).await;
    }
    let Ok(stream) = TcpStream::from_std(stream) else {
        return w.connection_closed();
    };
    if g.listen.proxy_protocol {
        let limit = g.servers[g.default].conf.core.client_header_timeout();
        match super::proxy_protocol::read(&stream, &info, limit).await {
            Ok(addrs) => info.proxy = addrs,
            Err(()) => return w.connection_closed(),
        }
    }
    if g.listen.ssl {
        // Boxed: the handshake's state would otherwise enlarge every cleartext
        // connection's task too.
        return Box::pin(serve_tls(w, stream, info, group)).await;
    }
    if g.listen.http2 {
        // `listen ... http2` without `ssl`: HTTP/2 only, with prior knowledge (nginx's
        // meaning of the parameter before `http2 on`, which serves both).
        let conf = g.servers[g.default].conf.clone();
        if conf.core.tcp_nodelay() {
            let _ = stream.set_nodelay(true);
        }
        return Box::pin(super::h2::serve(w, stream, info, group, conf)).await;
    }
    run_conn(w, Plain::Reg(stream), info, group, false).await;
}

/// The handshake, then the loop over TLS (or over the socket, to answer plain HTTP).
async fn serve_tls(w: Rc<Worker>, stream: TcpStream, mut info: ConnInfo, group: usize) {
    let accepted = handshake::accept(&w.config.listens[group], stream, &info).await;
    match accepted {
        Accepted::Tls(stream, tls) => {
            info.tls = Some(tls);
            run_conn::<TlsStream>(w, stream, info, group, false).await
        }
        Accepted::H2(stream, tls, conf) => {
            info.tls = Some(tls);
            if conf.core.tcp_nodelay() {
                // HTTP/2 writes whole frames itself: Nagle would hold a response's last
                // segment for the client's delayed ACK (40 ms per response on a stream
                // that fills the window), as nginx avoids by setting it too.
                let _ = stream.get_ref().0.set_nodelay(true);
            }
            super::h2::serve(w, stream, info, group, conf).await
        }
        Accepted::PlainHttp(stream) => run_conn(w, Plain::Reg(stream), info, group, true).await,
        Accepted::Closed => w.connection_closed(),
    }
}

/// Take a parked connection back and go on serving it (one clock turn per poll, as
/// [`serve`]).
pub fn resume(w: Rc<Worker>, p: Parked) -> clock::Turns<impl std::future::Future<Output = ()>> {
    clock::Turns::new(run_conn(w, Plain::Raw(p.stream), p.info, p.group, false))
}

async fn run_conn<S: Transport>(
    w: Rc<Worker>,
    stream: S,
    info: ConnInfo,
    group: usize,
    plain_on_tls: bool,
) {
    let send_timeout = w.config.listens[group].servers[w.config.listens[group].default]
        .conf
        .core
        .send_timeout();
    let born = info.born;
    let mut c = Conn {
        w: w.clone(),
        stream,
        group,
        info,
        buf: BytesMut::new(),
        out: Vec::new(),
        send_timeout,
        keepalive: None,
        nodelay: false,
        unsent_limited: false,
        plain_on_tls,
        reused: false,
        bodiless: false,
        ka_time: clock::Within::new(born, Duration::ZERO),
    };
    let end = c.run().await;
    let asked = matches!(end, End::Asked);
    if let End::H2c = end {
        // Boxed, as the handshake in `serve`: HTTP/2's state stays out of every HTTP/1.x
        // connection's task.
        let Conn {
            stream, buf, info, ..
        } = c;
        let g = &w.config.listens[group];
        let conf = g.servers[g.default].conf.clone();
        match stream.into_parkable().map(TcpStream::from_std) {
            Some(Ok(tcp)) => {
                if conf.core.tcp_nodelay() {
                    let _ = tcp.set_nodelay(true);
                }
                let io = super::h2::Prefixed::new(buf, tcp);
                return Box::pin(super::h2::serve(w.clone(), io, info, group, conf)).await;
            }
            _ => {
                w.connection_closed();
                return;
            }
        }
    }
    if let (End::Park(deadline, idle_since), Some(lot)) = (end, &w.parking) {
        let Conn { stream, info, .. } = c;
        if let Some(stream) = stream.into_parkable() {
            if lot
                .park(Parked {
                    stream,
                    info,
                    group,
                    deadline,
                    idle_since,
                })
                .is_ok()
            {
                return;
            }
        }
        w.connection_closed();
        return;
    }
    if w.draining.get() && c.info.requests > 0 && !asked {
        c.linger().await;
    } else {
        c.stream.close();
    }
    w.connection_closed();
}

impl<S: Transport> Conn<S> {
    /// The connection loop; see the module docs.
    async fn run(&mut self) -> End {
        let c = self;
        let w = c.w.clone();
        let g = &w.config.listens[c.group];
        // Until the Host header picks a virtual host, the default server's settings apply.
        let conf = g.servers[g.default].conf.clone();
        let core = &conf.core;
        let (n, size) = core.large_client_header_buffers();
        let limits = Limits {
            max_request_line: size,
            max_header_line: size,
            max_head: n * size,
            max_headers: core.max_headers(),
            names: core.header_names(),
        };
        // A new connection, or one just taken back from parking, usually has its request
        // waiting already.
        let mut fresh = true;
        let header_timeout = core.client_header_timeout();
        let server_keepalive = core.keepalive_timeout().0;
        // When the head being read must be complete: `client_header_timeout` bounds the
        // whole head, as in nginx, not each read (a client trickling a header line at a
        // time would otherwise keep the connection for ever). It runs from the accept for
        // a connection's first request, else from the first byte of the request (or from
        // the end of the previous one when it is pipelined right behind it).
        let mut head_deadline = (c.info.requests == 0).then(|| c.info.born + header_timeout);
        // `stub_status`'s Reading: from a request's first byte to its whole head.
        let mut reading = None;
        // The next request was in the buffer when the one before it was done (`$pipe`).
        let mut pipelined = false;
        loop {
            match parse_request(&mut c.buf, &limits) {
                Ok(Some(head)) => {
                    head_deadline = None;
                    c.info.requests += 1;
                    c.info.pipelined = pipelined;
                    if reading.take().is_none() {
                        w.stats.request();
                    }
                    let _writing = w.stats.writing();
                    // On the heap: the request's state (head, response, body sends) is large
                    // and lives only while the request does; inline it would sit in every
                    // idle connection's task for its whole life. In a block the thread
                    // reuses (`conn::reuse`): a fresh `Box` of that size cost a few hundred
                    // instructions per request in glibc.
                    let asked_close = !head.keep_alive;
                    if !super::reuse::Reused::new(|| c.request(head)).await {
                        // Nothing left unread (no body, nothing pipelined seen): the answer's
                        // end may wait for the FIN of the close that follows.
                        let last = c.bodiless && c.buf.is_empty();
                        let _ = c.flush_as(last).await;
                        return if last && asked_close {
                            End::Asked
                        } else {
                            End::Close
                        };
                    }
                    pipelined = !c.buf.is_empty();
                    if c.out.len() >= FLUSH_AT && c.flush().await.is_err() {
                        return End::Close;
                    }
                    continue;
                }
                Ok(None) => {
                    if reading.is_none() && !c.buf.is_empty() {
                        w.stats.request();
                        reading = Some(w.stats.reading());
                    }
                }
                Err(ParseError::VersionNotSupported)
                    if c.buf.starts_with(H2_PREFACE) && h2c_enabled(g) && !c.plain_on_tls =>
                {
                    return End::H2c;
                }
                // On an address that also speaks h2c, a connection that opens with a line
                // HTTP/1 refuses and that names no HTTP/ version at all is taken for an
                // HTTP/2 client with a wrong preface: HTTP/2 answers it (GOAWAY with
                // PROTOCOL_ERROR, as h2spec 3.5/2 expects), not an HTTP/1 400 page it could
                // not read.
                Err(e @ ParseError::BadRequest(_))
                    if e.in_request_line()
                        && c.info.requests == 0
                        && h2c_enabled(g)
                        && !c.plain_on_tls
                        && !names_http_version(&c.buf) =>
                {
                    return End::H2c;
                }
                Err(e) => {
                    if reading.is_none() {
                        w.stats.request();
                    }
                    // Log what nginx would: the request line up to the buffer's size, and the
                    // headers when it was the headers that were refused.
                    let mut raw = c.buf.split().freeze();
                    if e == ParseError::UriTooLong {
                        raw.truncate(limits.max_request_line);
                    }
                    let head = RequestHead::unparsed(raw, !e.in_request_line());
                    Box::pin(c.reject(&e, head)).await;
                    return End::Close;
                }
            }
            if c.flush().await.is_err() {
                return End::Close;
            }
            if fresh {
                // Read it now rather than wait for the event loop to report what is there.
                fresh = false;
                match c.read_now() {
                    Ok(0) => return End::Close,
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return End::Close,
                }
            }
            let idle = c.buf.is_empty();
            // Only a connection between requests is closed by a graceful stop, once its
            // grace time is over (`read_timers`): the wait below is cut short to it. One that
            // has not sent its first request yet was accepted just before the stop (a reload
            // hands the sockets to new workers at any moment) and its request is on the way.
            let between_requests = idle && c.info.requests > 0;
            if idle {
                // The empty buffers go to the worker for the next request of any connection
                // (`reuse::Spare`: they stay in cache); with the worker's slot full, they are
                // kept for this connection's next request (a connection that stays idle
                // parks and frees them). Ones a big request or answer grew are freed.
                c.w.spare.give_read(&mut c.buf, BUF_KEEP);
                c.w.spare.give_write(&mut c.out, FLUSH_AT);
            }
            // The turn's time (`runtime::clock`), read already for the request just answered.
            let now = clock::now();
            let (deadline, wait) = if idle && c.info.requests > 0 {
                // The wait is the timeout itself: no `Instant` subtraction to find it.
                let timeout = c.keepalive.unwrap_or(server_keepalive);
                (now + timeout, timeout)
            } else {
                let deadline = *head_deadline.get_or_insert(now + header_timeout);
                (deadline, deadline.saturating_duration_since(now))
            };
            // A connection with no request in hand may be closed to make room; the worker
            // closes the one that has waited longest first.
            let since = if c.info.requests == 0 {
                c.info.born
            } else {
                now
            };
            let reusable = idle.then_some(since);
            let may_park = S::PARKABLE && !c.plain_on_tls && w.parking.is_some();
            if idle && may_park && wait > PARK_AFTER && !w.draining.get() {
                // Most keep-alive clients come back at once: wait a moment here before parking.
                if !c
                    .wait_readable(now + PARK_AFTER, between_requests, reusable)
                    .await
                {
                    return if w.draining.get() || c.reused {
                        End::Close
                    } else {
                        End::Park(deadline, since)
                    };
                }
            } else if idle && !S::PARKABLE && wait > PARK_AFTER && !w.draining.get() {
                // A connection that cannot park (TLS) still gives its buffers back once it
                // has been idle that long; the next request allocates them again.
                if !c
                    .wait_readable(now + PARK_AFTER, between_requests, reusable)
                    .await
                {
                    if c.reused {
                        return End::Close;
                    }
                    c.buf = BytesMut::new();
                    c.out = Vec::new();
                    w.buffers_shed();
                    if w.draining.get()
                        || !c.wait_readable(deadline, between_requests, reusable).await
                    {
                        return End::Close;
                    }
                }
            } else if !c.wait_readable(deadline, between_requests, reusable).await {
                // Past the deadline (not a stream that broke) with part of a head in hand.
                if !idle && Instant::now() >= deadline {
                    c.head_timed_out();
                }
                return End::Close;
            }
            c.buf_in_hand();
            if c.buf.capacity() - c.buf.len() < 512 {
                c.buf.reserve(core.client_header_buffer_size().max(1024));
            }
            match c.read_some() {
                Ok(0) => return End::Close,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return End::Close,
            }
        }
    }
}

/// The start of the HTTP/2 connection preface (RFC 9113 3.4), as an HTTP/1 parser sees it:
/// a request line with version 2.0.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// Whether the first line in `buf` (as much of it as came) has an `HTTP/` in it, as any
/// HTTP/1 request line has.
fn names_http_version(buf: &[u8]) -> bool {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    line.windows(5).any(|w| w == b"HTTP/")
}

/// h2c with prior knowledge next to HTTP/1.x: `http2 on` in the address's default server.
fn h2c_enabled(g: &crate::config::ListenGroup) -> bool {
    g.servers[g.default].conf.http2.enabled()
}

impl<S: Transport> Conn<S> {
    /// Read now, whatever the event loop last heard about the stream (see `Transport`).
    fn read_now(&mut self) -> std::io::Result<usize> {
        self.buf_in_hand();
        self.stream.read_now(&mut self.buf)
    }

    /// Read what the stream has into the buffer once it was reported readable.
    fn read_some(&mut self) -> std::io::Result<usize> {
        self.stream.read_some(&mut self.buf)
    }

    /// A connection that gave its read buffer to the worker while it waited takes the
    /// worker's spare one (`reuse::Spare`).
    fn buf_in_hand(&mut self) {
        self.w.spare.take_read(&mut self.buf);
    }

    /// Room for `n` more bytes of output, in the worker's spare buffer if the connection
    /// gave its own up while it waited.
    fn out_room(&mut self, n: usize) {
        self.w.spare.take_write(&mut self.out);
        self.out.reserve(n);
    }

    /// Wait until the stream is readable (true) or the deadline passes (false). Polls the
    /// stream's readiness directly and keeps the deadline in the worker's table, so a
    /// waiting connection's task holds a few words (see `runtime::read_timers`).
    /// With `reusable` (waiting with no request in hand since then), the worker may end
    /// the wait to close the connection for room: false, and `reused` set.
    async fn wait_readable(
        &mut self,
        deadline: Instant,
        idle: bool,
        reusable: Option<Instant>,
    ) -> bool {
        let timers = &self.w.timers;
        let stream = &mut self.stream;
        let held = match reusable {
            Some(since) => timers.hold_reusable(deadline, idle, since),
            None => timers.hold(deadline, idle),
        };
        let ready = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = stream.poll_readable(cx) {
                return Poll::Ready(r);
            }
            timers.poll(held.key, cx).map(|()| false)
        })
        .await;
        if !ready && timers.was_reused(held.key) {
            self.reused = true;
        }
        ready
    }

    /// Close a kept-alive connection of a draining worker the careful way, as nginx's
    /// lingering close: FIN first, then read and drop what the client still sends until it
    /// closes too (at most `LINGER`). Closed at once with bytes unread, the socket would send
    /// a reset instead, which can destroy the last answer in the client's receive buffer
    /// before it reads it; a request that crossed the FIN gets an end of stream, which a
    /// client may retry, not a reset.
    async fn linger(&mut self) {
        self.stream.shutdown_write();
        let until = Instant::now() + LINGER;
        while self.wait_readable(until, false, None).await {
            self.buf.clear();
            self.buf.reserve(4096);
            match self.read_some() {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }

    /// Write the pending output. Most of the time the socket takes it all at once, so try
    /// that first: the timed, waiting write (and its timer) is only built when it does not
    /// (or when TLS still holds records the socket did not take).
    async fn flush(&mut self) -> std::io::Result<()> {
        self.flush_as(false).await
    }

    /// [`Conn::flush`]; `last`: the connection closes right after, with nothing unread
    /// (`Transport::try_write_last`).
    async fn flush_as(&mut self, last: bool) -> std::io::Result<()> {
        if self.out.is_empty() && !self.stream.has_pending() {
            return Ok(());
        }
        let tried = if last {
            self.stream.try_write_last(&self.out)
        } else {
            self.stream.try_write(&self.out)
        };
        let done = match tried {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        let r = if done < self.out.len() || self.stream.has_pending() {
            let rest = &self.out[done..];
            Box::pin(self.stream.write_all(rest, self.send_timeout)).await
        } else {
            Ok(())
        };
        self.out.clear();
        r
    }

    /// Answer a request that could not be parsed (the connection then closes), and log it
    /// as nginx does, against the default server.
    async fn reject(&mut self, e: &ParseError, head: RequestHead) {
        let w = self.w.clone();
        let g = &w.config.listens[self.group];
        let server = g.servers[g.default].clone();
        let host = server.primary_name.clone();
        let req = Request::new(head, self.info.clone(), server, String::new(), None, host);
        if let ParseError::BadRequest(why) = e {
            crate::errlog::request(
                Level::Info,
                &req,
                format_args!("client sent invalid request ({why})"),
            );
        }
        let mut resp =
            Response::error_page(exchange::refusal_status(e), req.conf.core.server_tokens());
        // nginx's header filters run on this answer too, with the server's settings: an
        // `add_header ... always` there is sent with it.
        crate::modules::headers::filter(&req, &mut resp);
        self.respond(&req, resp, false).await;
        let _ = self.flush().await;
    }

    /// The head did not arrive whole within `client_header_timeout`. Nothing is answered
    /// (the client is too slow to be waiting for it, or is an attack), but it is logged as
    /// nginx does: "client timed out" in the error log and a 408 in the access log, with
    /// what came of the request line.
    fn head_timed_out(&mut self) {
        let w = self.w.clone();
        let g = &w.config.listens[self.group];
        let server = g.servers[g.default].clone();
        let host = server.primary_name.clone();
        let part = if self.buf.contains(&b'\n') {
            "headers"
        } else {
            "line"
        };
        let head = RequestHead::unparsed(self.buf.split().freeze(), true);
        let req = Request::new(head, self.info.clone(), server, String::new(), None, host);
        crate::errlog::request(
            Level::Info,
            &req,
            format_args!("client timed out while reading client request {part}"),
        );
        self.log(&req, &Response::new(408), 0, 0, false);
    }

    /// Serve one request. Returns whether the connection stays open.
    async fn request(&mut self, head: RequestHead) -> bool {
        // Until this request's answer says otherwise (`Conn::head`).
        self.bodiless = false;
        let w = self.w.clone();
        let g = &w.config.listens[self.group];
        // `merge_slashes` is the default server's, as nginx parses the URI before the Host
        // header picks the server.
        let merge = g.servers[g.default].conf.core.merge_slashes();
        // The last request's buffers for the path and `$host` (given back below).
        let (path, host) = crate::http::request::spare_strings();
        let target = match parse_target_into(head.target(), merge, path) {
            Ok(t) => t,
            Err(e) => {
                let line_only =
                    RequestHead::unparsed(bytes::Bytes::copy_from_slice(head.raw()), false);
                self.reject(&e, line_only).await;
                return false;
            }
        };
        let mut req = exchange::request(g, head, target, self.info.clone(), host);
        req.log_ignored_headers();
        let keep = exchange::serve(self, &w, &mut req).await;
        req.give_back_strings();
        let update = req.background.get_mut().take();
        if let Some(update) = update {
            // A background cache update is part of the request in nginx (a subrequest):
            // the answer goes out at once, but the connection goes on to its next request,
            // or closes, once the update is done - so a next request finds it done.
            if self.flush().await.is_err() {
                return false;
            }
            let _ = update.await;
        }
        keep
    }

    /// Read the body whole for the application (memory or temporary file, see
    /// `conn::request_body`; always a named file if `named`) into `req.body`; returns its
    /// length.
    async fn keep_body(&mut self, req: &mut Request, named: bool) -> Result<u64, Failed> {
        let core = &req.conf.core;
        let mut src = body::BodyStream::new(
            &mut self.stream,
            &mut self.buf,
            req.head.body,
            core.client_max_body_size(),
            core.client_body_timeout(),
        )
        .map_err(Failed::Client)?;
        let kept = match super::request_body::read(&mut src, req, named).await {
            Err(Failed::Store) => {
                // The client is still sending: the rest is read off and dropped (for a
                // while, as nginx's lingering close) so that it gets the 500, not a reset
                // from a close with its bytes unread.
                let drain = async { while let Ok(Some(_)) = src.next().await {} };
                let _ = tokio::time::timeout(STORE_FAILED_DRAIN, drain).await;
                return Err(Failed::Store);
            }
            r => r?,
        };
        let n = kept.len();
        req.body = Some(std::rc::Rc::new(kept));
        Ok(n)
    }

    /// Pass the request upstream with its body read as it arrives. Returns the outcome,
    /// whether the body was read to its end, and how much of it was read.
    async fn run_streaming(
        &mut self,
        w: &Worker,
        req: &Request,
        how: Streamed,
    ) -> (Outcome, bool, u64) {
        let core = &req.conf.core;
        let src = body::BodyStream::new(
            &mut self.stream,
            &mut self.buf,
            req.head.body,
            core.client_max_body_size(),
            core.client_body_timeout(),
        );
        match src {
            Ok(mut src) => {
                let o = super::gateway::run_streaming(w, req, &mut src, how).await;
                (o, src.finished(), src.total())
            }
            // A Content-Length over the limit: refused before anything goes upstream, as
            // a buffered body is.
            Err(e) => {
                let status = if e == BodyError::TooLarge { 413 } else { 400 };
                (Outcome::Flow(Flow::Status(status)), false, 0)
            }
        }
    }

    /// Write the response (head into the output buffer, body after it), then log it.
    /// Returns whether the connection stays open.
    async fn respond(&mut self, req: &Request, mut resp: Response, keep: bool) -> bool {
        // The streamed and the paced sends are boxed where taken: inline, their state would
        // widen every request's future (allocated per request) for the few that need them.
        if let Some(src) = Source::from_body(&mut resp) {
            // Compressed or rewritten while sent.
            return Box::pin(self.respond_streamed(req, resp, src, keep)).await;
        }
        if req.head.version == Version::Http11 && headers::sends_trailers(req, &resp) {
            // Chunked, for its trailer fields to follow the body.
            let src = Source::whole(&mut resp);
            return Box::pin(self.respond_streamed(req, resp, src, keep)).await;
        }
        // Room for the head and a body copied after it, at once: a new connection's empty
        // buffer otherwise grew by doubling from a few bytes, eight reallocations per
        // short connection.
        let body_len = resp.body.len();
        let copied = usize::try_from(body_len).map_or(0, |n| {
            if n <= COPY_ALWAYS || (n <= COPY_MAX && self.copies(keep)) {
                n
            } else {
                0
            }
        });
        self.out_room(HEAD_ROOM + copied);
        let (keep, head_len, send_body) = self.head(req, &mut resp, keep);
        let sendfile = req.conf.core.sendfile();
        let sent_ok = !send_body
            || match limit_rate::pace(req, &resp) {
                None => self.send_body(&resp.body, sendfile, keep).await,
                Some(mut pace) => Box::pin(self.send_paced(&resp.body, sendfile, &mut pace)).await,
            }
            .is_ok();
        let body_sent = if send_body { body_len } else { 0 };
        self.log(req, &resp, head_len, body_sent, sent_ok);
        std::mem::take(&mut resp.body).give_back();
        keep && sent_ok
    }

    /// Send a body as it comes (an application's streamed answer, or one being compressed):
    /// with the length the application announced, else chunked to an HTTP/1.1 client and
    /// close-delimited to an HTTP/1.0 one. If the source fails half-way, what came is sent
    /// and the connection closes (the body is then short, or lacks its last chunk, so the
    /// client knows).
    async fn respond_streamed(
        &mut self,
        req: &Request,
        mut resp: Response,
        src: Source,
        keep: bool,
    ) -> bool {
        let mut src = src.filtered(&mut resp);
        // A length known beforehand (an application announced it) goes as is.
        let w = self.w.clone();
        // `chunked_transfer_encoding off`: close-delimited instead, as nginx. Trailer fields
        // need the chunked encoding: a known length is dropped for it, as nginx's chunked
        // filter does.
        let chunking =
            req.head.version == Version::Http11 && req.conf.core.chunked_transfer_encoding();
        let trailing = chunking && headers::sends_trailers(req, &resp);
        if trailing {
            resp.content_length = None;
        }
        let chunked = chunking && resp.content_length.is_none();
        resp.chunked = chunked;
        resp.length_unknown = !chunked && resp.content_length.is_none();
        let Some(mut encoder) = Compress::new(req, &resp) else {
            return false;
        };
        let delimited = !resp.length_unknown;
        let (keep, head_len, send_body) = self.head(req, &mut resp, keep && delimited);
        let mut pace = limit_rate::pace(req, &resp);
        let mut sent = 0u64;
        let mut whole = true;
        // A body-less answer (HEAD, 304) reads no further: the application's connection is
        // dropped, not kept.
        let mut more = send_body;
        // An application slow to its first byte (a long poll, an event stream, a report
        // being made): its head goes out at once, as nginx sends it, unless some of the body
        // is at hand to go in the same write.
        if more && src.may_pause() && !src.at_hand() && self.flush().await.is_err() {
            whole = false;
            more = false;
        }
        while more {
            let data = match src.next(&w, req).await {
                Ok(d) => d,
                Err(()) => {
                    whole = false;
                    break;
                }
            };
            more = data.is_some();
            let Some(piece) = encoder.piece(req, data, src.may_pause()) else {
                whole = false;
                break;
            };
            // `$body_bytes_sent` is what went out after the head, the chunks' framing too,
            // as nginx counts it.
            let framed = self.out.len();
            if !piece.is_empty() {
                if chunked {
                    gannet_proto::h1::encode::chunk_size(&mut self.out, piece.len());
                }
                self.out.extend_from_slice(&piece);
                if chunked {
                    self.out.extend_from_slice(b"\r\n");
                }
            }
            if !more && chunked {
                self.out.extend_from_slice(b"0\r\n");
                if trailing || headers::may_trail(req, &resp) {
                    for (n, v) in headers::trailers(req, &resp) {
                        for part in [n.as_bytes(), b": ", v.as_bytes(), b"\r\n"] {
                            self.out.extend_from_slice(part);
                        }
                    }
                }
                self.out.extend_from_slice(b"\r\n");
            }
            sent += (self.out.len() - framed) as u64;
            // An application may pause before its next piece: what it said goes out now,
            // unless more of it is at hand. A file's pieces come at once and are written in
            // FLUSH_AT batches. A buffered answer is read ahead while the client takes it.
            let due = (src.may_pause() && !src.at_hand()) || self.out.len() >= FLUSH_AT;
            if due
                && src
                    .alongside(&w, req, self.flush_paced(&mut pace))
                    .await
                    .is_err()
            {
                whole = false;
                break;
            }
        }
        let flushed = self.flush_paced(&mut pace).await.is_ok();
        if send_body && whole {
            src.finish(&self.w);
        }
        self.log(req, &resp, head_len, sent, whole && flushed);
        keep && whole && flushed
    }

    /// Send the 101 head, then relay between the client and the upstream server until both
    /// are done (see `conn::tunnel`). The connection closes after.
    async fn tunnel(&mut self, req: &Request, mut resp: Response, mut t: Tunnel) -> bool {
        let (_, head_len, _) = self.head(req, &mut resp, false);
        if self.flush().await.is_err() {
            return false;
        }
        // What the client sent after its request already belongs to the new protocol.
        let early = self.buf.split();
        let idle = req.conf.proxy.gw.read_timeout();
        let n = super::tunnel::relay(&mut self.stream, &mut t.conn, &early, &t.early, idle).await;
        self.log(req, &resp, head_len, n.to_client, true);
        false
    }

    /// Put the status line and headers in the output buffer. Returns whether the
    /// connection may stay open, the head's length, and whether a body follows.
    fn head(&mut self, req: &Request, resp: &mut Response, keep: bool) -> (bool, u64, bool) {
        let core = &req.conf.core;
        // The answer is written under the location's send_timeout, as nginx's.
        self.send_timeout = core.send_timeout();
        let (ka_timeout, ka_header) = core.keepalive_timeout();
        self.keepalive = Some(ka_timeout);
        let max_requests = core.keepalive_requests();
        let keep = keep
            && !resp.close
            && !ka_timeout.is_zero()
            && !self.w.draining.get()
            && (max_requests == 0 || self.info.requests < max_requests)
            // As of the request's start, whose time is at hand: no clock read per answer.
            && self.ka_time.holds(self.info.born, req.start, core.keepalive_time())
            && !core.keepalive_disabled(&req.head)
            // nginx's internal redirect passes through the server's settings on its way to
            // the new location, and a keep-alive they cancel stays cancelled.
            && !(req.internal && req.server.conf.core.keepalive_disabled(&req.head));
        if keep && !self.nodelay && core.tcp_nodelay() {
            self.nodelay = self.stream.set_nodelay();
        }
        if keep && !self.unsent_limited {
            self.unsent_limited = self.stream.limit_unsent();
        }
        self.bodiless = req.head.body == BodyKind::None;
        let body_len = resp.body.len();
        let send_body = !req.is_head() && resp.status_has_body();
        if !send_body && resp.status_has_body() && resp.content_length.is_none() {
            resp.content_length = Some(body_len);
        }
        if req.head.version == Version::Http09 {
            // HTTP/0.9: the body alone, ended by the connection's close (nginx's header
            // filter writes nothing for it).
            return (false, 0, send_body);
        }
        self.w.spare.take_write(&mut self.out);
        let head_start = self.out.len();
        let tokens = core.server_tokens();
        clock::with_date(|date| {
            let ctx = HeadCtx {
                hop: if keep {
                    Hop::KeepAlive(ka_header)
                } else {
                    Hop::Close
                },
                server_tokens: tokens,
                date,
            };
            encode_head(resp, body_len, &ctx, &mut self.out)
        });
        (keep, (self.out.len() - head_start) as u64, send_body)
    }

    /// Whether a body part of up to `COPY_MAX` bytes is copied after the head (see
    /// `COPY_ALWAYS`).
    fn copies(&self, keep: bool) -> bool {
        !keep || !self.buf.is_empty()
    }

    async fn send_body(
        &mut self,
        body: &Body,
        use_sendfile: bool,
        keep: bool,
    ) -> std::io::Result<()> {
        let Body::Parts(parts) = body else {
            return Ok(());
        };
        for p in parts {
            match p {
                Part::Bytes(b)
                    if b.len() <= COPY_ALWAYS || (b.len() <= COPY_MAX && self.copies(keep)) =>
                {
                    self.out.extend_from_slice(b)
                }
                Part::Bytes(b) => {
                    // Head (and anything queued) and the body in one writev.
                    let r = self
                        .stream
                        .write_pair(&self.out, b, self.send_timeout)
                        .await;
                    self.out.clear();
                    r?;
                }
                Part::File(f) => {
                    let pending = std::mem::take(&mut self.out);
                    let t = self.send_timeout;
                    let r = self.stream.send_file(&pending, f, use_sendfile, t).await;
                    self.out = pending;
                    self.out.clear();
                    r?;
                }
            }
        }
        Ok(())
    }

    /// `limit_rate`: the head, then the body, in the pieces the pace allows.
    async fn send_paced(
        &mut self,
        body: &Body,
        use_sendfile: bool,
        pace: &mut Pace,
    ) -> std::io::Result<()> {
        let Body::Parts(parts) = body else {
            return self.write_paced(pace).await;
        };
        for p in parts {
            match p {
                Part::Bytes(b) => {
                    self.out.extend_from_slice(b);
                    self.write_paced(pace).await?;
                }
                Part::File(f) => {
                    self.write_paced(pace).await?;
                    let end = f.offset + f.len;
                    let mut piece = f.clone();
                    while piece.offset < end {
                        piece.len = self.allowance(pace).await?.min(end - piece.offset);
                        let t = self.send_timeout;
                        self.stream.send_file(&[], &piece, use_sendfile, t).await?;
                        pace.wrote(piece.len);
                        piece.offset += piece.len;
                    }
                }
            }
        }
        self.write_paced(pace).await
    }

    /// How many bytes the pace allows now, waiting until some may; an error when the client
    /// closes meanwhile (as nginx's ngx_http_test_reading during a `limit_rate` delay: the
    /// connection ends then, not when the next write fails).
    async fn allowance(&mut self, pace: &mut Pace) -> std::io::Result<u64> {
        let allowance = std::pin::pin!(pace.allowance());
        let gone = std::pin::pin!(client_gone(
            &self.w.timers,
            &mut self.stream,
            &mut self.buf,
            false
        ));
        let mut race = (allowance, gone);
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(n) = std::future::Future::poll(race.0.as_mut(), cx) {
                return std::task::Poll::Ready(Ok(n));
            }
            std::future::Future::poll(race.1.as_mut(), cx)
                .map(|()| Err(std::io::Error::from(std::io::ErrorKind::ConnectionAborted)))
        })
        .await
    }

    /// Write the pending output in the pieces the pace allows.
    async fn write_paced(&mut self, pace: &mut Pace) -> std::io::Result<()> {
        let out = std::mem::take(&mut self.out);
        let mut rest = &out[..];
        let mut r = Ok(());
        while !rest.is_empty() && r.is_ok() {
            let n = match self.allowance(pace).await {
                Ok(n) => (n as usize).min(rest.len()),
                Err(e) => {
                    r = Err(e);
                    break;
                }
            };
            r = self.stream.write_all(&rest[..n], self.send_timeout).await;
            pace.wrote(n as u64);
            rest = &rest[n..];
        }
        self.out = out;
        self.out.clear();
        r
    }

    /// Write the pending output, paced when the answer has a `limit_rate`.
    async fn flush_paced(&mut self, pace: &mut Option<Pace>) -> std::io::Result<()> {
        match pace {
            None => self.flush().await,
            Some(p) => self.write_paced(p).await,
        }
    }

    /// The log phase: one line per configured access log.
    fn log(&self, req: &Request, resp: &Response, head_len: u64, body_len: u64, complete: bool) {
        super::log::access(&self.w, req, resp, head_len, body_len, complete);
    }
}

/// HTTP/1.x's part in the exchange: the connection itself (nothing allocated per request).
impl<S: Transport> Exchange for Conn<S> {
    const UPGRADES: bool = true;
    const DISCARDS_AFTER: bool = true;

    fn body_pending(&self, req: &Request, _: &Handled) -> bool {
        req.head.body != BodyKind::None
    }

    fn body_at_hand(&mut self, req: &Request) -> bool {
        let buffer = usize::try_from(req.conf.client_body.buffer_size()).unwrap_or(usize::MAX);
        body::arrived_whole(&mut self.stream, &mut self.buf, req.head.body, buffer)
    }

    async fn body_expected(&mut self, req: &Request, wanted: bool) -> bool {
        if wanted && req.head.expect_continue {
            self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        // Answers to earlier pipelined requests must not wait for this body.
        self.flush().await.is_ok()
    }

    async fn keep_body(&mut self, req: &mut Request, named: bool) -> Result<u64, Failed> {
        Conn::keep_body(self, req, named).await
    }

    async fn discard_body(&mut self, req: &Request) -> Result<u64, Failed> {
        let core = &req.conf.core;
        body::discard(
            &mut self.stream,
            &mut self.buf,
            req.head.body,
            core.client_max_body_size(),
            core.client_body_timeout(),
        )
        .await
        .map_err(Failed::Client)
    }

    async fn run_streaming(
        &mut self,
        w: &Rc<Worker>,
        req: &Request,
        how: Streamed,
    ) -> (Outcome, bool, u64) {
        Conn::run_streaming(self, w, req, how).await
    }

    async fn client_gone(&mut self, w: &Rc<Worker>, at_once: bool) {
        client_gone(&w.timers, &mut self.stream, &mut self.buf, at_once).await
    }

    async fn respond(&mut self, _: &Rc<Worker>, req: &Request, resp: Response, keep: bool) -> bool {
        Conn::respond(self, req, resp, keep).await
    }

    async fn flush_answer(&mut self) {
        // A failed write is the connection's to find on its next one.
        let _ = self.flush().await;
    }

    async fn respond_streamed(
        &mut self,
        _: &Rc<Worker>,
        req: &Request,
        resp: Response,
        src: Source,
        keep: bool,
    ) -> bool {
        Conn::respond_streamed(self, req, resp, src, keep).await
    }

    async fn upgrade(&mut self, _: &Rc<Worker>, req: &Request, resp: Response, t: Tunnel) -> bool {
        self.tunnel(req, resp, t).await
    }

    /// The connection closes: nothing to send first.
    fn reset(&mut self, _: Reset) {}

    fn plain_on_tls(&self) -> bool {
        self.plain_on_tls
    }
}

/// Ends when the client has closed its connection (or it failed). Bytes that come instead
/// are a pipelined request, kept in `buf` for later: the client is there, and nothing more
/// is watched (nginx peeks at one byte and stops watching too).
///
/// A connection not in the event loop yet (a new one whose request was read at once) is
/// watched only once the exchange has lasted a `TICK` (250 to 500 ms, the worker's
/// deadlines being swept every `TICK`): watching it at once would register it, an
/// `epoll_ctl` ADD now and a DEL at its close - two system calls per proxied request on a
/// new connection, for an exchange that is over in a millisecond most of the time. A
/// client that leaves sooner is noticed then - unless `at_once` (a request holding a
/// `limit_conn` count, whose release a next request may be waiting for).
async fn client_gone<S: Transport>(
    timers: &ReadTimers,
    stream: &mut S,
    buf: &mut BytesMut,
    at_once: bool,
) {
    if !stream.in_loop() && !at_once {
        let tick = timers.hold(Instant::now() + TICK, false);
        std::future::poll_fn(|cx| timers.poll(tick.key, cx)).await;
    }
    loop {
        if !std::future::poll_fn(|cx| stream.poll_readable(cx)).await {
            return;
        }
        buf.reserve(1024);
        match stream.read_some(buf) {
            Ok(0) => return,
            Ok(_) => std::future::pending::<()>().await,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::handler;

    // The size of the future an async fn returns, read from its type without calling it.
    fn size2<A, B, R>(_: impl FnOnce(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }
    fn size3<A, B, C, R>(_: impl FnOnce(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }
    fn size4<A, B, C, D, R>(_: impl FnOnce(A, B, C, D) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every request in progress holds its future in a heap block (`conn::reuse`), as large
    /// as the largest state any request may reach: the rare branches are boxed where taken
    /// so that it stays small (see `exchange::serve`).
    #[test]
    fn a_request_future_stays_small() {
        let request = size2(Conn::<Plain>::request);
        let parts = [
            ("exchange::serve", size3(exchange::serve::<Conn<Plain>>)),
            ("Conn::respond", size4(Conn::<Plain>::respond)),
            ("Conn::send_body", size4(Conn::<Plain>::send_body)),
            ("gateway::run", size2(super::super::gateway::run)),
            ("handler::settle", size3(handler::settle)),
        ];
        eprintln!("Conn::request: {request} bytes; {parts:?}");
        // About 8 KiB in a debug build today (8,224 bytes at e330431), most of it the
        // gateway's exchange (5.9 KiB, the proxy's hot path, inline); the rest of the rare
        // branches are boxed. The bound leaves room for small changes, not for a new state.
        assert!(request <= 9 * 1024, "{request} bytes");
    }
}
