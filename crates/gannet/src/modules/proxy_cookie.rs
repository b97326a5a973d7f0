//! The proxied server's cookies, as nginx's proxy module rewrites them: `proxy_cookie_domain`
//! and `proxy_cookie_path` change the `Domain` and `Path` attributes of each `Set-Cookie`,
//! `proxy_cookie_flags` adds or removes `Secure`, `HttpOnly` and `SameSite`.
//!
//! nginx's rules, checked against Debian's nginx: the first rule that matches wins; a plain
//! domain matches the whole value, case-insensitively, with a leading dot kept outside the
//! match; a plain path matches a prefix (case-sensitively) and the rest is kept; a regex
//! (`~`, and `~*` for paths; domain and cookie-name regexes always ignore case) is matched
//! against the whole value, dot included, and replaces it with the replacement and its
//! captures. A header no rule touched is passed byte for byte; one that changed is written
//! again as `name=value; attr; attr=value` (spaces trimmed). The lists are inherited only by
//! levels that set none; `off` empties one.

use super::proxy::compile_ci;
use super::{invalid, LoadCtx, LocConf};
use crate::http::regex::Regex;
use crate::http::request::Request;
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "proxy_cookie_domain",
        ctx: Ctx::HSL,
        args: Args::Between(1, 2),
        block: false,
    },
    Spec {
        name: "proxy_cookie_path",
        ctx: Ctx::HSL,
        args: Args::Between(1, 2),
        block: false,
    },
    Spec {
        name: "proxy_cookie_flags",
        ctx: Ctx::HSL,
        args: Args::AtLeast(1),
        block: false,
    },
];

#[derive(Debug, Clone)]
enum Pattern {
    Text(Template),
    Regex(Regex),
}

#[derive(Debug, Clone)]
pub struct Rule {
    from: Pattern,
    to: Template,
}

#[derive(Debug, Clone)]
pub struct FlagRule {
    /// The cookie's name: plain (any case) or a regex.
    cookie: Pattern,
    flags: Vec<Template>,
}

#[derive(Debug, Clone, Default)]
pub struct ProxyCookieConf {
    pub domain: Option<Arc<Vec<Rule>>>,
    pub path: Option<Arc<Vec<Rule>>>,
    pub flags: Option<Arc<Vec<FlagRule>>>,
}

impl ProxyCookieConf {
    pub fn merge(&mut self, p: &ProxyCookieConf) {
        super::inherit!(self, p, domain, path, flags);
    }

    fn active(&self) -> bool {
        fn some<T>(l: &Option<Arc<Vec<T>>>) -> bool {
            l.as_ref().is_some_and(|l| !l.is_empty())
        }
        some(&self.domain) || some(&self.path) || some(&self.flags)
    }
}

const FLAGS: &[&str] = &[
    "secure",
    "nosecure",
    "httponly",
    "nohttponly",
    "samesite=strict",
    "samesite=lax",
    "samesite=none",
    "nosamesite",
];

fn pattern(d: &Directive, s: &str, domain: bool) -> Result<Pattern, ConfError> {
    let (re, ci) = match (s.strip_prefix("~*"), s.strip_prefix('~')) {
        (Some(re), _) => (re, true),
        (None, Some(re)) => (re, domain),
        (None, None) => {
            return Template::compile(s)
                .map(Pattern::Text)
                .map_err(|e| d.error(e))
        }
    };
    compile_ci(d, re, ci).map(Pattern::Regex)
}

/// Add a rule to this level's list, or empty it with `off`: as in nginx, `off` and rules
/// do not mix at one level.
fn push<T>(d: &Directive, list: &mut Option<Arc<Vec<T>>>, rule: Option<T>) -> Result<(), ConfError>
where
    T: Clone,
{
    let dup = match (&rule, list.as_deref()) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(_), Some(l)) => l.is_empty(),
    };
    if dup {
        return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
    }
    let mut l = list.as_deref().cloned().unwrap_or_default();
    l.extend(rule);
    *list = Some(Arc::new(l));
    Ok(())
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.proxy.cookie;
    let a0 = d.args[0].as_str();
    if d.name == "proxy_cookie_flags" {
        if a0 == "off" && d.args.len() == 1 {
            return push(d, &mut c.flags, None);
        }
        if d.args.len() < 2 {
            return Err(d.error(format!("invalid parameter \"{a0}\"")));
        }
        let mut flags = Vec::new();
        for f in &d.args[1..] {
            let t = Template::compile(f).map_err(|e| d.error(e))?;
            if t.as_literal()
                .is_some_and(|l| !FLAGS.contains(&l.to_ascii_lowercase().as_str()))
            {
                return Err(invalid(d, f));
            }
            flags.push(t);
        }
        let rule = FlagRule {
            cookie: pattern(d, a0, true)?,
            flags,
        };
        return push(d, &mut c.flags, Some(rule));
    }
    let domain = d.name == "proxy_cookie_domain";
    let list = if domain { &mut c.domain } else { &mut c.path };
    let rule = match d.args.get(1) {
        None if a0 == "off" => None,
        None => return Err(d.error(format!("invalid parameter \"{a0}\""))),
        Some(to) => {
            // A plain domain and its replacement lose a leading dot, as in nginx: the
            // cookie's own dot is kept apart when matching (see `apply`).
            let (a0, to) = match domain && !a0.starts_with('~') {
                true => (
                    a0.strip_prefix('.').unwrap_or(a0),
                    to.strip_prefix('.').unwrap_or(to),
                ),
                false => (a0, to.as_str()),
            };
            Some(Rule {
                from: pattern(d, a0, domain)?,
                to: Template::compile(to).map_err(|e| d.error(e))?,
            })
        }
    };
    push(d, list, rule)
}

/// One `Set-Cookie` value as the rules say, or `None` when they change nothing.
pub fn rewrite(req: &Request, value: &str) -> Option<String> {
    let c = &req.conf.proxy.cookie;
    if !c.active() {
        return None;
    }
    let mut parts = value.split(';');
    let pair = parts.next().unwrap_or_default().trim().to_string();
    let mut attrs: Vec<(String, Option<String>)> = parts
        .map(|a| match a.split_once('=') {
            Some((k, v)) => (k.trim().to_string(), Some(v.trim().to_string())),
            None => (a.trim().to_string(), None),
        })
        .collect();
    let mut changed = false;
    for (attr, rules, domain) in [("domain", &c.domain, true), ("path", &c.path, false)] {
        let Some(rules) = rules.as_deref() else {
            continue;
        };
        let Some(v) = attrs
            .iter_mut()
            .find(|(k, _)| k.eq_ignore_ascii_case(attr))
            .and_then(|(_, v)| v.as_mut())
        else {
            continue;
        };
        if let Some(new) = apply(req, rules, v, domain) {
            *v = new;
            changed = true;
        }
    }
    let name = pair.split('=').next().unwrap_or_default().trim();
    if let Some(rule) = c.flags.as_deref().and_then(|l| {
        l.iter().find(|r| match &r.cookie {
            Pattern::Text(t) => t.eval(req, None).eq_ignore_ascii_case(name),
            Pattern::Regex(re) => re.is_match(name.as_bytes()),
        })
    }) {
        changed |= apply_flags(req, rule, &mut attrs);
    }
    if !changed {
        return None;
    }
    let mut out = pair;
    for (k, v) in attrs {
        out.push_str("; ");
        out.push_str(&k);
        if let Some(v) = v {
            out.push('=');
            out.push_str(&v);
        }
    }
    Some(out)
}

/// The first domain or path rule that matches `v`, applied.
fn apply(req: &Request, rules: &[Rule], v: &str, domain: bool) -> Option<String> {
    rules.iter().find_map(|r| match &r.from {
        Pattern::Text(t) => {
            let from = t.eval(req, None);
            if domain {
                // A domain's leading dot is not part of what is matched, and stays.
                let (dot, value) = v.strip_prefix('.').map_or(("", v), |rest| (".", rest));
                value
                    .eq_ignore_ascii_case(&from)
                    .then(|| format!("{dot}{}", r.to.eval(req, None)))
            } else {
                let rest = v.strip_prefix(from.as_str())?;
                Some(format!("{}{rest}", r.to.eval(req, None)))
            }
        }
        Pattern::Regex(re) => {
            let caps = re.captures(v.as_bytes())?.to_strings();
            Some(r.to.eval_with(req, None, &caps))
        }
    })
}

/// Set, add or remove the rule's flags; whether anything changed.
fn apply_flags(req: &Request, rule: &FlagRule, attrs: &mut Vec<(String, Option<String>)>) -> bool {
    let find = |attrs: &[(String, Option<String>)], name: &str| {
        attrs.iter().position(|(k, _)| k.eq_ignore_ascii_case(name))
    };
    let (mut secure, mut httponly, mut samesite) = (None, None, None);
    for f in &rule.flags {
        match f.eval(req, None).to_ascii_lowercase().as_str() {
            "secure" => secure = Some(true),
            "nosecure" => secure = Some(false),
            "httponly" => httponly = Some(true),
            "nohttponly" => httponly = Some(false),
            "samesite=strict" => samesite = Some(Some("Strict")),
            "samesite=lax" => samesite = Some(Some("Lax")),
            "samesite=none" => samesite = Some(Some("None")),
            "nosamesite" => samesite = Some(None),
            // A variable's value that is no flag changes nothing.
            _ => {}
        }
    }
    let mut changed = false;
    for (name, want) in [("Secure", secure), ("HttpOnly", httponly)] {
        match (want, find(attrs, name)) {
            (Some(true), None) => attrs.push((name.to_string(), None)),
            (Some(false), Some(i)) => {
                attrs.remove(i);
            }
            _ => continue,
        }
        changed = true;
    }
    match (samesite, find(attrs, "samesite")) {
        // Written again in nginx's spelling, even when only the case differs.
        (Some(Some(v)), Some(i)) => {
            attrs[i] = ("SameSite".to_string(), Some(v.to_string()));
            changed = true;
        }
        (Some(Some(v)), None) => {
            attrs.push(("SameSite".to_string(), Some(v.to_string())));
            changed = true;
        }
        (Some(None), Some(i)) => {
            attrs.remove(i);
            changed = true;
        }
        _ => {}
    }
    changed
}
