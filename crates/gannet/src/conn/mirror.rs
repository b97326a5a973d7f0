//! The copies `mirror` makes (see `modules::mirror`): each runs as its own task in the
//! worker's event loop, through the request phases from the mirror URI (as an internal
//! request, so `internal` locations take it), and any answer is read to its end and
//! dropped. The client's connection never waits for it.

use super::gateway::{self, Outcome};
use crate::http::handler::{self, Flow, Handled};
use crate::http::request::Request;
use crate::runtime::worker::Worker;
use std::rc::Rc;

/// Start a copy of `req` for each mirror URI of its location (none: nothing to do).
pub fn spawn(w: &Rc<Worker>, req: &Request) {
    let m = &req.conf.mirror;
    if m.uris().is_empty() {
        return;
    }
    // The body (in memory or its temporary file) is shared, not copied: each copy reads
    // its file from the start on its own.
    let body = req.body.clone().filter(|_| m.request_body());
    for uri in m.uris() {
        let mut copy = copy_of(req, uri.clone());
        // $request_uri stays the client's; $uri is the mirror's.
        copy.uri_changed = true;
        copy.body = body.clone();
        let w = w.clone();
        tokio::task::spawn_local(async move { run(&w, copy).await });
    }
}

/// An internal copy of `req` for `uri`, without a body: as nginx's subrequests, it shares
/// the request's head, connection and (realip-changed) address, and is limited (or not)
/// with it.
pub(super) fn copy_of(req: &Request, uri: String) -> Request {
    let mut copy = Request::new(
        req.head.clone(),
        req.conn.clone(),
        req.server.clone(),
        uri,
        req.args.clone(),
        req.host.clone(),
    );
    copy.internal = true;
    copy.limit_req_status = req.limit_req_status;
    copy.limit_conn_status = req.limit_conn_status;
    copy.real_peer = req.real_peer;
    copy
}

/// Run a copy through the request phases, its answer read to its end and dropped (a
/// cache's background update runs so too).
pub(super) async fn run(w: &Worker, mut req: Request) {
    let first = handler::resume(&mut req, w, Flow::Next);
    let mut handled = handler::settle(&mut req, w, first).await;
    // An application's local redirect or intercepted error may lead to another one; the
    // request phases bound how often.
    while let Handled::Gateway = handled {
        let flow = match gateway::run(w, &req).await {
            Outcome::Flow(f) => f,
            Outcome::Stream(_, mut s) => {
                while let Ok(Some(_)) = s.next(&req).await {}
                s.finish(w);
                return;
            }
            Outcome::Upgrade(..) => return,
        };
        let next = handler::resume(&mut req, w, flow);
        handled = handler::settle(&mut req, w, next).await;
    }
}
