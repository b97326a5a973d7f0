//! The request phases, in order, as a plain loop (the order is written here and nowhere
//! else):
//!
//! 1. server rewrite (`return` / `rewrite` at server level)
//! 2. find location (again after a rewrite or internal redirect; at most 10 times); an
//!    `internal` one refuses outside requests, and a `limit_except` block's settings
//!    replace the location's for the methods it limits (before its rewrites, as in nginx)
//! 3. rewrite (location level)
//! 4. pre-access: `limit_req` (which may refuse the request or make it wait), then
//!    `limit_conn`; once per request
//! 5. access: `allow` / `deny`, `auth_basic`, `auth_request` (`satisfy all | any`); an
//!    `auth_request` subrequest is run by [`settle`], which then resumes here
//! 6. content: `try_files`, then the location's application (`fastcgi_pass`, `scgi_pass`,
//!    `uwsgi_pass`) or else
//!    `index`, `autoindex`, static files
//! 7. errors: `error_page` redirect, else the built-in page
//! 8. filters: `expires` / `add_header`, then conditional requests and ranges, then
//!    `ssi`, then `sub_filter`, then `charset`, then compression (gzip, Brotli, zstd)
//!
//! Each handler returns a [`Flow`], like nginx's NGX_DECLINED / NGX_OK / status codes.
//! The phases are synchronous; an application's answer is awaited by the connection, which
//! then hands its outcome back to [`resume`] (so error_page and local redirects apply to it).
//! A `limit_req` delay is waited out by the connection too, which then resumes with
//! [`Flow::Delayed`] where the phases stopped.

use crate::errlog::Level;
use crate::http::flow::{Flow, Handled};
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::router::{find_location, Matcher};
use crate::http::{compress, conditional};
use crate::modules::error_page::Override;
use crate::modules::rewrite::{self, Outcome};
use crate::modules::{
    access, addition, autoindex, charset, dav, gateway, gunzip, headers, image_filter, index,
    limit_conn, limit_req, limit_zone, otel, random_index, realip, slice, ssi, static_files,
    stub_status, sub_filter, try_files, userid,
};
use crate::runtime::worker::Worker;
use gannet_proto::cgi::HeaderValue;
use gannet_proto::h1::{BodyKind, Method};
use std::borrow::Cow;
use std::sync::Arc;

/// The most internal redirects and location searches one request may make.
const MAX_REDIRECTS: u8 = 10;

/// Run the phases.
pub fn handle(req: &mut Request, w: &Worker) -> Handled {
    // ACME's HTTP-01 answers, before the server's rewrites and whatever its locations
    // say (nginx-acme's post-read phase handler).
    if let Some(acme) = &w.config.acme {
        if req.method() == Method::Get {
            if let Some(r) = acme.answer(&req.uri) {
                return resume(req, w, Flow::Done(r));
            }
        }
    }
    crate::http::router::bind_server_captures(req);
    realip::apply(req, true);
    if !w.config.main.debug_connection.is_empty()
        || crate::errlog::admits_for(req, crate::errlog::Level::Debug)
    {
        debug_request(req);
    }
    let flow = server_rewrites(req);
    resume(req, w, flow)
}

/// A request's debug lines (nginx's "http request line", "http uri", "http args" and the
/// header lines), for a log at `debug` or a client `debug_connection` names.
fn debug_request(req: &Request) {
    use crate::errlog::{admits_for, debugged, Level};
    if !admits_for(req, Level::Debug) && !debugged(req) {
        return;
    }
    let raw = req.head.raw();
    let mut lines = raw
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let line = String::from_utf8_lossy(lines.next().unwrap_or_default());
    crate::errlog::request(
        Level::Debug,
        req,
        format_args!("http request line: \"{line}\""),
    );
    crate::errlog::request(Level::Debug, req, format_args!("http uri: \"{}\"", req.uri));
    let args = req.args.as_deref().unwrap_or_default();
    crate::errlog::request(Level::Debug, req, format_args!("http args: \"{args}\""));
    for (name, value) in req.head.headers() {
        let value = String::from_utf8_lossy(value);
        crate::errlog::request(
            Level::Debug,
            req,
            format_args!("http header: \"{name}: {value}\""),
        );
    }
}

/// The server's rewrite statements (nginx's server rewrite phase), then the location search.
pub fn server_rewrites(req: &mut Request) -> Flow {
    if req.server.conf.rewrite.stmts.is_empty() {
        return Flow::Next;
    }
    let server_stmts = req.server.conf.rewrite.stmts.clone();
    match rewrite::run(&server_stmts, req) {
        Outcome::Flow(f) => f,
        Outcome::Stay | Outcome::Research => Flow::Next,
    }
}

/// Go on from `flow` (the start, or what an application answered) to the response.
pub fn resume(req: &mut Request, w: &Worker, mut flow: Flow) -> Handled {
    let resp = loop {
        flow = match flow {
            Flow::Next => locate_and_run(req, w),
            Flow::Done(r) => break r,
            Flow::Close => return Handled::Close,
            Flow::Gateway => return Handled::Gateway,
            Flow::Put => return Handled::Put,
            Flow::Delay(d) => return Handled::Delay(d),
            Flow::Delayed => match req.auth_delayed.take() {
                Some(code) => Flow::Status(code),
                None => after_limit_req(req, w),
            },
            Flow::AuthRequest(sub) => return Handled::AuthRequest(sub),
            Flow::LimitReqShared(p) => return Handled::LimitReqShared(p),
            Flow::LimitConnShared(p) => return Handled::LimitConnShared(p),
            Flow::LimitConnPassed => access_and_content(req, w),
            Flow::AuthAnswered(sub) => match access::auth_answered(req, &sub) {
                Some(refused) => auth_delay(req, refused),
                None => content(req, w),
            },
            Flow::Redirect(uri) => internal_redirect(req, w, &uri),
            Flow::Accel(uri, carried) => accel_redirect(req, w, &uri, carried),
            Flow::Intercepted(i) => {
                let (code, challenges) = *i;
                req.auth_challenge.extend(challenges);
                Flow::Status(code)
            }
            Flow::Status(code) => match error_page(req, code) {
                Some(f) => f,
                None => break Response::error_page(code, req.conf.core.server_tokens()),
            },
            Flow::Moved(code, to) => match error_page(req, code) {
                Some(f) => {
                    req.moved_to = Some(to);
                    f
                }
                None => break rewrite::redirect_response(req, code, &to),
            },
        };
    };
    filters(req, resp)
}

/// The filters of an answer whose body is at hand (a file's, an error page's, or an
/// application's read whole for the image filter), in nginx's order.
pub fn filters(req: &mut Request, mut resp: Response) -> Handled {
    // The slice filter runs first, as nginx's: the filters after it see the client's answer.
    if !slice::start(req, &mut resp) {
        return Handled::Close;
    }
    image_filter::filter(req, &mut resp);
    finish(req, &mut resp);
    gunzip::start(req, &mut resp);
    addition::start(req, &mut resp);
    // sub_filter's length is not known before it is sent; it is set up after the
    // conditional filter, which must see the validators it may remove.
    let sub = sub_filter::applies(req, &resp, false) || ssi::applies(req, &resp, false);
    if sub {
        resp.accept_ranges = false;
    }
    let recoded = charset::changes_length(req, &resp);
    let len = (!resp.length_unknown && !sub && !recoded)
        .then(|| resp.content_length.unwrap_or(resp.body.len()));
    let plan = compress::plan(req, &resp, len);
    // Conditions and ranges are the main request's (nginx's not_modified and range
    // filters skip subrequests): a subrequest's whole body goes into the main answer.
    // A sliced answer was ranged by the slice filter, which knows the whole length.
    let sliced = resp.rewrites.as_ref().is_some_and(|r| r.window.is_some());
    let conditional = resp.status == 200 && !req.subrequest && !sliced;
    let decided = conditional && conditional::not_modified_filter(req, &mut resp);
    if sub {
        ssi::start(req, &mut resp, false);
        sub_filter::start(req, &mut resp, false);
    }
    // The charset filter before the range filter, as nginx's: a multipart answer's parts
    // name the charset the body is sent in.
    charset::start(req, &mut resp);
    if conditional && !decided {
        conditional::range(req, &mut resp);
    }
    charset::keep_length(&mut resp);
    // A body changed while sent (gunzip's, addition's too) is not the one at hand.
    let rewritten = resp.rewrites.is_some();
    compress::apply(req, &mut resp, plan, rewritten);
    Handled::Respond(resp)
}

/// A DAV `PUT`'s body has been read (into `req.body`, or none was sent): put it in place
/// and go on to the answer.
pub fn put_body_read(req: &mut Request, w: &Worker) -> Handled {
    let flow = dav::put(req);
    req.body = None;
    resume(req, w, flow)
}

/// Whether `handled` has to wait before its answer ([`settle`] has work to do).
pub fn waits(handled: &Handled) -> bool {
    matches!(
        handled,
        Handled::Delay(_)
            | Handled::AuthRequest(_)
            | Handled::LimitReqShared(_)
            | Handled::LimitConnShared(_)
    )
}

/// Wait out `limit_req` delays and `auth_request` subrequests: the phases' decision, once
/// it is one to act on. HTTP/1 and HTTP/2 both come through here.
pub async fn settle(req: &mut Request, w: &Worker, mut handled: Handled) -> Handled {
    loop {
        handled = match handled {
            Handled::Delay(d) => {
                tokio::time::sleep(d).await;
                resume(req, w, Flow::Delayed)
            }
            Handled::AuthRequest(mut sub) => {
                // Boxed: the subrequest goes through the phases (and so `settle`) itself.
                Box::pin(crate::conn::subrequest::auth(w, req, &mut sub)).await;
                resume(req, w, Flow::AuthAnswered(sub))
            }
            Handled::LimitReqShared(pending) => {
                let asked = limit_req::shared::ask(pending).await;
                let flow = limit_req::shared::answered(req, asked);
                resume(req, w, flow)
            }
            Handled::LimitConnShared(pending) => {
                let flow = limit_conn::shared::ask(req, pending).await;
                resume(req, w, flow)
            }
            done => return done,
        };
    }
}

/// [`finish`] for an application's answer that is streamed: its length is not known (unless
/// it declared one) and its body comes later, compressed on the way if the filter says so.
/// `false`: the answer is broken (a slice that fails the slice filter's checks) and the
/// connection is closed without one, as nginx's error.
pub fn finish_streamed(req: &mut Request, resp: &mut Response) -> bool {
    if !slice::start(req, resp) {
        return false;
    }
    finish(req, resp);
    gunzip::start(req, resp);
    addition::start(req, resp);
    ssi::start(req, resp, true);
    sub_filter::start(req, resp, true);
    charset::start(req, resp);
    let plan = compress::plan(req, resp, resp.content_length);
    compress::apply(req, resp, plan, true);
    conditional::streamed_range(req, resp);
    true
}

/// The filters every response goes through, streamed ones too: the status an error_page
/// carries, then `add_header` / `expires`.
pub fn finish(req: &mut Request, resp: &mut Response) {
    if let Some(code) = req.error_status.take() {
        // error_page's page is answered with the original status (or its =code) whatever
        // it answered itself, a proxied 401 or 404 as well as a file's 200, unless it is
        // one of nginx's own answers. Ranges and conditionals, after this, see the status.
        if !resp.special {
            resp.status = code;
        }
    }
    crate::modules::core::msie_refresh(req, resp);
    // auth_basic's or auth_request's challenges: nginx sets them in the answer's headers
    // when refusing, so they go out whatever the error_page made of the refusal.
    for c in &req.auth_challenge {
        resp.headers
            .push(("WWW-Authenticate".into(), c.as_str().into()));
    }
    if !req.carried.is_empty() && resp.status < 400 {
        // X-Accel-Redirect's answer: the application's Content-Type wins over the file's,
        // as nginx sets a file's type only where none is set.
        for (name, value) in std::mem::take(&mut req.carried) {
            if name.eq_ignore_ascii_case("content-type") {
                resp.content_type = Some(Arc::from(value.as_ref()));
            } else {
                resp.headers.push((name, value));
            }
        }
    }
    if let Some(to) = req.moved_to.take() {
        resp.location.get_or_insert(to);
    }
    // Before the Location is made absolute: nginx's header filters see it as it was set
    // (`$sent_http_location` in an add_header is `/path`).
    headers::filter(req, resp);
    // After add_header's, as nginx's userid filter runs after the headers filter.
    userid::filter(req, resp);
    if let Some(abs) = resp
        .location
        .as_deref()
        .and_then(|l| rewrite::absolute(req, l))
    {
        resp.location = Some(abs);
    }
}

/// Phases 2 to 6 for the current URI.
fn locate_and_run(req: &mut Request, w: &Worker) -> Flow {
    if req.redirects > MAX_REDIRECTS {
        crate::errlog::error(format_args!(
            "rewrite or internal redirection cycle while processing \"{}\"",
            req.uri
        ));
        return Flow::Status(500);
    }
    req.redirects += 1;
    req.location_valid = true;
    let server = req.server.clone();
    let Ok(found) = find_location(&server.locations, &req.uri) else {
        return Flow::Status(500);
    };
    let mut redirect = false;
    if let Some(found) = found {
        redirect = found.redirect;
        req.conf = found.location.conf.clone();
        if let Some(captures) = found.captures {
            req.captures = captures;
            if let Matcher::Regex(re) = &found.location.matcher {
                re.bind_collected(&req.captures, req);
            }
        }
        req.location = Some(found.location);
    } else {
        req.conf = server.conf.clone();
        req.location = None;
    }
    if redirect {
        return location_checks(req).unwrap_or_else(|| auto_redirect(req));
    }
    run_location(req, w)
}

/// `/path` for a `location /path/ { proxy_pass ...; }`: a 301 to the location's name, with
/// the arguments (nginx's auto_redirect, after the location's checks).
fn auto_redirect(req: &Request) -> Flow {
    let Some(name) = req
        .location
        .as_ref()
        .and_then(|l| l.auto_redirect.as_deref())
    else {
        return Flow::Status(500);
    };
    let target = match &req.args {
        Some(a) => format!("{name}?{a}"),
        None => name.to_string(),
    };
    Flow::Moved(301, target)
}

/// What is checked as soon as the location is known, before its rewrites, as nginx does:
/// `internal`, `limit_except`'s settings, `client_max_body_size` against Content-Length.
fn location_checks(req: &mut Request) -> Option<Flow> {
    if req.conf.core.internal && !req.internal {
        return Some(Flow::Status(404));
    }
    if let Some(limited) = access::limited_conf(req) {
        req.conf = limited;
    }
    let limit = req.conf.core.client_max_body_size();
    if let BodyKind::Length(n) = req.head.body {
        if limit > 0 && n > limit {
            crate::errlog::request(
                Level::Error,
                req,
                format_args!("client intended to send too large body: {n} bytes"),
            );
            return Some(Flow::Status(413));
        }
    }
    None
}

/// Phases 3 to 6 in the location already chosen.
fn run_location(req: &mut Request, w: &Worker) -> Flow {
    if let Some(refused) = location_checks(req) {
        return refused;
    }
    // nginx-otel's rewrite-phase handler runs before the location's rewrites.
    otel::start(req);
    if req.location.is_some() {
        let stmts = req.conf.rewrite.stmts.clone();
        match rewrite::run(&stmts, req) {
            Outcome::Flow(f) => return f,
            Outcome::Research => return Flow::Next,
            Outcome::Stay => {}
        }
    }
    realip::apply(req, false);
    if let Some(limited) = limit_zone::check(req) {
        return limited;
    }
    access_and_content(req, w)
}

/// The phases after a `limit_req` delay: the rest of pre-access, then on.
fn after_limit_req(req: &mut Request, w: &Worker) -> Flow {
    if let Some(limited) = limit_conn::check(req) {
        return limited;
    }
    access_and_content(req, w)
}

/// Phases 5 and 6.
fn access_and_content(req: &mut Request, w: &Worker) -> Flow {
    if let Some(denied) = access::check(req) {
        return auth_delay(req, denied);
    }
    content(req, w)
}

/// `auth_delay`: a 401 from the access phase is answered once this time has passed (the
/// same for every wrong password, so its timing tells an attacker nothing), as nginx's.
fn auth_delay(req: &mut Request, refused: Flow) -> Flow {
    let delay = req.conf.core.auth_delay;
    match refused {
        Flow::Status(code @ (401 | 407)) if delay.is_some_and(|d| !d.is_zero()) => {
            crate::errlog::request(
                Level::Info,
                req,
                format_args!("delaying unauthorized request"),
            );
            req.auth_delayed = Some(code);
            Flow::Delay(delay.unwrap_or_default())
        }
        other => other,
    }
}

/// Phase 6.
fn content(req: &mut Request, w: &Worker) -> Flow {
    // The precontent phase: `mirror` (copies made once the body is read), then try_files.
    if !req.conf.mirror.uris().is_empty() && !req.subrequest {
        req.mirrored.push(req.conf.clone());
    }
    match try_files::handle(req, w) {
        Flow::Next => {}
        other => return other,
    }
    if gateway::active(&req.conf).is_some() {
        return Flow::Gateway;
    }
    if req.conf.stub_status {
        return stub_status::handle(req);
    }
    if req.conf.empty_gif {
        return crate::modules::empty_gif::handle(req);
    }
    if req.conf.flv {
        match crate::modules::flv::handle(req, w) {
            Flow::Next => {}
            other => return other,
        }
    }
    if req.conf.mp4.on {
        match crate::modules::mp4::handle(req, w) {
            Flow::Next => {}
            other => return other,
        }
    }
    if req.conf.metrics {
        return crate::modules::metrics::handle(req);
    }
    match dav::handle(req) {
        Flow::Next => {}
        other => return other,
    }
    let content: [fn(&Request, &Worker) -> Flow; 4] = [
        |r, _| random_index::handle(r),
        index::handle,
        |r, _| autoindex::handle(r),
        static_files::handle,
    ];
    for h in content {
        match h(req, w) {
            Flow::Next => {}
            other => return other,
        }
    }
    // A directory URI that neither index nor autoindex answered.
    let dir = req.filename_for(&req.uri);
    crate::errlog::request(
        Level::Error,
        req,
        format_args!("directory index of \"{}\" is forbidden", dir.display()),
    );
    Flow::Status(403)
}

/// Go to `uri` (`/path?args` or `@named`) inside the server, as nginx's internal redirect.
/// A URI continues with a new location search (`Flow::Next`); a named location runs at once.
fn internal_redirect(req: &mut Request, w: &Worker, uri: &str) -> Flow {
    req.internal = true;
    req.uri_changed = true;
    if let Some(name) = uri.strip_prefix('@') {
        let server = req.server.clone();
        let loc = server
            .named
            .iter()
            .find(|l| matches!(&l.matcher, Matcher::Named(n) if n == name));
        let Some(loc) = loc else {
            crate::errlog::error(format_args!("named location \"@{name}\" not found"));
            return Flow::Status(500);
        };
        req.redirects += 1;
        if req.redirects > MAX_REDIRECTS {
            return Flow::Status(500);
        }
        req.conf = loc.conf.clone();
        req.location = Some(loc.clone());
        return run_location(req, w);
    }
    match uri.split_once('?') {
        Some((p, a)) => {
            req.uri = p.to_string();
            req.args = (!a.is_empty()).then(|| a.to_string());
        }
        None => req.uri = uri.to_string(),
    }
    // As nginx's internal redirect: from the server rewrite phase (a named location is
    // entered at its own rewrites, above).
    server_rewrites(req)
}

/// `X-Accel-Redirect`, as nginx (ngx_http_parse_unsafe_uri): the path is percent-decoded
/// and a URI that could climb out of its folders (`..` segments, before or after decoding),
/// holds a NUL or has no leading `/` is a 404; else an internal redirect to the decoded path
/// (with the arguments as sent) as a GET, the headers carried to the answer.
fn accel_redirect(
    req: &mut Request,
    w: &Worker,
    uri: &str,
    carried: Vec<(Cow<'static, str>, HeaderValue)>,
) -> Flow {
    req.carried = carried;
    if uri.starts_with('@') {
        return internal_redirect(req, w, uri);
    }
    let Some(path) = crate::http::unsafe_uri(uri).filter(|p| p.starts_with('/')) else {
        return Flow::Status(404);
    };
    if !req.is_head() {
        req.method_override = Some(Method::Get);
    }
    // The decoded path may hold a `?` of its own: set apart from the arguments here.
    let args = uri.split_once('?').map(|(_, a)| a.to_string());
    req.internal = true;
    req.uri_changed = true;
    req.uri = path;
    req.args = args.filter(|a| !a.is_empty());
    server_rewrites(req)
}

/// `error_page` for `code`, if the location has one: an internal redirect (GET) carrying
/// the status, or a redirect for a full URL.
fn error_page(req: &mut Request, code: u16) -> Option<Flow> {
    // One error_page redirect per request unless recursive_error_pages is on.
    if req.error_paged && req.conf.error_page.recursive != Some(true) {
        return None;
    }
    let page = req.conf.error_page.find(code)?.clone();
    let target = page.uri.eval(req, None);
    // Neither a URI nor a named location: a redirect to it (nginx's
    // ngx_http_send_error_page), an absolute URL or not.
    if !target.starts_with('/') && !target.starts_with('@') {
        let status = match page.status {
            Override::Code(c) if matches!(c, 301 | 302 | 303 | 307 | 308) => c,
            _ => 302,
        };
        return Some(Flow::Done(rewrite::redirect_response(req, status, &target)));
    }
    req.error_status = match page.status {
        // nginx's own codes are answered 400 unless `=code` says otherwise.
        Override::Keep if crate::http::response::special_reason(code).is_some() => Some(400),
        Override::Keep => Some(code),
        Override::Code(c) => Some(c),
        Override::Page => None,
    };
    req.error_paged = true;
    // A page at a URI is fetched with GET (HEAD stays HEAD) whatever the original method; a
    // named location keeps the method, as nginx's ngx_http_send_error_page.
    if req.head.method != Method::Head && !target.starts_with('@') {
        req.method_override = Some(Method::Get);
    }
    Some(Flow::Redirect(target))
}
