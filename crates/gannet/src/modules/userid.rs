//! ngx_http_userid_filter_module: `userid`, `userid_name`, `userid_domain`, `userid_path`,
//! `userid_expires`, `userid_p3p`, `userid_mark`, `userid_service`, `userid_flags`, and the
//! variables `$uid_got`, `$uid_set` and `$uid_reset`.
//!
//! The cookie is nginx's, byte for byte, so a cookie one server set is read by the other:
//! 16 bytes (service, time, start value, sequence) in base64 with `+`, `/` and `==`
//! padding, whose 23rd character `userid_mark` may replace. `userid v1` writes the four
//! numbers in the host's byte order, `userid on` in network order; `$uid_got` and
//! `$uid_set` print the four 32-bit words as the host reads them (`name=%08X%08X%08X%08X`),
//! which is why an `on` cookie's time shows byte-swapped there, as in nginx.
//!
//! The start value is nginx's: the worker's start microseconds / 20 in the high 16 bits, OR
//! the worker's pid; the sequence starts at 1 (v1) or 0x03030302 (on) and steps by 0x100.

use super::{LoadCtx, LocConf};
use crate::errlog::Level;
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::user_vars::{self, UserVar};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::borrow::Cow;
use std::fmt::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

pub const DIRECTIVES: &[Spec] = &[
    spec("userid", Args::Exactly(1)),
    spec("userid_service", Args::Exactly(1)),
    spec("userid_name", Args::Exactly(1)),
    spec("userid_domain", Args::Exactly(1)),
    spec("userid_path", Args::Exactly(1)),
    spec("userid_expires", Args::Exactly(1)),
    spec("userid_flags", Args::Between(1, 3)),
    spec("userid_p3p", Args::Exactly(1)),
    spec("userid_mark", Args::Exactly(1)),
];

const fn spec(name: &'static str, args: Args) -> Spec {
    Spec {
        name,
        ctx: Ctx::HSL,
        args,
        block: false,
    }
}

/// `userid_flags`' values (`off`: none of the others).
const FLAGS: [&str; 6] = [
    "off",
    "secure",
    "httponly",
    "samesite=strict",
    "samesite=lax",
    "samesite=none",
];

/// nginx's `userid_expires max`: Thu, 31-Dec-37 23:55:55 GMT.
const MAX_EXPIRES: u64 = 2145916555;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Off,
    Log,
    V1,
    On,
}

#[derive(Debug, Clone, Default)]
pub struct UseridConf {
    mode: Option<Mode>,
    service: Option<u32>,
    name: Option<Arc<str>>,
    /// `; domain=...` (empty for `none`).
    domain: Option<Arc<str>>,
    /// `; path=...`.
    path: Option<Arc<str>>,
    expires: Option<u64>,
    p3p: Option<Arc<str>>,
    /// `Some(None)`: `off`.
    mark: Option<Option<u8>>,
    /// The attributes after the path, in nginx's order (`; secure; httponly; samesite=x`).
    flags: Option<Arc<str>>,
    /// `$uid_reset`, which `set` may give a value.
    reset: Option<UserVar>,
}

impl UseridConf {
    pub fn merge(&mut self, p: &UseridConf) {
        super::inherit!(self, p, mode, service, name, domain, path, expires, p3p, mark, flags);
        super::inherit!(self, p, reset);
    }

    fn mode(&self) -> Mode {
        self.mode.unwrap_or(Mode::Off)
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("uid")
    }

    fn mark(&self) -> Option<u8> {
        self.mark.flatten()
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.userid;
    let v = d.args[0].as_str();
    let dup = |set: bool| {
        if set {
            Err(d.error(format!("\"{}\" directive is duplicate", d.name)))
        } else {
            Ok(())
        }
    };
    // Every level that may read the cookie knows `$uid_reset`, defined once here so that a
    // config may `set` it (nginx defines it whether or not it is used).
    if c.reset.is_none() {
        c.reset = Some(user_vars::define("uid_reset").map_err(|e| d.error(e))?);
    }
    match d.name.as_str() {
        "userid" => {
            dup(c.mode.is_some())?;
            c.mode = Some(match v {
                "off" => Mode::Off,
                "log" => Mode::Log,
                "v1" => Mode::V1,
                "on" => Mode::On,
                _ => return Err(super::invalid(d, v)),
            });
        }
        "userid_service" => {
            dup(c.service.is_some())?;
            c.service = Some(setters::num_arg(d, 0)? as u32);
        }
        "userid_name" => {
            dup(c.name.is_some())?;
            c.name = Some(Arc::from(v));
        }
        "userid_domain" => {
            dup(c.domain.is_some())?;
            c.domain = Some(match v {
                "none" => Arc::from(""),
                _ => Arc::from(format!("; domain={v}")),
            });
        }
        "userid_path" => {
            dup(c.path.is_some())?;
            c.path = Some(Arc::from(format!("; path={v}")));
        }
        "userid_p3p" => {
            dup(c.p3p.is_some())?;
            c.p3p = Some(Arc::from(if v == "none" { "" } else { v }));
        }
        "userid_expires" => {
            dup(c.expires.is_some())?;
            c.expires = Some(match v {
                "max" => MAX_EXPIRES,
                "off" => 0,
                _ => setters::sec(v)
                    .ok_or_else(|| d.error(format!("\"{}\" directive invalid value", d.name)))?,
            });
        }
        "userid_mark" => {
            dup(c.mark.is_some())?;
            c.mark = Some(match v.as_bytes() {
                b"off" => None,
                [m] if m.is_ascii_alphanumeric() || *m == b'=' => Some(*m),
                _ => {
                    return Err(d.error(format!(
                        "\"{}\" directive value must be \"off\" or a single letter, digit or \"=\"",
                        d.name
                    )))
                }
            });
        }
        _ => {
            dup(c.flags.is_some())?;
            if let Some(bad) = d.args.iter().find(|a| !FLAGS.contains(&a.as_str())) {
                return Err(super::invalid(d, bad));
            }
            // nginx writes secure, httponly, then the samesite values in that order.
            let mut s = String::new();
            for (f, text) in [
                ("secure", "; secure"),
                ("httponly", "; httponly"),
                ("samesite=strict", "; samesite=strict"),
                ("samesite=lax", "; samesite=lax"),
                ("samesite=none", "; samesite=none"),
            ] {
                if d.args.iter().any(|a| a == f) {
                    s.push_str(text);
                }
            }
            c.flags = Some(Arc::from(s));
        }
    }
    Ok(())
}

/// What the filter learnt of one request's cookie (nginx's module context), made the first
/// time the filter or a variable asks.
#[derive(Debug, Default)]
pub struct Uid {
    /// The cookie's value, when the request had one.
    cookie: Option<String>,
    got: Option<[u8; 16]>,
    set: Option<[u8; 16]>,
    reset: bool,
    made: bool,
}

/// The request's cookie, decoded (nginx's `ngx_http_userid_get_uid`).
fn get_uid(req: &Request) -> std::cell::RefMut<'_, Uid> {
    let mut slot = req.userid.borrow_mut();
    if slot.is_none() {
        *slot = Some(Box::new(read_cookie(req)));
    }
    std::cell::RefMut::map(slot, |s| &mut **s.get_or_insert_with(Box::default))
}

fn read_cookie(req: &Request) -> Uid {
    let mut u = Uid::default();
    let Some(value) = cookie(req, req.conf.userid.name()) else {
        return u;
    };
    if value.len() < 22 {
        crate::errlog::request(
            Level::Error,
            req,
            format_args!("client sent too short userid cookie \"{value}\""),
        );
    } else {
        // The first 22 characters only: a mark, or garbage where "==" should be.
        match super::secure_link::decode_base64_lenient(&value.as_bytes()[..22], *b"+/")
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
        {
            Some(b) => u.got = Some(b),
            None => crate::errlog::request(
                Level::Error,
                req,
                format_args!("client sent invalid userid cookie \"{value}\""),
            ),
        }
    }
    u.cookie = Some(value);
    u
}

/// nginx's `ngx_http_parse_cookie_lines`: the first `name=value` in the Cookie headers,
/// the name matched without regard to case, spaces allowed around the `=`.
fn cookie(req: &Request, name: &str) -> Option<String> {
    for (n, v) in req.head.headers() {
        if !n.eq_ignore_ascii_case("cookie") {
            continue;
        }
        for item in v.split(|&c| c == b';') {
            let item = item.trim_ascii_start();
            let Some(rest) = item
                .get(..name.len())
                .filter(|k| k.eq_ignore_ascii_case(name.as_bytes()))
                .map(|_| item[name.len()..].trim_ascii_start())
            else {
                continue;
            };
            if let Some(value) = rest.strip_prefix(b"=") {
                return Some(String::from_utf8_lossy(value.trim_ascii_start()).into_owned());
            }
        }
    }
    None
}

/// The worker's start value: nginx's `(usec / 20) << 16 | pid`, made once per process.
fn start_value() -> u32 {
    static START: OnceLock<u32> = OnceLock::new();
    *START.get_or_init(|| {
        let usec = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_micros());
        ((usec / 20) << 16) | std::process::id()
    })
}

static SEQ_V1: AtomicU32 = AtomicU32::new(1);
static SEQ_V2: AtomicU32 = AtomicU32::new(0x0303_0302);

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// nginx's `ngx_http_userid_create_uid`: the identifier to set, if any.
fn create_uid(req: &Request, u: &mut Uid) {
    if u.made {
        return;
    }
    u.made = true;
    let c = &req.conf.userid;
    if let Some(got) = u.got {
        let reset = c.reset.as_ref().and_then(|v| user_vars::value(v, req));
        match reset.as_deref() {
            None | Some("") | Some("0") => {
                let marked = c.mark().is_none_or(|m| {
                    let b = u.cookie.as_deref().unwrap_or("").as_bytes();
                    b.len() > 23 && b[22] == m && b[23] == b'='
                });
                if !marked {
                    u.set = Some(got);
                }
                return;
            }
            Some(r) => {
                u.reset = true;
                if r == "log" {
                    crate::errlog::request(
                        Level::Notice,
                        req,
                        format_args!("userid cookie \"{}={}\" was reset", c.name(), words(&got)),
                    );
                }
            }
        }
    }
    let mut b = [0u8; 16];
    let put = |b: &mut [u8; 16], i: usize, w: [u8; 4]| b[i * 4..i * 4 + 4].copy_from_slice(&w);
    if c.mode() == Mode::V1 {
        put(&mut b, 0, c.service.unwrap_or(0).to_ne_bytes());
        put(&mut b, 1, (now() as u32).to_ne_bytes());
        put(&mut b, 2, start_value().to_ne_bytes());
        put(
            &mut b,
            3,
            SEQ_V1.fetch_add(0x100, Ordering::Relaxed).to_ne_bytes(),
        );
    } else {
        let service = match c.service {
            Some(s) => s.to_be_bytes(),
            // The server's address: IPv4 as is, IPv6 its last four bytes.
            None => match req.conn.local.ip() {
                std::net::IpAddr::V4(a) => a.octets(),
                std::net::IpAddr::V6(a) => {
                    let o = a.octets();
                    [o[12], o[13], o[14], o[15]]
                }
            },
        };
        put(&mut b, 0, service);
        put(&mut b, 1, (now() as u32).to_be_bytes());
        put(&mut b, 2, start_value().to_be_bytes());
        let seq = SEQ_V2
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                let n = s.wrapping_add(0x100);
                Some(if n < 0x0303_0302 { 0x0303_0302 } else { n })
            })
            .unwrap_or(0x0303_0302);
        put(&mut b, 3, seq.to_be_bytes());
    }
    u.set = Some(b);
}

/// The four words as nginx prints them: `%08X` each, read in the host's byte order.
fn words(b: &[u8; 16]) -> String {
    let mut s = String::with_capacity(32);
    for w in b.chunks_exact(4) {
        let n = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
        let _ = write!(s, "{n:08X}");
    }
    s
}

/// `$uid_got`: the identifier the request's cookie carried (unless `userid off`).
pub fn append_got(out: &mut String, req: &Request) {
    let c = &req.conf.userid;
    if c.mode() == Mode::Off {
        return;
    }
    if let Some(got) = get_uid(req).got.filter(|g| g[12..] != [0; 4]) {
        let _ = write!(out, "{}={}", c.name(), words(&got));
    }
}

/// `$uid_set`: the identifier the answer sets (with `v1` or `on`).
pub fn append_set(out: &mut String, req: &Request) {
    let c = &req.conf.userid;
    if c.mode() < Mode::V1 {
        return;
    }
    let mut u = get_uid(req);
    create_uid(req, &mut u);
    if let Some(set) = u.set.filter(|s| s[12..] != [0; 4]) {
        let _ = write!(out, "{}={}", c.name(), words(&set));
    }
}

/// The header filter: add the Set-Cookie (and P3P) of `userid on|v1`. Not for
/// subrequests, as nginx.
pub fn filter(req: &Request, r: &mut Response) {
    let c = &req.conf.userid;
    if c.mode() < Mode::V1 || req.subrequest {
        return;
    }
    let mut u = get_uid(req);
    create_uid(req, &mut u);
    let Some(set) = u.set else { return };
    if set[12..] == [0; 4] {
        return;
    }
    let mut v = String::with_capacity(96);
    v.push_str(c.name());
    v.push('=');
    let mark = c.mark();
    let kept = u.cookie.as_deref().filter(|_| u.got.is_some() && !u.reset);
    match kept {
        // The cookie as it came (its first 22 characters), marked.
        Some(cookie) => {
            v.push_str(cookie.get(..22).unwrap_or(""));
            v.push(char::from(mark.unwrap_or(0)));
            v.push('=');
        }
        None => {
            let mut enc = data_encoding::BASE64.encode(&set);
            if let Some(m) = mark {
                enc.replace_range(22..23, char::from(m).encode_utf8(&mut [0; 4]));
            }
            v.push_str(&enc);
        }
    }
    match c.expires.unwrap_or(0) {
        0 => {}
        MAX_EXPIRES => v.push_str("; expires=Thu, 31-Dec-37 23:55:55 GMT"),
        secs => {
            v.push_str("; expires=");
            cookie_time(&mut v, now() + secs);
        }
    }
    v.push_str(c.domain.as_deref().unwrap_or(""));
    v.push_str(c.path.as_deref().unwrap_or("; path=/"));
    v.push_str(c.flags.as_deref().unwrap_or(""));
    r.headers.push((Cow::Borrowed("Set-Cookie"), v.into()));
    if let Some(p3p) = c.p3p.as_deref().filter(|p| !p.is_empty()) {
        r.headers
            .push((Cow::Borrowed("P3P"), p3p.to_string().into()));
    }
}

/// nginx's `ngx_http_cookie_time`: `Thu, 31-Dec-37 23:55:55 GMT`, the year in two digits
/// up to 2037 and in four after.
fn cookie_time(out: &mut String, secs: u64) {
    let d = httpdate::fmt_http_date(UNIX_EPOCH + std::time::Duration::from_secs(secs));
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let (wday, rest) = d.split_at(5);
    let mut it = rest.split(' ');
    let (Some(day), Some(mon), Some(year), Some(time)) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        return;
    };
    let y: u32 = year.parse().unwrap_or(0);
    let year = if y > 2037 {
        y.to_string()
    } else {
        format!("{:02}", y % 100)
    };
    let _ = write!(out, "{wday}{day}-{mon}-{year} {time} GMT");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_times_as_nginx() {
        let mut s = String::new();
        cookie_time(&mut s, 784111777);
        assert_eq!(s, "Sun, 06-Nov-94 08:49:37 GMT");
        s.clear();
        cookie_time(&mut s, 2145916555);
        assert_eq!(s, "Thu, 31-Dec-37 23:55:55 GMT");
        s.clear();
        cookie_time(&mut s, 2208988800);
        assert_eq!(s, "Sun, 01-Jan-2040 00:00:00 GMT");
    }
}
