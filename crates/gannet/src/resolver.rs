//! The DNS client behind nginx's `resolver` directive: names met at run time (a
//! `*_pass` with variables, an upstream `server NAME resolve`) are looked up through the
//! name servers it lists, never through the system's resolver, as in nginx.
//!
//! The DNS protocol, the answers' cache (kept by their TTL, or for `valid=` when given)
//! and the rotation across name servers are hickory-resolver's. Each `resolver` line is
//! one [`Resolver`]; its hickory client is made in the worker on first use (the config is
//! read in the master, whose runtime is not the worker's). `resolver_timeout` is the
//! location's, so it bounds each lookup from outside.
//!
//! Errors are nginx's (ngx_resolver_strerror): a name that does not exist or has no
//! address is `3: Host not found`, a name server that does not answer in time (or cannot
//! be reached: nginx waits for the timeout then) is `110: Operation timed out`.

use gannet_conf::{ConfError, Directive};
use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
    ServerOrderingStrategy,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::proto::ProtoErrorKind;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// nginx's `resolver_timeout` default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// One `resolver` directive.
pub struct Resolver {
    servers: Vec<SocketAddr>,
    /// `valid=`: how long answers are kept, whatever their TTL.
    valid: Option<Duration>,
    strategy: LookupIpStrategy,
    client: OnceLock<hickory_resolver::TokioResolver>,
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
        client: OnceLock::new(),
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
    fn client(&self) -> &hickory_resolver::TokioResolver {
        self.client.get_or_init(|| {
            let mut config = ResolverConfig::new();
            for &sa in &self.servers {
                // nginx asks over UDP and falls back to TCP for a truncated answer; so
                // does hickory with both listed.
                config.add_name_server(NameServerConfig::new(sa, Protocol::Udp));
                config.add_name_server(NameServerConfig::new(sa, Protocol::Tcp));
            }
            let mut opts = ResolverOpts::default();
            opts.ip_strategy = self.strategy;
            opts.server_ordering_strategy = ServerOrderingStrategy::RoundRobin;
            opts.use_hosts_file = ResolveHosts::Never;
            // The names are looked up as written: no search list, no `ndots`.
            opts.ndots = 0;
            // nginx asks again every 5 s until `resolver_timeout` (30 s by default), which
            // bounds every lookup from outside.
            opts.attempts = 6;
            opts.timeout = Duration::from_secs(5);
            if let Some(v) = self.valid {
                opts.positive_min_ttl = Some(v);
                opts.positive_max_ttl = Some(v);
                opts.negative_min_ttl = Some(v);
                opts.negative_max_ttl = Some(v);
            }
            hickory_resolver::Resolver::builder_with_config(
                config,
                TokioConnectionProvider::default(),
            )
            .with_options(opts)
            .build()
        })
    }

    /// The addresses of `name`, within `timeout` (the location's `resolver_timeout`), and
    /// until when they hold (their TTL, or `valid=`).
    pub async fn lookup(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(Vec<IpAddr>, Instant), Failure> {
        // A fully qualified name: no search domain is ever appended.
        let fqdn = if name.ends_with('.') {
            name.to_string()
        } else {
            format!("{name}.")
        };
        let found = tokio::time::timeout(timeout, self.client().lookup_ip(fqdn)).await;
        let lookup = match found {
            Err(_) => return Err(Failure::TimedOut),
            Ok(Err(e)) => return Err(classify(&e)),
            Ok(Ok(l)) => l,
        };
        let addrs: Vec<IpAddr> = lookup.iter().collect();
        if addrs.is_empty() {
            return Err(Failure::NotFound);
        }
        Ok((addrs, lookup.valid_until()))
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
    use hickory_resolver::proto::rr::{Name, RData, RecordType};
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

fn classify(e: &hickory_resolver::ResolveError) -> Failure {
    use hickory_resolver::proto::op::ResponseCode;
    match e.proto().map(|p| p.kind()) {
        Some(ProtoErrorKind::NoRecordsFound { response_code, .. }) => match *response_code {
            ResponseCode::ServFail => Failure::ServFail,
            ResponseCode::Refused => Failure::Refused,
            _ => Failure::NotFound,
        },
        _ if e.is_nx_domain() || e.is_no_records_found() => Failure::NotFound,
        _ => Failure::TimedOut,
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
