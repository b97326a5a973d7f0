//! Certificates and keys from PEM files, with the checks `gannet -t` reports by file name
//! (missing, unreadable, not PEM, key not matching; expired or not yet valid is a warning), encrypted
//! keys opened with `ssl_password_file`, and the facts of a client certificate that the
//! `$ssl_client_*` variables show.

use crate::modules::tls::FileArg;
use gannet_conf::ConfError;
use pkcs8::der::zeroize::Zeroizing;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt::Write;
use x509_parser::prelude::{FromDer, X509Certificate, X509Name};

fn read(f: &FileArg, what: &str) -> Result<Vec<u8>, ConfError> {
    std::fs::read(&f.path).map_err(|e| {
        ConfError::at(
            &f.loc,
            format!("cannot load {what} \"{}\": {e}", f.path.display()),
        )
    })
}

/// Every certificate in a PEM file (the server's first, then its chain).
pub fn load_chain(f: &FileArg, what: &str) -> Result<Vec<CertificateDer<'static>>, ConfError> {
    let pem = read(f, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ConfError::at(
                &f.loc,
                format!("cannot load {what} \"{}\": {e}", f.path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(ConfError::at(
            &f.loc,
            format!(
                "cannot load {what} \"{}\": no PEM certificate in it",
                f.path.display()
            ),
        ));
    }
    Ok(certs)
}

/// The passphrases of `ssl_password_file`: one a line, tried in turn (empty lines are
/// skipped, as nginx does; a file with none holds the empty passphrase). Wiped on drop.
pub struct Passwords {
    pub file: FileArg,
    list: Vec<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for Passwords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Passwords({}, {} lines)",
            self.file.path.display(),
            self.list.len()
        )
    }
}

/// Read `ssl_password_file` (when the directive is read, so an unreadable file is an
/// error at its line, as in nginx).
pub fn read_passwords(f: FileArg) -> Result<Passwords, ConfError> {
    let text = Zeroizing::new(std::fs::read(&f.path).map_err(|e| {
        ConfError::at(
            &f.loc,
            format!("cannot open password file \"{}\": {e}", f.path.display()),
        )
    })?);
    Ok(Passwords {
        file: f,
        list: password_lines(&text),
    })
}

/// The passphrases in a password file's text (see `Passwords`).
fn password_lines(text: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    let mut list: Vec<Zeroizing<Vec<u8>>> = text
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .filter(|line| !line.is_empty())
        .map(|line| Zeroizing::new(line.to_vec()))
        .collect();
    if list.is_empty() {
        list.push(Zeroizing::new(Vec::new()));
    }
    list
}

const ENCRYPTED_BEGIN: &[u8] = b"-----BEGIN ENCRYPTED PRIVATE KEY-----";
const ENCRYPTED_END: &[u8] = b"-----END ENCRYPTED PRIVATE KEY-----";

/// The private key in a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC), or an encrypted PKCS#8
/// key (`ENCRYPTED PRIVATE KEY`) opened with the first of `passwords` that fits.
pub fn load_key(
    f: &FileArg,
    passwords: Option<&Passwords>,
) -> Result<PrivateKeyDer<'static>, ConfError> {
    let pem = Zeroizing::new(read(f, "certificate key")?);
    let fail = |why: String| {
        ConfError::at(
            &f.loc,
            format!(
                "cannot load certificate key \"{}\": {why}",
                f.path.display()
            ),
        )
    };
    if let Some(block) = section(&pem, ENCRYPTED_BEGIN, ENCRYPTED_END) {
        return decrypt(block, passwords).map_err(fail);
    }
    if memchr::memmem::find(&pem, b"Proc-Type: 4,ENCRYPTED").is_some() {
        return Err(fail(format!(
            "it is encrypted in the legacy PEM form (\"Proc-Type: 4,ENCRYPTED\"), which gannet \
             cannot read; convert it to encrypted PKCS#8 with \
             \"openssl pkcs8 -topk8 -v2 aes-256-cbc -in {0} -out {0}.p8\"",
            f.path.display()
        )));
    }
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| fail(format!("no PEM private key in it ({e})")))
}

/// The first `BEGIN ... END` block of the given kind, both lines included.
fn section<'a>(pem: &'a [u8], begin: &[u8], end: &[u8]) -> Option<&'a [u8]> {
    let start = memchr::memmem::find(pem, begin)?;
    let len = memchr::memmem::find(&pem[start..], end)? + end.len();
    Some(&pem[start..start + len])
}

/// An `ENCRYPTED PRIVATE KEY` block opened with each passphrase in turn (PBES2: PBKDF2 or
/// scrypt, AES-CBC, by the `pkcs8` crate).
fn decrypt(block: &[u8], passwords: Option<&Passwords>) -> Result<PrivateKeyDer<'static>, String> {
    use pkcs8::pkcs5;
    let (_, der) = pkcs8::der::pem::decode_vec(block)
        .map_err(|e| format!("its ENCRYPTED PRIVATE KEY block is not valid PEM ({e})"))?;
    let info = pkcs8::EncryptedPrivateKeyInfo::try_from(der.as_slice()).map_err(|e| {
        format!("its encryption cannot be read ({e}); gannet reads PBES2 with PBKDF2 or scrypt and AES-CBC")
    })?;
    let Some(passwords) = passwords else {
        return Err("it is encrypted and no \"ssl_password_file\" is set".to_string());
    };
    for password in &passwords.list {
        match info.decrypt(password.as_slice()) {
            Ok(doc) => return Ok(PrivateKeyDer::Pkcs8(doc.as_bytes().to_vec().into())),
            // The scheme itself is one gannet cannot use: no passphrase will help.
            Err(pkcs8::Error::EncryptedPrivateKey(
                e @ (pkcs5::Error::UnsupportedAlgorithm { .. }
                | pkcs5::Error::AlgorithmParametersInvalid { .. }
                | pkcs5::Error::NoPbes1CryptSupport),
            )) => {
                return Err(format!(
                    "its encryption is not supported ({e}); gannet reads PBES2 with PBKDF2 or \
                     scrypt and AES-CBC, as \"openssl pkcs8 -topk8 -v2 aes-256-cbc\" writes"
                ))
            }
            // A wrong passphrase: bad padding, or plaintext that is no key.
            Err(_) => continue,
        }
    }
    Err(format!(
        "none of the passphrases in \"{}\" decrypts it",
        passwords.file.path.display()
    ))
}

/// The key is the certificate's: their public keys are the same. Read with x509-parser,
/// not rustls's `keys_match`, which cannot parse an X.509 v1 certificate (and then says
/// nothing). A key whose public half the provider cannot tell is taken.
pub fn key_matches(ck: &rustls::sign::CertifiedKey) -> bool {
    let Some(public) = ck.key.public_key() else {
        return true;
    };
    ck.cert.first().is_some_and(|der| {
        X509Certificate::from_der(der)
            .is_ok_and(|(_, c)| c.tbs_certificate.subject_pki.raw == public.as_ref())
    })
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A server certificate must parse; outside its validity period it is still served (as
/// nginx serves it), and this says so for the error log.
pub fn validity_warning(
    f: &FileArg,
    der: &CertificateDer<'_>,
) -> Result<Option<String>, ConfError> {
    let say = |msg: String| {
        format!(
            "{}: certificate \"{}\" {msg}; served anyway, clients will refuse it",
            f.loc,
            f.path.display()
        )
    };
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| {
        ConfError::at(
            &f.loc,
            format!("certificate \"{}\" cannot be parsed: {e}", f.path.display()),
        )
    })?;
    let v = cert.validity();
    let now = now();
    Ok(if v.not_after.timestamp() < now {
        Some(say(format!(
            "has expired (not valid after {})",
            v.not_after
        )))
    } else if v.not_before.timestamp() > now {
        Some(say(format!(
            "is not valid yet (not before {})",
            v.not_before
        )))
    } else {
        None
    })
}

/// What nginx's `$ssl_client_*` variables show of a certificate.
#[derive(Debug, Clone, Default)]
pub struct CertFacts {
    /// RFC 2253 form, most specific first: `CN=client,O=Example`.
    pub subject: String,
    pub issuer: String,
    /// OpenSSL's old one-line form, in the certificate's order: `/O=Example/CN=client`
    /// (`$ssl_client_s_dn_legacy`, `_i_dn_legacy`).
    pub subject_legacy: String,
    pub issuer_legacy: String,
    /// Upper-case hex, as OpenSSL prints it.
    pub serial: String,
    /// SHA-1 of the DER, lower-case hex (`$ssl_client_fingerprint`).
    pub fingerprint: String,
    /// `Jan  2 03:04:05 2025 GMT`, as OpenSSL prints validity times.
    pub not_before: String,
    pub not_after: String,
    pub not_after_unix: i64,
    /// The certificate in PEM (`$ssl_client_raw_cert`).
    pub pem: String,
}

impl CertFacts {
    pub fn of(der: &CertificateDer<'_>) -> Option<CertFacts> {
        let (_, cert) = X509Certificate::from_der(der).ok()?;
        let serial = cert.raw_serial();
        // The DER integer's sign byte is not part of the number OpenSSL shows.
        let serial = match serial {
            [0, rest @ ..] if !rest.is_empty() => rest,
            s => s,
        };
        let v = cert.validity();
        Some(CertFacts {
            subject: rfc2253(cert.subject()),
            issuer: rfc2253(cert.issuer()),
            subject_legacy: oneline(cert.subject()),
            issuer_legacy: oneline(cert.issuer()),
            serial: hex(serial, true),
            fingerprint: hex(
                aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, der)
                    .as_ref(),
                false,
            ),
            not_before: openssl_time(v.not_before.timestamp()),
            not_after: openssl_time(v.not_after.timestamp()),
            not_after_unix: v.not_after.timestamp(),
            pem: pem(der),
        })
    }

    /// `$ssl_client_v_remain`: whole days until the certificate expires (0 once it has).
    pub fn days_left(&self) -> i64 {
        ((self.not_after_unix - now()) / 86400).max(0)
    }
}

/// PEM: base64 in lines of 64, between the armour lines.
fn pem(der: &[u8]) -> String {
    let b64 = data_encoding::BASE64.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Percent-encoding of everything but RFC 3986's unreserved characters, as nginx escapes
/// `$ssl_client_escaped_cert`.
pub fn escape_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn hex(bytes: &[u8], upper: bool) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = if upper {
            write!(s, "{b:02X}")
        } else {
            write!(s, "{b:02x}")
        };
    }
    s
}

/// A name as RFC 2253 writes it: the last RDN first, `,` between RDNs, `+` inside one,
/// with the special characters escaped.
fn rfc2253(name: &X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let rdns: Vec<String> = name
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|atv| {
                    let key = x509_parser::objects::oid2abbrev(atv.attr_type(), registry)
                        .map(str::to_string)
                        .unwrap_or_else(|_| atv.attr_type().to_id_string());
                    let val = atv.as_str().map_or_else(|_| String::new(), escape_dn);
                    format!("{key}={val}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// `X509_NAME_oneline`'s form: each attribute as `/KEY=value`, first to last.
fn oneline(name: &X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let mut out = String::new();
    for rdn in name.iter_rdn() {
        for (i, atv) in rdn.iter().enumerate() {
            out.push(if i == 0 { '/' } else { '+' });
            match x509_parser::objects::oid2abbrev(atv.attr_type(), registry) {
                Ok(k) => out.push_str(k),
                Err(_) => out.push_str(&atv.attr_type().to_id_string()),
            }
            out.push('=');
            out.push_str(atv.as_str().unwrap_or_default());
        }
    }
    out
}

fn escape_dn(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `Mon dd hh:mm:ss yyyy GMT` from Unix seconds (days from the civil calendar, as in
/// Howard Hinnant's days-to-date algorithm).
fn openssl_time(t: i64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = t.div_euclid(86400);
    let secs = t.rem_euclid(86400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{} {day:2} {:02}:{:02}:{:02} {year} GMT",
        MONTHS[(month - 1) as usize],
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openssl_times() {
        assert_eq!(openssl_time(0), "Jan  1 00:00:00 1970 GMT");
        assert_eq!(openssl_time(1_709_210_096), "Feb 29 12:34:56 2024 GMT");
        assert_eq!(openssl_time(4_102_444_800), "Jan  1 00:00:00 2100 GMT");
    }

    #[test]
    fn dn_escaping() {
        assert_eq!(escape_dn("a,b"), "a\\,b");
        assert_eq!(escape_dn(" x "), "\\ x\\ ");
        assert_eq!(escape_dn("#1"), "\\#1");
        assert_eq!(escape_dn("plain"), "plain");
    }

    #[test]
    fn pem_and_escaping() {
        let p = pem(&[0u8; 61]);
        assert!(p.starts_with("-----BEGIN CERTIFICATE-----\nAAAA"));
        assert_eq!(p.lines().nth(1).map(str::len), Some(64));
        assert!(p.ends_with("A==\n-----END CERTIFICATE-----\n"));
        assert_eq!(escape_component("a b+/=\n-_.~"), "a%20b%2B%2F%3D%0A-_.~");
    }

    #[test]
    fn password_file_lines() {
        let lines =
            |t: &[u8]| -> Vec<Vec<u8>> { password_lines(t).iter().map(|p| p.to_vec()).collect() };
        assert_eq!(
            lines(b"one\r\n\ntwo words\nlast"),
            [&b"one"[..], b"two words", b"last"]
        );
        assert_eq!(lines(b""), [b""]);
        assert_eq!(lines(b"\n\r\n"), [b""]);
    }

    #[test]
    fn hex_forms() {
        assert_eq!(hex(&[0x0a, 0xff], true), "0AFF");
        assert_eq!(hex(&[0x0a, 0xff], false), "0aff");
    }
}
