//! The DNS client behind nginx's `resolver` directive: names met at run time (a
//! `*_pass` with variables, an upstream `server NAME resolve`) are looked up through the
//! name servers it lists, never through the system's resolver, as in nginx.
//!
//! The DNS messages are hickory-proto's; the asking is nginx's (`query`): each new name is
//! asked of the next server in turn, A and AAAA together, a truncated answer again over
//! TCP, and what is unanswered after 5 s of the next server, until `resolver_timeout` (the
//! location's, bounding each lookup from outside). A server's answer, good or bad, is the
//! answer. A CNAME is kept as the name's answer and its target looked up as a name of its
//! own (at most 50 in a row). Answers are kept, for all servers, by their TTL (or for
//! `valid=` when given); errors are not.
//!
//! Errors are nginx's (ngx_resolver_strerror): a name that does not exist or has no
//! address is `3: Host not found`, a name server that does not answer in time (or cannot
//! be reached: nginx waits for the timeout then) is `110: Operation timed out`.

mod query;

use gannet_conf::{ConfError, Directive};
use hickory_resolver::proto::rr::{RData, RecordType};
use query::Found;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// nginx's `resolver_timeout` default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The most CNAMEs followed for one name (NGX_RESOLVER_MAX_RECURSION).
const MAX_RECURSION: usize = 50;

/// The most names kept (past it, expired ones are dropped; then new ones are not kept).
const KEPT_MAX: usize = 4096;

/// One `resolver` directive.
pub struct Resolver {
    servers: Vec<SocketAddr>,
    /// `valid=`: how long answers are kept, whatever their TTL.
    valid: Option<Duration>,
    /// `ipv4=`, `ipv6=`: the address families asked for.
    families: (bool, bool),
    /// The server the next name is asked of (modulo their number).
    next: AtomicUsize,
    /// Answers, by lower-case name, and until when they hold.
    kept: Mutex<HashMap<String, (Found, Instant)>>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("servers", &self.servers)
            .field("valid", &self.valid)
            .finish()
    }
}

/// Why a name has no address, as nginx words it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    NotFound,
    ServFail,
    NotImplemented,
    Refused,
    TimedOut,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Failure::NotFound => "3: Host not found",
            Failure::ServFail => "2: Server failure",
            Failure::NotImplemented => "4: Unimplemented",
            Failure::Refused => "5: Operation refused",
            Failure::TimedOut => "110: Operation timed out",
        })
    }
}

/// `resolver address ... [valid=time] [ipv4=on|off] [ipv6=on|off]`.
pub fn parse(d: &Directive) -> Result<Resolver, ConfError> {
    let mut servers = Vec::new();
    let mut valid = None;
    let (mut v4, mut v6) = (true, true);
    for a in &d.args {
        let flag = |v: &str| match v {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => Err(d.error(format!("invalid parameter: {a}"))),
        };
        if let Some(v) = a.strip_prefix("valid=") {
            let secs = gannet_conf::setters::sec(v)
                .ok_or_else(|| d.error(format!("invalid parameter: {a}")))?;
            valid = Some(Duration::from_secs(secs));
        } else if let Some(v) = a.strip_prefix("ipv4=") {
            v4 = flag(v)?;
        } else if let Some(v) = a.strip_prefix("ipv6=") {
            v6 = flag(v)?;
        } else if a.starts_with("status_zone=") {
            // nginx Plus's statistics: nothing to count into here.
        } else {
            servers.extend(server_addrs(d, a)?);
        }
    }
    if !v4 && !v6 {
        return Err(d.error("\"ipv4\" and \"ipv6\" cannot both be \"off\""));
    }
    if servers.is_empty() {
        return Err(d.error("no name servers defined"));
    }
    Ok(Resolver {
        servers,
        valid,
        families: (v4, v6),
        next: AtomicUsize::new(0),
        kept: Mutex::default(),
    })
}

/// A name server: an address with an optional port (53), or a name resolved now, at load
/// time, as nginx does.
fn server_addrs(d: &Directive, a: &str) -> Result<Vec<SocketAddr>, ConfError> {
    if let Ok(ip) = a
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return Ok(vec![SocketAddr::new(ip, 53)]);
    }
    if let Ok(sa) = a.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(d.error(format!("invalid port in resolver \"{a}\"")));
        }
        return Ok(vec![sa]);
    }
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => {
            let port = p
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| d.error(format!("invalid port in resolver \"{a}\"")))?;
            (h, port)
        }
        _ => (a, 53),
    };
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default();
    if found.is_empty() {
        return Err(d.error(format!("host not found in resolver \"{a}\"")));
    }
    Ok(found)
}

impl Resolver {
    /// `valid=`: how long answers are kept whatever their TTL.
    pub fn valid(&self) -> Option<Duration> {
        self.valid
    }

    /// The addresses of `name`, within `timeout` (the location's `resolver_timeout`), and
    /// until when they hold (their TTL, or `valid=`; the least along a CNAME chain).
    pub async fn lookup(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(Vec<IpAddr>, Instant), Failure> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut key = name.trim_end_matches('.').to_ascii_lowercase();
        let mut chain_until: Option<Instant> = None;
        for _ in 0..=MAX_RECURSION {
            let (found, until) = match self.kept(&key) {
                Some(kept) => kept,
                None => {
                    let first = self.next.fetch_add(1, Ordering::Relaxed);
                    let asked = query::resolve(&self.servers, first, self.families, &key);
                    let (found, ttl) = tokio::time::timeout_at(deadline, asked)
                        .await
                        .map_err(|_| Failure::TimedOut)??;
                    let until =
                        Instant::now() + self.valid.unwrap_or(Duration::from_secs(u64::from(ttl)));
                    self.keep(&key, &found, until);
                    (found, until)
                }
            };
            let until = chain_until.map_or(until, |u| u.min(until));
            match found {
                Found::Addrs(addrs) => return Ok((addrs, until)),
                Found::Cname(target) => {
                    key = target;
                    chain_until = Some(until);
                }
            }
        }
        Err(Failure::NotFound)
    }

    /// A kept answer, its addresses handed out as nginx hands out a cached one.
    fn kept(&self, key: &str) -> Option<(Found, Instant)> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let (found, until) = kept.get(key).filter(|(_, until)| *until > Instant::now())?;
        let found = match found {
            Found::Addrs(addrs) => Found::Addrs(rotated(addrs)),
            cname => cname.clone(),
        };
        Some((found, *until))
    }

    fn keep(&self, key: &str, found: &Found, until: Instant) {
        let now = Instant::now();
        if until <= now {
            // A zero TTL: not kept, as nginx.
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= KEPT_MAX {
            kept.retain(|_, (_, until)| *until > now);
        }
        if kept.len() < KEPT_MAX {
            kept.insert(key.to_string(), (found.clone(), until));
        }
    }

    /// The name of `ip` (its PTR record, without the final dot), within `timeout`: the
    /// mail proxy's SMTP client name. Asked of the name servers over UDP, one after
    /// another (5 s each) until `timeout`.
    pub async fn reverse(&self, ip: IpAddr, timeout: Duration) -> Result<String, Failure> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut servers = self.servers.iter().cycle();
        if self.servers.is_empty() {
            return Err(Failure::ServFail);
        }
        loop {
            let Some(&server) = servers.next() else {
                return Err(Failure::ServFail);
            };
            let until = deadline.min(tokio::time::Instant::now() + Duration::from_secs(5));
            match tokio::time::timeout_at(until, ptr_query(server, ip)).await {
                Ok(Some(answer)) => return answer,
                _ if tokio::time::Instant::now() >= deadline => return Err(Failure::TimedOut),
                _ => {}
            }
        }
    }
}

/// One PTR question to `server`: its answer, or `None` when none came (or not one to
/// this question).
async fn ptr_query(server: SocketAddr, ip: IpAddr) -> Option<Result<String, Failure>> {
    use hickory_resolver::proto::op::{Message, ResponseCode};
    use hickory_resolver::proto::rr::Name;
    use hickory_resolver::proto::serialize::binary::BinDecodable;
    let (id, bytes) = query::question(Name::from(ip), RecordType::PTR);
    let bytes = bytes?;
    let sock = query::udp_socket(server).await?;
    sock.send(&bytes).await.ok()?;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = sock.recv(&mut buf).await.ok()?;
        let Ok(r) = Message::from_bytes(&buf[..n]) else {
            continue;
        };
        if r.id() != id {
            continue;
        }
        return Some(match r.response_code() {
            ResponseCode::NoError => r
                .answers()
                .iter()
                .find_map(|a| match a.data() {
                    RData::PTR(p) => Some(p.0.to_utf8().trim_end_matches('.').to_string()),
                    _ => None,
                })
                // No PTR in the answer (empty, or of another type): a server failure to
                // nginx, not a name that does not exist.
                .ok_or(Failure::ServFail),
            ResponseCode::NXDomain => Err(Failure::NotFound),
            ResponseCode::Refused => Err(Failure::Refused),
            _ => Err(Failure::ServFail),
        });
    }
}

/// Addresses (IPv4 before IPv6) in nginx's order for a cached answer (ngx_resolver_export
/// with `rotate`): each family's from a random one on, laid from a random place on, so
/// that the requests for a name spread over its addresses.
fn rotated(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let n = addrs.len();
    if n < 2 {
        return addrs.to_vec();
    }
    let v4 = addrs.iter().filter(|a| a.is_ipv4()).count();
    let mut out = addrs.to_vec();
    let mut d = fastrand::usize(..n);
    for family in [&addrs[..v4], &addrs[v4..]] {
        if family.is_empty() {
            continue;
        }
        let j = fastrand::usize(..family.len());
        for i in 0..family.len() {
            out[d % n] = family[(j + i) % family.len()];
            d += 1;
        }
    }
    out
}

/// Whether `host` (without a port; an IPv6 address in brackets or not) is an address
/// that needs no lookup.
pub fn is_literal(host: &str) -> bool {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parsed(line: &str) -> Result<Resolver, String> {
        let tree =
            gannet_conf::parse_str(line, "t.conf", Path::new("/")).map_err(|e| e.to_string())?;
        parse(&tree[0]).map_err(|e| e.to_string())
    }

    #[test]
    fn name_servers_default_to_port_53() {
        let r = parsed("resolver 127.0.0.1 127.0.0.2:5353 [::1] [::1]:54 valid=30s;").unwrap();
        let want: Vec<SocketAddr> = ["127.0.0.1:53", "127.0.0.2:5353", "[::1]:53", "[::1]:54"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(r.servers, want);
        assert_eq!(r.valid, Some(Duration::from_secs(30)));
        assert_eq!(r.families, (true, true));
        assert_eq!(
            parsed("resolver 127.0.0.1 ipv6=off;").unwrap().families,
            (true, false)
        );
        assert_eq!(
            parsed("resolver 127.0.0.1 ipv4=off;").unwrap().families,
            (false, true)
        );
    }

    #[test]
    fn cached_addresses_are_rotated_not_lost() {
        let addrs: Vec<IpAddr> = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "::1", "::2"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let mut firsts = std::collections::HashSet::new();
        for _ in 0..200 {
            let r = rotated(&addrs);
            let mut sorted = r.clone();
            sorted.sort();
            assert_eq!(sorted, addrs);
            firsts.insert(r[0]);
        }
        assert_eq!(firsts.len(), addrs.len());
        assert_eq!(rotated(&addrs[..1]), addrs[..1]);
    }

    #[test]
    fn literals_need_no_lookup() {
        for a in ["127.0.0.1", "::1", "[::1]", "[2001:db8::1]"] {
            assert!(is_literal(a), "{a}");
        }
        for a in ["app.test", "localhost", "[app]", ""] {
            assert!(!is_literal(a), "{a}");
        }
    }
}
