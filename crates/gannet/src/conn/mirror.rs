//! The copies `mirror` makes (see `modules::mirror`): each runs as its own task in the
//! worker's event loop, through the request phases from the mirror URI (as an internal
//! request, so `internal` locations take it), and any answer is read to its end and
//! dropped. The client's connection never waits for it.
//!
//! `post_action` (core) runs the same way: the request again at its URI or named location,
//! its answer dropped. nginx runs it once the answer is sent, on the request itself;
//! gannet starts it with the answer, as its own task.

use super::gateway::{self, Outcome};
use crate::http::flow::{Flow, Handled};
use crate::http::handler;
use crate::http::request::Request;
use crate::runtime::worker::Worker;
use std::rc::Rc;

/// Start a copy of `req` for each mirror URI of the locations it went through (none:
/// nothing to do), and its location's `post_action`.
pub fn spawn(w: &Rc<Worker>, req: &Request) {
    if let Some(to) = &req.conf.core.post_action {
        if !req.subrequest {
            let mut copy = copy_of(req, req.uri.clone(), None);
            let start = if to.starts_with('@') {
                Flow::Redirect(to.to_string())
            } else {
                copy.uri = to.to_string();
                Flow::Next
            };
            let w = w.clone();
            tokio::task::spawn_local(async move { run(&w, copy, start).await });
        }
    }
    // Each location with `mirror` the request went through, in order (again after an
    // internal redirect, as nginx's precontent phase).
    for conf in &req.mirrored {
        let m = &conf.mirror;
        // The body (in memory or its temporary file) is shared, not copied: each copy
        // reads its file from the start on its own.
        let body = req.body.clone().filter(|_| m.request_body());
        for uri in m.uris() {
            let copy = copy_of(req, uri.clone(), body.clone());
            let w = w.clone();
            tokio::task::spawn_local(async move { run(&w, copy, Flow::Next).await });
        }
    }
}

/// `req` again, as an internal request for `uri` (with `body`, if any): as nginx's
/// subrequests, it shares the request's head, connection and (realip-changed) address.
pub(super) fn copy_of(
    req: &Request,
    uri: String,
    body: Option<Rc<crate::conn::request_body::RequestBody>>,
) -> Request {
    let mut copy = Request::new(
        req.head.clone(),
        req.conn.clone(),
        req.server.clone(),
        uri,
        req.args.clone(),
        req.host.clone(),
    );
    copy.internal = true;
    // Limited (or not) with the request it copies, as nginx's subrequests are.
    copy.limit_req_status = req.limit_req_status;
    copy.limit_conn_status = req.limit_conn_status;
    // Subrequests share the connection's (realip-changed) address in nginx.
    copy.real_peer = req.real_peer;
    // $request_uri stays the client's; $uri is the copy's.
    copy.uri_changed = true;
    copy.body = body;
    copy
}

/// Run a copy through the request phases, its answer read to its end and dropped (a
/// cache's background update runs so too).
pub(super) async fn run(w: &Worker, mut req: Request, start: Flow) {
    // `log_subrequest on` in the location the copy ended in logs it, as nginx's mirror
    // subrequests.
    if let Some(status) = answer(w, &mut req, start).await {
        super::subrequest::log(w, &req, status);
    }
}

/// Run the copy to the end of its answer (dropped); its status.
async fn answer(w: &Worker, req: &mut Request, start: Flow) -> Option<u16> {
    let first = handler::resume(req, w, start);
    let mut handled = handler::settle(req, w, first).await;
    // An application's local redirect or intercepted error may lead to another one; the
    // request phases bound how often.
    while let Handled::Gateway = handled {
        let flow = match gateway::run(w, req).await {
            Outcome::Flow(f) => f,
            Outcome::Stream(resp, mut s) => {
                while let Ok(Some(_)) = s.next(req).await {}
                s.finish(w);
                return Some(resp.status);
            }
            Outcome::Upgrade(..) => return None,
        };
        let next = handler::resume(req, w, flow);
        handled = handler::settle(req, w, next).await;
    }
    match handled {
        Handled::Respond(resp) => Some(resp.status),
        _ => None,
    }
}
