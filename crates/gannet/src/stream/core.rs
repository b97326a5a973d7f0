//! The stream core (nginx's ngx_stream_core_module): `server { listen ...; }` blocks, the
//! settings a server inherits from the stream level, and a TCP session from accept to its
//! log line: access rules, `ssl_preread`, the proxy, the log.
//!
//! `listen ADDRESS:PORT | PORT | unix:PATH [default_server] [ssl] [proxy_protocol] [udp]
//! [reuseport] [backlog=N] [rcvbuf=] [sndbuf=] [so_keepalive=] [fastopen=] [ipv6only=]
//! [bind]`: as nginx, a port is required. Several servers may share an address (nginx
//! 1.25.5's virtual servers, gathered in `stream::addresses`): a session starts in its
//! `default_server` (else the first), and the SNI name of `listen ... ssl` (during the
//! handshake, so the chosen server's certificate answers) or of `ssl_preread` (once the
//! ClientHello is read) moves it to the server whose `server_name` matches, with the http
//! side's matcher (`http::router::find_by_name`): exact, `*.suffix`, `prefix.*`, `~regex`.
//! As in nginx, the default server's `set`, `limit_conn` and access rules apply before
//! the move; the chosen server's handler, logs and `error_log` after it.

use super::access::Rules;
use super::log::{Format, Log};
use super::map::Maps;
use super::proxy::ProxyConf;
use super::relay::Sock;
use super::ssl_preread::Preread;
use super::upstream::Group;
use super::variables::Session;
use crate::config::listen::Listen;
use crate::http::regex::Regex;
use crate::http::router::{self, ServerNames};
use crate::runtime::worker::Worker;
use gannet_conf::{setters, ConfError, Directive, Loc};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// What the stream block's parts read while loading.
pub struct LoadCtx {
    pub prefix: PathBuf,
    pub maps: Arc<Maps>,
    pub upstreams: Arc<HashMap<String, Arc<Group>>>,
    pub formats: HashMap<String, Arc<Format>>,
    pub zones: HashMap<String, Arc<super::limit_conn::Zone>>,
    /// Every access log opened, for reopening (SIGUSR1).
    pub logs: std::cell::RefCell<Vec<Arc<Log>>>,
    /// Every error log opened, for reopening (SIGUSR1).
    pub error_files: std::cell::RefCell<Vec<Arc<crate::errlog::Log>>>,
    /// The http side's load state, for the TLS setups (`ssl`).
    pub http: std::cell::RefCell<crate::modules::LoadCtx>,
}

/// A server's settings (the stream level's, then each server's over them).
#[derive(Debug, Clone)]
pub struct ServerConf {
    pub proxy: ProxyConf,
    pub access: Rules,
    /// Rules set at this level (a server's first one drops the inherited ones).
    access_own: bool,
    pub logs: Vec<Arc<Log>>,
    logs_own: bool,
    /// `error_log` of the stream level or the server (the main logs without one).
    pub error_log: Option<Arc<crate::errlog::ErrorLogs>>,
    error_log_own: bool,
    pub preread: Preread,
    pub limits: super::limit_conn::Limits,
    pub ssl: super::ssl::SslConf,
    pub realip: super::realip::Trusted,
    pub proxy_protocol_timeout: Duration,
    /// `resolver` / `resolver_timeout`: names `proxy_pass $var` gives are looked up
    /// through it (the HTTP side's client, `crate::resolver`).
    pub resolver: Option<Arc<crate::resolver::Resolver>>,
    pub resolver_timeout: Duration,
    /// `tcp_nodelay` (default on): TCP_NODELAY on the client's and the upstream's TCP
    /// connections.
    pub tcp_nodelay: bool,
    /// `return`'s text when it is the server's content handler (written after any
    /// `proxy_pass`).
    pub ret: Option<super::variables::Template>,
    /// `pass`: the content handler hands the connection to another listener.
    pub pass: Option<super::pass::Pass>,
    /// `set $var value` (ngx_stream_set_module, server level only): variable index and
    /// value, in order.
    pub sets: Vec<(usize, super::variables::Template)>,
}

impl Default for ServerConf {
    fn default() -> ServerConf {
        ServerConf {
            proxy: Default::default(),
            access: Default::default(),
            access_own: false,
            logs: Vec::new(),
            logs_own: false,
            error_log: None,
            error_log_own: false,
            preread: Default::default(),
            limits: Default::default(),
            ssl: Default::default(),
            realip: Default::default(),
            proxy_protocol_timeout: Duration::from_secs(30),
            resolver: None,
            resolver_timeout: crate::resolver::DEFAULT_TIMEOUT,
            tcp_nodelay: true,
            ret: None,
            pass: None,
            sets: Vec::new(),
        }
    }
}

/// A `server {}` block, loaded.
#[derive(Debug)]
pub struct Server {
    /// `server_name`: what SNI (of `listen ... ssl` or `ssl_preread`) picks it by among
    /// the servers of an address, with the http side's rules (`http::router`).
    pub names: ServerNames<Regex>,
    /// `$server_name`: the first name ("" without `server_name`).
    pub name: Arc<str>,
    /// The `server` block, for the errors about it.
    pub loc: Loc,
    pub conf: ServerConf,
    pub maps: Arc<Maps>,
    /// The stream block's groups by name, for `proxy_pass $var`.
    pub groups: Arc<HashMap<String, Arc<Group>>>,
    /// Its TLS setup, when it has a `listen ... ssl`.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// The groups of addresses `proxy_pass $var` gave.
    pub by_addr: std::sync::Mutex<HashMap<String, Arc<Group>>>,
}

/// A directive of the stream or server level. `in_server`: inside a `server {}`.
pub fn apply(
    d: &Directive,
    c: &mut ServerConf,
    ctx: &LoadCtx,
    in_server: bool,
) -> Result<(), ConfError> {
    let one = || {
        if d.args.len() == 1 {
            Ok(())
        } else {
            Err(d.error(format!(
                "invalid number of arguments in \"{}\" directive",
                d.name
            )))
        }
    };
    match d.name.as_str() {
        "allow" | "deny" => {
            if in_server && !c.access_own {
                c.access = Rules::default();
            }
            c.access_own = in_server;
            c.access.add(d)?;
        }
        "access_log" => {
            if in_server && !c.logs_own {
                c.logs.clear();
            }
            c.logs_own = in_server;
            if let Some(log) = super::log::access_log(d, ctx)? {
                c.logs.push(log);
            }
        }
        "error_log" => {
            let mut opened = ctx.error_files.borrow_mut();
            let log = (&mut c.error_log, &mut c.error_log_own);
            crate::errlog::set_block(d, &ctx.prefix, log, in_server, &mut opened)?;
        }
        "limit_conn" | "limit_conn_log_level" | "limit_conn_dry_run" => {
            c.limits.set(d, &ctx.zones, in_server)?
        }
        n if n.starts_with("ssl_") && n != "ssl_preread" => {
            super::ssl::set(d, &mut c.ssl, &mut ctx.http.borrow_mut())?
        }
        "set_real_ip_from" => c.realip.add(d, &mut ctx.http.borrow_mut().notices)?,
        "resolver" => {
            if d.args.is_empty() {
                return Err(d.error("invalid number of arguments in \"resolver\" directive"));
            }
            c.resolver = Some(Arc::new(crate::resolver::parse(d)?));
        }
        "tcp_nodelay" => {
            one()?;
            c.tcp_nodelay = setters::flag(d)?;
        }
        "resolver_timeout" => {
            one()?;
            c.resolver_timeout = Duration::from_millis(setters::msec_arg(d, 0)?);
        }
        "proxy_protocol_timeout" => {
            one()?;
            c.proxy_protocol_timeout = Duration::from_millis(setters::msec_arg(d, 0)?);
        }
        "ssl_preread" => {
            one()?;
            c.preread.on = setters::flag(d)?;
        }
        "preread_timeout" => {
            one()?;
            c.preread.timeout = Duration::from_millis(setters::msec_arg(d, 0)?);
        }
        "preread_buffer_size" => {
            one()?;
            c.preread.buffer_size = setters::size_arg(d, 0)?.max(1) as usize;
        }
        "proxy_pass" | "return" | "set" | "pass" if !in_server => {
            return Err(d.error(format!("\"{}\" directive is not allowed here", d.name)))
        }
        "set" => {
            if d.args.len() != 2 {
                return Err(d.error("invalid number of arguments in \"set\" directive"));
            }
            let name = d.args[0].strip_prefix('$').unwrap_or_default();
            let i = ctx
                .maps
                .index(name)
                .ok_or_else(|| d.error(format!("invalid variable name \"{}\"", d.args[0])))?;
            let t = super::variables::Template::compile(&d.args[1], &ctx.maps)
                .map_err(|e| d.error(e))?;
            c.sets.push((i, t));
        }
        "return" => {
            one()?;
            if c.ret.is_some() {
                return Err(d.error("\"return\" directive is duplicate"));
            }
            let t = super::variables::Template::compile(&d.args[0], &ctx.maps)
                .map_err(|e| d.error(e))?;
            c.ret = Some(t);
            c.pass = None;
        }
        "proxy_pass" => {
            super::proxy::set(d, &mut c.proxy, ctx)?;
            // The last content handler written wins, as in nginx.
            c.ret = None;
            c.pass = None;
        }
        "pass" => {
            super::pass::set(d, &mut c.pass, &ctx.maps)?;
            c.ret = None;
            c.proxy.pass = None;
        }
        n if n.starts_with("proxy_") => super::proxy::set(d, &mut c.proxy, ctx)?,
        // Sizes of nginx's name hash tables: checked, as gannet's lookup has no table
        // to size.
        "server_names_hash_max_size" | "server_names_hash_bucket_size" if !in_server => {
            one()?;
            match d.name.as_str() {
                "server_names_hash_max_size" => setters::num_arg(d, 0).map(drop)?,
                _ => setters::size_arg(d, 0).map(drop)?,
            }
        }
        "server_names_hash_max_size" | "server_names_hash_bucket_size" => {
            return Err(d.error(format!("\"{}\" directive is not allowed here", d.name)))
        }
        "listen" | "server_name" if !in_server => {
            return Err(d.error(format!("\"{}\" directive is not allowed here", d.name)))
        }
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// A stream `listen` of a server: the address and its options, where it was written, and
/// whether it sets socket options (nginx's `lsopt.set`: one listen of an address may).
pub struct ServerListen {
    pub listen: Listen,
    pub loc: Loc,
    pub sets_options: bool,
}

/// A `server {}` block: its settings over the stream level's, and its listens. Its TLS
/// setup is made by the caller, which knows which addresses are `ssl`.
pub fn server(
    d: &Directive,
    top: &ServerConf,
    ctx: &LoadCtx,
) -> Result<(Server, Vec<ServerListen>), ConfError> {
    if d.block.is_none() || !d.args.is_empty() {
        return Err(d.error("invalid number of arguments in \"server\" directive"));
    }
    let mut conf = top.clone();
    conf.access_own = false;
    conf.logs_own = false;
    conf.error_log_own = false;
    conf.proxy.pass = None;
    conf.limits = top.limits.inherited();
    conf.ssl.certs_inherited = true;
    conf.ssl.keys_inherited = true;
    let mut listens = Vec::new();
    let mut names = ServerNames::default();
    let mut name = None;
    for e in d.block.as_deref().unwrap_or_default() {
        match e.name.as_str() {
            "listen" => listens.push(listen(e)?),
            "server_name" => {
                if e.args.is_empty() {
                    return Err(e.error("invalid number of arguments in \"server_name\" directive"));
                }
                for n in &e.args {
                    // nginx's `$hostname` name: the machine's.
                    let n = match n.eq_ignore_ascii_case("$hostname") {
                        true => super::variables::hostname(),
                        false => n.clone(),
                    };
                    names.add(&n).map_err(|m| e.error(m))?;
                    name.get_or_insert_with(|| router::primary_name(&n));
                }
            }
            _ => apply(e, &mut conf, ctx, true)?,
        }
    }
    if listens.is_empty() {
        return Err(d.error("no \"listen\" is defined for server"));
    }
    if conf.proxy.ssl_enable {
        super::proxy::finish_ssl(&mut conf.proxy, &ctx.prefix)?;
        let mut h = ctx.http.borrow_mut();
        let setup =
            crate::tls::client::build(&conf.proxy.ssl, "proxy_ssl_", &mut h.tls, &d.loc, None)?;
        conf.proxy.client_tls = Some(setup);
    }
    Ok((
        Server {
            names,
            name: Arc::from(name.unwrap_or_default()),
            loc: d.loc.clone(),
            tls: None,
            conf,
            maps: ctx.maps.clone(),
            groups: ctx.upstreams.clone(),
            by_addr: Default::default(),
        },
        listens,
    ))
}

/// A stream `listen`: http's parser for what both have, after the stream checks.
fn listen(d: &Directive) -> Result<ServerListen, ConfError> {
    if d.args.is_empty() {
        return Err(d.error("invalid number of arguments in \"listen\" directive"));
    }
    let arg = &d.args[0];
    let has_port = arg.starts_with("unix:")
        || arg.parse::<u16>().is_ok()
        || arg.rsplit_once(':').is_some_and(|(h, p)| {
            !h.ends_with(':') && !p.contains(']') && p.parse::<u16>().is_ok()
        });
    if !has_port {
        return Err(d.error(format!("no port in \"{arg}\" of the \"listen\" directive")));
    }
    let mut udp = false;
    let mut rest = d.clone();
    rest.args.retain(|a| {
        let is_udp = a == "udp";
        udp |= is_udp;
        !is_udp
    });
    let mut sets_options = false;
    for a in &rest.args[1..] {
        let key = a.split('=').next().unwrap_or_default();
        match key {
            "default" | "http2" | "deferred" | "quic" => {
                return Err(d.error(format!("invalid parameter \"{a}\"")))
            }
            "default_server" | "ssl" | "proxy_protocol" => {}
            _ => sets_options = true,
        }
    }
    let mut l = Listen::parse(&rest)?;
    if udp && l.unix.is_some() {
        return Err(d.error("\"udp\" on a unix socket is not supported"));
    }
    l.udp = udp;
    Ok(ServerListen {
        listen: l,
        loc: d.loc.clone(),
        sets_options,
    })
}

/// nginx's ngx_stream_find_virtual_server, with the SNI `name` as the client sent it
/// (checked and lowercased as nginx's ngx_stream_validate_host): the server of the
/// address it names, or `None` (a bad or unknown name: the current server stays).
pub fn find_virtual(servers: &[Arc<Server>], name: &str) -> Option<Found> {
    if servers.is_empty() || name.is_empty() {
        return None;
    }
    let len = gannet_proto::h1::valid_host(name.as_bytes())?;
    let host = name[..len].to_ascii_lowercase();
    let (srv, regex) = router::find_by_name(servers, |s| &s.names, &host)?;
    Some(Found {
        server: srv.clone(),
        regex: regex.map(|i| (i, host)),
    })
}

/// A server SNI chose, and the `~regex` name (and host) that chose it.
pub struct Found {
    pub server: Arc<Server>,
    regex: Option<(usize, String)>,
}

impl Found {
    /// The session moves to the server: `$server_name`, and the captures of the regex
    /// name that chose it (`$1`.., its named variables), as nginx's regex exec leaves them.
    pub fn enter(self, s: &mut Session) -> Arc<Server> {
        let srv = self.server;
        if let Some((i, host)) = &self.regex {
            if let Some(re) = srv.names.regex.get(*i) {
                if let Some(c) = re.captures(host.as_bytes()) {
                    srv.maps.capture(s, re, &c);
                }
            }
        }
        s.server_name = Some(srv.name.clone());
        srv
    }
}

/// Serve one accepted TCP connection of stream listen `idx`: its default server first,
/// the one SNI names once the handshake or `ssl_preread` has read it.
///
/// Its future holds only the plain path's states: every wait off it (TLS, `ssl_preread`,
/// a PROXY header, the buffered relay, a resolver, an upstream handshake) is a boxed
/// future of its own. With them inline it was 19 KB, which tokio boxed at the spawn and
/// which was moved whole into the error-log scope: a 19 KB `memcpy` per session, two
/// thirds of a short session's user-space instructions
/// (docs/bench/l4-proxy-report.md). The session is pinned where it is made and the
/// error-log scope polls it through that pin, so it is not moved at all.
///
/// Each poll is one turn of the clock (`runtime::clock::Turns`): the times a session
/// takes in one poll (its start, the connect's, the relay's first bytes and last
/// activity) are one clock read, as nginx's cached time.
///
/// Boxed here, so that tokio's task holds a pointer: tokio moves a task's future whole
/// into the task at the spawn and writes its stage (as big) again at the end, two copies
/// of the session's ~1 KB where the box makes one, and its task cell stays small.
pub fn serve_tcp(
    w: Rc<Worker>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    idx: usize,
) -> crate::runtime::clock::Turns<impl std::future::Future<Output = ()>> {
    crate::runtime::clock::Turns::new(Box::pin(serve_tcp_as(w, stream, peer, idx, None, 0)))
}

/// [`serve_tcp`] for a connection another stream server's `pass` handed over: the
/// address it was passed to is its local one, and the passes so far count towards
/// nginx's limit.
pub fn serve_passed(
    w: Rc<Worker>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    idx: usize,
    local: SocketAddr,
    passes: u8,
) -> crate::runtime::clock::Turns<impl std::future::Future<Output = ()>> {
    let session = serve_tcp_as(w, stream, peer, idx, Some(local), passes);
    crate::runtime::clock::Turns::new(Box::pin(session))
}

async fn serve_tcp_as(
    w: Rc<Worker>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    idx: usize,
    local: Option<SocketAddr>,
    passes: u8,
) {
    let Some(conf) = w.config.stream.clone() else {
        w.connection_closed();
        return;
    };
    let (Some(l), Some(srv)) = (conf.listens.get(idx), conf.servers.get(idx)) else {
        w.connection_closed();
        return;
    };
    let virtuals = conf.virtuals.get(idx).map_or(&[][..], Vec::as_slice);
    let mut srv = srv.clone();
    let local = local.unwrap_or_else(|| l.local_of(&stream));
    let mut s = Session::new(Worker::next_conn_id(), peer, local, false);
    s.unix = l.unix.is_some();
    s.passes = passes;
    s.server_name = Some(srv.name.clone());
    let logs = srv.conf.error_log.clone();
    // Pinned in place: the scope polls it through the pin (moving it was a memcpy of its
    // whole size per session).
    let session = std::pin::pin!(async {
        connected(&s);
        // In the event loop only once it has to wait (`relay::Sock`).
        let client = Sock::Raw(stream);
        let passed = run_tcp(&w, &mut srv, virtuals, client, l, &mut s).await;
        if !passed {
            finish(&srv, &s);
        }
        passed
    });
    // A passed connection is still one of the worker's: its new listener counts it out.
    if !crate::errlog::scoped(logs, session).await {
        w.connection_closed();
    }
}

/// nginx's first line of a session (info), and its debug line for a log at `debug`.
pub fn connected(s: &Session) {
    if !crate::errlog::admits(crate::errlog::Level::Info) {
        return;
    }
    if crate::errlog::admits(crate::errlog::Level::Debug) {
        crate::errlog::log(
            crate::errlog::Level::Debug,
            format_args!("*{} stream session: client {}", s.id, s.peer_text()),
        );
    }
    crate::errlog::log(
        crate::errlog::Level::Info,
        format_args!(
            "*{} {}client {} connected to {}",
            s.id,
            if s.udp { "udp " } else { "" },
            s.peer_text(),
            s.local
        ),
    );
}

/// The session's phases up to its content handler; true when `pass` handed the
/// connection to another listener (the session then ends without its log line).
async fn run_tcp(
    w: &Rc<Worker>,
    srv: &mut Arc<Server>,
    virtuals: &[Arc<Server>],
    mut client: Sock,
    l: &Listen,
    s: &mut Session,
) -> bool {
    let default = srv.clone();
    let c = &default.conf;
    let (ssl, pp) = (l.ssl, l.proxy_protocol);
    // Set on the listening socket, the accepted one has it already (`Listen::nodelay`).
    if c.tcp_nodelay && !s.unix && l.nodelay != Some(true) {
        if let Some(r) = client.sock_ref() {
            let _ = r.set_tcp_nodelay(true);
        }
    }
    if pp {
        let Ok(tcp) = client.reg() else {
            s.status = 500;
            return false;
        };
        let who = crate::conn::proxy_protocol::Who {
            id: s.id,
            peer: s.peer,
            local: s.local,
        };
        let start = std::time::Instant::now();
        // Boxed, as every wait off the plain path (see `serve_tcp`).
        let read = crate::conn::proxy_protocol::read_for(tcp, &who, c.proxy_protocol_timeout);
        match Box::pin(read).await {
            Ok(addrs) => s.proxy_protocol = addrs,
            // nginx: a timeout ends the session with 200, a broken header with 400.
            Err(()) if start.elapsed() >= c.proxy_protocol_timeout => return false,
            Err(()) => {
                s.status = 400;
                return false;
            }
        }
        c.realip.apply(s);
    }
    // As nginx's phases: the default server's limits and access rules, then the
    // handshake or the preread, which may move the session to another server.
    let Some(_held) = enter(&default, s) else {
        return false;
    };
    if !check_access(&default, s) {
        return false;
    }
    if ssl {
        return Box::pin(run_tls(w, srv, &default, virtuals, client, s)).await;
    }
    if c.preread.on {
        let Ok(tcp) = client.reg() else {
            s.status = 500;
            return false;
        };
        // Peeked at: the bytes stay in the socket (nginx 1.25.5), for the proxy or for
        // the listener `pass` gives the connection to.
        let preread = super::ssl_preread::run(&c.preread, tcp, s);
        if let Err(status) = Box::pin(preread).await {
            s.status = status;
            return false;
        }
        if let Some(f) = s.sni.as_deref().and_then(|n| find_virtual(virtuals, n)) {
            *srv = f.enter(s);
        }
    }
    if let Some(pass) = &srv.conf.pass {
        let conn = match client.into_std() {
            Ok(tcp) => super::pass::Conn::Plain(tcp),
            Err(_) => {
                s.status = 500;
                return false;
            }
        };
        return Box::pin(hand_over(w, srv, &default, pass, conn, false, s)).await;
    }
    content(w, srv, &default, client, Vec::new(), s).await;
    false
}

/// `listen ... ssl`: the handshake, then the content phase over TLS. A future of its own,
/// boxed by the caller: the TLS states are most of a session's future, and a plain
/// session's future is moved whole (at the spawn and into its error-log scope), so it is
/// kept to what the plain path needs.
async fn run_tls(
    w: &Rc<Worker>,
    srv: &mut Arc<Server>,
    default: &Arc<Server>,
    virtuals: &[Arc<Server>],
    client: Sock,
    s: &mut Session,
) -> bool {
    let c = &default.conf;
    let mut found = None;
    let choose = |name: &str| {
        found = find_virtual(virtuals, name);
        pick_tls(default, found.as_ref().map(|f| &f.server))
    };
    let Ok(tcp) = client.into_tokio() else {
        s.status = 500;
        return false;
    };
    let tls = super::ssl::handshake(choose, c.ssl.handshake_timeout, tcp, s).await;
    if let Some(f) = found {
        *srv = f.enter(s);
    }
    let Some(mut tls) = tls else {
        s.status = 500;
        return false;
    };
    // `ssl_preread` after the handshake (nginx's preread phase follows its ssl phase, in
    // the server SNI chose): TLS cannot be peeked at, so what the client sent first is
    // read, and goes to the upstream ahead of the rest.
    let mut head = Vec::new();
    let preread = &srv.conf.preread;
    if preread.on {
        if let Err(status) = super::ssl_preread::read(preread, &mut tls, &mut head, s).await {
            s.status = status;
            return false;
        }
    }
    if let Some(pass) = &srv.conf.pass {
        let conn = super::pass::Conn::Tls(Box::new(tls));
        return hand_over(w, srv, default, pass, conn, !head.is_empty(), s).await;
    }
    content(w, srv, default, tls, head, s).await;
    false
}

/// `pass` as the content handler, in the error log of the server SNI moved the session
/// to; true when the connection went to its new listener.
async fn hand_over(
    w: &Rc<Worker>,
    srv: &Arc<Server>,
    default: &Arc<Server>,
    pass: &super::pass::Pass,
    conn: super::pass::Conn,
    preread: bool,
    s: &mut Session,
) -> bool {
    use super::pass::Handoff;
    let run = async { super::pass::handler(w, pass, srv, conn, preread, s) };
    let done = match Arc::ptr_eq(srv, default) {
        true => run.await,
        false => crate::errlog::scoped(srv.conf.error_log.clone(), run).await,
    };
    match done {
        Handoff::Passed => true,
        Handoff::End(status) => {
            s.status = status;
            false
        }
    }
}

/// nginx's SNI callback: the TLS setup of the server the name chose (`None`: no server
/// has it, the default stays), or the default server's when the chosen one has no
/// certificate; the chosen server's `ssl_reject_handshake` refuses the handshake.
fn pick_tls(default: &Server, chosen: Option<&Arc<Server>>) -> super::ssl::Chosen {
    use super::ssl::Chosen;
    let own = chosen.map_or(default, |c| &**c);
    match &own.tls {
        Some(t) if t.reject_handshake => Chosen::Reject,
        Some(t) if t.config.is_some() => Chosen::Go(t.clone()),
        _ => match &default.tls {
            Some(t) if t.config.is_some() => Chosen::Go(t.clone()),
            _ => Chosen::Reject,
        },
    }
}

/// The content phase (`return` or the proxy), in the error log of the server SNI moved
/// the session to.
async fn content<C>(
    w: &Rc<Worker>,
    srv: &Arc<Server>,
    default: &Arc<Server>,
    mut client: C,
    head: Vec<u8>,
    s: &mut Session,
) where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let run = async {
        match (&srv.conf.ret, srv.conf.proxy.pass.is_some()) {
            (Some(t), _) => super::return_::tcp(&mut client, &t.eval(s, &srv.maps), s).await,
            (None, true) => super::proxy::tcp(w, srv, client, head, s).await,
            (None, false) => no_handler(s),
        }
    };
    match Arc::ptr_eq(srv, default) {
        true => run.await,
        false => crate::errlog::scoped(srv.conf.error_log.clone(), run).await,
    }
}

/// A server with neither `proxy_pass` nor `return` (nginx 1.27.1+ loads it, e.g. one
/// that only does `ssl_reject_handshake`): its sessions end in the content phase with 500.
pub fn no_handler(s: &mut Session) {
    if crate::errlog::admits(crate::errlog::Level::Debug) {
        crate::errlog::log(
            crate::errlog::Level::Debug,
            format_args!("*{} no handler for server", s.id),
        );
    }
    s.status = 500;
}

/// The preaccess phase (`set`, then `limit_conn`): the session's places in its zones, or
/// `None` (and `$status` 503) when a limit is reached.
pub fn enter(srv: &Server, s: &mut Session) -> Option<super::limit_conn::Held> {
    for (i, t) in &srv.conf.sets {
        let v = t.eval(s, &srv.maps);
        if s.set_values.len() <= *i {
            s.set_values.resize(srv.maps.len(), None);
        }
        s.set_values[*i] = Some(v);
    }
    let held = srv.conf.limits.enter(s, &srv.maps).ok();
    if held.is_none() {
        s.status = 503;
    }
    held
}

/// The access phase: false (and `$status` 403) for a denied client.
pub fn check_access(srv: &Server, s: &mut Session) -> bool {
    if srv.conf.access.allows(s.client_ip()) {
        return true;
    }
    crate::errlog::error(format_args!(
        "*{} access forbidden by rule, client: {}, server: {}",
        s.id,
        s.client_text(),
        s.local
    ));
    s.status = 403;
    false
}

/// The session's end: its log lines.
pub fn finish(srv: &Server, s: &Session) {
    for log in &srv.conf.logs {
        log.write(s, &srv.maps);
    }
}
