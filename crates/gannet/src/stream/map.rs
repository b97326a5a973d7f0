//! `map $source $variable { ... }` in the stream context (nginx's ngx_stream_map_module):
//! exact keys, `~regex` / `~*regex` keys tried in order after them, `default`. The value is
//! worked out when the variable is read, as nginx's (not cached: a session reads a map a
//! couple of times at most). `hostnames` and `volatile` are accepted; `hostnames`' wildcard
//! keys are matched as nginx does for `.example.com` and `*.example.com`.
//!
//! `geo [$address] $variable { ... }` (nginx's ngx_stream_geo_module) uses the http
//! module's tables (networks or `ranges`, `default`, `delete`, `include`).
//!
//! `split_clients "KEY" $variable { 10% a; * b; }` (nginx's ngx_stream_split_clients_module)
//! defines its variable here too, with the http module's shares (MurmurHash2 of the key, as
//! nginx's), so both kinds of variable share one index.

use super::variables::{Session, Template};
use crate::http::regex::Regex;
use gannet_conf::{ConfError, Directive};
use std::collections::HashMap;

/// How deep maps may read other maps before the value is cut short (a map reading itself).
const MAX_DEPTH: usize = 16;

#[derive(Debug, Default)]
pub struct Maps {
    names: Vec<String>,
    defs: Vec<Def>,
    /// The named captures of every `map` regex: each a variable (`$name`) reading the
    /// last match's group, as nginx's ngx_stream_regex_compile adds them.
    named: Vec<String>,
}

/// What the last regex match of a session captured (`$1`..`$9`, named groups), as
/// nginx's `s->captures`.
#[derive(Debug, Default)]
pub struct Captured {
    groups: Vec<Option<String>>,
    named: Vec<Option<String>>,
}

impl Captured {
    pub fn group(&self, n: usize) -> &str {
        self.groups
            .get(n)
            .and_then(Option::as_deref)
            .unwrap_or_default()
    }

    pub fn named(&self, i: usize) -> Option<&str> {
        self.named.get(i).and_then(Option::as_deref)
    }
}

#[derive(Debug)]
enum Def {
    Map(Map),
    Split(Template, crate::modules::split_clients::Shares),
    /// `geo [$address] $var { ... }`: the http module's table; no `$address`: the client's.
    Geo(Option<Template>, crate::modules::geo::Geo),
    /// A variable only `set` gives a value (ngx_stream_set_module): empty until then.
    Set,
}

#[derive(Debug)]
struct Map {
    source: Template,
    exact: HashMap<String, Template>,
    /// `hostnames`: `.example.com` / `*.example.com` keys, stored as `.example.com`.
    wildcards: Vec<(String, Template)>,
    regexes: Vec<(Regex, Template)>,
    default: Option<Template>,
    hostnames: bool,
}

impl Maps {
    /// The index of the map defining `$name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The index of the named capture `$name`.
    pub fn named_capture(&self, name: &str) -> Option<usize> {
        self.named.iter().position(|n| n == name)
    }

    /// How many variables `set` may give a value (maps and `set`'s own).
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Read every `map` and `split_clients` of the stream block: names first (with the
    /// named captures of the maps' regexes and of the servers' `server_name` ones, and the
    /// variables of `sets`, the servers' `set` directives), so values may read any of them.
    pub fn build(
        blocks: &[&Directive],
        sets: &[&Directive],
        server_names: &[&Directive],
        notices: &mut Vec<String>,
    ) -> Result<Maps, ConfError> {
        let mut maps = Maps::default();
        // The regexes' named captures: the maps' keys and the servers' `~` names.
        let patterns = blocks
            .iter()
            .filter(|d| d.name == "map")
            .flat_map(|d| d.block.iter().flatten())
            .map(|e| e.name.as_str())
            .chain(
                server_names
                    .iter()
                    .flat_map(|d| d.args.iter().map(String::as_str)),
            );
        for p in patterns {
            if let Some(re) = p.strip_prefix('~') {
                let re = re.strip_prefix('*').unwrap_or(re);
                if let Ok(re) = Regex::new(re, false) {
                    for (_, name) in re.names() {
                        if maps.named_capture(name).is_none() {
                            maps.named.push(name.to_string());
                        }
                    }
                }
            }
        }
        for d in blocks {
            let geo_one = d.name == "geo" && d.args.len() == 1;
            if !(d.args.len() == 2 || geo_one) || d.block.is_none() {
                return Err(d.error(format!(
                    "invalid number of arguments in \"{}\" directive",
                    d.name
                )));
            }
            let var = d.args.last().map_or("", String::as_str);
            let name = var
                .strip_prefix('$')
                .filter(|n| !n.is_empty())
                .ok_or_else(|| d.error(format!("invalid variable name \"{var}\"")))?;
            if maps.index(name).is_some() || super::variables::Var::from_name(name).is_some() {
                return Err(d.error(format!("duplicate \"{name}\" variable")));
            }
            maps.names.push(name.to_string());
        }
        for d in blocks {
            let def = if d.name == "geo" {
                // nginx's stream geo has no X-Forwarded-For: `proxy` lines are not its.
                let body = d.block.iter().flatten();
                if let Some(e) = body.into_iter().find(|e| e.name.starts_with("proxy")) {
                    return Err(e.error(format!("invalid network \"{}\"", e.name)));
                }
                let source = match d.args.len() {
                    2 => Some(Template::compile(&d.args[0], &maps).map_err(|e| d.error(e))?),
                    _ => None,
                };
                Def::Geo(source, crate::modules::geo::parse(d, None, notices)?)
            } else if d.name == "split_clients" {
                let key = Template::compile(&d.args[0], &maps).map_err(|e| d.error(e))?;
                Def::Split(key, crate::modules::split_clients::shares(d)?)
            } else {
                Def::Map(maps.parse(d)?)
            };
            maps.defs.push(def);
        }
        for d in sets {
            let var = d.args.first().map_or("", String::as_str);
            let name = var
                .strip_prefix('$')
                .filter(|n| !n.is_empty())
                .ok_or_else(|| d.error(format!("invalid variable name \"{var}\"")))?;
            if super::variables::Var::from_name(name).is_some() {
                return Err(d.error(format!("the duplicate \"{name}\" variable")));
            }
            if maps.index(name).is_none() {
                maps.names.push(name.to_string());
                maps.defs.push(Def::Set);
            }
        }
        Ok(maps)
    }

    fn parse(&self, d: &Directive) -> Result<Map, ConfError> {
        let source = Template::compile(&d.args[0], self).map_err(|e| d.error(e))?;
        let mut m = Map {
            source,
            exact: HashMap::new(),
            wildcards: Vec::new(),
            regexes: Vec::new(),
            default: None,
            hostnames: false,
        };
        for e in d.block.as_deref().unwrap_or_default() {
            let key = e.name.as_str();
            if e.args.is_empty() && matches!(key, "hostnames" | "volatile") {
                m.hostnames |= key == "hostnames";
                continue;
            }
            if e.block.is_some() || e.args.len() != 1 {
                return Err(e.error("invalid number of the map parameters"));
            }
            let value = Template::compile(&e.args[0], self).map_err(|err| e.error(err))?;
            if key == "default" {
                if m.default.replace(value).is_some() {
                    return Err(e.error("duplicate default map parameter"));
                }
            } else if let Some(re) = key.strip_prefix('~') {
                let (re, caseless) = match re.strip_prefix('*') {
                    Some(r) => (r, true),
                    None => (re, false),
                };
                let re = Regex::new(re, caseless).map_err(|err| e.error(err))?;
                m.regexes.push((re, value));
            } else if m.hostnames && (key.starts_with('.') || key.starts_with("*.")) {
                let suffix = key.trim_start_matches('*').to_ascii_lowercase();
                m.wildcards.push((suffix, value));
            } else {
                let key = key.strip_prefix('\\').unwrap_or(key);
                let key = if m.hostnames {
                    key.to_ascii_lowercase()
                } else {
                    key.to_string()
                };
                if m.exact.insert(key, value).is_some() {
                    return Err(e.error(format!("duplicate parameter \"{}\"", e.name)));
                }
            }
        }
        // Longest suffix first, as nginx's wildcard hash prefers the most specific.
        m.wildcards.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
        Ok(m)
    }

    /// `hostnames`: a key compared without case, then its wildcard suffixes.
    fn by_name<'m>(&self, m: &'m Map, key: &str) -> Option<&'m Template> {
        if !m.hostnames {
            return None;
        }
        let lower = key.to_ascii_lowercase();
        m.exact.get(&lower).or_else(|| {
            m.wildcards
                .iter()
                .find(|(suffix, _)| lower.ends_with(suffix.as_str()) || lower == suffix[1..])
                .map(|(_, v)| v)
        })
    }

    /// Keep a match's groups for `$1`.. and its named captures.
    pub fn capture(&self, s: &Session, re: &Regex, c: &crate::http::regex::Captures) {
        let mut to = s.captured.borrow_mut();
        to.groups = c.to_strings();
        for (group, name) in re.names() {
            if let Some(i) = self.named_capture(name) {
                if to.named.len() <= i {
                    to.named.resize(i + 1, None);
                }
                to.named[i] = c
                    .get(group)
                    .map(|b| String::from_utf8_lossy(b).into_owned());
            }
        }
    }

    /// Append the value of map `i` for the session.
    pub fn append(&self, i: usize, out: &mut String, s: &Session, depth: usize) {
        if depth >= MAX_DEPTH {
            return;
        }
        let m = match self.defs.get(i) {
            Some(Def::Map(m)) => m,
            Some(Def::Geo(source, geo)) => {
                let addr = match source {
                    None => s.client_ip(),
                    Some(t) => {
                        let mut a = String::new();
                        t.append_to(&mut a, s, self, depth + 1);
                        a.parse().ok()
                    }
                };
                out.push_str(&geo.lookup(addr));
                return;
            }
            Some(Def::Split(key, shares)) => {
                let mut k = String::new();
                key.append_to(&mut k, s, self, depth + 1);
                out.push_str(shares.pick(&k));
                return;
            }
            Some(Def::Set) | None => return,
        };
        let mut key = String::new();
        m.source.append_to(&mut key, s, self, depth + 1);
        let found = m.exact.get(&key).or_else(|| self.by_name(m, &key));
        let found = found
            .or_else(|| {
                m.regexes.iter().find_map(|(re, v)| {
                    let c = re.captures(key.as_bytes())?;
                    self.capture(s, re, &c);
                    Some(v)
                })
            })
            .or(m.default.as_ref());
        if let Some(v) = found {
            v.append_to(out, s, self, depth + 1);
        }
    }
}
