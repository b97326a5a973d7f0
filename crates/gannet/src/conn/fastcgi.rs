//! FastCGI, the I/O side: connect to the application (TCP or a unix socket), send
//! BEGIN_REQUEST, PARAMS and the request body as STDIN, read STDOUT / STDERR until
//! END_REQUEST, and turn the answer into a [`Flow`] for the request phases.
//!
//! The answer is buffered whole before it is sent (nginx's `fastcgi_buffering on`, the
//! default): the application is released as soon as it is done, and the client gets a
//! Content-Length. Up to [`MAX_BUFFERED`] bytes; a bigger answer is refused with 502 (the
//! streaming path is not built yet). With an `upstream` group, the server is picked by
//! round robin, failed servers are skipped per `fastcgi_next_upstream`, and with
//! `fastcgi_keep_conn on` plus the group's `keepalive N` connections are kept for reuse
//! (`upstream` module); a plain address gets a new connection per request, as in nginx.
//!
//! Failures map to nginx's statuses and log lines: refused or unreachable -> 502, a timeout
//! -> 504, malformed records or head -> 502, an application that closes before the end of
//! its answer -> 502. Nothing has been sent to the client at that point, so it always gets
//! a whole answer.

use crate::errlog::{self, Level};
use crate::http::handler::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use crate::modules::fastcgi::{self as conf, Answer, Backend};
use crate::runtime::worker::Worker;
use crate::upstream::{Addr, Conn, Pick};
use bytes::BytesMut;
use gannet_proto::fastcgi::{self, Record};
use gannet_proto::h1::Method;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The largest answer kept in memory.
pub const MAX_BUFFERED: usize = 64 * 1024 * 1024;

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
    TooBig,
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
            Failure::TooBig => write!(
                f,
                "upstream response is bigger than {MAX_BUFFERED} bytes, which gannet does not buffer yet"
            ),
        }
    }
}

/// The application's whole answer.
struct Answered {
    head: fastcgi::CgiHead,
    body: BytesMut,
}

/// Pass the request (with its body, already read) to the location's application.
pub async fn run(w: &Worker, req: &Request, body: &[u8]) -> Flow {
    let c = &req.conf.fastcgi;
    let Some(backend) = c.pass.clone() else {
        return Flow::Status(500);
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
                Ok((a, _)) => answer(req, a),
                Err(f) => failed(req, &addr, &f),
            };
        }
        Backend::Group(up) => up,
    };
    let mut tried = Vec::new();
    let queue_deadline = tokio::time::Instant::now() + up.queue.map_or(Duration::ZERO, |(_, t)| t);
    loop {
        let now = Instant::now();
        let (i, _lease) = match w.upstreams.pick(&up, &tried, now) {
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
                return Flow::Status(502);
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
                Err(f) if f.stale() => fresh(req, addr, &out).await.map(|(a, k)| (a, k, 0)),
                r => r.map(|(a, k)| (a, k, n)),
            },
            None => fresh(req, addr, &out).await.map(|(a, k)| (a, k, 0)),
        };
        match result {
            Ok((a, kept, n)) => {
                w.upstreams.succeeded(&up, i);
                if let Some(conn) = kept.filter(|_| c.keep_conn()) {
                    w.upstreams.put_idle(&up, i, conn, n + 1);
                }
                return answer(req, a);
            }
            Err(f) => {
                let flow = failed(req, addr, &f);
                w.upstreams.failed(&up, i, Instant::now());
                if tried.len() >= up.servers.len() || !retryable(&f, req) {
                    return flow;
                }
            }
        }
    }
}

fn failed(req: &Request, addr: &Addr, f: &Failure) -> Flow {
    errlog::request(
        Level::Error,
        req,
        format_args!("{f}, upstream: \"fastcgi://{addr}\""),
    );
    Flow::Status(f.status())
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
        Failure::TooBig => return false,
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

/// One exchange on a new connection.
async fn fresh(
    req: &Request,
    addr: &Addr,
    out: &[u8],
) -> Result<(Answered, Option<Conn>), Failure> {
    let conn = connect(addr, req.conf.fastcgi.connect_timeout()).await?;
    exchange(req, addr, conn, out).await
}

async fn timed<T>(d: Duration, f: impl std::future::Future<Output = T>) -> Result<T, ()> {
    tokio::time::timeout(d, f).await.map_err(|_| ())
}

/// Send the request and read the whole answer. The connection comes back when the answer
/// ended cleanly (END_REQUEST and nothing after it), for reuse.
async fn exchange(
    req: &Request,
    addr: &Addr,
    mut s: Conn,
    out: &[u8],
) -> Result<(Answered, Option<Conn>), Failure> {
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
                    if stdout.len() + b.len() > MAX_BUFFERED {
                        return Err(Failure::TooBig);
                    }
                    stdout.extend_from_slice(&b);
                    if head.is_none() {
                        head = fastcgi::parse_head(&mut stdout, c.buffer_size())
                            .map_err(|e| Failure::Protocol(e.to_string()))?;
                    }
                }
                Some(Record::Stderr(b)) => log_stderr(req, addr, &b, head.is_some()),
                Some(Record::End { .. }) => {
                    let reusable = input.is_empty();
                    return match head {
                        Some(head) => Ok((Answered { head, body: stdout }, reusable.then_some(s))),
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
        input.reserve(16 * 1024);
        match timed(c.read_timeout(), s.read_buf(&mut input)).await {
            Ok(Ok(0)) if !got_any => return Err(Failure::ClosedEarly),
            Ok(Ok(0)) => return Err(Failure::Premature),
            Ok(Ok(_)) => got_any = true,
            Ok(Err(e)) => return Err(Failure::Io(e, phase)),
            Err(()) => return Err(Failure::Timeout(phase)),
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

/// The answer as the next step of the request phases.
fn answer(req: &Request, a: Answered) -> Flow {
    let c = &req.conf.fastcgi;
    let (status, head) = match conf::classify(a.head) {
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
    if !a.body.is_empty() {
        resp.body = Body::bytes(a.body.freeze());
    }
    Flow::Done(resp)
}
