//! `upstream NAME { ... }` groups (nginx's ngx_http_upstream module) and each worker's view
//! of them: which server the next request goes to, which servers recently failed, and the
//! idle connections kept open for reuse.
//!
//! Directives inside `upstream`: `server ADDRESS [weight=N] [max_fails=N] [fail_timeout=T]
//! [max_conns=N] [backup] [down]`, `keepalive N`, `keepalive_timeout`, `keepalive_requests`,
//! `queue N [timeout=T]` (nginx Plus's: wait for a server under `max_conns` instead of
//! failing), `zone` (accepted: gannet's state is per worker, there is nothing to share;
//! so `max_conns` counts per worker, as nginx's does without a zone). The balancing method
//! is nginx's default, smooth weighted round robin; `least_conn`, `ip_hash`, `hash` and
//! `random` come with the proxy issue and are errors until then.
//!
//! Like nginx's, the state is per worker: no lock on the request path, and a worker that
//! saw a server fail stops sending to it for `fail_timeout` on its own.

use gannet_conf::{setters, ConfError, Directive};
use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;

/// An address a request can be sent to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Addr {
    Tcp(String),
    Unix(PathBuf),
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
            return (!path.is_empty()).then(|| Addr::Unix(PathBuf::from(path)));
        }
        let (host, port) = a.rsplit_once(':')?;
        let ok = !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0);
        ok.then(|| Addr::Tcp(a.to_string()))
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
    pub backup: bool,
    pub down: bool,
}

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<Server>,
    /// Idle connections each worker keeps (`keepalive N`); 0: none.
    pub keepalive: usize,
    pub keepalive_timeout: Duration,
    pub keepalive_requests: u64,
    /// `queue N timeout=T`: requests that may wait for a server under `max_conns`.
    pub queue: Option<(usize, Duration)>,
}

/// Parse an `upstream` block.
pub fn parse(d: &Directive) -> Result<Upstream, ConfError> {
    let mut up = Upstream {
        name: d.args[0].clone(),
        servers: Vec::new(),
        keepalive: 0,
        keepalive_timeout: Duration::from_secs(60),
        keepalive_requests: 1000,
        queue: None,
    };
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
                nargs(1, 8)?;
                up.servers.push(parse_server(s)?);
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
            "keepalive_time" | "zone" => nargs(1, 2)?,
            "least_conn" | "ip_hash" | "hash" | "random" => {
                return Err(s.error(format!(
                    "\"{}\": balancing methods other than round robin are not supported yet",
                    s.name
                )))
            }
            _ => return Err(s.error(format!("\"{}\" directive is not allowed here", s.name))),
        }
    }
    if up.servers.is_empty() {
        return Err(d.error(format!("no servers are inside upstream \"{}\"", up.name)));
    }
    Ok(up)
}

fn parse_server(s: &Directive) -> Result<Server, ConfError> {
    let addr = Addr::parse(&s.args[0]).ok_or_else(|| {
        s.error(format!(
            "invalid address \"{}\" in \"server\" (host:port or unix:/path)",
            s.args[0]
        ))
    })?;
    let mut srv = Server {
        addr,
        weight: 1,
        max_fails: 1,
        fail_timeout: Duration::from_secs(10),
        max_conns: 0,
        backup: false,
        down: false,
    };
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
        } else if a == "resolve" {
            // Accepted: names resolve when connecting.
        } else {
            return Err(bad());
        }
    }
    Ok(srv)
}

/// A connection to an upstream server.
pub trait Io: AsyncRead + AsyncWrite + AsFd + Unpin {}
impl<T: AsyncRead + AsyncWrite + AsFd + Unpin> Io for T {}

pub type Conn = Box<dyn Io>;

/// An idle connection kept for reuse.
struct Idle {
    server: usize,
    conn: Conn,
    since: Instant,
    requests: u64,
}

#[derive(Default)]
struct GroupState {
    /// Smooth weighted round robin: each server's current weight.
    current: Vec<i64>,
    /// Per server: failures counted and when the count started.
    fails: Vec<(u32, Instant)>,
    /// Per server: connections in use (for `max_conns`).
    active: Vec<usize>,
    idle: Vec<Idle>,
    /// Requests waiting in the `queue`, and how they are woken when a server frees up.
    queued: usize,
    freed: Rc<Notify>,
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
    ups: Rc<RefCell<HashMap<usize, GroupState>>>,
    key: usize,
    server: usize,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(g) = self.ups.borrow_mut().get_mut(&self.key) {
            if let Some(a) = g.active.get_mut(self.server) {
                *a = a.saturating_sub(1);
            }
            g.freed.notify_one();
        }
    }
}

/// A worker's state for every upstream group, keyed by the group's address in the config
/// (the config outlives the worker).
#[derive(Default)]
pub struct Upstreams {
    groups: Rc<RefCell<HashMap<usize, GroupState>>>,
}

fn key(up: &Arc<Upstream>) -> usize {
    Arc::as_ptr(up) as usize
}

impl Upstreams {
    /// The next server to try, skipping `tried` ones, down ones and ones that failed
    /// `max_fails` times within `fail_timeout`; backups only when no primary is left.
    pub fn pick(&self, up: &Arc<Upstream>, tried: &[usize], now: Instant) -> Pick {
        let mut groups = self.groups.borrow_mut();
        let g = groups.entry(key(up)).or_default();
        g.current.resize(up.servers.len(), 0);
        g.fails.resize(up.servers.len(), (0, now));
        g.active.resize(up.servers.len(), 0);
        let mut full = false;
        for backup in [false, true] {
            // Smooth weighted round robin over the usable servers, in one pass: each gains
            // its weight, the one with the most is chosen and pays back the total.
            let (mut total, mut best) = (0, None::<usize>);
            for (i, s) in up.servers.iter().enumerate() {
                let (n, since) = g.fails[i];
                let usable = s.backup == backup
                    && !s.down
                    && !tried.contains(&i)
                    && (s.max_fails == 0
                        || n < s.max_fails
                        || now.duration_since(since) >= s.fail_timeout);
                let at_limit = s.max_conns > 0 && g.active[i] >= s.max_conns;
                full |= usable && at_limit;
                if !usable || at_limit {
                    continue;
                }
                g.current[i] += s.weight;
                total += s.weight;
                if best.is_none_or(|b| g.current[i] > g.current[b]) {
                    best = Some(i);
                }
            }
            let Some(best) = best else { continue };
            g.current[best] -= total;
            g.active[best] += 1;
            return Pick::Server(
                best,
                Lease {
                    ups: self.groups.clone(),
                    key: key(up),
                    server: best,
                },
            );
        }
        if full {
            Pick::Full
        } else {
            Pick::None
        }
    }

    /// Wait (in the group's `queue`, if it has room) until a server may be under
    /// `max_conns` again. False: no queue, queue full, or its timeout passed.
    pub async fn wait_for_slot(&self, up: &Arc<Upstream>, deadline: tokio::time::Instant) -> bool {
        let Some((max, _)) = up.queue else {
            return false;
        };
        let freed = {
            let mut groups = self.groups.borrow_mut();
            let g = groups.entry(key(up)).or_default();
            if g.queued >= max {
                return false;
            }
            g.queued += 1;
            g.freed.clone()
        };
        let woken = tokio::time::timeout_at(deadline, freed.notified())
            .await
            .is_ok();
        if let Some(g) = self.groups.borrow_mut().get_mut(&key(up)) {
            g.queued -= 1;
        }
        woken
    }

    /// A server failed (could not connect, timed out, answered garbage).
    pub fn failed(&self, up: &Arc<Upstream>, server: usize, now: Instant) {
        let mut groups = self.groups.borrow_mut();
        let g = groups.entry(key(up)).or_default();
        g.fails.resize(up.servers.len(), (0, now));
        let s = &up.servers[server];
        let (n, since) = g.fails[server];
        g.fails[server] = if n == 0 || now.duration_since(since) >= s.fail_timeout {
            (1, now)
        } else {
            (n + 1, since)
        };
    }

    /// A server answered: its failure count starts over.
    pub fn succeeded(&self, up: &Arc<Upstream>, server: usize) {
        if let Some(g) = self.groups.borrow_mut().get_mut(&key(up)) {
            if let Some(f) = g.fails.get_mut(server) {
                f.0 = 0;
            }
        }
    }

    /// An idle connection to `server`, if one is kept and still open. Returns it with the
    /// number of requests it has carried.
    pub fn take_idle(
        &self,
        up: &Arc<Upstream>,
        server: usize,
        now: Instant,
    ) -> Option<(Conn, u64)> {
        let mut groups = self.groups.borrow_mut();
        let g = groups.get_mut(&key(up))?;
        g.idle
            .retain(|i| now.duration_since(i.since) < up.keepalive_timeout);
        while let Some(pos) = g.idle.iter().rposition(|i| i.server == server) {
            let i = g.idle.remove(pos);
            if still_open(&i.conn) {
                return Some((i.conn, i.requests));
            }
        }
        None
    }

    /// Keep a connection whose request ended cleanly, if the group keeps any and it has
    /// not carried `keepalive_requests` yet. The oldest idle one makes room.
    pub fn put_idle(&self, up: &Arc<Upstream>, server: usize, conn: Conn, requests: u64) {
        if up.keepalive == 0 || requests >= up.keepalive_requests {
            return;
        }
        let mut groups = self.groups.borrow_mut();
        let g = groups.entry(key(up)).or_default();
        if g.idle.len() >= up.keepalive {
            g.idle.remove(0);
        }
        g.idle.push(Idle {
            server,
            conn,
            since: Instant::now(),
            requests,
        });
    }
}

/// An idle connection is usable if reading it would block: end of stream means the
/// application closed it, and data it sent unasked means it is out of step.
fn still_open(c: &Conn) -> bool {
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    let sock = socket2::SockRef::from(c);
    matches!(
        sock.recv_with_flags(&mut probe, libc::MSG_PEEK | libc::MSG_DONTWAIT),
        Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock
    )
}
