//! How an HTTP/2 connection that gannet ends is closed, as nginx's lingering close
//! (ngx_http_v2_lingering_close). The codec writes its last frames and shuts our side
//! (`poll_shutdown`, a FIN after them); closed then with bytes from the client unread, or
//! with some arriving later, the socket would answer with a reset, and a reset throws away
//! what our kernel has not yet got the client to acknowledge - the end of an answer to a
//! slow reader, or the GOAWAY. So the socket is kept a while: what the client still sends
//! is read and dropped until
//!
//! - it closes (or the connection fails), and, for a connection a graceful stop or reload
//!   ends ([`Mode::UntilDelivered`]),
//! - or the client has acknowledged every byte we sent, FIN included (the socket's send
//!   queue is empty, `SIOCOUTQ`): a reset can destroy nothing from then on, and the worker
//!   need not wait for a client that keeps its connection open (nginx's tests do, with
//!   `lingering_close off`, which gannet does not read).
//!
//! The connection loop bounds it all (`conn::h2`'s `LINGER`). No readiness event says "the
//! peer acknowledged everything", so the send queue is looked at again after a short
//! while, less often the longer it takes; only a stopping connection whose client has not
//! yet taken all of it does so.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// What a shutdown of the connection does after our side is shut.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Mode {
    /// Nothing more: the connection is closed.
    #[default]
    Off,
    /// The client's input is read and dropped until it closes (a flood's cut-off).
    UntilClosed,
    /// As `UntilClosed`, or until the client has acknowledged all we sent (a graceful
    /// stop or reload).
    UntilDelivered,
}

/// The first look again at a send queue the client has not emptied yet; each next one
/// waits twice as long, up to [`RECHECK_MAX`].
const RECHECK_MIN: Duration = Duration::from_millis(5);
const RECHECK_MAX: Duration = Duration::from_millis(100);

/// Set by the connection loop, read by [`Lingering`] when the codec shuts the socket.
pub struct Linger {
    mode: Cell<Mode>,
    /// The connection's socket.
    fd: RawFd,
    /// Our side is shut: all was written.
    shut: Cell<bool>,
}

impl Linger {
    /// For the connection on socket `fd`.
    pub fn new(fd: RawFd) -> Linger {
        Linger {
            mode: Cell::new(Mode::Off),
            fd,
            shut: Cell::new(false),
        }
    }

    /// A flood's cut-off lingers until the client closes; a stop until it has everything
    /// (a flood's stricter mode stays).
    pub fn set(&self, mode: Mode) {
        if self.mode.get() != Mode::UntilClosed {
            self.mode.set(mode);
        }
    }

    /// Once lingering is asked for, while our side is not shut yet (the codec still has
    /// bytes to write): how long until the socket has sent nothing for `timeout` with
    /// bytes waiting in it (`send_timeout`: nginx's send timer ends a connection whose
    /// client takes nothing), zero once it has. The kernel's own count (TCP_INFO: the time
    /// since data last went out) is what TLS's buffering does not hide.
    pub fn stall_left(&self, timeout: Duration) -> Option<Duration> {
        if self.mode.get() == Mode::Off || self.shut.get() {
            return None;
        }
        Some(timeout.saturating_sub(stalled(self.fd)?))
    }
}

/// How long TCP socket `fd` has had bytes to send and sent none (a client whose window is
/// shut); zero when its queue is empty. `None` if that cannot be told.
fn stalled(fd: RawFd) -> Option<Duration> {
    // SAFETY: tcp_info is plain integers, for which all zeroes is a value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is that large and
    // lives for the call, and `len` says how many it wrote; `fd` is the connection's
    // socket, which the stream that owns it keeps open.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // Kernels before 4.6 do not fill tcpi_notsent_bytes in.
    if r != 0 || (len as usize) < std::mem::size_of::<libc::tcp_info>() {
        return None;
    }
    let waiting = info.tcpi_unacked > 0 || info.tcpi_notsent_bytes > 0;
    Some(if waiting {
        Duration::from_millis(info.tcpi_last_data_sent.into())
    } else {
        Duration::ZERO
    })
}

/// The socket under the codec (and its guards): its shutdown lingers as [`Linger`] says.
pub struct Lingering<IO> {
    io: IO,
    linger: Rc<Linger>,
    recheck: Option<(Pin<Box<Sleep>>, Duration)>,
}

impl<IO> Lingering<IO> {
    /// (`linger` is made for `io`'s socket.)
    pub fn new(io: IO, linger: Rc<Linger>) -> Lingering<IO> {
        Lingering {
            io,
            linger,
            recheck: None,
        }
    }
}

/// Bytes sent on TCP socket `fd` that the peer has not acknowledged yet (a FIN counts one),
/// `None` if that cannot be told.
fn unacknowledged(fd: RawFd) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ on a TCP socket) writes one int through the pointer, which
    // points at `n` for the whole call; `fd` is the connection's socket, which the stream
    // that owns it keeps open.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    (r == 0).then(|| usize::try_from(n).unwrap_or(0))
}

impl<IO: AsyncRead + AsyncWrite + AsRawFd + Unpin> Lingering<IO> {
    /// Whether the client has acknowledged all we sent; if not, a wake-up is set to look
    /// again.
    fn poll_delivered(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if unacknowledged(self.io.as_raw_fd()) == Some(0) {
                return Poll::Ready(());
            }
            let (sleep, every) = self
                .recheck
                .get_or_insert_with(|| (Box::pin(tokio::time::sleep(RECHECK_MIN)), RECHECK_MIN));
            ready!(sleep.as_mut().poll(cx));
            *every = (*every * 2).min(RECHECK_MAX);
            let next = tokio::time::Instant::now() + *every;
            sleep.as_mut().reset(next);
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Lingering<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + AsRawFd + Unpin> AsyncWrite for Lingering<IO> {
    writes_through!(no_shutdown);

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let mode = this.linger.mode.get();
        if !this.linger.shut.get() {
            let r = ready!(Pin::new(&mut this.io).poll_shutdown(cx));
            if mode == Mode::Off || r.is_err() {
                return Poll::Ready(r);
            }
            this.linger.shut.set(true);
        }
        let mut scratch = [0u8; 4096];
        loop {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        if mode == Mode::UntilDelivered {
            ready!(this.poll_delivered(cx));
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (s, c)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A stop's close ends once the client has acknowledged everything, though it keeps its
    /// side open; what it sends meanwhile is read off, and it gets all that was written.
    #[test]
    fn a_stop_ends_once_all_is_acknowledged() {
        rt().block_on(async {
            let (s, mut c) = pair().await;
            let linger = Rc::new(Linger::new(s.as_raw_fd()));
            linger.set(Mode::UntilDelivered);
            let mut s = Lingering::new(s, linger);
            s.write_all(b"last frames").await.unwrap();
            c.write_all(b"a late PING").await.unwrap();
            s.shutdown().await.unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"last frames");
        });
    }

    /// While the codec still writes, a socket whose client takes nothing is stalled from
    /// when it last sent; one with nothing to send is not.
    #[test]
    fn a_client_that_takes_nothing_stalls() {
        rt().block_on(async {
            let (mut s, _c) = pair().await;
            let linger = Linger::new(s.as_raw_fd());
            let hour = Duration::from_secs(3600);
            assert_eq!(linger.stall_left(hour), None);
            linger.set(Mode::UntilDelivered);
            assert_eq!(linger.stall_left(hour), Some(hour));
            // The client reads nothing: its window shuts, and the rest waits in the socket.
            let chunk = vec![0u8; 64 * 1024];
            while tokio::time::timeout(Duration::from_millis(200), s.write_all(&chunk))
                .await
                .is_ok()
            {}
            let stuck = async {
                while linger.stall_left(hour).is_some_and(|left| left == hour) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(5), stuck)
                .await
                .unwrap();
            assert!(linger.stall_left(hour).is_some_and(|left| left < hour));
        });
    }

    /// A flood's close waits for the client to close, whatever it has acknowledged.
    #[test]
    fn a_cut_off_lingers_until_the_client_closes() {
        rt().block_on(async {
            let (s, mut c) = pair().await;
            let linger = Rc::new(Linger::new(s.as_raw_fd()));
            linger.set(Mode::UntilClosed);
            linger.set(Mode::UntilDelivered);
            let mut s = Lingering::new(s, linger);
            let mut shut = Box::pin(s.shutdown());
            let waiting = tokio::time::timeout(Duration::from_millis(50), &mut shut).await;
            assert!(waiting.is_err());
            c.write_all(b"more").await.unwrap();
            drop(c);
            shut.await.unwrap();
        });
    }
}
