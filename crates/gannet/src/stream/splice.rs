//! `proxy_splice on` (gannet's own directive; nginx's stream proxy has no splice): the
//! plain TCP relay moves bytes socket -> pipe -> socket with splice(2), so they never
//! cross into userspace. Only a session whose both sides are plain TCP sockets and which
//! has no rate limit is spliced (the caller decides); TLS, unix upstreams and paced
//! sessions keep the buffered relay.
//!
//! A direction starts as a plain copy through a buffer and is spliced from its first read
//! that fills the buffer (`proxy_buffer_size`): a short session (a request and its answer,
//! a database's small messages) never pays for a pipe (pipe2, F_SETPIPE_SZ, two more
//! descriptors to close, two splices where one read and one write do), which made spliced
//! short sessions cost 1.3x the copied ones; a bulk transfer switches within its first
//! buffer. Each spliced direction has its own pipe. The pipe is only ever filled while empty, so
//! an EAGAIN from socket -> pipe means "no data" and one from pipe -> socket means "the
//! socket's send buffer is full": each maps onto tokio's readiness of that socket
//! (`try_io` clears it, the next `readable()`/`writable()` waits for the kernel).

use super::proxy::Flow;
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Linux's default pipe size; `proxy_buffer_size` above it asks for a larger pipe.
const DEFAULT_PIPE: usize = 64 * 1024;

/// A pipe's two ends and its capacity.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    cap: usize,
}

impl Pipe {
    fn new(want: usize) -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut cap = DEFAULT_PIPE;
        if want > DEFAULT_PIPE {
            // A refusal (over /proc/sys/fs/pipe-max-size for an unprivileged worker, or
            // the user's pipe pages spent) keeps the default size.
            let asked = i32::try_from(want).unwrap_or(i32::MAX);
            // SAFETY: F_SETPIPE_SZ on a pipe fd we own; no memory is passed.
            let got = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, asked) };
            if got > 0 {
                cap = got as usize;
            }
        }
        Ok(Pipe { r, w, cap })
    }
}

/// One splice(2) call; `Ok(0)`: end of input.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: both fds are open for the call (borrowed from live sockets and pipes);
    // null offsets are required for sockets and pipes; no memory of ours is passed.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n => Ok(n as usize),
    }
}

/// Write `data` fully to `to` (the PROXY line and the `ssl_preread` bytes before the
/// splicing starts).
pub(super) async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The spliced counterpart of the buffered relay's `pump`: `from` to `to` until `from`'s
/// EOF (or a read error): `true`; a write error (EPIPE, ECONNRESET): `false`. With
/// `half_close` an EOF is passed on as a shutdown of `to`'s writing side.
pub(super) async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    flow: &Flow,
    (size, half_close): (usize, bool),
    last: &Cell<Instant>,
) -> bool {
    let mut pipe: Option<Pipe> = None;
    // Until a read fills it: the copying phase's buffer (made at the first read).
    let mut copying = true;
    let mut buf = Vec::new();
    loop {
        // In: wait for bytes (or the EOF) before making the pipe.
        if from.readable().await.is_err() {
            return true;
        }
        if copying {
            if buf.is_empty() {
                buf = vec![0; size];
            }
            let n = match from.try_read(&mut buf) {
                Ok(0) if half_close => return shut_write(to),
                Ok(0) => return true,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return true,
            };
            last.set(Instant::now());
            if flow.first.get().is_none() {
                flow.first.set(Some(Instant::now()));
            }
            if write_all(to, &buf[..n]).await.is_err() {
                return false;
            }
            flow.bytes.set(flow.bytes.get() + n as u64);
            last.set(Instant::now());
            if n == buf.len() {
                // A full buffer: a bulk transfer; splice from here on.
                copying = false;
                buf = Vec::new();
            }
            continue;
        }
        let p = match &pipe {
            Some(p) => p,
            None => match Pipe::new(size) {
                Ok(p) => pipe.insert(p),
                // No pipe (fds spent): nothing can be relayed; the session ends as on an
                // error, which the log line names.
                Err(e) => {
                    crate::errlog::error(format_args!("pipe2() failed ({e})"));
                    return false;
                }
            },
        };
        let got = from.try_io(Interest::READABLE, || {
            splice(from.as_raw_fd(), p.w.as_raw_fd(), p.cap)
        });
        let mut left = match got {
            Ok(0) if half_close => return shut_write(to),
            Ok(0) => return true,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        };
        last.set(Instant::now());
        if flow.first.get().is_none() {
            flow.first.set(Some(Instant::now()));
        }
        // Out: drain the pipe fully before reading again.
        while left > 0 {
            if to.writable().await.is_err() {
                return false;
            }
            let put = to.try_io(Interest::WRITABLE, || {
                splice(p.r.as_raw_fd(), to.as_raw_fd(), left)
            });
            match put {
                // A pipe holding bytes never reads as empty; stop rather than spin.
                Ok(0) => return false,
                Ok(n) => {
                    left -= n;
                    flow.bytes.set(flow.bytes.get() + n as u64);
                    last.set(Instant::now());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// `proxy_half_close`: shut the writing side of `to`.
fn shut_write(to: &TcpStream) -> bool {
    socket2::SockRef::from(to)
        .shutdown(std::net::Shutdown::Write)
        .is_ok()
}
