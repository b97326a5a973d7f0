//! `pass ADDRESS` (nginx 1.25.5's ngx_stream_pass_module): the server's content handler
//! hands the client's connection to another listening socket of the same configuration -
//! an http, stream or mail `listen` - as if it had been accepted there, with ADDRESS as
//! its local address. A stream `server` can so pick the real listener by SNI
//! (`ssl_preread` or its own `listen ... ssl`) before http sees the connection.
//!
//! ADDRESS is `IP:PORT`, `[IPv6]:PORT` or `unix:PATH`, fixed or from variables (then
//! parsed per session); a name is not resolved. It matches a listen of the same address
//! and port, or a wildcard listen (`*:PORT`, `[::]:PORT`) of the same family and port.
//! As nginx: a UDP session, a session with data already read off the connection (`ssl_preread`
//! over `listen ... ssl` reads; over a plain connection it only peeks), a value that is not
//! an address with a port, or more than 10 passes of one connection end the session with
//! 500; an address no listen has ends it with 200 (`port not found for "..."`). A passed
//! session writes no access log line of its own; the connection goes on under the
//! listener it was passed to.
//!
//! A connection whose TLS the stream server terminated goes on as that TLS session; gannet
//! passes one only to an http listener (to a stream or mail one: 500, logged).

use super::variables::{Session, Template};
use crate::runtime::worker::Worker;
use gannet_conf::{ConfError, Directive};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// nginx's NGX_STREAM_PASS_MAX_PASSES.
const MAX_PASSES: u8 = 10;

/// `pass`'s argument.
#[derive(Debug, Clone)]
pub enum Pass {
    Fixed(Target),
    Var(Template),
}

/// Where a connection is passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Inet(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Inet(a) => write!(f, "{a}"),
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `pass ADDRESS` (server level only; `stream::core::apply` refuses it above).
pub fn set(
    d: &Directive,
    pass: &mut Option<Pass>,
    maps: &super::map::Maps,
) -> Result<(), ConfError> {
    if d.args.len() != 1 {
        return Err(d.error("invalid number of arguments in \"pass\" directive"));
    }
    if pass.is_some() {
        return Err(d.error("\"pass\" directive is duplicate"));
    }
    let arg = &d.args[0];
    let t = Template::compile(arg, maps).map_err(|e| d.error(e))?;
    if t.has_vars() {
        *pass = Some(Pass::Var(t));
        return Ok(());
    }
    *pass = Some(Pass::Fixed(parse(arg).map_err(|e| {
        d.error(match e {
            Bad::Url(why) => format!("{why} in \"{arg}\" of the \"pass\" directive"),
            Bad::NoAddresses => "\"pass\" directive has no addresses".into(),
            Bad::NoPort => "\"pass\" directive has no port".into(),
        })
    })?));
    Ok(())
}

/// Why an address does not do, as nginx's `ngx_parse_url` (with `no_resolve`) says it.
#[derive(Debug, PartialEq, Eq)]
enum Bad {
    /// Its own words ("invalid port", "invalid host"...).
    Url(&'static str),
    /// A name: not resolved, so no address.
    NoAddresses,
    NoPort,
}

fn parse(url: &str) -> Result<Target, Bad> {
    if let Some(path) = url.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(Bad::Url("no path in the unix domain socket"));
        }
        return Ok(Target::Unix(PathBuf::from(path)));
    }
    if url.is_empty() {
        return Err(Bad::Url("no host"));
    }
    if url.contains(['/', '?']) {
        return Err(Bad::Url("invalid host"));
    }
    let (host, port) = if let Some(rest) = url.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or(Bad::Url("invalid host"))?;
        let port = match tail {
            "" => None,
            t => Some(t.strip_prefix(':').ok_or(Bad::Url("invalid host"))?),
        };
        let ip = host
            .parse::<std::net::Ipv6Addr>()
            .map_err(|_| Bad::Url("invalid IPv6 address"))?;
        (Some(IpAddr::V6(ip)), port)
    } else {
        let (host, port) = match url.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (url, None),
        };
        (
            host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4),
            port,
        )
    };
    let port = match port {
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(Bad::Url("invalid port")),
        },
        None => None,
    };
    let ip = host.ok_or(Bad::NoAddresses)?;
    let port = port.ok_or(Bad::NoPort)?;
    Ok(Target::Inet(SocketAddr::new(ip, port)))
}

/// What the content phase does with a session's connection.
pub enum Handoff {
    /// Passed on: the session is over without a log line.
    Passed,
    /// The session ends with this `$status` (logged).
    End(u16),
}

/// The connection to hand over: its socket, or the TLS session the stream server
/// terminated on it.
pub enum Conn {
    Plain(std::net::TcpStream),
    /// Boxed: the TLS state is kilobytes, the plain socket a descriptor.
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

/// nginx's `ngx_stream_pass_handler`: find the listen for the session's pass target and
/// give it the connection (`preread`: bytes already taken off the connection).
pub fn handler(
    w: &Rc<Worker>,
    pass: &Pass,
    srv: &super::core::Server,
    conn: Conn,
    preread: bool,
    s: &mut Session,
) -> Handoff {
    if preread {
        return fail(s, format_args!("cannot pass connection with preread data"));
    }
    let target = match pass {
        Pass::Fixed(t) => t.clone(),
        Pass::Var(t) => {
            let url = t.eval(s, &srv.maps);
            match parse(&url) {
                Ok(t) => t,
                Err(Bad::Url(why)) => return fail(s, format_args!("{why} in pass \"{url}\"")),
                Err(Bad::NoAddresses) => {
                    return fail(s, format_args!("no addresses in pass \"{url}\""))
                }
                Err(Bad::NoPort) => return fail(s, format_args!("no port in pass \"{url}\"")),
            }
        }
    };
    if s.passes >= MAX_PASSES {
        return fail(s, format_args!("stream pass cycle"));
    }
    let Some(found) = find(w, &target) else {
        crate::errlog::error(format_args!(
            "*{} port not found for \"{target}\" while passing connection to port, client: {}, server: {}",
            s.id,
            s.client_text(),
            s.local
        ));
        return Handoff::End(200);
    };
    let local = match &target {
        Target::Inet(a) => *a,
        // A unix listener's connections have no address of their own.
        Target::Unix(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let (peer, passes) = (s.peer, s.passes + 1);
    let w = w.clone();
    match (found, conn) {
        (Found::Http(group), Conn::Plain(tcp)) => {
            tokio::task::spawn_local(crate::conn::h1::serve_passed(w, tcp, peer, group, local));
        }
        (Found::Http(group), Conn::Tls(tls)) => {
            let Some(info) = s.tls.take() else {
                return fail(s, format_args!("no TLS session to pass"));
            };
            tokio::task::spawn_local(crate::conn::h1::serve_passed_tls(
                w, *tls, *info, peer, group, local,
            ));
        }
        (Found::Stream(idx), Conn::Plain(tcp)) => {
            tokio::task::spawn_local(super::core::serve_passed(w, tcp, peer, idx, local, passes));
        }
        (Found::Mail(idx), Conn::Plain(tcp)) => {
            tokio::task::spawn_local(crate::mail::handler::serve_passed(w, tcp, peer, idx, local));
        }
        (_, Conn::Tls(_)) => {
            return fail(
                s,
                format_args!("cannot pass TLS connection to a non-http listener \"{target}\""),
            )
        }
    }
    Handoff::Passed
}

/// `pass` in a UDP session: nothing to hand over (nginx: 500).
pub fn udp(s: &mut Session) {
    crate::errlog::error(format_args!(
        "*{} cannot pass udp connection while passing connection to port, udp client: {}, server: {}",
        s.id,
        s.client_text(),
        s.local
    ));
    s.status = 500;
}

/// Log why the session cannot be passed, as nginx words it; it ends with 500.
fn fail(s: &Session, why: std::fmt::Arguments) -> Handoff {
    crate::errlog::error(format_args!(
        "*{} {why} while passing connection to port, client: {}, server: {}",
        s.id,
        s.client_text(),
        s.local
    ));
    Handoff::End(500)
}

/// The listener a connection is passed to.
enum Found {
    /// An http listening group.
    Http(usize),
    /// A stream listen (index into `StreamConf::listens`).
    Stream(usize),
    /// A mail listen.
    Mail(usize),
}

/// nginx's `ngx_stream_pass_match` over every TCP listen of the configuration, in nginx's
/// order of its listening sockets: http's, then stream's, then mail's.
fn find(w: &Worker, target: &Target) -> Option<Found> {
    let cfg = &w.config;
    if let Some(i) = cfg.listens.iter().position(|g| matches(&g.listen, target)) {
        return Some(Found::Http(i));
    }
    if let Some(st) = &cfg.stream {
        if let Some(i) = st.listens.iter().position(|l| matches(l, target)) {
            return Some(Found::Stream(i));
        }
    }
    let mail = cfg.mail.as_ref()?;
    mail.listens
        .iter()
        .position(|l| matches(l, target))
        .map(Found::Mail)
}

/// A TCP listen takes the target: the same unix path, the same address and port, or a
/// wildcard of the target's family on its port.
fn matches(l: &crate::config::listen::Listen, target: &Target) -> bool {
    if l.udp || l.quic {
        return false;
    }
    match (target, &l.unix) {
        (Target::Unix(p), Some(path)) => Path::new(&**path) == p,
        (Target::Inet(a), None) => {
            if l.addr.ip().is_unspecified() {
                l.addr.is_ipv4() == a.is_ipv4() && l.addr.port() == a.port()
            } else {
                l.addr == *a
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let inet = |s: &str| Ok(Target::Inet(s.parse().unwrap()));
        assert_eq!(parse("127.0.0.1:8092"), inet("127.0.0.1:8092"));
        assert_eq!(parse("[::1]:443"), inet("[::1]:443"));
        assert_eq!(
            parse("unix:/run/a.sock"),
            Ok(Target::Unix("/run/a.sock".into()))
        );
        assert_eq!(parse("127.0.0.1"), Err(Bad::NoPort));
        assert_eq!(parse("[::1]"), Err(Bad::NoPort));
        assert_eq!(parse("localhost:80"), Err(Bad::NoAddresses));
        assert_eq!(parse("8092"), Err(Bad::NoAddresses));
        for bad in [
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "127.0.0.1:x",
            "127.0.0.1:+1",
            "1.2.3.4:",
        ] {
            assert_eq!(parse(bad), Err(Bad::Url("invalid port")), "{bad}");
        }
        assert_eq!(parse("127.0.0.1:80/x"), Err(Bad::Url("invalid host")));
        assert_eq!(parse("[::1:80"), Err(Bad::Url("invalid host")));
        assert_eq!(parse(""), Err(Bad::Url("no host")));
    }
}
