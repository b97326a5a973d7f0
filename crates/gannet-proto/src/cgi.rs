//! What FastCGI, SCGI and uwsgi share, no I/O: the CGI meta-variables a server sends
//! ([`ParamSink`], each protocol encoding the pairs its own way) and the head an application
//! answers with (RFC 3875 section 6: `Status:`, `Location:`, other header fields), which
//! SCGI and uwsgi applications may also start with an HTTP status line
//! (`HTTP/1.1 200 OK`, [`parse_head_or_status_line`]), as nginx accepts from them.

use bytes::{Buf, Bytes, BytesMut};
pub use bytestring::ByteString;
use std::borrow::Cow;
use std::ops::Range;

/// A header name as an application sent it: borrowed from [`COMMON_NAMES`] when it is
/// spelled as one of them, else owned. Heads are parsed per answer and most names are a
/// few usual ones, so this spares an allocation per field, and the name is passed on to
/// the client's response (whose names are `Cow<'static, str>` too) without a copy.
pub type HeaderName = Cow<'static, str>;

/// The fields servers and applications usually send, in their usual spelling (and PHP's
/// `Content-type`, which every PHP answer carries).
pub const COMMON_NAMES: &[&str] = &[
    "Accept-Ranges",
    "Age",
    "Cache-Control",
    "Connection",
    "Content-Encoding",
    "Content-Language",
    "Content-Length",
    "Content-Type",
    "Content-type",
    "Date",
    "ETag",
    "Expires",
    "Keep-Alive",
    "Last-Modified",
    "Location",
    "Pragma",
    "Server",
    "Set-Cookie",
    "Transfer-Encoding",
    "Vary",
    "X-Powered-By",
];

/// `raw` as a [`HeaderName`]; bytes that are not UTF-8 are replaced, as in any value.
pub fn header_name(raw: &[u8]) -> HeaderName {
    match COMMON_NAMES.iter().find(|n| n.as_bytes() == raw) {
        Some(n) => Cow::Borrowed(n),
        None => Cow::Owned(text(raw)),
    }
}

/// A header name as text: almost always ASCII, checked and copied as is (the lossy
/// conversion's chunk walk costs more); other bytes (obs-text) become replacement
/// characters.
fn text(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(raw).into_owned(),
    }
}

/// A header value kept apart from its head (in a response): shares the head's text.
pub type HeaderValue = ByteString;

/// A head's header fields in order: names, and values as places in the head's text.
///
/// Why not a String per value, nor a shared slice per value: a proxied answer has eight or
/// so fields and the client gets three of them. A String each was an allocation and a copy
/// per field; a slice each (`Bytes`) two atomic count changes per field, which cost more
/// than the copies. Here the head's text is shared once, and a value becomes a
/// [`HeaderValue`] only where it is kept ([`Fields::keep`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    /// The head as received (or, for a head that is not UTF-8, its values with the other
    /// bytes replaced).
    pub text: ByteString,
    /// Each field's name, and where its value is in `text`.
    pub list: Vec<(HeaderName, Range<usize>)>,
}

impl Fields {
    /// The fields of `head` whose values are at the places `list` gives.
    pub(crate) fn from_head(head: Bytes, mut list: Vec<(HeaderName, Range<usize>)>) -> Fields {
        // A head is almost always ASCII: one check of that (`ByteString::try_from` made it
        // again after `from_utf8`'s, two walks of every head).
        if head.is_ascii() || std::str::from_utf8(&head).is_ok() {
            // SAFETY: `head` was just checked to be UTF-8 (ASCII is).
            let text = unsafe { ByteString::from_bytes_unchecked(head) };
            return Fields { text, list };
        }
        // obs-text: the values, each made valid, in a text of their own.
        let mut text = String::new();
        for (_, at) in &mut list {
            let value = String::from_utf8_lossy(head.get(at.clone()).unwrap_or_default());
            let start = text.len();
            text.push_str(&value);
            *at = start..text.len();
        }
        Fields {
            text: text.into(),
            list,
        }
    }

    /// [`Fields::from_head`] for a head its parser found to be all ASCII, without
    /// walking it again.
    ///
    /// # Safety
    ///
    /// Every byte of `head` is ASCII.
    pub(crate) unsafe fn from_ascii_head(
        head: Bytes,
        list: Vec<(HeaderName, Range<usize>)>,
    ) -> Fields {
        debug_assert!(head.is_ascii());
        // SAFETY: ASCII is UTF-8 (the caller's promise).
        let text = unsafe { ByteString::from_bytes_unchecked(head) };
        Fields { text, list }
    }

    /// Fields made from (name, value) pairs, for heads not parsed from the wire.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Fields {
        let mut text = String::new();
        let mut list = Vec::with_capacity(pairs.len());
        for (name, value) in pairs {
            let start = text.len();
            text.push_str(value);
            list.push((header_name(name.as_bytes()), start..text.len()));
        }
        Fields {
            text: text.into(),
            list,
        }
    }

    /// The value at `at` (a place from `list`).
    pub fn value(&self, at: &Range<usize>) -> &str {
        self.text.get(at.clone()).unwrap_or_default()
    }

    /// A value (from [`Fields::value`]) made to outlive the head, sharing its text.
    pub fn keep(&self, value: &str) -> HeaderValue {
        self.text.slice_ref(value)
    }

    /// The fields in order as (name, value).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.list.iter().map(|(n, at)| (&**n, self.value(at)))
    }

    /// The first value of a field, case-insensitive name. Only the name found is made a
    /// value (each lookup walks every field: a proxied answer is looked up several times).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.list
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, at)| self.value(at))
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Why a parameter could not be encoded.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum ParamError {
    /// Longer than the protocol's length fields (or its whole block) can say.
    TooBig,
    /// A NUL byte, which ends a name or value in SCGI's framing.
    Nul,
}

impl std::fmt::Display for ParamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ParamError::TooBig => "request parameters are too big for the protocol",
            ParamError::Nul => "a request parameter contains a NUL byte",
        })
    }
}

/// The name-value pairs of one request, in whichever protocol's encoding.
pub trait ParamSink {
    fn push(&mut self, name: &[u8], value: &[u8]) -> Result<(), ParamError>;
}

/// The CGI response head at the start of an application's answer.
#[derive(Debug, PartialEq, Eq, Default)]
pub struct CgiHead {
    /// From `Status: 404 Not Found` or an HTTP status line (the code only).
    pub status: Option<u16>,
    /// The header fields in order, `Status` excluded, names as sent.
    pub headers: Fields,
}

impl CgiHead {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
}

/// Why the head could not be parsed.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum HeadError {
    /// A header line that is not `name: value`.
    Invalid,
    /// `Status:` without a three-digit code.
    BadStatus,
    /// More than the head size limit without the empty line.
    TooBig,
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HeadError::Invalid => "upstream sent invalid header",
            HeadError::BadStatus => "upstream sent invalid status",
            HeadError::TooBig => "upstream sent too big header",
        })
    }
}

/// Parse the head off the front of `buf` (the answer so far). `Ok(None)`: the empty line
/// has not arrived yet. On success the head is removed and `buf` starts with the body.
/// Lines may end in CRLF or a bare LF (PHP sends CRLF; CGI scripts often send LF).
pub fn parse_head(buf: &mut BytesMut, max: usize) -> Result<Option<CgiHead>, HeadError> {
    head_from(buf, 0, max, None)
}

/// The head whose fields start at `pos`, once it has all come: split off `buf` and frozen,
/// so that the values are slices of it.
fn head_from(
    buf: &mut BytesMut,
    pos: usize,
    max: usize,
    line_status: Option<u16>,
) -> Result<Option<CgiHead>, HeadError> {
    let Some(used) = head_end(buf, pos, max)? else {
        return Ok(None);
    };
    // The head is copied out and the body left where it is, the buffer's only user: split
    // off, the two shared one buffer, and a body that grew with the next read (an answer
    // longer than one read) was copied whole into a new one, as was a body given back as
    // a `BytesMut` (docs/bench/cost-per-request.md, FastCGI).
    let raw = Bytes::copy_from_slice(&buf[..used]);
    buf.advance(used);
    fields(raw, pos, line_status).map(Some)
}

/// Where the head whose fields start at `pos` ends (after its empty line), once it has come.
fn head_end(buf: &[u8], mut pos: usize, max: usize) -> Result<Option<usize>, HeadError> {
    loop {
        let Some(nl) = memchr::memchr(b'\n', &buf[pos..]) else {
            return if buf.len() > max {
                Err(HeadError::TooBig)
            } else {
                Ok(None)
            };
        };
        let end = pos + nl;
        if end > max {
            return Err(HeadError::TooBig);
        }
        let line = &buf[pos..end];
        pos = end + 1;
        if line.is_empty() || line == b"\r" {
            return Ok(Some(pos));
        }
    }
}

/// [`parse_head`], except that the head may start with an HTTP status line, whose code then
/// wins over a `Status:` field (nginx's SCGI and uwsgi modules read answers this way). A
/// first line that is not a status line is read as a header field.
pub fn parse_head_or_status_line(
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<CgiHead>, HeadError> {
    let Some(nl) = memchr::memchr(b'\n', buf) else {
        return if buf.len() > max {
            Err(HeadError::TooBig)
        } else {
            Ok(None)
        };
    };
    let line = &buf[..nl];
    let Some(code) = status_line(line.strip_suffix(b"\r").unwrap_or(line)) else {
        return parse_head(buf, max);
    };
    head_from(buf, nl + 1, max, Some(code))
}

/// The code of `HTTP/major.minor NNN [reason]`, or `None` if `line` is not one.
fn status_line(line: &[u8]) -> Option<u16> {
    let rest = line.strip_prefix(b"HTTP/")?;
    let sp = memchr::memchr(b' ', rest)?;
    let (major, minor) = rest[..sp].split_at(memchr::memchr(b'.', &rest[..sp])?);
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    if !digits(major) || !digits(&minor[1..]) {
        return None;
    }
    let rest = &rest[sp + 1..];
    let code = rest.get(..3).filter(|c| digits(c))?;
    if rest.get(3).is_some_and(|&b| b != b' ') {
        return None;
    }
    let code = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    (100..1000).contains(&code).then_some(code)
}

/// The header fields of a whole `head` from `pos` to its empty line. `line_status` is the
/// code of a status line before them.
fn fields(head: Bytes, mut pos: usize, line_status: Option<u16>) -> Result<CgiHead, HeadError> {
    let mut status = line_status;
    let mut list = Vec::new();
    while let Some(nl) = memchr::memchr(b'\n', &head[pos..]) {
        let end = pos + nl;
        let line = &head[pos..end];
        let line_start = pos;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        pos = end + 1;
        if line.is_empty() {
            break;
        }
        let colon = memchr::memchr(b':', line).ok_or(HeadError::Invalid)?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&c| is_token(c)) {
            return Err(HeadError::Invalid);
        }
        let raw_value = &line[colon + 1..];
        let value = trim(raw_value);
        let at = line_start + colon + 1 + (value.as_ptr() as usize - raw_value.as_ptr() as usize);
        let name = header_name(name);
        if name.eq_ignore_ascii_case("status") {
            // After a status line the field is not read at all, as in nginx: only hidden.
            if line_status.is_some() {
                continue;
            }
            let code = value
                .get(..3)
                .filter(|c| c.iter().all(u8::is_ascii_digit))
                .map(|c| c.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0')));
            match code {
                Some(c) if (100..1000).contains(&c) && value.get(3).is_none_or(|&b| b == b' ') => {
                    status = Some(c)
                }
                _ => return Err(HeadError::BadStatus),
            }
        } else {
            list.push((name, at..at + value.len()));
        }
    }
    Ok(CgiHead {
        status,
        headers: Fields::from_head(head, list),
    })
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// One look-up a byte: the name of each field of every answer is checked (the alphanumeric
/// test and a search of the other fifteen cost several times that).
fn is_token(c: u8) -> bool {
    crate::h1::response::TOKEN[usize::from(c)]
}

#[cfg(test)]
#[path = "cgi_tests.rs"]
mod tests;
