//! nginx's stream modules (src/stream/): the `stream {}` block, a layer-4 proxy of TCP
//! connections and UDP datagrams. One file per nginx module:
//!
//! - [`core`]: `server`, `listen`, the session from accept to its log line
//!   (ngx_stream_core_module);
//! - [`proxy`]: `proxy_pass` and the `proxy_*` directives, the TCP relay and the UDP
//!   sessions (ngx_stream_proxy_module);
//! - [`upstream`]: `upstream` groups, with the HTTP side's balancing
//!   (ngx_stream_upstream_module and its hash / least_conn / random methods);
//! - [`access`]: `allow` / `deny` (ngx_stream_access_module);
//! - [`limit_conn`]: `limit_conn_zone` / `limit_conn` (ngx_stream_limit_conn_module);
//! - [`log`]: `log_format` / `access_log` (ngx_stream_log_module);
//! - [`return_`]: `return` (ngx_stream_return_module);
//! - [`pass`]: `pass`, the connection handed to another listener (ngx_stream_pass_module);
//! - [`realip`]: `set_real_ip_from` (ngx_stream_realip_module);
//! - [`relay`]: the plain TCP relay (both sides plain sockets, no rate), the proxy's
//!   common case, made for its cost per session; its sockets wait in [`epoll`], a set of
//!   its own that a socket's close leaves without an `epoll_ctl`;
//! - [`splice`]: `proxy_splice`, the plain relay through splice(2) (gannet's own);
//! - [`ssl`]: TLS terminated on `listen ... ssl` (ngx_stream_ssl_module);
//! - [`ssl_preread`]: the ClientHello's fields without terminating TLS
//!   (ngx_stream_ssl_preread_module);
//! - [`map`]: `map`, `geo` and `split_clients` (ngx_stream_map_module,
//!   ngx_stream_geo_module, ngx_stream_split_clients_module);
//! - [`variables`]: the variables and templates (ngx_stream_variables.c).
//!
//! The listening sockets are bound by the master with the HTTP ones (`runtime::listener`,
//! after `Config::listens` in the numbering) and so survive reloads and binary upgrades; a
//! session counts as a connection of its worker, so a draining worker waits for it (up to
//! `worker_shutdown_timeout`).

pub mod access;
pub mod core;
pub mod epoll;
pub mod limit_conn;
pub mod log;
pub mod map;
pub mod pass;
pub mod proxy;
pub mod realip;
pub mod relay;
#[path = "return.rs"]
pub mod return_;
pub mod splice;
pub mod ssl;
pub mod ssl_preread;
pub mod upstream;
pub mod variables;

use crate::config::listen::{Endpoint, Listen};
use gannet_conf::{ConfError, Directive};
use std::path::Path;
use std::sync::Arc;

/// The loaded `stream {}` block.
#[derive(Debug)]
pub struct StreamConf {
    /// Every address to listen on, each served by `servers[i]`, its default server,
    /// until SNI picks another of `virtuals[i]`.
    pub listens: Vec<Listen>,
    pub servers: Vec<Arc<core::Server>>,
    /// The servers of `listens[i]` that SNI chooses among (nginx's virtual servers);
    /// empty when there is nothing to choose (one server without a `~regex` name).
    pub virtuals: Vec<Vec<Arc<core::Server>>>,
    /// Every access log, for reopening (SIGUSR1).
    pub logs: Vec<Arc<log::Log>>,
    /// Every stream `error_log` file (moved to `Config::error_files`, reopened with them).
    pub error_files: Vec<Arc<crate::errlog::Log>>,
    /// The certificates stapled from their OCSP responders (moved to `Config::staplers`).
    pub staplers: Vec<Arc<crate::tls::stapling::Stapler>>,
}

/// Build the `stream` block. `http`: the addresses http listens on (the same TCP address
/// in both is refused here, where nginx fails to bind it).
/// The TLS setups' notices and warnings go to `notes` (`Config::notices`, `::warnings`).
pub fn build(
    d: &Directive,
    prefix: &Path,
    http: &[Endpoint],
    notes: (&mut Vec<String>, &mut Vec<String>),
) -> Result<StreamConf, ConfError> {
    let body = d.block.as_deref().unwrap_or_default();
    let maps: Vec<&Directive> = body
        .iter()
        .filter(|d| matches!(d.name.as_str(), "map" | "split_clients" | "geo"))
        .collect();
    let names: Vec<&Directive> = body
        .iter()
        .filter(|d| d.name == "server")
        .flat_map(|d| d.block.iter().flatten())
        .filter(|d| d.name == "server_name")
        .collect();
    let sets: Vec<&Directive> = body
        .iter()
        .filter(|d| d.name == "server")
        .flat_map(|d| d.block.iter().flatten())
        .filter(|d| d.name == "set" && d.args.len() == 2)
        .collect();
    let maps = Arc::new(map::Maps::build(&maps, &sets, &names, notes.0)?);
    let mut upstreams = std::collections::HashMap::new();
    for u in body.iter().filter(|d| d.name == "upstream") {
        let up = upstream::parse(u, &maps)?;
        if upstreams
            .insert(up.group.name.clone(), Arc::new(up))
            .is_some()
        {
            return Err(u.error(format!("duplicate upstream \"{}\"", u.args[0])));
        }
    }
    let mut ctx = core::LoadCtx {
        prefix: prefix.to_path_buf(),
        maps: maps.clone(),
        upstreams: Arc::new(upstreams),
        formats: Default::default(),
        zones: Default::default(),
        logs: Default::default(),
        error_files: Default::default(),
        http: std::cell::RefCell::new(crate::modules::LoadCtx::new(prefix)),
    };
    for z in body.iter().filter(|d| d.name == "limit_conn_zone") {
        let zone = limit_conn::zone(z, &ctx.maps)?;
        let name = z.args[1]["zone=".len()..]
            .split(':')
            .next()
            .unwrap_or_default();
        if ctx.zones.insert(name.to_string(), zone).is_some() {
            return Err(z.error(format!("duplicate zone \"{name}\"")));
        }
    }
    for f in body.iter().filter(|d| d.name == "log_format") {
        log::format(f, &mut ctx)?;
    }
    // Settings of the stream level, inherited by every server that does not set them.
    let mut top = core::ServerConf::default();
    for e in body {
        match e.name.as_str() {
            "map" | "split_clients" | "geo" | "upstream" | "log_format" | "server"
            | "limit_conn_zone" => {}
            _ => core::apply(e, &mut top, &ctx, false)?,
        }
    }
    let mut out = StreamConf {
        listens: Vec::new(),
        servers: Vec::new(),
        virtuals: Vec::new(),
        logs: Vec::new(),
        error_files: Vec::new(),
        staplers: Vec::new(),
    };
    let servers: Vec<&Directive> = body.iter().filter(|d| d.name == "server").collect();
    let (listens, servers, virtuals) = addresses(&servers, &top, &ctx, http, &mut *notes.1)?;
    out.listens = listens;
    out.servers = servers;
    out.virtuals = virtuals;
    out.logs = ctx.logs.take();
    out.error_files = ctx.error_files.take();
    let mut h = ctx.http.borrow_mut();
    notes.0.append(&mut h.notices);
    notes.1.append(&mut h.warnings);
    out.staplers = std::mem::take(&mut h.tls.staplers);
    Ok(out)
}

/// An address being gathered from the servers' listens (nginx's ngx_stream_conf_addr_t).
struct Address {
    listen: Listen,
    /// Indexes of its servers, in config order; `default` is one of them.
    servers: Vec<usize>,
    default: usize,
    /// One of its listens set socket options (`backlog=`, `bind`, ...).
    options_set: bool,
}

type Addresses = (
    Vec<Listen>,
    Vec<Arc<core::Server>>,
    Vec<Vec<Arc<core::Server>>>,
);

/// The `server` blocks and their addresses, as nginx's ngx_stream_add_listen: several
/// servers may share an address (its `ssl` and `proxy_protocol` are any listen's), one of
/// them the `default_server` (else the first); one listen of it may set socket options.
/// Each TLS address needs a certificate (or `ssl_reject_handshake`) in its default server.
fn addresses(
    blocks: &[&Directive],
    top: &core::ServerConf,
    ctx: &core::LoadCtx,
    http: &[Endpoint],
    warnings: &mut Vec<String>,
) -> Result<Addresses, ConfError> {
    let mut loaded = Vec::new();
    let mut addrs: Vec<Address> = Vec::new();
    for (si, s) in blocks.iter().enumerate() {
        let (server, listens) = core::server(s, top, ctx)?;
        loaded.push(server);
        for core::ServerListen {
            listen,
            loc,
            sets_options,
        } in listens
        {
            let at = listen.endpoint();
            if http.contains(&at) {
                return Err(ConfError::at(
                    &loc,
                    format!("duplicate \"{at}\" address and port pair"),
                ));
            }
            let Some(a) = addrs.iter_mut().find(|a| a.listen.endpoint() == at) else {
                addrs.push(Address {
                    listen,
                    servers: vec![si],
                    default: si,
                    options_set: sets_options,
                });
                continue;
            };
            if a.servers.contains(&si) {
                return Err(ConfError::at(&loc, format!("a duplicate listen {at}")));
            }
            let (ssl, pp, default) = (
                a.listen.ssl | listen.ssl,
                a.listen.proxy_protocol | listen.proxy_protocol,
                a.listen.default_server,
            );
            if sets_options {
                if a.options_set {
                    return Err(ConfError::at(
                        &loc,
                        format!("duplicate listen options for {at}"),
                    ));
                }
                a.listen = listen.clone();
                a.options_set = true;
            }
            if listen.default_server {
                if default {
                    return Err(ConfError::at(
                        &loc,
                        format!("a duplicate default server for {at}"),
                    ));
                }
                a.default = si;
            }
            a.listen.default_server = default | listen.default_server;
            a.listen.ssl = ssl;
            a.listen.proxy_protocol = pp;
            a.servers.push(si);
        }
    }
    // The TLS setups of the servers on `ssl` addresses, then nginx's certificate checks.
    for (si, srv) in loaded.iter_mut().enumerate() {
        if addrs
            .iter()
            .any(|a| a.listen.ssl && a.servers.contains(&si))
        {
            srv.tls = ssl::setup(&srv.conf.ssl, &mut ctx.http.borrow_mut(), &srv.loc)?;
        }
    }
    for a in addrs.iter().filter(|a| a.listen.ssl) {
        let default = &loaded[a.default];
        let missing = match &default.tls {
            None => Some(default),
            // A default server that rejects handshakes without a certificate: each of
            // the others needs its own (or rejects too).
            Some(t) if t.config.is_none() => a
                .servers
                .iter()
                .map(|&i| &loaded[i])
                .find(|s| s.tls.is_none()),
            Some(_) => None,
        };
        if let Some(s) = missing {
            return Err(ConfError::bare(format!(
                "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive in {}",
                s.loc
            )));
        }
    }
    for a in &addrs {
        conflicts(a, &loaded, warnings);
    }
    let loaded: Vec<Arc<core::Server>> = loaded.into_iter().map(Arc::new).collect();
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for a in addrs {
        let default = loaded[a.default].clone();
        let choose = a.servers.len() > 1 || !default.names.regex.is_empty();
        out.2.push(match choose {
            true => a.servers.iter().map(|&i| loaded[i].clone()).collect(),
            false => Vec::new(),
        });
        let mut listen = a.listen;
        // The sessions' TCP_NODELAY comes with the accepted socket (`Listen::nodelay`).
        listen.nodelay = (listen.unix.is_none() && !listen.udp).then_some(default.conf.tcp_nodelay);
        out.0.push(listen);
        out.1.push(default);
    }
    Ok(out)
}

/// nginx's warning for a name two servers of an address have (the first keeps it).
fn conflicts(a: &Address, loaded: &[core::Server], warnings: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    for &i in &a.servers {
        let names = &loaded[i].names;
        let wild = names.suffix.iter().chain(&names.prefix);
        for n in names.exact.iter().chain(wild) {
            if !n.is_empty() && !seen.insert(n.as_str()) {
                warnings.push(format!(
                    "conflicting server name \"{n}\" on {}, ignored",
                    a.listen.endpoint()
                ));
            }
        }
    }
}
