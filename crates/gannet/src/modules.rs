//! The module list: every module that owns directives in http/server/location context, in one
//! table, and `LocConf`, the merged settings of one location, made of each module's config.
//!
//! Order matters only for lookup (a directive name belongs to exactly one module). The
//! request phases that use these modules run in the order written in `http::handler`.

pub mod access;
pub mod access_log;
pub mod acme;
pub mod addition;
pub mod auth_basic;
pub mod auth_request;
pub mod autoindex;
pub mod charset;
pub mod client_body;
pub mod compress;
pub mod core;
pub mod dav;
pub mod empty_gif;
pub mod error_page;
pub mod fastcgi;
pub mod file_cache;
pub mod flv;
pub mod gateway;
pub mod gateway_cache;
pub mod geo;
pub mod grpc;
pub mod gunzip;
pub mod headers;
pub mod health_check;
pub mod http2;
pub mod http3;
pub mod image_filter;
pub mod index;
pub mod limit_conn;
pub mod limit_rate;
pub mod limit_req;
pub mod limit_zone;
pub mod map;
pub mod memcached;
pub mod metrics;
pub mod mirror;
pub mod mp4;
pub mod otel;
pub mod proxy;
pub mod proxy_cookie;
pub mod proxy_ssl;
pub mod random_index;
pub mod realip;
pub mod redis;
pub mod referer;
pub mod rewrite;
pub mod scgi;
pub mod secure_link;
pub mod slice;
pub mod split_clients;
pub mod ssi;
pub mod static_files;
pub mod stub_status;
pub mod sub_filter;
pub mod tls;
pub mod try_files;
pub mod types;
pub mod userid;
pub mod uwsgi;

use gannet_conf::registry::Spec;
use gannet_conf::{ConfError, Directive};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// What setters may need beyond the directive: the prefix for relative paths and http-level
/// tables (log formats) that later directives refer to.
pub struct LoadCtx {
    pub prefix: PathBuf,
    pub log_formats: HashMap<String, Arc<access_log::LogFormat>>,
    /// `upstream` groups by name (all of http's, read before any server).
    pub upstreams: HashMap<String, Arc<crate::upstream::Upstream>>,
    /// Every access log opened, for reopening them (SIGUSR1).
    pub log_files: Vec<Arc<access_log::LogFile>>,
    /// The directives being read are in a regex or named location or an `if` block, where
    /// no prefix matched (`proxy_pass` may not have a URI part there).
    pub prefixless: bool,
    /// `match` blocks by name (all of http's, read before any server).
    pub matches: HashMap<String, Arc<health_check::Match>>,
    /// Every `health_check` read so far.
    pub probes: Vec<crate::config::Probe>,
    /// `limit_req_zone` and `limit_conn_zone` by name (all of http's, read before the rest).
    pub zones: limit_zone::Zones,
    /// `redis_server` blocks by name (all of http's, read before the zones).
    pub redis: HashMap<String, Arc<redis::Server>>,
    /// `*_cache_path` zones by name (all of http's, read before the rest).
    pub caches: crate::cache::path::Zones,
    /// Every `*_temp_path` folder, for the master to make (`config::temp_dirs`).
    pub temp_dirs: Vec<PathBuf>,
    /// Notices for `gannet -t` (settings accepted in part).
    pub notices: Vec<String>,
    /// Problems that do not stop the config from loading but that an operator must see in
    /// the error log (an expired certificate): logged as warnings at start and at reload.
    pub warnings: Vec<String>,
    /// What the TLS setups of the servers share (session caches, ticket keys).
    pub tls: crate::tls::LoadState,
    /// The first `otel_trace`, which needs an `otel_exporter` at http level.
    pub otel_trace_at: Option<gannet_conf::Loc>,
    /// The config has a `metrics` location: zones get metrics keys.
    pub metrics: bool,
    /// `acme_issuer`s and `acme_certificate`s (`crate::acme`).
    pub acme: crate::acme::Registry,
    /// `acme_shared_zone` was given.
    pub acme_zone: bool,
}

impl LoadCtx {
    pub fn new(prefix: &std::path::Path) -> LoadCtx {
        LoadCtx {
            prefix: prefix.to_path_buf(),
            log_formats: access_log::predefined(),
            upstreams: HashMap::new(),
            log_files: Vec::new(),
            prefixless: false,
            matches: HashMap::new(),
            probes: Vec::new(),
            acme: Default::default(),
            acme_zone: false,
            zones: Default::default(),
            redis: HashMap::new(),
            notices: Vec::new(),
            warnings: Vec::new(),
            temp_dirs: Vec::new(),
            caches: Default::default(),
            tls: Default::default(),
            otel_trace_at: None,
            metrics: false,
        }
    }
}

type Setter = fn(&Directive, &mut LocConf, &mut LoadCtx) -> Result<(), ConfError>;

/// A module's directive table and the function that applies one of its directives.
pub struct Module {
    pub directives: &'static [Spec],
    pub set: Setter,
}

pub const MODULES: &[Module] = &[
    Module {
        directives: core::DIRECTIVES,
        set: core::set,
    },
    Module {
        directives: types::DIRECTIVES,
        set: types::set,
    },
    Module {
        directives: static_files::DIRECTIVES,
        set: static_files::set,
    },
    Module {
        directives: dav::DIRECTIVES,
        set: dav::set,
    },
    Module {
        directives: index::DIRECTIVES,
        set: index::set,
    },
    Module {
        directives: try_files::DIRECTIVES,
        set: try_files::set,
    },
    Module {
        directives: autoindex::DIRECTIVES,
        set: autoindex::set,
    },
    Module {
        directives: headers::DIRECTIVES,
        set: headers::set,
    },
    Module {
        directives: error_page::DIRECTIVES,
        set: error_page::set,
    },
    Module {
        directives: rewrite::DIRECTIVES,
        set: rewrite::set,
    },
    Module {
        directives: access_log::DIRECTIVES,
        set: access_log::set,
    },
    Module {
        directives: access::DIRECTIVES,
        set: access::set,
    },
    Module {
        directives: auth_basic::DIRECTIVES,
        set: auth_basic::set,
    },
    Module {
        directives: auth_request::DIRECTIVES,
        set: auth_request::set,
    },
    Module {
        directives: limit_req::DIRECTIVES,
        set: limit_req::set,
    },
    Module {
        directives: redis::DIRECTIVES,
        set: redis::set,
    },
    Module {
        directives: limit_conn::DIRECTIVES,
        set: limit_conn::set,
    },
    Module {
        directives: limit_rate::DIRECTIVES,
        set: limit_rate::set,
    },
    Module {
        directives: fastcgi::DIRECTIVES,
        set: fastcgi::set,
    },
    Module {
        directives: scgi::DIRECTIVES,
        set: scgi::set,
    },
    Module {
        directives: uwsgi::DIRECTIVES,
        set: uwsgi::set,
    },
    Module {
        directives: uwsgi::SSL_DIRECTIVES,
        set: uwsgi::set_ssl,
    },
    Module {
        directives: memcached::DIRECTIVES,
        set: memcached::set,
    },
    Module {
        directives: proxy::DIRECTIVES,
        set: proxy::set,
    },
    Module {
        directives: grpc::DIRECTIVES,
        set: grpc::set,
    },
    Module {
        directives: grpc::SSL_DIRECTIVES,
        set: grpc::set_ssl,
    },
    Module {
        directives: proxy_cookie::DIRECTIVES,
        set: proxy_cookie::set,
    },
    Module {
        directives: proxy_ssl::DIRECTIVES,
        set: proxy_ssl::set,
    },
    Module {
        directives: health_check::DIRECTIVES,
        set: health_check::set,
    },
    Module {
        directives: client_body::DIRECTIVES,
        set: client_body::set,
    },
    Module {
        directives: mirror::DIRECTIVES,
        set: mirror::set,
    },
    Module {
        directives: compress::DIRECTIVES,
        set: compress::set,
    },
    Module {
        directives: sub_filter::DIRECTIVES,
        set: sub_filter::set,
    },
    Module {
        directives: ssi::DIRECTIVES,
        set: ssi::set,
    },
    Module {
        directives: map::DIRECTIVES,
        set: map::set,
    },
    Module {
        directives: realip::DIRECTIVES,
        set: realip::set,
    },
    Module {
        directives: referer::DIRECTIVES,
        set: referer::set,
    },
    Module {
        directives: charset::DIRECTIVES,
        set: charset::set,
    },
    Module {
        directives: geo::DIRECTIVES,
        set: geo::set,
    },
    Module {
        directives: acme::DIRECTIVES,
        set: acme::set,
    },
    Module {
        directives: split_clients::DIRECTIVES,
        set: split_clients::set,
    },
    Module {
        directives: tls::DIRECTIVES,
        set: tls::set,
    },
    Module {
        directives: http2::DIRECTIVES,
        set: http2::set,
    },
    Module {
        directives: http3::DIRECTIVES,
        set: http3::set,
    },
    Module {
        directives: secure_link::DIRECTIVES,
        set: secure_link::set,
    },
    Module {
        directives: userid::DIRECTIVES,
        set: userid::set,
    },
    Module {
        directives: addition::DIRECTIVES,
        set: addition::set,
    },
    Module {
        directives: gunzip::DIRECTIVES,
        set: gunzip::set,
    },
    Module {
        directives: image_filter::DIRECTIVES,
        set: image_filter::set,
    },
    Module {
        directives: random_index::DIRECTIVES,
        set: random_index::set,
    },
    Module {
        directives: stub_status::DIRECTIVES,
        set: stub_status::set,
    },
    Module {
        directives: slice::DIRECTIVES,
        set: slice::set,
    },
    Module {
        directives: flv::DIRECTIVES,
        set: flv::set,
    },
    Module {
        directives: empty_gif::DIRECTIVES,
        set: empty_gif::set,
    },
    Module {
        directives: mp4::DIRECTIVES,
        set: mp4::set,
    },
    Module {
        directives: otel::DIRECTIVES,
        set: otel::set,
    },
    Module {
        directives: metrics::DIRECTIVES,
        set: metrics::set,
    },
];

/// Find the spec and setter for an http/server/location directive.
pub fn find(name: &str) -> Option<(&'static Spec, Setter)> {
    MODULES.iter().find_map(|m| {
        m.directives
            .iter()
            .find(|s| s.name == name)
            .map(|s| (s, m.set))
    })
}

/// Names of every directive gannet implements.
#[cfg(test)]
pub fn all_directive_names() -> impl Iterator<Item = &'static str> {
    MODULES
        .iter()
        .flat_map(|m| m.directives.iter())
        .chain(crate::config::main_conf::DIRECTIVES.iter())
        .chain(crate::config::process_conf::DIRECTIVES.iter())
        .map(|s| s.name)
}

#[cfg(test)]
mod tests {
    /// Every directive gannet implements is documented in the directive reference: it names
    /// a row of a table on a page of docs/modules/ (the first cell of a row, in backquotes:
    /// "| `limit_req` | ..." or "| `gzip` / `brotli` | ..."); a mention in a page's prose or in
    /// the index (docs/modules/README.md) does not count. The pages are read at run time, so
    /// an edited page is seen without a rebuild.
    #[test]
    fn docs_document_every_directive() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/modules");
        let mut rows = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|x| x != "md") || path.ends_with("README.md") {
                continue;
            }
            let page = std::fs::read_to_string(&path).unwrap();
            rows.extend(
                page.lines()
                    .filter_map(|l| l.strip_prefix("| `"))
                    .map(|l| format!("`{}", l.split(" | ").next().unwrap_or(""))),
            );
        }
        assert!(
            rows.len() > 100,
            "no directive reference in {}",
            dir.display()
        );
        let missing: Vec<_> = super::all_directive_names()
            .filter(|n| !rows.iter().any(|r| r.contains(&format!("`{n}`"))))
            .collect();
        assert!(
            missing.is_empty(),
            "directives missing from the tables of docs/modules/*.md: {missing:?}"
        );
    }
}

/// The settings of one location (or of a server, or of http), one struct per module.
#[derive(Debug, Clone, Default)]
pub struct LocConf {
    pub core: core::CoreConf,
    pub client_body: client_body::ClientBodyConf,
    pub types: types::TypesConf,
    pub files: static_files::FilesConf,
    pub index: index::IndexConf,
    pub dav: dav::DavConf,
    pub random_index: random_index::RandomIndexConf,
    pub try_files: try_files::TryFilesConf,
    pub autoindex: autoindex::AutoindexConf,
    pub headers: headers::HeadersConf,
    pub error_page: error_page::ErrorPageConf,
    pub access: access::AccessConf,
    pub auth_basic: auth_basic::AuthBasicConf,
    pub auth_request: auth_request::AuthRequestConf,
    pub limit_req: limit_req::LimitReqConf,
    pub limit_conn: limit_conn::LimitConnConf,
    pub limit_rate: limit_rate::LimitRateConf,
    pub realip: realip::RealIpConf,
    pub referer: referer::RefererConf,
    pub charset: charset::CharsetConf,
    pub rewrite: rewrite::RewriteConf,
    pub log: access_log::LogConf,
    /// `error_log` at this level (else inherited; none at all: the main context's logs).
    pub error_log: Option<Arc<crate::errlog::ErrorLogs>>,
    pub fastcgi: fastcgi::FastCgiConf,
    pub compress: compress::CompressConf,
    pub gunzip: gunzip::GunzipConf,
    pub image_filter: image_filter::ImageFilterConf,
    pub addition: addition::AdditionConf,
    pub sub_filter: sub_filter::SubFilterConf,
    pub ssi: ssi::SsiConf,
    pub scgi: gateway::GatewayConf,
    pub uwsgi: uwsgi::UwsgiConf,
    pub memcached: memcached::MemcachedConf,
    pub proxy: proxy::ProxyConf,
    pub grpc: grpc::GrpcConf,
    pub mirror: mirror::MirrorConf,
    /// `health_check`, of this location only (not inherited).
    pub health_check: Option<Arc<health_check::HealthCheck>>,
    pub tls: tls::TlsConf,
    pub http2: http2::Http2Conf,
    pub http3: http3::Http3Conf,
    pub secure_link: secure_link::SecureLinkConf,
    pub userid: userid::UseridConf,
    pub otel: otel::OtelConf,
    /// `stub_status` (this level only: a content handler is not inherited).
    pub stub_status: bool,
    /// `flv`: this location's content handler (not inherited, as nginx's handlers).
    pub flv: bool,
    /// `empty_gif` (this level only, as `flv`).
    pub empty_gif: bool,
    pub slice: slice::SliceConf,
    /// `mp4` (the handler: this level only) and its buffer sizes and key-frame flag.
    pub mp4: mp4::Mp4Conf,
    /// `metrics` (this level only, as `stub_status`).
    pub metrics: bool,
    /// `status_zone`: the metrics key requests here count in (inherited).
    pub status_zone: Option<crate::runtime::metrics::Key>,
    /// `acme_certificate` (server level only).
    pub acme: Option<acme::CertOrder>,
}

impl LocConf {
    /// Fill what this level left unset from its parent (nginx's merge_loc_conf).
    pub fn merge(&mut self, parent: &LocConf) {
        self.core.merge(&parent.core);
        if self.status_zone.is_none() {
            self.status_zone = parent.status_zone;
        }
        self.client_body.merge(&parent.client_body);
        self.types.merge(&parent.types);
        self.files.merge(&parent.files);
        self.index.merge(&parent.index);
        self.dav.merge(&parent.dav);
        self.random_index.merge(&parent.random_index);
        self.autoindex.merge(&parent.autoindex);
        self.headers.merge(&parent.headers);
        self.error_page.merge(&parent.error_page);
        self.access.merge(&parent.access);
        self.auth_basic.merge(&parent.auth_basic);
        self.auth_request.merge(&parent.auth_request);
        self.limit_req.merge(&parent.limit_req);
        self.limit_conn.merge(&parent.limit_conn);
        self.limit_rate.merge(&parent.limit_rate);
        self.realip.merge(&parent.realip);
        self.referer.merge(&parent.referer);
        self.charset.merge(&parent.charset);
        self.log.merge(&parent.log);
        if self.error_log.is_none() {
            self.error_log = parent.error_log.clone();
        }
        self.fastcgi.merge(&parent.fastcgi);
        self.compress.merge(&parent.compress);
        self.gunzip.merge(&parent.gunzip);
        self.image_filter.merge(&parent.image_filter);
        self.addition.merge(&parent.addition);
        self.slice.merge(&parent.slice);
        self.mp4.merge(&parent.mp4);
        self.sub_filter.merge(&parent.sub_filter);
        self.ssi.merge(&parent.ssi);
        self.scgi.merge(&parent.scgi);
        self.uwsgi.merge(&parent.uwsgi);
        self.memcached.merge(&parent.memcached);
        self.proxy.merge(&parent.proxy);
        self.grpc.merge(&parent.grpc);
        self.mirror.merge(&parent.mirror);
        self.tls.merge(&parent.tls);
        self.http2.merge(&parent.http2);
        self.http3.merge(&parent.http3);
        self.secure_link.merge(&parent.secure_link);
        self.userid.merge(&parent.userid);
        self.otel.merge(&parent.otel);
        // try_files and the rewrite statements are not inherited, as in nginx.
    }
}

/// Fill `$field` of `$self` from `$parent` when unset: the common merge rule.
macro_rules! inherit {
    ($self:ident, $parent:ident, $($field:ident),+ $(,)?) => {
        $( if $self.$field.is_none() { $self.$field = $parent.$field.clone(); } )+
    };
}
pub(crate) use inherit;

/// `invalid value "X" in "NAME" directive` at the directive's line.
pub fn invalid(d: &Directive, value: &str) -> ConfError {
    d.error(format!(
        "invalid value \"{value}\" in \"{}\" directive",
        d.name
    ))
}
