//! Access by client address, as nginx's access module: `allow` and `deny` (http, server,
//! location, `limit_except`), and `limit_except METHOD ... { ... }` (location), which
//! puts the other methods under the rules of its block.
//!
//! Rules are `address`, `address/bits` (IPv4 or IPv6), `unix:` or `all`, checked in order
//! against `$remote_addr` (an IPv4-mapped IPv6 client as its IPv4 address); the first that
//! matches decides, a `deny` answering 403, and none matching lets the request through.
//! A level with rules of its own replaces the outer level's, it does not add to them.
//!
//! `limit_except` is a nested configuration, like nginx's: it inherits everything from
//! its location, and a request whose method is not listed (GET includes HEAD) is served
//! with it instead of the location's. As in nginx, the location's rewrite statements and
//! `try_files` are not part of it. Inside it `allow`, `deny`,
//! `auth_basic`, `access_log` and `proxy_pass` are allowed, as in nginx; `satisfy` (http, server, location) says how they combine.
//!
//! The check runs after the location's rewrite statements (a `return` is not subject to
//! it, as in nginx) and before the content handlers.

use super::auth_basic::{self, Auth};
use super::auth_request::{self, Subrequest};
use super::{LoadCtx, LocConf};
use crate::errlog::Level;
use crate::http::cidr::{self, Cidr};
use crate::http::flow::Flow;
use crate::http::request::Request;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use gannet_proto::h1::Method;
use std::net::IpAddr;
use std::sync::Arc;

const RULE_CTX: Ctx = Ctx::HSL.or(Ctx::LIMIT_EXCEPT);

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "allow",
        ctx: RULE_CTX,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "deny",
        ctx: RULE_CTX,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "limit_except",
        ctx: Ctx::LOCATION,
        args: Args::AtLeast(1),
        block: true,
    },
    Spec {
        name: "satisfy",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

/// Who a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    All,
    Net(Cidr),
    /// Clients on a UNIX-domain socket (gannet listens on none, so it never matches).
    Unix,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    deny: bool,
    who: Who,
}

/// `limit_except`: the methods it leaves alone, and the settings for every other one.
#[derive(Debug, Clone)]
pub struct LimitExcept {
    /// Upper-case method names; GET brings HEAD.
    pub allowed: Vec<&'static str>,
    pub conf: Arc<LocConf>,
}

#[derive(Debug, Clone, Default)]
pub struct AccessConf {
    rules: Option<Arc<Vec<Rule>>>,
    /// This location's `limit_except` (not inherited by nested locations, as in nginx).
    pub limit_except: Option<Arc<LimitExcept>>,
    /// `satisfy any` (else `all`).
    satisfy_any: Option<bool>,
}

impl AccessConf {
    pub fn merge(&mut self, parent: &AccessConf) {
        // Rules are inherited only by a level without any of its own.
        if self.rules.is_none() {
            self.rules = parent.rules.clone();
        }
        super::inherit!(self, parent, satisfy_any);
    }

    /// The first rule matching the client: `Some(true)` if it denies, `Some(false)` if it
    /// allows, `None` when there are no rules or none matches.
    /// `peer` is `None` for a `listen unix:` client, which only `unix:` and `all` match.
    fn matching(&self, peer: Option<IpAddr>) -> Option<bool> {
        let rules = self.rules.as_ref()?;
        let peer = peer.map(cidr::unmapped);
        rules
            .iter()
            .find(|r| match (&r.who, peer) {
                (Who::All, _) => true,
                (Who::Net(c), Some(ip)) => c.contains(ip),
                (Who::Net(_), None) => false,
                (Who::Unix, p) => p.is_none(),
            })
            .map(|r| r.deny)
    }
}

/// The methods `limit_except` can name, as nginx has them.
const METHODS: &[&str] = &[
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "MKCOL",
    "COPY",
    "MOVE",
    "OPTIONS",
    "PROPFIND",
    "PROPPATCH",
    "LOCK",
    "UNLOCK",
    "PATCH",
];

impl LimitExcept {
    /// Whether the request's method is one the block applies to. The method is the one
    /// the phases act on: an `error_page` fetch is a GET.
    fn applies(&self, req: &Request) -> bool {
        let method = match req.method_override {
            Some(Method::Get) => "GET",
            _ => req.head.method_str(),
        };
        !self.allowed.contains(&method)
    }
}

/// The methods of a `limit_except` line (case-insensitive, as nginx reads them).
pub fn limit_except_methods(d: &Directive) -> Result<Vec<&'static str>, ConfError> {
    let mut allowed = Vec::new();
    for a in &d.args {
        let m = METHODS
            .iter()
            .find(|m| m.eq_ignore_ascii_case(a))
            .ok_or_else(|| d.error(format!("invalid method \"{a}\"")))?;
        allowed.push(*m);
        if *m == "GET" {
            allowed.push("HEAD");
        }
    }
    Ok(allowed)
}

/// After `lc` has been merged with its parents: its `limit_except` block inherits from it
/// what it did not set, including the application it passes to (as an `if` does).
pub fn merge_limit_except(lc: &mut LocConf) {
    let Some(mut lx) = lc.access.limit_except.take() else {
        return;
    };
    let inner = Arc::make_mut(&mut Arc::make_mut(&mut lx).conf);
    inner.merge(lc);
    super::rewrite::inherit_handler(inner, lc);
    lc.access.limit_except = Some(lx);
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if d.name == "satisfy" {
        lc.access.satisfy_any = Some(match d.args[0].as_str() {
            "all" => false,
            "any" => true,
            v => return Err(super::invalid(d, v)),
        });
        return Ok(());
    }
    let rule = Rule {
        deny: d.name == "deny",
        who: parse_who(d, ctx)?,
    };
    let mut rules = lc.access.rules.as_deref().cloned().unwrap_or_default();
    rules.push(rule);
    lc.access.rules = Some(Arc::new(rules));
    Ok(())
}

/// `all`, `unix:`, `address` or `address/bits`. Bits set past the prefix are cleared with
/// nginx's warning.
fn parse_who(d: &Directive, ctx: &mut LoadCtx) -> Result<Who, ConfError> {
    let arg = d.args[0].as_str();
    match arg {
        "all" => return Ok(Who::All),
        "unix:" => return Ok(Who::Unix),
        _ => {}
    }
    let (net, meaningful) =
        Cidr::parse(arg).ok_or_else(|| d.error(format!("invalid parameter \"{arg}\"")))?;
    if !meaningful {
        ctx.notices.push(format!(
            "{}: low address bits of {arg} are meaningless",
            d.loc
        ));
    }
    Ok(Who::Net(net))
}

/// The access phase: the address rules, then `auth_basic`, then `auth_request` (nginx runs
/// its access handlers in that order). With `satisfy all` (the default) a request must pass
/// each (the first refusal is the answer); with `satisfy any` an `allow` rule that matches,
/// good credentials or an `auth_request` that allows let it in, and when none does, a 401
/// wins over a 403, as in nginx (whose `access forbidden by rule` is then not logged).
/// `auth_request` needs its subrequest answered first: the phases stop at
/// [`Flow::AuthRequest`] and go on in [`auth_answered`].
///
/// Subrequests (`auth_request`'s own) skip the phase, as nginx's do.
pub fn check(req: &mut Request) -> Option<Flow> {
    if req.subrequest {
        return None;
    }
    let rule = (req.conf.access.rules.is_some())
        .then(|| {
            req.conf
                .access
                .matching((!req.unix_client()).then(|| req.client().ip()))
        })
        .flatten();
    let uri = req.conf.auth_request.uri().cloned();
    let ask = |denied| uri.map(|uri| Flow::AuthRequest(Box::new(Subrequest::new(uri, denied))));
    if req.conf.access.satisfy_any != Some(true) {
        if rule == Some(true) {
            crate::errlog::request(Level::Error, req, format_args!("access forbidden by rule"));
            return Some(Flow::Status(403));
        }
        if let Some(refused) = auth_basic::check(req).refusal() {
            return Some(refused);
        }
        return ask(None);
    }
    if rule == Some(false) {
        return None;
    }
    let denied = match auth_basic::check(req) {
        Auth::Passed => return None,
        Auth::Refused(Flow::Status(401)) => Some(401),
        // A user file that cannot be read ends the phase whatever else would allow.
        Auth::Refused(flow) => return Some(flow),
        Auth::Off => (rule == Some(true)).then_some(403),
    };
    ask(denied).or(denied.map(Flow::Status))
}

/// The access phase once `auth_request`'s subrequest has answered: its variables set, its
/// verdict combined with what the rules and `auth_basic` said (see [`check`]).
pub fn auth_answered(req: &mut Request, sub: &Subrequest) -> Option<Flow> {
    auth_request::apply_args(req, &sub.answer);
    let status = sub.answer.status;
    if req.conf.access.satisfy_any != Some(true) {
        return auth_request::verdict(req, &sub.answer);
    }
    match status {
        200..=299 => {
            // Let in: a challenge auth_basic made is not sent with whatever comes next.
            req.auth_challenge.clear();
            None
        }
        401 | 403 => {
            let refused = auth_request::verdict(req, &sub.answer);
            if sub.denied == Some(401) {
                Some(Flow::Status(401))
            } else {
                refused
            }
        }
        _ => auth_request::verdict(req, &sub.answer),
    }
}

/// The settings a request is served with in its location: the `limit_except` block's when
/// its method is one the block is about.
pub fn limited_conf(req: &Request) -> Option<Arc<LocConf>> {
    let lx = req.conf.access.limit_except.as_ref()?;
    lx.applies(req).then(|| lx.conf.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    impl AccessConf {
        fn denies(&self, peer: IpAddr) -> bool {
            self.matching(Some(peer)) == Some(true)
        }
    }

    fn conf(rules: &[(bool, Who)]) -> AccessConf {
        AccessConf {
            rules: Some(Arc::new(
                rules
                    .iter()
                    .map(|&(deny, who)| Rule { deny, who })
                    .collect(),
            )),
            limit_except: None,
            satisfy_any: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse()
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
    }

    fn net(s: &str) -> Who {
        Who::Net(Cidr::parse(s).map_or(Cidr::V4 { net: 0, bits: 32 }, |(c, _)| c))
    }

    #[test]
    fn first_match_decides() {
        let ten = net("10.0.0.0/8");
        let c = conf(&[(false, ten), (true, Who::All)]);
        assert!(!c.denies(ip("10.1.2.3")));
        assert!(c.denies(ip("11.0.0.1")));
        assert!(c.denies(ip("::1")));
        // An IPv4-mapped client is judged by its IPv4 address.
        assert!(!c.denies(ip("::ffff:10.0.0.9")));
        let v6 = net("2001:db8::/32");
        let c = conf(&[(true, v6), (true, Who::Unix)]);
        assert!(c.denies(ip("2001:db8::5")));
        assert!(!c.denies(ip("2001:db9::5")));
        assert!(!c.denies(ip("127.0.0.1")));
        assert!(!AccessConf::default().denies(ip("127.0.0.1")));
        // A unix client: only `unix:` and `all` apply to it.
        assert_eq!(c.matching(None), Some(true));
        let open = conf(&[(false, net("0.0.0.0/0")), (true, Who::All)]);
        assert_eq!(open.matching(None), Some(true));
    }
}
