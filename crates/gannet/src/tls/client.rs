//! TLS to upstream servers (`proxy_pass https://...`): the rustls client setup built at load
//! time from a location's `proxy_ssl_*` settings (read in `modules::proxy_ssl`), each
//! worker's session cache (`proxy_ssl_session_reuse`), the handshake, and the encrypted
//! stream that the gateway and the keepalive pool use like a plain socket.
//!
//! - Verification (`proxy_ssl_verify on`) is rustls's webpki verifier over the CAs of
//!   `proxy_ssl_trusted_certificate` (and `proxy_ssl_crl`), checking the certificate
//!   against the name of `proxy_ssl_name`. With it off, any certificate is taken, but the
//!   handshake's signatures are still checked (the peer must hold the key it presents).
//! - SNI: rustls always has a name to connect with (the same `proxy_ssl_name`);
//!   `proxy_ssl_server_name off` only keeps it out of the ClientHello, so with `verify on`
//!   the certificate is still checked against that name, as nginx does. Names that are IP
//!   addresses are never sent as SNI (RFC 6066), as in nginx.
//! - Sessions: the setup is shared by all workers, and each worker clones it with a session
//!   cache of its own, so resumption takes no lock shared between workers.
//! - The stream: a server closing without close_notify ends the stream (nginx takes that
//!   as the end too); before a pooled connection is reused, what rustls holds above the
//!   socket is checked as well as the socket (see [`TlsConn`]'s `holds_input`).

use super::build::{add_cas, provider, LoadState};
use super::certs::Passwords;
use super::certs::{load_chain, load_key};
use super::crl::Crls;
use super::verify::handshake_signature;
use crate::modules::proxy_ssl::{CertArg, ProxySslConf};
use crate::modules::tls::FileArg;
use crate::upstream::{Conn, Io};
use gannet_conf::{ConfError, Loc};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, Resumption, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    SupportedProtocolVersion,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Sessions each worker keeps per client setup (one per upstream server name it talks to,
/// at most this many).
const SESSIONS: usize = 256;

/// A location's client setup: rustls's config (without a session cache: each worker adds
/// its own) and whether sessions are reused.
#[derive(Debug)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    session_reuse: bool,
    /// The client certificate when its files are named by variables.
    pub dynamic: Option<DynamicCert>,
}

fn err(loc: &Loc, msg: impl std::fmt::Display) -> ConfError {
    ConfError::at(loc, msg)
}

/// The client setup for these settings; `at` is the location, for errors that belong to
/// no one directive; `prefix` names the directives (`proxy_ssl_`, `grpc_ssl_`...) in them;
/// `alpn` is the one protocol offered, if any (`grpcs://` upstreams are asked for `h2`).
pub fn build(
    c: &ProxySslConf,
    prefix: &str,
    state: &mut LoadState,
    at: &Loc,
    alpn: Option<&'static [u8]>,
) -> Result<Arc<ClientTls>, ConfError> {
    let key = format!(
        "{prefix}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}",
        c.verify(),
        c.trusted_certificate.as_ref().map(|f| &f.path),
        c.crl.as_ref().map(|f| &f.path),
        c.protocols(),
        c.ciphers,
        c.certificate.as_ref().map(|f| &f.file.path),
        c.certificate_key.as_ref().map(|f| &f.file.path),
        c.password_file.as_ref().map(|p| &p.file.path),
        c.server_name(),
        c.session_reuse(),
        alpn,
    );
    if let Some(done) = state.clients.get(&key) {
        return Ok(done.clone());
    }
    let provider = Arc::new(provider(c.ciphers.as_deref(), None));
    let p = c.protocols();
    let mut versions: Vec<&'static SupportedProtocolVersion> = Vec::new();
    if p.tls13 {
        versions.push(&rustls::version::TLS13);
    }
    if p.tls12 {
        versions.push(&rustls::version::TLS12);
    }
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| err(at, format!("upstream TLS setup failed: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match &c.verify {
        Some((true, loc)) => {
            let Some(f) = &c.trusted_certificate else {
                return Err(err(
                    loc,
                    format!("no {prefix}trusted_certificate for {prefix}verify"),
                ));
            };
            let mut roots = RootCertStore::empty();
            let trusted = add_cas(&mut roots, f, "trusted certificate")?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| err(&f.loc, format!("cannot verify upstreams: {e}")))?;
            // Revocation is checked apart from webpki (see `tls::crl`).
            let crls = c.crl.as_ref().map(Crls::load).transpose()?;
            Arc::new(Verifying {
                webpki,
                trusted,
                crls,
                algs: provider.signature_verification_algorithms,
            })
        }
        _ => Arc::new(AnyCertificate {
            algs: provider.signature_verification_algorithms,
        }),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut dynamic = None;
    let mut config = match &c.certificate {
        None => builder.with_no_client_auth(),
        Some(cert) => {
            let Some(key_file) = &c.certificate_key else {
                return Err(err(
                    &cert.file.loc,
                    format!(
                        "no \"{prefix}certificate_key\" is defined for certificate \"{}\"",
                        cert.file.path.display()
                    ),
                ));
            };
            if cert.vars.is_some() || key_file.vars.is_some() {
                // Loaded per connection (`with_certificate`), as nginx does.
                dynamic = Some(DynamicCert {
                    cert: cert.clone(),
                    key: key_file.clone(),
                    passwords: c.password_file.clone(),
                    provider: provider.clone(),
                });
                builder.with_no_client_auth()
            } else {
                let pair = load_pair(
                    &provider,
                    &cert.file,
                    &key_file.file,
                    c.password_file.as_deref(),
                )?;
                builder.with_client_cert_resolver(Arc::new(OwnCertificate(pair)))
            }
        }
    };
    config.enable_sni = c.server_name();
    config.alpn_protocols = alpn.map(|p| vec![p.to_vec()]).unwrap_or_default();
    // Each worker adds a cache of its own (`Sessions`).
    config.resumption = Resumption::disabled();
    let built = Arc::new(ClientTls {
        config: Arc::new(config),
        // A session made with one request's certificate must not be resumed for another's.
        session_reuse: c.session_reuse() && dynamic.is_none(),
        dynamic,
    });
    state.clients.insert(key, built.clone());
    Ok(built)
}

/// A client certificate and key file read and paired (at load time, or per connection
/// for `*_ssl_certificate` with variables, the http proxy's and the stream proxy's).
pub fn load_pair(
    provider: &CryptoProvider,
    cert: &FileArg,
    key_file: &FileArg,
    passwords: Option<&Passwords>,
) -> Result<Arc<CertifiedKey>, ConfError> {
    let chain = load_chain(cert, "certificate")?;
    let key = load_key(key_file, passwords)?;
    certified_key(provider, chain, key, cert, key_file)
}

/// `*_ssl_certificate` with variables: the files are named per request.
#[derive(Debug)]
pub struct DynamicCert {
    pub cert: CertArg,
    pub key: CertArg,
    passwords: Option<Arc<Passwords>>,
    provider: Arc<CryptoProvider>,
}

impl ClientTls {
    /// The config for one connection whose client certificate files are `cert` and `key`
    /// (as a request named them): read now, as nginx reads them per connection; `Err`
    /// with the reason for the log.
    pub fn with_certificate(
        &self,
        cert: &FileArg,
        key: &FileArg,
    ) -> Result<Arc<ClientConfig>, String> {
        let Some(d) = &self.dynamic else {
            return Ok(self.config.clone());
        };
        let pair =
            load_pair(&d.provider, cert, key, d.passwords.as_deref()).map_err(|e| e.to_string())?;
        Ok(sending(&self.config, pair))
    }

    /// The shared config, without session reuse (health probes use it).
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

/// The client certificate and its key, as a signer. Built directly, not by rustls's
/// `with_client_auth_cert`, which parses the certificate as webpki's end entity and so
/// refuses an X.509 v1 certificate that OpenSSL (and the upstream) take; only a key that
/// is not the certificate's is refused.
fn certified_key(
    provider: &CryptoProvider,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert: &FileArg,
    key_file: &FileArg,
) -> Result<Arc<CertifiedKey>, ConfError> {
    let signer = provider.key_provider.load_private_key(key).map_err(|e| {
        err(
            &key_file.loc,
            format!(
                "cannot load certificate key \"{}\": {e}",
                key_file.path.display()
            ),
        )
    })?;
    let ck = CertifiedKey::new(chain, signer);
    if !super::certs::key_matches(&ck) {
        return Err(err(
            &key_file.loc,
            format!(
                "certificate key \"{}\" does not match certificate \"{}\"",
                key_file.path.display(),
                cert.path.display()
            ),
        ));
    }
    Ok(Arc::new(ck))
}

/// `config` sending `pair` to servers that ask for a client certificate.
pub fn sending(config: &ClientConfig, pair: Arc<CertifiedKey>) -> Arc<ClientConfig> {
    let mut c = config.clone();
    c.client_auth_cert_resolver = Arc::new(OwnCertificate(pair));
    Arc::new(c)
}

/// Sends the one client certificate whatever the server asks (as nginx does).
#[derive(Debug)]
struct OwnCertificate(Arc<CertifiedKey>);

impl ResolvesClientCert for OwnCertificate {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// `proxy_ssl_verify on`: webpki's verdict on the chain, with what OpenSSL accepts and
/// webpki does not: the subject's CN as the name of a certificate with no DNS
/// subjectAltName, and a server certificate that is itself one of the trusted ones
/// (self-signed, X.509 v1 possibly) within its validity; then, with `proxy_ssl_crl`, the
/// revocation check of `tls::crl`.
#[derive(Debug)]
struct Verifying {
    webpki: Arc<WebPkiServerVerifier>,
    trusted: Vec<CertificateDer<'static>>,
    crls: Option<Crls>,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifying {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let r = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        // webpki checks the chain before the name: this error means the chain is good.
        let ok = match r {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if cn_matches(end_entity, server_name) => ServerCertVerified::assertion(),
            Err(_)
                if intermediates.is_empty()
                    && self.trusted.iter().any(|a| a[..] == end_entity[..])
                    && trusted_itself(end_entity, server_name, now) =>
            {
                ServerCertVerified::assertion()
            }
            r => r?,
        };
        if let Some(crls) = &self.crls {
            crls.check(end_entity, intermediates, &self.trusted)
                .map_err(|f| rustls::Error::InvalidCertificate(f.rustls()))?;
        }
        Ok(ok)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // (Not webpki's: it cannot read an X.509 v1 certificate the chain check took.)
        handshake_signature(message, cert, dss, &self.algs, false)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        handshake_signature(message, cert, dss, &self.algs, true)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A trusted certificate presented as the server's: valid now and naming `name` (in a
/// DNS subjectAltName, or in the CN without one).
fn trusted_itself(cert: &CertificateDer<'_>, name: &ServerName<'_>, now: UnixTime) -> bool {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let Ok((_, x)) = X509Certificate::from_der(cert) else {
        return false;
    };
    let now = now.as_secs() as i64;
    let v = x.validity();
    if now < v.not_before.timestamp() || now > v.not_after.timestamp() {
        return false;
    }
    let ServerName::DnsName(dns) = name else {
        return false;
    };
    let host = dns.as_ref().to_ascii_lowercase();
    let sans: Vec<String> = x
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|g| match g {
                    GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if sans.is_empty() {
        return cn_matches(cert, name);
    }
    sans.iter().any(|s| host_matches(s, &host))
}

/// `host` (lowercase) against a certificate's name (lowercase), with a `*.` wildcard for
/// one leftmost label.
fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(rest) => host
            .split_once('.')
            .is_some_and(|(first, tail)| !first.is_empty() && tail == rest),
        None => pattern == host,
    }
}

/// OpenSSL's `X509_check_host` fallback: no DNS subjectAltName, and a CN equal to the
/// name (case aside), or a `*.` CN matching one leftmost label.
fn cn_matches(cert: &CertificateDer<'_>, name: &ServerName<'_>) -> bool {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let ServerName::DnsName(dns) = name else {
        return false;
    };
    let Ok((_, x)) = X509Certificate::from_der(cert) else {
        return false;
    };
    let has_dns_san = x
        .subject_alternative_name()
        .ok()
        .flatten()
        .is_some_and(|san| {
            san.value
                .general_names
                .iter()
                .any(|g| matches!(g, GeneralName::DNSName(_)))
        });
    if has_dns_san {
        return false;
    }
    let host = dns.as_ref().to_ascii_lowercase();
    let found = x.subject().iter_common_name().any(|cn| {
        cn.as_str()
            .is_ok_and(|cn| host_matches(&cn.to_ascii_lowercase(), &host))
    });
    found
}

/// `proxy_ssl_verify off` (and an `acme_issuer`'s `ssl_verify off`): any certificate is
/// accepted, but the handshake signatures are checked against the key in it, as OpenSSL
/// does without verification.
#[derive(Debug)]
pub struct AnyCertificate {
    algs: WebPkiSupportedAlgorithms,
}

impl AnyCertificate {
    pub fn new(provider: &rustls::crypto::CryptoProvider) -> AnyCertificate {
        AnyCertificate {
            algs: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        handshake_signature(message, cert, dss, &self.algs, false)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        handshake_signature(message, cert, dss, &self.algs, true)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// A worker's client configs, each with its own session cache. Keyed by the address of the
/// shared setup, which the worker's config keeps alive as long as the worker runs.
#[derive(Default)]
pub struct Sessions {
    configs: RefCell<HashMap<usize, Arc<ClientConfig>>>,
}

impl Sessions {
    /// The config to connect with: the shared one without session reuse, else this worker's
    /// copy with its cache.
    pub fn config(&self, t: &Arc<ClientTls>) -> Arc<ClientConfig> {
        if !t.session_reuse {
            return t.config.clone();
        }
        self.configs
            .borrow_mut()
            .entry(Arc::as_ptr(t) as usize)
            .or_insert_with(|| {
                let mut c = (*t.config).clone();
                c.resumption = Resumption::in_memory_sessions(SESSIONS);
                Arc::new(c)
            })
            .clone()
    }
}

/// The name for the handshake from `proxy_ssl_name`'s value, without a port (a value from
/// `$proxy_host` or `$http_host` may carry one, as nginx allows). `None` if it is no
/// valid DNS name or IP address.
pub fn server_name(value: &str) -> Option<ServerName<'static>> {
    let host = if let Some(v6) = value.strip_prefix('[') {
        v6.split_once(']').map_or(v6, |(h, _)| h)
    } else {
        match value.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.contains(':') => h,
            _ => value,
        }
    };
    ServerName::try_from(host.to_string()).ok()
}

/// Why a handshake failed, as nginx words it for the error log.
pub fn describe(e: &io::Error, name: &ServerName<'_>) -> String {
    let tls = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => format!(
            "upstream SSL certificate does not match \"{}\"",
            name.to_str()
        ),
        Some(rustls::Error::InvalidCertificate(c)) => {
            format!("upstream SSL certificate verify error: ({c:?})")
        }
        Some(other) => format!("SSL_do_handshake() failed ({other})"),
        None if e.kind() == io::ErrorKind::UnexpectedEof => {
            "peer closed connection in SSL handshake".to_string()
        }
        None => format!("SSL_do_handshake() failed ({e})"),
    }
}

/// A TLS handshake over a connection just made.
pub async fn handshake(
    conn: Conn,
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
) -> io::Result<TlsConn> {
    let s = tokio_rustls::TlsConnector::from(config)
        .connect(name, conn)
        .await?;
    Ok(TlsConn { inner: s })
}

/// An upstream connection over TLS. Writers flush after `write_all` (rustls may keep the
/// last records when the socket is full: a flush sends them).
pub struct TlsConn {
    inner: tokio_rustls::client::TlsStream<Conn>,
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            // A close without close_notify ends the stream, as nginx takes it; an answer
            // that it cuts short is still found out by its framing.
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
            r => r,
        }
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl AsFd for TlsConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.get_ref().0.as_fd()
    }
}

impl Io for TlsConn {
    /// Records read off the socket but not taken: plaintext the server sent unasked (out of
    /// step) or its close_notify. Either way the connection must not carry a request; the
    /// socket alone cannot tell, as rustls may have read them with the answer's last bytes.
    fn holds_input(&mut self) -> bool {
        let (_, session) = self.inner.get_mut();
        match session.process_new_packets() {
            Ok(st) => st.plaintext_bytes_to_read() > 0 || st.peer_has_closed(),
            Err(_) => true,
        }
    }

    fn maybe_readable(&self) -> bool {
        self.inner.get_ref().0.maybe_readable()
    }
}

/// The client setup of an OTLP exporter over TLS (`otel_exporter`'s `https://` endpoint):
/// servers verified against `trusted_certificate`'s CAs, or the system's bundle as gRPC
/// uses without one; ALPN `h2`, as gRPC runs on HTTP/2.
pub fn otlp(trusted: &crate::modules::tls::FileArg) -> Result<Arc<ClientConfig>, ConfError> {
    let provider = Arc::new(provider(None, None));
    let mut roots = RootCertStore::empty();
    add_cas(&mut roots, trusted, "trusted certificate")?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&trusted.loc, format!("OTel TLS setup failed: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::{host_matches, server_name};

    #[test]
    fn names_match_as_openssl_matches_them() {
        assert!(host_matches("a.test", "a.test"));
        assert!(host_matches("*.example.com", "foo.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", "a.b.example.com"));
        assert!(!host_matches("a.test", "b.test"));
    }

    #[test]
    fn names_lose_their_port() {
        let s = |v: &str| server_name(v).map(|n| n.to_str().into_owned());
        assert_eq!(s("example.com:8443").as_deref(), Some("example.com"));
        assert_eq!(s("example.com").as_deref(), Some("example.com"));
        assert_eq!(s("backend").as_deref(), Some("backend"));
        assert_eq!(s("127.0.0.1:443").as_deref(), Some("127.0.0.1"));
        assert_eq!(s("[::1]:443").as_deref(), Some("::1"));
        assert_eq!(s("::1").as_deref(), Some("::1"));
        assert_eq!(s(""), None);
        assert_eq!(s("bad name"), None);
    }
}
