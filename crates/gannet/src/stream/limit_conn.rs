//! `limit_conn_zone` / `limit_conn` / `limit_conn_log_level` / `limit_conn_dry_run` in the
//! stream context (nginx's ngx_stream_limit_conn_module): sessions per key value (usually
//! `$binary_remote_addr`) open at once, counted across all workers (the zone is one table
//! shared by the worker threads, as nginx's shared memory is). A session over a limit ends
//! at once with `$status` 503 and nginx's "limiting connections by zone" line; with
//! `limit_conn_dry_run on` it is only counted as rejected. An empty key is not limited. The
//! check runs before `allow`/`deny`, as nginx's preaccess phase does.

use super::variables::{Session, Template};
use crate::errlog::Level;
use gannet_conf::{setters, ConfError, Directive};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub struct Zone {
    name: String,
    key: Template,
    counts: Mutex<HashMap<String, u64>>,
}

#[derive(Debug, Clone)]
pub struct Limits {
    limits: Vec<(Arc<Zone>, u64)>,
    /// Set at this level (a server's first `limit_conn` drops the inherited ones).
    own: bool,
    pub level: Level,
    pub dry_run: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            limits: Vec::new(),
            own: false,
            level: Level::Error,
            dry_run: false,
        }
    }
}

/// A session's place in its zones, given back when the session ends.
pub struct Held {
    taken: Vec<(Arc<Zone>, String)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        for (zone, key) in &self.taken {
            let mut counts = zone.counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = counts.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(key);
                }
            }
        }
    }
}

/// `limit_conn_zone KEY zone=NAME:SIZE` (stream level).
pub fn zone(d: &Directive, maps: &super::map::Maps) -> Result<Arc<Zone>, ConfError> {
    if d.args.len() != 2 {
        return Err(d.error("invalid number of arguments in \"limit_conn_zone\" directive"));
    }
    let key = Template::compile(&d.args[0], maps).map_err(|e| d.error(e))?;
    let spec = d.args[1]
        .strip_prefix("zone=")
        .ok_or_else(|| d.error(format!("invalid parameter \"{}\"", d.args[1])))?;
    let (name, size) = spec
        .split_once(':')
        .ok_or_else(|| d.error(format!("invalid zone size \"{spec}\"")))?;
    if name.is_empty() || setters::size(size).is_none_or(|n| n < 8192) {
        return Err(d.error(format!("invalid zone size \"{size}\"")));
    }
    Ok(Arc::new(Zone {
        name: name.to_string(),
        key,
        counts: Mutex::default(),
    }))
}

impl Limits {
    /// `limit_conn`, `limit_conn_log_level`, `limit_conn_dry_run`.
    pub fn set(
        &mut self,
        d: &Directive,
        zones: &HashMap<String, Arc<Zone>>,
        in_server: bool,
    ) -> Result<(), ConfError> {
        let nargs = |n: usize| {
            if d.args.len() == n {
                Ok(())
            } else {
                Err(d.error(format!(
                    "invalid number of arguments in \"{}\" directive",
                    d.name
                )))
            }
        };
        match d.name.as_str() {
            "limit_conn" => {
                nargs(2)?;
                let zone = zones
                    .get(&d.args[0])
                    .ok_or_else(|| d.error(format!("unknown limit_conn_zone \"{}\"", d.args[0])))?;
                let n = setters::num(&d.args[1]).filter(|&n| n > 0).ok_or_else(|| {
                    d.error(format!("invalid number of connections \"{}\"", d.args[1]))
                })?;
                if in_server && !self.own {
                    self.limits.clear();
                }
                self.own = in_server;
                if self.limits.iter().any(|(z, _)| Arc::ptr_eq(z, zone)) {
                    return Err(d.error("\"limit_conn\" directive is duplicate"));
                }
                self.limits.push((zone.clone(), n));
            }
            "limit_conn_log_level" => {
                nargs(1)?;
                self.level = match d.args[0].as_str() {
                    "info" => Level::Info,
                    "notice" => Level::Notice,
                    "warn" => Level::Warn,
                    "error" => Level::Error,
                    v => return Err(d.error(format!("invalid value \"{v}\""))),
                };
            }
            _ => {
                nargs(1)?;
                self.dry_run = setters::flag(d)?;
            }
        }
        Ok(())
    }

    /// A server's copy of the stream level's limits.
    pub fn inherited(&self) -> Limits {
        Limits {
            own: false,
            ..self.clone()
        }
    }

    /// Count the session in each zone; `Err(())` when a limit is reached (`$status` 503).
    /// Sets `$limit_conn_status`; a dry run's rejection gives back the places taken so far
    /// and stops counting, as nginx's cleanup does.
    pub fn enter(&self, s: &mut Session, maps: &super::map::Maps) -> Result<Held, ()> {
        let mut held = Held { taken: Vec::new() };
        for (zone, max) in &self.limits {
            let key = zone.key.eval(s, maps);
            if key.is_empty() || key.len() > 255 {
                continue;
            }
            s.limit_conn_status = 1;
            let mut counts = zone.counts.lock().unwrap_or_else(|e| e.into_inner());
            let n = counts.get(&key).copied().unwrap_or(0);
            if n >= *max {
                drop(counts);
                crate::errlog::log(
                    self.level,
                    format_args!(
                        "*{} limiting connections{} by zone \"{}\", client: {}, server: {}",
                        s.id,
                        if self.dry_run { ", dry run," } else { "" },
                        zone.name,
                        s.client_text(),
                        s.local
                    ),
                );
                drop(held);
                if self.dry_run {
                    s.limit_conn_status = 3;
                    return Ok(Held { taken: Vec::new() });
                }
                s.limit_conn_status = 2;
                return Err(());
            }
            counts.insert(key.clone(), n + 1);
            held.taken.push((zone.clone(), key));
        }
        Ok(held)
    }
}
