//! `allow` / `deny` in stream and server (nginx's ngx_stream_access_module): the rules in
//! order, the first that matches the client's address decides; a denied session ends at
//! once with `$status` 403 and nginx's error-log line. A server with rules of its own
//! does not inherit the stream level's.

use crate::http::cidr::{unmapped, Cidr};
use gannet_conf::{ConfError, Directive};
use std::net::IpAddr;

#[derive(Debug, Clone, Copy)]
enum Who {
    All,
    Unix,
    Net(Cidr),
}

#[derive(Debug, Clone, Copy)]
struct Rule {
    deny: bool,
    who: Who,
}

#[derive(Debug, Clone, Default)]
pub struct Rules {
    rules: Vec<Rule>,
}

impl Rules {
    /// Add an `allow` / `deny` line.
    pub fn add(&mut self, d: &Directive) -> Result<(), ConfError> {
        if d.args.len() != 1 {
            return Err(d.error(format!(
                "invalid number of arguments in \"{}\" directive",
                d.name
            )));
        }
        let arg = d.args[0].as_str();
        let who = match arg {
            "all" => Who::All,
            "unix:" => Who::Unix,
            _ => {
                let (net, _) = Cidr::parse(arg)
                    .ok_or_else(|| d.error(format!("invalid parameter \"{arg}\"")))?;
                Who::Net(net)
            }
        };
        self.rules.push(Rule {
            deny: d.name == "deny",
            who,
        });
        Ok(())
    }

    /// Whether the client may go on; `None` for a unix-socket client's address.
    pub fn allows(&self, ip: Option<IpAddr>) -> bool {
        for r in &self.rules {
            let hit = match (r.who, ip) {
                (Who::All, _) => true,
                (Who::Unix, None) => true,
                (Who::Net(n), Some(ip)) => n.contains(unmapped(ip)),
                _ => false,
            };
            if hit {
                return !r.deny;
            }
        }
        true
    }
}
