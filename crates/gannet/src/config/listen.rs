//! The `listen` directive: `listen [addr:]port | [ipv6]:port | addr | unix:PATH [default_server] [ssl]
//! [http2] [quic] [proxy_protocol] [reuseport] [backlog=N] [rcvbuf=SIZE] [sndbuf=SIZE]
//! [fastopen=N] [ipv6only=on|off] [deferred] [bind]
//! [so_keepalive=on|off|[keepidle]:[keepintvl]:[keepcnt]]`.

use gannet_conf::{ConfError, Directive};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

/// Where a `listen` listens: a TCP address or a unix domain socket's path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(Arc<Path>),
    /// A stream `listen ... udp`: a datagram socket (a TCP one may share its address).
    Udp(SocketAddr),
}

impl fmt::Display for Endpoint {
    /// As nginx writes a listening address: `127.0.0.1:80`, `unix:/run/app.sock`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Udp(a) => write!(f, "{a}"),
        }
    }
}

/// The longest path a unix domain socket address holds (`sun_path`, with its NUL).
const SUN_PATH_MAX: usize = 108;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    /// The TCP address; for `listen unix:`, 0.0.0.0:0, unused (see `unix`).
    pub addr: SocketAddr,
    /// `listen unix:PATH`: the socket file's path.
    pub unix: Option<Arc<Path>>,
    pub default_server: bool,
    pub backlog: i32,
    /// Kept for nginx compatibility: gannet always uses SO_REUSEPORT, one socket per worker.
    pub reuseport: bool,
    pub ipv6only: bool,
    /// `deferred`: TCP_DEFER_ACCEPT, the kernel hands over a connection only once its
    /// first data has arrived.
    pub deferred: bool,
    /// `ssl`: connections to the address speak TLS (one server saying so is enough, as in
    /// nginx, where the flag belongs to the address).
    pub ssl: bool,
    /// `http2` (nginx's older form of `http2 on`): HTTP/2 on the address, for every server.
    pub http2: bool,
    /// `proxy_protocol`: every connection opens with a PROXY protocol header
    /// (`conn::proxy_protocol`); the address's, as `ssl`.
    pub proxy_protocol: bool,
    /// `rcvbuf=` / `sndbuf=`: SO_RCVBUF / SO_SNDBUF of the listening socket, which accepted
    /// connections inherit (the kernel's autotuning otherwise, as nginx leaves it).
    pub rcvbuf: Option<usize>,
    pub sndbuf: Option<usize>,
    /// `so_keepalive=`: TCP keepalive probes on the address's connections (inherited from
    /// the listening socket), so a client that vanished without a FIN is found and closed.
    pub so_keepalive: Option<SoKeepalive>,
    /// `fastopen=N`: TCP_FASTOPEN with a queue of N connections not yet through the
    /// three-way handshake.
    pub fastopen: Option<i32>,
    /// `udp` (stream only): a datagram socket (`stream::proxy`'s sessions).
    pub udp: bool,
    /// `quic` (http): HTTP/3 over QUIC on a datagram socket (`conn::h3`); `udp` is set too,
    /// so the address is apart from a TCP listener on the same port.
    pub quic: bool,
    /// TCP_NODELAY on the listening socket, which the connections it accepts inherit
    /// (Linux copies it to them): a stream TCP address's, its default server's
    /// `tcp_nodelay`, so that a session need not set it itself (`stream::core`). `None`:
    /// left as the system has it (http, which sets it per connection as it decides).
    pub nodelay: Option<bool>,
}

/// `so_keepalive=on|off|[keepidle]:[keepintvl]:[keepcnt]`, as nginx: `on` / `off` set
/// SO_KEEPALIVE and leave the timings to the system; the third form turns it on and sets
/// the timings given (seconds, nginx's time syntax; the count a number), the rest as the
/// system has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoKeepalive {
    Off,
    On {
        idle: Option<u64>,
        interval: Option<u64>,
        count: Option<u32>,
    },
}

impl Listen {
    /// Where an accepted connection arrived. A listen on a specific address already says
    /// it: the getsockname() call (one of the handful of syscalls a short connection costs)
    /// is made only for a wildcard address.
    pub fn local_of(&self, stream: &std::net::TcpStream) -> SocketAddr {
        if self.unix.is_none() && self.addr.ip().is_unspecified() {
            stream.local_addr().unwrap_or(self.addr)
        } else {
            self.addr
        }
    }

    /// nginx's default when a server has no `listen`: *:80 (or *:8000 when not root).
    pub fn default_for_server() -> Listen {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let port = if unsafe { libc::geteuid() } == 0 {
            80
        } else {
            8000
        };
        Listen::with_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))
    }

    pub fn with_addr(addr: SocketAddr) -> Listen {
        Listen {
            addr,
            unix: None,
            default_server: false,
            backlog: 511,
            reuseport: false,
            ipv6only: true,
            deferred: false,
            ssl: false,
            http2: false,
            proxy_protocol: false,
            rcvbuf: None,
            sndbuf: None,
            so_keepalive: None,
            fastopen: None,
            udp: false,
            quic: false,
            nodelay: None,
        }
    }

    /// Where the listen listens.
    pub fn endpoint(&self) -> Endpoint {
        match &self.unix {
            Some(p) => Endpoint::Unix(p.clone()),
            None if self.udp => Endpoint::Udp(self.addr),
            None => Endpoint::Tcp(self.addr),
        }
    }

    /// An http `listen`, whose port may be a range (`127.0.0.1:8182-8183`): one listen
    /// per port of it, with the same parameters, as nginx's.
    pub fn parse_range(d: &Directive) -> Result<Vec<Listen>, ConfError> {
        let arg = &d.args[0];
        let Some((first, last)) = port_range(arg) else {
            return Ok(vec![Listen::parse(d)?]);
        };
        let err = |why: &str| d.error(format!("{why} in \"{arg}\" of the \"listen\" directive"));
        let port = |p: &str| p.parse::<u16>().ok().filter(|&n| n >= 1);
        let (Some(a), Some(b)) = (port(first), port(last)) else {
            return Err(err("invalid port"));
        };
        if a > b {
            return Err(err("invalid port range"));
        }
        let mut one = d.clone();
        one.args[0] = format!("{}{a}", &arg[..arg.len() - first.len() - last.len() - 1]);
        let l = Listen::parse(&one)?;
        Ok((a..=b)
            .map(|p| {
                let mut l = l.clone();
                l.addr.set_port(p);
                l
            })
            .collect())
    }

    pub fn parse(d: &Directive) -> Result<Listen, ConfError> {
        let arg = &d.args[0];
        let mut l = if arg.len() >= 5 && arg[..5].eq_ignore_ascii_case("unix:") {
            // nginx's ngx_parse_unix_domain_url, with its messages.
            let path = &arg[5..];
            let err =
                |why: &str| d.error(format!("{why} in \"{arg}\" of the \"listen\" directive"));
            if path.is_empty() {
                return Err(err("no path in the unix domain socket"));
            }
            if path.len() + 1 > SUN_PATH_MAX {
                return Err(err("too long path in the unix domain socket"));
            }
            let mut l = Listen::with_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
            l.unix = Some(Arc::from(Path::new(path)));
            l
        } else {
            let addr = parse_addr(arg).ok_or_else(|| {
                d.error(format!("invalid address \"{arg}\" in \"listen\" directive"))
            })?;
            Listen::with_addr(addr)
        };
        for opt in &d.args[1..] {
            let (key, val) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt.as_str(), None),
            };
            match (key, val) {
                ("default_server", None) | ("default", None) => l.default_server = true,
                ("reuseport", None) => l.reuseport = true,
                ("backlog", Some(v)) => {
                    l.backlog = v
                        .parse()
                        .map_err(|_| d.error(format!("invalid backlog \"{v}\"")))?
                }
                ("rcvbuf", Some(v)) => l.rcvbuf = Some(buffer_size(d, key, v)?),
                ("sndbuf", Some(v)) => l.sndbuf = Some(buffer_size(d, key, v)?),
                ("so_keepalive", Some(v)) => {
                    l.so_keepalive =
                        Some(so_keepalive(v).ok_or_else(|| {
                            d.error(format!("invalid so_keepalive value: \"{v}\""))
                        })?)
                }
                ("fastopen", Some(v)) => {
                    l.fastopen = Some(
                        v.parse()
                            .ok()
                            .filter(|n: &i32| *n >= 0)
                            .ok_or_else(|| d.error(format!("invalid fastopen \"{v}\"")))?,
                    )
                }
                ("ipv6only", Some("on")) => l.ipv6only = true,
                ("ipv6only", Some("off")) => l.ipv6only = false,
                ("deferred", None) => l.deferred = true,
                ("ssl", None) => l.ssl = true,
                ("http2", None) => l.http2 = true,
                ("proxy_protocol", None) => l.proxy_protocol = true,
                // Accepted for compatibility: `bind` because gannet binds every address on
                // its own socket anyway, the other two are FreeBSD's.
                ("bind", None) | ("setfib", Some(_)) | ("accept_filter", Some(_)) => {}
                ("quic", None) => {
                    l.quic = true;
                    l.udp = true;
                }
                _ => return Err(d.error(format!("invalid parameter \"{opt}\""))),
            }
        }
        if l.quic {
            quic_compatible(d, &l)?;
        }
        Ok(l)
    }
}

/// nginx's refusals of TCP-only parameters on a `quic` address (`ssl` too: QUIC is always
/// TLS; `http2`: it is HTTP/3).
fn quic_compatible(d: &Directive, l: &Listen) -> Result<(), ConfError> {
    let has = |p: &str| {
        d.args[1..]
            .iter()
            .any(|a| a == p || a.split_once('=').is_some_and(|(k, _)| k == p))
    };
    if l.unix.is_some() {
        return Err(d.error(
            "\"listen\" directive \"quic\" parameter is incompatible with a unix domain socket",
        ));
    }
    let clash = [
        ("fastopen", l.fastopen.is_some()),
        ("backlog", has("backlog")),
        ("accept_filter", has("accept_filter")),
        ("deferred", l.deferred),
        ("ssl", l.ssl),
        ("http2", l.http2),
        ("so_keepalive", l.so_keepalive.is_some()),
        ("proxy_protocol", l.proxy_protocol),
    ];
    match clash.iter().find(|(_, set)| *set) {
        Some((p, _)) => Err(d.error(format!(
            "\"listen\" directive \"{p}\" parameter is incompatible with \"quic\""
        ))),
        None => Ok(()),
    }
}

/// The value of `so_keepalive=`; None when malformed, when a timing is beyond what Linux
/// takes (32,767 s; 127 probes), or when the timed form sets nothing (`::`, which nginx
/// refuses too). A part that is empty or 0 is left as the system has it, as in nginx.
fn so_keepalive(v: &str) -> Option<SoKeepalive> {
    match v {
        "on" => {
            return Some(SoKeepalive::On {
                idle: None,
                interval: None,
                count: None,
            })
        }
        "off" => return Some(SoKeepalive::Off),
        _ => {}
    }
    let mut parts = v.splitn(3, ':');
    // Some(None): the part is empty or 0; None: it is malformed or too large.
    let mut part = |parse: fn(&str) -> Option<u64>, max: u64| match parts.next() {
        None | Some("") => Some(None),
        Some(p) => parse(p).filter(|&n| n <= max).map(|n| (n > 0).then_some(n)),
    };
    let idle = part(gannet_conf::setters::sec, 32_767)?;
    let interval = part(gannet_conf::setters::sec, 32_767)?;
    let count = part(|p| p.parse().ok(), 127)?.map(|n| n as u32);
    (idle.is_some() || interval.is_some() || count.is_some()).then_some(SoKeepalive::On {
        idle,
        interval,
        count,
    })
}

/// A socket buffer size (`64k`, `1m`), as nginx's "invalid sndbuf" when it is not one.
fn buffer_size(d: &Directive, key: &str, v: &str) -> Result<usize, ConfError> {
    gannet_conf::setters::size(v)
        .filter(|&n| n <= i32::MAX as u64)
        .map(|n| n as usize)
        .ok_or_else(|| d.error(format!("invalid {key} \"{v}\"")))
}

/// `8080`, `127.0.0.1:8080`, `127.0.0.1` (port 80), `*:8080`, `[::]:8080`, `[::1]`,
/// `localhost:8080`.
/// The two ends of a port range at the end of a TCP `listen` address (`8182-8183`,
/// `[::1]:8182-8183`), as text.
fn port_range(arg: &str) -> Option<(&str, &str)> {
    if arg.len() >= 5 && arg[..5].eq_ignore_ascii_case("unix:") {
        return None;
    }
    let port = match arg.rsplit_once(':') {
        Some((_, p)) => p,
        None => arg,
    };
    port.split_once('-')
}

fn parse_addr(s: &str) -> Option<SocketAddr> {
    if let Ok(port) = s.parse::<u16>() {
        return Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest.split_once(']')?;
        let ip: Ipv6Addr = host.parse().ok()?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => 80,
            None => return None,
        };
        return Some(SocketAddr::new(IpAddr::V6(ip), port));
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().ok()?),
        None => (s, 80),
    };
    let ip = match host {
        "*" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        h => h.parse().ok()?,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::{parse_addr, so_keepalive, SoKeepalive};

    #[test]
    fn keepalive_values() {
        let on = |idle, interval, count| {
            Some(SoKeepalive::On {
                idle,
                interval,
                count,
            })
        };
        assert_eq!(so_keepalive("on"), on(None, None, None));
        assert_eq!(so_keepalive("off"), Some(SoKeepalive::Off));
        assert_eq!(so_keepalive("30m::10"), on(Some(1800), None, Some(10)));
        assert_eq!(so_keepalive("1h"), on(Some(3600), None, None));
        assert_eq!(so_keepalive(":5s"), on(None, Some(5), None));
        assert_eq!(so_keepalive("0:0:3"), on(None, None, Some(3)));
        for bad in ["", "::", "0:0:0", "x", "1:2:3:4", "10h", "::128", "1ms"] {
            assert_eq!(so_keepalive(bad), None, "{bad}");
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addr("8080").unwrap().to_string(), "0.0.0.0:8080");
        assert_eq!(
            parse_addr("127.0.0.1:81").unwrap().to_string(),
            "127.0.0.1:81"
        );
        assert_eq!(parse_addr("127.0.0.1").unwrap().to_string(), "127.0.0.1:80");
        assert_eq!(parse_addr("*:90").unwrap().to_string(), "0.0.0.0:90");
        assert_eq!(parse_addr("[::]:80").unwrap().to_string(), "[::]:80");
        assert_eq!(parse_addr("[::1]").unwrap().to_string(), "[::1]:80");
        assert!(parse_addr("[::1").is_none());
        assert!(parse_addr("host:99999").is_none());
        assert!(parse_addr("example.com:80").is_none());
    }
}
