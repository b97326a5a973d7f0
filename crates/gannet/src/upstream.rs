//! `upstream NAME { ... }` groups (nginx's ngx_http_upstream module) and each worker's view
//! of them: which server the next request goes to, which servers recently failed, and the
//! idle connections kept open for reuse.
//!
//! Directives inside `upstream`: `server ADDRESS [weight=N] [max_fails=N] [fail_timeout=T]
//! [max_conns=N] [slow_start=T] [backup] [down]`, `keepalive N`, `keepalive_timeout`, `keepalive_requests`, `keepalive_time`,
//! `queue N [timeout=T]` (nginx Plus's: wait for a server under `max_conns` instead of
//! failing), `zone` (accepted: gannet's state is per worker, there is nothing to share;
//! so `max_conns` counts per worker, as nginx's does without a zone), and one balancing
//! method: smooth weighted round robin by default, or `least_conn`, `ip_hash`,
//! `hash KEY [consistent]`, `random [two [least_conn]]` with nginx's arithmetic (see
//! [`balance`]). As in nginx, `backup` servers go only with round robin and `least_conn`;
//! unlike nginx, which warns and keeps the last, a second method in a block is an error.
//!
//! `server NAME resolve` (nginx 1.27.3's, with `zone` and a `resolver` in the block or in
//! http): the name is looked up through the resolver when the workers start and again each
//! time its answer's TTL (or the resolver's `valid=`) has passed, requests or not (one
//! worker does it for all, [`keep_resolved`]), so its addresses follow DNS without a
//! reload; a name that stops existing leaves the server out until it resolves again, a
//! name server that fails keeps the last addresses, and a reload starts from them
//! ([`kept_addrs`]), as in nginx. As nginx's peers, a request tries each address of the
//! name once (they count in `*_next_upstream_tries`), and a group whose one server has one
//! address never takes it out. Unlike nginx, where each address is a peer of its own, the
//! addresses of one server share its weight and failure count and take turns
//! ([`Resolving`]).
//!
//! Like nginx's, the state is per worker: no lock on the request path, and a worker that
//! saw a server fail stops sending to it for `fail_timeout` on its own. Failures are counted
//! as nginx's round robin counts them: a success does not clear the count while
//! `fail_timeout` since the last failure runs (so `max_fails` failures among successes take
//! the server out); each failure lowers the server's effective weight by
//! `weight / max_fails`, regained one unit per choice; a group of one server is never
//! taken out.
//!
//! `proxy_pass` (and the other `*_pass`es) to `host:port` whose host is a name make an
//! implicit group, as nginx's: the name is looked up when the config is loaded and each
//! of its addresses is a server ([`implicit`]).
//!
//! Kept connections: `keepalive N` idle ones per worker, closed when `keepalive_timeout`
//! passes (on the worker's housekeeping tick, as nginx's timer does). One deliberate
//! difference: an HTTP upstream's connection freed while N are idle already stays for a
//! second as surplus instead of closing at once ([`SURPLUS_GRACE`] says why).
//!
//! Callers (the gateways, the HTTP proxy) choose a server per attempt with
//!
//! ```text
//! let hash = up.hash_key(req);              // once per request: `hash`'s KEY, evaluated
//! let key = Key { ip: Some(req.conn.peer.ip()), hash: hash.as_deref().map(str::as_bytes) };
//! loop {
//!     match upstreams.pick(&up, &key, &tried, Instant::now()) { ... }   // push to `tried`
//! }
//! ```
//!
//! then report the outcome with [`Upstreams::failed`] or [`Upstreams::succeeded`]; the
//! [`Lease`] of a pick holds the server's connection count (for `max_conns`, `least_conn`
//! and `random two`) until it is dropped.

mod balance;
mod kept_addrs;

use gannet_conf::{setters, ConfError, Directive};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;

pub use balance::Method;

/// An address a request can be sent to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Addr {
    /// `host:port`, shared: each attempt notes its address (`$upstream_addr`) with a count,
    /// not a copy.
    Tcp(Arc<str>),
    /// A socket's path, shared as `Tcp`'s text is (a FastCGI pool is usually one).
    Unix(Arc<std::path::Path>),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(a) => f.write_str(a),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl Addr {
    /// `host:port`, `[v6]:port` or `unix:/path`; `None` for anything else (an upstream name).
    pub fn parse(a: &str) -> Option<Addr> {
        if let Some(path) = a.strip_prefix("unix:") {
            return (!path.is_empty()).then(|| Addr::Unix(Arc::from(std::path::Path::new(path))));
        }
        let (host, port) = a.rsplit_once(':')?;
        let ok = !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0);
        ok.then(|| Addr::Tcp(a.into()))
    }
}

#[derive(Debug)]
pub struct Server {
    pub addr: Addr,
    pub weight: i64,
    pub max_fails: u32,
    pub fail_timeout: Duration,
    /// Most connections in use at once (per worker); 0: no limit.
    pub max_conns: usize,
    /// `slow_start=T` (nginx Plus's, documented there; nginx OSS has only the struct
    /// field): a server back from being unavailable ramps its weight up from 0 over T.
    pub slow_start: Option<Duration>,
    pub backup: bool,
    pub down: bool,
    /// `resolve` with a name: its addresses are looked up at run time.
    pub resolve: Option<Resolving>,
    /// Its `metrics` key (0: not counted).
    pub metrics: crate::runtime::metrics::Key,
}

impl Server {
    /// `server ADDR` with nginx's defaults (weight 1, max_fails 1, fail_timeout 10s).
    pub fn new(addr: Addr) -> Server {
        Server {
            addr,
            weight: 1,
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
            max_conns: 0,
            slow_start: None,
            backup: false,
            down: false,
            resolve: None,
            metrics: 0,
        }
    }
}

/// A `server NAME resolve`'s name and what it resolved to last.
#[derive(Debug)]
pub struct Resolving {
    host: String,
    port: u16,
    resolver: Arc<crate::resolver::Resolver>,
    timeout: Duration,
    /// The last addresses found (kept when a name server fails, as nginx does), and
    /// whether a lookup has ended yet (until then a request looks the name up itself).
    last: std::sync::Mutex<(Vec<IpAddr>, bool)>,
    /// How many addresses `last` holds: the server's peers, read without the lock.
    count: std::sync::atomic::AtomicUsize,
    /// Which of them the next request takes first.
    turn: std::sync::atomic::AtomicUsize,
    /// Where the addresses are kept for the next config after a reload.
    kept: Option<&'static kept_addrs::Slot>,
}

impl Resolving {
    /// How many addresses the name has now (nginx's peers of the server).
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The addresses a request tries, the next in turn first and the others after it
    /// fails (each is a peer of its own to nginx's round robin); empty while the name has
    /// none. Before the first lookup has ended, the request looks the name up itself.
    pub async fn addrs(&self) -> Vec<Addr> {
        let started = self.last.lock().unwrap_or_else(|e| e.into_inner()).1;
        if !started {
            self.refresh().await;
        }
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let ips = &last.0;
        let first = match ips.len() {
            0 => return Vec::new(),
            n => self.turn.fetch_add(1, Ordering::Relaxed) % n,
        };
        (0..ips.len())
            .map(|k| {
                let ip = ips[(first + k) % ips.len()];
                Addr::Tcp(std::net::SocketAddr::new(ip, self.port).to_string().into())
            })
            .collect()
    }

    /// Look the name up now and keep what is found: the time until the next lookup, as
    /// nginx's zone module times it (ngx_http_upstream_zone_resolve_handler): when the
    /// answer expires (its TTL, or `valid=`; nginx adds a second there because its clock
    /// counts seconds and the answer must have expired in its cache), the resolver's
    /// `valid=` (else 10 s) after a name that does not exist, `resolver_timeout` (at
    /// least a second) after a name server failed. Never less than a second: a TTL of 0
    /// does not make it ask in a loop.
    async fn refresh(&self) -> Duration {
        let found = self.resolver.lookup(&self.host, self.timeout).await;
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.1 = true;
        let wait = match found {
            Ok((ips, until)) => {
                last.0 = ips;
                until.saturating_duration_since(now)
            }
            Err(f) => {
                crate::errlog::log(
                    crate::errlog::Level::Error,
                    format_args!("{} could not be resolved ({f})", self.host),
                );
                if f != crate::resolver::Failure::NotFound {
                    return self.timeout.max(Duration::from_secs(1));
                }
                last.0.clear();
                self.resolver.valid().unwrap_or(Duration::from_secs(10))
            }
        };
        self.count.store(last.0.len(), Ordering::Relaxed);
        if let Some(k) = self.kept {
            k.write(&last.0);
        }
        wait.max(Duration::from_secs(1))
    }
}

/// Keep `up`'s `server NAME resolve` number `i` resolved for as long as the config
/// serves: looked up at once, then again each time the answer expires (nginx's resolve
/// timer), whether requests come or not. One worker runs it for every worker, as nginx
/// gives each name to one worker.
pub async fn keep_resolved(up: Arc<Upstream>, i: usize) {
    let Some(r) = up.servers.get(i).and_then(|s| s.resolve.as_ref()) else {
        return;
    };
    loop {
        let wait = r.refresh().await;
        tokio::time::sleep(wait).await;
    }
}

/// Every `server NAME resolve` of these groups: what [`keep_resolved`] is run for.
pub fn resolving<'a>(
    groups: impl IntoIterator<Item = &'a Arc<Upstream>>,
) -> Vec<(Arc<Upstream>, usize)> {
    let mut out = Vec::new();
    for up in groups {
        for (i, s) in up.servers.iter().enumerate() {
            if s.resolve.is_some() {
                out.push((up.clone(), i));
            }
        }
    }
    out
}

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<Server>,
    /// Idle connections each worker keeps (`keepalive N`); 0: none.
    pub keepalive: usize,
    pub keepalive_timeout: Duration,
    pub keepalive_requests: u64,
    /// `keepalive_time`: how long a kept connection may be used, from when it was made.
    pub keepalive_time: Duration,
    /// `queue N timeout=T`: requests that may wait for a server under `max_conns`.
    pub queue: Option<(usize, Duration)>,
    pub method: Method,
    /// Whether a server has `slow_start` (the balancer tracks ramps only then).
    pub slow_start: bool,
    /// Per server: whether its active health checks pass (`health_check`; always true
    /// without them). Shared by every worker of the config: the checks run in one worker
    /// and the balancers of all read it.
    pub health: Box<[AtomicBool]>,
}

impl Upstream {
    /// A round-robin group of these addresses with nginx's defaults (an implicit group, a
    /// stream `proxy_pass` with variables naming an address or a name).
    pub fn of_addrs(name: &str, addrs: Vec<Addr>) -> Upstream {
        Upstream {
            health: addrs.iter().map(|_| AtomicBool::new(true)).collect(),
            servers: addrs.into_iter().map(Server::new).collect(),
            ..Upstream::empty(name.to_string())
        }
    }

    /// A group without servers, with nginx's defaults (round robin, no kept connections).
    fn empty(name: String) -> Upstream {
        Upstream {
            name,
            servers: Vec::new(),
            keepalive: 0,
            keepalive_timeout: Duration::from_secs(60),
            keepalive_requests: 1000,
            keepalive_time: Duration::from_secs(3600),
            queue: None,
            method: Method::RoundRobin,
            slow_start: false,
            health: Box::new([]),
        }
    }

    /// How many peers one request may try (nginx's `peer.tries`): the servers not marked
    /// `down`, backups included, a `server NAME resolve` counting each of its addresses.
    pub fn tries(&self) -> usize {
        self.servers
            .iter()
            .filter(|s| !s.down)
            .map(|s| s.resolve.as_ref().map_or(1, Resolving::count))
            .sum()
    }

    /// One peer: nginx's `single`, never taken out for its failures (a `server NAME
    /// resolve` is one while its name has one address).
    pub fn single(&self) -> bool {
        self.servers.len() == 1
            && self.servers[0]
                .resolve
                .as_ref()
                .is_none_or(|r| r.count() == 1)
    }

    pub fn healthy(&self, i: usize) -> bool {
        self.health.get(i).is_none_or(|h| h.load(Ordering::Relaxed))
    }

    pub fn set_healthy(&self, i: usize, ok: bool) {
        if let Some(h) = self.health.get(i) {
            h.store(ok, Ordering::Relaxed);
        }
    }

    /// The key `hash KEY` hashes, evaluated for this request; `None` for the other methods.
    pub fn hash_key(&self, req: &crate::http::request::Request) -> Option<String> {
        self.method.key().map(|k| k.eval(req, None))
    }
}

/// What a request gives the balancing methods: the client's address (`ip_hash`; `None` for
/// a unix-socket client) and the evaluated `hash` key ([`Upstream::hash_key`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Key<'a> {
    pub ip: Option<IpAddr>,
    pub hash: Option<&'a [u8]>,
}

/// Where a connection whose answer ended cleanly goes back ([`Upstreams::put_idle`]).
#[derive(Clone, Copy)]
pub struct Slot {
    pub server: usize,
    /// What the connection is over (see [`Idle`]).
    pub kind: u64,
    /// Requests it has carried, the one just answered included.
    pub requests: u64,
    /// When the connection was made (`keepalive_time`).
    pub born: Instant,
    /// May stay as surplus over `keepalive` for a moment ([`SURPLUS_GRACE`]).
    pub linger: bool,
}

/// The servers one request has tried, in order (what [`Upstreams::pick`] skips). The usual
/// one or two are kept inline: a Vec was an allocation per proxied request.
#[derive(Default)]
pub struct Tried {
    few: [usize; 4],
    len: usize,
    more: Vec<usize>,
}

impl Tried {
    pub fn push(&mut self, server: usize) {
        if self.len < self.few.len() {
            self.few[self.len] = server;
        } else {
            if self.more.is_empty() {
                self.more.extend_from_slice(&self.few);
            }
            self.more.push(server);
        }
        self.len += 1;
    }
}

impl std::ops::Deref for Tried {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match self.few.get(..self.len) {
            Some(few) => few,
            None => &self.more,
        }
    }
}

/// The http level's `resolver` and `resolver_timeout`, for `server ... resolve`.
pub type HttpResolver = (Option<Arc<crate::resolver::Resolver>>, Option<Duration>);

/// Parse an `upstream` block.
pub fn parse(d: &Directive, http: &HttpResolver) -> Result<Upstream, ConfError> {
    let mut up = Upstream::empty(d.args[0].clone());
    let mut method_set = false;
    let mut zone = false;
    let (mut resolver, mut resolver_timeout) = (None, None);
    // Servers with `resolve`: their names are looked up once the block's resolver is known.
    let mut names = Vec::new();
    for s in d.block.as_deref().unwrap_or_default() {
        let nargs = |lo: usize, hi: usize| {
            if (lo..=hi).contains(&s.args.len()) {
                Ok(())
            } else {
                Err(s.error(format!(
                    "invalid number of arguments in \"{}\" directive",
                    s.name
                )))
            }
        };
        match s.name.as_str() {
            "server" => {
                nargs(1, 9)?;
                let (srv, name) = parse_server(s)?;
                if let Some(name) = name {
                    names.push((up.servers.len(), name));
                }
                up.servers.push(srv);
            }
            "resolver" => {
                if resolver.is_some() {
                    return Err(s.error("\"resolver\" directive is duplicate"));
                }
                resolver = Some(Arc::new(crate::resolver::parse(s)?));
            }
            "resolver_timeout" => {
                nargs(1, 1)?;
                resolver_timeout = Some(Duration::from_millis(setters::msec_arg(s, 0)?));
            }
            "zone" => {
                nargs(1, 2)?;
                zone = true;
            }
            "keepalive" => {
                nargs(1, 1)?;
                up.keepalive = setters::num_arg(s, 0)? as usize;
                if up.keepalive == 0 {
                    return Err(s.error(format!(
                        "invalid value \"{}\" in \"keepalive\" directive",
                        s.args[0]
                    )));
                }
            }
            "keepalive_timeout" => {
                nargs(1, 1)?;
                up.keepalive_timeout = Duration::from_millis(setters::msec_arg(s, 0)?);
            }
            "keepalive_requests" => {
                nargs(1, 1)?;
                up.keepalive_requests = setters::num_arg(s, 0)?;
            }
            "queue" => {
                nargs(1, 2)?;
                let n = setters::num_arg(s, 0)? as usize;
                let mut timeout = Duration::from_secs(60);
                if let Some(t) = s.args.get(1) {
                    let v = t
                        .strip_prefix("timeout=")
                        .and_then(setters::msec)
                        .ok_or_else(|| s.error(format!("invalid parameter \"{t}\"")))?;
                    timeout = Duration::from_millis(v);
                }
                up.queue = Some((n, timeout));
            }
            "keepalive_time" => {
                nargs(1, 1)?;
                up.keepalive_time = Duration::from_millis(setters::msec_arg(s, 0)?);
            }
            "least_conn" | "ip_hash" | "hash" | "random" => {
                // nginx warns and keeps the last; one of two was surely not meant.
                if std::mem::replace(&mut method_set, true) {
                    return Err(s.error("load balancing method redefined"));
                }
                up.method = Method::parse(s)?;
            }
            _ => return Err(s.error(format!("\"{}\" directive is not allowed here", s.name))),
        }
    }
    if up.servers.is_empty() {
        return Err(d.error(format!("no servers are inside upstream \"{}\"", up.name)));
    }
    // nginx checks only the servers after the method line; any order is meant the same.
    let refused = |param: &str, prefix: bool| {
        let found = d.block.iter().flatten().find(|s| {
            s.name == "server"
                && s.args
                    .iter()
                    .skip(1)
                    .any(|a| a == param || (prefix && a.starts_with(param)))
        });
        match found {
            Some(s) => Err(s.error(format!(
                "balancing method does not support parameter \"{}\"",
                param.trim_end_matches('=')
            ))),
            None => Ok(()),
        }
    };
    if !up.method.allows_backup() {
        refused("backup", false)?;
    }
    if !up.method.allows_slow_start() {
        refused("slow_start=", true)?;
    }
    if !names.is_empty() {
        let at = format!("{}:{}", d.loc.file, d.loc.line);
        if !zone {
            return Err(ConfError::bare(format!(
                "resolving names at run time requires upstream \"{}\" in {at} to be in shared memory",
                up.name
            )));
        }
        let Some(resolver) = resolver.or_else(|| http.0.clone()) else {
            return Err(ConfError::bare(format!(
                "no resolver defined to resolve names at run time in upstream \"{}\" in {at}",
                up.name
            )));
        };
        let timeout = resolver_timeout
            .or(http.1)
            .unwrap_or(crate::resolver::DEFAULT_TIMEOUT);
        for (i, (host, port)) in names {
            // What the name resolved to under the previous config: the servers start from
            // it, as nginx's do after a reload.
            let kept = kept_addrs::slot(&up.name, &host);
            let ips = kept.map(kept_addrs::Slot::read).unwrap_or_default();
            let n = ips.len();
            up.servers[i].resolve = Some(Resolving {
                host,
                port,
                resolver: resolver.clone(),
                timeout,
                count: n.into(),
                last: std::sync::Mutex::new((ips, n > 0)),
                turn: Default::default(),
                kept,
            });
        }
    }
    up.method.finish(&up.servers);
    up.slow_start = up.servers.iter().any(|s| s.slow_start.is_some());
    up.health = up.servers.iter().map(|_| AtomicBool::new(true)).collect();
    Ok(up)
}

/// nginx's implicit upstream (`ngx_http_upstream_add`) for a `*_pass` to `host:port` whose
/// host is a name: the name is looked up once, as the config is loaded (the system's
/// resolver, IPv4 addresses first as nginx orders them), and each address is a server of a
/// group named `host:port`, kept in `groups` so that every `*_pass` to the same `host:port`
/// shares it and one with variables whose value names it finds it (as nginx looks its
/// upstreams up). `None` for an address (nothing to look up) or a name that does not
/// resolve, which is then looked up when connecting (nginx refuses such a config).
pub fn implicit(
    groups: &mut HashMap<String, Arc<Upstream>>,
    host: &str,
    port: u16,
) -> Option<Arc<Upstream>> {
    use std::net::ToSocketAddrs;
    if crate::resolver::is_literal(host) {
        return None;
    }
    let key = format!("{host}:{port}");
    if let Some(up) = groups.get(&key) {
        return Some(up.clone());
    }
    let found: Vec<std::net::SocketAddr> = (host, port).to_socket_addrs().ok()?.collect();
    let mut addrs: Vec<std::net::SocketAddr> = Vec::new();
    for a in found
        .iter()
        .filter(|a| a.is_ipv4())
        .chain(found.iter().filter(|a| a.is_ipv6()))
    {
        if !addrs.contains(a) {
            addrs.push(*a);
        }
    }
    if addrs.is_empty() {
        return None;
    }
    let addrs = addrs
        .iter()
        .map(|a| Addr::Tcp(a.to_string().into()))
        .collect();
    let up = Arc::new(Upstream::of_addrs(&key, addrs));
    groups.insert(key, up.clone());
    Some(up)
}

/// A `server` line, with the name and port to look up at run time for `resolve`.
fn parse_server(s: &Directive) -> Result<(Server, Option<(String, u16)>), ConfError> {
    let resolve = s.args[1..].iter().any(|a| a == "resolve");
    if resolve && !s.args[0].contains(':') && !s.args[0].starts_with("unix:") {
        // nginx's default port for a server without one.
        let mut s = s.clone();
        s.args[0].push_str(":80");
        return parse_server(&s);
    }
    let addr = Addr::parse(&s.args[0]).ok_or_else(|| {
        s.error(format!(
            "invalid address \"{}\" in \"server\" (host:port or unix:/path)",
            s.args[0]
        ))
    })?;
    let mut srv = Server::new(addr);
    for a in &s.args[1..] {
        let bad = || s.error(format!("invalid parameter \"{a}\""));
        if let Some(v) = a.strip_prefix("weight=") {
            srv.weight = setters::num(v).filter(|&w| w > 0).ok_or_else(bad)? as i64;
        } else if let Some(v) = a.strip_prefix("max_fails=") {
            srv.max_fails = setters::num(v).ok_or_else(bad)? as u32;
        } else if let Some(v) = a.strip_prefix("fail_timeout=") {
            srv.fail_timeout = Duration::from_secs(setters::sec(v).ok_or_else(bad)?);
        } else if a == "backup" {
            srv.backup = true;
        } else if a == "down" {
            srv.down = true;
        } else if let Some(v) = a.strip_prefix("max_conns=") {
            srv.max_conns = setters::num(v).ok_or_else(bad)? as usize;
        } else if let Some(v) = a.strip_prefix("slow_start=") {
            let ms = setters::msec(v).ok_or_else(bad)?;
            srv.slow_start = (ms > 0).then(|| Duration::from_millis(ms));
        } else if a == "resolve" {
            // See the end: only names are looked up.
        } else {
            return Err(bad());
        }
    }
    let name = match &srv.addr {
        Addr::Tcp(a) if resolve => a
            .rsplit_once(':')
            .filter(|(h, _)| !crate::resolver::is_literal(h))
            .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?))),
        _ => None,
    };
    Ok((srv, name))
}

/// A connection to an upstream server: a socket, or TLS over one (`tls::client`).
pub trait Io: AsyncRead + AsyncWrite + AsFd + Unpin {
    /// Whether the peer's bytes wait above the socket (decrypted or not), where a look at
    /// the socket does not see them.
    fn holds_input(&mut self) -> bool {
        false
    }

    /// Whether the event loop has seen the socket readable since a read last drained it.
    /// False means nothing (no byte, no close) has come since, as far as the loop knows,
    /// and no system call is needed to tell; true means look.
    fn maybe_readable(&self) -> bool;
}
impl Io for tokio::net::TcpStream {
    fn maybe_readable(&self) -> bool {
        read_ready(|cx| self.poll_read_ready(cx))
    }
}
impl Io for tokio::net::UnixStream {
    fn maybe_readable(&self) -> bool {
        read_ready(|cx| self.poll_read_ready(cx))
    }
}

/// tokio's read readiness of a socket, without waiting: a read that took less than it
/// asked for, or found nothing, clears it; an epoll event sets it again.
fn read_ready(poll: impl FnOnce(&mut Context<'_>) -> Poll<std::io::Result<()>>) -> bool {
    // The waker is never needed: nothing waits on an idle connection.
    !poll(&mut Context::from_waker(std::task::Waker::noop())).is_pending()
}

pub type Conn = Box<dyn Io>;

/// An idle connection kept for reuse.
struct Idle {
    server: usize,
    /// What the connection is over: 0 for plain, else the TLS setup and name it was made
    /// with ([`Upstreams::take_idle`] hands it only to requests that would make the same).
    kind: u64,
    conn: Conn,
    since: Instant,
    requests: u64,
    born: Instant,
    /// The server's `metrics` key, whose idle gauge counts this connection.
    metrics: crate::runtime::metrics::Key,
}

impl Idle {
    /// Taken out of the pool (reused, closed or expired): no longer counted idle.
    fn left(&self) {
        crate::runtime::metrics::gauge_add(self.metrics, crate::runtime::metrics::zone::IDLE, -1);
    }
}

#[derive(Default)]
struct GroupState {
    /// Smooth weighted round robin: each server's current weight.
    current: Vec<i64>,
    /// Per server: its failures, as nginx's round robin counts them.
    fails: Vec<Fails>,
    /// Per server: how far its effective weight is below its weight (scaled as
    /// `balance::WEIGHT_SCALE`), nginx's `weight - effective_weight`: each failure lowers it
    /// by `weight / max_fails`, each choice it takes part in raises it by one again.
    deficit: Vec<i64>,
    /// Per server: connections in use (for `max_conns`).
    active: Vec<usize>,
    /// Per server with `slow_start`: when it last became usable again (its weight ramps
    /// up from then), and whether it was seen failing its health checks.
    ramp: Vec<(Option<Instant>, bool)>,
    /// Oldest first (each is pushed when freed); taken newest first, so the ones at the
    /// front are those no request needed lately.
    idle: VecDeque<Idle>,
    /// The group's `keepalive` and `keepalive_timeout`, for the worker's sweep.
    keep: (usize, Duration),
    /// Requests waiting in the `queue`, and how they are woken when a server frees up.
    queued: usize,
    freed: Rc<Notify>,
}

/// A server's failures, kept as nginx's round robin keeps them (`fails`, `accessed`,
/// `checked`): the count is not reset by a success while `fail_timeout` since the last
/// failure runs (so `max_fails` failures among successes take the server out), only by a
/// success of a request sent once that time had passed; nor by time alone.
#[derive(Clone, Copy)]
struct Fails {
    count: u32,
    /// The last failure.
    accessed: Option<Instant>,
    /// The last failure, or the first choice of the server once `fail_timeout` after it
    /// had passed.
    checked: Instant,
}

impl Fails {
    fn new(now: Instant) -> Fails {
        Fails {
            count: 0,
            accessed: None,
            checked: now,
        }
    }

    /// Out of use: `max_fails` failures, the last within `fail_timeout`.
    fn out(&self, s: &Server, now: Instant) -> bool {
        s.max_fails > 0
            && self.count >= s.max_fails
            && now.saturating_duration_since(self.checked) <= s.fail_timeout
    }
}

/// What [`Upstreams::pick`] found.
pub enum Pick {
    /// This server; the lease gives its `max_conns` slot back when dropped.
    Server(usize, Lease),
    /// Every usable server is at `max_conns`: the request may wait in the queue.
    Full,
    /// No server is usable.
    None,
}

/// A server's slot under `max_conns`, held while a request uses one of its connections.
pub struct Lease {
    ups: Rc<RefCell<Groups>>,
    key: usize,
    server: usize,
    /// The server's `metrics` key, whose active gauge counts the lease.
    metrics: crate::runtime::metrics::Key,
}

impl Drop for Lease {
    fn drop(&mut self) {
        crate::runtime::metrics::gauge_add(self.metrics, crate::runtime::metrics::zone::ACTIVE, -1);
        if let Some(g) = self.ups.borrow_mut().get_mut(&self.key) {
            if let Some(a) = g.active.get_mut(self.server) {
                *a = a.saturating_sub(1);
            }
            // Only a request waiting in the `queue` needs the word (with none, the notice
            // would be kept for the next one to wait, which would wake it for nothing).
            if g.queued > 0 {
                g.freed.notify_one();
            }
        }
    }
}

/// A worker's state for every upstream group, keyed by the group's address in the config
/// (the config outlives the worker).
#[derive(Default)]
pub struct Upstreams {
    groups: Rc<RefCell<Groups>>,
}

fn group_key(up: &Arc<Upstream>) -> usize {
    Arc::as_ptr(up) as usize
}

/// The worker's groups by [`group_key`]. A request looks its group up five times (pick,
/// idle take and put, success, the lease's end): foldhash's few instructions for an
/// address where the default SipHash cost ~150 each (the keys are the configuration's
/// addresses, not a client's choice).
type Groups = HashMap<usize, GroupState, foldhash::fast::RandomState>;

impl Upstreams {
    /// The server for a request's next attempt by the group's balancing method, skipping
    /// `tried` ones, down ones, ones that failed `max_fails` times within `fail_timeout`
    /// and ones at `max_conns`; backups only when no primary is left.
    pub fn pick(&self, up: &Arc<Upstream>, key: &Key, tried: &[usize], now: Instant) -> Pick {
        let mut groups = self.groups.borrow_mut();
        let g = groups.entry(group_key(up)).or_default();
        g.current.resize(up.servers.len(), 0);
        g.fails.resize(up.servers.len(), Fails::new(now));
        g.deficit.resize(up.servers.len(), 0);
        g.active.resize(up.servers.len(), 0);
        if up.slow_start {
            g.ramp.resize(up.servers.len(), (None, false));
            balance::track_ramps(up, g, now);
        }
        let mut view = balance::View { up, g, tried, now };
        match balance::choose(&mut view, key.ip, key.hash) {
            balance::Found::Server(i) => {
                view.g.active[i] += 1;
                // The first choice after `fail_timeout`: a success now makes the count
                // start over (nginx's `checked`).
                let f = &mut view.g.fails[i];
                if now.saturating_duration_since(f.checked) > up.servers[i].fail_timeout {
                    f.checked = now;
                }
                let metrics = up.servers[i].metrics;
                crate::runtime::metrics::gauge_add(
                    metrics,
                    crate::runtime::metrics::zone::ACTIVE,
                    1,
                );
                Pick::Server(
                    i,
                    Lease {
                        ups: self.groups.clone(),
                        key: group_key(up),
                        server: i,
                        metrics,
                    },
                )
            }
            balance::Found::Full => Pick::Full,
            balance::Found::None => Pick::None,
        }
    }

    /// Wait (in the group's `queue`, if it has room) until a server may be under
    /// `max_conns` again. False: no queue, queue full, or its timeout passed.
    ///
    /// The deadline is a slot in the worker's table (`timers`), not a tokio timeout: with
    /// `max_conns` and a queue (a FastCGI pool's usual setup) nearly every request waits
    /// here once, and a tokio `Sleep` cost a timer-wheel insertion, removal and clock read
    /// each time (about 500 instructions of a 30,000-instruction request). The table fires
    /// up to one `TICK` late, which a queue timeout of seconds does not notice.
    pub async fn wait_for_slot(
        &self,
        up: &Arc<Upstream>,
        timers: &crate::runtime::read_timers::ReadTimers,
        deadline: Instant,
    ) -> bool {
        let Some((max, _)) = up.queue else {
            return false;
        };
        let freed = {
            let mut groups = self.groups.borrow_mut();
            let g = groups.entry(group_key(up)).or_default();
            if g.queued >= max {
                return false;
            }
            g.queued += 1;
            g.freed.clone()
        };
        let woken = {
            let held = timers.hold(deadline, false);
            let mut notified = std::pin::pin!(freed.notified());
            std::future::poll_fn(|cx| {
                if std::future::Future::poll(notified.as_mut(), cx).is_ready() {
                    return Poll::Ready(true);
                }
                timers.poll(held.key, cx).map(|()| false)
            })
            .await
        };
        if let Some(g) = self.groups.borrow_mut().get_mut(&group_key(up)) {
            g.queued -= 1;
        }
        woken
    }

    /// A server failed (could not connect, timed out, answered garbage). A group of one
    /// server never takes it out (nginx's `single` peer).
    pub fn failed(&self, up: &Arc<Upstream>, server: usize, now: Instant) {
        if up.single() {
            return;
        }
        let mut groups = self.groups.borrow_mut();
        let g = groups.entry(group_key(up)).or_default();
        g.fails.resize(up.servers.len(), Fails::new(now));
        g.deficit.resize(up.servers.len(), 0);
        let s = &up.servers[server];
        let f = &mut g.fails[server];
        f.count += 1;
        f.accessed = Some(now);
        f.checked = now;
        if s.max_fails > 0 {
            // nginx's integer division: weight 1 with max_fails 3 loses nothing.
            let full = s.weight.saturating_mul(balance::WEIGHT_SCALE);
            let lost = (s.weight / i64::from(s.max_fails)).saturating_mul(balance::WEIGHT_SCALE);
            g.deficit[server] = (g.deficit[server] + lost).min(full);
            if f.count >= s.max_fails {
                crate::errlog::log(
                    crate::errlog::Level::Warn,
                    format_args!("upstream server temporarily disabled"),
                );
            }
        }
    }

    /// A server answered: its failure count starts over if it was chosen after
    /// `fail_timeout` had passed since its last failure.
    pub fn succeeded(&self, up: &Arc<Upstream>, server: usize) {
        if let Some(g) = self.groups.borrow_mut().get_mut(&group_key(up)) {
            if let Some(f) = g.fails.get_mut(server) {
                if f.accessed.is_some_and(|a| a < f.checked) {
                    f.count = 0;
                }
            }
        }
    }

    /// An idle connection to `server` of this `kind` (see [`Idle`]), if one is kept and
    /// still open. Returns it with the number of requests it has carried and when it was
    /// made.
    pub fn take_idle(
        &self,
        up: &Arc<Upstream>,
        server: usize,
        kind: u64,
        now: Instant,
    ) -> Option<(Conn, u64, Instant)> {
        let mut groups = self.groups.borrow_mut();
        let g = groups.get_mut(&group_key(up))?;
        g.expire_idle(now);
        while let Some(pos) = g
            .idle
            .iter()
            .rposition(|i| i.server == server && i.kind == kind)
        {
            let Some(mut i) = g.idle.remove(pos) else {
                break;
            };
            i.left();
            if still_open(&mut i.conn) {
                return Some((i.conn, i.requests, i.born));
            }
        }
        None
    }

    /// Keep a connection whose request ended cleanly, if the group keeps any and it has
    /// not carried `keepalive_requests` yet. When `keepalive` are idle already, the oldest
    /// makes room - unless the connection may `linger`: then it is kept as surplus for
    /// [`SURPLUS_GRACE`] (see there).
    pub fn put_idle(&self, up: &Arc<Upstream>, slot: Slot, conn: Conn, now: Instant) {
        let Slot {
            server,
            kind,
            requests,
            born,
            linger,
        } = slot;
        // Not kept past `keepalive_requests` or `keepalive_time` (nginx checks both as the
        // request ends, so the last request within the time still reuses the connection).
        if up.keepalive == 0
            || requests >= up.keepalive_requests
            || now.saturating_duration_since(born) > up.keepalive_time
        {
            return;
        }
        let mut groups = self.groups.borrow_mut();
        let g = groups.entry(group_key(up)).or_default();
        g.keep = (up.keepalive, up.keepalive_timeout);
        g.expire_idle(now);
        if g.idle.len() >= up.keepalive && !linger {
            if let Some(old) = g.idle.pop_front() {
                old.left();
            }
        }
        let metrics = up.servers.get(server).map_or(0, |s| s.metrics);
        crate::runtime::metrics::gauge_add(metrics, crate::runtime::metrics::zone::IDLE, 1);
        g.idle.push_back(Idle {
            server,
            kind,
            conn,
            since: now,
            requests,
            born,
            metrics,
        });
    }

    /// A graceful stop: every idle connection is closed now, as nginx closes its cached
    /// upstream connections (a server at the other end, gannet itself maybe, then sees its
    /// side idle and closes it without waiting for it).
    pub fn close_idle(&self) {
        for g in self.groups.borrow_mut().values_mut() {
            for old in g.idle.drain(..) {
                old.left();
            }
        }
    }

    /// Close idle connections past `keepalive_timeout`, and surplus ones past
    /// [`SURPLUS_GRACE`]; the worker calls this on its housekeeping tick so that they close
    /// when traffic stops, not at the next request.
    pub fn expire_idle(&self, now: Instant) {
        for g in self.groups.borrow_mut().values_mut() {
            g.expire_idle(now);
        }
    }
}

/// How long a connection freed while `keepalive` others were idle already stays kept, for
/// HTTP upstreams. nginx closes it at once; under a bursty load (an open-loop replay at
/// 7,000 req/s with `keepalive 32`) the number of requests in flight keeps swinging past
/// `keepalive`, so each swing closed connections that the next swing opened again: the
/// back end accepted thousands of connections a second, and both gannet and nginx lost
/// requests where h2o (whose pool has no count limit, only a timeout) lost none. Kept for a
/// second, the surplus serves the next swing and then closes, so the back end still sees
/// `keepalive` connections once the load drops. Not for FastCGI: an idle FastCGI
/// connection holds a PHP-FPM child that could serve another request.
pub const SURPLUS_GRACE: Duration = Duration::from_secs(1);

impl GroupState {
    fn expire_idle(&mut self, now: Instant) {
        let (keepalive, timeout) = self.keep;
        let grace = SURPLUS_GRACE.min(timeout);
        while let Some(oldest) = self.idle.front() {
            let age = now.saturating_duration_since(oldest.since);
            if age >= timeout || (self.idle.len() > keepalive && age >= grace) {
                if let Some(old) = self.idle.pop_front() {
                    old.left();
                }
            } else {
                // The rest are younger.
                break;
            }
        }
    }
}

/// An idle connection is usable if reading it would block: end of stream means the
/// application closed it, and data it sent unasked means it is out of step. Over TLS the
/// socket is looked at the same way (a close_notify or any record is data there), and so
/// is what rustls already read off it.
///
/// The look (a MSG_PEEK recv) is made only when the event loop has seen the socket
/// readable since its answer was read: tokio clears a socket's read readiness when a read
/// takes less than it asked for, as the answer's last read does, so a kept connection
/// nothing came on since is known open without a system call - one fewer per request on a
/// kept connection. nginx does the same with a read handler on its idle connections. A
/// close that reached the kernel but not yet the loop is found by the request's own read
/// and retried on a new connection (`conn::gateway`, `Failure::stale`), as a close after
/// the look always was.
fn still_open(c: &mut Conn) -> bool {
    if c.holds_input() {
        return false;
    }
    if !c.maybe_readable() {
        return true;
    }
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    let sock = socket2::SockRef::from(&*c);
    matches!(
        sock.recv_with_flags(&mut probe, libc::MSG_PEEK | libc::MSG_DONTWAIT),
        Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn group(body: &str) -> Result<Arc<Upstream>, String> {
        let src = format!("upstream u {{\n{body}\n}}");
        let tree =
            gannet_conf::parse_str(&src, "t.conf", Path::new("/")).map_err(|e| e.to_string())?;
        parse(&tree[0], &(None, None))
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }

    /// nginx-tests' upstream.t: every third request to the first server fails and is sent
    /// on to the second; successes in between do not clear the count, so the third failure
    /// takes the server out, after six successes.
    #[test]
    fn failures_among_successes_add_up_to_max_fails() {
        let up = group(
            "server 127.0.0.1:1 max_fails=3 fail_timeout=10s;
             server 127.0.0.1:2 max_fails=3 fail_timeout=10s;",
        )
        .unwrap();
        let ups = Upstreams::default();
        let now = Instant::now();
        let (mut served, mut first) = ([0; 2], 0);
        for _ in 0..30 {
            let mut tried = Vec::new();
            loop {
                let Pick::Server(i, _lease) = ups.pick(&up, &Key::default(), &tried, now) else {
                    panic!("no server left");
                };
                tried.push(i);
                if i == 0 {
                    first += 1;
                    if first % 3 == 0 {
                        ups.failed(&up, 0, now);
                        continue;
                    }
                }
                ups.succeeded(&up, i);
                served[i] += 1;
                break;
            }
        }
        assert_eq!(served, [6, 24]);
        // Once fail_timeout has passed it is tried again, and a success clears the count.
        let later = now + Duration::from_secs(11);
        let back = (0..2)
            .filter_map(|_| match ups.pick(&up, &Key::default(), &[], later) {
                Pick::Server(i, _) => Some(i),
                _ => None,
            })
            .find(|&i| i == 0);
        assert_eq!(back, Some(0));
        ups.succeeded(&up, 0);
        ups.failed(&up, 0, later);
        assert!(matches!(
            ups.pick(&up, &Key::default(), &[1], later),
            Pick::Server(0, _)
        ));
    }

    /// A group of one server (no backup) keeps it in use however often it fails (nginx's
    /// single peer).
    #[test]
    fn a_single_server_is_never_taken_out() {
        let up = group("server 127.0.0.1:1 max_fails=1;").unwrap();
        let ups = Upstreams::default();
        let now = Instant::now();
        for _ in 0..3 {
            ups.failed(&up, 0, now);
        }
        assert!(matches!(
            ups.pick(&up, &Key::default(), &[], now),
            Pick::Server(0, _)
        ));
    }

    #[test]
    fn slow_start_ramps_the_weight_up_after_fail_timeout() {
        let up = group("server 127.0.0.1:1; server 127.0.0.1:2 fail_timeout=10s slow_start=100s;")
            .unwrap();
        let ups = Upstreams::default();
        let t0 = Instant::now();
        ups.failed(&up, 1, t0);
        // Share of server 1 over 1000 picks at `at`, each answered (the first pick after
        // fail_timeout is the server's trial: its success brings it back).
        let share = |at: Instant| {
            (0..1000)
                .filter(|_| match ups.pick(&up, &Key::default(), &[], at) {
                    Pick::Server(i, _) => {
                        ups.succeeded(&up, i);
                        i == 1
                    }
                    _ => false,
                })
                .count()
        };
        assert_eq!(share(t0 + Duration::from_secs(5)), 0, "still failed");
        // A quarter of the way: weight 0.25 against 1, a fifth of the picks.
        let quarter = share(t0 + Duration::from_secs(35));
        assert!((190..=210).contains(&quarter), "{quarter}");
        // Once the ramp is over, its whole weight: half.
        assert_eq!(share(t0 + Duration::from_secs(110)), 500);
        // Back from failing its health checks: the ramp starts when the balancer sees it.
        up.set_healthy(1, false);
        assert_eq!(share(t0 + Duration::from_secs(200)), 0);
        up.set_healthy(1, true);
        assert!(share(t0 + Duration::from_secs(201)) <= 10);
        let quarter = share(t0 + Duration::from_secs(226));
        assert!((190..=210).contains(&quarter), "{quarter}");
    }

    fn servers(n: usize, extra: &str) -> String {
        (0..n)
            .map(|i| format!("server 127.0.0.1:{} {extra};\n", 9001 + i))
            .collect()
    }

    /// Where each key goes when every request ends before the next.
    fn map_keys(up: &Arc<Upstream>, keys: &[String]) -> Vec<usize> {
        let ups = Upstreams::default();
        let now = Instant::now();
        keys.iter()
            .map(|k| {
                let key = Key {
                    ip: k.parse().ok(),
                    hash: Some(k.as_bytes()),
                };
                match ups.pick(up, &key, &[], now) {
                    Pick::Server(i, _) => i,
                    _ => usize::MAX,
                }
            })
            .collect()
    }

    #[test]
    fn method_errors_as_nginx_words_them() {
        let err = |body: &str| group(body).unwrap_err();
        let one = servers(1, "");
        assert!(
            err(&format!("ip_hash; least_conn; {one}")).contains("load balancing method redefined")
        );
        for m in ["ip_hash;", "hash $uri;", "random;", "hash $uri consistent;"] {
            let before = format!("{m} server 127.0.0.1:1; server 127.0.0.1:2 backup;");
            let after = format!("server 127.0.0.1:1; server 127.0.0.1:2 backup; {m}");
            for body in [before, after] {
                assert!(
                    err(&body).contains("does not support parameter \"backup\""),
                    "{body}"
                );
            }
        }
        assert!(group(&format!("least_conn; {one} server 127.0.0.1:2 backup;")).is_ok());
        assert!(err(&format!("hash; {one}")).contains("invalid number of arguments in \"hash\""));
        assert!(err(&format!("hash $uri x; {one}")).contains("invalid parameter \"x\""));
        assert!(err(&format!("ip_hash on; {one}")).contains("invalid number of arguments"));
        assert!(
            err(&format!("random least_conn; {one}")).contains("invalid parameter \"least_conn\"")
        );
        assert!(err(&format!("random two x; {one}")).contains("invalid parameter \"x\""));
        assert!(err(&format!("random two least_conn x; {one}")).contains("invalid number"));
        assert!(err(&format!("hash ${{uri; {one}")).contains("closing bracket"));
        assert!(group(&format!("random two least_conn; {one}")).is_ok());
        // The line is the directive's.
        assert!(err(&format!("{one}random x;")).starts_with("t.conf:3: "));
    }

    #[test]
    fn least_conn_prefers_the_idle_and_shares_ties() {
        let up = group(&format!("least_conn; {}", servers(3, ""))).unwrap();
        let ups = Upstreams::default();
        let now = Instant::now();
        let pick = |tried: &[usize]| match ups.pick(&up, &Key::default(), tried, now) {
            Pick::Server(i, lease) => (i, lease),
            _ => panic!("no server"),
        };
        // All idle: round robin among the tie.
        let (a, la) = pick(&[]);
        let (b, lb) = pick(&[]);
        let (c, _lc) = pick(&[]);
        let mut seen = vec![a, b, c];
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2]);
        // Two busy, one freed: the freed one is the only least loaded.
        drop(la);
        assert_eq!(pick(&[]).0, a);
        drop(lb);
        assert_eq!(pick(&[]).0, b);
    }

    #[test]
    fn least_conn_weighs_connections() {
        let up = group("least_conn; server 127.0.0.1:1 weight=3; server 127.0.0.1:2;").unwrap();
        let ups = Upstreams::default();
        let now = Instant::now();
        let mut held = Vec::new();
        let mut counts = [0; 2];
        for _ in 0..8 {
            if let Pick::Server(i, lease) = ups.pick(&up, &Key::default(), &[], now) {
                counts[i] += 1;
                held.push(lease);
            }
        }
        // 6:2 keeps 6/3 == 2/1.
        assert_eq!(counts, [6, 2]);
    }

    #[test]
    fn hashes_are_stable_and_down_moves_only_its_own_keys() {
        let keys: Vec<String> = (0..200).map(|i| format!("key-{i}")).collect();
        let ips: Vec<String> = (0..200).map(|i| format!("10.{}.{}.7", i % 13, i)).collect();
        for (method, keys) in [
            ("hash $arg_k;", &keys),
            ("hash $arg_k consistent;", &keys),
            ("ip_hash;", &ips),
        ] {
            let up = group(&format!("{method} {}", servers(4, ""))).unwrap();
            let all = map_keys(&up, keys);
            assert_eq!(all, map_keys(&up, keys), "{method} is not stable");
            for s in 0..4 {
                assert!(all.contains(&s), "{method} never picks {s}");
            }
            let body = servers(4, "").replacen("9002 ;", "9002 down;", 1);
            let down = group(&format!("{method} {body}")).unwrap();
            let moved = map_keys(&down, keys);
            for (before, after) in all.iter().zip(&moved) {
                if *before == 1 {
                    assert_ne!(*after, 1);
                } else {
                    assert_eq!(before, after, "{method}: a key of a live server moved");
                }
            }
        }
    }

    #[test]
    fn consistent_hash_moves_few_keys_when_a_server_goes() {
        let keys: Vec<String> = (0..1000).map(|i| format!("/item/{i}")).collect();
        let five = group(&format!("hash $uri consistent; {}", servers(5, ""))).unwrap();
        let four = group(&format!("hash $uri consistent; {}", servers(4, ""))).unwrap();
        let (a, b) = (map_keys(&five, &keys), map_keys(&four, &keys));
        let moved = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        // Only the removed server's keys move (about a fifth).
        assert!(a.iter().zip(&b).all(|(x, y)| x == y || *x == 4));
        assert!((100..=300).contains(&moved), "{moved} moved");
    }

    #[test]
    fn hashing_falls_back_to_round_robin_when_all_are_out() {
        let up = group(&format!("hash $uri; {}", servers(3, ""))).unwrap();
        let ups = Upstreams::default();
        let now = Instant::now();
        let key = Key {
            ip: None,
            hash: Some(b"/x"),
        };
        let mut tried = Vec::new();
        for _ in 0..3 {
            match ups.pick(&up, &key, &tried, now) {
                Pick::Server(i, _) => tried.push(i),
                _ => panic!("a server was left"),
            }
        }
        tried.sort();
        assert_eq!(tried, vec![0, 1, 2]);
        assert!(matches!(ups.pick(&up, &key, &tried, now), Pick::None));
    }

    #[test]
    fn tried_keeps_order_past_its_inline_room() {
        let mut t = Tried::default();
        assert!(t.is_empty());
        for i in [3, 1, 4, 1, 5, 9] {
            t.push(i);
        }
        assert_eq!(&*t, [3, 1, 4, 1, 5, 9]);
        assert!(t.contains(&9) && !t.contains(&2));
    }

    #[test]
    fn an_empty_hash_key_goes_round_robin() {
        for method in ["hash $uri;", "hash $uri consistent;"] {
            let up = group(&format!("{method} {}", servers(3, ""))).unwrap();
            let ups = Upstreams::default();
            let key = Key {
                ip: None,
                hash: Some(b""),
            };
            let mut got: Vec<usize> = (0..3)
                .map(|_| match ups.pick(&up, &key, &[], Instant::now()) {
                    Pick::Server(i, _) => i,
                    _ => panic!("no server"),
                })
                .collect();
            got.sort();
            assert_eq!(got, vec![0, 1, 2], "{method}");
        }
    }

    #[test]
    fn random_honours_weights_and_skips_down() {
        for method in ["random;", "random two;"] {
            let body = "server 127.0.0.1:1 weight=3; server 127.0.0.1:2; server 127.0.0.1:3 down;";
            let up = group(&format!("{method} {body}")).unwrap();
            let ups = Upstreams::default();
            let mut counts = [0; 3];
            for _ in 0..4000 {
                if let Pick::Server(i, _) = ups.pick(&up, &Key::default(), &[], Instant::now()) {
                    counts[i] += 1;
                }
            }
            assert_eq!(counts[2], 0);
            assert_eq!(counts[0] + counts[1], 4000);
            if method == "random;" {
                // 3:1 within a wide margin (the expected 3000 has a deviation of about 27).
                assert!((2700..=3300).contains(&counts[0]), "{counts:?}");
            } else {
                assert!(counts[1] > 0, "{counts:?}");
            }
        }
    }
}
