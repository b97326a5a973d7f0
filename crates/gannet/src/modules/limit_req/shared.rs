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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

/// KEYS: the keys' hashes; ARGV: three per key: the rate (thousandths of a request per
/// second), the burst (thousandths) and how long a drained key is kept (ms). Returns
/// `{0, excess...}` when counted, or `{i, excess}` when key `i` (from 1) is over its burst.
/// The arithmetic is nginx's ngx_http_limit_req_lookup, in its integer units.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {0}
for i, k in ipairs(KEYS) do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local s = redis.call('HMGET', k, 'e', 'l')
  local e = 0
  if s[1] then
    local ms = now - tonumber(s[2])
    if ms < -60000 then ms = 1 elseif ms < 0 then ms = 0 end
    e = tonumber(s[1]) - math.floor(rate * ms / 1000) + 1000
    if e < 0 then e = 0 end
  end
  if e > burst then return {i, e} end
  out[i + 1] = e
end
for i, k in ipairs(KEYS) do
  redis.call('HSET', k, 'e', out[i + 1], 'l', now)
  redis.call('PEXPIRE', k, ARGV[3 * i])
end
return out
";

static LUA: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SCRIPT));

/// How long a key is kept after it has drained, as nginx keeps an idle node a minute.
const IDLE_MS: u64 = 60_000;

/// A zone's Redis side.
#[derive(Debug)]
pub struct Shared {
    server: Arc<Server>,
    /// Its keys' prefix: `gannet:limit_req:<zone>:`.
    prefix: String,
    fail_open: bool,
    /// The server did not answer last time (logged once).
    failing: AtomicBool,
}

impl Shared {
    pub fn new(server: Arc<Server>, zone: &str, fail_open: bool) -> Shared {
        Shared {
            server,
            prefix: format!("gannet:limit_req:{zone}:"),
            fail_open,
            failing: AtomicBool::new(false),
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
            args.extend([zone.rate, l.burst, drain.saturating_add(IDLE_MS)]);
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
                        let why = Refusal::Excess(n(1));
                        return refuse(req, policy, &run[i - 1].0.zone, why)
                            .unwrap_or(Flow::Delayed);
                    }
                    _ => counted.extend(run.iter().enumerate().map(|(i, (l, _))| (l, n(i + 1)))),
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
