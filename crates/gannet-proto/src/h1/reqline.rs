//! The slow path for request lines `httparse` refuses because of their version part.
//!
//! httparse accepts exactly `HTTP/1.0` or `HTTP/1.1` followed by the line end. nginx is
//! looser and more precise: any `HTTP/1.x` minor is served as 1.1, a major version above 1 is
//! answered with 505 rather than 400, and spaces may follow the version. Only requests that
//! fail httparse's version check come here, so this code is off the hot path.

use std::ops::Range;

use super::parse::{ParseError, Version};

/// A request line, as offsets into the buffer it was parsed from.
pub(super) struct RequestLine {
    pub method: Range<usize>,
    pub target: Range<usize>,
    pub version: Version,
    /// Length of the line without its terminator (the 414 limit applies to this).
    pub len: usize,
}

const BAD_VERSION: ParseError = ParseError::BadRequest("invalid HTTP version");

/// Parse the request line at the start of `b`. `Ok(None)`: the line is incomplete and could
/// still become valid. On success also returns the offset just past the line terminator.
pub(super) fn parse(b: &[u8]) -> Result<Option<(RequestLine, usize)>, ParseError> {
    let mut cur = Cursor { b, i: 0 };

    let Some(method) = cur.take_while(is_tchar) else {
        return Ok(None);
    };
    if method.is_empty() || !cur.eat(b' ') {
        return Err(ParseError::BadRequest("invalid method"));
    }
    let Some(target) = cur.take_while(is_target_byte) else {
        return Ok(None);
    };
    // The same rule httparse applies to targets, so both paths accept the same requests.
    if target.is_empty() || std::str::from_utf8(&b[target.clone()]).is_err() {
        return Err(ParseError::BadRequest("invalid request target"));
    }
    // HTTP/0.9 (nginx's `sw_http_09`): the line ends after the target and any spaces,
    // with no version - and no header fields follow.
    let after = cur.i;
    if cur.take_while(|c| c == b' ').is_none() {
        return Ok(None);
    }
    let line_end = match (cur.peek(), b.get(cur.i + 1)) {
        (Some(b'\n'), _) => Some(cur.i + 1),
        (Some(b'\r'), Some(b'\n')) => Some(cur.i + 2),
        (Some(b'\r'), None) => return Ok(None),
        _ => None,
    };
    if let Some(next) = line_end {
        let line = RequestLine {
            method,
            target,
            version: Version::Http09,
            len: cur.i,
        };
        return Ok(Some((line, next)));
    }
    cur.i = after;
    if !cur.eat(b' ') {
        return Err(ParseError::BadRequest("invalid request target"));
    }
    for &want in b"HTTP/" {
        match cur.peek() {
            None => return Ok(None),
            Some(c) if c == want => cur.i += 1,
            Some(_) => return Err(BAD_VERSION),
        }
    }
    // Major version: one digit 1-9. Anything above 1 (including a second digit) is a
    // protocol we do not speak: 505, as nginx answers.
    match cur.peek() {
        None => return Ok(None),
        Some(b'1') => cur.i += 1,
        Some(b'2'..=b'9') => return Err(ParseError::VersionNotSupported),
        Some(_) => return Err(BAD_VERSION),
    }
    match cur.peek() {
        None => return Ok(None),
        Some(b'.') => cur.i += 1,
        Some(b'0'..=b'9') => return Err(ParseError::VersionNotSupported),
        Some(_) => return Err(BAD_VERSION),
    }
    let Some(minor) = cur.take_while(|c| c.is_ascii_digit()) else {
        return Ok(None);
    };
    // nginx caps the minor version at three digits.
    if minor.is_empty() || minor.len() > 3 {
        return Err(BAD_VERSION);
    }
    let version = if minor.len() == 1 && b[minor.start] == b'0' {
        Version::Http10
    } else {
        Version::Http11
    };
    if cur.take_while(|c| c == b' ').is_none() {
        return Ok(None);
    }
    let len = cur.i;
    let next = match (cur.peek(), b.get(cur.i + 1)) {
        (Some(b'\n'), _) => cur.i + 1,
        (Some(b'\r'), Some(b'\n')) => cur.i + 2,
        (Some(b'\r'), None) => return Ok(None),
        _ => return Err(BAD_VERSION),
    };
    Ok(Some((
        RequestLine {
            method,
            target,
            version,
            len,
        },
        next,
    )))
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }
    /// Advance over bytes matching `f`; `None` if the input ended before a non-matching byte.
    fn take_while(&mut self, f: impl Fn(u8) -> bool) -> Option<Range<usize>> {
        let start = self.i;
        while f(self.peek()?) {
            self.i += 1;
        }
        Some(start..self.i)
    }
    /// Consume `c` if it is next.
    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.i += usize::from(hit);
        hit
    }
}

/// RFC 9110 `tchar`.
pub(super) fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// Bytes httparse allows in a request target: visible ASCII and any non-ASCII byte.
fn is_target_byte(c: u8) -> bool {
    matches!(c, 0x21..=0x7e | 0x80..=0xff)
}
