//! nginx's `ngx_http_acme_module` (nginx/nginx-acme): `acme_issuer NAME { ... }` and
//! `acme_shared_zone` at http level, `acme_certificate ISSUER [identifiers] [key=alg[:size]]`
//! in a server, whose certificate `ssl_certificate $acme_certificate;
//! ssl_certificate_key $acme_certificate_key;` serve. `crate::acme` obtains and renews the
//! certificates; this file only reads the directives (errors worded as nginx-acme's).
//!
//! Inside `acme_issuer`: `uri`, `account_key`, `challenge`, `contact`, `state_path`,
//! `accept_terms_of_service`, `ssl_trusted_certificate`, `ssl_verify`,
//! `external_account_key`, `profile`, `preferred_chain`, `common_name_in_csr`, and gannet's own
//! `renewal_check`.

use super::{LoadCtx, LocConf};
use crate::acme::store::Store;
use crate::acme::{Challenge, Issuer, KeyAlg, Slot};
use crate::modules::tls::FileArg;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive, Loc};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "acme_issuer",
        ctx: Ctx::HTTP,
        args: Args::Exactly(1),
        block: true,
    },
    Spec {
        name: "acme_shared_zone",
        ctx: Ctx::HTTP,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "acme_certificate",
        ctx: Ctx::SERVER,
        args: Args::AtLeast(1),
        block: false,
    },
];

/// A server's `acme_certificate`, read before its `server_name`s are all known.
#[derive(Debug, Clone)]
pub struct CertOrder {
    issuer: String,
    identifiers: Vec<String>,
    key: KeyAlg,
    loc: Loc,
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    match d.name.as_str() {
        "acme_issuer" => {
            let name = &d.args[0];
            if ctx.acme.issuers.contains_key(name) {
                return Err(d.error("\"acme_issuer\" directive is duplicate"));
            }
            let issuer = issuer(d, ctx)?;
            // Made by the master, 0700 and owned by the workers' user, as nginx-acme's
            // state path is (ngx_create_paths): the workers write into it.
            if let Some(dir) = issuer.store.dir() {
                ctx.temp_dirs.push(dir.to_path_buf());
            }
            ctx.acme.issuers.insert(name.clone(), Arc::new(issuer));
        }
        "acme_shared_zone" => {
            // One process holds every worker thread, so the certificates and challenges
            // are shared without a zone; the value is still checked as nginx-acme does.
            if ctx.acme_zone {
                return Err(d.error("\"acme_shared_zone\" directive is duplicate"));
            }
            let Some(v) = d.args[0].strip_prefix("zone=") else {
                return Err(d.error("\"acme_shared_zone\" must have \"zone\" parameter"));
            };
            let ok = v.split_once(':').is_some_and(|(n, s)| {
                !n.is_empty() && gannet_conf::setters::size(s).is_some_and(|b| b > 0)
            });
            if !ok {
                return Err(d.error(format!("invalid zone size \"{}\"", d.args[0])));
            }
            ctx.acme_zone = true;
        }
        "acme_certificate" => {
            if lc.acme.is_some() {
                return Err(d.error("\"acme_certificate\" directive is duplicate"));
            }
            let mut order = CertOrder {
                issuer: d.args[0].clone(),
                identifiers: Vec::new(),
                key: KeyAlg::Ecdsa(256),
                loc: d.loc.clone(),
            };
            if order.issuer.is_empty() {
                return Err(d.error("\"acme_certificate\" directive \"issuer\" is missing"));
            }
            for a in &d.args[1..] {
                if let Some(k) = a.strip_prefix("key=") {
                    order.key = KeyAlg::parse(k).ok_or_else(|| {
                        d.error("\"acme_certificate\" directive invalid \"key\" value")
                    })?;
                    continue;
                }
                add_identifier(&mut order.identifiers, a).map_err(|e| d.error(e))?;
            }
            lc.acme = Some(order);
        }
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// An identifier as nginx-acme takes it: an IP address in its canonical form, or a DNS
/// name, lowercased; `.example.com` (server_name's "with and without www") is both
/// `www.example.com` and `example.com`.
fn add_identifier(ids: &mut Vec<String>, v: &str) -> Result<(), String> {
    if let Ok(ip) = v.parse::<std::net::IpAddr>() {
        ids.push(ip.to_string());
        return Ok(());
    }
    let name = v.to_ascii_lowercase();
    let host = name.strip_prefix('.').unwrap_or(&name);
    // nginx-acme's check: URI characters (RFC 3986 unreserved, pct-encoded, sub-delims) in
    // non-empty labels, a wildcard only as a whole first label (RFC 8555 7.1.3), no
    // trailing dot; the CA judges the rest.
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"-_~%!$&'()+,;=".contains(&c))
    };
    let valid = host.split('.').enumerate().all(|(i, l)| {
        label_ok(l) || (i == 0 && l == "*" && host.len() > 2 && !name.starts_with('.'))
    });
    if !valid {
        return Err(format!(
            "\"acme_certificate\": invalid server name: \"{v}\""
        ));
    }
    if name.starts_with('.') {
        ids.push(format!("www.{host}"));
    }
    ids.push(host.to_string());
    Ok(())
}

/// The slot of the certificate a server's `acme_certificate` asks for (identifiers from
/// `server_name` when none are given), for its `ssl_certificate $acme_certificate`.
pub fn server_slot(
    conf: &LocConf,
    server_names: &[String],
    ctx: &mut LoadCtx,
) -> Result<Option<Arc<Slot>>, ConfError> {
    let Some(order) = &conf.acme else {
        return Ok(None);
    };
    let mut ids = order.identifiers.clone();
    if ids.is_empty() {
        for n in server_names {
            if n.starts_with('~') {
                ctx.warnings.push(format!(
                    "{}: \"acme_certificate\": unsupported regular expression in server_name: {n}",
                    order.loc
                ));
                continue;
            }
            if n.is_empty() {
                continue;
            }
            add_identifier(&mut ids, n).map_err(|e| ConfError::at(&order.loc, e))?;
        }
        if ids.is_empty() {
            return Err(ConfError::at(
                &order.loc,
                "\"acme_certificate\": no identifiers found in \"server_name\"",
            ));
        }
    }
    Ok(Some(ctx.acme.slot(
        &order.issuer,
        &order.loc,
        ids,
        order.key,
    )))
}

/// An `acme_issuer` block.
fn issuer(d: &Directive, ctx: &LoadCtx) -> Result<Issuer, ConfError> {
    let name = d.args[0].clone();
    let mut is = Issuer {
        store: Store::Files(ctx.prefix.join(format!("acme_{name}"))),
        name,
        uri: String::new(),
        account_key: None,
        account_key_alg: KeyAlg::Ecdsa(256),
        contacts: Vec::new(),
        accept_tos: false,
        trusted: None,
        verify: true,
        eab: None,
        profile: None,
        preferred_chain: None,
        common_name_in_csr: false,
        challenge: Challenge::Http01,
        renewal_check: crate::acme::RENEWAL_CHECK,
    };
    for e in d.block.as_deref().unwrap_or_default() {
        let n = e.name.as_str();
        let want = match n {
            "accept_terms_of_service" => 0,
            "external_account_key" => 2,
            "profile" => e.args.len().clamp(1, 2),
            _ => 1,
        };
        if e.block.is_some() || e.args.len() != want {
            return Err(e.error(format!("invalid number of arguments in \"{n}\"")));
        }
        let v = e.args.first().map_or("", String::as_str);
        match n {
            "uri" => {
                let ok = v.parse::<http::Uri>().ok().filter(|u| u.host().is_some());
                if ok.is_none() {
                    return Err(e.error(format!("\"uri\" directive invalid value \"{v}\"")));
                }
                is.uri = v.to_string();
            }
            "account_key" => match KeyAlg::parse(v) {
                Some(alg) => is.account_key_alg = alg,
                None => is.account_key = Some(account_key_file(e, &ctx.prefix.join(v))?),
            },
            "challenge" => {
                is.challenge = match v {
                    "http" | "http-01" => Challenge::Http01,
                    "tls-alpn" | "tls-alpn-01" => Challenge::TlsAlpn01,
                    _ => return Err(e.error(format!("unsupported challenge: {v}"))),
                }
            }
            "contact" => {
                // RFC 3986 scheme: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":".
                let scheme = v.split_once(':').is_some_and(|(s, _)| {
                    s.starts_with(|c: char| c.is_ascii_alphabetic())
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                });
                is.contacts.push(if scheme {
                    v.to_string()
                } else {
                    format!("mailto:{v}")
                });
            }
            "state_path" => {
                is.store =
                    match v.strip_prefix("redis:") {
                        _ if v == "off" => Store::Off,
                        // gannet's own: shared by the nodes using the same Redis.
                        Some(server) => Store::Redis {
                            server: ctx.redis.get(server).cloned().ok_or_else(|| {
                                e.error(format!("unknown redis_server \"{server}\""))
                            })?,
                            prefix: format!("gannet:acme:{}:", is.name),
                        },
                        None => Store::Files(ctx.prefix.join(v)),
                    };
            }
            "accept_terms_of_service" => is.accept_tos = true,
            "ssl_trusted_certificate" => {
                let f = FileArg {
                    path: ctx.prefix.join(v),
                    loc: e.loc.clone(),
                };
                // Checked now, as nginx-acme loads it (used when the CA is first asked).
                crate::tls::certs::load_chain(&f, "trusted certificate")?;
                is.trusted = Some(f);
            }
            "ssl_verify" => is.verify = flag(e, v)?,
            "external_account_key" => {
                if is.eab.is_some() {
                    return Err(e.error(format!("\"{n}\" directive is duplicate")));
                }
                let text = match e.args[1].strip_prefix("data:") {
                    Some(k) => k.to_string(),
                    None => {
                        let f = ctx.prefix.join(&e.args[1]);
                        std::fs::read_to_string(&f).map_err(|err| {
                            e.error(format!(
                                "\"{n}\" directive cannot read \"{}\": {err}",
                                f.display()
                            ))
                        })?
                    }
                };
                let key = base64url(text.trim()).ok_or_else(|| {
                    e.error(format!("\"{n}\" directive invalid base64url encoded value"))
                })?;
                if v.is_empty() || key.is_empty() {
                    return Err(e.error(format!("\"{n}\" directive invalid value")));
                }
                is.eab = Some((v.to_string(), key));
            }
            "profile" => {
                let require = match e.args.get(1).map(String::as_str) {
                    None => false,
                    Some("require") => true,
                    Some(other) => return Err(e.error(format!("invalid parameter \"{other}\""))),
                };
                is.profile = Some((v.to_string(), require));
            }
            "common_name_in_csr" => is.common_name_in_csr = flag(e, v)?,
            "preferred_chain" => is.preferred_chain = Some(v.to_string()),
            "renewal_check" => {
                let ms = gannet_conf::setters::msec(v)
                    .filter(|&ms| ms >= 1000)
                    .ok_or_else(|| e.error(format!("\"{n}\" directive invalid value")))?;
                is.renewal_check = std::time::Duration::from_millis(ms);
            }
            _ => return Err(e.error(format!("unknown directive \"{n}\""))),
        }
    }
    if is.uri.is_empty() {
        return Err(d.error("\"acme_issuer\" directive \"uri\" is missing"));
    }
    Ok(is)
}

/// `account_key FILE`: a PKCS#8 PEM key, read now (the master may read what the workers
/// cannot): ECDSA P-256, P-384, P-521 or RSA.
fn account_key_file(e: &Directive, path: &std::path::Path) -> Result<Vec<u8>, ConfError> {
    use rustls::pki_types::pem::PemObject;
    let shown = path.display();
    let pem = std::fs::read(path)
        .map_err(|err| e.error(format!("cannot load account key \"{shown}\": {err}")))?;
    let der = rustls::pki_types::PrivatePkcs8KeyDer::from_pem_slice(&pem).map_err(|err| {
        e.error(format!(
            "cannot load account key \"{shown}\": not a PKCS#8 PEM key ({err})"
        ))
    })?;
    let p256 = instant_acme::Key::from_pkcs8_der(der).is_ok();
    if !p256 {
        crate::acme::account_key_type(&pem)
            .map_err(|err| e.error(format!("cannot load account key \"{shown}\": {err}")))?;
    }
    Ok(pem)
}

/// `on` / `off`, with nginx's error otherwise.
fn flag(e: &Directive, v: &str) -> Result<bool, ConfError> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(e.error(format!(
            "invalid value \"{v}\" in \"{}\" directive, it must be \"on\" or \"off\"",
            e.name
        ))),
    }
}

/// base64url, with or without its padding (nginx's ngx_decode_base64url takes both).
fn base64url(s: &str) -> Option<Vec<u8>> {
    data_encoding::BASE64URL_NOPAD
        .decode(s.trim_end_matches('=').as_bytes())
        .ok()
}

#[cfg(test)]
mod tests {
    use super::{add_identifier, KeyAlg};

    #[test]
    fn key_types_as_nginx_acme() {
        assert_eq!(KeyAlg::parse("ecdsa"), Some(KeyAlg::Ecdsa(256)));
        assert_eq!(KeyAlg::parse("ecdsa:384"), Some(KeyAlg::Ecdsa(384)));
        assert_eq!(KeyAlg::parse("ecdsa:521"), Some(KeyAlg::Ecdsa(521)));
        assert_eq!(KeyAlg::parse("rsa"), Some(KeyAlg::Rsa(2048)));
        assert_eq!(KeyAlg::parse("rsa:4096"), Some(KeyAlg::Rsa(4096)));
        for bad in ["ecdsa:512", "rsa:1024", "dsa", "rsa:", "ecdsa:x", ""] {
            assert_eq!(KeyAlg::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn identifiers_from_names_and_addresses() {
        let mut ids = Vec::new();
        add_identifier(&mut ids, "Example.COM").unwrap();
        add_identifier(&mut ids, ".example.org").unwrap();
        add_identifier(&mut ids, "2001:DB8::1").unwrap();
        add_identifier(&mut ids, "192.0.2.1").unwrap();
        assert_eq!(
            ids,
            [
                "example.com",
                "www.example.org",
                "example.org",
                "2001:db8::1",
                "192.0.2.1"
            ]
        );
        add_identifier(&mut ids, "*.example.net").unwrap();
        assert_eq!(ids.last().map(String::as_str), Some("*.example.net"));
        for bad in [
            "a*.example.com",
            "*",
            "a.*.b",
            "a..b",
            "a.b.",
            "bad name",
            "~^www",
            ".*.x",
        ] {
            assert!(add_identifier(&mut ids, bad).is_err(), "{bad}");
        }
    }
}
