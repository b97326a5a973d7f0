//! Automatic HTTPS with ACME (RFC 8555), for nginx's `ngx_http_acme_module` directives
//! (`modules::acme` reads them): each `acme_certificate` becomes a [`Cert`] whose current
//! certificate sits in a [`Slot`] that the server's certificate resolver reads at every
//! handshake (`tls::resolve`), so a certificate obtained or renewed in the background is
//! served by every worker thread at once, without a reload and without touching open
//! connections. An empty slot refuses the handshake, as nginx-acme does.
//!
//! The protocol is the `instant-acme` crate's (JWS on aws-lc-rs, the crypto rustls uses
//! here); `client` runs the account and order state machine (renewal in the CA's ARI
//! window, RFC 9773, else at two thirds of the lifetime), `store` keeps the account key
//! and the certificates under `state_path` so a restart reuses them (or in Redis, with
//! an order lock, so that of several nodes one orders and all serve it). HTTP-01 challenges
//! are answered from [`Acme::answer`] on every GET for a pending token, whatever the
//! locations of the server say; TLS-ALPN-01 validation handshakes get their certificate
//! from [`Slot::validation`].

mod account_key;
mod chain;
mod client;
pub mod store;

use crate::http::response::{Body, Response};
use gannet_conf::{ConfError, Loc};
use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// Whether a certificate path is `$acme_certificate` (`ssl_certificate`) or
/// `$acme_certificate_key` (`ssl_certificate_key`), read as paths under the prefix.
pub fn names_variable(path: &std::path::Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "$acme_certificate" || n == "$acme_certificate_key")
}

/// Whether an account key file holds a key gannet can sign with (other than P-256, which
/// the ACME crate loads itself).
pub fn account_key_type(pem: &[u8]) -> Result<(), String> {
    account_key::AccountKey::from_pem(pem).map(|_| ())
}

/// A generated certificate key: `key=ecdsa:256` (the default) ... `key=rsa:4096`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyAlg {
    Ecdsa(u16),
    Rsa(u16),
}

impl KeyAlg {
    /// `alg[:size]` as nginx-acme reads it.
    pub fn parse(s: &str) -> Option<KeyAlg> {
        let (alg, size) = match s.split_once(':') {
            Some((a, n)) => (a, Some(n.parse::<u16>().ok()?)),
            None => (s, None),
        };
        match (alg, size) {
            ("ecdsa", None | Some(256)) => Some(KeyAlg::Ecdsa(256)),
            ("ecdsa", Some(n @ (384 | 521))) => Some(KeyAlg::Ecdsa(n)),
            ("rsa", None) => Some(KeyAlg::Rsa(2048)),
            ("rsa", Some(n @ (2048 | 3072 | 4096))) => Some(KeyAlg::Rsa(n)),
            _ => None,
        }
    }
}

impl std::fmt::Display for KeyAlg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyAlg::Ecdsa(n) => write!(f, "ecdsa:{n}"),
            KeyAlg::Rsa(n) => write!(f, "rsa:{n}"),
        }
    }
}

/// An `acme_issuer` block.
#[derive(Debug)]
pub struct Issuer {
    pub name: String,
    pub uri: String,
    /// `account_key FILE`: an existing key's PEM, read as the config loads (else one is
    /// generated and kept in the state directory).
    pub account_key: Option<Vec<u8>>,
    /// `account_key ALG[:SIZE]`: the type of the key generated (ecdsa:256 by default).
    pub account_key_alg: KeyAlg,
    pub contacts: Vec<String>,
    /// `state_path`: a directory, a Redis server, or nothing (`off`).
    pub store: store::Store,
    pub accept_tos: bool,
    /// `ssl_trusted_certificate` (else the system's CAs).
    pub trusted: Option<crate::modules::tls::FileArg>,
    /// `ssl_verify` (on): whether the CA's HTTPS certificate is verified.
    pub verify: bool,
    /// `external_account_key KID FILE|data:KEY`: the key ID and the decoded MAC key.
    pub eab: Option<(String, Vec<u8>)>,
    /// `profile NAME [require]`: the name, and whether a CA without it is an error.
    pub profile: Option<(String, bool)>,
    /// `preferred_chain NAME`: the alternate chain whose top was issued by this CN.
    pub preferred_chain: Option<String>,
    /// `common_name_in_csr on`: the first name is also the CSR's subject CN.
    pub common_name_in_csr: bool,
    pub challenge: Challenge,
    /// `renewal_check TIME` (gannet's own): the longest wait between two looks at the CA's
    /// renewal information, so a revoked certificate (whose window the CA moves into the
    /// past) is replaced within it whatever Retry-After the CA answers.
    pub renewal_check: std::time::Duration,
}

/// `renewal_check`'s default: RFC 9773's usual Retry-After, six hours.
pub const RENEWAL_CHECK: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// The challenge kind an issuer validates with (`challenge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Challenge {
    Http01,
    /// RFC 8737: a self-signed certificate naming the key authorization's digest, served
    /// to handshakes that offer only ALPN `acme-tls/1`.
    TlsAlpn01,
}

/// The ALPN protocol of TLS-ALPN-01 validation handshakes.
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The challenges being validated, shared by the worker threads: HTTP-01 tokens with
/// their key authorizations, TLS-ALPN-01 certificates by name.
#[derive(Debug, Default)]
struct Challenges {
    http: RwLock<HashMap<String, String>>,
    tls: RwLock<HashMap<String, Arc<CertifiedKey>>>,
}

/// The certificate a server serves, swapped in place when a new one arrives.
#[derive(Debug)]
pub struct Slot {
    current: RwLock<Option<Current>>,
    challenges: Arc<Challenges>,
}

#[derive(Debug, Clone)]
struct Current {
    key: Arc<CertifiedKey>,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Slot {
    /// What the handshake gets: `None` (refused) until a certificate exists.
    pub fn get(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .ok()
            .and_then(|c| c.as_ref().map(|c| c.key.clone()))
    }

    /// The TLS-ALPN-01 validation certificate for this SNI name, if one is pending.
    pub fn validation(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let m = self.challenges.tls.read().ok()?;
        m.get(&name.to_ascii_lowercase()).cloned()
    }

    fn set(&self, c: Current) {
        if let Ok(mut g) = self.current.write() {
            *g = Some(c);
        }
    }

    /// When the certificate should be renewed: at two thirds of its lifetime (`None`: there
    /// is none yet).
    fn renew_at(&self) -> Option<SystemTime> {
        let g = self.current.read().ok()?;
        let c = g.as_ref()?;
        let life = c.not_after.duration_since(c.not_before).unwrap_or_default();
        Some(c.not_before + life * 2 / 3)
    }
}

/// One `acme_certificate` (servers asking for the same names, key and issuer share it).
#[derive(Debug)]
pub struct Cert {
    pub issuer: Arc<Issuer>,
    pub identifiers: Vec<String>,
    pub key: KeyAlg,
    pub slot: Arc<Slot>,
}

impl Cert {
    /// The first DNS name, else the first identifier (an address), as nginx-acme picks it.
    pub fn first_name(&self) -> &str {
        self.identifiers
            .iter()
            .find(|i| i.parse::<std::net::IpAddr>().is_err())
            .or(self.identifiers.first())
            .map_or("", |s| s.as_str())
    }

    /// The file name stem in the state directory: the first DNS name (else the first
    /// identifier) and a hash of the identifiers and key type, as nginx-acme names them.
    pub fn stem(&self) -> String {
        let first = self.first_name();
        let mut h = crc32fast::Hasher::new();
        for i in &self.identifiers {
            h.update(i.as_bytes());
            h.update(b"\0");
        }
        h.update(self.key.to_string().as_bytes());
        format!("{}-{:08x}", first.replace(':', "_"), h.finalize())
    }
}

/// What the configuration's ACME setup shares between the worker threads.
#[derive(Debug, Default)]
pub struct Acme {
    pub certs: Vec<Arc<Cert>>,
    challenges: Arc<Challenges>,
}

const CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

impl Acme {
    /// The answer to an HTTP-01 validation request, if `path` asks for a pending token.
    pub fn answer(&self, path: &str) -> Option<Response> {
        let token = path.strip_prefix(CHALLENGE_PREFIX)?;
        let body = self.challenges.http.read().ok()?.get(token)?.clone();
        let mut r = Response::new(200);
        r.content_type = Some(Arc::from("text/plain"));
        r.body = Body::bytes(body);
        // As nginx-acme: the validation is the connection's only business.
        r.close = true;
        Some(r)
    }

    fn add_challenge(&self, token: &str, key_auth: &str) {
        if let Ok(mut m) = self.challenges.http.write() {
            m.insert(token.to_string(), key_auth.to_string());
        }
    }

    fn remove_challenge(&self, token: &str) {
        if let Ok(mut m) = self.challenges.http.write() {
            m.remove(token);
        }
    }

    fn add_validation_cert(&self, name: &str, ck: Arc<CertifiedKey>) {
        if let Ok(mut m) = self.challenges.tls.write() {
            m.insert(name.to_ascii_lowercase(), ck);
        }
    }

    fn remove_validation_cert(&self, name: &str) {
        if let Ok(mut m) = self.challenges.tls.write() {
            m.remove(&name.to_ascii_lowercase());
        }
    }
}

/// Start obtaining and renewing the certificates: called on one worker thread only, so
/// that each certificate is ordered once (the others read the same slots).
pub fn spawn(acme: &Arc<Acme>) {
    let mut accounts: HashMap<String, Arc<client::AccountCell>> = HashMap::new();
    for cert in &acme.certs {
        if !accounts.contains_key(&cert.issuer.name) {
            if let Some((server, channel)) = cert.issuer.store.challenge_channel() {
                tokio::task::spawn_local(follow_challenges(acme.clone(), server, channel));
            }
        }
        let account = accounts
            .entry(cert.issuer.name.clone())
            .or_insert_with(|| Arc::new(client::AccountCell::new(cert.issuer.clone())))
            .clone();
        tokio::task::spawn_local(client::run(acme.clone(), cert.clone(), account));
    }
}

/// Answer the HTTP-01 tokens the other nodes sharing the store are validated with (their
/// messages: `TOKEN KEYAUTH` to answer, `TOKEN` to stop).
async fn follow_challenges(
    acme: Arc<Acme>,
    server: Arc<crate::modules::redis::Server>,
    channel: String,
) {
    let acks = server.clone();
    server
        .subscribe(&channel, |msg| {
            let msg = String::from_utf8_lossy(&msg);
            match msg.split_once(' ') {
                Some((token, key_auth)) => {
                    acme.add_challenge(token, key_auth);
                    // Say so: the ordering node waits for every node before the CA asks.
                    let (server, key) = (acks.clone(), seen_key(&channel, token));
                    tokio::task::spawn_local(async move {
                        let mut incr = redis::cmd("INCR");
                        incr.arg(&key);
                        let mut expire = redis::cmd("EXPIRE");
                        expire.arg(&key).arg(600);
                        if server.query::<i64>(&incr).await.is_ok() {
                            let _ = server.query::<i64>(&expire).await;
                        }
                    });
                }
                None => acme.remove_challenge(&msg),
            }
        })
        .await;
}

/// The counter of the nodes that have taken `token` (see `follow_challenges`).
pub(crate) fn seen_key(channel: &str, token: &str) -> String {
    format!("{channel}:seen:{token}")
}

/// An `acme_certificate` as read: issuer name, where it was written, identifiers, key type,
/// and the slot its servers serve from.
#[derive(Debug)]
struct Pending {
    issuer: String,
    at: Loc,
    identifiers: Vec<String>,
    key: KeyAlg,
    slot: Arc<Slot>,
}

/// What `modules::acme` gathers while the config loads.
#[derive(Debug, Default)]
pub struct Registry {
    pub issuers: HashMap<String, Arc<Issuer>>,
    orders: Vec<Pending>,
    challenges: Arc<Challenges>,
}

impl Registry {
    /// The slot for a server's certificate (shared with an earlier server asking for the
    /// same one).
    pub fn slot(&mut self, issuer: &str, at: &Loc, ids: Vec<String>, key: KeyAlg) -> Arc<Slot> {
        if let Some(o) = self
            .orders
            .iter()
            .find(|o| o.issuer == issuer && o.identifiers == ids && o.key == key)
        {
            return o.slot.clone();
        }
        let slot = Arc::new(Slot {
            current: RwLock::default(),
            challenges: self.challenges.clone(),
        });
        self.orders.push(Pending {
            issuer: issuer.to_string(),
            at: at.clone(),
            identifiers: ids,
            key,
            slot: slot.clone(),
        });
        slot
    }

    /// At the end of the load: every issuer named exists; the certificates kept in the
    /// state directories are loaded into their slots.
    pub fn finish(self, warnings: &mut Vec<String>) -> Result<Option<Arc<Acme>>, ConfError> {
        if self.orders.is_empty() {
            return Ok(None);
        }
        let mut certs = Vec::new();
        for o in self.orders {
            let issuer = self.issuers.get(&o.issuer).ok_or_else(|| {
                ConfError::at(&o.at, format!("issuer \"{}\" is missing", o.issuer))
            })?;
            let cert = Cert {
                issuer: issuer.clone(),
                identifiers: o.identifiers,
                key: o.key,
                slot: o.slot,
            };
            match store::load_cert_now(&cert) {
                Ok(Some(c)) => cert.slot.set(c),
                Ok(None) => {}
                Err(e) => warnings.push(format!(
                    "acme: cannot use the stored certificate of \"{}\": {e}",
                    cert.identifiers.join(" ")
                )),
            }
            certs.push(Arc::new(cert));
        }
        Ok(Some(Arc::new(Acme {
            certs,
            challenges: self.challenges,
        })))
    }
}
