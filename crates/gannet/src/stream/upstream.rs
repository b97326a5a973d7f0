//! `upstream NAME { ... }` in the stream context (nginx's ngx_stream_upstream_module with
//! its round-robin, `hash`, `least_conn` and `random` methods). The group is parsed and
//! balanced by the HTTP side's code (`crate::upstream`): `server ADDRESS [weight=N]
//! [max_fails=N] [fail_timeout=T] [max_conns=N] [backup] [down]`, and the same arithmetic.
//! What differs is `hash KEY`: its key reads stream variables, so it is compiled here and
//! evaluated by the session ([`Group::hash_key`]); and the HTTP-only directives
//! (`ip_hash`, `keepalive*`, `queue`) are refused as nginx's stream module has none.

use super::map::Maps;
use super::variables::{Session, Template};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

#[derive(Debug)]
pub struct Group {
    pub group: Arc<crate::upstream::Upstream>,
    /// `hash KEY`'s key, in stream variables.
    pub key: Option<Template>,
    /// Each server's address parsed once (`None`: a unix socket, or a name), so that a
    /// session's connect does not parse its text again (~340 instructions).
    pub socks: Vec<Option<std::net::SocketAddr>>,
}

/// The servers' addresses, parsed (see [`Group::socks`]).
fn socks(group: &crate::upstream::Upstream) -> Vec<Option<std::net::SocketAddr>> {
    let parse = |a: &crate::upstream::Addr| match a {
        crate::upstream::Addr::Tcp(t) => t.parse().ok(),
        crate::upstream::Addr::Unix(_) => None,
    };
    group.servers.iter().map(|s| parse(&s.addr)).collect()
}

impl Group {
    pub fn hash_key(&self, s: &Session, maps: &Maps) -> Option<String> {
        self.key.as_ref().map(|k| k.eval(s, maps))
    }
}

/// The stream upstream directives the HTTP parser knows but nginx's stream module has not.
const HTTP_ONLY: &[&str] = &[
    "ip_hash",
    "keepalive",
    "keepalive_timeout",
    "keepalive_requests",
    "keepalive_time",
    "queue",
];

pub fn parse(d: &Directive, maps: &Maps) -> Result<Group, ConfError> {
    if d.args.len() != 1 || d.block.is_none() {
        return Err(d.error("invalid number of arguments in \"upstream\" directive"));
    }
    let mut d = d.clone();
    let mut key = None;
    for s in d.block.iter_mut().flatten() {
        if HTTP_ONLY.contains(&s.name.as_str()) {
            return Err(s.error(format!("unknown directive \"{}\"", s.name)));
        }
        if s.name == "hash" && !s.args.is_empty() {
            key = Some(Template::compile(&s.args[0], maps).map_err(|e| s.error(e))?);
            // The HTTP parser checks the rest of the line; its key template is unused.
            s.args[0] = "stream".to_string();
        }
    }
    let group = crate::upstream::parse(&d, &(None, None))?;
    Ok(Group {
        socks: socks(&group),
        group: Arc::new(group),
        key,
    })
}

/// The group of `proxy_pass ADDRESS`: one server, as nginx makes an implicit upstream.
pub fn implicit(d: &Directive, addr: &str) -> Result<Group, ConfError> {
    let a = crate::upstream::Addr::parse(addr).ok_or_else(|| {
        if addr.contains(':') {
            d.error(format!("invalid upstream \"{addr}\""))
        } else {
            d.error(format!("no port in upstream \"{addr}\""))
        }
    })?;
    Ok(single(a))
}

/// A group of one server with nginx's defaults (`proxy_pass ADDRESS`).
pub fn single(addr: crate::upstream::Addr) -> Group {
    of_addrs(&addr.to_string(), vec![addr])
}

/// A round-robin group of servers with nginx's defaults (`proxy_pass $var` naming an
/// address, or a name and the addresses it resolved to).
pub fn of_addrs(name: &str, addrs: Vec<crate::upstream::Addr>) -> Group {
    let group = crate::upstream::Upstream::of_addrs(name, addrs);
    Group {
        socks: socks(&group),
        group: Arc::new(group),
        key: None,
    }
}
