//! The handshake of a new connection on a `listen ... ssl` address, in the worker's event
//! loop like any other read, bounded by the default server's `client_header_timeout`.
//!
//! The first byte tells a TLS client (a handshake record, 0x16) from one speaking plain
//! HTTP to the port (anything without the high bit), whose request nginx answers with its
//! code 497: `error_page 497` may redirect it, else a 400 page ("The plain HTTP request
//! was sent to HTTPS port"). tokio-rustls reads the
//! ClientHello, its SNI name picks the server block (see the module docs of `tls`), and
//! the rest of the handshake runs with that server's rustls config. A failed or abandoned
//! handshake costs only its own connection: it is logged at `info`, as nginx does.

use super::TlsInfo;
use crate::config::ListenGroup;
use crate::conn::tls_stream::TlsStream;
use crate::conn::ConnInfo;
use crate::errlog::{self, Level};
use crate::http::router::select_server;
use crate::modules::LocConf;
use rustls::server::Acceptor;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::LazyConfigAcceptor;

/// How a connection's start ended.
pub enum Accepted {
    Tls(TlsStream, Arc<TlsInfo>),
    /// ALPN chose HTTP/2; the settings of the server SNI chose come along.
    H2(
        Box<tokio_rustls::server::TlsStream<TcpStream>>,
        Arc<TlsInfo>,
        Arc<LocConf>,
    ),
    /// The client sent plain HTTP: its request is refused with 497 (see the module docs).
    PlainHttp(TcpStream),
    Closed,
}

/// The first TLS record's content type: handshake.
const HANDSHAKE_RECORD: u8 = 0x16;

/// `ssl_reject_handshake`: the fatal alert nginx's SNI callback answers with
/// (`unrecognized_name`, 112), as a plaintext alert record (the handshake has not
/// begun, so nothing is encrypted yet). rustls has no way to refuse a ClientHello with an
/// alert of one's choosing, so the record is written to the socket directly.
pub(crate) const UNRECOGNIZED_NAME: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 112];

/// A handshake that began (the client sent a TLS record) and failed: counted for `metrics`.
fn handshake_failed(info: &ConnInfo, why: impl std::fmt::Display) -> Accepted {
    crate::modules::metrics::tls_handshake(None);
    failed(info, why)
}

fn failed(info: &ConnInfo, why: impl std::fmt::Display) -> Accepted {
    errlog::log(
        Level::Info,
        format_args!(
            "*{} {why} while SSL handshaking, client: {}, server: {}",
            info.id,
            info.peer.ip(),
            info.local
        ),
    );
    Accepted::Closed
}

pub async fn accept(g: &ListenGroup, tcp: TcpStream, info: &ConnInfo) -> Accepted {
    let default = &g.servers[g.default];
    let deadline = Instant::now() + default.conf.core.client_header_timeout();
    let mut first = [0u8; 1];
    match timeout_at(deadline, tcp.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        Ok(Ok(_)) => return Accepted::Closed,
        Ok(Err(e)) => return failed(info, e),
        Err(_) => return failed(info, "client timed out"),
    }
    // nginx's test: a TLS record or an SSLv2-style hello (high bit set) is a handshake,
    // anything else is taken for plain HTTP (and garbage then gets the parser's 400).
    if first[0] != HANDSHAKE_RECORD && first[0] & 0x80 == 0 {
        return Accepted::PlainHttp(tcp);
    }
    let start = match timeout_at(deadline, LazyConfigAcceptor::new(Acceptor::default(), tcp)).await
    {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => return handshake_failed(info, e),
        Err(_) => return handshake_failed(info, "client timed out"),
    };
    let hello = start.client_hello();
    let offered = super::Offered::of(&hello);
    let sni = hello
        .server_name()
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    // nginx's fallback: a name no server has, or a server without a certificate, leaves
    // the handshake to the address's default server.
    let chosen = select_server(&g.servers, g.default, &sni);
    let Some(tls) = chosen.tls.as_ref().or(default.tls.as_ref()) else {
        return handshake_failed(info, "no certificate for the listen address");
    };
    let config = match &tls.config {
        Some(c) if !tls.reject_handshake => c.clone(),
        _ => {
            let mut tcp = start.io;
            // Best effort: the connection is closed whatever comes of it.
            let _ = timeout_at(deadline, tcp.write_all(&UNRECOGNIZED_NAME)).await;
            return handshake_failed(info, format_args!("handshake rejected for \"{sni}\""));
        }
    };
    let stream = match timeout_at(deadline, start.into_stream(config)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return handshake_failed(info, e),
        Err(_) => return handshake_failed(info, "client timed out"),
    };
    let mut tls_info = TlsInfo::of(stream.get_ref().1, sni, offered, tls);
    tls_info
        .check_ocsp(stream.get_ref().1.peer_certificates())
        .await;
    let tls_info = Arc::new(tls_info);
    crate::modules::metrics::tls_handshake(Some((tls_info.protocol, tls_info.reused)));
    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        return Accepted::H2(Box::new(stream), tls_info, chosen.conf.clone());
    }
    let (tcp, conn) = stream.into_inner();
    Accepted::Tls(TlsStream::new(tcp, conn), tls_info)
}
