//! Listening sockets. Each worker gets its own socket per `listen` address, all bound with
//! SO_REUSEPORT so the kernel spreads connections over workers with no shared accept queue
//! and no accept lock. They are all created by the master before any worker starts, so a
//! port in use is a start-up error, not a worker failure.

use crate::config::listen::Listen;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::TcpListener;

pub fn bind(l: &Listen) -> io::Result<TcpListener> {
    let domain = if l.addr.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    if l.addr.is_ipv6() {
        s.set_only_v6(l.ipv6only)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&l.addr.into())?;
    s.listen(l.backlog)?;
    Ok(s.into())
}

/// One socket per listen group for each of `workers` workers: result[worker][group].
pub fn bind_all(listens: &[&Listen], workers: usize) -> Result<Vec<Vec<TcpListener>>, String> {
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
