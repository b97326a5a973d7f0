//! The connection loop's stream over TLS: rustls's `ServerConnection` driven straight on
//! the tokio socket, with the same never-waiting reads and writes as cleartext
//! (`conn::transport`), so the HTTP/1.x loop and its deadlines are shared.
//!
//! Reading takes plaintext rustls already holds first, and pulls records off the socket
//! only when it has none (so rustls's plaintext buffer never overflows). Writing hands
//! plaintext to rustls and pushes the records out; what the socket does not take waits in
//! rustls and `has_pending` tells the loop to finish it before waiting for the client.
//! Files are read and written in pieces (sendfile cannot encrypt), and an idle TLS
//! connection does not park: its session state lives in process memory, not in the socket.

use super::send;
use super::transport::Transport;
use crate::http::response::FileRange;
use bytes::BytesMut;
use rustls::ServerConnection;
use std::io::{self, Read, Write};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;

/// The most plaintext taken from rustls in one read (its own records are at most 16 KiB).
const READ_MAX: usize = 16 * 1024;

pub struct TlsStream {
    tcp: TcpStream,
    tls: Box<ServerConnection>,
    /// The peer closed its side, or the TLS session failed: reads give what rustls still
    /// holds, then the end (or the error).
    done: bool,
    failed: bool,
}

/// `Read` / `Write` on the tokio socket without waiting: `try_read` / `try_write` answer
/// WouldBlock and clear the socket's readiness, so a later wait is a real one.
struct Sock<'a>(&'a TcpStream);

impl Read for Sock<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for Sock<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn broken() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "TLS session failed")
}

impl TlsStream {
    pub fn new(tcp: TcpStream, tls: ServerConnection) -> TlsStream {
        let mut s = TlsStream {
            tcp,
            tls: Box::new(tls),
            done: false,
            failed: false,
        };
        // The handshake may leave records queued (TLS 1.3 session tickets): send them now
        // rather than with the first response.
        let _ = s.push();
        s
    }

    /// Send queued records until rustls has none or the socket is full (WouldBlock).
    fn push(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            if self.tls.write_tls(&mut Sock(&self.tcp))? == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }

    /// Read records off the socket into rustls and decrypt them. WouldBlock when the socket
    /// has nothing.
    fn pull(&mut self) -> io::Result<()> {
        let n = self.tls.read_tls(&mut Sock(&self.tcp))?;
        if n == 0 {
            self.done = true;
        }
        let quiet = !self.tls.wants_write();
        if let Err(e) = self.tls.process_new_packets() {
            // rustls queued an alert saying why: a best-effort send, then the end.
            let _ = self.tls.write_tls(&mut Sock(&self.tcp));
            self.failed = true;
            self.done = true;
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        if quiet && self.tls.wants_write() && self.renegotiation() {
            self.failed = true;
            self.done = true;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "SSL renegotiation disabled",
            ));
        }
        Ok(())
    }

    /// A TLS 1.2 client asked to renegotiate: rustls answers a ClientHello after the
    /// handshake with a `no_renegotiation` warning and goes on, but the client then waits
    /// for a handshake that never comes (a hang). nginx closes such a connection ("SSL
    /// renegotiation disabled"), and so does gannet. rustls tells it only by what it
    /// queues: in TLS 1.2 a client's records make the server send something on their own
    /// only for that warning (alerts from the client get no answer, failures are errors).
    fn renegotiation(&self) -> bool {
        self.tls.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_2)
    }

    /// Plaintext rustls already holds, into `buf`. WouldBlock when it holds none.
    fn take_plain(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if buf.capacity() == buf.len() {
            buf.reserve(1024);
        }
        let start = buf.len();
        let room = (buf.capacity() - start).min(READ_MAX);
        // rustls reads into initialised memory only.
        buf.resize(start + room, 0);
        let r = self.tls.reader().read(&mut buf[start..]);
        buf.truncate(start + *r.as_ref().unwrap_or(&0));
        r
    }

    /// What the loop's reads do: plaintext held, else records from the socket.
    fn read_plain(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            match self.take_plain(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Ok(0): the client's close_notify. UnexpectedEof: a close without one.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                r => return r,
            }
            if self.failed {
                return Err(broken());
            }
            if self.done {
                return Ok(0);
            }
            self.pull()?;
        }
    }
}

impl Transport for TlsStream {
    const PARKABLE: bool = false;

    fn into_parkable(self) -> Option<std::net::TcpStream> {
        None
    }

    fn set_nodelay(&self) -> bool {
        self.tcp.set_nodelay(true).is_ok()
    }

    fn limit_unsent(&self) -> bool {
        super::send::limit_unsent((&self.tcp).into())
    }

    fn read_now(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.read_plain(buf)
    }

    fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.read_plain(buf)
    }

    /// Ready when rustls holds plaintext (or the session ended); otherwise records are
    /// pulled off the socket as it turns readable, until a whole record decrypts.
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        loop {
            if self.done {
                return Poll::Ready(true);
            }
            match self.tls.process_new_packets() {
                Ok(st) if st.plaintext_bytes_to_read() > 0 || st.peer_has_closed() => {
                    return Poll::Ready(true)
                }
                Ok(_) => {}
                Err(_) => {
                    self.failed = true;
                    self.done = true;
                    return Poll::Ready(true);
                }
            }
            match self.tcp.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(false),
                Poll::Ready(Ok(())) => {}
            }
            match self.pull() {
                // WouldBlock cleared the readiness: the next poll waits for a real event.
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Poll::Ready(true),
            }
        }
    }

    async fn read_wait(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            match self.read_plain(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return r,
            }
            if !std::future::poll_fn(|cx| self.poll_readable(cx)).await {
                return Err(broken());
            }
        }
    }

    fn try_write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = self.tls.writer().write(data)?;
        match self.push() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(n),
            r => r.map(|()| n),
        }
    }

    fn has_pending(&self) -> bool {
        self.tls.wants_write()
    }

    async fn write_all(&mut self, mut data: &[u8], idle: Duration) -> io::Result<()> {
        loop {
            if !data.is_empty() {
                // rustls takes what fits under its buffer limit; the rest after a push.
                let n = self.tls.writer().write(data)?;
                data = &data[n..];
            }
            match self.push() {
                Ok(()) if data.is_empty() => return Ok(()),
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    send::writable(&self.tcp, idle).await?
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn write_pair(&mut self, a: &[u8], b: &[u8], idle: Duration) -> io::Result<()> {
        self.write_all(a, idle).await?;
        self.write_all(b, idle).await
    }

    async fn send_file(
        &mut self,
        head: &[u8],
        f: &FileRange,
        _sendfile: bool,
        idle: Duration,
    ) -> io::Result<()> {
        self.write_all(head, idle).await?;
        send::copy_file(self, f, idle).await
    }

    fn close(&mut self) {
        self.tls.send_close_notify();
        let _ = self.push();
    }
}
