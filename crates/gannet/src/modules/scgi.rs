//! SCGI, the configuration side (nginx's ngx_http_scgi_module): only the shared gateway
//! directives with the `scgi_` prefix (`gateway`), as in nginx, where SCGI has none of its
//! own. `CONTENT_LENGTH` and `SCGI` are written by the protocol itself
//! (`gannet_proto::scgi`), so `scgi_param`s of those names are not sent twice. The I/O is
//! in `conn::gateway`.

use super::gateway::{self, Proto};
use super::{LoadCtx, LocConf};
use gannet_conf::registry::Spec;
use gannet_conf::{ConfError, Directive};

pub const DIRECTIVES: &[Spec] = gateway::directives!("scgi_");

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if gateway::set(d, Proto::Scgi, lc, ctx)? {
        return Ok(());
    }
    unreachable!("not an scgi directive: {}", d.name)
}
