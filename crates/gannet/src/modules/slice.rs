//! `slice SIZE;` and `$slice_range` (nginx's ngx_http_slice_filter_module): a big answer
//! is fetched from the upstream in slices of SIZE bytes, each its own request with
//! `Range: $slice_range`, so that each can be cached on its own (`proxy_cache_key` with
//! `$slice_range`). The main request fetches the slice its client's range starts in; the
//! slices after it are fetched by subrequests, one after the other, as the body is sent
//! (`conn::slice`). The client gets one answer: a 200 with the whole length (taken from
//! the first slice's `Content-Range`), or a 206 for its own single range.
//!
//! As nginx: the slice machinery starts only when `$slice_range` is read (by the cache key
//! or `proxy_set_header Range`); a main answer that is not a 206 (an upstream that ignores
//! ranges) goes to the client as it is; a slice subrequest's answer that is not a 206, or
//! disagrees on the ETag or the whole length, is an error that cuts the answer short.

use super::{inherit, LoadCtx, LocConf};
use crate::errlog::{self, Level};
use crate::http::conditional::{self, Ranged};
use crate::http::request::Request;
use crate::http::response::Response;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::borrow::Cow;
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "slice",
    ctx: Ctx::HSL,
    args: Args::Exactly(1),
    block: false,
}];

#[derive(Debug, Clone, Default)]
pub struct SliceConf {
    /// The slice size; 0 (the default) is off.
    pub size: Option<u64>,
}

impl SliceConf {
    pub fn merge(&mut self, p: &SliceConf) {
        inherit!(self, p, size);
    }

    pub fn size(&self) -> u64 {
        self.size.unwrap_or(0)
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if lc.slice.size.is_some() {
        return Err(d.error("\"slice\" directive is duplicate"));
    }
    lc.slice.size = Some(gannet_conf::setters::size_arg(d, 0)?);
    Ok(())
}

/// A request's slice state (nginx's slice ctx), made when `$slice_range` is first read.
#[derive(Debug, Clone)]
pub struct State {
    /// Where the next slice starts.
    pub start: u64,
    /// Where the client's answer ends (exclusive): the slices stop there.
    pub end: u64,
    /// `$slice_range` of this request: `bytes=START-END`.
    pub range: String,
    /// The first slice's ETag, which every later one must have.
    pub etag: Option<Arc<str>>,
    /// The whole length the first slice's `Content-Range` gave.
    pub total: u64,
    /// The main answer was a slice (a 206 made into the client's answer).
    pub active: bool,
}

fn range_of(start: u64, size: u64) -> String {
    format!("bytes={}-{}", start, start + size - 1)
}

/// `$slice_range`: the request's slice range, its slice state made on the first read in a
/// main request whose location slices (nothing elsewhere, as nginx's "not found").
pub fn variable(req: &Request, out: &mut String) {
    let mut st = req.slice.borrow_mut();
    if st.is_none() {
        let size = req.conf.slice.size();
        if req.subrequest || size == 0 {
            return;
        }
        let start = size * (client_start(req) / size);
        *st = Some(Box::new(State {
            start,
            end: 0,
            range: range_of(start, size),
            etag: None,
            total: 0,
            active: false,
        }));
    }
    if let Some(s) = st.as_ref() {
        out.push_str(&s.range);
    }
}

/// The slice state of a subrequest that fetches the slice at `start`.
pub fn for_subrequest(main: &State, start: u64, size: u64) -> Box<State> {
    Box::new(State {
        start,
        range: range_of(start, size),
        ..main.clone()
    })
}

/// Where the client's range starts, as nginx's `ngx_http_slice_get_start`: 0 with an
/// If-Range, several ranges, a suffix range, or anything it cannot read.
fn client_start(req: &Request) -> u64 {
    if req.head.header("if-range").is_some() {
        return 0;
    }
    let Some(v) = req.head.header("range") else {
        return 0;
    };
    if v.len() < 7 || !v[..6].eq_ignore_ascii_case(b"bytes=") || v.contains(&b',') {
        return 0;
    }
    let p = v[6..].trim_ascii_start();
    let digits = p.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&p[..digits])
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .map_or(0, |n| n as u64)
}

/// A slice answer's `Content-Range: bytes START-END/TOTAL` as START, END + 1 and TOTAL
/// (`None` for `*`), read as strictly as nginx does.
pub fn content_range(v: &str) -> Result<(u64, u64, Option<u64>), ()> {
    let rest = v.strip_prefix("bytes ").ok_or(())?;
    let num = |s: &str| -> Result<u64, ()> {
        let s = s.trim_matches(' ');
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(());
        }
        s.parse::<i64>().map(|n| n as u64).map_err(|_| ())
    };
    let (range, total) = rest.split_once('/').ok_or(())?;
    let (a, b) = range.split_once('-').ok_or(())?;
    let total = match total.trim_matches(' ') {
        "*" => None,
        t => Some(num(t)?),
    };
    Ok((num(a)?, num(b)? + 1, total))
}

/// Check a slice's answer against what the slices so far said (nginx's header filter):
/// a 206 of the expected range, with the same ETag. `Ok`: its range (START, END + 1) and
/// the whole length, the state moved on to the next slice.
pub fn check(req: &Request, st: &mut State, resp: &Response) -> Result<(u64, u64, u64), ()> {
    let fail = |m: std::fmt::Arguments| {
        errlog::request(Level::Error, req, m);
        Err(())
    };
    if resp.status != 206 {
        return fail(format_args!(
            "unexpected status code {} in slice response",
            resp.status
        ));
    }
    let (tag, _) = conditional::validators(resp);
    if st.etag.is_some() && tag != st.etag {
        return fail(format_args!("etag mismatch in slice response"));
    }
    if tag.is_some() {
        st.etag = tag;
    }
    let range = resp
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-range"))
        .map(|(_, v)| content_range(v));
    let Some(Ok((start, end, total))) = range else {
        return fail(format_args!("invalid range in slice response"));
    };
    let Some(total) = total else {
        return fail(format_args!("no complete length in slice response"));
    };
    let size = req.conf.slice.size();
    let want = (st.start + size).min(total);
    if start != st.start || end != want {
        return fail(format_args!(
            "unexpected range in slice response: {start}-{end}, expected: {}-{want}",
            st.start
        ));
    }
    st.start = want;
    Ok((start, end, total))
}

/// What the main answer's body is to be: the client's window `[from, to)` of the whole,
/// the first slice's body starting at `offset`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub offset: u64,
    pub from: u64,
    pub to: u64,
}

/// The slice filter's header part for the main request (before the other header filters,
/// as nginx's runs first): its first slice's 206 made into the client's answer (a 200 of
/// the whole, or a 206 of its range). `false`: the answer is broken and the connection is
/// to be closed without one, as nginx's NGX_ERROR.
pub fn start(req: &Request, resp: &mut Response) -> bool {
    let mut guard = req.slice.borrow_mut();
    let Some(st) = guard.as_mut().filter(|_| !req.subrequest) else {
        return true;
    };
    if st.active {
        return true;
    }
    if resp.status != 206 {
        // The upstream ignored the range (or failed): its answer goes as it is.
        *guard = None;
        return true;
    }
    let Ok((offset, _, total)) = check(req, st, resp) else {
        return false;
    };
    st.active = true;
    st.total = total;
    resp.status = 200;
    resp.headers.retain(|(n, _)| {
        !n.eq_ignore_ascii_case("content-range") && !n.eq_ignore_ascii_case("accept-ranges")
    });
    resp.length_unknown = false;
    // nginx's not_modified filter comes next: a 304 or 412 instead, and no slices.
    let (etag, lm) = conditional::validators(resp);
    if conditional::preconditions(req, resp, etag.as_deref(), lm) {
        *guard = None;
        own_body(resp);
        return true;
    }
    let (mut from, mut to) = (0, total);
    match conditional::single_range(req, resp, total) {
        Ranged::Whole => resp.accept_ranges = true,
        Ranged::One(s, e) => {
            resp.status = 206;
            resp.accept_ranges = false;
            resp.headers.push((
                Cow::Borrowed("Content-Range"),
                format!("bytes {s}-{e}/{total}").into(),
            ));
            (from, to) = (s, e + 1);
            let size = req.conf.slice.size();
            if st.start + size <= from {
                st.start = size * (from / size);
            }
        }
        Ranged::Unsatisfiable => {
            *resp = conditional::unsatisfiable(req, total);
            own_body(resp);
            *guard = None;
            return true;
        }
    }
    st.end = to;
    resp.content_length = Some(to - from);
    if req.is_head() {
        resp.body = Default::default();
        *guard = None;
    } else {
        resp.rewrites().window = Some(Window { offset, from, to });
    }
    true
}

/// The answer is gannet's own page (304, 412, 416), the slice's body dropped.
fn own_body(resp: &mut Response) {
    if resp.status != 304 {
        resp.content_length = Some(resp.body.len());
    }
    resp.rewrites().own_body = true;
}

#[cfg(test)]
mod tests {
    use super::content_range;

    #[test]
    fn content_ranges() {
        assert_eq!(content_range("bytes 0-9/100"), Ok((0, 10, Some(100))));
        assert_eq!(content_range("bytes 10-19/*"), Ok((10, 20, None)));
        assert_eq!(content_range("bytes  5 - 6 / 7"), Ok((5, 7, Some(7))));
        assert!(content_range("bytes a-9/100").is_err());
        assert!(content_range("items 0-9/100").is_err());
        assert!(content_range("bytes 0-9").is_err());
    }
}
