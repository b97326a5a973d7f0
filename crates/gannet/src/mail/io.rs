//! The client's connection: plain TCP until a `listen ... ssl` handshake or STARTTLS
//! turns it into TLS, one type for the dialogue and the relay either way.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// Between taking the plain socket for a STARTTLS handshake and its result.
    Gone,
}

impl Io {
    /// The plain socket, for STARTTLS (`None` once TLS).
    pub fn take_plain(&mut self) -> Option<TcpStream> {
        match std::mem::replace(self, Io::Gone) {
            Io::Plain(t) => Some(t),
            other => {
                *self = other;
                None
            }
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Io::Tls(_))
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "connection gone")
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(t) => Pin::new(t).poll_read(cx, buf),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
            Io::Gone => Poll::Ready(Err(gone())),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(t) => Pin::new(t).poll_write(cx, b),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, b),
            Io::Gone => Poll::Ready(Err(gone())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(t) => Pin::new(t).poll_flush(cx),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
            Io::Gone => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(t) => Pin::new(t).poll_shutdown(cx),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
            Io::Gone => Poll::Ready(Ok(())),
        }
    }
}
