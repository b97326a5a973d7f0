//! What `limit_req` and `limit_conn` share: their zones (`limit_req_zone`,
//! `limit_conn_zone`, http level), the `zone=name:size` argument, the settings every limit
//! module has (`*_dry_run`, `*_log_level`, `*_status`), and the order they run in.
//!
//! A zone here is a table behind a mutex, shared by all the worker threads, where nginx has
//! a shared-memory zone shared by its worker processes. The size is kept as nginx's measure
//! of how many clients the zone remembers (its documentation's 16,000 limit_req states or
//! 32,000 limit_conn states per megabyte). Zones are made afresh by a reload: counters and
//! rates start again from zero, where nginx keeps a zone whose name and size did not change.

use super::{limit_conn, limit_req, LoadCtx};
use crate::errlog::Level;
use crate::http::flow::Flow;
use crate::http::request::Request;
use gannet_conf::{setters, ConfError, Directive};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The zones the http block declares, by name (one namespace for both kinds, as nginx's
/// shared memory zones have).
#[derive(Default)]
pub struct Zones {
    pub req: HashMap<String, Arc<limit_req::ReqZone>>,
    pub conn: HashMap<String, Arc<limit_conn::ConnZone>>,
}

impl Zones {
    fn taken(&self, name: &str) -> bool {
        self.req.contains_key(name) || self.conn.contains_key(name)
    }
}

/// The zone directives, read before the rest of the http block so that a limit may name a
/// zone declared further down, as in nginx.
pub fn is_zone(name: &str) -> bool {
    matches!(name, "limit_req_zone" | "limit_conn_zone")
}

/// `zone=name:size` (argument `i`): the name and how many keys fit in `size` at
/// `per_mb` keys per megabyte. nginx's smallest zone is 8 pages (32 KiB).
pub fn parse_zone(
    d: &Directive,
    arg: &str,
    per_mb: usize,
    ctx: &LoadCtx,
) -> Result<(String, usize), ConfError> {
    let invalid = || d.error(format!("invalid zone size \"{arg}\""));
    let spec = arg.strip_prefix("zone=").ok_or_else(invalid)?;
    let (name, size) = spec.split_once(':').ok_or_else(invalid)?;
    let size = setters::size(size).ok_or_else(invalid)?;
    if size < 8 * 4096 {
        return Err(d.error(format!("zone \"{arg}\" is too small")));
    }
    if name.is_empty() {
        return Err(d.error(format!("invalid zone name \"{arg}\"")));
    }
    if ctx.zones.taken(name) {
        return Err(d.error(format!(
            "the shared memory zone \"{name}\" is already declared"
        )));
    }
    let keys = (size as u128 * per_mb as u128 / (1 << 20)) as usize;
    Ok((name.to_string(), keys.max(1)))
}

/// A zone's `redis=name` and `fail_open | fail_closed` (gannet's), after nginx's `n`
/// arguments: the server (`None` without `redis=`) and whether it fails open (the default).
pub fn redis_args(
    d: &Directive,
    n: usize,
    ctx: &LoadCtx,
) -> Result<(Option<Arc<super::redis::Server>>, bool), ConfError> {
    let extra = d.args.get(n..).unwrap_or_default();
    if !extra.iter().any(|a| a.starts_with("redis=")) {
        return Err(d.error(if extra.is_empty() {
            return Ok((None, true));
        } else if extra.iter().any(|a| a == "fail_open" || a == "fail_closed") {
            "\"fail_open\" and \"fail_closed\" need \"redis=\"".to_string()
        } else {
            format!("invalid number of arguments in \"{}\" directive", d.name)
        }));
    }
    let mut server = None;
    let mut fail_open = true;
    for a in extra {
        if let Some(name) = a.strip_prefix("redis=") {
            let s = ctx.redis.get(name).cloned();
            server = Some(s.ok_or_else(|| d.error(format!("unknown redis_server \"{name}\"")))?);
        } else if a == "fail_open" || a == "fail_closed" {
            fail_open = a == "fail_open";
        } else {
            return Err(d.error(format!("invalid parameter \"{a}\"")));
        }
    }
    Ok((server, fail_open))
}

/// A level's limits of one kind with their settings: the list is inherited by a level that
/// has none of its own, the settings one by one.
#[derive(Debug, Clone)]
pub struct Limits<L> {
    pub list: Option<Arc<Vec<L>>>,
    pub policy: Policy,
}

impl<L> Default for Limits<L> {
    fn default() -> Self {
        Limits {
            list: None,
            policy: Policy::default(),
        }
    }
}

impl<L> Limits<L> {
    pub fn merge(&mut self, parent: &Limits<L>) {
        if self.list.is_none() {
            self.list = parent.list.clone();
        }
        self.policy.merge(&parent.policy);
    }
}

/// The settings both limit modules have, inherited one by one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy {
    pub dry_run: Option<bool>,
    pub log_level: Option<Level>,
    pub status: Option<u16>,
}

impl Policy {
    pub fn merge(&mut self, parent: &Policy) {
        super::inherit!(self, parent, dry_run, log_level, status);
    }
    pub fn dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }
    /// Where refusals are logged (`error` by default).
    pub fn log_level(&self) -> Level {
        self.log_level.unwrap_or(Level::Error)
    }
    /// The status of a refusal (503 by default).
    pub fn status(&self) -> u16 {
        self.status.unwrap_or(503)
    }

    /// `*_dry_run`, `*_log_level` or `*_status` (the name's ending says which).
    pub fn set(&mut self, d: &Directive) -> Result<(), ConfError> {
        if d.name.ends_with("_dry_run") {
            self.dry_run = Some(setters::flag(d)?);
        } else if d.name.ends_with("_log_level") {
            let v = setters::arg(d, 0)?;
            match v {
                "info" | "notice" | "warn" | "error" => self.log_level = Level::parse(v),
                _ => return Err(super::invalid(d, v)),
            }
        } else {
            let v = setters::arg(d, 0)?;
            let code = setters::num(v).ok_or_else(|| super::invalid(d, v))?;
            if !(400..=599).contains(&code) {
                return Err(d.error("value must be between 400 and 599"));
            }
            self.status = Some(code as u16);
        }
        Ok(())
    }
}

/// The pre-access phase: `limit_req`, then `limit_conn` (nginx runs them in this order; a
/// request `limit_req` delays is counted by `limit_conn` once its delay is over).
pub fn check(req: &mut Request) -> Option<Flow> {
    limit_req::check(req).or_else(|| limit_conn::check(req))
}

/// A zone's table, also when a worker panicked while holding it (the table is only ever
/// left consistent: every change is a single insert, update or remove).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key a limit counts by: `None` (the limit does not apply) when it is empty or, with
/// an error logged as nginx does, longer than `max`.
pub fn key(
    req: &Request,
    template: &crate::http::variables::Template,
    src: &str,
    max: usize,
) -> Option<String> {
    let key = template.eval(req, None);
    if key.is_empty() {
        return None;
    }
    if key.len() > max {
        crate::errlog::request(
            Level::Error,
            req,
            format_args!("the value of the \"{src}\" key is more than {max} bytes: \"{key}\""),
        );
        return None;
    }
    Some(key)
}
