//! The load: `connections` slots, each holding one QUIC connection (its own UDP socket, so
//! each has its own 4-tuple as a browser's would) with `streams` request streams kept busy
//! until the run's requests are all taken. Everything runs on one thread: the shared counts
//! are plain cells.
//!
//! A connection the server ends (GOAWAY after `keepalive_requests`, an idle timeout) is made
//! again by its slot, and requests the server refused unprocessed are sent again, as h2load
//! does; a slot whose connection attempt fails, or whose connection ended without answering
//! anything, stops, so a dead server ends the run instead of spinning.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use futures_util::stream::{FuturesUnordered, StreamExt};
use h3::client::SendRequest;
use h3::error::{Code, ConnectionError, StreamError};
use h3::quic::ConnectionErrorIncoming;

use crate::report::Tally;

/// H3_NO_ERROR: the code a finished connection is closed with.
const H3_NO_ERROR: u32 = 0x100;

pub struct Plan {
    pub uri: http::Uri,
    pub headers: http::HeaderMap,
    pub addr: SocketAddr,
    pub server_name: String,
    pub streams: usize,
    pub timeout: Duration,
    pub client: quinn::ClientConfig,
}

struct Shared {
    plan: Plan,
    /// Requests not yet taken by a stream.
    left: Cell<u64>,
    /// When the last answer ended.
    last: Cell<Option<Instant>>,
    tally: RefCell<Tally>,
}

impl Shared {
    fn take(&self) -> bool {
        let left = self.left.get();
        if left == 0 {
            return false;
        }
        self.left.set(left - 1);
        true
    }

    /// A request the server never processed goes back to the pool; it counts as retried
    /// if it was sent.
    fn give_back(&self, sent: bool) {
        self.left.set(self.left.get() + 1);
        let mut t = self.tally.borrow_mut();
        t.started -= 1;
        t.retried += u64::from(sent);
    }
}

/// How one request ended, when it did not end in an answer.
enum Failure {
    /// The server never processed it: send it again on a new connection. `sent`: its
    /// HEADERS frame went out (it counted as started).
    Refused { sent: bool },
    /// Lost with its connection.
    Lost { timeout: bool, why: String },
    /// Its stream failed; the connection goes on.
    Stream(String),
}

fn connection_failure(e: &ConnectionError, sent: bool) -> Failure {
    if e.is_h3_no_error() {
        // Closed gracefully (after GOAWAY): what was not answered was not processed.
        return Failure::Refused { sent };
    }
    let timeout = matches!(
        e,
        ConnectionError::Timeout { .. }
            | ConnectionError::Remote {
                0: ConnectionErrorIncoming::Timeout,
                ..
            }
    );
    Failure::Lost {
        timeout,
        why: e.to_string(),
    }
}

fn classify(e: StreamError, sent: bool) -> Failure {
    match &e {
        StreamError::RemoteTerminate { code, .. } if *code == Code::H3_REQUEST_REJECTED => {
            Failure::Refused { sent }
        }
        StreamError::RemoteClosing { .. } => Failure::Refused { sent },
        StreamError::ConnectionError { 0: c, .. } => connection_failure(c, sent),
        _ => Failure::Stream(format!("{e:?}")),
    }
}

struct Reply {
    status: u16,
    header_bytes: u64,
    body_bytes: u64,
}

async fn request(
    plan: &Plan,
    send: &mut SendRequest<h3_quinn::OpenStreams, Bytes>,
) -> Result<Reply, Failure> {
    let mut req = http::Request::new(());
    *req.uri_mut() = plan.uri.clone();
    if !plan.headers.is_empty() {
        *req.headers_mut() = plan.headers.clone();
    }
    let mut stream = send
        .send_request(req)
        .await
        .map_err(|e| classify(e, false))?;
    stream.finish().await.map_err(|e| classify(e, true))?;
    let resp = stream
        .recv_response()
        .await
        .map_err(|e| classify(e, true))?;
    // `:status` and its three digits, then every field.
    let header_bytes = 10
        + resp
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str().len() + value.len()) as u64)
            .sum::<u64>();
    let mut body_bytes = 0;
    while let Some(chunk) = stream.recv_data().await.map_err(|e| classify(e, true))? {
        body_bytes += chunk.remaining() as u64;
    }
    Ok(Reply {
        status: resp.status().as_u16(),
        header_bytes,
        body_bytes,
    })
}

/// One stream's loop: request after request while there are requests left and its
/// connection is usable.
async fn stream_loop(shared: &Shared, mut send: SendRequest<h3_quinn::OpenStreams, Bytes>) {
    while shared.take() {
        shared.tally.borrow_mut().started += 1;
        let start = Instant::now();
        let result = request(&shared.plan, &mut send).await;
        let end = Instant::now();
        match result {
            Ok(reply) => {
                shared.last.set(Some(end));
                let mut t = shared.tally.borrow_mut();
                t.done += 1;
                t.classes[usize::from(reply.status / 100).min(5)] += 1;
                t.header_bytes += reply.header_bytes;
                t.body_bytes += reply.body_bytes;
                t.latency_us.push((end - start).as_micros() as u64);
            }
            Err(Failure::Refused { sent }) => {
                shared.give_back(sent);
                return;
            }
            Err(Failure::Lost { timeout, why }) => {
                let mut t = shared.tally.borrow_mut();
                t.errored += 1;
                t.timeout += u64::from(timeout);
                t.error(why);
                return;
            }
            Err(Failure::Stream(why)) => {
                let mut t = shared.tally.borrow_mut();
                t.errored += 1;
                t.error(why);
            }
        }
    }
}

async fn connect(endpoint: &quinn::Endpoint, plan: &Plan) -> Result<quinn::Connection, String> {
    let connecting = endpoint
        .connect_with(plan.client.clone(), plan.addr, &plan.server_name)
        .map_err(|e| format!("connect to {}: {e}", plan.addr))?;
    match tokio::time::timeout(plan.timeout, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(format!("QUIC handshake with {}: {e}", plan.addr)),
        Err(_) => Err(format!(
            "QUIC handshake with {}: no answer within {:?}",
            plan.addr, plan.timeout
        )),
    }
}

/// Keep `plan.streams` requests in flight on `conn` until none are left or the connection
/// ends; whether any request was answered on it.
async fn serve(shared: &Shared, conn: &quinn::Connection) -> bool {
    // No GREASE: each request is what h2load's would be, nothing more on the wire.
    let setup = h3::client::builder()
        .send_grease(false)
        .build(h3_quinn::Connection::new(conn.clone()))
        .await;
    let (mut driver, send) = match setup {
        Ok(pair) => pair,
        Err(e) => {
            shared
                .tally
                .borrow_mut()
                .error(format!("HTTP/3 set-up: {e}"));
            return false;
        }
    };
    let before = shared.tally.borrow().done;
    let mut streams: FuturesUnordered<_> = (0..shared.plan.streams)
        .map(|_| stream_loop(shared, send.clone()))
        .collect();
    drop(send);
    let all = async { while streams.next().await.is_some() {} };
    tokio::pin!(all);
    tokio::select! {
        _ = &mut all => {}
        // The connection ended (the driver also reads the server's control stream: SETTINGS,
        // GOAWAY); the streams see it too and finish.
        _ = poll_fn(|cx| driver.poll_close(cx)) => all.await,
    }
    conn.close(quinn::VarInt::from_u32(H3_NO_ERROR), b"");
    shared.tally.borrow().done > before
}

/// Room for 8 MiB of datagrams on the client's socket (quic-go asks as much for its own): while
/// this one thread is busy with other connections the kernel holds a server's burst instead of
/// dropping it, so the servers are not made to recover losses the client caused.
const RECEIVE_BUFFER: libc::c_int = 8 << 20;

fn endpoint(bind: SocketAddr) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(bind)?;
    let fd = socket.as_raw_fd();
    let size = RECEIVE_BUFFER;
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    for option in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: `fd` is the open socket owned by `socket` above, and `size` is a c_int
        // that lives through the call, whose length is passed with it. SO_RCVBUFFORCE (past
        // net.core.rmem_max) needs CAP_NET_ADMIN; without it SO_RCVBUF gets what the limit allows.
        let done = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&size as *const libc::c_int).cast(),
                len,
            )
        };
        if done == 0 {
            break;
        }
    }
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

async fn slot(shared: Rc<Shared>) {
    let bind: SocketAddr = if shared.plan.addr.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let endpoint = match endpoint(bind) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            let mut t = shared.tally.borrow_mut();
            t.connect_failed += 1;
            t.error(format!("UDP socket: {e}"));
            return;
        }
    };
    while shared.left.get() > 0 {
        let start = Instant::now();
        let conn = match connect(&endpoint, &shared.plan).await {
            Ok(conn) => conn,
            Err(why) => {
                let mut t = shared.tally.borrow_mut();
                t.connect_failed += 1;
                t.error(why);
                break;
            }
        };
        {
            let mut t = shared.tally.borrow_mut();
            t.connections += 1;
            t.connect_us.push(start.elapsed().as_micros() as u64);
            if t.alpn.is_none() {
                t.alpn = conn
                    .handshake_data()
                    .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
                    .and_then(|d| d.protocol)
                    .map(|p| String::from_utf8_lossy(&p).into_owned());
            }
        }
        let answered = serve(&shared, &conn).await;
        let stats = conn.stats();
        {
            let mut t = shared.tally.borrow_mut();
            t.udp_rx_bytes += stats.udp_rx.bytes;
            t.udp_rx_datagrams += stats.udp_rx.datagrams;
        }
        if !answered {
            break;
        }
    }
    // The CONNECTION_CLOSE frames go out before the process ends, so the server does not hold
    // the connection until its idle timeout (into the next round).
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
}

/// Run `requests` requests over `connections` connections; the counts and the time from the
/// start to the last answer.
pub async fn run(plan: Plan, requests: u64, connections: usize) -> (Tally, Duration) {
    let shared = Rc::new(Shared {
        plan,
        left: Cell::new(requests),
        last: Cell::new(None),
        tally: RefCell::new(Tally::default()),
    });
    let start = Instant::now();
    let mut slots = tokio::task::JoinSet::new();
    for _ in 0..connections {
        slots.spawn_local(slot(shared.clone()));
    }
    while slots.join_next().await.is_some() {}
    let elapsed = shared
        .last
        .get()
        .map_or(Duration::ZERO, |last| last - start);
    let tally = shared.tally.take();
    (tally, elapsed)
}
