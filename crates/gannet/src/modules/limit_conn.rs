//! Concurrent request limiting, as nginx's ngx_http_limit_conn_module: `limit_conn_zone key
//! zone=name:size` (http), `limit_conn zone N`, `limit_conn_dry_run`,
//! `limit_conn_log_level`, `limit_conn_status` (http, server, location), and
//! `$limit_conn_status`.
//!
//! As in nginx, what is counted is requests being served, not TCP connections: an idle
//! keep-alive connection counts for nothing, and each HTTP/2 stream counts. A request is
//! counted from the pre-access phase until its answer has been sent (the count is held by
//! the request and given back when it is dropped). One over the limit of any zone is
//! refused (503 unless `limit_conn_status` says otherwise). The lists are inherited by a
//! level that has none of its own.
//!
//! A zone with `redis=name` (gannet's, not nginx's) counts the requests of every gannet node
//! using that `redis_server`: see [`shared`].

use super::limit_zone;
use super::{LoadCtx, LocConf};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::gateway::spec;

pub mod shared;

pub const DIRECTIVES: &[Spec] = &[
    // Two as nginx's; `redis=name` and `fail_open | fail_closed` may follow.
    spec("limit_conn_zone", Ctx::HTTP, Args::Between(2, 4)),
    spec("limit_conn", Ctx::HSL, Args::Exactly(2)),
    spec("limit_conn_dry_run", Ctx::HSL, Args::Exactly(1)),
    spec("limit_conn_log_level", Ctx::HSL, Args::Exactly(1)),
    spec("limit_conn_status", Ctx::HSL, Args::Exactly(1)),
];

/// The longest key nginx accepts here.
const MAX_KEY: usize = 255;

/// A `limit_conn_zone`: its key and the requests in progress per key.
#[derive(Debug)]
pub struct ConnZone {
    name: String,
    key: Template,
    key_src: String,
    capacity: usize,
    counts: Mutex<HashMap<Box<[u8]>, u64>>,
    /// Its `metrics` key (0: not counted).
    metrics: crate::runtime::metrics::Key,
    /// Counted in Redis (`redis=name`); `counts` then holds this node's own requests.
    shared: Option<shared::Shared>,
}

/// One request counted in a zone, given back when dropped.
#[derive(Debug)]
pub struct Held {
    zone: Arc<ConnZone>,
    key: Box<[u8]>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut counts = limit_zone::lock(&self.zone.counts);
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
        drop(counts);
        if self.zone.shared.is_some() {
            shared::give(&self.zone, &self.key);
        }
    }
}

impl ConnZone {
    /// Count one more request for `key` unless `max` are in progress (or the zone is full).
    fn take(self: &Arc<Self>, key: &[u8], max: u64) -> Result<Held, Refused> {
        let mut counts = limit_zone::lock(&self.counts);
        let full = counts.len() >= self.capacity;
        match counts.get_mut(key) {
            Some(n) if *n >= max => return Err(Refused::Limit),
            Some(n) => *n += 1,
            None if full => return Err(Refused::Full),
            None => {
                counts.insert(key.into(), 1);
            }
        }
        Ok(Held {
            zone: self.clone(),
            key: key.into(),
        })
    }
}

enum Refused {
    Limit,
    Full,
}

/// One `limit_conn` line.
#[derive(Debug, Clone)]
pub struct Limit {
    zone: Arc<ConnZone>,
    max: u64,
}

pub type LimitConnConf = limit_zone::Limits<Limit>;

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    match d.name.as_str() {
        "limit_conn_zone" => zone(d, ctx),
        "limit_conn" => {
            let name = &d.args[0];
            let zone = ctx
                .zones
                .conn
                .get(name)
                .cloned()
                .ok_or_else(|| d.error(format!("unknown limit_conn_zone \"{name}\"")))?;
            let max = match setters::num(&d.args[1]) {
                Some(n) if n > 0 && n <= 65535 => n,
                _ => {
                    return Err(d.error(format!("invalid number of connections \"{}\"", d.args[1])))
                }
            };
            let mut limits = lc.limit_conn.list.as_deref().cloned().unwrap_or_default();
            if limits.iter().any(|l| Arc::ptr_eq(&l.zone, &zone)) {
                return Err(d.error("\"limit_conn\" directive is duplicate"));
            }
            limits.push(Limit { zone, max });
            lc.limit_conn.list = Some(Arc::new(limits));
            Ok(())
        }
        _ => lc.limit_conn.policy.set(d),
    }
}

/// `limit_conn_zone key zone=name:size [redis=name [fail_open | fail_closed]]`.
fn zone(d: &Directive, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let (redis, fail_open) = limit_zone::redis_args(d, 2, ctx)?;
    let key = Template::compile(&d.args[0]).map_err(|e| d.error(e))?;
    let (name, capacity) = limit_zone::parse_zone(d, &d.args[1], 32_000, ctx)?;
    let zone = ConnZone {
        name: name.clone(),
        key,
        key_src: d.args[0].clone(),
        capacity,
        counts: Mutex::default(),
        metrics: super::metrics::register(ctx, crate::runtime::metrics::Kind::LimitConn, &name),
        shared: redis.map(|server| shared::Shared::new(server, &name, fail_open)),
    };
    ctx.zones.conn.insert(name, Arc::new(zone));
    Ok(())
}

/// The pre-access check: `None` to go on (the request now holds its counts), or the
/// refusal.
pub fn check(req: &mut Request) -> Option<Flow> {
    if req.limit_conn_status.is_some() {
        return None;
    }
    // The location's settings outlive the borrow of `req` the counts need.
    let conf = match req.conf.limit_conn.list {
        Some(_) => req.conf.clone(),
        None => return None,
    };
    let limits = conf.limit_conn.list.as_deref()?;
    let policy = &conf.limit_conn.policy;
    let mut in_redis = Vec::new();
    for l in limits {
        let Some(key) = limit_zone::key(req, &l.zone.key, &l.zone.key_src, MAX_KEY) else {
            continue;
        };
        if l.zone.shared.is_some() {
            in_redis.push((l.clone(), key));
            continue;
        }
        req.limit_conn_status = Some("PASSED");
        match l.zone.take(key.as_bytes(), l.max) {
            Ok(held) => {
                super::metrics::limited(l.zone.metrics, "PASSED");
                req.limit_conns.push(held)
            }
            Err(why) => {
                if let Some(f) = refuse(req, policy, &l.zone, why) {
                    return Some(f);
                }
                return None;
            }
        }
    }
    if in_redis.is_empty() {
        return None;
    }
    Some(Flow::LimitConnShared(Box::new(shared::Pending {
        shared: in_redis,
        policy: *policy,
    })))
}

/// Log a refusal, give back what the request holds and answer it (or, in a dry run, note it
/// and go on: `None`).
fn refuse(
    req: &mut Request,
    policy: &limit_zone::Policy,
    zone: &ConnZone,
    why: Refused,
) -> Option<Flow> {
    let dry = if policy.dry_run() { ", dry run," } else { "" };
    match why {
        Refused::Limit => errlog::request(
            policy.log_level(),
            req,
            format_args!("limiting connections{dry} by zone \"{}\"", zone.name),
        ),
        Refused::Full => errlog::request(
            Level::Alert,
            req,
            format_args!(
                "could not allocate node in limit_conn zone \"{}\"",
                zone.name
            ),
        ),
    }
    // What the other zones counted for this request is given back.
    req.limit_conns.clear();
    let word = if policy.dry_run() {
        "REJECTED_DRY_RUN"
    } else {
        "REJECTED"
    };
    super::metrics::limited(zone.metrics, word);
    req.limit_conn_status = Some(word);
    (!policy.dry_run()).then(|| Flow::Status(policy.status()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_up_to_the_limit_and_gives_back_on_drop() {
        let z = Arc::new(ConnZone {
            name: "z".into(),
            key: Template::literal("k"),
            key_src: "k".into(),
            capacity: 1,
            counts: Mutex::default(),
            metrics: 0,
            shared: None,
        });
        let a = z.take(b"a", 2).ok();
        let b = z.take(b"a", 2).ok();
        assert!(a.is_some() && b.is_some());
        assert!(matches!(z.take(b"a", 2), Err(Refused::Limit)));
        assert!(matches!(z.take(b"b", 2), Err(Refused::Full)));
        drop(a);
        assert!(z.take(b"a", 2).is_ok());
        drop(b);
        assert!(
            limit_zone::lock(&z.counts).is_empty(),
            "the last one removes the key"
        );
    }
}
