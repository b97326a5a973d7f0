//! FastCGI, the I/O side: connect to the application (TCP or a unix socket), send
//! BEGIN_REQUEST, PARAMS and the request body as STDIN, read STDOUT / STDERR until
//! END_REQUEST, and turn the answer into a [`Flow`] for the request phases.
//!
//! The answer is buffered whole before it is sent (nginx's `fastcgi_buffering on`, the
//! default): the application is released as soon as it is done, and the client gets a
//! Content-Length. Up to [`MAX_BUFFERED`] bytes; a bigger answer is refused with 502 (the
//! streaming path is not built yet). One connection per request: `fastcgi_keep_conn` is
//! sent to the application, pooling comes with `upstream` blocks.
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
use bytes::BytesMut;
use gannet_proto::fastcgi::{self, Record};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest answer kept in memory.
pub const MAX_BUFFERED: usize = 64 * 1024 * 1024;

/// Why a FastCGI exchange failed, with nginx's wording for the error log.
enum Failure {
    Connect(std::io::Error),
    Timeout(&'static str),
    Io(std::io::Error, &'static str),
    Protocol(String),
    Premature,
    TooBig,
}

impl Failure {
    fn status(&self) -> u16 {
        match self {
            Failure::Timeout(_) => 504,
            _ => 502,
        }
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
pub async fn run(req: &Request, body: &[u8]) -> Flow {
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

    let result = match &backend {
        Backend::Tcp(addr) => {
            match timed(
                c.connect_timeout(),
                tokio::net::TcpStream::connect(addr.as_str()),
            )
            .await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    exchange(req, &backend, s, &out).await
                }
                Ok(Err(e)) => Err(Failure::Connect(e)),
                Err(()) => Err(Failure::Timeout("connecting to upstream")),
            }
        }
        Backend::Unix(path) => {
            match timed(c.connect_timeout(), tokio::net::UnixStream::connect(path)).await {
                Ok(Ok(s)) => exchange(req, &backend, s, &out).await,
                Ok(Err(e)) => Err(Failure::Connect(e)),
                Err(()) => Err(Failure::Timeout("connecting to upstream")),
            }
        }
    };
    match result {
        Ok(a) => answer(req, a),
        Err(f) => {
            errlog::request(
                Level::Error,
                req,
                format_args!("{f}, upstream: \"{backend}\""),
            );
            Flow::Status(f.status())
        }
    }
}

async fn timed<T>(d: Duration, f: impl std::future::Future<Output = T>) -> Result<T, ()> {
    tokio::time::timeout(d, f).await.map_err(|_| ())
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    req: &Request,
    backend: &Backend,
    mut s: S,
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
                Some(Record::Stderr(b)) => log_stderr(req, backend, &b, head.is_some()),
                Some(Record::End { .. }) => {
                    return match head {
                        Some(head) => Ok(Answered { head, body: stdout }),
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
            Ok(Ok(0)) => return Err(Failure::Premature),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(Failure::Io(e, phase)),
            Err(()) => return Err(Failure::Timeout(phase)),
        }
    }
}

/// Each STDERR line goes to the error log, as nginx logs them.
fn log_stderr(req: &Request, backend: &Backend, msg: &[u8], in_body: bool) {
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
        format_args!("FastCGI sent in stderr: \"{text}\" while {phase}, upstream: \"{backend}\""),
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
