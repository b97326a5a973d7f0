//! One request's exchange, written once for every protocol: the server the request is
//! for, nginx's TLS refusals, the phases (`http::handler`), the request body (read whole
//! for an application or a DAV `PUT`, passed on as it comes with `*_request_buffering
//! off`, else read off and dropped), `mirror`, the race between an application and a
//! client that leaves (499), a CGI local redirect, and the answer.
//!
//! A protocol takes part through [`Exchange`]: it reads the body, says when the client
//! left, sends the answer and refuses what it cannot carry. HTTP/1.x implements it on its
//! connection (`conn::h1`, no allocation per request), HTTP/2 on a stream (`conn::h2`);
//! a new protocol needs only such an adapter.

use super::body::BodyError;
use super::gateway::{Outcome, Tunnel};
use super::grpc::Served;
use super::request_body::Failed;
use super::source::Source;
use super::ConnInfo;
use crate::config::ListenGroup;
use crate::errlog::{self, Level};
use crate::http::encoder::Encoder;
use crate::http::flow::{Flow, Handled};
use crate::http::handler;
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::router::select_server;
use crate::modules::gateway::Streamed;
use crate::modules::image_filter;
use crate::runtime::worker::Worker;
use bytes::Bytes;
use gannet_proto::h1::{BodyKind, Method, RequestHead};
use gannet_proto::uri::Target;
use std::rc::Rc;

/// How a protocol carries one request's exchange (see the module docs). The exchange calls
/// these in order: maybe [`Exchange::body_at_hand`], then [`Exchange::body_expected`]
/// and one of the body reads, then one answer ([`Exchange::respond`],
/// [`Exchange::respond_streamed`], [`Exchange::upgrade`]) or [`Exchange::reset`]. `keep`
/// is HTTP/1.x's "the connection may stay open": other protocols ignore it and return
/// anything.
///
/// A protocol whose messages are `http::Request` / `http::Response` streams (HTTP/2,
/// HTTP/3) implements the body reads over its stream of DATA chunks (`Failed::Client`
/// with `BodyError::TooLarge` past `client_max_body_size`, `BodyError::Io` when the client
/// is gone or slower than `client_body_timeout`), and the answers through the response
/// head HTTP/2 builds (`conn::h2_response`: the same fields as HTTP/1.x less the
/// connection-specific ones), DATA in `http2_chunk_size` pieces and `add_trailer`'s fields.
/// (`conn::h2`'s `H2Exchange` is the model.)
#[allow(async_fn_in_trait)] // futures stay on the worker's thread: no Send bound wanted
pub trait Exchange {
    /// The protocol can switch to another one (a 101 answer and a tunnel): HTTP/1.x only.
    /// Elsewhere an application's 101 is answered 502.
    const UPGRADES: bool;
    /// The protocol passes gRPC through itself ([`Exchange::grpc`]), both ways at once.
    const GRPC: bool = false;
    /// A body nobody wants that has not all arrived is read off after the answer, which
    /// does not wait for it (HTTP/1.x: nginx's ngx_http_discard_request_body reads what is
    /// there and the rest as it comes; the other protocols read off a stream's body apart).
    const DISCARDS_AFTER: bool = false;

    /// Whether a body is announced and still to come from the client (HTTP/1.x: the head
    /// announced one; HTTP/2: the stream is not ended). `handled` is the phases' answer.
    fn body_pending(&self, req: &Request, handled: &Handled) -> bool;

    /// With `*_request_buffering off`: whether the whole body is at hand already, so it is
    /// read whole rather than passed on as it comes.
    fn body_at_hand(&mut self, req: &Request) -> bool;

    /// The body is about to be read (`wanted`: for an application or a PUT; else read off):
    /// HTTP/1.x answers `Expect: 100-continue` and flushes earlier pipelined answers.
    /// Returns false when the connection broke.
    async fn body_expected(&mut self, req: &Request, wanted: bool) -> bool;

    /// Read the body whole into `req.body` (memory or temporary file, `conn::request_body`;
    /// a named file if `named`), returning its length.
    async fn keep_body(&mut self, req: &mut Request, named: bool) -> Result<u64, Failed>;

    /// Read the body off and drop it (within `client_max_body_size`), returning its length.
    async fn discard_body(&mut self, req: &Request) -> Result<u64, Failed>;

    /// Run the application with the body passed on as it arrives
    /// (`gateway::run_streaming`). Returns the outcome, whether the body was read to its
    /// end, and how much of it was read.
    async fn run_streaming(
        &mut self,
        w: &Rc<Worker>,
        req: &Request,
        how: Streamed,
    ) -> (Outcome, bool, u64);

    /// Ends when the client has gone (closed the connection, reset the stream). `at_once`:
    /// watched from now on, even where watching costs system calls that a short exchange
    /// would not need (the request holds a `limit_conn` count, which a client that left
    /// must give back as soon as nginx's would).
    async fn client_gone(&mut self, w: &Rc<Worker>, at_once: bool);

    /// Send the answer (its body held in memory or files, or rewritten while sent) and log
    /// it. Returns whether the connection stays open.
    async fn respond(&mut self, w: &Rc<Worker>, req: &Request, resp: Response, keep: bool) -> bool;

    /// Send what the last answer left buffered (HTTP/1.x copies a short answer into its
    /// output buffer and writes it before it reads on; HTTP/2 and HTTP/3 hand each answer
    /// to their connection as it is made).
    async fn flush_answer(&mut self) {}

    /// Send an answer whose body comes from `src` (an application's), and log it.
    async fn respond_streamed(
        &mut self,
        w: &Rc<Worker>,
        req: &Request,
        resp: Response,
        src: Source,
        keep: bool,
    ) -> bool;

    /// Send the 101 head, then relay both ways (only called when [`Exchange::UPGRADES`]).
    async fn upgrade(&mut self, w: &Rc<Worker>, req: &Request, resp: Response, t: Tunnel) -> bool;

    /// End the exchange without an answer (`return 444`, a broken slice).
    fn reset(&mut self, why: Reset);

    /// gRPC both ways (only called when [`Exchange::GRPC`]).
    async fn grpc(&mut self, w: &Rc<Worker>, req: &mut Request) -> Served {
        let _ = (w, req);
        Served::Flow(Flow::Status(502))
    }

    /// The request came as plain HTTP on a TLS address (HTTP/1.x only): refused 497.
    fn plain_on_tls(&self) -> bool {
        false
    }
}

/// Why an exchange ends without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// Closed on purpose (`return 444`).
    Cancel,
    /// The answer broke before its head (a slice that does not fit).
    Internal,
}

/// The status a request that could not be parsed is answered with: the parser's, except
/// for a head over the limits (too many fields, a field or the whole head too long), which
/// nginx refuses with its own code 494, sent as `400 Request Header Or Cookie Too Large`.
pub fn refusal_status(e: &gannet_proto::h1::ParseError) -> u16 {
    match e {
        gannet_proto::h1::ParseError::HeaderTooLarge => 494,
        e => e.status(),
    }
}

/// The request for a parsed head: the server its host names in `group` (the target's host
/// in absolute form, else the Host header's; lowercased, without port or trailing dot, as
/// nginx's `ngx_http_validate_host`), `$host` (the server's name when none came).
/// `spare` is a buffer for `$host` (`http::request::spare_strings`). The caller logs the
/// head's ignored fields (`Request::log_ignored_headers`): the request is built straight
/// in the caller's place, not moved out of this function (two copies of it, ~1 KiB each).
pub fn request(
    g: &ListenGroup,
    head: RequestHead,
    target: Target,
    info: ConnInfo,
    spare: String,
) -> Request {
    // Both validated as nginx's `ngx_http_validate_host` (`gannet_proto`): the trailing
    // dot is off already.
    let host = match (target.host.as_deref(), head.host()) {
        (Some(h), _) => h.to_string(),
        (None, Some(h)) => lowercase(h, spare),
        (None, None) => String::new(),
    };
    let server = select_server(&g.servers, g.default, &host).clone();
    let host = if host.is_empty() {
        server.primary_name.clone()
    } else {
        host
    };
    Request::new(head, info, server, target.path, target.query, host)
}

/// `$host` from the Host header's host part (without port or trailing dot): one String
/// (`spare`'s room), lowercased in place.
fn lowercase(host: &[u8], mut spare: String) -> String {
    if host.is_ascii() {
        spare.clear();
        // SAFETY: ASCII bytes are UTF-8. (`from_utf8` took 97 instructions for
        // `127.0.0.1`, `is_ascii` a third of that; callgrind.)
        spare.push_str(unsafe { std::str::from_utf8_unchecked(host) });
        spare.make_ascii_lowercase();
        return spare;
    }
    // UTF-8 is checked and copied lowercased in one go; the lossy conversion's chunk
    // iterator cost more than the rest together (callgrind).
    match std::str::from_utf8(host) {
        Ok(h) => h.to_ascii_lowercase(),
        Err(_) => {
            let mut s = String::from_utf8_lossy(host).into_owned();
            s.make_ascii_lowercase();
            s
        }
    }
}

/// Drive `req` through the server to its answer over `ex`. Returns whether the connection
/// may stay open (HTTP/1.x).
pub async fn serve<E: Exchange>(ex: &mut E, w: &Rc<Worker>, req: &mut Request) -> bool {
    req.store_after_answer = true;
    let mut keep = req.head.keep_alive;
    let refusal = if matches!(req.head.method, Method::Trace | Method::Connect) {
        // nginx refuses both once the head is read (`ngx_http_process_request_header`),
        // before anything else runs, on every protocol, and closes the connection after
        // its 405 (refused before keep-alive is settled).
        Some((405, format!("client sent {} method", req.head.method_str())))
    } else if ex.plain_on_tls() {
        Some((
            497,
            "client sent plain HTTP request to HTTPS port".to_string(),
        ))
    } else {
        req.conn.tls.as_ref().and_then(|t| match &req.server.tls {
            Some(s) => t.refusal(s),
            None => t.refusal_by_mode(req.server.conf.tls.verify_client(), &req.host),
        })
    };
    let handled = match refusal {
        // nginx's own status (497, 495, 496) or 421, through `error_page` like any other;
        // the connection closes after the answer.
        Some((status, why)) => {
            errlog::request(Level::Info, req, format_args!("{why}"));
            keep = false;
            handler::resume(req, w, Flow::Status(status))
        }
        None => handler::handle(req, w),
    };
    // The rare branches' futures (a wait, a request body, an upgrade, gRPC, the image
    // filter) are boxed where they are taken: inline, each would widen this future - which
    // every request allocates - to its own size, for requests that never take them.
    let handled = if matches!(handled, Handled::Delay(_)) {
        // A `limit_req` delay ends early when the client leaves (nginx's
        // ngx_http_test_reading): the request is done then, logged 499.
        let at_once = !req.limit_conns.is_empty();
        let raced = {
            let mut settled = Box::pin(handler::settle(req, w, handled));
            let gone = std::pin::pin!(ex.client_gone(w, at_once));
            race(settled.as_mut(), gone).await
        };
        match raced {
            Some(h) => h,
            None => {
                let why = "client prematurely closed connection";
                errlog::request(Level::Info, req, format_args!("{why}"));
                super::log::access(w, req, &Response::new(499), 0, 0, false);
                return false;
            }
        }
    } else if handler::waits(&handled) {
        Box::pin(handler::settle(req, w, handled)).await
    } else {
        handled
    };
    let kept = answer(ex, w, req, handled, keep).await;
    store_after(ex, req).await;
    kept
}

/// A body of a length within `client_body_buffer_size` (and `client_max_body_size`): what
/// is read off after the answer. A larger (or chunked) one is read off before it, as a
/// client that sends all before it reads would otherwise block on its sending while the
/// answer waits for it to read; one over the limit closes the connection after its 413.
fn small_length(req: &Request) -> bool {
    let buffer = req.conf.client_body.buffer_size();
    let limit = req.conf.core.client_max_body_size();
    matches!(req.head.body, BodyKind::Length(n) if n <= buffer && (limit == 0 || n <= limit))
}

/// A request whose head nginx refuses (a 400 found by the protocol's own checks): answered
/// through the server's `error_page` like any other status (nginx finalizes it so), where
/// a `return 444` ends the exchange without an answer.
pub async fn refuse<E: Exchange>(ex: &mut E, w: &Rc<Worker>, req: &mut Request, status: u16) {
    req.store_after_answer = true;
    let handled = handler::resume(req, w, Flow::Status(status));
    answer(ex, w, req, handled, false).await;
    store_after(ex, req).await;
}

/// The cache entry of an answer held in memory (`gateway_cache::Tee::finish`), put in
/// place once the answer is out, before the connection reads on.
async fn store_after<E: Exchange>(ex: &mut E, req: &mut Request) {
    if let Some(tee) = req.store_after.get_mut().take() {
        // Boxed: a miss's step, which would otherwise widen every request's future.
        Box::pin(async {
            ex.flush_answer().await;
            tee.commit().await;
        })
        .await;
    }
}

/// The request's body and answer once the phases have said what to do (`handled`).
async fn answer<E: Exchange>(
    ex: &mut E,
    w: &Rc<Worker>,
    req: &mut Request,
    mut handled: Handled,
    mut keep: bool,
) -> bool {
    // gRPC streams both ways from the head on (`conn::grpc`): the body is not read first,
    // unless a mirror needs it (below), as in nginx.
    if E::GRPC
        && matches!(handled, Handled::Gateway)
        && super::grpc::is_grpc(req)
        && req.conf.mirror.uris().is_empty()
    {
        match Box::pin(ex.grpc(w, req)).await {
            Served::Done => return false,
            Served::Flow(flow) => handled = handler::resume(req, w, flow),
        }
    }
    // `*_request_buffering off`: the gateway reads the body itself, passing it on as it
    // arrives (unless it is all here already).
    let mut stream_body = match handled {
        Handled::Gateway => super::gateway::streams(req),
        _ => None,
    };
    if stream_body.is_some() && ex.body_at_hand(req) {
        stream_body = None;
    }
    let mut discard_after = false;
    if ex.body_pending(req, &handled) {
        let wanted = matches!(handled, Handled::Gateway | Handled::Put);
        // The body is read before the answer: kept for an application, else read off and
        // dropped - unless nobody wants it and the client waits for 100-continue (it will
        // not send it), or the answer is to close anyway. (HTTP/2 then reads off what
        // comes after the answer; answering every unwanted body first would close the
        // stream's sending side early, and a WINDOW_UPDATE overflow on it would then go
        // unanswered, which h2spec 6.9.1 checks.)
        if !wanted && (req.head.expect_continue || matches!(handled, Handled::Close)) {
            keep = false;
        } else if E::DISCARDS_AFTER
            && !wanted
            && keep
            && matches!(handled, Handled::Respond(_))
            && req.conf.mirror.uris().is_empty()
            && small_length(req)
            && !ex.body_at_hand(req)
        {
            discard_after = true;
        } else {
            if !ex.body_expected(req, wanted).await {
                return false;
            }
            let read = match stream_body {
                Some(_) => Ok(0),
                None if wanted => {
                    Box::pin(ex.keep_body(req, matches!(handled, Handled::Put))).await
                }
                None => Box::pin(ex.discard_body(req)).await,
            };
            match read {
                Ok(n) => req.body_length = n,
                Err(e) => {
                    keep = false;
                    let malformed = e == Failed::Client(BodyError::Malformed);
                    if malformed {
                        errlog::request(
                            Level::Info,
                            req,
                            format_args!("client sent invalid chunked body"),
                        );
                    }
                    let answered = matches!(&handled, Handled::Respond(r) if r.status < 400);
                    if !wanted && malformed && answered {
                        // nginx reads off (discards) a body before a `return`, a file or
                        // any other answer that is not an error already, and a broken
                        // chunked body turns it into a 400; an error answer stands.
                        handled = handler::resume(req, w, Flow::Status(400));
                    }
                    if wanted {
                        // The application cannot be given half a body.
                        let Some(status) = e.status() else {
                            return false;
                        };
                        handled = handler::resume(req, w, Flow::Status(status));
                    }
                }
            }
        }
    }
    if let Handled::Put = handled {
        handled = handler::put_body_read(req, w);
    }
    super::mirror::spawn(w, req);
    loop {
        match handled {
            Handled::Respond(resp) if discard_after => {
                // The body's rest is read off after the answer, flushed first (it waits
                // for no more than that): before the next request, or before the close of
                // an answer that closes (so that the close does not reset it with bytes
                // unread, as nginx's lingering close). A connection where that fails
                // closes.
                let kept = ex.respond(w, req, resp, keep).await;
                let drained = ex.body_expected(req, false).await
                    && Box::pin(ex.discard_body(req)).await.is_ok();
                return kept && drained;
            }
            Handled::Respond(resp) => return ex.respond(w, req, resp, keep).await,
            Handled::Put => handled = handler::put_body_read(req, w),
            Handled::Close => {
                ex.reset(Reset::Cancel);
                return false;
            }
            waiting @ (Handled::Delay(_)
            | Handled::AuthRequest(_)
            | Handled::LimitReqShared(_)
            | Handled::LimitConnShared(_)) => {
                handled = Box::pin(handler::settle(req, w, waiting)).await
            }
            Handled::Gateway if E::GRPC && super::grpc::is_grpc(req) => {
                // The body, if any, was read whole (a mirror, an error_page's request).
                match Box::pin(ex.grpc(w, req)).await {
                    Served::Done => return false,
                    Served::Flow(flow) => handled = handler::resume(req, w, flow),
                }
            }
            Handled::Gateway => {
                let outcome = match stream_body.take() {
                    Some(how) => {
                        // (A content-length over the limit never gets here unread: the
                        // location phase answers it 413.)
                        let (o, finished, n) = Box::pin(ex.run_streaming(w, req, how)).await;
                        // The rest of a body the upstream did not wait for is not read:
                        // the connection closes after the answer.
                        keep &= finished;
                        req.body_length = n;
                        o
                    }
                    None if super::gateway::ignores_client_abort(req) => {
                        super::gateway::run(w, req).await
                    }
                    None => {
                        let at_once = !req.limit_conns.is_empty();
                        let raced = {
                            let exchange = std::pin::pin!(super::gateway::run(w, req));
                            let gone = std::pin::pin!(ex.client_gone(w, at_once));
                            super::gateway::unless_client_leaves(req, exchange, gone).await
                        };
                        match raced {
                            Some(o) => o,
                            None => {
                                super::log::access(w, req, &Response::new(499), 0, 0, false);
                                return false;
                            }
                        }
                    }
                };
                let flow = match outcome {
                    Outcome::Flow(f) => f,
                    Outcome::Upgrade(resp, tunnel) if E::UPGRADES => {
                        return Box::pin(ex.upgrade(w, req, resp, *tunnel)).await;
                    }
                    // No Upgrade here (HTTP/2: RFC 9113, 8.2.2): a 101 is a broken
                    // upstream's.
                    Outcome::Upgrade(..) => Flow::Status(502),
                    Outcome::Stream(resp, mut stream) if image_filter::applies(req) => {
                        // The image filter needs the whole answer before its head.
                        let resp = Box::pin(image_filter::read_whole(req, resp, &mut stream)).await;
                        handled = handler::filters(req, resp);
                        continue;
                    }
                    Outcome::Stream(mut resp, stream) => {
                        // A broken slice: no answer, as nginx closes.
                        if !handler::finish_streamed(req, &mut resp) {
                            ex.reset(Reset::Internal);
                            return false;
                        }
                        let src = Source::App(stream);
                        return ex.respond_streamed(w, req, resp, src, keep).await;
                    }
                };
                if matches!(flow, Flow::Redirect(_)) && !req.is_head() {
                    // A CGI local redirect is served as a GET (RFC 3875, 6.2.2).
                    req.method_override = Some(Method::Get);
                }
                // The body read whole stays, as nginx's `r->request_body`: an error page or
                // local redirect reads it in `$request_body`, and passes it on again if it
                // reaches an application (with GET, as nginx).
                handled = handler::resume(req, w, flow);
            }
        }
    }
}

/// HTTP/2's rule for a body declared empty (Content-Length: 0) on a stream not ended yet:
/// a proxied application that takes bodies unbuffered is asked at once, without waiting
/// for the stream's end, as nginx does (a buffered one waits for it, as there; a FastCGI
/// one is sent the request at once and the empty STDIN record that ends the body at the
/// stream's end, `gateway::streams`).
pub fn declared_empty(req: &Request, handled: &Handled) -> bool {
    matches!(req.head.body, BodyKind::Length(0))
        && matches!(handled, Handled::Gateway)
        && super::gateway::unbuffered(req)
            .is_some_and(|p| p != crate::modules::gateway::Proto::FastCgi)
}

/// A body compressed while sent (`resp.encode`: a large file, an application's answer),
/// piece by piece, as every protocol sends it; without `encode` the pieces go as they are.
pub struct Compress(Option<Encoder>);

impl Compress {
    /// `None` (logged) when the encoder cannot be made: the answer is aborted.
    pub fn new(req: &Request, resp: &Response) -> Option<Compress> {
        match resp.encode.map(|(c, level)| Encoder::new(c, level)) {
            None => Some(Compress(None)),
            Some(Ok(e)) => Some(Compress(Some(e))),
            Some(Err(e)) => {
                compress_failed(req, &e);
                None
            }
        }
    }

    /// What to send for the next piece of the body (`None`: its end, for the encoder's
    /// last bytes). `flush`: the source may pause before its next piece, so what was
    /// compressed so far goes now. `None` when compression failed (logged).
    pub fn piece(&mut self, req: &Request, data: Option<Bytes>, flush: bool) -> Option<Bytes> {
        let out = match (data, &mut self.0) {
            (Some(data), None) => return Some(data),
            (None, None) => return Some(Bytes::new()),
            (Some(data), Some(e)) => e
                .write(&data)
                .and_then(|()| if flush { e.flush() } else { Ok(()) })
                .map(|()| e.take().into()),
            (None, Some(_)) => match self.0.take() {
                Some(e) => e.finish().map(Bytes::from),
                None => Ok(Bytes::new()),
            },
        };
        out.map_err(|e| compress_failed(req, &e)).ok()
    }
}

fn compress_failed(req: &Request, e: &std::io::Error) {
    errlog::request(
        Level::Error,
        req,
        format_args!("compression failed, response aborted: {e}"),
    );
}

/// `fut`'s output, or `None` if `gone` ends first.
async fn race<F: std::future::Future>(
    mut fut: std::pin::Pin<&mut F>,
    mut gone: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(out));
        }
        gone.as_mut().poll(cx).map(|()| None)
    })
    .await
}
