//! Virtual-host selection by Host (`server_name`) and location matching, with nginx's rules.
//!
//! server_name: exact names first, then the longest `*.suffix` wildcard, then the longest
//! `prefix.*` wildcard, then `~regex` names in config order, else the listen's default server.
//!
//! location: `=` exact match wins at once; otherwise the longest prefix match is remembered
//! and its nested locations searched; a `^~` prefix match stops there; otherwise regex
//! locations (`~`, `~*`) of each level are tried in config order, the first match winning
//! (nested regexes before their parent's level), else the longest prefix match.

use crate::config::ServerConf;
use crate::http::user_vars::CapRegex;
use crate::modules::LocConf;
use regex::Regex;
use std::sync::Arc;

#[derive(Debug)]
pub enum Matcher {
    /// `location = /path`
    Exact(String),
    /// `location /path` (`no_regex` for `^~`)
    Prefix { path: String, no_regex: bool },
    /// `location ~ re` / `location ~* re` (named captures set variables)
    Regex(CapRegex),
    /// `location @name`
    Named(String),
}

#[derive(Debug)]
pub struct Location {
    pub matcher: Matcher,
    pub conf: Arc<LocConf>,
    pub children: Vec<Arc<Location>>,
}

impl Location {
    /// The prefix this location matched by, for `alias` (empty for regex locations).
    pub fn prefix(&self) -> &str {
        match &self.matcher {
            Matcher::Exact(p) | Matcher::Prefix { path: p, .. } => p,
            _ => "",
        }
    }
}

/// The result of location matching: the location and regex captures (`$1`...).
pub struct Found {
    pub location: Arc<Location>,
    pub captures: Vec<Option<String>>,
}

/// Find the location for `uri` among `locs` (one level), nginx's ngx_http_core_find_location.
pub fn find_location(locs: &[Arc<Location>], uri: &str) -> Option<Found> {
    find_level(locs, uri).0
}

/// One level of the search. The flag says the match is final (an exact or a regex match),
/// which stops the regex search of the levels above, as nginx's NGX_OK does.
fn find_level(locs: &[Arc<Location>], uri: &str) -> (Option<Found>, bool) {
    let mut best: Option<&Arc<Location>> = None;
    for l in locs {
        match &l.matcher {
            Matcher::Exact(p) if p == uri => {
                return (
                    Some(Found {
                        location: l.clone(),
                        captures: Vec::new(),
                    }),
                    true,
                );
            }
            Matcher::Prefix { path, .. }
                if uri.starts_with(path.as_str())
                    && best.is_none_or(|b| b.prefix().len() < path.len()) =>
            {
                best = Some(l);
            }
            _ => {}
        }
    }
    let mut found = best.map(|b| Found {
        location: b.clone(),
        captures: Vec::new(),
    });
    if let Some(b) = best {
        let (inner, is_final) = find_level(&b.children, uri);
        if inner.is_some() {
            found = inner;
        }
        // A `^~` match at this level skips this level's regexes (not the levels above).
        if is_final || matches!(b.matcher, Matcher::Prefix { no_regex: true, .. }) {
            return (found, is_final);
        }
    }
    for l in locs {
        if let Matcher::Regex(re) = &l.matcher {
            if let Some(caps) = re.re.captures(uri) {
                let here = Found {
                    location: l.clone(),
                    captures: crate::http::user_vars::captures(&caps),
                };
                // Locations nested in a regex location are searched too.
                return match find_level(&l.children, uri) {
                    (Some(inner), _) => (Some(inner), true),
                    (None, _) => (Some(here), true),
                };
            }
        }
    }
    (found, false)
}

/// A server's names, split by kind for the lookup order.
#[derive(Debug, Default)]
pub struct ServerNames {
    pub exact: Vec<String>,
    /// `*.example.com` stored as `.example.com`; `.example.com` also matches `example.com`.
    pub suffix: Vec<String>,
    /// `www.example.*` stored as `www.example.`
    pub prefix: Vec<String>,
    pub regex: Vec<Regex>,
}

impl ServerNames {
    pub fn add(&mut self, name: &str) -> Result<(), String> {
        let name = name.to_ascii_lowercase();
        if let Some(re) = name.strip_prefix('~') {
            self.regex.push(
                Regex::new(re).map_err(|e| format!("invalid server_name regex \"{re}\": {e}"))?,
            );
        } else if let Some(s) = name.strip_prefix('*') {
            self.suffix.push(s.to_string());
        } else if let Some(s) = name.strip_prefix('.') {
            // `.example.com` = `example.com` + `*.example.com`
            self.exact.push(s.to_string());
            self.suffix.push(format!(".{s}"));
        } else if let Some(p) = name.strip_suffix('*') {
            self.prefix.push(p.to_string());
        } else {
            self.exact.push(name);
        }
        Ok(())
    }
}

/// Pick the virtual host for `host` (already lowercased, without port).
pub fn select_server<'a>(
    servers: &'a [Arc<ServerConf>],
    default: usize,
    host: &str,
) -> &'a Arc<ServerConf> {
    if !host.is_empty() {
        if let Some(s) = servers
            .iter()
            .find(|s| s.names.exact.iter().any(|n| n == host))
        {
            return s;
        }
        let longest = |f: &dyn Fn(&ServerNames) -> Option<usize>| {
            servers
                .iter()
                .filter_map(|s| f(&s.names).map(|len| (len, s)))
                .max_by_key(|(len, _)| *len)
                .map(|(_, s)| s)
        };
        if let Some(s) = longest(&|n| {
            n.suffix
                .iter()
                .filter(|w| host.ends_with(w.as_str()))
                .map(|w| w.len())
                .max()
        }) {
            return s;
        }
        if let Some(s) = longest(&|n| {
            n.prefix
                .iter()
                .filter(|w| host.starts_with(w.as_str()))
                .map(|w| w.len())
                .max()
        }) {
            return s;
        }
        if let Some(s) = servers
            .iter()
            .find(|s| s.names.regex.iter().any(|r| r.is_match(host)))
        {
            return s;
        }
    }
    &servers[default]
}
