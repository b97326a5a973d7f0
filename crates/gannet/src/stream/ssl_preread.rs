//! `ssl_preread on` (nginx's ngx_stream_ssl_preread_module): read the client's TLS
//! ClientHello before choosing the upstream, without terminating TLS, so `map
//! $ssl_preread_server_name $backend {...}; proxy_pass $backend;` routes by SNI. The
//! ClientHello is parsed by rustls (`Acceptor`), fed a copy of the bytes read; the bytes
//! themselves are kept and sent to the upstream first.
//!
//! As nginx's preread phase (`preread_timeout`, `preread_buffer_size`): data that is not a
//! TLS handshake record leaves the variables empty and the session goes on; a client that
//! closes or is silent for `preread_timeout` ends the session with 200; a ClientHello
//! larger than the buffer ends it with 400 ("preread buffer full").
//!
//! `$ssl_preread_protocol` is not provided: rustls does not expose the offered versions.

use super::variables::Session;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

#[derive(Debug, Clone)]
pub struct Preread {
    pub on: bool,
    pub timeout: Duration,
    pub buffer_size: usize,
}

impl Default for Preread {
    fn default() -> Preread {
        Preread {
            on: false,
            timeout: Duration::from_secs(30),
            buffer_size: 16 * 1024,
        }
    }
}

/// Read the ClientHello into `head` and fill in the session's `$ssl_preread_*`. `Err`:
/// the session ends with this `$status`.
pub async fn run(
    conf: &Preread,
    client: &mut TcpStream,
    head: &mut Vec<u8>,
    s: &mut Session,
) -> Result<(), u16> {
    let mut acceptor = rustls::server::Acceptor::default();
    let deadline = tokio::time::Instant::now() + conf.timeout;
    let mut buf = vec![0u8; conf.buffer_size];
    loop {
        if head.len() >= conf.buffer_size {
            crate::errlog::error(format_args!("*{} preread buffer full", s.id));
            return Err(400);
        }
        let room = conf.buffer_size - head.len();
        let n = match tokio::time::timeout_at(deadline, client.read(&mut buf[..room])).await {
            Err(_) | Ok(Err(_)) | Ok(Ok(0)) => return Err(200),
            Ok(Ok(n)) => n,
        };
        let fresh = &buf[..n];
        head.extend_from_slice(fresh);
        // nginx's first checks: a handshake record of SSLv3 / TLS, or not TLS at all.
        if head.first().is_some_and(|&b| b != 0x16) || head.get(1).is_some_and(|&b| b != 3) {
            return Ok(());
        }
        if acceptor.read_tls(&mut &fresh[..]).is_err() {
            return Ok(());
        }
        match acceptor.accept() {
            Ok(None) => continue,
            Ok(Some(accepted)) => {
                let hello = accepted.client_hello();
                s.sni = Some(hello.server_name().unwrap_or_default().to_string());
                let names: Vec<String> = hello
                    .alpn()
                    .into_iter()
                    .flatten()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect();
                s.alpn = Some(names.join(","));
                return Ok(());
            }
            // Not a ClientHello rustls can read: nginx declines too and goes on.
            Err(_) => return Ok(()),
        }
    }
}
