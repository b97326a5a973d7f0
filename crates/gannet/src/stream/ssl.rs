//! TLS terminated on `listen ... ssl` (nginx's ngx_stream_ssl_module): the `ssl_*`
//! directives are read and the rustls setup built by the HTTP side's code (`modules::tls`,
//! `tls::build_server`: certificates, keys, protocols, ciphers, session cache, client
//! verification), so a stream server takes the same settings as an http one. After the
//! handshake the proxy relays the decrypted bytes. A failed or timed out handshake
//! (`ssl_handshake_timeout`, 60s) ends the session with `$status` 500, as nginx's.
//! `$ssl_protocol`, `$ssl_cipher` and `$ssl_server_name` describe the handshake.

use super::variables::Session;
use crate::modules::tls::TlsConf;
use crate::tls::ServerTls;
use gannet_conf::{setters, ConfError, Directive, Loc};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

#[derive(Debug, Clone)]
pub struct SslConf {
    pub tls: TlsConf,
    pub handshake_timeout: Duration,
}

impl Default for SslConf {
    fn default() -> SslConf {
        SslConf {
            tls: TlsConf::default(),
            handshake_timeout: Duration::from_secs(60),
        }
    }
}

/// An `ssl_*` directive of the stream or server level.
pub fn set(
    d: &Directive,
    c: &mut SslConf,
    h: &mut crate::modules::LoadCtx,
) -> Result<(), ConfError> {
    if d.name == "ssl_handshake_timeout" {
        if d.args.len() != 1 {
            return Err(
                d.error("invalid number of arguments in \"ssl_handshake_timeout\" directive")
            );
        }
        c.handshake_timeout = Duration::from_millis(setters::msec_arg(d, 0)?);
        return Ok(());
    }
    let spec = crate::modules::tls::DIRECTIVES
        .iter()
        .find(|s| s.name == d.name)
        .ok_or_else(|| d.error(format!("unknown directive \"{}\"", d.name)))?;
    gannet_conf::registry::check(spec, d, gannet_conf::registry::Ctx::SERVER)?;
    let mut lc = crate::modules::LocConf::default();
    std::mem::swap(&mut lc.tls, &mut c.tls);
    let r = crate::modules::tls::set(d, &mut lc, h);
    std::mem::swap(&mut lc.tls, &mut c.tls);
    r
}

/// The server's TLS setup, for a server with a `listen ... ssl`.
pub fn build(
    c: &SslConf,
    h: &mut crate::modules::LoadCtx,
    at: &Loc,
) -> Result<Arc<ServerTls>, ConfError> {
    match crate::tls::build_server(&c.tls, false, h, at)? {
        Some(t) if t.config.is_some() => Ok(t),
        _ => Err(ConfError::at(
            at,
            "no \"ssl_certificate\" is defined for server",
        )),
    }
}

/// The handshake; `None` when it failed (logged, as nginx at `info`).
pub async fn handshake(
    tls: &ServerTls,
    timeout: Duration,
    tcp: TcpStream,
    s: &mut Session,
) -> Option<TlsStream<TcpStream>> {
    let config = tls.config.clone()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let why = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => {
            let conn = stream.get_ref().1;
            s.ssl_protocol = match conn.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "",
            };
            s.ssl_cipher = conn
                .negotiated_cipher_suite()
                .map_or("", |c| crate::tls::ciphers::openssl_name(c.suite()));
            s.ssl_server_name = conn.server_name().unwrap_or_default().to_string();
            return Some(stream);
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => "client timed out".to_string(),
    };
    crate::errlog::log(
        crate::errlog::Level::Info,
        format_args!(
            "*{} {why} while SSL handshaking, client: {}, server: {}",
            s.id,
            crate::http::cidr::unmapped(s.peer.ip()),
            s.local
        ),
    );
    None
}
