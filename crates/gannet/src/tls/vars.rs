//! The `$ssl_*` variables of a TLS connection, for http (`http::variables`) and stream
//! (`stream::variables`) alike: nginx's ngx_ssl_get_* functions over [`TlsInfo`].
//!
//! `$ssl_ciphers` and `$ssl_curves` are the client's offers from its ClientHello, named as
//! OpenSSL names them (a suite or group gannet has no name for as `0x` and its hex code,
//! as nginx writes those OpenSSL does not know). `$ssl_session_id` is empty: rustls does
//! not expose session ids (nginx's value may be empty too, for a session-less handshake).

use super::certs::CertFacts;
use super::TlsInfo;
use rustls::{CipherSuite, NamedGroup};
use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslVar {
    Protocol,
    Cipher,
    Ciphers,
    Curve,
    Curves,
    ServerName,
    SessionId,
    SessionReused,
    /// `$ssl_early_data`: "1" while a request that came in 0-RTT data is served before the
    /// handshake completed.
    EarlyData,
    AlpnProtocol,
    ClientVerify,
    ClientSDn,
    ClientIDn,
    ClientSDnLegacy,
    ClientIDnLegacy,
    ClientSerial,
    ClientFingerprint,
    ClientVStart,
    ClientVEnd,
    ClientVRemain,
    ClientCert,
    ClientRawCert,
    ClientEscapedCert,
}

impl SslVar {
    /// The variable `$ssl_NAME`, from `NAME`.
    pub fn from_name(name: &str) -> Option<SslVar> {
        Some(match name {
            "protocol" => SslVar::Protocol,
            "cipher" => SslVar::Cipher,
            "ciphers" => SslVar::Ciphers,
            "curve" => SslVar::Curve,
            "curves" => SslVar::Curves,
            "server_name" => SslVar::ServerName,
            "session_id" => SslVar::SessionId,
            "session_reused" => SslVar::SessionReused,
            "early_data" => SslVar::EarlyData,
            "alpn_protocol" => SslVar::AlpnProtocol,
            "client_verify" => SslVar::ClientVerify,
            "client_s_dn" => SslVar::ClientSDn,
            "client_i_dn" => SslVar::ClientIDn,
            "client_s_dn_legacy" => SslVar::ClientSDnLegacy,
            "client_i_dn_legacy" => SslVar::ClientIDnLegacy,
            "client_serial" => SslVar::ClientSerial,
            "client_fingerprint" => SslVar::ClientFingerprint,
            "client_v_start" => SslVar::ClientVStart,
            "client_v_end" => SslVar::ClientVEnd,
            "client_v_remain" => SslVar::ClientVRemain,
            "client_cert" => SslVar::ClientCert,
            "client_raw_cert" => SslVar::ClientRawCert,
            "client_escaped_cert" => SslVar::ClientEscapedCert,
            _ => return None,
        })
    }

    /// Whether nginx's stream module has it too (the `_legacy` names are http's only).
    pub fn in_stream(self) -> bool {
        !matches!(
            self,
            SslVar::ClientSDnLegacy | SslVar::ClientIDnLegacy | SslVar::EarlyData
        )
    }

    pub fn append(self, out: &mut String, t: &TlsInfo) {
        let client = t.client.as_ref();
        let from_client = |f: fn(&CertFacts) -> &str| client.map_or("", f);
        match self {
            SslVar::Protocol => out.push_str(t.protocol),
            SslVar::Cipher => out.push_str(t.cipher),
            SslVar::Ciphers => join(out, &t.offered.ciphers, |o, c| match cipher_name(*c) {
                Some(n) => o.push_str(n),
                None => {
                    let _ = write!(o, "0x{:04x}", u16::from(*c));
                }
            }),
            SslVar::Curve => out.push_str(t.curve),
            SslVar::Curves => join(out, &t.offered.groups, |o, g| match group_name(*g) {
                Some(n) => o.push_str(n),
                None => {
                    let _ = write!(o, "0x{:04x}", u16::from(*g));
                }
            }),
            SslVar::ServerName => out.push_str(&t.server_name),
            SslVar::SessionId => {}
            SslVar::SessionReused => out.push(if t.reused { 'r' } else { '.' }),
            SslVar::EarlyData => {
                let early = t.early_data.as_ref();
                if early.is_some_and(|e| e.load(std::sync::atomic::Ordering::Relaxed)) {
                    out.push('1');
                }
            }
            SslVar::AlpnProtocol => out.push_str(&t.alpn),
            SslVar::ClientVerify => out.push_str(&t.verify_str()),
            SslVar::ClientSDn => out.push_str(from_client(|c| &c.subject)),
            SslVar::ClientIDn => out.push_str(from_client(|c| &c.issuer)),
            SslVar::ClientSDnLegacy => out.push_str(from_client(|c| &c.subject_legacy)),
            SslVar::ClientIDnLegacy => out.push_str(from_client(|c| &c.issuer_legacy)),
            SslVar::ClientSerial => out.push_str(from_client(|c| &c.serial)),
            SslVar::ClientFingerprint => out.push_str(from_client(|c| &c.fingerprint)),
            SslVar::ClientVStart => out.push_str(from_client(|c| &c.not_before)),
            SslVar::ClientVEnd => out.push_str(from_client(|c| &c.not_after)),
            SslVar::ClientRawCert => out.push_str(from_client(|c| &c.pem)),
            SslVar::ClientCert => {
                // nginx's old form: the PEM without its last character (the final newline),
                // each line after the first starting with a tab.
                if let Some(c) = client {
                    let mut chars = c.pem.chars();
                    chars.next_back();
                    out.push_str(&chars.as_str().replace('\n', "\n\t"));
                }
            }
            SslVar::ClientEscapedCert => {
                if let Some(c) = client {
                    out.push_str(&super::certs::escape_component(&c.pem))
                }
            }
            SslVar::ClientVRemain => {
                if let Some(c) = client {
                    let _ = write!(out, "{}", c.days_left());
                }
            }
        }
    }
}

fn join<T>(out: &mut String, items: &[T], f: impl Fn(&mut String, &T)) {
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        f(out, x);
    }
}

/// OpenSSL's name for a suite, if gannet knows it.
fn cipher_name(c: CipherSuite) -> Option<&'static str> {
    Some(super::ciphers::openssl_name(c)).filter(|n| *n != "UNKNOWN")
}

/// OpenSSL's short name for a key exchange group (`$ssl_curve`, `$ssl_curves`).
pub fn group_name(g: NamedGroup) -> Option<&'static str> {
    Some(match u16::from(g) {
        0x0017 => "prime256v1",
        0x0018 => "secp384r1",
        0x0019 => "secp521r1",
        0x001d => "X25519",
        0x001e => "X448",
        0x0100 => "ffdhe2048",
        0x0101 => "ffdhe3072",
        0x0102 => "ffdhe4096",
        0x0103 => "ffdhe6144",
        0x0104 => "ffdhe8192",
        0x11eb => "SecP256r1MLKEM768",
        0x11ec => "X25519MLKEM768",
        0x11ed => "SecP384r1MLKEM1024",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_groups_and_unknowns() {
        assert_eq!(group_name(NamedGroup::X25519), Some("X25519"));
        assert_eq!(group_name(NamedGroup::secp256r1), Some("prime256v1"));
        assert_eq!(group_name(NamedGroup::from(0x0a0a)), None);
        let mut s = String::new();
        join(&mut s, &[1u16, 2], |o, x| o.push_str(&x.to_string()));
        assert_eq!(s, "1:2");
    }
}
