//! Client certificates (`ssl_verify_client`, `ssl_client_certificate`), judged as nginx
//! judges them: the handshake asks for a certificate and checks that the client holds its
//! key (rustls verifies the handshake signature), but whether the chain leads to a trusted
//! CA is decided afterwards, so that a request without a good certificate gets nginx's
//! 400 page ("No required SSL certificate was sent", "The SSL certificate error") instead
//! of a bare TLS alert, and `optional_no_ca` can still show what was sent.
//!
//! A failure is described as OpenSSL describes it (its X509_V_ERR number and text), since
//! that is what `$ssl_client_verify` shows and what nginx logs.

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use std::sync::Arc;

/// `$ssl_client_verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// No certificate was sent (`NONE`).
    None,
    /// `SUCCESS`.
    Success,
    /// `FAILED:reason`.
    Failed(Failure),
}

/// Why a chain failed: OpenSSL's verify error number and its text (rustls's own text when
/// OpenSSL has no matching error, with number 1, "unspecified").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: u32,
    pub reason: String,
}

impl Failure {
    fn new(code: u32, reason: impl Into<String>) -> Failure {
        Failure {
            code,
            reason: reason.into(),
        }
    }

    /// A failure `ssl_verify_client optional_no_ca` lets through: the issuer is unknown,
    /// and nothing else is wrong (nginx's `ngx_ssl_verify_error_optional`).
    pub fn only_unknown_ca(&self) -> bool {
        matches!(self.code, 2 | 18 | 19 | 20 | 21)
    }
}

/// What client chains are judged against: rustls's webpki verifier over the CAs, and the
/// CA certificates themselves (a client may present one of them, see `judge`).
#[derive(Debug, Clone)]
pub struct ClientRoots {
    pub verifier: Arc<dyn ClientCertVerifier>,
    pub trusted: Vec<CertificateDer<'static>>,
    /// `ssl_crl`, checked once the chain is good.
    pub crls: Option<super::crl::Crls>,
    /// `ssl_verify_depth`.
    pub depth: u64,
}

/// Asks for a client certificate; lets any chain through the handshake (see the module
/// docs), after checking the client's proof that it holds the certificate's key.
#[derive(Debug)]
pub struct DeferredVerifier {
    /// The CA names sent to the client (from `ssl_client_certificate`).
    hints: Vec<DistinguishedName>,
    algs: WebPkiSupportedAlgorithms,
}

impl DeferredVerifier {
    pub fn new(roots: Option<&ClientRoots>, algs: WebPkiSupportedAlgorithms) -> Self {
        DeferredVerifier {
            hints: roots.map_or_else(Vec::new, |r| r.verifier.root_hint_subjects().to_vec()),
            algs,
        }
    }
}

impl ClientCertVerifier for DeferredVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Judged after the handshake by `judge`, against the CAs (see the module docs).
        Ok(ClientCertVerified::assertion())
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

/// The verdict on the chain a client sent: checked against the CAs by rustls's webpki
/// verifier (`roots`), or failed for an unknown issuer when there are none to check
/// against (`optional_no_ca`). A client certificate that is itself one of the trusted
/// certificates is good while it is valid, as OpenSSL finds it in its store at once;
/// webpki would refuse it (a CA as an end entity, or an X.509 v1 certificate).
pub fn judge(chain: Option<&[CertificateDer<'static>]>, roots: Option<&ClientRoots>) -> Verified {
    let Some((end_entity, intermediates)) = chain.and_then(|c| c.split_first()) else {
        return Verified::None;
    };
    let Some(roots) = roots else {
        return Verified::Failed(unknown_issuer(end_entity, intermediates));
    };
    // What OpenSSL checks after the chain itself: its length, then revocation.
    let revoked = || {
        if chain_len(end_entity, intermediates, &roots.trusted) > roots.depth + 2 {
            return Some(Failure::new(22, "certificate chain too long"));
        }
        let crls = roots.crls.as_ref()?;
        let failed = crls
            .check(end_entity, intermediates, &roots.trusted)
            .err()?;
        let (code, reason) = failed.openssl();
        Some(Failure::new(code, reason))
    };
    if roots.trusted.iter().any(|t| t == end_entity) {
        return match validity(end_entity).or_else(revoked) {
            Some(f) => Verified::Failed(f),
            None => Verified::Success,
        };
    }
    match roots
        .verifier
        .verify_client_cert(end_entity, intermediates, UnixTime::now())
    {
        Ok(_) => match revoked() {
            Some(f) => Verified::Failed(f),
            None => Verified::Success,
        },
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(o)))
            if matches!(
                o.0.downcast_ref::<webpki::Error>(),
                Some(webpki::Error::CaUsedAsEndEntity)
            ) =>
        {
            match ca_client(end_entity, intermediates, &roots.trusted).or_else(revoked) {
                Some(f) => Verified::Failed(f),
                None => Verified::Success,
            }
        }
        Err(rustls::Error::InvalidCertificate(e)) => {
            Verified::Failed(openssl_failure(&e, end_entity, intermediates))
        }
        Err(e) => Verified::Failed(Failure::new(1, e.to_string())),
    }
}

/// A rustls certificate error as OpenSSL's verify error.
fn openssl_failure(
    e: &CertificateError,
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
) -> Failure {
    use CertificateError as E;
    match e {
        E::UnknownIssuer => unknown_issuer(end_entity, intermediates),
        // webpki refuses a lone self-signed certificate for other reasons first (a CA
        // used as an end entity); OpenSSL reports that it is self-signed.
        E::Other(_) if intermediates.is_empty() && self_signed(end_entity) => {
            unknown_issuer(end_entity, intermediates)
        }
        E::Expired | E::ExpiredContext { .. } => Failure::new(10, "certificate has expired"),
        E::NotValidYet | E::NotValidYetContext { .. } => {
            Failure::new(9, "certificate is not yet valid")
        }
        E::Revoked => Failure::new(23, "certificate revoked"),
        E::UnknownRevocationStatus => Failure::new(3, "unable to get certificate CRL"),
        E::ExpiredRevocationList | E::ExpiredRevocationListContext { .. } => {
            Failure::new(12, "CRL has expired")
        }
        E::BadSignature => Failure::new(7, "certificate signature failure"),
        E::InvalidPurpose | E::InvalidPurposeContext { .. } => {
            Failure::new(26, "unsupported certificate purpose")
        }
        E::UnhandledCriticalExtension => Failure::new(34, "unhandled critical extension"),
        other => Failure::new(1, other.to_string()),
    }
}

/// No trusted CA issued the chain: OpenSSL tells apart by the chain's shape a self-signed
/// certificate (18), a self-signed root at the end of the chain (19), a lone certificate
/// (21) and a chain that stops at an unknown issuer (20).
fn unknown_issuer(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
) -> Failure {
    match intermediates.last() {
        None if self_signed(end_entity) => Failure::new(18, "self-signed certificate"),
        None => Failure::new(21, "unable to verify the first certificate"),
        Some(top) if self_signed(top) => {
            Failure::new(19, "self-signed certificate in certificate chain")
        }
        Some(_) => Failure::new(20, "unable to get local issuer certificate"),
    }
}

/// A client certificate marked `CA:TRUE`, which OpenSSL takes as a client's own (nginx's
/// test suite makes them so) and webpki refuses as an end entity: the chain is walked
/// here instead, from the certificate to a trusted one, each link found by the issuer's
/// name and checked as OpenSSL checks it: signed by that issuer's key (x509-parser with
/// aws-lc-rs), within its dates, the issuer a CA; and the client's own extended key usage,
/// if it has one, allows client authentication. `None` when the chain is good.
fn ca_client(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    trusted: &[CertificateDer<'static>],
) -> Option<Failure> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    fn parse(d: &[u8]) -> Option<X509Certificate<'_>> {
        X509Certificate::from_der(d).ok().map(|(_, c)| c)
    }
    let Some(leaf) = parse(end_entity) else {
        return Some(Failure::new(1, "certificate cannot be parsed"));
    };
    if let Ok(Some(eku)) = leaf.extended_key_usage() {
        if !(eku.value.client_auth || eku.value.any) {
            return Some(Failure::new(26, "unsupported certificate purpose"));
        }
    }
    let mut der: &[u8] = end_entity.as_ref();
    let mut cert = leaf;
    // A chain is short; the bound only stops a loop of names.
    for _ in 0..16 {
        if let Some(f) = validity(&CertificateDer::from(der)) {
            return Some(f);
        }
        if trusted.iter().any(|t| t.as_ref() == der) {
            return None;
        }
        let issuer = intermediates
            .iter()
            .map(|c| c.as_ref())
            .chain(trusted.iter().map(|c| c.as_ref()))
            .filter_map(|d| parse(d).map(|c| (d, c)))
            .find(|(_, c)| {
                c.subject().as_raw() == cert.issuer().as_raw()
                    && cert.verify_signature(Some(c.public_key())).is_ok()
            });
        let Some((issuer_der, issuer)) = issuer else {
            return Some(unknown_issuer(end_entity, intermediates));
        };
        if !issuer.is_ca() && !trusted.iter().any(|t| t.as_ref() == issuer_der) {
            return Some(Failure::new(24, "invalid CA certificate"));
        }
        der = issuer_der;
        cert = issuer;
    }
    Some(Failure::new(22, "certificate chain too long"))
}

/// How many certificates the chain has, from the client's up to a self-signed one, as
/// OpenSSL builds it (by issuer names, among those sent and the trusted ones): at most
/// `ssl_verify_depth` + 2 (the client's, that many intermediates, the root).
fn chain_len(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    trusted: &[CertificateDer<'static>],
) -> u64 {
    use x509_parser::prelude::{FromDer, X509Certificate};
    fn parse(d: &[u8]) -> Option<X509Certificate<'_>> {
        X509Certificate::from_der(d).ok().map(|(_, c)| c)
    }
    let pool: Vec<X509Certificate<'_>> = intermediates
        .iter()
        .map(|c| c.as_ref())
        .chain(trusted.iter().map(|c| c.as_ref()))
        .filter_map(parse)
        .collect();
    let Some(mut cert) = parse(end_entity) else {
        return 1;
    };
    let mut n = 1;
    while n < 32 && cert.subject().as_raw() != cert.issuer().as_raw() {
        match pool
            .iter()
            .find(|c| c.subject().as_raw() == cert.issuer().as_raw())
        {
            Some(issuer) => cert = issuer.clone(),
            None => break,
        }
        n += 1;
    }
    n
}

/// Why a certificate is outside its validity period, if it is (OpenSSL's errors 9, 10).
fn validity(der: &CertificateDer<'_>) -> Option<Failure> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let Ok((_, c)) = X509Certificate::from_der(der) else {
        return Some(Failure::new(1, "certificate cannot be parsed"));
    };
    let v = c.validity();
    let now = UnixTime::now().as_secs() as i64;
    if v.not_after.timestamp() < now {
        Some(Failure::new(10, "certificate has expired"))
    } else if v.not_before.timestamp() > now {
        Some(Failure::new(9, "certificate is not yet valid"))
    } else {
        None
    }
}

/// Subject and issuer are the same name.
fn self_signed(der: &CertificateDer<'_>) -> bool {
    use x509_parser::prelude::{FromDer, X509Certificate};
    X509Certificate::from_der(der).is_ok_and(|(_, c)| c.subject().as_raw() == c.issuer().as_raw())
}

/// A handshake signature (CertificateVerify, or TLS 1.2's ServerKeyExchange) checked
/// against the public key of the peer's certificate. rustls's own helpers first parse the
/// certificate as webpki's end entity, which refuses X.509 v1 certificates
/// (`UnsupportedCertVersion`), although the signature concerns only the key; OpenSSL takes
/// them, so the key is read here with x509-parser, whatever the version, and checked as a
/// raw key (`webpki::RawPublicKeyEntity`). TLS 1.2 schemes may map to several algorithms,
/// tried in turn as rustls does.
pub fn handshake_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &WebPkiSupportedAlgorithms,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    use rustls::pki_types::SubjectPublicKeyInfoDer;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, parsed) = X509Certificate::from_der(cert)
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let spki = SubjectPublicKeyInfoDer::from(parsed.tbs_certificate.subject_pki.raw);
    if tls13 {
        return rustls::crypto::verify_tls13_signature_with_raw_key(message, &spki, dss, algs);
    }
    let bad = || rustls::Error::InvalidCertificate(CertificateError::BadSignature);
    let key = webpki::RawPublicKeyEntity::try_from(&spki).map_err(|_| bad())?;
    let candidates = algs
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == dss.scheme)
        .map(|(_, a)| *a)
        .ok_or(rustls::Error::PeerMisbehaved(
            rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
        ))?;
    for alg in candidates {
        match key.verify_signature(*alg, message, dss.signature()) {
            Ok(()) => return Ok(HandshakeSignatureValid::assertion()),
            Err(webpki::Error::UnsupportedSignatureAlgorithmForPublicKeyContext(_)) => continue,
            Err(_) => return Err(bad()),
        }
    }
    Err(rustls::Error::InvalidCertificate(
        CertificateError::BadSignature,
    ))
}

/// The chain OpenSSL verified, as DER: the client's certificate, then each issuer (found by
/// name among those sent and the trusted ones, and checked to have signed it) up to a
/// self-signed one or the last found. nginx's `ssl_ocsp` asks about each link of it.
pub fn verified_chain(
    end_entity: &CertificateDer<'static>,
    intermediates: &[CertificateDer<'static>],
    trusted: &[CertificateDer<'static>],
) -> Vec<CertificateDer<'static>> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    fn parse(d: &[u8]) -> Option<X509Certificate<'_>> {
        X509Certificate::from_der(d).ok().map(|(_, c)| c)
    }
    let mut chain = vec![end_entity.clone()];
    // A chain is short; the bound only stops a loop of names.
    while chain.len() < 16 {
        let Some(last) = chain.last() else { break };
        let Some(cert) = parse(last) else { break };
        if cert.subject().as_raw() == cert.issuer().as_raw() {
            break;
        }
        let issuer = intermediates.iter().chain(trusted).find(|d| {
            parse(d).is_some_and(|c| {
                c.subject().as_raw() == cert.issuer().as_raw()
                    && cert.verify_signature(Some(c.public_key())).is_ok()
            })
        });
        match issuer {
            Some(i) if !chain.contains(i) => chain.push(i.clone()),
            _ => break,
        }
    }
    chain
}
