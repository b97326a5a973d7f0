//! The TLS session of a QUIC connection: rustls's QUIC server connection driven for quinn
//! (its `crypto::Session`), as quinn's own rustls session does, but kept at hand so that
//! what the handshake established reaches the `$ssl_*` variables as on the TCP listener
//! (`TlsInfo::of` over the same rustls state: suite, group, resumption, ALPN, the client's
//! certificate and its verdict). quinn's own session says only the SNI name and ALPN.
//!
//! What rustls does not keep is noted by the certificate resolver (`conn::quic`), which
//! rustls calls from inside [`Session::read_handshake`]: while the session reads, a
//! thread-local slot is open, where the resolver leaves the client's offers
//! (`$ssl_ciphers`, `$ssl_curves`) and the TLS setup of the server the SNI name chose. The
//! client certificate request ([`ClientAuth`]) reads that choice from the same slot, in
//! the same read: each server asks for a certificate as its `ssl_verify_client` says.

use crate::modules::tls::VerifyClient;
use crate::tls::verify::DeferredVerifier;
use crate::tls::{Offered, ServerTls, TlsInfo};
use quinn::crypto::rustls::QuicServerConfig;
use quinn::crypto::{
    ExportKeyingMaterialError, HeaderKey, KeyPair, Keys, PacketKey, ServerConfig, Session,
    UnsupportedVersion,
};
use quinn::ConnectionId;
use quinn_proto::transport_parameters::TransportParameters;
use quinn_proto::{Side, TransportError, TransportErrorCode};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::quic::{Connection, KeyChange, Secrets, Suite, Version};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CipherSuite, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

/// What the resolver saw of a handshake.
struct Noted {
    offered: Offered,
    /// The setup of the server that answers (see `conn::quic::SniCerts`).
    by: Arc<ServerTls>,
}

thread_local! {
    /// Open while a session reads handshake data on this thread: what the resolver saw.
    static READING: RefCell<Option<Option<Noted>>> = const { RefCell::new(None) };
}

/// Called by the certificate resolver with the ClientHello and the setup it chose.
pub fn note_hello(hello: &rustls::server::ClientHello<'_>, by: &Arc<ServerTls>) {
    READING.with(|r| {
        if let Some(slot) = r.borrow_mut().as_mut() {
            *slot = Some(Noted {
                offered: Offered::of(hello),
                by: by.clone(),
            });
        }
    });
}

/// The setup the resolver chose in the handshake being read on this thread, if any.
fn chosen() -> Option<Arc<ServerTls>> {
    READING.with(|r| {
        r.borrow()
            .as_ref()
            .and_then(|s| s.as_ref().map(|n| n.by.clone()))
    })
}

/// What a QUIC connection's `handshake_data()` holds (instead of quinn's own type).
pub struct Handshake {
    /// The `$ssl_*` facts; `None` until the resolver chose a server.
    pub tls: Option<TlsInfo>,
}

/// The server side of QUIC's TLS: quinn's for the initial keys and Retry tags (which do
/// not depend on the session), [`QuicSession`] for each connection.
pub struct Quic {
    quinn: Arc<QuicServerConfig>,
    tls: Arc<rustls::ServerConfig>,
    initial: Suite,
}

impl Quic {
    pub fn new(tls: rustls::ServerConfig) -> Result<Quic, String> {
        let tls = Arc::new(tls);
        let quinn = QuicServerConfig::try_from(tls.clone()).map_err(|e| e.to_string())?;
        let initial = tls
            .crypto_provider()
            .cipher_suites
            .iter()
            .find(|s| s.suite() == CipherSuite::TLS13_AES_128_GCM_SHA256)
            .and_then(|s| s.tls13())
            .and_then(|s| s.quic_suite())
            .ok_or("no initial cipher suite for QUIC")?;
        // What could make a session fail to start depends on the config only: tried here,
        // once, so that `start_session` (which cannot fail) does not.
        rustls::quic::ServerConnection::new(tls.clone(), Version::V1, Vec::new())
            .map_err(|e| e.to_string())?;
        Ok(Quic {
            quinn: Arc::new(quinn),
            tls,
            initial,
        })
    }
}

/// QUIC's version numbers as TLS's key schedule knows them (RFC 9001, and the drafts
/// quinn still accepts); quinn starts no session for another.
fn tls_version(version: u32) -> Option<Version> {
    match version {
        0xff00_001d..=0xff00_0020 => Some(Version::V1Draft),
        0x0000_0001 | 0xff00_0021..=0xff00_0022 => Some(Version::V1),
        _ => None,
    }
}

impl ServerConfig for Quic {
    fn initial_keys(
        &self,
        version: u32,
        dst_cid: &ConnectionId,
    ) -> Result<Keys, UnsupportedVersion> {
        self.quinn.initial_keys(version, dst_cid)
    }

    fn retry_tag(&self, version: u32, orig_dst_cid: &ConnectionId, packet: &[u8]) -> [u8; 16] {
        self.quinn.retry_tag(version, orig_dst_cid, packet)
    }

    fn start_session(
        self: Arc<Self>,
        version: u32,
        params: &TransportParameters,
    ) -> Box<dyn Session> {
        // quinn starts a session only for a version `initial_keys` took.
        let version = tls_version(version).unwrap_or_default();
        let mut encoded = Vec::new();
        params.write(&mut encoded);
        let conn = rustls::quic::ServerConnection::new(self.tls.clone(), version, encoded)
            .expect("the config was tried in Quic::new");
        Box::new(QuicSession {
            version,
            initial: self.initial,
            conn: Connection::Server(conn),
            got_handshake_data: false,
            next_secrets: None,
            noted: None,
        })
    }
}

struct QuicSession {
    version: Version,
    initial: Suite,
    conn: Connection,
    /// quinn's signal that the ClientHello is in (the SNI name can be read) was given.
    got_handshake_data: bool,
    next_secrets: Option<Secrets>,
    /// Set once the resolver saw the ClientHello.
    noted: Option<Noted>,
}

/// rustls's keys as quinn's (quinn implements its key traits for rustls's key types).
fn keys(k: rustls::quic::Keys) -> Keys {
    Keys {
        header: KeyPair {
            local: Box::new(k.local.header),
            remote: Box::new(k.remote.header),
        },
        packet: KeyPair {
            local: Box::new(k.local.packet),
            remote: Box::new(k.remote.packet),
        },
    }
}

impl Session for QuicSession {
    fn initial_keys(&self, dst_cid: &ConnectionId, side: Side) -> Keys {
        let side = match side {
            Side::Client => rustls::Side::Client,
            Side::Server => rustls::Side::Server,
        };
        keys(self.initial.keys(dst_cid, side, self.version))
    }

    fn handshake_data(&self) -> Option<Box<dyn Any>> {
        if !self.got_handshake_data {
            return None;
        }
        let Connection::Server(server) = &self.conn else {
            return None;
        };
        let tls = self.noted.as_ref().map(|n| {
            let sni = server.server_name().unwrap_or_default();
            TlsInfo::of(
                &self.conn,
                sni.to_ascii_lowercase(),
                n.offered.copy(),
                &n.by,
            )
        });
        Some(Box::new(Handshake { tls }))
    }

    /// As quinn's: the client's chain, a `Vec<CertificateDer<'static>>`.
    fn peer_identity(&self) -> Option<Box<dyn Any>> {
        let chain = self.conn.peer_certificates()?;
        Some(Box::new(chain.to_vec()))
    }

    fn early_crypto(&self) -> Option<(Box<dyn HeaderKey>, Box<dyn PacketKey>)> {
        let keys = self.conn.zero_rtt_keys()?;
        Some((Box::new(keys.header), Box::new(keys.packet)))
    }

    fn early_data_accepted(&self) -> Option<bool> {
        // A client's question.
        None
    }

    fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    fn read_handshake(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        READING.with(|r| *r.borrow_mut() = Some(None));
        let read = self.conn.read_hs(buf);
        if let Some(Some(noted)) = READING.with(|r| r.borrow_mut().take()) {
            self.noted = Some(noted);
        }
        read.map_err(|e| TransportError {
            code: match self.conn.alert() {
                Some(alert) => TransportErrorCode::crypto(alert.into()),
                None => TransportErrorCode::PROTOCOL_VIOLATION,
            },
            frame: None,
            reason: e.to_string(),
        })?;
        if !self.got_handshake_data {
            // rustls does not say when the ClientHello is in; the SNI name, ALPN or the
            // end of the handshake tell (quinn's own test).
            let named = matches!(&self.conn, Connection::Server(s) if s.server_name().is_some());
            if named || self.conn.alpn_protocol().is_some() || !self.conn.is_handshaking() {
                self.got_handshake_data = true;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
        match self.conn.quic_transport_parameters() {
            None => Ok(None),
            Some(mut buf) => Ok(Some(TransportParameters::read(Side::Server, &mut buf)?)),
        }
    }

    fn write_handshake(&mut self, buf: &mut Vec<u8>) -> Option<Keys> {
        let k = match self.conn.write_hs(buf)? {
            KeyChange::Handshake { keys } => keys,
            KeyChange::OneRtt { keys, next } => {
                self.next_secrets = Some(next);
                keys
            }
        };
        Some(keys(k))
    }

    fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn PacketKey>>> {
        let k = self.next_secrets.as_mut()?.next_packet_keys();
        Some(KeyPair {
            local: Box::new(k.local),
            remote: Box::new(k.remote),
        })
    }

    fn is_valid_retry(&self, _orig: &ConnectionId, _header: &[u8], _payload: &[u8]) -> bool {
        // Retry packets are for clients.
        false
    }

    fn export_keying_material(
        &self,
        output: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> Result<(), ExportKeyingMaterialError> {
        self.conn
            .export_keying_material(output, label, Some(context))
            .map(|_| ())
            .map_err(|_| ExportKeyingMaterialError)
    }
}

/// Client certificates on a QUIC address: the certificate request of the server the SNI
/// name chose (its `ssl_verify_client`, the CA names of its `ssl_client_certificate`),
/// each the TCP listener's [`DeferredVerifier`]; the chain is judged after the handshake,
/// by `TlsInfo::of`, as on TCP.
#[derive(Debug)]
pub struct ClientAuth {
    /// The servers that verify clients, each with its request.
    servers: Vec<(Arc<ServerTls>, DeferredVerifier)>,
    /// For the handshake signature, which does not depend on the server.
    any: DeferredVerifier,
}

impl ClientAuth {
    /// `None` when no server of the address verifies clients (nothing is ever asked).
    pub fn new(
        servers: impl Iterator<Item = Arc<ServerTls>>,
        algs: rustls::crypto::WebPkiSupportedAlgorithms,
    ) -> Option<ClientAuth> {
        let servers: Vec<_> = servers
            .filter(|t| t.verify != VerifyClient::Off)
            .map(|t| {
                let v = DeferredVerifier::new(t.roots.as_ref(), algs);
                (t, v)
            })
            .collect();
        (!servers.is_empty()).then(|| ClientAuth {
            servers,
            any: DeferredVerifier::new(None, algs),
        })
    }

    /// The request of the server chosen in the handshake being read, if it verifies.
    fn request(&self) -> Option<&DeferredVerifier> {
        let by = chosen()?;
        self.servers
            .iter()
            .find(|(t, _)| Arc::ptr_eq(t, &by))
            .map(|(_, v)| v)
    }
}

impl ClientCertVerifier for ClientAuth {
    fn offer_client_auth(&self) -> bool {
        // Outside a handshake read (rustls asks once when the connection is made, to keep
        // the transcript for a later request): maybe.
        chosen().is_none() || self.request().is_some()
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        match self.request() {
            Some(v) => v.root_hint_subjects(),
            None => &[],
        }
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.any.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.any.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.any.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.any.supported_verify_schemes()
    }
}
