//! Writing responses: plain bytes, headers with MSG_MORE ahead of a file, and file ranges
//! with `sendfile` (or read-and-write when `sendfile off`, and always over TLS).

use super::transport::Transport;
use crate::http::response::FileRange;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// TCP_NOTSENT_LOWAT of a kept connection: the socket takes more only once fewer than this
/// many of its bytes wait unsent (bytes in flight do not count, so a connection on a long
/// fat path still fills its window). Without it a large answer went into the socket whole
/// (the autotuned buffer takes the 394 KB image in one sendfile) and the kernel sent it as
/// the client's window opened, in small segments, much of it from the client's ACK
/// processing: the image with keep-alive at c=100 cost 0.56 server CPU s per 10k requests at
/// 17.6k req/s, against 0.26 at 23.5k with it (docs/bench/adhoc/image, interleaved;
/// docs/bench/README.md). Only kept connections get it: on one that closes after its answer,
/// the kernel may as well send the rest after the close, and waiting for the queue to drain cost
/// that case half its rate (3.9k vs 7.0k req/s at c=1). 16 KiB is the value commonly used
/// (h2o, Cloudflare) and measured best of 16, 64, 128 and 256 KiB. nginx sets nothing here.
/// Without it the arena's image at c=1,000 reads 14-19 % cheaper by the server's CPU, but
/// only because on loopback the socket's ACK-clocked sending then runs on the client's CPU:
/// server and client together spent 3.11 s per 10k answers without it, 2.79-2.86 with it
/// (docs/bench/cost-per-request.md, "the low-water mark, and whose CPU sends the answer").
const NOTSENT_LOWAT: libc::c_int = 16 << 10;

/// Keep little unsent on `sock` ([`NOTSENT_LOWAT`]); returns whether it worked.
pub fn limit_unsent(sock: socket2::SockRef<'_>) -> bool {
    crate::runtime::listener::set_tcp_int(sock, libc::TCP_NOTSENT_LOWAT, NOTSENT_LOWAT).is_ok()
}

/// Wait until the socket takes more, for at most `idle` (`send_timeout`).
pub async fn writable(stream: &TcpStream, idle: Duration) -> io::Result<()> {
    match tokio::time::timeout(idle, stream.writable()).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// Write all of `buf`; with `more`, tell the kernel more data follows (MSG_MORE) so the
/// head and the start of a file leave in full segments, as `tcp_nopush on` does in nginx.
/// gannet does it for every file, `tcp_nopush` or not: a head in a segment of its own
/// costs the client a wake-up and a read more per answer, and with `tcp_nopush off` (nginx's
/// default) that halved the 394 KB image's rate at c=100 for nginx and gannet alike
/// (3.6k vs 8.3k req/s, interleaved; see docs/bench/README.md). Unlike TCP_CORK
/// it costs no extra system call.
pub async fn write_all(
    stream: &mut TcpStream,
    buf: &[u8],
    more: bool,
    idle: Duration,
) -> io::Result<()> {
    let flags = if more { libc::MSG_MORE } else { 0 } | libc::MSG_NOSIGNAL;
    let mut sent = 0;
    let fd = stream.as_raw_fd();
    while sent < buf.len() {
        let rest = &buf[sent..];
        let r = stream.try_io(Interest::WRITABLE, || {
            // SAFETY: `fd` is the live socket owned by `stream`; `rest` is a valid slice for
            // its whole length and send() only reads from it.
            let n = unsafe { libc::send(fd, rest.as_ptr().cast(), rest.len(), flags) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable(stream, idle).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Send as much of `buf` as the socket takes now, without waiting: the bytes sent. For a
/// socket not in the event loop yet (`transport::Plain::Raw`), whose answer usually fits the
/// socket buffer whole.
pub fn send_now(fd: RawFd, buf: &[u8], more: bool) -> io::Result<usize> {
    let flags = if more { libc::MSG_MORE } else { 0 } | libc::MSG_NOSIGNAL;
    let mut sent = 0;
    while sent < buf.len() {
        let rest = &buf[sent..];
        // SAFETY: `fd` is a live socket its caller owns; `rest` is a valid slice for its
        // whole length and send() only reads from it.
        let n = unsafe { libc::send(fd, rest.as_ptr().cast(), rest.len(), flags) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                break;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(sent)
}

/// [`send_now`] for a file range with sendfile(2): the bytes sent before the socket would
/// block.
pub fn sendfile_now(fd: RawFd, f: &FileRange) -> io::Result<u64> {
    let file = f.file.as_raw_fd();
    let mut off = f.offset as libc::off_t;
    let end = (f.offset + f.len) as libc::off_t;
    while off < end {
        let chunk = ((end - off) as usize).min(1 << 30);
        // SAFETY: both fds are open for the duration of the call (the socket is owned by the
        // caller, the file by `f`), and `off` is a valid, exclusively borrowed off_t.
        let n = unsafe { libc::sendfile(fd, file, &mut off, chunk) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                break;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(truncated());
        }
    }
    Ok(off as u64 - f.offset)
}

fn truncated() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "file truncated while sending")
}

/// Send a file range with sendfile(2): the bytes go from the page cache to the socket
/// without passing through this process.
pub async fn sendfile(stream: &mut TcpStream, f: &FileRange, idle: Duration) -> io::Result<()> {
    let sock = stream.as_raw_fd();
    let file = f.file.as_raw_fd();
    let mut off = f.offset as libc::off_t;
    let end = (f.offset + f.len) as libc::off_t;
    while off < end {
        let chunk = ((end - off) as usize).min(1 << 30);
        let r = stream.try_io(Interest::WRITABLE, || {
            // SAFETY: both fds are open for the duration of the call (the socket is owned by
            // `stream`, the file by `f`), and `off` is a valid, exclusively borrowed off_t.
            let n = unsafe { libc::sendfile(sock, file, &mut off, chunk) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            // The file shrank under us: the promised length can no longer be sent.
            Ok(0) => return Err(truncated()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable(stream, idle).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `sendfile off` (and any file over TLS): read the range in pieces and write them.
pub async fn copy_file<S: Transport>(
    stream: &mut S,
    f: &FileRange,
    idle: Duration,
) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = f.offset;
    let end = f.offset + f.len;
    while off < end {
        let want = ((end - off) as usize).min(buf.len());
        let n = f.file.read_at(&mut buf[..want], off)?;
        if n == 0 {
            return Err(truncated());
        }
        stream.write_all(&buf[..n], idle).await?;
        off += n as u64;
    }
    Ok(())
}
