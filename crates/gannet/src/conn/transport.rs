//! How the connection loop reaches its client: the [`Transport`] trait, and its cleartext
//! implementation straight on the TCP socket ([`Plain`], which joins the event loop only
//! when it has to wait).
//!
//! The HTTP/1.x loop (`conn::h1`) is generic over this trait, so each kind of connection is
//! compiled on its own: the cleartext path keeps its `recv` / `try_read` / `sendfile` /
//! parking code exactly as it was, and TLS (`conn::tls_stream`) reads and writes through
//! rustls instead, with no branch on the kind in between.
//!
//! Writes that wait take `idle`, nginx's `send_timeout`: the longest the client may take
//! no more bytes, timed per wait rather than for the whole write, so a large file to a slow
//! (or `limit_rate`d) client is not cut off as long as it keeps reading.

use super::send;
use crate::http::response::FileRange;
use bytes::BytesMut;
use std::future::Future;
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::TcpStream;

/// What the connection loop needs from its stream. Reads never wait (they answer
/// `WouldBlock`); waiting is `poll_readable`, so the loop keeps its own deadlines.
pub trait Transport: Sized {
    /// Whether an idle connection can leave its task as a bare socket (`runtime::parking`).
    const PARKABLE: bool;

    /// The bare socket for parking (`None` when the connection cannot park).
    fn into_parkable(self) -> Option<std::net::TcpStream>;

    /// Set TCP_NODELAY; returns whether it worked.
    fn set_nodelay(&self) -> bool;

    /// Keep little unsent (`send::limit_unsent`); returns whether it worked.
    fn limit_unsent(&self) -> bool;

    /// Read what has arrived, whatever the event loop last heard about the socket.
    fn read_now(&mut self, buf: &mut BytesMut) -> io::Result<usize>;

    /// Read what has arrived after the socket was reported readable.
    fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<usize>;

    /// Ready (true) when a read will not answer `WouldBlock`; false when the stream broke.
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<bool>;

    /// Whether the stream is in the event loop already, so that waiting on it costs no
    /// system call to register it (and none to take it out at its close).
    fn in_loop(&self) -> bool {
        true
    }

    /// Wait for data and read it (a request body's next piece). Ok(0) is the end.
    fn read_wait(&mut self, buf: &mut BytesMut) -> impl Future<Output = io::Result<usize>>;

    /// Write what the stream takes now without waiting; returns how much of `data` it took.
    fn try_write(&mut self, data: &[u8]) -> io::Result<usize>;

    /// [`Transport::try_write`] for the last bytes of a connection that closes right after
    /// and has nothing unread: they may wait for the close to go out with its FIN.
    fn try_write_last(&mut self, data: &[u8]) -> io::Result<usize> {
        self.try_write(data)
    }

    /// Output taken by `try_write` that has not reached the socket yet (TLS records).
    fn has_pending(&self) -> bool;

    /// Write all of `data` (and anything pending before it).
    fn write_all(&mut self, data: &[u8], idle: Duration) -> impl Future<Output = io::Result<()>>;

    /// Write `a` then `b`, in one system call when the stream allows it.
    fn write_pair(
        &mut self,
        a: &[u8],
        b: &[u8],
        idle: Duration,
    ) -> impl Future<Output = io::Result<()>>;

    /// Write `head` and then a file range, with `sendfile` as configured.
    fn send_file(
        &mut self,
        head: &[u8],
        f: &FileRange,
        sendfile: bool,
        idle: Duration,
    ) -> impl Future<Output = io::Result<()>>;

    /// The connection is closing cleanly: say so if the protocol has a way (TLS
    /// close_notify). Best effort, never waits.
    fn close(&mut self) {}

    /// No more bytes will be sent, but reading goes on (a relayed half close). TLS has no
    /// half close: it says close_notify.
    fn shutdown_write(&mut self) {
        self.close();
    }
}

/// A cleartext client connection, registered with the event loop only once it has to
/// wait. Most short connections never do: with deferred accept the request is there when
/// the socket is accepted, the answer (a file too) fits the socket buffer, and the connection
/// closes. nginx skips `epoll_ctl` for them the same way (it reads a deferred-accept
/// socket before adding it); registering every socket (tokio's `accept`) cost two more
/// system calls per connection, ADD and DEL, a tenth of the server's CPU time for
/// robots.txt with a new connection per request. A write that would block and any
/// wait register it, and from then on it is the plain tokio stream.
pub enum Plain {
    /// Not in the event loop yet: reads and writes are direct system calls.
    Raw(std::net::TcpStream),
    Reg(TcpStream),
    /// Registering failed; every operation fails.
    Failed,
}

impl Plain {
    /// The tokio stream, registering the socket now if it is not yet.
    fn reg(&mut self) -> io::Result<&mut TcpStream> {
        if let Plain::Raw(_) = self {
            if let Plain::Raw(s) = std::mem::replace(self, Plain::Failed) {
                *self = Plain::Reg(TcpStream::from_std(s)?);
            }
        }
        match self {
            Plain::Reg(t) => Ok(t),
            _ => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// The socket, registered or not.
    fn sock(&self) -> Option<socket2::SockRef<'_>> {
        match self {
            Plain::Raw(s) => Some(s.into()),
            Plain::Reg(t) => Some(t.into()),
            Plain::Failed => None,
        }
    }
}

impl Transport for Plain {
    const PARKABLE: bool = true;

    fn in_loop(&self) -> bool {
        matches!(self, Plain::Reg(_))
    }

    fn shutdown_write(&mut self) {
        if let Some(s) = self.sock() {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }

    /// A socket never registered leaves as it is: no `epoll_ctl` DEL.
    fn into_parkable(self) -> Option<std::net::TcpStream> {
        match self {
            Plain::Raw(s) => Some(s),
            Plain::Reg(t) => t.into_std().ok(),
            Plain::Failed => None,
        }
    }

    fn set_nodelay(&self) -> bool {
        self.sock().is_some_and(|s| s.set_tcp_nodelay(true).is_ok())
    }

    fn limit_unsent(&self) -> bool {
        self.sock().is_some_and(send::limit_unsent)
    }

    /// One `recv` straight on the socket.
    fn read_now(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let s = self.sock().ok_or(io::ErrorKind::NotConnected)?;
        buf.reserve(1024);
        let n = s.recv(buf.spare_capacity_mut())?;
        // SAFETY: recv() initialised the first `n` bytes of the spare capacity it was given.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }

    /// A short read means the socket is drained, and tokio is told so (by answering
    /// WouldBlock from inside `try_io`, which clears the readiness unless a new event came
    /// in meanwhile). Without that, every request would cost one more `recv` that only
    /// returns EAGAIN before the connection waits again.
    fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let Plain::Reg(stream) = self else {
            return self.read_now(buf);
        };
        let spare = buf.capacity() - buf.len();
        let mut got = 0;
        let r = stream.try_io(Interest::READABLE, || {
            got = stream.try_read_buf(buf)?;
            if got > 0 && got < spare {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(got)
            }
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
            r => r,
        }
    }

    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        match self.reg() {
            Ok(t) => t.poll_read_ready(cx).map(|r| r.is_ok()),
            Err(_) => Poll::Ready(false),
        }
    }

    async fn read_wait(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.reg()?.read_buf(buf).await
    }

    fn try_write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            // MSG_NOSIGNAL, as tokio's write: a closed peer is an error, not a signal.
            Plain::Raw(s) => socket2::SockRef::from(&*s).send_with_flags(data, libc::MSG_NOSIGNAL),
            Plain::Reg(t) => t.try_write(data),
            Plain::Failed => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// With MSG_MORE: the kernel holds the answer's last segment, and the close that
    /// follows at once puts its FIN on it - one segment (and one ACK from the client)
    /// where an answer sent and then closed took two, data then FIN. nginx's close after a
    /// corked (`tcp_nopush`) answer goes out the same way. Only without bytes unread: a
    /// close with some would reset the connection and drop the held answer.
    fn try_write_last(&mut self, data: &[u8]) -> io::Result<usize> {
        const FLAGS: libc::c_int = libc::MSG_NOSIGNAL | libc::MSG_MORE;
        match self {
            Plain::Raw(s) => socket2::SockRef::from(&*s).send_with_flags(data, FLAGS),
            Plain::Reg(t) => t.try_io(Interest::WRITABLE, || {
                socket2::SockRef::from(&*t).send_with_flags(data, FLAGS)
            }),
            Plain::Failed => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    fn has_pending(&self) -> bool {
        false
    }

    /// Straight to a socket not in the event loop yet, registering it only if the socket
    /// buffer fills (as [`Transport::send_file`]).
    async fn write_all(&mut self, mut data: &[u8], idle: Duration) -> io::Result<()> {
        if let Plain::Raw(s) = self {
            data = &data[send::send_now(s.as_raw_fd(), data, false)?..];
            if data.is_empty() {
                return Ok(());
            }
        }
        send::write_all(self.reg()?, data, false, idle).await
    }

    async fn write_pair(&mut self, a: &[u8], b: &[u8], idle: Duration) -> io::Result<()> {
        let stream = self.reg()?;
        let mut bufs = [IoSlice::new(a), IoSlice::new(b)];
        let total = a.len() + b.len();
        let mut written = 0;
        let mut bufs: &mut [IoSlice<'_>] = &mut bufs;
        while written < total {
            match stream.try_write_vectored(bufs) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    written += n;
                    IoSlice::advance_slices(&mut bufs, n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    send::writable(stream, idle).await?
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// A socket not in the event loop yet gets the head and the file straight away, and is
    /// registered only if the socket buffer fills: a new connection's file answer that fits
    /// it (the 394 KB image on loopback does) then costs no `epoll_ctl` ADD and DEL, as in
    /// nginx (see [`Plain`]).
    async fn send_file(
        &mut self,
        mut head: &[u8],
        f: &FileRange,
        sendfile: bool,
        idle: Duration,
    ) -> io::Result<()> {
        let mut rest = None;
        if let Plain::Raw(s) = &*self {
            let fd = s.as_raw_fd();
            head = &head[send::send_now(fd, head, f.len > 0)?..];
            if head.is_empty() && !sendfile {
                // Its writes go straight to the socket too, until one would block.
                return send::copy_file(self, f, idle).await;
            }
            if head.is_empty() {
                let sent = send::sendfile_now(fd, f)?;
                if sent == f.len {
                    return Ok(());
                }
                rest = Some(FileRange {
                    file: f.file.clone(),
                    offset: f.offset + sent,
                    len: f.len - sent,
                });
            }
        }
        let f = rest.as_ref().unwrap_or(f);
        let stream = self.reg()?;
        if !head.is_empty() {
            // MSG_MORE whatever `tcp_nopush` says (see `send::write_all`); not before an
            // empty range, where nothing would follow to push the head out.
            send::write_all(stream, head, f.len > 0, idle).await?;
        }
        if sendfile {
            send::sendfile(stream, f, idle).await
        } else {
            send::copy_file(self, f, idle).await
        }
    }
}
