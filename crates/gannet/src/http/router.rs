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
use crate::http::regex::Regex;
use crate::http::request::Request;
use crate::http::user_vars::CapRegex;
use crate::modules::LocConf;
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
    /// nginx's `auto_redirect`: for a `/path/` location (prefix or exact) that passes to an
    /// application itself, a request for `/path` that no location names exactly is sent
    /// there with a 301 (this is its Location, the name escaped).
    pub auto_redirect: Option<Box<str>>,
}

/// The directives that give a location nginx's `auto_redirect`.
const PASSES: &[&str] = &[
    "proxy_pass",
    "fastcgi_pass",
    "uwsgi_pass",
    "scgi_pass",
    "grpc_pass",
    "memcached_pass",
];

/// A location's `auto_redirect` target, from its matcher and the names of the directives
/// in its own block (one in a nested `if` or `limit_except` does not count, as in nginx).
pub fn auto_redirect<'a>(
    matcher: &Matcher,
    mut directives: impl Iterator<Item = &'a str>,
) -> Option<Box<str>> {
    let (Matcher::Exact(p) | Matcher::Prefix { path: p, .. }) = matcher else {
        return None;
    };
    if !p.ends_with('/') || !directives.any(|n| PASSES.contains(&n)) {
        return None;
    }
    let mut out = Vec::with_capacity(p.len());
    crate::modules::proxy::escape_uri(p, &mut out);
    Some(String::from_utf8_lossy(&out).into())
}

impl Location {
    /// The prefix this location matched by, which a `proxy_pass` URI part replaces (empty
    /// for regex locations).
    pub fn prefix(&self) -> &str {
        match &self.matcher {
            Matcher::Exact(p) | Matcher::Prefix { path: p, .. } => p,
            _ => "",
        }
    }
}

/// The result of location matching: the location and, for a regex location, its captures
/// (`$1`...), which replace the request's (none for a regex without groups, as nginx).
pub struct Found {
    pub location: Arc<Location>,
    pub captures: Option<Vec<Option<String>>>,
    /// The URI is the location's name without its final `/`: answer with its
    /// `auto_redirect` (checked before any regex location, as nginx does).
    pub redirect: bool,
}

/// A regex location's match failed (logged): nginx answers 500 rather than guess.
#[derive(Debug)]
pub struct Failed;

/// Find the location for `uri` among `locs` (one level), nginx's ngx_http_core_find_location.
pub fn find_location(locs: &[Arc<Location>], uri: &str) -> Result<Option<Found>, Failed> {
    Ok(find_level(locs, uri)?.0)
}

/// One level of the search. The flag says the match is final (an exact or a regex match),
/// which stops the regex search of the levels above, as nginx's NGX_OK does.
fn find_level(locs: &[Arc<Location>], uri: &str) -> Result<(Option<Found>, bool), Failed> {
    let mut best: Option<&Arc<Location>> = None;
    // A `/uri/` location with auto_redirect (an exact one's settings over a prefix one's).
    let mut slash: Option<&Arc<Location>> = None;
    for l in locs {
        match &l.matcher {
            Matcher::Exact(p) if p == uri => {
                return Ok((
                    Some(Found {
                        location: l.clone(),
                        captures: None,
                        redirect: false,
                    }),
                    true,
                ));
            }
            Matcher::Prefix { path, .. }
                if uri.starts_with(path.as_str())
                    && best.is_none_or(|b| b.prefix().len() < path.len()) =>
            {
                best = Some(l);
            }
            Matcher::Exact(p) | Matcher::Prefix { path: p, .. }
                if l.auto_redirect.is_some()
                    && p.len() == uri.len() + 1
                    && p.starts_with(uri)
                    && slash.is_none_or(|s| !matches!(s.matcher, Matcher::Exact(_))) =>
            {
                slash = Some(l);
            }
            _ => {}
        }
    }
    // Unless a prefix location is named the URI itself, the redirect wins over shorter
    // prefixes and over regexes.
    if let Some(l) = slash.filter(|_| best.is_none_or(|b| b.prefix().len() != uri.len())) {
        return Ok((
            Some(Found {
                location: l.clone(),
                captures: None,
                redirect: true,
            }),
            true,
        ));
    }
    let mut found = best.map(|b| Found {
        location: b.clone(),
        captures: None,
        redirect: false,
    });
    if let Some(b) = best {
        let (inner, is_final) = find_level(&b.children, uri)?;
        if inner.is_some() {
            found = inner;
        }
        // A `^~` match at this level skips this level's regexes (not the levels above).
        if is_final || matches!(b.matcher, Matcher::Prefix { no_regex: true, .. }) {
            return Ok((found, is_final));
        }
    }
    for l in locs {
        if let Matcher::Regex(re) = &l.matcher {
            // A regex without groups leaves no captures (nginx clears `$1`.. too): a plain
            // match test, without the captures' allocations (`location ~ \.php$` runs for
            // every PHP request).
            let captures = if re.re.groups() == 1 {
                if !re.re.matches(uri.as_bytes()).map_err(|_| Failed)? {
                    continue;
                }
                Vec::new()
            } else {
                match re.re.captures_checked(uri.as_bytes()).map_err(|_| Failed)? {
                    Some(caps) => caps.to_strings(),
                    None => continue,
                }
            };
            let here = Found {
                location: l.clone(),
                captures: Some(captures),
                redirect: false,
            };
            // Locations nested in a regex location are searched too.
            return Ok(match find_level(&l.children, uri)? {
                (Some(inner), _) => (Some(inner), true),
                (None, _) => (Some(here), true),
            });
        }
    }
    Ok((found, false))
}

/// A `~regex` server name: HTTP's keep their named captures as request variables
/// ([`CapRegex`]), stream's as the session's (a bare [`Regex`]).
pub trait NameRegex: Sized {
    fn compile(pattern: &str, caseless: bool) -> Result<Self, String>;
    fn is_match(&self, host: &str) -> bool;
}

impl NameRegex for CapRegex {
    fn compile(pattern: &str, caseless: bool) -> Result<Self, String> {
        CapRegex::compile(pattern, caseless)
    }
    fn is_match(&self, host: &str) -> bool {
        self.re.is_match(host.as_bytes())
    }
}

impl NameRegex for Regex {
    fn compile(pattern: &str, caseless: bool) -> Result<Self, String> {
        Regex::new(pattern, caseless)
    }
    fn is_match(&self, host: &str) -> bool {
        Regex::is_match(self, host.as_bytes())
    }
}

/// A server's names, split by kind for the lookup order.
#[derive(Debug)]
pub struct ServerNames<R = CapRegex> {
    pub exact: Vec<String>,
    /// `*.example.com` stored as `.example.com`; `.example.com` also matches `example.com`.
    pub suffix: Vec<String>,
    /// `www.example.*` stored as `www.example.`
    pub prefix: Vec<String>,
    /// `~regex` names; their captures set `$1`.. and named variables, as in nginx.
    pub regex: Vec<R>,
}

impl<R> Default for ServerNames<R> {
    fn default() -> Self {
        ServerNames {
            exact: Vec::new(),
            suffix: Vec::new(),
            prefix: Vec::new(),
            regex: Vec::new(),
        }
    }
}

/// `$server_name` for a server whose first name is `name`, as nginx keeps it: a regex as
/// written, a `.name` without its dot, others in lower case.
pub fn primary_name(name: &str) -> String {
    if name.starts_with('~') {
        return name.to_string();
    }
    let n = name
        .strip_prefix('.')
        .filter(|r| !r.is_empty())
        .unwrap_or(name);
    n.to_ascii_lowercase()
}

impl<R: NameRegex> ServerNames<R> {
    pub fn add(&mut self, name: &str) -> Result<(), String> {
        // nginx's check of both `server_name` directives (http's and stream's).
        let b = name.as_bytes();
        if (b.first() == Some(&b'*') && (b.len() < 3 || b[1] != b'.'))
            || (b.first() == Some(&b'.') && b.len() < 2)
        {
            return Err(format!("server name \"{name}\" is invalid"));
        }
        if let Some(re) = name.strip_prefix('~') {
            if re.is_empty() {
                return Err(format!("empty regex in server name \"{name}\""));
            }
            // As nginx: the pattern is not lowercased (`\D` is not `\d`); one with an
            // upper-case letter matches caselessly instead, the host being lowercase.
            let caseless = re.bytes().any(|b| b.is_ascii_uppercase());
            self.regex.push(R::compile(re, caseless)?);
            return Ok(());
        }
        let name = name.to_ascii_lowercase();
        if let Some(s) = name.strip_prefix('*') {
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
    // No Host at all is the name "" (`server_name ""`), as nginx looks it up.
    let found = if host.is_empty() {
        servers
            .iter()
            .find(|s| s.names.exact.iter().any(String::is_empty))
    } else {
        find_by_name(servers, |s| &s.names, host).map(|(s, _)| s)
    };
    found.unwrap_or(&servers[default])
}

/// The server among `servers` that `host` (lowercased, without port) names, with nginx's
/// order: exact names, the longest `*.suffix`, the longest `prefix.*`, then the regexes in
/// config order (the index of the one that matched comes along, for its captures). `None`:
/// no server has the name (the caller's default server serves it).
pub fn find_by_name<'a, T, R: NameRegex>(
    servers: &'a [T],
    names: impl Fn(&T) -> &ServerNames<R>,
    host: &str,
) -> Option<(&'a T, Option<usize>)> {
    if let Some(s) = servers
        .iter()
        .find(|s| names(s).exact.iter().any(|n| n == host))
    {
        return Some((s, None));
    }
    let longest = |f: &dyn Fn(&ServerNames<R>) -> Option<usize>| {
        servers
            .iter()
            .filter_map(|s| f(names(s)).map(|len| (len, s)))
            .max_by_key(|(len, _)| *len)
            .map(|(_, s)| (s, None))
    };
    let wildcard = longest(&|n| {
        n.suffix
            .iter()
            .filter(|w| host.ends_with(w.as_str()))
            .map(|w| w.len())
            .max()
    })
    .or_else(|| {
        longest(&|n| {
            n.prefix
                .iter()
                .filter(|w| host.starts_with(w.as_str()))
                .map(|w| w.len())
                .max()
        })
    });
    if wildcard.is_some() {
        return wildcard;
    }
    servers.iter().find_map(|s| {
        let i = names(s).regex.iter().position(|r| r.is_match(host))?;
        Some((s, Some(i)))
    })
}

/// When `req`'s server was chosen by one of its `~regex` names, set that match's captures
/// (`$1`.., named variables) for the request, as nginx does while it picks the server.
pub fn bind_server_captures(req: &mut Request) {
    let names = &req.server.names;
    if names.regex.is_empty() {
        return;
    }
    let host = req.host.as_str();
    // Chosen by an exact or wildcard name of its own: no regex took part.
    if names.exact.iter().any(|n| n == host)
        || names.suffix.iter().any(|w| host.ends_with(w.as_str()))
        || names.prefix.iter().any(|w| host.starts_with(w.as_str()))
    {
        return;
    }
    let server = req.server.clone();
    for re in &server.names.regex {
        if let Some(caps) = re.captures(&req.host, req) {
            if re.re.groups() > 1 {
                req.captures = caps;
            }
            return;
        }
    }
}
