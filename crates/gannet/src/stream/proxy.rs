//! `proxy_pass` and the `proxy_*` directives of the stream context (nginx's
//! ngx_stream_proxy_module): the upstream chosen by the group's balancing method, tried
//! again on another server when a connect fails (`proxy_next_upstream`, `_tries`,
//! `_timeout`), then bytes relayed both ways until either side closes or nothing moves for
//! `proxy_timeout`; `proxy_protocol on` opens the upstream connection with a PROXY v1
//! header; `proxy_upload_rate` / `proxy_download_rate` pace each direction as nginx's
//! per-second budget does. `proxy_splice on` (gannet's own) relays a plain TCP session
//! with splice(2) (see `splice`).
//!
//! UDP (`listen ... udp`): datagrams from one client address make a session with its own
//! upstream socket; replies go back from the listening socket. The session ends when the
//! expected replies came (`proxy_responses` per datagram), or after `proxy_timeout` of
//! silence (502 if replies were still expected, as nginx); `proxy_requests N` makes the
//! N+1th datagram of a client start a new session.
//!
//! `proxy_ssl on`: the upstream connection is TLS, set up by the HTTP proxy's code
//! (`modules::proxy_ssl` reads the `proxy_ssl_*` directives, `tls::client` builds the rustls
//! client and does the handshake); only `proxy_ssl_name` is read here, its value having
//! stream variables. The name defaults to the group's (`upstream NAME`, or the address of
//! `proxy_pass ADDRESS`), without its port. A handshake that fails or does not pass
//! `proxy_ssl_verify` counts as a failed connect (next upstream, then 502), as nginx's.
//!
//! `$status`: 200 a session that ran, 502 when no upstream could be reached, 500 an
//! internal error or a `proxy_pass $var` naming neither a group nor an address (nginx's
//! codes).

use super::core::{LoadCtx, Server};
use super::relay::{Early, Sock};
use super::upstream::Group;
use super::variables::{Attempt, Session, Template};
use crate::runtime::worker::Worker;
use crate::upstream::{Addr, Conn, Key, Pick, Tried};
use gannet_conf::{setters, ConfError, Directive};
use std::cell::{Cell, RefCell};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket, UnixStream};

#[derive(Debug, Clone)]
pub enum Pass {
    Group(Arc<Group>),
    /// `proxy_pass $var`: an upstream's name or an address, per session.
    Var(Template),
}

#[derive(Debug, Clone)]
pub struct ProxyConf {
    pub pass: Option<Pass>,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub next_upstream: bool,
    /// 0: no limit.
    pub tries: u32,
    pub next_timeout: Option<Duration>,
    pub proxy_protocol: bool,
    /// Replies expected per datagram (UDP); `None`: any number.
    pub responses: Option<u64>,
    /// Datagrams after which a client's next one starts a new session; 0: no limit.
    pub requests: u64,
    pub buffer_size: usize,
    /// Bytes per second; 0: no limit.
    pub upload_rate: u64,
    pub download_rate: u64,
    /// `proxy_ssl on`.
    pub ssl_enable: bool,
    /// The other `proxy_ssl_*` settings, as the HTTP proxy keeps them (`name` unused).
    pub ssl: crate::modules::proxy_ssl::ProxySslConf,
    /// `proxy_ssl_name`, with stream variables.
    pub ssl_name: Option<Template>,
    /// The rustls client setup, built for a server with `proxy_ssl on` (`core::server`).
    pub client_tls: Option<Arc<crate::tls::client::ClientTls>>,
    /// `proxy_ssl_certificate` / `_key` with variables, as written (`finish_ssl` makes
    /// `ssl_cert_vars` of them).
    cert_tpl: Option<(Template, gannet_conf::Loc)>,
    key_tpl: Option<(Template, gannet_conf::Loc)>,
    /// The client certificate and key evaluated per session (nginx 1.21+).
    pub ssl_cert_vars: Option<CertVars>,
    /// A rate given by variables (`proxy_download_rate $rate`), worked out per session: a
    /// value that is not a size means no limit, as nginx's ngx_stream_complex_value_size.
    pub upload_rate_var: Option<Template>,
    pub download_rate_var: Option<Template>,
    /// `proxy_bind ADDRESS [transparent]`: the local address of upstream connections
    /// (variables allowed; an empty value binds nothing); `None`: `off` or unset.
    pub bind: Option<(Template, bool)>,
    /// `proxy_half_close`: one side's EOF is passed on as a shutdown of the other's
    /// writing side; the session ends when both sides have closed.
    pub half_close: bool,
    /// `proxy_splice` (gannet's own): the plain TCP relay moves bytes with splice(2).
    pub splice: bool,
}

/// `proxy_ssl_certificate` and `_key` with variables: the files are loaded for each session
/// (nginx too loads them each time, without `proxy_ssl_certificate_cache`); an empty
/// certificate name sends none.
#[derive(Debug, Clone)]
pub struct CertVars {
    cert: Template,
    key: Template,
    loc: gannet_conf::Loc,
    prefix: std::path::PathBuf,
}

impl ProxyConf {
    /// The session's rate: the fixed one or its variables' value.
    fn rate(fixed: u64, var: &Option<Template>, s: &Session, maps: &super::map::Maps) -> u64 {
        match var {
            Some(t) => setters::size(&t.eval(s, maps)).unwrap_or(0),
            None => fixed,
        }
    }
}

impl Default for ProxyConf {
    fn default() -> ProxyConf {
        ProxyConf {
            pass: None,
            connect_timeout: Duration::from_secs(60),
            timeout: Duration::from_secs(600),
            next_upstream: true,
            tries: 0,
            next_timeout: None,
            proxy_protocol: false,
            responses: None,
            requests: 0,
            buffer_size: 16 * 1024,
            upload_rate: 0,
            download_rate: 0,
            ssl_enable: false,
            ssl: Default::default(),
            ssl_name: None,
            client_tls: None,
            cert_tpl: None,
            key_tpl: None,
            ssl_cert_vars: None,
            upload_rate_var: None,
            download_rate_var: None,
            half_close: false,
            splice: false,
            bind: None,
        }
    }
}

/// A `proxy_*` directive.
pub fn set(d: &Directive, c: &mut ProxyConf, ctx: &LoadCtx) -> Result<(), ConfError> {
    if d.name == "proxy_bind" {
        return bind(d, c, ctx);
    }
    if d.name.starts_with("proxy_ssl") {
        return set_ssl(d, c, ctx);
    }
    if d.args.len() != 1 {
        return Err(d.error(format!(
            "invalid number of arguments in \"{}\" directive",
            d.name
        )));
    }
    let ms = |d: &Directive| setters::msec_arg(d, 0).map(Duration::from_millis);
    match d.name.as_str() {
        "proxy_pass" => {
            if c.pass.is_some() {
                return Err(d.error("\"proxy_pass\" directive is duplicate"));
            }
            let arg = &d.args[0];
            c.pass = Some(if arg.contains('$') {
                Pass::Var(Template::compile(arg, &ctx.maps).map_err(|e| d.error(e))?)
            } else if let Some(g) = ctx.upstreams.get(arg) {
                Pass::Group(g.clone())
            } else {
                Pass::Group(Arc::new(super::upstream::implicit(d, arg)?))
            });
        }
        "proxy_connect_timeout" => c.connect_timeout = ms(d)?,
        "proxy_timeout" => c.timeout = ms(d)?,
        "proxy_next_upstream" => c.next_upstream = setters::flag(d)?,
        "proxy_next_upstream_tries" => c.tries = setters::num_arg(d, 0)? as u32,
        "proxy_next_upstream_timeout" => {
            let t = ms(d)?;
            c.next_timeout = (!t.is_zero()).then_some(t);
        }
        "proxy_protocol" => c.proxy_protocol = setters::flag(d)?,
        "proxy_responses" => c.responses = Some(setters::num_arg(d, 0)?),
        "proxy_requests" => c.requests = setters::num_arg(d, 0)?,
        "proxy_buffer_size" => c.buffer_size = setters::size_arg(d, 0)?.max(1) as usize,
        "proxy_upload_rate" | "proxy_download_rate" => {
            let var = match d.args[0].contains('$') {
                true => Some(Template::compile(&d.args[0], &ctx.maps).map_err(|e| d.error(e))?),
                false => None,
            };
            let fixed = match var {
                Some(_) => 0,
                None => setters::size_arg(d, 0)?,
            };
            if d.name == "proxy_upload_rate" {
                (c.upload_rate, c.upload_rate_var) = (fixed, var);
            } else {
                (c.download_rate, c.download_rate_var) = (fixed, var);
            }
        }
        "proxy_half_close" => c.half_close = setters::flag(d)?,
        "proxy_splice" => c.splice = setters::flag(d)?,
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// A `proxy_ssl` or `proxy_ssl_*` directive: the HTTP proxy's reader for all but the
/// flag and the name.
fn set_ssl(d: &Directive, c: &mut ProxyConf, ctx: &LoadCtx) -> Result<(), ConfError> {
    let one = || match d.args.len() {
        1 => Ok(()),
        _ => Err(d.error(format!(
            "invalid number of arguments in \"{}\" directive",
            d.name
        ))),
    };
    match d.name.as_str() {
        "proxy_ssl" => {
            one()?;
            c.ssl_enable = setters::flag(d)?;
        }
        "proxy_ssl_name" => {
            one()?;
            c.ssl_name = Some(Template::compile(&d.args[0], &ctx.maps).map_err(|e| d.error(e))?);
        }
        "proxy_ssl_certificate" | "proxy_ssl_certificate_key" if d.args.len() == 1 => {
            let tpl = match d.args[0].contains('$') {
                true => {
                    let t = Template::compile(&d.args[0], &ctx.maps).map_err(|e| d.error(e))?;
                    Some((t, d.loc.clone()))
                }
                false => None,
            };
            let is_cert = d.name == "proxy_ssl_certificate";
            match (&tpl, is_cert) {
                (Some(_), true) => c.ssl.certificate = None,
                (Some(_), false) => c.ssl.certificate_key = None,
                (None, _) => {
                    let mut h = ctx.http.borrow_mut();
                    crate::modules::proxy_ssl::set_on(d, "proxy_ssl_", &mut c.ssl, &mut h)?;
                }
            }
            match is_cert {
                true => c.cert_tpl = tpl,
                false => c.key_tpl = tpl,
            }
        }
        name => {
            let spec = crate::modules::proxy_ssl::DIRECTIVES
                .iter()
                .find(|s| s.name == name)
                .ok_or_else(|| d.error(format!("unknown directive \"{name}\"")))?;
            gannet_conf::registry::check(spec, d, gannet_conf::registry::Ctx::SERVER)?;
            let mut h = ctx.http.borrow_mut();
            crate::modules::proxy_ssl::set_on(d, "proxy_ssl_", &mut c.ssl, &mut h)?;
        }
    }
    Ok(())
}

/// A server's settings done: a certificate or key with variables makes both per-session
/// ones (a plain file name among them is a template without variables).
pub fn finish_ssl(c: &mut ProxyConf, prefix: &std::path::Path) -> Result<(), ConfError> {
    if c.cert_tpl.is_none() && c.key_tpl.is_none() {
        return Ok(());
    }
    let plain = |f: &Option<crate::modules::proxy_ssl::CertArg>| {
        f.as_ref().map(|f| &f.file).map(|f| {
            let lit = Template::literal(&f.path.to_string_lossy());
            (lit, f.loc.clone())
        })
    };
    let cert = c.cert_tpl.take().or_else(|| plain(&c.ssl.certificate));
    let key = c.key_tpl.take().or_else(|| plain(&c.ssl.certificate_key));
    let (cert, key) = match (cert, key) {
        (Some(cert), Some(key)) => (cert, key),
        (Some((_, at)), None) => {
            return Err(ConfError::at(
                &at,
                "no \"proxy_ssl_certificate_key\" is defined",
            ))
        }
        (None, Some((_, at))) => {
            return Err(ConfError::at(
                &at,
                "no \"proxy_ssl_certificate\" is defined",
            ))
        }
        (None, None) => return Ok(()),
    };
    let ((cert, loc), (key, _)) = (cert, key);
    c.ssl.certificate = None;
    c.ssl.certificate_key = None;
    c.ssl_cert_vars = Some(CertVars {
        cert,
        key,
        loc,
        prefix: prefix.to_path_buf(),
    });
    Ok(())
}

/// `proxy_bind ADDRESS [transparent] | off`.
fn bind(d: &Directive, c: &mut ProxyConf, ctx: &LoadCtx) -> Result<(), ConfError> {
    let transparent = match d.args.get(1).map(String::as_str) {
        None => false,
        Some("transparent") if d.args.len() == 2 => true,
        Some(a) if d.args.len() == 2 => return Err(d.error(format!("invalid parameter \"{a}\""))),
        _ => return Err(d.error("invalid number of arguments in \"proxy_bind\" directive")),
    };
    if d.args[0] == "off" {
        c.bind = None;
        return Ok(());
    }
    let t = Template::compile(&d.args[0], &ctx.maps).map_err(|e| d.error(e))?;
    if !d.args[0].contains('$') && local_addr(&d.args[0]).is_none() {
        return Err(d.error(format!("invalid address \"{}\"", d.args[0])));
    }
    c.bind = Some((t, transparent));
    Ok(())
}

/// The session's `proxy_bind` address. nginx: one that does not parse ends the session
/// with 500 (`Err`); an empty one binds nothing.
fn bind_for(srv: &Server, s: &mut Session) -> Result<Option<(SocketAddr, bool)>, ()> {
    let Some((t, transparent)) = &srv.conf.proxy.bind else {
        return Ok(None);
    };
    let v = t.eval(s, &srv.maps);
    match local_addr(&v) {
        Some(a) => Ok(Some((a, *transparent))),
        None if v.is_empty() => Ok(None),
        None => {
            crate::errlog::error(format_args!(
                "*{} invalid local address \"{v}\", {}",
                s.id,
                client_text(s)
            ));
            s.status = 500;
            Err(())
        }
    }
}

/// `IP` or `IP:PORT` (`[v6]:PORT`) of `proxy_bind`.
fn local_addr(v: &str) -> Option<SocketAddr> {
    v.parse::<SocketAddr>().ok().or_else(|| {
        let ip = v.trim_start_matches('[').trim_end_matches(']');
        ip.parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, 0))
    })
}

/// The group a session goes to; `Err(500)` when `proxy_pass $var` names neither a group
/// nor an address, or a name that has no port, no `resolver` or no address (nginx's
/// codes and lines).
async fn group_for(srv: &Server, s: &Session) -> Result<Arc<Group>, u16> {
    let conf = srv.conf.proxy.pass.as_ref().ok_or(500u16)?;
    let t = match conf {
        Pass::Group(g) => return Ok(g.clone()),
        Pass::Var(t) => t,
    };
    let name = t.eval(s, &srv.maps);
    if let Some(g) = srv.groups.get(&name) {
        return Ok(g.clone());
    }
    if let Some(a) = Addr::parse(&name).filter(is_literal) {
        return Ok(kept(srv, &name, |_| true, || vec![a]));
    }
    let port = name
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)));
    let Some((host, port)) = port.filter(|(h, _)| !h.is_empty()) else {
        crate::errlog::error(format_args!(
            "*{} no port in upstream \"{name}\", {}",
            s.id,
            client_text(s)
        ));
        return Err(500);
    };
    let Some(resolver) = &srv.conf.resolver else {
        crate::errlog::error(format_args!(
            "*{} no resolver defined to resolve {host}, {}",
            s.id,
            client_text(s)
        ));
        return Err(500);
    };
    // Boxed: off the plain path, whose future stays small (`core::serve_tcp`).
    match Box::pin(resolver.lookup(host, srv.conf.resolver_timeout)).await {
        Ok((ips, _)) => {
            let addrs: Vec<Addr> = ips
                .into_iter()
                .map(|ip| Addr::Tcp(SocketAddr::new(ip, port).to_string().into()))
                .collect();
            let same = |g: &Group| {
                g.group.servers.len() == addrs.len()
                    && g.group
                        .servers
                        .iter()
                        .zip(&addrs)
                        .all(|(a, b)| a.addr == *b)
            };
            Ok(kept(srv, &name, same, || addrs.clone()))
        }
        Err(f) => {
            crate::errlog::error(format_args!(
                "*{} {host} could not be resolved ({f}), {}",
                s.id,
                client_text(s)
            ));
            Err(500)
        }
    }
}

/// The group kept for `name` while `still` holds for it, else a new one of `addrs`: one
/// group per address or name, kept as the balancer's state (failures, `max_fails`) is
/// per group. The names come from the session (a client may vary them), so the table
/// starts over past a bound instead of growing.
fn kept(
    srv: &Server,
    name: &str,
    still: impl Fn(&Group) -> bool,
    addrs: impl FnOnce() -> Vec<Addr>,
) -> Arc<Group> {
    let mut seen = srv.by_addr.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = seen.get(name).filter(|g| still(g)) {
        return g.clone();
    }
    if seen.len() >= MAX_VAR_GROUPS {
        seen.clear();
    }
    let g = Arc::new(super::upstream::of_addrs(name, addrs()));
    seen.insert(name.to_string(), g.clone());
    g
}

/// The most groups `proxy_pass $var` keeps for addresses (see `group_for`).
const MAX_VAR_GROUPS: usize = 1024;

/// `IP:port`, `[v6]:port` or `unix:PATH`.
fn is_literal(a: &Addr) -> bool {
    match a {
        Addr::Unix(_) => true,
        Addr::Tcp(t) => t.parse::<SocketAddr>().is_ok(),
    }
}

/// A connected upstream socket.
enum Socket {
    Tcp(Sock),
    Unix(UnixStream),
}

impl Socket {
    /// The local end, as nginx's "proxy ... connected to" line names it.
    fn local_text(&self) -> String {
        match self {
            Socket::Tcp(t) => t
                .sock_ref()
                .and_then(|r| r.local_addr().ok()?.as_socket())
                .map(|a| a.to_string())
                .unwrap_or_default(),
            Socket::Unix(_) => "unix:".to_string(),
        }
    }
}

/// An upstream connection: a plain TCP socket (the plain relay's, unboxed) or any other.
enum Up {
    Plain(Sock),
    Other(Conn),
}

impl Up {
    fn into_conn(self) -> std::io::Result<Conn> {
        match self {
            Up::Plain(t) => Ok(Box::new(t.into_tokio()?)),
            Up::Other(c) => Ok(c),
        }
    }
}

/// The error of a connect that took longer than `proxy_connect_timeout`.
pub(super) fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "upstream timed out")
}

/// nginx's line for a session that `proxy_timeout` ended.
pub(super) fn log_timed_out(id: u64) {
    crate::errlog::log(
        crate::errlog::Level::Info,
        format_args!("*{id} connection timed out"),
    );
}

/// Connect, from `local` (`proxy_bind`) when given. `early`: the plain relay's first
/// bytes, sent as the connect completes (an address without `proxy_bind` only; see
/// `relay::connect`).
async fn connect(
    (addr, parsed): (&Addr, Option<SocketAddr>),
    (timeout, timers): (Duration, &crate::runtime::read_timers::ReadTimers),
    local: Option<(SocketAddr, bool)>,
    nodelay: bool,
    early: Option<&mut Early>,
) -> std::io::Result<Socket> {
    if let (Some(to), None, Some(early)) = (parsed, local, early) {
        // `tcp_nodelay`: set by the relay, before the socket's second send.
        let sock = super::relay::connect(timers, to, timeout, early).await?;
        return Ok(Socket::Tcp(sock));
    }
    // Boxed: off the plain path, whose future stays small (`core::serve_tcp`).
    let fut = Box::pin(async {
        let tcp = match (addr, local) {
            (Addr::Tcp(a), Some((from, transparent))) => {
                let to = tokio::net::lookup_host(&**a)
                    .await?
                    .next()
                    .ok_or_else(|| std::io::Error::other("host not found"))?;
                let sock = match to {
                    SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                    SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
                };
                if transparent {
                    let r = socket2::SockRef::from(&sock);
                    match from {
                        SocketAddr::V4(_) => r.set_ip_transparent_v4(true)?,
                        SocketAddr::V6(_) => r.set_ip_transparent_v6(true)?,
                    }
                }
                sock.bind(from)?;
                sock.connect(to).await?
            }
            (Addr::Tcp(a), None) => TcpStream::connect(&**a).await?,
            (Addr::Unix(p), _) => return UnixStream::connect(p).await.map(Socket::Unix),
        };
        if nodelay {
            let _ = tcp.set_nodelay(true);
        }
        Ok(Socket::Tcp(Sock::Reg(tcp)))
    });
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(timed_out()),
    }
}

/// An attempt's `$upstream_addr`: a TCP address is shared, not copied.
fn attempt_addr(addr: &Addr) -> Arc<str> {
    match addr {
        Addr::Tcp(a) => a.clone(),
        Addr::Unix(_) => addr.to_string().into(),
    }
}

fn client_text(s: &Session) -> String {
    format!("client: {}, server: {}", s.client_text(), s.local)
}

/// nginx's tries of a group: its servers but the `down` ones (each tried once at most).
fn live_servers(group: &Group) -> usize {
    group.group.servers.iter().filter(|s| !s.down).count()
}

/// No server of the group can be tried: nginx's line, 502, and the group's name as
/// the attempt's `$upstream_addr`.
fn no_live(s: &mut Session, group: &Group) {
    crate::errlog::error(format_args!(
        "*{} no live upstreams while connecting to upstream, {}, upstream: \"{}\"",
        s.id,
        client_text(s),
        group.group.name
    ));
    s.attempts.push(Attempt {
        addr: group.group.name.as_str().into(),
        ..Default::default()
    });
    s.status = 502;
}

/// What every upstream attempt starts from, TCP or UDP: the group (`$status` set when there
/// is none), the value of its `hash` key and the local address `proxy_bind` gives.
#[allow(clippy::type_complexity)]
async fn choose_group(
    srv: &Server,
    s: &mut Session,
) -> Option<(Arc<Group>, Option<String>, Option<(SocketAddr, bool)>)> {
    let group = match group_for(srv, s).await {
        Ok(g) => g,
        Err(status) => {
            s.status = status;
            return None;
        }
    };
    let hash = group.hash_key(s, &srv.maps);
    let local = bind_for(srv, s).ok()?;
    Some((group, hash, local))
}

/// Pick and connect, trying the next server on failure as `proxy_next_upstream` allows.
/// Returns the connection and its attempt's index; `None`: `$status` is set.
async fn connect_upstream(
    w: &Rc<Worker>,
    srv: &Server,
    s: &mut Session,
    mut early: Option<&mut Early>,
) -> Option<(Up, crate::upstream::Lease, Arc<Group>, usize)> {
    let c = &srv.conf.proxy;
    let (group, hash, local) = choose_group(srv, s).await?;
    let key = Key {
        ip: Some(s.peer.ip()),
        hash: hash.as_deref().map(str::as_bytes),
    };
    let mut tried = Tried::default();
    // The turn's time (`runtime::clock`): one clock read for the session's poll.
    let now = crate::runtime::clock::now;
    let start = now();
    loop {
        let (i, lease) = match w.upstreams.pick(&group.group, &key, &tried, now()) {
            Pick::Server(i, lease) => (i, lease),
            Pick::Full | Pick::None => {
                no_live(s, &group);
                return None;
            }
        };
        tried.push(i);
        let addr = &group.group.servers[i].addr;
        let began = now();
        s.attempts.push(Attempt {
            addr: attempt_addr(addr),
            ..Default::default()
        });
        let timeout = (c.connect_timeout, &*w.timers);
        let nodelay = srv.conf.tcp_nodelay;
        let to = (addr, group.socks.get(i).copied().flatten());
        let conn = match connect(to, timeout, local, nodelay, early.as_deref_mut()).await {
            Ok(sock) => {
                if crate::errlog::admits(crate::errlog::Level::Info) {
                    crate::errlog::log(
                        crate::errlog::Level::Info,
                        format_args!(
                            "*{} proxy {} connected to {addr} while connecting to upstream, {}, upstream: \"{addr}\"",
                            s.id,
                            sock.local_text(),
                            client_text(s)
                        ),
                    );
                }
                match (&c.client_tls, sock) {
                    (None, Socket::Tcp(t)) => Ok(Up::Plain(t)),
                    (None, Socket::Unix(u)) => Ok(Up::Other(Box::new(u))),
                    (Some(setup), sock) => {
                        let conn: std::io::Result<Conn> = match sock {
                            Socket::Tcp(t) => t.into_tokio().map(|t| Box::new(t) as Conn),
                            Socket::Unix(u) => Ok(Box::new(u)),
                        };
                        match conn {
                            // Boxed: off the plain path (`core::serve_tcp`).
                            Ok(conn) => Box::pin(ssl_handshake(w, srv, s, &group, setup, conn))
                                .await
                                .map(Up::Other),
                            Err(e) => Err((
                                format!(
                                    "connect() failed ({}) while connecting to upstream",
                                    crate::errlog::errno_text(&e)
                                ),
                                false,
                            )),
                        }
                    }
                }
            }
            Err(e) => {
                let e = crate::errlog::errno_text(&e);
                Err((
                    format!("connect() failed ({e}) while connecting to upstream"),
                    false,
                ))
            }
        };
        match conn {
            Ok(conn) => {
                w.upstreams.succeeded(&group.group, i);
                if let Some(a) = s.attempts.last_mut() {
                    a.connect = Some((now() - began).as_secs_f64());
                }
                return Some((conn, lease, group, i));
            }
            Err((why, true)) => {
                crate::errlog::error(format_args!("*{} {why}, {}", s.id, client_text(s)));
                s.status = 500;
                return None;
            }
            Err((why, false)) => {
                w.upstreams.failed(&group.group, i, Instant::now());
                crate::errlog::error(format_args!(
                    "*{} {why}, {}, upstream: \"{addr}\"",
                    s.id,
                    client_text(s)
                ));
                // As nginx, each server is tried once at most.
                let out_of_tries = (c.tries > 0 && tried.len() >= c.tries as usize)
                    || tried.len() >= live_servers(&group);
                let out_of_time = c.next_timeout.is_some_and(|t| start.elapsed() >= t);
                if !c.next_upstream || out_of_tries || out_of_time {
                    s.status = 502;
                    return None;
                }
            }
        }
    }
}

/// `proxy_ssl on`: the handshake over a connection just made, within
/// `proxy_connect_timeout` as nginx's; `Err`: what the error log says.
async fn ssl_handshake(
    w: &Rc<Worker>,
    srv: &Server,
    s: &Session,
    group: &Group,
    setup: &Arc<crate::tls::client::ClientTls>,
    mut conn: Conn,
) -> Result<Conn, (String, bool)> {
    use crate::tls::client as tls_client;
    let c = &srv.conf.proxy;
    if c.proxy_protocol {
        // nginx sends the PROXY line in the clear, before the handshake.
        let h = proxy_header(s);
        if let Err(e) = conn.write_all(h.as_bytes()).await {
            let e = crate::errlog::errno_text(&e);
            return Err((
                format!("send() failed ({e}) while connecting to upstream"),
                false,
            ));
        }
    }
    let value = match &c.ssl_name {
        Some(t) => t.eval(s, &srv.maps),
        None => group.group.name.clone(),
    };
    let name = match tls_client::server_name(&value) {
        Some(n) => n,
        // A name that can be neither checked nor sent (`upstream my_backend`) matters to
        // neither: rustls only wants one to connect with.
        None if !c.ssl.verify() && !c.ssl.server_name() => {
            rustls::pki_types::ServerName::IpAddress(s.local.ip().into())
        }
        None => {
            return Err((
                format!("invalid proxy_ssl_name \"{value}\" while SSL handshaking to upstream"),
                false,
            ))
        }
    };
    let mut config = w.tls_sessions.config(setup);
    if let Some(v) = &c.ssl_cert_vars {
        let cert = v.cert.eval(s, &srv.maps);
        if !cert.is_empty() {
            let file = |value: String| crate::modules::tls::FileArg {
                path: v.prefix.join(value),
                loc: v.loc.clone(),
            };
            let key = file(v.key.eval(s, &srv.maps));
            let provider = config.crypto_provider().clone();
            let passwords = c.ssl.password_file.as_deref();
            match tls_client::load_pair(&provider, &file(cert), &key, passwords) {
                Ok(ck) => config = tls_client::sending(&config, ck),
                Err(e) => return Err((e.msg, true)),
            }
        }
    }
    let hs = tls_client::handshake(conn, config, name.clone());
    match tokio::time::timeout(c.connect_timeout, hs).await {
        Ok(Ok(t)) => Ok(Box::new(t)),
        Ok(Err(e)) => Err((
            format!(
                "{} while SSL handshaking to upstream",
                tls_client::describe(&e, &name)
            ),
            false,
        )),
        Err(_) => Err((
            "upstream timed out (110: Connection timed out) while SSL handshaking to upstream"
                .to_string(),
            false,
        )),
    }
}

/// The PROXY protocol v1 line for the session (nginx's `ngx_proxy_protocol_write`).
fn proxy_header(s: &Session) -> String {
    crate::conn::proxy_protocol::v1_line(s.peer, s.local)
}

/// Proxy a TCP session; `head`: client bytes read already (`ssl_preread`). A plain
/// client ([`Sock`]) that no rate paces goes to the plain relay (`relay`).
pub async fn tcp<C>(w: &Rc<Worker>, srv: &Server, client: C, head: Vec<u8>, s: &mut Session)
where
    C: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let c = &srv.conf.proxy;
    let paced = c.upload_rate != 0
        || c.download_rate != 0
        || c.upload_rate_var.is_some()
        || c.download_rate_var.is_some();
    let mut client = Some(client);
    if !paced {
        let plain = (&mut client as &mut dyn std::any::Any).downcast_mut::<Option<Sock>>();
        if let Some(sock) = plain.and_then(Option::take) {
            return tcp_plain(w, srv, sock, head, s).await;
        }
    }
    let Some(client) = client else {
        return;
    };
    // Boxed: off the plain path, whose future stays small (`core::serve_tcp`).
    Box::pin(tcp_buffered(w, srv, client, head, s)).await
}

/// A client that is not a plain socket (TLS), or a paced session: the buffered relay.
async fn tcp_buffered<C>(w: &Rc<Worker>, srv: &Server, client: C, head: Vec<u8>, s: &mut Session)
where
    C: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let Some((up, _lease, _group, _)) = connect_upstream(w, srv, s, None).await else {
        return;
    };
    let Ok(conn) = up.into_conn() else {
        s.status = 502;
        return;
    };
    let pre = preamble(&srv.conf.proxy, s, head);
    relay(srv, client, conn, pre, s).await
}

/// A plain client: its first bytes go out with the connect, and a plain TCP upstream
/// gets the plain relay (others the buffered one).
async fn tcp_plain(w: &Rc<Worker>, srv: &Server, client: Sock, head: Vec<u8>, s: &mut Session) {
    let c = &srv.conf.proxy;
    let pre = preamble(c, s, head);
    let mut early = Early::new(client, pre, c.buffer_size);
    // Over TLS the upstream's first bytes are the handshake's.
    let first = c.client_tls.is_none().then_some(&mut early);
    let Some((up, _lease, _group, _)) = connect_upstream(w, srv, s, first).await else {
        return;
    };
    let up = match up {
        Up::Plain(up) => up,
        Up::Other(conn) => {
            let (client, pre) = early.into_parts();
            // Boxed: off the plain path (`core::serve_tcp`).
            return Box::pin(relay(srv, client, conn, pre, s)).await;
        }
    };
    let conf = super::relay::Conf {
        size: c.buffer_size,
        splice: c.splice,
        half_close: c.half_close,
        timeout: c.timeout,
        timers: &w.timers,
        id: s.id,
        nodelay: srv.conf.tcp_nodelay,
    };
    let pre_len = early.pre_len as u64;
    let began = crate::runtime::clock::now();
    let out = super::relay::run(early, up, &conf).await;
    if out.pre_failed {
        s.status = 502;
        return;
    }
    let counts = Counts {
        up: out.up_bytes,
        down: out.down_bytes,
        down_first: out.down_first,
        began,
    };
    account(s, pre_len, out.closed, &counts);
}

/// One direction's byte counter and pacing.
struct Flow {
    bytes: Cell<u64>,
    /// When the first byte came (`$upstream_first_byte_time` of the download side).
    first: Cell<Option<Instant>>,
    rate: u64,
    /// The session's start in the clock's whole seconds (nginx's `u->start_sec`).
    start_sec: u64,
}

impl Flow {
    /// How much may be read now under the rate, waiting while the budget is spent (nginx:
    /// `rate * (elapsed seconds + 1) - sent`, the seconds whole ones of the clock as
    /// nginx's `ngx_time()`, so a budget renews at each tick of the clock's second).
    async fn budget(&self, max: usize) -> usize {
        if self.rate == 0 {
            return max;
        }
        let start_sec = self.start_sec;
        loop {
            let secs = unix_secs().saturating_sub(start_sec);
            let allowed = self.rate.saturating_mul(secs + 1);
            let spent = self.bytes.get();
            if allowed > spent {
                return max.min((allowed - spent) as usize);
            }
            let wait_ms = (spent - allowed) * 1000 / self.rate + 1;
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
    }
}

/// The wall clock's whole seconds (nginx's `ngx_time()`).
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `half_close`: an EOF is passed on as a shutdown of `wr`'s writing side.
async fn pump<R, W>(
    mut r: R,
    mut wr: W,
    flow: &Flow,
    (size, half_close): (usize, bool),
    last: &Cell<Instant>,
) -> bool
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; size];
    loop {
        let room = flow.budget(size).await;
        let n = match r.read(&mut buf[..room]).await {
            Ok(0) if half_close => return wr.shutdown().await.is_ok(),
            Ok(0) | Err(_) => return true,
            Ok(n) => n,
        };
        last.set(Instant::now());
        if flow.first.get().is_none() {
            flow.first.set(Some(Instant::now()));
        }
        // A TLS side may hold the last records until flushed.
        if wr.write_all(&buf[..n]).await.is_err() || wr.flush().await.is_err() {
            return false;
        }
        flow.bytes.set(flow.bytes.get() + n as u64);
        last.set(Instant::now());
        // nginx: after a read under a rate, the next waits n / rate seconds.
        if let Some(pause) = (n as u64 * 1000).checked_div(flow.rate) {
            if pause > 0 {
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
    }
}

/// The bytes that go to the upstream before the client's (a PROXY line, `ssl_preread`'s
/// bytes), counted as nginx does: all in `$upstream_bytes_sent`, the preread ones in
/// `$bytes_received` too.
fn preamble(c: &ProxyConf, s: &mut Session, head: Vec<u8>) -> Vec<u8> {
    // Over TLS the line went before the handshake (`ssl_handshake`).
    let mut pre = match c.proxy_protocol && c.client_tls.is_none() {
        true => proxy_header(s).into_bytes(),
        false => Vec::new(),
    };
    s.bytes_received += head.len() as u64;
    pre.extend_from_slice(&head);
    pre
}

/// The buffered relay (TLS on a side, a unix upstream, a rate): `pre` goes first.
async fn relay<C, U>(srv: &Server, client: C, up: U, pre: Vec<u8>, s: &mut Session)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let c = &srv.conf.proxy;
    let (ur, mut uw) = tokio::io::split(up);
    if !pre.is_empty() && (uw.write_all(&pre).await.is_err() || uw.flush().await.is_err()) {
        s.status = 502;
        return;
    }
    let m = Meter::new(srv, s);
    let (cr, cw) = tokio::io::split(client);
    let how = (c.buffer_size, c.half_close);
    let up = pump(cr, uw, &m.up, how, &m.last);
    let down = pump(ur, cw, &m.down, how, &m.last);
    m.drive(srv, s, pre.len() as u64, up, down).await;
}

/// A relay's two directions' counts and the time of its last byte (`proxy_timeout`).
struct Meter {
    up: Flow,
    down: Flow,
    last: Cell<Instant>,
    began: Instant,
}

impl Meter {
    fn new(srv: &Server, s: &Session) -> Meter {
        let c = &srv.conf.proxy;
        let flow = |rate| Flow {
            bytes: Cell::new(0),
            first: Cell::new(None),
            rate,
            start_sec: unix_secs(),
        };
        Meter {
            up: flow(ProxyConf::rate(
                c.upload_rate,
                &c.upload_rate_var,
                s,
                &srv.maps,
            )),
            down: flow(ProxyConf::rate(
                c.download_rate,
                &c.download_rate_var,
                s,
                &srv.maps,
            )),
            last: Cell::new(Instant::now()),
            began: Instant::now(),
        }
    }

    /// Run the two directions (`up`: client to upstream) until either ends (both with
    /// `proxy_half_close`) or `proxy_timeout` passes idle, then count the session's bytes
    /// and log nginx's "disconnected" line. `sent_first`: the preamble's bytes.
    async fn drive(
        &self,
        srv: &Server,
        s: &mut Session,
        sent_first: u64,
        up: impl std::future::Future<Output = bool>,
        down: impl std::future::Future<Output = bool>,
    ) {
        let c = &srv.conf.proxy;
        let last = &self.last;
        let id = s.id;
        let idle = async {
            loop {
                let until = last.get() + c.timeout;
                tokio::time::sleep_until(until.into()).await;
                if last.get() + c.timeout <= Instant::now() {
                    log_timed_out(id);
                    return;
                }
            }
        };
        tokio::pin!(up, down, idle);
        let first = tokio::select! {
            ok = &mut up => Some(("client", ok)),
            ok = &mut down => Some(("upstream", ok)),
            _ = &mut idle => None,
        };
        let closed = match first {
            // `proxy_half_close`: the other direction goes on until its own EOF.
            Some(("client", true)) if c.half_close => tokio::select! {
                _ = &mut down => Some("upstream"),
                _ = &mut idle => None,
            },
            Some((_, true)) if c.half_close => tokio::select! {
                _ = &mut up => Some("client"),
                _ = &mut idle => None,
            },
            f => f.map(|(who, _)| who),
        };
        let counts = Counts {
            up: self.up.bytes.get(),
            down: self.down.bytes.get(),
            down_first: self.down.first.get(),
            began: self.began,
        };
        account(s, sent_first, closed, &counts);
    }
}

/// A relay's counts: bytes each way, the upstream's first byte, when the relay began.
struct Counts {
    up: u64,
    down: u64,
    down_first: Option<Instant>,
    began: Instant,
}

/// A relay is over (`closed`: the side that ended it, `None` at `proxy_timeout`): the
/// session's bytes and times, and nginx's "disconnected" line. `sent_first`: the
/// preamble's bytes.
fn account(s: &mut Session, sent_first: u64, closed: Option<&str>, n: &Counts) {
    s.bytes_received += n.up;
    s.bytes_sent += n.down;
    if let Some(a) = s.attempts.last_mut() {
        a.sent = sent_first + n.up;
        a.received = n.down;
        // nginx measures both from the start of the connect.
        let base = a.connect.unwrap_or_default();
        a.first_byte = n.down_first.map(|t| base + (t - n.began).as_secs_f64());
        a.session = Some(base + (crate::runtime::clock::now() - n.began).as_secs_f64());
    }
    let info = crate::errlog::admits(crate::errlog::Level::Info);
    if let (Some(who), Some(a), true) = (closed, s.attempts.last(), info) {
        crate::errlog::log(
            crate::errlog::Level::Info,
            format_args!(
                "*{} {who} disconnected, bytes from/to client:{}/{}, bytes from/to upstream:{}/{}",
                s.id, s.bytes_received, s.bytes_sent, a.received, a.sent
            ),
        );
    }
}

/// A client's live UDP session: its id (to remove only its own entry), its inbox and the
/// datagrams given to it so far.
type UdpSessions =
    Rc<RefCell<HashMap<SocketAddr, (u64, tokio::sync::mpsc::UnboundedSender<Vec<u8>>, u64)>>>;

/// Serve a `listen ... udp` socket of stream server `idx`.
pub async fn udp_listener(w: Rc<Worker>, sock: std::net::UdpSocket, idx: usize) {
    let Some(srv) = w
        .config
        .stream
        .as_ref()
        .and_then(|s| s.servers.get(idx))
        .cloned()
    else {
        return;
    };
    let Ok(sock) = UdpSocket::from_std(sock) else {
        crate::errlog::error(format_args!("udp listener setup failed"));
        return;
    };
    let local = sock
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let sock = Rc::new(sock);
    let sessions: UdpSessions = Rc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let data = buf[..n].to_vec();
        // `proxy_requests N`: the Nth datagram is a session's last, decided here as it
        // is handed over (a session that counted for itself would lose the ones queued
        // behind it).
        let limit = srv.conf.proxy.requests;
        let data = match sessions.borrow_mut().entry(peer) {
            Entry::Occupied(mut e) => {
                let (_, tx, given) = e.get_mut();
                match tx.send(data) {
                    Ok(()) => {
                        *given += 1;
                        if limit > 0 && *given >= limit {
                            e.remove();
                        }
                        continue;
                    }
                    Err(err) => {
                        e.remove();
                        err.0
                    }
                }
            }
            Entry::Vacant(_) => data,
        };
        if w.active.get() >= w.config.main.worker_connections {
            continue;
        }
        w.active.set(w.active.get() + 1);
        let id = Worker::next_conn_id();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = tx.send(data);
        if limit != 1 {
            sessions.borrow_mut().insert(peer, (id, tx, 1));
        }
        let s = Session::new(id, peer, local, true);
        let session = udp_session(
            w.clone(),
            srv.clone(),
            sock.clone(),
            s,
            rx,
            sessions.clone(),
        );
        let logs = srv.conf.error_log.clone();
        tokio::task::spawn_local(crate::errlog::scoped(logs, session));
    }
}

async fn udp_session(
    w: Rc<Worker>,
    srv: Arc<Server>,
    sock: Rc<UdpSocket>,
    mut s: Session,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    sessions: UdpSessions,
) {
    super::core::connected(&s);
    if let Some(_held) = super::core::enter(&srv, &mut s) {
        if super::core::check_access(&srv, &mut s) {
            match (&srv.conf.ret, srv.conf.proxy.pass.is_some()) {
                (Some(t), _) => {
                    if let Ok(d) = rx.try_recv() {
                        s.bytes_received += d.len() as u64;
                    }
                    let text = t.eval(&s, &srv.maps);
                    if sock.send_to(text.as_bytes(), s.peer).await.is_ok() {
                        s.bytes_sent += text.len() as u64;
                    }
                }
                (None, true) => run_udp(&w, &srv, &sock, &mut s, &mut rx).await,
                (None, false) => {
                    // nginx counts the session's first datagram as it starts.
                    if let Ok(d) = rx.try_recv() {
                        s.bytes_received += d.len() as u64;
                    }
                    match srv.conf.pass.is_some() {
                        true => super::pass::udp(&mut s),
                        false => super::core::no_handler(&mut s),
                    }
                }
            }
        }
    }
    let forget = |m: &mut HashMap<_, (u64, _, _)>| {
        if m.get(&s.peer).is_some_and(|(id, _, _)| *id == s.id) {
            m.remove(&s.peer);
        }
    };
    forget(&mut sessions.borrow_mut());
    super::core::finish(&srv, &s);
    w.connection_closed();
}

/// An upstream UDP socket connected to the server chosen (no connect can fail for UDP
/// but a bad address; nginx's next-upstream applies the same way).
async fn udp_upstream(
    w: &Rc<Worker>,
    srv: &Server,
    s: &mut Session,
) -> Option<(UdpSocket, crate::upstream::Lease, Arc<Group>, usize)> {
    let (group, hash, local) = choose_group(srv, s).await?;
    let key = Key {
        ip: Some(s.peer.ip()),
        hash: hash.as_deref().map(str::as_bytes),
    };
    let mut tried = Tried::default();
    loop {
        let Pick::Server(i, lease) = w.upstreams.pick(&group.group, &key, &tried, Instant::now())
        else {
            no_live(s, &group);
            return None;
        };
        tried.push(i);
        let addr = group.group.servers[i].addr.clone();
        s.attempts.push(Attempt {
            addr: attempt_addr(&addr),
            ..Default::default()
        });
        let began = Instant::now();
        let r = async {
            let Addr::Tcp(a) = &addr else {
                return Err(std::io::Error::other("unix upstream for udp"));
            };
            let target = tokio::net::lookup_host(&**a)
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other("host not found"))?;
            let bind: SocketAddr = match local {
                Some((a, _)) => a,
                None if target.is_ipv4() => ([0, 0, 0, 0], 0).into(),
                None => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let u = UdpSocket::bind(bind).await?;
            u.connect(target).await?;
            Ok(u)
        }
        .await;
        match r {
            Ok(u) => {
                if let Some(a) = s.attempts.last_mut() {
                    a.connect = Some(began.elapsed().as_secs_f64());
                }
                return Some((u, lease, group, i));
            }
            Err(e) => {
                w.upstreams.failed(&group.group, i, Instant::now());
                crate::errlog::error(format_args!(
                    "*{} connect() failed ({}) while connecting to upstream, {}, upstream: \"{addr}\"",
                    s.id,
                    crate::errlog::errno_text(&e),
                    client_text(s)
                ));
                if !srv.conf.proxy.next_upstream || tried.len() >= live_servers(&group) {
                    s.status = 502;
                    return None;
                }
            }
        }
    }
}

/// A UDP direction's rate (nginx's datagrams are never split; a client's datagram that
/// comes while the upload is held back is dropped, as nginx's): the budget of
/// `rate * (seconds + 1)` bytes, and after each datagram of n bytes a pause of n / rate
/// seconds.
struct Pace {
    rate: u64,
    start_sec: u64,
    spent: u64,
    paused_until: Instant,
}

impl Pace {
    fn new(rate: u64) -> Pace {
        Pace {
            rate,
            start_sec: unix_secs(),
            spent: 0,
            paused_until: Instant::now(),
        }
    }

    /// When the next datagram may be read.
    fn ready_at(&self, now: Instant) -> Instant {
        if self.rate == 0 {
            return now;
        }
        let secs = unix_secs().saturating_sub(self.start_sec);
        let allowed = self.rate.saturating_mul(secs + 1);
        let budget = match allowed > self.spent {
            true => now,
            false => now + Duration::from_millis((self.spent - allowed) * 1000 / self.rate + 1),
        };
        budget.max(self.paused_until)
    }

    fn took(&mut self, n: usize) {
        if let Some(pause) = (n as u64 * 1000).checked_div(self.rate) {
            self.spent += n as u64;
            self.paused_until = Instant::now() + Duration::from_millis(pause);
        }
    }
}

async fn run_udp(
    w: &Rc<Worker>,
    srv: &Server,
    sock: &UdpSocket,
    s: &mut Session,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let c = &srv.conf.proxy;
    let Some((up, _lease, group, server)) = udp_upstream(w, srv, s).await else {
        return;
    };
    let began = Instant::now();
    let (mut requests, mut responses) = (0u64, 0u64);
    let (mut sent, mut received) = (0u64, 0u64);
    let mut buf = vec![0u8; 65536];
    let mut inbox_open = true;
    let mut first = None;
    let mut errored = false;
    // nginx: with `proxy_requests`, not before the session had all its datagrams.
    let done = |requests: u64, responses: u64| {
        (c.requests == 0 || requests >= c.requests)
            && c.responses.is_some_and(|r| responses >= r * requests)
    };
    let mut up_pace = Pace::new(ProxyConf::rate(
        c.upload_rate,
        &c.upload_rate_var,
        s,
        &srv.maps,
    ));
    let mut down_pace = Pace::new(ProxyConf::rate(
        c.download_rate,
        &c.download_rate_var,
        s,
        &srv.maps,
    ));
    let mut last = Instant::now();
    loop {
        let deadline = tokio::time::Instant::from_std(last + c.timeout);
        let now = Instant::now();
        let (up_at, down_at) = (up_pace.ready_at(now), down_pace.ready_at(now));
        let (up_ok, down_ok) = (up_at <= now, down_at <= now);
        // The next wake-up of a direction held back by its rate.
        let wake = [(up_ok, up_at), (down_ok, down_at)]
            .iter()
            .filter(|(ok, _)| !ok)
            .map(|(_, at)| *at)
            .min();
        tokio::select! {
            _ = tokio::time::sleep_until(wake.map_or(deadline, tokio::time::Instant::from_std)), if wake.is_some() => continue,
            m = rx.recv(), if inbox_open => match m {
                // nginx reads a client's datagram only as it arrives: one that comes while
                // the upload rate holds the session back is lost.
                Some(_) if !up_ok => continue,
                Some(d) => {
                    last = Instant::now();
                    up_pace.took(d.len());
                    s.bytes_received += d.len() as u64;
                    requests += 1;
                    if up.send(&d).await.is_err() {
                        s.status = 502;
                        break;
                    }
                    sent += d.len() as u64;
                    if done(requests, responses) {
                        break;
                    }
                }
                None => inbox_open = false,
            },
            r = up.recv(&mut buf), if down_ok => match r {
                Ok(n) => {
                    last = Instant::now();
                    down_pace.took(n);
                    received += n as u64;
                    first.get_or_insert_with(Instant::now);
                    if sock.send_to(&buf[..n], s.peer).await.is_ok() {
                        s.bytes_sent += n as u64;
                    }
                    responses += 1;
                    if done(requests, responses) {
                        break;
                    }
                }
                Err(e) => {
                    // An ICMP error (a closed port): nginx counts it as the datagram's reply,
                    // so with `proxy_responses` met the session ends with 200; the server
                    // is marked failed when the session ends (`max_fails`).
                    errored = true;
                    crate::errlog::error(format_args!(
                        "*{} recv() failed ({}) while proxying and reading from upstream, {}",
                        s.id,
                        crate::errlog::errno_text(&e),
                        client_text(s)
                    ));
                    responses += 1;
                    if done(requests, responses) {
                        break;
                    }
                }
            },
            _ = tokio::time::sleep_until(deadline) => {
                // nginx's "udp timed out": 200 if the replies expected so far came.
                if c.responses.is_some_and(|r| responses < r * requests) {
                    crate::errlog::error(format_args!("*{} upstream timed out (110: Connection timed out) while proxying connection, {}", s.id, client_text(s)));
                    s.status = 502;
                }
                break;
            }
        }
    }
    // nginx's finalize: a UDP upstream whose socket had an error is freed as failed.
    if errored {
        w.upstreams.failed(&group.group, server, Instant::now());
    }
    if let Some(a) = s.attempts.last_mut() {
        a.sent = sent;
        a.received = received;
        let base = a.connect.unwrap_or_default();
        a.first_byte = first.map(|t: Instant| base + (t - began).as_secs_f64());
        a.session = Some(base + began.elapsed().as_secs_f64());
    }
}
