//! Where an issuer keeps its account and certificates, behind one small interface
//! ([`Store`]) so the ordering code does not care which:
//!
//! - the state directory (`state_path`, default `acme_NAME` under the prefix, as
//!   nginx-acme): `account.key` and `account.url` for the account, `STEM.crt` and
//!   `STEM.key` per certificate. Every file is written 0600 in a 0700 directory, through a
//!   temporary file renamed into place, so a reader never sees half a key;
//! - a Redis server (`state_path redis:NAME`, gannet's own), shared by several gannet
//!   nodes: the same names as keys under `gannet:acme:ISSUER:`, a certificate and its key
//!   written together (MSET), and an order lock per certificate (`STEM.lock`, SET NX with
//!   an expiry) so that one node orders and the others take the result from Redis.

use super::{Cert, Current};
use crate::modules::redis::{Server, NODE};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// An issuer's storage.
#[derive(Debug)]
pub enum Store {
    /// `state_path off`: nothing kept, a restart orders again.
    Off,
    Files(PathBuf),
    Redis {
        server: Arc<Server>,
        prefix: String,
    },
}

/// Releases the order lock only if this node still holds it (it may have expired and been
/// taken by another).
const UNLOCK: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

impl Store {
    /// Whether other nodes share it (their renewals are to be picked up from it).
    pub fn shared(&self) -> bool {
        matches!(self, Store::Redis { .. })
    }

    /// The state directory, for the master to make.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Store::Files(d) => Some(d),
            _ => None,
        }
    }

    /// What the log calls it.
    pub fn describe(&self) -> String {
        match self {
            Store::Off => "no storage".into(),
            Store::Files(d) => format!("\"{}\"", d.display()),
            Store::Redis { server, .. } => {
                format!("redis_server \"{}\" ({})", server.name, server.addr)
            }
        }
    }

    /// `name`'s contents, `None` if there is none.
    pub async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        match self {
            Store::Off => Ok(None),
            Store::Files(d) => read(d, name).map_err(|e| e.to_string()),
            Store::Redis { server, prefix } => {
                let mut cmd = redis::cmd("GET");
                cmd.arg(format!("{prefix}{name}"));
                server.query(&cmd).await
            }
        }
    }

    /// Keep these entries: files in the order given, Redis all at once.
    pub async fn put(&self, items: &[(&str, &[u8])]) -> Result<(), String> {
        match self {
            Store::Off => Ok(()),
            Store::Files(d) => {
                for (name, data) in items {
                    write(d, name, data).map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            Store::Redis { server, prefix } => {
                let mut cmd = redis::cmd("MSET");
                for (name, data) in items {
                    cmd.arg(format!("{prefix}{name}")).arg(*data);
                }
                server.query::<()>(&cmd).await
            }
        }
    }

    /// Take the order lock `name` for at most `ttl`: `true` when this node may order (always
    /// with a store of its own), `false` when another node holds it.
    pub async fn lock(&self, name: &str, ttl: Duration) -> Result<bool, String> {
        let Store::Redis { server, prefix } = self else {
            return Ok(true);
        };
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!("{prefix}{name}"))
            .arg(NODE.to_string())
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64);
        let r: Option<String> = server.query(&cmd).await?;
        Ok(r.is_some())
    }

    /// The Redis server and channel the nodes tell each other their pending HTTP-01
    /// tokens on (`TOKEN KEYAUTH` to answer it, `TOKEN` alone to stop), so that the CA's
    /// validation request may reach any node.
    pub fn challenge_channel(&self) -> Option<(Arc<Server>, String)> {
        match self {
            Store::Redis { server, prefix } => {
                Some((server.clone(), format!("{prefix}challenges")))
            }
            _ => None,
        }
    }

    /// Whether the order lock `name` is held (by any node).
    pub async fn held(&self, name: &str) -> Result<bool, String> {
        let Store::Redis { server, prefix } = self else {
            return Ok(false);
        };
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(format!("{prefix}{name}"));
        server.query::<i64>(&cmd).await.map(|n| n > 0)
    }

    /// Give the order lock back (it expires anyway if this fails).
    pub async fn unlock(&self, name: &str) {
        if let Store::Redis { server, prefix } = self {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(UNLOCK)
                .arg(1)
                .arg(format!("{prefix}{name}"))
                .arg(NODE.to_string());
            let _ = server.query::<i64>(&cmd).await;
        }
    }
}

pub const ACCOUNT_KEY: &str = "account.key";
pub const ACCOUNT_URL: &str = "account.url";

/// Write `data` to `dir/name`, mode 0600, making `dir` (0700) if needed.
pub fn write(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))
}

/// `dir/name`'s contents, `None` if there is no such file.
pub fn read(dir: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(dir.join(name)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn names(cert: &Cert) -> (String, String) {
    let stem = cert.stem();
    (format!("{stem}.crt"), format!("{stem}.key"))
}

/// The name of `cert`'s order lock.
pub(super) fn lock_name(cert: &Cert) -> String {
    format!("{}.lock", cert.stem())
}

/// The stored certificate of `cert`, if there is one (and it matches its key).
pub(super) async fn load_cert(cert: &Cert) -> Result<Option<Current>, String> {
    let (crt, key) = names(cert);
    let store = &cert.issuer.store;
    let (Some(chain), Some(key)) = (store.get(&crt).await?, store.get(&key).await?) else {
        return Ok(None);
    };
    certified(&chain, &key).map(Some)
}

/// The certificate in the state directory, as the config loads (a Redis store is read by
/// the workers, the master never connects).
pub(super) fn load_cert_now(cert: &Cert) -> Result<Option<Current>, String> {
    let Some(dir) = cert.issuer.store.dir() else {
        return Ok(None);
    };
    let (crt, key) = names(cert);
    let e = |e: std::io::Error| e.to_string();
    let (Some(chain), Some(key)) = (read(dir, &crt).map_err(e)?, read(dir, &key).map_err(e)?)
    else {
        return Ok(None);
    };
    certified(&chain, &key).map(Some)
}

/// Keep a new certificate and its key; the key first, so the pair in files never
/// mismatches for long (and a mismatch is refused at load); in Redis both at once.
pub(super) async fn save_cert(cert: &Cert, chain_pem: &[u8], key_pem: &[u8]) -> Result<(), String> {
    let (crt, key) = names(cert);
    cert.issuer
        .store
        .put(&[(key.as_str(), key_pem), (crt.as_str(), chain_pem)])
        .await
}

/// A PEM chain and key as rustls serves them, with the leaf's validity.
pub(super) fn certified(chain_pem: &[u8], key_pem: &[u8]) -> Result<Current, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("bad certificate PEM: {e}"))?;
    let leaf = chain.first().ok_or("no certificate in the chain")?;
    let (_, x) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("cannot parse certificate: {e}"))?;
    let at = |t: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(t.max(0) as u64);
    let not_before = at(x.validity().not_before.timestamp());
    let not_after = at(x.validity().not_after.timestamp());
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("bad private key: {e}"))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("cannot load private key: {e}"))?;
    let ck = CertifiedKey::new(chain, signer);
    if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
        ck.keys_match()
    {
        return Err("certificate and key do not match".to_string());
    }
    Ok(Current {
        key: Arc::new(ck),
        not_before,
        not_after,
    })
}
