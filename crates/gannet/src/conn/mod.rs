//! Client connections: one request's exchange written once for every protocol
//! (`exchange`, which each protocol joins through a small adapter), the HTTP/1.x
//! connection loop (and HTTP/2's, over TLS or h2c), the
//! streams they run on (cleartext or TLS), the ways a body leaves the process
//! (whole, or streamed from a `source`), request bodies (kept in memory or a temporary
//! file, or passed on as they arrive), the exchange with a FastCGI, SCGI or uwsgi
//! application a request may wait for, and its answer read ahead of a slow client (`spool`).

/// The `AsyncWrite` methods of a stream wrapper that changes only what is read: writes,
/// flushes (and, unless the wrapper writes its own `poll_shutdown`, the shutdown) go to its
/// `io` field as they are. Used in `impl AsyncWrite for Wrapper<IO>` blocks.
macro_rules! writes_through {
    () => {
        writes_through!(no_shutdown);
        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
        }
    };
    (no_shutdown) => {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
        }
        fn is_write_vectored(&self) -> bool {
            self.io.is_write_vectored()
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_flush(cx)
        }
    };
}

pub mod body;
pub mod exchange;
pub mod gateway;
pub mod gateway_cache;
pub mod gateway_store;
pub mod grpc;
pub mod h1;
pub mod h2;
pub mod h2_flood;
pub mod h2_goaway;
pub mod h2_mend;
pub mod h2_priority;
pub mod h2_resets;
pub mod h2_response;
pub mod h2_table;
pub mod h2_upstream;
pub mod h2_window;
pub mod h3;
pub mod h3_stream;
pub mod health;
pub mod health_share;
pub mod info;
pub mod log;
pub mod mirror;
pub mod pace;
pub mod proxy_h2;
pub mod proxy_protocol;
pub mod proxy_tlv;
pub mod quic;
pub mod quic_bpf;
pub mod quic_session;
pub mod request_body;
pub mod reuse;
pub mod send;
pub mod slice;
pub mod source;
pub mod spool;
pub mod ssi;
pub mod subrequest;
pub mod temp_file;
pub mod tls_stream;
pub mod transport;
pub mod tunnel;

pub use info::ConnInfo;
