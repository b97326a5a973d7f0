//! uwsgi, the configuration side (nginx's ngx_http_uwsgi_module): the shared gateway
//! directives with the `uwsgi_` prefix (`gateway`), and `uwsgi_modifier1` /
//! `uwsgi_modifier2`, the two bytes of the packet header that tell uWSGI which plugin
//! handles the request (0 is WSGI). The packet is in `gannet_proto::uwsgi`; the I/O in
//! `conn::gateway`.
//!
//! TLS to the application: `uwsgi_pass suwsgi://host:port` (nginx's scheme; `uwsgi://` is
//! the plain one), with the `uwsgi_ssl_*` directives, nginx's `proxy_ssl_*` set under
//! this module's prefix, read and built by the proxy's code (`proxy_ssl`, `tls::client`).

use super::gateway::{self, spec, GatewayConf, Proto};
use super::proxy_ssl::{self, ProxySslConf};
use super::{inherit, invalid, LoadCtx, LocConf};
use crate::tls::client::ClientTls;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = gateway::directives!(
    "uwsgi_",
    spec("uwsgi_modifier1", Ctx::HSL, Args::Exactly(1)),
    spec("uwsgi_modifier2", Ctx::HSL, Args::Exactly(1)),
);

#[derive(Debug, Clone, Default)]
pub struct UwsgiConf {
    pub gw: GatewayConf,
    /// `uwsgi_ssl_*`.
    pub ssl: ProxySslConf,
    /// `uwsgi_pass suwsgi://`: the connection is TLS (set with the pass: not inherited).
    pub tls: bool,
    /// The TLS client setup built from `ssl` when `tls` (`proxy_ssl::finish`).
    pub client_tls: Option<Arc<ClientTls>>,
    pub modifier1: Option<u8>,
    pub modifier2: Option<u8>,
}

impl UwsgiConf {
    pub fn merge(&mut self, parent: &UwsgiConf) {
        self.gw.merge(&parent.gw);
        self.ssl.merge(&parent.ssl);
        inherit!(self, parent, modifier1, modifier2);
    }
}

/// `uwsgi_ssl_*` (see the module docs).
pub const SSL_DIRECTIVES: &[Spec] = proxy_ssl::ssl_directives!("uwsgi_ssl_");

pub fn set_ssl(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    proxy_ssl::set_on(d, "uwsgi_ssl_", &mut lc.uwsgi.ssl, ctx)
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if d.name == "uwsgi_pass" {
        // The scheme, as nginx reads it: `suwsgi://` for TLS, `uwsgi://` or none for plain.
        let a0 = d.args[0].as_str();
        let (rest, tls) = match strip_scheme(a0) {
            Some((rest, tls)) => (rest, tls),
            None => (a0, false),
        };
        let mut plain = d.clone();
        plain.args[0] = rest.to_string();
        gateway::set(&plain, Proto::Uwsgi, lc, ctx)?;
        lc.uwsgi.tls = tls;
        return Ok(());
    }
    if gateway::set(d, Proto::Uwsgi, lc, ctx)? {
        return Ok(());
    }
    // One byte each in the packet header: nginx bounds them to 0..255 too.
    let n = setters::num_arg(d, 0)?;
    let n = u8::try_from(n).map_err(|_| invalid(d, &d.args[0]))?;
    match d.name.as_str() {
        "uwsgi_modifier1" => lc.uwsgi.modifier1 = Some(n),
        "uwsgi_modifier2" => lc.uwsgi.modifier2 = Some(n),
        _ => unreachable!("not a uwsgi directive: {}", d.name),
    }
    Ok(())
}

/// `uwsgi://` or `suwsgi://` (any case, as nginx compares it) taken off a pass value, with
/// whether it asks for TLS.
pub fn strip_scheme(v: &str) -> Option<(&str, bool)> {
    let starts = |p: &str| v.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p));
    if starts("uwsgi://") {
        Some((&v[8..], false))
    } else if starts("suwsgi://") {
        Some((&v[9..], true))
    } else {
        None
    }
}
