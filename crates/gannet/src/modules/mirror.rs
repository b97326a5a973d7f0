//! `mirror URI | off` and `mirror_request_body on | off` (nginx's ngx_http_mirror_module):
//! each request of the location is also sent, as an internal request to URI (usually an
//! `internal` location with a `proxy_pass` to a shadow server), and the copy's answer is
//! thrown away. The built-in equivalent of the TCPCopy set-up in study S4.
//!
//! Unlike nginx, where a client's next keep-alive request waits until the mirrors of the
//! previous one are done, a copy runs on its own in the worker's event loop (see
//! `conn::mirror`): a slow or dead shadow server never slows the main traffic.
//!
//! Lists are inherited by levels that set none; `mirror off` clears them.

use super::{LoadCtx, LocConf};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    super::gateway::spec("mirror", Ctx::HSL, Args::Exactly(1)),
    super::gateway::spec("mirror_request_body", Ctx::HSL, Args::Exactly(1)),
];

#[derive(Debug, Clone, Default)]
pub struct MirrorConf {
    pub uris: Option<Arc<Vec<String>>>,
    pub body: Option<bool>,
}

impl MirrorConf {
    pub fn merge(&mut self, parent: &MirrorConf) {
        super::inherit!(self, parent, uris, body);
    }

    /// The URIs to copy requests to (none by default).
    pub fn uris(&self) -> &[String] {
        self.uris.as_deref().map_or(&[], |u| u.as_slice())
    }

    pub fn request_body(&self) -> bool {
        self.body.unwrap_or(true)
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.mirror;
    let a0 = d.args[0].as_str();
    match d.name.as_str() {
        "mirror" if a0 == "off" => {
            if c.uris.as_ref().is_some_and(|u| !u.is_empty()) {
                return Err(d.error("\"mirror\" directive is duplicate"));
            }
            c.uris = Some(Arc::new(Vec::new()));
        }
        "mirror" => {
            if !a0.starts_with('/') {
                return Err(super::invalid(d, a0));
            }
            let mut l = c.uris.as_deref().cloned().unwrap_or_default();
            l.push(a0.to_string());
            c.uris = Some(Arc::new(l));
        }
        "mirror_request_body" => c.body = Some(setters::flag(d)?),
        _ => unreachable!("not a mirror directive: {}", d.name),
    }
    Ok(())
}
