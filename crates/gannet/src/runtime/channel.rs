//! The master's line to a worker process: one end of an AF_UNIX SOCK_SEQPACKET socketpair
//! each. SEQPACKET keeps message boundaries, so a message is one `sendmsg` and one
//! `recvmsg`, and descriptors ride along as SCM_RIGHTS (how the master, still root, hands
//! freshly reopened log files to a worker that could not open them itself).
//!
//! The worker reads its end with blocking calls on a thread of its own; the master's end
//! is non-blocking, so a stuck worker can never stall the master.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message carries (the kernel's limit, SCM_MAX_FD, is 253).
pub const MAX_FDS: usize = 200;

/// The longest message.
pub const MAX_MSG: usize = 4096;

pub struct Channel {
    fd: OwnedFd,
}

/// A connected pair: (master's end, worker's end), both close-on-exec; the master's end
/// non-blocking.
pub fn pair() -> io::Result<(Channel, Channel)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded: both descriptors are open and owned by nobody else.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    socket2::SockRef::from(&a).set_nonblocking(true)?;
    Ok((Channel { fd: a }, Channel { fd: b }))
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Bytes of control buffer for `n` descriptors.
fn space_for(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

impl Channel {
    /// Send `msg` with `fds` (at most [`MAX_FDS`]); the descriptors stay open here.
    pub fn send(&self, msg: &[u8], fds: &[RawFd]) -> io::Result<()> {
        if fds.len() > MAX_FDS || msg.is_empty() || msg.len() > MAX_MSG {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // u64s so the control buffer is aligned for cmsghdr.
        let mut control = vec![0u64; space_for(MAX_FDS).div_ceil(8)];
        let mut iov = libc::iovec {
            iov_base: msg.as_ptr() as *mut libc::c_void,
            iov_len: msg.len(),
        };
        // SAFETY: msghdr is plain data, valid when zeroed.
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        if !fds.is_empty() {
            hdr.msg_control = control.as_mut_ptr().cast();
            hdr.msg_controllen = space_for(fds.len());
            // SAFETY: msg_control points at `control`, at least msg_controllen bytes and
            // aligned, so CMSG_FIRSTHDR returns a header inside it with room for `fds`
            // after it (CMSG_SPACE(len) >= CMSG_LEN(len)); the copy stays within that room.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&hdr);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr().cast::<u8>(),
                    libc::CMSG_DATA(c),
                    std::mem::size_of_val(fds),
                );
            }
        }
        // SAFETY: `hdr` points at `iov` (over `msg`) and `control`, all alive for the call;
        // sendmsg only reads them.
        let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next message into `buf` (its length; 0 when the other end is gone) and the
    /// descriptors that came with it, owned by the caller. Blocks on a blocking end.
    pub fn recv(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
        let mut control = vec![0u64; space_for(MAX_FDS).div_ceil(8)];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data, valid when zeroed.
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = control.len() * 8;
        let n = loop {
            // SAFETY: `hdr` points at `iov` (over `buf`) and `control`, writable and alive
            // for the call, with their true lengths.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        // SAFETY: recvmsg filled `control` and set msg_controllen to what it wrote; the
        // CMSG_* walk stays within it. Each SCM_RIGHTS payload is an array of descriptors
        // the kernel just installed in this process, owned by no one else yet.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&hdr);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let len = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                    for i in 0..len / std::mem::size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned(
                            data.add(i * std::mem::size_of::<RawFd>()).cast::<RawFd>(),
                        );
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(&hdr, c);
            }
        }
        if hdr.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other(
                "descriptors lost: control message truncated",
            ));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn message_and_descriptors_arrive() {
        let (master, worker) = pair().unwrap();
        let mut f = tempfile();
        f.write_all(b"passed").unwrap();
        master.send(b"R\x00", &[f.as_raw_fd()]).unwrap();
        master.send(b"Q", &[]).unwrap();
        let (mut buf, mut fds) = ([0u8; 64], Vec::new());
        assert_eq!(worker.recv(&mut buf, &mut fds).unwrap(), 2);
        assert_eq!(&buf[..2], b"R\x00");
        assert_eq!(fds.len(), 1);
        let mut got = std::fs::File::from(fds.pop().unwrap());
        got.rewind().unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "passed");
        assert_eq!(worker.recv(&mut buf, &mut fds).unwrap(), 1);
        assert!(fds.is_empty());
        drop(master);
        assert_eq!(worker.recv(&mut buf, &mut fds).unwrap(), 0, "EOF");
    }

    fn tempfile() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("gannet-chan-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }
}
