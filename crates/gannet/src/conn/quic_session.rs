//! What a QUIC handshake's TLS tells the connection beyond quinn's `HandshakeData` (the
//! SNI name and ALPN): the client's offers (`$ssl_ciphers`, `$ssl_curves`). quinn's rustls
//! session is wrapped: while it reads the client's handshake, a thread-local slot is open,
//! and the certificate resolver (`conn::quic`), which rustls calls from inside that read,
//! notes the ClientHello there. Everything else goes to quinn's session as it is.

use crate::tls::Offered;
use quinn::crypto::{
    ExportKeyingMaterialError, HeaderKey, KeyPair, Keys, PacketKey, ServerConfig, Session,
    UnsupportedVersion,
};
use quinn::ConnectionId;
use quinn_proto::transport_parameters::TransportParameters;
use quinn_proto::{Side, TransportError};
use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// Open while a session reads handshake data on this thread: what the resolver saw.
    static READING: RefCell<Option<Option<Offered>>> = const { RefCell::new(None) };
}

/// Called by the certificate resolver with the ClientHello.
pub fn note_hello(hello: &rustls::server::ClientHello<'_>) {
    READING.with(|r| {
        if let Some(slot) = r.borrow_mut().as_mut() {
            *slot = Some(Offered::of(hello));
        }
    });
}

/// What a QUIC connection's `handshake_data()` holds (instead of quinn's own type).
pub struct Handshake {
    pub server_name: Option<String>,
    pub offered: Option<Offered>,
}

/// quinn's server-side TLS, observed.
pub struct Observed(pub Arc<quinn::crypto::rustls::QuicServerConfig>);

impl ServerConfig for Observed {
    fn initial_keys(
        &self,
        version: u32,
        dst_cid: &ConnectionId,
    ) -> Result<Keys, UnsupportedVersion> {
        self.0.initial_keys(version, dst_cid)
    }

    fn retry_tag(&self, version: u32, orig_dst_cid: &ConnectionId, packet: &[u8]) -> [u8; 16] {
        self.0.retry_tag(version, orig_dst_cid, packet)
    }

    fn start_session(
        self: Arc<Self>,
        version: u32,
        params: &TransportParameters,
    ) -> Box<dyn Session> {
        Box::new(ObservedSession {
            inner: self.0.clone().start_session(version, params),
            offered: None,
        })
    }
}

struct ObservedSession {
    inner: Box<dyn Session>,
    /// Set once the resolver saw the ClientHello.
    offered: Option<Offered>,
}

impl Session for ObservedSession {
    fn read_handshake(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        READING.with(|r| *r.borrow_mut() = Some(None));
        let read = self.inner.read_handshake(buf);
        if let Some(Some(offered)) = READING.with(|r| r.borrow_mut().take()) {
            self.offered = Some(offered);
        }
        read
    }

    fn handshake_data(&self) -> Option<Box<dyn Any>> {
        let data = self.inner.handshake_data()?;
        let quinn = data
            .downcast::<quinn::crypto::rustls::HandshakeData>()
            .ok()?;
        Some(Box::new(Handshake {
            server_name: quinn.server_name,
            offered: self.offered.as_ref().map(Offered::copy),
        }))
    }

    fn initial_keys(&self, dst_cid: &ConnectionId, side: Side) -> Keys {
        self.inner.initial_keys(dst_cid, side)
    }
    fn peer_identity(&self) -> Option<Box<dyn Any>> {
        self.inner.peer_identity()
    }
    fn early_crypto(&self) -> Option<(Box<dyn HeaderKey>, Box<dyn PacketKey>)> {
        self.inner.early_crypto()
    }
    fn early_data_accepted(&self) -> Option<bool> {
        self.inner.early_data_accepted()
    }
    fn is_handshaking(&self) -> bool {
        self.inner.is_handshaking()
    }
    fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
        self.inner.transport_parameters()
    }
    fn write_handshake(&mut self, buf: &mut Vec<u8>) -> Option<Keys> {
        self.inner.write_handshake(buf)
    }
    fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn PacketKey>>> {
        self.inner.next_1rtt_keys()
    }
    fn is_valid_retry(&self, orig_dst_cid: &ConnectionId, header: &[u8], payload: &[u8]) -> bool {
        self.inner.is_valid_retry(orig_dst_cid, header, payload)
    }
    fn export_keying_material(
        &self,
        output: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> Result<(), ExportKeyingMaterialError> {
        self.inner.export_keying_material(output, label, context)
    }
}
