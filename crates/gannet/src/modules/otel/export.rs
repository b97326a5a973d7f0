//! `otel_exporter`: the bounded span queue of a worker process and the thread that sends it
//! over OTLP/gRPC (`TraceService/Export`) in batches.
//!
//! Why not the `opentelemetry_sdk` + `opentelemetry-otlp` pipeline: the spans are made
//! by nginx's rules, not by a tracer (ids from `traceparent`, the request's start time, a
//! sampling decision per location), and the SDK's batch processor brings its own runtime
//! and tonic's channel stack, where gannet runs one single-threaded tokio runtime per
//! thread. So the messages are `opentelemetry-proto`'s types, encoded by prost, and the
//! unary gRPC call is one HTTP/2 request through the `h2` client gannet already links
//! (a 5-byte frame prefix, `grpc-status` in the trailers) on a thread of its own; an
//! `https://` endpoint is reached over rustls (the CAs of `trusted_certificate`, else the
//! system's).
//!
//! The request path only `try_send`s a finished span into a bounded queue of
//! `batch_size * batch_count` spans (nginx-otel's batches in flight); a full queue drops
//! the span and counts it, logged at `notice` at most once a second ("OTel dropped
//! records: N", as nginx-otel). The thread sends a batch when it has `batch_size` spans or
//! `interval` has passed, and everything left when the configuration is dropped or the
//! worker process exits (`flush_at_exit`, waited for at most 5 seconds).

use crate::modules::tls::FileArg;
use bytes::{BufMut, Bytes, BytesMut};
use gannet_conf::{setters, ConfError, Directive};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::mpsc;

pub use opentelemetry_proto::tonic::common::v1::any_value::Value;
pub use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue};
pub use opentelemetry_proto::tonic::trace::v1::{Span, Status};

pub const SPAN_KIND_SERVER: i32 =
    opentelemetry_proto::tonic::trace::v1::span::SpanKind::Server as i32;
pub const STATUS_CODE_ERROR: i32 =
    opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32;

const PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// How long one export may take before it is given up (and its connection with it).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The http level's `otel_exporter`, `otel_service_name` and `otel_resource_attr`, and,
/// once the first span of this configuration is queued, the queue to the export thread.
#[derive(Debug, Clone, Default)]
pub struct Exporter {
    /// `host:port` (an `http://` prefix removed).
    endpoint: Option<String>,
    interval: Option<u64>,
    batch_size: Option<u64>,
    batch_count: Option<u64>,
    /// gRPC metadata sent with every export (names lowercase).
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    service_name: Option<String>,
    resource: Vec<(String, String)>,
    /// `trusted_certificate`: the CAs an `https://` endpoint is verified against.
    trusted: Option<FileArg>,
    /// The TLS setup of an `https://` endpoint.
    tls: Option<Arc<rustls::ClientConfig>>,
    queue: OnceLock<Arc<Queue>>,
}

/// The CAs gRPC trusts when `trusted_certificate` names none: the system's (Debian's path).
const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug)]
struct Queue {
    tx: mpsc::Sender<Span>,
    dropped: AtomicU64,
    /// The second the last drop notice was logged in.
    logged: AtomicU64,
    /// Tells the export thread to send what it has and end (the worker process exits).
    stop: Arc<tokio::sync::Notify>,
    /// Disconnected when the export thread has ended.
    done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

/// The queues whose export threads run in this process, for [`flush_at_exit`].
static STARTED: Mutex<Vec<Weak<Queue>>> = Mutex::new(Vec::new());

/// How long an exiting worker process waits for its spans to be sent.
const EXIT_FLUSH: Duration = Duration::from_secs(5);

/// The worker process is exiting: every export thread sends the spans it still has (as
/// nginx-otel flushes when its worker exits), waited for at most [`EXIT_FLUSH`].
pub fn flush_at_exit() {
    let started = std::mem::take(&mut *STARTED.lock().unwrap_or_else(|e| e.into_inner()));
    let queues: Vec<_> = started.iter().filter_map(Weak::upgrade).collect();
    for q in &queues {
        q.stop.notify_one();
    }
    let deadline = std::time::Instant::now() + EXIT_FLUSH;
    for q in &queues {
        let done = q.done.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(done) = done {
            let _ =
                done.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
        }
    }
}

/// "OTel: ..." / nginx-otel's wording for a bad exporter setting.
fn sub_error(e: &Directive, what: &str) -> ConfError {
    e.error(format!(
        "\"{}\" directive of \"otel_exporter\" {what}",
        e.name
    ))
}

impl Exporter {
    pub fn has_endpoint(&self) -> bool {
        self.endpoint.is_some()
    }

    /// `otel_exporter { ... }`.
    pub fn parse_block(&mut self, d: &Directive, prefix: &Path) -> Result<(), ConfError> {
        for e in d.block.as_deref().unwrap_or_default() {
            let argc = match e.name.as_str() {
                "endpoint" | "interval" | "batch_size" | "batch_count" | "trusted_certificate" => 1,
                "header" => 2,
                _ => {
                    return Err(e.error(format!(
                        "unknown directive \"{}\" in \"otel_exporter\"",
                        e.name
                    )))
                }
            };
            if e.args.len() != argc || e.block.is_some() {
                return Err(e.error(format!(
                    "invalid number of arguments in \"{}\" directive of \"otel_exporter\"",
                    e.name
                )));
            }
            let v = e.args[0].as_str();
            let number = |slot: &mut Option<u64>, parse: fn(&str) -> Option<u64>| {
                if slot.is_some() {
                    return Err(sub_error(e, "is duplicate"));
                }
                *slot = Some(parse(v).ok_or_else(|| sub_error(e, "invalid value"))?);
                Ok(())
            };
            match e.name.as_str() {
                "endpoint" => {
                    if self.endpoint.is_some() {
                        return Err(sub_error(e, "is duplicate"));
                    }
                    self.endpoint = Some(v.to_string());
                }
                "interval" => number(&mut self.interval, setters::msec)?,
                "batch_size" => number(&mut self.batch_size, setters::size)?,
                "batch_count" => number(&mut self.batch_count, setters::size)?,
                "header" => {
                    let name = http::HeaderName::from_bytes(v.to_ascii_lowercase().as_bytes())
                        .map_err(|_| sub_error(e, "has invalid header name"))?;
                    let value = http::HeaderValue::from_str(&e.args[1])
                        .map_err(|_| sub_error(e, "has invalid header value"))?;
                    self.headers.push((name, value));
                }
                _ => {
                    self.trusted = Some(FileArg {
                        path: prefix.join(v),
                        loc: e.loc.clone(),
                    })
                }
            }
        }
        let endpoint = self.endpoint.take().unwrap_or_default();
        let (endpoint, ssl) = if starts_with_ignore_case(&endpoint, "https://") {
            (endpoint[8..].to_string(), true)
        } else if starts_with_ignore_case(&endpoint, "http://") {
            (endpoint[7..].to_string(), false)
        } else {
            (endpoint, false)
        };
        if endpoint.is_empty() {
            return Err(d.error("\"otel_exporter\" requires \"endpoint\""));
        }
        if ssl {
            let cas = self.trusted.clone().unwrap_or_else(|| FileArg {
                path: SYSTEM_CAS.into(),
                loc: d.loc.clone(),
            });
            self.tls = Some(crate::tls::client::otlp(&cas)?);
        }
        self.endpoint = Some(endpoint);
        Ok(())
    }

    pub fn set_service_name(&mut self, d: &Directive) -> Result<(), ConfError> {
        if self.service_name.is_some() {
            return Err(d.error("\"otel_service_name\" directive is duplicate"));
        }
        self.service_name = Some(d.args[0].clone());
        Ok(())
    }

    pub fn add_resource_attr(&mut self, name: &str, value: &str) {
        // A later value for a name replaces the earlier one (nginx-otel keeps a map).
        self.resource.retain(|(n, _)| n != name);
        self.resource.push((name.to_string(), value.to_string()));
    }

    fn batch_size(&self) -> usize {
        self.batch_size.unwrap_or(512).max(1) as usize
    }

    fn capacity(&self) -> usize {
        self.batch_size()
            .saturating_mul(self.batch_count.unwrap_or(4).max(1) as usize)
    }

    /// Queue a finished span (from any worker thread); the export thread starts with the
    /// first. A full queue drops it.
    pub fn push(&self, span: Span) {
        let Some(endpoint) = &self.endpoint else {
            return;
        };
        let q = self.queue.get_or_init(|| self.start(endpoint));
        if q.tx.try_send(span).is_ok() {
            return;
        }
        let dropped = q.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if q.logged.swap(now, Ordering::Relaxed) != now {
            crate::errlog::notice(format_args!("OTel dropped records: {dropped}"));
        }
    }

    fn start(&self, endpoint: &str) -> Arc<Queue> {
        let (tx, rx) = mpsc::channel(self.capacity());
        let stop = Arc::new(tokio::sync::Notify::new());
        let (ended, done) = std::sync::mpsc::channel::<()>();
        let target = Target {
            endpoint: endpoint.to_string(),
            interval: Duration::from_millis(self.interval.unwrap_or(5000).max(1)),
            batch_size: self.batch_size(),
            headers: self.headers.clone(),
            resource: self.resource_attrs(),
            tls: self.tls.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("otel-export".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    let _ended = ended;
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt.block_on(run(rx, target, &stop)),
                        Err(e) => crate::errlog::error(format_args!("OTel worker init error: {e}")),
                    }
                }
            });
        if let Err(e) = spawned {
            crate::errlog::error(format_args!("OTel worker init error: {e}"));
        }
        let q = Arc::new(Queue {
            tx,
            dropped: AtomicU64::new(0),
            logged: AtomicU64::new(0),
            stop,
            done: Mutex::new(Some(done)),
        });
        let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
        started.retain(|w| w.strong_count() > 0);
        started.push(Arc::downgrade(&q));
        q
    }

    /// The resource's attributes: `otel_resource_attr`s, `service.name` from
    /// `otel_service_name` (over an attribute of that name) or `unknown_service:nginx`.
    fn resource_attrs(&self) -> Vec<KeyValue> {
        let mut attrs = self.resource.clone();
        match &self.service_name {
            Some(s) => {
                attrs.retain(|(n, _)| n != "service.name");
                attrs.push(("service.name".into(), s.clone()));
            }
            None if !attrs.iter().any(|(n, _)| n == "service.name") => {
                attrs.push(("service.name".into(), "unknown_service:nginx".into()));
            }
            None => {}
        }
        attrs.sort();
        attrs
            .into_iter()
            .map(|(key, v)| KeyValue {
                key,
                value: Some(AnyValue {
                    value: Some(Value::StringValue(v)),
                }),
                ..Default::default()
            })
            .collect()
    }
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

/// What the export thread needs.
struct Target {
    endpoint: String,
    interval: Duration,
    batch_size: usize,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    resource: Vec<KeyValue>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Target {
    /// A new HTTP/2 connection to the endpoint (over TLS for `https://`).
    async fn connect(&self) -> Result<h2::client::SendRequest<Bytes>, String> {
        let tcp = tokio::net::TcpStream::connect(&self.endpoint)
            .await
            .map_err(|e| format!("connect() to {} failed: {e}", self.endpoint))?;
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return open(tcp).await;
        };
        // SNI and the certificate's check name the endpoint's host.
        let name = crate::tls::client::server_name(&self.endpoint)
            .ok_or_else(|| format!("invalid host in \"{}\"", self.endpoint))?;
        let tls = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake with {} failed: {e}", self.endpoint))?;
        open(tls).await
    }
}

/// The HTTP/2 handshake on `io`; the connection is driven by a task of its own.
async fn open<T>(io: T) -> Result<h2::client::SendRequest<Bytes>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (client, connection) = h2::client::handshake(io).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The export thread: batches by size or time, until every sender is gone (the
/// configuration was dropped) or `stop` (the process exits), then what is left.
async fn run(mut rx: mpsc::Receiver<Span>, t: Target, stop: &tokio::sync::Notify) {
    let mut conn: Option<h2::client::SendRequest<Bytes>> = None;
    let mut batch = Vec::with_capacity(t.batch_size);
    let mut stopping = false;
    loop {
        let deadline = tokio::time::Instant::now() + t.interval;
        let closed = loop {
            let got = if stopping {
                // What is queued now, without waiting for more.
                match rx.try_recv() {
                    Ok(span) => Ok(Some(span)),
                    Err(_) => Ok(None),
                }
            } else {
                tokio::select! {
                    got = tokio::time::timeout_at(deadline, rx.recv()) => got,
                    _ = stop.notified() => {
                        stopping = true;
                        continue;
                    }
                }
            };
            match got {
                Ok(Some(span)) => {
                    batch.push(span);
                    if batch.len() >= t.batch_size {
                        break false;
                    }
                }
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        if !batch.is_empty() {
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(t.batch_size));
            let body = encode(&t, spans);
            match tokio::time::timeout(EXPORT_TIMEOUT, export(&t, &mut conn, body)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    conn = None;
                    crate::errlog::error(format_args!("OTel export failure: {e}"));
                }
                Err(_) => {
                    conn = None;
                    crate::errlog::error(format_args!("OTel export failure: timed out"));
                }
            }
        }
        if closed {
            return;
        }
    }
}

/// One `ExportTraceServiceRequest` in its gRPC frame (uncompressed flag, length).
fn encode(t: &Target, spans: Vec<Span>) -> Bytes {
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: t.resource.clone(),
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "nginx".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let len = req.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    // Encoding into a buffer of the encoded length cannot fail.
    let _ = req.encode(&mut buf);
    buf.freeze()
}

async fn export(
    t: &Target,
    conn: &mut Option<h2::client::SendRequest<Bytes>>,
    body: Bytes,
) -> Result<(), String> {
    let client = match conn {
        Some(c) => c,
        None => conn.insert(t.connect().await?),
    };
    let scheme = if t.tls.is_some() { "https" } else { "http" };
    let mut req = http::Request::post(format!("{scheme}://{}{PATH}", t.endpoint))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    for (n, v) in &t.headers {
        req.headers_mut().append(n.clone(), v.clone());
    }
    let mut ready = client.clone().ready().await.map_err(|e| e.to_string())?;
    let (answer, mut stream) = ready.send_request(req, false).map_err(|e| e.to_string())?;
    stream.send_data(body, true).map_err(|e| e.to_string())?;
    let answer = answer.await.map_err(|e| e.to_string())?;
    if answer.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", answer.status().as_u16()));
    }
    let (head, mut body) = answer.into_parts();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.map_err(|e| e.to_string())?;
    // A "trailers-only" answer has its status in the head.
    let fields = trailers.as_ref().unwrap_or(&head.headers);
    let status = fields.get("grpc-status").map(|v| v.as_bytes());
    match status {
        Some(b"0") => Ok(()),
        Some(code) => Err(format!(
            "gRPC status {}: {}",
            String::from_utf8_lossy(code),
            fields
                .get("grpc-message")
                .map_or(std::borrow::Cow::Borrowed(""), |m| String::from_utf8_lossy(
                    m.as_bytes()
                ))
        )),
        None => Err("no gRPC status".into()),
    }
}
