//! Listening sockets. Each worker gets its own socket per `listen` address, all bound with
//! SO_REUSEPORT so the kernel spreads connections over workers with no shared accept queue
//! and no accept lock. They are all created by the master before any worker starts, so a
//! port in use is a start-up error, not a worker failure.
//!
//! A `listen unix:PATH` is one socket, bound (creating the file, mode 0666 as nginx
//! leaves it, owned by the master's user: root before workers drop privileges) and shared
//! by every worker, as SO_REUSEPORT does not apply to unix sockets. nginx does not remove
//! a file already at the path: binding fails with EADDRINUSE, as it does there. The file
//! is removed when the master stops listening on it: a reload without it ("deleting
//! socket"), and the master's exit unless a new binary took the socket over.
//!
//! A `listen ... quic` address's sockets form one reuseport group; with `quic_bpf on` the
//! group gets a program that steers a packet to its connection's socket by connection ID
//! (`conn::quic_bpf`), whose index in the group is the order it was bound: here, worker
//! order, and a reload only appends.
//!
//! The master keeps every socket ([`Bound`]) across reloads: an address the new config still
//! listens on keeps its sockets (only missing ones are added), so no connection queued in
//! a socket's backlog is lost when workers change.

use crate::config::listen::{Endpoint, Listen, SoKeepalive};
use crate::config::Config;
use crate::conn::quic_bpf::{self, Steering};
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// A TCP socket for `l`'s address family, with SO_REUSEADDR (and the `ipv6only` choice),
/// bound to it; with `reuseport`, SO_REUSEPORT too.
fn bound_socket(l: &Listen, reuseport: bool) -> io::Result<Socket> {
    let domain = if l.addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let s = if l.udp {
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?
    } else {
        Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?
    };
    s.set_reuse_address(true)?;
    s.set_reuse_port(reuseport)?;
    if l.addr.is_ipv6() {
        s.set_only_v6(l.ipv6only)?;
    }
    s.bind(&l.addr.into())?;
    Ok(s)
}

/// An integer option at the TCP level, one socket2 has no setter for.
pub fn set_tcp_int(s: SockRef<'_>, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the fd is the open socket `s` borrows; the option value is a c_int that lives
    // across the call, and its size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `listen ... rcvbuf= sndbuf= so_keepalive= fastopen=` on a listening socket; accepted
/// connections inherit them. Applied to the sockets a reload keeps too, as nginx does, so
/// a changed value takes effect for new connections (one taken out of the config leaves
/// the last one set).
fn set_options(s: SockRef<'_>, l: &Listen) -> io::Result<()> {
    if let Some(n) = l.rcvbuf {
        s.set_recv_buffer_size(n)?;
    }
    if let Some(n) = l.sndbuf {
        s.set_send_buffer_size(n)?;
    }
    if l.udp {
        return Ok(());
    }
    if let Some(on) = l.nodelay {
        s.set_tcp_nodelay(on)?;
    }
    match l.so_keepalive {
        None => {}
        Some(SoKeepalive::Off) => s.set_keepalive(false)?,
        Some(SoKeepalive::On {
            idle,
            interval,
            count,
        }) => {
            let mut k = TcpKeepalive::new();
            if let Some(secs) = idle {
                k = k.with_time(Duration::from_secs(secs));
            }
            if let Some(secs) = interval {
                k = k.with_interval(Duration::from_secs(secs));
            }
            if let Some(n) = count {
                k = k.with_retries(n);
            }
            s.set_tcp_keepalive(&k)?;
        }
    }
    if let Some(n) = l.fastopen {
        set_tcp_int(s, libc::TCP_FASTOPEN, n)?;
    }
    Ok(())
}

/// The listening socket of `listen unix:PATH`. Held as a std `TcpListener` like the TCP
/// ones, so that the master, the upgrade and the workers handle one type: every call made
/// on a listener (dup, fcntl, accept4 through socket2) is the same for both families.
fn bind_unix(l: &Listen, path: &std::path::Path) -> io::Result<TcpListener> {
    use std::os::unix::fs::PermissionsExt;
    let s = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    s.bind(&socket2::SockAddr::unix(path)?)?;
    // rw for everyone, as nginx's chmod(): who may connect is the directory's business.
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)) {
        crate::errlog::error(format_args!("chmod() \"{}\" failed ({e})", path.display()));
    }
    s.set_nonblocking(true)?;
    if let Some(n) = l.rcvbuf {
        s.set_recv_buffer_size(n)?;
    }
    if let Some(n) = l.sndbuf {
        s.set_send_buffer_size(n)?;
    }
    Ok(std::os::fd::OwnedFd::from(s).into())
}

/// Remove the socket file of a unix listener the master no longer listens on.
pub fn delete_unix(e: &Endpoint) {
    if let Endpoint::Unix(path) = e {
        crate::errlog::warn(format_args!("deleting socket {}", path.display()));
        if let Err(err) = std::fs::remove_file(path) {
            crate::errlog::error(format_args!("unlink() {} failed ({err})", path.display()));
        }
    }
}

/// At the master's exit (not when a new binary took the sockets over, as nginx): remove
/// the socket files of its unix listeners.
pub fn remove_unix_files(bound: &Bound) {
    for e in bound.keys() {
        if let Endpoint::Unix(path) = e {
            if let Err(err) = std::fs::remove_file(path) {
                crate::errlog::error(format_args!("unlink() {} failed ({err})", path.display()));
            }
        }
    }
}

/// A socket bound to `l`'s address with its options set; a stream socket is not yet
/// listening (see `bind_for`).
fn bind(l: &Listen) -> io::Result<TcpListener> {
    if let Some(path) = &l.unix {
        return bind_unix(l, path);
    }
    let s = bound_socket(l, true)?;
    s.set_nonblocking(true)?;
    set_options(SockRef::from(&s), l)?;
    if l.udp {
        // A datagram socket held as the listeners are (see `bind_unix`): its worker reads
        // it as a `UdpSocket` (`stream::proxy::udp_listener`).
        return Ok(std::os::fd::OwnedFd::from(s).into());
    }
    if l.deferred {
        // TCP_DEFER_ACCEPT's value is how long (s) to wait for the first data.
        set_tcp_int(SockRef::from(&s), libc::TCP_DEFER_ACCEPT, 1)?;
    }
    Ok(s.into())
}

/// Fail with EADDRINUSE if anything listens on the address already. SO_REUSEPORT would
/// otherwise let a second gannet (same user) join the port silently and take half of the
/// connections; a probe socket without SO_REUSEPORT cannot bind over a live listener.
fn probe(l: &Listen) -> io::Result<()> {
    bound_socket(l, false).map(drop)
}

/// The listening sockets of each address.
pub type Bound = HashMap<Endpoint, Vec<TcpListener>>;

/// A worker's sockets, each with the index of the `config.listens` group it serves and,
/// for a QUIC address, how its connections' packets find it.
pub type WorkerSockets = Vec<(TcpListener, usize, Steering)>;

fn bind_error(l: &Listen, e: io::Error) -> String {
    format!("bind() to {} failed ({e})", l.endpoint())
}

/// The sockets `config` needs, one per worker for each address: those of `old` for the
/// addresses it already has (kept even beyond the worker count, so none is closed with
/// connections in its backlog), new ones for the rest. Addresses `config` no longer
/// listens on are left out, to close once their last user is gone.
///
/// The new sockets listen only once all are bound: a client (a health check, a test)
/// that reached one address finds every other one accepting too, and a failed bind
/// leaves no address having taken connections it then drops.
pub fn bind_for(config: &Config, old: &Bound) -> Result<Bound, String> {
    let workers = config.main.worker_processes.max(1);
    let mut out = Bound::new();
    let mut fresh = Vec::new();
    for l in config.all_listens() {
        let at = l.endpoint();
        let mut socks = match old.get(&at) {
            Some(v) => v
                .iter()
                .map(|s| {
                    if l.unix.is_none() {
                        set_options(SockRef::from(s), l)
                            .map_err(|e| format!("setsockopt() on {at} failed ({e})"))?;
                    }
                    s.try_clone().map_err(|e| format!("socket dup failed: {e}"))
                })
                .collect::<Result<Vec<_>, String>>()?,
            // A unix socket's bind is its own probe: it fails if the file exists.
            None if l.unix.is_some() => {
                fresh.push((at.clone(), 0, l.backlog));
                vec![bind(l).map_err(|e| bind_error(l, e))?]
            }
            None => {
                probe(l).map_err(|e| bind_error(l, e))?;
                Vec::new()
            }
        };
        while socks.len() < workers {
            // A socket passed by systemd (`activation`) was bound without SO_REUSEPORT:
            // the workers share it rather than bind siblings beside it; so do they a
            // unix socket.
            let s = match socks.first() {
                Some(s) if l.unix.is_some() || super::activation::inherited(&at) => {
                    s.try_clone()
                        .map_err(|e| format!("socket dup failed: {e}"))?
                }
                _ => {
                    if !l.udp {
                        fresh.push((at.clone(), socks.len(), l.backlog));
                    }
                    bind(l).map_err(|e| bind_error(l, e))?
                }
            };
            socks.push(s);
        }
        if l.quic && socks.len() > 1 && !super::activation::inherited(&at) {
            let sock = SockRef::from(&socks[0]);
            if config.main.quic_bpf {
                quic_bpf::attach(sock).map_err(|e| {
                    format!("quic bpf setsockopt(SO_ATTACH_REUSEPORT_CBPF) on {at} failed ({e})")
                })?;
            } else if let Err(e) = quic_bpf::detach(sock) {
                crate::errlog::warn(format_args!(
                    "quic bpf setsockopt(SO_DETACH_REUSEPORT_BPF) on {at} failed ({e})"
                ));
            }
        }
        out.insert(at, socks);
    }
    for (at, i, backlog) in fresh {
        SockRef::from(&out[&at][i])
            .listen(backlog)
            .map_err(|e| format!("listen() to {at} failed ({e})"))?;
    }
    Ok(out)
}

/// Share the sockets out over `config`'s workers: each worker gets one per address, and
/// sockets beyond the worker count go round to the workers too.
pub fn assign(config: &Config, bound: &Bound) -> Result<Vec<WorkerSockets>, String> {
    let workers = config.main.worker_processes.max(1);
    let mut per: Vec<WorkerSockets> = (0..workers).map(|_| Vec::new()).collect();
    for (group, l) in config.all_listens().enumerate() {
        let at = l.endpoint();
        let socks = bound.get(&at).map_or(&[][..], Vec::as_slice);
        for (k, s) in socks.iter().enumerate() {
            let s = s
                .try_clone()
                .map_err(|e| format!("socket dup failed: {e}"))?;
            let steering = if !l.quic {
                Steering::Hash
            } else if socks.len() == 1 {
                Steering::Alone
            } else if config.main.quic_bpf && !super::activation::inherited(&at) {
                // `bind_for` attached the program; its index is the socket's place.
                u16::try_from(k).map_or(Steering::Hash, Steering::Cid)
            } else {
                Steering::Hash
            };
            per[k % workers].push((s, group, steering));
        }
    }
    Ok(per)
}
