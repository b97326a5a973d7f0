//! The cache directives every gateway protocol has (nginx's `proxy_cache*`,
//! `fastcgi_cache*`, `scgi_cache*`, `uwsgi_cache*`, from ngx_http_upstream.c and each
//! protocol's module): `*_cache_path` (http level), `*_cache`, `*_cache_key`,
//! `*_cache_valid`, `*_cache_methods`, `*_cache_min_uses`, `*_cache_bypass`, `*_no_cache`,
//! `*_cache_use_stale`, `*_cache_lock`, `*_cache_lock_age`, `*_cache_lock_timeout`,
//! `*_cache_revalidate`, `*_cache_max_range_offset`, `*_cache_background_update`, and
//! nginx Plus's `*_cache_purge`. The
//! cache itself is in `crate::cache`, its request side in `conn::gateway_cache`.
//!
//! Every setting is inherited by a level that has none of its own, as in nginx.

use super::gateway::Proto;
use super::{inherit, invalid, LoadCtx, LocConf};
use crate::cache::Zone;
use crate::http::request::Request;
use crate::http::variables::Template;
use gannet_conf::{setters, ConfError, Directive, Loc};
use std::sync::Arc;
use std::time::Duration;

/// `*_cache_use_stale` conditions, as bits.
pub mod stale {
    pub const ERROR: u16 = 1;
    pub const TIMEOUT: u16 = 2;
    pub const INVALID_HEADER: u16 = 4;
    pub const UPDATING: u16 = 8;
    pub const HTTP_500: u16 = 16;
    pub const HTTP_502: u16 = 32;
    pub const HTTP_503: u16 = 64;
    pub const HTTP_504: u16 = 128;
    pub const HTTP_403: u16 = 256;
    pub const HTTP_404: u16 = 512;
    pub const HTTP_429: u16 = 1024;
}

/// `*_cache_methods` bits: nginx knows GET, HEAD and POST here; GET and HEAD are always in.
pub const GET: u8 = 1;
pub const HEAD: u8 = 2;
pub const POST: u8 = 4;

/// What `*_cache` names.
#[derive(Debug, Clone)]
pub enum CacheRef {
    Off,
    Zone(Arc<Zone>),
    /// A name with variables, looked up per request among the http block's zones.
    Vars(Arc<Template>, Arc<crate::cache::path::Zones>),
}

#[derive(Debug, Clone, Default)]
pub struct CacheConf {
    /// `*_cache NAME`, `off`, or a name with variables.
    pub zone: Option<CacheRef>,
    pub key: Option<Arc<Template>>,
    /// `*_cache_valid`: (status, seconds); status 0 is `any`.
    pub valid: Option<Arc<Vec<(u16, i64)>>>,
    pub methods: Option<u8>,
    pub min_uses: Option<u64>,
    pub bypass: Option<Arc<Vec<Template>>>,
    pub no_cache: Option<Arc<Vec<Template>>>,
    pub use_stale: Option<u16>,
    pub lock: Option<bool>,
    pub lock_age: Option<Duration>,
    pub lock_timeout: Option<Duration>,
    pub revalidate: Option<bool>,
    /// `*_cache_max_range_offset`: a range request starting at or past this offset is
    /// passed to the upstream with its Range, and its answer not stored.
    pub max_range_offset: Option<u64>,
    /// `*_cache_purge`: a request for which one of these is set (not empty, not "0")
    /// removes its key's entry (or, for a key ending with `*`, every entry the rest
    /// starts).
    pub purge: Option<Arc<Vec<Template>>>,
    /// `*_cache_background_update`: an expired entry served as `STALE` while a background
    /// request refreshes it (with `*_cache_use_stale updating`).
    pub background_update: Option<bool>,
}

impl CacheConf {
    pub fn merge(&mut self, parent: &CacheConf) {
        inherit!(
            self,
            parent,
            zone,
            key,
            valid,
            methods,
            min_uses,
            bypass,
            no_cache,
            use_stale,
            lock,
            lock_age,
            lock_timeout,
            revalidate,
            max_range_offset,
            purge,
            background_update,
        );
    }
    /// Whether the location caches (in a zone, or one its variables name).
    pub fn enabled(&self) -> bool {
        matches!(self.zone, Some(CacheRef::Zone(_) | CacheRef::Vars(..)))
    }
    /// The zone this request caches in: `None` for none (`off`, or variables that give
    /// an empty value or `off`); `Err` with nginx's log line for a name no zone has.
    pub fn zone_for(&self, req: &Request) -> Result<Option<Arc<Zone>>, String> {
        match &self.zone {
            None | Some(CacheRef::Off) => Ok(None),
            Some(CacheRef::Zone(z)) => Ok(Some(z.clone())),
            Some(CacheRef::Vars(t, zones)) => {
                let v = t.eval(req, None);
                if v.is_empty() || v == "off" {
                    return Ok(None);
                }
                zones
                    .get(&v)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| format!("cache \"{v}\" not found"))
            }
        }
    }
    pub fn methods(&self) -> u8 {
        self.methods.unwrap_or(0) | GET | HEAD
    }
    pub fn min_uses(&self) -> u64 {
        self.min_uses.unwrap_or(1)
    }
    pub fn use_stale(&self) -> u16 {
        self.use_stale.unwrap_or(0)
    }
    pub fn lock(&self) -> bool {
        self.lock.unwrap_or(false)
    }
    pub fn lock_age(&self) -> Duration {
        self.lock_age.unwrap_or(Duration::from_secs(5))
    }
    pub fn revalidate(&self) -> bool {
        self.revalidate.unwrap_or(false)
    }
    /// Whether the request's Range starts too far for its answer to be stored (nginx's
    /// `ngx_http_upstream_cache_check_range`: a suffix range always is; with 0, any range).
    pub fn range_too_far(&self, req: &Request) -> bool {
        let (Some(max), Some(r)) = (self.max_range_offset, req.head.header("range")) else {
            return false;
        };
        if max == 0 {
            return true;
        }
        if r.len() < 7 || !r[..6].eq_ignore_ascii_case(b"bytes=") {
            return false;
        }
        let p = r[6..].trim_ascii_start();
        if p.first() == Some(&b'-') {
            return true;
        }
        let digits = p.iter().take_while(|b| b.is_ascii_digit()).count();
        let offset = std::str::from_utf8(&p[..digits])
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(if digits > 0 { u64::MAX } else { 0 });
        offset >= max
    }
    pub fn background_update(&self) -> bool {
        self.background_update.unwrap_or(false)
    }
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout.unwrap_or(Duration::from_secs(5))
    }
}

/// The `*_cache_path` directives, read before the rest of the http block: a `*_cache`
/// above one may name its zone, as in nginx.
pub fn is_path(name: &str) -> bool {
    Proto::ALL
        .iter()
        .any(|p| name.strip_prefix(p.prefix()) == Some("cache_path"))
}

/// Apply `d` (its name without the protocol's prefix is `suffix`) if it is a cache
/// directive; false if it is not one.
pub fn set(
    d: &Directive,
    suffix: &str,
    c: &mut CacheConf,
    ctx: &mut LoadCtx,
) -> Result<bool, ConfError> {
    let a0 = d.args[0].as_str();
    let templates = |d: &Directive| -> Result<Vec<Template>, ConfError> {
        d.args
            .iter()
            .map(|a| Template::compile(a).map_err(|e| d.error(e)))
            .collect()
    };
    match suffix {
        "cache_path" => {
            let mut zone = crate::cache::path::parse(d, &ctx.prefix, &ctx.redis)?;
            if ctx.caches.contains_key(&zone.name) {
                return Err(d.error(format!("duplicate zone \"{}\"", zone.name)));
            }
            ctx.temp_dirs.push(zone.dir.clone());
            super::metrics::cache::register(ctx, &mut zone);
            let zone = Arc::new(zone);
            super::metrics::cache::loaded(&zone);
            ctx.caches.insert(zone.name.clone(), zone);
        }
        "cache" => {
            if c.zone.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            c.zone =
                Some(if a0 == "off" {
                    CacheRef::Off
                } else if a0.contains('$') {
                    let t = Template::compile(a0).map_err(|e| d.error(e))?;
                    CacheRef::Vars(Arc::new(t), Arc::new(ctx.caches.clone()))
                } else {
                    CacheRef::Zone(ctx.caches.get(a0).cloned().ok_or_else(|| {
                        d.error(format!("\"{}\" zone \"{a0}\" is unknown", d.name))
                    })?)
                });
        }
        "cache_key" => {
            if c.key.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            c.key = Some(Arc::new(Template::compile(a0).map_err(|e| d.error(e))?));
        }
        "cache_valid" => {
            let (last, codes) = d.args.split_last().unwrap_or((&d.args[0], &[]));
            let secs = setters::sec(last)
                .ok_or_else(|| d.error(format!("invalid time value \"{last}\"")))?;
            let secs = i64::try_from(secs).unwrap_or(i64::MAX / 2);
            let mut l = c.valid.as_deref().cloned().unwrap_or_default();
            if codes.is_empty() {
                l.extend([200, 301, 302].map(|s| (s, secs)));
            }
            for code in codes {
                let s = match code.as_str() {
                    "any" => 0,
                    n => n
                        .parse::<u16>()
                        .ok()
                        .filter(|s| (200..=599).contains(s))
                        .ok_or_else(|| d.error(format!("invalid status \"{n}\"")))?,
                };
                l.push((s, secs));
            }
            c.valid = Some(Arc::new(l));
        }
        "cache_methods" => {
            let mut m = 0;
            for a in &d.args {
                m |= match a.to_ascii_uppercase().as_str() {
                    "GET" => GET,
                    "HEAD" => HEAD,
                    "POST" => POST,
                    _ => return Err(d.error(format!("invalid value \"{a}\""))),
                };
            }
            c.methods = Some(m);
        }
        "cache_min_uses" => c.min_uses = Some(setters::num_arg(d, 0)?.max(1)),
        "cache_bypass" => {
            let mut l = c.bypass.as_deref().cloned().unwrap_or_default();
            l.extend(templates(d)?);
            c.bypass = Some(Arc::new(l));
        }
        "no_cache" => {
            let mut l = c.no_cache.as_deref().cloned().unwrap_or_default();
            l.extend(templates(d)?);
            c.no_cache = Some(Arc::new(l));
        }
        "cache_use_stale" => {
            let mut bits = 0;
            for a in &d.args {
                bits |= match a.as_str() {
                    "error" => stale::ERROR,
                    "timeout" => stale::TIMEOUT,
                    "invalid_header" => stale::INVALID_HEADER,
                    "updating" => stale::UPDATING,
                    "http_500" => stale::HTTP_500,
                    "http_502" => stale::HTTP_502,
                    "http_503" => stale::HTTP_503,
                    "http_504" => stale::HTTP_504,
                    "http_403" => stale::HTTP_403,
                    "http_404" => stale::HTTP_404,
                    "http_429" => stale::HTTP_429,
                    "off" => 0,
                    _ => return Err(invalid(d, a)),
                };
            }
            c.use_stale = Some(bits);
        }
        "cache_lock" => c.lock = Some(setters::flag(d)?),
        "cache_revalidate" => c.revalidate = Some(setters::flag(d)?),
        "cache_max_range_offset" => c.max_range_offset = Some(setters::offset_arg(d, 0)?),
        "cache_background_update" => c.background_update = Some(setters::flag(d)?),
        "cache_purge" => {
            let mut l = c.purge.as_deref().cloned().unwrap_or_default();
            l.extend(templates(d)?);
            c.purge = Some(Arc::new(l));
        }
        "cache_lock_age" => {
            c.lock_age = Some(Duration::from_millis(setters::msec_arg(d, 0)?));
        }
        "cache_lock_timeout" => {
            c.lock_timeout = Some(Duration::from_millis(setters::msec_arg(d, 0)?));
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// nginx's merge-time warning: the proxy has a default key, the other protocols none (all
/// their requests then share the empty key, as in nginx).
pub fn finish(lc: &LocConf, ctx: &mut LoadCtx, at: &Loc) {
    for p in Proto::ALL {
        let c = &super::gateway::conf(lc, p).cache;
        if p != Proto::Http && c.enabled() && c.key.is_none() {
            ctx.warnings.push(format!(
                "no \"{0}cache_key\" for \"{0}cache\" in {at}",
                p.prefix()
            ));
        }
    }
}

/// The key of a request without `*_cache_key`: the proxy's default
/// `$scheme$proxy_host$request_uri`, the others' empty one.
pub fn default_key(p: Proto) -> &'static Template {
    static KEY: std::sync::OnceLock<Template> = std::sync::OnceLock::new();
    static EMPTY: std::sync::OnceLock<Template> = std::sync::OnceLock::new();
    if p != Proto::Http {
        return EMPTY.get_or_init(|| Template::literal(""));
    }
    KEY.get_or_init(|| {
        Template::compile("$scheme$proxy_host$request_uri")
            .unwrap_or_else(|_| Template::literal(""))
    })
}
