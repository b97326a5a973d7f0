//! The exchange with a gRPC server, the I/O side of `grpc_pass` (`modules::grpc`): HTTP/2
//! to the upstream over the `h2` crate's client, with prior knowledge on a plain connection
//! (`grpc://`) or after a TLS handshake offering ALPN `h2` (`grpcs://`).
//!
//! The upstream group, balancing, `grpc_next_upstream`, timeouts, the error-log lines and
//! the `$upstream_*` records are the gateway's (`conn::gateway`); only the wire differs.
//! Connections are `conn::h2_upstream`'s, shared with `proxy_http_version 2`: with
//! `keepalive N` in the group, one per server and worker, kept and multiplexed (each request
//! a stream on it); without, each request has a connection of its own, closed with its
//! stream.
//!
//! Both directions stream, as nginx's `request_body_no_buffering` does for gRPC: the
//! client's DATA frames go upstream as they arrive (its trailers too), while the answer's
//! head, DATA frames and trailers (`grpc-status`, `grpc-message`) go back as they come, so
//! client-, server- and bidirectional streaming calls work. A client that resets its stream
//! (a cancelled call) makes gannet reset the upstream stream (CANCEL); an upstream reset
//! after the head resets the client's stream with the same reason. Before the head, a
//! failure is nginx's status: 502 for an unreachable or broken upstream, 504 for a timeout
//! (a gRPC client reads 502 as UNAVAILABLE).
//!
//! HTTP/1.x clients get the same exchange with their body read whole and the answer sent
//! whole (its trailers are dropped: HTTP/1.x answers carry none).

use super::gateway::{self as gw, Failure, Via, READING, READING_HEAD};
use super::h2_response::{self, Out};
use super::h2_upstream::{self as h2u, Head};
use super::request_body::RequestBody;
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::handler;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use crate::modules::gateway::{Backend, Proto};
use crate::runtime::worker::Worker;
use crate::upstream::{Addr, Key, Lease, Pick, Tried, Upstream};
use bytes::{Bytes, BytesMut};
use h2::client::ResponseFuture;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Whether the location passes its requests to a gRPC server.
pub fn is_grpc(req: &Request) -> bool {
    req.conf.grpc.gw.pass.is_some()
}

/// Client headers never passed on: hop-by-hop ones, HTTP/2's forbidden ones and the
/// framing (nginx's `grpc_set_header` defaults clear them).
const HOP: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "expect",
    "upgrade",
    "transfer-encoding",
    "content-length",
];

/// The request's head: `:path` as the proxy sends its URI, `:authority` from
/// `grpc_set_header Host` or the URL, the client's headers and the `grpc_set_header` ones
/// (an empty value sends nothing), and `TE: trailers` when the client sent it.
fn build_head(req: &Request, dest: &crate::modules::proxy::Dest) -> Result<Head, String> {
    let c = &req.conf.grpc;
    let set = c.set_headers.as_deref().map_or(&[][..], |v| v.as_slice());
    let is_set = |name: &str| set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let mut path = Vec::with_capacity(64);
    crate::modules::proxy::upstream_uri(req, dest, false, &mut path);
    let host = set
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("host"))
        .map(|(_, v)| v.eval(req, None))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| dest.host.clone());
    let scheme = if dest.tls { "https" } else { "http" };
    let uri = format!("{scheme}://{host}{}", String::from_utf8_lossy(&path));
    let uri = http::Uri::try_from(uri).map_err(|e| format!("invalid upstream URI: {e}"))?;
    let method = http::Method::from_bytes(req.head.method_str().as_bytes())
        .map_err(|e| format!("invalid method: {e}"))?;
    let mut headers = http::HeaderMap::new();
    let mut put = |n: &str, v: &[u8]| {
        // A name or value HTTP/2 cannot carry is left out.
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(n.as_bytes()),
            http::HeaderValue::from_bytes(v),
        ) {
            headers.append(n, v);
        }
    };
    let trailers = req.head.header_all("te").any(|v| {
        String::from_utf8_lossy(v)
            .to_ascii_lowercase()
            .contains("trailers")
    });
    if trailers && !is_set("te") {
        put("te", b"trailers");
    }
    for (name, value) in set {
        if name.eq_ignore_ascii_case("host") {
            continue;
        }
        let v = value.eval(req, None);
        if !v.is_empty() {
            put(name, v.as_bytes());
        }
    }
    if req.conf.grpc.gw.pass_request_headers.unwrap_or(true) {
        for (name, value) in req.head.headers() {
            if !HOP.iter().any(|h| name.eq_ignore_ascii_case(h)) && !is_set(name) {
                put(name, value);
            }
        }
    }
    Ok(Head {
        method,
        uri,
        headers,
    })
}

/// A stream opened on a server: where its answer comes, where the body goes, and what the
/// `$upstream_*` record and the group need when the answer's head comes.
struct Opened {
    answer: ResponseFuture,
    addr: Addr,
    peer: crate::runtime::metrics::Key,
    since: Instant,
    scheme: &'static str,
    /// The group's server, and its `max_conns` slot held while the stream runs.
    server: Option<(Arc<Upstream>, usize, Lease)>,
}

/// Open the request's stream on a server of the location's upstream: the group's balancing
/// picks one, and a server that cannot be reached is skipped per `grpc_next_upstream`
/// (nothing has been sent to it). `whole`: the request's body at hand (maybe empty), sent
/// here, and the answer's head read here too, so that a failure or a status listed in
/// `grpc_next_upstream` moves the request on to the next server; `None`: the body streams
/// from the client after this, and the head is the caller's to read. As nginx
/// (`preserve_output`), the head is read while the body goes up: a server may answer
/// before it opened its window for all of the body, whose rest (returned) goes on after.
#[allow(clippy::type_complexity)]
async fn open(
    w: &Worker,
    req: &Request,
    whole: Option<Bytes>,
) -> Result<
    (
        Opened,
        SendStream<Bytes>,
        Option<(http::response::Parts, RecvStream)>,
        Bytes,
    ),
    Flow,
> {
    let c = &req.conf.grpc;
    let Some(target) = c.target.as_deref() else {
        return Err(Flow::Status(500));
    };
    let dest = target.dest(req).map_err(|why| {
        errlog::request(Level::Error, req, format_args!("{why}"));
        Flow::Status(500)
    })?;
    let tls = if dest.tls {
        let name = || dest.host.clone();
        let tls = gw::tls_for(w, req, c.client_tls.as_ref(), &c.ssl, "grpc_ssl_name", name);
        Some(tls.map_err(|why| {
            errlog::request(Level::Error, req, format_args!("{why}"));
            Flow::Status(502)
        })?)
    } else {
        None
    };
    let via = Via {
        proto: Proto::Grpc,
        tls,
        timers: w.timers.clone(),
    };
    let head = build_head(req, &dest).map_err(|why| {
        errlog::request(Level::Error, req, format_args!("{why}"));
        Flow::Status(500)
    })?;
    let backend = dest.backend.clone();
    let (backend, spare) = match target {
        crate::modules::grpc::Target::Vars(..) => gw::dynamic(req, backend).await?,
        crate::modules::grpc::Target::Fixed(_) => (backend, Vec::new()),
    };
    let gwc = &c.gw;
    let start = Instant::now();
    let mut now = start;
    let mut tried = Tried::default();
    let mut spare = spare.into_iter();
    let mut single = match &backend {
        Backend::Addr(a) => Some(a.clone()),
        _ => None,
    };
    let hash;
    let key = match &backend {
        Backend::Group(up) => {
            hash = up.hash_key(req);
            Key {
                ip: (!req.unix_client()).then(|| req.client().ip()),
                hash: hash.as_deref().map(str::as_bytes),
            }
        }
        _ => Key {
            ip: None,
            hash: None,
        },
    };
    // `grpc_next_upstream_tries` and `_timeout` allow another attempt.
    let within = |attempts: u64, start: Instant, now: Instant| {
        gwc.next_upstream_tries
            .is_none_or(|n| n == 0 || attempts < n)
            && gwc
                .next_upstream_timeout
                .is_none_or(|t| t.is_zero() || now.duration_since(start) < t)
    };
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        let (addr, mut server) = match &backend {
            Backend::Group(up) => match w.upstreams.pick(up, &key, &tried, now) {
                Pick::Server(i, lease) => {
                    tried.push(i);
                    // `server NAME resolve`: its next address in turn.
                    let addr = match &up.servers[i].resolve {
                        None => up.servers[i].addr.clone(),
                        Some(r) => match r.addrs().await.into_iter().next() {
                            Some(a) => a,
                            None => continue,
                        },
                    };
                    (addr, Some((up.clone(), i, lease)))
                }
                Pick::Full | Pick::None => {
                    super::gateway::no_live(req, &via, &up.name, std::time::Instant::now());
                    return Err(Flow::Status(502));
                }
            },
            _ => match single.take().or_else(|| spare.next()) {
                Some(a) => (a, None),
                None => return Err(Flow::Status(502)),
            },
        };
        let keep = server.as_ref().is_some_and(|(up, ..)| up.keepalive > 0);
        let peer = match &server {
            Some((up, i, _)) => up.servers[*i].metrics,
            None => crate::modules::metrics::direct_peer(req, &addr),
        };
        let end = whole.as_ref().is_some_and(Bytes::is_empty);
        let f = match h2u::stream(req, &via, gwc, &addr, (keep, None), &head, end).await {
            Ok((answer, mut body, _)) => {
                let mut o = Opened {
                    answer,
                    addr: addr.clone(),
                    peer,
                    since: now,
                    scheme: via.scheme(),
                    server,
                };
                let Some(data) = &whole else {
                    return Ok((o, body, None, Bytes::new()));
                };
                let mut rest = data.clone();
                let r = {
                    // A failure to send shows in the answer (or its absence).
                    let send = send_up(&mut body, &mut rest, true, gwc.send_timeout());
                    let mut send = std::pin::pin!(send);
                    let mut sending = !data.is_empty();
                    let mut head = std::pin::pin!(answer_head(req, &mut o));
                    std::future::poll_fn(|cx| {
                        if sending && send.as_mut().poll(cx).is_ready() {
                            sending = false;
                        }
                        head.as_mut().poll(cx)
                    })
                    .await
                };
                now = Instant::now();
                match r {
                    Ok((parts, recv)) => {
                        let status = parts.status.as_u16();
                        let more = match &o.server {
                            Some((up, ..)) => tried.len() < up.tries(),
                            None => spare.len() > 0,
                        } && within(attempts, start, now);
                        if !more || !gw::retry_status(status, gwc, req) {
                            return Ok((o, body, Some((parts, recv)), rest));
                        }
                        // nginx counts these against the server, except 403 and 404.
                        if let Some((up, i, _)) = &o.server {
                            if status != 403 && status != 404 {
                                w.upstreams.failed(up, *i, now);
                            }
                        }
                        continue;
                    }
                    Err(f) => {
                        server = o.server.take();
                        f
                    }
                }
            }
            Err(f) => {
                now = gw::record(req, &addr, peer, f.status(), now);
                f
            }
        };
        let flow = gw::failed(req, via.scheme(), &addr, &f);
        let group_left = match &server {
            Some((up, i, _)) => {
                w.upstreams.failed(up, *i, now);
                tried.len() < up.tries()
            }
            None => spare.len() > 0,
        };
        if !group_left || !gw::retryable(&f, gwc, req) || !within(attempts, start, now) {
            return Err(flow);
        }
    }
}

/// The answer's head within `grpc_read_timeout`, recorded for `$upstream_*`; a failure
/// is the caller's to log.
async fn answer_head(
    req: &Request,
    o: &mut Opened,
) -> Result<(http::response::Parts, RecvStream), Failure> {
    let r = h2u::answer(&mut o.answer, req.conf.grpc.gw.read_timeout()).await;
    let status = match &r {
        Ok(r) => r.status().as_u16(),
        Err(f) => f.status(),
    };
    if r.is_ok() {
        req.upstream.borrow_mut().head_read = Some(Instant::now());
    }
    gw::record(req, &o.addr, o.peer, status, o.since);
    r.map(http::Response::into_parts)
}

/// What became of a stream served to an HTTP/2 client.
pub enum Served {
    /// Answered (and logged).
    Done,
    /// Answer with this flow instead (an error status, an intercepted error).
    Flow(Flow),
}

/// Serve `req` to an HTTP/2 client: its body streamed up from `recv`, the answer streamed
/// back through `respond` (see the module's header).
pub async fn serve_h2(
    w: &Worker,
    req: &mut Request,
    recv: &mut RecvStream,
    respond: &mut SendResponse<Bytes>,
) -> Served {
    // A body read already (for a mirror) goes whole, and so does none: the whole exchange
    // up to the head may then move to another server.
    let whole = match super::gateway::passed_body(req) {
        Some(b) => match body_bytes(b) {
            Some(b) => Some(b),
            None => return Served::Flow(Flow::Status(500)),
        },
        None => recv.is_end_stream().then(Bytes::new),
    };
    let end = whole.is_some();
    let opened = {
        let open = std::pin::pin!(open(w, req, whole));
        race_reset(respond, open).await
    };
    let (mut o, mut body, head0, rest) = match opened {
        Some(Ok(o)) => o,
        Some(Err(flow)) => return Served::Flow(flow),
        None => return client_gone(w, req),
    };
    let (limit, body_timeout) = {
        let core = &req.conf.core;
        (core.client_max_body_size(), core.client_body_timeout())
    };
    let send_timeout = req.conf.grpc.gw.send_timeout();
    let mut pumped = end && rest.is_empty();
    let mut pump = std::pin::pin!(pump_body(
        recv,
        &mut body,
        limit,
        body_timeout,
        send_timeout,
        (end, rest)
    ));
    // As nginx, an upstream reset with an error, even after the answer's end, fails the
    // answer (its trailers are not passed on): seen by the pump, judged by the relay.
    let rejected = std::cell::Cell::new(None);
    let pumped_out = |r: Result<(), Pumped>| match r {
        Err(Pumped::Client) => true,
        Err(Pumped::Reset(r)) => {
            if r != h2::Reason::NO_ERROR {
                rejected.set(Some(r));
            }
            false
        }
        _ => false,
    };
    // The answer's head, while the body goes up.
    let head = if let Some(h) = head0 {
        Some(Ok(h))
    } else {
        let mut head = std::pin::pin!(answer_head(req, &mut o));
        let mut reset = std::pin::pin!(std::future::poll_fn(|cx| respond.poll_reset(cx)));
        std::future::poll_fn(|cx| {
            if !pumped {
                if let Poll::Ready(r) = pump.as_mut().poll(cx) {
                    pumped = true;
                    if pumped_out(r) {
                        return Poll::Ready(None);
                    }
                }
            }
            if reset.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            head.as_mut().poll(cx).map(Some)
        })
        .await
    };
    let (parts, mut up) = match head {
        Some(Ok(h)) => h,
        Some(Err(f)) => return Served::Flow(gw::failed(req, o.scheme, &o.addr, &f)),
        None => return client_gone(w, req),
    };
    let mut resp = match gw::answer(req, &req.conf.grpc.gw, h2u::cgi_head(&parts)) {
        Flow::Done(resp) => resp,
        flow => return Served::Flow(flow),
    };
    handler::finish(req, &mut resp);
    resp.length_unknown = true;
    let req = &*req;
    let (h, head_len) = h2_response::head(&resp, 0, req.conf.core.server_tokens());
    // A HEAD request's answer is its head alone (as nginx's `header_only`): what the
    // server sends after it is not read (the upstream stream is cancelled when dropped).
    let head_only = req.head.method_str() == "HEAD";
    let ended = up.is_end_stream() || head_only;
    let mut stream = match respond.send_response(h, ended) {
        Ok(s) => s,
        Err(_) => {
            super::log::access(w, req, &resp, 0, 0, false);
            return Served::Done;
        }
    };
    let mut out = Out {
        stream: &mut stream,
        sent: 0,
        chunk: req.conf.http2.chunk_size() as usize,
        timeout: req.conf.core.send_timeout(),
        ended,
        trailers: None,
        pace: None,
    };
    let mut whole = true;
    if !ended {
        whole = {
            let mut relay = std::pin::pin!(relay(req, &o, &mut up, &mut out, &rejected));
            std::future::poll_fn(|cx| {
                if !pumped {
                    if let Poll::Ready(r) = pump.as_mut().poll(cx) {
                        pumped = true;
                        if pumped_out(r) {
                            return Poll::Ready(false);
                        }
                    }
                }
                relay.as_mut().poll(cx)
            })
            .await
        };
        if !whole {
            out.stream.send_reset(h2::Reason::CANCEL);
        }
    }
    if let Some((up, i, _)) = &o.server {
        w.upstreams.succeeded(up, *i);
    }
    let sent = out.sent;
    super::log::access(w, req, &resp, head_len, sent, whole);
    Served::Done
}

/// The client left before the answer's head: nginx's info line and a 499 in the access
/// log; dropping the upstream stream resets it (CANCEL).
fn client_gone(w: &Worker, req: &Request) -> Served {
    errlog::request(
        Level::Info,
        req,
        format_args!("client prematurely closed connection, so upstream connection is closed too while {READING_HEAD}"),
    );
    super::log::access(w, req, &Response::new(499), 0, 0, false);
    Served::Done
}

/// Run `f` unless the client resets its stream first (`None`).
async fn race_reset<F: Future>(
    respond: &mut SendResponse<Bytes>,
    mut f: std::pin::Pin<&mut F>,
) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        respond.poll_reset(cx).map(|_| None)
    })
    .await
}

/// How the body's pumping ended badly.
enum Pumped {
    /// The client reset its stream, timed out or sent too much: the call is over.
    Client,
    /// The upstream stopped taking the body (it answered, or reset the stream): the
    /// answer decides.
    Upstream,
    /// The upstream reset its stream while the body was still coming (with this reason).
    Reset(h2::Reason),
}

/// The client's body up to the server as it arrives, with its trailers, within
/// `client_max_body_size` (`limit`, 0 for none) and the timeouts.
async fn pump_body(
    recv: &mut RecvStream,
    send: &mut SendStream<Bytes>,
    limit: u64,
    body_timeout: Duration,
    send_timeout: Duration,
    (ended, mut rest): (bool, Bytes),
) -> Result<(), Pumped> {
    if ended {
        // The rest of a body read whole that the server answered before it took.
        if !rest.is_empty() {
            send_up(send, &mut rest, true, send_timeout).await?;
        }
        return Ok(());
    }
    let mut total = 0u64;
    loop {
        // The upstream may reset its stream while the client is still sending: seen at
        // once (the answer's relay judges it).
        let next = {
            let mut data = std::pin::pin!(tokio::time::timeout(body_timeout, recv.data()));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = send.poll_reset(cx) {
                    return Poll::Ready(Err(r.ok()));
                }
                data.as_mut().poll(cx).map(Ok)
            })
            .await
        };
        let chunk = match next {
            Err(Some(reason)) => return Err(Pumped::Reset(reason)),
            Err(None) => return Err(Pumped::Upstream),
            Ok(Ok(Some(Ok(c)))) => c,
            Ok(Ok(None)) => {
                let t = tokio::time::timeout(body_timeout, recv.trailers()).await;
                return match t {
                    Ok(Ok(Some(t))) => send.send_trailers(t).map_err(|_| Pumped::Upstream),
                    Ok(Ok(None)) => send
                        .send_data(Bytes::new(), true)
                        .map_err(|_| Pumped::Upstream),
                    _ => Err(Pumped::Client),
                };
            }
            Ok(Ok(Some(Err(_))) | Err(_)) => return Err(Pumped::Client),
        };
        total += chunk.len() as u64;
        let _ = recv.flow_control().release_capacity(chunk.len());
        if limit > 0 && total > limit {
            return Err(Pumped::Client);
        }
        // The last DATA frame ends the upstream stream too, as nginx sends it.
        let last = recv.is_end_stream();
        if chunk.is_empty() && !last {
            continue;
        }
        let mut chunk = chunk;
        send_up(send, &mut chunk, last, send_timeout).await?;
        if last {
            return Ok(());
        }
    }
}

/// `data` upstream as its window opens, within `grpc_send_timeout` per wait (what was sent
/// taken off it); `end`: its last frame ends the stream.
async fn send_up(
    send: &mut SendStream<Bytes>,
    data: &mut Bytes,
    end: bool,
    timeout: Duration,
) -> Result<(), Pumped> {
    if data.is_empty() && end {
        return send
            .send_data(Bytes::new(), true)
            .map_err(|_| Pumped::Upstream);
    }
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let cap = tokio::time::timeout(timeout, std::future::poll_fn(|cx| send.poll_capacity(cx)));
        let n = match cap.await {
            Ok(Some(Ok(n))) => n.min(data.len()),
            _ => return Err(Pumped::Upstream),
        };
        if n == 0 {
            continue;
        }
        let piece = data.split_to(n);
        send.send_data(piece, end && data.is_empty())
            .map_err(|_| Pumped::Upstream)?;
    }
    Ok(())
}

/// The answer's DATA frames and trailers to the client as they come; false when it was
/// cut short (the client's stream is then reset).
async fn relay(
    req: &Request,
    o: &Opened,
    up: &mut RecvStream,
    out: &mut Out<'_>,
    rejected: &std::cell::Cell<Option<h2::Reason>>,
) -> bool {
    let timeout = req.conf.grpc.gw.read_timeout();
    loop {
        let next = {
            let data = std::pin::pin!(tokio::time::timeout(timeout, up.data()));
            let stream = &mut *out.stream;
            let mut data = data;
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = data.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                // The client reset its stream: the upstream one is reset when dropped.
                stream.poll_reset(cx).map(|_| None)
            })
            .await
        };
        match next {
            None => return false,
            Some(Ok(Some(Ok(b)))) => {
                let _ = up.flow_control().release_capacity(b.len());
                if !b.is_empty() && !out.data_frames(b, false).await {
                    return false;
                }
            }
            Some(Ok(None)) => break,
            Some(Ok(Some(Err(e)))) => {
                let reason = e.reason();
                relay_failed(req, o, h2u::failure(e, READING), reason, out);
                return true;
            }
            Some(Err(_)) => {
                relay_failed(req, o, Failure::Timeout(READING), None, out);
                return true;
            }
        }
    }
    let t = match tokio::time::timeout(timeout, up.trailers()).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            let reason = e.reason();
            relay_failed(req, o, h2u::failure(e, READING), reason, out);
            return true;
        }
        Err(_) => {
            relay_failed(req, o, Failure::Timeout(READING), None, out);
            return true;
        }
    };
    if let Some(r) = rejected.get() {
        let why = format!("upstream rejected request with error {}", u32::from(r));
        relay_failed(req, o, Failure::Protocol(why), Some(r), out);
        return true;
    }
    out.ended = match t {
        Some(t) => out.stream.send_trailers(t).is_ok(),
        None => out.stream.send_data(Bytes::new(), true).is_ok(),
    };
    out.ended
}

/// The upstream failed after the head went: logged, and the client's stream reset (with
/// the upstream's reason when it reset its stream).
fn relay_failed(
    req: &Request,
    o: &Opened,
    f: Failure,
    reason: Option<h2::Reason>,
    out: &mut Out<'_>,
) {
    gw::failed(req, o.scheme, &o.addr, &f);
    out.stream
        .send_reset(reason.unwrap_or(h2::Reason::INTERNAL_ERROR));
    out.ended = true;
}

/// The exchange for an HTTP/1.x client: the body read whole goes up, the answer comes back
/// whole (its trailers dropped).
pub async fn run_whole(w: &Worker, req: &Request) -> Flow {
    let body = match super::gateway::passed_body(req).map(body_bytes) {
        Some(Some(b)) => b,
        Some(None) => return Flow::Status(500),
        None => Bytes::new(),
    };
    let (o, mut send, head, mut rest) = match open(w, req, Some(body)).await {
        Ok(o) => o,
        Err(flow) => return flow,
    };
    let Some((parts, mut up)) = head else {
        return Flow::Status(502);
    };
    let timeout = req.conf.grpc.gw.read_timeout();
    // The body's rest, if the server answered before it took all, goes on meanwhile.
    let send_timeout = req.conf.grpc.gw.send_timeout();
    let mut sending = !rest.is_empty();
    let mut pump = std::pin::pin!(send_up(&mut send, &mut rest, true, send_timeout));
    let mut data = BytesMut::new();
    loop {
        let next = std::future::poll_fn(|cx| {
            if sending && pump.as_mut().poll(cx).is_ready() {
                sending = false;
            }
            Poll::Pending::<()>
        });
        let read = async {
            tokio::select! {
                biased;
                r = up.data() => r,
                () = next => None,
            }
        };
        match tokio::time::timeout(timeout, read).await {
            Ok(Some(Ok(b))) => {
                let _ = up.flow_control().release_capacity(b.len());
                data.extend_from_slice(&b);
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return gw::failed(req, o.scheme, &o.addr, &h2u::failure(e, READING))
            }
            Err(_) => return gw::failed(req, o.scheme, &o.addr, &Failure::Timeout(READING)),
        }
    }
    if let Some((up, i, _)) = &o.server {
        w.upstreams.succeeded(up, *i);
    }
    match gw::answer(req, &req.conf.grpc.gw, h2u::cgi_head(&parts)) {
        Flow::Done(mut resp) => {
            if !data.is_empty() {
                resp.body = Body::bytes(data.freeze());
            }
            Flow::Done(resp)
        }
        flow => flow,
    }
}

/// A body read whole, in memory (one in a temporary file is read back); `None` when the
/// file cannot be read.
fn body_bytes(b: &RequestBody) -> Option<Bytes> {
    match b {
        RequestBody::Memory(v) => Some(Bytes::copy_from_slice(v)),
        RequestBody::File(f) => {
            let mut buf = vec![0u8; usize::try_from(f.len()).ok()?];
            let mut at = 0;
            while at < buf.len() {
                match f.piece(at as u64, &mut buf[at..]) {
                    Ok(n) if n > 0 => at += n,
                    _ => return None,
                }
            }
            Some(Bytes::from(buf))
        }
    }
}
