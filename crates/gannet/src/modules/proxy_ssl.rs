//! TLS to upstream servers, the configuration side: what a location that proxies to
//! `https://` asks of the handshake (nginx's `proxy_ssl_*` directives). The rustls client
//! setup is built from the merged settings at load time (`tls::client`), so a missing or
//! broken certificate file is a `file:line` error from `gannet -t`; the handshake itself is
//! in `conn::gateway`.
//!
//! Directives: `proxy_ssl_verify` (off), `proxy_ssl_trusted_certificate`,
//! `proxy_ssl_crl`, `proxy_ssl_verify_depth` (1, accepted: rustls's chain builder has no
//! depth limit to set), `proxy_ssl_server_name` (off), `proxy_ssl_name` (`$proxy_host`),
//! `proxy_ssl_protocols` (`TLSv1.2 TLSv1.3`), `proxy_ssl_ciphers`,
//! `proxy_ssl_certificate` / `proxy_ssl_certificate_key` (a client certificate for
//! upstreams that ask for one), `proxy_ssl_password_file` (the passphrases of an
//! encrypted `proxy_ssl_certificate_key`) and `proxy_ssl_session_reuse` (on).
//!
//! The stream proxy (`stream::proxy`) takes the same settings through [`set_conf`], all
//! but `proxy_ssl_name`, whose value has stream variables.
//!
//! As in nginx, `proxy_ssl_verify on` needs `proxy_ssl_trusted_certificate`: there are no
//! built-in system roots (no roots crate is in the build).

use super::proxy::Target;
use super::rewrite::Stmt;
use super::tls::{self as server_tls, FileArg, Protocols};
use super::{inherit, LoadCtx, LocConf};
use crate::http::variables::Template;
use crate::tls::certs::{read_passwords, Passwords};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive, Loc};
use rustls::CipherSuite;
use std::sync::Arc;

const HSL: Ctx = Ctx::HSL;

const fn spec(name: &'static str, args: Args) -> Spec {
    Spec {
        name,
        ctx: HSL,
        args,
        block: false,
    }
}

pub const DIRECTIVES: &[Spec] = &[
    spec("proxy_ssl_verify", Args::Exactly(1)),
    spec("proxy_ssl_trusted_certificate", Args::Exactly(1)),
    spec("proxy_ssl_crl", Args::Exactly(1)),
    spec("proxy_ssl_verify_depth", Args::Exactly(1)),
    spec("proxy_ssl_server_name", Args::Exactly(1)),
    spec("proxy_ssl_name", Args::Exactly(1)),
    spec("proxy_ssl_protocols", Args::AtLeast(1)),
    spec("proxy_ssl_ciphers", Args::Exactly(1)),
    spec("proxy_ssl_certificate", Args::Exactly(1)),
    spec("proxy_ssl_certificate_key", Args::Exactly(1)),
    spec("proxy_ssl_session_reuse", Args::Exactly(1)),
    spec("proxy_ssl_password_file", Args::Exactly(1)),
];

/// The `proxy_ssl_*` settings of one level, merged like the others.
#[derive(Debug, Clone, Default)]
pub struct ProxySslConf {
    /// With where it was set: the "no trusted certificate" error points there.
    pub verify: Option<(bool, Loc)>,
    pub trusted_certificate: Option<FileArg>,
    pub crl: Option<FileArg>,
    pub verify_depth: Option<u64>,
    pub server_name: Option<bool>,
    /// The name checked against the certificate and sent as SNI; `$proxy_host` without
    /// its port when unset.
    pub name: Option<Template>,
    pub protocols: Option<Protocols>,
    /// The TLS 1.2 suites offered, in order (TLS 1.3's are always offered).
    pub ciphers: Option<Vec<CipherSuite>>,
    pub certificate: Option<FileArg>,
    pub certificate_key: Option<FileArg>,
    /// `proxy_ssl_password_file`, read when the directive is.
    pub password_file: Option<Arc<Passwords>>,
    pub session_reuse: Option<bool>,
}

impl ProxySslConf {
    pub fn merge(&mut self, parent: &ProxySslConf) {
        inherit!(
            self,
            parent,
            verify,
            trusted_certificate,
            crl,
            verify_depth,
            server_name,
            name,
            protocols,
            ciphers,
            certificate,
            certificate_key,
            password_file,
            session_reuse,
        );
    }

    pub fn verify(&self) -> bool {
        self.verify.as_ref().is_some_and(|v| v.0)
    }

    pub fn server_name(&self) -> bool {
        self.server_name.unwrap_or(false)
    }

    /// nginx's default since 1.23.4.
    pub fn protocols(&self) -> Protocols {
        self.protocols.unwrap_or(Protocols {
            tls12: true,
            tls13: true,
        })
    }

    pub fn session_reuse(&self) -> bool {
        self.session_reuse.unwrap_or(true)
    }
}

fn file(d: &Directive, ctx: &LoadCtx) -> FileArg {
    FileArg {
        path: ctx.prefix.join(&d.args[0]),
        loc: d.loc.clone(),
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.proxy.ssl;
    match d.name.as_str() {
        "proxy_ssl_name" => {
            c.name = Some(Template::compile(&d.args[0]).map_err(|e| d.error(e))?);
            Ok(())
        }
        _ => set_conf(d, c, ctx),
    }
}

/// A `proxy_ssl_*` directive other than `proxy_ssl_name`, of http or stream.
pub fn set_conf(d: &Directive, c: &mut ProxySslConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let a0 = d.args[0].as_str();
    match d.name.as_str() {
        "proxy_ssl_verify" => c.verify = Some((setters::flag(d)?, d.loc.clone())),
        "proxy_ssl_trusted_certificate" => c.trusted_certificate = Some(file(d, ctx)),
        "proxy_ssl_crl" => c.crl = Some(file(d, ctx)),
        "proxy_ssl_verify_depth" => c.verify_depth = Some(setters::num_arg(d, 0)?),
        "proxy_ssl_server_name" => c.server_name = Some(setters::flag(d)?),
        "proxy_ssl_protocols" => c.protocols = Some(server_tls::protocols(d, ctx)?),
        "proxy_ssl_ciphers" => c.ciphers = Some(server_tls::cipher_list(d, ctx)?),
        "proxy_ssl_certificate" => {
            if a0.contains('$') {
                return Err(d.error("variables in \"proxy_ssl_certificate\" are not supported yet"));
            }
            c.certificate = Some(file(d, ctx));
        }
        "proxy_ssl_certificate_key" => {
            if a0.contains('$') {
                return Err(
                    d.error("variables in \"proxy_ssl_certificate_key\" are not supported yet")
                );
            }
            c.certificate_key = Some(file(d, ctx));
        }
        "proxy_ssl_session_reuse" => c.session_reuse = Some(setters::flag(d)?),
        "proxy_ssl_password_file" => {
            c.password_file = Some(Arc::new(read_passwords(file(d, ctx))?))
        }
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// After a location's merge: the rustls client setup its `proxy_pass` needs, if it may
/// reach an `https://` upstream (an https URL, or one built from variables), and the same
/// for its `if` blocks. Locations with the same settings share one setup.
pub fn finish(lc: &mut LocConf, ctx: &mut LoadCtx, at: &Loc) -> Result<(), ConfError> {
    build_for(lc, ctx, at)?;
    let mut stmts = std::mem::take(&mut lc.rewrite.stmts);
    let mut r = Ok(());
    for s in Arc::make_mut(&mut stmts) {
        if let Stmt::If { conf: Some(c), .. } = s {
            r = r.and_then(|()| build_for(Arc::make_mut(c), ctx, at));
        }
    }
    lc.rewrite.stmts = stmts;
    r
}

fn build_for(lc: &mut LocConf, ctx: &mut LoadCtx, at: &Loc) -> Result<(), ConfError> {
    let may_tls = match lc.proxy.target.as_deref() {
        Some(Target::Fixed(dest)) => dest.tls,
        Some(Target::Vars(..)) => true,
        None => false,
    };
    if may_tls && lc.proxy.client_tls.is_none() {
        lc.proxy.client_tls = Some(crate::tls::client::build(&lc.proxy.ssl, &mut ctx.tls, at)?);
    }
    Ok(())
}
