//! Header-field semantics of a request head: body framing (RFC 9112 6), Host, Connection and
//! Expect, with nginx's answers for the malformed cases. Runs once per head over the ranges
//! the parser recorded; header names are compared without allocating.

use std::ops::Range;

use super::parse::{BodyKind, ParseError, Version};

/// What the header fields say, as needed by the connection loop.
pub(super) struct Fields {
    pub body: BodyKind,
    pub keep_alive: bool,
    pub expect_continue: bool,
    /// Host part of the Host header (port and trailing dot removed).
    pub host: Option<Range<usize>>,
}

const fn bad(reason: &'static str) -> ParseError {
    ParseError::BadRequest(reason)
}

/// Interpret the fields of a complete head. `b` is the head's bytes, `headers` the
/// (name, value) ranges into it.
pub(super) fn interpret(
    b: &[u8],
    version: Version,
    headers: &[(Range<usize>, Range<usize>)],
) -> Result<Fields, ParseError> {
    let mut content_length: Option<u64> = None;
    let mut transfer_encoding: Option<&[u8]> = None;
    let mut host: Option<Range<usize>> = None;
    let mut close = false;
    let mut keep_alive_token = false;
    let mut expect_continue = false;
    let mut seen = 0u8;

    for (name, value) in headers {
        let name = &b[name.clone()];
        let v = &b[value.clone()];
        if let Some(bit) = unique(name) {
            if seen & bit != 0 {
                return Err(bad("client sent duplicate header line"));
            }
            seen |= bit;
        }
        // Dispatch on length first: most fields are none of these and cost one compare.
        match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => {
                if host.is_some() {
                    return Err(bad("duplicate Host header"));
                }
                let len = valid_host(v).ok_or(bad("invalid Host header"))?;
                host = Some(value.start..value.start + len);
            }
            6 if name.eq_ignore_ascii_case(b"expect") => {
                // Other expectations are left to the server; nginx ignores them.
                expect_continue =
                    version == Version::Http11 && trim_ows(v).eq_ignore_ascii_case(b"100-continue");
            }
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for token in v.split(|&c| c == b',').map(trim_ows) {
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                // Even an identical repeat is refused: a proxy in front may have picked the
                // other one (request smuggling), and nginx refuses it too.
                if content_length.is_some() {
                    return Err(bad("duplicate Content-Length header"));
                }
                content_length = Some(parse_length(v).ok_or(bad("invalid Content-Length header"))?);
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                if transfer_encoding.is_some() {
                    return Err(bad("duplicate Transfer-Encoding header"));
                }
                transfer_encoding = Some(v);
            }
            _ => {}
        }
    }

    if version == Version::Http11 && host.is_none() {
        return Err(bad("HTTP/1.1 request without Host header"));
    }
    let body = match (transfer_encoding, content_length) {
        (Some(_), _) if version == Version::Http10 => {
            return Err(bad("HTTP/1.0 request with Transfer-Encoding"));
        }
        // Both framings at once is the classic smuggling vector: refuse outright.
        (Some(_), Some(_)) => return Err(bad("both Content-Length and Transfer-Encoding")),
        (Some(te), None) if trim_ows(te).eq_ignore_ascii_case(b"chunked") => BodyKind::Chunked,
        (Some(_), None) => return Err(ParseError::NotImplemented("unknown Transfer-Encoding")),
        (None, Some(n)) => BodyKind::Length(n),
        (None, None) => BodyKind::None,
    };
    let keep_alive = match version {
        Version::Http11 | Version::Http2 | Version::Http3 => !close,
        Version::Http10 => keep_alive_token && !close,
        // The answer ends with the connection: HTTP/0.9 has no other framing.
        Version::Http09 => false,
    };
    Ok(Fields {
        body,
        keep_alive,
        expect_continue,
        host,
    })
}

/// The fields nginx takes once only (ngx_http_process_unique_header_line; Host,
/// Content-Length and Transfer-Encoding are checked with their meaning): a repeat is a
/// bad request. Each one's bit in a set of those seen.
pub(super) fn unique(name: &[u8]) -> Option<u8> {
    const NAMES: [&[u8]; 8] = [
        b"if-modified-since",
        b"if-unmodified-since",
        b"if-match",
        b"if-none-match",
        b"content-range",
        b"if-range",
        b"expect",
        b"authorization",
    ];
    // Most fields have none of these lengths: one compare.
    if !matches!(name.len(), 6 | 8 | 13 | 17 | 19) {
        return None;
    }
    NAMES
        .iter()
        .position(|n| name.eq_ignore_ascii_case(n))
        .map(|i| 1 << i)
}

/// Content-Length: 1*DIGIT that fits a u64. No sign, no spaces inside, no list form.
pub(super) fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, &c| {
        let d = c.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// Validate a Host value the way nginx's `ngx_http_validate_host` does and return the length
/// of its host part (without `:port` and one trailing dot). `None` for an invalid host:
/// empty, `..`, a path separator, whitespace or control bytes.
pub fn valid_host(v: &[u8]) -> Option<usize> {
    plain_host(v).or_else(|| valid_host_general(v))
}

/// Bytes of a host name as most clients send it: letters, digits, `-` and `_`.
static NAME_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
        c += 1;
    }
    t
};

/// The usual Host value in one table lookup a byte: a name or IPv4 address (name bytes
/// and single dots inside), then maybe `:` and a port of digits. `None` for anything else,
/// which [`valid_host_general`] judges (the general rules, a dozen instructions a byte:
/// about 250 for `127.0.0.1:8080`, callgrind).
fn plain_host(v: &[u8]) -> Option<usize> {
    let mut prev_dot = true;
    let mut end = v.len();
    for (i, &c) in v.iter().enumerate() {
        if NAME_BYTE[usize::from(c)] {
            prev_dot = false;
        } else if c == b'.' && !prev_dot {
            prev_dot = true;
        } else if c == b':' {
            end = i;
            break;
        } else {
            return None;
        }
    }
    if prev_dot || !v[end..].iter().skip(1).all(u8::is_ascii_digit) {
        return None;
    }
    Some(end)
}

/// [`valid_host`]'s rules for every value.
fn valid_host_general(v: &[u8]) -> Option<usize> {
    let mut host_len = v.len();
    let mut in_literal = false;
    let mut in_port = false;
    let mut prev_dot = false;
    for (i, &c) in v.iter().enumerate() {
        let is_dot = c == b'.';
        match c {
            b'.' if prev_dot => return None,
            b':' if !in_port && !in_literal => {
                host_len = i;
                in_port = true;
            }
            b'[' if i == 0 => in_literal = true,
            b']' if in_literal => {
                host_len = i + 1;
                in_literal = false;
                in_port = true;
            }
            b'/' | b'\\' => return None,
            0..=0x20 | 0x7f => return None,
            _ => {}
        }
        prev_dot = is_dot;
    }
    if host_len > 0 && v[host_len - 1] == b'.' {
        host_len -= 1;
    }
    (host_len > 0).then_some(host_len)
}

/// Strip optional whitespace (SP / HTAB) from both ends.
pub(super) fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t'))
        .map_or(start, |i| i + 1);
    &v[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-lookup-a-byte path takes only values the general rules take, and finds the
    /// same host part: every value of up to six bytes from the bytes that matter.
    #[test]
    fn the_plain_host_path_agrees_with_the_general_one() {
        let alphabet: &[u8] = b"a-_.:9[]/ \x7f\xc3";
        let mut v = Vec::new();
        let mut taken = 0;
        for len in 0..=6u32 {
            for mut n in 0..alphabet.len().pow(len) {
                v.clear();
                for _ in 0..len {
                    v.push(alphabet[n % alphabet.len()]);
                    n /= alphabet.len();
                }
                if let Some(h) = plain_host(&v) {
                    assert_eq!(Some(h), valid_host_general(&v), "{v:?}");
                    taken += 1;
                }
            }
        }
        assert!(taken > 1000, "{taken}");
        assert_eq!(valid_host(b"127.0.0.1:8080"), Some(9));
        assert_eq!(valid_host(b"Example.COM."), Some(11));
    }
}
