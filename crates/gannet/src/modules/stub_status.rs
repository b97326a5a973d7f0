//! `stub_status` (server, location; nginx's old `stub_status on|off` form is accepted too):
//! the location answers with the server's connection counters in nginx's text layout,
//! which monitoring tools (nginx-prometheus-exporter) parse byte for byte. Also the
//! variables `$connections_active`, `$connections_reading`, `$connections_writing` and
//! `$connections_waiting`. The counters are the whole server's (`runtime::conn_stats`).

use super::{LoadCtx, LocConf};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use crate::runtime::conn_stats::Totals;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use gannet_proto::h1::Method;
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "stub_status",
    ctx: Ctx(Ctx::SERVER.0 | Ctx::LOCATION.0),
    args: Args::Between(0, 1),
    block: false,
}];

/// Only the level that says it answers with the status: nginx sets the location's
/// content handler, which is not inherited.
pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    // The argument of the old `stub_status on` form is not looked at, as in nginx.
    let _ = d;
    lc.stub_status = true;
    Ok(())
}

/// The content handler of a `stub_status` location.
pub fn handle(req: &Request) -> Flow {
    if !matches!(req.method(), Method::Get | Method::Head) {
        return Flow::Status(405);
    }
    let t = Totals::now();
    let body = format!(
        "Active connections: {} \nserver accepts handled requests\n {} {} {} \n\
         Reading: {} Writing: {} Waiting: {} \n",
        t.active,
        t.accepted,
        t.handled,
        t.requests,
        t.reading,
        t.writing,
        t.waiting()
    );
    let mut r = Response::new(200);
    r.content_type = Some(Arc::from("text/plain"));
    r.body = Body::bytes(body);
    Flow::Done(r)
}

/// `$connections_active|reading|writing|waiting` (`which` is the name's last part).
pub fn variable(which: Gauge) -> u64 {
    let t = Totals::now();
    match which {
        Gauge::Active => t.active,
        Gauge::Reading => t.reading,
        Gauge::Writing => t.writing,
        Gauge::Waiting => t.waiting(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    Active,
    Reading,
    Writing,
    Waiting,
}
