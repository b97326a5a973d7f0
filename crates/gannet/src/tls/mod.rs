//! HTTPS with rustls (aws-lc-rs provider): the TLS setup each server block gets from its `ssl_*`
//! directives (`build`), the handshake on a `listen ... ssl` address (`handshake`), and what
//! a TLS connection tells its requests (`TlsInfo`: `$https`, `$scheme`, `$ssl_*`).
//!
//! Each server block with a certificate has its own rustls `ServerConfig`. The handshake
//! first reads the ClientHello, lets its SNI name pick the server block as nginx does (the
//! address's default server when no name matches, or when the matching server has no
//! certificate), and goes on with that server's config, so protocols, ciphers,
//! certificates, session settings and client verification are all per server.
//!
//! The directives themselves are read in `modules::tls`; the encrypted stream the connection
//! loop uses is `conn::tls_stream`. The client side, TLS to upstream servers
//! (`proxy_pass https://`), is `client`.

mod build;
pub mod certs;
pub mod ciphers;
pub mod client;
pub mod crl;
pub mod handshake;
pub mod ocsp;
mod resolve;
mod session;
pub mod stapling;
pub mod vars;
pub mod verify;

pub use build::{build_server, LoadState};

use crate::modules::tls::VerifyClient;
use certs::CertFacts;
use rustls::pki_types::CertificateDer;
use rustls::{CommonState, HandshakeKind, ProtocolVersion, ServerConfig};
use std::sync::Arc;
use verify::Verified;

/// A server block's TLS setup.
#[derive(Debug)]
pub struct ServerTls {
    /// `None` only for a server that rejects every handshake and has no certificate.
    pub config: Option<Arc<ServerConfig>>,
    pub verify: VerifyClient,
    /// Judges client chains against `ssl_client_certificate` (see `verify`).
    pub roots: Option<verify::ClientRoots>,
    /// `ssl_ocsp`: the OCSP status of good client chains, asked after the handshake.
    pub ocsp: Option<Arc<ocsp::ClientOcsp>>,
    /// `ssl_reject_handshake on`: a client whose SNI picks this server is refused.
    pub reject_handshake: bool,
}

/// nginx's 421 for a request whose server verifies clients, on a connection whose
/// handshake named another (a certificate judged against another server's CAs proves
/// nothing to it).
fn misdirected() -> (u16, String) {
    (
        421,
        "client attempted to request the server name different from the one that was negotiated"
            .to_string(),
    )
}

/// What a finished handshake established, for the `$ssl_*` variables.
#[derive(Debug)]
pub struct TlsInfo {
    /// `TLSv1.2`, `TLSv1.3`.
    pub protocol: &'static str,
    /// The OpenSSL name of the suite.
    pub cipher: &'static str,
    /// The key exchange group (`X25519`, `prime256v1`, `secp384r1`).
    pub curve: &'static str,
    /// The SNI name, lowercased; empty without SNI.
    pub server_name: String,
    /// The ALPN protocol agreed on; empty without.
    pub alpn: String,
    /// What the client offered (`$ssl_ciphers`, `$ssl_curves`).
    pub offered: Offered,
    pub reused: bool,
    pub verified: Verified,
    pub client: Option<CertFacts>,
    /// The setup that did the handshake (and judged the client's certificate).
    pub by: Arc<ServerTls>,
    /// A QUIC connection that took 0-RTT data: set while its handshake is not complete
    /// yet (`$ssl_early_data` is "1" then, as OpenSSL's SSL_in_early_data says in nginx).
    pub early_data: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// A ClientHello's offers, kept as codes (named only when a variable is read).
#[derive(Debug, Default)]
pub struct Offered {
    pub ciphers: Box<[rustls::CipherSuite]>,
    pub groups: Box<[rustls::NamedGroup]>,
}

impl Offered {
    pub fn of(hello: &rustls::server::ClientHello<'_>) -> Offered {
        Offered {
            ciphers: hello.cipher_suites().into(),
            groups: hello.named_groups().unwrap_or_default().into(),
        }
    }

    pub fn copy(&self) -> Offered {
        Offered {
            ciphers: self.ciphers.clone(),
            groups: self.groups.clone(),
        }
    }
}

impl TlsInfo {
    /// What the handshake of `conn` established, on TCP (a `ServerConnection`) or QUIC
    /// (`conn::quic_session`) alike; `tls` is the server setup that did it.
    pub fn of(
        conn: &CommonState,
        server_name: String,
        offered: Offered,
        tls: &Arc<ServerTls>,
    ) -> TlsInfo {
        let protocol = match conn.protocol_version() {
            Some(ProtocolVersion::TLSv1_3) => "TLSv1.3",
            Some(ProtocolVersion::TLSv1_2) => "TLSv1.2",
            _ => "unknown",
        };
        let cipher = conn
            .negotiated_cipher_suite()
            .map_or("", |s| ciphers::openssl_name(s.suite()));
        let curve = match conn.negotiated_key_exchange_group().map(|g| g.name()) {
            Some(g) => vars::group_name(g).unwrap_or("unknown"),
            None => "",
        };
        let chain = conn.peer_certificates();
        let verified = if tls.verify == VerifyClient::Off {
            Verified::None
        } else {
            verify::judge(chain, tls.roots.as_ref())
        };
        TlsInfo {
            protocol,
            cipher,
            curve,
            server_name,
            alpn: conn
                .alpn_protocol()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .unwrap_or_default(),
            offered,
            reused: conn.handshake_kind() == Some(HandshakeKind::Resumed),
            verified,
            client: chain.and_then(|c| c.first()).and_then(CertFacts::of),
            by: tls.clone(),
            early_data: None,
        }
    }

    /// `ssl_ocsp`: the OCSP status of a good client chain, asked once the handshake is
    /// over (nginx's ngx_ssl_ocsp_validate: the first request waits for it); a revoked or
    /// unknown one turns the verdict into a failure.
    pub async fn check_ocsp(&mut self, chain: Option<&[CertificateDer<'static>]>) {
        let by = self.by.clone();
        if let (Some(ocsp), Verified::Success, Some(chain), Some(roots)) =
            (&by.ocsp, &self.verified, chain, &by.roots)
        {
            if let Err(f) = ocsp.check(chain, &roots.trusted).await {
                self.verified = Verified::Failed(f);
            }
        }
    }

    /// `$ssl_client_verify`.
    pub fn verify_str(&self) -> String {
        match &self.verified {
            Verified::None => "NONE".to_string(),
            Verified::Success => "SUCCESS".to_string(),
            Verified::Failed(f) => format!("FAILED:{}", f.reason),
        }
    }

    /// Why a request for a server with this TLS setup is refused, if it is: the status
    /// and what nginx logs. The status is 495 (the certificate failed) or 496 (none was
    /// sent where one is required), which `error_page` can catch and which are answered
    /// 400 otherwise; or 421: a server that verifies clients answers only on connections
    /// whose handshake it did itself, since a certificate judged against another server's
    /// CAs proves nothing to it.
    pub fn refusal(&self, server: &Arc<ServerTls>) -> Option<(u16, String)> {
        let mode = server.verify;
        if mode != VerifyClient::Off && !Arc::ptr_eq(server, &self.by) {
            return Some(misdirected());
        }
        self.judged(mode)
    }

    /// [`refusal`](Self::refusal) for a server with no TLS setup of its own (no
    /// certificate: the address's default server did the handshake, nginx's SNI callback
    /// leaving it its context): its `ssl_verify_client` still judges the handshake's
    /// verdict once the request is the server's, as nginx's does; with verification on, a
    /// request for another name than the handshake's is nginx's 421.
    pub fn refusal_by_mode(&self, mode: VerifyClient, host: &str) -> Option<(u16, String)> {
        if mode != VerifyClient::Off && !self.server_name.eq_ignore_ascii_case(host) {
            return Some(misdirected());
        }
        self.judged(mode)
    }

    fn judged(&self, mode: VerifyClient) -> Option<(u16, String)> {
        match (mode, &self.verified) {
            (VerifyClient::On, Verified::None) => {
                Some((496, "client sent no required SSL certificate".to_string()))
            }
            (VerifyClient::OptionalNoCa, Verified::Failed(f)) if f.only_unknown_ca() => None,
            (VerifyClient::Off, _) | (_, Verified::None | Verified::Success) => None,
            // An OCSP verdict (code 0) is logged by nginx without a number.
            (_, Verified::Failed(f)) if f.code == 0 => Some((
                495,
                format!("client SSL certificate verify error: {}", f.reason),
            )),
            (_, Verified::Failed(f)) => Some((
                495,
                format!(
                    "client SSL certificate verify error: ({}:{})",
                    f.code, f.reason
                ),
            )),
        }
    }
}
