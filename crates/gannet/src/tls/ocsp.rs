//! Client certificates checked with their CAs' OCSP responders (`ssl_ocsp on | leaf`,
//! `ssl_ocsp_responder`, `ssl_ocsp_cache`), as nginx's ngx_ssl_ocsp_validate: once the
//! handshake is done and the chain judged good, each certificate of the verified chain
//! but the root (`leaf`: the client's only) is asked about, in turn, at
//! `ssl_ocsp_responder` or the certificate's own responder URL; a response must be signed
//! by the certificate's issuer or a responder it delegated to, chaining up to the trusted
//! CAs. A revoked (or unknown) certificate, or a failed query, makes the verification
//! fail (`$ssl_client_verify` `FAILED:certificate revoked`, `FAILED:certificate status
//! request failed`...), which a request then gets as nginx's 400 page.
//!
//! Every connection asks again, as nginx does without a cache; `ssl_ocsp_cache
//! shared:NAME:SIZE` keeps the answers (good or revoked) until their nextUpdate, an hour
//! without one, for every server naming the cache. The request, the HTTP exchange and the
//! response's judgement are OCSP stapling's (`tls::stapling`).

use super::stapling::{self, Responder, Status};
use super::verify::Failure;
use crate::resolver::Resolver;
use der::{Decode, Encode};
use rustls::pki_types::CertificateDer;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use x509_cert::Certificate;

/// `ssl_ocsp`: which certificates are asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `on`: every certificate of the chain but the root.
    All,
    /// `leaf`: the client's own.
    Leaf,
}

/// nginx's estimate of one entry's room in the zone (its node and key).
const ENTRY_BYTES: usize = 128;
/// How long an answer without nextUpdate is kept, as nginx.
const NO_NEXT_UPDATE: u64 = 3600;

/// The cache's answers by CertID (status, until when), and the keys oldest first.
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<Vec<u8>, (Status, u64)>,
    order: VecDeque<Vec<u8>>,
}

/// `ssl_ocsp_cache shared:NAME:SIZE`: answers by CertID, until when they hold; the oldest
/// goes when it is full.
#[derive(Debug)]
pub struct Cache {
    max: usize,
    entries: Mutex<Entries>,
}

impl Cache {
    pub fn new(bytes: usize) -> Cache {
        Cache {
            max: (bytes / ENTRY_BYTES).max(1),
            entries: Mutex::default(),
        }
    }

    fn get(&self, key: &[u8]) -> Option<Status> {
        let mut g = self.entries.lock().ok()?;
        let &(status, valid) = g.map.get(key)?;
        if valid >= stapling::now() {
            return Some(status);
        }
        g.map.remove(key);
        None
    }

    fn put(&self, key: Vec<u8>, status: Status, valid: u64) {
        let now = stapling::now();
        if valid < now {
            return;
        }
        let valid = if valid == u64::MAX {
            now + NO_NEXT_UPDATE
        } else {
            valid
        };
        let Ok(mut g) = self.entries.lock() else {
            return;
        };
        let Entries { map, order } = &mut *g;
        if map.insert(key.clone(), (status, valid)).is_none() {
            order.push_back(key);
        }
        while map.len() > self.max {
            match order.pop_front() {
                Some(old) => {
                    map.remove(&old);
                }
                None => break,
            }
        }
        // Keys of entries dropped as expired are forgotten here too.
        if order.len() > 2 * self.max {
            order.retain(|k| map.contains_key(k));
        }
    }
}

/// A server's `ssl_ocsp` setup.
#[derive(Debug)]
pub struct ClientOcsp {
    pub mode: Mode,
    /// `ssl_ocsp_responder` (else each certificate's own).
    pub responder: Option<Responder>,
    pub cache: Option<Arc<Cache>>,
    /// The server's `resolver`: without one, a responder named by a certificate must be an
    /// address (nginx: "no resolver defined to resolve NAME").
    pub resolver: Option<(Arc<Resolver>, Duration)>,
}

fn failure(reason: &str) -> Failure {
    // Not an X509 verify error: nginx logs the reason alone (see `Failure::code`).
    Failure {
        code: 0,
        reason: reason.to_string(),
    }
}

const REQUEST_FAILED: &str = "certificate status request failed";

impl ClientOcsp {
    /// The status of the client's chain (`chain` as sent, `trusted` the CAs it was judged
    /// against): `Ok` when every certificate asked about is good. Failures are logged.
    pub async fn check(
        &self,
        chain: &[CertificateDer<'static>],
        trusted: &[CertificateDer<'static>],
    ) -> Result<(), Failure> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Ok(());
        };
        let verified = super::verify::verified_chain(leaf, intermediates, trusted);
        let certs: Vec<Certificate> = verified
            .iter()
            .map(|d| Certificate::from_der(d.as_ref()))
            .collect::<Result<_, _>>()
            .map_err(|_| failure(REQUEST_FAILED))?;
        let anchors: Vec<Certificate> = trusted
            .iter()
            .filter_map(|d| Certificate::from_der(d.as_ref()).ok())
            .collect();
        let asked = match self.mode {
            Mode::All => certs.len().saturating_sub(1),
            Mode::Leaf => certs.len().saturating_sub(1).min(1),
        };
        for i in 0..asked {
            let (cert, issuer) = (&certs[i], &certs[i + 1]);
            match self.status(cert, issuer, &certs, &anchors).await {
                Ok(Status::Good) => {}
                Ok(Status::Revoked) => return Err(failure("certificate revoked")),
                Ok(Status::Unknown) => return Err(failure("certificate status unknown")),
                Err(e) => {
                    crate::errlog::error(format_args!("{e}"));
                    return Err(failure(REQUEST_FAILED));
                }
            }
        }
        Ok(())
    }

    /// One certificate's status: from the cache, else from its responder.
    async fn status(
        &self,
        cert: &Certificate,
        issuer: &Certificate,
        chain: &[Certificate],
        anchors: &[Certificate],
    ) -> Result<Status, String> {
        let id = stapling::cert_id(cert, issuer)?;
        let key = id.to_der().map_err(|e| e.to_string())?;
        if let Some(s) = self.cache.as_ref().and_then(|c| c.get(&key)) {
            return Ok(s);
        }
        let (responder, named) = match &self.responder {
            Some(r) => (r.clone(), true),
            None => {
                let url = stapling::aia_url(cert).ok_or("no OCSP responder URL in certificate")?;
                let r = Responder::parse(&url).map_err(|e| format!("{e} in certificate"))?;
                (r, false)
            }
        };
        let subject = cert.tbs_certificate.subject.to_string();
        let failed = |what: &str| {
            format!(
                "{what} while requesting certificate status, responder: {}, peer: {}:{}, certificate: \"{subject}\"",
                responder.host, responder.host, responder.port
            )
        };
        let req = stapling::request(&id)?;
        // `ssl_ocsp_responder`'s name is resolved as the configuration loads (by the
        // system's resolver); a certificate's only with `resolver`.
        let body =
            stapling::fetch(&responder, self.resolver.as_ref(), named, &req, &failed).await?;
        let trusted = |b: &x509_ocsp::BasicOcspResponse| {
            stapling::signer_trusted(b, anchors, chain, issuer, false)
        };
        let (status, valid) = stapling::judge_response(&body, &id, trusted, &failed)?;
        if let Some(c) = &self.cache {
            c.put(key, status, valid);
        }
        Ok(status)
    }
}
