//! The DNS client behind nginx's `resolver` directive: names met at run time (a
//! `*_pass` with variables, an upstream `server NAME resolve`) are looked up through the
//! name servers it lists, never through the system's resolver, as in nginx.
//!
//! The DNS protocol is hickory-resolver's; the asking is nginx's. Each `resolver` line is
//! one [`Resolver`], with a hickory client per name server (made in the worker on first
//! use: the config is read in the master, whose runtime is not the worker's). A name is
//! asked of one server at a time, the next in turn for each new name; a server that gives
//! no usable answer within 5 s (none, or a format error, which nginx ignores) is left for
//! the next one, until `resolver_timeout` (the location's, bounding each lookup from
//! outside). A server's answer, good or bad, is the answer: nginx does not ask another
//! server after SERVFAIL, as hickory's pool would. A and AAAA are asked together, and an
//! error for either fails the name. Answers are kept, for all servers, by their TTL (or for
//! `valid=` when given); errors are not (hickory keeps "no such name" as nginx does).
//!
//! Errors are nginx's (ngx_resolver_strerror): a name that does not exist or has no
//! address is `3: Host not found`, a name server that does not answer in time (or cannot
//! be reached: nginx waits for the timeout then) is `110: Operation timed out`.

use gannet_conf::{ConfError, Directive};
use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::proto::ProtoErrorKind;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// nginx's `resolver_timeout` default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a server has to answer before the name is asked of the next (nginx's
/// resend time).
const RESEND: Duration = Duration::from_secs(5);

/// The most names kept (past it, expired ones are dropped; then new ones are not kept).
const KEPT_MAX: usize = 4096;

/// One `resolver` directive.
pub struct Resolver {
    servers: Vec<SocketAddr>,
    /// `valid=`: how long answers are kept, whatever their TTL.
    valid: Option<Duration>,
    strategy: LookupIpStrategy,
    /// One client per name server, in `servers`' order.
    clients: OnceLock<Vec<hickory_resolver::TokioResolver>>,
    /// The server the next name is asked of (modulo their number).
    next: AtomicUsize,
    /// Addresses found, by lower-case name, and until when they hold.
    kept: Mutex<HashMap<String, (Vec<IpAddr>, Instant)>>,
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
    Refused,
    TimedOut,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Failure::NotFound => "3: Host not found",
            Failure::ServFail => "2: Server failure",
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
    let strategy = match (v4, v6) {
        (true, false) => LookupIpStrategy::Ipv4Only,
        (false, true) => LookupIpStrategy::Ipv6Only,
        _ => LookupIpStrategy::Ipv4AndIpv6,
    };
    Ok(Resolver {
        servers,
        valid,
        strategy,
        clients: OnceLock::new(),
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
    fn clients(&self) -> &[hickory_resolver::TokioResolver] {
        self.clients
            .get_or_init(|| self.servers.iter().map(|&sa| self.client(sa)).collect())
    }

    fn client(&self, server: SocketAddr) -> hickory_resolver::TokioResolver {
        let mut config = ResolverConfig::new();
        // nginx asks over UDP and asks again over TCP for a truncated answer; so does
        // hickory with both listed.
        config.add_name_server(NameServerConfig::new(server, Protocol::Udp));
        config.add_name_server(NameServerConfig::new(server, Protocol::Tcp));
        let mut opts = ResolverOpts::default();
        opts.use_hosts_file = ResolveHosts::Never;
        // The names are looked up as written: no search list, no `ndots`.
        opts.ndots = 0;
        // One question at a time; asking again (another server) is `lookup`'s.
        opts.attempts = 1;
        opts.num_concurrent_reqs = 1;
        opts.timeout = RESEND;
        if let Some(v) = self.valid {
            opts.positive_min_ttl = Some(v);
            opts.positive_max_ttl = Some(v);
            opts.negative_min_ttl = Some(v);
            opts.negative_max_ttl = Some(v);
        }
        hickory_resolver::Resolver::builder_with_config(config, TokioConnectionProvider::default())
            .with_options(opts)
            .build()
    }

    /// The addresses of `name`, within `timeout` (the location's `resolver_timeout`), and
    /// until when they hold (their TTL, or `valid=`).
    pub async fn lookup(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(Vec<IpAddr>, Instant), Failure> {
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(found) = self.kept(&key) {
            return Ok(found);
        }
        // A fully qualified name: no search domain is ever appended.
        let fqdn = format!("{key}.");
        let clients = self.clients();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut turn = self.next.fetch_add(1, Ordering::Relaxed);
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(Failure::TimedOut);
            }
            let resend = deadline.min(now + RESEND);
            let client = &clients[turn % clients.len()];
            turn = turn.wrapping_add(1);
            match tokio::time::timeout_at(resend, self.ask(client, &fqdn)).await {
                Ok(Ok(found)) => {
                    self.keep(key, &found);
                    return Ok(found);
                }
                Ok(Err(Some(failure))) => return Err(failure),
                // No usable answer: as nginx, the next server when the resend time comes.
                Ok(Err(None)) => tokio::time::sleep_until(resend).await,
                Err(_) => {}
            }
        }
    }

    /// One server's answer for `fqdn`: its addresses, a failure, or `Err(None)` for none
    /// usable. A and AAAA are asked apart (hickory's combined lookup keeps one answer when
    /// the other is an error): as nginx, an error for either fails the name, and only an
    /// empty answer (NOERROR, no records) leaves the other's addresses.
    async fn ask(
        &self,
        client: &hickory_resolver::TokioResolver,
        fqdn: &str,
    ) -> Result<(Vec<IpAddr>, Instant), Option<Failure>> {
        let (v4, v6) = match self.strategy {
            LookupIpStrategy::Ipv4Only => (true, false),
            LookupIpStrategy::Ipv6Only => (false, true),
            _ => (true, true),
        };
        let ask = |on: bool, kind: RecordType| async move {
            match on {
                true => Some(client.lookup(fqdn, kind).await),
                false => None,
            }
        };
        let (a, aaaa) = (ask(v4, RecordType::A), ask(v6, RecordType::AAAA));
        tokio::pin!(a, aaaa);
        // Each answer as it comes: an error fails the name at once, as in nginx.
        let (mut got_a, mut got_aaaa) = (None, None);
        while got_a.is_none() || got_aaaa.is_none() {
            let answer = tokio::select! {
                r = &mut a, if got_a.is_none() => got_a.insert(r),
                r = &mut aaaa, if got_aaaa.is_none() => got_aaaa.insert(r),
            };
            if let Some(Err(e)) = answer {
                if !is_empty_answer(e) {
                    return Err(judge(e));
                }
            }
        }
        let mut addrs = Vec::new();
        let mut until: Option<Instant> = None;
        for answer in [got_a, got_aaaa].into_iter().flatten().flatten() {
            let Ok(lookup) = answer else { continue };
            addrs.extend(lookup.iter().filter_map(|r| match r {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            }));
            let t = lookup.valid_until();
            until = Some(until.map_or(t, |u| u.min(t)));
        }
        match until {
            Some(until) if !addrs.is_empty() => Ok((addrs, until)),
            _ => Err(Some(Failure::NotFound)),
        }
    }

    fn kept(&self, key: &str) -> Option<(Vec<IpAddr>, Instant)> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.get(key)
            .filter(|(_, until)| *until > Instant::now())
            .cloned()
    }

    fn keep(&self, key: String, found: &(Vec<IpAddr>, Instant)) {
        let now = Instant::now();
        if found.1 <= now {
            // A zero TTL: not kept, as nginx.
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= KEPT_MAX {
            kept.retain(|_, (_, until)| *until > now);
        }
        if kept.len() < KEPT_MAX {
            kept.insert(key, found.clone());
        }
    }

    /// The name of `ip` (its PTR record, without the final dot), within `timeout`: the
    /// mail proxy's SMTP client name. Asked of the name servers directly over UDP, one
    /// after another (5 s each) until `timeout`: hickory's resolver answers for the
    /// loopback addresses itself (RFC 6761), where nginx asks the server.
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
    use hickory_resolver::proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_resolver::proto::rr::Name;
    use hickory_resolver::proto::serialize::binary::BinDecodable;
    let id = fastrand::u16(..);
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from(ip), RecordType::PTR));
    let bytes = m.to_vec().ok()?;
    let bind: SocketAddr = match server {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = tokio::net::UdpSocket::bind(bind).await.ok()?;
    sock.connect(server).await.ok()?;
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

/// NOERROR with no record of the type asked: the name has none of those addresses.
fn is_empty_answer(e: &hickory_resolver::ResolveError) -> bool {
    use hickory_resolver::proto::op::ResponseCode;
    matches!(
        e.proto().map(|p| p.kind()),
        Some(ProtoErrorKind::NoRecordsFound { response_code, .. }) if *response_code == ResponseCode::NoError
    )
}

/// What a server's error answer means for the name; `None` when it is no usable answer
/// (a format error, which nginx ignores, or no answer at all: a broken connection).
fn judge(e: &hickory_resolver::ResolveError) -> Option<Failure> {
    use hickory_resolver::proto::op::ResponseCode;
    match e.proto().map(|p| p.kind()) {
        Some(ProtoErrorKind::NoRecordsFound { response_code, .. }) => match *response_code {
            ResponseCode::FormErr => None,
            ResponseCode::ServFail => Some(Failure::ServFail),
            ResponseCode::Refused => Some(Failure::Refused),
            _ => Some(Failure::NotFound),
        },
        _ if e.is_nx_domain() || e.is_no_records_found() => Some(Failure::NotFound),
        _ => None,
    }
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
        assert_eq!(r.strategy, LookupIpStrategy::Ipv4AndIpv6);
        assert_eq!(
            parsed("resolver 127.0.0.1 ipv6=off;").unwrap().strategy,
            LookupIpStrategy::Ipv4Only
        );
        assert_eq!(
            parsed("resolver 127.0.0.1 ipv4=off;").unwrap().strategy,
            LookupIpStrategy::Ipv6Only
        );
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
