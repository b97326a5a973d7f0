//! The loaded configuration: an immutable tree built once from the parsed directives, then
//! shared by every worker behind an `Arc`.
//!
//! Owns the block structure (main, events, http, server, location, types) and the main and
//! events directives (`worker_processes`, `pid`, `daemon`, `error_log`, `worker_rlimit_nofile`,
//! `worker_connections`); every other directive belongs to a module in `crate::modules`.
//! Location settings are inherited http -> server -> location by a merge step at load time,
//! so the request path never looks further than its own location.

mod ignored;
pub mod listen;
pub mod load;
pub mod main_conf;
pub mod process_conf;
pub mod temp_dirs;

use crate::http::router::{Location, ServerNames};
use crate::http::user_vars::VarTable;
use crate::modules::access_log::LogFile;
use crate::modules::LocConf;
use listen::Listen;
pub use main_conf::MainConf;
use std::sync::Arc;

/// Everything gannet runs with.
#[derive(Debug)]
pub struct Config {
    pub main: MainConf,
    /// What the worker process runs as and with: `user`, `env`, `working_directory`...
    pub process: process_conf::ProcessConf,
    /// One entry per address to bind; several servers may share it.
    pub listens: Vec<ListenGroup>,
    /// Messages for directives accepted without effect (printed by `gannet -t`).
    pub notices: Vec<String>,
    /// Logged as warnings at start and at reload (and printed by `gannet -t` with the
    /// notices): see `LoadCtx::warnings`.
    pub warnings: Vec<String>,
    /// Every access log file, for reopening (SIGUSR1).
    pub log_files: Vec<Arc<LogFile>>,
    /// Every http/server/location error log, for reopening (SIGUSR1).
    pub error_files: Vec<Arc<crate::errlog::Log>>,
    /// Every `health_check`: what the first worker probes.
    pub probes: Vec<Probe>,
    /// Every upstream `server NAME resolve` (a group and the server's index): what the
    /// first worker keeps resolved.
    pub resolving: Vec<(Arc<crate::upstream::Upstream>, usize)>,
    /// Every certificate stapled from its OCSP responder: what the first worker queries.
    pub staplers: Vec<Arc<crate::tls::stapling::Stapler>>,
    /// Every `*_cache_path` with `redis=name`: what the first worker listens for purges on.
    pub purge_zones: Vec<Arc<crate::cache::path::Zone>>,
    /// The ACME certificates and pending HTTP-01 challenges (`acme_certificate`).
    pub acme: Option<Arc<crate::acme::Acme>>,
    /// The `stream {}` block, if any; its listens come after `listens` in the group
    /// numbering of the workers' sockets (`Config::all_listens`).
    pub stream: Option<Arc<crate::stream::StreamConf>>,
    /// The `mail {}` block, if any; its listens come after the stream ones.
    pub mail: Option<Arc<crate::mail::MailConf>>,
    /// Every `*_temp_path` folder: made by the master for the workers' account
    /// (`temp_dirs::create`).
    pub temp_dirs: Vec<std::path::PathBuf>,
}

impl Config {
    /// Every address to listen on: http's groups, then the stream servers', then the mail
    /// servers'. A worker's
    /// socket comes with its index in this order.
    pub fn all_listens(&self) -> impl Iterator<Item = &Listen> {
        let stream = self.stream.iter().flat_map(|s| s.listens.iter());
        let mail = self.mail.iter().flat_map(|m| m.listens.iter());
        self.listens
            .iter()
            .map(|g| &g.listen)
            .chain(stream)
            .chain(mail)
    }
}

/// A `health_check` and the group it watches.
#[derive(Debug, Clone)]
pub struct Probe {
    pub upstream: Arc<crate::upstream::Upstream>,
    pub check: Arc<crate::modules::health_check::HealthCheck>,
    /// The Host header of the probes (the group's name, as `$proxy_host`).
    pub host: String,
    /// `proxy_pass https://`: probes go over TLS with the location's setup, to this name
    /// (`proxy_ssl_name` if it has no variables, else the group's name).
    pub tls: Option<(
        Arc<crate::tls::client::ClientTls>,
        rustls::pki_types::ServerName<'static>,
    )>,
}

/// A bound address and the virtual hosts reachable through it.
#[derive(Debug)]
pub struct ListenGroup {
    pub listen: Listen,
    pub servers: Vec<Arc<ServerConf>>,
    /// Index into `servers` of the `default_server` (the first one if none is marked).
    pub default: usize,
}

/// One `server {}` block.
#[derive(Debug)]
pub struct ServerConf {
    pub names: ServerNames,
    /// The first `server_name`, used in redirects (`server_name_in_redirect`).
    pub primary_name: String,
    /// Server-level settings, already merged with http.
    pub conf: Arc<LocConf>,
    /// Top-level locations, in config order.
    pub locations: Vec<Arc<Location>>,
    /// `location @name` blocks.
    pub named: Vec<Arc<Location>>,
    /// The config's `map` variables (shared by every server).
    pub vars: Arc<VarTable>,
    /// Its TLS setup, when it has a certificate (or rejects handshakes).
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// Its `metrics` key: its `status_zone`, else its first name or first address (0:
    /// not counted).
    pub zone: crate::runtime::metrics::Key,
}
