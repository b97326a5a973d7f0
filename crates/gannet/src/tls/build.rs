//! From a server's merged TLS settings to its rustls `ServerConfig`, at load time, so that
//! every problem with a certificate, key, CA or stapling file is a config error naming the
//! file (and `gannet -t` finds it).

use super::certs::{self, load_chain, load_key};
use super::crl::Crls;
use super::resolve::KeyPairs;
use super::session::{rotating_keys, TimedCache, TimedTickets};
use super::stapling;
use super::verify::{ClientRoots, DeferredVerifier};
use super::ServerTls;
use crate::modules::tls::{FileArg, SessionCache, TlsConf, VerifyClient};
use crate::modules::LoadCtx;
use gannet_conf::{ConfError, Loc};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::server::{
    NoServerSessionStorage, ProducesTickets, ServerSessionMemoryCache, StoresServerSessions,
    WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::DistinguishedName;
use rustls::{CipherSuite, NamedGroup, RootCertStore, ServerConfig, SupportedProtocolVersion};
use std::collections::HashMap;
use std::sync::Arc;

/// What the servers of one configuration share: the `shared:NAME` session caches and the
/// ticket keys (one rotating set per timeout value).
#[derive(Default)]
pub struct LoadState {
    caches: HashMap<String, Arc<ServerSessionMemoryCache>>,
    ticket_keys: HashMap<u64, Arc<dyn ProducesTickets>>,
    /// Upstream client setups by their settings (see `client::build`), so the locations
    /// that inherit the same `proxy_ssl_*` share one.
    pub(super) clients: HashMap<String, Arc<super::client::ClientTls>>,
    /// The certificates stapled from their OCSP responders (`tls::stapling`).
    pub staplers: Vec<Arc<super::stapling::Stapler>>,
    /// The `ssl_ocsp_cache shared:NAME` caches.
    ocsp_caches: HashMap<String, Arc<super::ocsp::Cache>>,
}

fn err(loc: &Loc, msg: impl std::fmt::Display) -> ConfError {
    ConfError::at(loc, msg)
}

/// The server's TLS setup, or `None` when it has no certificate (and does not reject
/// handshakes). `at` is the server block, for errors that belong to no one directive.
pub fn build_server(
    c: &TlsConf,
    h2: bool,
    lctx: &mut LoadCtx,
    at: &Loc,
) -> Result<Option<Arc<ServerTls>>, ConfError> {
    let certs = c.certificates.as_deref().unwrap_or_default();
    if certs.is_empty() {
        return Ok(c.reject_handshake().then(|| {
            Arc::new(ServerTls {
                config: None,
                verify: VerifyClient::Off,
                roots: None,
                ocsp: None,
                reject_handshake: true,
            })
        }));
    }
    let keys = c.keys.as_deref().unwrap_or_default();
    let provider = Arc::new(provider(c.ciphers.as_deref(), c.ecdh_curves.as_deref()));
    let mut pairs = Vec::new();
    let mut staples = Vec::new();
    let trusted = match (&c.stapling, &c.stapling_file, &c.trusted_certificate) {
        (Some((true, _)), None, Some(f)) => load_chain(f, "trusted certificate")?,
        _ => Vec::new(),
    };
    for (i, cert_file) in certs.iter().enumerate() {
        if crate::acme::names_variable(&cert_file.path) {
            // `ssl_certificate $acme_certificate`: the certificate comes later, into the
            // slot the resolver reads (see `crate::acme`). In a server without
            // `acme_certificate` the variable is empty, as nginx-acme's: no certificate,
            // its handshakes are refused.
            continue;
        }
        let key_file = keys.get(i).ok_or_else(|| {
            err(
                &cert_file.loc,
                format!(
                    "no \"ssl_certificate_key\" is defined for certificate \"{}\"",
                    cert_file.path.display()
                ),
            )
        })?;
        let chain = load_chain(cert_file, "certificate")?;
        // Expired or not yet valid: loaded anyway, as nginx does (a restart on the day a
        // renewal failed must not take every site of the server down), with a warning.
        if let Some(w) = certs::validity_warning(cert_file, &chain[0])? {
            lctx.warnings.push(w);
        }
        let key = load_key(key_file, c.password_file.as_deref())?;
        let signer = provider.key_provider.load_private_key(key).map_err(|e| {
            err(
                &key_file.loc,
                format!(
                    "cannot load certificate key \"{}\": {e}",
                    key_file.path.display()
                ),
            )
        })?;
        let mut ck = CertifiedKey::new(chain, signer);
        if !certs::key_matches(&ck) {
            return Err(err(
                &key_file.loc,
                format!(
                    "certificate key \"{}\" does not match certificate \"{}\"",
                    key_file.path.display(),
                    cert_file.path.display()
                ),
            ));
        }
        ck.ocsp = stapled(c)?;
        let ck = Arc::new(ck);
        let queried = matches!((&c.stapling, &c.stapling_file), (Some((true, _)), None));
        let stapler = if queried {
            let made = stapling::setup(
                ck.clone(),
                &trusted,
                c.stapling_responder.as_deref(),
                c.stapling_verify.unwrap_or(false),
                c.resolver.clone(),
                &cert_file.path.display().to_string(),
            );
            match made {
                Ok(s) => {
                    lctx.tls.staplers.push(s.clone());
                    Some(s)
                }
                Err(w) => {
                    lctx.warnings.push(w);
                    None
                }
            }
        } else {
            None
        };
        staples.push(stapler);
        pairs.push(ck);
    }
    let protocols = c.protocols();
    let mut versions: Vec<&'static SupportedProtocolVersion> = Vec::new();
    if protocols.tls13 {
        versions.push(&rustls::version::TLS13);
    }
    if protocols.tls12 {
        versions.push(&rustls::version::TLS12);
    }
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| err(at, format!("TLS setup failed: {e}")))?;
    let verify = c.verify_client();
    let roots = client_roots(c, &provider, at)?;
    let builder = if verify == VerifyClient::Off {
        builder.with_no_client_auth()
    } else {
        let algs = provider.signature_verification_algorithms;
        builder.with_client_cert_verifier(Arc::new(DeferredVerifier::new(roots.as_ref(), algs)))
    };
    let mut config = builder.with_cert_resolver(Arc::new(KeyPairs {
        keys: pairs,
        staples,
        acme: c.acme.clone(),
        acme_serves: certs.iter().any(|f| crate::acme::names_variable(&f.path)),
        suites: provider.cipher_suites.clone(),
    }));
    config.ignore_client_order = c.prefer_server_ciphers.unwrap_or(false);
    // A client offering ALPN with none of these is refused, as nginx does.
    config.alpn_protocols = if h2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    if c.acme.is_some() {
        config
            .alpn_protocols
            .push(crate::acme::ACME_TLS_ALPN.to_vec());
    }
    let timeout = c.session_timeout().as_secs();
    config.session_storage = sessions(c, &mut lctx.tls, timeout);
    if c.session_tickets() {
        let keys = match lctx.tls.ticket_keys.get(&timeout) {
            Some(k) => k.clone(),
            None => {
                let k = rotating_keys(timeout)
                    .map_err(|e| err(at, format!("cannot make session ticket keys: {e}")))?;
                lctx.tls.ticket_keys.insert(timeout, k.clone());
                k
            }
        };
        config.ticketer = Arc::new(TimedTickets::new(keys, timeout));
    } else if !config.session_storage.can_cache() {
        // Neither tickets nor a cache: a TLS 1.3 ticket could never be honoured.
        config.send_tls13_tickets = 0;
    }
    let ocsp = client_ocsp(c, verify, &mut lctx.tls)?;
    Ok(Some(Arc::new(ServerTls {
        config: Some(Arc::new(config)),
        verify,
        roots,
        ocsp,
        reject_handshake: c.reject_handshake(),
    })))
}

/// rustls's aws-lc-rs provider, offering the suites `ssl_ciphers` chose (TLS 1.2) and every
/// TLS 1.3 suite, and the groups `ssl_ecdh_curve` chose.
pub(super) fn provider(
    ciphers: Option<&[CipherSuite]>,
    curves: Option<&[NamedGroup]>,
) -> CryptoProvider {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    if let Some(chosen) = curves {
        let all = std::mem::take(&mut p.kx_groups);
        p.kx_groups = chosen
            .iter()
            .filter_map(|n| all.iter().find(|g| g.name() == *n).copied())
            .collect();
    }
    if let Some(chosen) = ciphers {
        let all = std::mem::take(&mut p.cipher_suites);
        let tls13 = all.iter().filter(|s| s.tls13().is_some()).copied();
        let tls12 = chosen
            .iter()
            .filter_map(|id| all.iter().find(|s| s.suite() == *id).copied());
        p.cipher_suites = tls13.chain(tls12).collect();
    }
    p
}

/// The OCSP response to staple from `ssl_stapling_file` (without one, `stapling` queries
/// the responder).
fn stapled(c: &TlsConf) -> Result<Option<Vec<u8>>, ConfError> {
    let (Some((true, _)), Some(f)) = (&c.stapling, &c.stapling_file) else {
        return Ok(None);
    };
    let der = std::fs::read(&f.path).map_err(|e| {
        err(
            &f.loc,
            format!("cannot open OCSP response \"{}\": {e}", f.path.display()),
        )
    })?;
    if der.is_empty() {
        return Err(err(
            &f.loc,
            format!("OCSP response \"{}\" is empty", f.path.display()),
        ));
    }
    Ok(Some(der))
}

/// The CA certificates of a file, into `store`.
/// Returns the certificates added.
pub(super) fn add_cas(
    store: &mut RootCertStore,
    f: &FileArg,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, ConfError> {
    let cas = load_chain(f, what)?;
    for ca in cas.iter().cloned() {
        store.add(ca).map_err(|e| {
            err(
                &f.loc,
                format!("cannot use CA certificate in \"{}\": {e}", f.path.display()),
            )
        })?;
    }
    Ok(cas)
}

/// rustls's webpki verifier, which judges client chains: trusting the CAs of
/// `ssl_client_certificate` (named to clients) and `ssl_trusted_certificate` (not named),
/// checking revocation against `ssl_crl`.
fn client_roots(
    c: &TlsConf,
    provider: &Arc<CryptoProvider>,
    at: &Loc,
) -> Result<Option<ClientRoots>, ConfError> {
    let verify = c.verify_client();
    if verify == VerifyClient::Off {
        return Ok(None);
    }
    let mut named = RootCertStore::empty();
    let mut trusted = Vec::new();
    if let Some(f) = &c.client_certificate {
        trusted = add_cas(&mut named, f, "client certificate")?;
    }
    let mut store = named.clone();
    if let Some(f) = &c.trusted_certificate {
        trusted.extend(add_cas(&mut store, f, "trusted certificate")?);
    }
    if store.is_empty() {
        if matches!(verify, VerifyClient::On | VerifyClient::Optional) {
            let loc = c.verify_client.as_ref().map_or(at, |v| &v.1);
            return Err(err(
                loc,
                "no ssl_client_certificate or ssl_trusted_certificate for ssl_verify_client",
            ));
        }
        return Ok(None);
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider.clone())
        .clear_root_hint_subjects()
        .add_root_hint_subjects(distinct(named.subjects()))
        .allow_unauthenticated();
    let verifier = builder
        .build()
        .map_err(|e| err(at, format!("cannot verify clients: {e}")))?;
    // Revocation is checked apart from webpki (see `tls::crl`).
    let crls = c.crl.as_ref().map(Crls::load).transpose()?;
    Ok(Some(ClientRoots {
        verifier,
        trusted,
        crls,
        depth: c.verify_depth(),
    }))
}

/// `ssl_ocsp on|leaf` with `ssl_verify_client`: how client chains' OCSP status is asked.
fn client_ocsp(
    c: &TlsConf,
    verify: VerifyClient,
    state: &mut LoadState,
) -> Result<Option<Arc<super::ocsp::ClientOcsp>>, ConfError> {
    let Some((Some(mode), loc)) = &c.ocsp else {
        return Ok(None);
    };
    if verify == VerifyClient::OptionalNoCa {
        return Err(err(
            loc,
            "\"ssl_ocsp\" is incompatible with \"ssl_verify_client optional_no_ca\"",
        ));
    }
    let responder = match &c.ocsp_responder {
        Some((url, at)) => Some(
            super::stapling::Responder::parse(url)
                .map_err(|e| err(at, format!("{e} in \"ssl_ocsp_responder\"")))?,
        ),
        None => None,
    };
    if verify == VerifyClient::Off {
        return Ok(None);
    }
    let cache = match &c.ocsp_cache {
        Some(Some((name, bytes))) => Some(
            state
                .ocsp_caches
                .entry(name.clone())
                .or_insert_with(|| Arc::new(super::ocsp::Cache::new(*bytes)))
                .clone(),
        ),
        _ => None,
    };
    Ok(Some(Arc::new(super::ocsp::ClientOcsp {
        mode: *mode,
        responder,
        cache,
        resolver: c.resolver.clone(),
    })))
}

/// The CA names, each once (a file may hold the same CA twice; OpenSSL's list is unique).
fn distinct(mut names: Vec<DistinguishedName>) -> Vec<DistinguishedName> {
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.as_ref().to_vec()));
    names
}

fn sessions(c: &TlsConf, state: &mut LoadState, timeout: u64) -> Arc<dyn StoresServerSessions> {
    match c.session_cache() {
        SessionCache::Off | SessionCache::None => Arc::new(NoServerSessionStorage {}),
        SessionCache::Builtin(n) => {
            Arc::new(TimedCache::new(ServerSessionMemoryCache::new(n), timeout))
        }
        SessionCache::Shared { name, sessions } => {
            let shared = state
                .caches
                .entry(name)
                .or_insert_with(|| ServerSessionMemoryCache::new(sessions))
                .clone();
            Arc::new(TimedCache::new(shared, timeout))
        }
    }
}
