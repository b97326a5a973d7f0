//! Active health checks, the configuration side (nginx Plus's `health_check` and `match`,
//! which open-source nginx lacks): `health_check [interval=T] [jitter=T] [fails=N]
//! [passes=N] [uri=URI] [port=N] [match=NAME] [mandatory]` in a location that proxies to
//! an `upstream` group, and `match NAME { status ...; header ...; body ...; }` at http
//! level for what a healthy answer looks like (by default: a 2xx or 3xx status).
//!
//! The probes themselves run in `conn::health`; an unhealthy server gets no requests from
//! any worker until it passes again. With `redis=name` (gannet's) a node's verdicts reach
//! the other nodes using that `redis_server` (`conn::health_share`).

use super::{invalid, LoadCtx, LocConf};
use crate::http::regex::Regex;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::cgi::Fields;
use std::sync::Arc;
use std::time::Duration;

pub const DIRECTIVES: &[Spec] = &[super::gateway::spec(
    "health_check",
    Ctx::LOCATION,
    Args::AtLeast(0),
)];

/// One `health_check`.
#[derive(Debug, Clone)]
pub struct HealthCheck {
    pub interval: Duration,
    /// Failed probes in a row that make a server unhealthy.
    pub fails: u32,
    /// Passed probes in a row that make it healthy again.
    pub passes: u32,
    pub uri: String,
    /// Probe this port instead of the server's own.
    pub port: Option<u16>,
    pub matcher: Option<Arc<Match>>,
    /// Servers start unhealthy until their first probe passes.
    pub mandatory: bool,
    /// `redis=name` (gannet's): results are shared with the other nodes through that
    /// server (`conn::health_share`).
    pub redis: Option<Arc<super::redis::Server>>,
}

/// A `match` block: every condition must hold.
#[derive(Debug, Default)]
pub struct Match {
    /// Status ranges; `true` in front negates the whole list (`status ! 500-599`).
    pub status: Option<(bool, Vec<(u16, u16)>)>,
    pub headers: Vec<HeaderCond>,
    pub body: Option<(bool, Regex)>,
}

#[derive(Debug)]
pub enum HeaderCond {
    Present(String, bool),
    Equals(String, bool, String),
    Matches(String, bool, Regex),
}

impl Match {
    /// Whether an answer with this status, headers and body is a healthy one.
    pub fn accepts(&self, status: u16, headers: &Fields, body: &[u8]) -> bool {
        if let Some((neg, ranges)) = &self.status {
            let hit = ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&status));
            if hit == *neg {
                return false;
            }
        }
        let value = |name: &str| headers.get(name);
        for h in &self.headers {
            let ok = match h {
                HeaderCond::Present(n, neg) => value(n).is_some() != *neg,
                HeaderCond::Equals(n, neg, v) => (value(n) == Some(v.as_str())) != *neg,
                HeaderCond::Matches(n, neg, re) => {
                    value(n).is_some_and(|v| re.is_match(v.as_bytes())) != *neg
                }
            };
            if !ok {
                return false;
            }
        }
        match &self.body {
            Some((neg, re)) => re.is_match(body) != *neg,
            None => true,
        }
    }
}

/// Without a `match`: a 2xx or 3xx answer is healthy.
pub fn default_accepts(status: u16) -> bool {
    (200..400).contains(&status)
}

/// Parse a `match NAME { ... }` block.
pub fn parse_match(d: &Directive) -> Result<Match, ConfError> {
    let mut m = Match::default();
    for c in d.block.as_deref().unwrap_or_default() {
        let (neg, args) = match c.args.first().map(String::as_str) {
            Some("!") => (true, &c.args[1..]),
            _ => (false, &c.args[..]),
        };
        match c.name.as_str() {
            "status" => {
                let mut ranges = Vec::new();
                for a in args {
                    let (lo, hi) = a.split_once('-').unwrap_or((a, a));
                    let code = |s: &str| s.parse::<u16>().ok().filter(|c| (100..600).contains(c));
                    match (code(lo), code(hi)) {
                        (Some(lo), Some(hi)) if lo <= hi => ranges.push((lo, hi)),
                        _ => return Err(invalid(c, a)),
                    }
                }
                if ranges.is_empty() {
                    return Err(c.error("invalid number of arguments in \"status\" directive"));
                }
                m.status = Some((neg, ranges));
            }
            "header" => {
                let cond = match args {
                    [name] => HeaderCond::Present(name.clone(), neg),
                    [name, op, v] if op == "=" || op == "!=" => {
                        HeaderCond::Equals(name.clone(), neg ^ (op == "!="), v.clone())
                    }
                    [name, op, re] if op == "~" || op == "!~" => {
                        let re = Regex::new(re, false).map_err(|e| c.error(e))?;
                        HeaderCond::Matches(name.clone(), neg ^ (op == "!~"), re)
                    }
                    _ => return Err(c.error("invalid \"header\" condition in \"match\"")),
                };
                m.headers.push(cond);
            }
            "body" => match args {
                [op, re] if op == "~" || op == "!~" => {
                    let re = Regex::new(re, false).map_err(|e| c.error(e))?;
                    m.body = Some((neg ^ (op == "!~"), re));
                }
                _ => return Err(c.error("invalid \"body\" condition in \"match\"")),
            },
            _ => return Err(c.error(format!("\"{}\" directive is not allowed here", c.name))),
        }
    }
    Ok(m)
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if lc.health_check.is_some() {
        return Err(d.error("\"health_check\" directive is duplicate"));
    }
    let mut hc = HealthCheck {
        interval: Duration::from_secs(5),
        fails: 1,
        passes: 1,
        uri: "/".into(),
        port: None,
        matcher: None,
        mandatory: false,
        redis: None,
    };
    for a in &d.args {
        let bad = || invalid(d, a);
        let (k, v) = a.split_once('=').unwrap_or((a, ""));
        match k {
            "interval" => {
                hc.interval = setters::msec(v)
                    .filter(|&ms| ms > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(bad)?
            }
            // Accepted: gannet probes each server on its own timer already.
            "jitter" => {
                setters::msec(v).ok_or_else(bad)?;
            }
            "fails" => hc.fails = setters::num(v).filter(|&n| n > 0).ok_or_else(bad)? as u32,
            "passes" => hc.passes = setters::num(v).filter(|&n| n > 0).ok_or_else(bad)? as u32,
            "uri" if v.starts_with('/') => hc.uri = v.to_string(),
            "port" => {
                hc.port = Some(v.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(bad)?);
            }
            "match" => {
                let m = ctx
                    .matches
                    .get(v)
                    .ok_or_else(|| d.error(format!("match \"{v}\" not found")))?;
                hc.matcher = Some(m.clone());
            }
            "mandatory" if v.is_empty() => hc.mandatory = true,
            "redis" => {
                let s = ctx.redis.get(v).cloned();
                hc.redis = Some(s.ok_or_else(|| d.error(format!("unknown redis_server \"{v}\"")))?);
            }
            _ => return Err(bad()),
        }
    }
    lc.health_check = Some(Arc::new(hc));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gannet_conf::parse_str;

    fn m(src: &str) -> Match {
        let tree = parse_str(src, "t.conf", std::path::Path::new(".")).unwrap();
        parse_match(&tree[0]).unwrap()
    }

    #[test]
    fn conditions() {
        let ok =
            m("match ok { status 200-299 304; header Content-Type ~ json; body !~ \"error\"; }");
        let json = Fields::from_pairs(&[("content-type", "application/json")]);
        let none = Fields::default();
        assert!(ok.accepts(200, &json, b"{\"fine\":1}"));
        assert!(ok.accepts(304, &json, b""));
        assert!(!ok.accepts(500, &json, b"{}"));
        assert!(!ok.accepts(200, &none, b"{}"));
        assert!(!ok.accepts(200, &json, b"{\"error\":1}"));
        let not5 = m("match n { status ! 500-599; header ! X-Down; }");
        assert!(not5.accepts(404, &none, b""));
        assert!(!not5.accepts(503, &none, b""));
        let down = Fields::from_pairs(&[("X-Down", "1")]);
        assert!(!not5.accepts(200, &down, b""));
        assert!(default_accepts(301) && !default_accepts(404));
    }
}
