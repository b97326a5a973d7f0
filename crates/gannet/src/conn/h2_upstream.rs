//! HTTP/2 to upstream servers, the wire shared by `grpc_pass` (`conn::grpc`) and
//! `proxy_http_version 2` (`conn::proxy_h2`): the `h2` crate's client, with prior knowledge
//! on a plain connection or after a TLS handshake offering ALPN `h2`.
//!
//! Connections are kept per worker and server (and TLS setup) when the server's group has
//! `keepalive N`: each request is a stream on the kept connection, as many at once as the
//! server's SETTINGS_MAX_CONCURRENT_STREAMS allows; once it is full (or gone) a new
//! connection is made and kept in its place, the old one closing when its last stream
//! ends. So at most one connection per server is idle, whatever N. Without `keepalive`
//! each request has a connection of its own, closed with its stream, as in nginx.

use super::gateway::{self as gw, Failure, Via, READING_HEAD, SENDING};
use crate::http::request::Request;
use crate::modules::gateway::GatewayConf;
use crate::upstream::Addr;
use bytes::Bytes;
use gannet_proto::cgi::{CgiHead, Fields};
use h2::client::{ResponseFuture, SendRequest};
use h2::SendStream;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::Poll;

/// The stream window (and the connection's) offered to servers: enough for a fast server
/// to send ahead of the reads without waiting for each WINDOW_UPDATE; the window is opened
/// again only as the answer is read (backpressure).
const WINDOW: u32 = 1024 * 1024;

thread_local! {
    /// Each worker's kept HTTP/2 connections (`keepalive` groups): one per server and TLS
    /// setup, shared by the requests to it.
    static KEPT: RefCell<HashMap<(String, u64), Kept>> = RefCell::default();
}

/// A server's kept connection, or the one being made for it: the requests that come
/// meanwhile wait for it rather than each making one of their own.
enum Kept {
    Ready(SendRequest<Bytes>),
    Connecting(Rc<tokio::sync::Notify>),
}

/// The request as it goes upstream, rebuilt for each attempt (an `http::Request` is no
/// `Clone`).
pub(super) struct Head {
    pub(super) method: http::Method,
    pub(super) uri: http::Uri,
    pub(super) headers: http::HeaderMap,
}

impl Head {
    pub(super) fn request(&self) -> http::Request<()> {
        let mut r = http::Request::new(());
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.uri.clone();
        *r.headers_mut() = self.headers.clone();
        r
    }
}

/// A stream for the request on `addr`: on the kept connection if there is a live one with
/// room, else on a new one (made from `from`, `proxy_bind`'s address, and kept for the
/// next requests when `keep`). `end`: the request has no body. The flag says the stream is
/// on a connection made before (which may have been closing meanwhile: [`unprocessed`]).
pub(super) async fn stream(
    req: &Request,
    via: &Via,
    c: &GatewayConf,
    addr: &Addr,
    (keep, from): (bool, Option<(SocketAddr, bool)>),
    head: &Head,
    end: bool,
) -> Result<(ResponseFuture, SendStream<Bytes>, bool), Failure> {
    let key = (addr.to_string(), via.kind());
    // At most two waits for a connection being made, then one of its own.
    for waits in 0..3 {
        if !keep {
            break;
        }
        match KEPT.with(|k| k.borrow_mut().remove(&key)) {
            Some(Kept::Ready(mut s)) => {
                // Gone (an error) or out of streams (pending): a new connection is made.
                let ready = std::future::poll_fn(|cx| Poll::Ready(s.poll_ready(cx))).await;
                if matches!(ready, Poll::Ready(Ok(()))) {
                    if let Ok(r) = s.send_request(head.request(), end) {
                        req.upstream.borrow_mut().mark_connected();
                        KEPT.with(|k| k.borrow_mut().insert(key, Kept::Ready(s)));
                        return Ok((r.0, r.1, true));
                    }
                }
                break;
            }
            Some(Kept::Connecting(n)) if waits < 2 => {
                KEPT.with(|k| {
                    k.borrow_mut()
                        .insert(key.clone(), Kept::Connecting(n.clone()))
                });
                // Made or failed: either way look again.
                let _ = tokio::time::timeout(c.connect_timeout(), n.notified()).await;
            }
            _ => break,
        }
    }
    let connecting = keep.then(|| {
        let n = Rc::new(tokio::sync::Notify::new());
        KEPT.with(|k| {
            k.borrow_mut()
                .insert(key.clone(), Kept::Connecting(n.clone()))
        });
        // Whatever becomes of this attempt, those waiting for it look again.
        Wake(key.clone(), n)
    });
    let conn = gw::connect(addr, via, c, from).await?;
    let shake = h2::client::Builder::new()
        .enable_push(false)
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        // An upstream's over-long Huffman padding is taken, as nginx takes it; resets
        // after a stream's reset fail its answer, as there (`conn::h2_resets`).
        .handshake::<_, Bytes>(super::h2_mend::HpackMend::new(
            super::h2_resets::Resets::new(conn, 0),
            0,
            None,
        ));
    let (send, connection) = match tokio::time::timeout(c.connect_timeout(), shake).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return Err(failure(e, SENDING)),
        Err(_) => return Err(Failure::Timeout(SENDING)),
    };
    req.upstream.borrow_mut().mark_connected();
    // The connection's frames are read and written by a task of its own; it ends when
    // the last handle on it (the kept `SendRequest`, the streams) is dropped.
    tokio::task::spawn_local(async move {
        let _ = connection.await;
    });
    let ready = tokio::time::timeout(c.send_timeout(), send.ready()).await;
    let mut send = match ready {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(failure(e, SENDING)),
        Err(_) => return Err(Failure::Timeout(SENDING)),
    };
    let r = send
        .send_request(head.request(), end)
        .map_err(|e| failure(e, SENDING))?;
    if keep {
        KEPT.with(|k| k.borrow_mut().insert(key, Kept::Ready(send)));
    }
    drop(connecting);
    Ok((r.0, r.1, false))
}

/// Let go of the server's kept connection (it is closing): the next request makes a new one.
pub(super) fn forget(via: &Via, addr: &Addr) {
    let key = (addr.to_string(), via.kind());
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        if matches!(k.get(&key), Some(Kept::Ready(_))) {
            k.remove(&key);
        }
    });
}

/// The server refused the stream without processing it (GOAWAY below its id, or
/// REFUSED_STREAM, RFC 9113 8.7): the request may go again on a new connection, whatever
/// its method.
pub(super) fn unprocessed(e: &h2::Error) -> bool {
    (e.is_go_away() && e.is_remote()) || e.reason() == Some(h2::Reason::REFUSED_STREAM)
}

/// Wakes the requests waiting for a connection being made, when dropped (made, failed,
/// or the request gone).
struct Wake((String, u64), Rc<tokio::sync::Notify>);

impl Drop for Wake {
    fn drop(&mut self) {
        KEPT.with(|k| {
            let mut k = k.borrow_mut();
            // Not made: its place is free for the next attempt.
            if matches!(k.get(&self.0), Some(Kept::Connecting(n)) if Rc::ptr_eq(n, &self.1)) {
                k.remove(&self.0);
            }
        });
        self.1.notify_waiters();
    }
}

/// An HTTP/2 error as the gateway's failure (and nginx's log wording).
pub(super) fn failure(e: h2::Error, phase: &'static str) -> Failure {
    if e.is_io() {
        if let Some(io) = e.get_io() {
            return Failure::Io(std::io::Error::new(io.kind(), io.to_string()), phase);
        }
    }
    match e.reason() {
        Some(r) if e.is_remote() && e.is_reset() => Failure::Protocol(format!(
            "upstream rejected request with error {}",
            u32::from(r)
        )),
        _ => Failure::Protocol(format!("upstream sent invalid http2 frames ({e})")),
    }
}

/// The answer's head as the gateway takes one: status and fields.
pub(super) fn cgi_head(resp: &http::response::Parts) -> CgiHead {
    let pairs: Vec<(&str, &str)> = resp
        .headers
        .iter()
        .filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?)))
        .collect();
    CgiHead {
        status: Some(resp.status.as_u16()),
        headers: Fields::from_pairs(&pairs),
    }
}

/// The answer's head within `timeout`.
pub(super) async fn answer(
    answer: &mut ResponseFuture,
    timeout: std::time::Duration,
) -> Result<http::Response<h2::RecvStream>, Failure> {
    match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(failure(e, READING_HEAD)),
        Err(_) => Err(Failure::Timeout(READING_HEAD)),
    }
}
