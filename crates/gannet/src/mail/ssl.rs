//! TLS for mail (nginx's ngx_mail_ssl_module): `listen ... ssl` (TLS from the first
//! byte), `starttls on|off|only` (STARTTLS / STLS offered; `only`: no login before it),
//! and the `ssl_*` directives, read and built by the stream side's code
//! (`stream::ssl`, over the http side's `modules::tls`), so a mail server takes the same
//! TLS settings as an http or stream one. `ssl on` (nginx's deprecated form) makes every
//! listen of the server a TLS one.
//!
//! A client whose certificate does not do for `ssl_verify_client` gets the protocol's
//! `SSL certificate error` / `No required SSL certificate` line and the session ends.

use super::handler::Session;
use super::io::Io;
use crate::stream::ssl::SslConf;
use crate::tls::ServerTls;
use gannet_conf::{setters, ConfError, Directive, Loc};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartTls {
    Off,
    On,
    Only,
}

#[derive(Debug, Clone)]
pub struct MailSsl {
    pub tls: SslConf,
    pub starttls: StartTls,
    /// `ssl on`.
    pub on: bool,
}

impl Default for MailSsl {
    fn default() -> MailSsl {
        MailSsl {
            tls: SslConf::default(),
            starttls: StartTls::Off,
            on: false,
        }
    }
}

impl MailSsl {
    /// In a new server: the mail level's certificates are replaced by the server's first.
    pub fn inherit(&mut self) {
        self.tls.certs_inherited = true;
        self.tls.keys_inherited = true;
    }

    pub fn starttls_enabled(&self) -> bool {
        self.starttls != StartTls::Off
    }

    /// `ssl_verify_client` is other than `off`.
    pub fn verifies(&self) -> bool {
        self.tls
            .tls
            .verify_client
            .as_ref()
            .is_some_and(|(v, _)| *v != crate::modules::tls::VerifyClient::Off)
    }
}

pub fn set(
    d: &Directive,
    c: &mut MailSsl,
    h: &mut crate::modules::LoadCtx,
) -> Result<(), ConfError> {
    match d.name.as_str() {
        "starttls" => {
            if d.args.len() != 1 {
                return Err(d.error("invalid number of arguments in \"starttls\" directive"));
            }
            c.starttls = match d.args[0].as_str() {
                "off" => StartTls::Off,
                "on" => StartTls::On,
                "only" => StartTls::Only,
                v => return Err(d.error(format!("invalid value \"{v}\""))),
            };
        }
        "ssl" => {
            if d.args.len() != 1 {
                return Err(d.error("invalid number of arguments in \"ssl\" directive"));
            }
            c.on = setters::flag(d)?;
            h.warnings.push(format!(
                "the \"ssl\" directive is deprecated, use the \"listen ... ssl\" directive instead in {}",
                d.loc
            ));
        }
        // Stream's own, not mail's.
        "ssl_alpn" | "ssl_handshake_timeout" | "ssl_preread" => {
            return Err(d.error(format!("unknown directive \"{}\"", d.name)))
        }
        _ => crate::stream::ssl::set(d, &mut c.tls, h)?,
    }
    Ok(())
}

/// The server's TLS setup: ALPN agrees to the protocol's name only (a client offering
/// others is refused, as nginx's).
pub fn build(
    c: &MailSsl,
    protocol: super::core::Protocol,
    h: &mut crate::modules::LoadCtx,
    at: &Loc,
) -> Result<Arc<ServerTls>, ConfError> {
    let mut tls = c.tls.clone();
    tls.alpn = vec![protocol.name().as_bytes().to_vec()];
    crate::stream::ssl::build(&tls, h, at)
}

/// `listen ... ssl`: the handshake before the greeting.
pub async fn handshake_listen(s: &mut Session) -> bool {
    handshake(s).await
}

/// STARTTLS / STLS, after its positive answer: the handshake, and the dialogue starts
/// over (what the client sent before is dropped).
pub async fn starttls(s: &mut Session) -> bool {
    s.buf.clear();
    if !handshake(s).await {
        return false;
    }
    s.starttls = true;
    true
}

async fn handshake(s: &mut Session) -> bool {
    let (Some(tls), Some(tcp)) = (s.srv.tls.clone(), s.io.take_plain()) else {
        return false;
    };
    // nginx's mail handshake is bounded by the session's `timeout`.
    let timeout = s.srv.conf.timeout;
    let Some((stream, info)) =
        crate::stream::ssl::accept(&tls, timeout, tcp, (s.id, s.peer, s.local)).await
    else {
        return false;
    };
    let refused = info.refusal(&tls);
    s.tls = Some(info);
    s.io = Io::Tls(Box::new(stream));
    if let Some((status, why)) = refused {
        s.log(crate::errlog::Level::Info, format_args!("{why}"));
        let line: &[u8] = match (s.srv.protocol, status) {
            (super::core::Protocol::Imap, 496) => b"* BYE No required SSL certificate\r\n",
            (super::core::Protocol::Imap, _) => b"* BYE SSL certificate error\r\n",
            (super::core::Protocol::Pop3, 496) => b"-ERR No required SSL certificate\r\n",
            (super::core::Protocol::Pop3, _) => b"-ERR SSL certificate error\r\n",
            (super::core::Protocol::Smtp, 496) => b"421 4.7.1 No required SSL certificate\r\n",
            (super::core::Protocol::Smtp, _) => b"421 4.7.1 SSL certificate error\r\n",
        };
        s.send(line).await;
        return false;
    }
    true
}
