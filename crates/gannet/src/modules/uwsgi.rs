//! uwsgi, the configuration side (nginx's ngx_http_uwsgi_module): the shared gateway
//! directives with the `uwsgi_` prefix (`gateway`), and `uwsgi_modifier1` /
//! `uwsgi_modifier2`, the two bytes of the packet header that tell uWSGI which plugin
//! handles the request (0 is WSGI). The packet is in `gannet_proto::uwsgi`; the I/O in
//! `conn::gateway`.

use super::gateway::{self, spec, GatewayConf, Proto};
use super::{inherit, invalid, LoadCtx, LocConf};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};

pub const DIRECTIVES: &[Spec] = gateway::directives!(
    "uwsgi_",
    spec("uwsgi_modifier1", Ctx::HSL, Args::Exactly(1)),
    spec("uwsgi_modifier2", Ctx::HSL, Args::Exactly(1)),
);

#[derive(Debug, Clone, Default)]
pub struct UwsgiConf {
    pub gw: GatewayConf,
    pub modifier1: Option<u8>,
    pub modifier2: Option<u8>,
}

impl UwsgiConf {
    pub fn merge(&mut self, parent: &UwsgiConf) {
        self.gw.merge(&parent.gw);
        inherit!(self, parent, modifier1, modifier2);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
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
