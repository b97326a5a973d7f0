//! HTTP/1.x response heads, as a reverse proxy reads them from an upstream server: the
//! status, the header fields in order, and how the body is framed (RFC 9112 section 6.3),
//! which also says whether the connection can carry another request.
//!
//! Interim 1xx answers other than 101 (Switching Protocols) are skipped: the request was
//! sent without `Expect`, so a `100 Continue` carries nothing for the client. Framing that
//! could be read two ways (`Content-Length` with `Transfer-Encoding`, or two different
//! lengths) is an error, as in nginx, because a proxy that guesses can be desynchronised.

use crate::cgi::{header_name, Fields};
use bytes::{Buf, BytesMut};
use httparse::{Header, ParserConfig, Status};
use std::mem::MaybeUninit;

/// The most header fields a response head may have.
pub const MAX_HEADERS: usize = 100;

/// How the response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Up to the end of the connection.
    Close,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    /// 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub minor: u8,
    /// The header fields in order, names as sent.
    pub headers: Fields,
    pub framing: Framing,
    /// Whether the server keeps the connection open after this answer (HTTP/1.1 without
    /// `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`), and the body is
    /// delimited by something other than the close.
    pub keep_alive: bool,
}

impl ResponseHead {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
}

/// Why a response head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseError {
    /// Not an HTTP/1.x status line and header fields.
    Invalid,
    /// More than the size limit (or [`MAX_HEADERS`] fields) without the empty line.
    TooBig,
    /// Two different `Content-Length`s, or one that is not a number.
    BadLength,
    /// `Content-Length` and `Transfer-Encoding` together.
    LengthAndEncoding,
    /// A `Transfer-Encoding` that does not end in chunked, on an HTTP/1.1 answer whose
    /// length the server could then only give by closing (refused rather than guessed).
    BadEncoding,
}

impl std::fmt::Display for ResponseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // nginx's wording, for the error log.
        f.write_str(match self {
            ResponseError::Invalid => "upstream sent no valid HTTP/1.0 header",
            ResponseError::TooBig => "upstream sent too big header",
            ResponseError::BadLength => "upstream sent invalid \"Content-Length\" header",
            ResponseError::LengthAndEncoding => {
                "upstream sent \"Content-Length\" and \"Transfer-Encoding\" headers at the same time"
            }
            ResponseError::BadEncoding => "upstream sent unknown \"Transfer-Encoding\"",
        })
    }
}

/// Parse the head off the front of `buf`. `Ok(None)`: it has not all arrived yet. On
/// success the head (and any interim 1xx heads before it) is removed and `buf` starts with
/// the body. `head_request`: the answer is to a HEAD request, so it has no body whatever
/// its fields say.
pub fn parse_response(
    buf: &mut BytesMut,
    max: usize,
    head_request: bool,
) -> Result<Option<ResponseHead>, ResponseError> {
    loop {
        // Uninitialised slots: httparse fills only what it uses (no 3 KiB memset per answer).
        let mut slots = [const { MaybeUninit::<Header<'_>>::uninit() }; MAX_HEADERS];
        let mut r = httparse::Response::new(&mut []);
        let parsed = plain(buf, &mut slots);
        let fast = parsed.is_some();
        let (status, minor, used, headers): (u16, u8, usize, &[Header<'_>]) = match parsed {
            Some((status, minor, used, n)) => {
                // SAFETY: `plain` initialised the first `n` slots (and `n` is within
                // them); they borrow `buf`, as httparse's would.
                let h = unsafe { std::slice::from_raw_parts(slots.as_ptr().cast(), n) };
                (status, minor, used, h)
            }
            None => {
                let used = match ParserConfig::default()
                    .parse_response_with_uninit_headers(&mut r, buf, &mut slots)
                {
                    Ok(Status::Complete(n)) => n,
                    Ok(Status::Partial) if buf.len() > max => return Err(ResponseError::TooBig),
                    Ok(Status::Partial) => return Ok(None),
                    Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::TooBig),
                    Err(_) => return Err(ResponseError::Invalid),
                };
                let status = r.code.ok_or(ResponseError::Invalid)?;
                let minor = r.version.ok_or(ResponseError::Invalid)?;
                (status, minor, used, &*r.headers)
            }
        };
        if used > max {
            return Err(ResponseError::TooBig);
        }
        if (100..200).contains(&status) && status != 101 {
            buf.advance(used);
            continue;
        }
        let mut head = ResponseHead {
            status,
            minor,
            headers: Fields::default(),
            framing: Framing::Close,
            keep_alive: minor == 1,
        };
        let mut length: Option<u64> = None;
        let mut chunked = None::<bool>;
        // Where each value lies in the head, which becomes the fields' text once split off
        // `buf` (`headers` borrow `buf` until then).
        let base = buf.as_ptr() as usize;
        let mut list = Vec::with_capacity(headers.len());
        for h in headers {
            let at = (h.value.as_ptr() as usize).wrapping_sub(base);
            list.push((header_name(h.name.as_bytes()), at..at + h.value.len()));
            // Only the framing fields are read here; a value that is not UTF-8 matches nothing.
            let value = || std::str::from_utf8(h.value).unwrap_or("\u{FFFD}");
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = value()
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| ResponseError::BadLength)?;
                if length.is_some_and(|l| l != n) {
                    return Err(ResponseError::BadLength);
                }
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                // Only the last coding says how the message ends.
                let last = value().rsplit(',').next().unwrap_or("").trim();
                chunked = Some(last.eq_ignore_ascii_case("chunked"));
            } else if h.name.eq_ignore_ascii_case("connection") {
                // The usual value alone, without the split and trims of a list.
                if h.value.eq_ignore_ascii_case(b"keep-alive") {
                    head.keep_alive |= minor == 0;
                    continue;
                }
                for token in value().split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        head.keep_alive = false;
                    } else if token.eq_ignore_ascii_case("keep-alive") && minor == 0 {
                        head.keep_alive = true;
                    }
                }
            }
        }
        let text = buf.split_to(used).freeze();
        head.headers = if fast {
            // SAFETY: `plain` took only ASCII bytes into the head (see there).
            unsafe { Fields::from_ascii_head(text, list) }
        } else {
            Fields::from_head(text, list)
        };
        head.framing = if head_request || status < 200 || status == 204 || status == 304 {
            Framing::Empty
        } else {
            match (chunked, length) {
                (Some(_), Some(_)) => return Err(ResponseError::LengthAndEncoding),
                (Some(true), None) => Framing::Chunked,
                (Some(false), None) if minor == 1 => return Err(ResponseError::BadEncoding),
                (Some(false), None) | (None, None) => Framing::Close,
                (None, Some(n)) => Framing::Length(n),
            }
        };
        if head.framing == Framing::Close || status == 101 {
            head.keep_alive = false;
        }
        return Ok(Some(head));
    }
}

/// The usual answer head, parsed in one pass: `HTTP/1.1` or `HTTP/1.0`, a three-digit code,
/// a reason of visible ASCII, then `Name: value` lines of token names and visible-ASCII
/// values, every line ending in CRLF, up to [`MAX_HEADERS`] fields (so all of it ASCII).
/// Returns the code, the
/// minor version, the head's length and how many of `slots` hold its fields, exactly as
/// httparse would give them for such a head; `None` for anything else (not all here yet,
/// other bytes, bare LFs, folded lines, whitespace after a value, an empty value...),
/// which httparse then parses (or refuses) as before.
///
/// Why: httparse's general parser (each byte of each name through its state machine) was
/// about 2,000 of the 30,000 user-space instructions of a proxied request for a back
/// end's 8-field head; this takes values eight bytes at a time.
pub(super) fn plain<'b>(
    buf: &'b [u8],
    slots: &mut [MaybeUninit<Header<'b>>],
) -> Option<(u16, u8, usize, usize)> {
    let minor = match buf.get(..9)? {
        b"HTTP/1.1 " => 1,
        b"HTTP/1.0 " => 0,
        _ => return None,
    };
    let code = buf.get(9..12)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let status = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    let mut i = 12;
    if *buf.get(i)? == b' ' {
        i = visible_to_cr(buf, i + 1)?;
    }
    if buf.get(i..i + 2)? != b"\r\n" {
        return None;
    }
    i += 2;
    let mut n = 0;
    loop {
        if *buf.get(i)? == b'\r' {
            return (*buf.get(i + 1)? == b'\n').then_some((status, minor, i + 2, n));
        }
        let start = i;
        while TOKEN[usize::from(*buf.get(i)?)] {
            i += 1;
        }
        if i == start || buf[i] != b':' {
            return None;
        }
        // SAFETY: the bytes were all checked to be token characters, which are ASCII.
        let name = unsafe { std::str::from_utf8_unchecked(&buf[start..i]) };
        i += 1;
        while matches!(*buf.get(i)?, b' ' | b'\t') {
            i += 1;
        }
        let from = i;
        i = visible_to_cr(buf, i)?;
        // An empty value, or one with whitespace to trim: httparse's.
        if i == from || matches!(buf[i - 1], b' ' | b'\t') || *buf.get(i + 1)? != b'\n' {
            return None;
        }
        *slots.get_mut(n)? = MaybeUninit::new(Header {
            name,
            value: &buf[from..i],
        });
        n += 1;
        i += 2;
    }
}

/// Where the CR after `buf[i..]`'s run of visible ASCII, spaces and tabs is; `None` when
/// another byte (or the end of `buf`) comes first. Eight bytes at a time while they are
/// all 0x20..=0x7e (the usual value), then byte by byte.
fn visible_to_cr(buf: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(w) = buf.get(i..i + 8) {
        let x = u64::from_le_bytes(w.try_into().ok()?);
        // The bytes below 0x20 and above 0x7e: exact up to the first flagged one (borrows
        // and carries go only towards later bytes), which is usually the CR.
        let below = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
        // (Adding 0x7f - 0x7e to each byte takes a byte above 0x7e to 0x80 or past it.)
        let above = (x.wrapping_add(ONES) | x) & HIGH;
        let odd = below | above;
        if odd != 0 {
            i += (odd.trailing_zeros() / 8) as usize;
            if buf[i] == b'\r' {
                return Some(i);
            }
            break;
        }
        i += 8;
    }
    loop {
        match *buf.get(i)? {
            b'\r' => return Some(i),
            b'\t' | 0x20..=0x7e => i += 1,
            _ => return None,
        }
    }
}

/// The token characters of RFC 9110 (a field name's), as httparse takes them.
pub(crate) static TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        c += 1;
    }
    t
};

/// [`plain`]'s answer with its fields copied out, for the tests.
#[cfg(test)]
pub(super) type PlainHead = (u16, u8, usize, Vec<(String, Vec<u8>)>);

#[cfg(test)]
pub(super) fn plain_fields(buf: &[u8]) -> Option<PlainHead> {
    let mut slots = [const { MaybeUninit::<Header<'_>>::uninit() }; MAX_HEADERS];
    let (status, minor, used, n) = plain(buf, &mut slots)?;
    let fields = slots[..n]
        .iter()
        // SAFETY: `plain` initialised the first `n` slots.
        .map(|h| unsafe { h.assume_init_ref() })
        .map(|h| (h.name.to_string(), h.value.to_vec()))
        .collect();
    Some((status, minor, used, fields))
}
