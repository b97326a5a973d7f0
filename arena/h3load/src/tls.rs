//! The QUIC client configuration: TLS 1.3 on aws-lc-rs (the provider gannet's own rustls
//! uses) offering ALPN `h3`, the server's certificate checked against `--cacert` or, without
//! it, not checked at all (h2load's way: the arena's servers carry a throwaway self-signed
//! certificate). The handshake signature is verified either way.

use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicClientConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Accepts any certificate chain (the run's self-signed one), but still checks that the
/// server signed the handshake with the key of the certificate it sent.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn roots(cacert: &str) -> Result<rustls::RootCertStore, String> {
    let certs =
        CertificateDer::pem_file_iter(cacert).map_err(|e| format!("--cacert {cacert}: {e}"))?;
    let mut store = rustls::RootCertStore::empty();
    for cert in certs {
        let cert = cert.map_err(|e| format!("--cacert {cacert}: {e}"))?;
        store
            .add(cert)
            .map_err(|e| format!("--cacert {cacert}: {e}"))?;
    }
    if store.is_empty() {
        return Err(format!("--cacert {cacert}: no certificate in it"));
    }
    Ok(store)
}

/// The client configuration every connection uses.
pub fn client_config(cacert: Option<&str>, idle: Duration) -> Result<quinn::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3: {e}"))?;
    let mut tls = match cacert {
        Some(path) => builder.with_root_certificates(roots(path)?),
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
    }
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = QuicClientConfig::try_from(tls).map_err(|e| format!("QUIC TLS: {e}"))?;
    let mut transport = quinn::TransportConfig::default();
    let idle =
        quinn::IdleTimeout::try_from(idle).map_err(|_| "--timeout is too long".to_string())?;
    transport
        .max_idle_timeout(Some(idle))
        // Windows as large as h2load's over QUIC (2^26 per stream, 2^30 per connection): flow
        // control never holds a 394 KB answer back, the congestion controller alone paces it.
        .stream_receive_window(quinn::VarInt::from_u32(1 << 26))
        .receive_window(quinn::VarInt::from_u32(1 << 30))
        // The server opens no request streams; its control and QPACK streams are unidirectional.
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(0));
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport));
    Ok(config)
}
