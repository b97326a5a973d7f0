//! The state directory (`state_path`, default `acme_NAME` under the prefix, as nginx-acme):
//! `account.key` and `account.url` for the account, `STEM.crt` and `STEM.key` per
//! certificate. Every file is written 0600 in a 0700 directory, through a temporary file
//! renamed into place, so a reader never sees half a key.

use super::{Cert, Current};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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

fn paths(cert: &Cert) -> Option<(PathBuf, String, String)> {
    let dir = cert.issuer.state_path.clone()?;
    let stem = cert.stem();
    Some((dir, format!("{stem}.crt"), format!("{stem}.key")))
}

/// The stored certificate of `cert`, if there is one (and it matches its key).
pub(super) fn load_cert(cert: &Cert) -> Result<Option<Current>, String> {
    let Some((dir, crt, key)) = paths(cert) else {
        return Ok(None);
    };
    let e = |e: std::io::Error| e.to_string();
    let (Some(chain), Some(key)) = (read(&dir, &crt).map_err(e)?, read(&dir, &key).map_err(e)?)
    else {
        return Ok(None);
    };
    certified(&chain, &key).map(Some)
}

/// Keep a new certificate and its key; the key first, so the pair on disk never mismatches
/// for long (and a mismatch is refused at load).
pub(super) fn save_cert(cert: &Cert, chain_pem: &[u8], key_pem: &[u8]) -> std::io::Result<()> {
    if let Some((dir, crt, key)) = paths(cert) {
        write(&dir, &key, key_pem)?;
        write(&dir, &crt, chain_pem)?;
    }
    Ok(())
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
