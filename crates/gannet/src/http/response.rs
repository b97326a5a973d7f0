//! The response a handler produces, the fields of its head (chosen once for every
//! protocol: [`head_fields`]), and their encoding as an HTTP/1.1 head.
//!
//! The body is kept as bytes or file ranges, so the connection can send a cached small file
//! with one write and a large one with `sendfile`, and HEAD / 304 can drop it.

use crate::modules::compress::Coding;
use crate::modules::file_cache::Variants;
use bytes::Bytes;
use gannet_proto::cgi::HeaderValue;
use gannet_proto::h1::encode;
use std::borrow::Cow;
use std::fs::File;
use std::rc::Rc;
use std::sync::Arc;
use std::time::SystemTime;

/// The reason phrase nginx sends: its own older wording where it differs from RFC 9110
/// (clients ignore the phrase, but byte counts in logs and tests compare equal this way).
pub fn reason(status: u16) -> &'static str {
    match status {
        302 => "Moved Temporarily",
        405 => "Not Allowed",
        408 => "Request Time-out",
        413 => "Request Entity Too Large",
        414 => "Request-URI Too Large",
        416 => "Requested Range Not Satisfiable",
        503 => "Service Temporarily Unavailable",
        504 => "Gateway Time-out",
        _ => encode::reason(status),
    }
}

/// The explanation on the 400 page of one of nginx's own codes: 494 (a header too large),
/// 495 (a client certificate that failed verification), 496 (no client certificate where
/// one is required), 497 (plain HTTP to a TLS port).
pub fn special_reason(status: u16) -> Option<&'static str> {
    Some(match status {
        494 => "Request Header Or Cookie Too Large",
        495 => "The SSL certificate error",
        496 => "No required SSL certificate was sent",
        497 => "The plain HTTP request was sent to HTTPS port",
        _ => return None,
    })
}

/// A range of an open file.
#[derive(Debug, Clone)]
pub struct FileRange {
    pub file: Rc<File>,
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone)]
pub enum Part {
    Bytes(Bytes),
    File(FileRange),
}

impl Part {
    pub fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::File(f) => f.len,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub enum Body {
    #[default]
    Empty,
    /// One or more pieces sent in order (a multipart range answer has several).
    Parts(Vec<Part>),
}

thread_local! {
    /// The last answer's part list (emptied), for the next answer's body on this thread: a
    /// file's answer then allocates no list (a `malloc` and a `free`, about 130 instructions
    /// a request, callgrind). Handed back by the connection that sent it ([`Body::give_back`]).
    static SPARE_PARTS: std::cell::Cell<Vec<Part>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Body {
    pub fn bytes(b: impl Into<Bytes>) -> Body {
        Body::one(Part::Bytes(b.into()))
    }

    /// A body of one part, in the list the last answer gave back (if any).
    pub fn one(p: Part) -> Body {
        let mut parts = SPARE_PARTS.with(std::cell::Cell::take);
        parts.push(p);
        Body::Parts(parts)
    }

    /// The answer was sent: its parts are dropped, and a short list is kept for the next
    /// answer's [`Body::one`].
    pub fn give_back(self) {
        if let Body::Parts(mut parts) = self {
            if parts.capacity() <= 4 {
                parts.clear();
                SPARE_PARTS.with(|c| c.set(parts));
            }
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            Body::Empty => 0,
            Body::Parts(p) => p.iter().map(Part::len).sum(),
        }
    }
}

/// The filters that change a body while it is sent, in nginx's order (`conn::source`).
#[derive(Debug, Clone, Default)]
pub struct Rewrites {
    /// Inflate the gzip-encoded body (`gunzip`).
    pub gunzip: bool,
    /// Rewrite the body with these `sub_filter` strings.
    pub sub_filter: Option<Rc<crate::modules::sub_filter::Patterns>>,
    /// Recode the body to the charset its Content-Type names, as the charset module set
    /// it up.
    pub charset: Option<Rc<crate::modules::charset::Recode>>,
    /// Parse the body for SSI commands (after `sub_filter` and `charset`, as nginx's filter
    /// order has it).
    pub ssi: Option<crate::modules::ssi::Setup>,
    /// Send the bodies of these subrequests around the body (`add_before_body`,
    /// `add_after_body`).
    pub addition: Option<crate::modules::addition::Around>,
    /// Only this window of the body is sent (a range of a streamed answer); when the
    /// request slices, the body is the first slice and the others are fetched as it is
    /// sent (`conn::slice`).
    pub window: Option<crate::modules::slice::Window>,
    /// The body is the response's own (an error page), not the streamed one, which is
    /// dropped unread.
    pub own_body: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Response {
    pub status: u16,
    pub content_type: Option<Arc<str>>,
    /// Overrides the body length (HEAD of a file whose body was dropped keeps its length).
    pub content_length: Option<u64>,
    pub last_modified: Option<SystemTime>,
    pub etag: Option<Arc<str>>,
    /// `Accept-Ranges: bytes` (set for files; dropped on anything but a 200).
    pub accept_ranges: bool,
    /// Only one range may be cut from it (nginx's `single_range`: an upstream's answer).
    pub single_range: bool,
    pub location: Option<String>,
    /// Further headers in order (ETag-like standard ones first, then add_header's).
    pub headers: Vec<(Cow<'static, str>, HeaderValue)>,
    pub body: Body,
    /// Close the connection after this response.
    pub close: bool,
    /// The length is not known (an application's answer to HEAD without Content-Length,
    /// or a streamed answer): send no Content-Length rather than a wrong one.
    pub length_unknown: bool,
    /// The body is sent with `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// A small file's compressed copies, for the compression filter to reuse.
    pub variants: Option<Rc<Variants>>,
    /// Compress the body with this encoding and level while sending it (a large file or a
    /// streamed answer; in-memory bodies are compressed before).
    pub encode: Option<(Coding, u32)>,
    /// An application's `X-Accel-Limit-Rate` (bytes per second; 0 lifts the limit).
    /// (A u32: 4 GiB/s is no limit in practice, and it keeps `Response` small.)
    pub limit_rate: Option<u32>,
    /// What changes the body while it is sent (before `encode`); boxed, as most answers
    /// have none of it.
    pub rewrites: Option<Box<Rewrites>>,
    /// `add_trailer`'s fields, when one applies to the status: evaluated and sent after the
    /// body (`modules::headers::trailers`).
    pub trailers: Option<Arc<Vec<crate::modules::headers::AddHeader>>>,
    /// One of nginx's own answers (a built-in error page or redirect): its status stands
    /// over an `error_page`'s, as nginx's special response handler sets `r->err_status` to
    /// it, where any other answer to the page's URI (a file, a proxied answer) takes the
    /// error_page's status.
    pub special: bool,
    /// The application's `Server` and `Date` stand for gannet's own (`proxy_pass_header
    /// Server`/`Date`): gannet adds none of its own, even when the application sent none
    /// (nginx's proxy marks a missing one with an empty field that is never sent).
    pub passed_server_date: (bool, bool),
}

impl Response {
    /// A body filter is to change the body (`sub_filter`, SSI): its length and ranges no
    /// longer hold (nginx's `clear_content_length`, `clear_accept_ranges`), and its
    /// validators go (`clear_last_modified`, `clear_etag`) or, with the filter's
    /// `*_last_modified on`, the Last-Modified stays and the ETag turns weak.
    pub fn body_rewritten(&mut self, keep_last_modified: bool) {
        self.content_length = None;
        self.length_unknown = true;
        self.accept_ranges = false;
        self.headers.retain(|(n, _)| {
            !n.eq_ignore_ascii_case("content-length") && !n.eq_ignore_ascii_case("accept-ranges")
        });
        if keep_last_modified {
            if let Some(e) = self.etag.as_deref().filter(|e| !e.starts_with("W/")) {
                self.etag = Some(format!("W/{e}").into());
            }
            for (n, v) in &mut self.headers {
                if n.eq_ignore_ascii_case("etag") && !v.starts_with("W/") {
                    *v = format!("W/{v}").into();
                }
            }
        } else {
            self.last_modified = None;
            self.etag = None;
            self.headers.retain(|(n, _)| {
                !n.eq_ignore_ascii_case("last-modified") && !n.eq_ignore_ascii_case("etag")
            });
        }
    }

    /// The Last-Modified time the response is sent with: as nginx, only on 200, 206 and 304.
    pub fn last_modified_sent(&self) -> Option<SystemTime> {
        self.last_modified
            .filter(|_| matches!(self.status, 200 | 206 | 304))
    }

    /// The body rewrites, made on first use.
    pub fn rewrites(&mut self) -> &mut Rewrites {
        self.rewrites.get_or_insert_with(Box::default)
    }

    /// nginx's `ngx_http_weak_etag`, for a filter that changes the body: a strong ETag
    /// (the file's, or an application's among the headers) becomes weak.
    pub fn weak_etag(&mut self) {
        if let Some(etag) = &self.etag {
            if !etag.starts_with("W/") {
                self.etag = Some(format!("W/{etag}").into());
            }
        }
        for (name, value) in &mut self.headers {
            if name.eq_ignore_ascii_case("etag") && !value.starts_with("W/") {
                *value = format!("W/{value}").into();
            }
        }
    }

    pub fn new(status: u16) -> Response {
        Response {
            status,
            ..Default::default()
        }
    }

    /// nginx's built-in page for an error or redirect status. nginx's own codes 494-497
    /// (refusals that `error_page` can catch by number) are answered 400 with a line
    /// saying why.
    pub fn error_page(status: u16, server_tokens: bool) -> Response {
        match special_reason(status) {
            Some(why) => Response::error_page_because(400, server_tokens, why),
            None => Response::error_page_because(status, server_tokens, ""),
        }
    }

    /// nginx's page with a line saying why, under the heading (as its TLS refusals have:
    /// "The plain HTTP request was sent to HTTPS port").
    fn error_page_because(status: u16, server_tokens: bool, why: &str) -> Response {
        let mut r = Response::new(status);
        r.special = true;
        // 204 and 304 never carry a body; the others get nginx's small HTML page.
        if status != 204 && status != 304 && status >= 200 {
            // nginx's pages for 302 and 401 say "Found" and "Authorization Required", though
            // its status lines say "Moved Temporarily" and "Unauthorized".
            let phrase = match status {
                302 => "Found",
                401 => "Authorization Required",
                _ => reason(status),
            };
            let heading = format!("{status} {phrase}");
            let (title, why) = if why.is_empty() {
                (heading.clone(), String::new())
            } else {
                (
                    format!("{status} {why}"),
                    format!("<center>{why}</center>\r\n"),
                )
            };
            let server = server(server_tokens);
            let html = format!(
                "<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n<center><h1>{heading}</h1></center>\r\n{why}<hr><center>{server}</center>\r\n</body>\r\n</html>\r\n"
            );
            r.content_type = Some(Arc::from("text/html"));
            r.body = Body::bytes(html);
        }
        r
    }

    /// Whether the status allows a body at all (1xx, 204, 304 do not).
    pub fn status_has_body(&self) -> bool {
        !(self.status < 200 || self.status == 204 || self.status == 304)
    }
}

/// What a head says about its connection: HTTP/1.x's `Connection` field (with
/// `Keep-Alive: timeout=N`, keepalive_timeout's second argument, when kept). HTTP/2 and
/// HTTP/3 have no connection-specific fields (RFC 9113 8.2.2, RFC 9114 4.2): their heads
/// carry none, and drop an application's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    KeepAlive(Option<u64>),
    Close,
    /// HTTP/2, HTTP/3.
    None,
}

/// Connection-level facts the head needs.
pub struct HeadCtx<'a> {
    pub hop: Hop,
    pub server_tokens: bool,
    pub date: &'a [u8],
}

/// One field of a response head, as [`head_fields`] chose it (names in HTTP/1.x's case;
/// HTTP/2 lowercases them).
pub enum Field<'a> {
    /// `Server` then `Date`, always first (HTTP/1.x writes them as one piece).
    ServerDate(bool, &'a [u8]),
    /// Only one of the two (the application's other one is passed on in its place).
    Server(bool),
    Date(&'a [u8]),
    ContentType(&'a str),
    Chunked,
    ContentLength(u64),
    LastModified(SystemTime),
    Location(&'a str),
    /// `Connection: upgrade` (a 101).
    Upgrade,
    /// `Connection: keep-alive`, and `Keep-Alive: timeout=N` with a number.
    KeepAlive(Option<u64>),
    /// `Connection: close`.
    Close,
    ETag(&'a str),
    AcceptRanges,
    /// Anything else: an application's, `add_header`'s.
    Other(&'a str, &'a str),
}

/// Fields that only mean something for one HTTP/1.x connection (an application may send
/// them): an HTTP/2 or HTTP/3 message must not carry them.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// The head's fields, in the order they are sent: which ones, and on what conditions, for
/// every protocol ([`encode_head`] for HTTP/1.x, `conn::h2_response::head` for HTTP/2).
#[inline]
pub fn head_fields<'a>(
    r: &'a Response,
    body_len: u64,
    ctx: &HeadCtx<'a>,
    mut f: impl FnMut(Field<'a>),
) {
    let h1 = ctx.hop != Hop::None;
    match r.passed_server_date {
        (false, false) => f(Field::ServerDate(ctx.server_tokens, ctx.date)),
        (server, date) => {
            if !server {
                f(Field::Server(ctx.server_tokens));
            }
            if !date {
                f(Field::Date(ctx.date));
            }
        }
    }
    if let Some(ct) = &r.content_type {
        f(Field::ContentType(ct));
    }
    if r.chunked && h1 {
        f(Field::Chunked);
    } else if (r.status_has_body() || r.content_length.is_some()) && !r.length_unknown {
        f(Field::ContentLength(r.content_length.unwrap_or(body_len)));
    }
    if let Some(lm) = r.last_modified_sent() {
        f(Field::LastModified(lm));
    }
    if let Some(loc) = &r.location {
        f(Field::Location(loc));
    }
    match ctx.hop {
        _ if !h1 => {}
        _ if r.status == 101 => f(Field::Upgrade),
        Hop::KeepAlive(t) => f(Field::KeepAlive(t)),
        _ => f(Field::Close),
    }
    if let Some(etag) = &r.etag {
        f(Field::ETag(etag));
    }
    if r.accept_ranges && r.status == 200 {
        f(Field::AcceptRanges);
    }
    for (n, v) in &r.headers {
        if h1 || !HOP_BY_HOP.iter().any(|h| n.eq_ignore_ascii_case(h)) {
            f(Field::Other(n, v));
        }
    }
}

/// The `Server` field's value.
pub fn server(tokens: bool) -> &'static str {
    if tokens {
        concat!("gannet/", env!("CARGO_PKG_VERSION"))
    } else {
        "gannet"
    }
}

/// Write the HTTP/1.1 status line and headers. Returns nothing: `out` ends with the empty
/// line.
pub fn encode_head(r: &Response, body_len: u64, ctx: &HeadCtx, out: &mut Vec<u8>) {
    // Written in as few copies as the fields allow, every one of them but the status line
    // starting with its line break: the name (a literal, copied inline) and then the value
    // (a `memcpy`). A head in its usual pieces cost about 900 instructions, a third of
    // them the calls copying a few bytes each (callgrind, robots.txt).
    match r.status {
        200 => out.extend_from_slice(b"HTTP/1.1 200 OK"),
        status => {
            out.extend_from_slice(b"HTTP/1.1 ");
            encode::write_u64(out, u64::from(status));
            out.push(b' ');
            out.extend_from_slice(reason(status).as_bytes());
        }
    }
    head_fields(r, body_len, ctx, |field| match field {
        Field::ServerDate(tokens, date) => {
            out.extend_from_slice(if tokens {
                concat!(
                    "\r\nServer: gannet/",
                    env!("CARGO_PKG_VERSION"),
                    "\r\nDate: "
                )
                .as_bytes()
            } else {
                b"\r\nServer: gannet\r\nDate: "
            });
            out.extend_from_slice(date);
        }
        Field::Server(tokens) => put(out, b"\r\nServer: ", server(tokens)),
        Field::Date(date) => {
            out.extend_from_slice(b"\r\nDate: ");
            out.extend_from_slice(date);
        }
        Field::ContentType(ct) => put(out, b"\r\nContent-Type: ", ct),
        Field::Chunked => out.extend_from_slice(b"\r\nTransfer-Encoding: chunked"),
        Field::ContentLength(n) => {
            out.extend_from_slice(b"\r\nContent-Length: ");
            encode::write_u64(out, n);
        }
        Field::LastModified(lm) => {
            crate::runtime::clock::with_http_date(lm, |d| put(out, b"\r\nLast-Modified: ", d))
        }
        Field::Location(loc) => put(out, b"\r\nLocation: ", loc),
        Field::Upgrade => out.extend_from_slice(b"\r\nConnection: upgrade"),
        Field::KeepAlive(t) => {
            out.extend_from_slice(b"\r\nConnection: keep-alive");
            if let Some(t) = t {
                out.extend_from_slice(b"\r\nKeep-Alive: timeout=");
                encode::write_u64(out, t);
            }
        }
        Field::Close => out.extend_from_slice(b"\r\nConnection: close"),
        Field::ETag(etag) => put(out, b"\r\nETag: ", etag),
        Field::AcceptRanges => out.extend_from_slice(b"\r\nAccept-Ranges: bytes"),
        Field::Other(n, v) => {
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
        }
    });
    out.extend_from_slice(b"\r\n\r\n");
}

/// A line break and a field's name and colon (a literal: copied inline), then its value.
#[inline(always)]
fn put(out: &mut Vec<u8>, name: &'static [u8], value: &str) {
    out.extend_from_slice(name);
    out.extend_from_slice(value.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head written in its few copies is the field-per-line head, byte for byte.
    #[test]
    fn encodes_the_head_field_by_field() {
        let mut r = Response::new(200);
        r.content_type = Some(Arc::from("text/plain"));
        r.last_modified = Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1));
        r.etag = Some(Arc::from("\"1-5\""));
        r.accept_ranges = true;
        r.headers.push(("X-A".into(), "b".into()));
        let ctx = HeadCtx {
            hop: Hop::KeepAlive(Some(65)),
            server_tokens: false,
            date: b"Thu, 01 Jan 1970 00:00:02 GMT",
        };
        let mut out = Vec::new();
        encode_head(&r, 5, &ctx, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nServer: gannet\r\nDate: Thu, 01 Jan 1970 00:00:02 GMT\r\n\
             Content-Type: text/plain\r\nContent-Length: 5\r\n\
             Last-Modified: Thu, 01 Jan 1970 00:00:01 GMT\r\nConnection: keep-alive\r\n\
             Keep-Alive: timeout=65\r\nETag: \"1-5\"\r\nAccept-Ranges: bytes\r\nX-A: b\r\n\r\n"
        );
        let mut r = Response::new(404);
        r.passed_server_date = (true, false);
        r.location = Some("/x".into());
        let ctx = HeadCtx {
            hop: Hop::Close,
            ..ctx
        };
        let mut out = Vec::new();
        encode_head(&r, 0, &ctx, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 404 Not Found\r\nDate: Thu, 01 Jan 1970 00:00:02 GMT\r\n\
             Content-Length: 0\r\nLocation: /x\r\nConnection: close\r\n\r\n"
        );
    }
}
