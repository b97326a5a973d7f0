//! Subrequests: a GET without a body, with the client's headers, through the request phases
//! from a URI as an internal request (so `internal` locations take it), skipping the access
//! phase as nginx's subrequests do. `auth_request`'s (see `modules::auth_request`): what it
//! answered (status and headers) goes back to the phases, its body is dropped. SSI's
//! `include` (see `conn::ssi`) and `add_before_body` / `add_after_body`'s: its answer with
//! its body, to be sent within the main answer.
//!
//! It runs inside `handler::settle`, which HTTP/1 and HTTP/2 both call, so there is one
//! code path for both protocols.

use super::gateway::{self, Outcome, Streaming};
use super::source::Source;
use crate::http::flow::Handled;
use crate::http::handler;
use crate::http::request::Request;
use crate::http::response::Response;
use crate::modules::auth_request::{self, Answer, Subrequest};
use crate::runtime::worker::Worker;
use gannet_proto::h1::{BodyKind, Method};

/// Run `sub` for `main`: fill in its answer and set `main`'s `auth_request_set` variables.
pub async fn auth(w: &Worker, main: &Request, sub: &mut Subrequest) {
    let (uri, args) = split(&sub.uri);
    let mut r = request(main, uri, args);
    let resp = answer(w, &mut r).await;
    log(w, &r, resp.status);
    main.vars.copy_from(&r.vars);
    let mut headers = resp.headers;
    // The gateway keeps these apart from the other headers.
    if let Some(ct) = resp.content_type {
        headers.push(("Content-Type".into(), ct.as_ref().into()));
    }
    if let Some(loc) = resp.location {
        headers.push(("Location".into(), loc.as_str().into()));
    }
    // `$upstream_http_*` in `auth_request_set` reads the subrequest's upstream answer,
    // which the gateway kept on `r` (the variable's use in the config asks it to).
    let args = auth_request::set_vars(main, &r);
    sub.answer = Answer {
        status: resp.status,
        headers,
        args,
    };
}

/// A subrequest of `main` for `uri` (a path) and `args`.
pub fn request(main: &Request, uri: String, args: Option<String>) -> Request {
    let mut head = main.head.clone();
    // A GET without a body whatever the client's method: the body is not read yet, and a
    // HEAD would make the gateway expect an answer without one.
    head.method = Method::Get;
    head.body = BodyKind::None;
    let mut r = Request::new(
        head,
        main.conn.clone(),
        main.server.clone(),
        uri,
        args,
        main.host.clone(),
    );
    r.internal = true;
    r.subrequest = true;
    r.method_override = Some(Method::Get);
    // $request_uri stays the client's (X-Original-URI); $uri is the subrequest's URI.
    r.uri_changed = true;
    r.real_peer = main.real_peer;
    // Limited (or not) with the request it serves, as nginx's subrequests are.
    r.limit_req_status = main.limit_req_status;
    r.limit_conn_status = main.limit_conn_status;
    // The variables are the main request's (a server-level `set` naming the auth
    // service's URL, as Authelia's snippets do); the caller takes back what it set.
    r.vars.copy_from(&main.vars);
    // One `$request_id` for the request and its subrequests (nginx's share the values of
    // their variables).
    r.request_id.set(Some(main.request_id()));
    r
}

/// `add_before_body` / `add_after_body`'s subrequest for `uri` (`/path?args`): its body
/// (whatever its status, as nginx), as a source to send in the main answer's, filtered by
/// its own location's settings. The subrequest is returned with it: reading the source
/// needs it.
pub async fn body(w: &Worker, main: &Request, uri: &str) -> Body {
    let (path, args) = split(uri);
    let mut r = Box::new(request(main, path, args));
    let (mut resp, stream) = run(w, &mut r).await;
    let src = match stream {
        Some(s) => Source::App(s),
        None => Source::whole(&mut resp),
    };
    let src = src.filtered(&mut resp);
    Body {
        req: r,
        src,
        status: resp.status,
    }
}

/// A subrequest whose body goes into the main answer, and its status (for
/// `log_subrequest`).
pub struct Body {
    pub req: Box<Request>,
    pub src: Source,
    pub status: u16,
}

/// `log_subrequest on` in the subrequest's location: a finished subrequest's line in its
/// access logs, with its status; its bytes count as the main request's (nginx logs a
/// subrequest's `$body_bytes_sent` as 0).
pub fn log(w: &Worker, r: &Request, status: u16) {
    if r.conf.core.log_subrequest() {
        super::log::access(w, r, &Response::new(status), 0, 0, false);
    }
}

/// `/path?args` as the path and the arguments (none if empty).
fn split(uri: &str) -> (String, Option<String>) {
    match uri.split_once('?') {
        Some((p, a)) => (p.to_string(), (!a.is_empty()).then(|| a.to_string())),
        None => (uri.to_string(), None),
    }
}

/// Run `r` through the phases (and its application): its answer, with the application's
/// body still to read when it is streamed (its headers then went through the filters).
pub async fn run(w: &Worker, r: &mut Request) -> (Response, Option<Box<Streaming>>) {
    // From the server's rewrites, as nginx's subrequests (internal requests).
    let start = handler::server_rewrites(r);
    let first = handler::resume(r, w, start);
    let mut handled = handler::settle(r, w, first).await;
    loop {
        match handled {
            Handled::Respond(resp) => return (resp, None),
            // `return 444` and a 101 are no answer to an authentication question: a 500
            // follows, as for any status that is neither 2xx, 401 nor 403.
            Handled::Close => return (Response::new(444), None),
            // A subrequest has no body of its own: `dav::put` answers 500, as nginx.
            Handled::Put => handled = handler::put_body_read(r, w),
            Handled::Delay(_)
            | Handled::AuthRequest(_)
            | Handled::LimitReqShared(_)
            | Handled::LimitConnShared(_) => handled = handler::settle(r, w, handled).await,
            Handled::Gateway => {
                let flow = match gateway::run(w, r).await {
                    Outcome::Flow(f) => f,
                    Outcome::Stream(mut resp, s) => {
                        // Slices are checked by their main request (`conn::slice`).
                        let _ = handler::finish_streamed(r, &mut resp);
                        return (resp, Some(s));
                    }
                    Outcome::Upgrade(resp, _) => return (resp, None),
                };
                handled = handler::resume(r, w, flow);
            }
        }
    }
}

/// The subrequest's answer, its body read off (an application's) or dropped.
async fn answer(w: &Worker, r: &mut Request) -> Response {
    let (resp, streamed) = run(w, r).await;
    if let Some(mut s) = streamed {
        // Read to its end (an authentication answer is short), so that a kept-alive
        // upstream connection can serve the next check.
        loop {
            match s.next(r).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    s.finish(w);
                    break;
                }
                // Cut short: the connection is not reused; the status stands, as the
                // head came whole.
                Err(()) => break,
            }
        }
    }
    resp
}
