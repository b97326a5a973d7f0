//! TLS terminated on `listen ... ssl` (nginx's ngx_stream_ssl_module): the `ssl_*`
//! directives are read and the rustls setup built by the HTTP side's code (`modules::tls`,
//! `tls::build_server`: certificates, keys, protocols, ciphers, session cache, client
//! verification), so a stream server takes the same settings as an http one. After the
//! handshake the proxy relays the decrypted bytes. A failed or timed out handshake
//! (`ssl_handshake_timeout`, 60s) ends the session with `$status` 500, as nginx's.
//! The `$ssl_*` variables are the http side's (`tls::vars`, over the same `TlsInfo`).
//!
//! `ssl_verify_client on|optional|optional_no_ca` with `ssl_client_certificate` /
//! `ssl_trusted_certificate` / `ssl_crl`: a client without a certificate (`on`) or with one
//! that does not verify ends the session after the handshake, 500, as nginx's stream module
//! does. `ssl_alpn PROTO...`: the protocols agreed to, in the server's order; a client that
//! offers ALPN but none of them is refused, one that offers none goes on. Without it no
//! ALPN is agreed (nginx's stream default).

use super::variables::Session;
use crate::modules::tls::TlsConf;
use crate::tls::ServerTls;
use gannet_conf::{setters, ConfError, Directive, Loc};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::LazyConfigAcceptor;

#[derive(Debug, Clone)]
pub struct SslConf {
    pub tls: TlsConf,
    pub handshake_timeout: Duration,
    /// `ssl_alpn`.
    pub alpn: Vec<Vec<u8>>,
    /// The certificates and keys are the stream level's: a server's first
    /// `ssl_certificate` (`_key`) replaces them rather than adding to them, as in nginx.
    pub certs_inherited: bool,
    pub keys_inherited: bool,
}

impl Default for SslConf {
    fn default() -> SslConf {
        SslConf {
            tls: TlsConf::default(),
            handshake_timeout: Duration::from_secs(60),
            alpn: Vec::new(),
            certs_inherited: false,
            keys_inherited: false,
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
    if d.name == "ssl_alpn" {
        if d.args.is_empty() {
            return Err(d.error("invalid number of arguments in \"ssl_alpn\" directive"));
        }
        if !c.alpn.is_empty() {
            return Err(d.error("\"ssl_alpn\" directive is duplicate"));
        }
        if d.args.iter().any(|a| a.len() > 255) {
            return Err(d.error("\"ssl_alpn\" directive protocol too long"));
        }
        c.alpn = d.args.iter().map(|a| a.as_bytes().to_vec()).collect();
        return Ok(());
    }
    if d.name == "ssl_certificate" && std::mem::take(&mut c.certs_inherited) {
        c.tls.certificates = None;
    }
    if d.name == "ssl_certificate_key" && std::mem::take(&mut c.keys_inherited) {
        c.tls.keys = None;
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

/// The server's TLS setup, for a server with a `listen ... ssl` (the mail proxy's).
pub fn build(
    c: &SslConf,
    h: &mut crate::modules::LoadCtx,
    at: &Loc,
) -> Result<Arc<ServerTls>, ConfError> {
    match setup(c, h, at)? {
        Some(t) if t.config.is_some() => Ok(t),
        _ => Err(ConfError::at(
            at,
            "no \"ssl_certificate\" is defined for server",
        )),
    }
}

/// A server's TLS setup, or `None` when it has no certificate and does not reject
/// handshakes (SNI choosing it then leaves the handshake to the default server's).
pub fn setup(
    c: &SslConf,
    h: &mut crate::modules::LoadCtx,
    at: &Loc,
) -> Result<Option<Arc<ServerTls>>, ConfError> {
    let Some(t) = crate::tls::build_server(&c.tls, false, h, at)? else {
        return Ok(None);
    };
    // http's setup agrees to http/1.1; stream agrees to `ssl_alpn`'s, or to none.
    let config = t.config.as_ref().map(|config| {
        let mut config = (**config).clone();
        config.alpn_protocols = c.alpn.clone();
        Arc::new(config)
    });
    Ok(Some(Arc::new(ServerTls {
        config,
        verify: t.verify,
        roots: t.roots.clone(),
        ocsp: None,
        reject_handshake: t.reject_handshake,
    })))
}

/// How the ClientHello's name settles the handshake (nginx's SNI callback).
pub enum Chosen {
    /// Go on with this setup.
    Go(Arc<ServerTls>),
    /// `ssl_reject_handshake`: refuse with an `unrecognized_name` alert.
    Reject,
}

/// The handshake; `None` when it failed or the client's certificate does not do for
/// `ssl_verify_client` (logged, as nginx at `info`). `choose` sees the SNI name as sent
/// (empty without) and picks the setup, as nginx's SNI callback switches the server.
pub async fn handshake(
    choose: impl FnOnce(&str) -> Chosen,
    timeout: Duration,
    tcp: TcpStream,
    s: &mut Session,
) -> Option<TlsStream<TcpStream>> {
    let who = (s.id, s.peer, s.local);
    let stream = match accept_with(choose, timeout, tcp, who).await {
        Some((stream, info)) => {
            // nginx's checks after the handshake (495/496 are HTTP's codes: here the
            // session just ends).
            let refused = info.refusal(&info.by);
            s.tls = Some(Box::new(info));
            match refused {
                None => return Some(stream),
                Some((_, why)) => why,
            }
        }
        None => return None,
    };
    failed(who, &stream);
    None
}

/// The handshake alone (the mail proxy's): the stream and what it agreed, or `None`
/// (logged). `who`: the connection's number, client and local address, for the log.
pub async fn accept(
    tls: &Arc<ServerTls>,
    timeout: Duration,
    tcp: TcpStream,
    who: (u64, std::net::SocketAddr, std::net::SocketAddr),
) -> Option<(TlsStream<TcpStream>, crate::tls::TlsInfo)> {
    accept_with(|_| Chosen::Go(tls.clone()), timeout, tcp, who).await
}

async fn accept_with(
    choose: impl FnOnce(&str) -> Chosen,
    timeout: Duration,
    tcp: TcpStream,
    who: (u64, std::net::SocketAddr, std::net::SocketAddr),
) -> Option<(TlsStream<TcpStream>, crate::tls::TlsInfo)> {
    let deadline = tokio::time::Instant::now() + timeout;
    let hs = async {
        let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp);
        let start = acceptor.await?;
        let hello = start.client_hello();
        let offered = crate::tls::Offered::of(&hello);
        let raw = hello.server_name().unwrap_or_default().to_string();
        let tls = match choose(&raw) {
            Chosen::Go(t) if !t.reject_handshake => t,
            _ => {
                let mut tcp = start.io;
                // Best effort: the connection is closed whatever comes of it.
                let alert = crate::tls::handshake::UNRECOGNIZED_NAME;
                let _ = tokio::io::AsyncWriteExt::write_all(&mut tcp, &alert).await;
                let why = format!("handshake rejected for \"{raw}\"");
                return Err(std::io::Error::other(why));
            }
        };
        let Some(config) = tls.config.clone() else {
            return Err(std::io::Error::other("no certificate"));
        };
        let stream = start.into_stream(config).await?;
        Ok::<_, std::io::Error>((stream, raw.to_ascii_lowercase(), offered, tls))
    };
    let why = match tokio::time::timeout_at(deadline, hs).await {
        Ok(Ok((stream, sni, offered, tls))) => {
            let info = crate::tls::TlsInfo::of(stream.get_ref().1, sni, offered, &tls);
            return Some((stream, info));
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => "client timed out".to_string(),
    };
    failed(who, &why);
    None
}

/// nginx's `info` line for a handshake that failed.
pub fn failed(who: (u64, std::net::SocketAddr, std::net::SocketAddr), why: &str) {
    crate::errlog::log(
        crate::errlog::Level::Info,
        format_args!(
            "*{} {why} while SSL handshaking, client: {}, server: {}",
            who.0,
            crate::http::cidr::unmapped(who.1.ip()),
            who.2
        ),
    );
}
