//! The log phase, shared by HTTP/1.x and HTTP/2: one access-log line per configured log,
//! with the response's headers for `$sent_http_*`.

use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::variables::Sent;
use crate::modules::access_log;
use crate::runtime::worker::Worker;

/// Log a finished request; `head_len` and `body_len` are the bytes sent for it, `complete`
/// whether the whole answer went out (`$request_completion`).
pub fn access(
    w: &Worker,
    req: &Request,
    resp: &Response,
    head_len: u64,
    body_len: u64,
    complete: bool,
) {
    crate::modules::otel::finish(req, resp, body_len);
    {
        use crate::errlog::{admits_for, debugged, Level};
        // The location's debug line (its logs, not the server's the request line went to).
        let debug = admits_for(req, Level::Debug)
            || (!w.config.main.debug_connection.is_empty() && debugged(req));
        if debug {
            let status = resp.status;
            crate::errlog::request(
                Level::Debug,
                req,
                format_args!("http finalize request: {status}"),
            );
        }
    }
    crate::modules::metrics::request(
        req,
        resp.status,
        req.head.raw().len() as u64 + req.body_length,
        head_len + body_len,
    );
    let Some(logs) = &req.conf.log.logs else {
        return;
    };
    if logs.is_empty() {
        return;
    }
    // The request is over: the last attempt's time stands (nginx's finalize).
    req.upstream.borrow_mut().pending = false;
    let sent = Sent {
        status: resp.status,
        body_bytes: body_len,
        bytes: head_len + body_len,
        response: Some(resp),
        trailers: &[],
        complete,
    };
    // One line buffer per worker thread, reused from request to request (taken out of the
    // cell while in use, so nothing here can see it borrowed twice).
    let mut line = LINE.with(std::cell::Cell::take);
    for log in logs.iter() {
        if let Some(cond) = &log.filter {
            let v = cond.eval(req, Some(&sent));
            if v.is_empty() || v == "0" {
                continue;
            }
        }
        line.clear();
        access_log::format_line(&log.format, req, &sent, &mut line);
        log.write_line(w, req, &line);
    }
    if line.capacity() <= LINE_KEEP {
        LINE.with(|c| c.set(line));
    }
}

/// A line buffer that grew past this (a huge header logged) is not kept.
const LINE_KEEP: usize = 16 * 1024;

thread_local! {
    static LINE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}
