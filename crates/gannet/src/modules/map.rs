//! `map $source $name { ... }` (http context; nginx's ngx_http_map_module): `$name` is
//! computed from `$source` when a request first reads it, and kept for the rest of that
//! request unless the map is `volatile`.
//!
//! Inside the block: `default value;`, `key value;` (exact, case-insensitive), `~regex value;`
//! and `~*regex value;` (tried in order after the exact keys; their captures, numbered and
//! named, are usable in the value), `hostnames;` (keys may be `*.example.com`,
//! `.example.com`, `www.example.*`, and a trailing dot of the source is ignored),
//! `volatile;` and `include file;`. A key that would read as a keyword or regex is escaped
//! with a leading `\`. Values may contain variables.

use super::{LoadCtx, LocConf};
use crate::http::regex::Captures;
use crate::http::request::Request;
use crate::http::user_vars::{self, CapRegex};
use crate::http::variables::{Sent, Template};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::collections::HashMap;
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "map",
    ctx: Ctx::HTTP,
    args: Args::Exactly(2),
    block: true,
}];

#[derive(Debug)]
pub struct Map {
    source: Template,
    /// Lower-cased keys.
    exact: HashMap<String, Template>,
    /// `hostnames` wildcards `*.example.com` / `.example.com`, kept as `.example.com`.
    head: Vec<(String, Template)>,
    /// `hostnames` wildcards `www.example.*`, kept as `www.example.`.
    tail: Vec<(String, Template)>,
    regexes: Vec<(CapRegex, Template)>,
    default: Option<Template>,
    hostnames: bool,
    volatile: bool,
}

/// Which value a key selects.
enum Hit<'m, 'k> {
    Value(&'m Template),
    Regex(&'m CapRegex, &'m Template, Captures<'m, 'k>),
}

pub fn set(d: &Directive, _lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let name = d.args[1]
        .strip_prefix('$')
        .ok_or_else(|| d.error(format!("invalid variable name \"{}\"", d.args[1])))?;
    let map = parse(d)?;
    user_vars::define_computed(name, Arc::new(map)).map_err(|e| d.error(e))?;
    Ok(())
}

fn parse(d: &Directive) -> Result<Map, ConfError> {
    let mut m = Map {
        source: Template::compile(&d.args[0]).map_err(|e| d.error(e))?,
        exact: HashMap::new(),
        head: Vec::new(),
        tail: Vec::new(),
        regexes: Vec::new(),
        default: None,
        hostnames: false,
        volatile: false,
    };
    for e in d.block.as_deref().unwrap_or_default() {
        user_vars::at(&e.loc);
        if e.block.is_some() {
            return Err(e.error("unexpected \"{\""));
        }
        match (e.name.as_str(), e.args.as_slice()) {
            ("hostnames", []) => m.hostnames = true,
            ("volatile", []) => m.volatile = true,
            (key, [value]) => m.add(key, value).map_err(|msg| e.error(msg))?,
            _ => return Err(e.error("invalid number of the map parameters")),
        }
    }
    Ok(m)
}

impl Map {
    fn add(&mut self, key: &str, value: &str) -> Result<(), String> {
        let value = Template::compile(value)?;
        if key == "default" {
            if self.default.is_some() {
                return Err("duplicate default map parameter".to_string());
            }
            self.default = Some(value);
            return Ok(());
        }
        if let Some(re) = key.strip_prefix('~') {
            let (re, caseless) = match re.strip_prefix('*') {
                Some(r) => (r, true),
                None => (re, false),
            };
            self.regexes.push((CapRegex::compile(re, caseless)?, value));
            return Ok(());
        }
        let key = key.strip_prefix('\\').unwrap_or(key).to_ascii_lowercase();
        if self.hostnames && (key.contains('*') || key.starts_with('.')) {
            return self.add_wildcard(&key, value);
        }
        if self.exact.insert(key.clone(), value).is_some() {
            return Err(format!("conflicting parameter \"{key}\""));
        }
        Ok(())
    }

    fn add_wildcard(&mut self, key: &str, value: Template) -> Result<(), String> {
        let invalid = || format!("invalid hostname or wildcard \"{key}\"");
        let (list, pattern) = if let Some(rest) = key.strip_prefix('*') {
            (&mut self.head, rest.to_string())
        } else if let Some(name) = key.strip_prefix('.') {
            // `.example.com` is also the exact name `example.com`.
            self.exact.entry(name.to_string()).or_insert(value.clone());
            (&mut self.head, key.to_string())
        } else if let Some(rest) = key.strip_suffix('*') {
            (&mut self.tail, rest.to_string())
        } else {
            return Err(invalid());
        };
        let well_formed = pattern.len() > 1
            && !pattern.contains('*')
            && (pattern.starts_with('.') || pattern.ends_with('.'));
        if !well_formed {
            return Err(invalid());
        }
        if list.iter().any(|(p, _)| *p == pattern) {
            return Err(format!("conflicting parameter \"{key}\""));
        }
        list.push((pattern, value));
        Ok(())
    }

    /// The entry `key` selects: exact, then (with `hostnames`) the longest wildcard, then
    /// the first matching regex; `None` means the default.
    fn find<'m, 'k>(&'m self, key: &'k str) -> Option<Hit<'m, 'k>> {
        let low = key.to_ascii_lowercase();
        if let Some(v) = self.exact.get(&low) {
            return Some(Hit::Value(v));
        }
        let longest = |list: &'m [(String, Template)], matches: &dyn Fn(&str) -> bool| {
            list.iter()
                .filter(|(p, _)| matches(p))
                .max_by_key(|(p, _)| p.len())
                .map(|(_, v)| Hit::Value(v))
        };
        if let Some(hit) = longest(&self.head, &|p| low.ends_with(p)) {
            return Some(hit);
        }
        if let Some(hit) = longest(&self.tail, &|p| low.starts_with(p)) {
            return Some(hit);
        }
        // As nginx: an empty value is looked up among the keys but never matched by a regex.
        if key.is_empty() {
            return None;
        }
        self.regexes.iter().find_map(|(re, v)| {
            re.re
                .captures(key.as_bytes())
                .map(|caps| Hit::Regex(re, v, caps))
        })
    }
}

impl user_vars::Computed for Map {
    fn volatile(&self) -> bool {
        self.volatile
    }

    /// The value of the map's variable for `req`.
    fn value(&self, req: &Request, sent: Option<&Sent>) -> String {
        let mut key = self.source.eval(req, sent);
        if self.hostnames && key.ends_with('.') {
            key.pop();
        }
        let value = match self.find(&key) {
            Some(Hit::Value(v)) => v.eval(req, sent),
            Some(Hit::Regex(re, v, caps)) => {
                let caps = re.bind(&caps, req);
                v.eval_with(req, sent, &caps)
            }
            None => self
                .default
                .as_ref()
                .map_or_else(String::new, |v| v.eval(req, sent)),
        };
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn map(body: &str) -> Result<Map, String> {
        let _scope = user_vars::LoadScope::begin();
        let src = format!("map $host $out {{\n{body}\n}}");
        let tree =
            gannet_conf::parse_str(&src, "t.conf", Path::new("/")).map_err(|e| e.to_string())?;
        parse(&tree[0]).map_err(|e| e.to_string())
    }

    /// The literal value `key` selects, or "default".
    fn pick(m: &Map, key: &str) -> String {
        match m.find(key) {
            Some(Hit::Value(v)) | Some(Hit::Regex(_, v, _)) => {
                v.as_literal().unwrap_or("<vars>").to_string()
            }
            None => "default".to_string(),
        }
    }

    #[test]
    fn exact_keys_then_regexes_in_order() {
        let m = map(r#"
            default d;
            Example.COM exact;
            ~^ex first;
            ~^example second;
            ~*^CASE caseless;
            "" empty;
            \default escaped;
        "#)
        .unwrap();
        assert_eq!(pick(&m, "example.com"), "exact");
        assert_eq!(pick(&m, "EXAMPLE.com"), "exact");
        assert_eq!(pick(&m, "example.org"), "first");
        assert_eq!(pick(&m, "case-x"), "caseless");
        assert_eq!(pick(&m, "EXAMPLE.org"), "default");
        assert_eq!(pick(&m, ""), "empty");
        assert_eq!(pick(&m, "default"), "escaped");
        assert_eq!(pick(&m, "nothing"), "default");
    }

    #[test]
    fn empty_value_skips_regexes() {
        let m = map("~.* any;").unwrap();
        assert_eq!(pick(&m, ""), "default");
        assert_eq!(pick(&m, "x"), "any");
    }

    #[test]
    fn regex_captures_are_numbered() {
        let m = map("~^(\\w+)\\.(\\w+)$ v;").unwrap();
        let hit = m.find("www.test");
        match &hit {
            Some(Hit::Regex(_, _, caps)) => {
                assert_eq!(caps.text(1), "www");
                assert_eq!(caps.text(2), "test");
            }
            _ => panic!("regex did not match"),
        }
    }

    #[test]
    fn hostnames_wildcards() {
        let m = map(
            "hostnames;\n*.example.com star;\n*.a.example.com longer;\n.dot.org dot;\nwww.example.* tail;\nexample.com exact;",
        )
        .unwrap();
        assert_eq!(pick(&m, "x.example.com"), "star");
        assert_eq!(pick(&m, "b.a.example.com"), "longer");
        assert_eq!(pick(&m, "example.com"), "exact");
        assert_eq!(pick(&m, "dot.org"), "dot");
        assert_eq!(pick(&m, "x.dot.org"), "dot");
        assert_eq!(pick(&m, "www.example.net"), "tail");
        assert_eq!(pick(&m, "other.net"), "default");
        // Without `hostnames`, a star is an ordinary character.
        let plain = map("*.example.com star;").unwrap();
        assert_eq!(pick(&plain, "x.example.com"), "default");
        assert_eq!(pick(&plain, "*.example.com"), "star");
    }

    #[test]
    fn errors() {
        assert!(map("default a;\ndefault b;")
            .unwrap_err()
            .contains("t.conf:3: duplicate default map parameter"));
        assert!(map("a 1;\nA 2;")
            .unwrap_err()
            .contains("conflicting parameter \"a\""));
        assert!(map("a 1 2;")
            .unwrap_err()
            .contains("invalid number of the map parameters"));
        assert!(map("~( bad;")
            .unwrap_err()
            .contains("pcre2_compile() failed: missing closing parenthesis in \"(\""));
        assert!(map("hostnames;\nw*w.x good;")
            .unwrap_err()
            .contains("invalid hostname or wildcard"));
        assert!(map("a { }").unwrap_err().contains("unexpected \"{\""));
    }
}
