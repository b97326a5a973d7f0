//! gRPC to upstream servers, the configuration side (nginx's ngx_http_grpc_module): one more
//! protocol of the gateway machinery (`gateway`, `Proto::Grpc`), with HTTP/2 on the wire
//! (the `h2` crate's client; the I/O is in `conn::grpc`). Cleartext `grpc://` is HTTP/2
//! with prior knowledge, `grpcs://` is TLS offering ALPN `h2`, with the `proxy_ssl_*`
//! settings under the `grpc_ssl_` prefix (`proxy_ssl::set_on`, built by `proxy_ssl::finish`).
//!
//! Directives: `grpc_pass`, `grpc_set_header`, and the shared gateway ones nginx's module
//! has: `grpc_connect_timeout`, `grpc_send_timeout`, `grpc_read_timeout`,
//! `grpc_buffer_size`, `grpc_intercept_errors`, `grpc_hide_header`, `grpc_pass_header`,
//! `grpc_ignore_headers`, `grpc_next_upstream` (+ `_tries`, `_timeout`),
//! `grpc_socket_keepalive`, and the `grpc_ssl_*` ones.
//!
//! `grpc_pass` takes `grpc://host:port`, `grpcs://host:port`, a bare `host:port` (as
//! `grpc://`), or an `upstream` group's name in place of the host; with variables it is
//! evaluated per request like `proxy_pass`. The request's `:authority` is `grpc_set_header
//! Host`'s value if it is set and not empty, else the URL's host, as nginx sends it.

use super::gateway::{self, spec, Backend, GatewayConf, Proto};
use super::proxy::{self, Dest};
use super::proxy_ssl::ProxySslConf;
use super::{inherit, LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::variables::Template;
use crate::tls::client::ClientTls;
use crate::upstream::Upstream;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

const HSL: Ctx = Ctx::HSL;
const LOC_IF: Ctx = Ctx(Ctx::LOCATION.0 | Ctx::IF.0);

pub const DIRECTIVES: &[Spec] = &[
    spec("grpc_pass", LOC_IF, Args::Exactly(1)),
    spec("grpc_set_header", HSL, Args::Exactly(2)),
    spec("grpc_connect_timeout", HSL, Args::Exactly(1)),
    spec("grpc_send_timeout", HSL, Args::Exactly(1)),
    spec("grpc_read_timeout", HSL, Args::Exactly(1)),
    spec("grpc_buffer_size", HSL, Args::Exactly(1)),
    spec("grpc_intercept_errors", HSL, Args::Exactly(1)),
    spec("grpc_hide_header", HSL, Args::Exactly(1)),
    spec("grpc_pass_header", HSL, Args::Exactly(1)),
    spec("grpc_ignore_headers", HSL, Args::AtLeast(1)),
    spec("grpc_next_upstream", HSL, Args::AtLeast(1)),
    spec("grpc_next_upstream_tries", HSL, Args::Exactly(1)),
    spec("grpc_next_upstream_timeout", HSL, Args::Exactly(1)),
    spec("grpc_socket_keepalive", HSL, Args::Exactly(1)),
];

/// Where `grpc_pass` sends requests.
#[derive(Debug, Clone)]
pub enum Target {
    Fixed(Dest),
    /// A URL with variables, evaluated per request; its host may name a group.
    Vars(Template, Arc<HashMap<String, Arc<Upstream>>>),
}

impl Target {
    /// Where this request goes (borrowed for a fixed URL); `Err` with the log's reason.
    pub fn dest(&self, req: &Request) -> Result<Cow<'_, Dest>, String> {
        match self {
            Target::Fixed(d) => Ok(Cow::Borrowed(d)),
            Target::Vars(t, groups) => parse_url(&t.eval(req, None), groups).map(Cow::Owned),
        }
    }
}

/// The grpc share of a location's settings.
#[derive(Debug, Clone, Default)]
pub struct GrpcConf {
    /// The shared settings; `gw.pass` marks the location as a grpc one.
    pub gw: GatewayConf,
    /// Set with `grpc_pass`, in the location itself only.
    pub target: Option<Arc<Target>>,
    pub set_headers: Option<Arc<Vec<(String, Template)>>>,
    /// `grpc_ssl_*`.
    pub ssl: ProxySslConf,
    /// The TLS client setup (ALPN `h2`) for a location that may reach `grpcs://` (built
    /// after the merge by [`finish`]; not inherited).
    pub client_tls: Option<Arc<ClientTls>>,
}

impl GrpcConf {
    pub fn merge(&mut self, parent: &GrpcConf) {
        self.gw.merge(&parent.gw);
        self.ssl.merge(&parent.ssl);
        inherit!(self, parent, set_headers);
    }
}

/// `grpc_ssl_*`: the proxy's upstream TLS set under grpc's prefix.
pub const SSL_DIRECTIVES: &[Spec] = super::proxy_ssl::ssl_directives!("grpc_ssl_");

pub fn set_ssl(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    super::proxy_ssl::set_on(d, "grpc_ssl_", &mut lc.grpc.ssl, ctx)
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let a0 = d.args[0].as_str();
    match d.name.as_str() {
        "grpc_pass" => {
            if let Some(other) = gateway::active(lc) {
                return Err(d.error(if other == Proto::Grpc {
                    "\"grpc_pass\" directive is duplicate".to_string()
                } else {
                    format!(
                        "\"grpc_pass\" directive is duplicate: \"{}pass\" is set in this location",
                        other.prefix()
                    )
                }));
            }
            let target = if a0.contains('$') {
                let t = Template::compile(a0).map_err(|e| d.error(e))?;
                Target::Vars(t, Arc::new(ctx.upstreams.clone()))
            } else {
                Target::Fixed(parse_url(a0, &ctx.upstreams).map_err(|e| d.error(e))?)
            };
            lc.grpc.gw.pass = Some(match &target {
                Target::Fixed(dest) => dest.backend.clone(),
                Target::Vars(..) => Backend::Dynamic,
            });
            lc.grpc.target = Some(Arc::new(target));
        }
        "grpc_set_header" => {
            let value = Template::compile(&d.args[1]).map_err(|e| d.error(e))?;
            let mut l = lc.grpc.set_headers.as_deref().cloned().unwrap_or_default();
            l.push((a0.to_string(), value));
            lc.grpc.set_headers = Some(Arc::new(l));
        }
        name => {
            if !gateway::set(d, Proto::Grpc, lc, ctx)? {
                return Err(d.error(format!("unknown directive \"{name}\"")));
            }
        }
    }
    Ok(())
}

/// `grpc://host:port`, `grpcs://host:port` or a bare `host:port`, the host maybe a group's
/// name: read as the proxy's `http://` / `https://` URLs are. A URI part is refused (nginx
/// sends the request's own path).
pub fn parse_url(url: &str, groups: &HashMap<String, Arc<Upstream>>) -> Result<Dest, String> {
    let as_http = if let Some(r) = url.strip_prefix("grpc://") {
        format!("http://{r}")
    } else if let Some(r) = url.strip_prefix("grpcs://") {
        format!("https://{r}")
    } else if url.contains("://") {
        return Err(format!("invalid URL prefix in \"{url}\""));
    } else {
        format!("http://{url}")
    };
    let dest = proxy::parse_url(&as_http, groups)?;
    if dest.uri.is_some() {
        return Err(format!("invalid host in \"{url}\""));
    }
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Addr;

    #[test]
    fn urls() {
        let none = HashMap::new();
        let d = parse_url("grpc://127.0.0.1:9000", &none).unwrap();
        assert!(matches!(d.backend, Backend::Addr(Addr::Tcp(ref a)) if &**a == "127.0.0.1:9000"));
        assert!(!d.tls);
        let d = parse_url("grpcs://h:9443", &none).unwrap();
        assert!(d.tls);
        assert_eq!(d.host, "h:9443");
        let d = parse_url("localhost:9000", &none).unwrap();
        assert!(!d.tls);
        for bad in ["http://h:1", "grpc://h:1/x", "grpc://", "grpc://h:0"] {
            assert!(parse_url(bad, &none).is_err(), "{bad}");
        }
    }
}
