//! HTTP/2 connections: ALPN `h2` on TLS addresses, and prior-knowledge h2c on cleartext
//! ones (the HTTP/1.x loop hands over a connection that opens with the HTTP/2 preface).
//! The `h2` crate does the framing, HPACK, flow control and the protocol's abuse limits;
//! each stream is a local task that runs the same exchange as HTTP/1.x (`conn::exchange`,
//! through `H2Exchange`) and answers through `conn::h2_response`. A request body is read whole before it goes to an application,
//! but with `*_request_buffering off`, where it is passed on as its DATA frames come (each
//! frame's window given back once it is taken, so the client sends no faster than the
//! upstream reads); a body nobody wants is read off before the answer, or after it when
//! the client waits for 100-continue; `mirror` copies each request as HTTP/1.x does.
//!
//! Limits, with nginx's names: `http2_max_concurrent_streams` (128), `http2_body_preread_size`
//! (a stream's initial window, 64k), `http2_chunk_size` (16k per DATA frame), the header
//! list cap (`http2_max_field_size`, else `large_client_header_buffers`' total),
//! `keepalive_requests` streams per connection, `keepalive_timeout` without streams,
//! `client_body_timeout` / `send_timeout` per body read / window wait. The h2 crate closes
//! connections that reset streams in bulk (rapid reset), send endless CONTINUATION frames
//! or oversized header blocks, with GOAWAY; `conn::h2_flood` ends PING / SETTINGS / empty
//! frame floods. Stream priority is nginx's (`conn::h2_priority`, fed by the mend): streams
//! woken by one window update queue their DATA by the client's dependency tree.

use super::body::{BodyError, BodySource};
use super::exchange::{self, Exchange, Reset};
use super::gateway::{Outcome, Tunnel};
use super::grpc::Served;
use super::h2_flood::{Flood, FloodGuard};
use super::h2_goaway::{self, GoawayWriter, Guard, Wire};
use super::h2_linger::{Linger, Lingering, Mode};
use super::h2_mend::{Fault, HpackMend, Refused, CONTENT_LENGTH_ALIAS};
use super::h2_priority::{self, Priorities};
use super::h2_response;
use super::h2_window::{self, Windows};
use super::request_body::Failed;
use super::source::Source;
use super::ConnInfo;
use crate::errlog::{self, Level};
use crate::http::flow::Handled;
use crate::http::request::Request;
use crate::http::response::Response;
use crate::modules::gateway::Streamed;
use crate::modules::LocConf;
use crate::runtime::worker::Worker;
use bytes::{Bytes, BytesMut};
use gannet_proto::h1::{BodyKind, ParseError, RequestHead};
use gannet_proto::uri::parse_target_with;
use h2::server::SendResponse;
use h2::RecvStream;
use std::cell::Cell;
use std::future::Future;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Notify;

/// The connection's receive window: the most HTTP/2 allows, as nginx's.
const CONN_WINDOW: u32 = (1 << 31) - 1;

/// HTTP/2's initial stream window until SETTINGS say otherwise (RFC 9113 6.9.2).
const DEFAULT_WINDOW: u32 = 65_535;

/// A connection's streams in flight, and when the last one ended.
struct Activity {
    streams: Cell<usize>,
    last: Cell<Instant>,
    /// Woken when the last stream in flight ends.
    idle: Notify,
}

/// Held by a stream's task: counts it in, and out when the task ends.
struct InFlight(Rc<Activity>);

impl InFlight {
    fn new(a: &Rc<Activity>) -> InFlight {
        a.streams.set(a.streams.get() + 1);
        InFlight(a.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.streams.set(self.0.streams.get() - 1);
        self.0.last.set(Instant::now());
        if self.0.streams.get() == 0 {
            self.0.idle.notify_one();
        }
    }
}

/// Serve an HTTP/2 connection until it closes; `conf` holds the connection-level
/// settings (the server SNI chose, or the address's default server).
pub async fn serve<IO>(w: Rc<Worker>, io: IO, info: ConnInfo, group: usize, conf: Arc<LocConf>)
where
    IO: AsyncRead + AsyncWrite + AsRawFd + Unpin + 'static,
{
    let core = &conf.core;
    let h2c = &conf.http2;
    let (n, size) = core.large_client_header_buffers();
    let header_cap = h2c
        .max_header_size()
        .unwrap_or(u32::try_from(n * size).unwrap_or(u32::MAX));
    // nginx's limit on a request's names and values (checked on each as it is taken); the
    // codec's own cap, which counts 32 more a field, leaves room for that.
    let header_limit = header_cap as usize;
    let codec_cap = h2_goaway::codec_header_cap(header_cap, core.max_headers());
    let max_frame = header_cap
        .max(h2c.body_preread_size().saturating_mul(2))
        .clamp(16 * 1024, (1 << 24) - 1);
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(h2c.max_concurrent_streams())
        .initial_window_size(h2c.body_preread_size())
        // As nginx, the connection's receive window is opened to the largest at once (a
        // WINDOW_UPDATE right after SETTINGS, which clients such as nginx's tests wait
        // for): what a client may send unread is bounded by each stream's window.
        .initial_connection_window_size(CONN_WINDOW)
        .max_header_list_size(codec_cap)
        // nginx takes frames of any size (it offers 2^24-1): a client may send its whole
        // header block in one HEADERS frame, or its body in one DATA frame past the
        // stream's first window (nginx's tests send 66,000 bytes against 64k), which nginx
        // takes when the body is read whole at once. Up to the larger of the header cap and
        // twice that window here: the codec holds a frame whole before it judges it, but
        // `conn::h2_mend` never gives it DATA past a stream's window, cutting a longer frame
        // (`conn::h2_window`); a frame over this is still the codec's FRAME_SIZE_ERROR.
        .max_frame_size(max_frame)
        // Room for four frames of 16k (the largest a client takes unless it says more) per
        // stream: what one wait for window capacity may queue (`conn::h2_response`).
        .max_send_buffer_size(4 * 16 * 1024)
        // Frames on a stream gannet reset are ignored this long: the rest of a header block
        // that came too late (`conn::h2_goaway`) is decoded and dropped, as nginx's.
        .reset_stream_duration(RESET_MEMORY);
    let flood = Rc::new(Flood::default());
    let linger = Rc::new(Linger::new(io.as_raw_fd()));
    let io = FloodGuard::new(
        Lingering::new(io, linger.clone()),
        flood.clone(),
        PREFACE.len(),
    );
    let Some(io) = preface(io, core.client_header_timeout(), &info).await else {
        w.connection_closed();
        return;
    };
    // A client's over-long Huffman padding is taken, and the fields nginx answers 400 are
    // noted (`conn::h2_mend`; after the preface, which `Prefixed` gives again).
    let refused = Rc::new(Refused::default());
    refused
        .early_bodies_refused
        .set(h2c.body_preread_size() < DEFAULT_WINDOW);
    let prio = Rc::new(Priorities::default());
    // Connection errors, GOAWAY frames and late header blocks as nginx's (`conn::h2_goaway`).
    let wire = Rc::new(Wire::default());
    let guard = Guard::new(wire.clone(), core.client_header_timeout(), size);
    // Request bodies' windows as nginx keeps them (`conn::h2_window`).
    let windows = Rc::new(Windows::new(h2c.body_preread_size(), max_frame));
    let io = HpackMend::new(io, PREFACE.len(), Some(refused.clone()))
        .with_priorities(prio.clone())
        .with_windows(windows.clone())
        .guarded(guard);
    let io = GoawayWriter::new(io, wire.clone()).with_windows(windows.clone());
    let handshake = builder.handshake::<_, Bytes>(io);
    let mut conn = match tokio::time::timeout(core.client_header_timeout(), handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            log_conn(&info, format_args!("HTTP/2 handshake failed: {e}"));
            w.connection_closed();
            return;
        }
        Err(_) => {
            w.connection_closed();
            return;
        }
    };
    let (keepalive, _) = core.keepalive_timeout();
    let max_requests = core.keepalive_requests();
    let activity = Rc::new(Activity {
        streams: Cell::new(0),
        last: Cell::new(Instant::now()),
        idle: Notify::new(),
    });
    let mut requests = 0u64;
    // Since when the connection has been ending gracefully (GOAWAY sent).
    let mut closing: Option<Instant> = None;
    // The worker is stopping or reloading: the connection ends as soon as it is quiet.
    let mut stopping = false;
    // Once the codec is told to end the connection at once (a flood, a stop): when to stop
    // waiting for it to write its last frames and close.
    let mut cut_off: Option<tokio::time::Instant> = None;
    loop {
        // A graceful stop or reload, noticed as it begins (`drain_started`, or here for a
        // connection that was not waiting then): as nginx at exit, a connection without
        // streams ends now, one with streams is told GOAWAY and ends when they are done.
        if w.draining.get() && !stopping {
            stopping = true;
            linger.set(Mode::UntilDelivered);
            if closing.is_none() && !quiet(&conn, &activity) {
                conn.graceful_shutdown();
                closing = Some(Instant::now());
            }
        }
        // Without streams the connection may idle for keepalive_timeout, or, once it is
        // ending, LINGER for the client to close; with streams it waits for them (woken
        // when the last ends).
        // With keepalive_timeout 0 a connection still has client_header_timeout for its
        // first request (nginx's read timer from ngx_http_v2_init), which then ends it.
        let idle_limit = if requests == 0 && keepalive.is_zero() {
            core.client_header_timeout()
        } else {
            keepalive
        };
        let wait = match closing {
            // (Once cut off, `cut_off` bounds the end.)
            _ if activity.streams.get() > 0 || cut_off.is_some() => None,
            None => Some(idle_limit.saturating_sub(activity.last.get().elapsed())),
            Some(since) => Some(LINGER.saturating_sub(since.elapsed())),
        };
        // Stopping, its streams done, with frames the client does not take: dropped once
        // the socket has taken nothing for send_timeout, as nginx's send timer ends it.
        let stall = match linger.stall_left(core.send_timeout()) {
            Some(left) if stopping && activity.streams.get() == 0 => Some(left),
            _ => None,
        };
        if stall == Some(Duration::ZERO) {
            log_conn(
                &info,
                format_args!("client timed out while the connection ended"),
            );
            break;
        }
        let wait = match (wait, stall) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Stopping, the connection ends once quiet: looked at after each turn of the codec.
        let watch = stopping && cut_off.is_none();
        let next = tokio::select! {
            r = accept_unless_quiet(&mut conn, watch.then_some(&*activity)) => match r {
                Some(r) => Some(r),
                None => {
                    // Every stream's frames are with the codec, and no stream is left to
                    // answer: the codec writes them and a GOAWAY (our first, or the same
                    // again), shuts our side, and the close lingers until the client has
                    // them all (`conn::h2_linger`).
                    conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                    closing.get_or_insert_with(Instant::now);
                    cut_off = Some(tokio::time::Instant::now() + LINGER);
                    continue;
                }
            },
            () = sleep_or_never(wait) => None,
            () = w.drain_started.notified(), if !stopping => continue,
            () = activity.idle.notified() => continue,
            () = flood.alarm.notified(), if cut_off.is_none() => {
                log_conn(&info, format_args!("client flooded the HTTP/2 connection with control frames"));
                linger.set(Mode::UntilClosed);
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                closing.get_or_insert_with(Instant::now);
                cut_off = Some(tokio::time::Instant::now() + LINGER);
                continue;
            }
            () = sleep_until_or_never(cut_off) => break,
        };
        match next {
            Some(Some(Ok((req, respond)))) => {
                if h2_goaway::header_list_len(&req) > header_limit {
                    // As nginx: the connection ends (GOAWAY ENHANCE_YOUR_CALM, this stream
                    // the last).
                    log_conn(&info, format_args!("client sent too large header"));
                    conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                    closing.get_or_insert_with(Instant::now);
                    cut_off = Some(tokio::time::Instant::now() + LINGER);
                    continue;
                }
                requests += 1;
                let aged = info.born.elapsed() > core.keepalive_time();
                let mut info = info.clone();
                info.requests = requests;
                let guard = InFlight::new(&activity);
                let id = u32::from(respond.stream_id());
                let noted = (refused.take(id), refused.block_len(id));
                let run = stream(w.clone(), info, group, req, respond, guard, noted);
                let run = h2_window::watch(windows.clone(), id, run);
                tokio::task::spawn_local(h2_priority::scope(prio.clone(), id, run));
                // As nginx, the stream that reaches a limit is the last (the GOAWAY names it).
                let spent = max_requests > 0 && requests >= max_requests;
                if (spent || aged || keepalive.is_zero() || stopping) && closing.is_none() {
                    conn.graceful_shutdown();
                    closing = Some(Instant::now());
                }
            }
            Some(Some(Err(e))) => {
                // A protocol error (ours to note); a client that went away is not.
                if !e.is_io() {
                    log_conn(&info, format_args!("HTTP/2 connection closed: {e}"));
                }
                break;
            }
            Some(None) => break,
            None => match closing {
                // Ended gracefully, streams done, and the client still has not closed (the
                // codec waits for its answer to a PING): it is closed for it.
                Some(since) => {
                    if activity.streams.get() == 0 && since.elapsed() >= LINGER {
                        break;
                    }
                }
                None => {
                    let idle =
                        activity.streams.get() == 0 && activity.last.get().elapsed() >= idle_limit;
                    if idle {
                        conn.graceful_shutdown();
                        closing = Some(Instant::now());
                    }
                }
            },
        }
    }
    w.connection_closed();
}

/// How long frames on a stream gannet reset are ignored (the h2 crate's default is 1 s).
const RESET_MEMORY: Duration = Duration::from_secs(30);

/// How long a connection that was sent GOAWAY (with no streams left) gets to close before
/// it is dropped.
const LINGER: Duration = Duration::from_secs(5);

/// The codec's turn: a request, or `None` inside when the connection closed. With `watch`,
/// `None` as soon as a turn leaves the connection [`quiet`] (`poll_accept`, which `accept`
/// is made of, gives the moment between turns).
async fn accept_unless_quiet<T>(
    conn: &mut h2::server::Connection<T, Bytes>,
    watch: Option<&Activity>,
) -> Option<Option<Result<(http::Request<RecvStream>, SendResponse<Bytes>), h2::Error>>>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    std::future::poll_fn(|cx| match conn.poll_accept(cx) {
        Poll::Pending if watch.is_some_and(|a| quiet(conn, a)) => Poll::Ready(None),
        p => p.map(Some),
    })
    .await
}

/// No stream left to answer, and none of their frames waiting: the h2 crate counts a
/// stream until it is closed both ways with its last frame (END_STREAM, RST_STREAM) moved
/// from the stream's queue to the codec's write buffer, which its shutdown writes out
/// before our side is shut. (Our own count of streams in flight says only that each
/// stream's task has handed its answer to the codec.)
fn quiet<T>(conn: &h2::server::Connection<T, Bytes>, a: &Activity) -> bool
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    a.streams.get() == 0 && !conn.has_streams()
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_or_never(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The client connection preface (RFC 9113 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the server says to a client whose preface is wrong, as nginx does: its own
/// preface (an empty SETTINGS frame), then GOAWAY with PROTOCOL_ERROR and no stream
/// processed (RFC 9113 3.4: an invalid preface is a connection error of that type).
const REFUSE_PREFACE: [u8; 26] = [
    0, 0, 0, 0x4, 0, 0, 0, 0, 0, // SETTINGS, empty
    0, 0, 8, 0x7, 0, 0, 0, 0, 0, // GOAWAY, 8 bytes
    0, 0, 0, 0, // last stream: none
    0, 0, 0, 0x1, // PROTOCOL_ERROR
];

/// Read and check the client's preface before the codec starts. Anything else ends the
/// connection, cleanly: a preface that goes wrong is answered GOAWAY (PROTOCOL_ERROR) as
/// soon as a byte differs, our side is shut, and what the client sent is read off for a
/// moment (closing with unread input would reset the connection, and the client might not
/// see the end). A client that says nothing within `timeout` is closed.
async fn preface<IO>(mut io: IO, timeout: Duration, info: &ConnInfo) -> Option<Prefixed<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut got = [0u8; 24];
    let mut n = 0;
    let mut wrong = false;
    while n < got.len() {
        match tokio::time::timeout_at(deadline, io.read(&mut got[n..])).await {
            Ok(Ok(k)) if k > 0 => n += k,
            _ => break,
        }
        if got[..n] != PREFACE[..n] {
            wrong = true;
            break;
        }
    }
    if n == PREFACE.len() && !wrong {
        return Some(Prefixed::new(BytesMut::from(&got[..]), io));
    }
    if wrong {
        log_conn(info, format_args!("invalid connection preface"));
        let _ = tokio::time::timeout(LINGER, io.write_all(&REFUSE_PREFACE)).await;
    }
    let _ = io.shutdown().await;
    let mut sink = [0u8; 4096];
    let linger = async {
        let mut left: usize = 64 * 1024;
        while left > 0 {
            match io.read(&mut sink).await {
                Ok(n) if n > 0 => left = left.saturating_sub(n),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), linger).await;
    None
}

fn log_conn(info: &ConnInfo, what: std::fmt::Arguments) {
    errlog::log(
        Level::Info,
        format_args!(
            "*{} {what}, client: {}, server: {}",
            info.id,
            info.peer.ip(),
            info.local
        ),
    );
}

/// One stream: the request through the pipeline, the answer back.
async fn stream(
    w: Rc<Worker>,
    info: ConnInfo,
    group: usize,
    req: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    _in_flight: InFlight,
    noted: (Option<Fault>, Option<u32>),
) {
    let (parts, mut recv) = req.into_parts();
    w.stats.request();
    crate::modules::metrics::h2_stream();
    let writing = w.stats.writing();
    let (timeout, late) = answer(&w, info, group, parts, &mut recv, &mut respond, noted).await;
    // A body that stopped coming for client_body_timeout: the stream is reset at once with
    // PROTOCOL_ERROR, as nginx's (it finalizes the request with 408, which closes the stream
    // so). A body not read to its end otherwise (not wanted, too large): it is read off for
    // a while so the client sees the answer and the stream ends cleanly. Past that, the
    // client is told to stop (RST_STREAM NO_ERROR, RFC 9113 8.1), which may cost it the
    // answer. Dropped unread, the stream would be cancelled at once.
    if late {
        respond.send_reset(h2::Reason::PROTOCOL_ERROR);
    } else if !recv.is_end_stream() && read_body(&mut recv, DISCARD_MAX, timeout).await.is_err() {
        respond.send_reset(h2::Reason::NO_ERROR);
    }
    drop(writing);
}

/// The most of an unwanted body read off after the answer before the stream is stopped.
const DISCARD_MAX: u64 = 1024 * 1024;

/// The request through the pipeline, and its answer. Returns the `client_body_timeout` in
/// force, and whether the body stopped coming for that long. `noted` by `conn::h2_mend`: a field nginx refuses came with it (400) or the method
/// was CONNECT (405; the codec was given OPTIONS), and the header block's length
/// (`$request_length`).
async fn answer(
    w: &Rc<Worker>,
    info: ConnInfo,
    group: usize,
    parts: http::request::Parts,
    recv: &mut RecvStream,
    respond: &mut SendResponse<Bytes>,
    (fault, head_len): (Option<Fault>, Option<u32>),
) -> (Duration, bool) {
    let g = &w.config.listens[group];
    let default = g.servers[g.default].clone();
    let timeout = default.conf.core.client_body_timeout();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    // Content-Length comes under `h2_mend`'s alias (the codec would reset the stream where
    // nginx answers 400): taken back here, and checked against the body by `H2Body`.
    let fields = parts.headers.iter().map(|(n, v)| match n.as_str() {
        CONTENT_LENGTH_ALIAS => ("content-length", v.as_bytes()),
        n => (n, v.as_bytes()),
    });
    let authority = parts.uri.authority().map(|a| a.as_str());
    // nginx's ngx_http_v2_parse_method: upper-case letters, `_` and `-` only (the codec
    // takes any token).
    if fault == Some(Fault::Unacked) {
        // nginx: "client sent stream with data before settings were acknowledged".
        respond.send_reset(h2::Reason::REFUSED_STREAM);
        return (timeout, false);
    }
    let method = match fault {
        Some(Fault::Connect) => "CONNECT",
        _ => parts.method.as_str(),
    };
    let method_ok = gannet_proto::h1::parse::lawful_method(method.as_bytes());
    let parsed = match (fault == Some(Fault::Invalid), method_ok) {
        (true, _) => Err(ParseError::BadRequest("client sent invalid header")),
        (false, false) => Err(ParseError::BadRequest("client sent invalid method")),
        (false, true) => RequestHead::from_fields(
            method,
            target,
            authority,
            fields,
            !recv.is_end_stream(),
            default.conf.core.header_names(),
        ),
    }
    .and_then(|head| ended_early(head, recv.is_end_stream()))
    .and_then(|head| {
        parse_target_with(head.target(), default.conf.core.merge_slashes()).map(|t| (head, t))
    });
    let (head, target) = match parsed {
        Ok(p) => p,
        Err(e) => {
            let line = format!("{method} {target} HTTP/2.0");
            let head = RequestHead::unparsed(Bytes::from(line), false);
            let host = default.primary_name.clone();
            let mut req = Request::new(head, info, default.clone(), String::new(), None, host);
            req.wire_head_len = head_len;
            // Through the server's error_page, as nginx finalizes it (a `return 444`
            // there resets the stream).
            let mut ex = H2Exchange {
                recv,
                respond,
                late: false,
            };
            exchange::refuse(&mut ex, w, &mut req, exchange::refusal_status(&e)).await;
            return (timeout, ex.late);
        }
    };
    let mut req = exchange::request(g, head, target, info, String::new());
    req.log_ignored_headers();
    req.wire_head_len = head_len;
    let mut ex = H2Exchange {
        recv,
        respond,
        late: false,
    };
    exchange::serve(&mut ex, w, &mut req).await;
    (req.conf.core.client_body_timeout(), ex.late)
}

/// A stream ended with its HEADERS that announced a body (nginx: 400, "client prematurely
/// closed stream").
fn ended_early(head: RequestHead, ended: bool) -> Result<RequestHead, ParseError> {
    match head.body {
        BodyKind::Length(n) if ended && n > 0 => {
            Err(ParseError::BadRequest("client prematurely closed stream"))
        }
        _ => Ok(head),
    }
}

/// HTTP/2's part in the exchange: a stream's body as its DATA frames come, its answer
/// through `conn::h2_response`.
struct H2Exchange<'a> {
    recv: &'a mut RecvStream,
    respond: &'a mut SendResponse<Bytes>,
    /// The body stopped coming for client_body_timeout.
    late: bool,
}

impl Exchange for H2Exchange<'_> {
    const UPGRADES: bool = false;
    const GRPC: bool = true;

    fn body_pending(&self, req: &Request, handled: &Handled) -> bool {
        !self.recv.is_end_stream() && !exchange::declared_empty(req, handled)
    }

    fn body_at_hand(&mut self, _: &Request) -> bool {
        self.recv.is_end_stream()
    }

    /// Nothing to say before a body: HTTP/2 has no interim answer to pipelined requests,
    /// and a client waiting for 100-continue sends the body once its window is there.
    async fn body_expected(&mut self, _: &Request, _: bool) -> bool {
        true
    }

    async fn keep_body(&mut self, req: &mut Request, named: bool) -> Result<u64, Failed> {
        // Kept for the application the way HTTP/1.x keeps it (memory, else a file); as
        // nginx, the stream's window is opened for it (`conn::h2_window`).
        h2_window::open_body();
        let mut src = H2Body::new(self.recv, req);
        let kept = super::request_body::read(&mut src, req, named).await;
        self.late |= src.late;
        let kept = kept?;
        let n = kept.len();
        req.body = Some(Rc::new(kept));
        Ok(n)
    }

    async fn discard_body(&mut self, req: &Request) -> Result<u64, Failed> {
        let core = &req.conf.core;
        let limit = core.client_max_body_size();
        read_body(self.recv, limit, core.client_body_timeout())
            .await
            .map_err(Failed::Client)
    }

    async fn run_streaming(
        &mut self,
        w: &Rc<Worker>,
        req: &Request,
        how: Streamed,
    ) -> (Outcome, bool, u64) {
        let mut src = H2Body::new(self.recv, req);
        let o = super::gateway::run_streaming(w, req, &mut src, how).await;
        self.late |= src.late;
        // (A body not read to its end is read off by `stream`, after the answer.)
        (o, true, src.total)
    }

    async fn client_gone(&mut self, _: &Rc<Worker>, _: bool) {
        let _ = std::future::poll_fn(|cx| self.respond.poll_reset(cx)).await;
    }

    async fn respond(&mut self, w: &Rc<Worker>, req: &Request, resp: Response, _: bool) -> bool {
        h2_response::send(w, req, resp, None, self.respond).await;
        false
    }

    async fn respond_streamed(
        &mut self,
        w: &Rc<Worker>,
        req: &Request,
        resp: Response,
        src: Source,
        _: bool,
    ) -> bool {
        h2_response::send(w, req, resp, Some(src), self.respond).await;
        false
    }

    async fn upgrade(&mut self, _: &Rc<Worker>, _: &Request, _: Response, _: Tunnel) -> bool {
        false
    }

    fn reset(&mut self, why: Reset) {
        self.respond.send_reset(match why {
            Reset::Cancel => h2::Reason::CANCEL,
            Reset::Internal => h2::Reason::INTERNAL_ERROR,
        });
    }

    async fn grpc(&mut self, w: &Rc<Worker>, req: &mut Request) -> Served {
        super::grpc::serve_h2(w, req, self.recv, self.respond).await
    }
}

/// Read a request body nobody wants and drop it, giving the window back as it is read.
/// `limit` 0 means no limit.
async fn read_body(recv: &mut RecvStream, limit: u64, timeout: Duration) -> Result<u64, BodyError> {
    // DATA past the window is taken and dropped too (`conn::h2_window`).
    h2_window::drain_body();
    let mut body = H2Body {
        recv,
        limit,
        timeout,
        total: 0,
        late: false,
        declared: None,
    };
    while body.next().await?.is_some() {}
    Ok(body.total)
}

/// A stream's request body, DATA frame by DATA frame, within `client_max_body_size` (`limit`,
/// 0 for none) and `client_body_timeout` per frame.
struct H2Body<'a> {
    recv: &'a mut RecvStream,
    limit: u64,
    timeout: Duration,
    total: u64,
    /// Nothing came for `timeout`.
    late: bool,
    /// The Content-Length the request announced: the DATA must add up to it, else nginx
    /// answers 400 ("client intended to send body data larger than declared", "client
    /// prematurely closed stream"). Not checked on a body read off unwanted (nginx skips
    /// its DATA unread).
    declared: Option<u64>,
}

impl<'a> H2Body<'a> {
    fn new(recv: &'a mut RecvStream, req: &Request) -> H2Body<'a> {
        let core = &req.conf.core;
        H2Body {
            recv,
            limit: core.client_max_body_size(),
            timeout: core.client_body_timeout(),
            total: 0,
            late: false,
            declared: match req.head.body {
                BodyKind::Length(n) => Some(n),
                _ => None,
            },
        }
    }

    /// The next piece, its window given back; `Ok(None)` at the end. Empty DATA frames are
    /// skipped: upstream, an empty piece would read as the body's end (an empty chunk or
    /// STDIN record).
    async fn next(&mut self) -> Result<Option<Bytes>, BodyError> {
        loop {
            let chunk = match tokio::time::timeout(self.timeout, self.recv.data()).await {
                Ok(Some(Ok(c))) => c,
                // The data is over; trailers, if any, end the stream (they are read and
                // dropped: nothing in gannet reads trailers).
                Ok(None) => {
                    return match tokio::time::timeout(self.timeout, self.recv.trailers()).await {
                        Ok(Ok(_)) if self.declared.is_some_and(|n| n != self.total) => {
                            Err(BodyError::Malformed)
                        }
                        Ok(Ok(_)) => Ok(None),
                        _ => Err(BodyError::Io),
                    }
                }
                Ok(Some(Err(_))) => return Err(BodyError::Io),
                Err(_) => {
                    self.late = true;
                    return Err(BodyError::Io);
                }
            };
            self.total += chunk.len() as u64;
            // As nginx, DATA past the Content-Length, or a last DATA frame that leaves the
            // body short, is refused before it goes anywhere.
            let (total, ended) = (self.total, self.recv.is_end_stream());
            if self
                .declared
                .is_some_and(|n| total > n || (ended && total < n))
            {
                let _ = self.recv.flow_control().release_capacity(chunk.len());
                return Err(BodyError::Malformed);
            }
            if self.limit > 0 && self.total > self.limit {
                return Err(BodyError::TooLarge);
            }
            let _ = self.recv.flow_control().release_capacity(chunk.len());
            if !chunk.is_empty() {
                return Ok(Some(chunk));
            }
        }
    }
}

impl BodySource for H2Body<'_> {
    fn next_piece(
        &mut self,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Bytes>, BodyError>> + '_>> {
        Box::pin(self.next())
    }
}

/// A socket whose first bytes were already read (the HTTP/1.x loop read the start of the
/// HTTP/2 preface before it knew): they are read again first.
pub struct Prefixed<IO> {
    head: BytesMut,
    io: IO,
}

impl<IO> Prefixed<IO> {
    pub fn new(head: BytesMut, io: IO) -> Prefixed<IO> {
        Prefixed { head, io }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.remaining());
            let piece = self.head.split_to(n);
            buf.put_slice(&piece);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    writes_through!();
}

impl<IO: AsRawFd> AsRawFd for Prefixed<IO> {
    fn as_raw_fd(&self) -> RawFd {
        self.io.as_raw_fd()
    }
}
