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
//! - [`realip`]: `set_real_ip_from` (ngx_stream_realip_module);
//! - [`splice`]: `proxy_splice`, the plain TCP relay through splice(2) (gannet's own);
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
pub mod limit_conn;
pub mod log;
pub mod map;
pub mod proxy;
pub mod realip;
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
    /// Every address to listen on, each served by `servers[i]` (nginx allows one server
    /// per address in stream: there is no name to tell them apart).
    pub listens: Vec<Listen>,
    pub servers: Vec<Arc<core::Server>>,
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
    let sets: Vec<&Directive> = body
        .iter()
        .filter(|d| d.name == "server")
        .flat_map(|d| d.block.iter().flatten())
        .filter(|d| d.name == "set" && d.args.len() == 2)
        .collect();
    let maps = Arc::new(map::Maps::build(&maps, &sets, notes.0)?);
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
        logs: Vec::new(),
        error_files: Vec::new(),
        staplers: Vec::new(),
    };
    for s in body.iter().filter(|d| d.name == "server") {
        let (server, listens) = core::server(s, &top, &ctx)?;
        let server = Arc::new(server);
        for l in listens {
            let at = l.endpoint();
            if out.listens.iter().any(|o| o.endpoint() == at) || http.contains(&at) {
                return Err(s.error(format!("duplicate \"{at}\" address and port pair")));
            }
            out.listens.push(l);
            out.servers.push(server.clone());
        }
    }
    out.logs = ctx.logs.take();
    out.error_files = ctx.error_files.take();
    let mut h = ctx.http.borrow_mut();
    notes.0.append(&mut h.notices);
    notes.1.append(&mut h.warnings);
    out.staplers = std::mem::take(&mut h.tls.staplers);
    Ok(out)
}
