//! `proxy_splice on` (gannet's own directive; nginx's stream proxy has no splice): the
//! plain TCP relay (`relay`) moves bytes socket -> pipe -> socket with splice(2), so they
//! never cross into userspace. Only a session whose both sides are plain sockets and which
//! has no rate limit is spliced; TLS, unix upstreams and paced sessions keep the buffered
//! relay.
//!
//! A direction starts as a plain copy through a buffer and is spliced from its first read
//! that fills the buffer (`proxy_buffer_size`): a short session (a request and its answer,
//! a database's small messages) never pays for a pipe (pipe2, F_SETPIPE_SZ, two more
//! descriptors to close, two splices where one read and one write do), which made spliced
//! short sessions cost 1.3x the copied ones; a bulk transfer switches within its first
//! buffer. Each spliced direction has its own pipe. The pipe is only ever filled while
//! empty, so an EAGAIN from socket -> pipe means "no data" and one from pipe -> socket
//! means "the socket's send buffer is full": each maps onto tokio's readiness of that
//! socket (`try_io` clears it, the next poll waits for the kernel).
//!
//! This file holds the pipe and the call; the relay (`relay::step`) drives them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Linux's default pipe size; `proxy_buffer_size` above it asks for a larger pipe.
const DEFAULT_PIPE: usize = 64 * 1024;

/// A pipe's two ends and its capacity.
pub(super) struct Pipe {
    pub(super) r: OwnedFd,
    pub(super) w: OwnedFd,
    pub(super) cap: usize,
}

impl Pipe {
    pub(super) fn new(want: usize) -> io::Result<Pipe> {
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
pub(super) fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
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
