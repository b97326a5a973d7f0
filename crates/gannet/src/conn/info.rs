//! What a request knows of the connection it came on, whatever the protocol.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Facts about the connection a request came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// Connection serial number (`$connection`).
    pub id: u64,
    /// Requests served on this connection, this one included (`$connection_requests`).
    pub requests: u64,
    /// What the TLS handshake established (`None` on cleartext).
    pub tls: Option<Arc<crate::tls::TlsInfo>>,
    /// The addresses of a `listen ... proxy_protocol` connection's PROXY header.
    pub proxy: Option<Arc<crate::conn::proxy_protocol::ProxyAddrs>>,
    /// A connection to `listen unix:PATH`: the path. Its `peer` and `local` are 0.0.0.0:0
    /// then; the variables give nginx's `unix:` instead (`Request::unix_client`).
    pub unix: Option<Arc<std::path::Path>>,
    /// When the connection was accepted (`$connection_time`, `keepalive_time`).
    pub born: Instant,
    /// The request was in the buffer already when the one before it ended (`$pipe`).
    pub pipelined: bool,
}
