//! The stream context's variables (nginx's ngx_stream_variables.c plus the variables of the
//! stream modules gannet has) and the templates that read them: `log_format`, `map`
//! values, `proxy_pass $name`, `hash KEY`.
//!
//! A [`Session`] holds what a variable may read: filled in as the session goes (addresses
//! at accept, the ClientHello's fields at `ssl_preread`, the upstream's at connect, the
//! counters and `$status` at the end).

use super::map::Maps;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    RemoteAddr,
    RemotePort,
    BinaryRemoteAddr,
    ServerAddr,
    ServerPort,
    Protocol,
    BytesSent,
    BytesReceived,
    SessionTime,
    Status,
    Connection,
    Pid,
    Hostname,
    NginxVersion,
    LimitConnStatus,
    Msec,
    TimeLocal,
    TimeIso8601,
    UpstreamAddr,
    UpstreamBytesSent,
    UpstreamBytesReceived,
    UpstreamConnectTime,
    UpstreamFirstByteTime,
    UpstreamSessionTime,
    SslPrereadServerName,
    SslPrereadAlpnProtocols,
    ProxyProtocolAddr,
    ProxyProtocolPort,
    ProxyProtocolServerAddr,
    ProxyProtocolServerPort,
    /// `$proxy_protocol_tlv_NAME` (`conn::proxy_tlv`).
    ProxyProtocolTlv(crate::conn::proxy_tlv::Tlv),
    RealipRemoteAddr,
    RealipRemotePort,
    SslPrereadProtocol,
    /// `$server_name`: the first name of the server serving the session (the one SNI
    /// chose, else the address's default).
    ServerName,
    /// `$ssl_*` of `listen ... ssl` (the http side's, `tls::vars`).
    Ssl(crate::tls::vars::SslVar),
    /// A `map`'s result (index into [`Maps`]), or a `set` variable's.
    Map(usize),
    /// `$1`..`$9` of the last regex match.
    Capture(u8),
    /// A named capture (index into [`Maps`]' named captures).
    Named(usize),
}

impl Var {
    pub fn from_name(name: &str) -> Option<Var> {
        Some(match name {
            "remote_addr" => Var::RemoteAddr,
            "remote_port" => Var::RemotePort,
            "binary_remote_addr" => Var::BinaryRemoteAddr,
            "server_addr" => Var::ServerAddr,
            "server_port" => Var::ServerPort,
            "protocol" => Var::Protocol,
            "bytes_sent" => Var::BytesSent,
            "bytes_received" => Var::BytesReceived,
            "session_time" => Var::SessionTime,
            "status" => Var::Status,
            "connection" => Var::Connection,
            "pid" => Var::Pid,
            "hostname" => Var::Hostname,
            "nginx_version" => Var::NginxVersion,
            "limit_conn_status" => Var::LimitConnStatus,
            "msec" => Var::Msec,
            "time_local" => Var::TimeLocal,
            "time_iso8601" => Var::TimeIso8601,
            "upstream_addr" => Var::UpstreamAddr,
            "upstream_bytes_sent" => Var::UpstreamBytesSent,
            "upstream_bytes_received" => Var::UpstreamBytesReceived,
            "upstream_connect_time" => Var::UpstreamConnectTime,
            "upstream_first_byte_time" => Var::UpstreamFirstByteTime,
            "upstream_session_time" => Var::UpstreamSessionTime,
            "ssl_preread_server_name" => Var::SslPrereadServerName,
            "ssl_preread_alpn_protocols" => Var::SslPrereadAlpnProtocols,
            "proxy_protocol_addr" => Var::ProxyProtocolAddr,
            "proxy_protocol_port" => Var::ProxyProtocolPort,
            "proxy_protocol_server_addr" => Var::ProxyProtocolServerAddr,
            "proxy_protocol_server_port" => Var::ProxyProtocolServerPort,
            "realip_remote_addr" => Var::RealipRemoteAddr,
            "realip_remote_port" => Var::RealipRemotePort,
            "ssl_preread_protocol" => Var::SslPrereadProtocol,
            "server_name" => Var::ServerName,
            _ if name.starts_with("proxy_protocol_tlv_") => {
                Var::ProxyProtocolTlv(crate::conn::proxy_tlv::Tlv::from_var_name(name)?)
            }
            _ => Var::Ssl(
                name.strip_prefix("ssl_")
                    .and_then(crate::tls::vars::SslVar::from_name)
                    .filter(|v| v.in_stream())?,
            ),
        })
    }
}

/// One upstream attempt, for the `$upstream_*` lists (`, `-separated as nginx writes them).
#[derive(Debug, Default, Clone)]
pub struct Attempt {
    /// The server's address (shared with the group's, not copied per session).
    pub addr: std::sync::Arc<str>,
    pub sent: u64,
    pub received: u64,
    /// Seconds to connect; `None`: the connect failed ("-").
    pub connect: Option<f64>,
    pub first_byte: Option<f64>,
    pub session: Option<f64>,
}

/// What a stream session's variables read.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub udp: bool,
    /// A client of `listen unix:`: no address (`peer` is 0.0.0.0:0), `$remote_addr` is
    /// `unix:`, and `geo` sees 255.255.255.255, as nginx's.
    pub unix: bool,
    /// The connection's own client was a unix one when `set_real_ip_from` replaced it.
    pub realip_unix: bool,
    pub start: Instant,
    /// To the client, from the client.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub status: u16,
    pub attempts: Vec<Attempt>,
    /// `None` until a ClientHello was read (the variables are then "not found": `-` in
    /// a log line, as nginx writes them).
    pub sni: Option<String>,
    pub alpn: Option<String>,
    /// The highest version the ClientHello offered (`$ssl_preread_protocol`).
    pub preread_protocol: &'static str,
    /// The PROXY protocol header of `listen ... proxy_protocol`.
    pub proxy_protocol: Option<std::sync::Arc<crate::conn::proxy_protocol::ProxyAddrs>>,
    /// The connection's own client address when `set_real_ip_from` replaced it.
    pub realip_from: Option<SocketAddr>,
    /// The handshake of `listen ... ssl`. Boxed: a plain session has none, and the
    /// session lives in the session's future, which is copied whole (counted: ~120 bytes
    /// less per copy, docs/bench/l4-proxy-report.md).
    pub tls: Option<Box<crate::tls::TlsInfo>>,
    /// `$limit_conn_status` (nginx's order): 0 before any limit counted the session,
    /// then PASSED, REJECTED, REJECTED_DRY_RUN.
    pub limit_conn_status: u8,
    /// What the last `map` regex captured (read by `$1`.., named captures).
    pub captured: std::cell::RefCell<super::map::Captured>,
    /// The values `set` gave, by variable index (empty without any `set`).
    pub set_values: Vec<Option<String>>,
    /// `$server_name` (the serving server's `core::Server::name`).
    pub server_name: Option<std::sync::Arc<str>>,
    /// How many times `pass` has handed this connection on before (`stream::pass`).
    pub passes: u8,
}

impl Session {
    pub fn new(id: u64, peer: SocketAddr, local: SocketAddr, udp: bool) -> Session {
        Session {
            id,
            peer,
            local,
            udp,
            unix: false,
            realip_unix: false,
            // The turn's time (`runtime::clock`), as nginx's session start.
            start: crate::runtime::clock::now(),
            bytes_sent: 0,
            bytes_received: 0,
            status: 200,
            attempts: Vec::new(),
            sni: None,
            alpn: None,
            preread_protocol: "",
            proxy_protocol: None,
            realip_from: None,
            tls: None,
            limit_conn_status: 0,
            captured: Default::default(),
            set_values: Vec::new(),
            server_name: None,
            passes: 0,
        }
    }
}

impl Session {
    /// The client's address; `None` for a unix client.
    pub fn client_ip(&self) -> Option<std::net::IpAddr> {
        (!self.unix).then(|| crate::http::cidr::unmapped(self.peer.ip()))
    }

    /// The client as log lines name it: its address, or `unix:`.
    pub fn client_text(&self) -> String {
        match self.client_ip() {
            Some(ip) => ip.to_string(),
            None => "unix:".to_string(),
        }
    }

    /// The client with its port (`unix:` for a unix one).
    pub fn peer_text(&self) -> String {
        match self.unix {
            true => "unix:".to_string(),
            false => self.peer.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
}

/// A string with stream `$variables`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Compile `src` (`$name`, `${name}`); a name that is neither built in nor a `map`'s
    /// is nginx's "unknown variable".
    pub fn compile(src: &str, maps: &Maps) -> Result<Template, String> {
        use crate::http::variables::{pieces, Piece};
        let parts = pieces(src, true, |name| {
            let digit = name.parse::<u8>().ok().filter(|_| name.len() == 1);
            Var::from_name(name)
                .or_else(|| digit.map(Var::Capture))
                .or_else(|| maps.index(name).map(Var::Map))
                .or_else(|| maps.named_capture(name).map(Var::Named))
                .ok_or_else(|| format!("unknown \"{name}\" variable"))
        })?;
        let parts = parts
            .into_iter()
            .map(|p| match p {
                Piece::Lit(s) => Part::Lit(s),
                Piece::Var(v) => Part::Var(v),
            })
            .collect();
        Ok(Template { parts })
    }

    /// Whether any part is a variable.
    pub fn has_vars(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Var(_)))
    }

    /// Text without variables (a `$` in it is a `$`).
    pub fn literal(text: &str) -> Template {
        Template {
            parts: vec![Part::Lit(text.to_string())],
        }
    }

    pub fn eval(&self, s: &Session, maps: &Maps) -> String {
        let mut out = String::new();
        self.append_to(&mut out, s, maps, 0);
        out
    }

    /// `depth`: how many maps deep the evaluation is (a map whose value reads itself stops).
    pub fn append_to(&self, out: &mut String, s: &Session, maps: &Maps, depth: usize) {
        for p in &self.parts {
            match p {
                Part::Lit(l) => out.push_str(l),
                Part::Var(v) => append(out, v, s, maps, depth),
            }
        }
    }
}

impl Template {
    /// For a log line: literals as written, each variable's value through `escape`; a
    /// variable without a value is `missing` (nginx: `-`, nothing with `escape=json` or
    /// `none`).
    pub fn append_log(
        &self,
        out: &mut String,
        (s, maps): (&Session, &Maps),
        missing: &str,
        escape: impl Fn(&str, &mut String),
    ) {
        let mut v = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(l) => out.push_str(l),
                Part::Var(var) if !found(var, s) => out.push_str(missing),
                Part::Var(var) => {
                    v.clear();
                    append(&mut v, var, s, maps, 0);
                    escape(&v, out);
                }
            }
        }
    }
}

/// Whether the variable has a value (nginx's `not_found` otherwise): the upstream ones
/// once a server was tried, the `ssl_preread` ones once a ClientHello was read, the
/// `ssl` ones after a handshake.
fn found(v: &Var, s: &Session) -> bool {
    match v {
        Var::UpstreamAddr
        | Var::UpstreamBytesSent
        | Var::UpstreamBytesReceived
        | Var::UpstreamConnectTime
        | Var::UpstreamFirstByteTime
        | Var::UpstreamSessionTime => !s.attempts.is_empty(),
        Var::SslPrereadServerName | Var::SslPrereadAlpnProtocols | Var::SslPrereadProtocol => {
            s.sni.is_some()
        }
        // As nginx's stream ssl module: `$ssl_protocol` and `$ssl_cipher` are found on any
        // TLS session, the others only when not empty.
        Var::Ssl(v) => s.tls.as_ref().is_some_and(|t| {
            use crate::tls::vars::SslVar;
            if matches!(v, SslVar::Protocol | SslVar::Cipher) {
                return true;
            }
            let mut value = String::new();
            v.append(&mut value, t);
            !value.is_empty()
        }),
        Var::ProxyProtocolAddr
        | Var::ProxyProtocolPort
        | Var::ProxyProtocolServerAddr
        | Var::ProxyProtocolServerPort => s.proxy_protocol.is_some(),
        Var::ProxyProtocolTlv(t) => t.append(s.proxy_protocol.as_deref(), &mut String::new()),
        Var::LimitConnStatus => s.limit_conn_status != 0,
        Var::Named(i) => s.captured.borrow().named(*i).is_some(),
        _ => true,
    }
}

fn secs(out: &mut String, t: f64) {
    let _ = write!(out, "{t:.3}");
}

/// `$upstream_*` lists: one entry per attempt, `, `-separated.
fn list(out: &mut String, s: &Session, f: impl Fn(&mut String, &Attempt)) {
    for (i, a) in s.attempts.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        f(out, a);
    }
}

fn opt_secs(out: &mut String, t: Option<f64>) {
    match t {
        Some(t) => secs(out, t),
        None => out.push('-'),
    }
}

fn append(out: &mut String, v: &Var, s: &Session, maps: &Maps, depth: usize) {
    match v {
        Var::RemoteAddr => out.push_str(&s.client_text()),
        Var::RemotePort if s.unix => {}
        Var::RemotePort => {
            let _ = write!(out, "{}", s.peer.port());
        }
        Var::BinaryRemoteAddr => match s.client_ip() {
            // Bytes as Latin-1 characters, as the HTTP side writes binary values.
            Some(std::net::IpAddr::V4(a)) => out.extend(a.octets().iter().map(|&b| b as char)),
            Some(std::net::IpAddr::V6(a)) => out.extend(a.octets().iter().map(|&b| b as char)),
            None => {}
        },
        Var::ServerAddr => {
            let _ = write!(out, "{}", crate::http::cidr::unmapped(s.local.ip()));
        }
        Var::ServerPort => {
            let _ = write!(out, "{}", s.local.port());
        }
        Var::Protocol => out.push_str(if s.udp { "UDP" } else { "TCP" }),
        Var::BytesSent => {
            let _ = write!(out, "{}", s.bytes_sent);
        }
        Var::BytesReceived => {
            let _ = write!(out, "{}", s.bytes_received);
        }
        Var::SessionTime => secs(out, s.start.elapsed().as_secs_f64()),
        Var::Status => {
            let _ = write!(out, "{}", s.status);
        }
        Var::Connection => {
            let _ = write!(out, "{}", s.id);
        }
        Var::Pid => {
            let _ = write!(out, "{}", std::process::id());
        }
        Var::Hostname => out.push_str(&hostname()),
        Var::NginxVersion => out.push_str(env!("CARGO_PKG_VERSION")),
        Var::LimitConnStatus => out.push_str(match s.limit_conn_status {
            1 => "PASSED",
            2 => "REJECTED",
            3 => "REJECTED_DRY_RUN",
            _ => "",
        }),
        Var::Msec => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let _ = write!(out, "{}.{:03}", now.as_secs(), now.subsec_millis());
        }
        Var::TimeLocal => crate::runtime::clock::append_time_local(out),
        Var::TimeIso8601 => crate::runtime::clock::append_time_iso8601(out),
        Var::UpstreamAddr => list(out, s, |o, a| o.push_str(&a.addr)),
        Var::UpstreamBytesSent => list(out, s, |o, a| {
            let _ = write!(o, "{}", a.sent);
        }),
        Var::UpstreamBytesReceived => list(out, s, |o, a| {
            let _ = write!(o, "{}", a.received);
        }),
        Var::UpstreamConnectTime => list(out, s, |o, a| opt_secs(o, a.connect)),
        Var::UpstreamFirstByteTime => list(out, s, |o, a| opt_secs(o, a.first_byte)),
        Var::UpstreamSessionTime => list(out, s, |o, a| opt_secs(o, a.session)),
        Var::SslPrereadServerName => out.push_str(s.sni.as_deref().unwrap_or_default()),
        Var::SslPrereadAlpnProtocols => out.push_str(s.alpn.as_deref().unwrap_or_default()),
        Var::ProxyProtocolAddr => pp(out, s, |p, o| o.push_str(&p.addr)),
        Var::ProxyProtocolPort => pp(out, s, |p, o| {
            let _ = write!(o, "{}", p.port);
        }),
        Var::ProxyProtocolServerAddr => pp(out, s, |p, o| o.push_str(&p.server_addr)),
        Var::ProxyProtocolServerPort => pp(out, s, |p, o| {
            let _ = write!(o, "{}", p.server_port);
        }),
        Var::ProxyProtocolTlv(t) => {
            t.append(s.proxy_protocol.as_deref(), out);
        }
        Var::RealipRemoteAddr if s.realip_unix || (s.unix && s.realip_from.is_none()) => {
            out.push_str("unix:")
        }
        Var::RealipRemotePort if s.realip_unix || (s.unix && s.realip_from.is_none()) => {}
        Var::RealipRemoteAddr => {
            let a = s.realip_from.unwrap_or(s.peer);
            let _ = write!(out, "{}", crate::http::cidr::unmapped(a.ip()));
        }
        Var::RealipRemotePort => {
            let _ = write!(out, "{}", s.realip_from.unwrap_or(s.peer).port());
        }
        Var::SslPrereadProtocol => out.push_str(s.preread_protocol),
        Var::ServerName => out.push_str(s.server_name.as_deref().unwrap_or_default()),
        Var::Ssl(v) => {
            if let Some(t) = &s.tls {
                v.append(out, t);
            }
        }
        Var::Map(i) => match s.set_values.get(*i) {
            Some(Some(v)) => out.push_str(v),
            _ => maps.append(*i, out, s, depth),
        },
        Var::Capture(n) => out.push_str(s.captured.borrow().group((*n).into())),
        Var::Named(i) => out.push_str(s.captured.borrow().named(*i).unwrap_or_default()),
    }
}

fn pp(
    out: &mut String,
    s: &Session,
    f: impl Fn(&crate::conn::proxy_protocol::ProxyAddrs, &mut String),
) {
    if let Some(p) = &s.proxy_protocol {
        f(p, out);
    }
}

pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer it is given.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
