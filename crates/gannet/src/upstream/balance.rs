//! How an `upstream` group chooses a server: nginx's balancing methods, with nginx's
//! arithmetic, so that a key or a client maps to the same server in gannet as in nginx for
//! the same `server` list.
//!
//! - round robin (the default): smooth weighted round robin over the usable primaries, then
//!   over the backups when no primary is left.
//! - `least_conn`: the fewest connections in use relative to weight (`a/wa < b/wb`, compared
//!   as `a*wb < b*wa`); servers tied at the least are taken by round robin among them.
//! - `ip_hash`: a hash of the client address, the first three octets of IPv4 (so a /24
//!   shares a server) and all sixteen bytes of IPv6: from 89, `h = (h * 113 + byte) % 6271`
//!   per byte; the server is the one whose weight slot holds `h % total weight`.
//! - `hash KEY`: Cache::Memcached's scheme, `(crc32([n] KEY) >> 16) & 0x7fff` summed over
//!   the attempts, with the attempt number `n` written before the key from the second on;
//!   the sum picks a weight slot as above.
//! - `hash KEY consistent`: Cache::Memcached::Fast's ketama ring: per server, 160 points per
//!   unit of weight, each `crc32(HOST \0 PORT PREV)` with `PREV` the previous point's
//!   value (little-endian, 0 for the first); the key's `crc32` goes to the first point at or
//!   after it, walking on to the next point while that point's server is unusable.
//! - `random [two [least_conn]]`: a server drawn with probability by weight; with `two`,
//!   two different ones and the one with fewer connections per weight (the second on a tie).
//!
//! For the hashes and `random`, every non-backup server has its slot, `down` ones too: a
//! server marked `down` sends only its own keys elsewhere (nginx's documented reason for
//! `down` over deleting the line). An unusable pick (down, failed `max_fails` times within
//! `fail_timeout`, at `max_conns`, or tried already by this request) tries again; after 21
//! picks, or with fewer than two servers, the choice falls back to round robin, as nginx's;
//! so does a `hash` whose key came out empty.
//!
//! One difference, on retries only: nginx keeps a request's hash walk between attempts;
//! here each attempt replays the walk from its start, skipping the servers already tried. The
//! server reached is the same; only the count toward the 21-pick limit can differ.

use super::{GroupState, Server, Upstream};
use crate::http::variables::Template;
use gannet_conf::{ConfError, Directive};
use std::net::IpAddr;
use std::time::Instant;

/// Picks before a hashing or random method gives up and falls back to round robin.
const PICKS: usize = 21;

/// Ring points per unit of weight (ketama's figure, nginx's too).
const POINTS_PER_WEIGHT: i64 = 160;

/// A group's balancing method.
#[derive(Debug, Default)]
pub enum Method {
    #[default]
    RoundRobin,
    LeastConn,
    IpHash,
    Hash(Template),
    /// The key and the ring (built once the group's servers are known, by [`Method::finish`]).
    Consistent(Template, Ring),
    Random {
        two: bool,
    },
}

impl Method {
    /// Parse `least_conn`, `ip_hash`, `hash KEY [consistent]` or `random [two [least_conn]]`.
    pub fn parse(d: &Directive) -> Result<Method, ConfError> {
        let max_args = match d.name.as_str() {
            "least_conn" | "ip_hash" => 0,
            _ => 2,
        };
        let min_args = usize::from(d.name == "hash");
        if !(min_args..=max_args).contains(&d.args.len()) {
            return Err(d.error(format!(
                "invalid number of arguments in \"{}\" directive",
                d.name
            )));
        }
        let invalid = |a: &str| d.error(format!("invalid parameter \"{a}\""));
        let arg = |i: usize| d.args.get(i).map(String::as_str);
        Ok(match d.name.as_str() {
            "least_conn" => Method::LeastConn,
            "ip_hash" => Method::IpHash,
            "hash" => {
                // Unknown user variables are reported at this line (see `user_vars`).
                crate::http::user_vars::at(&d.loc);
                let key = Template::compile(&d.args[0]).map_err(|e| d.error(e))?;
                match arg(1) {
                    None => Method::Hash(key),
                    Some("consistent") => Method::Consistent(key, Ring::default()),
                    Some(other) => return Err(invalid(other)),
                }
            }
            _ => {
                let two = match arg(0) {
                    None => false,
                    Some("two") => true,
                    Some(other) => return Err(invalid(other)),
                };
                // `least_conn` after `two` names the default (and only) way to compare.
                match arg(1) {
                    None | Some("least_conn") => {}
                    Some(other) => return Err(invalid(other)),
                }
                Method::Random { two }
            }
        })
    }

    /// Whether the method lets `backup` servers in the group: only the ones that walk the
    /// whole list do (nginx's "balancing method does not support parameter").
    pub fn allows_backup(&self) -> bool {
        matches!(self, Method::RoundRobin | Method::LeastConn)
    }

    /// Whether `slow_start` goes with the method: not with the ones that map a key or a
    /// draw to a weight slot (nginx Plus's documented `hash`, `ip_hash`, `random`).
    pub fn allows_slow_start(&self) -> bool {
        matches!(self, Method::RoundRobin | Method::LeastConn)
    }

    /// Set up what depends on the group's servers.
    pub fn finish(&mut self, servers: &[Server]) {
        if let Method::Consistent(_, ring) = self {
            *ring = Ring::new(servers);
        }
    }

    /// The template of the hash key, for the methods that have one.
    pub fn key(&self) -> Option<&Template> {
        match self {
            Method::Hash(k) | Method::Consistent(k, _) => Some(k),
            _ => None,
        }
    }
}

/// The consistent-hash ring: point values, sorted and unique, each with the server it
/// belongs to (an index into the group's servers).
#[derive(Debug, Default)]
pub struct Ring {
    points: Vec<(u32, usize)>,
}

impl Ring {
    pub fn new(servers: &[Server]) -> Ring {
        let mut points = Vec::new();
        for (i, s) in servers.iter().enumerate().filter(|(_, s)| !s.backup) {
            let text = s.addr.to_string();
            let (host, port) = host_port(&text);
            let mut base = crc32fast::Hasher::new();
            base.update(host.as_bytes());
            base.update(b"\0");
            base.update(port.as_bytes());
            let mut prev = 0u32;
            for _ in 0..s.weight.saturating_mul(POINTS_PER_WEIGHT) {
                let mut h = base.clone();
                h.update(&prev.to_le_bytes());
                prev = h.finalize();
                points.push((prev, i));
            }
        }
        points.sort_by_key(|p| p.0);
        // Two servers on one value keep one point, as in nginx.
        points.dedup_by_key(|p| p.0);
        Ring { points }
    }

    /// Where a key's hash lands: the first point at or after it (past the last one wraps).
    fn start(&self, hash: u32) -> usize {
        self.points.partition_point(|p| p.0 < hash)
    }
}

/// The host and port of a `server` address as written, the ring's name for it: `unix:PATH`
/// is the path with no port; otherwise the digits after the last `:`, if all digits.
fn host_port(text: &str) -> (&str, &str) {
    if text.len() >= 5 && text[..5].eq_ignore_ascii_case("unix:") {
        return (&text[5..], "");
    }
    match text.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|c| c.is_ascii_digit()) => (host, port),
        _ => (text, ""),
    }
}

/// One step of `hash KEY`: the share of attempt `n`'s crc32 that is added to the sum.
fn key_step(n: usize, key: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    if n > 0 {
        h.update(n.to_string().as_bytes());
    }
    h.update(key);
    (h.finalize() >> 16) & 0x7fff
}

/// The bytes of the client address that `ip_hash` reads: a /24 for IPv4, everything for
/// IPv6, three zero bytes when there is no address (a unix-socket client).
fn ip_bytes(ip: Option<IpAddr>) -> Vec<u8> {
    match ip {
        Some(IpAddr::V4(a)) => a.octets()[..3].to_vec(),
        Some(IpAddr::V6(a)) => a.octets().to_vec(),
        None => vec![0; 3],
    }
}

/// One step of `ip_hash`: the hash carried through the address bytes once more.
fn ip_step(hash: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(hash, |h, &b| (h * 113 + u64::from(b)) % 6271)
}

/// Weights are counted in thousandths, so that a ramping server's share grows smoothly.
/// Smooth weighted round robin chooses the same with every weight scaled alike.
pub(super) const WEIGHT_SCALE: i64 = 1000;

/// Note the `slow_start` servers that became usable again since the last choice: back from
/// `max_fails` (the ramp starts when `fail_timeout` ran out) or from failing health checks
/// (it starts when the balancer first sees the server healthy). A worker sees the failures
/// of its own requests, as nginx's per-worker state without a zone.
pub(super) fn track_ramps(up: &Upstream, g: &mut GroupState, now: Instant) {
    for (i, s) in up.servers.iter().enumerate() {
        if s.slow_start.is_none() {
            continue;
        }
        let f = g.fails[i];
        let ramp = &mut g.ramp[i];
        if let Some(last) = f
            .accessed
            .filter(|_| s.max_fails > 0 && f.count >= s.max_fails)
        {
            let back = last + s.fail_timeout;
            if now >= back && ramp.0.is_none_or(|r| r < back) {
                ramp.0 = Some(back);
            }
        }
        if !up.healthy(i) {
            ramp.1 = true;
        } else if std::mem::take(&mut ramp.1) {
            ramp.0 = Some(now);
        }
    }
}

/// What a choice came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    Server(usize),
    /// Nothing usable now, but some server is only at `max_conns`.
    Full,
    None,
}

#[derive(PartialEq, Eq)]
enum Fit {
    Usable,
    /// Usable but at `max_conns`.
    Full,
    Out,
}

/// One choice: the group, the worker's state of it, what this request tried already.
pub(super) struct View<'a> {
    pub up: &'a Upstream,
    pub g: &'a mut GroupState,
    pub tried: &'a [usize],
    pub now: Instant,
}

impl View<'_> {
    fn fit(&self, i: usize) -> Fit {
        let s = &self.up.servers[i];
        let failed = self.g.fails[i].out(s, self.now) && !self.up.single();
        if s.down || failed || !self.up.healthy(i) || self.tried.contains(&i) {
            Fit::Out
        } else if s.max_conns > 0 && self.g.active[i] >= s.max_conns {
            Fit::Full
        } else {
            Fit::Usable
        }
    }

    fn usable(&self, i: usize) -> bool {
        self.fit(i) == Fit::Usable
    }

    /// The weight `i` has now, scaled by [`WEIGHT_SCALE`]: its own, or while it ramps up
    /// after coming back (`slow_start`), the part of it that the time since has earned (at
    /// least one thousandth, so a ramping server alone is still chosen).
    fn weight(&self, i: usize) -> i64 {
        let s = &self.up.servers[i];
        let full = s.weight.saturating_mul(WEIGHT_SCALE);
        let (Some(span), Some((Some(from), _))) = (s.slow_start, self.g.ramp.get(i)) else {
            return full;
        };
        let gone = self.now.saturating_duration_since(*from);
        if gone >= span {
            return full;
        }
        let part = full as u128 * gone.as_millis() / span.as_millis().max(1);
        (part as i64).max(1)
    }

    /// Smooth weighted round robin among `candidates`: each gains its weight, the one with
    /// the most (the first on a tie) is chosen and pays back the total.
    fn swrr(&mut self, candidates: &[usize]) -> Option<usize> {
        self.swrr_where(|_, i| candidates.contains(&i))
    }

    /// [`View::swrr`] over the servers `candidate` accepts, in config order.
    fn swrr_where(&mut self, candidate: impl Fn(&Self, usize) -> bool) -> Option<usize> {
        let (mut total, mut best) = (0, None::<usize>);
        for i in 0..self.up.servers.len() {
            if !candidate(self, i) {
                continue;
            }
            // The effective weight (nginx's): lowered by failures, regained one unit per
            // choice taken part in.
            let full = self.up.servers[i].weight.saturating_mul(WEIGHT_SCALE);
            let deficit = self.g.deficit[i];
            let w = self.weight(i).min(full - deficit);
            self.g.deficit[i] = (deficit - WEIGHT_SCALE).max(0);
            self.g.current[i] += w;
            total += w;
            if best.is_none_or(|b| self.g.current[i] > self.g.current[b]) {
                best = Some(i);
            }
        }
        let best = best?;
        self.g.current[best] -= total;
        Some(best)
    }

    /// Indices of the primaries (`backup == false`) or of the backups.
    fn tier(&self, backup: bool) -> impl Iterator<Item = usize> + '_ {
        let servers = &self.up.servers;
        (0..servers.len()).filter(move |&i| servers[i].backup == backup)
    }

    /// The usable servers of a tier, and whether any other was only at `max_conns`.
    fn usable_in(&self, backup: bool) -> (Vec<usize>, bool) {
        let (mut ok, mut full) = (Vec::new(), false);
        for i in self.tier(backup) {
            match self.fit(i) {
                Fit::Usable => ok.push(i),
                Fit::Full => full = true,
                Fit::Out => {}
            }
        }
        (ok, full)
    }

    fn total_weight(&self) -> u64 {
        self.tier(false)
            .map(|i| self.up.servers[i].weight as u64)
            .sum()
    }

    /// The primary whose weight slot holds `w` (0 <= w < total weight), in config order.
    fn slot(&self, mut w: u64) -> usize {
        let mut last = 0;
        for i in self.tier(false) {
            let weight = self.up.servers[i].weight as u64;
            if w < weight {
                return i;
            }
            w -= weight;
            last = i;
        }
        last
    }

    /// Whether connections-in-use per weight of `a` exceed those of `b`.
    fn busier(&self, a: usize, b: usize) -> bool {
        let load = |x: usize, y: usize| self.g.active[x] as u128 * self.weight(y) as u128;
        load(a, b) > load(b, a)
    }

    /// Whether the hashing and random methods have anything to choose between.
    fn few(&self) -> bool {
        self.tier(false).nth(1).is_none()
    }
}

/// The server for the next attempt of a request from `ip` with hash key `key`.
pub(super) fn choose(v: &mut View, ip: Option<IpAddr>, key: Option<&[u8]>) -> Found {
    let up = v.up;
    match &up.method {
        Method::RoundRobin => round_robin(v),
        Method::LeastConn => least_conn(v),
        Method::IpHash => ip_hash(v, ip),
        // An empty key says nothing about the request: round robin, as nginx does.
        Method::Hash(_) | Method::Consistent(..) if key.is_none_or(<[u8]>::is_empty) => {
            round_robin(v)
        }
        Method::Hash(_) => hash(v, key.unwrap_or_default()),
        Method::Consistent(_, ring) => consistent(v, ring, key.unwrap_or_default()),
        Method::Random { two } => random(v, *two),
    }
}

fn round_robin(v: &mut View) -> Found {
    for backup in [false, true] {
        // The tier's usable servers are walked in place rather than collected: this is
        // every proxied request's path, and the list was an allocation per request.
        let usable =
            |v: &View, i: usize| v.up.servers[i].backup == backup && v.fit(i) == Fit::Usable;
        if let Some(i) = v.swrr_where(usable) {
            return Found::Server(i);
        }
    }
    // Only when none is usable: whether some are at `max_conns` (the request may wait).
    // Looked at up front, it was each server's fitness taken twice per request.
    if [false, true]
        .into_iter()
        .any(|backup| v.tier(backup).any(|i| v.fit(i) == Fit::Full))
    {
        Found::Full
    } else {
        Found::None
    }
}

fn least_conn(v: &mut View) -> Found {
    let mut any_full = false;
    for backup in [false, true] {
        let (ok, full) = v.usable_in(backup);
        any_full |= full;
        // The first of the least loaded, then round robin among all tied with it.
        let Some(least) = ok
            .iter()
            .copied()
            .reduce(|a, b| if v.busier(a, b) { b } else { a })
        else {
            continue;
        };
        let tied: Vec<usize> = ok
            .into_iter()
            .filter(|&i| !v.busier(i, least) && !v.busier(least, i))
            .collect();
        if let Some(i) = v.swrr(&tied) {
            return Found::Server(i);
        }
    }
    if any_full {
        Found::Full
    } else {
        Found::None
    }
}

fn ip_hash(v: &mut View, ip: Option<IpAddr>) -> Found {
    if v.few() {
        return round_robin(v);
    }
    let bytes = ip_bytes(ip);
    let total = v.total_weight();
    let mut h = 89;
    for _ in 0..PICKS {
        h = ip_step(h, &bytes);
        let i = v.slot(h % total);
        if v.usable(i) {
            return Found::Server(i);
        }
    }
    round_robin(v)
}

fn hash(v: &mut View, key: &[u8]) -> Found {
    if v.few() {
        return round_robin(v);
    }
    let total = v.total_weight();
    let mut sum = 0u32;
    for n in 0..PICKS {
        sum = sum.wrapping_add(key_step(n, key));
        let i = v.slot(u64::from(sum) % total);
        if v.usable(i) {
            return Found::Server(i);
        }
    }
    round_robin(v)
}

fn consistent(v: &mut View, ring: &Ring, key: &[u8]) -> Found {
    if v.few() || ring.points.is_empty() {
        return round_robin(v);
    }
    let start = ring.start(crc32fast::hash(key));
    for step in 0..PICKS {
        let owner = ring.points[(start + step) % ring.points.len()].1;
        // A point names an address: every usable server written with it takes part.
        let addr = &v.up.servers[owner].addr;
        let same: Vec<usize> = v
            .tier(false)
            .filter(|&i| v.up.servers[i].addr == *addr && v.usable(i))
            .collect();
        if let Some(i) = v.swrr(&same) {
            return Found::Server(i);
        }
    }
    round_robin(v)
}

fn random(v: &mut View, two: bool) -> Found {
    if v.few() {
        return round_robin(v);
    }
    let total = v.total_weight();
    let mut first = None;
    for _ in 0..PICKS {
        let i = v.slot(fastrand::u64(0..total));
        if first == Some(i) || !v.usable(i) {
            continue;
        }
        match first {
            _ if !two => return Found::Server(i),
            None => first = Some(i),
            Some(f) => return Found::Server(if v.busier(i, f) { f } else { i }),
        }
    }
    round_robin(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Addr;
    use std::time::Duration;

    fn server(addr: &str, weight: i64) -> Server {
        Server {
            addr: Addr::parse(addr).expect("test address"),
            weight,
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
            max_conns: 0,
            slow_start: None,
            backup: false,
            down: false,
            resolve: None,
            metrics: 0,
        }
    }

    #[test]
    fn host_port_as_nginx_splits_it() {
        assert_eq!(host_port("127.0.0.1:9000"), ("127.0.0.1", "9000"));
        assert_eq!(host_port("[::1]:80"), ("[::1]", "80"));
        assert_eq!(host_port("unix:/run/app.sock"), ("/run/app.sock", ""));
        assert_eq!(host_port("UNIX:/x"), ("/x", ""));
        assert_eq!(host_port("example.com"), ("example.com", ""));
        assert_eq!(host_port("a:b"), ("a:b", ""));
    }

    #[test]
    fn key_step_is_memcached_crc() {
        // crc32("a") = 0xe8b7be43 (the standard check value family); the step keeps bits
        // 16..30.
        assert_eq!(crc32fast::hash(b"a"), 0xe8b7_be43);
        assert_eq!(key_step(0, b"a"), (0xe8b7_be43u32 >> 16) & 0x7fff);
        // From the second attempt on, the attempt number is written before the key.
        assert_eq!(key_step(1, b"a"), (crc32fast::hash(b"1a") >> 16) & 0x7fff);
        assert_eq!(key_step(12, b"a"), (crc32fast::hash(b"12a") >> 16) & 0x7fff);
    }

    #[test]
    fn ip_hash_reads_a_slash_24_of_ipv4() {
        let a = ip_bytes(Some("10.1.2.3".parse().unwrap()));
        let b = ip_bytes(Some("10.1.2.250".parse().unwrap()));
        assert_eq!(a, vec![10, 1, 2]);
        assert_eq!(a, b);
        assert_eq!(ip_bytes(Some("::1".parse().unwrap())).len(), 16);
        assert_eq!(ip_bytes(None), vec![0, 0, 0]);
        let by_hand = (((89 * 113 + 10) % 6271 * 113 + 1) % 6271 * 113 + 2) % 6271;
        assert_eq!(ip_step(89, &a), by_hand);
    }

    #[test]
    fn ring_has_160_points_per_weight_chained_from_host_and_port() {
        let ring = Ring::new(&[server("127.0.0.1:9001", 1), server("127.0.0.1:9002", 2)]);
        assert_eq!(ring.points.len(), 3 * 160);
        assert!(ring.points.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(ring.points.iter().filter(|p| p.1 == 1).count(), 320);
        // The first point of a server is crc32(host \0 port, then four zero bytes).
        let first = crc32fast::hash(b"127.0.0.1\x009001\0\0\0\0");
        let second = {
            let mut b = b"127.0.0.1\x009001".to_vec();
            b.extend_from_slice(&first.to_le_bytes());
            crc32fast::hash(&b)
        };
        assert!(ring.points.contains(&(first, 0)));
        assert!(ring.points.contains(&(second, 0)));
    }

    #[test]
    fn ring_start_wraps() {
        let ring = Ring {
            points: vec![(10, 0), (20, 1)],
        };
        assert_eq!(ring.start(5), 0);
        assert_eq!(ring.start(10), 0);
        assert_eq!(ring.start(11), 1);
        assert_eq!(ring.start(21), 2);
    }
}
