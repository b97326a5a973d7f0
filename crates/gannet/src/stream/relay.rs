//! The plain TCP relay of the stream proxy: a session whose client and upstream are both
//! plain sockets (no TLS on either side, a TCP upstream) and that no rate paces, which is
//! the common case and the one short sessions are made of. `proxy` decides; TLS, unix
//! upstreams and paced sessions keep its buffered relay.
//!
//! Written for its cost per session, counted in system calls, wake-ups and instructions
//! (docs/bench/l4-proxy-report.md, "Cost per session"):
//! - a socket joins the event loop only when it has to wait ([`Sock`]): the client's first
//!   bytes are read, and the upstream connected, without it (registering and leaving
//!   tokio's epoll set is an `epoll_ctl` each);
//! - the upstream's connect is not waited for when it is done by the time the client's
//!   first bytes are sent (loopback and fast networks: a send on a connecting socket says
//!   EAGAIN until it is connected): no wake-up, no SO_ERROR read ([`connect`]);
//! - a read shorter than the buffer shows the socket is drained: the next read waits for
//!   the event loop instead of asking for an EAGAIN;
//! - one deadline per session, in the worker's timer table (`runtime::read_timers`), taken
//!   only when the session first waits and moved only when it fires;
//! - reads go to one buffer per worker and are written out at once; a direction keeps
//!   bytes of its own only when the other side does not take them all, so a short session
//!   allocates no buffer. With `proxy_splice` a direction whose read fills the buffer moves
//!   to splice(2) (see `splice`).

use super::epoll::{self, Dir, Epoll, Key};
use super::splice::{splice, Pipe};
use crate::runtime::clock;
use crate::runtime::read_timers::{Held, ReadTimers};
use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// System calls one direction makes in a turn before letting the worker's other tasks
/// run (a bulk transfer always has more to read).
const OPS_PER_TURN: usize = 32;

thread_local! {
    /// The worker's read buffer (one thread per worker): a read is written out before
    /// anything else runs, so every session shares it.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A plain socket of a session (TCP, or the client of a `listen unix:`), in an event loop
/// only once it has to wait: until then reads and writes are direct system calls. It
/// waits in the relays' own epoll set (`epoll`), which its close leaves by itself, or in
/// tokio's when it is used through tokio's traits (`return`, the buffered relay) or was
/// there already (read by `ssl_preread` or a PROXY header).
pub enum Sock {
    Raw(std::net::TcpStream),
    Own(Owned),
    Reg(TcpStream),
    /// Registering failed; every operation fails.
    Failed,
}

/// A socket in the relays' epoll set.
pub struct Owned {
    /// Always there but while moving to tokio's set (`Sock::reg`).
    s: Option<std::net::TcpStream>,
    key: Key,
    set: Rc<Epoll>,
}

impl Drop for Owned {
    /// The slot goes; the socket's close (its field, dropped next) leaves the set.
    fn drop(&mut self) {
        self.set.remove(self.key);
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

fn sys_result(n: isize) -> io::Result<usize> {
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n => Ok(n as usize),
    }
}

/// One recv(2) on a socket.
fn sys_recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes for the call; `fd` is
    // open (borrowed from a live `Sock`).
    sys_result(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) })
}

/// One send(2), MSG_NOSIGNAL as tokio's and std's writes: a closed peer is an error, not
/// a signal.
fn sys_send(fd: RawFd, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is a live slice of `data.len()` bytes for the call; `fd` is open
    // (borrowed from a live `Sock`).
    sys_result(unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), libc::MSG_NOSIGNAL) })
}

impl Sock {
    /// The tokio stream, moving the socket to tokio's set now if it is not there yet.
    pub fn reg(&mut self) -> io::Result<&mut TcpStream> {
        if !matches!(self, Sock::Reg(_)) {
            let std = match std::mem::replace(self, Sock::Failed) {
                Sock::Raw(s) => Some(s),
                Sock::Own(mut o) => {
                    let s = o.s.take();
                    if let Some(s) = &s {
                        o.set.delete(s.as_raw_fd(), o.key);
                    }
                    s
                }
                _ => None,
            };
            if let Some(s) = std {
                *self = Sock::Reg(TcpStream::from_std(s)?);
            }
        }
        match self {
            Sock::Reg(t) => Ok(t),
            _ => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    pub fn into_tokio(mut self) -> io::Result<TcpStream> {
        self.reg()?;
        match self {
            Sock::Reg(t) => Ok(t),
            _ => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// The socket out of whichever set it waits in, for another listener to take it
    /// (`stream::pass`).
    pub fn into_std(self) -> io::Result<std::net::TcpStream> {
        match self {
            Sock::Raw(s) => Ok(s),
            Sock::Own(mut o) => {
                let s = o.s.take().ok_or(io::ErrorKind::NotConnected)?;
                o.set.delete(s.as_raw_fd(), o.key);
                Ok(s)
            }
            Sock::Reg(t) => t.into_std(),
            Sock::Failed => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Sock::Raw(s) => s.as_raw_fd(),
            Sock::Own(o) => o.s.as_ref().map_or(-1, |s| s.as_raw_fd()),
            Sock::Reg(t) => t.as_raw_fd(),
            Sock::Failed => -1,
        }
    }

    /// The socket, wherever it waits.
    pub fn sock_ref(&self) -> Option<socket2::SockRef<'_>> {
        match self {
            Sock::Raw(s) => Some(s.into()),
            Sock::Own(o) => o.s.as_ref().map(socket2::SockRef::from),
            Sock::Reg(t) => Some(t.into()),
            Sock::Failed => None,
        }
    }

    /// Tell the set the socket has nothing more for `dir` (EAGAIN, or a short read or
    /// write showing it drained or full), so the next wait is for its next event.
    fn drained(&self, dir: Dir) {
        if let Sock::Own(o) = self {
            o.set.clear(o.key, dir);
        }
    }

    /// One read. A read shorter than `buf` also counts as drained (for tokio by
    /// answering WouldBlock inside `try_io`, which clears its readiness unless an event
    /// came in meanwhile; an EOF seen with the event stays ready either way).
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Reg(t) => {
                let mut got = 0;
                let r = t.try_io(Interest::READABLE, || {
                    got = sys_recv(t.as_raw_fd(), buf)?;
                    match got > 0 && got < buf.len() {
                        true => Err(io::ErrorKind::WouldBlock.into()),
                        false => Ok(got),
                    }
                });
                match r {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
                    r => r,
                }
            }
            Sock::Failed => Err(io::ErrorKind::NotConnected.into()),
            _ => {
                let r = sys_recv(self.fd(), buf);
                match &r {
                    Ok(n) if *n > 0 && *n < buf.len() => self.drained(Dir::Read),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained(Dir::Read),
                    _ => {}
                }
                r
            }
        }
    }

    /// The peer shut its writing side down before the last read (a short one): the end
    /// is all a next read would find, so it need not be made.
    fn peer_done(&self) -> bool {
        match self {
            Sock::Own(o) => o.set.peer_done(o.key),
            _ => false,
        }
    }

    /// One write; a socket that takes nothing (or not all) is full until its next event.
    fn send(&self, data: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Reg(t) => t.try_io(Interest::WRITABLE, || sys_send(t.as_raw_fd(), data)),
            Sock::Failed => Err(io::ErrorKind::NotConnected.into()),
            _ => {
                let r = sys_send(self.fd(), data);
                match &r {
                    Ok(n) if *n < data.len() => self.drained(Dir::Write),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained(Dir::Write),
                    _ => {}
                }
                r
            }
        }
    }

    /// Ready to read (or write): a socket not waiting anywhere yet joins the relays' set
    /// (tokio's when there is none).
    fn poll_ready(&mut self, cx: &mut Context<'_>, dir: Dir) -> Poll<io::Result<()>> {
        if let Sock::Raw(s) = self {
            if let Some(set) = epoll::get() {
                match set.add(s.as_raw_fd()) {
                    Ok(key) => {
                        if let Sock::Raw(s) = std::mem::replace(self, Sock::Failed) {
                            *self = Sock::Own(Owned {
                                s: Some(s),
                                key,
                                set,
                            });
                        }
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        }
        match self {
            Sock::Own(o) => o.set.poll_ready(o.key, dir, cx).map(Ok),
            _ => match (self.reg(), dir) {
                (Ok(t), Dir::Read) => t.poll_read_ready(cx),
                (Ok(t), Dir::Write) => t.poll_write_ready(cx),
                (Err(e), _) => Poll::Ready(Err(e)),
            },
        }
    }

    /// splice(2) from this socket (into a pipe: `dir` Read) or to it (out of one: Write),
    /// with an EAGAIN noted as `recv` and `send` do.
    fn splice(&self, dir: Dir, from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
        let interest = match dir {
            Dir::Read => Interest::READABLE,
            Dir::Write => Interest::WRITABLE,
        };
        match self {
            Sock::Reg(t) => t.try_io(interest, || splice(from, to, len)),
            Sock::Failed => Err(io::ErrorKind::NotConnected.into()),
            _ => {
                let r = splice(from, to, len);
                if r.as_ref()
                    .is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock)
                {
                    self.drained(dir);
                }
                r
            }
        }
    }

    /// `proxy_half_close`: no more bytes will be sent.
    fn shutdown_write(&self) -> bool {
        self.sock_ref()
            .is_some_and(|s| s.shutdown(std::net::Shutdown::Write).is_ok())
    }
}

/// Through tokio's stream (registered at the first use): `return`, the buffered relay.
impl AsyncRead for Sock {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().reg() {
            Ok(t) => Pin::new(t).poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Sock {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().reg() {
            Ok(t) => Pin::new(t).poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().reg() {
            Ok(t) => Pin::new(t).poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// What goes to the upstream first, and the client until the relay starts: the bytes
/// before the client's (a PROXY line, `ssl_preread`'s), then the client's first bytes,
/// read as the connect is under way and sent at once.
pub struct Early {
    pub client: Sock,
    /// Not sent yet: the first `pre` bytes are the preamble, the rest the client's.
    buf: Vec<u8>,
    pre: usize,
    /// The preamble's length, all of it counted as sent to the upstream.
    pub pre_len: usize,
    /// The client's bytes sent so far.
    sent: u64,
    /// The client was read once (its bytes are in `buf` or sent).
    read: bool,
    /// That read was short: the next one waits for the event loop.
    dry: bool,
    /// The client's read side ended then: EOF (true) or an error (false).
    client_done: Option<bool>,
    /// `proxy_buffer_size`.
    size: usize,
}

impl Early {
    pub fn new(client: Sock, pre: Vec<u8>, size: usize) -> Early {
        Early {
            client,
            pre: pre.len(),
            pre_len: pre.len(),
            buf: pre,
            sent: 0,
            read: false,
            dry: false,
            client_done: None,
            size,
        }
    }

    /// The client and the unsent bytes, when the upstream is not for the plain relay
    /// (nothing of the client's was read then).
    pub fn into_parts(self) -> (Sock, Vec<u8>) {
        (self.client, self.buf)
    }

    /// `n` bytes of `buf` went out.
    fn consume(&mut self, n: usize) {
        let of_pre = n.min(self.pre);
        self.pre -= of_pre;
        self.sent += (n - of_pre) as u64;
        self.buf.drain(..n);
    }

    /// Read the client once (if not yet) and send what there is on `up`, whose connect
    /// is under way. `Ok(true)`: some went out, so `up` is connected; `Ok(false)`: nothing
    /// to send, or EAGAIN (not connected yet); `Err`: the connect failed. Whatever was
    /// read and not sent stays in `buf` for the next try (or the next upstream).
    fn send_now(&mut self, up: &Sock) -> io::Result<bool> {
        if !self.read {
            self.read = true;
            let client = &self.client;
            let (buf, size) = (&mut self.buf, self.size);
            let got = SCRATCH.with_borrow_mut(|scratch| {
                if scratch.len() < size {
                    scratch.resize(size, 0);
                }
                let n = client.recv(&mut scratch[..size])?;
                if n == 0 || !buf.is_empty() {
                    buf.extend_from_slice(&scratch[..n]);
                    return Ok((n, None));
                }
                // The common case: straight from the scratch buffer to the upstream.
                let sent = up.send(&scratch[..n]);
                let k = *sent.as_ref().unwrap_or(&0);
                buf.extend_from_slice(&scratch[k..n]);
                Ok((n, Some(sent)))
            });
            match got {
                Ok((0, _)) => self.client_done = Some(true),
                Ok((n, sent)) => {
                    self.dry = n < size;
                    match sent {
                        Some(Ok(k)) => {
                            self.sent += k as u64;
                            return Ok(true);
                        }
                        Some(Err(e)) if would_block(&e) => return Ok(false),
                        Some(Err(e)) => return Err(e),
                        None => {}
                    }
                }
                Err(e) if would_block(&e) => self.dry = true,
                Err(_) => self.client_done = Some(false),
            }
        }
        if self.buf.is_empty() {
            return Ok(false);
        }
        match up.send(&self.buf) {
            Ok(n) => {
                self.consume(n);
                Ok(true)
            }
            Err(e) if would_block(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Connect to `to` without waiting when the connect is done by the time the client's
/// first bytes are sent (see [`Early::send_now`]); else wait for it (the worker's timer
/// table keeps `timeout`), sending them then, or reading SO_ERROR when there are none.
/// `tcp_nodelay` is not set here but by the relay, before the socket's second send
/// (`Conf::nodelay`).
pub async fn connect(
    timers: &ReadTimers,
    to: SocketAddr,
    timeout: Duration,
    early: &mut Early,
) -> io::Result<Sock> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(to),
        socket2::Type::STREAM.nonblocking(),
        None,
    )?;
    match sock.connect(&to.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let mut up = Sock::Raw(sock.into());
    if early.send_now(&up)? {
        return Ok(up);
    }
    let connected = async {
        loop {
            std::future::poll_fn(|cx| up.poll_ready(cx, Dir::Write)).await?;
            if early.buf.is_empty() {
                // Writable without an error or hang-up in the same event: connected (a
                // refused connect reports EPOLLERR|EPOLLHUP); SO_ERROR is read only to
                // name a failure, or where tokio has the socket.
                if let Sock::Own(o) = &up {
                    if !o.set.failed(o.key) {
                        return Ok(());
                    }
                }
                let error = up.sock_ref().map(|r| r.take_error());
                return match error {
                    Some(Ok(None)) => Ok(()),
                    Some(Ok(Some(e)) | Err(e)) => Err(e),
                    None => Err(io::ErrorKind::NotConnected.into()),
                };
            }
            match up.send(&early.buf) {
                Ok(n) => {
                    early.consume(n);
                    return Ok(());
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        }
    };
    let r = timers.within(timeout, connected).await;
    match r {
        Ok(Ok(())) => Ok(up),
        Ok(Err(e)) => Err(e),
        Err(()) => Err(super::proxy::timed_out()),
    }
}

/// One direction of the relay.
#[derive(Default)]
struct Direction {
    /// Read and not written yet (`pending[at..]`); the first `pre` of it are preamble
    /// bytes, not counted as the direction's.
    pending: Vec<u8>,
    at: usize,
    pre: usize,
    /// The spliced phase's pipe and what it holds.
    pipe: Option<Pipe>,
    piped: usize,
    /// A read filled the buffer under `proxy_splice`: splice from now on.
    bulk: bool,
    /// The last read was short (or EAGAIN): the next one waits for the event loop.
    dry: bool,
    /// The read side ended (EOF: true, error: false), to be passed on once `pending` is out.
    src_done: Option<bool>,
    /// Some(ok) once the direction is over (see `step`).
    ended: Option<bool>,
    bytes: u64,
    first: Option<Instant>,
    /// `tcp_nodelay` is wanted on the destination and not set yet (see `Conf::nodelay`).
    nodelay_due: bool,
    /// The destination was sent to (or tried) already.
    sent_any: bool,
}

impl Direction {
    fn wrote(&mut self, n: usize) {
        let of_pre = n.min(self.pre);
        self.pre -= of_pre;
        self.bytes += (n - of_pre) as u64;
        self.at += n;
        if self.at == self.pending.len() {
            self.pending.clear();
            self.at = 0;
        }
    }

    /// Before a send to the destination: a `tcp_nodelay` still due is set before its
    /// second send (see `Conf::nodelay`).
    fn before_send(&mut self, dst: &Sock) {
        if self.nodelay_due {
            if self.sent_any {
                if let Some(r) = dst.sock_ref() {
                    let _ = r.set_tcp_nodelay(true);
                }
                self.nodelay_due = false;
            }
            self.sent_any = true;
        }
    }

    fn saw_bytes(&mut self) {
        if self.first.is_none() {
            self.first = Some(clock::now());
        }
    }
}

/// The relay's settings.
pub struct Conf<'a> {
    pub size: usize,
    pub splice: bool,
    pub half_close: bool,
    pub timeout: Duration,
    pub timers: &'a ReadTimers,
    pub id: u64,
    /// `tcp_nodelay` for the upstream ([`connect`] leaves it unset), set before the
    /// upstream's second send, not at the connect: Nagle's algorithm never holds a
    /// connection's first send back (Linux holds a small segment only while an earlier
    /// small one is unacknowledged, Minshall's rule), so the bytes go out as with it set,
    /// and a short session, whose request is one send, saves the `setsockopt`.
    pub nodelay: bool,
}

/// How a relay ended.
pub struct Outcome {
    /// The side whose end ended the session ("client" or "upstream"); `None`: `proxy_timeout`.
    pub closed: Option<&'static str>,
    /// Bytes of the client's written to the upstream, and of the upstream's to the client.
    pub up_bytes: u64,
    pub down_bytes: u64,
    /// When the upstream's first byte came.
    pub down_first: Option<Instant>,
    /// Writing the preamble failed (nginx's 502).
    pub pre_failed: bool,
}

/// What a read into the scratch buffer came to.
enum Got {
    Eof,
    ReadError,
    Wait,
    /// Read `n`, of which the other side took `k` at once.
    Moved(usize, usize),
    WriteError,
}

/// Move a direction on as far as it goes now. `Ready(ok)`: it is over: its source ended
/// (`ok`: and, with `half_close`, that was passed on), or a write failed (`false`).
fn step(
    d: &mut Direction,
    src: &mut Sock,
    dst: &mut Sock,
    c: &Conf,
    cx: &mut Context<'_>,
    moved: &mut bool,
) -> Poll<bool> {
    macro_rules! wait {
        ($sock:expr, $interest:expr, $failed:expr) => {
            match $sock.poll_ready(cx, $interest) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready($failed),
                Poll::Ready(Ok(())) => {}
            }
        };
    }
    for _ in 0..OPS_PER_TURN {
        // Out first: what was read and not taken yet.
        if d.at < d.pending.len() {
            wait!(dst, Dir::Write, false);
            d.before_send(dst);
            match dst.send(&d.pending[d.at..]) {
                Ok(n) => {
                    d.wrote(n);
                    *moved = true;
                }
                Err(e) if would_block(&e) => {}
                Err(_) => return Poll::Ready(false),
            }
            continue;
        }
        if d.piped > 0 {
            wait!(dst, Dir::Write, false);
            d.before_send(dst);
            let Some(p) = &d.pipe else {
                return Poll::Ready(false);
            };
            match dst.splice(Dir::Write, p.r.as_raw_fd(), dst.fd(), d.piped) {
                // A pipe holding bytes never reads as empty; stop rather than spin.
                Ok(0) => return Poll::Ready(false),
                Ok(n) => {
                    d.piped -= n;
                    d.bytes += n as u64;
                    *moved = true;
                }
                Err(e) if would_block(&e) => {}
                Err(_) => return Poll::Ready(false),
            }
            continue;
        }
        if let Some(eof) = d.src_done {
            return Poll::Ready(match eof && c.half_close {
                true => dst.shutdown_write(),
                false => true,
            });
        }
        if d.bulk {
            wait!(src, Dir::Read, true);
            let p = match &d.pipe {
                Some(p) => p,
                None => match Pipe::new(c.size) {
                    Ok(p) => d.pipe.insert(p),
                    // No pipe (fds spent): nothing can be relayed; the session ends as on
                    // an error, which the log line names.
                    Err(e) => {
                        crate::errlog::error(format_args!("*{} pipe2() failed ({e})", c.id));
                        return Poll::Ready(false);
                    }
                },
            };
            match src.splice(Dir::Read, src.fd(), p.w.as_raw_fd(), p.cap) {
                Ok(0) => d.src_done = Some(true),
                Ok(n) => {
                    d.piped = n;
                    d.saw_bytes();
                    *moved = true;
                }
                Err(e) if would_block(&e) => {}
                Err(_) => d.src_done = Some(false),
            }
            continue;
        }
        // A socket waiting somewhere has its readiness noted there: a read only when it
        // says so.
        if d.dry || !matches!(src, Sock::Raw(_)) {
            wait!(src, Dir::Read, true);
            d.dry = false;
        }
        let size = c.size;
        let got = SCRATCH.with_borrow_mut(|scratch| {
            if scratch.len() < size {
                scratch.resize(size, 0);
            }
            let n = match src.recv(&mut scratch[..size]) {
                Ok(0) => return Got::Eof,
                Ok(n) => n,
                Err(e) if would_block(&e) => return Got::Wait,
                Err(_) => return Got::ReadError,
            };
            d.before_send(dst);
            let k = match dst.send(&scratch[..n]) {
                Ok(k) => k,
                Err(e) if would_block(&e) => 0,
                Err(_) => return Got::WriteError,
            };
            d.pending.extend_from_slice(&scratch[k..n]);
            Got::Moved(n, k)
        });
        match got {
            Got::Eof => d.src_done = Some(true),
            Got::ReadError => d.src_done = Some(false),
            Got::Wait => d.dry = true,
            Got::WriteError => return Poll::Ready(false),
            Got::Moved(n, k) => {
                d.saw_bytes();
                d.bytes += k as u64;
                *moved = true;
                d.dry = n < size;
                d.bulk = c.splice && n == size;
                // The FIN came with (or before the read of) these bytes: they were the
                // last (nginx reads on to the 0).
                if d.dry && src.peer_done() {
                    d.src_done = Some(true);
                }
            }
        }
    }
    // More to do than a turn allows: come back after the others.
    cx.waker().wake_by_ref();
    Poll::Pending
}

/// Relay until either side ends (both with `proxy_half_close`) or nothing moves for
/// `proxy_timeout` (nginx's "connection timed out", logged here).
pub async fn run(early: Early, mut up: Sock, c: &Conf<'_>) -> Outcome {
    let mut client = early.client;
    let mut to_up = Direction {
        pre: early.pre,
        pending: early.buf,
        bytes: early.sent,
        dry: early.dry,
        src_done: early.client_done,
        nodelay_due: c.nodelay,
        sent_any: early.sent > 0 || early.pre < early.pre_len,
        ..Default::default()
    };
    // The upstream was just sent the client's first bytes: its answer is not there yet.
    let mut to_client = Direction {
        dry: true,
        ..Default::default()
    };
    let mut first: Option<(&'static str, bool)> = None;
    let mut last = clock::now();
    let mut held: Option<Held> = None;
    let closed = std::future::poll_fn(|cx| loop {
        let mut moved = false;
        if to_up.ended.is_none() {
            if let Poll::Ready(ok) = step(&mut to_up, &mut client, &mut up, c, cx, &mut moved) {
                to_up.ended = Some(ok);
                first.get_or_insert(("client", ok));
            }
        }
        if to_client.ended.is_none() {
            if let Poll::Ready(ok) = step(&mut to_client, &mut up, &mut client, c, cx, &mut moved) {
                to_client.ended = Some(ok);
                first.get_or_insert(("upstream", ok));
            }
        }
        if moved {
            last = clock::now();
        }
        match first {
            // `proxy_half_close`: the other direction goes on until its own end.
            Some((who, true)) if c.half_close => {
                let other = match who {
                    "client" => to_client.ended.map(|_| "upstream"),
                    _ => to_up.ended.map(|_| "client"),
                };
                if other.is_some() {
                    return Poll::Ready(other);
                }
            }
            Some((who, _)) => return Poll::Ready(Some(who)),
            None => {}
        }
        let deadline = last + c.timeout;
        let h = held.get_or_insert_with(|| c.timers.hold(deadline, false));
        if c.timers.poll(h.key, cx).is_pending() {
            return Poll::Pending;
        }
        if deadline <= Instant::now() {
            super::proxy::log_timed_out(c.id);
            return Poll::Ready(None);
        }
        // Bytes moved since the deadline was taken: a new one from the last of them.
        held = None;
    })
    .await;
    Outcome {
        closed,
        up_bytes: to_up.bytes,
        down_bytes: to_client.bytes,
        down_first: to_client.first,
        pre_failed: to_up.pre > 0 && to_up.ended == Some(false),
    }
}
