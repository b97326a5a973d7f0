//! The HTTP reverse proxy, the configuration side (nginx's ngx_http_proxy_module), and the
//! request it sends upstream. It is the fourth protocol of the gateway machinery
//! (`gateway`, `conn::gateway`): the same upstream groups, retries, timeouts and header
//! lists as FastCGI, SCGI and uwsgi, with HTTP/1.x on the wire, over TCP, a unix socket, or
//! TLS for `https://` URLs (whose `proxy_ssl_*` directives are in `proxy_ssl`), or HTTP/2
//! with `proxy_http_version 2` (`conn::proxy_h2`, with the same fields: [`fields`]).
//!
//! Directives: `proxy_pass`, `proxy_set_header`, `proxy_http_version`, `proxy_pass_trailers`,
//! `proxy_method`,
//! `proxy_set_body`, `proxy_redirect`, and the shared ones with the `proxy_` prefix
//! (`proxy_request_buffering`, `proxy_connect_timeout`, `proxy_send_timeout`, `proxy_read_timeout`,
//! `proxy_buffering`, `proxy_buffers`, `proxy_buffer_size`, `proxy_intercept_errors`,
//! `proxy_hide_header`, `proxy_pass_header`, `proxy_pass_request_headers`,
//! `proxy_pass_request_body`, `proxy_next_upstream`, `proxy_next_upstream_tries`,
//! `proxy_next_upstream_timeout`). Variables: `$proxy_host`, `$proxy_port`,
//! `$proxy_add_x_forwarded_for`.
//!
//! The request line's URI follows nginx's rules: `proxy_pass` without a URI passes the
//! client's URI as it was sent (or the normalised, re-escaped `$uri` once a rewrite or an
//! internal redirect changed it); with a URI, the part of the normalised URI that matched
//! the location's prefix is replaced by it. A URI part is refused in regex and named
//! locations and in `if` blocks, where no prefix matched. With variables in `proxy_pass`
//! the evaluated URL is used as it is, and its host may name an `upstream` group.
//!
//! Headers sent: `Host: $proxy_host` and `Connection: close` unless `proxy_set_header`
//! changes them, the other `proxy_set_header`s (an empty value sends nothing), then the
//! client's headers except the ones set here and the hop-by-hop ones (`Connection`,
//! `Keep-Alive`, `TE`, `Expect`, `Upgrade`, `Transfer-Encoding`, `Content-Length`). A body
//! read whole (`proxy_request_buffering on`, the default) goes with a `Content-Length`, a
//! chunked one included; one passed on as it arrives (`off`) goes with the client's
//! `Content-Length`, or chunked (HTTP/1.1 upstreams only; with 1.0 it is read whole).

use super::gateway::{self, spec, Backend, GatewayConf, Proto, Streamed};
use super::proxy_ssl::ProxySslConf;
use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::regex::Regex;
use crate::http::request::Request;
use crate::http::variables::Template;
use crate::tls::client::ClientTls;
use crate::upstream::{Addr, Upstream};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

const HSL: Ctx = Ctx::HSL;
const LOC_IF: Ctx = Ctx(Ctx::LOCATION.0 | Ctx::IF.0);

pub const DIRECTIVES: &[Spec] = &[
    spec("proxy_pass", LOC_IF.or(Ctx::LIMIT_EXCEPT), Args::Exactly(1)),
    spec("proxy_set_header", HSL, Args::Exactly(2)),
    spec("proxy_http_version", HSL, Args::Exactly(1)),
    spec("proxy_store", HSL, Args::Exactly(1)),
    spec("proxy_store_access", HSL, Args::Between(1, 3)),
    spec("proxy_pass_trailers", HSL, Args::Exactly(1)),
    spec("proxy_limit_rate", HSL, Args::Exactly(1)),
    spec("proxy_bind", HSL, Args::Between(1, 2)),
    spec("proxy_method", HSL, Args::Exactly(1)),
    spec("proxy_set_body", HSL, Args::Exactly(1)),
    spec("proxy_redirect", HSL, Args::Between(1, 2)),
    spec("proxy_connect_timeout", HSL, Args::Exactly(1)),
    spec("proxy_send_timeout", HSL, Args::Exactly(1)),
    spec("proxy_read_timeout", HSL, Args::Exactly(1)),
    spec("proxy_buffering", HSL, Args::Exactly(1)),
    spec("proxy_buffers", HSL, Args::Exactly(2)),
    spec("proxy_buffer_size", HSL, Args::Exactly(1)),
    spec("proxy_intercept_errors", HSL, Args::Exactly(1)),
    spec("proxy_hide_header", HSL, Args::Exactly(1)),
    spec("proxy_pass_header", HSL, Args::Exactly(1)),
    spec("proxy_pass_request_headers", HSL, Args::Exactly(1)),
    spec("proxy_pass_request_body", HSL, Args::Exactly(1)),
    spec("proxy_request_buffering", HSL, Args::Exactly(1)),
    spec("proxy_next_upstream", HSL, Args::AtLeast(1)),
    spec("proxy_next_upstream_tries", HSL, Args::Exactly(1)),
    spec("proxy_next_upstream_timeout", HSL, Args::Exactly(1)),
    spec("proxy_busy_buffers_size", HSL, Args::Exactly(1)),
    spec("proxy_ignore_headers", HSL, Args::AtLeast(1)),
    spec("proxy_socket_keepalive", HSL, Args::Exactly(1)),
    spec("proxy_ignore_client_abort", HSL, Args::Exactly(1)),
    spec("proxy_temp_path", HSL, Args::Between(1, 4)),
    spec("proxy_max_temp_file_size", HSL, Args::Exactly(1)),
    spec("proxy_temp_file_write_size", HSL, Args::Exactly(1)),
    spec("proxy_cache_path", Ctx::HTTP, Args::AtLeast(2)),
    spec("proxy_cache", HSL, Args::Exactly(1)),
    spec("proxy_cache_key", HSL, Args::Exactly(1)),
    spec("proxy_cache_valid", HSL, Args::AtLeast(1)),
    spec("proxy_cache_methods", HSL, Args::AtLeast(1)),
    spec("proxy_cache_min_uses", HSL, Args::Exactly(1)),
    spec("proxy_cache_bypass", HSL, Args::AtLeast(1)),
    spec("proxy_no_cache", HSL, Args::AtLeast(1)),
    spec("proxy_cache_use_stale", HSL, Args::AtLeast(1)),
    spec("proxy_cache_lock", HSL, Args::Exactly(1)),
    spec("proxy_cache_lock_age", HSL, Args::Exactly(1)),
    spec("proxy_cache_lock_timeout", HSL, Args::Exactly(1)),
    spec("proxy_cache_revalidate", HSL, Args::Exactly(1)),
    spec("proxy_cache_max_range_offset", HSL, Args::Exactly(1)),
    spec("proxy_force_ranges", HSL, Args::Exactly(1)),
    spec("proxy_cache_purge", HSL, Args::AtLeast(1)),
    spec("proxy_cache_background_update", HSL, Args::Exactly(1)),
    spec("proxy_cache_convert_head", HSL, Args::Exactly(1)),
];

/// Where `proxy_pass` sends requests.
#[derive(Debug, Clone)]
pub enum Target {
    Fixed(Dest),
    /// A URL with variables, evaluated per request; its host may name a group.
    Vars(Template, Arc<HashMap<String, Arc<Upstream>>>),
}

/// A parsed `proxy_pass` URL.
#[derive(Debug, Clone)]
pub struct Dest {
    pub backend: Backend,
    /// `https://`: the connection is TLS (`proxy_ssl_*`).
    pub tls: bool,
    /// `$proxy_host`: the group's name, or host with the port if the URL has one.
    pub host: String,
    pub port: u16,
    /// The URI part (from the `/` after the host), if the URL has one.
    pub uri: Option<String>,
    /// The URL without its URI part, for `proxy_redirect default`.
    pub base: String,
}

#[derive(Debug, Clone)]
pub enum Redirect {
    Off,
    Default,
    Rule(RedirectFrom, Template),
}

#[derive(Debug, Clone)]
pub enum RedirectFrom {
    Prefix(String),
    /// A prefix with variables, evaluated per answer (nginx's complex-value pattern).
    Vars(Template),
    Regex(Regex),
}

/// The proxy's share of a location's settings.
#[derive(Debug, Clone, Default)]
pub struct ProxyConf {
    /// The shared settings; `gw.pass` marks the location as proxied.
    pub gw: GatewayConf,
    /// Set with `proxy_pass`, in the location itself only.
    pub target: Option<Arc<Target>>,
    pub set_headers: Option<Arc<Vec<(String, Template)>>>,
    /// `proxy_http_version`: 1.0 (the default), 1.1 or 2 (`conn::proxy_h2`).
    pub http_version: Option<HttpVersion>,
    /// `proxy_pass_trailers`: the answer's trailer fields go on to the client.
    pub pass_trailers: Option<bool>,
    /// `proxy_limit_rate`: bytes a second the answer is read from the server at (0: no
    /// limit).
    pub limit_rate: Option<u64>,
    /// `proxy_bind`: the local address connections to servers are made from; `Some(None)`
    /// is `off`.
    pub bind: Option<Option<Arc<Bind>>>,
    pub method: Option<Template>,
    pub body: Option<Template>,
    pub redirect: Option<Arc<Vec<Redirect>>>,
    /// `proxy_ssl_*`.
    pub ssl: ProxySslConf,
    /// `proxy_cookie_*`.
    pub cookie: super::proxy_cookie::ProxyCookieConf,
    /// `proxy_cache_convert_head`: a HEAD that may be cached goes upstream as a GET.
    pub convert_head: Option<bool>,
    /// The TLS client setup built from `ssl` for a location that may proxy to `https://`
    /// (`proxy_ssl::finish`, after the merge; not inherited).
    pub client_tls: Option<Arc<ClientTls>>,
}

impl ProxyConf {
    pub fn merge(&mut self, parent: &ProxyConf) {
        self.gw.merge(&parent.gw);
        self.ssl.merge(&parent.ssl);
        self.cookie.merge(&parent.cookie);
        inherit!(
            self,
            parent,
            set_headers,
            http_version,
            pass_trailers,
            limit_rate,
            bind,
            method,
            body,
            redirect,
            convert_head
        );
    }
    pub fn limit_rate(&self) -> u64 {
        self.limit_rate.unwrap_or(0)
    }
    /// HTTP/1.1 or HTTP/2 upstream: a body of unknown length can be passed on as it comes.
    pub fn http11(&self) -> bool {
        self.http_version.is_some_and(|v| v != HttpVersion::V10)
    }
    /// `proxy_http_version 2`.
    pub fn http2(&self) -> bool {
        self.http_version == Some(HttpVersion::V2)
    }
    pub fn pass_trailers(&self) -> bool {
        self.pass_trailers.unwrap_or(false)
    }
}

/// `proxy_http_version`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersion {
    V10,
    V11,
    V2,
}

/// `proxy_bind address [transparent]`: an address, with a port or not, or a value with
/// variables that is one when evaluated (empty: none).
#[derive(Debug)]
pub struct Bind {
    addr: Template,
    /// IP_TRANSPARENT: the address need not be one of this host's (needs root).
    pub transparent: bool,
}

impl Bind {
    /// The local address for this request's connections: `None` when the value is empty,
    /// or not an address (logged, as nginx, which then connects from anywhere).
    pub fn local(&self, req: &Request) -> Option<std::net::SocketAddr> {
        let v = self.addr.eval(req, None);
        if v.is_empty() {
            return None;
        }
        let a = local_addr(&v);
        if a.is_none() {
            crate::errlog::request(
                crate::errlog::Level::Error,
                req,
                format_args!("invalid local address \"{v}\""),
            );
        }
        a
    }
}

/// `ADDR` or `ADDR:PORT` (`[V6]:PORT`), as nginx's ngx_parse_addr_port.
fn local_addr(s: &str) -> Option<std::net::SocketAddr> {
    use std::net::{IpAddr, SocketAddr};
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, 0));
    }
    s.parse().ok()
}

fn bind(d: &Directive) -> Result<Option<Arc<Bind>>, ConfError> {
    let a0 = d.args[0].as_str();
    if a0 == "off" && d.args.len() == 1 {
        return Ok(None);
    }
    let transparent = match d.args.get(1).map(String::as_str) {
        None => false,
        Some("transparent") => true,
        Some(other) => return Err(d.error(format!("invalid parameter \"{other}\""))),
    };
    let addr = Template::compile(a0).map_err(|e| d.error(e))?;
    if !addr.has_vars() && local_addr(a0).is_none() {
        return Err(d.error(format!("invalid address \"{a0}\"")));
    }
    Ok(Some(Arc::new(Bind { addr, transparent })))
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let a0 = d.args[0].as_str();
    match d.name.as_str() {
        "proxy_pass" => {
            if let Some(other) = gateway::active(lc) {
                return Err(d.error(format!(
                    "\"proxy_pass\" directive is duplicate{}",
                    if other == Proto::Http {
                        String::new()
                    } else {
                        format!(": \"{}pass\" is set in this location", other.prefix())
                    }
                )));
            }
            let target = parse_target(d, a0, ctx)?;
            lc.proxy.gw.pass = Some(match &target {
                Target::Fixed(dest) => dest.backend.clone(),
                Target::Vars(..) => Backend::Dynamic,
            });
            lc.proxy.target = Some(Arc::new(target));
        }
        "proxy_set_header" => {
            let value = Template::compile(&d.args[1]).map_err(|e| d.error(e))?;
            let mut l = lc.proxy.set_headers.as_deref().cloned().unwrap_or_default();
            l.push((a0.to_string(), value));
            lc.proxy.set_headers = Some(Arc::new(l));
        }
        "proxy_limit_rate" => {
            let bad = || d.error(format!("\"{}\" directive invalid value", d.name));
            lc.proxy.limit_rate = Some(gannet_conf::setters::size(a0).ok_or_else(bad)?)
        }
        "proxy_bind" => {
            if lc.proxy.bind.is_some() {
                return Err(d.error("\"proxy_bind\" directive is duplicate"));
            }
            lc.proxy.bind = Some(bind(d)?);
        }
        "proxy_http_version" => {
            lc.proxy.http_version = Some(match a0 {
                "1.0" => HttpVersion::V10,
                "1.1" => HttpVersion::V11,
                "2" => HttpVersion::V2,
                _ => return Err(invalid(d, a0)),
            })
        }
        "proxy_method" => {
            lc.proxy.method = Some(Template::compile(a0).map_err(|e| d.error(e))?);
        }
        "proxy_set_body" => {
            lc.proxy.body = Some(Template::compile(a0).map_err(|e| d.error(e))?);
        }
        "proxy_redirect" => set_redirect(d, &mut lc.proxy)?,
        "proxy_pass_trailers" => {
            lc.proxy.pass_trailers = Some(gannet_conf::setters::flag(d)?);
        }
        "proxy_cache_convert_head" => {
            lc.proxy.convert_head = Some(gannet_conf::setters::flag(d)?);
        }
        _ => {
            if !gateway::set(d, Proto::Http, lc, ctx)? {
                unreachable!("not a proxy directive: {}", d.name)
            }
        }
    }
    Ok(())
}

fn set_redirect(d: &Directive, c: &mut ProxyConf) -> Result<(), ConfError> {
    let a0 = d.args[0].as_str();
    let mut list = c.redirect.as_deref().cloned().unwrap_or_default();
    let rule = match (a0, d.args.get(1)) {
        ("off", None) => {
            // `off` cancels the rules of this level, as in nginx.
            c.redirect = Some(Arc::new(vec![Redirect::Off]));
            return Ok(());
        }
        ("default", None) => Redirect::Default,
        (_, None) => return Err(invalid(d, a0)),
        (from, Some(to)) => {
            let to = Template::compile(to).map_err(|e| d.error(e))?;
            let from = if let Some(re) = from.strip_prefix("~*") {
                RedirectFrom::Regex(compile_ci(d, re, true)?)
            } else if let Some(re) = from.strip_prefix('~') {
                RedirectFrom::Regex(compile_ci(d, re, false)?)
            } else if from.contains('$') {
                RedirectFrom::Vars(Template::compile(from).map_err(|e| d.error(e))?)
            } else {
                RedirectFrom::Prefix(from.to_string())
            };
            Redirect::Rule(from, to)
        }
    };
    list.retain(|r| !matches!(r, Redirect::Off));
    list.push(rule);
    c.redirect = Some(Arc::new(list));
    Ok(())
}

pub fn compile_ci(d: &Directive, re: &str, ci: bool) -> Result<Regex, ConfError> {
    Regex::new(re, ci).map_err(|e| d.error(e))
}

fn parse_target(d: &Directive, url: &str, ctx: &mut LoadCtx) -> Result<Target, ConfError> {
    if url.contains('$') {
        let t = Template::compile(url).map_err(|e| d.error(e))?;
        return Ok(Target::Vars(t, Arc::new(ctx.upstreams.clone())));
    }
    let mut dest = parse_url(url, &ctx.upstreams).map_err(|e| d.error(e))?;
    if let Backend::Addr(Addr::Tcp(hp)) = &dest.backend {
        if let Some(group) = gateway::implicit_group(ctx, hp) {
            dest.backend = group;
        }
    }
    if dest.uri.is_some() && ctx.prefixless {
        return Err(d.error(
            "\"proxy_pass\" cannot have URI part in location given by regular expression, \
             or inside named location, or inside \"if\" statement",
        ));
    }
    Ok(Target::Fixed(dest))
}

/// `http://host[:port][/uri]`, `http://unix:/path:[/uri]` or `http://group[/uri]`, and the
/// same with `https://` (port 443 unless given).
pub fn parse_url(url: &str, groups: &HashMap<String, Arc<Upstream>>) -> Result<Dest, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        return Err(format!("invalid URL prefix in \"{url}\""));
    };
    let scheme = if tls { "https" } else { "http" };
    let default_port = if tls { 443 } else { 80 };
    if let Some(path) = rest.strip_prefix("unix:") {
        // The socket path ends at the first `:` (nginx's rule); the URI follows it.
        let (sock, uri) = match path.split_once(':') {
            Some((s, u)) => (s, (!u.is_empty()).then(|| u.to_string())),
            None => (path, None),
        };
        if sock.is_empty() {
            return Err(format!("no path in the unix domain socket \"{url}\""));
        }
        return Ok(Dest {
            backend: Backend::Addr(Addr::Unix(sock.into())),
            tls,
            host: "localhost".into(),
            port: default_port,
            uri,
            base: format!("{scheme}://unix:{sock}:"),
        });
    }
    let (authority, uri) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_string())),
        None => (rest, None),
    };
    if authority.is_empty() {
        return Err(format!("no host in \"{url}\""));
    }
    let base = format!("{scheme}://{authority}");
    if let Some(up) = groups.get(authority) {
        return Ok(Dest {
            backend: Backend::Group(up.clone()),
            tls,
            host: authority.to_string(),
            port: default_port,
            uri,
            base,
        });
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            let port = p
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("invalid port in \"{url}\""))?;
            (h, port)
        }
        _ => (authority, default_port),
    };
    if host.is_empty() {
        return Err(format!("no host in \"{url}\""));
    }
    let host_port = format!("{host}:{port}");
    // A name some `proxy_pass` made an implicit group of (found by a URL with variables).
    let backend = match groups.get(&host_port) {
        Some(up) => Backend::Group(up.clone()),
        None => Backend::Addr(Addr::Tcp(host_port.into())),
    };
    Ok(Dest {
        backend,
        tls,
        host: authority.to_string(),
        port,
        uri,
        base,
    })
}

impl Target {
    /// Whether the URL has variables (its host is known per request).
    pub fn vars(&self) -> bool {
        matches!(self, Target::Vars(..))
    }

    /// Where this request goes: borrowed from the config for a fixed URL (no copy per
    /// request), made for the request from a URL with variables; `Err` with the reason for
    /// the log when that is not a valid one.
    pub fn dest(&self, req: &Request) -> Result<Cow<'_, Dest>, String> {
        match self {
            Target::Fixed(d) => Ok(Cow::Borrowed(d)),
            Target::Vars(t, groups) => parse_url(&t.eval(req, None), groups).map(Cow::Owned),
        }
    }
}

/// `$proxy_host` / `$proxy_port` for a request in a proxied location: `f` of them, borrowed
/// (no copy per request: `$proxy_host` is in the default cache key).
pub fn host_and_port<R>(req: &Request, f: impl FnOnce(&str, u16) -> R) -> Option<R> {
    let dest = req.conf.proxy.target.as_ref()?.dest(req).ok()?;
    Some(f(&dest.host, dest.port))
}

/// `$proxy_add_x_forwarded_for`: the client's X-Forwarded-For with its address added.
pub fn add_x_forwarded_for(req: &Request, out: &mut String) {
    for v in req.head.header_all("x-forwarded-for") {
        out.push_str(&String::from_utf8_lossy(v));
        out.push_str(", ");
    }
    if req.unix_client() {
        out.push_str("unix:");
    } else {
        out.push_str(&req.client().ip().to_string());
    }
}

/// The request line's URI (see the module docs), written to `out`.
pub(crate) fn upstream_uri(req: &Request, dest: &Dest, vars: bool, out: &mut Vec<u8>) {
    if vars {
        if let Some(u) = &dest.uri {
            out.extend_from_slice(u.as_bytes());
            return;
        }
    }
    if dest.uri.is_none() && !req.uri_changed {
        let raw = req.head.target();
        // An absolute-form target (`http://host/path`) is passed as origin-form.
        let raw = match raw.windows(3).position(|w| w == b"://") {
            Some(i) if !raw.starts_with(b"/") => {
                let rest = &raw[i + 3..];
                rest.iter()
                    .position(|&c| c == b'/')
                    .map_or(&b"/"[..], |p| &rest[p..])
            }
            _ => raw,
        };
        out.extend_from_slice(String::from_utf8_lossy(raw).as_bytes());
        return;
    }
    let mut uri = req.uri.as_str();
    // After a rewrite with `break` the URI no longer starts with the location's prefix:
    // the whole changed URI goes, without the URI part (nginx's `valid_location`).
    if let (Some(part), true) = (&dest.uri, req.location_valid) {
        let prefix = req.location.as_ref().map_or("", |l| l.prefix());
        uri = uri.get(prefix.len()..).unwrap_or("");
        out.extend_from_slice(part.as_bytes());
    }
    escape_uri(uri, out);
    if let Some(a) = &req.args {
        out.push(b'?');
        out.extend_from_slice(a.as_bytes());
    }
}

/// nginx's NGX_ESCAPE_URI set (1.22's, after RFC 3986): space, `#`, `%`, `?`, the
/// characters a URI may not hold unescaped (`"`, `<`, `>`, `\`, `^`, `` ` ``, `{`, `|`,
/// `}`), controls and bytes above 0x7e.
pub(crate) fn escape_uri(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &c in s.as_bytes() {
        if c <= b' '
            || c >= 0x7f
            || matches!(
                c,
                b'#' | b'%' | b'?' | b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
            )
        {
            out.extend_from_slice(&[b'%', HEX[usize::from(c >> 4)], HEX[usize::from(c & 15)]]);
        } else {
            out.push(c);
        }
    }
}

/// Client headers never passed on as they are: hop-by-hop ones and the framing, which the
/// proxy sets itself.
const HOP: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "te",
    "expect",
    "upgrade",
    "transfer-encoding",
    "content-length",
    "proxy-connection",
];

/// What goes upstream besides the fields, for HTTP/1.x and HTTP/2 alike: the method, the
/// body (`proxy_set_body`'s, the client's, or none), and how a body sent after the head
/// is framed.
pub struct Outline<'r> {
    pub method: Cow<'r, str>,
    /// `proxy_set_body`'s value, sent in place of the client's body.
    pub set_body: Option<String>,
    /// A body goes (and so a Content-Length, when its length is known).
    pub has_body: bool,
    pub streamed: Option<Streamed>,
}

impl<'r> Outline<'r> {
    /// `streamed`: how the client's body would follow the head, if it is passed on as it
    /// arrives.
    pub fn of(req: &'r Request, streamed: Option<Streamed>) -> Outline<'r> {
        let c = &req.conf.proxy;
        let method: Cow<str> = match &c.method {
            Some(m) => Cow::Owned(m.eval(req, None)),
            None => match req.method_override {
                Some(_) => Cow::Borrowed("GET"),
                None if crate::conn::gateway_cache::head_as_get(req) => Cow::Borrowed("GET"),
                None => Cow::Borrowed(req.head.method_str()),
            },
        };
        let set_body = c.body.as_ref().map(|t| t.eval(req, None));
        // The client's body goes unless turned off or the request became a GET (error_page).
        let client_body = c.gw.pass_request_body()
            && req.method_override.is_none()
            && req.head.body != gannet_proto::h1::BodyKind::None;
        let has_body = set_body.is_some() || client_body;
        let streamed = streamed.filter(|_| set_body.is_none() && client_body);
        Outline {
            method,
            set_body,
            has_body,
            streamed,
        }
    }

    /// The body sent with the head: `proxy_set_body`'s, else `body` when the client's goes.
    pub fn body<'a>(&'a self, body: &'a [u8]) -> &'a [u8] {
        match &self.set_body {
            Some(b) => b.as_bytes(),
            None if self.has_body => body,
            None => &[],
        }
    }
}

/// The request's header fields in the order they go, each to `put`: `Host` and
/// `Connection: close` unless `proxy_set_header` changes them, the framing of the body
/// (`body_len` bytes sent with the head, or `o.streamed`), the other `proxy_set_header`s
/// (an empty value sends nothing), the cache's conditional fields, then the client's
/// fields except the ones set here and the hop-by-hop ones. Returns whether the request
/// lets the server keep the connection (no `Connection: close` went). One list for
/// HTTP/1.x and HTTP/2 (which leaves out what it cannot carry).
pub fn fields(
    req: &Request,
    dest: &Dest,
    o: &Outline,
    body_len: usize,
    mut put: impl FnMut(&str, &[u8]),
) -> bool {
    let c = &req.conf.proxy;
    let set = c.set_headers.as_deref().map_or(&[][..], |v| v.as_slice());
    let is_set = |name: &str| set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let mut keep = true;
    if !is_set("host") {
        put("Host", dest.host.as_bytes());
    }
    if !is_set("connection") {
        put("Connection", b"close");
        keep = false;
    }
    match o.streamed {
        Some(Streamed::Chunked) => put("Transfer-Encoding", b"chunked"),
        Some(Streamed::Length(n)) if !is_set("content-length") => {
            put("Content-Length", n.to_string().as_bytes())
        }
        Some(Streamed::Length(_)) => {}
        None if o.has_body && !is_set("content-length") => {
            put("Content-Length", body_len.to_string().as_bytes())
        }
        None => {}
    }
    for (name, value) in set {
        let v = value.eval(req, None);
        if v.is_empty() {
            continue;
        }
        if name.eq_ignore_ascii_case("connection") && v.to_ascii_lowercase().contains("close") {
            keep = false;
        }
        put(name, v.as_bytes());
    }
    // A request whose answer may be cached sends the cache's conditional headers, not the
    // client's (nginx's `proxy_cache_headers`): the entry must be the whole answer.
    let cached = c.gw.cache.enabled() && crate::conn::gateway_cache::cacheable(req);
    if cached {
        if let Some((lm, etag)) = crate::conn::gateway_cache::revalidation(req) {
            for (n, v) in [("If-Modified-Since", lm), ("If-None-Match", etag)] {
                if let Some(v) = v.filter(|_| !is_set(n)) {
                    put(n, v.as_bytes());
                }
            }
        }
    }
    if c.gw.pass_request_headers.unwrap_or(true) {
        for (name, value) in req.head.headers() {
            if HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
                || is_set(name)
                || (cached && crate::conn::gateway_cache::withheld(name))
            {
                continue;
            }
            put(name, value);
        }
    }
    keep
}

/// The request to send upstream over HTTP/1.x: its head, then the body (or only the head,
/// framed for a body that follows as it arrives: `streamed`). Returns whether it asks the
/// server to keep the connection (no `Connection: close` was sent).
pub fn encode_request(
    req: &Request,
    dest: &Dest,
    body: &[u8],
    streamed: Option<Streamed>,
    out: &mut Vec<u8>,
) -> bool {
    let c = &req.conf.proxy;
    let vars = matches!(c.target.as_deref(), Some(Target::Vars(..)));
    let o = Outline::of(req, streamed);
    out.extend_from_slice(o.method.as_bytes());
    out.push(b' ');
    upstream_uri(req, dest, vars, out);
    out.extend_from_slice(if c.http11() {
        b" HTTP/1.1\r\n"
    } else {
        b" HTTP/1.0\r\n"
    });
    let body = o.body(body);
    let keep = fields(req, dest, &o, body.len(), |name, value| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    });
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    keep
}

/// `proxy_redirect`: rewrite a `Location` or `Refresh` value from upstream.
pub fn rewrite_location(req: &Request, value: &str) -> Option<String> {
    let c = &req.conf.proxy;
    let default = [Redirect::Default];
    let rules = c.redirect.as_deref().map_or(&default[..], |r| r.as_slice());
    for rule in rules {
        match rule {
            Redirect::Off => return None,
            Redirect::Default => {
                // The URL in proxy_pass becomes the location's prefix (or "/" without a URI
                // part), as nginx's `proxy_redirect default` does; not with variables.
                let Some(Target::Fixed(dest)) = c.target.as_deref() else {
                    continue;
                };
                let (from, to) = match &dest.uri {
                    Some(u) => (
                        format!("{}{u}", dest.base),
                        req.location
                            .as_ref()
                            .map_or("/", |l| l.prefix())
                            .to_string(),
                    ),
                    None => (dest.base.clone(), String::new()),
                };
                if let Some(rest) = value.strip_prefix(from.as_str()) {
                    return Some(format!("{to}{rest}"));
                }
            }
            Redirect::Rule(RedirectFrom::Prefix(p), to) => {
                if let Some(rest) = value.strip_prefix(p.as_str()) {
                    return Some(format!("{}{rest}", to.eval(req, None)));
                }
            }
            Redirect::Rule(RedirectFrom::Vars(p), to) => {
                if let Some(rest) = value.strip_prefix(p.eval(req, None).as_str()) {
                    return Some(format!("{}{rest}", to.eval(req, None)));
                }
            }
            Redirect::Rule(RedirectFrom::Regex(re), to) => {
                // A match replaces the whole value (not only the part matched, as nginx
                // does), with the captures as $1..$9.
                if let Some(caps) = re.captures(value.as_bytes()) {
                    return Some(to.eval_with(req, None, &caps.to_strings()));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let none = HashMap::new();
        let d = parse_url("http://127.0.0.1:8080/two/", &none).unwrap();
        assert!(matches!(d.backend, Backend::Addr(Addr::Tcp(ref a)) if &**a == "127.0.0.1:8080"));
        assert_eq!(
            (d.host.as_str(), d.port, d.uri.as_deref()),
            ("127.0.0.1:8080", 8080, Some("/two/"))
        );
        let d = parse_url("http://example.com", &none).unwrap();
        assert!(matches!(d.backend, Backend::Addr(Addr::Tcp(ref a)) if &**a == "example.com:80"));
        assert_eq!((d.host.as_str(), d.uri), ("example.com", None));
        let d = parse_url("http://[::1]:81/x", &none).unwrap();
        assert!(matches!(d.backend, Backend::Addr(Addr::Tcp(ref a)) if &**a == "[::1]:81"));
        let d = parse_url("http://unix:/run/app.sock:/api/", &none).unwrap();
        assert!(
            matches!(d.backend, Backend::Addr(Addr::Unix(ref p)) if p.to_str() == Some("/run/app.sock"))
        );
        assert_eq!(d.uri.as_deref(), Some("/api/"));
        let d = parse_url("https://example.com/x", &none).unwrap();
        assert!(matches!(d.backend, Backend::Addr(Addr::Tcp(ref a)) if &**a == "example.com:443"));
        assert!(d.tls);
        assert_eq!((d.host.as_str(), d.port), ("example.com", 443));
        assert_eq!(d.base, "https://example.com");
        let d = parse_url("https://h:8443", &none).unwrap();
        assert_eq!((d.host.as_str(), d.port, d.tls), ("h:8443", 8443, true));
        assert!(!parse_url("http://h", &none).unwrap().tls);
        for bad in [
            "ftp://x",
            "https://",
            "http://",
            "http://h:0",
            "http://h:99999",
            "http://unix::/x",
        ] {
            assert!(parse_url(bad, &none).is_err(), "{bad}");
        }
    }

    #[test]
    fn escaping_matches_nginx_set() {
        let mut s = Vec::new();
        escape_uri("/a b/%?#/é\"<>", &mut s);
        assert_eq!(s, b"/a%20b/%25%3F%23/%C3%A9%22%3C%3E");
    }
}
