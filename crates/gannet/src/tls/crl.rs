//! Revocation checks against `ssl_crl` / `proxy_ssl_crl` (`uwsgi_ssl_crl`), as OpenSSL makes
//! them for nginx (`X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL`): every certificate of
//! the chain, the root included, needs a CRL from its issuer, signed by the issuer's key and
//! not past its next update, that does not list its serial.
//!
//! Done here rather than by webpki, which reads only v2 CRLs: `openssl ca -gencrl` writes v1
//! CRLs unless given a `crlnumber` file or `crl_extensions`, and OpenSSL (so nginx) takes
//! them. The chain itself is still verified by webpki first; this walks the same chain
//! by issuer names (leaf, then the issuers among the certificates sent and the trusted
//! ones, up to a self-signed one) and parses with x509-parser, which reads both versions.

use crate::modules::tls::FileArg;
use gannet_conf::ConfError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use x509_parser::prelude::{CertificateRevocationList, FromDer, X509Certificate};

/// Why a chain fails its revocation check (OpenSSL's verify errors 23, 3, 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrlFailure {
    Revoked,
    NoCrl,
    Expired,
}

impl CrlFailure {
    /// OpenSSL's error number and text.
    pub fn openssl(self) -> (u32, &'static str) {
        match self {
            CrlFailure::Revoked => (23, "certificate revoked"),
            CrlFailure::NoCrl => (3, "unable to get certificate CRL"),
            CrlFailure::Expired => (12, "CRL has expired"),
        }
    }

    pub fn rustls(self) -> rustls::CertificateError {
        match self {
            CrlFailure::Revoked => rustls::CertificateError::Revoked,
            CrlFailure::NoCrl => rustls::CertificateError::UnknownRevocationStatus,
            CrlFailure::Expired => rustls::CertificateError::ExpiredRevocationList,
        }
    }
}

/// The CRLs of one file, each checked to parse when the file is loaded.
#[derive(Debug, Clone)]
pub struct Crls(Vec<CertificateRevocationListDer<'static>>);

impl Crls {
    /// Every CRL in a PEM file; one that cannot be parsed is an error naming the file.
    pub fn load(f: &FileArg) -> Result<Crls, ConfError> {
        let fail = |why: String| {
            ConfError::at(
                &f.loc,
                format!("cannot load CRL \"{}\": {why}", f.path.display()),
            )
        };
        let pem = std::fs::read(&f.path).map_err(|e| fail(e.to_string()))?;
        let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(e.to_string()))?;
        if crls.is_empty() {
            return Err(fail("no PEM CRL in it".to_string()));
        }
        for crl in &crls {
            CertificateRevocationList::from_der(crl).map_err(|e| fail(e.to_string()))?;
        }
        Ok(Crls(crls))
    }

    /// The revocation verdict on a chain webpki accepted: `end_entity` and `sent` as the
    /// peer sent them, `trusted` the CA certificates.
    pub fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        sent: &[CertificateDer<'_>],
        trusted: &[CertificateDer<'static>],
    ) -> Result<(), CrlFailure> {
        fn parse(d: &[u8]) -> Option<X509Certificate<'_>> {
            X509Certificate::from_der(d).ok().map(|(_, c)| c)
        }
        let pool: Vec<X509Certificate<'_>> = sent
            .iter()
            .map(|c| c.as_ref())
            .chain(trusted.iter().map(|c| c.as_ref()))
            .filter_map(parse)
            .collect();
        let crls: Vec<CertificateRevocationList<'_>> = self
            .0
            .iter()
            .filter_map(|d| CertificateRevocationList::from_der(d).ok().map(|(_, c)| c))
            .collect();
        let Some(mut cert) = parse(end_entity) else {
            return Err(CrlFailure::NoCrl);
        };
        let now = x509_parser::time::ASN1Time::now();
        // Every certificate is checked and the last failure along the chain is the verdict,
        // as OpenSSL reports it when nginx's verify callback lets the check go on.
        let mut verdict = Ok(());
        // A chain is short; the bound only stops a loop of names.
        for _ in 0..16 {
            let self_signed = cert.subject().as_raw() == cert.issuer().as_raw();
            let issuer = if self_signed {
                Some(cert.clone())
            } else {
                pool.iter()
                    .find(|c| c.subject().as_raw() == cert.issuer().as_raw())
                    .cloned()
            };
            let Some(issuer) = issuer else {
                return Err(CrlFailure::NoCrl);
            };
            let crl = crls
                .iter()
                .filter(|crl| crl.issuer().as_raw() == cert.issuer().as_raw())
                .find(|crl| crl.verify_signature(issuer.public_key()).is_ok());
            match crl {
                None => verdict = Err(CrlFailure::NoCrl),
                Some(crl) if crl.next_update().is_some_and(|t| t < now) => {
                    verdict = Err(CrlFailure::Expired)
                }
                Some(crl)
                    if crl
                        .iter_revoked_certificates()
                        .any(|r| r.raw_serial() == cert.raw_serial()) =>
                {
                    verdict = Err(CrlFailure::Revoked)
                }
                Some(_) => {}
            }
            if self_signed {
                break;
            }
            cert = issuer;
        }
        verdict
    }
}
