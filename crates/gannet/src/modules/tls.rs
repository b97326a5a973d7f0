//! The TLS directives, read into each http / server level and merged like the others;
//! `crate::tls` builds the rustls configuration of a server from the merged result.
//!
//! Directives: `ssl_certificate`, `ssl_certificate_key`, `ssl_password_file`, `ssl_protocols`, `ssl_ciphers`,
//! `ssl_prefer_server_ciphers`, `ssl_session_cache`, `ssl_session_timeout`,
//! `ssl_session_tickets`, `ssl_stapling`, `ssl_stapling_file`, `ssl_stapling_responder`,
//! `ssl_stapling_verify`, `ssl_client_certificate`,
//! `ssl_trusted_certificate`, `ssl_crl`, `ssl_ocsp`, `ssl_ocsp_responder`,
//! `ssl_ocsp_cache`, `ssl_verify_client`, `ssl_reject_handshake`,
//! `ssl_ecdh_curve`, `ssl_early_data` (0-RTT, taken over QUIC only: `conn::quic`).
//! (`listen ... ssl` is in `config::listen`.)

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::tls::certs::{read_passwords, Passwords};
use crate::tls::ciphers;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive, Loc};
use rustls::{CipherSuite, NamedGroup};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const HS: Ctx = Ctx(Ctx::HTTP.0 | Ctx::SERVER.0);

const fn spec(name: &'static str, args: Args) -> Spec {
    Spec {
        name,
        ctx: HS,
        args,
        block: false,
    }
}

pub const DIRECTIVES: &[Spec] = &[
    spec("ssl_certificate", Args::Exactly(1)),
    spec("ssl_certificate_key", Args::Exactly(1)),
    spec("ssl_password_file", Args::Exactly(1)),
    spec("ssl_protocols", Args::AtLeast(1)),
    spec("ssl_ciphers", Args::Exactly(1)),
    spec("ssl_prefer_server_ciphers", Args::Exactly(1)),
    spec("ssl_session_cache", Args::AtLeast(1)),
    spec("ssl_session_timeout", Args::Exactly(1)),
    spec("ssl_session_tickets", Args::Exactly(1)),
    spec("ssl_stapling", Args::Exactly(1)),
    spec("ssl_stapling_file", Args::Exactly(1)),
    spec("ssl_stapling_responder", Args::Exactly(1)),
    spec("ssl_stapling_verify", Args::Exactly(1)),
    spec("ssl_client_certificate", Args::Exactly(1)),
    spec("ssl_trusted_certificate", Args::Exactly(1)),
    spec("ssl_crl", Args::Exactly(1)),
    spec("ssl_ocsp", Args::Exactly(1)),
    spec("ssl_ocsp_responder", Args::Exactly(1)),
    spec("ssl_ocsp_cache", Args::Exactly(1)),
    spec("ssl_verify_client", Args::Exactly(1)),
    spec("ssl_verify_depth", Args::Exactly(1)),
    spec("ssl_reject_handshake", Args::Exactly(1)),
    spec("ssl_early_data", Args::Exactly(1)),
    spec("ssl_ecdh_curve", Args::Exactly(1)),
];

/// A file named by a directive, with where it was named (errors point there).
#[derive(Debug, Clone)]
pub struct FileArg {
    pub path: PathBuf,
    pub loc: Loc,
}

/// `ssl_protocols`: the versions rustls can offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocols {
    pub tls12: bool,
    pub tls13: bool,
}

/// `ssl_session_cache`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCache {
    /// `off`: no cache, and clients are told sessions are not reused.
    Off,
    /// `none` (nginx's default): no cache.
    None,
    /// `builtin[:sessions]`: a cache of this server's own.
    Builtin(usize),
    /// `shared:NAME:SIZE`: one cache for every server naming it (all workers are threads of
    /// one process, so it is shared by all of them).
    Shared { name: String, sessions: usize },
}

/// `ssl_verify_client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyClient {
    Off,
    On,
    Optional,
    OptionalNoCa,
}

#[derive(Debug, Clone, Default)]
pub struct TlsConf {
    pub certificates: Option<Vec<FileArg>>,
    pub keys: Option<Vec<FileArg>>,
    /// `ssl_password_file`, read when the directive is.
    pub password_file: Option<Arc<Passwords>>,
    pub protocols: Option<Protocols>,
    /// The TLS 1.2 suites `ssl_ciphers` selected, in its order.
    pub ciphers: Option<Vec<CipherSuite>>,
    pub prefer_server_ciphers: Option<bool>,
    pub session_cache: Option<SessionCache>,
    pub session_timeout: Option<Duration>,
    pub session_tickets: Option<bool>,
    pub stapling: Option<(bool, Loc)>,
    pub stapling_file: Option<FileArg>,
    /// `ssl_stapling_responder`: the URL asked instead of the certificate's.
    pub stapling_responder: Option<String>,
    pub stapling_verify: Option<bool>,
    pub client_certificate: Option<FileArg>,
    /// CAs trusted for client chains but not named to clients.
    pub trusted_certificate: Option<FileArg>,
    /// Revocation lists the client chains are checked against.
    pub crl: Option<FileArg>,
    /// `ssl_ocsp on|leaf` (`None` inside: `off`), where it was written.
    pub ocsp: Option<(Option<crate::tls::ocsp::Mode>, Loc)>,
    /// `ssl_ocsp_responder`: the URL asked instead of the certificates' own.
    pub ocsp_responder: Option<(String, Loc)>,
    /// `ssl_ocsp_cache`: `None` inside for `off`, else the zone's name and size.
    pub ocsp_cache: Option<Option<(String, usize)>>,
    pub verify_client: Option<(VerifyClient, Loc)>,
    /// `ssl_verify_depth`: the most intermediate CAs in a client chain.
    pub verify_depth: Option<u64>,
    pub reject_handshake: Option<bool>,
    /// `ssl_early_data`: 0-RTT requests are taken (HTTP/3; a TCP handshake takes none).
    pub early_data: Option<bool>,
    /// `ssl_ecdh_curve`: the key exchange groups, in order (`None`: rustls's default).
    pub ecdh_curves: Option<Vec<NamedGroup>>,
    /// The certificate of this server's `acme_certificate`, which `ssl_certificate
    /// $acme_certificate` serves (set per server by `modules::acme`, not inherited).
    pub acme: Option<Arc<crate::acme::Slot>>,
    /// The server's `resolver` and `resolver_timeout`, for the OCSP responder's name (set
    /// per server from the core settings, not inherited here).
    pub resolver: Option<(Arc<crate::resolver::Resolver>, Duration)>,
}

/// nginx: "one megabyte of the cache can store about 4000 sessions".
const SESSION_BYTES: u64 = 256;
/// nginx's builtin cache size when none is given.
const BUILTIN_SESSIONS: usize = 20480;

impl TlsConf {
    pub fn merge(&mut self, parent: &TlsConf) {
        inherit!(
            self,
            parent,
            certificates,
            keys,
            password_file,
            protocols,
            ciphers,
            prefer_server_ciphers,
            session_cache,
            session_timeout,
            session_tickets,
            stapling,
            stapling_file,
            stapling_responder,
            stapling_verify,
            client_certificate,
            verify_depth,
            trusted_certificate,
            crl,
            ocsp,
            ocsp_responder,
            ocsp_cache,
            verify_client,
            reject_handshake,
            early_data,
            ecdh_curves,
        );
    }

    pub fn protocols(&self) -> Protocols {
        self.protocols.unwrap_or(Protocols {
            tls12: true,
            tls13: true,
        })
    }

    pub fn session_timeout(&self) -> Duration {
        self.session_timeout.unwrap_or(Duration::from_secs(300))
    }

    pub fn session_cache(&self) -> SessionCache {
        self.session_cache.clone().unwrap_or(SessionCache::None)
    }

    pub fn session_tickets(&self) -> bool {
        self.session_tickets.unwrap_or(true)
    }

    /// nginx's default: 1.
    pub fn verify_depth(&self) -> u64 {
        self.verify_depth.unwrap_or(1)
    }

    pub fn verify_client(&self) -> VerifyClient {
        self.verify_client
            .as_ref()
            .map_or(VerifyClient::Off, |v| v.0)
    }

    pub fn early_data(&self) -> bool {
        self.early_data.unwrap_or(false)
    }

    pub fn reject_handshake(&self) -> bool {
        self.reject_handshake.unwrap_or(false)
    }
}

fn file(d: &Directive, ctx: &LoadCtx) -> FileArg {
    FileArg {
        path: ctx.prefix.join(&d.args[0]),
        loc: d.loc.clone(),
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.tls;
    match d.name.as_str() {
        "ssl_certificate" => c
            .certificates
            .get_or_insert_with(Vec::new)
            .push(file(d, ctx)),
        "ssl_certificate_key" => c.keys.get_or_insert_with(Vec::new).push(file(d, ctx)),
        "ssl_password_file" => c.password_file = Some(Arc::new(read_passwords(file(d, ctx))?)),
        "ssl_protocols" => c.protocols = Some(protocols(d, ctx)?),
        "ssl_ciphers" => c.ciphers = Some(cipher_list(d, ctx)?),
        "ssl_prefer_server_ciphers" => c.prefer_server_ciphers = Some(setters::flag(d)?),
        "ssl_session_cache" => c.session_cache = Some(session_cache(d)?),
        "ssl_session_timeout" => {
            c.session_timeout = Some(Duration::from_secs(setters::sec_arg(d, 0)?))
        }
        "ssl_session_tickets" => c.session_tickets = Some(setters::flag(d)?),
        "ssl_stapling" => {
            let on = setters::flag(d)?;
            c.stapling = Some((on, d.loc.clone()));
        }
        "ssl_stapling_file" => c.stapling_file = Some(file(d, ctx)),
        // A bad URL is found, as nginx's, when a certificate is set up (a warning then).
        "ssl_stapling_responder" => c.stapling_responder = Some(d.args[0].clone()),
        "ssl_stapling_verify" => c.stapling_verify = Some(setters::flag(d)?),
        "ssl_client_certificate" => c.client_certificate = Some(file(d, ctx)),
        "ssl_trusted_certificate" => c.trusted_certificate = Some(file(d, ctx)),
        "ssl_crl" => c.crl = Some(file(d, ctx)),
        "ssl_ocsp" => {
            use crate::tls::ocsp::Mode;
            let mode = match d.args[0].as_str() {
                "off" => None,
                "on" => Some(Mode::All),
                "leaf" => Some(Mode::Leaf),
                other => return Err(invalid(d, other)),
            };
            c.ocsp = Some((mode, d.loc.clone()));
        }
        // Checked when the server is set up, and only with `ssl_ocsp` on, as nginx's.
        "ssl_ocsp_responder" => c.ocsp_responder = Some((d.args[0].clone(), d.loc.clone())),
        "ssl_ocsp_cache" => {
            if c.ocsp_cache.is_some() {
                return Err(d.error("\"ssl_ocsp_cache\" directive is duplicate"));
            }
            c.ocsp_cache = Some(ocsp_cache(d)?);
        }
        "ssl_verify_depth" => c.verify_depth = Some(setters::num_arg(d, 0)?),
        "ssl_verify_client" => {
            let v = match d.args[0].as_str() {
                "off" => VerifyClient::Off,
                "on" => VerifyClient::On,
                "optional" => VerifyClient::Optional,
                "optional_no_ca" => VerifyClient::OptionalNoCa,
                other => return Err(invalid(d, other)),
            };
            c.verify_client = Some((v, d.loc.clone()));
        }
        "ssl_reject_handshake" => c.reject_handshake = Some(setters::flag(d)?),
        "ssl_early_data" => c.early_data = Some(setters::flag(d)?),
        "ssl_ecdh_curve" => c.ecdh_curves = ecdh_curves(d, ctx)?,
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// `ssl_ciphers` (and `proxy_ssl_ciphers`): OpenSSL's cipher list syntax, for the TLS 1.2
/// suites rustls has; names it lacks are a notice.
pub fn cipher_list(d: &Directive, ctx: &mut LoadCtx) -> Result<Vec<CipherSuite>, ConfError> {
    let (list, unknown) = ciphers::parse(&d.args[0]);
    for u in unknown {
        ctx.notices.push(format!(
            "{}: cipher \"{u}\" in \"{}\" is not one gannet offers; ignored",
            d.loc, d.name
        ));
    }
    if list.is_empty() {
        return Err(d.error(format!(
            "\"{}\" selects no cipher gannet offers (TLS 1.2 suites: {})",
            d.name,
            ciphers::offered_tls12()
        )));
    }
    Ok(list)
}

/// `ssl_protocols` (and `proxy_ssl_protocols`): TLSv1.2 and TLSv1.3 are offered; older
/// names (Debian's stock config lists them) are accepted with a notice.
pub fn protocols(d: &Directive, ctx: &mut LoadCtx) -> Result<Protocols, ConfError> {
    let mut p = Protocols {
        tls12: false,
        tls13: false,
    };
    for a in &d.args {
        match a.as_str() {
            "TLSv1.2" => p.tls12 = true,
            "TLSv1.3" => p.tls13 = true,
            "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1" => ctx.notices.push(format!(
                "{}: \"{a}\" in \"{}\" is not offered: gannet speaks TLSv1.2 and TLSv1.3 only",
                d.loc, d.name
            )),
            other => return Err(invalid(d, other)),
        }
    }
    if !p.tls12 && !p.tls13 {
        return Err(d.error(format!(
            "\"{}\" names no protocol gannet offers (TLSv1.2, TLSv1.3)",
            d.name
        )));
    }
    Ok(p)
}

/// `ssl_ecdh_curve auto | name[:name...]` with OpenSSL's names for the groups rustls has;
/// OpenSSL groups it lacks are a notice.
fn ecdh_curves(d: &Directive, ctx: &mut LoadCtx) -> Result<Option<Vec<NamedGroup>>, ConfError> {
    if d.args[0] == "auto" {
        return Ok(None);
    }
    let mut groups = Vec::new();
    for name in d.args[0].split(':') {
        let g = match name {
            "X25519" | "x25519" => NamedGroup::X25519,
            "prime256v1" | "secp256r1" | "P-256" => NamedGroup::secp256r1,
            "secp384r1" | "P-384" => NamedGroup::secp384r1,
            "X448" | "x448" | "secp521r1" | "P-521" | "ffdhe2048" | "ffdhe3072" | "ffdhe4096"
            | "X25519MLKEM768" => {
                ctx.notices.push(format!(
                    "{}: curve \"{name}\" in \"ssl_ecdh_curve\" is not offered: gannet has X25519, prime256v1 and secp384r1",
                    d.loc
                ));
                continue;
            }
            other => return Err(invalid(d, other)),
        };
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    if groups.is_empty() {
        return Err(d.error(
            "\"ssl_ecdh_curve\" names no curve gannet offers (X25519, prime256v1, secp384r1)",
        ));
    }
    Ok(Some(groups))
}

/// `ssl_ocsp_cache off | shared:NAME:SIZE` (at least 8 pages, as nginx's zone).
fn ocsp_cache(d: &Directive) -> Result<Option<(String, usize)>, ConfError> {
    let v = &d.args[0];
    if v == "off" {
        return Ok(None);
    }
    let bad = || d.error(format!("invalid OCSP cache \"{v}\""));
    let rest = v.strip_prefix("shared:").ok_or_else(bad)?;
    let (name, size) = rest.split_once(':').ok_or_else(bad)?;
    if name.is_empty() {
        return Err(bad());
    }
    let bytes = setters::size(size).ok_or_else(bad)?;
    if bytes < 8 * 4096 {
        return Err(d.error(format!("OCSP cache \"{v}\" is too small")));
    }
    Ok(Some((name.to_string(), bytes as usize)))
}

fn session_cache(d: &Directive) -> Result<SessionCache, ConfError> {
    let mut chosen = None;
    for a in &d.args {
        let v = match a.as_str() {
            "off" => SessionCache::Off,
            "none" => SessionCache::None,
            "builtin" => SessionCache::Builtin(BUILTIN_SESSIONS),
            _ => {
                if let Some(n) = a.strip_prefix("builtin:") {
                    let n = setters::num(n)
                        .filter(|n| *n > 0)
                        .ok_or_else(|| invalid(d, a))?;
                    SessionCache::Builtin(n as usize)
                } else if let Some(rest) = a.strip_prefix("shared:") {
                    let (name, size) = rest.rsplit_once(':').ok_or_else(|| invalid(d, a))?;
                    let bytes = setters::size(size).ok_or_else(|| invalid(d, a))?;
                    if name.is_empty() || bytes < 8 * 1024 {
                        return Err(d.error(format!("zone \"{name}\" is too small")));
                    }
                    SessionCache::Shared {
                        name: name.to_string(),
                        sessions: (bytes / SESSION_BYTES) as usize,
                    }
                } else {
                    return Err(invalid(d, a));
                }
            }
        };
        if d.args.len() > 1 && matches!(v, SessionCache::Off | SessionCache::None) {
            return Err(invalid(d, a));
        }
        // With both builtin and shared, the shared cache is the one that serves.
        if !matches!(chosen, Some(SessionCache::Shared { .. })) {
            chosen = Some(v);
        }
    }
    chosen.ok_or_else(|| d.error("invalid number of arguments in \"ssl_session_cache\""))
}
