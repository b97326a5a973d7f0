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
        let used = match ParserConfig::default()
            .parse_response_with_uninit_headers(&mut r, buf, &mut slots)
        {
            Ok(Status::Complete(n)) => n,
            Ok(Status::Partial) if buf.len() > max => return Err(ResponseError::TooBig),
            Ok(Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::TooBig),
            Err(_) => return Err(ResponseError::Invalid),
        };
        if used > max {
            return Err(ResponseError::TooBig);
        }
        let status = r.code.ok_or(ResponseError::Invalid)?;
        let minor = r.version.ok_or(ResponseError::Invalid)?;
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
        // `buf` (`r` borrows `buf` until then).
        let base = buf.as_ptr() as usize;
        let mut list = Vec::with_capacity(r.headers.len());
        for h in r.headers.iter() {
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
                for token in value().split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        head.keep_alive = false;
                    } else if token.eq_ignore_ascii_case("keep-alive") && minor == 0 {
                        head.keep_alive = true;
                    }
                }
            }
        }
        head.headers = Fields::from_head(buf.split_to(used).freeze(), list);
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
