//! Active health checks, the probing side (see `modules::health_check`): one task per
//! server of each checked group, in the first worker of a generation only, sends
//! `GET uri HTTP/1.0` every `interval` on a new connection (over TLS with the location's
//! `proxy_ssl_*` setup for `proxy_pass https://`) and reads the answer. `fails`
//! failed probes in a row mark the server unhealthy in the group's shared state, which every
//! worker's balancer reads (one atomic load per candidate, no lock); `passes` good ones in a
//! row bring it back. Each change of state is logged.

use crate::config::Probe;
use crate::errlog;
use crate::modules::health_check::default_accepts;
use crate::upstream::Addr;
use bytes::BytesMut;
use gannet_proto::h1::parse_response;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// The most of a probe's answer that is read (for `body ~` conditions).
const MAX_ANSWER: usize = 256 * 1024;

/// Start the probes of every `health_check`.
pub fn spawn_all(probes: &[Probe]) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for p in probes {
        for i in 0..p.upstream.servers.len() {
            tasks.push(tokio::task::spawn_local(probe_loop(p.clone(), i)));
        }
        if p.check.redis.is_some() {
            tasks.push(tokio::task::spawn_local(super::health_share::listen(
                p.clone(),
            )));
        }
    }
    tasks
}

async fn probe_loop(p: Probe, i: usize) {
    let server = &p.upstream.servers[i];
    let addr = match (&server.addr, p.check.port) {
        (Addr::Tcp(a), Some(port)) => {
            let host = a.rsplit_once(':').map_or(&**a, |(h, _)| h);
            Addr::Tcp(format!("{host}:{port}").into())
        }
        (a, _) => a.clone(),
    };
    let (mut fails, mut passes) = (0u32, 0u32);
    loop {
        match probe(&p, &addr).await {
            Ok(()) => {
                fails = 0;
                passes += 1;
                if passes >= p.check.passes && !p.upstream.healthy(i) {
                    p.upstream.set_healthy(i, true);
                    crate::modules::metrics::peer_state(server.metrics, server.down, true);
                    errlog::warn(format_args!(
                        "upstream server {} of \"{}\" is healthy again",
                        server.addr, p.upstream.name
                    ));
                    super::health_share::publish(&p, i, true).await;
                }
            }
            Err(why) => {
                passes = 0;
                fails += 1;
                if fails >= p.check.fails && p.upstream.healthy(i) {
                    p.upstream.set_healthy(i, false);
                    crate::modules::metrics::peer_state(server.metrics, server.down, false);
                    errlog::error(format_args!(
                        "upstream server {} of \"{}\" is unhealthy: {why} (health check \"{}\")",
                        server.addr, p.upstream.name, p.check.uri
                    ));
                    super::health_share::publish(&p, i, false).await;
                }
            }
        }
        tokio::time::sleep(p.check.interval).await;
    }
}

/// One probe: `Err` says why it failed.
async fn probe(p: &Probe, addr: &Addr) -> Result<(), String> {
    // A probe may take at most the interval (at least a second), so probes never pile up.
    let limit = p.check.interval.max(Duration::from_secs(1));
    match tokio::time::timeout(limit, exchange(p, addr)).await {
        Ok(r) => r,
        Err(_) => Err("timed out".into()),
    }
}

async fn exchange(p: &Probe, addr: &Addr) -> Result<(), String> {
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: gannet-health-check\r\n\r\n",
        p.check.uri, p.host
    );
    let mut conn = crate::conn::gateway::connect_plain(addr, false, None)
        .await
        .map_err(|e| format!("connect() failed ({e})"))?;
    if let Some((setup, name)) = &p.tls {
        let tls = crate::tls::client::handshake(conn, setup.config(), name.clone())
            .await
            .map_err(|e| crate::tls::client::describe(&e, name))?;
        conn = Box::new(tls);
    }
    conn.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    conn.flush().await.map_err(|e| e.to_string())?;
    // HTTP/1.0: the server closes after its answer; read it whole (up to a limit).
    let mut buf = BytesMut::with_capacity(8192);
    loop {
        let n = conn.read_buf(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 || buf.len() >= MAX_ANSWER {
            break;
        }
    }
    let head = parse_response(&mut buf, MAX_ANSWER, false)
        .map_err(|e| e.to_string())?
        .ok_or("incomplete answer")?;
    let ok = match &p.check.matcher {
        Some(m) => m.accepts(head.status, &head.headers, &buf),
        None => default_accepts(head.status),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("answer {} does not match", head.status))
    }
}
