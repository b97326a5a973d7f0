//! `proxy_cache_path` (and `fastcgi_`, `scgi_`, `uwsgi_cache_path`), nginx's
//! `ngx_http_file_cache_set_slot`: the folder, its `levels`, the keys zone's name and size,
//! `inactive`, `max_size`, `use_temp_path`. The folder is made by the master for the
//! workers' account, as the temp paths are (`config::temp_dirs`).
//!
//! The keys zone is in shared memory, mapped here while the master loads the config, so
//! one for every worker process ([`super::shm`]); a reload keeps a zone of the same name
//! and size. Its size bounds how many keys it holds (nginx's 8,000 keys per megabyte);
//! `min_free` is kept by the manager with `max_size`; `loader_*` and `manager_*` pace the
//! loader's walk of the folder and the manager's rounds (see [`super::store`]).

use super::shm::Region;
use super::store::Local;
use gannet_conf::{setters, ConfError, Directive};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
pub struct Zone {
    pub name: String,
    pub dir: PathBuf,
    /// Each level's length in hex digits (1 or 2), at most 3 levels.
    pub levels: Vec<u8>,
    /// `inactive`: entries not used this long are removed (10 minutes by default).
    pub inactive: std::time::Duration,
    /// `max_size`: the most the entries may take on disk.
    pub max_size: Option<u64>,
    /// `min_free`: the least free space the cache's file system is to keep; below it the
    /// least recently used entries go, as past `max_size`.
    pub min_free: Option<u64>,
    /// `loader_files`, `loader_sleep`, `loader_threshold`.
    pub loader: Pace,
    /// `manager_files`, `manager_sleep`, `manager_threshold`.
    pub manager: Pace,
    /// `use_temp_path`: write entries in the location's `*_temp_path` first (on, the
    /// default) or in the cache folder itself (off).
    pub use_temp_path: bool,
    /// The keys zone, shared by the worker processes.
    pub shm: Arc<Region>,
    /// The config generation this zone belongs to (for the manager's lease).
    pub gen: u64,
    /// What this worker process keeps for itself.
    pub local: Local,
    /// The zone's key on the `metrics` page (0: nothing counted).
    pub metrics: crate::runtime::metrics::Key,
    /// `redis=name` (gannet's): purges are sent to, and taken from, the other nodes using
    /// that server ([`super::fanout`]).
    pub redis: Option<Arc<crate::modules::redis::Server>>,
}

/// The pace of the loader or the manager, as nginx's: a round handles at most `files`
/// entries and runs at most `threshold`, then the next waits `sleep`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    pub files: u64,
    pub sleep: Duration,
    pub threshold: Duration,
}

impl Default for Pace {
    /// nginx's defaults for both: 100 files, 50 ms, 200 ms.
    fn default() -> Pace {
        Pace {
            files: 100,
            sleep: Duration::from_millis(50),
            threshold: Duration::from_millis(200),
        }
    }
}

impl Zone {
    /// The entry file of `h`.
    pub fn file(&self, h: &super::key::Hash) -> PathBuf {
        super::key::file(&self.dir, &self.levels, h)
    }
}

/// Parse `*_cache_path`; `prefix` completes a relative folder, `redis` has the
/// `redis_server` blocks a `redis=name` may name.
pub fn parse(
    d: &Directive,
    prefix: &std::path::Path,
    redis: &std::collections::HashMap<String, Arc<crate::modules::redis::Server>>,
) -> Result<Zone, ConfError> {
    let mut dir = d.args[0].as_str();
    if dir.len() > 1 {
        dir = dir.strip_suffix('/').unwrap_or(dir);
    }
    let dir = prefix.join(dir);
    let mut levels = Vec::new();
    let mut name = None;
    let mut size = 0u64;
    let mut inactive = std::time::Duration::from_secs(600);
    let mut max_size = None;
    let mut min_free = None;
    let (mut loader, mut manager) = (Pace::default(), Pace::default());
    let mut use_temp_path = true;
    let mut server = None;
    for a in &d.args[1..] {
        let (k, v) = a.split_once('=').unwrap_or((a, ""));
        match k {
            "levels" => {
                let bad = || d.error(format!("invalid \"levels\" \"{a}\""));
                levels.clear();
                for l in v.split(':') {
                    match l {
                        "1" => levels.push(1),
                        "2" => levels.push(2),
                        _ => return Err(bad()),
                    }
                }
                if levels.len() > 3 {
                    return Err(bad());
                }
            }
            "use_temp_path" => {
                use_temp_path = match v {
                    "on" => true,
                    "off" => false,
                    _ => {
                        return Err(d.error(format!(
                            "invalid use_temp_path value \"{v}\", it must be \"on\" or \"off\""
                        )))
                    }
                }
            }
            "keys_zone" => {
                let bad = || d.error(format!("invalid keys zone size \"{a}\""));
                let (n, s) = v.split_once(':').ok_or_else(bad)?;
                if n.is_empty() {
                    return Err(bad());
                }
                size = setters::size(s).ok_or_else(bad)?;
                if size < 2 * 4096 {
                    return Err(d.error(format!("keys zone \"{a}\" is too small")));
                }
                name = Some(n.to_string());
            }
            "inactive" => {
                let s = setters::sec(v)
                    .ok_or_else(|| d.error(format!("invalid inactive value \"{a}\"")))?;
                inactive = std::time::Duration::from_secs(s);
            }
            "max_size" => {
                max_size = Some(
                    setters::size(v)
                        .ok_or_else(|| d.error(format!("invalid max_size value \"{a}\"")))?,
                );
            }
            "redis" => {
                let s = redis.get(v).cloned();
                server = Some(s.ok_or_else(|| d.error(format!("unknown redis_server \"{v}\"")))?);
            }
            "min_free" => {
                min_free = Some(
                    setters::size(v)
                        .ok_or_else(|| d.error(format!("invalid min_free value \"{a}\"")))?,
                );
            }
            "loader_files" | "manager_files" | "loader_sleep" | "loader_threshold"
            | "manager_sleep" | "manager_threshold" => {
                let bad = || d.error(format!("invalid {k} value \"{a}\""));
                let pace = if k.starts_with("loader") {
                    &mut loader
                } else {
                    &mut manager
                };
                match k.split_once('_').map_or("", |(_, what)| what) {
                    "files" => pace.files = setters::num(v).ok_or_else(bad)?,
                    what => {
                        let t = Duration::from_millis(setters::msec(v).ok_or_else(bad)?);
                        if what == "sleep" {
                            pace.sleep = t;
                        } else {
                            pace.threshold = t;
                        }
                    }
                }
            }
            _ => return Err(d.error(format!("invalid parameter \"{a}\""))),
        }
    }
    let Some(name) = name.filter(|_| size > 0) else {
        return Err(d.error(format!("\"{}\" must have \"keys_zone\" parameter", d.name)));
    };
    let (shm, gen) = super::shm::region(&name, size, &dir, &levels).map_err(|e| d.error(e))?;
    Ok(Zone {
        name,
        dir,
        levels,
        inactive,
        max_size,
        min_free,
        loader,
        manager,
        use_temp_path,
        shm,
        gen,
        local: Local::default(),
        metrics: 0,
        redis: server,
    })
}

/// The zones by name, for `*_cache NAME`.
pub type Zones = std::collections::HashMap<String, Arc<Zone>>;
