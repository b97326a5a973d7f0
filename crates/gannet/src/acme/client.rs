//! The ACME state machine of one certificate: account (created once per issuer, then
//! restored from the state directory), order, HTTP-01 authorizations, finalization with a
//! CSR for a key generated here, download; then sleep until two thirds of the lifetime and
//! renew. Failures are logged and retried with a doubling back-off.

use super::{account_key, chain, store, Acme, Cert, Challenge, Issuer, KeyAlg};
use crate::errlog;
use instant_acme::{
    Account, AuthorizationStatus, BodyWrapper, CertificateIdentifier, ChallengeType,
    ExternalAccountKey, Identifier, Key, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The first retry after a failure; doubled after each one, up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The longest one order may take, all its requests and polls together (a CA that
/// accepts connections and never answers must not stop the renewals for good).
const ORDER_TIMEOUT: Duration = Duration::from_secs(600);
/// The lower bound on the Retry-After of the CA's renewal information (RFC 9773 4.3.3
/// suggests a client clamp it); the upper one is the issuer's `renewal_check`.
const ARI_MIN_RECHECK: Duration = Duration::from_secs(60);

type Error = Box<dyn std::error::Error + Send + Sync>;

/// An issuer's account, made on first use and shared by its certificates.
pub struct AccountCell {
    issuer: Arc<Issuer>,
    account: tokio::sync::Mutex<Option<Account>>,
    /// What the account's HTTP client noted (`preferred_chain`).
    links: Arc<chain::Links>,
}

impl AccountCell {
    pub fn new(issuer: Arc<Issuer>) -> AccountCell {
        AccountCell {
            issuer,
            account: tokio::sync::Mutex::new(None),
            links: Arc::default(),
        }
    }

    async fn get(&self) -> Result<Account, Error> {
        let mut g = self.account.lock().await;
        if let Some(a) = g.as_ref() {
            return Ok(a.clone());
        }
        let a = login(&self.issuer, &self.links).await?;
        *g = Some(a.clone());
        Ok(a)
    }
}

/// The HTTP client to the ACME server: rustls on aws-lc-rs, trusting
/// `ssl_trusted_certificate`'s CAs, or the system's.
fn http(
    issuer: &Issuer,
    links: &Arc<chain::Links>,
) -> Result<Box<dyn instant_acme::HttpClient>, Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let roots = match &issuer.trusted {
        Some(f) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in crate::tls::certs::load_chain(f, "trusted certificate")? {
                roots.add(ca)?;
            }
            Some(roots)
        }
        None => None,
    };
    let builder = if !issuer.verify {
        // `ssl_verify off`: the CA's certificate is not checked (a test CA, a private one).
        let any = Arc::new(crate::tls::client::AnyCertificate::new(&provider));
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(any)
            .with_no_client_auth();
        builder.with_tls_config(config)
    } else if let Some(roots) = roots {
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        builder.with_tls_config(config)
    } else {
        builder.with_provider_and_native_roots(provider)?
    };
    let connector = builder.https_only().enable_http1().build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, BodyWrapper<bytes::Bytes>>(connector);
    Ok(Box::new(chain::Tap {
        inner: Arc::new(client),
        links: links.clone(),
    }))
}

/// The issuer's account: restored from `account.key` and `account.url`, or found or made
/// with the key (`account_key FILE`, or the stored one), or made with a new key, kept.
async fn login(issuer: &Issuer, links: &Arc<chain::Links>) -> Result<Account, Error> {
    let store = &issuer.store;
    let own_key = issuer.account_key.is_none();
    let mut key_pem = match &issuer.account_key {
        Some(pem) => Some(pem.clone()),
        None => store.get(store::ACCOUNT_KEY).await?,
    };
    let url = match own_key {
        true => store
            .get(store::ACCOUNT_URL)
            .await?
            .and_then(|u| String::from_utf8(u).ok())
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty()),
        false => None,
    };
    let uri = issuer.uri.clone();
    // `account_key ecdsa:384` / `rsa:N`: a key of that type, made on first use.
    let mut generated = false;
    if key_pem.is_none() && issuer.account_key_alg != KeyAlg::Ecdsa(256) {
        key_pem = Some(account_key::generate(issuer.account_key_alg)?.into_bytes());
        generated = true;
    }
    let other = match &key_pem {
        Some(pem) => account_key::AccountKey::from_pem(pem)?,
        None => None,
    };
    if let (Some(key), Some(pem)) = (other, &key_pem) {
        // A key the crate cannot sign with: it signs with a throwaway P-256 key, and every
        // request is signed again with this one on its way out (see `account_key`).
        links.set_signer(Arc::new(key), issuer.eab.as_ref().map(|(_, k)| k.clone()));
        let (_, dummy) = Key::generate_pkcs8()?;
        if let Some(id) = url {
            let a = Account::builder_with_http(http(issuer, links)?)
                .from_parts(id, dummy, uri)
                .await?;
            return Ok(a);
        }
        let (a, _) = create(issuer, links, uri).await?;
        if own_key {
            let mut items = vec![(store::ACCOUNT_URL, a.id().as_bytes())];
            if generated {
                items.insert(0, (store::ACCOUNT_KEY, pem.as_slice()));
            }
            store.put(&items).await?;
        }
        return Ok(a);
    }
    if let Some(pem) = key_pem {
        let der = PrivatePkcs8KeyDer::from_pem_slice(&pem)
            .map_err(|e| format!("account key is not a PKCS#8 PEM key: {e}"))?;
        if let Some(id) = url {
            let a = Account::builder_with_http(http(issuer, links)?)
                .from_parts(id, der, uri)
                .await?;
            return Ok(a);
        }
        let key = Key::from_pkcs8_der(der.clone_key())?;
        let (a, _) = Account::builder_with_http(http(issuer, links)?)
            .create_from_key((key, PrivateKeyDer::Pkcs8(der)), uri)
            .await?;
        if own_key {
            store
                .put(&[(store::ACCOUNT_URL, a.id().as_bytes())])
                .await?;
        }
        return Ok(a);
    }
    let (a, creds) = create(issuer, links, uri).await?;
    let pem = rcgen::KeyPair::try_from(creds.private_key().secret_pkcs8_der())?.serialize_pem();
    store
        .put(&[
            (store::ACCOUNT_KEY, pem.as_bytes()),
            (store::ACCOUNT_URL, a.id().as_bytes()),
        ])
        .await?;
    Ok(a)
}

/// A new account (or the one the CA has for the key), with the issuer's contacts, terms
/// and external account binding.
async fn create(
    issuer: &Issuer,
    links: &Arc<chain::Links>,
    uri: String,
) -> Result<(Account, instant_acme::AccountCredentials), Error> {
    let contacts: Vec<&str> = issuer.contacts.iter().map(String::as_str).collect();
    let eab = issuer
        .eab
        .as_ref()
        .map(|(kid, key)| ExternalAccountKey::new(kid.clone(), key));
    let (a, creds) = Account::builder_with_http(http(issuer, links)?)
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: issuer.accept_tos,
                only_return_existing: false,
            },
            uri,
            eab.as_ref(),
        )
        .await?;
    errlog::notice(format_args!(
        "acme: account {} created with issuer \"{}\"",
        a.id(),
        issuer.name
    ));
    Ok((a, creds))
}

/// Obtain the certificate when there is none, renew it in the window the CA suggests
/// (ARI, RFC 9773) or else at two thirds of its lifetime; forever (the task ends with the
/// worker thread).
pub async fn run(acme: Arc<Acme>, cert: Arc<Cert>, account: Arc<AccountCell>) {
    let store = &cert.issuer.store;
    let names = cert.identifiers.join(" ");
    // A worker process restarted by the master has the slots of the config as loaded: a
    // certificate obtained since then is stored, not in them (and a Redis store is read
    // here only).
    if cert.slot.get().is_none() {
        match store::load_cert(&cert).await {
            Ok(Some(c)) => cert.slot.set(c),
            Ok(None) => {}
            Err(e) => errlog::error(format_args!(
                "acme: cannot read the certificate for \"{names}\" from {}: {e}",
                store.describe()
            )),
        }
    }
    if store.shared() {
        tokio::task::spawn_local(follow(cert.clone()));
    }
    let mut backoff = FIRST_BACKOFF;
    // The certificate the next order replaces (told to a CA that has ARI); none on the
    // retries after a failed order, in case the failure was the replacement itself.
    let mut replaces = None;
    loop {
        if backoff == FIRST_BACKOFF {
            let (judged, ari) = wait_for_renewal(&cert, &account).await;
            // Another node renewed it meanwhile (taken from the shared store): judge again.
            if judged.is_some() && judged != leaf_of(&cert) {
                continue;
            }
            replaces = judged.filter(|_| ari);
        }
        let attempt = tokio::time::timeout(
            ORDER_TIMEOUT,
            ordered(&acme, &cert, &account, replaces.take()),
        );
        let result = match attempt.await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {}s", ORDER_TIMEOUT.as_secs()).into()),
        };
        match result {
            Ok(issued) => {
                backoff = FIRST_BACKOFF;
                if issued {
                    errlog::notice(format_args!(
                        "acme: certificate for \"{names}\" issued by \"{}\"",
                        cert.issuer.name
                    ));
                }
            }
            Err(e) => {
                let what = match e.downcast_ref::<instant_acme::Error>() {
                    Some(instant_acme::Error::Api(p))
                        if p.r#type.as_deref()
                            == Some("urn:ietf:params:acme:error:rateLimited") =>
                    {
                        "rate limited by the ACME server"
                    }
                    _ => "failed",
                };
                errlog::error(format_args!(
                    "acme: certificate for \"{names}\" from \"{}\" {what}: {e}; retrying in {}s",
                    cert.issuer.name,
                    backoff.as_secs()
                ));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// How often a node looks in a shared store for a certificate another node ordered: while
/// that node holds the order lock, and between renewals.
const WAIT_POLL: Duration = Duration::from_secs(1);
const FOLLOW_POLL: Duration = Duration::from_secs(10);

/// The served leaf certificate, if any.
fn leaf_of(cert: &Cert) -> Option<CertificateDer<'static>> {
    cert.slot.get()?.cert.first().cloned()
}

/// Take the stored certificate when it is not the one served; whether it was.
async fn take_stored(cert: &Cert) -> bool {
    match store::load_cert(cert).await {
        Ok(Some(c)) if c.key.cert.first() != leaf_of(cert).as_ref() => {
            cert.slot.set(c);
            true
        }
        _ => false,
    }
}

/// With a shared store, serve the certificates the other nodes store, for ever.
async fn follow(cert: Arc<Cert>) {
    loop {
        tokio::time::sleep(FOLLOW_POLL).await;
        take_stored(&cert).await;
    }
}

/// Order under the store's lock (`true`: issued here); a node that does not get the lock
/// waits for the holder's certificate in the store instead (`false`).
async fn ordered(
    acme: &Acme,
    cert: &Cert,
    cell: &AccountCell,
    replaces: Option<CertificateDer<'static>>,
) -> Result<bool, Error> {
    let store = &cert.issuer.store;
    let lock = store::lock_name(cert);
    let unavailable = |e: String| format!("{} unavailable: {e}", store.describe());
    if !store
        .lock(&lock, ORDER_TIMEOUT)
        .await
        .map_err(unavailable)?
    {
        loop {
            tokio::time::sleep(WAIT_POLL).await;
            if take_stored(cert).await || !store.held(&lock).await.map_err(unavailable)? {
                return Ok(false);
            }
        }
    }
    // Another node may have stored a renewal since this one last looked.
    if store.shared() && take_stored(cert).await {
        store.unlock(&lock).await;
        return Ok(false);
    }
    let r = order(acme, cert, cell, replaces).await;
    store.unlock(&lock).await;
    r.map(|()| true)
}

/// Sleep until the certificate is due for renewal (at once when there is none). With ARI
/// the CA's suggested window decides, a random time in it, asked again after its
/// Retry-After; without (or when the CA cannot be asked), two thirds of the lifetime.
/// Returns the certificate judged due (none when there is none), and whether the CA has
/// ARI (then the order names it as replaced).
async fn wait_for_renewal(
    cert: &Cert,
    account: &AccountCell,
) -> (Option<CertificateDer<'static>>, bool) {
    loop {
        let (Some(fallback), Some(leaf)) = (cert.slot.renew_at(), leaf_of(cert)) else {
            return (None, false);
        };
        let most = cert.issuer.renewal_check;
        let (due, recheck, ari) = match renewal_info(&leaf, account).await {
            Ok((start, end, retry)) => {
                let span = end.duration_since(start).unwrap_or_default();
                let pick = Duration::from_secs(fastrand::u64(0..=span.as_secs()));
                (
                    start + pick,
                    retry.clamp(ARI_MIN_RECHECK.min(most), most),
                    true,
                )
            }
            Err(e) => {
                if !matches!(
                    e.downcast_ref::<instant_acme::Error>(),
                    Some(instant_acme::Error::Unsupported(_))
                ) {
                    errlog::warn(format_args!(
                        "acme: renewal information for \"{}\" unavailable: {e}",
                        cert.identifiers.join(" ")
                    ));
                }
                (fallback, most, false)
            }
        };
        let Ok(wait) = due.duration_since(SystemTime::now()) else {
            return (Some(leaf), ari);
        };
        if wait <= recheck {
            tokio::time::sleep(wait).await;
            return (Some(leaf), ari);
        }
        tokio::time::sleep(recheck).await;
    }
}

/// The CA's suggested renewal window for a certificate and when to ask again.
async fn renewal_info(
    leaf: &CertificateDer<'_>,
    account: &AccountCell,
) -> Result<(SystemTime, SystemTime, Duration), Error> {
    let account = account.get().await?;
    let id = CertificateIdentifier::try_from(leaf)?;
    let (info, retry) = account.renewal_info(&id).await?;
    let w = info.suggested_window;
    Ok((SystemTime::from(w.start), SystemTime::from(w.end), retry))
}

/// One order, from `newOrder` to the certificate in its slot and on disk.
async fn order(
    acme: &Acme,
    cert: &Cert,
    cell: &AccountCell,
    replaces: Option<CertificateDer<'static>>,
) -> Result<(), Error> {
    let account = cell.get().await?;
    let ids: Vec<Identifier> = cert
        .identifiers
        .iter()
        .map(|i| match i.parse::<std::net::IpAddr>() {
            Ok(ip) => Identifier::Ip(ip),
            Err(_) => Identifier::Dns(i.clone()),
        })
        .collect();
    let replaced = match &replaces {
        Some(leaf) => Some(CertificateIdentifier::try_from(leaf)?),
        None => None,
    };
    let mut new = NewOrder::new(&ids);
    if let Some(r) = replaced {
        new = new.replaces(r);
    }
    if let Some((name, require)) = &cert.issuer.profile {
        // nginx-acme: a profile the CA does not list is asked for only with `require`,
        // which then fails the order.
        if account.profiles().any(|p| p.name == name) {
            new = new.profile(name);
        } else if *require {
            return Err(format!("the ACME server has no profile \"{name}\"").into());
        }
    }
    let mut order = account.new_order(&new).await?;
    let mut tokens = Tokens {
        acme,
        http: Vec::new(),
        tls: Vec::new(),
        channel: cert.issuer.store.challenge_channel(),
    };
    async {
        let mut authzs = order.authorizations();
        while let Some(a) = authzs.next().await {
            let mut a = a?;
            if a.status != AuthorizationStatus::Pending {
                continue;
            }
            let (kind, what) = match cert.issuer.challenge {
                Challenge::Http01 => (ChallengeType::Http01, "http-01"),
                Challenge::TlsAlpn01 => (ChallengeType::TlsAlpn01, "tls-alpn-01"),
            };
            let name = match a.identifier().identifier {
                Identifier::Dns(n) => n.clone(),
                other => format!("{other:?}"),
            };
            let mut ch = a
                .challenge(kind.clone())
                .ok_or_else(|| format!("the ACME server offers no {what} challenge for {name}"))?;
            // With a key the crate does not sign with, the authorization is that key's.
            let key_auth = match cell.links.signer() {
                Some(k) => k.key_authorization(&ch.token),
                None => ch.key_authorization().as_str().to_string(),
            };
            match cert.issuer.challenge {
                Challenge::TlsAlpn01 => {
                    acme.add_validation_cert(&name, validation_cert(&name, &key_auth)?);
                    tokens.tls.push(name);
                }
                Challenge::Http01 => {
                    acme.add_challenge(&ch.token, &key_auth);
                    tokens.http.push(ch.token.clone());
                    // The CA's request may reach another node sharing the store.
                    if let Some((server, channel)) = &tokens.channel {
                        let msg = format!("{} {key_auth}", ch.token);
                        match server.publish(channel, msg.as_bytes()).await {
                            Ok(nodes) => {
                                let key = super::seen_key(channel, &ch.token);
                                if !all_took(server, &key, nodes).await {
                                    errlog::warn(format_args!(
                                        "acme: not every node confirmed the challenge for {name} in time"
                                    ));
                                }
                            }
                            Err(e) => errlog::warn(format_args!(
                                "acme: cannot tell the other nodes the challenge for {name}: {e}"
                            )),
                        }
                    }
                }
            }
            ch.set_ready().await?;
        }
        let retries = RetryPolicy::default().timeout(Duration::from_secs(120));
        let status = order.poll_ready(&retries).await?;
        if status != OrderStatus::Ready {
            return Err(why_not_ready(&mut order, status).await.into());
        }
        Ok::<_, Error>(())
    }
    .await?;
    drop(tokens);
    let key = generate(cert.key)?;
    let mut params = rcgen::CertificateParams::new(cert.identifiers.clone())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    if cert.issuer.common_name_in_csr {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cert.first_name());
    }
    let csr = params.serialize_request(&key)?;
    order.finalize_csr(csr.der()).await?;
    let retries = RetryPolicy::default().timeout(Duration::from_secs(120));
    let mut chain = order.poll_certificate(&retries).await?;
    if let Some(name) = &cert.issuer.preferred_chain {
        if let Some(alt) = preferred(&account, &mut order, &cell.links, name, &chain).await? {
            chain = alt;
        }
    }
    let key_pem = key.serialize_pem();
    let current = store::certified(chain.as_bytes(), key_pem.as_bytes())?;
    if let Err(e) = store::save_cert(cert, chain.as_bytes(), key_pem.as_bytes()).await {
        // Served anyway; only a restart will have to order again.
        errlog::error(format_args!("acme: cannot store the certificate: {e}"));
    }
    cert.slot.set(current);
    Ok(())
}

/// `preferred_chain NAME`: the first alternate chain issued by NAME when the default one is
/// not (`None`: keep the default).
async fn preferred(
    account: &Account,
    order: &mut instant_acme::Order,
    links: &chain::Links,
    name: &str,
    default: &str,
) -> Result<Option<String>, Error> {
    if chain::issued_by(default, name) {
        return Ok(None);
    }
    let Some(cert_url) = order.state().certificate.clone() else {
        return Ok(None);
    };
    let order_url = order.url().to_string();
    for alt in links.alternates(&cert_url) {
        links.swap(&order_url, &alt);
        let again = account.order(order_url.clone()).await;
        links.unswap(&order_url);
        let pem = match again?.certificate().await? {
            Some(p) => p,
            None => continue,
        };
        if chain::issued_by(&pem, name) {
            return Ok(Some(pem));
        }
    }
    Ok(None)
}

/// The HTTP-01 tokens of an order, answered until it is over (or given up, the timeout
/// dropping it).
struct Tokens<'a> {
    acme: &'a Acme,
    http: Vec<String>,
    /// TLS-ALPN-01: the names whose validation certificates are served.
    tls: Vec<String>,
    /// Where the other nodes sharing the store learn the HTTP-01 tokens.
    channel: Option<(Arc<crate::modules::redis::Server>, String)>,
}

impl Drop for Tokens<'_> {
    fn drop(&mut self) {
        for t in &self.http {
            self.acme.remove_challenge(t);
        }
        if let Some((server, channel)) = self.channel.take() {
            let done = std::mem::take(&mut self.http);
            tokio::task::spawn_local(async move {
                for t in done {
                    let _ = server.publish(&channel, t.as_bytes()).await;
                }
            });
        }
        for n in &self.tls {
            self.acme.remove_validation_cert(n);
        }
    }
}

/// RFC 8737's validation certificate for `name`: self-signed, naming only it, with the
/// critical acmeIdentifier extension holding the SHA-256 of the key authorization.
fn validation_cert(name: &str, key_auth: &str) -> Result<Arc<rustls::sign::CertifiedKey>, Error> {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key_auth.as_bytes());
    if digest.as_ref().len() != 32 {
        return Err("key authorization digest is not SHA-256".into());
    }
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()])?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest.as_ref())];
    let cert = params.self_signed(&key)?;
    let current = store::certified(cert.pem().as_bytes(), key.serialize_pem().as_bytes())?;
    Ok(current.key)
}

/// What the CA said about a failed validation (e.g. that it could not fetch the HTTP-01
/// answer), for the log.
async fn why_not_ready(order: &mut instant_acme::Order, status: OrderStatus) -> String {
    let mut why = format!("order is {status:?}");
    let mut authzs = order.authorizations();
    while let Some(Ok(a)) = authzs.next().await {
        for p in a.challenges.iter().filter_map(|c| c.error.as_ref()) {
            why.push_str(&format!("; {}: {p}", a.identifier()));
        }
    }
    why
}

pub(super) fn generate(alg: KeyAlg) -> Result<rcgen::KeyPair, rcgen::Error> {
    match alg {
        KeyAlg::Ecdsa(384) => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        KeyAlg::Ecdsa(521) => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P521_SHA512),
        KeyAlg::Ecdsa(_) => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        KeyAlg::Rsa(bits) => {
            let size = match bits {
                4096 => rcgen::RsaKeySize::_4096,
                3072 => rcgen::RsaKeySize::_3072,
                _ => rcgen::RsaKeySize::_2048,
            };
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, size)
        }
    }
}

/// Whether the `nodes` that got a challenge's token have all taken it (their count in
/// `key`), waiting up to 5 s: the CA's validation request may reach any of them at once.
async fn all_took(server: &crate::modules::redis::Server, key: &str, nodes: i64) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        if let Ok(Some(n)) = server.query::<Option<i64>>(&cmd).await {
            if n >= nodes {
                return true;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        // A node's acknowledgement is one Redis round trip away.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
