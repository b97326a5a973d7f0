//! Conditional requests and ranges on a 200 response (RFC 9110 §13, §14), as nginx's
//! not_modified and range filters do: If-Match / If-Unmodified-Since -> 412,
//! If-None-Match / If-Modified-Since -> 304 (`if_modified_since exact|before|off`),
//! Range with If-Range -> 206 (one range, or multipart/byteranges for several) or 416.

use crate::http::request::Request;
use crate::http::response::{Body, Part, Response};
use crate::modules::static_files::IfModifiedSince;
use bytes::Bytes;
use gannet_proto::h1::encode::parse_http_date;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether an If-Match / If-None-Match list names `etag` (weak comparison when `weak`).
fn etag_listed(list: &[u8], etag: &str, weak: bool) -> bool {
    let list = String::from_utf8_lossy(list);
    let strip = |t: &str| t.trim().trim_start_matches("W/").to_string();
    list.split(',').any(|t| {
        let t = t.trim();
        t == "*" || t == etag || (weak && strip(t) == strip(etag))
    })
}

/// nginx's not_modified filter on an answer with its own validators: `true` when it made
/// the answer a 304 or 412 (no range is then cut).
pub fn not_modified_filter(req: &Request, r: &mut Response) -> bool {
    let (etag, lm) = (r.etag.clone(), r.last_modified);
    preconditions(req, r, etag.as_deref(), lm)
}

/// nginx's not_modified filter against these validators: a failed If-Match or
/// If-Unmodified-Since makes the answer a 412, a matching If-None-Match or
/// If-Modified-Since a 304. `true` when it did.
pub fn preconditions(
    req: &Request,
    r: &mut Response,
    etag: Option<&str>,
    last_modified: Option<SystemTime>,
) -> bool {
    // No `If-` field at all (the usual request): nothing to look up.
    if !req.head.may_be_conditional() {
        return false;
    }
    let h = |n| req.head.header(n);
    // Preconditions that fail with 412.
    if let Some(im) = h("if-match") {
        if !etag.is_some_and(|e| etag_listed(im, e, false)) {
            *r = Response::error_page(412, req.conf.core.server_tokens());
            return true;
        }
    } else if let (Some(ius), Some(lm)) = (h("if-unmodified-since"), last_modified) {
        if parse_http_date(ius).is_some_and(|t| secs(lm) > secs(t)) {
            *r = Response::error_page(412, req.conf.core.server_tokens());
            return true;
        }
    }
    if not_modified(req, etag, last_modified) {
        r.status = 304;
        r.body = Body::Empty;
        r.content_type = None;
        r.content_length = None;
        return true;
    }
    false
}

fn not_modified(req: &Request, etag: Option<&str>, last_modified: Option<SystemTime>) -> bool {
    if let Some(inm) = req.head.header("if-none-match") {
        return etag.is_some_and(|e| etag_listed(inm, e, true));
    }
    let (Some(ims), Some(lm)) = (req.head.header("if-modified-since"), last_modified) else {
        return false;
    };
    let Some(t) = parse_http_date(ims) else {
        return false;
    };
    match req.conf.files.if_modified_since() {
        IfModifiedSince::Off => false,
        IfModifiedSince::Exact => secs(t) == secs(lm),
        IfModifiedSince::Before => secs(lm) <= secs(t),
    }
}

/// Parse `bytes=a-b,c-,-n` against `len`. `None`: not a bytes range, ignored (200).
/// `Some(empty)`: nothing satisfiable or a malformed bytes range (416, as nginx).
pub(crate) fn parse_ranges(v: &[u8], len: u64) -> Option<Vec<(u64, u64)>> {
    let v = std::str::from_utf8(v).ok()?;
    let spec = v.trim().strip_prefix("bytes=")?;
    Some(parse_spec(spec, len).unwrap_or_default())
}

fn parse_spec(spec: &str, len: u64) -> Option<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (a, b) = part.split_once('-')?;
        let (a, b) = (a.trim(), b.trim());
        let (start, end) = if a.is_empty() {
            let n: u64 = b.parse().ok()?;
            if n == 0 {
                continue;
            }
            (len.saturating_sub(n), len.checked_sub(1)?)
        } else {
            let s: u64 = a.parse().ok()?;
            let e: u64 = if b.is_empty() {
                u64::MAX
            } else {
                b.parse().ok()?
            };
            if e < s {
                return None;
            }
            if s >= len {
                continue;
            }
            (s, e.min(len - 1))
        };
        out.push((start, end));
    }
    Some(out)
}

/// Bytes `start..=end` of a body, as the pieces of its parts they fall in (one part for a
/// plain file; an FLV answer is its header and the file from `?start`).
fn slice(body: &Body, start: u64, end: u64) -> Option<Vec<Part>> {
    let Body::Parts(parts) = body else {
        return None;
    };
    let mut out = Vec::with_capacity(1);
    let mut at = 0u64;
    for p in parts {
        let (from, to) = (at, at + p.len());
        at = to;
        if to <= start || from > end {
            continue;
        }
        let (s, e) = (start.max(from) - from, end.min(to - 1) - from);
        out.push(match p {
            Part::Bytes(b) => Part::Bytes(b.slice(s as usize..=e as usize)),
            Part::File(f) => {
                let mut f = f.clone();
                f.offset += s;
                f.len = e - s + 1;
                Part::File(f)
            }
        });
    }
    Some(out)
}

/// Whether the request's If-Range (if any) names the answer's ETag or Last-Modified: its
/// Range is to be answered then, else the whole.
pub(crate) fn if_range_holds(
    req: &Request,
    etag: Option<&str>,
    last_modified: Option<SystemTime>,
) -> bool {
    let Some(ir) = req.head.header("if-range") else {
        return true;
    };
    let ir = String::from_utf8_lossy(ir);
    if ir.starts_with('"') || ir.starts_with("W/") {
        etag == Some(ir.trim())
    } else {
        match (parse_http_date(ir.as_bytes()), last_modified) {
            (Some(t), Some(lm)) => secs(t) == secs(lm),
            _ => false,
        }
    }
}

/// What the range filter makes of a request for an answer of `len` bytes that allows one
/// range only (nginx's `single_range`: an upstream's answer, a slice).
pub enum Ranged {
    /// The whole answer (no Range, one that does not apply, or several).
    Whole,
    /// Bytes `start..=end`.
    One(u64, u64),
    /// Nothing of it: 416.
    Unsatisfiable,
}

/// The answer's ETag and Last-Modified, as a file's fields or as an application's headers.
pub fn validators(r: &Response) -> (Option<Arc<str>>, Option<SystemTime>) {
    let header = |name: &str| {
        r.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| &v[..])
    };
    let etag = r.etag.clone().or_else(|| header("etag").map(Arc::from));
    let lm = r
        .last_modified
        .or_else(|| header("last-modified").and_then(|v| parse_http_date(v.as_bytes())));
    (etag, lm)
}

/// The client's range of an answer of `len` bytes that allows a single one.
pub fn single_range(req: &Request, r: &Response, len: u64) -> Ranged {
    if req.conf.core.max_ranges == Some(0) {
        return Ranged::Whole;
    }
    let Some(rv) = req.head.header("range") else {
        return Ranged::Whole;
    };
    let (etag, lm) = validators(r);
    if !if_range_holds(req, etag.as_deref(), lm) {
        return Ranged::Whole;
    }
    match parse_ranges(rv, len) {
        Some(r) if r.is_empty() => Ranged::Unsatisfiable,
        Some(r) if r.len() == 1 => Ranged::One(r[0].0, r[0].1),
        _ => Ranged::Whole,
    }
}

/// nginx's 416 answer for an answer of `len` bytes.
pub fn unsatisfiable(req: &Request, len: u64) -> Response {
    let mut e = Response::error_page(416, req.conf.core.server_tokens());
    e.headers.push((
        Cow::Borrowed("Content-Range"),
        format!("bytes */{len}").into(),
    ));
    e
}

/// The range filter for an application's answer streamed with a known length, when it
/// allows ranges (`*_force_ranges`, or an answer being cached that said `Accept-Ranges`):
/// one range gets a 206 whose body is cut as it is sent; several get the whole (nginx's
/// `single_range`). Nothing for an answer a filter changes on the way.
pub fn streamed_range(req: &Request, r: &mut Response) {
    let windowed = r.rewrites.as_ref().is_some_and(|w| w.window.is_some());
    if !r.accept_ranges || r.status != 200 || req.subrequest || windowed {
        return;
    }
    let Some(len) = r
        .content_length
        .filter(|_| r.rewrites.is_none() && r.encode.is_none())
    else {
        // The range filter skips an answer of unknown length, and says nothing of ranges.
        r.accept_ranges = false;
        return;
    };
    match single_range(req, r, len) {
        Ranged::Whole => {}
        Ranged::One(s, e) => {
            r.status = 206;
            clear_content_range(r);
            r.headers.push((
                Cow::Borrowed("Content-Range"),
                format!("bytes {s}-{e}/{len}").into(),
            ));
            r.content_length = Some(e - s + 1);
            r.rewrites().window = Some(crate::modules::slice::Window {
                offset: 0,
                from: s,
                to: e + 1,
            });
        }
        Ranged::Unsatisfiable => {
            *r = unsatisfiable(req, len);
            r.content_length = Some(r.body.len());
            // The error page replaces the application's body, which is not read.
            r.rewrites().own_body = true;
        }
    }
}

/// A Content-Range the answer came with (an upstream's, on a 200) gives way to the range
/// filter's own, or to the parts' when it is cut into several (nginx 1.23.3).
fn clear_content_range(r: &mut Response) {
    r.headers
        .retain(|(n, _)| !n.eq_ignore_ascii_case("content-range"));
}

/// nginx's range filter: the answer cut into the ranges asked for (a 206, or a 416), when
/// it offers ranges. It runs after the filters that change the head (the charset filter's
/// Content-Type is in each part's head).
pub fn range(req: &Request, r: &mut Response) {
    let max_ranges = req.conf.core.max_ranges;
    // `max_ranges 0`: ranges are off, and not offered either (no Accept-Ranges), as nginx.
    if max_ranges == Some(0) {
        r.accept_ranges = false;
        return;
    }
    // Only what offers ranges (nginx's allow_ranges: plain files) is cut into them.
    let Some(rv) = req.head.header("range").filter(|_| r.accept_ranges) else {
        return;
    };
    // The validators an application or `add_header` gave count too (nginx's range filter
    // reads the answer's headers).
    let (etag, lm) = validators(r);
    if !if_range_holds(req, etag.as_deref(), lm) {
        return;
    }
    let len = r.body.len();
    let Some(ranges) = parse_ranges(rv, len) else {
        return;
    };
    if ranges.is_empty() {
        *r = unsatisfiable(req, len);
        return;
    }
    // More ranges than `max_ranges` allows are answered whole (200), as nginx; so are
    // several where only one is allowed (an upstream's answer).
    let most = if r.single_range { Some(1) } else { max_ranges };
    if most.is_some_and(|m| ranges.len() > m as usize) {
        return;
    }
    // Overlapping ranges that add up to more than the file are answered whole, as nginx.
    if ranges.iter().map(|(s, e)| e - s + 1).sum::<u64>() > len {
        return;
    }
    if let [(s, e)] = ranges[..] {
        let Some(part) = slice(&r.body, s, e) else {
            return;
        };
        r.status = 206;
        clear_content_range(r);
        r.headers.push((
            Cow::Borrowed("Content-Range"),
            format!("bytes {s}-{e}/{len}").into(),
        ));
        r.body = Body::Parts(part);
        return;
    }
    let boundary = format!("{:020}", secs(SystemTime::now()) ^ 0x005e_ed9a_77e7);
    let ct = r
        .content_type
        .clone()
        .unwrap_or_else(|| Arc::from("application/octet-stream"));
    let mut parts = Vec::new();
    for (s, e) in ranges {
        let Some(part) = slice(&r.body, s, e) else {
            return;
        };
        let head = format!(
            "\r\n--{boundary}\r\nContent-Type: {ct}\r\nContent-Range: bytes {s}-{e}/{len}\r\n\r\n"
        );
        parts.push(Part::Bytes(Bytes::from(head)));
        parts.extend(part);
    }
    parts.push(Part::Bytes(Bytes::from(format!("\r\n--{boundary}--\r\n"))));
    r.status = 206;
    clear_content_range(r);
    r.content_type = Some(Arc::from(format!(
        "multipart/byteranges; boundary={boundary}"
    )));
    r.body = Body::Parts(parts);
}

#[cfg(test)]
mod tests {
    use super::parse_ranges;

    #[test]
    fn ranges() {
        assert_eq!(parse_ranges(b"bytes=0-9", 100), Some(vec![(0, 9)]));
        assert_eq!(parse_ranges(b"bytes=-10", 100), Some(vec![(90, 99)]));
        assert_eq!(parse_ranges(b"bytes=95-", 100), Some(vec![(95, 99)]));
        assert_eq!(parse_ranges(b"bytes=95-200", 100), Some(vec![(95, 99)]));
        assert_eq!(
            parse_ranges(b"bytes=0-1,5-6", 100),
            Some(vec![(0, 1), (5, 6)])
        );
        assert_eq!(parse_ranges(b"bytes=100-", 100), Some(vec![]));
        assert_eq!(parse_ranges(b"bytes=5-1", 100), Some(vec![]));
        assert_eq!(parse_ranges(b"items=0-1", 100), None);
        assert_eq!(parse_ranges(b"bytes=a-b", 100), Some(vec![]));
    }
}
