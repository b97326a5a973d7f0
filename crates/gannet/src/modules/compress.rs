//! Compression, the configuration side: nginx's gzip and gzip_static modules, and the same
//! settings for Brotli and zstd under the names the widely used ngx_brotli and
//! zstd-nginx-module give them. The filter that uses them is `http::compress`.
//!
//! Directives: `gzip`, `gzip_types`, `gzip_min_length`, `gzip_comp_level`, `gzip_vary`,
//! `gzip_proxied`, `gzip_disable`, `gzip_http_version`, `gzip_buffers` (accepted),
//! `gzip_static`; `brotli`, `brotli_types`, `brotli_min_length`, `brotli_comp_level`,
//! `brotli_static`, `brotli_buffers` and `brotli_window` (accepted); `zstd`, `zstd_types`,
//! `zstd_min_length`, `zstd_comp_level`, `zstd_static`, `zstd_buffers` (accepted).
//!
//! `gzip_vary`, `gzip_proxied`, `gzip_disable` and `gzip_http_version` decide for all three
//! encodings (the Brotli and zstd modules follow the gzip module's settings for these too).

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::regex::Regex;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::sync::Arc;

const LOC_IF: Ctx = Ctx(Ctx::HSL.0 | Ctx::IF.0);

const fn spec(name: &'static str, ctx: Ctx, args: Args) -> Spec {
    Spec {
        name,
        ctx,
        args,
        block: false,
    }
}

/// The table: the settings each encoding has under its own prefix, then the shared ones.
macro_rules! directives {
    ($($p:literal),+) => {
        &[
            $(
                spec($p, LOC_IF, Args::Exactly(1)),
                spec(concat!($p, "_types"), Ctx::HSL, Args::AtLeast(1)),
                spec(concat!($p, "_min_length"), Ctx::HSL, Args::Exactly(1)),
                spec(concat!($p, "_comp_level"), Ctx::HSL, Args::Exactly(1)),
                spec(concat!($p, "_static"), Ctx::HSL, Args::Exactly(1)),
                spec(concat!($p, "_buffers"), Ctx::HSL, Args::Exactly(2)),
            )+
            spec("gzip_vary", Ctx::HSL, Args::Exactly(1)),
            spec("gzip_proxied", Ctx::HSL, Args::AtLeast(1)),
            spec("gzip_disable", Ctx::HSL, Args::AtLeast(1)),
            spec("gzip_http_version", Ctx::HSL, Args::Exactly(1)),
            spec("brotli_window", Ctx::HSL, Args::Exactly(1)),
        ]
    };
}

pub const DIRECTIVES: &[Spec] = directives!("gzip", "brotli", "zstd");

/// A content coding gannet can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip = 0,
    Br = 1,
    Zstd = 2,
}

impl Coding {
    /// Server preference when a client accepts several with the same q-value: Brotli and
    /// zstd compress text better than gzip at the levels servers use.
    pub const PREFERENCE: [Coding; 3] = [Coding::Br, Coding::Zstd, Coding::Gzip];

    /// The Content-Encoding token.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Br => "br",
            Coding::Zstd => "zstd",
        }
    }

    /// The suffix of precompressed files (`*_static`).
    pub fn suffix(self) -> &'static str {
        match self {
            Coding::Gzip => ".gz",
            Coding::Br => ".br",
            Coding::Zstd => ".zst",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Br => "brotli",
            Coding::Zstd => "zstd",
        }
    }

    /// (min, max, default) compression level, as each nginx module has them.
    fn levels(self) -> (u32, u32, u32) {
        match self {
            Coding::Gzip => (1, 9, 1),
            Coding::Br => (0, 11, 6),
            Coding::Zstd => (1, 22, 1),
        }
    }
}

/// `*_static`: serve `file.gz` (`.br`, `.zst`) when it exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Static {
    Off,
    /// When the client accepts the encoding.
    On,
    /// Whatever the client accepts (sites that keep only compressed copies).
    Always,
}

/// The MIME types an encoding applies to; `text/html` always is one, as in nginx.
#[derive(Debug, Clone)]
pub enum Types {
    Any,
    List(Vec<String>),
}

impl Types {
    /// Whether `content_type` (parameters ignored, any case) is listed.
    pub fn matches(&self, content_type: &str) -> bool {
        let mime = content_type.split(';').next().unwrap_or("").trim();
        match self {
            Types::Any => true,
            Types::List(l) => {
                mime.eq_ignore_ascii_case("text/html")
                    || l.iter().any(|t| t.eq_ignore_ascii_case(mime))
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct CodingConf {
    pub on: Option<bool>,
    pub types: Option<Arc<Types>>,
    pub min_length: Option<u64>,
    pub level: Option<u32>,
    pub static_mode: Option<Static>,
}

impl CodingConf {
    fn merge(&mut self, p: &CodingConf) {
        inherit!(self, p, on, types, min_length, level, static_mode);
    }
}

/// `gzip_proxied` flags: which answers to requests that came through a proxy (that carry
/// `Via`) may be compressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Proxied {
    pub any: bool,
    pub expired: bool,
    pub no_cache: bool,
    pub no_store: bool,
    pub private: bool,
    pub no_last_modified: bool,
    pub no_etag: bool,
    pub auth: bool,
}

/// One `gzip_disable` entry, matched against User-Agent.
#[derive(Debug, Clone)]
pub enum Disable {
    /// nginx's `msie6`: "MSIE [4-6]." without "SV1".
    Msie6,
    Regex(Regex),
}

#[derive(Debug, Clone, Default)]
pub struct CompressConf {
    /// Indexed by `Coding as usize`.
    pub codings: [CodingConf; 3],
    pub vary: Option<bool>,
    pub proxied: Option<Proxied>,
    pub disable: Option<Arc<Vec<Disable>>>,
    /// `gzip_http_version 1.0` lets HTTP/1.0 requests be compressed too.
    pub http10: Option<bool>,
}

impl CompressConf {
    pub fn merge(&mut self, p: &CompressConf) {
        for (c, pc) in self.codings.iter_mut().zip(&p.codings) {
            c.merge(pc);
        }
        inherit!(self, p, vary, proxied, disable, http10);
    }

    pub fn coding(&self, c: Coding) -> &CodingConf {
        &self.codings[c as usize]
    }
    pub fn enabled(&self, c: Coding) -> bool {
        self.coding(c).on.unwrap_or(false)
    }
    /// Whether any encoding is on (the filter's first, cheapest test).
    pub fn any_enabled(&self) -> bool {
        self.codings.iter().any(|c| c.on.unwrap_or(false))
    }
    pub fn static_mode(&self, c: Coding) -> Static {
        self.coding(c).static_mode.unwrap_or(Static::Off)
    }
    pub fn any_static(&self) -> bool {
        self.codings
            .iter()
            .any(|c| c.static_mode.is_some_and(|s| s != Static::Off))
    }
    pub fn level(&self, c: Coding) -> u32 {
        self.coding(c).level.unwrap_or(c.levels().2)
    }
    /// nginx's default is 20 bytes for all three modules.
    pub fn min_length(&self, c: Coding) -> u64 {
        self.coding(c).min_length.unwrap_or(20)
    }
    pub fn types_match(&self, c: Coding, content_type: &str) -> bool {
        match &self.coding(c).types {
            Some(t) => t.matches(content_type),
            None => Types::List(Vec::new()).matches(content_type),
        }
    }
    pub fn vary(&self) -> bool {
        self.vary.unwrap_or(false)
    }
    pub fn proxied(&self) -> Proxied {
        self.proxied.unwrap_or_default()
    }
    pub fn http10(&self) -> bool {
        self.http10.unwrap_or(false)
    }
    pub fn disabled_for(&self, user_agent: &[u8]) -> bool {
        self.disable.as_ref().is_some_and(|list| {
            list.iter().any(|d| match d {
                Disable::Msie6 => crate::http::browser::is_msie6(user_agent),
                Disable::Regex(r) => r.is_match(user_agent),
            })
        })
    }
}

fn coding_of(name: &str) -> Option<(Coding, &str)> {
    [Coding::Gzip, Coding::Br, Coding::Zstd]
        .into_iter()
        .find_map(|c| name.strip_prefix(c.prefix()).map(|rest| (c, rest)))
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.compress;
    match d.name.as_str() {
        "gzip_vary" => c.vary = Some(setters::flag(d)?),
        "gzip_http_version" => {
            c.http10 = Some(match d.args[0].as_str() {
                "1.0" => true,
                "1.1" => false,
                v => return Err(invalid(d, v)),
            })
        }
        "gzip_proxied" => c.proxied = Some(proxied(d)?),
        "gzip_disable" => {
            let mut list = Vec::with_capacity(d.args.len());
            for a in &d.args {
                list.push(if a == "msie6" {
                    Disable::Msie6
                } else {
                    // nginx compiles these caseless.
                    Disable::Regex(Regex::new(a, true).map_err(|e| d.error(e))?)
                });
            }
            c.disable = Some(Arc::new(list));
        }
        "brotli_window" => {
            // Accepted: gannet uses Brotli's default window; the size is checked.
            let v = setters::size_arg(d, 0)?;
            if !(1024..=16 * 1024 * 1024).contains(&v) || !v.is_power_of_two() {
                return Err(invalid(d, &d.args[0]));
            }
        }
        name => {
            let Some((coding, rest)) = coding_of(name) else {
                return Err(d.error(format!("unknown directive \"{name}\"")));
            };
            let cc = &mut c.codings[coding as usize];
            match rest {
                "" => cc.on = Some(setters::flag(d)?),
                "_types" => cc.types = Some(Arc::new(types(d))),
                "_min_length" => cc.min_length = Some(setters::size_arg(d, 0)?),
                "_comp_level" => {
                    let (lo, hi, _) = coding.levels();
                    let v = setters::num_arg(d, 0)?;
                    if !(u64::from(lo)..=u64::from(hi)).contains(&v) {
                        return Err(d.error(format!(
                            "the \"{name}\" level must be between {lo} and {hi}"
                        )));
                    }
                    cc.level = Some(v as u32);
                }
                "_static" => {
                    cc.static_mode = Some(match d.args[0].as_str() {
                        "on" => Static::On,
                        "off" => Static::Off,
                        "always" => Static::Always,
                        v => return Err(invalid(d, v)),
                    })
                }
                "_buffers" => {
                    // Accepted: gannet sizes its compression buffers itself; checked.
                    setters::num_arg(d, 0)?;
                    setters::size_arg(d, 1)?;
                }
                _ => return Err(d.error(format!("unknown directive \"{name}\""))),
            }
        }
    }
    Ok(())
}

/// `*_types` arguments (`sub_filter_types` reads them the same way).
pub fn types(d: &Directive) -> Types {
    if d.args.iter().any(|a| a == "*") {
        Types::Any
    } else {
        Types::List(d.args.iter().map(|a| a.to_ascii_lowercase()).collect())
    }
}

fn proxied(d: &Directive) -> Result<Proxied, ConfError> {
    let mut p = Proxied::default();
    for a in &d.args {
        match a.as_str() {
            "off" => p = Proxied::default(),
            "any" => p.any = true,
            "expired" => p.expired = true,
            "no-cache" => p.no_cache = true,
            "no-store" => p.no_store = true,
            "private" => p.private = true,
            "no_last_modified" => p.no_last_modified = true,
            "no_etag" => p.no_etag = true,
            "auth" => p.auth = true,
            v => return Err(invalid(d, v)),
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_always_include_html_and_ignore_parameters() {
        let t = Types::List(vec!["text/plain".into()]);
        assert!(t.matches("text/html; charset=utf-8"));
        assert!(t.matches("TEXT/PLAIN"));
        assert!(!t.matches("image/jpeg"));
        assert!(Types::Any.matches("image/jpeg"));
    }

    #[test]
    fn coding_prefixes_do_not_overlap() {
        assert_eq!(coding_of("gzip_types").map(|c| c.0), Some(Coding::Gzip));
        assert_eq!(coding_of("brotli").map(|c| c.0), Some(Coding::Br));
        assert_eq!(coding_of("zstd_static").map(|c| c.0), Some(Coding::Zstd));
    }
}
