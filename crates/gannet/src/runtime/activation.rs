//! Socket activation (sd_listen_fds(3)): listening sockets handed over by systemd (a
//! `.socket` unit) or any starter speaking the same protocol, used instead of binding for
//! the `listen` addresses they are bound to. nginx has no such thing; it lets a unit own
//! the port (e.g. port 80 open while gannet restarts) or start gannet with no privilege
//! to bind at all.
//!
//! The protocol: descriptors 3, 4, ... (`LISTEN_FDS` of them), meant for the process whose
//! pid is `LISTEN_PID` (so a forked or exec'd child that inherits the environment does not
//! take them too), optionally named by `LISTEN_FDNAMES` (colon-separated). They are taken
//! once, at start-up, by the master.
//!
//! A socket is matched to a `listen` by its bound address, exactly: `ListenStream=80` is
//! `[::]:80` (dual-stack), which `listen 80;` (`0.0.0.0:80`) does not match, but
//! `listen [::]:80;` does. A socket no `listen` matches is logged and closed; an address no
//! socket matches is bound as usual. An inherited socket is one socket per address,
//! shared by every worker thread (SO_REUSEPORT siblings cannot join a socket bound without
//! it); its backlog is the unit's, not `listen backlog=`.
//!
//! The sockets live in the master's `listener::Bound` like bound ones: kept across reloads
//! while the config listens on their address, closed when a reload drops it (a later
//! reload that adds the address again binds it anew).

use super::listener::Bound;
use crate::config::listen::Endpoint;
use crate::config::Config;
use socket2::{Domain, Socket, Type};
use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::OnceLock;

/// The first descriptor passed (SD_LISTEN_FDS_START).
const FIRST_FD: RawFd = 3;

/// Addresses whose socket was inherited, for [`inherited`].
static INHERITED: OnceLock<HashSet<SocketAddr>> = OnceLock::new();

/// Whether `addr`'s socket came from the starter: its workers share it instead of each
/// binding its own.
pub fn inherited(at: &Endpoint) -> bool {
    matches!(at, Endpoint::Tcp(addr) if INHERITED.get().is_some_and(|s| s.contains(addr)))
}

/// The passed sockets that `config` listens on, by address. Empty when the environment
/// passes none to this process. Call once, in the master, before anything else opens a
/// descriptor that could be mistaken for a passed one.
pub fn take(config: &Config) -> Bound {
    let mut bound = Bound::new();
    let Some((n, names)) = passed() else {
        let _ = INHERITED.set(HashSet::new());
        return bound;
    };
    // Unix listeners are bound by the master (a passed unix socket matches none).
    let wanted: HashSet<SocketAddr> = config
        .listens
        .iter()
        .filter(|g| g.listen.unix.is_none())
        .map(|g| g.listen.addr)
        .collect();
    for i in 0..n {
        let fd = FIRST_FD + i as RawFd;
        let name = names.get(i).map_or("", |s| s.as_str());
        let shown = if name.is_empty() {
            format!("socket {fd}")
        } else {
            format!("socket {fd} (\"{name}\")")
        };
        // SAFETY: F_GETFD only reads the descriptor's flags; it fails on a closed one.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            crate::errlog::warn(format_args!("{shown} is announced but not open"));
            continue;
        }
        // SAFETY: `fd` is open, and the protocol hands descriptors FIRST_FD.. to this
        // process (LISTEN_PID is ours); nothing else in it owns them: they are taken once
        // (`passed` refuses once `INHERITED` is set) and from here on owned by this
        // `Socket` alone.
        let s = unsafe { Socket::from_raw_fd(fd) };
        match usable(&s) {
            Ok(addr) if wanted.contains(&addr) && !bound.contains_key(&Endpoint::Tcp(addr)) => {
                crate::errlog::notice(format_args!("using {shown} passed for {addr}"));
                bound.insert(Endpoint::Tcp(addr), vec![TcpListener::from(s)]);
            }
            Ok(addr) => crate::errlog::warn(format_args!(
                "{shown} passed for {addr} matches no \"listen\" address; closed"
            )),
            Err(why) => crate::errlog::warn(format_args!("{shown} passed is {why}; closed")),
        }
    }
    let addrs = bound.keys().filter_map(|e| match e {
        Endpoint::Tcp(a) => Some(*a),
        Endpoint::Unix(_) | Endpoint::Udp(_) => None,
    });
    let _ = INHERITED.set(addrs.collect());
    bound
}

/// `LISTEN_FDS` and `LISTEN_FDNAMES` when `LISTEN_PID` is this process.
fn passed() -> Option<(usize, Vec<String>)> {
    if INHERITED.get().is_some() {
        return None;
    }
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.trim().parse().ok()?;
    if pid != std::process::id() {
        return None;
    }
    let n: usize = std::env::var("LISTEN_FDS").ok()?.trim().parse().ok()?;
    let names = std::env::var("LISTEN_FDNAMES")
        .map(|v| v.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    Some((n, names))
}

/// A listening TCP socket's address, made ready for the worker threads (non-blocking,
/// closed on exec); or why it cannot serve.
fn usable(s: &Socket) -> Result<SocketAddr, String> {
    let err = |what: &str, e: std::io::Error| format!("not usable ({what}: {e})");
    if s.r#type().map_err(|e| err("SO_TYPE", e))? != Type::STREAM
        || !s.is_listener().map_err(|e| err("SO_ACCEPTCONN", e))?
    {
        return Err("not a listening stream socket".into());
    }
    let addr = s.local_addr().map_err(|e| err("getsockname", e))?;
    if !matches!(addr.domain(), Domain::IPV4 | Domain::IPV6) {
        return Err("not a TCP socket".into());
    }
    let addr = addr.as_socket().ok_or("not a TCP socket")?;
    s.set_nonblocking(true).map_err(|e| err("O_NONBLOCK", e))?;
    s.set_cloexec(true).map_err(|e| err("FD_CLOEXEC", e))?;
    Ok(addr)
}
