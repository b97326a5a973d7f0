//! `set_real_ip_from` in the stream context (nginx's ngx_stream_realip_module): a session
//! whose connection comes from a trusted address and opened with a PROXY protocol header
//! (`listen ... proxy_protocol`) takes the header's client address and port as
//! `$remote_addr` / `$remote_port` (what `allow`/`deny`, `limit_conn`, `hash` and the
//! PROXY line to the upstream then see); `$realip_remote_addr` / `$realip_remote_port`
//! keep the connection's own.

use super::variables::Session;
use crate::http::cidr::{unmapped, Cidr};
use gannet_conf::{ConfError, Directive};

#[derive(Debug, Clone, Default)]
pub struct Trusted {
    from: Vec<Cidr>,
    /// `set_real_ip_from unix:`: clients of `listen unix:` are trusted.
    unix: bool,
}

impl Trusted {
    /// `set_real_ip_from ADDRESS[/BITS] | HOSTNAME | unix:` (a name: each address it
    /// resolves to at load, as the http module's).
    pub fn add(&mut self, d: &Directive, notices: &mut Vec<String>) -> Result<(), ConfError> {
        if d.args.len() != 1 {
            return Err(d.error("invalid number of arguments in \"set_real_ip_from\" directive"));
        }
        if d.args[0] == "unix:" {
            self.unix = true;
            return Ok(());
        }
        let nets = crate::modules::realip::trusted(d, &d.args[0], notices)?;
        self.from.extend(nets);
        Ok(())
    }

    /// Whether a connection from `peer` (`unix`: over a unix socket) is trusted.
    pub fn trusts(&self, peer: std::net::SocketAddr, unix: bool) -> bool {
        match unix {
            true => self.unix,
            false => self.from.iter().any(|n| n.contains(unmapped(peer.ip()))),
        }
    }

    /// Take the PROXY header's client address when the connection is trusted.
    pub fn apply(&self, s: &mut Session) {
        if self.from.is_empty() && !self.unix {
            return;
        }
        let Some(client) = s.proxy_protocol.as_ref().and_then(|p| p.client()) else {
            return;
        };
        if self.trusts(s.peer, s.unix) {
            s.realip_from = Some(s.peer);
            s.realip_unix = s.unix;
            s.peer = client;
            s.unix = false;
        }
    }
}
