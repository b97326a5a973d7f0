//! One HTTP/3 request stream (`conn::h3` runs the connection): its head made into a
//! request (`$request` and `$server_protocol` say `HTTP/3.0`), the exchange every protocol
//! runs (`conn::exchange`) with HTTP/3's part in it: the body from the stream's DATA frames
//! (within `client_max_body_size` and `client_body_timeout`, adding up to the
//! Content-Length), the answer through `conn::h2_response`'s head and body writers (each
//! write within `send_timeout`, paced by `limit_rate`), then the access-log line.

use super::body::{BodyError, BodySource};
use super::exchange::{self, Exchange, Reset};
use super::gateway::{Outcome, Tunnel};
use super::h2_response::{self, BodyOut};
use super::pace::Pace;
use super::request_body::Failed;
use super::source::Source;
use super::ConnInfo;
use crate::http::flow::Handled;
use crate::http::request::Request;
use crate::http::response::Response;
use crate::modules::gateway::Streamed;
use crate::modules::limit_rate;
use crate::runtime::worker::Worker;
use bytes::{Buf, Bytes};
use gannet_proto::h1::{BodyKind, RequestHead};
use gannet_proto::uri::parse_target_with;
use h3::server::RequestStream;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

/// A request stream: quinn's bidirectional stream under h3's framing.
type Stream = RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

/// One request stream: its head, the exchange, the answer.
pub(super) async fn stream(
    w: Rc<Worker>,
    info: ConnInfo,
    group: usize,
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
    conn: quinn::Connection,
    _in_flight: super::h3::InFlight,
) {
    let g = &w.config.listens[group];
    let default = g.servers[g.default].clone();
    let timeout = default.conf.core.client_header_timeout();
    let (req, mut s) = match tokio::time::timeout(timeout, resolver.resolve_request()).await {
        Ok(Ok(r)) => r,
        // A malformed head: h3 has answered it with a stream or connection error.
        _ => return,
    };
    w.stats.request();
    let writing = w.stats.writing();
    let (parts, ()) = req.into_parts();
    // Whether a body follows: from Content-Length, else from whether the stream is known
    // to end with its head (the FIN usually comes in the head's packet). What is at hand
    // is looked at without waiting: a body's first piece, kept to go first.
    let mut first = None;
    let mut body_follows = parts.headers.contains_key(http::header::CONTENT_LENGTH);
    if !body_follows {
        match std::future::poll_fn(|cx| Poll::Ready(s.poll_recv_data(cx))).await {
            Poll::Ready(Ok(None)) => {}
            Poll::Ready(Ok(Some(mut b))) => {
                first = Some(b.copy_to_bytes(b.remaining()));
                body_follows = true;
            }
            Poll::Ready(Err(_)) => return,
            Poll::Pending => body_follows = true,
        }
    }
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fields = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()));
    let authority = parts.uri.authority().map(|a| a.as_str());
    let parsed = RequestHead::from_fields(
        parts.method.as_str(),
        target,
        authority,
        fields,
        body_follows,
        default.conf.core.header_names(),
    )
    .and_then(|head| {
        parse_target_with(head.target(), default.conf.core.merge_slashes())
            .map(|t| (head.into_http3(), t))
    });
    let mut ex = H3Exchange {
        s,
        first,
        done: !body_follows,
        conn,
    };
    match parsed {
        Ok((head, target)) => {
            let mut req = exchange::request(g, head, target, info, String::new());
            req.log_ignored_headers();
            exchange::serve(&mut ex, &w, &mut req).await;
        }
        Err(e) => {
            let line = format!("{} {target} HTTP/3.0", parts.method);
            let head = RequestHead::unparsed(Bytes::from(line), false).into_http3();
            let host = default.primary_name.clone();
            let req = Request::new(head, info, default.clone(), String::new(), None, host);
            let resp = Response::error_page(e.status(), req.conf.core.server_tokens());
            ex.send(&w, &req, resp, None).await;
        }
    }
    // A body not read to its end: the client is told to stop sending it.
    if !ex.done {
        ex.s.stop_sending(h3::error::Code::H3_NO_ERROR);
    }
    drop(writing);
}

/// HTTP/3's part in the exchange: the stream's body as its DATA frames come, its answer
/// through `conn::h2_response`'s head and body writers.
struct H3Exchange {
    s: Stream,
    /// The body's first piece, read to learn whether there is a body.
    first: Option<Bytes>,
    /// The body has been read to its end (or there is none).
    done: bool,
    conn: quinn::Connection,
}

impl H3Exchange {
    fn body<'a>(&'a mut self, req: &Request) -> H3Body<'a> {
        let core = &req.conf.core;
        H3Body {
            ex: self,
            limit: core.client_max_body_size(),
            timeout: core.client_body_timeout(),
            total: 0,
            declared: match req.head.body {
                BodyKind::Length(n) => Some(n),
                _ => None,
            },
        }
    }

    /// Send the answer and log it.
    async fn send(&mut self, w: &Worker, req: &Request, mut resp: Response, src: Option<Source>) {
        let timeout = req.conf.core.send_timeout();
        let p = h2_response::prepare(req, &mut resp, src);
        let sent_head = tokio::time::timeout(timeout, self.s.send_response(p.head)).await;
        if !matches!(sent_head, Ok(Ok(()))) {
            super::log::access(w, req, &resp, 0, 0, false);
            return;
        }
        let mut out = Out {
            s: &mut self.s,
            sent: 0,
            timeout,
            ended: false,
            trailers: p.trailing.then_some((req, &resp)),
            pace: if p.end {
                None
            } else {
                limit_rate::pace(req, &resp)
            },
        };
        let whole = if p.end {
            out.finish().await
        } else {
            h2_response::body(w, req, &resp, p.src, &mut out).await
        };
        if !whole {
            out.s.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
        }
        let sent = out.sent;
        super::log::access(w, req, &resp, p.head_len, sent, whole);
    }
}

impl Exchange for H3Exchange {
    const UPGRADES: bool = false;

    fn body_pending(&self, req: &Request, handled: &Handled) -> bool {
        !self.done && !exchange::declared_empty(req, handled)
    }

    fn body_at_hand(&mut self, _: &Request) -> bool {
        self.done
    }

    /// Nothing to say before a body: a client waiting for 100-continue sends it once its
    /// stream's credit is there, as over HTTP/2.
    async fn body_expected(&mut self, _: &Request, _: bool) -> bool {
        true
    }

    async fn keep_body(&mut self, req: &mut Request, named: bool) -> Result<u64, Failed> {
        // Kept for the application the way HTTP/1.x keeps it (memory, else a file).
        let mut src = self.body(req);
        let kept = super::request_body::read(&mut src, req, named).await?;
        let n = kept.len();
        req.body = Some(Rc::new(kept));
        Ok(n)
    }

    async fn discard_body(&mut self, req: &Request) -> Result<u64, Failed> {
        let mut src = self.body(req);
        while src.next().await.map_err(Failed::Client)?.is_some() {}
        Ok(src.total)
    }

    async fn run_streaming(
        &mut self,
        w: &Rc<Worker>,
        req: &Request,
        how: Streamed,
    ) -> (Outcome, bool, u64) {
        let mut src = self.body(req);
        let o = super::gateway::run_streaming(w, req, &mut src, how).await;
        // (A body not read to its end is refused by `stream`, after the answer.)
        (o, true, src.total)
    }

    /// The client closed the connection. (A stream the client reset alone is not seen
    /// before the answer is written to it: h3 does not expose the peer's STOP_SENDING.)
    async fn client_gone(&mut self, _: &Rc<Worker>, _: bool) {
        let _ = self.conn.closed().await;
    }

    async fn respond(&mut self, w: &Rc<Worker>, req: &Request, resp: Response, _: bool) -> bool {
        self.send(w, req, resp, None).await;
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
        self.send(w, req, resp, Some(src)).await;
        false
    }

    async fn upgrade(&mut self, _: &Rc<Worker>, _: &Request, _: Response, _: Tunnel) -> bool {
        false
    }

    fn reset(&mut self, why: Reset) {
        self.s.stop_stream(match why {
            Reset::Cancel => h3::error::Code::H3_REQUEST_CANCELLED,
            Reset::Internal => h3::error::Code::H3_INTERNAL_ERROR,
        });
    }
}

/// The sending half of a request stream.
struct Out<'a> {
    s: &'a mut Stream,
    sent: u64,
    timeout: Duration,
    ended: bool,
    trailers: Option<(&'a Request, &'a Response)>,
    pace: Option<Pace>,
}

/// The most handed to the stream per write: what `limit_rate` meters at a time.
const WRITE_MAX: usize = 64 * 1024;

impl Out<'_> {
    /// End the stream: trailers if any, then FIN.
    async fn finish(&mut self) -> bool {
        if let Some((req, resp)) = self.trailers {
            let map = h2_response::trailer_fields(req, resp);
            if !map.is_empty() {
                let sent = tokio::time::timeout(self.timeout, self.s.send_trailers(map)).await;
                if !matches!(sent, Ok(Ok(()))) {
                    return false;
                }
            }
        }
        let done = tokio::time::timeout(self.timeout, self.s.finish()).await;
        self.ended = matches!(done, Ok(Ok(())));
        self.ended
    }
}

impl BodyOut for Out<'_> {
    async fn data(&mut self, mut data: Bytes, end: bool) -> bool {
        while !data.is_empty() {
            let mut want = data.len().min(WRITE_MAX);
            if let Some(p) = &mut self.pace {
                want = want.min(p.allowance().await as usize);
                p.wrote(want as u64);
            }
            let piece = data.split_to(want);
            // Bounded by the stream's and the connection's flow-control credit: a client
            // that stops reading stalls the write, for `send_timeout` at most.
            match tokio::time::timeout(self.timeout, self.s.send_data(piece)).await {
                Ok(Ok(())) => self.sent += want as u64,
                _ => return false,
            }
        }
        !end || self.finish().await
    }

    fn ended(&self) -> bool {
        self.ended
    }
}

/// A request stream's body, DATA frame by DATA frame, within `client_max_body_size`
/// (`limit`, 0 for none) and `client_body_timeout` per frame.
struct H3Body<'a> {
    ex: &'a mut H3Exchange,
    limit: u64,
    timeout: Duration,
    total: u64,
    /// The Content-Length the head announced: the DATA must add up to it (RFC 9114 4.1.2;
    /// nginx answers a body that does not 400).
    declared: Option<u64>,
}

impl H3Body<'_> {
    async fn next(&mut self) -> Result<Option<Bytes>, BodyError> {
        loop {
            let chunk = match self.ex.first.take() {
                Some(c) => c,
                None if self.ex.done => return Ok(None),
                None => match tokio::time::timeout(self.timeout, self.ex.s.recv_data()).await {
                    Ok(Ok(Some(mut b))) => b.copy_to_bytes(b.remaining()),
                    Ok(Ok(None)) => {
                        // Trailers, if any, are read and dropped (nothing in gannet reads
                        // them).
                        let _ = tokio::time::timeout(self.timeout, self.ex.s.recv_trailers()).await;
                        self.ex.done = true;
                        if self.declared.is_some_and(|n| n != self.total) {
                            return Err(BodyError::Malformed);
                        }
                        return Ok(None);
                    }
                    _ => return Err(BodyError::Io),
                },
            };
            self.total += chunk.len() as u64;
            if self.limit > 0 && self.total > self.limit {
                return Err(BodyError::TooLarge);
            }
            if self.declared.is_some_and(|n| self.total > n) {
                return Err(BodyError::Malformed);
            }
            if !chunk.is_empty() {
                return Ok(Some(chunk));
            }
        }
    }
}

impl BodySource for H3Body<'_> {
    fn next_piece(
        &mut self,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Bytes>, BodyError>> + '_>> {
        Box::pin(self.next())
    }
}
