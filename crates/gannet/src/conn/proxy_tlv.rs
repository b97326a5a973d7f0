//! `$proxy_protocol_tlv_NAME` (http and stream, nginx 1.23.2): a TLV of the connection's
//! PROXY protocol version 2 header (`listen ... proxy_protocol`), as nginx's
//! `ngx_proxy_protocol_get_tlv` finds it.
//!
//! NAME is `alpn` (type 0x01), `authority` (0x02), `unique_id` (0x05), `ssl` (0x20, the
//! whole SSL TLV: its client byte, verify word and sub-TLVs), `netns` (0x30), or a type by
//! number in hex, `0x..`; `ssl_` before one of `version` (0x21), `cn` (0x22), `cipher` (0x23),
//! `sig_alg` (0x24), `key_alg` (0x25) or `0x..` looks among the SSL TLV's sub-TLVs, and
//! `ssl_verify` is the SSL TLV's verify word in decimal. The value is the TLV's bytes as they
//! came; the first of a type counts. "Not found" (empty; `-` in a log line): no header, no
//! TLV of that type, or a type beyond a byte.
//!
//! As nginx, the config takes any NAME: one nginx does not know is not found and logged
//! (`unknown PROXY protocol TLV`), as is `0x` without hex digits (`invalid PROXY protocol
//! TLV`) or a TLV list cut short (`broken PROXY protocol TLV`). nginx fails the variable
//! for the last two (the request or session ends in an error); gannet gives it no value.
//!
//! The name is resolved once, at load time; the TLVs are only looked through when a
//! variable is read, so a connection whose config reads none pays nothing.

use super::proxy_protocol::ProxyAddrs;
use crate::errlog;

const ALPN: u8 = 0x01;
const AUTHORITY: u8 = 0x02;
const UNIQUE_ID: u8 = 0x05;
const SSL: u8 = 0x20;
const NETNS: u8 = 0x30;

/// The names nginx knows at the top level, and inside the SSL TLV.
const NAMES: [(&str, u8); 5] = [
    ("alpn", ALPN),
    ("authority", AUTHORITY),
    ("unique_id", UNIQUE_ID),
    ("ssl", SSL),
    ("netns", NETNS),
];
const SSL_NAMES: [(&str, u8); 5] = [
    ("version", 0x21),
    ("cn", 0x22),
    ("cipher", 0x23),
    ("sig_alg", 0x24),
    ("key_alg", 0x25),
];

/// The SSL TLV's fixed part: its client flags byte and 32-bit verify result.
const SSL_HEAD: usize = 5;

/// What `$proxy_protocol_tlv_NAME` reads: NAME resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tlv {
    /// NAME as written, for the error log.
    name: Box<str>,
    /// Looked for among the SSL TLV's sub-TLVs (`ssl_...`).
    ssl: bool,
    what: What,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum What {
    /// A type; one beyond a byte is never found (the list is still looked through, for
    /// nginx's error on a broken one).
    Type(u64),
    /// `ssl_verify`.
    Verify,
    Unknown,
    Invalid,
}

impl Tlv {
    /// The TLV of the variable `proxy_protocol_tlv_NAME`, for a variable name with that
    /// prefix.
    pub fn from_var_name(var: &str) -> Option<Tlv> {
        var.strip_prefix("proxy_protocol_tlv_").map(Tlv::new)
    }

    fn new(name: &str) -> Tlv {
        let (ssl, rest) = match name.strip_prefix("ssl_") {
            Some(rest) => (true, rest),
            None => (false, name),
        };
        let what = if ssl && rest == "verify" {
            What::Verify
        } else if let Some(hex) = rest.strip_prefix("0x") {
            hex_type(hex)
        } else {
            let names = if ssl { &SSL_NAMES } else { &NAMES };
            names
                .iter()
                .find(|(n, _)| *n == rest)
                .map_or(What::Unknown, |&(_, t)| What::Type(t.into()))
        };
        Tlv {
            name: name.into(),
            ssl,
            what,
        }
    }

    /// Append the value for the connection's header `pp` (none without one); whether it
    /// was found.
    pub fn append(&self, pp: Option<&ProxyAddrs>, out: &mut String) -> bool {
        let Some(pp) = pp else { return false };
        let mut tlvs: &[u8] = &pp.tlvs;
        if self.ssl {
            let ssl = match self.lookup(tlvs, SSL.into()) {
                Ok(Some(ssl)) => ssl,
                Ok(None) | Err(()) => return false,
            };
            if ssl.len() < SSL_HEAD {
                // nginx: an error, without a message.
                return false;
            }
            if self.what == What::Verify {
                let verify = u32::from_be_bytes([ssl[1], ssl[2], ssl[3], ssl[4]]);
                out.push_str(gannet_proto::h1::encode::decimal(
                    verify.into(),
                    &mut [0; 20],
                ));
                return true;
            }
            tlvs = &ssl[SSL_HEAD..];
        }
        let value = match self.what {
            What::Type(t) => self.lookup(tlvs, t),
            What::Verify => Ok(None),
            What::Unknown => {
                self.complain("unknown");
                Ok(None)
            }
            What::Invalid => {
                self.complain("invalid");
                Ok(None)
            }
        };
        match value {
            Ok(Some(v)) => {
                push_bytes(out, v);
                true
            }
            Ok(None) | Err(()) => false,
        }
    }

    /// The first TLV of type `t` in `tlvs`; `Err` (logged) when the list is cut short
    /// before one is found.
    fn lookup<'a>(&self, mut tlvs: &'a [u8], t: u64) -> Result<Option<&'a [u8]>, ()> {
        while !tlvs.is_empty() {
            let Some(&[ty, hi, lo]) = tlvs.get(..3) else {
                return self.broken();
            };
            let len = usize::from(u16::from_be_bytes([hi, lo]));
            let Some(value) = tlvs.get(3..3 + len) else {
                return self.broken();
            };
            if u64::from(ty) == t {
                return Ok(Some(value));
            }
            tlvs = &tlvs[3 + len..];
        }
        Ok(None)
    }

    fn broken<T>(&self) -> Result<T, ()> {
        errlog::error(format_args!("broken PROXY protocol TLV"));
        Err(())
    }

    fn complain(&self, what: &str) {
        errlog::error(format_args!("{what} PROXY protocol TLV \"{}\"", self.name));
    }
}

/// `0x` followed by NAME's rest: nginx's `ngx_hextoi`, which takes any number of hex
/// digits (`0x000ae` is 0xae) and fails on none, another character or overflow.
fn hex_type(hex: &str) -> What {
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return What::Invalid;
    }
    match u64::from_str_radix(hex, 16) {
        Ok(n) if n > i64::MAX as u64 => What::Invalid,
        Ok(n) => What::Type(n),
        Err(_) => What::Invalid,
    }
}

/// A TLV's bytes as text: most are (an ALPN, a host name, a cipher's name); a byte that is
/// not UTF-8 (the SSL TLV's verify word) is replaced, NULs and other controls kept.
fn push_bytes(out: &mut String, v: &[u8]) {
    match std::str::from_utf8(v) {
        Ok(s) => out.push_str(s),
        Err(_) => out.push_str(&String::from_utf8_lossy(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(t: u8, v: &[u8]) -> Vec<u8> {
        let mut b = vec![t];
        b.extend((v.len() as u16).to_be_bytes());
        b.extend(v);
        b
    }

    fn pp(tlvs: Vec<u8>) -> ProxyAddrs {
        ProxyAddrs {
            addr: "192.0.2.1".into(),
            port: 1,
            server_addr: "192.0.2.2".into(),
            server_port: 2,
            tlvs: tlvs.into(),
        }
    }

    fn get(pp: &ProxyAddrs, name: &str) -> Option<String> {
        let mut out = String::new();
        Tlv::new(name).append(Some(pp), &mut out).then_some(out)
    }

    #[test]
    fn names_and_numbers() {
        let mut sub = vec![0x01, 0, 0, 0, 255];
        sub.extend(tlv(0x21, b"TLSv1.3"));
        sub.extend(tlv(0x22, b"example.com"));
        sub.extend(tlv(0x25, b"RSA2048"));
        let all = [
            tlv(ALPN, b"h2"),
            tlv(AUTHORITY, b"a.example"),
            tlv(0x03, b"crc"),
            tlv(ALPN, b"second"),
            tlv(0xae, b""),
            tlv(SSL, &sub),
        ]
        .concat();
        let p = pp(all);
        assert_eq!(get(&p, "alpn").as_deref(), Some("h2"));
        assert_eq!(get(&p, "0x01").as_deref(), Some("h2"));
        assert_eq!(get(&p, "0x1").as_deref(), Some("h2"));
        assert_eq!(get(&p, "authority").as_deref(), Some("a.example"));
        assert_eq!(get(&p, "0x03").as_deref(), Some("crc"));
        assert_eq!(get(&p, "0x000ae").as_deref(), Some(""));
        assert_eq!(get(&p, "0xAE").as_deref(), Some(""));
        assert_eq!(get(&p, "unique_id"), None);
        assert_eq!(get(&p, "0x0e"), None);
        assert_eq!(get(&p, "0x101"), None);
        assert_eq!(get(&p, "ssl_verify").as_deref(), Some("255"));
        assert_eq!(get(&p, "ssl_version").as_deref(), Some("TLSv1.3"));
        assert_eq!(get(&p, "ssl_0x22").as_deref(), Some("example.com"));
        assert_eq!(get(&p, "ssl_key_alg").as_deref(), Some("RSA2048"));
        assert_eq!(get(&p, "ssl_cipher"), None);
        // A top-level name is not one inside the SSL TLV, nor the other way round.
        assert_eq!(get(&p, "ssl_alpn"), None);
        assert_eq!(get(&p, "cn"), None);
        assert!(get(&p, "ssl").unwrap().contains('\0'));
        for bad in ["0x", "0xg1", "foo", "ssl_foo", "0x-1"] {
            assert_eq!(get(&p, bad), None, "{bad}");
        }
    }

    #[test]
    fn missing_or_broken() {
        let mut out = String::new();
        assert!(!Tlv::new("alpn").append(None, &mut out));
        assert_eq!(get(&pp(Vec::new()), "alpn"), None);
        assert_eq!(get(&pp(Vec::new()), "ssl_verify"), None);
        // Found before the list breaks; not after.
        let cut = [tlv(ALPN, b"h2"), vec![0x02, 0, 9, b'x']].concat();
        assert_eq!(get(&pp(cut.clone()), "alpn").as_deref(), Some("h2"));
        assert_eq!(get(&pp(cut.clone()), "authority"), None);
        assert_eq!(get(&pp(vec![0x01, 0]), "alpn"), None);
        // An SSL TLV too short for its verify word.
        assert_eq!(get(&pp(tlv(SSL, &[1, 0, 0])), "ssl_verify"), None);
        assert!(out.is_empty());
    }
}
