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
//! upstreams that ask for one), `proxy_ssl_password_file` (passphrases for that key) and
//! `proxy_ssl_session_reuse` (on). uwsgi's `uwsgi_ssl_*` (for `uwsgi_pass suwsgi://`) and
//! grpc's `grpc_ssl_*` (for `grpc_pass grpcs://`) are the same set, read by the same code
//! ([`ssl_directives`], [`set_on`]) and built into a client setup by the same [`finish`].
//!
//! The stream proxy (`stream::proxy`) reads its `proxy_ssl_*` with [`set_on`] too, all but
//! `proxy_ssl_name` and a certificate or key with variables, whose values have stream
//! variables.
//!
//! As in nginx, `proxy_ssl_verify on` needs `proxy_ssl_trusted_certificate`: there are no
//! built-in system roots (no roots crate is in the build).

use super::grpc::Target as GrpcTarget;
use super::proxy::Target;
use super::rewrite::Stmt;
use super::tls::{self as server_tls, FileArg, Protocols};
use super::{inherit, LoadCtx, LocConf};
use crate::http::variables::Template;
use crate::tls::certs::{read_passwords, Passwords};
use gannet_conf::registry::Spec;
use gannet_conf::{setters, ConfError, Directive, Loc};
use rustls::CipherSuite;
use std::sync::Arc;

/// The table of one module's upstream TLS directives under its prefix (`proxy_ssl_`,
/// `uwsgi_ssl_`): nginx gives the proxy and uwsgi modules the same set, read here by
/// one `set_on`. Names are built at compile time, as `gateway::directives!` does.
macro_rules! ssl_directives {
    ($p:literal) => {
        &[
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "verify" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "trusted_certificate" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "crl" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "verify_depth" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "server_name" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "name" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "protocols" AtLeast(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "ciphers" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "certificate" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "certificate_key" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "password_file" Exactly(1)),
            $crate::modules::proxy_ssl::ssl_directives!(@spec $p "session_reuse" Exactly(1)),
        ]
    };
    (@spec $p:literal $suffix:literal $($args:tt)+) => {
        gannet_conf::registry::Spec {
            name: concat!($p, $suffix),
            ctx: gannet_conf::registry::Ctx::HSL,
            args: gannet_conf::registry::Args::$($args)+,
            block: false,
        }
    };
}
pub(crate) use ssl_directives;

pub const DIRECTIVES: &[Spec] = ssl_directives!("proxy_ssl_");

/// `*_ssl_certificate` / `*_ssl_certificate_key`: a file, or (nginx 1.21+) a value with
/// variables naming the file per request (relative to the prefix; empty: no certificate).
#[derive(Debug, Clone)]
pub struct CertArg {
    /// The file as written (with the prefix), and where.
    pub file: FileArg,
    pub vars: Option<Template>,
    pub prefix: std::path::PathBuf,
}

impl CertArg {
    /// The file this request names (`None` for an empty value).
    pub fn path(&self, req: &crate::http::request::Request) -> Option<FileArg> {
        let Some(t) = &self.vars else {
            return Some(self.file.clone());
        };
        let v = t.eval(req, None);
        (!v.is_empty()).then(|| FileArg {
            path: self.prefix.join(v),
            loc: self.file.loc.clone(),
        })
    }
}

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
    pub certificate: Option<CertArg>,
    pub certificate_key: Option<CertArg>,
    /// `*_ssl_password_file`: passphrases for an encrypted `certificate_key`.
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
    set_on(d, "proxy_ssl_", &mut lc.proxy.ssl, ctx)
}

/// One upstream TLS directive whose name starts with `prefix`, into `c`.
pub fn set_on(
    d: &Directive,
    prefix: &str,
    c: &mut ProxySslConf,
    ctx: &mut LoadCtx,
) -> Result<(), ConfError> {
    let a0 = d.args[0].as_str();
    let unknown = || d.error(format!("unknown directive \"{}\"", d.name));
    let suffix = d.name.strip_prefix(prefix).ok_or_else(unknown)?;
    match suffix {
        "verify" => c.verify = Some((setters::flag(d)?, d.loc.clone())),
        "trusted_certificate" => c.trusted_certificate = Some(file(d, ctx)),
        "crl" => c.crl = Some(file(d, ctx)),
        "verify_depth" => c.verify_depth = Some(setters::num_arg(d, 0)?),
        "server_name" => c.server_name = Some(setters::flag(d)?),
        "name" => c.name = Some(Template::compile(a0).map_err(|e| d.error(e))?),
        "protocols" => c.protocols = Some(server_tls::protocols(d, ctx)?),
        "ciphers" => c.ciphers = Some(server_tls::cipher_list(d, ctx)?),
        "certificate" | "certificate_key" => {
            let vars = if a0.contains('$') {
                Some(Template::compile(a0).map_err(|e| d.error(e))?)
            } else {
                None
            };
            let arg = CertArg {
                file: file(d, ctx),
                vars,
                prefix: ctx.prefix.clone(),
            };
            if suffix == "certificate" {
                c.certificate = Some(arg);
            } else {
                c.certificate_key = Some(arg);
            }
        }
        "password_file" => c.password_file = Some(Arc::new(read_passwords(file(d, ctx))?)),
        "session_reuse" => c.session_reuse = Some(setters::flag(d)?),
        _ => return Err(unknown()),
    }
    Ok(())
}

/// After a location's merge: the rustls client setup its `proxy_pass` needs, if it may
/// reach an `https://` upstream (an https URL, or one built from variables), its
/// `uwsgi_pass suwsgi://` or its `grpc_pass grpcs://`, and the same for its `if` blocks. Locations with the same settings share one setup.
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

/// After `access::merge_limit_except`: the same for a `limit_except` block's settings,
/// which serve the methods it limits (with the location's handler, `inherit_handler`).
pub fn finish_limit_except(lc: &mut LocConf, ctx: &mut LoadCtx, at: &Loc) -> Result<(), ConfError> {
    match lc.access.limit_except.as_mut() {
        Some(lx) => build_for(Arc::make_mut(&mut Arc::make_mut(lx).conf), ctx, at),
        None => Ok(()),
    }
}

fn build_for(lc: &mut LocConf, ctx: &mut LoadCtx, at: &Loc) -> Result<(), ConfError> {
    let may_tls = match lc.proxy.target.as_deref() {
        Some(Target::Fixed(dest)) => dest.tls,
        Some(Target::Vars(..)) => true,
        None => false,
    };
    if may_tls && lc.proxy.client_tls.is_none() {
        // `proxy_http_version 2` asks the server for `h2` (ALPN), as nginx.
        let alpn = lc.proxy.http2().then_some(&b"h2"[..]);
        lc.proxy.client_tls = Some(build(&lc.proxy.ssl, "proxy_ssl_", ctx, at, alpn)?);
    }
    if lc.uwsgi.tls && lc.uwsgi.client_tls.is_none() {
        lc.uwsgi.client_tls = Some(build(&lc.uwsgi.ssl, "uwsgi_ssl_", ctx, at, None)?);
    }
    // grpc: a grpcs URL, or one with variables; the upstream is asked for `h2` (ALPN).
    let may_tls = match lc.grpc.target.as_deref() {
        Some(GrpcTarget::Fixed(dest)) => dest.tls,
        Some(GrpcTarget::Vars(..)) => true,
        None => false,
    };
    if may_tls && lc.grpc.client_tls.is_none() {
        lc.grpc.client_tls = Some(build(&lc.grpc.ssl, "grpc_ssl_", ctx, at, Some(b"h2"))?);
    }
    Ok(())
}

fn build(
    c: &ProxySslConf,
    prefix: &'static str,
    ctx: &mut LoadCtx,
    at: &Loc,
    alpn: Option<&'static [u8]>,
) -> Result<Arc<crate::tls::client::ClientTls>, ConfError> {
    crate::tls::client::build(c, prefix, &mut ctx.tls, at, alpn)
}
