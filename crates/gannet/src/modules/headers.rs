//! Response header filter: `add_header name value [always]` and `expires`.
//!
//! As in nginx, both act on 200, 201, 204, 206, 301, 302, 303, 304, 307 and 308 responses
//! (add_header on any status with `always`), and add_header lists are inherited only by
//! levels that set none of their own.

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::variables::{Sent, Template};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::h1::encode::http_date;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "add_header",
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expires {
    Off,
    Epoch,
    Max,
    /// Seconds from now (or from the file's mtime with `modified`); may be negative.
    After {
        secs: i64,
        modified: bool,
    },
}

#[derive(Debug, Clone, Default)]
pub struct HeadersConf {
    pub add: Option<Arc<Vec<AddHeader>>>,
    pub expires: Option<Expires>,
}

impl HeadersConf {
    pub fn merge(&mut self, p: &HeadersConf) {
        inherit!(self, p, add, expires);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.headers;
    match d.name.as_str() {
        "add_header" => {
            let always = match d.args.get(2).map(String::as_str) {
                None => false,
                Some("always") => true,
                Some(v) => return Err(invalid(d, v)),
            };
            let mut list = c.add.as_deref().cloned().unwrap_or_default();
            list.push(AddHeader {
                name: d.args[0].clone(),
                value: Template::compile(&d.args[1]).map_err(|e| d.error(e))?,
                always,
            });
            c.add = Some(Arc::new(list));
        }
        _ => {
            let (modified, v) = match d.args.as_slice() {
                [m, v] if m == "modified" => (true, v),
                [v] => (false, v),
                _ => return Err(invalid(d, &d.args[0])),
            };
            c.expires = Some(match v.as_str() {
                "off" => Expires::Off,
                "epoch" => Expires::Epoch,
                "max" => Expires::Max,
                t => {
                    let (neg, t) = match t.strip_prefix('-') {
                        Some(rest) => (true, rest),
                        None => (false, t.strip_prefix('+').unwrap_or(t)),
                    };
                    let secs = setters::sec(t).ok_or_else(|| invalid(d, v))? as i64;
                    Expires::After {
                        secs: if neg { -secs } else { secs },
                        modified,
                    }
                }
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
        if let Some(e) = c.expires {
            expires(e, r);
        }
    }
    if let Some(list) = &c.add {
        let sent = Sent::status(r.status);
        for h in list.iter().filter(|h| ok || h.always) {
            let v = h.value.eval(req, Some(&sent));
            // An empty value adds nothing, as in nginx.
            if !v.is_empty() {
                r.headers.push((Cow::Owned(h.name.clone()), v.into()));
            }
        }
    }
}

fn expires(e: Expires, r: &mut Response) {
    let (exp, cc) = match e {
        Expires::Off => return,
        Expires::Epoch => (
            "Thu, 01 Jan 1970 00:00:01 GMT".to_string(),
            "no-cache".to_string(),
        ),
        Expires::Max => (
            "Thu, 31 Dec 2037 23:55:55 GMT".to_string(),
            "max-age=315360000".to_string(),
        ),
        Expires::After { secs, modified } => {
            let now = SystemTime::now();
            let base = if modified {
                r.last_modified.unwrap_or(now)
            } else {
                now
            };
            let at = if secs >= 0 {
                base + Duration::from_secs(secs as u64)
            } else {
                base - Duration::from_secs(secs.unsigned_abs())
            };
            let max_age = at.duration_since(now).map(|d| d.as_secs()).ok();
            let cc = match max_age {
                Some(a) if secs >= 0 || a > 0 => format!("max-age={a}"),
                _ => "no-cache".to_string(),
            };
            (http_date(at), cc)
        }
    };
    r.headers.retain(|(n, _)| {
        !n.eq_ignore_ascii_case("expires") && !n.eq_ignore_ascii_case("cache-control")
    });
    r.headers.push((Cow::Borrowed("Expires"), exp.into()));
    r.headers.push((Cow::Borrowed("Cache-Control"), cc.into()));
}
