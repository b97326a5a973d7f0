//! OCSP stapling from the certificate's responder (`ssl_stapling on` without
//! `ssl_stapling_file`), as nginx's ngx_event_openssl_stapling.c: a background task asks
//! the responder (the certificate's Authority Information Access URL, or
//! `ssl_stapling_responder`) for the certificate's status, never on the handshake path;
//! a `good` response is stapled until it is replaced. nginx's timing: refreshed 5 minutes
//! before its nextUpdate but at least hourly and at most every 5 minutes; after an error,
//! tried again (after 5 s, doubling up to nginx's 5 minutes; a staple still valid is kept
//! meanwhile).
//!
//! The DER is read with RustCrypto's `x509-ocsp`; signatures (`ssl_stapling_verify on`)
//! are checked with rustls's webpki on aws-lc-rs.

use crate::resolver::Resolver;
use der::{Decode, Encode};
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use x509_cert::Certificate;
use x509_ocsp::{BasicOcspResponse, CertId, CertStatus, OcspRequest, OcspResponseStatus};

const AIA: &str = "1.3.6.1.5.5.7.1.1";
const AD_OCSP: &str = "1.3.6.1.5.5.7.48.1";
const BASIC: &str = "1.3.6.1.5.5.7.48.1.1";
const EKU: &str = "2.5.29.37";
const OCSP_SIGNING: &str = "1.3.6.1.5.5.7.3.9";
const SHA1: &str = "1.3.14.3.2.26";
/// nginx's `ssl_stapling_responder` and resolver timeouts are not configurable here.
const TIMEOUT: Duration = Duration::from_secs(60);
const RETRY: u64 = 300;
const HOUR: u64 = 3600;
/// After a failure nginx asks again on the first handshake 5 minutes later; gannet, asking
/// in the background, starts sooner and doubles up to those 5 minutes, so a responder that
/// was down when the server started is not felt for long.
const FIRST_RETRY: u64 = 5;

/// Where the responder is: `http://host[:port][/path]`.
#[derive(Debug, Clone)]
pub struct Responder {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Responder {
    /// nginx refuses anything but `http://` ("invalid URL prefix in OCSP responder").
    pub fn parse(url: &str) -> Result<Responder, String> {
        let rest = url
            .get(..7)
            .filter(|p| p.eq_ignore_ascii_case("http://"))
            .map(|_| &url[7..])
            .ok_or_else(|| format!("invalid URL prefix in OCSP responder \"{url}\""))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        // `[::1]` alone has no port; `[::1]:8080` and `host:8080` have.
        let bare_v6 = hostport.starts_with('[') && hostport.ends_with(']');
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !bare_v6 => (
                h,
                p.parse::<u16>()
                    .map_err(|_| format!("invalid port in OCSP responder \"{url}\""))?,
            ),
            _ => (hostport, 80),
        };
        if host.is_empty() {
            return Err(format!("empty host in OCSP responder \"{url}\""));
        }
        Ok(Responder {
            host: host.trim_matches(['[', ']']).to_string(),
            port,
            path: path.to_string(),
        })
    }
}

/// One certificate's staple: what handshakes serve (`current`), and what the task needs.
#[derive(Debug)]
pub struct Stapler {
    base: Arc<CertifiedKey>,
    current: RwLock<(Arc<CertifiedKey>, u64)>,
    cert: Certificate,
    issuer: Certificate,
    responder: Responder,
    /// The certificate's file, as nginx names it in its log lines.
    file: String,
    /// The server's `resolver` for the responder's name (else the system's, as nginx,
    /// which resolves it when the configuration loads).
    resolver: Option<(Arc<Resolver>, Duration)>,
    /// `ssl_stapling_verify on`: the trust anchors (`ssl_trusted_certificate`) and the
    /// chain's other certificates a signer may chain through.
    verify: Option<(Vec<Certificate>, Vec<Certificate>)>,
}

/// What keeps a certificate from being stapled, in nginx's words (logged as a warning).
pub fn setup(
    ck: Arc<CertifiedKey>,
    trusted: &[CertificateDer<'static>],
    responder: Option<&str>,
    verify: bool,
    resolver: Option<(Arc<Resolver>, Duration)>,
    file: &str,
) -> Result<Arc<Stapler>, String> {
    let parse = |d: &CertificateDer| Certificate::from_der(d.as_ref()).ok();
    let cert =
        ck.cert.first().and_then(parse).ok_or_else(|| {
            format!("\"ssl_stapling\" ignored, cannot read certificate \"{file}\"")
        })?;
    let chain: Vec<Certificate> = ck.cert.iter().skip(1).filter_map(parse).collect();
    let anchors: Vec<Certificate> = trusted.iter().filter_map(parse).collect();
    let wanted = &cert.tbs_certificate.issuer;
    let issuer = chain
        .iter()
        .chain(&anchors)
        .find(|c| &c.tbs_certificate.subject == wanted)
        .cloned()
        .ok_or_else(|| {
            format!(
                "\"ssl_stapling\" ignored, issuer certificate not found for certificate \"{file}\""
            )
        })?;
    let url = match responder {
        Some(u) => u.to_string(),
        None => aia_url(&cert).ok_or_else(|| {
            format!("\"ssl_stapling\" ignored, no OCSP responder URL in the certificate \"{file}\"")
        })?,
    };
    let responder = Responder::parse(&url)
        .map_err(|e| format!("\"ssl_stapling\" ignored, {e} in the certificate \"{file}\""))?;
    Ok(Arc::new(Stapler {
        current: RwLock::new((ck.clone(), 0)),
        base: ck,
        cert,
        issuer,
        responder,
        file: file.to_string(),
        resolver,
        verify: verify.then_some((anchors, chain)),
    }))
}

/// The certificate's OCSP URL from its Authority Information Access extension.
pub fn aia_url(cert: &Certificate) -> Option<String> {
    use x509_cert::ext::pkix::name::GeneralName;
    use x509_cert::ext::pkix::AuthorityInfoAccessSyntax;
    let ext = cert
        .tbs_certificate
        .extensions
        .as_ref()?
        .iter()
        .find(|e| e.extn_id.to_string() == AIA)?;
    let aia = AuthorityInfoAccessSyntax::from_der(ext.extn_value.as_bytes()).ok()?;
    aia.0.iter().find_map(|ad| match &ad.access_location {
        GeneralName::UniformResourceIdentifier(u) if ad.access_method.to_string() == AD_OCSP => {
            Some(u.to_string())
        }
        _ => None,
    })
}

/// The CertID (SHA-1 hashes of the issuer's name and key, the serial) of `cert`.
pub fn cert_id(cert: &Certificate, issuer: &Certificate) -> Result<CertId, String> {
    let sha1 =
        |b: &[u8]| aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, b);
    let name = issuer
        .tbs_certificate
        .subject
        .to_der()
        .map_err(|e| format!("OCSP_cert_to_id() failed: {e}"))?;
    let key = issuer
        .tbs_certificate
        .subject_public_key_info
        .subject_public_key
        .raw_bytes();
    let oct = |d: aws_lc_rs::digest::Digest| {
        der::asn1::OctetString::new(d.as_ref()).map_err(|e| e.to_string())
    };
    Ok(CertId {
        hash_algorithm: x509_cert::spki::AlgorithmIdentifierOwned {
            oid: SHA1.parse().map_err(|_| "bad OID".to_string())?,
            parameters: Some(der::asn1::Null.into()),
        },
        issuer_name_hash: oct(sha1(&name))?,
        issuer_key_hash: oct(sha1(key))?,
        serial_number: cert.tbs_certificate.serial_number.clone(),
    })
}

/// The DER of an OCSP request for one certificate.
pub fn request(id: &CertId) -> Result<Vec<u8>, String> {
    OcspRequest {
        tbs_request: x509_ocsp::TbsRequest {
            version: x509_ocsp::Version::V1,
            requestor_name: None,
            request_list: vec![x509_ocsp::Request {
                req_cert: id.clone(),
                single_request_extensions: None,
            }],
            request_extensions: None,
        },
        optional_signature: None,
    }
    .to_der()
    .map_err(|e| format!("i2d_OCSP_REQUEST() failed: {e}"))
}

/// A certificate's status in a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Good,
    Revoked,
    Unknown,
}

/// What the responder said of the certificate `id`, as nginx's ngx_ssl_ocsp_verify judges
/// a response: successful, signed by a signer `trusted` accepts, naming `id`, current.
/// Returns the status and until when it holds (`u64::MAX`: no nextUpdate). `failed` words
/// the error.
pub fn judge_response(
    der_bytes: &[u8],
    id: &CertId,
    trusted: impl Fn(&BasicOcspResponse) -> bool,
    failed: &dyn Fn(&str) -> String,
) -> Result<(Status, u64), String> {
    let resp = x509_ocsp::OcspResponse::from_der(der_bytes)
        .map_err(|_| failed("d2i_OCSP_RESPONSE() failed"))?;
    if resp.response_status != OcspResponseStatus::Successful {
        return Err(failed(&format!(
            "OCSP response not successful ({}: {:?})",
            resp.response_status as u8, resp.response_status
        )));
    }
    let bytes = resp
        .response_bytes
        .filter(|b| b.response_type.to_string() == BASIC)
        .ok_or_else(|| failed("OCSP_response_get1_basic() failed"))?;
    let basic = BasicOcspResponse::from_der(bytes.response.as_bytes())
        .map_err(|_| failed("OCSP_response_get1_basic() failed"))?;
    if !trusted(&basic) {
        return Err(failed("OCSP_basic_verify() failed"));
    }
    let single = basic
        .tbs_response_data
        .responses
        .iter()
        .find(|r| r.cert_id == *id)
        .ok_or_else(|| failed("certificate status not found in the OCSP response"))?;
    let now = now();
    let secs = |t: &x509_ocsp::OcspGeneralizedTime| t.0.to_unix_duration().as_secs();
    // OCSP_check_validity(thisupdate, nextupdate, 300, -1).
    let next = single.next_update.as_ref().map(secs);
    if secs(&single.this_update) > now + RETRY || next.is_some_and(|n| n + RETRY < now) {
        return Err(failed("OCSP_check_validity() failed"));
    }
    let status = match single.cert_status {
        CertStatus::Good(_) => Status::Good,
        CertStatus::Revoked(_) => Status::Revoked,
        CertStatus::Unknown(_) => Status::Unknown,
    };
    Ok((status, next.unwrap_or(u64::MAX)))
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Stapler {
    /// The certificate with its staple, if one is valid now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(c) if c.1 >= now() => c.0.clone(),
            _ => self.base.clone(),
        }
    }

    fn set(&self, der: Vec<u8>, valid: u64) {
        let mut ck = (*self.base).clone();
        ck.ocsp = Some(der);
        if let Ok(mut c) = self.current.write() {
            *c = (Arc::new(ck), valid);
        }
    }

    /// Query, staple, and query again when nginx would, until the worker stops.
    pub async fn run(self: Arc<Self>) {
        let mut backoff = FIRST_RETRY;
        loop {
            let wait = match self.query().await {
                Ok((der, valid)) => {
                    self.set(der, valid);
                    backoff = FIRST_RETRY;
                    let now = now();
                    (valid.saturating_sub(RETRY).min(now + HOUR)).max(now + RETRY) - now
                }
                Err(e) => {
                    crate::errlog::error(format_args!("{e}"));
                    let wait = backoff;
                    backoff = (backoff * 2).min(RETRY);
                    wait
                }
            };
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
    }

    /// One exchange with the responder: the DER to staple and until when it is valid.
    async fn query(&self) -> Result<(Vec<u8>, u64), String> {
        let id = cert_id(&self.cert, &self.issuer)?;
        let req = request(&id)?;
        let failed = |what: &str| self.failed(what);
        let body = fetch(&self.responder, self.resolver.as_ref(), true, &req, &failed).await?;
        let trusted = |b: &BasicOcspResponse| match &self.verify {
            Some((anchors, chain)) => signer_trusted(b, anchors, chain, &self.issuer, true),
            None => true,
        };
        match judge_response(&body, &id, trusted, &failed)? {
            (Status::Good, valid) => Ok((body, valid)),
            (status, _) => Err(self.failed(&format!(
                "certificate status \"{}\" in the OCSP response",
                if status == Status::Revoked {
                    "revoked"
                } else {
                    "unknown"
                }
            ))),
        }
    }

    fn failed(&self, what: &str) -> String {
        format!(
            "{what} while requesting certificate status, responder: {}, peer: {}:{}, certificate: \"{}\"",
            self.responder.host,
            self.responder.host,
            self.responder.port,
            self.file
        )
    }
}

/// Ask the responder, within nginx's timeout; nginx's request: `GET /path/<base64, escaped> HTTP/1.0` with Host; the body of a
/// 200 answer of type application/ocsp-response.
pub async fn fetch(
    r: &Responder,
    resolver: Option<&(Arc<Resolver>, Duration)>,
    system_resolver: bool,
    req: &[u8],
    failed: &dyn Fn(&str) -> String,
) -> Result<Vec<u8>, String> {
    tokio::time::timeout(TIMEOUT, exchange(r, resolver, system_resolver, req, failed))
        .await
        .map_err(|_| failed("OCSP responder timed out"))?
}

async fn exchange(
    r: &Responder,
    resolver: Option<&(Arc<Resolver>, Duration)>,
    system_resolver: bool,
    req: &[u8],
    failed: &dyn Fn(&str) -> String,
) -> Result<Vec<u8>, String> {
    let b64 = data_encoding::BASE64.encode(req);
    let mut path = r.path.clone();
    if !path.ends_with('/') {
        path.push('/');
    }
    for ch in b64.chars() {
        match ch {
            '+' => path.push_str("%2B"),
            '/' => path.push_str("%2F"),
            '=' => path.push_str("%3D"),
            c => path.push(c),
        }
    }
    let literal = crate::resolver::is_literal(&r.host);
    let addrs: Vec<std::net::SocketAddr> = match resolver {
        Some((res, timeout)) if !literal => res
            .lookup(&r.host, *timeout)
            .await
            .map_err(|f| failed(&format!("{} could not be resolved ({f})", r.host)))?
            .0
            .into_iter()
            .map(|ip| (ip, r.port).into())
            .collect(),
        // nginx's ssl_ocsp resolves a certificate's responder only with `resolver`.
        None if !literal && !system_resolver => {
            return Err(failed(&format!(
                "no resolver defined to resolve {}",
                r.host
            )))
        }
        _ => tokio::net::lookup_host((r.host.as_str(), r.port))
            .await
            .map_err(|_| {
                failed(&format!(
                    "{} could not be resolved (3: Host not found)",
                    r.host
                ))
            })?
            .collect(),
    };
    let mut s = tokio::net::TcpStream::connect(&addrs[..])
        .await
        .map_err(|e| {
            failed(&format!(
                "connect() failed ({})",
                crate::errlog::errno_text(&e)
            ))
        })?;
    let head = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", r.host);
    s.write_all(head.as_bytes()).await.map_err(|e| {
        failed(&format!(
            "send() failed ({})",
            crate::errlog::errno_text(&e)
        ))
    })?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await.map_err(|e| {
        failed(&format!(
            "recv() failed ({})",
            crate::errlog::errno_text(&e)
        ))
    })?;
    // Lines end in CRLF or, as nginx's parser also takes, a bare LF.
    let (end, sep) = match (
        memchr::memmem::find(&resp, b"\r\n\r\n"),
        memchr::memmem::find(&resp, b"\n\n"),
    ) {
        (Some(a), Some(b)) if b < a => (b, 2),
        (Some(a), _) => (a, 4),
        (None, Some(b)) => (b, 2),
        (None, None) if resp.is_empty() => {
            return Err(failed("OCSP responder prematurely closed connection"))
        }
        (None, None) => return Err(failed("OCSP responder sent invalid response")),
    };
    let head = String::from_utf8_lossy(&resp[..end]).into_owned();
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default();
    let code = status.split(' ').nth(1).unwrap_or_default();
    if code != "200" {
        return Err(failed(&format!(
            "OCSP responder sent invalid response, status: {status}"
        )));
    }
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-type")
                && !v.eq_ignore_ascii_case("application/ocsp-response")
            {
                return Err(failed(&format!(
                    "OCSP responder sent invalid \"Content-Type\" header: \"{v}\""
                )));
            }
        }
    }
    Ok(resp[end + sep..].to_vec())
}

/// OCSP_basic_verify: the response is signed by the certificate's issuer or a responder
/// it delegated to (one the response carries, or one of `chain`), which chains up to
/// the `anchors`. With `trust_other` (nginx's stapling passes OCSP_TRUSTOTHER) a signer
/// among `chain`, the certificates served with this one, is trusted as it is.
pub fn signer_trusted(
    basic: &BasicOcspResponse,
    anchors: &[Certificate],
    chain: &[Certificate],
    issuer: &Certificate,
    trust_other: bool,
) -> bool {
    let Ok(tbs) = basic.tbs_response_data.to_der() else {
        return false;
    };
    let Some(sig) = basic.signature.as_bytes() else {
        return false;
    };
    // nginx passes OCSP_TRUSTOTHER: a signer among the certificates served with this one
    // is trusted as it is.
    if trust_other
        && chain
            .iter()
            .any(|c| signed(c, &basic.signature_algorithm, &tbs, sig))
    {
        return true;
    }
    let carried = basic.certs.as_deref().unwrap_or_default();
    let candidates = carried.iter().chain(chain).chain(std::iter::once(issuer));
    let Some(signer) = candidates
        .into_iter()
        .find(|c| signed(c, &basic.signature_algorithm, &tbs, sig))
    else {
        return false;
    };
    // RFC 6960 4.2.2.2: the issuer itself, or a responder it delegated to.
    if signer != issuer && !delegated(issuer, signer) {
        return false;
    }
    // Up the chain to an anchor (a few steps at most).
    let pool: Vec<&Certificate> = anchors
        .iter()
        .chain(chain)
        .chain(carried)
        .chain([issuer])
        .collect();
    let mut cur = signer.clone();
    for _ in 0..4 {
        if anchors.contains(&cur) {
            return true;
        }
        let Ok(tbs) = cur.tbs_certificate.to_der() else {
            return false;
        };
        let Some(sig) = cur.signature.as_bytes() else {
            return false;
        };
        let parent = pool.iter().find(|p| {
            p.tbs_certificate.subject == cur.tbs_certificate.issuer
                && **p != &cur
                && signed(p, &cur.signature_algorithm, &tbs, sig)
        });
        match parent {
            Some(p) => cur = (*p).clone(),
            None => return false,
        }
    }
    false
}

/// A certificate `issuer` signed for OCSP signing (extended key usage id-kp-OCSPSigning).
fn delegated(issuer: &Certificate, c: &Certificate) -> bool {
    use x509_cert::ext::pkix::ExtendedKeyUsage;
    let (Ok(tbs), Some(sig)) = (c.tbs_certificate.to_der(), c.signature.as_bytes()) else {
        return false;
    };
    let eku = c
        .tbs_certificate
        .extensions
        .iter()
        .flatten()
        .find(|e| e.extn_id.to_string() == EKU)
        .and_then(|e| ExtendedKeyUsage::from_der(e.extn_value.as_bytes()).ok());
    c.tbs_certificate.issuer == issuer.tbs_certificate.subject
        && eku.is_some_and(|u| u.0.iter().any(|o| o.to_string() == OCSP_SIGNING))
        && signed(issuer, &c.signature_algorithm, &tbs, sig)
}

/// Whether `signer`'s key made `sig` over `msg` with the algorithm named.
fn signed(
    signer: &Certificate,
    alg: &x509_cert::spki::AlgorithmIdentifierOwned,
    msg: &[u8],
    sig: &[u8],
) -> bool {
    let (Ok(der), Ok(alg_der)) = (signer.to_der(), alg.to_der()) else {
        return false;
    };
    // The algorithm identifier's contents, without its SEQUENCE header, as webpki names them.
    let Ok(seq) = der::asn1::AnyRef::from_der(&alg_der) else {
        return false;
    };
    let cert = CertificateDer::from(der);
    let Ok(ee) = webpki::EndEntityCert::try_from(&cert) else {
        return false;
    };
    rustls::crypto::aws_lc_rs::default_provider()
        .signature_verification_algorithms
        .all
        .iter()
        .filter(|a| a.signature_alg_id().as_ref() == seq.value())
        .any(|a| ee.verify_signature(*a, msg, sig).is_ok())
}

/// Start every stapler's task (on one worker: the certificates are shared).
pub fn spawn_all(staplers: &[Arc<Stapler>]) -> Vec<tokio::task::JoinHandle<()>> {
    staplers
        .iter()
        .map(|s| tokio::task::spawn_local(s.clone().run()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Responder;

    #[test]
    fn responder_urls() {
        let r = Responder::parse("http://[::1]/ocsp").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("::1", 80, "/ocsp")
        );
        let r = Responder::parse("HTTP://[::1]:8081").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("::1", 8081, "/")
        );
        let r = Responder::parse("http://ocsp.example:81/a/b").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("ocsp.example", 81, "/a/b")
        );
        assert!(Responder::parse("https://ocsp.example/")
            .unwrap_err()
            .starts_with("invalid URL prefix"));
        assert!(Responder::parse("http://:80/").is_err());
        assert!(Responder::parse("http://h:x/").is_err());
    }
}
