//! HTTP/1.x request-head parser.
//!
//! The hot path is a single `httparse` pass over the read buffer with the header index in a
//! stack array; the result records byte ranges and the head's bytes are split off the buffer
//! (no copy). Request lines `httparse` refuses only for their version (`HTTP/1.2`, `HTTP/2.0`,
//! trailing spaces) go through the slower [`super::reqline`] path so that they get nginx's
//! answers (treat as 1.1, 505) instead of a blanket 400. Header semantics (framing, Host,
//! Connection, Expect) live in [`super::fields`].

use bytes::{Buf, Bytes, BytesMut};
use httparse::{Header, Status, EMPTY_HEADER};
use std::mem::MaybeUninit;
use std::ops::Range;

use super::fields::{self, Fields};
use super::reqline::{self, RequestLine};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// A request line without a version (`GET /`): no header fields, and an answer of the
    /// body alone, as nginx still serves it.
    Http09,
    Http10,
    Http11,
    /// A request that came as an HTTP/2 stream (see [`RequestHead::from_fields`]).
    Http2,
    /// A request that came as an HTTP/3 stream ([`RequestHead::into_http3`]).
    Http3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Trace,
    Connect,
    Patch,
    /// Any other token; its text is `RequestHead::method_str()`.
    Other,
}

/// How the request body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    None,
    Length(u64),
    Chunked,
}

/// Size limits, as nginx's `client_header_buffer_size` / `large_client_header_buffers`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest request line; longer -> `ParseError::UriTooLong` (414).
    pub max_request_line: usize,
    /// Longest single header line; longer -> `ParseError::HeaderTooLarge` (431).
    pub max_header_line: usize,
    /// Largest whole head (request line + headers); larger -> `HeaderTooLarge`.
    pub max_head: usize,
    /// Most header fields.
    pub max_headers: usize,
    /// Which header names are accepted (`underscores_in_headers`, `ignore_invalid_headers`).
    pub names: HeaderNames,
}

/// nginx's header-name policy: a name is valid when made of `[A-Za-z0-9-]` (and `_` with
/// `underscores_in_headers on`); an invalid one is dropped (and logged by the caller) with
/// `ignore_invalid_headers on`, nginx's default, else kept as sent. HTTP/1 and HTTP/2 heads
/// both go through [`HeaderNames::drops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderNames {
    pub underscores: bool,
    pub ignore_invalid: bool,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            underscores: false,
            ignore_invalid: true,
        }
    }
}

impl HeaderNames {
    /// Whether a field of this name is left out of the request.
    pub fn drops(&self, name: &[u8]) -> bool {
        // Every field name of every request goes through here: one table lookup a byte.
        let allowed = if self.underscores { 3 } else { 1 };
        self.ignore_invalid
            && !name
                .iter()
                .all(|&c| NAME_CLASS[usize::from(c)] & allowed != 0)
    }
}

/// Header-name bytes nginx keeps: 1 for letters, digits and `-`; 2 for `_` (kept with
/// `underscores_in_headers on`).
pub(super) static NAME_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = if b.is_ascii_alphanumeric() || b == b'-' {
            1
        } else if b == b'_' {
            2
        } else {
            0
        };
        c += 1;
    }
    t
};

impl Default for Limits {
    /// nginx's defaults: `large_client_header_buffers 4 8k`.
    fn default() -> Self {
        Limits {
            max_request_line: 8192,
            max_header_line: 8192,
            max_head: 32768,
            max_headers: 100,
            names: HeaderNames::default(),
        }
    }
}

/// Why a request head was refused; each maps to the status nginx would send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// 400 with a short reason for the error log.
    BadRequest(&'static str),
    /// 414
    UriTooLong,
    /// 431
    HeaderTooLarge,
    /// 501 (unknown Transfer-Encoding)
    NotImplemented(&'static str),
    /// 505
    VersionNotSupported,
}

impl ParseError {
    /// Whether the request line itself was refused (so no header was read), as opposed
    /// to a header or the framing they describe.
    pub fn in_request_line(&self) -> bool {
        match self {
            ParseError::UriTooLong | ParseError::VersionNotSupported => true,
            ParseError::BadRequest(r) => matches!(
                *r,
                "invalid method or request target"
                    | "invalid HTTP version"
                    | "invalid request"
                    | "invalid method"
                    | "invalid request target"
            ),
            _ => false,
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            ParseError::BadRequest(_) => 400,
            ParseError::UriTooLong => 414,
            ParseError::HeaderTooLarge => 431,
            ParseError::NotImplemented(_) => 501,
            ParseError::VersionNotSupported => 505,
        }
    }
}

/// A parsed request head. It owns the head's bytes (split off the read buffer without
/// copying) and refers into them by ranges, so it has no lifetime and costs one allocation
/// for the header index.
#[derive(Debug, Clone)]
pub struct RequestHead {
    raw: Bytes,
    method_range: Range<usize>,
    target_range: Range<usize>,
    headers: Vec<(Range<usize>, Range<usize>)>,
    /// The Host header's host part (no port, no trailing dot), if a Host header was sent.
    host_range: Option<Range<usize>>,
    pub method: Method,
    pub version: Version,
    pub body: BodyKind,
    /// Whether the connection may stay open after this request (version default + Connection).
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
    /// Fields left out for their names (see [`HeaderNames`]), for the error log: the whole
    /// line for HTTP/1, the name for HTTP/2. Empty (no allocation) in the usual case.
    pub ignored: Vec<Bytes>,
    /// Bytes at the end of `raw` that were not received but added by [`Self::set_header`]
    /// (0 in the usual case): `raw()` leaves them out, so `$request` and
    /// `$request_length` stay what the client sent.
    added: usize,
    /// Some field's name starts with `If-` (a conditional request): when none does, the
    /// not_modified filter looks up none of them (four lookups per file answer).
    conditional: bool,
}

impl RequestHead {
    /// A stand-in for a request that could not be parsed, so the server can still log it
    /// (nginx logs rejected requests too). `raw` is what was received; with `with_headers`
    /// the `name: value` lines after the request line are kept (read leniently, for logging
    /// only). It has no body, and its method is `Other`.
    pub fn unparsed(raw: Bytes, with_headers: bool) -> RequestHead {
        let line_end = raw.iter().position(|&b| b == b'\n').unwrap_or(raw.len());
        let method_end = raw[..line_end]
            .iter()
            .position(|&b| b == b' ')
            .unwrap_or(line_end);
        let mut headers = Vec::new();
        let mut pos = line_end + 1;
        while with_headers && pos < raw.len() {
            let end = raw[pos..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(raw.len(), |i| pos + i);
            let line_len = if end > pos && raw[end - 1] == b'\r' {
                end - 1
            } else {
                end
            };
            if line_len == pos {
                break;
            }
            if let Some(colon) = raw[pos..line_len].iter().position(|&b| b == b':') {
                let vstart = raw[pos + colon + 1..line_len]
                    .iter()
                    .position(|b| !b.is_ascii_whitespace())
                    .map_or(line_len, |i| pos + colon + 1 + i);
                headers.push((pos..pos + colon, vstart..line_len));
            }
            pos = end + 1;
        }
        let raw = if with_headers {
            raw
        } else {
            raw.slice(..line_end)
        };
        RequestHead {
            raw,
            method_range: 0..method_end,
            target_range: method_end..method_end,
            headers,
            host_range: None,
            method: Method::Other,
            version: Version::Http10,
            body: BodyKind::None,
            keep_alive: false,
            expect_continue: false,
            ignored: Vec::new(),
            added: 0,
            conditional: true,
        }
    }

    /// The head of a request that did not arrive as HTTP/1.x text (an HTTP/2 stream, whose
    /// codec has already checked the method, target, names and values). It is laid out as
    /// an HTTP/1 head, `GET /x HTTP/2.0` then a `host` line from `:authority` (which wins
    /// over a Host field, RFC 9113 8.3.1) and the fields, so that `$request`, logs and
    /// header lookups work as for HTTP/1. The Host is checked and a Content-Length parsed
    /// as in HTTP/1; `body` says whether a body follows. Fields whose names `names` drops
    /// are left out and listed in `ignored`.
    pub fn from_fields<'a>(
        method: &str,
        target: &str,
        authority: Option<&str>,
        fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
        body_follows: bool,
        names: HeaderNames,
    ) -> Result<RequestHead, ParseError> {
        let mut raw = Vec::with_capacity(256);
        raw.extend_from_slice(method.as_bytes());
        raw.push(b' ');
        let target_range = raw.len()..raw.len() + target.len();
        raw.extend_from_slice(target.as_bytes());
        raw.extend_from_slice(b" HTTP/2.0\r\n");
        let mut headers = Vec::new();
        let mut push = |raw: &mut Vec<u8>, name: &[u8], value: &[u8]| {
            let n = raw.len()..raw.len() + name.len();
            raw.extend_from_slice(name);
            raw.extend_from_slice(b": ");
            let v = raw.len()..raw.len() + value.len();
            raw.extend_from_slice(value);
            raw.extend_from_slice(b"\r\n");
            headers.push((n, v));
        };
        let mut host = None;
        if let Some(a) = authority {
            push(&mut raw, b"host", a.as_bytes());
        }
        let mut length = None;
        let mut expect_continue = false;
        let mut ignored = Vec::new();
        let mut seen = 0u8;
        // Cookie fields (HTTP/2 and HTTP/3 may split the Cookie header, RFC 9113 8.2.3)
        // joined with "; " into one, after the others, as nginx's
        // ngx_http_v2_construct_cookie_header: an upstream gets one Cookie line.
        let mut cookie: Option<std::borrow::Cow<'a, [u8]>> = None;
        for (name, value) in fields {
            if names.drops(name.as_bytes()) {
                ignored.push(Bytes::copy_from_slice(name.as_bytes()));
                continue;
            }
            if name.eq_ignore_ascii_case("cookie") {
                cookie = Some(match cookie.take() {
                    None => value.into(),
                    Some(c) => [&c[..], b"; ", value].concat().into(),
                });
                continue;
            }
            if let Some(bit) = fields::unique(name.as_bytes()) {
                if seen & bit != 0 {
                    return Err(ParseError::BadRequest("client sent duplicate header line"));
                }
                seen |= bit;
            }
            if name.eq_ignore_ascii_case("expect") {
                expect_continue = fields::trim_ows(value).eq_ignore_ascii_case(b"100-continue");
            }
            if name.eq_ignore_ascii_case("host") {
                if authority.is_some() {
                    continue;
                }
                if host.is_some() {
                    return Err(ParseError::BadRequest("duplicate Host header"));
                }
                host = Some(());
            }
            if name.eq_ignore_ascii_case("content-length") {
                if length.is_some() {
                    return Err(ParseError::BadRequest("duplicate Content-Length header"));
                }
                length = Some(
                    fields::parse_length(value)
                        .ok_or(ParseError::BadRequest("invalid Content-Length header"))?,
                );
            }
            push(&mut raw, name.as_bytes(), value);
        }
        if let Some(c) = cookie {
            push(&mut raw, b"cookie", &c);
        }
        raw.extend_from_slice(b"\r\n");
        let raw = Bytes::from(raw);
        let host_range = match headers
            .iter()
            .find(|(n, _)| raw[n.clone()].eq_ignore_ascii_case(b"host"))
        {
            Some((_, v)) => {
                let len = fields::valid_host(&raw[v.clone()])
                    .ok_or(ParseError::BadRequest("invalid Host header"))?;
                Some(v.start..v.start + len)
            }
            None => None,
        };
        let body = match length {
            Some(n) => BodyKind::Length(n),
            // A body of unknown length: its end is the stream's end.
            None if body_follows => BodyKind::Chunked,
            None => BodyKind::None,
        };
        Ok(RequestHead {
            method: Method::from_token(method.as_bytes()),
            method_range: 0..method.len(),
            target_range,
            headers,
            host_range,
            raw,
            version: Version::Http2,
            body,
            keep_alive: true,
            expect_continue,
            ignored,
            added: 0,
            conditional: true,
        })
    }

    /// A head made by [`RequestHead::from_fields`] for a request that came over HTTP/3:
    /// its request line says `HTTP/3.0` (`$request`), as nginx's.
    pub fn into_http3(mut self) -> RequestHead {
        let at = self.target_range.end + 1;
        if self.raw.get(at..at + 8) == Some(b"HTTP/2.0".as_slice()) {
            let mut raw = self.raw.to_vec();
            raw[at..at + 8].copy_from_slice(b"HTTP/3.0");
            self.raw = Bytes::from(raw);
        }
        self.version = Version::Http3;
        self
    }

    pub fn method_str(&self) -> &str {
        ascii_str(&self.raw[self.method_range.clone()])
    }
    /// The raw request-target as sent (origin-form, absolute-form, `*`).
    pub fn target(&self) -> &[u8] {
        &self.raw[self.target_range.clone()]
    }
    /// First value of a header, case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        // Compared as bytes: the names are tokens (ASCII), so the UTF-8 check `headers()`
        // makes is not needed here, and a proxied answer alone looks up five headers.
        self.headers
            .iter()
            .find(|(n, _)| name_eq(&self.raw[n.clone()], name.as_bytes()))
            .map(|(_, v)| &self.raw[v.clone()])
    }
    /// All headers in order as (name, value).
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.headers
            .iter()
            .map(move |(n, v)| (ascii_str(&self.raw[n.clone()]), &self.raw[v.clone()]))
    }
    /// The whole head's bytes as received (request line through the empty line).
    pub fn raw(&self) -> &[u8] {
        &self.raw[..self.raw.len() - self.added]
    }
    /// Give the first header field called `name` (case-insensitive) the value `value`, or
    /// add one when there is none; an absent field is not added for an empty value. This
    /// is how a module changes what later phases and the gateways see of the request (as
    /// nginx modules edit `headers_in`), e.g. a `traceparent` for the upstream. A value of
    /// the same length is written over the old one; otherwise the new bytes go after the
    /// received ones (one copy of the head either way). Not for Host or the framing fields,
    /// whose meaning was read at parse time.
    pub fn set_header(&mut self, name: &str, value: &[u8]) {
        let found = self
            .headers
            .iter()
            .position(|(n, _)| self.raw[n.clone()].eq_ignore_ascii_case(name.as_bytes()));
        if found.is_none() && value.is_empty() {
            return;
        }
        self.conditional |= name
            .as_bytes()
            .get(..3)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"if-"));
        let mut raw = BytesMut::with_capacity(self.raw.len() + name.len() + value.len());
        raw.extend_from_slice(&self.raw);
        match found {
            Some(i) if self.headers[i].1.len() == value.len() => {
                raw[self.headers[i].1.clone()].copy_from_slice(value);
            }
            Some(i) => {
                let start = raw.len();
                raw.extend_from_slice(value);
                self.headers[i].1 = start..raw.len();
            }
            None => {
                let start = raw.len();
                raw.extend_from_slice(name.as_bytes());
                let name_range = start..raw.len();
                raw.extend_from_slice(value);
                self.headers
                    .push((name_range, start + name.len()..raw.len()));
            }
        }
        self.added += raw.len() - self.raw.len();
        self.raw = raw.freeze();
    }
    /// The validated Host header's host part: port and one trailing dot removed, case as
    /// sent (`Example.COM:8080` -> `Example.COM`). `None` when no Host header was sent.
    pub fn host(&self) -> Option<&[u8]> {
        self.host_range.clone().map(|r| &self.raw[r])
    }
    /// Whether a field's name may start with `If-`: `false` means no conditional field
    /// was sent (`If-Match`, `If-None-Match`, `If-Modified-Since`...); `true` says look.
    pub fn may_be_conditional(&self) -> bool {
        self.conditional
    }
    /// Number of header fields.
    pub fn header_count(&self) -> usize {
        self.headers.len()
    }
    /// All values of a header, in order, case-insensitive name.
    pub fn header_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }
}

/// Two header names equal but for ASCII case, eight bytes at a time: `eq_ignore_ascii_case`
/// took 14 instructions a byte, 140 for each `User-Agent` found (the access log looks up
/// two fields per line, keepalive_disable and gzip more; callgrind).
fn name_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a.eq_ignore_ascii_case(b);
    }
    // Whole words, the last one ending with the names (it may overlap the one before).
    let same = |i: usize| lower8(word(&a[i..i + 8])) == lower8(word(&b[i..i + 8]));
    (0..n - 8).step_by(8).all(same) && same(n - 8)
}

fn word(c: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(c);
    u64::from_le_bytes(w)
}

/// `x` with each byte from `A` to `Z` made lower case and every other byte as it is: a
/// byte's low seven bits plus `0x80 - 'A'` reach the high bit when it is `A` or above, plus
/// `0x80 - '['` when it is past `Z` (no sum carries into the next byte); a byte from 0x80
/// up is left alone.
fn lower8(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let low = x & (ONES * 0x7f);
    let from_a = low + ONES * (0x80 - u64::from(b'A'));
    let past_z = low + ONES * (0x80 - u64::from(b'Z') - 1);
    let upper = from_a & !past_z & !x & (ONES * 0x80);
    x | (upper >> 2)
}

pub(super) type Index = Vec<(Range<usize>, Range<usize>)>;

/// Header indexes given back by dropped heads, for the next heads of the thread: one
/// `malloc` and one `free` per request were about 125 instructions (callgrind), a pop and
/// a push here a third of that.
const INDEX_KEEP: usize = 64;
/// An index that grew past this many fields is not kept.
const INDEX_MAX: usize = 64;

thread_local! {
    static INDEXES: std::cell::RefCell<Vec<Index>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty index with room for `n` fields.
pub(super) fn take_index(n: usize) -> Index {
    let kept = INDEXES
        .try_with(|k| k.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten();
    match kept {
        Some(mut v) => {
            v.reserve(n);
            v
        }
        None => Vec::with_capacity(n),
    }
}

impl Drop for RequestHead {
    fn drop(&mut self) {
        give_index(std::mem::take(&mut self.headers));
    }
}

/// Keep an index for the thread's next heads (see [`take_index`]).
pub(super) fn give_index(mut v: Index) {
    if v.capacity() == 0 || v.capacity() > INDEX_MAX {
        return;
    }
    v.clear();
    // During the thread's exit the list may be gone: the index is then just freed.
    let _ = INDEXES.try_with(|k| {
        if let Ok(mut k) = k.try_borrow_mut() {
            if k.len() < INDEX_KEEP {
                k.push(v);
            }
        }
    });
}

/// Header slots kept on the stack: enough for virtually every real request, so the common
/// case parses without touching the allocator. Larger `max_headers` fall back to the heap.
const STACK_HEADERS: usize = 64;

/// Why one parsing attempt stopped: a real error, or the header slots ran out (retry bigger).
pub(super) enum Fail {
    TooManyHeaders,
    Parse(ParseError),
}

impl From<ParseError> for Fail {
    fn from(e: ParseError) -> Self {
        Fail::Parse(e)
    }
}

/// What one successful pass found, as offsets into the buffer (so it outlives the borrow).
pub(super) struct Parsed {
    pub len: usize,
    pub line: RequestLine,
    pub headers: Vec<(Range<usize>, Range<usize>)>,
    /// Lines of fields dropped for their names.
    pub ignored: Vec<Range<usize>>,
    pub fields: Fields,
    pub conditional: bool,
}

/// Parse one request head from the front of `buf`. `Ok(None)`: need more bytes (and none of
/// the limits is exceeded yet). `Ok(Some(head))`: the head's bytes were split off `buf`, which
/// now starts at the body or the next pipelined request.
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<RequestHead>, ParseError> {
    parse_request_as(buf, limits, true)
}

/// [`parse_request`]; `plain`: try the one-pass parse of the usual head first
/// ([`super::plain`]), which the tests turn off to compare the two paths.
pub(super) fn parse_request_as(
    buf: &mut BytesMut,
    limits: &Limits,
    plain: bool,
) -> Result<Option<RequestHead>, ParseError> {
    skip_empty_lines(buf);
    if buf.is_empty() {
        return Ok(None);
    }
    let stack_fields = limits.max_headers.min(STACK_HEADERS);
    let quick = if plain {
        super::plain::parse(buf, limits, stack_fields)
    } else {
        None
    };
    let first = match quick {
        Some(r) => r.map(Some),
        None => {
            // Uninitialised slots: httparse fills only what it uses, so the common case
            // pays neither an allocation nor a 2 KiB memset for the header index.
            let mut slots = [const { MaybeUninit::<Header<'_>>::uninit() }; STACK_HEADERS];
            parse_with(buf, &mut slots[..stack_fields], limits)
        }
    };
    let parsed = match first {
        Err(Fail::TooManyHeaders) if limits.max_headers > STACK_HEADERS => {
            // Rare: more than 64 fields. Pay for a heap index sized to the configured limit.
            let mut heap = vec![MaybeUninit::uninit(); limits.max_headers];
            parse_with(buf, &mut heap, limits)
        }
        other => other,
    };
    let parsed = match parsed {
        Ok(Some(p)) => p,
        Ok(None) => {
            // nginx refuses a method byte it does not take at once, not at the line's end
            // (a lone CR may still be the start of an empty line's CRLF).
            let open = memchr::memchr(b' ', buf).map_or(&buf[..], |sp| &buf[..sp]);
            if open != b"\r" && !lawful_method(open) {
                return Err(ParseError::BadRequest("client sent invalid method"));
            }
            check_partial(buf, limits)?;
            return Ok(None);
        }
        Err(Fail::TooManyHeaders) => return Err(ParseError::HeaderTooLarge),
        Err(Fail::Parse(e)) => return Err(e),
    };
    let method = Method::from_token(&buf[parsed.line.method.clone()]);
    if method == Method::Other && !lawful_method(&buf[parsed.line.method.clone()]) {
        return Err(ParseError::BadRequest("client sent invalid method"));
    }
    // nginx serves HTTP/0.9 for GET only.
    if parsed.line.version == Version::Http09 && method != Method::Get {
        return Err(ParseError::BadRequest("invalid method in HTTP/0.9 request"));
    }
    let raw = buf.split_to(parsed.len).freeze();
    let ignored = parsed.ignored.into_iter().map(|r| raw.slice(r)).collect();
    Ok(Some(RequestHead {
        raw,
        method_range: parsed.line.method,
        target_range: parsed.line.target,
        headers: parsed.headers,
        host_range: parsed.fields.host,
        method,
        version: parsed.line.version,
        body: parsed.fields.body,
        keep_alive: parsed.fields.keep_alive,
        expect_continue: parsed.fields.expect_continue,
        ignored,
        added: 0,
        conditional: parsed.conditional,
    }))
}

/// A method nginx takes (`ngx_http_parse_request_line`, and HTTP/2's
/// `ngx_http_v2_parse_method`): upper-case letters, `_` and `-`; anything else is its 400.
pub fn lawful_method(m: &[u8]) -> bool {
    m.iter()
        .all(|&c| c.is_ascii_uppercase() || c == b'_' || c == b'-')
}

impl Method {
    /// Methods are case-sensitive (RFC 9110 9.1): `get` is an unknown method, not GET.
    fn from_token(t: &[u8]) -> Method {
        match t {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"OPTIONS" => Method::Options,
            b"TRACE" => Method::Trace,
            b"CONNECT" => Method::Connect,
            b"PATCH" => Method::Patch,
            _ => Method::Other,
        }
    }
}

/// Empty lines before a request line are ignored (RFC 9112 2.2, and nginx). Dropping them
/// from the buffer keeps them out of the head and out of the size limits.
fn skip_empty_lines(buf: &mut BytesMut) {
    let mut n = 0;
    loop {
        match buf.get(n..n + 2) {
            Some(b"\r\n") => n += 2,
            _ if buf.get(n) == Some(&b'\n') => n += 1,
            _ => break,
        }
    }
    buf.advance(n);
}

/// One parsing attempt with the given header slots.
fn parse_with<'b>(
    b: &'b [u8],
    slots: &mut [MaybeUninit<Header<'b>>],
    limits: &Limits,
) -> Result<Option<Parsed>, Fail> {
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(b, slots) {
        Ok(Status::Complete(len)) => {
            let method = span(b, req.method.unwrap_or("").as_bytes())?;
            let target = span(b, req.path.unwrap_or("").as_bytes())?;
            let version = if req.version == Some(0) {
                Version::Http10
            } else {
                Version::Http11
            };
            // httparse accepts exactly `SP HTTP/1.x` then the line end after the target.
            let line_len = target.end + 1 + 8;
            let line = RequestLine {
                method,
                target,
                version,
                len: line_len,
            };
            finish(b, line, req.headers, len, limits).map(Some)
        }
        Ok(Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(Fail::TooManyHeaders),
        // A line end right after the target (httparse's token error): HTTP/0.9, when the
        // rest of the line is one; otherwise the error stands.
        Err(e @ httparse::Error::Token) => match reqline::parse(b) {
            Ok(Some((line, rest))) if line.version == Version::Http09 => {
                finish(b, line, &[], rest, limits).map(Some)
            }
            Ok(None) if memchr::memchr(b'\n', b).is_none() => Ok(None),
            _ => Err(map_httparse(e)),
        },
        // Not `HTTP/1.0` / `HTTP/1.1` followed directly by the line end: decide ourselves.
        Err(httparse::Error::Version) | Err(httparse::Error::NewLine) => {
            let Some((line, rest)) = reqline::parse(b)? else {
                return Ok(None);
            };
            if line.version == Version::Http09 {
                return finish(b, line, &[], rest, limits).map(Some);
            }
            // Rare path: an initialised index of the same size keeps the same header limit.
            let mut init = vec![EMPTY_HEADER; slots.len()];
            match httparse::parse_headers(&b[rest..], &mut init) {
                Ok(Status::Complete((hlen, headers))) => {
                    finish(b, line, headers, rest + hlen, limits).map(Some)
                }
                Ok(Status::Partial) => Ok(None),
                Err(e) => Err(map_httparse(e)),
            }
        }
        Err(e) => Err(map_httparse(e)),
    }
}

fn map_httparse(e: httparse::Error) -> Fail {
    let reason = match e {
        httparse::Error::TooManyHeaders => return Fail::TooManyHeaders,
        httparse::Error::Token => "invalid method or request target",
        // Also obs-fold and whitespace before the colon: both start a name with a non-token.
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Version => "invalid HTTP version",
        httparse::Error::Status => "invalid request",
    };
    Fail::Parse(ParseError::BadRequest(reason))
}

/// The offset range of `part` inside `whole`. httparse hands out sub-slices of its input;
/// a slice from anywhere else is refused rather than trusted.
fn span(whole: &[u8], part: &[u8]) -> Result<Range<usize>, ParseError> {
    let start = (part.as_ptr() as usize).wrapping_sub(whole.as_ptr() as usize);
    match whole.len().checked_sub(start) {
        Some(room) if part.len() <= room => Ok(start..start + part.len()),
        _ => Err(ParseError::BadRequest("internal parser offset error")),
    }
}

/// Limits and header semantics for a complete head of `len` bytes.
fn finish(
    b: &[u8],
    line: RequestLine,
    headers: &[Header<'_>],
    len: usize,
    limits: &Limits,
) -> Result<Parsed, Fail> {
    if line.len > limits.max_request_line {
        return Err(ParseError::UriTooLong.into());
    }
    if len > limits.max_head {
        return Err(ParseError::HeaderTooLarge.into());
    }
    // The header index the head keeps: one the thread kept from an earlier head, if any.
    let mut ranges = take_index(headers.len());
    // Each header line runs from its name to the next name (or to the final empty line), so
    // line lengths fall out of the offsets without rescanning the bytes.
    let line_ok = |start: usize, next: usize| {
        let len = next.saturating_sub(start).saturating_sub(eol_len(b, next));
        len <= limits.max_header_line
    };
    let mut ignored = Vec::new();
    let mut conditional = false;
    // Where the previous line started: a dropped field's line counts for the limits too.
    let mut prev: Option<usize> = None;
    for h in headers {
        let name = span(b, h.name.as_bytes())?;
        if prev.is_some_and(|p| !line_ok(p, name.start)) {
            return Err(ParseError::HeaderTooLarge.into());
        }
        prev = Some(name.start);
        let value = span(b, h.value)?;
        if limits.names.drops(&b[name.clone()]) {
            ignored.push(name.start..value.end);
            continue;
        }
        conditional |= b
            .get(name.start..name.start + 3)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"if-"));
        ranges.push((name, value));
    }
    if prev.is_some_and(|p| !line_ok(p, len.saturating_sub(eol_len(b, len)))) {
        return Err(ParseError::HeaderTooLarge.into());
    }
    let fields = fields::interpret(b, line.version, &ranges)?;
    Ok(Parsed {
        len,
        line,
        headers: ranges,
        ignored,
        fields,
        conditional,
    })
}

/// Length of the line terminator (`\n` or `\r\n`) that ends just before `end`.
fn eol_len(b: &[u8], end: usize) -> usize {
    match (
        end.checked_sub(2).and_then(|i| b.get(i)),
        end.checked_sub(1).and_then(|i| b.get(i)),
    ) {
        (Some(b'\r'), Some(b'\n')) => 2,
        (_, Some(b'\n')) => 1,
        _ => 0,
    }
}

/// Limits on an incomplete head: refuse as soon as the eventual head is sure to exceed them,
/// so a slow or hostile client cannot make the buffer grow without bound. Each check measures
/// the same thing `finish` does (every line so far, not just the open one), so the answer
/// does not depend on how the bytes arrived. Only runs when the head is incomplete.
fn check_partial(b: &[u8], limits: &Limits) -> Result<(), ParseError> {
    let check = |first: bool, len: usize| match first {
        true if len > limits.max_request_line => Err(ParseError::UriTooLong),
        false if len > limits.max_header_line => Err(ParseError::HeaderTooLarge),
        _ => Ok(()),
    };
    let mut start = 0;
    for lf in memchr::memchr_iter(b'\n', b) {
        check(
            start == 0,
            lf - start - usize::from(lf > start && b[lf - 1] == b'\r'),
        )?;
        start = lf + 1;
    }
    // The open line: a trailing CR may be the start of its terminator, so it is not counted.
    let open = &b[start..];
    check(
        start == 0,
        open.len() - usize::from(open.last() == Some(&b'\r')),
    )?;
    if b.len() > limits.max_head {
        return Err(ParseError::HeaderTooLarge);
    }
    Ok(())
}

/// A method's or a field name's bytes as text: a token, so ASCII (checked a word at a
/// time, where `from_utf8`'s check cost ~90 instructions a name; the FastCGI parameters
/// take every field's name, callgrind: docs/bench/cost-per-request.md); other bytes are
/// checked as before (invalid UTF-8: empty).
fn ascii_str(b: &[u8]) -> &str {
    if b.is_ascii() {
        // SAFETY: ASCII bytes are valid UTF-8.
        unsafe { std::str::from_utf8_unchecked(b) }
    } else {
        std::str::from_utf8(b).unwrap_or("")
    }
}
