//! `metrics` (server, location) and `status_zone` (server, location, if in location): a
//! location that answers with the server's counters in the Prometheus text format 0.0.4,
//! or OpenMetrics 1.0 when the scraper asks for it. gannet's own (nginx has no such
//! module; nginx Plus has its API and `status_zone`, whose name and meaning are kept).
//!
//! Counting only happens when the config has a `metrics` location: keys (server zones,
//! limit zones) are only registered then, and a key of 0 counts nothing. The counters
//! live in `runtime::metrics` (per worker thread, shared between processes, summed here).

use super::{LoadCtx, LocConf};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use crate::runtime::conn_stats::Totals;
use crate::runtime::metrics::{self as m, global, limit, zone, Key, Kind, BUCKETS};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use gannet_proto::h1::Method;
pub mod cache;
mod encode;
pub use encode::{Encoder, Type};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "metrics",
        ctx: Ctx(Ctx::SERVER.0 | Ctx::LOCATION.0),
        args: Args::Exactly(0),
        block: false,
    },
    Spec {
        name: "status_zone",
        ctx: Ctx(Ctx::SERVER.0 | Ctx::LOCATION.0 | Ctx::IF.0),
        args: Args::Exactly(1),
        block: false,
    },
];

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    match d.name.as_str() {
        // A content handler: this level only, not inherited.
        "metrics" => lc.metrics = true,
        _ => {
            if lc.status_zone.is_some() {
                return Err(d.error("\"status_zone\" directive is duplicate"));
            }
            lc.status_zone = Some(register(ctx, Kind::Server, &d.args[0]));
        }
    }
    Ok(())
}

/// Whether an http block has a `metrics` location (or server) anywhere: then everything
/// is counted. Only server and location blocks are looked into (a `map` entry may be
/// named `metrics` too).
pub fn used(tree: &[gannet_conf::Directive]) -> bool {
    tree.iter().any(|d| match d.name.as_str() {
        "metrics" => true,
        "server" | "location" => d.block.as_deref().is_some_and(used),
        _ => false,
    })
}

/// The key of a name when the config counts, else 0 (nothing counted).
pub fn register(ctx: &LoadCtx, kind: Kind, name: &str) -> Key {
    if ctx.metrics {
        m::key(kind, name)
    } else {
        0
    }
}

/// The log phase: count a finished request in its zone.
pub fn request(req: &Request, status: u16, received: u64, sent: u64) {
    let key = req.conf.status_zone.unwrap_or(req.server.zone);
    if key == 0 {
        return;
    }
    m::add(key, class(status), 1);
    m::add(key, zone::IN, received);
    m::add(key, zone::OUT, sent);
    m::observe(key, req.start.elapsed());
}

/// Keys for the servers of an `upstream` group (labels: the group, the server as written)
/// and their state as configured.
pub fn register_group(ctx: &LoadCtx, up: &mut crate::upstream::Upstream) {
    if !ctx.metrics {
        return;
    }
    for s in &mut up.servers {
        s.metrics = m::key2(Kind::Peer, &up.name, &s.addr.to_string());
        peer_state(s.metrics, s.down, true);
    }
}

/// The key of an address `proxy_pass` (or `*_pass`) names directly, not a group: nginx
/// makes an implicit group named after it, and so its label is the address twice.
pub fn direct_peer(req: &Request, addr: &crate::upstream::Addr) -> Key {
    if req.server.zone == 0 {
        return 0;
    }
    match addr {
        crate::upstream::Addr::Tcp(a) => m::key2(Kind::Peer, a, a),
        crate::upstream::Addr::Unix(p) => {
            let p = format!("unix:{}", p.display());
            m::key2(Kind::Peer, &p, &p)
        }
    }
}

/// One attempt at an upstream server: answered (its head read) or failed.
pub fn attempt(peer: Key, status: u16, answered: bool, took: std::time::Duration) {
    if peer == 0 {
        return;
    }
    m::add(peer, zone::IN, 1);
    if answered {
        m::add(peer, class(status), 1);
    } else {
        m::add(peer, zone::OUT, 1);
    }
    m::observe(peer, took);
}

/// States of a peer, as its gauge holds them.
const PEER_STATES: [&str; 3] = ["up", "down", "unhealthy"];

/// A peer's state: `down` as configured, else whether its active checks pass.
pub fn peer_state(peer: Key, down: bool, healthy: bool) {
    m::set_gauge(
        peer,
        if down {
            1
        } else if healthy {
            0
        } else {
            2
        },
    );
}

/// A limit zone's verdict (`$limit_req_status`/`$limit_conn_status` words).
pub fn limited(key: Key, status: &str) {
    if key == 0 {
        return;
    }
    let i = match status {
        "PASSED" => limit::PASSED,
        "DELAYED" => limit::DELAYED,
        "REJECTED" => limit::REJECTED,
        "DELAYED_DRY_RUN" => limit::DELAYED_DRY_RUN,
        _ => limit::REJECTED_DRY_RUN,
    };
    m::add(key, i, 1);
}

/// A TLS handshake's end: its protocol (`TLSv1.2`...) and whether a session was resumed,
/// or `None` when it failed.
pub fn tls_handshake(done: Option<(&str, bool)>) {
    match done {
        Some((proto, resumed)) => {
            let i = match proto {
                "TLSv1.3" => global::TLS13,
                "TLSv1.2" => global::TLS12,
                _ => global::TLS_OTHER,
            };
            m::add(m::GLOBAL, i, 1);
            if resumed {
                m::add(m::GLOBAL, global::TLS_RESUMED, 1);
            }
        }
        None => m::add(m::GLOBAL, global::TLS_FAILED, 1),
    }
}

pub fn h2_stream() {
    m::add(m::GLOBAL, global::H2_STREAMS, 1);
}

/// Counter index of a status's class (1xx at 0 .. 5xx at 4; others count as 5xx).
fn class(status: u16) -> usize {
    match status {
        100..=599 => usize::from(status / 100 - 1),
        _ => 4,
    }
}

const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The content handler of a `metrics` location.
pub fn handle(req: &Request) -> Flow {
    if !matches!(req.method(), Method::Get | Method::Head) {
        return Flow::Status(405);
    }
    let om = req
        .head
        .header("accept")
        .is_some_and(|a| String::from_utf8_lossy(a).contains("application/openmetrics-text"));
    let mut r = Response::new(200);
    r.content_type = Some(Arc::from(if om {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; version=0.0.4; charset=utf-8"
    }));
    r.body = Body::bytes(scrape(om));
    Flow::Done(r)
}

/// The whole page.
pub fn scrape(om: bool) -> String {
    let mut e = Encoder::new(om);
    let t = Totals::now();
    e.family(
        "gannet_connections_accepted",
        Type::Counter,
        "Connections accepted.",
    );
    e.sample("gannet_connections_accepted", &[], t.accepted);
    e.family(
        "gannet_connections_handled",
        Type::Counter,
        "Connections served.",
    );
    e.sample("gannet_connections_handled", &[], t.handled);
    e.family(
        "gannet_connections",
        Type::Gauge,
        "Open connections by state.",
    );
    // Parked connections are idle ones waiting out of their tasks: shown apart, so that
    // the states add up to the open connections.
    let parked = m::gauge_total(m::GLOBAL, global::PARKED).min(t.waiting());
    let states = [
        ("reading", t.reading),
        ("writing", t.writing),
        ("idle", t.waiting() - parked),
        ("parked", parked),
    ];
    for (s, v) in states {
        e.sample("gannet_connections", &[("state", s)], v);
    }
    let g = |i| m::total(m::GLOBAL, i);
    e.family(
        "gannet_tls_handshakes",
        Type::Counter,
        "TLS handshakes done, by version.",
    );
    for (v, i) in [
        ("TLSv1.2", global::TLS12),
        ("TLSv1.3", global::TLS13),
        ("other", global::TLS_OTHER),
    ] {
        e.sample("gannet_tls_handshakes", &[("version", v)], g(i));
    }
    e.family(
        "gannet_tls_handshakes_resumed",
        Type::Counter,
        "TLS handshakes that resumed a session.",
    );
    e.sample("gannet_tls_handshakes_resumed", &[], g(global::TLS_RESUMED));
    e.family(
        "gannet_tls_handshakes_failed",
        Type::Counter,
        "TLS handshakes that failed.",
    );
    e.sample("gannet_tls_handshakes_failed", &[], g(global::TLS_FAILED));
    e.family(
        "gannet_http2_streams",
        Type::Counter,
        "HTTP/2 streams (requests) opened.",
    );
    e.sample("gannet_http2_streams", &[], g(global::H2_STREAMS));

    let keys = m::registered();
    let of = |k: Kind| keys.iter().filter(move |(_, kind, _)| *kind == k);
    e.family(
        "gannet_http_requests",
        Type::Counter,
        "Requests answered, by server zone and status class.",
    );
    for (k, _, name) in of(Kind::Server) {
        for (i, c) in CLASSES.iter().enumerate() {
            e.sample(
                "gannet_http_requests",
                &[("server", name), ("code", c)],
                m::total(*k, i),
            );
        }
    }
    e.family(
        "gannet_http_received_bytes",
        Type::Counter,
        "Request bytes received (head and body).",
    );
    for (k, _, name) in of(Kind::Server) {
        e.sample(
            "gannet_http_received_bytes",
            &[("server", name)],
            m::total(*k, zone::IN),
        );
    }
    e.family(
        "gannet_http_sent_bytes",
        Type::Counter,
        "Response bytes sent (head and body).",
    );
    for (k, _, name) in of(Kind::Server) {
        e.sample(
            "gannet_http_sent_bytes",
            &[("server", name)],
            m::total(*k, zone::OUT),
        );
    }
    e.family(
        "gannet_http_request_duration_seconds",
        Type::Histogram,
        "Time from a request's first byte to its log phase.",
    );
    for (k, _, name) in of(Kind::Server) {
        histogram(
            &mut e,
            "gannet_http_request_duration_seconds",
            &[("server", name)],
            *k,
        );
    }

    let peers: Vec<(Key, &str, &str)> = of(Kind::Peer)
        .map(|(k, _, n)| {
            let (g, p) = n.split_once('\t').unwrap_or((n, n));
            (*k, g, p)
        })
        .collect();
    e.family(
        "gannet_upstream_requests",
        Type::Counter,
        "Attempts sent to an upstream server.",
    );
    for &(k, g, p) in &peers {
        e.sample(
            "gannet_upstream_requests",
            &[("upstream", g), ("peer", p)],
            m::total(k, zone::IN),
        );
    }
    e.family(
        "gannet_upstream_responses",
        Type::Counter,
        "Answers from an upstream server, by status class.",
    );
    for &(k, g, p) in &peers {
        for (i, c) in CLASSES.iter().enumerate() {
            e.sample(
                "gannet_upstream_responses",
                &[("upstream", g), ("peer", p), ("code", c)],
                m::total(k, i),
            );
        }
    }
    e.family(
        "gannet_upstream_failures",
        Type::Counter,
        "Attempts that got no answer (refused, timed out, reset).",
    );
    for &(k, g, p) in &peers {
        e.sample(
            "gannet_upstream_failures",
            &[("upstream", g), ("peer", p)],
            m::total(k, zone::OUT),
        );
    }
    e.family(
        "gannet_upstream_response_duration_seconds",
        Type::Histogram,
        "Time of an attempt, from its start to the answer's end or the failure.",
    );
    for &(k, g, p) in &peers {
        histogram(
            &mut e,
            "gannet_upstream_response_duration_seconds",
            &[("upstream", g), ("peer", p)],
            k,
        );
    }
    e.family("gannet_upstream_peer_state", Type::Gauge, "1 for a server's state: down (configured), unhealthy (failing its active health checks) or up.");
    for &(k, g, p) in &peers {
        let now = m::gauge(k) as usize;
        for (i, st) in PEER_STATES.iter().enumerate() {
            e.sample(
                "gannet_upstream_peer_state",
                &[("upstream", g), ("peer", p), ("state", st)],
                u8::from(i == now),
            );
        }
    }

    e.family(
        "gannet_upstream_connections",
        Type::Gauge,
        "Connections to an upstream server: in use (active), or kept idle for reuse.",
    );
    for &(k, g, p) in &peers {
        for (st, i) in [("active", zone::ACTIVE), ("idle", zone::IDLE)] {
            let v = m::gauge_total(k, i);
            e.sample(
                "gannet_upstream_connections",
                &[("upstream", g), ("peer", p), ("state", st)],
                v,
            );
        }
    }

    let results = [
        ("passed", limit::PASSED),
        ("delayed", limit::DELAYED),
        ("rejected", limit::REJECTED),
        ("delayed_dry_run", limit::DELAYED_DRY_RUN),
        ("rejected_dry_run", limit::REJECTED_DRY_RUN),
    ];
    e.family(
        "gannet_limit_req_requests",
        Type::Counter,
        "limit_req verdicts, by zone.",
    );
    for (k, _, name) in of(Kind::LimitReq) {
        for (r, i) in results {
            e.sample(
                "gannet_limit_req_requests",
                &[("zone", name), ("result", r)],
                m::total(*k, i),
            );
        }
    }
    e.family(
        "gannet_limit_conn_requests",
        Type::Counter,
        "limit_conn verdicts, by zone.",
    );
    for (k, _, name) in of(Kind::LimitConn) {
        for (r, i) in [results[0], results[2], results[4]] {
            e.sample(
                "gannet_limit_conn_requests",
                &[("zone", name), ("result", r)],
                m::total(*k, i),
            );
        }
    }
    let caches: Vec<(Key, &str)> = of(Kind::Cache).map(|(k, _, n)| (*k, n.as_str())).collect();
    cache::scrape(&mut e, &caches);
    e.finish()
}

/// A histogram's buckets (cumulative), sum (seconds) and count for one label.
fn histogram(e: &mut Encoder, name: &str, labels: &[(&str, &str)], key: Key) {
    let mut counts = [0u64; BUCKETS.len() + 1];
    for (i, c) in counts.iter_mut().enumerate() {
        *c = m::total(key, zone::BUCKET0 + i);
    }
    let sum = m::total(key, zone::TIME_US) as f64 / 1e6;
    e.histogram_of(name, labels, &counts, sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes() {
        assert_eq!(class(101), 0);
        assert_eq!(class(204), 1);
        assert_eq!(class(404), 3);
        assert_eq!(class(499), 3);
        assert_eq!(class(503), 4);
        assert_eq!(class(0), 4);
    }
}
