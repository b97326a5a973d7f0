//! Client certificates (`ssl_verify_client`, `ssl_client_certificate`), judged as nginx
//! judges them: the handshake asks for a certificate and checks that the client holds its
//! key (rustls verifies the handshake signature), but whether the chain leads to a trusted
//! CA is decided afterwards, so that a request without a good certificate gets nginx's
//! 400 page ("No required SSL certificate was sent", "The SSL certificate error") instead
//! of a bare TLS alert, and `optional_no_ca` can still show what was sent.

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use std::sync::Arc;

/// `$ssl_client_verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// No certificate was sent (`NONE`).
    None,
    /// `SUCCESS`.
    Success,
    /// `FAILED:reason`.
    Failed(String),
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The verdict on the chain a client sent: checked against the CAs by rustls's webpki
/// verifier (`roots`), or FAILED when there are none to check against (`optional_no_ca`).
pub fn judge(
    chain: Option<&[CertificateDer<'static>]>,
    roots: Option<&Arc<dyn ClientCertVerifier>>,
) -> Verified {
    let Some((end_entity, intermediates)) = chain.and_then(|c| c.split_first()) else {
        return Verified::None;
    };
    let Some(roots) = roots else {
        return Verified::Failed("unable to verify the first certificate".to_string());
    };
    match roots.verify_client_cert(end_entity, intermediates, UnixTime::now()) {
        Ok(_) => Verified::Success,
        Err(e) => Verified::Failed(e.to_string()),
    }
}
