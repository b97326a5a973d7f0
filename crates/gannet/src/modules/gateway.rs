//! What the upstream gateways share, the configuration side: nginx's proxy, FastCGI, SCGI
//! and uwsgi modules are one upstream module with four request encodings, and so are
//! gannet's. This module owns the directives all of them have, generated from the
//! protocol's prefix (`fastcgi_`, `scgi_`, `uwsgi_`) by [`directives!`]: `*_pass`, `*_param`
//! (with `if_not_empty`), `*_connect_timeout`, `*_send_timeout`, `*_read_timeout`,
//! `*_buffering`, `*_buffers`, `*_buffer_size`, `*_busy_buffers_size`, `*_temp_path`,
//! `*_max_temp_file_size`, `*_temp_file_write_size`, `*_intercept_errors`, `*_hide_header`,
//! `*_pass_header`, `*_pass_request_headers`, `*_pass_request_body`, `*_request_buffering`,
//! `*_next_upstream`, `*_next_upstream_tries`, `*_next_upstream_timeout`, and the cache's
//! (`*_cache_path`, `*_cache`, `*_cache_key`..., see `gateway_cache`), `*_store` and
//! `*_store_access` (not grpc's, as nginx: see `conn::gateway_store`); the parameters a
//! request sends and
//! which answer headers reach the client. The protocols' own directives are in `proxy`
//! (which has no `*_param` and its own `proxy_pass`), `fastcgi`, `scgi` and `uwsgi`; the I/O
//! is in `conn::gateway`.
//!
//! As in nginx, `*_param` lists (and the hide/pass header lists) are inherited only by
//! levels that set none of their own.

use super::client_body::{self, temp_path_in, TempPath};
use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::variables::Template;
use crate::upstream::{Addr, Upstream};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::cgi::{CgiHead, HeaderValue, ParamError, ParamSink};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// The protocol a location speaks to its application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    FastCgi,
    Scgi,
    Uwsgi,
    /// HTTP/1.x to a server behind a reverse proxy (`proxy_pass`).
    Http,
    /// A `get` to memcached (`memcached_pass`).
    Memcached,
    /// HTTP/2 to a gRPC server (`grpc_pass`, `conn::grpc`).
    Grpc,
}

impl Proto {
    pub const ALL: [Proto; 6] = [
        Proto::FastCgi,
        Proto::Scgi,
        Proto::Uwsgi,
        Proto::Http,
        Proto::Memcached,
        Proto::Grpc,
    ];

    /// The start of its directives' names.
    pub fn prefix(self) -> &'static str {
        match self {
            Proto::FastCgi => "fastcgi_",
            Proto::Scgi => "scgi_",
            Proto::Uwsgi => "uwsgi_",
            Proto::Http => "proxy_",
            Proto::Memcached => "memcached_",
            Proto::Grpc => "grpc_",
        }
    }

    /// How nginx names an upstream of this protocol in the error log (`fastcgi://addr`).
    pub fn scheme(self) -> &'static str {
        match self {
            Proto::FastCgi => "fastcgi",
            Proto::Scgi => "scgi",
            Proto::Uwsgi => "uwsgi",
            Proto::Http => "http",
            Proto::Memcached => "memcached",
            Proto::Grpc => "grpc",
        }
    }
}

/// The directive table of one protocol: the shared directives under its prefix, then its
/// own `$extra` specs. Names are built at compile time (`concat!`), so a table stays a
/// `&'static [Spec]` like every other module's.
macro_rules! directives {
    ($p:literal $(, $extra:expr)* $(,)?) => {
        &[
            $crate::modules::gateway::directives!(@spec $p "pass" [LOCATION | IF] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "param" [HSL] Between(2, 3)),
            $crate::modules::gateway::directives!(@spec $p "connect_timeout" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "send_timeout" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "read_timeout" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "buffering" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "buffers" [HSL] Exactly(2)),
            $crate::modules::gateway::directives!(@spec $p "buffer_size" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "intercept_errors" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "hide_header" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "pass_header" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "pass_request_headers" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "pass_request_body" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "request_buffering" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "next_upstream" [HSL] AtLeast(1)),
            $crate::modules::gateway::directives!(@spec $p "next_upstream_tries" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "next_upstream_timeout" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "busy_buffers_size" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "ignore_headers" [HSL] AtLeast(1)),
            $crate::modules::gateway::directives!(@spec $p "socket_keepalive" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "ignore_client_abort" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "temp_path" [HSL] Between(1, 4)),
            $crate::modules::gateway::directives!(@spec $p "max_temp_file_size" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "temp_file_write_size" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_path" [HTTP] AtLeast(2)),
            $crate::modules::gateway::directives!(@spec $p "cache" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_key" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_valid" [HSL] AtLeast(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_methods" [HSL] AtLeast(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_min_uses" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_bypass" [HSL] AtLeast(1)),
            $crate::modules::gateway::directives!(@spec $p "no_cache" [HSL] AtLeast(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_use_stale" [HSL] AtLeast(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_lock" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_lock_age" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_lock_timeout" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_revalidate" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_max_range_offset" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "force_ranges" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_purge" [HSL] AtLeast(1)),
            $crate::modules::gateway::directives!(@spec $p "cache_background_update" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "store" [HSL] Exactly(1)),
            $crate::modules::gateway::directives!(@spec $p "store_access" [HSL] Between(1, 3)),
            $($extra,)*
        ]
    };
    (@spec $p:literal $suffix:literal [$($ctx:ident)|+] $($args:tt)+) => {
        $crate::modules::gateway::spec(
            concat!($p, $suffix),
            gannet_conf::registry::Ctx(0 $(| gannet_conf::registry::Ctx::$ctx.0)+),
            gannet_conf::registry::Args::$($args)+,
        )
    };
}
pub(crate) use directives;

/// `user:rw group:r all:r`, as nginx's ngx_conf_set_access_slot: the owner may always
/// read and write unless `user:` says otherwise.
fn access(d: &Directive) -> Result<u32, ConfError> {
    let (mut mode, mut user) = (0, 0o600);
    for a in &d.args {
        let (shift, right) = if let Some(r) = a.strip_prefix("user:") {
            user = 0;
            (6, r)
        } else if let Some(r) = a.strip_prefix("group:") {
            (3, r)
        } else if let Some(r) = a.strip_prefix("all:") {
            (0, r)
        } else {
            return Err(d.error(format!("invalid value \"{a}\"")));
        };
        let bits = match right {
            "rw" => 6,
            "r" => 4,
            _ => return Err(d.error(format!("invalid value \"{a}\""))),
        };
        mode |= bits << shift;
    }
    Ok(mode | user)
}

/// A plain (non-block) directive's spec.
pub const fn spec(name: &'static str, ctx: Ctx, args: Args) -> Spec {
    Spec {
        name,
        ctx,
        args,
        block: false,
    }
}

/// How a request body passed on as it arrives (`*_request_buffering off`) is framed: with
/// the client's Content-Length, or (HTTP/1.1 to the upstream only) chunked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streamed {
    Length(u64),
    Chunked,
}

/// Where the application listens: one address, or an `upstream` group.
#[derive(Debug, Clone)]
pub enum Backend {
    Addr(Addr),
    Group(Arc<Upstream>),
    /// Known per request: a `proxy_pass` URL with variables.
    Dynamic,
    /// Known per request: a `fastcgi_pass` (`scgi_pass`, `uwsgi_pass`) with variables.
    Vars(Arc<PassVars>),
}

/// A `*_pass` address with variables and the groups its value may name.
#[derive(Debug)]
pub struct PassVars {
    pub value: Template,
    pub groups: std::collections::HashMap<String, Arc<Upstream>>,
}

impl PassVars {
    /// The backend this request's value names, as nginx reads it (`ngx_http_fastcgi_eval`):
    /// a group, a unix socket, or `host:port` whose host may still need resolving; `Err`
    /// with the status and the log line for a value that is none of them.
    pub fn eval(&self, req: &Request) -> Result<Backend, (u16, String)> {
        let v = self.value.eval(req, None);
        if let Some(up) = self.groups.get(&v) {
            return Ok(Backend::Group(up.clone()));
        }
        match Addr::parse(&v) {
            Some(a) => Ok(Backend::Addr(a)),
            None if v.starts_with("unix:") || v.is_empty() => {
                Err((500, format!("invalid URL in upstream \"{v}\"")))
            }
            None => Err((502, format!("no port in upstream \"{v}\""))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub value: Template,
    pub if_not_empty: bool,
}

/// One protocol's share of a location's settings.
#[derive(Debug, Clone, Default)]
pub struct GatewayConf {
    /// Set in the location itself only (not inherited, as a content handler).
    pub pass: Option<Backend>,
    pub params: Option<Arc<Vec<Param>>>,
    pub connect_timeout: Option<Duration>,
    pub send_timeout: Option<Duration>,
    pub read_timeout: Option<Duration>,
    /// `*_buffering`: off sends each piece of the answer on as it is read (`conn::gateway`).
    pub buffering: Option<bool>,
    pub buffer_size: Option<u64>,
    /// `*_buffers N size`: the memory an answer read ahead of its client may take.
    pub buffers: Option<(u64, u64)>,
    /// `*_busy_buffers_size`: the most handed to the client at once from what was read ahead.
    pub busy_buffers_size: Option<u64>,
    /// `*_temp_path`: where an answer read ahead goes past `buffers` (`conn::spool`).
    pub temp_path: Option<Arc<TempPath>>,
    /// `*_max_temp_file_size`: the most of an answer in the temp file; 0: none.
    pub max_temp_file_size: Option<u64>,
    /// `*_temp_file_write_size`: what is gathered before each write to the file.
    pub temp_file_write_size: Option<u64>,
    pub intercept_errors: Option<bool>,
    pub hide: Option<Arc<Vec<String>>>,
    pub pass_headers: Option<Arc<Vec<String>>>,
    pub pass_request_headers: Option<bool>,
    pub pass_request_body: Option<bool>,
    /// `*_request_buffering`: off passes the body on as it arrives (`conn::gateway`).
    pub request_buffering: Option<bool>,
    pub next_upstream: Option<Arc<Vec<String>>>,
    /// Most servers one request may try; 0: no limit.
    pub next_upstream_tries: Option<u64>,
    /// How long retries may go on; zero: no limit.
    pub next_upstream_timeout: Option<Duration>,
    /// `*_ignore_headers`, lower case: the application's `X-Accel-*` headers listed here are
    /// not acted on.
    pub ignore_headers: Option<Arc<Vec<String>>>,
    /// `*_socket_keepalive`: TCP keep-alive probes on upstream connections.
    pub socket_keepalive: Option<bool>,
    /// `*_ignore_client_abort`: finish the exchange even when the client has left.
    pub ignore_client_abort: Option<bool>,
    /// `*_force_ranges`: byte ranges are cut from an answer whether or not it said
    /// `Accept-Ranges`.
    pub force_ranges: Option<bool>,
    /// `*_cache` and its settings (`gateway_cache`).
    pub cache: super::gateway_cache::CacheConf,
    /// `*_store`: a 200 answer is kept as a file (`conn::gateway_store`).
    pub store: Option<Store>,
    /// `*_store_access`: the stored file's permissions (and its new directories').
    pub store_access: Option<u32>,
}

/// `*_store`'s value.
#[derive(Debug, Clone)]
pub enum Store {
    Off,
    /// `on`: at the path the URI maps to under `root` / `alias`.
    Root,
    /// At the path the string makes.
    Path(Arc<Template>),
}

impl GatewayConf {
    pub fn merge(&mut self, parent: &GatewayConf) {
        self.cache.merge(&parent.cache);
        inherit!(
            self,
            parent,
            params,
            connect_timeout,
            send_timeout,
            read_timeout,
            buffering,
            buffer_size,
            buffers,
            busy_buffers_size,
            temp_path,
            max_temp_file_size,
            temp_file_write_size,
            intercept_errors,
            hide,
            pass_headers,
            pass_request_headers,
            pass_request_body,
            request_buffering,
            next_upstream,
            next_upstream_tries,
            next_upstream_timeout,
            ignore_headers,
            socket_keepalive,
            ignore_client_abort,
            force_ranges,
            store,
            store_access,
        );
    }
    /// `*_store`, if it is on.
    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref().filter(|s| !matches!(s, Store::Off))
    }
    pub fn store_access(&self) -> u32 {
        self.store_access.unwrap_or(0o600)
    }
    pub fn force_ranges(&self) -> bool {
        self.force_ranges.unwrap_or(false)
    }
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(Duration::from_secs(60))
    }
    pub fn send_timeout(&self) -> Duration {
        self.send_timeout.unwrap_or(Duration::from_secs(60))
    }
    /// Whether the application's `name` header (lower case) is to be ignored.
    pub fn ignores(&self, name: &str) -> bool {
        self.ignore_headers
            .as_ref()
            .is_some_and(|l| l.iter().any(|h| h == name))
    }
    pub fn socket_keepalive(&self) -> bool {
        self.socket_keepalive.unwrap_or(false)
    }
    pub fn ignore_client_abort(&self) -> bool {
        self.ignore_client_abort.unwrap_or(false)
    }
    pub fn read_timeout(&self) -> Duration {
        self.read_timeout.unwrap_or(Duration::from_secs(60))
    }
    /// The most a response head may take (`*_buffer_size`, one page by default).
    pub fn buffer_size(&self) -> usize {
        self.buffer_size.unwrap_or(4096) as usize
    }
    pub fn buffering(&self) -> bool {
        self.buffering.unwrap_or(true)
    }
    /// `*_buffers`' total: nginx's default is 8 pages.
    pub fn buffers_total(&self) -> usize {
        let (n, size) = self.buffers.unwrap_or((8, 4096));
        usize::try_from(n.saturating_mul(size)).unwrap_or(usize::MAX)
    }
    /// nginx's defaults for the busy and write sizes: two of the larger of a buffer and
    /// the head's buffer.
    fn two_buffers(&self) -> u64 {
        2 * self
            .buffers
            .map_or(4096, |(_, s)| s)
            .max(self.buffer_size() as u64)
    }
    pub fn busy_buffers_size(&self) -> usize {
        usize::try_from(self.busy_buffers_size.unwrap_or_else(|| self.two_buffers()))
            .unwrap_or(usize::MAX)
            .max(1)
    }
    pub fn temp_file_write_size(&self) -> usize {
        usize::try_from(
            self.temp_file_write_size
                .unwrap_or_else(|| self.two_buffers()),
        )
        .unwrap_or(usize::MAX)
    }
    pub fn max_temp_file_size(&self) -> u64 {
        self.max_temp_file_size.unwrap_or(1024 * 1024 * 1024)
    }
    /// The loader sets the http level's (`proxy_temp` and the like under the prefix); the
    /// fallback only serves a LocConf built outside it.
    pub fn temp_path(&self) -> Arc<TempPath> {
        self.temp_path
            .clone()
            .unwrap_or_else(|| temp_path_in(std::path::Path::new("."), "proxy_temp"))
    }
    pub fn intercept_errors(&self) -> bool {
        self.intercept_errors.unwrap_or(false)
    }
    pub fn pass_request_body(&self) -> bool {
        self.pass_request_body.unwrap_or(true)
    }
    pub fn request_buffering(&self) -> bool {
        self.request_buffering.unwrap_or(true)
    }
}

/// A protocol's settings in a location.
pub fn conf(lc: &LocConf, p: Proto) -> &GatewayConf {
    match p {
        Proto::FastCgi => &lc.fastcgi.gw,
        Proto::Scgi => &lc.scgi,
        Proto::Uwsgi => &lc.uwsgi.gw,
        Proto::Http => &lc.proxy.gw,
        Proto::Memcached => &lc.memcached.gw,
        Proto::Grpc => &lc.grpc.gw,
    }
}

pub fn conf_mut(lc: &mut LocConf, p: Proto) -> &mut GatewayConf {
    match p {
        Proto::FastCgi => &mut lc.fastcgi.gw,
        Proto::Scgi => &mut lc.scgi,
        Proto::Uwsgi => &mut lc.uwsgi.gw,
        Proto::Http => &mut lc.proxy.gw,
        Proto::Memcached => &mut lc.memcached.gw,
        Proto::Grpc => &mut lc.grpc.gw,
    }
}

/// The protocol whose application answers this location's requests, if any.
pub fn active(lc: &LocConf) -> Option<Proto> {
    Proto::ALL.into_iter().find(|&p| conf(lc, p).pass.is_some())
}

fn duration(d: &Directive) -> Result<Option<Duration>, ConfError> {
    Ok(Some(Duration::from_millis(setters::msec_arg(d, 0)?)))
}

fn push(list: &mut Option<Arc<Vec<String>>>, v: &str) {
    let mut l = list.as_deref().cloned().unwrap_or_default();
    l.push(v.to_ascii_lowercase());
    *list = Some(Arc::new(l));
}

/// Apply `d` if it is one of the shared directives of `p`; false if it is the protocol's own.
pub fn set(
    d: &Directive,
    p: Proto,
    lc: &mut LocConf,
    ctx: &mut LoadCtx,
) -> Result<bool, ConfError> {
    let Some(suffix) = d.name.strip_prefix(p.prefix()) else {
        return Ok(false);
    };
    if suffix == "pass" {
        // One content handler per location: nginx would silently keep the last one.
        if let Some(other) = active(lc).filter(|&o| o != p) {
            return Err(d.error(format!(
                "\"{}\" directive is duplicate: \"{}pass\" is set in this location",
                d.name,
                other.prefix()
            )));
        }
    }
    let c = conf_mut(lc, p);
    if super::gateway_cache::set(d, suffix, &mut c.cache, ctx)? {
        return Ok(true);
    }
    let a0 = d.args[0].as_str();
    match suffix {
        "pass" => {
            if c.pass.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            c.pass = Some(parse_backend(d, a0, ctx)?);
        }
        "param" => {
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
        "connect_timeout" => c.connect_timeout = duration(d)?,
        "send_timeout" => c.send_timeout = duration(d)?,
        "read_timeout" => c.read_timeout = duration(d)?,
        "buffering" => c.buffering = Some(setters::flag(d)?),
        "buffers" => {
            let n = setters::num_arg(d, 0)?;
            let size = setters::size_arg(d, 1)?;
            if n < 2 {
                return Err(d.error(format!("there must be at least 2 \"{}\"", d.name)));
            }
            c.buffers = Some((n, size));
        }
        // Any size, as nginx's: a head that does not fit is the upstream's error (502).
        "buffer_size" => c.buffer_size = Some(setters::size_arg(d, 0)?),
        "intercept_errors" => c.intercept_errors = Some(setters::flag(d)?),
        "hide_header" => push(&mut c.hide, a0),
        "pass_header" => push(&mut c.pass_headers, a0),
        "pass_request_headers" => c.pass_request_headers = Some(setters::flag(d)?),
        "pass_request_body" => c.pass_request_body = Some(setters::flag(d)?),
        "request_buffering" => c.request_buffering = Some(setters::flag(d)?),
        "ignore_client_abort" => c.ignore_client_abort = Some(setters::flag(d)?),
        "store" => {
            if c.store.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            c.store = Some(match a0 {
                "off" => Store::Off,
                "on" => Store::Root,
                _ => Store::Path(Arc::new(Template::compile(a0).map_err(|e| d.error(e))?)),
            });
        }
        "store_access" => {
            if c.store_access.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            c.store_access = Some(access(d)?);
        }
        "next_upstream" => {
            const KNOWN: &[&str] = &[
                "error",
                "timeout",
                "invalid_header",
                "http_500",
                "http_502",
                "http_503",
                "http_504",
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
        "next_upstream_tries" => c.next_upstream_tries = Some(setters::num_arg(d, 0)?),
        "next_upstream_timeout" => c.next_upstream_timeout = duration(d)?,
        "busy_buffers_size" => c.busy_buffers_size = Some(setters::size_arg(d, 0)?),
        "temp_path" => {
            if c.temp_path.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            c.temp_path = Some(Arc::new(client_body::temp_path(d, ctx)?));
        }
        "max_temp_file_size" => c.max_temp_file_size = Some(setters::size_arg(d, 0)?),
        "temp_file_write_size" => c.temp_file_write_size = Some(setters::size_arg(d, 0)?),
        "ignore_headers" => {
            // nginx's list. The cache's headers (Expires, Cache-Control, Set-Cookie, Vary,
            // X-Accel-Expires) are read by `cache::validity`.
            const KNOWN: &[&str] = &[
                "x-accel-redirect",
                "x-accel-expires",
                "x-accel-limit-rate",
                "x-accel-buffering",
                "x-accel-charset",
                "expires",
                "cache-control",
                "set-cookie",
                "vary",
            ];
            // Several directives at one level add up (nginx's bitmask slot).
            let mut l = c.ignore_headers.as_deref().cloned().unwrap_or_default();
            for a in &d.args {
                let lower = a.to_ascii_lowercase();
                if !KNOWN.contains(&lower.as_str()) {
                    return Err(d.error(format!("invalid value \"{a}\"")));
                }
                l.push(lower);
            }
            c.ignore_headers = Some(Arc::new(l));
        }
        "socket_keepalive" => c.socket_keepalive = Some(setters::flag(d)?),
        "force_ranges" => c.force_ranges = Some(setters::flag(d)?),
        _ => return Ok(false),
    }
    Ok(true)
}

fn parse_backend(d: &Directive, a: &str, ctx: &mut LoadCtx) -> Result<Backend, ConfError> {
    if a.contains('$') {
        let value = Template::compile(a).map_err(|e| d.error(e))?;
        return Ok(Backend::Vars(Arc::new(PassVars {
            value,
            groups: ctx.upstreams.clone(),
        })));
    }
    if let Some(up) = ctx.upstreams.get(a) {
        return Ok(Backend::Group(up.clone()));
    }
    match Addr::parse(a) {
        Some(Addr::Tcp(hp)) => Ok(implicit_group(ctx, &hp).unwrap_or(Backend::Addr(Addr::Tcp(hp)))),
        Some(addr) => Ok(Backend::Addr(addr)),
        None if a.starts_with("unix:") => Err(invalid(d, a)),
        // What nginx says when a name is neither a group nor a host:port.
        None => Err(d.error(format!("host not found in upstream \"{a}\""))),
    }
}

/// A `*_pass` to `host:port` whose host is a name: nginx's implicit group of the addresses
/// it resolves to (`upstream::implicit`).
pub fn implicit_group(ctx: &mut LoadCtx, host_port: &str) -> Option<Backend> {
    let (host, port) = host_port.rsplit_once(':')?;
    let port = port.parse().ok()?;
    crate::upstream::implicit(&mut ctx.upstreams, host, port).map(Backend::Group)
}

/// The parameters of a request into `out`: the configured `*_param`s, then each request
/// header as `HTTP_NAME` unless a param of that name was configured (nginx's rule).
/// `body_len` is the length of the body read whole (a chunked one has no header for it).
pub fn build_params(
    req: &Request,
    c: &GatewayConf,
    body_len: u64,
    out: &mut impl ParamSink,
) -> Result<(), ParamError> {
    // The params named like a header's variable (`HTTP_...`): that header is not sent again.
    // Usually none, so this Vec never allocates (it grew four times per request when it
    // held every name).
    let mut set_names: Vec<&str> = Vec::new();
    // One buffer for every value (a typical fastcgi_params has about twenty): the thread's,
    // reused request after request (taken out of its cell while in use).
    let mut v = PARAM_VALUE.with(std::cell::Cell::take);
    for param in c.params.iter().flat_map(|l| l.iter()) {
        // A value without variables (`GATEWAY_INTERFACE CGI/1.1`) goes as it is, not
        // through the value buffer.
        let value = match param.value.as_literal() {
            Some(lit) => lit,
            None => {
                v.clear();
                param.value.append_to(&mut v, req, None);
                // A chunked body was read whole: tell the application its length, as
                // nginx does.
                if param.name == "CONTENT_LENGTH" && v.is_empty() && body_len > 0 {
                    v = body_len.to_string();
                }
                v.as_str()
            }
        };
        if param.if_not_empty && value.is_empty() {
            continue;
        }
        out.push(param.name.as_bytes(), value.as_bytes())?;
        if param.name.starts_with("HTTP_") {
            set_names.push(&param.name);
        }
    }
    // A request whose answer may be cached sends the cache's conditional headers, not the
    // client's (nginx's `fastcgi_cache_headers`).
    let cached = c.cache.enabled() && crate::conn::gateway_cache::cacheable(req);
    if cached {
        if let Some((lm, etag)) = crate::conn::gateway_cache::revalidation(req) {
            for (n, v) in [("HTTP_IF_MODIFIED_SINCE", lm), ("HTTP_IF_NONE_MATCH", etag)] {
                if let Some(v) = v.filter(|_| !set_names.contains(&n)) {
                    out.push(n.as_bytes(), v.as_bytes())?;
                }
            }
        }
    }
    if v.capacity() <= PARAM_VALUE_KEEP {
        v.clear();
        PARAM_VALUE.with(|cell| cell.set(v));
    }
    if c.pass_request_headers.unwrap_or(true) {
        // `HTTP_` and the name, made byte by byte on the stack (a String built char by char
        // and allocated per request cost ~40 instructions a header more); a name too long
        // for it gets a Vec.
        let mut stack = [0u8; 96];
        let mut heap = Vec::new();
        for (n, v) in req.head.headers() {
            // Underscores would make two different headers one variable: nginx drops them.
            if n.as_bytes().contains(&b'_') || (cached && crate::conn::gateway_cache::withheld(n)) {
                continue;
            }
            let len = 5 + n.len();
            let name: &mut [u8] = if len <= stack.len() {
                &mut stack[..len]
            } else {
                heap.resize(len, 0);
                &mut heap[..]
            };
            name[..5].copy_from_slice(b"HTTP_");
            for (d, b) in name[5..].iter_mut().zip(n.bytes()) {
                *d = if b == b'-' {
                    b'_'
                } else {
                    b.to_ascii_uppercase()
                };
            }
            if set_names.iter().any(|s| s.as_bytes() == &name[..]) {
                continue;
            }
            out.push(name, v)?;
        }
    }
    Ok(())
}

thread_local! {
    /// [`build_params`]' value buffer, kept between requests.
    static PARAM_VALUE: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// The most value-buffer capacity kept for the next request (a huge value is not kept).
const PARAM_VALUE_KEEP: usize = 4096;

/// An answer field that `conn::gateway::answer` treats apart from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Passed on as it is (unless `*_hide_header` names it).
    Other,
    /// Hop-by-hop, or the framing gannet sets itself: never passed.
    Never,
    /// In nginx's default hidden list: passed only when `*_pass_header` names it.
    Hidden,
    ContentType,
    Location,
    Refresh,
    SetCookie,
    /// `X-Accel-Limit-Rate` and `X-Accel-Charset`: read, and hidden as the others.
    LimitRate,
    Charset,
}

impl Field {
    /// What `name` is, case-insensitively. The name's length picks the one or two
    /// candidates it is compared with: this runs for every field of every answer, where
    /// comparing each name with `answer`'s six names and `passes`' thirteen in turn made
    /// `answer` 2,165 instructions for a back end's eight fields (1,859 this way; see
    /// docs/bench/cost-per-request.md). Each candidate is compared a word at a time
    /// ([`Known`]): std's `eq_ignore_ascii_case` folds one byte at a time, 58 instructions
    /// a field.
    pub fn of(name: &str) -> Field {
        const DATE: Known = Known::new("date");
        const X_PAD: Known = Known::new("x-pad");
        const SERVER: Known = Known::new("server");
        const STATUS: Known = Known::new("status");
        const REFRESH: Known = Known::new("refresh");
        const LOCATION: Known = Known::new("location");
        const CONNECTION: Known = Known::new("connection");
        const KEEP_ALIVE: Known = Known::new("keep-alive");
        const SET_COOKIE: Known = Known::new("set-cookie");
        const CONTENT_TYPE: Known = Known::new("content-type");
        const CONTENT_LENGTH: Known = Known::new("content-length");
        const X_ACCEL_CHARSET: Known = Known::new("x-accel-charset");
        const X_ACCEL_EXPIRES: Known = Known::new("x-accel-expires");
        const X_ACCEL_REDIRECT: Known = Known::new("x-accel-redirect");
        const TRANSFER_ENCODING: Known = Known::new("transfer-encoding");
        const X_ACCEL_BUFFERING: Known = Known::new("x-accel-buffering");
        const X_ACCEL_LIMIT_RATE: Known = Known::new("x-accel-limit-rate");
        let n = name.as_bytes();
        match n.len() {
            4 if DATE.is(n) => Field::Hidden,
            5 if X_PAD.is(n) => Field::Hidden,
            6 if SERVER.is(n) || STATUS.is(n) => Field::Hidden,
            7 if REFRESH.is(n) => Field::Refresh,
            8 if LOCATION.is(n) => Field::Location,
            10 if CONNECTION.is(n) || KEEP_ALIVE.is(n) => Field::Never,
            10 if SET_COOKIE.is(n) => Field::SetCookie,
            12 if CONTENT_TYPE.is(n) => Field::ContentType,
            14 if CONTENT_LENGTH.is(n) => Field::Never,
            15 if X_ACCEL_CHARSET.is(n) => Field::Charset,
            15 if X_ACCEL_EXPIRES.is(n) => Field::Hidden,
            16 if X_ACCEL_REDIRECT.is(n) => Field::Hidden,
            17 if TRANSFER_ENCODING.is(n) => Field::Never,
            17 if X_ACCEL_BUFFERING.is(n) => Field::Hidden,
            18 if X_ACCEL_LIMIT_RATE.is(n) => Field::LimitRate,
            _ => Field::Other,
        }
    }
}

/// A lowercase name of 4 to 24 bytes as the words a name of its length is compared with,
/// ignoring ASCII case: the first and the last 4 (under 8 bytes) or 8 bytes, and the 8
/// after the first 8 when it is longer than 16 (words overlap where the length is not a
/// multiple). `fold` has 0x20 in each byte that is a letter in `words`, so `(w | fold) ==
/// words` holds exactly when each letter matches in either case and every other byte
/// (`-`) is the same: the same answer as `eq_ignore_ascii_case`, from two or three word
/// compares. Hand-written for `Field::of`'s hot path (see there).
struct Known {
    len: usize,
    words: [u64; 3],
    fold: [u64; 3],
}

impl Known {
    const fn new(lower: &str) -> Known {
        let b = lower.as_bytes();
        let len = b.len();
        assert!(len >= 4 && len <= 24);
        let (width, at) = if len < 8 {
            (4, [0, len - 4, len - 4])
        } else {
            (8, [0, len - 8, if len > 16 { 8 } else { len - 8 }])
        };
        let mut words = [0u64; 3];
        let mut fold = [0u64; 3];
        let mut k = 0;
        while k < 3 {
            let mut i = 0;
            while i < width {
                let c = b[at[k] + i];
                assert!(c.is_ascii_lowercase() || c == b'-');
                words[k] |= (c as u64) << (8 * i);
                if c.is_ascii_lowercase() {
                    fold[k] |= 0x20 << (8 * i);
                }
                i += 1;
            }
            k += 1;
        }
        Known { len, words, fold }
    }

    /// Whether `name` is this name, ignoring ASCII case.
    #[inline(always)]
    fn is(&self, name: &[u8]) -> bool {
        let len = self.len;
        if name.len() != len {
            return false;
        }
        if len < 8 {
            (word4(name, 0) | self.fold[0]) == self.words[0]
                && (word4(name, len - 4) | self.fold[1]) == self.words[1]
        } else {
            (word8(name, 0) | self.fold[0]) == self.words[0]
                && (word8(name, len - 8) | self.fold[1]) == self.words[1]
                && (len <= 16 || (word8(name, 8) | self.fold[2]) == self.words[2])
        }
    }
}

/// The 4 bytes of `b` at `at`, little-endian.
#[inline(always)]
fn word4(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u64::from(u32::from_le_bytes(w))
}

/// The 8 bytes of `b` at `at`, little-endian.
#[inline(always)]
fn word8(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Whether a header of the application's answer goes to the client.
pub fn passes(c: &GatewayConf, name: &str) -> bool {
    passes_field(c, name, Field::of(name))
}

/// [`passes`] for a field already classified: hop-by-hop fields and the ones gannet sets
/// itself never, `*_hide_header`'s not, nginx's default hidden list only when
/// `*_pass_header` names them.
pub fn passes_field(c: &GatewayConf, name: &str, kind: Field) -> bool {
    let listed = |list: &Option<Arc<Vec<String>>>| {
        list.as_ref()
            .is_some_and(|l| l.iter().any(|n| n.eq_ignore_ascii_case(name)))
    };
    match kind {
        Field::Never => false,
        _ if listed(&c.hide) => false,
        Field::Hidden | Field::LimitRate | Field::Charset => listed(&c.pass_headers),
        _ => true,
    }
}

/// Whether `*_pass_header` names this header (one of the hidden ones passed on).
pub fn pass_lists(c: &GatewayConf, name: &str) -> bool {
    c.pass_headers
        .as_ref()
        .is_some_and(|l| l.iter().any(|n| n.eq_ignore_ascii_case(name)))
}

/// What the application's head asks for.
pub enum Answer {
    /// A response with this status and these headers.
    Respond(u16, CgiHead),
    /// A CGI local redirect (`Location: /path` and no `Status`): serve that URI instead.
    LocalRedirect(String),
    /// `X-Accel-Redirect: /uri` or `@name`: serve that instead, with the headers nginx
    /// carries over to the redirected request's answer and the `X-Accel-Limit-Rate` given
    /// with it (nginx sets the request's rate as it reads the head, so it outlives the
    /// redirect and stands over the new location's `limit_rate`).
    AccelRedirect(String, Vec<(Cow<'static, str>, HeaderValue)>, Option<u64>),
}

/// The answer headers nginx keeps across an `X-Accel-Redirect` (its `redirect` flag).
const CARRIED: &[&str] = &[
    "content-type",
    "set-cookie",
    "content-disposition",
    "cache-control",
    "expires",
    "accept-ranges",
];

pub fn classify(c: &GatewayConf, head: CgiHead) -> Answer {
    if let Some(uri) = head.get("x-accel-redirect").filter(|u| !u.is_empty()) {
        if !c.ignores("x-accel-redirect") {
            let carried = head
                .headers
                .iter()
                .filter(|(n, _)| CARRIED.iter().any(|k| n.eq_ignore_ascii_case(k)))
                .map(|(n, v)| (Cow::Owned(n.to_string()), HeaderValue::from(v)))
                .collect();
            let rate = head
                .get("x-accel-limit-rate")
                .filter(|_| !c.ignores("x-accel-limit-rate"))
                .and_then(|v| gannet_conf::setters::num(v.trim()));
            return Answer::AccelRedirect(uri.to_string(), carried, rate);
        }
    }
    match (head.status, head.get("location")) {
        (None, Some(l)) if l.starts_with('/') && !l.starts_with("//") => {
            Answer::LocalRedirect(l.to_string())
        }
        (None, Some(_)) => Answer::Respond(302, head),
        (Some(s), _) => Answer::Respond(s, head),
        (None, None) => Answer::Respond(200, head),
    }
}

/// Each protocol's table is its prefix on the shared names, plus its own.
#[cfg(test)]
mod tests {
    use super::{Field, Proto};

    /// Each name `answer` treats apart is found in any case, and no other name is: nginx's
    /// hidden list, the hop-by-hop and framing fields, the ones read.
    #[test]
    fn answer_fields_are_classified_by_name() {
        let named = [
            ("Connection", Field::Never),
            ("keep-alive", Field::Never),
            ("TRANSFER-ENCODING", Field::Never),
            ("Content-Length", Field::Never),
            ("Status", Field::Hidden),
            ("date", Field::Hidden),
            ("Server", Field::Hidden),
            ("X-Pad", Field::Hidden),
            ("X-Accel-Expires", Field::Hidden),
            ("X-Accel-Redirect", Field::Hidden),
            ("x-accel-buffering", Field::Hidden),
            ("X-Accel-Limit-Rate", Field::LimitRate),
            ("X-Accel-Charset", Field::Charset),
            ("content-type", Field::ContentType),
            ("Location", Field::Location),
            ("Refresh", Field::Refresh),
            ("Set-Cookie", Field::SetCookie),
        ];
        for (name, kind) in named {
            assert_eq!(Field::of(name), kind, "{name}");
        }
        // Against std's comparison: each name in every case at each byte, and with each
        // byte changed to each other value.
        for (name, kind) in named {
            let lower = name.to_ascii_lowercase().into_bytes();
            for i in 0..lower.len() {
                for c in 0..=255u8 {
                    let mut n = lower.clone();
                    n[i] = c;
                    let Ok(n) = String::from_utf8(n) else {
                        continue;
                    };
                    let want = if n.eq_ignore_ascii_case(name) {
                        kind
                    } else {
                        Field::Other
                    };
                    assert_eq!(Field::of(&n), want, "{n:?}");
                }
            }
        }
        for other in [
            "ETag",
            "Last-Modified",
            "Accept-Ranges",
            "X-Accel",
            "Dates",
            "Locatio",
            "",
        ] {
            assert_eq!(Field::of(other), Field::Other, "{other}");
        }
    }

    #[test]
    fn tables_follow_the_prefix() {
        for p in Proto::ALL {
            let table: &[gannet_conf::registry::Spec] = match p {
                Proto::FastCgi => super::super::fastcgi::DIRECTIVES,
                Proto::Scgi => super::super::scgi::DIRECTIVES,
                Proto::Uwsgi => super::super::uwsgi::DIRECTIVES,
                Proto::Http => super::super::proxy::DIRECTIVES,
                Proto::Memcached => super::super::memcached::DIRECTIVES,
                Proto::Grpc => super::super::grpc::DIRECTIVES,
            };
            assert!(table.iter().all(|s| s.name.starts_with(p.prefix())));
            for shared in ["pass", "param", "next_upstream", "hide_header"] {
                // memcached has nginx's subset: no params, no answer headers to pick.
                if (matches!(p, Proto::Http | Proto::Grpc) && shared == "param")
                    || (p == Proto::Memcached && matches!(shared, "param" | "hide_header"))
                {
                    continue;
                }
                let name = format!("{}{shared}", p.prefix());
                assert!(table.iter().any(|s| s.name == name), "{name}");
            }
        }
    }
}
