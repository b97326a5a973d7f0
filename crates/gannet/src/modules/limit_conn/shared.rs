//! `limit_conn_zone ... redis=name [fail_open | fail_closed]`: a zone whose counts are kept
//! in a `redis_server`, so that `limit_conn zone N` holds for the requests in progress on
//! every gannet node using that server.
//!
//! Each key is a Redis hash, `gannet:limit_conn:<zone>:<key>`, with one field per node (its
//! id, random per process) holding that node's requests in progress. [`TAKE`] sums the
//! fields of nodes that are alive and adds one to the node's own unless the sum is at the
//! limit, atomically; the end of a request takes one off (a task, so the answer does not
//! wait on it). A node is alive while its key `gannet:node:<id>` exists: each node sets it
//! for [`LEASE`] and renews it every third of that, so a node that crashed (or lost its
//! network) stops counting once its lease runs out, and the next check deletes its fields.
//!
//! The node keeps its own counts too: a decrement that did not reach Redis, or counts that
//! Redis lost (it restarted, or the node's lease ran out while Redis did not answer), are
//! written again from them by the next renewal. When Redis does not answer, the zone fails
//! open (the request is served and not counted in Redis) or closed (refused with
//! `limit_conn_status`), logged once per outage as `limit_req`'s shared zones are.

use super::{ConnZone, Held, Limit};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::modules::limit_zone::{self, Policy};
use crate::modules::redis::{Server, NODE};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

/// How long a node's counts outlive its last renewal.
pub const LEASE: Duration = Duration::from_secs(6);

/// KEYS[1]: the key's hash, KEYS[2]: the node key prefix; ARGV: the node's id, the limit,
/// the lease (ms). `{counted, alive}`: counted 1, or 0 when the key is at its limit; alive 0
/// when Redis had forgot the node (it is alive from now on, and its counts must be written
/// again).
const TAKE: &str = r"
local me = KEYS[2] .. ARGV[1]
local alive = redis.call('EXISTS', me)
if alive == 0 then redis.call('SET', me, '1', 'PX', ARGV[3]) end
local sum = 0
local f = redis.call('HGETALL', KEYS[1])
for i = 1, #f, 2 do
  if f[i] == ARGV[1] or redis.call('EXISTS', KEYS[2] .. f[i]) == 1 then
    sum = sum + tonumber(f[i + 1])
  else
    redis.call('HDEL', KEYS[1], f[i])
  end
end
if sum >= tonumber(ARGV[2]) then return {0, alive} end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return {1, alive}
";

/// KEYS[1]: the key's hash; ARGV[1]: the node's id. One request of the node's ended.
const GIVE: &str = r"
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return {n}
";

/// KEYS[1]: the node's key; ARGV[1]: the lease (ms). `{1}` if the node was alive still.
const RENEW: &str = r"
local had = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return {had}
";

/// KEYS: hashes; ARGV: the node's id, whether only to raise, then its count in each.
/// Exact (a decrement that failed left Redis too high), or only raised where Redis has less
/// (counts it lost): a request counted by [`TAKE`] while this was on its way is in Redis and
/// not yet in the node's counts the write was made from, and lowering it would let the
/// cluster take one more than its limit.
const WRITE: &str = r"
for i, k in ipairs(KEYS) do
  local n = tonumber(ARGV[i + 2])
  if ARGV[2] == '1' then
    if n > tonumber(redis.call('HGET', k, ARGV[1]) or '0') then redis.call('HSET', k, ARGV[1], n) end
  elseif n > 0 then redis.call('HSET', k, ARGV[1], n) else redis.call('HDEL', k, ARGV[1]) end
end
return {#KEYS}
";

static LUA: LazyLock<[redis::Script; 4]> =
    LazyLock::new(|| [TAKE, GIVE, RENEW, WRITE].map(redis::Script::new));

const NODE_PREFIX: &str = "gannet:node:";

/// A zone's Redis side.
#[derive(Debug)]
pub struct Shared {
    server: Arc<Server>,
    /// `gannet:limit_conn:<zone>:`.
    prefix: String,
    fail_open: bool,
    /// The server did not answer last time (logged once).
    failing: AtomicBool,
    /// The renewal task runs (started by the first request).
    renewing: AtomicBool,
    /// A request found that Redis had forgot the node: the next renewal writes its counts.
    forgot: AtomicBool,
    /// Keys whose count in Redis may differ from the node's (a decrement failed).
    dirty: Mutex<HashSet<Box<[u8]>>>,
}

impl Shared {
    pub fn new(server: Arc<Server>, zone: &str, fail_open: bool) -> Shared {
        Shared {
            server,
            prefix: format!("gannet:limit_conn:{zone}:"),
            fail_open,
            failing: AtomicBool::new(false),
            renewing: AtomicBool::new(false),
            forgot: AtomicBool::new(false),
            dirty: Mutex::default(),
        }
    }

    fn hash(&self, key: &[u8]) -> String {
        format!("{}{}", self.prefix, String::from_utf8_lossy(key))
    }
}

/// The request's limits in Redis, asked by [`crate::http::handler::settle`].
pub struct Pending {
    pub(super) shared: Vec<(Limit, String)>,
    pub(super) policy: Policy,
}

fn shared(zone: &ConnZone) -> Option<&Shared> {
    zone.shared.as_ref()
}

/// Count the request in each zone, in order; the first at its limit refuses it (what the
/// others counted is given back when the request drops its holds).
pub async fn ask(req: &mut Request, pending: Box<Pending>) -> Flow {
    let policy = pending.policy;
    for (l, key) in &pending.shared {
        let Some(s) = shared(&l.zone) else {
            continue;
        };
        renew_from_here(&l.zone, s);
        let keys = [s.hash(key.as_bytes()), NODE_PREFIX.to_string()];
        let lease = LEASE.as_millis() as u64;
        let answer = s.server.eval(&LUA[0], &keys, &[*NODE, l.max, lease]).await;
        match answer {
            Ok(v) => {
                back(req, &l.zone, s);
                if v.get(1) == Some(&0) {
                    // Redis lost the node's counts: the next renewal writes them again.
                    s.forgot.store(true, Ordering::Relaxed);
                }
                if v.first() == Some(&1) {
                    req.limit_conn_status = Some("PASSED");
                    super::super::metrics::limited(l.zone.metrics, "PASSED");
                    let held = l.zone.hold(key.as_bytes());
                    req.limit_conns.push(held);
                    continue;
                }
                // A dry run notes the refusal and goes on without the other zones, as a
                // local zone's does.
                return super::refuse(req, &policy, &l.zone, super::Refused::Limit)
                    .unwrap_or(Flow::LimitConnPassed);
            }
            Err(e) => {
                if !s.failing.swap(true, Ordering::Relaxed) {
                    let how = if s.fail_open { "open" } else { "closed" };
                    errlog::request(
                        Level::Error,
                        req,
                        format_args!(
                            "limit_conn zone \"{}\" fails {how}: redis_server \"{}\" ({}): {e}",
                            l.zone.name, s.server.name, s.server.addr
                        ),
                    );
                }
                if !s.fail_open {
                    req.limit_conns.clear();
                    req.limit_conn_status = Some("REJECTED");
                    super::super::metrics::limited(l.zone.metrics, "REJECTED");
                    return Flow::Status(policy.status());
                }
            }
        }
    }
    Flow::LimitConnPassed
}

/// The zone's server answered: say so if it had not.
fn back(req: &Request, zone: &ConnZone, s: &Shared) {
    if s.failing.swap(false, Ordering::Relaxed) {
        errlog::request(
            Level::Notice,
            req,
            format_args!(
                "limit_conn zone \"{}\" is shared again: redis_server \"{}\" ({}) answers",
                zone.name, s.server.name, s.server.addr
            ),
        );
    }
}

/// A request counted in Redis ended: take it off there, without the request waiting.
pub(super) fn give(zone: &Arc<ConnZone>, key: &[u8]) {
    let Some(s) = shared(zone) else {
        return;
    };
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        limit_zone::lock(&s.dirty).insert(key.into());
        return;
    };
    let zone = zone.clone();
    let key: Box<[u8]> = key.into();
    rt.spawn(async move {
        let Some(s) = shared(&zone) else {
            return;
        };
        let hash = [s.hash(&key)];
        if s.server.eval(&LUA[1], &hash, &[*NODE]).await.is_err() {
            limit_zone::lock(&s.dirty).insert(key);
        }
    });
}

/// Start the zone's renewals on this worker's runtime unless they run already.
fn renew_from_here(zone: &Arc<ConnZone>, s: &Shared) {
    if s.renewing.swap(true, Ordering::Relaxed) {
        return;
    }
    let weak = Arc::downgrade(zone);
    tokio::spawn(renew(weak));
}

/// Every third of the lease while the zone is in use (a reload's new zone has its own):
/// keep the node alive, and write again the counts Redis may have wrong.
async fn renew(zone: Weak<ConnZone>) {
    let node_key = [format!("{NODE_PREFIX}{}", *NODE)];
    let lease = LEASE.as_millis() as u64;
    loop {
        let Some(z) = zone.upgrade() else {
            return;
        };
        let Some(s) = shared(&z) else {
            return;
        };
        match s.server.eval(&LUA[2], &node_key, &[lease]).await {
            // Redis forgot the node (restarted, or the lease ran out while it did not
            // answer): the other nodes may have dropped its counts, so all are written.
            Ok(v) if v.first() == Some(&0) || s.forgot.swap(false, Ordering::Relaxed) => {
                write(&z, s, None).await
            }
            Ok(_) => {
                let dirty = std::mem::take(&mut *limit_zone::lock(&s.dirty));
                if !dirty.is_empty() {
                    write(&z, s, Some(dirty)).await;
                }
            }
            Err(_) => {}
        }
        drop(z);
        tokio::time::sleep(LEASE / 3).await;
    }
}

/// Write the node's counts for `keys` (all it holds when `None`) into Redis; what fails
/// stays to be written next time.
async fn write(zone: &ConnZone, s: &Shared, keys: Option<HashSet<Box<[u8]>>>) {
    let raise = keys.is_none();
    let (hashes, counts, all): (Vec<String>, Vec<u64>, Vec<Box<[u8]>>) = {
        let counts = limit_zone::lock(&zone.counts);
        let keys: Vec<Box<[u8]>> = match keys {
            Some(k) => k.into_iter().collect(),
            None => counts.keys().cloned().collect(),
        };
        let n = keys.iter().map(|k| counts.get(k).copied().unwrap_or(0));
        let n: Vec<u64> = n.collect();
        (keys.iter().map(|k| s.hash(k)).collect(), n, keys)
    };
    if hashes.is_empty() {
        return;
    }
    // All of them: Redis forgot the node, so its counts only go up (see WRITE).
    let mut args = vec![*NODE, u64::from(raise)];
    args.extend(counts);
    if s.server.eval(&LUA[3], &hashes, &args).await.is_err() {
        limit_zone::lock(&s.dirty).extend(all);
    }
}

impl ConnZone {
    /// Note one more of this node's requests for `key` (counted in Redis already).
    fn hold(self: &Arc<Self>, key: &[u8]) -> Held {
        *limit_zone::lock(&self.counts)
            .entry(key.into())
            .or_insert(0) += 1;
        Held {
            zone: self.clone(),
            key: key.into(),
        }
    }
}
