//! Core location settings: where files come from, request limits, timeouts and connection
//! behaviour.
//!
//! Directives: `root`, `alias`, `internal`, `client_max_body_size`,
//! `client_header_buffer_size`, `large_client_header_buffers`, `max_headers`,
//! `connection_pool_size`, `request_pool_size` (checked only), `client_header_timeout`,
//! `client_body_timeout`, `send_timeout`, `keepalive_timeout`, `keepalive_requests`,
//! `keepalive_time`, `keepalive_disable`, `auth_delay`, `post_action`, `subrequest_output_buffer_size`, `sendfile`, `tcp_nopush`, `tcp_nodelay`, `server_tokens`,
//! `log_not_found`, `absolute_redirect`, `port_in_redirect`, `server_name_in_redirect`,
//! `merge_slashes`, `underscores_in_headers`, `ignore_invalid_headers`, `max_ranges`,
//! `chunked_transfer_encoding`, `msie_refresh` (see [`msie_refresh`]), `log_subrequest`, `disable_symlinks`, `resolver`, `resolver_timeout` (the
//! name servers for names met at run time: `crate::resolver`).

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::sync::OnceLock;
use std::time::Duration;

const HSL: Ctx = Ctx::HSL;
const HS: Ctx = Ctx(Ctx::HTTP.0 | Ctx::SERVER.0);
/// Also allowed inside a location's `if`, as in nginx.
const HSLI: Ctx = Ctx::HSL.or(Ctx::IF);

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "root",
        ctx: HSLI,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "alias",
        ctx: Ctx::LOCATION,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "internal",
        ctx: Ctx::LOCATION,
        args: Args::Exactly(0),
        block: false,
    },
    Spec {
        name: "client_max_body_size",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "client_header_buffer_size",
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "large_client_header_buffers",
        ctx: HS,
        args: Args::Exactly(2),
        block: false,
    },
    Spec {
        name: "connection_pool_size",
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "request_pool_size",
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "max_headers",
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "client_header_timeout",
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "client_body_timeout",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "send_timeout",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "keepalive_timeout",
        ctx: HSL,
        args: Args::Between(1, 2),
        block: false,
    },
    Spec {
        name: "keepalive_requests",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "keepalive_time",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "keepalive_disable",
        ctx: HSL,
        args: Args::AtLeast(1),
        block: false,
    },
    Spec {
        name: "auth_delay",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "subrequest_output_buffer_size",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "post_action",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "sendfile",
        ctx: HSLI,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "tcp_nopush",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "tcp_nodelay",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "server_tokens",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "log_not_found",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "absolute_redirect",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "port_in_redirect",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "server_name_in_redirect",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "resolver",
        ctx: HSL,
        args: Args::AtLeast(1),
        block: false,
    },
    Spec {
        name: "resolver_timeout",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "merge_slashes",
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "underscores_in_headers",
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "ignore_invalid_headers",
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "max_ranges",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "chunked_transfer_encoding",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "msie_refresh",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "log_subrequest",
        ctx: HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "disable_symlinks",
        ctx: HSL,
        args: Args::Between(1, 2),
        block: false,
    },
];

/// nginx's smallest memory pool on 64-bit systems (`NGX_MIN_POOL_SIZE`), which
/// `connection_pool_size` and `request_pool_size` are checked against.
const MIN_POOL_SIZE: u64 = 112;

/// `keepalive_disable msie6`.
pub const KEEPALIVE_MSIE6: u8 = 1;
/// `keepalive_disable safari`.
pub const KEEPALIVE_SAFARI: u8 = 2;

/// `disable_symlinks`' mode, and its `from=` part (a template, often `$document_root`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymlinkMode {
    Off,
    On,
    IfNotOwner,
}

#[derive(Debug, Clone, Default)]
pub struct CoreConf {
    pub root: Option<Template>,
    pub alias: Option<Template>,
    /// The prefix of the location that set `alias` (what the alias replaces in the URI),
    /// kept with it into nested locations, as nginx's `clcf->alias` length; `None` for an
    /// alias set in a regex location.
    pub alias_of: Option<std::sync::Arc<str>>,
    pub internal: bool,
    pub client_max_body_size: Option<u64>,
    pub client_header_buffer_size: Option<usize>,
    pub large_client_header_buffers: Option<(usize, usize)>,
    /// `max_headers`: the most header fields a request may have (taken from the address's
    /// default server, as the buffer sizes).
    pub max_headers: Option<usize>,
    pub client_header_timeout: Option<Duration>,
    pub client_body_timeout: Option<Duration>,
    pub send_timeout: Option<Duration>,
    /// (idle timeout, optional `Keep-Alive: timeout=` header value)
    pub keepalive_timeout: Option<(Duration, Option<u64>)>,
    pub keepalive_requests: Option<u64>,
    pub keepalive_time: Option<Duration>,
    /// `keepalive_disable`: the browsers whose requests close the connection
    /// ([`KEEPALIVE_MSIE6`], [`KEEPALIVE_SAFARI`]).
    pub keepalive_disable: Option<u8>,
    /// `auth_delay`: how long a 401 from the access phase is held back.
    pub auth_delay: Option<Duration>,
    /// `post_action`: a URI or named location the request also goes to, its answer
    /// dropped (`conn::mirror`).
    pub post_action: Option<std::sync::Arc<str>>,
    /// `subrequest_output_buffer_size`: the most of a subrequest's answer kept in memory
    /// (SSI's `include ... set=`).
    pub subrequest_output_buffer_size: Option<usize>,
    pub sendfile: Option<bool>,
    pub tcp_nodelay: Option<bool>,
    pub server_tokens: Option<bool>,
    pub log_not_found: Option<bool>,
    pub absolute_redirect: Option<bool>,
    pub port_in_redirect: Option<bool>,
    pub server_name_in_redirect: Option<bool>,
    pub merge_slashes: Option<bool>,
    pub underscores_in_headers: Option<bool>,
    pub ignore_invalid_headers: Option<bool>,
    /// Most ranges answered with a 206; `None`: no limit (nginx's default).
    pub max_ranges: Option<u32>,
    pub chunked_transfer_encoding: Option<bool>,
    /// `msie_refresh`: MSIE clients get a redirect as a page that refreshes to it.
    pub msie_refresh: Option<bool>,
    /// `log_subrequest`: subrequests (auth_request, SSI includes, additions) are logged too.
    pub log_subrequest: Option<bool>,
    pub disable_symlinks: Option<(SymlinkMode, Option<Template>)>,
    /// `resolver`: the name servers for names met at run time.
    pub resolver: Option<std::sync::Arc<crate::resolver::Resolver>>,
    pub resolver_timeout: Option<Duration>,
}

impl CoreConf {
    pub fn merge(&mut self, p: &CoreConf) {
        // `internal` belongs to one location. `root` and `alias` are one setting: a
        // location with either inherits neither (nested locations of an aliased location
        // inherit the alias in nginx, with the prefix it replaces).
        if self.root.is_none() && self.alias.is_none() {
            self.root = p.root.clone();
            self.alias = p.alias.clone();
            self.alias_of = p.alias_of.clone();
        }
        inherit!(
            self,
            p,
            client_max_body_size,
            client_header_buffer_size,
            large_client_header_buffers,
            max_headers,
            client_header_timeout,
            client_body_timeout,
            send_timeout,
            keepalive_timeout,
            keepalive_requests,
            keepalive_time,
            keepalive_disable,
            auth_delay,
            post_action,
            subrequest_output_buffer_size,
            sendfile,
            tcp_nodelay,
            server_tokens,
            log_not_found,
            absolute_redirect,
            port_in_redirect,
            server_name_in_redirect,
            merge_slashes,
            underscores_in_headers,
            ignore_invalid_headers,
            max_ranges,
            chunked_transfer_encoding,
            msie_refresh,
            log_subrequest,
            disable_symlinks,
            resolver,
            resolver_timeout
        );
    }

    /// The loader gives the http level a root (nginx's `PREFIX/html`), so every merged
    /// location has one; the fallback only serves a LocConf built outside the loader.
    pub fn root(&self) -> &Template {
        static HTML: OnceLock<Template> = OnceLock::new();
        self.root
            .as_ref()
            .unwrap_or_else(|| HTML.get_or_init(|| Template::literal("html")))
    }
    pub fn resolver_timeout(&self) -> Duration {
        self.resolver_timeout
            .unwrap_or(crate::resolver::DEFAULT_TIMEOUT)
    }
    pub fn client_max_body_size(&self) -> u64 {
        self.client_max_body_size.unwrap_or(1024 * 1024)
    }
    pub fn client_header_buffer_size(&self) -> usize {
        self.client_header_buffer_size.unwrap_or(1024)
    }
    pub fn large_client_header_buffers(&self) -> (usize, usize) {
        self.large_client_header_buffers.unwrap_or((4, 8192))
    }
    /// nginx's default is a memory page: 4k here.
    pub fn subrequest_output_buffer_size(&self) -> usize {
        self.subrequest_output_buffer_size.unwrap_or(4096)
    }
    pub fn max_headers(&self) -> usize {
        self.max_headers.unwrap_or(1000)
    }
    pub fn client_header_timeout(&self) -> Duration {
        self.client_header_timeout
            .unwrap_or(Duration::from_secs(60))
    }
    pub fn client_body_timeout(&self) -> Duration {
        self.client_body_timeout.unwrap_or(Duration::from_secs(60))
    }
    pub fn send_timeout(&self) -> Duration {
        self.send_timeout.unwrap_or(Duration::from_secs(60))
    }
    pub fn keepalive_timeout(&self) -> (Duration, Option<u64>) {
        self.keepalive_timeout
            .unwrap_or((Duration::from_secs(75), None))
    }
    /// 0 means unlimited (gannet extension; nginx has no unlimited value).
    pub fn keepalive_requests(&self) -> u64 {
        self.keepalive_requests.unwrap_or(1000)
    }
    pub fn keepalive_time(&self) -> Duration {
        self.keepalive_time.unwrap_or(Duration::from_secs(3600))
    }
    /// Whether this request's browser gets no keep-alive (nginx's default: MSIE 4-6 after
    /// a POST, which it may wait on over a kept connection). The User-Agent is looked at
    /// only when a browser is disabled and could match.
    pub fn keepalive_disabled(&self, head: &gannet_proto::h1::RequestHead) -> bool {
        let mask = self.keepalive_disable.unwrap_or(KEEPALIVE_MSIE6);
        if mask == 0 {
            return false;
        }
        let Some(ua) = head.header("user-agent") else {
            return false;
        };
        let post = head.method_str() == "POST";
        (mask & KEEPALIVE_MSIE6 != 0 && post && crate::http::browser::is_msie6(ua))
            || (mask & KEEPALIVE_SAFARI != 0 && crate::http::browser::is_safari(ua))
    }
    pub fn sendfile(&self) -> bool {
        self.sendfile.unwrap_or(false)
    }
    pub fn tcp_nodelay(&self) -> bool {
        self.tcp_nodelay.unwrap_or(true)
    }
    pub fn merge_slashes(&self) -> bool {
        self.merge_slashes.unwrap_or(true)
    }
    pub fn server_tokens(&self) -> bool {
        self.server_tokens.unwrap_or(true)
    }
    pub fn log_not_found(&self) -> bool {
        self.log_not_found.unwrap_or(true)
    }
    pub fn absolute_redirect(&self) -> bool {
        self.absolute_redirect.unwrap_or(true)
    }
    pub fn port_in_redirect(&self) -> bool {
        self.port_in_redirect.unwrap_or(true)
    }
    pub fn server_name_in_redirect(&self) -> bool {
        self.server_name_in_redirect.unwrap_or(false)
    }
    /// The header-name policy. Like the buffer sizes, it is read from the default server
    /// of the address, since the names are checked before the Host header picks a server.
    pub fn header_names(&self) -> gannet_proto::h1::HeaderNames {
        gannet_proto::h1::HeaderNames {
            underscores: self.underscores_in_headers.unwrap_or(false),
            ignore_invalid: self.ignore_invalid_headers.unwrap_or(true),
        }
    }
    pub fn msie_refresh(&self) -> bool {
        self.msie_refresh.unwrap_or(false)
    }
    pub fn chunked_transfer_encoding(&self) -> bool {
        self.chunked_transfer_encoding.unwrap_or(true)
    }
    pub fn log_subrequest(&self) -> bool {
        self.log_subrequest.unwrap_or(false)
    }
}

fn size(d: &Directive, i: usize) -> Result<u64, ConfError> {
    setters::size(&d.args[i]).ok_or_else(|| invalid(d, &d.args[i]))
}

fn duration(d: &Directive, i: usize) -> Result<Duration, ConfError> {
    setters::msec(&d.args[i])
        .map(Duration::from_millis)
        .ok_or_else(|| invalid(d, &d.args[i]))
}

fn template(d: &Directive) -> Result<Template, ConfError> {
    Template::compile(&d.args[0]).map_err(|e| d.error(e))
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.core;
    let dup = |d: &Directive| d.error(format!("\"{}\" directive is duplicate", d.name));
    match d.name.as_str() {
        "root" | "alias" => {
            if c.root.is_some() || c.alias.is_some() {
                let other = if c.root.is_some() { "root" } else { "alias" };
                return Err(if other == d.name {
                    dup(d)
                } else {
                    d.error(format!("\"{}\" directive is duplicate, \"{other}\" directive was specified earlier", d.name))
                });
            }
            // A relative root is relative to the prefix, as in nginx.
            let path = if d.args[0].starts_with('/') || d.args[0].starts_with('$') {
                d.args[0].clone()
            } else {
                ctx.prefix.join(&d.args[0]).to_string_lossy().into_owned()
            };
            let mut t = Directive {
                args: vec![path],
                ..d.clone()
            };
            // nginx strips a trailing slash from root (not from alias).
            if d.name == "root" && t.args[0].len() > 1 && t.args[0].ends_with('/') {
                t.args[0].pop();
            }
            let tpl = template(&t)?;
            if d.name == "root" {
                c.root = Some(tpl)
            } else {
                c.alias = Some(tpl)
            }
        }
        "internal" => c.internal = true,
        "client_max_body_size" => c.client_max_body_size = Some(size(d, 0)?),
        "client_header_buffer_size" => c.client_header_buffer_size = Some(size(d, 0)? as usize),
        "large_client_header_buffers" => {
            let n = d.args[0]
                .parse::<usize>()
                .map_err(|_| invalid(d, &d.args[0]))?;
            let s = size(d, 1)? as usize;
            if n == 0 || s == 0 {
                return Err(invalid(d, &d.args[0]));
            }
            c.large_client_header_buffers = Some((n, s));
        }
        // nginx sizes its memory pools with these; gannet has no such pools, so they are
        // checked as nginx checks them and then have nothing to size.
        "connection_pool_size" | "request_pool_size" => {
            let n = setters::size(&d.args[0])
                .ok_or_else(|| d.error(format!("\"{}\" directive invalid value", d.name)))?;
            if n < MIN_POOL_SIZE {
                return Err(d.error(format!(
                    "the pool size must be no less than {MIN_POOL_SIZE}"
                )));
            }
            if n % 16 != 0 {
                return Err(d.error("the pool size must be a multiple of 16"));
            }
        }
        "max_headers" => {
            if c.max_headers.is_some() {
                return Err(dup(d));
            }
            let n = d.args[0]
                .parse()
                .map_err(|_| d.error(format!("\"{}\" directive invalid number", d.name)))?;
            c.max_headers = Some(n);
        }
        "client_header_timeout" => c.client_header_timeout = Some(duration(d, 0)?),
        "client_body_timeout" => c.client_body_timeout = Some(duration(d, 0)?),
        "send_timeout" => c.send_timeout = Some(duration(d, 0)?),
        "keepalive_timeout" => {
            let header = match d.args.get(1) {
                Some(h) => Some(setters::sec(h).ok_or_else(|| invalid(d, h))?),
                None => None,
            };
            c.keepalive_timeout = Some((duration(d, 0)?, header));
        }
        "keepalive_requests" => {
            c.keepalive_requests = Some(d.args[0].parse().map_err(|_| invalid(d, &d.args[0]))?)
        }
        "keepalive_time" => c.keepalive_time = Some(duration(d, 0)?),
        "auth_delay" => c.auth_delay = Some(duration(d, 0)?),
        "post_action" => {
            if c.post_action.is_some() {
                return Err(dup(d));
            }
            c.post_action = Some(d.args[0].as_str().into());
        }
        "subrequest_output_buffer_size" => {
            c.subrequest_output_buffer_size = Some(size(d, 0)? as usize)
        }
        // A bitmask as nginx's: names in any case, a second directive adds to the first.
        "keepalive_disable" => {
            let mut mask = c.keepalive_disable.unwrap_or(0);
            for a in &d.args {
                mask |= match a.to_ascii_lowercase().as_str() {
                    "none" => 0,
                    "msie6" => KEEPALIVE_MSIE6,
                    "safari" => KEEPALIVE_SAFARI,
                    _ => return Err(d.error(format!("invalid value \"{a}\""))),
                };
            }
            c.keepalive_disable = Some(mask);
        }
        "sendfile" => c.sendfile = Some(setters::flag(d)?),
        // Checked, then nothing to keep: a head ahead of a file always goes with MSG_MORE
        // (`conn::send`), which is what `tcp_nopush on` asks nginx for.
        "tcp_nopush" => {
            setters::flag(d)?;
        }
        "tcp_nodelay" => c.tcp_nodelay = Some(setters::flag(d)?),
        "server_tokens" => {
            c.server_tokens = Some(match d.args[0].as_str() {
                "on" => true,
                "off" | "build" => false,
                v => return Err(invalid(d, v)),
            })
        }
        "log_not_found" => c.log_not_found = Some(setters::flag(d)?),
        "absolute_redirect" => c.absolute_redirect = Some(setters::flag(d)?),
        "port_in_redirect" => c.port_in_redirect = Some(setters::flag(d)?),
        "server_name_in_redirect" => c.server_name_in_redirect = Some(setters::flag(d)?),
        "merge_slashes" => c.merge_slashes = Some(setters::flag(d)?),
        "underscores_in_headers" => c.underscores_in_headers = Some(setters::flag(d)?),
        "ignore_invalid_headers" => c.ignore_invalid_headers = Some(setters::flag(d)?),
        "max_ranges" => c.max_ranges = Some(d.args[0].parse().map_err(|_| invalid(d, &d.args[0]))?),
        "chunked_transfer_encoding" => c.chunked_transfer_encoding = Some(setters::flag(d)?),
        "msie_refresh" => c.msie_refresh = Some(setters::flag(d)?),
        "log_subrequest" => c.log_subrequest = Some(setters::flag(d)?),
        "disable_symlinks" => {
            if c.disable_symlinks.is_some() {
                return Err(dup(d));
            }
            c.disable_symlinks = Some(disable_symlinks(d)?);
        }
        "resolver" => {
            if c.resolver.is_some() {
                return Err(dup(d));
            }
            c.resolver = Some(std::sync::Arc::new(crate::resolver::parse(d)?));
        }
        "resolver_timeout" => {
            c.resolver_timeout = Some(Duration::from_millis(setters::msec_arg(d, 0)?));
        }
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// `disable_symlinks off | on | if_not_owner [from=part]`, with nginx's checks and words.
fn disable_symlinks(d: &Directive) -> Result<(SymlinkMode, Option<Template>), ConfError> {
    let mut mode = None;
    let mut from = None;
    for a in &d.args {
        match a.as_str() {
            "off" => mode = Some(SymlinkMode::Off),
            "on" => mode = Some(SymlinkMode::On),
            "if_not_owner" => mode = Some(SymlinkMode::IfNotOwner),
            _ => match a.strip_prefix("from=") {
                Some(v) => from = Some(Template::compile(v).map_err(|e| d.error(e))?),
                None => return Err(d.error(format!("invalid parameter \"{a}\""))),
            },
        }
    }
    let Some(mode) = mode else {
        return Err(d.error(format!(
            "\"{}\" must have \"off\", \"on\" or \"if_not_owner\" parameter",
            d.name
        )));
    };
    if d.args.len() == 2 && from.is_none() {
        return Err(d.error(format!(
            "duplicate parameters \"{} {}\"",
            d.args[0], d.args[1]
        )));
    }
    if mode == SymlinkMode::Off && from.is_some() {
        return Err(d.error("\"from=\" cannot be used with \"off\" parameter"));
    }
    Ok((mode, from))
}

/// `msie_refresh on`: nginx's own 301 / 302 (a `return`, an `error_page` redirect) to an
/// MSIE client (its User-Agent says `MSIE ` with something after) is a 200 page whose meta
/// refresh goes to the Location, as ngx_http_send_refresh: the Location header goes, the
/// URL is escaped as nginx's NGX_ESCAPE_REFRESH (controls, space, quotes, non-ASCII).
pub fn msie_refresh(
    req: &crate::http::request::Request,
    resp: &mut crate::http::response::Response,
) {
    if !resp.special || !matches!(resp.status, 301 | 302) || !req.conf.core.msie_refresh() {
        return;
    }
    let msie = req
        .head
        .header("user-agent")
        .is_some_and(|ua| memchr::memmem::find(ua, b"MSIE ").is_some_and(|at| at + 7 < ua.len()));
    if !msie {
        return;
    }
    let Some(location) = resp.location.take() else {
        return;
    };
    let mut body = String::from("<html><head><meta http-equiv=\"Refresh\" content=\"0; URL=");
    for &b in location.as_bytes() {
        if b <= b' ' || b == b'"' || b == b'\'' || b >= 0x7f {
            body.push_str(&format!("%{b:02X}"));
        } else {
            body.push(b as char);
        }
    }
    body.push_str("\"></head><body></body></html>\r\n");
    let mut page = crate::http::response::Response::new(200);
    page.content_type = Some(std::sync::Arc::from("text/html"));
    page.body = crate::http::response::Body::bytes(bytes::Bytes::from(body));
    page.special = true;
    *resp = page;
}
