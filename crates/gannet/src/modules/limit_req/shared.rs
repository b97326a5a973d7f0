//! `limit_req_zone ... redis=name [fail_open | fail_closed]`: a zone whose keys are kept in a
//! `redis_server`, so that every gannet node using that server counts against one limit.
//!
//! The bucket is nginx's (see the parent module), computed by [`SCRIPT`] inside Redis: the
//! script reads each key's excess and time, refuses (counting nothing) when one would go
//! over its burst, else stores them all, atomically, so nodes racing on one key cannot
//! both pass where one nginx would refuse one. Time is Redis's clock (`TIME`), one clock for
//! every node. A request costs one round trip (EVALSHA) on its worker's connection; the
//! zone's size does not bound Redis's keys, which expire once drained and idle.
//!
//! When the server does not answer, the zone fails open (the limit is not applied, the
//! default) or closed (requests are refused with `limit_req_status`); one error line says
//! so when that starts and a notice when the server answers again, not a line per request.

use super::{count, refuse, Limit, Refusal, ReqZone, ONE};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::modules::limit_zone::Policy;
use crate::modules::redis::Server;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// KEYS: the keys' hashes; ARGV: four per key: the rate (thousandths of a request per
/// second), the burst (thousandths), how long a drained key is kept (ms) and how many
/// requests the node would like to count at once (its local allowance, at least one).
/// Returns `{0, excess, granted, ...}` (per key: the first request's excess and how many
/// were counted, each one more than the last) or `{i, excess}` when key `i` (from 1) is
/// over its burst. The arithmetic is nginx's ngx_http_limit_req_lookup, in its integer
/// units; a batch is as many requests as fit under the burst, as many nginx requests in a
/// row would.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {0}
for i, k in ipairs(KEYS) do
  local rate = tonumber(ARGV[4 * i - 3])
  local burst = tonumber(ARGV[4 * i - 2])
  local want = tonumber(ARGV[4 * i])
  local s = redis.call('HMGET', k, 'e', 'l')
  local e = 0
  if s[1] then
    local ms = now - tonumber(s[2])
    if ms < -60000 then ms = 1 elseif ms < 0 then ms = 0 end
    e = tonumber(s[1]) - math.floor(rate * ms / 1000) + 1000
    if e < 0 then e = 0 end
  end
  if e > burst then return {i, e} end
  local room = math.floor((burst - e) / 1000) + 1
  if want > room then want = room end
  out[2 * i] = e
  out[2 * i + 1] = want
end
for i, k in ipairs(KEYS) do
  local last = out[2 * i] + (out[2 * i + 1] - 1) * 1000
  redis.call('HSET', k, 'e', last, 'l', now)
  redis.call('PEXPIRE', k, ARGV[4 * i - 1])
end
return out
";

static LUA: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SCRIPT));

/// How long a key is kept after it has drained, as nginx keeps an idle node a minute.
const IDLE_MS: u64 = 60_000;

/// How long requests counted ahead (a node's allowance) may be spent: past it, what is
/// left is not used (it stays counted, so the cluster accepts less, never more).
const LEASE: Duration = Duration::from_millis(100);

/// The most keys a zone remembers locally (allowances and refusals); past it the stale
/// ones go, then all.
const MAX_LOCAL: usize = 4096;

/// A zone's Redis side.
#[derive(Debug)]
pub struct Shared {
    server: Arc<Server>,
    /// Its keys' prefix: `gannet:limit_req:<zone>:`.
    prefix: String,
    fail_open: bool,
    /// The server did not answer last time (logged once).
    failing: AtomicBool,
    /// Per key, what this node may decide without asking Redis.
    local: Mutex<HashMap<String, Local>>,
    /// The zone's rate (thousandths of a request per second).
    rate: u64,
}

/// What a node knows of a key between calls: requests counted ahead in Redis that it may
/// still let through, and the last refusal (the key's excess only grows from other nodes'
/// requests, so while the refusal's excess has not leaked below the burst, a request would
/// be refused again: refusing it here is what Redis would answer).
#[derive(Debug)]
struct Local {
    /// Requests counted ahead and not spent yet.
    left: u64,
    /// The excess the next of them brings, as it was at `at`.
    next: u64,
    at: Instant,
    /// How many to ask for next time (doubled while a batch is spent within its lease).
    batch: u64,
    /// The last refusal's excess, as it was at `refused_at`.
    refused: Option<(u64, Instant)>,
}

/// What a node decides alone for one limit.
pub(super) enum Alone {
    /// Let through with this excess (counted ahead).
    Pass(u64),
    /// Refuse: over the burst by this excess.
    Refuse(u64),
    /// Redis must be asked.
    Ask,
}

impl Shared {
    pub fn new(server: Arc<Server>, zone: &str, rate: u64, fail_open: bool) -> Shared {
        Shared {
            server,
            prefix: format!("gannet:limit_req:{zone}:"),
            fail_open,
            failing: AtomicBool::new(false),
            local: Mutex::default(),
            rate,
        }
    }

    /// What `excess` at `at` has become by `now`.
    fn leak(&self, excess: u64, at: Instant, now: Instant) -> u64 {
        let ms = now.saturating_duration_since(at).as_millis() as u64;
        excess.saturating_sub(self.rate.saturating_mul(ms) / 1000)
    }

    /// Decide for `key` under `burst` without Redis when the node can.
    pub(super) fn alone(&self, key: &str, burst: u64) -> Alone {
        let now = Instant::now();
        let mut map = super::limit_zone::lock(&self.local);
        let Some(l) = map.get_mut(key) else {
            return Alone::Ask;
        };
        if let Some((e, at)) = l.refused {
            let e = self.leak(e, at, now);
            if e > burst {
                return Alone::Refuse(e);
            }
            l.refused = None;
        }
        if l.left > 0 && now.saturating_duration_since(l.at) < LEASE {
            let e = self.leak(l.next, l.at, now);
            if e <= burst {
                l.left -= 1;
                l.next += ONE;
                return Alone::Pass(e);
            }
        }
        Alone::Ask
    }

    /// How many requests to ask Redis to count for `key` now: one more batch when the last
    /// was spent within its lease, else one. At most what the rate brings in a lease, and a
    /// quarter of the room `burst` leaves, so that what nodes hold unspent does not fill
    /// the bucket for the others.
    fn want(&self, key: &str, burst: u64) -> u64 {
        let most = (self.rate.saturating_mul(LEASE.as_millis() as u64) / 1000 / ONE)
            .min((burst / ONE + 1) / 4)
            .max(1);
        let map = super::limit_zone::lock(&self.local);
        match map.get(key) {
            Some(l) if l.left == 0 && l.at.elapsed() < LEASE => l.batch.min(most),
            _ => 1,
        }
    }

    /// Redis counted `granted` requests from `excess` for `key`: the first is this request's,
    /// the rest are the node's to spend.
    fn granted(&self, key: &str, excess: u64, granted: u64) {
        let now = Instant::now();
        let mut map = super::limit_zone::lock(&self.local);
        self.make_room(&mut map, now);
        let l = map.entry(key.to_string()).or_insert(Local {
            left: 0,
            next: 0,
            at: now,
            batch: 1,
            refused: None,
        });
        let live = now.saturating_duration_since(l.at) < LEASE;
        // Asks overlap when requests for the key come at once (all saw nothing left): an
        // answer arriving while the last batch is unspent neither shrinks the next batch
        // (which kept batches at one or two: every few requests a call) nor loses what is
        // left (Redis counted it already).
        l.batch = match (live, l.left) {
            (true, 0) => (l.batch * 2).min(1 << 16),
            (true, _) => l.batch,
            (false, _) => 1,
        };
        l.left = if live { l.left } else { 0 } + granted.saturating_sub(1);
        l.next = excess + ONE;
        l.at = now;
        l.refused = None;
    }

    /// Redis refused a request for `key` with `excess`.
    fn refused(&self, key: &str, excess: u64) {
        let now = Instant::now();
        let mut map = super::limit_zone::lock(&self.local);
        self.make_room(&mut map, now);
        let l = map.entry(key.to_string()).or_insert(Local {
            left: 0,
            next: 0,
            at: now,
            batch: 1,
            refused: None,
        });
        l.refused = Some((excess, now));
    }

    /// Before a new key: forget those whose allowance and refusal are over, or all of them.
    fn make_room(&self, map: &mut HashMap<String, Local>, now: Instant) {
        if map.len() < MAX_LOCAL {
            return;
        }
        map.retain(|_, l| {
            now.saturating_duration_since(l.at) < LEASE
                || l.refused.is_some_and(|(e, at)| self.leak(e, at, now) > 0)
        });
        if map.len() >= MAX_LOCAL {
            map.clear();
        }
    }
}

/// A request's limits once the local ones let it through: asked of Redis by
/// [`crate::http::handler::settle`], then finished by [`answered`].
pub struct Pending {
    /// Local limits, checked but not counted yet.
    pub(super) local: Vec<(Limit, String)>,
    /// Limits in Redis, with their keys.
    pub(super) shared: Vec<(Limit, String)>,
    /// Limits in Redis this node let through alone, with the excess.
    pub(super) spent: Vec<(Limit, u64)>,
    pub(super) policy: Policy,
}

/// What Redis said for each run of limits on one server.
pub struct Asked {
    pending: Box<Pending>,
    /// `(end of the run in pending.shared, the script's answer)`.
    runs: Vec<(usize, Result<Vec<i64>, String>)>,
}

fn zone_of(l: &Limit) -> Option<(&ReqZone, &Shared)> {
    l.zone.shared.as_ref().map(|s| (&*l.zone, s))
}

/// Run the script once per server (limits on one server in one call); a refusal stops there.
pub async fn ask(pending: Box<Pending>) -> Asked {
    let mut runs = Vec::new();
    let mut start = 0;
    let all = &pending.shared;
    while start < all.len() {
        let Some((_, first)) = zone_of(&all[start].0) else {
            break;
        };
        let server = &first.server;
        let end = start
            + all[start..]
                .iter()
                .take_while(|(l, _)| {
                    zone_of(l).is_some_and(|(_, s)| Arc::ptr_eq(&s.server, server))
                })
                .count();
        let mut keys = Vec::with_capacity(end - start);
        let mut args = Vec::with_capacity(3 * (end - start));
        for (l, key) in &all[start..end] {
            let Some((zone, s)) = zone_of(l) else {
                continue;
            };
            keys.push(format!("{}{key}", s.prefix));
            // A full bucket drains in burst / rate seconds.
            let drain = (l.burst + ONE).saturating_mul(1000) / zone.rate;
            args.extend([
                zone.rate,
                l.burst,
                drain.saturating_add(IDLE_MS),
                s.want(key, l.burst),
            ]);
        }
        let answer = server.eval(&LUA, &keys, &args).await;
        let refused = matches!(&answer, Ok(v) if v.first().is_some_and(|&i| i != 0));
        runs.push((end, answer));
        if refused {
            break;
        }
        start = end;
    }
    Asked { pending, runs }
}

/// Finish the check with Redis's answers: refuse, wait, or go on ([`Flow::Delayed`]).
pub fn answered(req: &mut Request, asked: Asked) -> Flow {
    let Asked { pending, runs } = asked;
    let policy = &pending.policy;
    let mut counted: Vec<(&Limit, u64)> = Vec::with_capacity(pending.shared.len());
    let mut start = 0;
    for (end, answer) in runs {
        let run = &pending.shared[start..end];
        start = end;
        match answer {
            Ok(v) => {
                for (l, _) in run {
                    back(req, l);
                }
                let n = |i: usize| v.get(i).map_or(0, |&e| u64::try_from(e).unwrap_or(0));
                match v.first().map(|&i| usize::try_from(i).unwrap_or(0)) {
                    Some(i @ 1..) if i <= run.len() => {
                        let (l, key) = &run[i - 1];
                        if let Some((_, s)) = zone_of(l) {
                            s.refused(key, n(1));
                        }
                        let why = Refusal::Excess(n(1));
                        return refuse(req, policy, &l.zone, why).unwrap_or(Flow::Delayed);
                    }
                    _ => {
                        for (i, (l, key)) in run.iter().enumerate() {
                            let (excess, granted) = (n(2 * i + 1), n(2 * i + 2));
                            if let Some((_, s)) = zone_of(l) {
                                s.granted(key, excess, granted);
                            }
                            counted.push((l, excess));
                        }
                    }
                }
            }
            Err(e) => {
                for (l, _) in run {
                    let Some((zone, s)) = zone_of(l) else {
                        continue;
                    };
                    if !s.failing.swap(true, Ordering::Relaxed) {
                        let how = if s.fail_open { "open" } else { "closed" };
                        errlog::request(
                            Level::Error,
                            req,
                            format_args!(
                                "limit_req zone \"{}\" fails {how}: redis_server \"{}\" ({}): {e}",
                                zone.name, s.server.name, s.server.addr
                            ),
                        );
                    }
                    if !s.fail_open {
                        return refuse(req, policy, zone, Refusal::Unreachable)
                            .unwrap_or(Flow::Delayed);
                    }
                }
            }
        }
    }
    counted.extend(pending.spent.iter().map(|(l, e)| (l, *e)));
    count(req, policy, &pending.local, &counted).unwrap_or(Flow::Delayed)
}

/// The zone's server answered: say so if it had not.
fn back(req: &Request, l: &Limit) {
    if let Some((zone, s)) = zone_of(l) {
        if s.failing.swap(false, Ordering::Relaxed) {
            errlog::request(
                Level::Notice,
                req,
                format_args!(
                    "limit_req zone \"{}\" is shared again: redis_server \"{}\" ({}) answers",
                    zone.name, s.server.name, s.server.addr
                ),
            );
        }
    }
}
