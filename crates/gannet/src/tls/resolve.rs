//! Which of a server's certificates a client gets, when it has several (`ssl_certificate`
//! given more than once, typically an ECDSA and an RSA one): the first, in the client's
//! order of signature schemes, that the client can both verify and use with a cipher suite
//! both sides have (a TLS 1.2 client offering only ECDHE-RSA suites gets the RSA certificate
//! even if it could verify ECDSA).

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SupportedCipherSuite;
use std::sync::Arc;

#[derive(Debug)]
pub struct KeyPairs {
    pub keys: Vec<Arc<CertifiedKey>>,
    /// Per key: its staple's current state when it is queried from a responder.
    pub staples: Vec<Option<Arc<super::stapling::Stapler>>>,
    /// The server's `acme_certificate`: its TLS-ALPN-01 validation certificates, and with
    /// `ssl_certificate $acme_certificate` (`acme_serves`) the certificate ACME got (or will
    /// get), read at each handshake so a new one serves at once; none yet refuses the
    /// handshake, as nginx-acme.
    pub acme: Option<Arc<crate::acme::Slot>>,
    pub acme_serves: bool,
    /// The suites this server offers.
    pub suites: Vec<SupportedCipherSuite>,
}

impl KeyPairs {
    /// Key `i`, with the staple its responder last gave.
    fn get(&self, i: usize) -> Option<Arc<CertifiedKey>> {
        match self.staples.get(i) {
            Some(Some(s)) => Some(s.current()),
            _ => self.keys.get(i).cloned(),
        }
    }

    /// Whether some suite offered by both sides can be used with this key.
    fn usable(&self, ck: &CertifiedKey, hello: &ClientHello<'_>) -> bool {
        let alg = ck.key.algorithm();
        let offered = hello.cipher_suites();
        self.suites.iter().any(|s| {
            offered.contains(&s.suite())
                && (s.tls13().is_some() || s.usable_for_signature_algorithm(alg))
        })
    }
}

impl ResolvesServerCert for KeyPairs {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(slot) = &self.acme {
            // TLS-ALPN-01 (RFC 8737): the CA's handshake offers only `acme-tls/1`.
            let validation = hello
                .alpn()
                .is_some_and(|mut a| a.any(|p| p == crate::acme::ACME_TLS_ALPN));
            if validation {
                return slot.validation(hello.server_name()?);
            }
            if self.acme_serves {
                return slot.get();
            }
        }
        for scheme in hello.signature_schemes() {
            let found = self.keys.iter().position(|ck| {
                ck.key.choose_scheme(&[*scheme]).is_some() && self.usable(ck, &hello)
            });
            if let Some(i) = found {
                return self.get(i);
            }
        }
        // Nothing fits the client's list: let rustls refuse with the first pair (it sends
        // the right alert).
        let i = self.keys.iter().position(|ck| self.usable(ck, &hello));
        self.get(i.unwrap_or(0))
    }
}
