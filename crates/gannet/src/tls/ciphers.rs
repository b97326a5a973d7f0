//! `ssl_ciphers`: an OpenSSL cipher string mapped onto the TLS 1.2 suites rustls offers,
//! and the OpenSSL names of every suite (for `$ssl_cipher`).
//!
//! The string is read as OpenSSL reads it: elements separated by `:` (or `,` or spaces),
//! each a suite name or an alias (`HIGH`, `ECDHE`, `aRSA`, `AESGCM`...), several joined by
//! `+` to mean "all of these"; a `!` prefix removes for good, `-` removes, `+` moves to the
//! end, `@STRENGTH` / `@SECLEVEL=n` are accepted and change nothing. Aliases that match only
//! suites rustls does not have (`aNULL`, `MD5`, `3DES`...) select nothing, silently; a name
//! that is no alias and no suite gannet offers is reported as a notice. TLS 1.3 suites are
//! not chosen here (nginx's `ssl_ciphers` does not choose them either): all three are offered
//! whenever TLS 1.3 is.

use rustls::CipherSuite;

/// What the aliases look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    Ecdsa,
    Rsa,
    /// TLS 1.3 suites name no key exchange or authentication.
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enc {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20,
}

struct Suite {
    openssl: &'static str,
    id: CipherSuite,
    auth: Auth,
    enc: Enc,
    sha384: bool,
    tls13: bool,
}

const SUITES: &[Suite] = &[
    Suite {
        openssl: "TLS_AES_256_GCM_SHA384",
        id: CipherSuite::TLS13_AES_256_GCM_SHA384,
        auth: Auth::Any,
        enc: Enc::Aes256Gcm,
        sha384: true,
        tls13: true,
    },
    Suite {
        openssl: "TLS_AES_128_GCM_SHA256",
        id: CipherSuite::TLS13_AES_128_GCM_SHA256,
        auth: Auth::Any,
        enc: Enc::Aes128Gcm,
        sha384: false,
        tls13: true,
    },
    Suite {
        openssl: "TLS_CHACHA20_POLY1305_SHA256",
        id: CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
        auth: Auth::Any,
        enc: Enc::Chacha20,
        sha384: false,
        tls13: true,
    },
    Suite {
        openssl: "ECDHE-ECDSA-AES256-GCM-SHA384",
        id: CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        auth: Auth::Ecdsa,
        enc: Enc::Aes256Gcm,
        sha384: true,
        tls13: false,
    },
    Suite {
        openssl: "ECDHE-ECDSA-AES128-GCM-SHA256",
        id: CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        auth: Auth::Ecdsa,
        enc: Enc::Aes128Gcm,
        sha384: false,
        tls13: false,
    },
    Suite {
        openssl: "ECDHE-ECDSA-CHACHA20-POLY1305",
        id: CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        auth: Auth::Ecdsa,
        enc: Enc::Chacha20,
        sha384: false,
        tls13: false,
    },
    Suite {
        openssl: "ECDHE-RSA-AES256-GCM-SHA384",
        id: CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        auth: Auth::Rsa,
        enc: Enc::Aes256Gcm,
        sha384: true,
        tls13: false,
    },
    Suite {
        openssl: "ECDHE-RSA-AES128-GCM-SHA256",
        id: CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        auth: Auth::Rsa,
        enc: Enc::Aes128Gcm,
        sha384: false,
        tls13: false,
    },
    Suite {
        openssl: "ECDHE-RSA-CHACHA20-POLY1305",
        id: CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        auth: Auth::Rsa,
        enc: Enc::Chacha20,
        sha384: false,
        tls13: false,
    },
];

/// OpenSSL aliases that only ever match suites rustls does not implement (or TLS 1.3
/// names, which `ssl_ciphers` does not govern): accepted, selecting nothing.
const EMPTY_ALIASES: &[&str] = &[
    "MEDIUM",
    "LOW",
    "EXP",
    "EXPORT",
    "EXPORT40",
    "EXPORT56",
    "NULL",
    "eNULL",
    "aNULL",
    "COMPLEMENTOFDEFAULT",
    "COMPLEMENTOFALL",
    "kRSA",
    "RSA",
    "kDHE",
    "kEDH",
    "DH",
    "DHE",
    "EDH",
    "ADH",
    "kDHr",
    "kDHd",
    "kDH",
    "kECDHr",
    "kECDHe",
    "kECDH",
    "aECDH",
    "AECDH",
    "aDSS",
    "DSS",
    "aDH",
    "aGOST",
    "aGOST01",
    "kGOST",
    "GOST94",
    "GOST89MAC",
    "PSK",
    "kPSK",
    "kECDHEPSK",
    "kDHEPSK",
    "kRSAPSK",
    "aPSK",
    "SRP",
    "kSRP",
    "aSRP",
    "MD5",
    "SHA1",
    "SHA",
    "DES",
    "3DES",
    "RC4",
    "RC2",
    "IDEA",
    "SEED",
    "CAMELLIA",
    "CAMELLIA128",
    "CAMELLIA256",
    "ARIA",
    "ARIA128",
    "ARIA256",
    "CCM",
    "CCM8",
    "AESCCM",
    "AESCCM8",
    "SSLv3",
    "TLSv1",
    "TLSv1.0",
    "SUITEB128",
    "SUITEB128ONLY",
    "SUITEB192",
    "TLS_AES_256_GCM_SHA384",
    "TLS_AES_128_GCM_SHA256",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_AES_128_CCM_SHA256",
    "TLS_AES_128_CCM_8_SHA256",
];

/// Whether one alias (or suite name) matches a TLS 1.2 suite; `None` for an unknown word.
fn alias_matches(word: &str, s: &Suite) -> Option<bool> {
    if s.openssl == word {
        return Some(true);
    }
    let m = match word {
        "ALL" | "DEFAULT" | "HIGH" | "TLSv1.2" | "kECDHE" | "kEECDH" | "ECDHE" | "EECDH"
        | "ECDH" | "AEAD" | "FIPS" => true,
        "aECDSA" | "ECDSA" => s.auth == Auth::Ecdsa,
        "aRSA" => s.auth == Auth::Rsa,
        "AES" | "AESGCM" => s.enc != Enc::Chacha20,
        "AES128" => s.enc == Enc::Aes128Gcm,
        "AES256" => s.enc == Enc::Aes256Gcm,
        "CHACHA20" => s.enc == Enc::Chacha20,
        "SHA256" => !s.sha384,
        "SHA384" => s.sha384,
        w if EMPTY_ALIASES.contains(&w) => false,
        w if SUITES.iter().any(|x| x.openssl == w) => false,
        _ => return None,
    };
    Some(m)
}

/// The TLS 1.2 suites a cipher string selects, in its order, and the words gannet does not
/// know (names of suites rustls lacks, typos), for notices.
pub fn parse(spec: &str) -> (Vec<CipherSuite>, Vec<String>) {
    let tls12: Vec<&Suite> = SUITES.iter().filter(|s| !s.tls13).collect();
    let mut list: Vec<CipherSuite> = Vec::new();
    let mut banned: Vec<CipherSuite> = Vec::new();
    let mut unknown = Vec::new();
    let elements = spec
        .split([':', ',', ' '])
        .map(str::trim)
        .filter(|e| !e.is_empty());
    for el in elements {
        if el.starts_with('@') {
            continue;
        }
        let (op, body) = match el.as_bytes()[0] {
            b'!' | b'-' | b'+' => (el.as_bytes()[0], &el[1..]),
            _ => (0, el),
        };
        let mut selected: Vec<CipherSuite> = Vec::new();
        let mut known = true;
        for s in &tls12 {
            let mut all = true;
            for word in body.split('+') {
                match alias_matches(word, s) {
                    Some(m) => all &= m,
                    None => {
                        known = false;
                        all = false;
                    }
                }
            }
            if all {
                selected.push(s.id);
            }
        }
        if !known {
            unknown.push(el.to_string());
            continue;
        }
        match op {
            b'!' => {
                list.retain(|c| !selected.contains(c));
                banned.extend(selected);
            }
            b'-' => list.retain(|c| !selected.contains(c)),
            b'+' => {
                let moved: Vec<CipherSuite> = list
                    .iter()
                    .copied()
                    .filter(|c| selected.contains(c))
                    .collect();
                list.retain(|c| !selected.contains(c));
                list.extend(moved);
            }
            _ => {
                for c in selected {
                    if !list.contains(&c) && !banned.contains(&c) {
                        list.push(c);
                    }
                }
            }
        }
    }
    (list, unknown)
}

/// The OpenSSL name of a suite, as nginx's `$ssl_cipher` shows it.
pub fn openssl_name(id: CipherSuite) -> &'static str {
    SUITES
        .iter()
        .find(|s| s.id == id)
        .map_or("UNKNOWN", |s| s.openssl)
}

/// The OpenSSL names of the TLS 1.2 suites gannet can offer (for error messages).
pub fn offered_tls12() -> String {
    SUITES
        .iter()
        .filter(|s| !s.tls13)
        .map(|s| s.openssl)
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(spec: &str) -> Vec<&'static str> {
        parse(spec).0.into_iter().map(openssl_name).collect()
    }

    #[test]
    fn nginx_default_selects_every_suite() {
        assert_eq!(names("HIGH:!aNULL:!MD5").len(), 6);
        assert!(parse("HIGH:!aNULL:!MD5").1.is_empty());
    }

    #[test]
    fn explicit_names_keep_their_order() {
        assert_eq!(
            names("ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305"),
            [
                "ECDHE-RSA-AES128-GCM-SHA256",
                "ECDHE-ECDSA-CHACHA20-POLY1305"
            ]
        );
    }

    #[test]
    fn aliases_combine_and_remove() {
        assert_eq!(
            names("ECDHE+AESGCM:!aRSA"),
            [
                "ECDHE-ECDSA-AES256-GCM-SHA384",
                "ECDHE-ECDSA-AES128-GCM-SHA256"
            ]
        );
        // `!` bans for good, `-` only removes.
        assert!(names("!CHACHA20:ALL").iter().all(|n| !n.contains("CHACHA")));
        assert!(names("-CHACHA20:ALL").iter().any(|n| n.contains("CHACHA")));
        // `+` moves to the end.
        assert_eq!(
            names("ALL:+AES256").last().copied(),
            Some("ECDHE-RSA-AES256-GCM-SHA384")
        );
    }

    #[test]
    fn unknown_and_unoffered_names() {
        let (list, unknown) = parse("DHE-RSA-AES128-GCM-SHA256:BOGUS:AES128-SHA");
        assert!(list.is_empty());
        assert_eq!(
            unknown,
            ["DHE-RSA-AES128-GCM-SHA256", "BOGUS", "AES128-SHA"]
        );
        // A known alias that matches nothing rustls has is no notice.
        assert_eq!(parse("3DES:aNULL").1, Vec::<String>::new());
        assert!(parse("3DES").0.is_empty());
    }
}
