//! Response header filter: `add_header name value [always]`,
//! `add_trailer name value [always]` and `expires [modified] time|@time|epoch|max|off|$variable`.
//!
//! `add_trailer`: when one applies to the answer's status, an HTTP/1.1 answer with a body
//! is sent chunked (its Content-Length dropped, as nginx's chunked filter does) and the
//! trailer fields follow the last chunk; HTTP/2 sends them in a HEADERS frame that ends the
//! stream. Their values are evaluated once the body is sent ([`trailers`], which both
//! protocols call); an empty value sends nothing. HTTP/1.0 clients, HEAD, 204 and 304 get
//! none.
//!
//! As in nginx, both act on 200, 201, 204, 206, 301, 302, 303, 304, 307 and 308 responses
//! (add_header on any status with `always`), and add_header lists are inherited only by
//! levels that set none of their own.
//!
//! Both run once the response's own headers are known, so their variables see them:
//! `$sent_http_content_type` in an `add_header` value (or in a `map` it reads) is the type
//! being sent, and each `add_header` sees the ones before it. `expires $var` parses the
//! variable's value per response as nginx parses the directive's argument; a value that does
//! not parse sets nothing.

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::variables::{Sent, Template};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::cgi::HeaderValue;
use gannet_proto::h1::encode::http_date;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "add_header",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::Between(2, 3),
        block: false,
    },
    Spec {
        name: "add_trailer",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::Between(2, 3),
        block: false,
    },
    Spec {
        name: "expires",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::Between(1, 2),
        block: false,
    },
];

#[derive(Debug, Clone)]
pub struct AddHeader {
    pub name: String,
    pub value: Template,
    pub always: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expires {
    Off,
    Epoch,
    Max,
    /// Seconds from now (or from the file's mtime with `modified`); may be negative.
    After {
        secs: i64,
        modified: bool,
    },
    /// `@time`: the next time the local clock shows this time of day (seconds after
    /// midnight).
    Daily(i64),
    /// A value with variables, parsed per response.
    Var {
        value: Template,
        modified: bool,
    },
}

/// nginx's `ngx_http_parse_expires`: at load time for a fixed argument, per response for a
/// variable's value (with the same messages, though those are only shown at load time).
fn parse_expires(v: &str, modified: bool) -> Result<Expires, &'static str> {
    if !modified {
        match v {
            "epoch" => return Ok(Expires::Epoch),
            "max" => return Ok(Expires::Max),
            "off" => return Ok(Expires::Off),
            _ => {}
        }
    }
    let (daily, neg, t) = if let Some(t) = v.strip_prefix('@') {
        if modified {
            return Err("daily time cannot be used with \"modified\" parameter");
        }
        (true, false, t)
    } else if let Some(t) = v.strip_prefix('-') {
        (false, true, t)
    } else {
        (false, false, v.strip_prefix('+').unwrap_or(v))
    };
    let secs = setters::sec(t).ok_or("invalid value")? as i64;
    if daily {
        if secs > 24 * 60 * 60 {
            return Err("daily time value must be less than 24 hours");
        }
        return Ok(Expires::Daily(secs));
    }
    Ok(Expires::After {
        secs: if neg { -secs } else { secs },
        modified,
    })
}

#[derive(Debug, Clone, Default)]
pub struct HeadersConf {
    pub add: Option<Arc<Vec<AddHeader>>>,
    pub trailers: Option<Arc<Vec<AddHeader>>>,
    pub expires: Option<Expires>,
}

impl HeadersConf {
    pub fn merge(&mut self, p: &HeadersConf) {
        inherit!(self, p, add, trailers, expires);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.headers;
    match d.name.as_str() {
        "add_header" | "add_trailer" => {
            let always = match d.args.get(2).map(String::as_str) {
                None => false,
                Some("always") => true,
                Some(v) => return Err(invalid(d, v)),
            };
            let slot = if d.name == "add_header" {
                &mut c.add
            } else {
                &mut c.trailers
            };
            let mut list = slot.as_deref().cloned().unwrap_or_default();
            list.push(AddHeader {
                name: d.args[0].clone(),
                value: Template::compile(&d.args[1]).map_err(|e| d.error(e))?,
                always,
            });
            *slot = Some(Arc::new(list));
        }
        _ => {
            if c.expires.is_some() {
                return Err(d.error("\"expires\" directive is duplicate"));
            }
            let (modified, v) = match d.args.as_slice() {
                [m, v] if m == "modified" => (true, v),
                [v] => (false, v),
                _ => return Err(invalid(d, &d.args[0])),
            };
            let value = Template::compile(v).map_err(|e| d.error(e))?;
            c.expires = Some(if value.has_vars() {
                Expires::Var { value, modified }
            } else {
                parse_expires(v, modified).map_err(|e| d.error(e))?
            });
        }
    }
    Ok(())
}

fn status_gets_headers(s: u16) -> bool {
    matches!(s, 200 | 201 | 204 | 206 | 301 | 302 | 303 | 304 | 307 | 308)
}

/// Apply `expires` and `add_header` to a finished response.
pub fn filter(req: &Request, r: &mut Response) {
    let c = &req.conf.headers;
    let ok = status_gets_headers(r.status);
    if ok {
        match &c.expires {
            None | Some(Expires::Off) => {}
            Some(Expires::Var { value, modified }) => {
                let v = value.eval(req, Some(&sent(r)));
                // A value that does not parse sets nothing (nginx: NGX_OK, no header).
                if let Ok(e) = parse_expires(&v, *modified) {
                    expires(&e, false, r);
                }
            }
            Some(e) => expires(e, true, r),
        }
    }
    if let Some(list) = &c.add {
        for h in list.iter().filter(|h| ok || h.always) {
            // Evaluated against the response as it is now, the headers added before it
            // included (nginx adds them one by one).
            let v = h.value.eval(req, Some(&sent(r)));
            if replaces(r, &h.name, &v) {
                continue;
            }
            // An empty value adds nothing, as in nginx.
            if !v.is_empty() {
                r.headers.push((Cow::Owned(h.name.clone()), v.into()));
            }
        }
    }
    // nginx's `expect_trailers`: some add_trailer applies to this status.
    if let Some(list) = &c.trailers {
        if list.iter().any(|h| ok || h.always) {
            r.trailers = Some(list.clone());
        }
    }
}

/// `add_header Last-Modified` or `ETag` replaces the answer's own, a file's or an
/// application's (nginx's `ngx_http_set_last_modified` and `ngx_http_set_response_header`;
/// an empty value removes it): `true` when it took the new value itself, which the
/// conditional and range filters then compare with.
fn replaces(r: &mut Response, name: &str, v: &str) -> bool {
    let lm = name.eq_ignore_ascii_case("last-modified");
    if !lm && !name.eq_ignore_ascii_case("etag") {
        return false;
    }
    r.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    if lm {
        r.last_modified =
            gannet_proto::h1::encode::parse_http_date(v.as_bytes()).filter(|_| !v.is_empty());
        r.last_modified.is_some() || v.is_empty()
    } else {
        r.etag = (!v.is_empty()).then(|| std::sync::Arc::from(v));
        true
    }
}

/// Whether the answer ends with trailer fields: one is expected for its status and it has
/// a body that is sent (nginx's `expect_trailers` without `header_only`).
pub fn sends_trailers(req: &Request, r: &Response) -> bool {
    r.trailers.is_some() && !req.is_head() && r.status_has_body()
}

/// The trailer fields of an answer whose body has been sent, for the HTTP/1 chunked ending
/// and the HTTP/2 trailing HEADERS frame alike: `add_trailer`'s that apply to the status,
/// evaluated now (those with an empty value are left out), then an upstream's. nginx evaluates them before its
/// last buffer is written, so `$body_bytes_sent` is not counted yet: 0 here too.
pub fn trailers(req: &Request, r: &Response) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let list = r.trailers.as_deref().map_or(&[][..], |l| l.as_slice());
    let ok = status_gets_headers(r.status);
    for h in list.iter().filter(|h| ok || h.always) {
        // Each sees those before it as sent (`$sent_trailer_*`), as in nginx.
        let sent = Sent {
            trailers: &out,
            ..sent(r)
        };
        let v = h.value.eval(req, Some(&sent));
        if !v.is_empty() {
            out.push((h.name.clone(), v));
        }
    }
    // Then an HTTP/2 server's own (`proxy_pass_trailers`), as nginx appends them.
    crate::conn::proxy_h2::passed_trailers(req, &mut out);
    out
}

/// Whether the answer may end with trailer fields that are not known yet: a server's
/// passed on (`proxy_pass_trailers`). Unlike `add_trailer`'s, they do not make an
/// HTTP/1.1 answer chunked (nginx's `expect_trailers` is not set for them): they go when it
/// is chunked anyway.
pub fn may_trail(req: &Request, r: &Response) -> bool {
    !req.is_head() && r.status_has_body() && crate::conn::proxy_h2::trails(req)
}

/// The response as `$status` and `$sent_http_*` see it while its head is being made.
fn sent(r: &Response) -> Sent<'_> {
    Sent {
        response: Some(r),
        ..Sent::status(r.status)
    }
}

/// Set Expires and Cache-Control as nginx's `ngx_http_set_expires` does. `fixed`: the
/// setting is the directive's own argument (nginx looks at its configured time for
/// `no-cache`, which is 0 when the time came from a variable).
fn expires(e: &Expires, fixed: bool, r: &mut Response) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (secs, modified, daily) = match *e {
        Expires::Off | Expires::Var { .. } => return,
        Expires::Epoch => {
            return set_expires(r, "Thu, 01 Jan 1970 00:00:01 GMT".into(), "no-cache".into())
        }
        Expires::Max => {
            return set_expires(
                r,
                "Thu, 31 Dec 2037 23:55:55 GMT".into(),
                "max-age=315360000".into(),
            )
        }
        // A time of 0 is "now", even with `modified`.
        Expires::After { secs: 0, .. } => {
            return set_expires(r, http_date(at(now)).into(), "max-age=0".into())
        }
        Expires::After { secs, modified } => (secs, modified, false),
        Expires::Daily(secs) => (secs, false, true),
    };
    // The file's time, or an application's Last-Modified (nginx parses the upstream's into
    // last_modified_time, which `modified` counts from).
    let proxied = || {
        r.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("last-modified"))
            .and_then(|(_, v)| std::str::from_utf8(v.as_ref()).ok())
            .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
    };
    let last_modified = r
        .last_modified
        .or_else(|| if modified { proxied() } else { None })
        .map(|t| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    let (when, max_age) = if daily {
        let when = crate::runtime::clock::next_local_time(secs, now);
        (when, when - now)
    } else if let (true, Some(lm)) = (modified, last_modified) {
        (lm + secs, lm + secs - now)
    } else {
        (now + secs, secs)
    };
    let cc = if (fixed && secs < 0) || max_age < 0 {
        "no-cache".into()
    } else {
        format!("max-age={max_age}").into()
    };
    set_expires(r, http_date(at(when)).into(), cc);
}

/// Replace any Expires and Cache-Control the response has.
fn set_expires(r: &mut Response, exp: HeaderValue, cc: HeaderValue) {
    r.headers.retain(|(n, _)| {
        !n.eq_ignore_ascii_case("expires") && !n.eq_ignore_ascii_case("cache-control")
    });
    r.headers.push((Cow::Borrowed("Expires"), exp));
    r.headers.push((Cow::Borrowed("Cache-Control"), cc));
}

/// A time in seconds since the epoch (before it: the epoch).
fn at(secs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_expires_as_nginx() {
        assert_eq!(parse_expires("max", false), Ok(Expires::Max));
        assert_eq!(parse_expires("epoch", false), Ok(Expires::Epoch));
        assert_eq!(parse_expires("off", false), Ok(Expires::Off));
        assert_eq!(parse_expires("max", true), Err("invalid value"));
        assert_eq!(
            parse_expires("-1h", false),
            Ok(Expires::After {
                secs: -3600,
                modified: false
            })
        );
        assert_eq!(
            parse_expires("+30d", true),
            Ok(Expires::After {
                secs: 30 * 86400,
                modified: true
            })
        );
        assert_eq!(parse_expires("@15h30m", false), Ok(Expires::Daily(55800)));
        assert!(parse_expires("@25h", false).is_err());
        assert!(parse_expires("@1h", true).is_err());
        assert_eq!(parse_expires("", false), Err("invalid value"));
        assert_eq!(parse_expires("soon", false), Err("invalid value"));
    }
}
