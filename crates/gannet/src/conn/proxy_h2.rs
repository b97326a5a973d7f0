//! `proxy_http_version 2`: the reverse proxy's requests over HTTP/2 (nginx 1.29's
//! ngx_http_proxy_v2_module), h2c with prior knowledge to `http://` upstreams and TLS with
//! ALPN `h2` to `https://` ones, on the connections `conn::h2_upstream` keeps and
//! multiplexes (shared with `grpc_pass`).
//!
//! Only the wire differs from HTTP/1.x: the gateway (`conn::gateway`) picks the server,
//! retries per `proxy_next_upstream`, maps failures to 502 / 504 and turns the answer's
//! head into the client's response with the same code as for an HTTP/1.x server
//! (`proxy_hide_header`, `proxy_pass_header`, `proxy_redirect`, caching...). The request's
//! fields are the proxy's own list (`modules::proxy::fields`), less what HTTP/2 cannot
//! carry (`Connection` and the other hop-by-hop ones, `Transfer-Encoding`), with `Host` as
//! `:authority`. The body goes as DATA frames as the server's window opens, from memory,
//! from its temporary file, or from the client as it arrives (`proxy_request_buffering
//! off`); the answer's DATA frames are read by the gateway's link through [`Download`],
//! which opens the window again only as it is read, so a slow client slows the server.
//! Its trailer fields are kept for the client when `proxy_pass_trailers` is on (an HTTP/1.1
//! server's chunked answer keeps its own in the same place: [`Trailers`]).

use super::gateway::{
    self as gw, Answered, Failure, Link, Outgoing, Via, Wire, READING_HEAD, SENDING,
};
use super::h2_upstream::{self as h2u, Head};
use crate::http::request::Request;
use crate::modules::gateway::{self as gateway, GatewayConf, Streamed};
use crate::modules::proxy::{self, Dest, Outline};
use crate::upstream::Addr;
use bytes::{Buf, Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

/// Fields HTTP/2 does not carry (RFC 9113 8.2.2), or that go as pseudo-fields.
const NOT_H2: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// The request's head for HTTP/2, and its body at hand (`proxy_set_body`'s, or the
/// client's read whole into memory) into `out`; `Err` with the log's reason.
pub(super) fn head(
    req: &Request,
    dest: &Dest,
    body: &[u8],
    streamed: Option<Streamed>,
    out: &mut Vec<u8>,
) -> Result<Head, String> {
    let vars = req
        .conf
        .proxy
        .target
        .as_deref()
        .is_some_and(proxy::Target::vars);
    let o = Outline::of(req, streamed);
    let body = o.body(body);
    let mut headers = http::HeaderMap::new();
    let mut host = None;
    proxy::fields(req, dest, &o, body.len(), |name, value| {
        if name.eq_ignore_ascii_case("host") {
            host.get_or_insert_with(|| value.to_vec());
            return;
        }
        if NOT_H2.iter().any(|h| name.eq_ignore_ascii_case(h))
            || (name.eq_ignore_ascii_case("te") && !value.eq_ignore_ascii_case(b"trailers"))
        {
            return;
        }
        // A name or value HTTP/2 cannot carry is left out.
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    });
    out.extend_from_slice(body);
    // `proxy_set_header Host ""` sends the URL's host (nginx's `host_header`).
    let host = host
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| dest.host.as_bytes().to_vec());
    let mut path = Vec::with_capacity(64);
    proxy::upstream_uri(req, dest, vars, &mut path);
    let scheme = if dest.tls { "https" } else { "http" };
    let uri = uri(scheme, &host, &path)?;
    let method = http::Method::from_bytes(o.method.as_bytes())
        .map_err(|_| format!("invalid http2 method \"{}\"", o.method))?;
    Ok(Head {
        method,
        uri,
        headers,
    })
}

/// `scheme://host/path`; bytes a URI cannot hold as they are (a client's raw `"` or `{`,
/// passed on by nginx) are escaped.
fn uri(scheme: &str, host: &[u8], path: &[u8]) -> Result<http::Uri, String> {
    let host = String::from_utf8_lossy(host);
    let mut s = format!("{scheme}://{host}");
    for &b in path {
        if b.is_ascii_graphic()
            && !matches!(
                b,
                b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
            )
        {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    http::Uri::try_from(s).map_err(|e| format!("invalid http2 URI: {e}"))
}

/// One attempt on `addr`: a stream on a kept connection (`keep`: the group has
/// `keepalive`) or a new one, the body sent, and the answer read as the gateway reads an
/// HTTP/1.x one.
pub(super) async fn exchange(
    req: &Request,
    via: &Via,
    c: &GatewayConf,
    addr: &Addr,
    keep: bool,
    head: &Head,
    out: &mut Outgoing<'_>,
) -> Result<Answered, Failure> {
    let from = match &req.conf.proxy.bind {
        Some(Some(b)) => b.local(req).map(|a| (a, b.transparent)),
        _ => None,
    };
    let end = out.out.is_empty() && out.body.is_none();
    // A stream a closing connection refused was not processed: it goes again on another
    // connection (a few times at most, should each be full when it gets there).
    let mut again = 8;
    loop {
        let (mut answer, send, reused) =
            h2u::stream(req, via, c, addr, (keep, from), head, end).await?;
        match attempt(req, via, c, addr, out, (&mut answer, send), end).await {
            Err(Ok(e)) if reused && again > 0 && h2u::unprocessed(&e) && !out.started() => {
                again -= 1;
                h2u::forget(via, addr);
            }
            Err(Ok(e)) => return Err(h2u::failure(e, READING_HEAD)),
            Err(Err(f)) => return Err(f),
            Ok(a) => return Ok(a),
        }
    }
}

/// The body sent and the answer read, on the stream opened; an HTTP/2 error before the
/// answer's head is given as it is (`Err(Ok(..))`).
async fn attempt(
    req: &Request,
    via: &Via,
    c: &GatewayConf,
    addr: &Addr,
    out: &mut Outgoing<'_>,
    (answer, send): (&mut h2::client::ResponseFuture, SendStream<Bytes>),
    end: bool,
) -> Result<Answered, Result<h2::Error, Failure>> {
    let mut up = Upload(send);
    if !end {
        let timeout = c.send_timeout();
        let sent = match &mut out.body {
            Some(b) => gw::send_body(&via.timers, &mut up, &out.out, b, timeout)
                .await
                .and_then(|_| {
                    up.0.send_data(Bytes::new(), true)
                        .map_err(|e| h2u::failure(e, SENDING))
                }),
            // A body at hand ends the stream with its last frame, as nginx sends it.
            None => up.last(Bytes::copy_from_slice(&out.out), timeout).await,
        };
        match sent {
            Ok(()) => {}
            Err(f @ Failure::Client(_)) => return Err(Err(f)),
            // The server may have answered without taking the whole body (a 413, say):
            // its answer, if it gave one, is what the client gets.
            Err(f) => {
                if let Ok(Ok(r)) =
                    tokio::time::timeout(std::time::Duration::from_millis(100), &mut *answer).await
                {
                    return read(req, via, addr, r, up.0).await.map_err(Err);
                }
                return Err(Err(f));
            }
        }
    }
    req.upstream.borrow_mut().sent += out.out.len() as u64;
    let r = match tokio::time::timeout(c.read_timeout(), answer).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(Ok(e)),
        Err(_) => return Err(Err(Failure::Timeout(READING_HEAD))),
    };
    read(req, via, addr, r, up.0).await.map_err(Err)
}

/// The answer after its head: the body read through the gateway's link.
async fn read(
    req: &Request,
    via: &Via,
    addr: &Addr,
    r: http::Response<RecvStream>,
    send: SendStream<Bytes>,
) -> Result<Answered, Failure> {
    req.upstream.borrow_mut().head_read = Some(Instant::now());
    let (parts, recv) = r.into_parts();
    let head = h2u::cgi_head(&parts);
    // Trailers are kept only where they may be passed on.
    let trailers = req.conf.proxy.pass_trailers().then(|| trailer_slot(req));
    let d = Download {
        recv,
        send,
        left: Bytes::new(),
        done: false,
        trailers,
    };
    let mut link = Link::on(Wire::H2(d), via);
    let mut body = BytesMut::new();
    link.frame(req, &head, &mut body);
    gw::read_answer(req, addr, link, (Some(head), body), &[]).await
}

/// Where an answer's trailer fields (an HTTP/2 server's, or an HTTP/1.1 server's after its
/// last chunk) are kept until the body's end is sent.
pub type Trailers = Rc<RefCell<Option<http::HeaderMap>>>;

/// A new place for the answer's trailer fields, the request's.
pub(super) fn trailer_slot(req: &Request) -> Trailers {
    let slot: Trailers = Rc::default();
    req.upstream.borrow_mut().trailers = Some(slot.clone());
    slot
}

/// An HTTP/1.1 server's trailer fields (after its last chunk) into `slot`; those HTTP/2
/// could not carry are left out.
pub(super) fn keep_trailers(slot: &Trailers, fields: Vec<(String, String)>) {
    let mut map = http::HeaderMap::new();
    for (n, v) in fields {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(n.as_bytes()),
            http::HeaderValue::from_str(&v),
        ) {
            map.append(n, v);
        }
    }
    *slot.borrow_mut() = Some(map);
}

/// Whether the answer being sent may end with an upstream's trailer fields
/// (`proxy_pass_trailers`, an HTTP/2 server or a chunked HTTP/1.1 answer).
pub fn trails(req: &Request) -> bool {
    req.upstream.borrow().trailers.is_some()
}

/// The upstream's trailer fields that go to the client, after `add_trailer`'s: those
/// `proxy_hide_header` (and the default hidden list) does not hide, as nginx's
/// `ngx_http_upstream_process_trailers`.
pub fn passed_trailers(req: &Request, out: &mut Vec<(String, String)>) {
    let Some(slot) = req.upstream.borrow().trailers.clone() else {
        return;
    };
    let Some(proto) = gateway::active(&req.conf) else {
        return;
    };
    let c = gateway::conf(&req.conf, proto);
    let map = slot.borrow();
    for (n, v) in map.iter().flatten() {
        if let (true, Ok(v)) = (gateway::passes(c, n.as_str()), v.to_str()) {
            out.push((n.as_str().to_string(), v.to_string()));
        }
    }
}

/// The request body's way up: DATA frames sent as the stream's window has room.
struct Upload(SendStream<Bytes>);

fn h2_io(e: h2::Error) -> io::Error {
    match e.get_io() {
        Some(io) => io::Error::new(io.kind(), io.to_string()),
        None => io::Error::other(e.to_string()),
    }
}

impl Upload {
    /// `data` as the stream's last DATA frames, sent as the window opens (each wait at
    /// most `timeout`).
    async fn last(&mut self, mut data: Bytes, timeout: std::time::Duration) -> Result<(), Failure> {
        let s = &mut self.0;
        while !data.is_empty() {
            s.reserve_capacity(data.len());
            let cap = std::future::poll_fn(|cx| s.poll_capacity(cx));
            let n = match tokio::time::timeout(timeout, cap).await {
                Ok(Some(Ok(n))) => n.min(data.len()),
                Ok(Some(Err(e))) => return Err(h2u::failure(e, SENDING)),
                Ok(None) => return Err(Failure::Io(io::ErrorKind::BrokenPipe.into(), SENDING)),
                Err(_) => return Err(Failure::Timeout(SENDING)),
            };
            let piece = data.split_to(n);
            s.send_data(piece, data.is_empty())
                .map_err(|e| h2u::failure(e, SENDING))?;
        }
        Ok(())
    }
}

impl gw::BodySink for Upload {}

impl tokio::io::AsyncWrite for Upload {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let s = &mut self.get_mut().0;
        s.reserve_capacity(buf.len());
        loop {
            match ready!(s.poll_capacity(cx)) {
                Some(Ok(0)) => continue,
                Some(Ok(n)) => {
                    let n = n.min(buf.len());
                    s.send_data(Bytes::copy_from_slice(&buf[..n]), false)
                        .map_err(h2_io)?;
                    return Poll::Ready(Ok(n));
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_io(e))),
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The answer's body as the gateway's link reads it: the stream's DATA frames, each read
/// opening the window again by what it took; the end of the stream is the end of the
/// body, after which the trailer fields are kept (`trailers`).
pub struct Download {
    recv: RecvStream,
    /// The request's side of the stream: where the server's reset shows.
    send: SendStream<Bytes>,
    /// The rest of a frame a read had no room for.
    left: Bytes,
    done: bool,
    trailers: Option<Trailers>,
}

impl Download {
    /// As nginx, a reset with an error read with the answer (a second reset comes as one
    /// with an error, `conn::h2_resets`) fails it, the DATA before it included: nginx
    /// judges what one read brought before it passes any of it on.
    fn rejected(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        match self.send.poll_reset(cx) {
            Poll::Ready(Ok(r)) if r != h2::Reason::NO_ERROR => Some(io::Error::other(format!(
                "upstream rejected request with error {}",
                u32::from(r)
            ))),
            _ => None,
        }
    }
}

impl tokio::io::AsyncRead for Download {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if !me.left.is_empty() {
                let n = me.left.len().min(buf.remaining());
                buf.put_slice(&me.left[..n]);
                me.left.advance(n);
                return Poll::Ready(Ok(()));
            }
            if me.done {
                return Poll::Ready(Ok(()));
            }
            match ready!(me.recv.poll_data(cx)) {
                Some(Ok(b)) => {
                    let _ = me.recv.flow_control().release_capacity(b.len());
                    if let Some(e) = me.rejected(cx) {
                        return Poll::Ready(Err(e));
                    }
                    me.left = b;
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_io(e))),
                None => {
                    let t = ready!(me.recv.poll_trailers(cx)).map_err(h2_io)?;
                    if let Some(e) = me.rejected(cx) {
                        return Poll::Ready(Err(e));
                    }
                    if let (Some(slot), Some(t)) = (&me.trailers, t) {
                        *slot.borrow_mut() = Some(t);
                    }
                    me.done = true;
                }
            }
        }
    }
}
