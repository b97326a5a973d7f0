//! FastCGI, the I/O side: connect to the application (TCP or a unix socket), send
//! BEGIN_REQUEST, PARAMS and the request body as STDIN, read STDOUT / STDERR until
//! END_REQUEST, and turn the answer into an [`Outcome`] for the request phases.
//!
//! An answer up to [`STREAM_AT`] bytes is buffered whole before it is sent: the application
//! is released as soon as it is done, and the client gets a Content-Length. A bigger one is
//! streamed as it comes ([`Streaming`], chunked to HTTP/1.1 clients, close-delimited to
//! HTTP/1.0 ones); if the application dies mid-way the client connection is closed, so the
//! client sees the answer is incomplete. With an `upstream` group, the server is picked by
//! round robin, failed servers are skipped per `fastcgi_next_upstream`, and with
//! `fastcgi_keep_conn on` plus the group's `keepalive N` connections are kept for reuse
//! (`upstream` module); a plain address gets a new connection per request, as in nginx.
//!
//! Failures map to nginx's statuses and log lines: refused or unreachable -> 502, a timeout
//! -> 504, malformed records or head -> 502, an application that closes before the end of
//! a buffered answer -> 502 (nothing has been sent to the client yet). A streamed answer
//! that fails is cut short and the client connection closed.

use crate::errlog::{self, Level};
use crate::http::handler::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use crate::modules::fastcgi::{self as conf, Answer, Backend};
use crate::runtime::worker::Worker;
use crate::upstream::{Addr, Conn, Lease, Pick, Upstream};
use bytes::{Bytes, BytesMut};
use gannet_proto::fastcgi::{self, Record};
use gannet_proto::h1::Method;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers up to this size are buffered whole; bigger ones are streamed.
pub const STREAM_AT: usize = 1024 * 1024;

/// Why a FastCGI exchange failed, with nginx's wording for the error log.
enum Failure {
    Connect(std::io::Error),
    Timeout(&'static str),
    Io(std::io::Error, &'static str),
    Protocol(String),
    /// The connection closed after part of the answer.
    Premature,
    /// The connection closed before any answer (a kept connection may simply be stale).
    ClosedEarly,
}

impl Failure {
    fn status(&self) -> u16 {
        match self {
            Failure::Timeout(_) => 504,
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
            Failure::Connect(e) => write!(f, "connect() failed ({e}) while connecting to upstream"),
            Failure::Timeout(phase) => write!(f, "upstream timed out while {phase}"),
            Failure::Io(e, phase) => write!(f, "{e} while {phase}"),
            Failure::Protocol(why) => write!(f, "{why} while reading response header from upstream"),
            Failure::Premature => {
                f.write_str("upstream prematurely closed FastCGI stdout while reading upstream")
            }
            Failure::ClosedEarly => f.write_str(
                "upstream prematurely closed connection while reading response header from upstream",
            ),
        }
    }
}

/// The application's answer: its head and body, whole (`done`, and then the connection if
/// it can be reused), or its first [`STREAM_AT`] bytes and the connection to read on.
struct Answered {
    head: fastcgi::CgiHead,
    body: BytesMut,
    done: bool,
    conn: Option<Conn>,
    /// Bytes read but not decoded yet.
    input: BytesMut,
}

/// What the request phases go on with.
pub enum Outcome {
    Flow(Flow),
    /// Send this response's head, then the body as [`Streaming::next`] gives it.
    Stream(Response, Streaming),
}

/// The rest of a big answer, read from the application while it is sent on.
pub struct Streaming {
    conn: Conn,
    input: BytesMut,
    first: Option<Bytes>,
    addr: Addr,
    done: bool,
    /// Where the connection goes back when the answer ended cleanly.
    pool: Option<(Arc<Upstream>, usize, u64)>,
    _lease: Option<Lease>,
}

impl Streaming {
    /// The next piece of the body; `Ok(None)` at its end. An error is logged and means the
    /// answer is cut short.
    pub async fn next(&mut self, req: &Request) -> Result<Option<Bytes>, ()> {
        match self.pull(req).await {
            Ok(b) => Ok(b),
            Err(f) => {
                log_failure(req, &self.addr, &f);
                Err(())
            }
        }
    }

    async fn pull(&mut self, req: &Request) -> Result<Option<Bytes>, Failure> {
        if let Some(b) = self.first.take() {
            return Ok(Some(b));
        }
        loop {
            match fastcgi::decode(&mut self.input) {
                Ok(Some(Record::Stdout(b))) => return Ok(Some(b)),
                Ok(Some(Record::Stderr(b))) => log_stderr(req, &self.addr, &b, true),
                Ok(Some(Record::End { .. })) => {
                    self.done = true;
                    return Ok(None);
                }
                Ok(None) => {}
                Err(e) => return Err(Failure::Protocol(e.to_string())),
            }
            let t = req.conf.fastcgi.read_timeout();
            if read_more(&mut self.conn, &mut self.input, t, "reading upstream").await? == 0 {
                return Err(Failure::Premature);
            }
        }
    }

    /// The answer was sent whole: keep the connection if it may be reused.
    pub fn finish(self, w: &Worker) {
        if let (true, true, Some((up, i, n))) = (self.done, self.input.is_empty(), self.pool) {
            w.upstreams.put_idle(&up, i, self.conn, n + 1);
        }
    }
}

/// Pass the request (with its body, already read) to the location's application.
pub async fn run(w: &Worker, req: &Request, body: &[u8]) -> Outcome {
    let c = &req.conf.fastcgi;
    let Some(backend) = c.pass.clone() else {
        return Outcome::Flow(Flow::Status(500));
    };
    let mut out = Vec::with_capacity(1024 + body.len() + body.len() / 8);
    fastcgi::begin_request(&mut out, c.keep_conn());
    fastcgi::params(&mut out, &conf::build_params(req, Some(body.len() as u64)));
    if c.pass_request_body.unwrap_or(true) {
        fastcgi::stdin(&mut out, body);
    }
    fastcgi::stdin_end(&mut out);

    let up = match backend {
        Backend::Addr(addr) => {
            return match fresh(req, &addr, &out).await {
                Ok(a) => outcome(req, a, addr, None, None),
                Err(f) => Outcome::Flow(failed(req, &addr, &f)),
            };
        }
        Backend::Group(up) => up,
    };
    let mut tried = Vec::new();
    let queue_deadline = tokio::time::Instant::now() + up.queue.map_or(Duration::ZERO, |(_, t)| t);
    loop {
        let now = Instant::now();
        let (i, lease) = match w.upstreams.pick(&up, &tried, now) {
            Pick::Server(i, lease) => (i, lease),
            Pick::Full if w.upstreams.wait_for_slot(&up, queue_deadline).await => continue,
            Pick::Full | Pick::None => {
                errlog::request(
                    Level::Error,
                    req,
                    format_args!(
                    "no live upstreams while connecting to upstream, upstream: \"fastcgi://{}\"",
                    up.name
                ),
                );
                return Outcome::Flow(Flow::Status(502));
            }
        };
        tried.push(i);
        let addr = &up.servers[i].addr;
        let idle = if c.keep_conn() {
            w.upstreams.take_idle(&up, i, now)
        } else {
            None
        };
        let result = match idle {
            // A kept connection the application closed meanwhile is no failure of the
            // server: try once more on a new one.
            Some((conn, n)) => match exchange(req, addr, conn, &out).await {
                Err(f) if f.stale() => fresh(req, addr, &out).await.map(|a| (a, 0)),
                r => r.map(|a| (a, n)),
            },
            None => fresh(req, addr, &out).await.map(|a| (a, 0)),
        };
        match result {
            Ok((mut a, n)) => {
                w.upstreams.succeeded(&up, i);
                let pool = c.keep_conn().then(|| (up.clone(), i, n));
                if a.done {
                    if let (Some(conn), Some((up, i, n))) = (a.conn.take(), &pool) {
                        w.upstreams.put_idle(up, *i, conn, n + 1);
                    }
                }
                return outcome(req, a, addr.clone(), pool, Some(lease));
            }
            Err(f) => {
                let flow = failed(req, addr, &f);
                w.upstreams.failed(&up, i, Instant::now());
                if tried.len() >= up.servers.len() || !retryable(&f, req) {
                    return Outcome::Flow(flow);
                }
            }
        }
    }
}

fn log_failure(req: &Request, addr: &Addr, f: &Failure) {
    errlog::request(
        Level::Error,
        req,
        format_args!("{f}, upstream: \"fastcgi://{addr}\""),
    );
}

fn failed(req: &Request, addr: &Addr, f: &Failure) -> Flow {
    log_failure(req, addr, f);
    Flow::Status(f.status())
}

/// Read what the application sent next into `input`; 0 is the end of the stream.
async fn read_more(
    s: &mut Conn,
    input: &mut BytesMut,
    timeout: Duration,
    phase: &'static str,
) -> Result<usize, Failure> {
    input.reserve(16 * 1024);
    match timed(timeout, s.read_buf(input)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(Failure::Io(e, phase)),
        Err(()) => Err(Failure::Timeout(phase)),
    }
}

/// Whether `fastcgi_next_upstream` (default `error timeout`) sends the request on to the
/// next server after this failure. A request already sent is retried only if it is
/// idempotent or `non_idempotent` is listed, as in nginx.
fn retryable(f: &Failure, req: &Request) -> bool {
    let list = req.conf.fastcgi.next_upstream.as_deref();
    let has = |k: &str| match list {
        Some(l) => l.iter().any(|x| x == k),
        None => k == "error" || k == "timeout",
    };
    if has("off") {
        return false;
    }
    let (kind, sent) = match f {
        Failure::Connect(_) => ("error", false),
        Failure::Timeout(phase) => ("timeout", *phase != CONNECTING),
        Failure::Io(..) | Failure::Premature | Failure::ClosedEarly => ("error", true),
        Failure::Protocol(_) => ("invalid_header", true),
    };
    // RFC 9110's idempotent methods; nginx retries only these unless told otherwise.
    let idempotent = matches!(
        req.method(),
        Method::Get | Method::Head | Method::Put | Method::Delete | Method::Options | Method::Trace
    );
    has(kind) && (!sent || idempotent || has("non_idempotent"))
}

const CONNECTING: &str = "connecting to upstream";

async fn connect(addr: &Addr, timeout: Duration) -> Result<Conn, Failure> {
    let r = match addr {
        Addr::Tcp(a) => timed(timeout, tokio::net::TcpStream::connect(a.as_str()))
            .await
            .map(|r| {
                r.map(|s| {
                    let _ = s.set_nodelay(true);
                    Box::new(s) as Conn
                })
            }),
        Addr::Unix(p) => timed(timeout, tokio::net::UnixStream::connect(p))
            .await
            .map(|r| r.map(|s| Box::new(s) as Conn)),
    };
    match r {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(Failure::Connect(e)),
        Err(()) => Err(Failure::Timeout(CONNECTING)),
    }
}

/// A whole answer goes on as a flow; the head of a big one as a stream.
fn outcome(
    req: &Request,
    mut a: Answered,
    addr: Addr,
    pool: Option<(Arc<Upstream>, usize, u64)>,
    lease: Option<Lease>,
) -> Outcome {
    let streaming = (!a.done).then(|| (a.conn.take(), std::mem::take(&mut a.input)));
    let first = std::mem::take(&mut a.body);
    match (answer(req, a.head), streaming) {
        (Flow::Done(mut resp), None) => {
            if !first.is_empty() {
                resp.body = Body::bytes(first.freeze());
            }
            Outcome::Flow(Flow::Done(resp))
        }
        (Flow::Done(resp), Some((Some(conn), input))) => Outcome::Stream(
            resp,
            Streaming {
                conn,
                input,
                first: (!first.is_empty()).then(|| first.freeze()),
                addr,
                done: false,
                pool,
                _lease: lease,
            },
        ),
        // A redirect or an intercepted error: the rest of the answer is not wanted.
        (flow, _) => Outcome::Flow(flow),
    }
}

/// One exchange on a new connection.
async fn fresh(req: &Request, addr: &Addr, out: &[u8]) -> Result<Answered, Failure> {
    let conn = connect(addr, req.conf.fastcgi.connect_timeout()).await?;
    exchange(req, addr, conn, out).await
}

async fn timed<T>(d: Duration, f: impl std::future::Future<Output = T>) -> Result<T, ()> {
    tokio::time::timeout(d, f).await.map_err(|_| ())
}

/// Send the request and read the answer, whole or its first [`STREAM_AT`] bytes. A whole
/// answer brings the connection back when it ended cleanly (END_REQUEST and nothing after
/// it), for reuse.
async fn exchange(
    req: &Request,
    addr: &Addr,
    mut s: Conn,
    out: &[u8],
) -> Result<Answered, Failure> {
    let c = &req.conf.fastcgi;
    match timed(c.send_timeout(), s.write_all(out)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(Failure::Io(e, "sending request to upstream")),
        Err(()) => return Err(Failure::Timeout("sending request to upstream")),
    }
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut stdout = BytesMut::new();
    let mut head = None;
    let mut got_any = false;
    loop {
        loop {
            let record =
                fastcgi::decode(&mut input).map_err(|e| Failure::Protocol(e.to_string()))?;
            match record {
                None => break,
                Some(Record::Stdout(b)) => {
                    stdout.extend_from_slice(&b);
                    if head.is_none() {
                        head = fastcgi::parse_head(&mut stdout, c.buffer_size())
                            .map_err(|e| Failure::Protocol(e.to_string()))?;
                    }
                    if stdout.len() >= STREAM_AT {
                        if let Some(head) = head.take() {
                            return Ok(Answered {
                                head,
                                body: stdout,
                                done: false,
                                conn: Some(s),
                                input,
                            });
                        }
                    }
                }
                Some(Record::Stderr(b)) => log_stderr(req, addr, &b, head.is_some()),
                Some(Record::End { .. }) => {
                    let reusable = input.is_empty();
                    return match head {
                        Some(head) => Ok(Answered {
                            head,
                            body: stdout,
                            done: true,
                            conn: reusable.then_some(s),
                            input,
                        }),
                        None if stdout.is_empty() => Err(Failure::Protocol(
                            "upstream sent no valid FastCGI stdout".into(),
                        )),
                        None => Err(Failure::Protocol("upstream sent invalid header".into())),
                    };
                }
            }
        }
        let phase = if head.is_some() {
            "reading upstream"
        } else {
            "reading response header from upstream"
        };
        match read_more(&mut s, &mut input, c.read_timeout(), phase).await? {
            0 if !got_any => return Err(Failure::ClosedEarly),
            0 => return Err(Failure::Premature),
            _ => got_any = true,
        }
    }
}

/// Each STDERR line goes to the error log, as nginx logs them.
fn log_stderr(req: &Request, addr: &Addr, msg: &[u8], in_body: bool) {
    let text = String::from_utf8_lossy(msg);
    let text = text.trim_end_matches(['\r', '\n']);
    let phase = if in_body {
        "reading upstream"
    } else {
        "reading response header from upstream"
    };
    errlog::request(
        Level::Error,
        req,
        format_args!(
            "FastCGI sent in stderr: \"{text}\" while {phase}, upstream: \"fastcgi://{addr}\""
        ),
    );
}

/// The answer's head as the next step of the request phases (the caller adds the body).
fn answer(req: &Request, head: fastcgi::CgiHead) -> Flow {
    let c = &req.conf.fastcgi;
    let (status, head) = match conf::classify(head) {
        Answer::LocalRedirect(uri) => return Flow::Redirect(uri),
        Answer::Respond(s, h) => (s, h),
    };
    if status >= 300 && c.intercept_errors() && req.conf.error_page.find(status).is_some() {
        return Flow::Status(status);
    }
    let mut resp = Response::new(status);
    if req.is_head() {
        // The application answered HEAD without a body: its Content-Length, if it gave
        // one, is the only true one.
        resp.content_length = head.get("content-length").and_then(|v| v.parse().ok());
        resp.length_unknown = resp.content_length.is_none();
    }
    for (name, value) in head.headers {
        if name.eq_ignore_ascii_case("content-type") {
            resp.content_type = Some(Arc::from(value.as_str()));
        } else if name.eq_ignore_ascii_case("location") {
            resp.location = Some(value);
        } else if conf::passes(c, &name) {
            resp.headers.push((name.into(), value));
        }
    }
    Flow::Done(resp)
}
