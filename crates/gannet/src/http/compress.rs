//! The content-encoding filter (settings in `modules::compress`): decides per response
//! whether to compress and with what, as nginx's gzip header filter does, and compresses.
//!
//! - Only 200, 403 and 404 answers of a listed type (`*_types`; text/html always), at least
//!   `*_min_length` long when the length is known, without a Content-Encoding of their own.
//! - Such an answer varies by Accept-Encoding (`gzip_vary on` says so with `Vary`), whether
//!   or not this client gets it compressed.
//! - The client's Accept-Encoding picks the encoding: the highest q-value among those on;
//!   ties go to Brotli, then zstd, then gzip. Malformed entries count as not accepted; with
//!   nothing accepted the answer goes out as it is (identity), never as an error.
//! - HTTP/1.0 requests (unless `gzip_http_version 1.0`), requests through a proxy (`Via`,
//!   per `gzip_proxied`) and user agents matched by `gzip_disable` get identity.
//! - A compressed answer gets a weak ETag and no Accept-Ranges (as nginx; an upstream's too). Ranges are
//!   answered from the identity representation: the conditional filter runs first and its
//!   206 is never compressed.
//!
//! In-memory bodies are compressed at once and sent with Content-Length; a small static
//! file's compressed copy is kept with its cache entry, so a hot file is compressed once per
//! encoding and level, not per request. Large files and streamed application answers are
//! compressed while they are sent (`Response::encode`, chunked).

use crate::errlog::{self, Level};
use crate::http::encoder;
use crate::http::request::Request;
use crate::http::response::{Body, Part, Response};
use crate::modules::compress::{Coding, CompressConf};
use bytes::Bytes;
use gannet_proto::cgi::HeaderValue;
use gannet_proto::h1::encode::parse_http_date;
use gannet_proto::h1::Version;
use std::time::SystemTime;

/// What the filter decided for one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Not a compressible answer: untouched.
    Skip,
    /// Compressible, but not for this client: identity (with `Vary`).
    Vary,
    /// Compress with this encoding and level.
    Encode(Coding, u32),
}

/// Decide, before the conditional filter turns a 200 into a 304 or 206 (both keep `Vary`).
/// `len` is the body's length when known.
pub fn plan(req: &Request, resp: &Response, len: Option<u64>) -> Plan {
    let conf = &req.conf.compress;
    // A subrequest's body goes into the main answer, which is compressed whole (nginx's
    // gzip filter skips subrequests).
    if !conf.any_enabled() || !matches!(resp.status, 200 | 403 | 404) || req.subrequest {
        return Plan::Skip;
    }
    let Some(ct) = resp.content_type.as_deref() else {
        return Plan::Skip;
    };
    if header(resp, "content-encoding").is_some() {
        return Plan::Skip;
    }
    let mut eligible = [false; 3];
    for c in Coding::PREFERENCE {
        eligible[c as usize] = conf.enabled(c)
            && conf.types_match(c, ct)
            && len.is_none_or(|l| l >= conf.min_length(c));
    }
    if !eligible.contains(&true) {
        return Plan::Skip;
    }
    if client_refuses(req, resp) {
        return Plan::Vary;
    }
    match negotiate(accept_encoding(req), &eligible) {
        Some(c) => Plan::Encode(c, conf.level(c)),
        None => Plan::Vary,
    }
}

pub fn accept_encoding(req: &Request) -> &[u8] {
    req.head.header("accept-encoding").unwrap_or_default()
}

/// nginx's `ngx_http_gzip_ok` beyond Accept-Encoding: HTTP/1.0 (`gzip_http_version`),
/// proxied requests (`gzip_proxied`), user agents in `gzip_disable`.
pub fn client_refuses(req: &Request, resp: &Response) -> bool {
    let conf = &req.conf.compress;
    (matches!(req.head.version, Version::Http09 | Version::Http10) && !conf.http10())
        || (req.head.header("via").is_some() && !proxied_ok(req, resp, conf))
        || req
            .head
            .header("user-agent")
            .is_some_and(|ua| conf.disabled_for(ua))
}

/// Apply `plan` to `resp`. `streamed`: the body comes later, from an application.
pub fn apply(req: &Request, resp: &mut Response, plan: Plan, streamed: bool) {
    if plan == Plan::Skip {
        return;
    }
    if req.conf.compress.vary() {
        add_vary(resp);
    }
    let Plan::Encode(coding, level) = plan else {
        return;
    };
    // The conditional filter may have made a 304, 206 or 412 of the 200.
    if !matches!(resp.status, 200 | 403 | 404) {
        return;
    }
    // A body that is not all here: streamed, or a HEAD answer's declared length.
    let absent = streamed
        || resp.length_unknown
        || resp.content_length.is_some_and(|n| n != resp.body.len());
    let whole = if absent { None } else { whole_body(&resp.body) };
    match whole {
        Some(data) => {
            let made = match &resp.variants {
                Some(v) => v.get_or_make(coding, level, || encoder::compress(coding, level, &data)),
                None => encoder::compress(coding, level, &data).map(Bytes::from),
            };
            match made {
                Ok(out) => resp.body = Body::bytes(out),
                Err(e) => {
                    // The identity answer is still good: send it rather than nothing.
                    errlog::request(
                        Level::Error,
                        req,
                        format_args!("{} compression failed: {e}", coding.token()),
                    );
                    return;
                }
            }
            resp.content_length = None;
        }
        None => {
            // Compressed while sent: the length is not known beforehand. A HEAD answer
            // (nothing sent) says so by having no Content-Length.
            resp.content_length = None;
            resp.length_unknown = true;
            if !req.is_head() {
                resp.encode = Some((coding, level));
            }
        }
    }
    resp.headers
        .push(("Content-Encoding".into(), coding.token().into()));
    resp.accept_ranges = false;
    // An upstream's answer carries its validators as plain headers: the same rules.
    resp.headers
        .retain(|(name, _)| !name.eq_ignore_ascii_case("accept-ranges"));
    resp.weak_etag();
}

/// The whole body as one buffer when it is in memory (a file to be sent with sendfile is
/// not; nor is a HEAD answer's missing body, whose length was declared).
fn whole_body(body: &Body) -> Option<Bytes> {
    match body {
        Body::Empty => Some(Bytes::new()),
        Body::Parts(parts) => match parts.as_slice() {
            [Part::Bytes(b)] => Some(b.clone()),
            parts => {
                let mut all = Vec::new();
                for p in parts {
                    let Part::Bytes(b) = p else { return None };
                    all.extend_from_slice(b);
                }
                Some(all.into())
            }
        },
    }
}

/// `Vary: Accept-Encoding`, unless the response says so already.
pub fn add_vary(resp: &mut Response) {
    if !header(resp, "vary").is_some_and(names_accept_encoding) {
        resp.headers
            .push(("Vary".into(), HeaderValue::from_static("Accept-Encoding")));
    }
}

fn header<'a>(resp: &'a Response, name: &str) -> Option<&'a str> {
    resp.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| &**v)
}

fn names_accept_encoding(v: &str) -> bool {
    v.split(',')
        .any(|t| t.trim().eq_ignore_ascii_case("accept-encoding") || t.trim() == "*")
}

/// `gzip_proxied`: may an answer to a request that came through a proxy be compressed?
fn proxied_ok(req: &Request, resp: &Response, conf: &CompressConf) -> bool {
    let p = conf.proxied();
    if p.any {
        return true;
    }
    if p.expired {
        let expired = header(resp, "expires")
            .is_some_and(|v| parse_http_date(v.as_bytes()).is_none_or(|t| t <= SystemTime::now()));
        if expired {
            return true;
        }
    }
    let cc = header(resp, "cache-control").unwrap_or_default();
    let cc_has = |token: &str| cc.split(',').any(|t| t.trim().eq_ignore_ascii_case(token));
    (p.no_cache && cc_has("no-cache"))
        || (p.no_store && cc_has("no-store"))
        || (p.private && cc_has("private"))
        || (p.no_last_modified
            && resp.last_modified.is_none()
            && header(resp, "last-modified").is_none())
        || (p.no_etag && resp.etag.is_none() && header(resp, "etag").is_none())
        || (p.auth && req.head.header("authorization").is_some())
}

/// The accepted encoding the client prefers among `eligible` (indexed by `Coding`).
pub fn negotiate(accept: &[u8], eligible: &[bool; 3]) -> Option<Coding> {
    let mut q = [None::<u16>; 3];
    let mut star = None;
    for item in accept.split(|&b| b == b',') {
        let mut fields = item.split(|&b| b == b';');
        let token = fields.next().unwrap_or_default().trim_ascii();
        let weight = fields
            .find_map(|f| {
                let f = f.trim_ascii();
                (f.len() > 2 && f[..2].eq_ignore_ascii_case(b"q=")).then(|| qvalue(&f[2..]))
            })
            .unwrap_or(Some(1000))
            .unwrap_or(0);
        let slot = if token.eq_ignore_ascii_case(b"gzip") || token.eq_ignore_ascii_case(b"x-gzip") {
            &mut q[Coding::Gzip as usize]
        } else if token.eq_ignore_ascii_case(b"br") {
            &mut q[Coding::Br as usize]
        } else if token.eq_ignore_ascii_case(b"zstd") {
            &mut q[Coding::Zstd as usize]
        } else if token == b"*" {
            &mut star
        } else {
            continue;
        };
        *slot = Some(slot.map_or(weight, |w| w.max(weight)));
    }
    let mut best: Option<(Coding, u16)> = None;
    for c in Coding::PREFERENCE {
        let w = q[c as usize].or(star).unwrap_or(0);
        if eligible[c as usize] && w > 0 && best.is_none_or(|(_, bw)| w > bw) {
            best = Some((c, w));
        }
    }
    best.map(|(c, _)| c)
}

/// An RFC 9110 qvalue in thousandths; `None` when malformed (then not accepted).
fn qvalue(v: &[u8]) -> Option<u16> {
    match v {
        [b'0'] | [b'0', b'.'] => Some(0),
        [b'1'] | [b'1', b'.'] => Some(1000),
        [b'1', b'.', rest @ ..] if rest.len() <= 3 && rest.iter().all(|&b| b == b'0') => Some(1000),
        [b'0', b'.', rest @ ..] if rest.len() <= 3 && rest.iter().all(u8::is_ascii_digit) => {
            let mut n = 0u16;
            for i in 0..3 {
                n = n * 10 + rest.get(i).map_or(0, |d| u16::from(d - b'0'));
            }
            Some(n)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [bool; 3] = [true; 3];

    #[test]
    fn picks_the_highest_q_then_server_preference() {
        assert_eq!(negotiate(b"gzip", &ALL), Some(Coding::Gzip));
        assert_eq!(negotiate(b"gzip, deflate, br", &ALL), Some(Coding::Br));
        assert_eq!(negotiate(b"br;q=0.5, gzip;q=0.8", &ALL), Some(Coding::Gzip));
        assert_eq!(
            negotiate(b"br;q=1, gzip;q=0.8, *;q=0", &ALL),
            Some(Coding::Br)
        );
        assert_eq!(negotiate(b"zstd, gzip", &ALL), Some(Coding::Zstd));
        assert_eq!(negotiate(b"*", &ALL), Some(Coding::Br));
        assert_eq!(negotiate(b"*;q=0.1, br;q=0", &ALL), Some(Coding::Zstd));
        assert_eq!(negotiate(b"X-GZIP", &ALL), Some(Coding::Gzip));
        assert_eq!(negotiate(b"GZip ; Q=0.3", &ALL), Some(Coding::Gzip));
    }

    #[test]
    fn only_eligible_encodings_are_chosen() {
        let gzip_only = [true, false, false];
        assert_eq!(negotiate(b"br, gzip;q=0.1", &gzip_only), Some(Coding::Gzip));
        assert_eq!(negotiate(b"br", &gzip_only), None);
    }

    #[test]
    fn refusals_and_malformed_values_mean_identity() {
        assert_eq!(negotiate(b"", &ALL), None);
        assert_eq!(negotiate(b"identity", &ALL), None);
        assert_eq!(negotiate(b"gzip;q=0", &ALL), None);
        assert_eq!(negotiate(b"gzip;q=0.000", &ALL), None);
        assert_eq!(negotiate(b"gzip;q=2", &ALL), None);
        assert_eq!(negotiate(b"gzip;q=0.1234", &ALL), None);
        assert_eq!(negotiate(b"gzip;q=abc", &ALL), None);
        assert_eq!(negotiate(b";;;,,,", &ALL), None);
        assert_eq!(negotiate(b"\xff\xfe, gzip", &ALL), Some(Coding::Gzip));
    }

    #[test]
    fn qvalues_parse_as_rfc_9110_says() {
        assert_eq!(qvalue(b"0.5"), Some(500));
        assert_eq!(qvalue(b"0.05"), Some(50));
        assert_eq!(qvalue(b"1.000"), Some(1000));
        assert_eq!(qvalue(b"1.001"), None);
        assert_eq!(qvalue(b".5"), None);
    }
}
