//! ngx_http_v3_module's directives (`conn::h3` serves the connections): `http3`,
//! `http3_max_concurrent_streams`, `http3_stream_buffer_size`, `quic_retry`, `quic_gso`,
//! `quic_host_key`, `quic_active_connection_id_limit`, all http or server level as in
//! nginx. (`listen ... quic` is in `config::listen`; `$http3` in `http::variables`.)
//!
//! As in nginx, the QUIC settings of an address are its default server's (a connection's
//! transport is set up before the client names a server); `http3 off` in a server refuses
//! the handshakes whose SNI name picks it.

use super::{inherit, LoadCtx, LocConf};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::sync::Arc;

const HS: Ctx = Ctx(Ctx::HTTP.0 | Ctx::SERVER.0);

const fn spec(name: &'static str) -> Spec {
    Spec {
        name,
        ctx: HS,
        args: Args::Exactly(1),
        block: false,
    }
}

pub const DIRECTIVES: &[Spec] = &[
    spec("http3"),
    spec("http3_max_concurrent_streams"),
    spec("http3_stream_buffer_size"),
    spec("quic_retry"),
    spec("quic_gso"),
    spec("quic_host_key"),
    spec("quic_active_connection_id_limit"),
];

#[derive(Debug, Clone, Default)]
pub struct Http3Conf {
    pub enable: Option<bool>,
    pub max_concurrent_streams: Option<u64>,
    pub stream_buffer_size: Option<u64>,
    pub retry: Option<bool>,
    pub gso: Option<bool>,
    /// The bytes of the `quic_host_key` file: what retry tokens and stateless resets are
    /// keyed with (else a random key made at load, shared by the workers started from it).
    pub host_key: Option<Arc<[u8]>>,
    /// Checked and kept, but not sent: quinn advertises its own limit (5 connection IDs),
    /// which is not configurable.
    pub active_connection_id_limit: Option<u64>,
}

impl Http3Conf {
    pub fn merge(&mut self, parent: &Http3Conf) {
        inherit!(
            self,
            parent,
            enable,
            max_concurrent_streams,
            stream_buffer_size,
            retry,
            gso,
            host_key,
            active_connection_id_limit,
        );
    }

    /// nginx's default: on (an address still needs `listen ... quic`).
    pub fn enabled(&self) -> bool {
        self.enable.unwrap_or(true)
    }

    /// Request streams a client may have open at once (nginx's default 128).
    pub fn max_concurrent_streams(&self) -> u64 {
        self.max_concurrent_streams.unwrap_or(128)
    }

    /// A stream's receive window, and what the connection may have unread in all (times the
    /// stream limit, as nginx sizes its connection window): nginx's default 64k.
    pub fn stream_buffer_size(&self) -> u64 {
        self.stream_buffer_size.unwrap_or(64 * 1024)
    }

    pub fn retry(&self) -> bool {
        self.retry.unwrap_or(false)
    }

    pub fn gso(&self) -> bool {
        self.gso.unwrap_or(false)
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.http3;
    match d.name.as_str() {
        "http3" => c.enable = Some(setters::flag(d)?),
        "http3_max_concurrent_streams" => c.max_concurrent_streams = Some(setters::num_arg(d, 0)?),
        "http3_stream_buffer_size" => c.stream_buffer_size = Some(setters::size_arg(d, 0)?),
        "quic_retry" => c.retry = Some(setters::flag(d)?),
        "quic_gso" => c.gso = Some(setters::flag(d)?),
        "quic_active_connection_id_limit" => {
            c.active_connection_id_limit = Some(setters::num_arg(d, 0)?)
        }
        "quic_host_key" => {
            if c.host_key.is_some() {
                return Err(d.error("\"quic_host_key\" directive is duplicate".to_string()));
            }
            let path = ctx.prefix.join(&d.args[0]);
            let key = std::fs::read(&path)
                .map_err(|e| d.error(format!("open() \"{}\" failed ({e})", path.display())))?;
            if key.is_empty() {
                return Err(d.error(format!("\"{}\" zero key size", path.display())));
            }
            c.host_key = Some(Arc::from(key));
        }
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}
