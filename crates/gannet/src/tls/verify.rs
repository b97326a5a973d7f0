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

/// Asks for a client certificate; lets any chain through the handshake (see the module
/// docs), after checking the client's proof that it holds the certificate's key.
#[derive(Debug)]
pub struct DeferredVerifier {
    /// The CA names sent to the client (from `ssl_client_certificate`).
    hints: Vec<DistinguishedName>,
    algs: WebPkiSupportedAlgorithms,
}

impl DeferredVerifier {
    pub fn new(
        roots: Option<&Arc<dyn ClientCertVerifier>>,
        algs: WebPkiSupportedAlgorithms,
    ) -> Self {
        DeferredVerifier {
            hints: roots.map_or_else(Vec::new, |r| r.root_hint_subjects().to_vec()),
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
        signed_by_key(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        signed_by_key(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// Whether `dss` signs `message` with the key of `cert`, read by x509-parser rather than
/// webpki: without verification any certificate OpenSSL takes must do, X.509 v1 ones too
/// (which webpki refuses to parse, and `openssl req -x509` without extensions makes).
pub fn signed_by_key(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, x) = X509Certificate::from_der(cert)
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let key = &x.public_key().subject_public_key.data;
    let candidates = algs
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == dss.scheme)
        .map_or(&[][..], |(_, a)| *a);
    if candidates
        .iter()
        .any(|alg| alg.verify_signature(key, message, dss.signature()).is_ok())
    {
        return Ok(HandshakeSignatureValid::assertion());
    }
    Err(rustls::Error::InvalidCertificate(
        CertificateError::BadSignature,
    ))
}

/// rustls's webpki verifier, plus OpenSSL's acceptance of a client certificate that is
/// itself one of the trusted ones (a self-signed certificate put in
/// `ssl_client_certificate`, possibly X.509 v1, which webpki cannot parse as an end entity).
#[derive(Debug)]
pub struct WithAnchors {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub anchors: Vec<CertificateDer<'static>>,
}

impl ClientCertVerifier for WithAnchors {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if intermediates.is_empty() && self.anchors.iter().any(|a| a[..] == end_entity[..]) {
            use x509_parser::prelude::{FromDer, X509Certificate};
            let (_, c) = X509Certificate::from_der(end_entity)
                .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
            let now = now.as_secs() as i64;
            let v = c.validity();
            if now < v.not_before.timestamp() {
                return Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidYet,
                ));
            }
            if now > v.not_after.timestamp() {
                return Err(rustls::Error::InvalidCertificate(CertificateError::Expired));
            }
            return Ok(ClientCertVerified::assertion());
        }
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The verdict on the chain a client sent: checked against the CAs by rustls's webpki
/// verifier (`roots`), or failed for an unknown issuer when there are none to check
/// against (`optional_no_ca`).
pub fn judge(
    chain: Option<&[CertificateDer<'static>]>,
    roots: Option<&Arc<dyn ClientCertVerifier>>,
) -> Verified {
    let Some((end_entity, intermediates)) = chain.and_then(|c| c.split_first()) else {
        return Verified::None;
    };
    let Some(roots) = roots else {
        return Verified::Failed(unknown_issuer(end_entity, intermediates));
    };
    match roots.verify_client_cert(end_entity, intermediates, UnixTime::now()) {
        Ok(_) => Verified::Success,
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

/// Subject and issuer are the same name.
fn self_signed(der: &CertificateDer<'_>) -> bool {
    use x509_parser::prelude::{FromDer, X509Certificate};
    X509Certificate::from_der(der).is_ok_and(|(_, c)| c.subject().as_raw() == c.issuer().as_raw())
}
