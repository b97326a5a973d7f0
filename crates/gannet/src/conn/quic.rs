//! QUIC on a `listen ... quic` address: each worker has its own UDP socket for the address
//! (SO_REUSEPORT, as its TCP listeners: `runtime::listener`) and runs a quinn endpoint on
//! it; every connection it accepts goes to `conn::h3`.
//!
//! The transport's settings are the address's default server's, as in nginx (they are
//! sent before the client names a server): `http3_max_concurrent_streams` request streams,
//! `http3_stream_buffer_size` of receive window per stream and that times the stream limit
//! per connection (so what a client can make the server buffer is bounded), three
//! unidirectional streams (control and the two QPACK ones), `keepalive_timeout` as the idle
//! timeout, `client_header_timeout` for the handshake, `quic_gso` for segmentation offload.
//! `quic_retry on` answers a client whose address is not yet validated with a Retry
//! packet first; the tokens, like stateless resets, are keyed from `quic_host_key` (else
//! from a random key made once per process, which every worker thread shares).
//!
//! TLS is 1.3 only with ALPN `h3`: the SNI name picks the server (`select_server`, the
//! default server for an unknown name) whose certificates answer, as on the TCP listener;
//! a server with `http3 off` or `ssl_reject_handshake on` refuses the handshake. A server
//! with `ssl_verify_client` asks for a client certificate, judged after the handshake as
//! on TCP (`conn::quic_session` drives rustls's session so that everything the handshake
//! agreed on reaches the `$ssl_*` variables through `TlsInfo::of`, as on TCP). Session
//! resumption uses the default server's cache and ticket keys, and with its `ssl_early_data
//! on`, a resumed client's 0-RTT requests are served before the handshake completes
//! (`$ssl_early_data` is "1" for them, as nginx). Not yet: `http3_hq` (nginx's HTTP/0.9
//! over QUIC for interop tests: gannet has no HTTP/0.9).
//!
//! A client may change address (migrate, or be moved by a NAT) when its packets still
//! reach this endpoint after it: with `quic_bpf on` (`conn::quic_bpf`: the connection IDs
//! carry the socket's place and a program steers by them), or when the socket is its
//! address's only one. Otherwise clients are told not to migrate (another worker's socket
//! would get the packets) and packets from a new address are ignored.

use super::quic_bpf::{Cids, Steering};
use crate::config::{Config, ListenGroup};
use crate::errlog::{self, Level};
use crate::http::router::select_server;
use crate::runtime::worker::Worker;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The QUIC unidirectional streams a client may open: control, QPACK encoder and decoder
/// (nginx's NGX_HTTP_V3_MAX_UNI_STREAMS).
const UNI_STREAMS: u32 = 3;

/// What a connection may have in flight unacknowledged, for all its streams: bounds the
/// memory a slow client holds on the server.
const SEND_WINDOW: u64 = 1024 * 1024;

/// The salt nginx derives its QUIC keys with.
const SALT: &[u8] = b"ngx_quic";

/// Serve the QUIC address `group` on this worker's socket for it, until the worker stops
/// accepting (the task is aborted; connections go on until they end). `steering`: how the
/// packets of the socket's connections find it.
pub async fn serve(w: Rc<Worker>, sock: std::net::UdpSocket, group: usize, steering: Steering) {
    let (endpoint_config, server_config, retry) = match setup(&w.config, group, steering) {
        Ok(s) => s,
        Err(e) => {
            errlog::error(format_args!("QUIC setup failed: {e}"));
            return;
        }
    };
    let runtime = Arc::new(quinn::TokioRuntime);
    let endpoint = match quinn::Endpoint::new(endpoint_config, Some(server_config), sock, runtime) {
        Ok(e) => e,
        Err(e) => {
            errlog::error(format_args!("QUIC endpoint failed to start: {e}"));
            return;
        }
    };
    // When the worker stops accepting (this task is aborted), new connections are refused;
    // those in hand end as the worker drains (`conn::h3`: GOAWAY, streams finish).
    let _refuser = RefuseOnDrop(endpoint.clone());
    while let Some(incoming) = endpoint.accept().await {
        if retry && !incoming.remote_address_validated() && incoming.may_retry() {
            let _ = incoming.retry();
            continue;
        }
        if !w.admit() {
            incoming.refuse();
            continue;
        }
        let Ok(connecting) = incoming.accept() else {
            w.connection_closed();
            continue;
        };
        tokio::task::spawn_local(super::h3::serve(w.clone(), connecting, group));
    }
}

struct RefuseOnDrop(quinn::Endpoint);

impl Drop for RefuseOnDrop {
    fn drop(&mut self) {
        self.0.set_server_config(None);
    }
}

/// The endpoint's keys, the server side (TLS and transport) and whether to send Retry.
fn setup(
    config: &Arc<Config>,
    group: usize,
    steering: Steering,
) -> Result<(quinn::EndpointConfig, quinn::ServerConfig, bool), String> {
    let g = &config.listens[group];
    let default = &g.servers[g.default];
    let h3 = &default.conf.http3;
    // The TLS settings shared by the address (cipher suites and groups, session cache and
    // ticket keys): its default server's, or when that one only rejects handshakes
    // (`ssl_reject_handshake` without a certificate), the first server's that has some.
    let with_config =
        |s: &Arc<crate::config::ServerConf>| s.tls.as_ref().and_then(|t| t.config.clone());
    let base = with_config(default)
        .or_else(|| g.servers.iter().find_map(with_config))
        .ok_or("no certificate for the listen address")?;
    let builder = rustls::ServerConfig::builder_with_provider(base.crypto_provider().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    // Client certificates are asked for only by the servers whose `ssl_verify_client` says
    // so (see `quic_session::ClientAuth`); an address without any asks nothing.
    let algs = base.crypto_provider().signature_verification_algorithms;
    let verifying = g.servers.iter().filter_map(|s| s.tls.clone());
    let builder = match super::quic_session::ClientAuth::new(verifying, algs) {
        Some(auth) => builder.with_client_cert_verifier(Arc::new(auth)),
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder.with_cert_resolver(Arc::new(SniCerts {
        config: config.clone(),
        group,
    }));
    tls.alpn_protocols = vec![b"h3".to_vec()];
    if default.conf.tls.early_data() {
        // `ssl_early_data on`: 0-RTT (quinn takes 0 or u32::MAX here; QUIC's flow control
        // bounds what comes early). rustls takes early data only on a session resumed from
        // its cache, each ticket once (RFC 8446 8.1: a replayed first flight is refused),
        // so no stateless tickets here, and a cache even without `ssl_session_cache`.
        tls.max_early_data_size = u32::MAX;
        tls.session_storage = if base.session_storage.can_cache() {
            base.session_storage.clone()
        } else {
            early_data_cache()
        };
    } else {
        tls.session_storage = base.session_storage.clone();
        tls.ticketer = base.ticketer.clone();
        tls.send_tls13_tickets = base.send_tls13_tickets;
    }
    let crypto = super::quic_session::Quic::new(tls)?;

    let host_key: &[u8] = match &h3.host_key {
        Some(k) => k,
        None => default_host_key(),
    };
    let prk = aws_lc_rs::hkdf::Salt::new(aws_lc_rs::hkdf::HKDF_SHA256, SALT).extract(host_key);
    let mut reset = [0u8; 32];
    prk.expand(&[b"sr_token_key"], aws_lc_rs::hkdf::HKDF_SHA256)
        .and_then(|okm| okm.fill(&mut reset))
        .map_err(|_| "cannot derive the stateless reset key")?;
    let reset_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &reset);
    let token_key: aws_lc_rs::hkdf::Prk = prk
        .expand(&[b"av_token_key"], aws_lc_rs::hkdf::HKDF_SHA256)
        .map_err(|_| "cannot derive the address validation key")?
        .into();
    let mut endpoint = quinn::EndpointConfig::new(Arc::new(reset_key));
    if let Steering::Cid(index) = steering {
        endpoint.cid_generator(move || Box::new(Cids::new(index)));
    }

    let var = |n: u64| quinn::VarInt::from_u64(n).unwrap_or(quinn::VarInt::MAX);
    let streams = h3.max_concurrent_streams();
    let window = h3.stream_buffer_size();
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(var(streams))
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(UNI_STREAMS))
        .stream_receive_window(var(window))
        .receive_window(var(window.saturating_mul(streams.max(1))))
        .send_window(SEND_WINDOW)
        .datagram_receive_buffer_size(None)
        .enable_segmentation_offload(h3.gso());
    let (keepalive, _) = default.conf.core.keepalive_timeout();
    let idle = quinn::IdleTimeout::try_from(keepalive.max(Duration::from_secs(1))).ok();
    transport.max_idle_timeout(idle);
    let mut server = quinn::ServerConfig::new(Arc::new(crypto), Arc::new(token_key));
    server.transport_config(Arc::new(transport));
    // Unless its packets are steered here, a migrated connection would reach another
    // worker's socket: clients are told not to migrate.
    server.migration(steering.follows_migration());
    Ok((endpoint, server, h3.retry()))
}

/// The key retry tokens and stateless resets are made with when `quic_host_key` is not
/// set: random, made once by the master when it loads a config with a QUIC address, so
/// that every worker (threads, and processes forked after) has the same, and a token one
/// issued is good at another.
pub fn default_host_key() -> &'static [u8] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        // A failing system RNG leaves the key zero; the tokens are then only as secret as
        // the host's name, which costs Retry its point but nothing else.
        let _ = aws_lc_rs::rand::fill(&mut k);
        k
    })
}

/// The sessions 0-RTT resumes from when the server has no `ssl_session_cache`: one cache
/// for the process, so a client that reconnects (from another port, so maybe to another
/// worker thread) finds its session.
fn early_data_cache() -> Arc<dyn rustls::server::StoresServerSessions> {
    static CACHE: OnceLock<Arc<rustls::server::ServerSessionMemoryCache>> = OnceLock::new();
    CACHE
        .get_or_init(|| rustls::server::ServerSessionMemoryCache::new(EARLY_DATA_SESSIONS))
        .clone()
}

/// How many sessions [`early_data_cache`] keeps (about 100 bytes each).
const EARLY_DATA_SESSIONS: usize = 10_000;

/// The certificate for a QUIC handshake: that of the server the SNI name picks.
#[derive(Debug)]
struct SniCerts {
    config: Arc<Config>,
    group: usize,
}

impl SniCerts {
    fn group(&self) -> &ListenGroup {
        &self.config.listens[self.group]
    }
}

impl ResolvesServerCert for SniCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let g = self.group();
        let sni = hello
            .server_name()
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        let chosen = select_server(&g.servers, g.default, &sni);
        if !chosen.conf.http3.enabled() {
            errlog::log(
                Level::Info,
                format_args!("QUIC handshake refused for \"{sni}\": http3 is off"),
            );
            return None;
        }
        let default = &g.servers[g.default];
        let tls = chosen.tls.as_ref().or(default.tls.as_ref())?;
        if tls.reject_handshake {
            return None;
        }
        super::quic_session::note_hello(&hello, tls);
        tls.config.as_ref()?.cert_resolver.resolve(hello)
    }
}
