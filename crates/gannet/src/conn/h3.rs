//! HTTP/3 connections (`conn::quic` accepts them): the `h3` crate does the framing and
//! QPACK over quinn's streams; each request stream is a local task (`conn::h3_stream`)
//! that runs the same exchange as HTTP/1.x and HTTP/2 (`conn::exchange`).
//!
//! Limits: the request streams a client may have open are `http3_max_concurrent_streams`
//! (QUIC's stream credit, `conn::quic`), the header section `large_client_header_buffers`'
//! total, `keepalive_requests` streams per connection (then GOAWAY), the handshake
//! `client_header_timeout`, each body read `client_body_timeout`, each write `send_timeout`.
//! A worker that drains sends GOAWAY and lets the streams in flight finish.

use super::ConnInfo;
use crate::errlog::{self, Level};
use crate::runtime::worker::Worker;
use bytes::Bytes;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a connection that sent GOAWAY looks whether its streams are done. (Its close
/// throws away what the client has not acknowledged yet, and neither h3 nor quinn's
/// connection tells when a finished stream's data has been: the next look gives them time.)
const DRAIN_CHECK: Duration = Duration::from_secs(1);

/// A connection's request streams in flight.
struct Activity {
    streams: Cell<usize>,
}

/// Held by a stream's task: counts it in, and out when the task ends.
pub(super) struct InFlight(Rc<Activity>);

impl InFlight {
    fn new(a: &Rc<Activity>) -> InFlight {
        a.streams.set(a.streams.get() + 1);
        InFlight(a.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.streams.set(self.0.streams.get() - 1);
    }
}

/// Serve one QUIC connection, from its handshake until it closes.
pub async fn serve(w: Rc<Worker>, connecting: quinn::Connecting, group: usize) {
    let g = &w.config.listens[group];
    let default = g.servers[g.default].clone();
    let born = Instant::now();
    let local = SocketAddr::new(
        connecting.local_ip().unwrap_or(g.listen.addr.ip()),
        g.listen.addr.port(),
    );
    let mut info = ConnInfo {
        peer: connecting.remote_address(),
        local,
        id: Worker::next_conn_id(),
        requests: 0,
        tls: None,
        proxy: None,
        unix: None,
        born,
        pipelined: false,
    };
    let (conn, early_data) = match handshake(connecting, &default).await {
        Ok(c) => c,
        Err(why) => return handshake_failed(&w, &info, why),
    };
    // What the handshake established, as on the TCP listener (`conn::quic_session`):
    // the server the SNI name chose did it (and judged the client's certificate).
    let tls = conn
        .handshake_data()
        .and_then(|d| d.downcast::<super::quic_session::Handshake>().ok())
        .and_then(|h| h.tls);
    let Some(mut tls) = tls else {
        return handshake_failed(&w, &info, "no certificate for the listen address");
    };
    let chain = conn.peer_identity().and_then(|c| {
        c.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()
    });
    tls.check_ocsp(chain.as_deref().map(Vec::as_slice)).await;
    tls.early_data = early_data;
    crate::modules::metrics::tls_handshake(Some((tls.protocol, tls.reused)));
    info.tls = Some(Arc::new(tls));
    let (n, size) = default.conf.core.large_client_header_buffers();
    let mut builder = h3::server::builder();
    builder
        .max_field_section_size(u64::try_from(n * size).unwrap_or(u64::MAX))
        // As nginx: no reserved (GREASE) frames, settings or streams, which some clients
        // (nginx's own test client among them) do not skip.
        .send_grease(false);
    let built = builder.build::<_, Bytes>(h3_quinn::Connection::new(conn.clone()));
    let mut h3c = match tokio::time::timeout(default.conf.core.client_header_timeout(), built).await
    {
        Ok(Ok(c)) => c,
        _ => {
            w.connection_closed();
            return;
        }
    };
    let core = &default.conf.core;
    // `keepalive_timeout 0` keeps no connection for a second request, as over HTTP/1.x.
    let max_requests = if core.keepalive_timeout().0.is_zero() {
        1
    } else {
        core.keepalive_requests()
    };
    let keepalive_time = core.keepalive_time();
    let activity = Rc::new(Activity {
        streams: Cell::new(0),
    });
    let mut requests = 0u64;
    // GOAWAY has been sent (keepalive_requests reached, or the worker drains).
    let mut closing = false;
    loop {
        // A graceful stop or reload: GOAWAY as it begins (`drain_started`, or here for a
        // connection that was not waiting then).
        if w.draining.get() && !closing {
            let _ = h3c.shutdown(1).await;
            closing = true;
        }
        let next = tokio::select! {
            r = h3c.accept(), if !closing => Some(r),
            () = tokio::time::sleep(DRAIN_CHECK), if closing => None,
            () = w.drain_started.notified(), if !closing => continue,
            _ = conn.closed() => break,
        };
        match next {
            Some(Ok(Some(resolver))) => {
                requests += 1;
                let mut info = info.clone();
                info.requests = requests;
                // The client's address now: a connection that migrated (`quic_bpf`) is
                // on a new one, which `$remote_addr` gives from then on, as in nginx.
                info.peer = conn.remote_address();
                let guard = InFlight::new(&activity);
                let task =
                    super::h3_stream::stream(w.clone(), info, group, resolver, conn.clone(), guard);
                tokio::task::spawn_local(task);
                let enough = max_requests > 0 && requests >= max_requests;
                if enough || born.elapsed() >= keepalive_time {
                    // GOAWAY names the first stream not served: the one after this.
                    let _ = h3c.shutdown(1).await;
                    closing = true;
                }
            }
            Some(Ok(None)) => break,
            Some(Err(e)) => {
                // A protocol error of the client's (ours to note); one that closed or
                // went away is not.
                if matches!(e, h3::error::ConnectionError::Local { .. }) && !e.is_h3_no_error() {
                    log_conn(&info, format_args!("HTTP/3 connection closed: {e}"));
                }
                break;
            }
            None => {
                if activity.streams.get() == 0 {
                    break;
                }
            }
        }
    }
    // Streams still running hold the connection (each within its own timeouts); it closes
    // when the last one is done.
    while activity.streams.get() > 0 {
        tokio::select! {
            () = tokio::time::sleep(DRAIN_CHECK) => {}
            _ = conn.closed() => break,
        }
    }
    conn.close(quinn::VarInt::from_u32(0x100), b"");
    w.connection_closed();
}

/// The handshake, within `client_header_timeout`. With `ssl_early_data on` a resumed
/// connection is taken as soon as the client's first flight is in (its 0-RTT requests are
/// served at once), with a flag that says the handshake is not complete yet.
async fn handshake(
    mut connecting: quinn::Connecting,
    default: &crate::config::ServerConf,
) -> Result<(quinn::Connection, Option<Arc<AtomicBool>>), String> {
    let timeout = default.conf.core.client_header_timeout();
    if default.conf.tls.early_data() {
        // The ClientHello first: the SNI name must be known before any request is.
        match tokio::time::timeout(timeout, connecting.handshake_data()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("client timed out".to_string()),
        }
        match connecting.into_0rtt() {
            // Only a resumed session can carry early data; any other handshake completes
            // first (quinn would hand it over before the client's certificate is in).
            Ok((conn, done)) if !resumed(&conn) => {
                return match tokio::time::timeout(timeout, done).await {
                    Ok(_) => match conn.close_reason() {
                        None => Ok((conn, None)),
                        Some(e) => Err(e.to_string()),
                    },
                    Err(_) => Err("client timed out".to_string()),
                };
            }
            Ok((conn, done)) => {
                let early = Arc::new(AtomicBool::new(true));
                let flag = early.clone();
                let watched = conn.clone();
                tokio::task::spawn_local(async move {
                    // Complete or failed (quinn closes a failed one): either way no longer
                    // in early data. One not done in time is closed, as without 0-RTT.
                    let finished = tokio::time::timeout(timeout, done).await;
                    flag.store(false, Ordering::Relaxed);
                    if finished.is_err() {
                        watched.close(quinn::VarInt::from_u32(0x100), b"");
                    }
                });
                return Ok((conn, Some(early)));
            }
            Err(c) => connecting = c,
        }
    }
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(c)) => Ok((c, None)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("client timed out".to_string()),
    }
}

/// The session was resumed (quinn's connection, while in its handshake).
fn resumed(conn: &quinn::Connection) -> bool {
    conn.handshake_data()
        .and_then(|d| d.downcast::<super::quic_session::Handshake>().ok())
        .and_then(|h| h.tls)
        .is_some_and(|t| t.reused)
}

fn handshake_failed(w: &Worker, info: &ConnInfo, why: impl std::fmt::Display) {
    crate::modules::metrics::tls_handshake(None);
    errlog::log(
        Level::Info,
        format_args!(
            "*{} {why} while handshaking, client: {}, server: {}",
            info.id,
            info.peer.ip(),
            info.local
        ),
    );
    w.connection_closed();
}

fn log_conn(info: &ConnInfo, what: std::fmt::Arguments) {
    errlog::log(
        Level::Info,
        format_args!(
            "*{} {what}, client: {}, server: {}",
            info.id,
            info.peer.ip(),
            info.local
        ),
    );
}
