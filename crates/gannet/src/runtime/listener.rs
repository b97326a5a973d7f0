//! Listening sockets. Each worker gets its own socket per `listen` address, all bound with
//! SO_REUSEPORT so the kernel spreads connections over workers with no shared accept queue
//! and no accept lock. They are all created by the master before any worker starts, so a
//! port in use is a start-up error, not a worker failure.

use crate::config::listen::Listen;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;

/// A TCP socket for `l`'s address family, with SO_REUSEADDR (and the `ipv6only` choice),
/// bound to it; with `reuseport`, SO_REUSEPORT too.
fn bound_socket(l: &Listen, reuseport: bool) -> io::Result<Socket> {
    let domain = if l.addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(reuseport)?;
    if l.addr.is_ipv6() {
        s.set_only_v6(l.ipv6only)?;
    }
    s.bind(&l.addr.into())?;
    Ok(s)
}

pub fn bind(l: &Listen) -> io::Result<TcpListener> {
    let s = bound_socket(l, true)?;
    s.set_nonblocking(true)?;
    if l.deferred {
        let secs: libc::c_int = 1;
        // SAFETY: the fd is the open socket owned by `s`; the option value is a c_int that
        // lives across the call, and its size is passed with it.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                (&secs as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    s.listen(l.backlog)?;
    Ok(s.into())
}

/// Fail with EADDRINUSE if anything listens on the address already. SO_REUSEPORT would
/// otherwise let a second gannet (same user) join the port silently and take half of the
/// connections; a probe socket without SO_REUSEPORT cannot bind over a live listener.
fn probe(l: &Listen) -> io::Result<()> {
    bound_socket(l, false).map(drop)
}

/// One socket per listen group for each of `workers` workers: result[worker][group].
pub fn bind_all(listens: &[&Listen], workers: usize) -> Result<Vec<Vec<TcpListener>>, String> {
    for l in listens {
        probe(l).map_err(|e| format!("bind() to {} failed ({e})", l.addr))?;
    }
    let mut out = Vec::with_capacity(workers);
    for _ in 0..workers {
        let mut mine = Vec::with_capacity(listens.len());
        for l in listens {
            mine.push(bind(l).map_err(|e| format!("bind() to {} failed ({e})", l.addr))?);
        }
        out.push(mine);
    }
    Ok(out)
}
