//! Response-head encoding helpers: reason phrases, status lines, HTTP dates and decimal
//! numbers written straight into the output buffer without temporary allocations.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The standard reason phrase for `status`, or `""` for a code without one.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        305 => "Use Proxy",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        // nginx's own code for "header too large", sent on the wire as a 400 page.
        494 => "Request Header Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "",
    }
}

/// Append `HTTP/1.1 <status> <reason>\r\n`. A code without a phrase keeps the space before
/// the (empty) reason, as RFC 9112 4 requires.
pub fn write_status_line(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    write_u64(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The status line as a new vector (see [`write_status_line`]).
pub fn status_line(status: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    write_status_line(&mut out, status);
    out
}

/// IMF-fixdate, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`. Times outside 1970..=9999 (a file
/// mtime can be anything) are clamped, because the format cannot express them and the
/// formatter would panic.
pub fn http_date(t: SystemTime) -> String {
    // 9999-12-31T23:59:59Z
    const LAST: Duration = Duration::from_secs(253_402_300_799);
    let t = match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d > LAST => UNIX_EPOCH + LAST,
        Ok(_) => t,
        Err(_) => UNIX_EPOCH,
    };
    httpdate::fmt_http_date(t)
}

/// Parse an HTTP date in any of the three formats RFC 9110 5.6.7 requires recipients to
/// accept (IMF-fixdate, RFC 850, asctime). Surrounding whitespace is ignored.
pub fn parse_http_date(s: &[u8]) -> Option<SystemTime> {
    let s = std::str::from_utf8(s).ok()?.trim_matches([' ', '\t']);
    httpdate::parse_http_date(s).ok()
}

/// Append `n` in decimal. Digits are produced into a stack buffer, so no allocation
/// happens beyond `out` growing.
pub fn write_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(decimal(n, &mut [0; 20]).as_bytes());
}

/// A chunk's size line (`1a2f\r\n`) appended to `out`, without the formatter: a streamed
/// answer writes one per piece.
pub fn chunk_size(out: &mut Vec<u8>, n: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(HEX[(n >> (i * 4)) & 0xf]);
    }
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written into `buf` (u64::MAX has 20 digits): the formatter's machinery
/// costs several times more for the numbers a request's head and variables carry.
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // SAFETY: `buf[i..]` holds only the bytes b'0'..=b'9' written above, which are ASCII
    // and so valid UTF-8. (The checked conversion, a call per number, showed in profiles:
    // every Content-Length and every logged number goes through here.)
    unsafe { std::str::from_utf8_unchecked(&buf[i..]) }
}
