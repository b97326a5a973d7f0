//! `valid_referers none | blocked | server_names | string ...`, `referer_hash_max_size` and
//! `referer_hash_bucket_size` (nginx's ngx_http_referer_module), and the variable
//! `$invalid_referer`: empty when the request's Referer is valid, "1" when not.
//!
//! As nginx reads a Referer: without any `valid_referers` at all every request is valid. No
//! header is valid only with `none`. A header of at least 11 bytes ("http://i.ru") that
//! starts with `http://` or `https://` (any case) has its scheme cut off; any other header
//! is valid only with `blocked`. The host is what comes before the first `/` or `:` (so a
//! port is ignored), lower-cased and at most 256 bytes; it is looked up among the exact
//! names, then the `*.example.com` / `.example.com` wildcards (the longest first), then the
//! `www.example.*` ones. A name written with a path (`example.com/img/`) then also needs the
//! Referer's path (from its first `/`) to start with that path, case-sensitively. Failing
//! those, the server's regex `server_name`s are tried on the host, then the `~regex`
//! referers (caseless) on the whole Referer without its scheme.
//!
//! The hash sizes only tune nginx's hash tables: they are checked and otherwise unused.

use super::{LoadCtx, LocConf};
use crate::http::regex::Regex;
use crate::http::request::Request;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

use super::gateway::spec;

/// Server and location, as in nginx.
const SL: Ctx = Ctx::SERVER.or(Ctx::LOCATION);

pub const DIRECTIVES: &[Spec] = &[
    spec("valid_referers", SL, Args::AtLeast(1)),
    spec("referer_hash_max_size", SL, Args::Exactly(1)),
    spec("referer_hash_bucket_size", SL, Args::Exactly(1)),
];

/// A host name and the path a Referer must start with ("" for any).
#[derive(Debug)]
struct Name {
    host: String,
    path: String,
}

/// One level's `valid_referers`, all of them (a level with its own replaces the outer one).
#[derive(Debug, Default)]
pub struct Referers {
    none: bool,
    blocked: bool,
    server_names: bool,
    exact: Vec<Name>,
    /// `*.example.com` kept as `.example.com` (not matching `example.com` itself).
    head: Vec<Name>,
    /// `www.example.*` kept as `www.example.`.
    tail: Vec<Name>,
    regex: Vec<Regex>,
}

#[derive(Debug, Clone, Default)]
pub struct RefererConf {
    referers: Option<Arc<Referers>>,
}

impl RefererConf {
    pub fn merge(&mut self, parent: &RefererConf) {
        super::inherit!(self, parent, referers);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    match d.name.as_str() {
        "valid_referers" => {
            let mut r = lc
                .referer
                .referers
                .take()
                .and_then(|a| Arc::try_unwrap(a).ok())
                .unwrap_or_default();
            for arg in &d.args {
                add(&mut r, arg).map_err(|e| d.error(e))?;
            }
            // nginx checks this once the level is read; every referer is known here too.
            let hosts = r.exact.len() + r.head.len() + r.tail.len();
            if (r.none || r.blocked) && hosts == 0 && !r.server_names {
                return Err(d.error(
                    "the \"none\" or \"blocked\" referers are specified in the \
                     \"valid_referers\" directive without any valid referer",
                ));
            }
            lc.referer.referers = Some(Arc::new(r));
        }
        "referer_hash_max_size" | "referer_hash_bucket_size" => {
            gannet_conf::setters::num_arg(d, 0)?;
        }
        _ => unreachable!("not a referer directive: {}", d.name),
    }
    Ok(())
}

fn add(r: &mut Referers, arg: &str) -> Result<(), String> {
    match arg {
        "" => return Err(format!("invalid referer \"{arg}\"")),
        "none" => r.none = true,
        "blocked" => r.blocked = true,
        "server_names" => r.server_names = true,
        _ if arg.starts_with('~') => {
            let re = &arg[1..];
            if re.is_empty() {
                return Err(format!("empty regex in \"{arg}\""));
            }
            r.regex.push(Regex::new(re, true)?);
        }
        _ => {
            let (host, path) = match arg.find('/') {
                Some(i) => arg.split_at(i),
                None => (arg, ""),
            };
            let host = host.to_ascii_lowercase();
            let name = |host: &str| Name {
                host: host.to_string(),
                path: path.to_string(),
            };
            let bad = || format!("invalid hostname or wildcard \"{host}\"");
            if let Some(rest) = host.strip_prefix("*.") {
                if rest.is_empty() || rest.contains('*') {
                    return Err(bad());
                }
                r.head.push(name(&host[1..]));
            } else if let Some(rest) = host.strip_prefix('.') {
                if rest.is_empty() || rest.contains('*') {
                    return Err(bad());
                }
                // `.example.com`: example.com itself and every name under it.
                r.exact.push(name(rest));
                r.head.push(name(&host));
            } else if let Some(rest) = host.strip_suffix(".*") {
                if rest.is_empty() || rest.contains('*') {
                    return Err(bad());
                }
                r.tail.push(name(&host[..host.len() - 1]));
            } else if host.contains('*') {
                return Err(bad());
            } else {
                r.exact.push(name(&host));
            }
        }
    }
    Ok(())
}

/// `$invalid_referer`: whether the request's Referer is not among the location's valid ones.
pub fn invalid(req: &Request) -> bool {
    let Some(r) = req.conf.referer.referers.as_deref() else {
        return false;
    };
    let has_hosts = !(r.exact.is_empty() && r.head.is_empty() && r.tail.is_empty());
    let server_regex = r.server_names && !req.server.names.regex.is_empty();
    let server_hosts = r.server_names
        && !(req.server.names.exact.is_empty()
            && req.server.names.suffix.is_empty()
            && req.server.names.prefix.is_empty());
    if !has_hosts && !server_hosts && !server_regex && r.regex.is_empty() {
        return false;
    }
    let Some(referer) = req.head.header("referer") else {
        return !r.none;
    };
    let rest = if referer.len() >= "http://i.ru".len() {
        if referer[..7].eq_ignore_ascii_case(b"http://") {
            Some(&referer[7..])
        } else if referer[..8].eq_ignore_ascii_case(b"https://") {
            Some(&referer[8..])
        } else {
            None
        }
    } else {
        None
    };
    let Some(rest) = rest else {
        return !r.blocked;
    };
    let host_end = memchr::memchr2(b'/', b':', rest).unwrap_or(rest.len());
    if host_end > 256 {
        return true;
    }
    let host = String::from_utf8_lossy(&rest[..host_end]).to_ascii_lowercase();
    if let Some(path) = lookup(r, req, &host) {
        // The path part starts at the first `/` after the host (past any port).
        let from = memchr::memchr(b'/', &rest[host_end..]).map_or(rest.len(), |i| host_end + i);
        return !rest[from..].starts_with(path.as_bytes());
    }
    if server_regex
        && req
            .server
            .names
            .regex
            .iter()
            .any(|re| re.re.is_match(host.as_bytes()))
    {
        return false;
    }
    !r.regex.iter().any(|re| re.is_match(rest))
}

/// The path a valid Referer with this host must start with, if the host is a valid one.
fn lookup<'r>(r: &'r Referers, req: &Request, host: &str) -> Option<&'r str> {
    if let Some(n) = r.exact.iter().find(|n| n.host == host) {
        return Some(&n.path);
    }
    let names = &req.server.names;
    if r.server_names && names.exact.iter().any(|n| n == host) {
        return Some("");
    }
    let longest = |v: &'r [Name], f: &dyn Fn(&str) -> bool| {
        v.iter()
            .filter(|n| f(&n.host))
            .max_by_key(|n| n.host.len())
            .map(|n| n.path.as_str())
    };
    if let Some(p) = longest(&r.head, &|w| host.ends_with(w) && host.len() > w.len()) {
        return Some(p);
    }
    if r.server_names && names.suffix.iter().any(|w| host.ends_with(w.as_str())) {
        return Some("");
    }
    if let Some(p) = longest(&r.tail, &|w| host.starts_with(w) && host.len() > w.len()) {
        return Some(p);
    }
    if r.server_names && names.prefix.iter().any(|w| host.starts_with(w.as_str())) {
        return Some("");
    }
    None
}
