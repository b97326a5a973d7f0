//! Request rate limiting, as nginx's ngx_http_limit_req_module: `limit_req_zone key
//! zone=name:size rate=N r/s | r/m` (http), `limit_req zone=name [burst=N] [nodelay |
//! delay=N]`, `limit_req_dry_run`, `limit_req_log_level`, `limit_req_status` (http, server,
//! location), and `$limit_req_status`.
//!
//! The leaky bucket is nginx's, in its units (1 = 0.001 requests): each key's `excess` drains
//! at `rate` and a request adds 1.000 to it (a key's first request adds nothing). A request
//! that would take the excess over `burst` is refused (503 unless `limit_req_status` says
//! otherwise) and not counted; one over `delay` (0 by default, all of `burst` with
//! `nodelay`) waits until it would not be. Every limit of the location must let a request
//! through before any of them counts it; the longest wait of those it passes decides.
//!
//! A location's limits apply once per request: an internal redirect to a location with
//! limits of its own is not limited again (nginx's `limit_req_set`). The lists are
//! inherited by a level that has none of its own.
//!
//! A zone with `redis=name` (gannet's, not nginx's) keeps its keys in that `redis_server`
//! instead, so that many gannet nodes share one limit: see [`shared`].

use super::limit_zone;
use super::{LoadCtx, LocConf};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::gateway::spec;

pub mod shared;

pub const DIRECTIVES: &[Spec] = &[
    // Three as nginx's; `redis=name` and `fail_open | fail_closed` may follow.
    spec("limit_req_zone", Ctx::HTTP, Args::Between(3, 5)),
    spec("limit_req", Ctx::HSL, Args::Between(1, 3)),
    spec("limit_req_dry_run", Ctx::HSL, Args::Exactly(1)),
    spec("limit_req_log_level", Ctx::HSL, Args::Exactly(1)),
    spec("limit_req_status", Ctx::HSL, Args::Exactly(1)),
];

/// One request, in the bucket's unit.
const ONE: u64 = 1000;

/// A key idle this long with its excess drained may make room for a new one (nginx's).
const IDLE_MS: u64 = 60_000;

/// The longest key nginx accepts.
const MAX_KEY: usize = 65535;

/// A `limit_req_zone`: its key, its rate and the state of each key seen.
#[derive(Debug)]
pub struct ReqZone {
    pub name: String,
    key: Template,
    key_src: String,
    /// Requests per second, in thousandths.
    rate: u64,
    capacity: usize,
    born: Instant,
    table: Mutex<Table>,
    /// Its `metrics` key (0: not counted).
    pub metrics: crate::runtime::metrics::Key,
    /// Kept in Redis (`redis=name`) rather than in `table`.
    shared: Option<shared::Shared>,
}

#[derive(Debug, Default)]
struct Table {
    nodes: HashMap<Box<[u8]>, Node>,
    /// Keys from the oldest; one found still in use when room is needed goes to the back
    /// (a second chance), so the front is about the least recently used.
    order: VecDeque<Box<[u8]>>,
}

#[derive(Debug)]
struct Node {
    excess: u64,
    /// Milliseconds since the zone was made; `None` for a key created by a request that was
    /// then refused by another limit (it drains to nothing when next counted, as nginx's).
    last: Option<u64>,
}

/// Why a key could not be looked at.
struct Full;

impl ReqZone {
    fn now(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// The excess a request for `key` brings, counted (`account`) or not. A new key gets a
    /// node (making room by dropping idle or, when full, the oldest ones).
    fn excess(&self, key: &[u8], account: bool) -> Result<u64, Full> {
        let now = self.now();
        let mut t = limit_zone::lock(&self.table);
        let excess = match t.nodes.get(key) {
            Some(n) => self.next(n, now),
            None => {
                self.make_room(&mut t, now);
                if t.nodes.len() >= self.capacity {
                    return Err(Full);
                }
                t.order.push_back(key.into());
                t.nodes.insert(
                    key.into(),
                    Node {
                        excess: 0,
                        last: None,
                    },
                );
                0
            }
        };
        if account {
            if let Some(n) = t.nodes.get_mut(key) {
                n.excess = excess;
                n.last = Some(now);
            }
        }
        Ok(excess)
    }

    /// What has leaked from a node by `now`, in thousandths (everything for a node never
    /// counted).
    fn leaked(&self, n: &Node, now: u64) -> u64 {
        n.last.map_or(u64::MAX, |l| {
            self.rate.saturating_mul(now.saturating_sub(l)) / 1000
        })
    }

    /// The excess with one more request at `now`: what is left plus one, where what is left
    /// may be below nothing (a key back after a pause pays less than a whole request), and
    /// never below nothing in all, as nginx computes it.
    fn next(&self, n: &Node, now: u64) -> u64 {
        if n.last.is_none() {
            return 0;
        }
        (i128::from(n.excess) - i128::from(self.leaked(n, now)) + i128::from(ONE)).max(0) as u64
    }

    /// Before a new key: drop up to two idle, drained keys from the front, and when the zone
    /// is still full, the oldest by force (nginx's expiry).
    fn make_room(&self, t: &mut Table, now: u64) {
        for _ in 0..2 {
            let Some(k) = t.order.pop_front() else {
                return;
            };
            let idle = t.nodes.get(&k).is_none_or(|n| {
                n.last.is_none_or(|l| now.saturating_sub(l) >= IDLE_MS)
                    && self.leaked(n, now) >= n.excess
            });
            if idle {
                t.nodes.remove(&k);
            } else {
                t.order.push_back(k);
                break;
            }
        }
        if t.nodes.len() >= self.capacity {
            if let Some(k) = t.order.pop_front() {
                t.nodes.remove(&k);
            }
        }
    }
}

/// One `limit_req` line.
#[derive(Debug, Clone)]
pub struct Limit {
    zone: Arc<ReqZone>,
    /// Thousandths of a request, as the excess.
    burst: u64,
    delay: u64,
}

pub type LimitReqConf = limit_zone::Limits<Limit>;

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    match d.name.as_str() {
        "limit_req_zone" => zone(d, ctx),
        "limit_req" => {
            let limit = limit(d, ctx)?;
            let mut limits = lc.limit_req.list.as_deref().cloned().unwrap_or_default();
            if limits.iter().any(|l| Arc::ptr_eq(&l.zone, &limit.zone)) {
                return Err(d.error("\"limit_req\" directive is duplicate"));
            }
            limits.push(limit);
            lc.limit_req.list = Some(Arc::new(limits));
            Ok(())
        }
        _ => lc.limit_req.policy.set(d),
    }
}

/// `limit_req_zone key zone=name:size rate=N r/s`.
fn zone(d: &Directive, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if d.args.len() != 3 && !d.args.iter().any(|a| a.starts_with("redis=")) {
        // nginx's own zones take exactly three arguments (checked before their values).
        let extra = d
            .args
            .iter()
            .any(|a| a == "fail_open" || a == "fail_closed");
        return Err(d.error(if extra {
            "\"fail_open\" and \"fail_closed\" need \"redis=\""
        } else {
            "invalid number of arguments in \"limit_req_zone\" directive"
        }));
    }
    let key = Template::compile(&d.args[0]).map_err(|e| d.error(e))?;
    let mut named = None;
    let mut rate = None;
    let mut redis = None;
    let mut fail_open = None;
    for a in &d.args[1..] {
        if let Some(name) = a.strip_prefix("redis=") {
            let server = ctx.redis.get(name).cloned();
            redis =
                Some(server.ok_or_else(|| d.error(format!("unknown redis_server \"{name}\"")))?);
        } else if a == "fail_open" || a == "fail_closed" {
            fail_open = Some(a == "fail_open");
        } else if a.starts_with("zone=") {
            named = Some(limit_zone::parse_zone(d, a, 16_000, ctx)?);
        } else if let Some(r) = a.strip_prefix("rate=") {
            let (n, per) = if let Some(n) = r.strip_suffix("r/s") {
                (n, 1)
            } else if let Some(n) = r.strip_suffix("r/m") {
                (n, 60)
            } else {
                (r, 1)
            };
            rate = match setters::num(n) {
                Some(n) if n > 0 => Some(n.saturating_mul(ONE) / per),
                _ => return Err(d.error(format!("invalid rate \"{a}\""))),
            };
        } else {
            return Err(d.error(format!("invalid parameter \"{a}\"")));
        }
    }
    let Some((name, capacity)) = named else {
        return Err(d.error("\"limit_req_zone\" must have \"zone\" parameter"));
    };
    // nginx's default rate: 1r/s (below 1r/m the rate rounds down to 0; keep it leaking).
    let rate = rate.unwrap_or(ONE).max(1);
    let shared =
        redis.map(|server| shared::Shared::new(server, &name, rate, fail_open.unwrap_or(true)));
    let zone = ReqZone {
        name: name.clone(),
        key,
        key_src: d.args[0].clone(),
        rate,
        capacity,
        born: Instant::now(),
        table: Mutex::default(),
        metrics: super::metrics::register(ctx, crate::runtime::metrics::Kind::LimitReq, &name),
        shared,
    };
    ctx.zones.req.insert(name, Arc::new(zone));
    Ok(())
}

/// `limit_req zone=name [burst=N] [nodelay | delay=N]`.
fn limit(d: &Directive, ctx: &LoadCtx) -> Result<Limit, ConfError> {
    let mut zone = None;
    let mut burst = 0;
    let mut delay = None;
    for a in &d.args {
        if let Some(name) = a.strip_prefix("zone=") {
            zone = Some(
                ctx.zones
                    .req
                    .get(name)
                    .cloned()
                    .ok_or_else(|| d.error(format!("unknown limit_req_zone \"{name}\"")))?,
            );
        } else if let Some(n) = a.strip_prefix("burst=") {
            burst = match setters::num(n) {
                Some(n) if n > 0 => n,
                _ => return Err(d.error(format!("invalid burst value \"{a}\""))),
            };
        } else if let Some(n) = a.strip_prefix("delay=") {
            delay = match setters::num(n) {
                Some(n) if n > 0 => Some(n.saturating_mul(ONE)),
                _ => return Err(d.error(format!("invalid delay value \"{a}\""))),
            };
        } else if a == "nodelay" {
            delay = Some(u64::MAX);
        } else {
            return Err(d.error(format!("invalid parameter \"{a}\"")));
        }
    }
    let Some(zone) = zone else {
        return Err(d.error("\"limit_req\" must have \"zone\" parameter"));
    };
    Ok(Limit {
        zone,
        burst: burst.saturating_mul(ONE),
        delay: delay.unwrap_or(0),
    })
}

/// `excess` as nginx logs it: `1.500`.
struct Excess(u64);

impl std::fmt::Display for Excess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03}", self.0 / ONE, self.0 % ONE)
    }
}

/// Why a limit refuses a request.
enum Refusal {
    /// Over its burst by this excess.
    Excess(u64),
    /// No room for the key in the zone.
    Full,
    /// Its Redis server does not answer and the zone fails closed (logged once by
    /// [`shared`], not per request).
    Unreachable,
}

/// The pre-access check: `None` to go on (now), else the refusal or how long to wait.
pub fn check(req: &mut Request) -> Option<Flow> {
    if req.limit_req_status.is_some() {
        return None;
    }
    // The location's settings outlive the borrow of `req` the status updates need.
    let conf = match req.conf.limit_req.list {
        Some(_) => req.conf.clone(),
        None => return None,
    };
    let limits = conf.limit_req.list.as_deref()?;
    let policy = &conf.limit_req.policy;
    // First whether every limit lets the request through, without counting it (a zone in
    // Redis is asked later, in one round trip that checks and counts at once).
    let mut keyed = Vec::with_capacity(limits.len());
    let mut in_redis = Vec::new();
    // Zones in Redis the node decided alone (within its allowance).
    let mut spent: Vec<(&Limit, u64)> = Vec::new();
    for l in limits {
        let Some(key) = limit_zone::key(req, &l.zone.key, &l.zone.key_src, MAX_KEY) else {
            continue;
        };
        if let Some(s) = &l.zone.shared {
            match s.alone(&key, l.burst) {
                shared::Alone::Pass(e) => spent.push((l, e)),
                shared::Alone::Refuse(e) => {
                    return refuse(req, policy, &l.zone, Refusal::Excess(e))
                }
                shared::Alone::Ask => in_redis.push((l, key)),
            }
            continue;
        }
        let refused = match l.zone.excess(key.as_bytes(), false) {
            Ok(e) if e > l.burst => Some(Refusal::Excess(e)),
            Ok(_) => None,
            Err(Full) => Some(Refusal::Full),
        };
        if let Some(why) = refused {
            return refuse(req, policy, &l.zone, why);
        }
        keyed.push((l, key));
    }
    if !in_redis.is_empty() {
        let own = |v: Vec<(&Limit, String)>| v.into_iter().map(|(l, k)| (l.clone(), k)).collect();
        return Some(Flow::LimitReqShared(Box::new(shared::Pending {
            local: own(keyed),
            shared: own(in_redis),
            spent: spent.into_iter().map(|(l, e)| (l.clone(), e)).collect(),
            policy: *policy,
        })));
    }
    if keyed.is_empty() && spent.is_empty() {
        // No key applied: a later location's limits may still (nginx's limit_req_set unset).
        return None;
    }
    count(req, policy, &keyed, &spent)
}

/// Log a refusal and answer it (or, in a dry run, note it and go on: `None`).
fn refuse(
    req: &mut Request,
    policy: &limit_zone::Policy,
    zone: &ReqZone,
    why: Refusal,
) -> Option<Flow> {
    let dry = if policy.dry_run() { ", dry run" } else { "" };
    match why {
        Refusal::Excess(e) => errlog::request(
            policy.log_level(),
            req,
            format_args!(
                "limiting requests{dry}, excess: {} by zone \"{}\"",
                Excess(e),
                zone.name
            ),
        ),
        Refusal::Full => errlog::request(
            Level::Alert,
            req,
            format_args!(
                "could not allocate node in limit_req zone \"{}\"",
                zone.name
            ),
        ),
        Refusal::Unreachable => {}
    }
    let word = if policy.dry_run() {
        "REJECTED_DRY_RUN"
    } else {
        "REJECTED"
    };
    super::metrics::limited(zone.metrics, word);
    req.limit_req_status = Some(word);
    (!policy.dry_run()).then(|| Flow::Status(policy.status()))
}

/// Count the request in every local zone whose key applied (`local`) and take the excesses
/// the Redis zones counted (`counted`): `None` to go on, else how long to wait.
fn count<L: std::borrow::Borrow<Limit>>(
    req: &mut Request,
    policy: &limit_zone::Policy,
    local: &[(L, String)],
    counted: &[(&Limit, u64)],
) -> Option<Flow> {
    let dry = if policy.dry_run() { ", dry run" } else { "" };
    // The longest wait decides.
    let mut wait: Option<(u64, u64, &ReqZone)> = None;
    let local_excess = local
        .iter()
        .map(|(l, key)| (l.borrow(), key))
        .filter_map(|(l, key)| l.zone.excess(key.as_bytes(), true).ok().map(|e| (l, e)));
    for (l, excess) in local_excess.chain(counted.iter().copied()) {
        if excess <= l.delay {
            continue;
        }
        let ms = (excess - l.delay).saturating_mul(1000) / l.zone.rate;
        if wait.is_none_or(|(w, _, _)| ms > w) {
            wait = Some((ms, excess, &l.zone));
        }
    }
    let Some((ms, excess, zone)) = wait else {
        for l in local
            .iter()
            .map(|(l, _)| l.borrow())
            .chain(counted.iter().map(|(l, _)| *l))
        {
            super::metrics::limited(l.zone.metrics, "PASSED");
        }
        req.limit_req_status = Some("PASSED");
        return None;
    };
    // Delays are logged a level below refusals (info stays info), as in nginx.
    let level = match policy.log_level() {
        Level::Error => Level::Warn,
        Level::Warn => Level::Notice,
        _ => Level::Info,
    };
    errlog::request(
        level,
        req,
        format_args!(
            "delaying request{dry}, excess: {}, by zone \"{}\"",
            Excess(excess),
            zone.name
        ),
    );
    super::metrics::limited(
        zone.metrics,
        if policy.dry_run() {
            "DELAYED_DRY_RUN"
        } else {
            "DELAYED"
        },
    );
    if policy.dry_run() {
        req.limit_req_status = Some("DELAYED_DRY_RUN");
        return None;
    }
    req.limit_req_status = Some("DELAYED");
    Some(Flow::Delay(Duration::from_millis(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(rate: u64, capacity: usize) -> ReqZone {
        ReqZone {
            name: "z".into(),
            key: Template::literal("k"),
            key_src: "k".into(),
            rate,
            capacity,
            born: Instant::now(),
            table: Mutex::default(),
            metrics: 0,
            shared: None,
        }
    }

    #[test]
    fn first_request_is_free_then_each_adds_one() {
        let z = zone(ONE, 10);
        assert_eq!(z.excess(b"a", true).ok(), Some(0));
        // Within a millisecond or so: nothing has leaked at 1 r/s.
        let e = z.excess(b"a", true).ok().unwrap_or(0);
        assert!((990..=1000).contains(&e), "{e}");
        // Looking without counting leaves it as it was.
        let peek = z.excess(b"a", false).ok().unwrap_or(0);
        assert!((1980..=2000).contains(&peek), "{peek}");
        let again = z.excess(b"a", false).ok().unwrap_or(0);
        assert!((1980..=2000).contains(&again), "{again}");
    }

    #[test]
    fn drains_at_the_rate() {
        let z = zone(2 * ONE, 10);
        let n = Node {
            excess: 3000,
            last: Some(0),
        };
        // 1.000 leaked in half a second at 2 r/s, then one more request.
        assert_eq!(z.next(&n, 500), 3000);
        // 3.500 leaked: half a request of credit, as in nginx.
        assert_eq!(z.next(&n, 1750), 500);
        assert_eq!(z.next(&n, 60_000), 0);
        let refused_elsewhere = Node {
            excess: 0,
            last: None,
        };
        assert_eq!(z.next(&refused_elsewhere, 10), 0);
    }

    #[test]
    fn a_new_key_takes_the_place_of_idle_ones_then_of_the_oldest() {
        let mut z = zone(ONE, 2);
        // Two minutes into the zone's life (unless the machine has not been up that long).
        let Some(born) = Instant::now().checked_sub(Duration::from_secs(120)) else {
            return;
        };
        z.born = born;
        {
            let mut t = limit_zone::lock(&z.table);
            let now = z.now();
            for (k, last) in [(b"idle", 0), (b"busy", now)] {
                t.order.push_back(k[..].into());
                let node = Node {
                    excess: ONE,
                    last: Some(last),
                };
                t.nodes.insert(k[..].into(), node);
            }
        }
        let has = |k: &[u8]| limit_zone::lock(&z.table).nodes.contains_key(k);
        assert!(z.excess(b"new1", true).is_ok());
        assert!(!has(b"idle") && has(b"busy") && has(b"new1"));
        // Full of keys in use: the one not given a second chance goes.
        assert!(z.excess(b"new2", true).is_ok());
        assert!(has(b"busy") && !has(b"new1") && has(b"new2"));
    }
}
