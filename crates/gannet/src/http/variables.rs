//! `$variables`: compiled once at load time into a [`Template`] (literal parts and variable
//! references), evaluated per request. Unknown variables are config errors, as in nginx.
//!
//! Supported: `$uri` `$document_uri` `$request_uri` `$args` `$query_string` `$is_args`
//! `$arg_NAME` `$http_NAME` `$cookie_NAME` `$sent_http_NAME` `$host` `$hostname`
//! `$remote_addr` `$remote_port` `$realip_remote_addr` `$realip_remote_port` `$proxy_protocol_tlv_NAME` `$remote_user` `$server_addr` `$server_port` `$server_name`
//! `$server_protocol` `$scheme` `$https` `$document_root` `$realpath_root` `$request_filename`
//! `$request_method` `$request` `$request_body` `$request_body_file` `$request_length` `$request_time` `$status` `$body_bytes_sent`
//! `$bytes_sent` `$content_type` `$content_length` `$connection` `$connection_requests` `$connection_time` `$pipe` `$request_completion` `$msec`
//! `$time_local` `$time_iso8601` `$pid` `$nginx_version` `$gannet_version` `$fastcgi_script_name`
//! `$fastcgi_path_info` `$proxy_host` `$proxy_port` `$proxy_add_x_forwarded_for`
//! `$upstream_addr` `$upstream_status` `$upstream_response_time` `$upstream_connect_time`
//! `$upstream_header_time` `$upstream_response_length` `$upstream_bytes_sent`
//! `$upstream_bytes_received` `$upstream_cache_status` `$upstream_http_NAME`
//! `$upstream_cookie_NAME` `$sent_trailer_NAME`
//! `$request_id` `$http2` `$http3` `$limit_req_status` `$limit_conn_status` `$secure_link`
//! `$secure_link_expires` `$uid_got` `$uid_set` `$otel_trace_id` `$otel_span_id`
//! `$otel_parent_id` `$otel_parent_sampled` and `$1`..`$9`; the TLS
//! ones of `tls::vars` (`$ssl_protocol`, `$ssl_client_verify`...; empty on cleartext); and the variables a config defines with `set`, `map`, `geo`, `split_clients` or named captures (see
//! `http::user_vars`).

use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::user_vars::{self, UserVar};
use crate::modules::stub_status::Gauge;
use crate::tls::vars::SslVar;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// A loaded config reads `$upstream_http_*` or `$upstream_cookie_*`: the gateways then keep each answer's header
/// fields on the request (a copy of their list per proxied request, which no other config
/// pays for). Never cleared: after a reload that dropped the variable the copy is made
/// for nothing, but nothing is wrong.
static UPSTREAM_HEADERS: AtomicBool = AtomicBool::new(false);

/// Whether upstream answers' header fields are to be kept for `$upstream_http_*`.
pub fn keeps_upstream_headers() -> bool {
    UPSTREAM_HEADERS.load(Ordering::Relaxed)
}

/// One variable reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    Uri,
    RequestUri,
    Args,
    IsArgs,
    Arg(String),
    Http(String),
    Cookie(String),
    SentHttp(String),
    Host,
    Hostname,
    RemoteAddr,
    /// `$binary_remote_addr`: in a log line nginx's bytes (4 or 16, escaped as any value);
    /// elsewhere (a `limit_req`/`limit_conn` key, a `map` source) the text address, which
    /// tells clients apart the same.
    BinaryRemoteAddr,
    RemotePort,
    RealipRemoteAddr,
    RealipRemotePort,
    /// `$proxy_protocol_addr` and its kin: a `listen ... proxy_protocol` header's addresses.
    ProxyProtocolAddr,
    ProxyProtocolPort,
    ProxyProtocolServerAddr,
    ProxyProtocolServerPort,
    /// `$proxy_protocol_tlv_NAME`: a TLV of the PROXY header (`conn::proxy_tlv`).
    ProxyProtocolTlv(crate::conn::proxy_tlv::Tlv),
    RemoteUser,
    ServerAddr,
    ServerPort,
    ServerName,
    ServerProtocol,
    Scheme,
    Https,
    DocumentRoot,
    RealpathRoot,
    RequestFilename,
    RequestMethod,
    Request,
    RequestLength,
    RequestBody,
    RequestBodyFile,
    RequestTime,
    Status,
    BodyBytesSent,
    BytesSent,
    ContentType,
    ContentLength,
    Connection,
    ConnectionRequests,
    /// `$connection_time`: seconds since the connection was accepted, in milliseconds.
    ConnectionTime,
    /// `$pipe`: `p` for a pipelined request, else `.`.
    Pipe,
    /// `$request_completion`: `OK` once the whole answer is sent, else empty.
    RequestCompletion,
    Connections(crate::modules::stub_status::Gauge),
    LimitReqStatus,
    LimitConnStatus,
    LimitRate,
    Msec,
    TimeLocal,
    /// The SSI module's `$date_local` / `$date_gmt` (in its default `timefmt` outside a page).
    DateLocal,
    DateGmt,
    TimeIso8601,
    Pid,
    Version,
    FastcgiScriptName,
    FastcgiPathInfo,
    ProxyHost,
    ProxyPort,
    ProxyAddXForwardedFor,
    UpstreamAddr,
    UpstreamStatus,
    UpstreamResponseTime,
    UpstreamConnectTime,
    UpstreamHeaderTime,
    UpstreamResponseLength,
    UpstreamBytesSent,
    UpstreamBytesReceived,
    /// `$upstream_cache_status`: MISS, BYPASS, EXPIRED, STALE, UPDATING, HIT; nothing
    /// (nginx's "not found", logged as `-`) where the cache was not looked at.
    UpstreamCacheStatus,
    /// `$slice_range`: `bytes=START-END` of the request's slice (`modules::slice`).
    SliceRange,
    /// `$upstream_http_NAME` (lowercase, with `-`).
    UpstreamHttp(String),
    /// `$upstream_cookie_NAME`: the cookie NAME an upstream's `Set-Cookie` sets.
    UpstreamCookie(String),
    /// `$sent_trailer_NAME` (lowercase, with `-`).
    SentTrailer(String),
    RequestId,
    Http2,
    /// `$http3`: "h3" on an HTTP/3 request, else empty (ngx_http_v3_module).
    Http3,
    /// `$invalid_referer` (the referer module).
    InvalidReferer,
    SecureLink,
    SecureLinkExpires,
    UidGot,
    UidSet,
    Otel(crate::modules::otel::OtelVar),
    Capture(usize),
    Ssl(SslVar),
    /// Defined by the config (`set`, `map`, a named capture).
    User(UserVar),
}

impl Var {
    /// The built-in variable called `name`.
    pub(crate) fn from_name(name: &str) -> Option<Var> {
        if let Ok(n) = name.parse::<usize>() {
            return (n <= 9).then_some(Var::Capture(n));
        }
        let lower = |s: &str| s.to_ascii_lowercase();
        Some(match name {
            "uri" | "document_uri" => Var::Uri,
            "request_uri" => Var::RequestUri,
            "args" | "query_string" => Var::Args,
            "is_args" => Var::IsArgs,
            "host" => Var::Host,
            "hostname" => Var::Hostname,
            "remote_addr" => Var::RemoteAddr,
            "binary_remote_addr" => Var::BinaryRemoteAddr,
            "remote_port" => Var::RemotePort,
            "realip_remote_addr" => Var::RealipRemoteAddr,
            "realip_remote_port" => Var::RealipRemotePort,
            "proxy_protocol_addr" => Var::ProxyProtocolAddr,
            "proxy_protocol_port" => Var::ProxyProtocolPort,
            "proxy_protocol_server_addr" => Var::ProxyProtocolServerAddr,
            "proxy_protocol_server_port" => Var::ProxyProtocolServerPort,
            "remote_user" => Var::RemoteUser,
            "server_addr" => Var::ServerAddr,
            "server_port" => Var::ServerPort,
            "server_name" => Var::ServerName,
            "server_protocol" => Var::ServerProtocol,
            "scheme" => Var::Scheme,
            "https" => Var::Https,
            "invalid_referer" => Var::InvalidReferer,
            "document_root" => Var::DocumentRoot,
            "realpath_root" => Var::RealpathRoot,
            "request_filename" => Var::RequestFilename,
            "request_method" => Var::RequestMethod,
            "request" => Var::Request,
            "request_length" => Var::RequestLength,
            "request_body" => Var::RequestBody,
            "request_body_file" => {
                crate::conn::request_body::want_names();
                Var::RequestBodyFile
            }
            "request_time" => Var::RequestTime,
            "status" => Var::Status,
            "body_bytes_sent" => Var::BodyBytesSent,
            "bytes_sent" => Var::BytesSent,
            "content_type" => Var::ContentType,
            "content_length" => Var::ContentLength,
            "connection" => Var::Connection,
            "connection_requests" => Var::ConnectionRequests,
            "connection_time" => Var::ConnectionTime,
            "pipe" => Var::Pipe,
            "request_completion" => Var::RequestCompletion,
            "connections_active" => Var::Connections(Gauge::Active),
            "connections_reading" => Var::Connections(Gauge::Reading),
            "connections_writing" => Var::Connections(Gauge::Writing),
            "connections_waiting" => Var::Connections(Gauge::Waiting),
            "msec" => Var::Msec,
            "time_local" => Var::TimeLocal,
            "date_local" => Var::DateLocal,
            "date_gmt" => Var::DateGmt,
            "time_iso8601" => Var::TimeIso8601,
            "pid" => Var::Pid,
            "nginx_version" | "gannet_version" => Var::Version,
            "fastcgi_script_name" => Var::FastcgiScriptName,
            "fastcgi_path_info" => Var::FastcgiPathInfo,
            "proxy_host" => Var::ProxyHost,
            "proxy_port" => Var::ProxyPort,
            "proxy_add_x_forwarded_for" => Var::ProxyAddXForwardedFor,
            "upstream_addr" => Var::UpstreamAddr,
            "upstream_status" => Var::UpstreamStatus,
            "upstream_response_time" => Var::UpstreamResponseTime,
            "upstream_connect_time" => Var::UpstreamConnectTime,
            "upstream_header_time" => Var::UpstreamHeaderTime,
            "upstream_response_length" => Var::UpstreamResponseLength,
            "upstream_bytes_sent" => Var::UpstreamBytesSent,
            "upstream_bytes_received" => Var::UpstreamBytesReceived,
            "upstream_cache_status" => Var::UpstreamCacheStatus,
            "slice_range" => Var::SliceRange,
            "request_id" => Var::RequestId,
            "http2" => Var::Http2,
            "http3" => Var::Http3,
            "secure_link" => Var::SecureLink,
            "secure_link_expires" => Var::SecureLinkExpires,
            "uid_got" => Var::UidGot,
            "uid_set" => Var::UidSet,
            "limit_req_status" => Var::LimitReqStatus,
            "limit_conn_status" => Var::LimitConnStatus,
            "limit_rate" => Var::LimitRate,
            _ => {
                if let Some(a) = name.strip_prefix("arg_") {
                    Var::Arg(a.to_string())
                } else if let Some(h) = name.strip_prefix("http_") {
                    Var::Http(lower(h).replace('_', "-"))
                } else if let Some(h) = name.strip_prefix("sent_http_") {
                    Var::SentHttp(lower(h).replace('_', "-"))
                } else if let Some(h) = name.strip_prefix("sent_trailer_") {
                    Var::SentTrailer(lower(h).replace('_', "-"))
                } else if let Some(c) = name.strip_prefix("upstream_cookie_") {
                    UPSTREAM_HEADERS.store(true, Ordering::Relaxed);
                    Var::UpstreamCookie(c.to_string())
                } else if let Some(h) = name.strip_prefix("upstream_http_") {
                    UPSTREAM_HEADERS.store(true, Ordering::Relaxed);
                    Var::UpstreamHttp(lower(h).replace('_', "-"))
                } else if let Some(c) = name.strip_prefix("cookie_") {
                    Var::Cookie(c.to_string())
                } else if let Some(s) = name.strip_prefix("ssl_").and_then(SslVar::from_name) {
                    Var::Ssl(s)
                } else if let Some(o) = crate::modules::otel::OtelVar::from_name(name) {
                    Var::Otel(o)
                } else if let Some(t) = crate::conn::proxy_tlv::Tlv::from_var_name(name) {
                    Var::ProxyProtocolTlv(t)
                } else {
                    return None;
                }
            }
        })
    }
}

impl Var {
    /// A built-in variable of a prefix (`$http_NAME` and its kin), which a config may
    /// assign (`http::user_vars::define_assigned`).
    pub fn is_prefixed(&self) -> bool {
        matches!(
            self,
            Var::Arg(_)
                | Var::Http(_)
                | Var::Cookie(_)
                | Var::SentHttp(_)
                | Var::SentTrailer(_)
                | Var::UpstreamHttp(_)
                | Var::UpstreamCookie(_)
        )
    }

    /// Whether an empty value is one nginx has (empty, but found) rather than its "not
    /// found": the difference between `""` and `-` in a default-escaped log line.
    /// The value as the request's bytes, for the log's most common variables (`$request`,
    /// `$http_user_agent`...): written escaped as received, with no UTF-8 check or copy
    /// (nginx logs a byte that is not UTF-8 as it is, escaped). `None` for the others;
    /// `Some(None)` for a header that is not there.
    fn log_bytes<'r>(&self, req: &'r Request) -> Option<Option<&'r [u8]>> {
        match self {
            // An empty one (a rejected request with no line) is logged as not found.
            Var::Request => Some(Some(request_line(req)).filter(|l| !l.is_empty())),
            Var::Http(name) if !joined_header(name) && !req.server.vars.may_assign(self) => {
                Some(req.head.header(name))
            }
            _ => None,
        }
    }

    fn found_empty(&self, req: &Request, sent: &Sent) -> bool {
        match self {
            Var::Http(name) => req.head.header(name).is_some(),
            Var::Arg(name) => req.arg(name).is_some(),
            Var::Cookie(name) => req.cookie(name).is_some(),
            Var::Args => req.args.is_some(),
            Var::IsArgs
            | Var::Http2
            | Var::Http3
            | Var::InvalidReferer
            | Var::RequestCompletion => true,
            Var::SentHttp(name) => sent
                .response
                .is_some_and(|r| r.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))),
            Var::SentTrailer(name) => sent
                .trailers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name)),
            Var::UpstreamCookie(name) => upstream_cookie(req, name, &mut String::new()),
            Var::ProxyProtocolTlv(t) => t.append(req.conn.proxy.as_deref(), &mut String::new()),
            // `set`, `map`, `geo` and named captures give a value even when it is empty
            // (nginx logs `set $x ""` as `""`).
            Var::User(_) => true,
            // Empty only for a rejected request: one whose target was read but could not be
            // normalised (`/../x`) has nginx's empty URI; without a target, none at all.
            Var::Uri => request_line(req)
                .split(|&b| b == b' ')
                .nth(1)
                .is_some_and(|t| t.first() == Some(&b'/')),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
}

/// A string with `$variables`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// What the response side contributes to variables (filled in by the log phase).
#[derive(Debug, Default, Clone)]
pub struct Sent<'a> {
    pub status: u16,
    pub body_bytes: u64,
    pub bytes: u64,
    /// The response sent, for `$sent_http_*`: looked up when a format asks, where copying
    /// every header for each log line was two allocations a header per request.
    pub response: Option<&'a Response>,
    /// The trailer fields sent so far, for `$sent_trailer_*` (`add_trailer` evaluates each
    /// field with those before it already sent, as nginx does).
    pub trailers: &'a [(String, String)],
    /// The whole answer went out (`$request_completion`); known in the log phase only.
    pub complete: bool,
}

impl Sent<'_> {
    /// An answer being made: its status is known (`$status` in `return`'s text and in
    /// `add_header`, as nginx has it), nothing is sent yet.
    pub fn status(status: u16) -> Sent<'static> {
        Sent {
            status,
            body_bytes: 0,
            bytes: 0,
            response: None,
            trailers: &[],
            complete: false,
        }
    }

    /// Append `$sent_http_NAME` (`name` lowercase, with `-`): the first such header sent.
    fn append_header(&self, name: &str, out: &mut String) {
        let Some(r) = self.response else { return };
        let own = match name {
            "content-type" => r.content_type.as_deref(),
            "location" => r.location.as_deref(),
            "etag" => r.etag.as_deref(),
            // Made by the head encoder; as nginx's ngx_http_variable_sent_connection reads
            // it in the log phase, where a kept-alive request has had its r->keepalive
            // cleared (ngx_http_set_keepalive) already: "close" but for an upgrade.
            "connection" if r.status == 101 => Some("upgrade"),
            "connection" => Some("close"),
            // Sent by the head encoder from a flag, as it is (`http::response`).
            "accept-ranges" if r.accept_ranges && r.status == 200 => Some("bytes"),
            "last-modified" => {
                if let Some(lm) = r.last_modified_sent() {
                    crate::runtime::clock::with_http_date(lm, |d| out.push_str(d));
                    return;
                }
                None
            }
            _ => None,
        };
        if let Some(v) = own {
            out.push_str(v);
            return;
        }
        // Several Cache-Control or Link lines are joined (nginx keeps them as lists); of
        // another name, the first is the value.
        let all = matches!(name, "cache-control" | "link");
        let mut first = true;
        for (_, v) in r
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            if !first {
                out.push_str(", ");
            }
            out.push_str(v);
            first = false;
            if !all {
                break;
            }
        }
    }
}

/// The value of the built-in variable `name` for `req` at run time (SSI's `echo` and
/// expressions): `None` when there is no such variable, or when a header, argument or
/// cookie variable names none that is there (nginx's "not found").
pub fn lookup(name: &str, req: &Request) -> Option<String> {
    let var = Var::from_name(name)?;
    let mut out = String::new();
    append(&mut out, &var, req, None, &req.captures);
    let absent = out.is_empty()
        && matches!(
            var,
            Var::Capture(_)
                | Var::Arg(_)
                | Var::Http(_)
                | Var::Cookie(_)
                | Var::SentHttp(_)
                | Var::SentTrailer(_)
                | Var::UpstreamHttp(_)
                | Var::UpstreamCookie(_)
                | Var::ProxyProtocolTlv(_)
        )
        // `?a=` has an empty `$arg_a`, not none (SSI's `echo` shows no "(none)").
        && !var.found_empty(req, &Sent::status(0));
    (!absent).then_some(out)
}

/// A piece of a value in nginx's variable syntax.
pub enum Piece<V> {
    Lit(String),
    Var(V),
}

/// Split `src` at its variables (`$name`, `${name}`, and `$1`..`$9` when `captures`), each
/// name resolved by `resolve`; a `$` not followed by a name is literal. The one scanner the
/// http and stream templates share.
pub fn pieces<V>(
    src: &str,
    captures: bool,
    mut resolve: impl FnMut(&str) -> Result<V, String>,
) -> Result<Vec<Piece<V>>, String> {
    let mut parts = Vec::new();
    let mut lit = String::new();
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            let start = i;
            while i < b.len() && b[i] != b'$' {
                i += 1;
            }
            lit.push_str(&src[start..i]);
            continue;
        }
        let (name, next) = if b.get(i + 1) == Some(&b'{') {
            let end = src[i + 2..]
                .find('}')
                .ok_or_else(|| format!("the closing bracket in \"{src}\" variable is missing"))?;
            (&src[i + 2..i + 2 + end], i + 3 + end)
        } else if captures && b.get(i + 1).is_some_and(|c| c.is_ascii_digit()) {
            (&src[i + 1..i + 2], i + 2)
        } else {
            let mut j = i + 1;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            (&src[i + 1..j], j)
        };
        if name.is_empty() {
            lit.push('$');
            i += 1;
            continue;
        }
        let var = resolve(name)?;
        if !lit.is_empty() {
            parts.push(Piece::Lit(std::mem::take(&mut lit)));
        }
        parts.push(Piece::Var(var));
        i = next;
    }
    if !lit.is_empty() || parts.is_empty() {
        parts.push(Piece::Lit(lit));
    }
    Ok(parts)
}

impl Template {
    /// Compile `src`; `$name`, `${name}`, `$1`. A `$` not followed by a name is literal.
    pub fn compile(src: &str) -> Result<Template, String> {
        let parts = pieces(src, true, |name| {
            Var::from_name(name)
                .or_else(|| user_vars::reference(name).map(Var::User))
                .ok_or_else(|| format!("unknown \"{name}\" variable"))
        })?;
        let parts = parts
            .into_iter()
            .map(|p| match p {
                Piece::Lit(s) => Part::Lit(s),
                Piece::Var(v) => Part::Var(v),
            })
            .collect();
        Ok(Template { parts })
    }

    /// A template of fixed text.
    pub fn literal(s: &str) -> Template {
        Template {
            parts: vec![Part::Lit(s.to_string())],
        }
    }

    /// The text when the template has no variables.
    pub fn as_literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Lit(s)] => Some(s),
            _ => None,
        }
    }

    pub fn has_vars(&self) -> bool {
        self.as_literal().is_none()
    }

    pub fn eval(&self, req: &Request, sent: Option<&Sent>) -> String {
        self.eval_with(req, sent, &req.captures)
    }

    /// Evaluate with `$0`..`$9` taken from `caps` (a map's regex match) instead of the
    /// request's last match.
    pub fn eval_with(&self, req: &Request, sent: Option<&Sent>, caps: &[Option<String>]) -> String {
        if let Some(s) = self.as_literal() {
            return s.to_string();
        }
        let mut out = String::new();
        self.append_with(&mut out, req, sent, caps);
        out
    }

    /// Evaluate with the regex captures (`$0`..`$9`) written through `escape`: nginx
    /// escapes a rewrite's captures where they make arguments or a redirect, when the
    /// client's URI was percent-encoded.
    pub fn eval_escaping_captures(
        &self,
        req: &Request,
        escape: impl Fn(&str, &mut String),
    ) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(Var::Capture(n)) => {
                    if let Some(Some(c)) = req.captures.get(*n) {
                        escape(c, &mut out);
                    }
                }
                Part::Var(v) => append(&mut out, v, req, None, &req.captures),
            }
        }
        out
    }

    /// Evaluate onto the end of `out`: for callers that evaluate many templates per request
    /// (the FastCGI parameters) into one reused buffer instead of a string each.
    pub fn append_to(&self, out: &mut String, req: &Request, sent: Option<&Sent>) {
        self.append_with(out, req, sent, &req.captures);
    }

    fn append_with(
        &self,
        out: &mut String,
        req: &Request,
        sent: Option<&Sent>,
        caps: &[Option<String>],
    ) {
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v) => append(out, v, req, sent, caps),
            }
        }
    }

    /// Evaluate for a log line: literal text as it is, each variable's value through
    /// `value`, which escapes it as the format's `escape=` says; `None` for a variable nginx
    /// calls "not found" (logged as `-` by default), `Some("")` for one that is there but
    /// empty (an empty header, `$is_args` without a query). One value buffer for the whole
    /// line, and for the next lines of the thread.
    pub fn eval_log(
        &self,
        req: &Request,
        sent: &Sent,
        out: &mut Vec<u8>,
        value: impl Fn(Option<&[u8]>, &mut Vec<u8>),
    ) {
        // The value buffer is the thread's, reused line after line (taken out of its cell
        // while in use: a value that logs something itself gets a fresh one).
        let mut val = LOG_VALUE.with(std::cell::Cell::take);
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.extend_from_slice(s.as_bytes()),
                Part::Var(Var::BinaryRemoteAddr) if !req.unix_client() => {
                    let (bytes, n) = binary_addr(req.client().ip());
                    value(Some(&bytes[..n]), out);
                }
                // The combined format's own values, written straight into the line: they
                // are never empty and hold no byte any `escape=` changes (digits, an
                // address, the cached local time), so neither the value buffer, `append`'s
                // dispatch nor the escaping scan is needed (about 400 instructions a line
                // went to those four, callgrind: docs/bench/cost-per-request.md).
                Part::Var(Var::RemoteAddr) if !req.unix_client() => {
                    write_ip(out, req.client().ip())
                }
                Part::Var(Var::Status) => write_status(out, sent.status),
                Part::Var(Var::BodyBytesSent) => out.extend_from_slice(
                    gannet_proto::h1::encode::decimal(sent.body_bytes, &mut [0; 20]).as_bytes(),
                ),
                Part::Var(Var::TimeLocal) => crate::runtime::clock::write_time_local(out),
                Part::Var(v) => {
                    if let Some(raw) = v.log_bytes(req) {
                        value(raw, out);
                        continue;
                    }
                    val.clear();
                    append(&mut val, v, req, Some(sent), &req.captures);
                    // Only an empty value needs the second look.
                    let found = !val.is_empty() || v.found_empty(req, sent);
                    value(found.then_some(val.as_bytes()), out);
                }
            }
        }
        if val.capacity() <= LOG_VALUE_KEEP {
            LOG_VALUE.with(|c| c.set(val));
        }
    }
}

/// `$request`: the request line as received, without the line end.
fn request_line(req: &Request) -> &[u8] {
    let raw = req.head.raw();
    let end = memchr::memchr(b'\n', raw).unwrap_or(raw.len());
    let line = &raw[..end];
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The request headers `$http_NAME` gives every field of, joined (as nginx's multi-header
/// variables); the others give the first one.
fn joined_header(name: &str) -> bool {
    name == "cookie" || name == "x-forwarded-for"
}

/// A log value buffer that grew past this (a huge header) is not kept.
const LOG_VALUE_KEEP: usize = 16 * 1024;

thread_local! {
    static LOG_VALUE: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// Bytes as text, an invalid sequence replaced. An ASCII request target (nearly every one)
/// is taken as it is: `from_utf8_lossy`'s checks cost about 340 instructions for
/// `$request_uri` in the default cache key, per request (callgrind,
/// docs/bench/cache-report.md).
fn push_lossy(out: &mut String, b: &[u8]) {
    if b.is_ascii() {
        // SAFETY: ASCII bytes are valid UTF-8.
        out.push_str(unsafe { std::str::from_utf8_unchecked(b) });
    } else {
        out.push_str(&String::from_utf8_lossy(b));
    }
}

/// A number in decimal. The variables a FastCGI request sends for every request (ports) and
/// the log's numbers (`$status`, `$body_bytes_sent`...) are written often enough that `write!`'s formatting machinery showed in
/// profiles (about 150 instructions a number, callgrind).
fn push_uint(out: &mut String, n: u64) {
    out.push_str(gannet_proto::h1::encode::decimal(n, &mut [0; 20]));
}

/// A duration as nginx writes its times: seconds with three decimals ("0.012").
fn push_secs(out: &mut String, t: std::time::Duration) {
    push_uint(out, t.as_secs());
    let ms = t.subsec_millis();
    out.push('.');
    for d in [ms / 100, ms / 10 % 10, ms % 10] {
        out.push(char::from(b'0' + d as u8));
    }
}

/// An address as `Display` writes it; IPv4 without the formatter (`$remote_addr` and
/// `$server_addr` went through it for every FastCGI request: ~950 instructions each).
/// `$binary_remote_addr`'s bytes, as nginx's: the four of IPv4, the sixteen of IPv6.
fn binary_addr(ip: std::net::IpAddr) -> ([u8; 16], usize) {
    let mut b = [0; 16];
    match ip {
        std::net::IpAddr::V4(v4) => {
            b[..4].copy_from_slice(&v4.octets());
            (b, 4)
        }
        std::net::IpAddr::V6(v6) => (v6.octets(), 16),
    }
}

fn push_ip(out: &mut String, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let (buf, n) = ipv4_text(v4);
            // SAFETY: digits and dots, ASCII (the check cost ~90 instructions an address,
            // two per FastCGI request).
            out.push_str(unsafe { std::str::from_utf8_unchecked(&buf[..n]) });
        }
        std::net::IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// [`push_ip`] into a log line.
fn write_ip(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let (buf, n) = ipv4_text(v4);
            out.extend_from_slice(&buf[..n]);
        }
        std::net::IpAddr::V6(v6) => {
            let _ = std::io::Write::write_fmt(out, format_args!("{v6}"));
        }
    }
}

/// An IPv4 address's dotted text in a stack buffer: four numbers written one by one were
/// about 210 instructions per access-log line (callgrind).
fn ipv4_text(v4: std::net::Ipv4Addr) -> ([u8; 15], usize) {
    let mut buf = [0u8; 15];
    let mut n = 0;
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            buf[n] = b'.';
            n += 1;
        }
        if o >= 100 {
            buf[n] = b'0' + o / 100;
            n += 1;
        }
        if o >= 10 {
            buf[n] = b'0' + o / 10 % 10;
            n += 1;
        }
        buf[n] = b'0' + o % 10;
        n += 1;
    }
    (buf, n)
}

/// `$status` into a log line: three digits, nginx's `000` before an answer was made.
fn write_status(out: &mut Vec<u8>, s: u16) {
    if s > 999 {
        out.extend_from_slice(gannet_proto::h1::encode::decimal(s.into(), &mut [0; 20]).as_bytes());
        return;
    }
    out.extend_from_slice(&[
        b'0' + (s / 100) as u8,
        b'0' + (s / 10 % 10) as u8,
        b'0' + (s % 10) as u8,
    ]);
}

/// Append `$upstream_cookie_NAME`, as nginx's `ngx_http_parse_set_cookie_lines` finds it:
/// the first upstream `Set-Cookie` whose value starts with NAME (any case), spaces, `=`;
/// its value after spaces, up to `;`. Returns whether one was found.
fn upstream_cookie(req: &Request, name: &str, out: &mut String) -> bool {
    let fields = req.upstream_headers.borrow();
    let Some(fields) = fields.as_ref() else {
        return false;
    };
    for (n, v) in fields.iter() {
        if !n.eq_ignore_ascii_case("set-cookie") || name.len() >= v.len() {
            continue;
        }
        let Some(start) = v.get(..name.len()) else {
            continue;
        };
        if !start.eq_ignore_ascii_case(name) {
            continue;
        }
        let Some(rest) = v[name.len()..].trim_start_matches(' ').strip_prefix('=') else {
            continue;
        };
        let rest = rest.trim_start_matches(' ');
        out.push_str(rest.split(';').next().unwrap_or(""));
        return true;
    }
    false
}

fn header_str(req: &Request, name: &str) -> Option<String> {
    req.head
        .header(name)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

fn append(out: &mut String, v: &Var, req: &Request, sent: Option<&Sent>, caps: &[Option<String>]) {
    if v.is_prefixed() && req.server.vars.append_assigned(v, req, out) {
        return;
    }
    match v {
        Var::Uri => out.push_str(&req.uri),
        Var::RequestUri => push_lossy(out, req.head.target()),
        Var::Args => out.push_str(req.args.as_deref().unwrap_or("")),
        Var::IsArgs => {
            if req.args.is_some() {
                out.push('?')
            }
        }
        Var::Arg(name) => {
            if let Some(v) = req.arg(name) {
                out.push_str(v)
            }
        }
        Var::Http(name) if !joined_header(name) => {
            if let Some(val) = req.head.header(name) {
                out.push_str(&String::from_utf8_lossy(val));
            }
        }
        Var::Http(name) => {
            // Several Cookie / X-Forwarded-For headers are joined as nginx does.
            let sep = if name == "cookie" { "; " } else { ", " };
            let mut first = true;
            for (n, val) in req.head.headers() {
                if n.eq_ignore_ascii_case(name) {
                    if !first {
                        out.push_str(sep);
                    }
                    out.push_str(&String::from_utf8_lossy(val));
                    first = false;
                }
            }
        }
        Var::Cookie(name) => {
            if let Some(c) = req.cookie(name) {
                out.push_str(&c)
            }
        }
        Var::SentHttp(name) => {
            if let Some(s) = sent {
                s.append_header(name, out);
            }
        }
        Var::Host => out.push_str(&req.host),
        Var::ProxyHost => {
            crate::modules::proxy::host_and_port(req, |h, _| out.push_str(h));
        }
        Var::ProxyPort => {
            crate::modules::proxy::host_and_port(req, |_, p| push_uint(out, p.into()));
        }
        Var::ProxyAddXForwardedFor => crate::modules::proxy::add_x_forwarded_for(req, out),
        Var::UpstreamAddr
        | Var::UpstreamStatus
        | Var::UpstreamResponseTime
        | Var::UpstreamConnectTime
        | Var::UpstreamHeaderTime
        | Var::UpstreamResponseLength
        | Var::UpstreamBytesSent
        | Var::UpstreamBytesReceived => {
            // One entry per server tried, as nginx lists them: "a, b"; a time the attempt
            // never reached (no connection, no head) as "-".
            let tries = req.upstream.borrow();
            let last = tries.len().wrapping_sub(1);
            for (i, t) in tries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let time = match v {
                    Var::UpstreamAddr => {
                        let _ = write!(out, "{}", t.addr);
                        continue;
                    }
                    Var::UpstreamStatus => {
                        // 0: the attempt ended without one (the client left), nginx's `-`.
                        if t.status == 0 {
                            out.push('-');
                        } else {
                            push_uint(out, t.status.into());
                        }
                        continue;
                    }
                    Var::UpstreamResponseLength
                    | Var::UpstreamBytesSent
                    | Var::UpstreamBytesReceived => {
                        push_uint(
                            out,
                            match v {
                                Var::UpstreamResponseLength => t.body,
                                Var::UpstreamBytesSent => t.sent,
                                _ => t.received,
                            },
                        );
                        continue;
                    }
                    Var::UpstreamConnectTime => t.connect,
                    Var::UpstreamHeaderTime => t.header,
                    _ if i == last && tries.pending => None,
                    _ => Some(t.time),
                };
                match time {
                    Some(t) => push_secs(out, t),
                    None => out.push('-'),
                }
            }
        }
        Var::SliceRange => crate::modules::slice::variable(req, out),
        Var::UpstreamCacheStatus => {
            if let Some(s) = req.cache_status.get() {
                out.push_str(s.as_str());
            }
        }
        Var::UpstreamHttp(name) => {
            if let Some(v) = req
                .upstream_headers
                .borrow()
                .as_ref()
                .and_then(|f| f.get(name))
            {
                out.push_str(v);
            }
        }
        Var::UpstreamCookie(name) => {
            upstream_cookie(req, name, out);
        }
        Var::SentTrailer(name) => {
            // Every field of that name, joined with ", " (nginx's unknown-header rule).
            let found = sent.map_or(&[][..], |s| s.trailers);
            let mut first = true;
            for (_, v) in found.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)) {
                if !first {
                    out.push_str(", ");
                }
                out.push_str(v);
                first = false;
            }
        }
        Var::RequestId => {
            let _ = write!(out, "{:032x}", req.request_id());
        }
        Var::InvalidReferer => {
            if crate::modules::referer::invalid(req) {
                out.push('1');
            }
        }
        Var::Http2 => {
            if req.head.version == gannet_proto::h1::Version::Http2 {
                out.push_str(if req.conn.tls.is_some() { "h2" } else { "h2c" });
            }
        }
        Var::Http3 => {
            if req.head.version == gannet_proto::h1::Version::Http3 {
                out.push_str("h3");
            }
        }
        Var::SecureLink => crate::modules::secure_link::append_secure_link(out, req),
        Var::SecureLinkExpires => crate::modules::secure_link::append_expires(out, req),
        Var::UidGot => crate::modules::userid::append_got(out, req),
        Var::UidSet => crate::modules::userid::append_set(out, req),
        Var::Otel(o) => o.append(out, req),
        Var::Hostname => out.push_str(crate::runtime::hostname()),
        // A unix socket's client is `unix:`, with no port (nginx).
        Var::RemoteAddr | Var::BinaryRemoteAddr if req.unix_client() => out.push_str("unix:"),
        Var::RemoteAddr | Var::BinaryRemoteAddr => {
            push_ip(out, req.client().ip());
        }
        // A client address from `real_ip_header` without a port has none (nginx: empty).
        Var::RemotePort => {
            let port = req.client().port();
            if port != 0 {
                push_uint(out, port.into());
            }
        }
        Var::RealipRemoteAddr if req.conn.unix.is_some() => out.push_str("unix:"),
        Var::RealipRemoteAddr => {
            push_ip(out, req.conn.peer.ip());
        }
        Var::RealipRemotePort => {
            if req.conn.unix.is_none() {
                push_uint(out, req.conn.peer.port().into());
            }
        }
        // Empty without a header, or with one that carried no addresses; a port also when
        // it is 0 (nginx).
        Var::ProxyProtocolAddr => {
            if let Some(p) = &req.conn.proxy {
                out.push_str(&p.addr);
            }
        }
        Var::ProxyProtocolPort => {
            if let Some(p) = req.conn.proxy.as_ref().filter(|p| p.port != 0) {
                push_uint(out, p.port.into());
            }
        }
        Var::ProxyProtocolServerAddr => {
            if let Some(p) = &req.conn.proxy {
                out.push_str(&p.server_addr);
            }
        }
        Var::ProxyProtocolServerPort => {
            if let Some(p) = req.conn.proxy.as_ref().filter(|p| p.server_port != 0) {
                push_uint(out, p.server_port.into());
            }
        }
        Var::ProxyProtocolTlv(t) => {
            t.append(req.conn.proxy.as_deref(), out);
        }
        Var::RemoteUser => {
            if let Some((user, _)) = crate::modules::auth_basic::credentials(req) {
                out.push_str(&user);
            }
        }
        // `unix:PATH` and no port for a unix listener, as nginx.
        Var::ServerAddr => match &req.conn.unix {
            Some(path) => {
                out.push_str("unix:");
                out.push_str(&path.to_string_lossy());
            }
            None => push_ip(out, req.conn.local.ip()),
        },
        Var::ServerPort => {
            if req.conn.unix.is_none() {
                push_uint(out, req.conn.local.port().into());
            }
        }
        Var::ServerName => out.push_str(&req.server.primary_name),
        Var::ServerProtocol => out.push_str(match req.head.version {
            // nginx keeps the line's protocol text, which HTTP/0.9 has none of.
            gannet_proto::h1::Version::Http09 => "",
            gannet_proto::h1::Version::Http10 => "HTTP/1.0",
            gannet_proto::h1::Version::Http11 => "HTTP/1.1",
            gannet_proto::h1::Version::Http2 => "HTTP/2.0",
            gannet_proto::h1::Version::Http3 => "HTTP/3.0",
        }),
        Var::Scheme => out.push_str(if req.conn.tls.is_some() {
            "https"
        } else {
            "http"
        }),
        Var::Https => {
            if req.conn.tls.is_some() {
                out.push_str("on")
            }
        }
        Var::DocumentRoot => req.append_document_root(out),
        Var::RealpathRoot => {
            let root = req.document_root();
            match std::fs::canonicalize(&root) {
                Ok(p) => out.push_str(&p.to_string_lossy()),
                Err(_) => out.push_str(&root),
            }
        }
        Var::RequestFilename => out.push_str(&req.filename_for(&req.uri).to_string_lossy()),
        // An error page's or X-Accel-Redirect's GET is the method from then on, as nginx's.
        Var::RequestMethod => match req.method_override {
            Some(gannet_proto::h1::Method::Get) => out.push_str("GET"),
            _ => out.push_str(req.head.method_str()),
        },
        Var::Request => out.push_str(&String::from_utf8_lossy(request_line(req))),
        Var::RequestBody => {
            // As nginx: the body when it is in memory, nothing when it is in a file.
            if let Some(crate::conn::request_body::RequestBody::Memory(b)) = req.body.as_deref() {
                out.push_str(&String::from_utf8_lossy(b));
            }
        }
        Var::RequestBodyFile => {
            // The temporary file's name while the body is in one (nginx: not found else).
            if let Some(crate::conn::request_body::RequestBody::File(f)) = req.body.as_deref() {
                if let Some(name) = f.name() {
                    out.push_str(&name.to_string_lossy());
                }
            }
        }
        Var::RequestLength => {
            let head = req
                .wire_head_len
                .map_or(req.head.raw().len() as u64, u64::from);
            push_uint(out, head + req.body_length);
        }
        Var::RequestTime => push_secs(
            out,
            crate::runtime::clock::now().saturating_duration_since(req.start),
        ),
        // Before an answer is made, nginx's "000".
        Var::Status => match sent.map_or(0, |s| s.status) {
            s @ 100.. => push_uint(out, s.into()),
            s => {
                let _ = write!(out, "{s:03}");
            }
        },
        Var::BodyBytesSent => {
            push_uint(out, sent.map_or(0, |s| s.body_bytes));
        }
        Var::BytesSent => {
            push_uint(out, sent.map_or(0, |s| s.bytes));
        }
        Var::ContentType => {
            if let Some(v) = header_str(req, "content-type") {
                out.push_str(&v)
            }
        }
        Var::ContentLength => {
            if let Some(v) = header_str(req, "content-length") {
                out.push_str(&v)
            } else if let Some(b) = req
                .body
                .as_deref()
                .filter(|_| req.head.body == gannet_proto::h1::BodyKind::Chunked)
            {
                // A chunked body read whole: its length, as nginx's (0 for an empty one).
                push_uint(out, b.len());
            }
        }
        Var::Connection => {
            push_uint(out, req.conn.id);
        }
        Var::ConnectionRequests => {
            push_uint(out, req.conn.requests);
        }
        Var::ConnectionTime => push_secs(out, req.conn.born.elapsed()),
        Var::Pipe => out.push(if req.conn.pipelined { 'p' } else { '.' }),
        Var::RequestCompletion => {
            if sent.is_some_and(|s| s.complete) {
                out.push_str("OK");
            }
        }
        Var::Connections(g) => push_uint(out, crate::modules::stub_status::variable(*g)),
        Var::LimitReqStatus => out.push_str(req.limit_req_status.unwrap_or_default()),
        Var::LimitConnStatus => out.push_str(req.limit_conn_status.unwrap_or_default()),
        Var::LimitRate => {
            push_uint(out, req.limit_rate.get().unwrap_or(0));
        }
        Var::Msec => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let _ = write!(out, "{}.{:03}", now.as_secs(), now.subsec_millis());
        }
        Var::TimeLocal => crate::runtime::clock::append_time_local(out),
        Var::DateLocal | Var::DateGmt => {
            let d = crate::modules::ssi::date(b"%A, %d-%b-%Y %H:%M:%S %Z", *v == Var::DateGmt);
            out.push_str(&String::from_utf8_lossy(&d));
        }
        Var::TimeIso8601 => crate::runtime::clock::append_time_iso8601(out),
        Var::Pid => {
            push_uint(out, std::process::id().into());
        }
        Var::Version => out.push_str(env!("CARGO_PKG_VERSION")),
        Var::FastcgiScriptName => crate::modules::fastcgi::append_script_name(req, out),
        Var::FastcgiPathInfo => crate::modules::fastcgi::append_path_info(req, out),
        Var::Capture(n) => {
            if let Some(Some(c)) = caps.get(*n) {
                out.push_str(c)
            }
        }
        Var::Ssl(s) => {
            if let Some(t) = &req.conn.tls {
                s.append(out, t)
            }
        }
        Var::User(u) => user_vars::append(out, u, req, sent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles() {
        assert_eq!(
            Template::compile("plain").unwrap().as_literal(),
            Some("plain")
        );
        assert!(Template::compile("$uri").unwrap().has_vars());
        assert!(Template::compile("a${uri}b").unwrap().has_vars());
        assert_eq!(
            Template::compile("cost $").unwrap().as_literal(),
            Some("cost $")
        );
        assert!(Template::compile("$nosuchvar")
            .unwrap_err()
            .contains("unknown \"nosuchvar\" variable"));
        assert!(Template::compile("${uri").is_err());
        assert_eq!(Template::compile("").unwrap().as_literal(), Some(""));
    }

    #[test]
    fn times_as_nginx_writes_them() {
        use std::time::Duration;
        for (t, text) in [
            (Duration::ZERO, "0.000"),
            (Duration::from_millis(7), "0.007"),
            (Duration::from_millis(12_345), "12.345"),
            (Duration::from_micros(1_999_999), "1.999"),
        ] {
            let mut out = String::new();
            push_secs(&mut out, t);
            assert_eq!(out, text);
        }
    }

    #[test]
    fn numbers_and_addresses_as_display_writes_them() {
        for n in [0, 7, 10, 99, 65535, 1_000_000, u64::MAX] {
            let mut out = String::from("x");
            push_uint(&mut out, n);
            assert_eq!(out, format!("x{n}"));
        }
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.200.3.255",
            "255.255.255.255",
            "100.10.1.9",
            "1.20.199.0",
            "::1",
            "2001:db8::ff",
            "::ffff:1.2.3.4",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            let mut out = String::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string());
        }
    }
}
