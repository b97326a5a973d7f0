//! The client address behind trusted proxies, as nginx's ngx_http_realip_module:
//! `set_real_ip_from` (addresses, networks, `unix:`, or host names resolved at load),
//! `real_ip_header` (`X-Real-IP` by default, `X-Forwarded-For`, `proxy_protocol` - the
//! PROXY header of a `listen ... proxy_protocol` connection - or any header) and
//! `real_ip_recursive`, at http, server and location level; `$realip_remote_addr` and
//! `$realip_remote_port` keep the connection's own address.
//!
//! A request from a trusted address takes the last address of the header (with
//! `real_ip_recursive`, the last one from the right that is not trusted itself); from then
//! on it is the client for everything - `$remote_addr`, `$remote_port` (the header's port,
//! or empty), `allow`/`deny`, limit keys, `geo`, `ip_hash`, the logs. As in nginx it is
//! tried twice: with the server's settings before its rewrite statements, and with the
//! location's before `limit_req`; the first that finds an address wins, and the change
//! lasts for the request (internal redirects included), not for the connection.

use super::{inherit, LoadCtx, LocConf};
use crate::http::cidr::{self, Cidr};
use crate::http::request::Request;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "set_real_ip_from",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "real_ip_header",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "real_ip_recursive",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

#[derive(Debug, Clone)]
enum Header {
    XRealIp,
    XForwardedFor,
    /// The connection's PROXY protocol header (`listen ... proxy_protocol`).
    ProxyProtocol,
    /// Any other, lower-cased.
    Named(String),
}

#[derive(Debug, Clone, Default)]
pub struct RealIpConf {
    /// The trusted networks, and whether `unix:` (a `listen unix:` client) is trusted.
    from: Option<Arc<(Vec<Cidr>, bool)>>,
    header: Option<Header>,
    recursive: Option<bool>,
}

impl RealIpConf {
    pub fn merge(&mut self, parent: &RealIpConf) {
        inherit!(self, parent, from, header, recursive);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let arg = d.args[0].as_str();
    let conf = &mut lc.realip;
    match d.name.as_str() {
        "set_real_ip_from" => {
            let mut from = conf.from.as_deref().cloned().unwrap_or_default();
            if arg == "unix:" {
                from.1 = true;
            } else {
                from.0.extend(trusted(d, arg, &mut ctx.notices)?);
            }
            conf.from = Some(Arc::new(from));
        }
        "real_ip_header" => {
            if conf.header.is_some() {
                return Err(d.error("\"real_ip_header\" directive is duplicate"));
            }
            conf.header = Some(match arg {
                "X-Real-IP" => Header::XRealIp,
                "X-Forwarded-For" => Header::XForwardedFor,
                "proxy_protocol" => Header::ProxyProtocol,
                name => Header::Named(name.to_ascii_lowercase()),
            });
        }
        _ => conf.recursive = Some(gannet_conf::setters::flag(d)?),
    }
    Ok(())
}

/// A `set_real_ip_from` address or network, or the addresses a host name resolves to.
pub(crate) fn trusted(
    d: &Directive,
    arg: &str,
    notices: &mut Vec<String>,
) -> Result<Vec<Cidr>, ConfError> {
    if let Some((net, meaningful)) = Cidr::parse(arg) {
        if !meaningful {
            notices.push(format!(
                "{}: low address bits of {arg} are meaningless",
                d.loc
            ));
        }
        return Ok(vec![net]);
    }
    let not_found = || d.error(format!("host not found in set_real_ip_from \"{arg}\""));
    let addrs = (arg, 0).to_socket_addrs().map_err(|_| not_found())?;
    let nets: Vec<Cidr> = addrs
        .filter_map(|a| Cidr::parse(&a.ip().to_string()).map(|(c, _)| c))
        .collect();
    if nets.is_empty() {
        return Err(not_found());
    }
    Ok(nets)
}

/// Look for the client's address with the server's settings (`server_level`) or the
/// location's, unless an earlier look found it already.
pub fn apply(req: &mut Request, server_level: bool) {
    if req.real_peer.is_none() {
        let conf = if server_level {
            &req.server.conf.realip
        } else {
            &req.conf.realip
        };
        req.real_peer = find(req, conf);
    }
}

fn find(req: &Request, conf: &RealIpConf) -> Option<SocketAddr> {
    let from = conf.from.as_ref()?;
    // The first address asked about is the connection's: a unix client is trusted by
    // `unix:` alone (its stand-in address 0.0.0.0 is no network's).
    let peer_is_unix = std::cell::Cell::new(req.conn.unix.is_some());
    let trusted = |a: std::net::IpAddr| {
        if peer_is_unix.replace(false) {
            return from.1;
        }
        from.0.iter().any(|c| c.contains(cidr::unmapped(a)))
    };
    let name = match conf.header.as_ref().unwrap_or(&Header::XRealIp) {
        // The header's client, with its port, when the proxy that sent it is trusted.
        Header::ProxyProtocol => {
            let client = req.conn.proxy.as_ref()?.client()?;
            return trusted(req.conn.peer.ip()).then_some(client);
        }
        Header::XRealIp => "x-real-ip",
        Header::XForwardedFor => "x-forwarded-for",
        Header::Named(n) => n,
    };
    // Every X-Forwarded-For line; of another header, the first.
    let value = if name == "x-forwarded-for" {
        req.x_forwarded_for()?
    } else {
        String::from_utf8_lossy(req.head.header(name)?).into_owned()
    };
    cidr::forwarded(req.conn.peer, &value, trusted, conf.recursive == Some(true))
}

impl Request {
    /// The client's address: the connection's, or the one `real_ip_header` gave.
    pub fn client(&self) -> SocketAddr {
        self.real_peer.unwrap_or(self.conn.peer)
    }

    /// Whether the client is a `listen unix:` connection's, with no address of its own
    /// (none from `real_ip_header` either): nginx's `unix:` for `$remote_addr`.
    pub fn unix_client(&self) -> bool {
        self.real_peer.is_none() && self.conn.unix.is_some()
    }

    /// Every X-Forwarded-For line, in order, as one list (`None` without any), for the
    /// walk from trusted proxy to client (`cidr::forwarded`).
    pub fn x_forwarded_for(&self) -> Option<String> {
        let mut lines = self.head.header_all("x-forwarded-for");
        let mut list = String::from_utf8_lossy(lines.next()?).into_owned();
        for l in lines {
            list.push(',');
            list.push_str(&String::from_utf8_lossy(l));
        }
        Some(list)
    }
}
