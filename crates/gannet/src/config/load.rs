//! From the directive tree to [`Config`]: walks main / events / http / server / location,
//! hands every other directive to the module that owns it (checked against its spec), then
//! merges each level with its parent.
//!
//! Within a block, plain directives are applied before nested blocks are built, so an
//! http-level directive written after a `server {}` still reaches it, as in nginx.
//!
//! `if` blocks are built here too (their directives are applied like a location's), and the
//! variables the config defines are collected while loading: a variable read anywhere must
//! be defined (`set`, `map`, a named capture) somewhere, or the load fails at its first read.

use super::listen::Listen;
use super::{ignored, main_conf, process_conf, Config, ListenGroup, MainConf, ServerConf};
use crate::http::router::{self, Location, Matcher, ServerNames};
use crate::http::user_vars::{self, CapRegex, VarTable};
use crate::http::variables::Template;
use crate::modules::{self, LoadCtx, LocConf};
use crate::runtime::metrics::Kind;
use gannet_conf::registry::{self, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::path::Path;
use std::sync::Arc;

/// Block directives nginx has that gannet does not implement yet, with the reason shown.
const NOT_YET: &[(&str, &str)] = &[("mail", "the mail module is not supported")];

/// Directive families of nginx modules gannet has not built yet (by name prefix).
const NOT_YET_FAMILIES: &[(&str, &str)] = &[
    ("proxy_", "this proxy directive is not supported yet"),
    ("fastcgi_", "this FastCGI directive is not supported yet"),
    ("uwsgi_", "this uwsgi directive is not supported yet"),
    ("scgi_", "this SCGI directive is not supported yet"),
    ("ssl_", "this TLS directive is not supported yet"),
    ("http2", "this HTTP/2 directive is not supported yet"),
];

const STRUCTURE: &[Spec] = &[
    Spec {
        name: "upstream",
        ctx: Ctx::HTTP,
        args: registry::Args::Exactly(1),
        block: true,
    },
    Spec {
        name: "match",
        ctx: Ctx::HTTP,
        args: registry::Args::Exactly(1),
        block: true,
    },
    Spec {
        name: "events",
        ctx: Ctx::MAIN,
        args: registry::Args::Exactly(0),
        block: true,
    },
    Spec {
        name: "http",
        ctx: Ctx::MAIN,
        args: registry::Args::Exactly(0),
        block: true,
    },
    Spec {
        name: "server",
        ctx: Ctx::HTTP,
        args: registry::Args::Exactly(0),
        block: true,
    },
    Spec {
        name: "location",
        ctx: Ctx(Ctx::SERVER.0 | Ctx::LOCATION.0),
        args: registry::Args::Between(1, 2),
        block: true,
    },
    Spec {
        name: "listen",
        ctx: Ctx::SERVER,
        args: registry::Args::AtLeast(1),
        block: false,
    },
    Spec {
        name: "server_name",
        ctx: Ctx::SERVER,
        args: registry::Args::AtLeast(1),
        block: false,
    },
];

/// Build from a parsed tree (the file's, or the embedded default's, after `-g`'s directives);
/// relative paths in it resolve against `prefix`.
pub fn build(tree: &[Directive], prefix: &Path) -> Result<Config, ConfError> {
    let _vars = user_vars::LoadScope::begin();
    let mut cfg = Config {
        main: MainConf::default(),
        process: Default::default(),
        listens: Vec::new(),
        notices: Vec::new(),
        warnings: Vec::new(),
        log_files: Vec::new(),
        error_files: Vec::new(),
        probes: Vec::new(),
        resolving: Vec::new(),
        staplers: Vec::new(),
        purge_zones: Vec::new(),
        acme: None,
        stream: None,
        mail: None,
        temp_dirs: Vec::new(),
    };
    let mut http_blocks = Vec::new();
    let mut stream_block = None;
    let mut mail_block = None;
    for d in tree {
        match d.name.as_str() {
            "http" => {
                check(d, Ctx::MAIN)?;
                if !http_blocks.is_empty() {
                    return Err(d.error("\"http\" directive is duplicate"));
                }
                http_blocks.push(d);
            }
            "stream" => {
                if d.block.is_none() || !d.args.is_empty() {
                    return Err(d.error("invalid number of arguments in \"stream\" directive"));
                }
                if stream_block.replace(d).is_some() {
                    return Err(d.error("\"stream\" directive is duplicate"));
                }
            }
            "mail" => {
                if d.block.is_none() || !d.args.is_empty() {
                    return Err(d.error("invalid number of arguments in \"mail\" directive"));
                }
                if mail_block.replace(d).is_some() {
                    return Err(d.error("\"mail\" directive is duplicate"));
                }
            }
            "events" => {
                check(d, Ctx::MAIN)?;
                for e in d.block.as_deref().unwrap_or_default() {
                    main_directive(&mut cfg, e, prefix, Ctx::EVENTS)?;
                }
            }
            _ => main_directive(&mut cfg, d, prefix, Ctx::MAIN)?,
        }
    }
    cfg.process.finish()?;
    if let Some(http) = http_blocks.first() {
        load_http(&mut cfg, http, prefix)?;
    }
    if let Some(stream) = stream_block {
        let http: Vec<_> = cfg.listens.iter().map(|g| g.listen.endpoint()).collect();
        let notes = (&mut cfg.notices, &mut cfg.warnings);
        let mut conf = crate::stream::build(stream, prefix, &http, notes)?;
        cfg.error_files.append(&mut conf.error_files);
        cfg.staplers.append(&mut conf.staplers);
        cfg.stream = Some(Arc::new(conf));
    }
    if let Some(mail) = mail_block {
        let taken: Vec<_> = cfg.all_listens().map(|l| l.endpoint()).collect();
        let notes = (&mut cfg.notices, &mut cfg.warnings);
        let mut conf = crate::mail::build(mail, prefix, &taken, notes)?;
        cfg.error_files.append(&mut conf.error_files);
        cfg.mail = Some(Arc::new(conf));
    }
    user_vars::check()?;
    // Printed by `gannet -t` as well as logged at start.
    cfg.notices.extend(cfg.process.warnings.iter().cloned());
    cfg.notices.extend(cfg.warnings.iter().cloned());
    Ok(cfg)
}

fn check(d: &Directive, ctx: Ctx) -> Result<(), ConfError> {
    let spec = STRUCTURE
        .iter()
        .find(|s| s.name == d.name)
        .ok_or_else(|| d.error(format!("unknown directive \"{}\"", d.name)))?;
    registry::check(spec, d, ctx)
}

/// A directive in main or events context (or an ignored / unknown one there).
fn main_directive(
    cfg: &mut Config,
    d: &Directive,
    prefix: &Path,
    ctx: Ctx,
) -> Result<(), ConfError> {
    if let Some(spec) = main_conf::DIRECTIVES.iter().find(|s| s.name == d.name) {
        registry::check(spec, d, ctx)?;
        cfg.main.set(d, prefix)?;
        return Ok(());
    }
    if let Some(spec) = process_conf::DIRECTIVES.iter().find(|s| s.name == d.name) {
        registry::check(spec, d, ctx)?;
        cfg.process.set(d, prefix)?;
        return Ok(());
    }
    other_directive(cfg, d)
}

/// Ignored, not-yet-supported, misplaced or unknown: a notice or a clear error.
fn other_directive(cfg: &mut Config, d: &Directive) -> Result<(), ConfError> {
    if let Some(why) = ignored::lookup(&d.name) {
        cfg.notices.push(format!(
            "{}: \"{}\" has no effect in gannet: {why}",
            d.loc, d.name
        ));
        return Ok(());
    }
    if let Some((_, why)) = NOT_YET.iter().find(|(n, _)| *n == d.name) {
        return Err(d.error(format!("\"{}\": {why}", d.name)));
    }
    if STRUCTURE.iter().any(|s| s.name == d.name)
        || modules::find(&d.name).is_some()
        || main_conf::DIRECTIVES.iter().any(|s| s.name == d.name)
        || process_conf::DIRECTIVES.iter().any(|s| s.name == d.name)
    {
        return Err(d.error(format!("\"{}\" directive is not allowed here", d.name)));
    }
    if let Some((_, why)) = NOT_YET_FAMILIES
        .iter()
        .find(|(prefix, _)| d.name.starts_with(prefix))
    {
        return Err(d.error(format!("\"{}\": {why}", d.name)));
    }
    Err(d.error(format!("unknown directive \"{}\"", d.name)))
}

/// Apply a module directive (or `error_log`) at an http, server or location level.
fn level_directive(
    cfg: &mut Config,
    d: &Directive,
    lc: &mut LocConf,
    lctx: &mut LoadCtx,
    ctx: Ctx,
) -> Result<(), ConfError> {
    user_vars::at(&d.loc);
    if let Some((spec, set)) = modules::find(&d.name) {
        registry::check(spec, d, ctx)?;
        if d.name == "if" {
            return load_if(cfg, d, lc, lctx, ctx);
        }
        if d.name == "limit_except" {
            return load_limit_except(cfg, d, lc, lctx);
        }
        return set(d, lc, lctx);
    }
    if d.name == "error_log" {
        let spec = main_conf::DIRECTIVES.iter().find(|s| s.name == "error_log");
        if let Some(spec) = spec {
            registry::check(spec, d, ctx)?;
        }
        return crate::errlog::set_nested(d, &lctx.prefix, &mut lc.error_log, &mut cfg.error_files);
    }
    other_directive(cfg, d)
}

/// `if (condition) { ... }`: in a location, a nested configuration applied when the
/// condition holds; at server level, rewrite statements only (nginx's "server if").
fn load_if(
    cfg: &mut Config,
    d: &Directive,
    lc: &mut LocConf,
    lctx: &mut LoadCtx,
    ctx: Ctx,
) -> Result<(), ConfError> {
    let in_location = ctx.contains(Ctx::LOCATION);
    let mut inner = LocConf::default();
    let outer = std::mem::replace(&mut lctx.prefixless, true);
    for c in d.block.as_deref().unwrap_or_default() {
        let foreign = modules::find(&c.name).is_some_and(|(spec, _)| {
            !modules::rewrite::DIRECTIVES
                .iter()
                .any(|r| r.name == spec.name)
        });
        if !in_location && foreign {
            return Err(c.error(format!("\"{}\" directive is not allowed here", c.name)));
        }
        level_directive(cfg, c, &mut inner, lctx, ctx.or(Ctx::IF))?;
    }
    lctx.prefixless = outer;
    // Back at the `if` line for the variables of its condition.
    user_vars::at(&d.loc);
    modules::rewrite::add_if(d, lc, inner, in_location)
}

/// `limit_except METHOD ... { allow/deny ... }`: the settings for the other methods, merged
/// with the location's once that is complete (`modules::access::merge_limit_except`).
fn load_limit_except(
    cfg: &mut Config,
    d: &Directive,
    lc: &mut LocConf,
    lctx: &mut LoadCtx,
) -> Result<(), ConfError> {
    if lc.access.limit_except.is_some() {
        return Err(d.error("\"limit_except\" directive is duplicate"));
    }
    let allowed = modules::access::limit_except_methods(d)?;
    let mut inner = LocConf::default();
    // A nameless location to nginx: `proxy_pass` may not have a URI part there.
    let outer = std::mem::replace(&mut lctx.prefixless, true);
    for c in d.block.as_deref().unwrap_or_default() {
        level_directive(cfg, c, &mut inner, lctx, Ctx::LIMIT_EXCEPT)?;
    }
    lctx.prefixless = outer;
    user_vars::at(&d.loc);
    lc.access.limit_except = Some(Arc::new(modules::access::LimitExcept {
        allowed,
        conf: Arc::new(inner),
    }));
    Ok(())
}

fn load_http(cfg: &mut Config, http: &Directive, prefix: &Path) -> Result<(), ConfError> {
    let mut lctx = LoadCtx::new(prefix);
    lctx.metrics = modules::metrics::used(http.block.as_deref().unwrap_or_default());
    let mut conf = LocConf::default();
    let body = http.block.as_deref().unwrap_or_default();
    // http's `resolver` before the groups: a `server ... resolve` without its own uses it.
    let mut http_resolver: crate::upstream::HttpResolver = (None, None);
    for d in body.iter() {
        match d.name.as_str() {
            "resolver" => {
                http_resolver.0 = Some(Arc::new(crate::resolver::parse(d)?));
            }
            "resolver_timeout" if d.args.len() == 1 => {
                let ms = gannet_conf::setters::msec_arg(d, 0)?;
                http_resolver.1 = Some(std::time::Duration::from_millis(ms));
            }
            _ => {}
        }
    }
    // Groups first: a location may name one defined further down, as in nginx.
    for d in body.iter().filter(|d| d.name == "upstream") {
        check(d, Ctx::HTTP)?;
        let mut up = crate::upstream::parse(d, &http_resolver)?;
        modules::metrics::register_group(&lctx, &mut up);
        if lctx.upstreams.contains_key(&up.name) {
            return Err(d.error(format!("duplicate upstream \"{}\"", up.name)));
        }
        lctx.upstreams.insert(up.name.clone(), Arc::new(up));
    }
    for d in body.iter().filter(|d| d.name == "match") {
        check(d, Ctx::HTTP)?;
        let m = modules::health_check::parse_match(d)?;
        if lctx
            .matches
            .insert(d.args[0].clone(), Arc::new(m))
            .is_some()
        {
            return Err(d.error(format!("duplicate match \"{}\"", d.args[0])));
        }
    }
    // The limit zones before the rest: a `limit_req` or `limit_conn` above one may name it.
    let is_zone = |d: &&Directive| {
        modules::limit_zone::is_zone(&d.name) || modules::gateway_cache::is_path(&d.name)
    };
    let rest = |d: &&Directive| {
        !matches!(
            d.name.as_str(),
            "server" | "upstream" | "match" | "redis_server"
        ) && !is_zone(d)
    };
    // `redis_server` blocks before the zones that name them.
    let is_redis = |d: &&Directive| d.name == "redis_server";
    let first = body.iter().filter(is_redis);
    for d in first
        .chain(body.iter().filter(is_zone))
        .chain(body.iter().filter(rest))
    {
        level_directive(cfg, d, &mut conf, &mut lctx, Ctx::HTTP)?;
    }
    if http_resolver.0.is_some() {
        // One resolver (one cache of answers) for the groups and the locations.
        conf.core.resolver = http_resolver.0.clone();
    }
    if conf.core.root.is_none() {
        // nginx's compiled-in default: `html` under the prefix.
        conf.core.root = Some(Template::literal(&prefix.join("html").to_string_lossy()));
    }
    if conf.client_body.temp_path.is_none() {
        let t = modules::client_body::default_temp_path(prefix);
        lctx.temp_dirs.push(t.dir.clone());
        conf.client_body.temp_path = Some(t);
    }
    // nginx's compiled-in temp paths for answers read ahead of their clients.
    // (memcached's answers are never read ahead: nginx has no `memcached_temp_path`.)
    for p in modules::gateway::Proto::ALL {
        if matches!(
            p,
            modules::gateway::Proto::Memcached | modules::gateway::Proto::Grpc
        ) {
            continue;
        }
        let c = modules::gateway::conf_mut(&mut conf, p);
        if c.temp_path.is_none() {
            let t = modules::client_body::temp_path_in(prefix, &format!("{}temp", p.prefix()));
            lctx.temp_dirs.push(t.dir.clone());
            c.temp_path = Some(t);
        }
    }
    // Every `map` is an http-level directive, so all are known by now.
    let vars = user_vars::table();
    let mut groups: Vec<ListenGroup> = Vec::new();
    // Where each group was first made TLS, for the missing-certificate error.
    let mut ssl_at: Vec<Option<gannet_conf::Loc>> = Vec::new();
    for d in body.iter().filter(|d| d.name == "server") {
        check(d, Ctx::HTTP)?;
        let (server, listens) = load_server(cfg, d, &conf, &vars, &mut lctx)?;
        let server = Arc::new(server);
        for (l, loc) in listens {
            let i = groups
                .iter()
                .position(|g| g.listen.endpoint() == l.endpoint())
                .unwrap_or(groups.len());
            if i == ssl_at.len() {
                ssl_at.push(None);
            }
            if (l.ssl || l.quic) && ssl_at[i].is_none() {
                ssl_at[i] = Some(loc.clone());
            }
            match groups.get_mut(i) {
                Some(g) => {
                    g.listen.ssl |= l.ssl;
                    g.listen.http2 |= l.http2;
                    g.listen.proxy_protocol |= l.proxy_protocol;
                    if l.default_server {
                        if g.listen.default_server {
                            return Err(ConfError::at(
                                &loc,
                                format!("a duplicate default server for {}", l.endpoint()),
                            ));
                        }
                        g.default = g.servers.len();
                        g.listen.default_server = true;
                    }
                    g.servers.push(server.clone());
                }
                None => groups.push(ListenGroup {
                    listen: l,
                    servers: vec![server.clone()],
                    default: 0,
                }),
            }
        }
    }
    // The servers' `set`s are all read: which built-in variables they assign.
    user_vars::finish(&vars);
    // As nginx: a TLS address needs a certificate in its default server (the one that
    // answers clients whose SNI name no server has).
    for (g, at) in groups.iter().zip(&ssl_at) {
        if let Some(at) = at {
            let name = if g.listen.quic { "quic" } else { "ssl" };
            let default = &g.servers[g.default];
            if default.tls.is_none() {
                return Err(ConfError::at(
                    at,
                    format!(
                        "no \"ssl_certificate\" is defined for the \"listen ... {name}\" directive ({} has none)",
                        describe_server(default)
                    ),
                ));
            }
            // QUIC carries TLS 1.3 only (RFC 9001).
            if g.listen.quic && !default.conf.tls.protocols().tls13 {
                return Err(ConfError::at(
                    at,
                    "\"ssl_protocols\" must enable TLSv1.3 for the \"listen ... quic\" directive",
                ));
            }
        }
    }
    if groups.iter().any(|g| g.listen.quic) {
        // Made here, in the master, for the workers it forks to share (`conn::quic`).
        crate::conn::quic::default_host_key();
    }
    modules::otel::check_exporter(&conf, &lctx)?;
    cfg.listens = groups;
    cfg.log_files = lctx.log_files;
    cfg.probes = lctx.probes;
    cfg.resolving = crate::upstream::resolving(lctx.upstreams.values());
    let fanout = lctx.caches.values().filter(|z| z.redis.is_some());
    cfg.purge_zones = fanout.cloned().collect();
    cfg.staplers = std::mem::take(&mut lctx.tls.staplers);
    cfg.acme = std::mem::take(&mut lctx.acme).finish(&mut lctx.warnings)?;
    lctx.temp_dirs.sort();
    lctx.temp_dirs.dedup();
    cfg.temp_dirs = lctx.temp_dirs;
    cfg.notices.append(&mut lctx.notices);
    cfg.warnings.append(&mut lctx.warnings);
    Ok(())
}

type Listens = Vec<(Listen, gannet_conf::Loc)>;

fn load_server(
    cfg: &mut Config,
    sd: &Directive,
    http: &LocConf,
    vars: &Arc<VarTable>,
    lctx: &mut LoadCtx,
) -> Result<(ServerConf, Listens), ConfError> {
    let mut conf = LocConf::default();
    let mut names = ServerNames::default();
    let mut primary = None;
    let mut server_names = Vec::new();
    let mut listens = Vec::new();
    let body = sd.block.as_deref().unwrap_or_default();
    for d in body.iter().filter(|d| d.name != "location") {
        match d.name.as_str() {
            "listen" => {
                check(d, Ctx::SERVER)?;
                for l in Listen::parse_range(d)? {
                    listens.push((l, d.loc.clone()));
                }
            }
            "server_name" => {
                check(d, Ctx::SERVER)?;
                for n in &d.args {
                    // `$server_name` is the first name as nginx keeps it: a regex as
                    // written, a `.name` without its dot, others in lower case; `""` too.
                    if primary.is_none() {
                        primary = Some(router::primary_name(n));
                    }
                    server_names.push(n.clone());
                    names.add(n).map_err(|e| d.error(e))?;
                }
            }
            _ => level_directive(cfg, d, &mut conf, lctx, Ctx::SERVER)?,
        }
    }
    // A server without `server_name` has the name "", as nginx's.
    if primary.is_none() {
        names.add("").map_err(|e| sd.error(e))?;
    }
    conf.merge(http);
    // ALPN offers h2 when the server has `http2 on` or one of its addresses `listen ... http2`.
    let h2 = conf.http2.enabled() || listens.iter().any(|(l, _)| l.http2);
    conf.tls.acme = modules::acme::server_slot(&conf, &server_names, lctx)?;
    conf.tls.resolver = conf
        .core
        .resolver
        .clone()
        .map(|r| (r, conf.core.resolver_timeout()));
    let tls = crate::tls::build_server(&conf.tls, h2, lctx, &sd.loc)?;
    if listens.is_empty() {
        listens.push((Listen::default_for_server(), sd.loc.clone()));
    }
    let conf = Arc::new(conf);
    let mut locations = Vec::new();
    let mut named = Vec::new();
    for d in body.iter().filter(|d| d.name == "location") {
        check(d, Ctx::SERVER)?;
        let loc = load_location(cfg, d, &conf, None, lctx)?;
        if matches!(loc.matcher, Matcher::Named(_)) {
            named.push(Arc::new(loc));
        } else {
            locations.push(Arc::new(loc));
        }
    }
    check_duplicates(&locations, body)?;
    let zone = conf.status_zone.unwrap_or_else(|| match &primary {
        Some(n) if !n.is_empty() => modules::metrics::register(lctx, Kind::Server, n),
        _ => modules::metrics::register(lctx, Kind::Server, &listens[0].0.endpoint().to_string()),
    });
    let server = ServerConf {
        zone,
        names,
        primary_name: primary.unwrap_or_default(),
        conf,
        locations,
        named,
        vars: vars.clone(),
        tls,
    };
    Ok((server, listens))
}

/// A server for messages: its first name, or where it is defined.
fn describe_server(s: &ServerConf) -> String {
    if s.primary_name.is_empty() {
        "its default server".to_string()
    } else {
        format!("default server \"{}\"", s.primary_name)
    }
}

/// nginx refuses two locations with the same kind and path.
fn check_duplicates(locs: &[Arc<Location>], body: &[Directive]) -> Result<(), ConfError> {
    let key = |l: &Location| match &l.matcher {
        Matcher::Exact(p) => format!("={p}"),
        Matcher::Prefix { path, .. } => path.clone(),
        Matcher::Regex(r) => format!("~{}", r.re.as_str()),
        Matcher::Named(n) => format!("@{n}"),
    };
    let mut seen = std::collections::HashSet::new();
    let defs: Vec<&Directive> = body.iter().filter(|d| d.name == "location").collect();
    for (l, d) in locs
        .iter()
        .zip(defs.iter().filter(|d| !d.args[0].starts_with('@')))
    {
        if !seen.insert(key(l)) {
            return Err(d.error(format!(
                "duplicate location \"{}\"",
                d.args.last().map_or("", String::as_str)
            )));
        }
    }
    Ok(())
}

fn parse_matcher(d: &Directive, parent: Option<&Matcher>) -> Result<Matcher, ConfError> {
    let (modifier, path) = match d.args.as_slice() {
        [m, p] => (m.as_str(), p.as_str()),
        [one] => {
            // Modifiers may be glued to the path: `location =/x`, `location ~*\.php$`.
            let one = one.as_str();
            if let Some(n) = one.strip_prefix('@') {
                return Ok(Matcher::Named(n.to_string()));
            }
            ["^~", "~*", "~", "="]
                .iter()
                .find_map(|m| {
                    one.strip_prefix(m)
                        .filter(|rest| !rest.is_empty())
                        .map(|rest| (*m, rest))
                })
                .unwrap_or(("", one))
        }
        _ => return Err(d.error("invalid number of arguments in \"location\" directive")),
    };
    if matches!(parent, Some(Matcher::Exact(_))) {
        return Err(d.error(format!(
            "location \"{path}\" cannot be inside the exact location"
        )));
    }
    if matches!(parent, Some(Matcher::Named(_))) {
        return Err(d.error(format!(
            "location \"{path}\" cannot be inside the named location"
        )));
    }
    let m = match modifier {
        "=" => Matcher::Exact(path.to_string()),
        "^~" => Matcher::Prefix {
            path: path.to_string(),
            no_regex: true,
        },
        "" => Matcher::Prefix {
            path: path.to_string(),
            no_regex: false,
        },
        "~" | "~*" => {
            Matcher::Regex(CapRegex::compile(path, modifier == "~*").map_err(|e| d.error(e))?)
        }
        m => return Err(d.error(format!("invalid location modifier \"{m}\""))),
    };
    if let (
        Some(Matcher::Prefix { path: pp, .. }),
        Matcher::Exact(p) | Matcher::Prefix { path: p, .. },
    ) = (parent, &m)
    {
        if !p.starts_with(pp.as_str()) {
            return Err(d.error(format!("location \"{p}\" is outside location \"{pp}\"")));
        }
    }
    if matches!(m, Matcher::Named(_)) && parent.is_some() {
        return Err(d.error("named location can be on the server level only"));
    }
    Ok(m)
}

fn load_location(
    cfg: &mut Config,
    d: &Directive,
    parent_conf: &LocConf,
    parent: Option<&Matcher>,
    lctx: &mut LoadCtx,
) -> Result<Location, ConfError> {
    let matcher = parse_matcher(d, parent)?;
    let mut conf = LocConf::default();
    let body = d.block.as_deref().unwrap_or_default();
    lctx.prefixless = matches!(matcher, Matcher::Regex(_) | Matcher::Named(_));
    for c in body.iter().filter(|c| c.name != "location") {
        level_directive(cfg, c, &mut conf, lctx, Ctx::LOCATION)?;
    }
    lctx.prefixless = false;
    if conf.core.alias.is_some() {
        // What the alias replaces, here and in the locations nested in this one.
        if let Matcher::Exact(p) | Matcher::Prefix { path: p, .. } = &matcher {
            conf.core.alias_of = Some(Arc::from(p.as_str()));
        }
    }
    conf.merge(parent_conf);
    modules::rewrite::merge_ifs(&mut conf);
    modules::proxy_ssl::finish(&mut conf, lctx, &d.loc)?;
    modules::gateway_cache::finish(&conf, lctx, &d.loc);
    modules::access::merge_limit_except(&mut conf);
    modules::proxy_ssl::finish_limit_except(&mut conf, lctx, &d.loc)?;
    if let Some(check) = conf.health_check.clone() {
        let Some(crate::modules::gateway::Backend::Group(up)) = conf.proxy.gw.pass.clone() else {
            let at = body.iter().find(|c| c.name == "health_check").unwrap_or(d);
            return Err(at.error("\"health_check\" needs \"proxy_pass\" to an upstream group"));
        };
        if check.mandatory {
            for i in 0..up.servers.len() {
                up.set_healthy(i, false);
            }
        }
        let https = matches!(
            conf.proxy.target.as_deref(),
            Some(modules::proxy::Target::Fixed(dest)) if dest.tls
        );
        let tls = match (&conf.proxy.client_tls, https) {
            (Some(setup), true) => {
                let name = conf.proxy.ssl.name.as_ref().and_then(|t| t.as_literal());
                let name = name.unwrap_or(&up.name);
                let name = crate::tls::client::server_name(name).ok_or_else(|| {
                    d.error(format!(
                        "invalid \"proxy_ssl_name\" \"{name}\" for health checks"
                    ))
                })?;
                Some((setup.clone(), name))
            }
            _ => None,
        };
        lctx.probes.push(crate::config::Probe {
            host: up.name.clone(),
            upstream: up,
            check,
            tls,
        });
    }
    let conf = Arc::new(conf);
    let mut children = Vec::new();
    for c in body.iter().filter(|c| c.name == "location") {
        check(c, Ctx::LOCATION)?;
        children.push(Arc::new(load_location(
            cfg,
            c,
            &conf,
            Some(&matcher),
            lctx,
        )?));
    }
    let auto_redirect = router::auto_redirect(&matcher, body.iter().map(|c| c.name.as_str()));
    Ok(Location {
        matcher,
        conf,
        children,
        auto_redirect,
    })
}
