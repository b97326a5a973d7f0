//! ngx_otel_module (nginx's OpenTelemetry module, nginxinc/nginx-otel): `otel_exporter`
//! (`endpoint`, `interval`, `batch_size`, `batch_count`, `header`), `otel_service_name`,
//! `otel_resource_attr`, `otel_trace`, `otel_trace_context`, `otel_span_name`,
//! `otel_span_attr`, and the variables `$otel_trace_id`, `$otel_span_id`, `$otel_parent_id`
//! and `$otel_parent_sampled`.
//!
//! As in nginx-otel: at the start of the location phases of a request (not again after an
//! internal redirect) `otel_trace` decides whether the request is sampled (a value of `on`
//! or `1`), the W3C `traceparent`/`tracestate` request headers are read (`extract`) and
//! replaced by this request's own context (`inject`), so that every gateway passes them on
//! as it passes any request header (`proxy_pass` as headers, FastCGI/SCGI/uwsgi as
//! `HTTP_TRACEPARENT`). At the log phase a sampled request's span (kind SERVER, the HTTP
//! semantic-convention attributes of OTel 1.16 that nginx-otel sets) goes into a bounded
//! queue, which a thread of the worker process sends over OTLP/gRPC in batches
//! (`export`). A location with no `otel_trace` and no `otel_trace_context` costs a
//! request one check of its settings, and the variables make a context only when read.

mod export;

use super::{LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::router::Matcher;
use crate::http::variables::{Sent, Template};
use export::{AnyValue, KeyValue, Span, Value};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use export::{flush_at_exit, Exporter};

pub const DIRECTIVES: &[Spec] = &[
    spec("otel_exporter", Ctx::HTTP, Args::Exactly(0), true),
    spec("otel_service_name", Ctx::HTTP, Args::Exactly(1), false),
    spec("otel_resource_attr", Ctx::HTTP, Args::Exactly(2), false),
    spec("otel_trace", Ctx::HSL, Args::Exactly(1), false),
    spec("otel_trace_context", Ctx::HSL, Args::Exactly(1), false),
    spec("otel_span_name", Ctx::HSL, Args::Exactly(1), false),
    spec("otel_span_attr", Ctx::HSL, Args::Exactly(2), false),
];

const fn spec(name: &'static str, ctx: Ctx, args: Args, block: bool) -> Spec {
    Spec {
        name,
        ctx,
        args,
        block,
    }
}

/// `otel_span_attr name value`.
type SpanAttr = (Box<str>, Template);

/// `otel_trace_context` bits.
const EXTRACT: u8 = 1;
const INJECT: u8 = 2;

#[derive(Debug, Clone, Default)]
pub struct OtelConf {
    trace: Option<Arc<Template>>,
    context: Option<u8>,
    span_name: Option<Arc<Template>>,
    span_attrs: Option<Arc<[SpanAttr]>>,
    /// The http level's exporter and resource (`otel_exporter`, `otel_service_name`,
    /// `otel_resource_attr`), shared by every level below.
    pub exporter: Option<Arc<Exporter>>,
}

impl OtelConf {
    pub fn merge(&mut self, p: &OtelConf) {
        super::inherit!(self, p, trace, context, span_name, span_attrs, exporter);
    }

    /// Whether requests here trace at all (the one check a request without otel pays).
    fn active(&self) -> bool {
        self.trace.is_some() || self.context.unwrap_or(0) != 0
    }
}

/// After the http block: an `otel_trace` anywhere needs the `otel_exporter` (nginx-otel
/// checks this as it merges, at the end of the http block; the error names the first
/// `otel_trace` here).
pub fn check_exporter(http: &LocConf, ctx: &LoadCtx) -> Result<(), ConfError> {
    match &ctx.otel_trace_at {
        Some(at)
            if !http
                .otel
                .exporter
                .as_ref()
                .is_some_and(|e| e.has_endpoint()) =>
        {
            Err(ConfError::at(at, "\"otel_exporter\" block is missing"))
        }
        _ => Ok(()),
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.otel;
    let dup = |set: bool| {
        if set {
            Err(d.error(format!("\"{}\" directive is duplicate", d.name)))
        } else {
            Ok(())
        }
    };
    let template = |s: &str| Template::compile(s).map(Arc::new).map_err(|e| d.error(e));
    match d.name.as_str() {
        "otel_exporter" => {
            let e = exporter_mut(c);
            dup(e.has_endpoint())?;
            e.parse_block(d, &ctx.prefix)?;
        }
        "otel_service_name" => exporter_mut(c).set_service_name(d)?,
        "otel_resource_attr" => exporter_mut(c).add_resource_attr(&d.args[0], &d.args[1]),
        "otel_trace" => {
            dup(c.trace.is_some())?;
            c.trace = Some(template(&d.args[0])?);
            ctx.otel_trace_at.get_or_insert_with(|| d.loc.clone());
        }
        "otel_trace_context" => {
            dup(c.context.is_some())?;
            c.context = Some(match d.args[0].as_str() {
                "ignore" => 0,
                "extract" => EXTRACT,
                "inject" => INJECT,
                "propagate" => EXTRACT | INJECT,
                v => return Err(super::invalid(d, v)),
            });
        }
        "otel_span_name" => {
            dup(c.span_name.is_some())?;
            c.span_name = Some(template(&d.args[0])?);
        }
        "otel_span_attr" => {
            let value = Template::compile(&d.args[1]).map_err(|e| d.error(e))?;
            let mut attrs: Vec<_> = c.span_attrs.as_deref().unwrap_or_default().to_vec();
            attrs.push((Box::from(d.args[0].as_str()), value));
            c.span_attrs = Some(attrs.into());
        }
        _ => {}
    }
    Ok(())
}

/// The http level's exporter settings, being read (only the http level holds them, and
/// nothing shares them until the servers are read).
fn exporter_mut(c: &mut OtelConf) -> &mut Exporter {
    Arc::make_mut(c.exporter.get_or_insert_with(Default::default))
}

/// A trace context: W3C `traceparent`'s ids and flag, and `tracestate` as received.
#[derive(Debug, Clone, Default)]
struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
    state: Option<Box<str>>,
}

impl TraceContext {
    /// `00-<32 hex>-<16 hex>-<2 hex>` as nginx-otel reads it; anything else is no parent.
    fn parse(parent: Option<&[u8]>, state: Option<&[u8]>) -> TraceContext {
        let mut tc = TraceContext::default();
        let Some(p) = parent else { return tc };
        let mut parts = p.split(|&b| b == b'-');
        let (Some(ver), Some(tid), Some(sid), Some(flags), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return tc;
        };
        let mut f = [0u8; 1];
        if ver != b"00"
            || unhex(tid, &mut tc.trace_id).is_none()
            || unhex(sid, &mut tc.span_id).is_none()
            || unhex(flags, &mut f).is_none()
        {
            return TraceContext::default();
        }
        tc.sampled = f[0] & 1 == 1;
        tc.state = state.map(|s| String::from_utf8_lossy(s).into());
        tc
    }

    /// A new span of `parent`'s trace (a new trace when it has none).
    fn child_of(parent: &TraceContext) -> TraceContext {
        let trace_id = if valid(&parent.trace_id) {
            parent.trace_id
        } else {
            nonzero(|| fastrand::u128(..).to_be_bytes())
        };
        TraceContext {
            trace_id,
            span_id: nonzero(|| fastrand::u64(..).to_be_bytes()),
            sampled: false,
            state: parent.state.clone(),
        }
    }

    fn traceparent(&self, sampled: bool) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.span_id);
        s.push_str(if sampled { "-01" } else { "-00" });
        s
    }
}

fn valid(id: &[u8]) -> bool {
    id.iter().any(|&b| b != 0)
}

fn nonzero<const N: usize>(mut f: impl FnMut() -> [u8; N]) -> [u8; N] {
    loop {
        let id = f();
        if valid(&id) {
            return id;
        }
    }
}

/// Hex digits (either case) of exactly `out`'s length.
fn unhex(s: &[u8], out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(())
}

fn push_hex(out: &mut String, id: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in id {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
}

/// A request's trace: the client's context and this request's span.
#[derive(Debug)]
pub struct Trace {
    parent: TraceContext,
    current: TraceContext,
    sampled: Cell<bool>,
}

/// The request's trace, made the first time something asks (nginx-otel's ensureOtelCtx):
/// the phase start or one of the variables.
fn ensure(req: &Request) -> &Trace {
    req.otel.get_or_init(|| {
        let parent = if req.conf.otel.context.unwrap_or(0) & EXTRACT != 0 {
            TraceContext::parse(
                req.head.header("traceparent"),
                req.head.header("tracestate"),
            )
        } else {
            TraceContext::default()
        };
        let current = TraceContext::child_of(&parent);
        Box::new(Trace {
            parent,
            current,
            sampled: Cell::new(false),
        })
    })
}

/// The start of the location phases (nginx-otel's rewrite-phase handler): the sampling
/// decision, and the context passed on. Not after an internal redirect, which must not
/// change the decision.
pub fn start(req: &mut Request) {
    if req.internal || !req.conf.otel.active() {
        return;
    }
    let c = req.conf.otel.clone();
    let sampled = c.trace.as_ref().is_some_and(|t| {
        let v = t.eval(req, None);
        v == "on" || v == "1"
    });
    let trace = ensure(req);
    trace.sampled.set(sampled);
    if c.context.unwrap_or(0) & INJECT != 0 {
        let parent = trace.current.traceparent(sampled);
        let state = trace.current.state.clone();
        req.head.set_header("traceparent", parent.as_bytes());
        req.head
            .set_header("tracestate", state.as_deref().unwrap_or("").as_bytes());
    }
}

/// `$otel_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtelVar {
    TraceId,
    SpanId,
    ParentId,
    ParentSampled,
}

impl OtelVar {
    pub fn from_name(name: &str) -> Option<OtelVar> {
        Some(match name {
            "otel_trace_id" => OtelVar::TraceId,
            "otel_span_id" => OtelVar::SpanId,
            "otel_parent_id" => OtelVar::ParentId,
            "otel_parent_sampled" => OtelVar::ParentSampled,
            _ => return None,
        })
    }

    /// The value; `$otel_parent_id` has none (nginx's "not found") without a parent.
    pub fn append(self, out: &mut String, req: &Request) {
        let t = ensure(req);
        match self {
            OtelVar::TraceId => push_hex(out, &t.current.trace_id),
            OtelVar::SpanId => push_hex(out, &t.current.span_id),
            OtelVar::ParentId => {
                if valid(&t.parent.span_id) {
                    push_hex(out, &t.parent.span_id);
                }
            }
            OtelVar::ParentSampled => out.push(if t.parent.sampled { '1' } else { '0' }),
        }
    }
}

/// The log phase: a sampled request's span, queued for the exporter.
pub fn finish(req: &Request, resp: &Response, body_len: u64) {
    let Some(t) = req.otel.get() else { return };
    if !t.sampled.get() {
        return;
    }
    let c = &req.conf.otel;
    let Some(exporter) = &c.exporter else { return };
    let now = SystemTime::now();
    let nanos = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_nanos() as u64
    };
    let start = now.checked_sub(req.start.elapsed()).unwrap_or(now);
    let name = match &c.span_name {
        Some(n) => n.eval(req, None),
        None => location_name(req),
    };
    let sent = Sent {
        status: resp.status,
        body_bytes: body_len,
        bytes: body_len,
        response: Some(resp),
        trailers: &[],
        complete: false,
    };
    let mut span = Span {
        trace_id: t.current.trace_id.to_vec(),
        span_id: t.current.span_id.to_vec(),
        trace_state: t.current.state.as_deref().unwrap_or("").to_string(),
        parent_span_id: if valid(&t.parent.span_id) {
            t.parent.span_id.to_vec()
        } else {
            Vec::new()
        },
        name,
        kind: export::SPAN_KIND_SERVER,
        start_time_unix_nano: nanos(start),
        end_time_unix_nano: nanos(now),
        ..Default::default()
    };
    default_attrs(&mut span, req, resp.status, body_len);
    for (name, value) in c.span_attrs.as_deref().unwrap_or_default() {
        let v = Value::StringValue(value.eval(req, Some(&sent)));
        // nginx-otel sends header attributes as arrays, as the conventions have them.
        let v = if name.starts_with("http.request.header.")
            || name.starts_with("http.response.header.")
        {
            Value::ArrayValue(export::ArrayValue {
                values: vec![AnyValue { value: Some(v) }],
            })
        } else {
            v
        };
        span.attributes.push(attr(name, v));
    }
    exporter.push(span);
}

/// The location's name as nginx has it (`clcf->name`): a prefix or exact location's URI,
/// a regex location's pattern, `@name`; empty outside any location.
fn location_name(req: &Request) -> String {
    match req.location.as_deref().map(|l| &l.matcher) {
        Some(Matcher::Exact(p)) | Some(Matcher::Prefix { path: p, .. }) => p.clone(),
        Some(Matcher::Regex(re)) => re.re.as_str().to_string(),
        Some(Matcher::Named(n)) => format!("@{n}"),
        None => String::new(),
    }
}

fn attr(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn text(key: &str, value: impl Into<String>) -> KeyValue {
    attr(key, Value::StringValue(value.into()))
}

fn int(key: &str, value: i64) -> KeyValue {
    attr(key, Value::IntValue(value))
}

/// nginx-otel's attributes (HTTP semantic conventions of OTel 1.16), in its order.
fn default_attrs(span: &mut Span, req: &Request, status: u16, body_len: u64) {
    use gannet_proto::h1::{BodyKind, Version};
    let a = &mut span.attributes;
    a.push(text("http.method", req.head.method_str()));
    a.push(text(
        "http.target",
        String::from_utf8_lossy(req.head.target()),
    ));
    let route = location_name(req);
    if !route.is_empty() {
        a.push(text("http.route", route));
    }
    let tls = req.conn.tls.is_some();
    a.push(text("http.scheme", if tls { "https" } else { "http" }));
    let flavor = match req.head.version {
        Version::Http09 => "0.9",
        Version::Http10 => "1.0",
        Version::Http11 => "1.1",
        Version::Http2 => "2.0",
        Version::Http3 => "3.0",
    };
    a.push(text("http.flavor", flavor));
    if let Some(ua) = req.head.header("user-agent") {
        a.push(text("http.user_agent", String::from_utf8_lossy(ua)));
    }
    let received = match req.head.body {
        BodyKind::Length(n) => n,
        _ => 0,
    };
    a.push(int("http.request_content_length", received as i64));
    a.push(int("http.response_content_length", body_len as i64));
    if status != 0 {
        a.push(int("http.status_code", status.into()));
        if status >= 500 {
            span.status = Some(export::Status {
                code: export::STATUS_CODE_ERROR,
                ..Default::default()
            });
        }
    }
    let a = &mut span.attributes;
    let server_name = if req.server.primary_name.is_empty() {
        String::from_utf8_lossy(req.head.host().unwrap_or_default()).into_owned()
    } else {
        req.server.primary_name.clone()
    };
    a.push(text("net.host.name", server_name));
    let port = req.conn.local.port();
    if port != if tls { 443 } else { 80 } {
        a.push(int("net.host.port", port.into()));
    }
    let peer = crate::http::variables::lookup("remote_addr", req).unwrap_or_default();
    a.push(text("net.sock.peer.addr", peer));
    a.push(int("net.sock.peer.port", req.client().port().into()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_read_as_nginx_otel_reads_it() {
        let tid = "0af7651916cd43dd8448eb211c80319c";
        let good = format!("00-{tid}-b7ad6b7169203331-01");
        let tc = TraceContext::parse(Some(good.as_bytes()), Some(b"k=v"));
        assert!(tc.sampled && valid(&tc.trace_id) && valid(&tc.span_id));
        assert_eq!(tc.traceparent(true), good);
        assert_eq!(tc.state.as_deref(), Some("k=v"));
        let unsampled = TraceContext::parse(
            Some(format!("00-{tid}-b7ad6b7169203331-00").as_bytes()),
            None,
        );
        assert!(!unsampled.sampled && valid(&unsampled.trace_id));
        for bad in [
            format!("01-{tid}-b7ad6b7169203331-01"),
            format!("00-{tid}-b7ad6b716920333-01"),
            format!("00-{tid}-b7ad6b7169203331-01-x"),
            format!("00-{tid}-b7ad6b716920333g-01"),
            format!("00-{tid}b7ad6b7169203331-01"),
            String::new(),
        ] {
            let tc = TraceContext::parse(Some(bad.as_bytes()), Some(b"k=v"));
            assert!(!valid(&tc.trace_id) && tc.state.is_none(), "{bad}");
        }
    }

    #[test]
    fn a_child_keeps_the_trace_and_gets_a_new_span() {
        let parent = TraceContext::parse(
            Some(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            None,
        );
        let child = TraceContext::child_of(&parent);
        assert_eq!(child.trace_id, parent.trace_id);
        assert_ne!(child.span_id, parent.span_id);
        let root = TraceContext::child_of(&TraceContext::default());
        assert!(valid(&root.trace_id) && valid(&root.span_id));
    }
}
