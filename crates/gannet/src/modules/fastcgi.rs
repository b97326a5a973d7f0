//! FastCGI, the configuration side (nginx's ngx_http_fastcgi_module): which application a
//! location passes to, the parameters it sends, and how the answer is turned into a
//! response. The I/O is in `conn::fastcgi`; the records in `gannet_proto::fastcgi`.
//!
//! Directives: `fastcgi_pass`, `fastcgi_param` (with `if_not_empty`), `fastcgi_index`,
//! `fastcgi_split_path_info`, `fastcgi_keep_conn`, `fastcgi_connect_timeout`,
//! `fastcgi_send_timeout`, `fastcgi_read_timeout`, `fastcgi_buffering`, `fastcgi_buffers`,
//! `fastcgi_buffer_size`, `fastcgi_intercept_errors`, `fastcgi_hide_header`,
//! `fastcgi_pass_header`, `fastcgi_pass_request_headers`, `fastcgi_pass_request_body`,
//! `fastcgi_next_upstream`. Variables: `$fastcgi_script_name`, `$fastcgi_path_info`.
//!
//! As in nginx, `fastcgi_param` lists (and the hide/pass header lists) are inherited only by
//! levels that set none of their own.

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::variables::Template;
use crate::upstream::{Addr, Upstream};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::fastcgi::{CgiHead, Params};
use regex::Regex;
use std::sync::Arc;
use std::time::Duration;

const LOC: Ctx = Ctx(Ctx::LOCATION.0 | Ctx::IF.0);

const fn spec(name: &'static str, ctx: Ctx, args: Args) -> Spec {
    Spec {
        name,
        ctx,
        args,
        block: false,
    }
}

pub const DIRECTIVES: &[Spec] = &[
    spec("fastcgi_pass", LOC, Args::Exactly(1)),
    spec("fastcgi_param", Ctx::HSL, Args::Between(2, 3)),
    spec("fastcgi_index", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_split_path_info", Ctx::LOCATION, Args::Exactly(1)),
    spec("fastcgi_keep_conn", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_connect_timeout", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_send_timeout", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_read_timeout", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_buffering", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_buffers", Ctx::HSL, Args::Exactly(2)),
    spec("fastcgi_buffer_size", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_intercept_errors", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_hide_header", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_pass_header", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_pass_request_headers", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_pass_request_body", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_next_upstream", Ctx::HSL, Args::AtLeast(1)),
];

/// Where the application listens: one address, or an `upstream` group.
#[derive(Debug, Clone)]
pub enum Backend {
    Addr(Addr),
    Group(Arc<Upstream>),
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub value: Template,
    pub if_not_empty: bool,
}

#[derive(Debug, Clone, Default)]
pub struct FastCgiConf {
    /// Set in the location itself only (not inherited, as a content handler).
    pub pass: Option<Backend>,
    pub params: Option<Arc<Vec<Param>>>,
    pub index: Option<String>,
    pub split: Option<Regex>,
    pub keep_conn: Option<bool>,
    pub connect_timeout: Option<Duration>,
    pub send_timeout: Option<Duration>,
    pub read_timeout: Option<Duration>,
    pub buffer_size: Option<u64>,
    pub intercept_errors: Option<bool>,
    pub hide: Option<Arc<Vec<String>>>,
    pub pass_headers: Option<Arc<Vec<String>>>,
    pub pass_request_headers: Option<bool>,
    pub pass_request_body: Option<bool>,
    pub next_upstream: Option<Arc<Vec<String>>>,
}

impl FastCgiConf {
    pub fn merge(&mut self, parent: &FastCgiConf) {
        inherit!(
            self,
            parent,
            params,
            index,
            keep_conn,
            connect_timeout,
            send_timeout,
            read_timeout,
            buffer_size,
            intercept_errors,
            hide,
            pass_headers,
            pass_request_headers,
            pass_request_body,
            next_upstream,
            split,
        );
    }
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(Duration::from_secs(60))
    }
    pub fn send_timeout(&self) -> Duration {
        self.send_timeout.unwrap_or(Duration::from_secs(60))
    }
    pub fn read_timeout(&self) -> Duration {
        self.read_timeout.unwrap_or(Duration::from_secs(60))
    }
    /// The most a response head may take (`fastcgi_buffer_size`, one page by default).
    pub fn buffer_size(&self) -> usize {
        self.buffer_size.unwrap_or(4096) as usize
    }
    pub fn intercept_errors(&self) -> bool {
        self.intercept_errors.unwrap_or(false)
    }
    pub fn keep_conn(&self) -> bool {
        self.keep_conn.unwrap_or(false)
    }
}

fn duration(d: &Directive) -> Result<Option<Duration>, ConfError> {
    Ok(Some(Duration::from_millis(setters::msec_arg(d, 0)?)))
}

fn push(list: &mut Option<Arc<Vec<String>>>, v: &str) {
    let mut l = list.as_deref().cloned().unwrap_or_default();
    l.push(v.to_ascii_lowercase());
    *list = Some(Arc::new(l));
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.fastcgi;
    let a0 = d.args[0].as_str();
    match d.name.as_str() {
        "fastcgi_pass" => {
            if c.pass.is_some() {
                return Err(d.error("\"fastcgi_pass\" directive is duplicate"));
            }
            c.pass = Some(parse_backend(d, a0, ctx)?);
        }
        "fastcgi_param" => {
            let if_not_empty = match d.args.get(2).map(String::as_str) {
                None => false,
                Some("if_not_empty") => true,
                Some(other) => return Err(d.error(format!("invalid parameter \"{other}\""))),
            };
            let value = Template::compile(&d.args[1]).map_err(|e| d.error(e))?;
            let mut l = c.params.as_deref().cloned().unwrap_or_default();
            l.push(Param {
                name: a0.to_string(),
                value,
                if_not_empty,
            });
            c.params = Some(Arc::new(l));
        }
        "fastcgi_index" => c.index = Some(a0.to_string()),
        "fastcgi_split_path_info" => {
            let re = Regex::new(a0).map_err(|e| d.error(format!("invalid regex \"{a0}\": {e}")))?;
            if re.captures_len() < 3 {
                return Err(d.error(format!("pattern \"{a0}\" must have 2 captures")));
            }
            c.split = Some(re);
        }
        "fastcgi_keep_conn" => c.keep_conn = Some(setters::flag(d)?),
        "fastcgi_connect_timeout" => c.connect_timeout = duration(d)?,
        "fastcgi_send_timeout" => c.send_timeout = duration(d)?,
        "fastcgi_read_timeout" => c.read_timeout = duration(d)?,
        // Checked, then without effect: small answers are buffered whole, big ones streamed
        // (see `conn::fastcgi`).
        "fastcgi_buffering" => {
            setters::flag(d)?;
        }
        "fastcgi_buffers" => {
            setters::num_arg(d, 0)?;
            setters::size_arg(d, 1)?;
        }
        "fastcgi_buffer_size" => {
            let n = setters::size_arg(d, 0)?;
            if n < 256 {
                return Err(invalid(d, a0));
            }
            c.buffer_size = Some(n);
        }
        "fastcgi_intercept_errors" => c.intercept_errors = Some(setters::flag(d)?),
        "fastcgi_hide_header" => push(&mut c.hide, a0),
        "fastcgi_pass_header" => push(&mut c.pass_headers, a0),
        "fastcgi_pass_request_headers" => c.pass_request_headers = Some(setters::flag(d)?),
        "fastcgi_pass_request_body" => c.pass_request_body = Some(setters::flag(d)?),
        "fastcgi_next_upstream" => {
            const KNOWN: &[&str] = &[
                "error",
                "timeout",
                "invalid_header",
                "http_500",
                "http_503",
                "http_403",
                "http_404",
                "http_429",
                "non_idempotent",
                "off",
            ];
            for a in &d.args {
                if !KNOWN.contains(&a.as_str()) {
                    return Err(invalid(d, a));
                }
            }
            c.next_upstream = Some(Arc::new(d.args.clone()));
        }
        _ => unreachable!("not a fastcgi directive: {}", d.name),
    }
    Ok(())
}

fn parse_backend(d: &Directive, a: &str, ctx: &LoadCtx) -> Result<Backend, ConfError> {
    if a.contains('$') {
        return Err(d.error("variables in \"fastcgi_pass\" are not supported yet"));
    }
    if let Some(up) = ctx.upstreams.get(a) {
        return Ok(Backend::Group(up.clone()));
    }
    match Addr::parse(a) {
        Some(addr) => Ok(Backend::Addr(addr)),
        None if a.starts_with("unix:") => Err(invalid(d, a)),
        // What nginx says when a name is neither a group nor a host:port.
        None => Err(d.error(format!("host not found in upstream \"{a}\""))),
    }
}

/// `$fastcgi_script_name` and `$fastcgi_path_info` for the current URI.
pub fn script_name_and_path_info(req: &Request) -> (String, String) {
    let c = &req.conf.fastcgi;
    let (mut script, info) = match c.split.as_ref().and_then(|re| re.captures(&req.uri)) {
        Some(caps) => (
            caps.get(1).map_or("", |m| m.as_str()).to_string(),
            caps.get(2).map_or("", |m| m.as_str()).to_string(),
        ),
        None => (req.uri.clone(), String::new()),
    };
    if script.ends_with('/') {
        if let Some(index) = &c.index {
            script.push_str(index);
        }
    }
    (script, info)
}

/// The PARAMS of a request: the configured `fastcgi_param`s, then each request header as
/// `HTTP_NAME` unless a param of that name was configured (nginx's rule).
pub fn build_params(req: &Request, body_len: Option<u64>) -> Params {
    let c = &req.conf.fastcgi;
    let mut p = Params::new();
    let mut set_names: Vec<&str> = Vec::new();
    for param in c.params.iter().flat_map(|l| l.iter()) {
        let mut v = param.value.eval(req, None);
        // A chunked body was read whole: tell the application its length, as nginx does.
        if param.name == "CONTENT_LENGTH" && v.is_empty() {
            if let Some(n) = body_len.filter(|&n| n > 0) {
                v = n.to_string();
            }
        }
        if param.if_not_empty && v.is_empty() {
            continue;
        }
        // Names and values are bounded by the request size limits; cannot be too long.
        let _ = p.push(param.name.as_bytes(), v.as_bytes());
        set_names.push(&param.name);
    }
    if c.pass_request_headers.unwrap_or(true) {
        let mut name = String::new();
        for (n, v) in req.head.headers() {
            // Underscores would make two different headers one variable: nginx drops them.
            if n.contains('_') {
                continue;
            }
            name.clear();
            name.push_str("HTTP_");
            name.extend(n.chars().map(|ch| match ch {
                '-' => '_',
                ch => ch.to_ascii_uppercase(),
            }));
            if set_names.contains(&name.as_str()) {
                continue;
            }
            let _ = p.push(name.as_bytes(), v);
        }
    }
    p
}

/// Whether a header of the application's answer goes to the client.
pub fn passes(c: &FastCgiConf, name: &str) -> bool {
    // Hop-by-hop fields and the ones gannet sets itself.
    const NEVER: &[&str] = &[
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
    ];
    // nginx's default hidden list for upstream answers.
    const HIDDEN: &[&str] = &[
        "status",
        "date",
        "server",
        "x-pad",
        "x-accel-expires",
        "x-accel-redirect",
        "x-accel-limit-rate",
        "x-accel-buffering",
        "x-accel-charset",
    ];
    let lower = name.to_ascii_lowercase();
    if NEVER.contains(&lower.as_str()) {
        return false;
    }
    if c.hide.as_ref().is_some_and(|h| h.contains(&lower)) {
        return false;
    }
    if HIDDEN.contains(&lower.as_str()) {
        return c.pass_headers.as_ref().is_some_and(|p| p.contains(&lower));
    }
    true
}

/// What the application's head asks for.
pub enum Answer {
    /// A response with this status and these headers.
    Respond(u16, CgiHead),
    /// A CGI local redirect (`Location: /path` and no `Status`): serve that URI instead.
    LocalRedirect(String),
}

pub fn classify(head: CgiHead) -> Answer {
    match (head.status, head.get("location")) {
        (None, Some(l)) if l.starts_with('/') && !l.starts_with("//") => {
            Answer::LocalRedirect(l.to_string())
        }
        (None, Some(_)) => Answer::Respond(302, head),
        (Some(s), _) => Answer::Respond(s, head),
        (None, None) => Answer::Respond(200, head),
    }
}
