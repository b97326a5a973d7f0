//! `ssl_preread on` (nginx's ngx_stream_ssl_preread_module): read the client's TLS
//! ClientHello before choosing the upstream, without terminating TLS, so `map
//! $ssl_preread_server_name $backend {...}; proxy_pass $backend;` routes by SNI. The
//! ClientHello is parsed by rustls (`Acceptor`), fed a copy of the bytes peeked at
//! (nginx 1.25.5 peeks: the bytes stay in the socket for the proxy, or for the listener
//! `pass` hands the connection to). Over a TLS session the stream server terminated, the
//! first bytes are read instead, and go to the upstream first.
//!
//! As nginx's preread phase (`preread_timeout`, `preread_buffer_size`): data that is not a
//! TLS handshake record leaves the variables empty and the session goes on; a client that
//! closes or is silent for `preread_timeout` ends the session with 200; a ClientHello
//! larger than the buffer ends it with 400 ("preread buffer full").
//!
//! `$ssl_preread_protocol`, which rustls does not expose, is read as nginx reads it: the
//! ClientHello's `client_version`, or `TLSv1.3` when it has a `supported_versions`
//! extension (whatever its list), or the version of an SSLv2-style hello ([`version`]).
//! A ClientHello rustls refuses (an SSLv3 record, no cipher suites) but whose fields
//! nginx's parser would read still gives them: the name, the ALPN list and the protocol
//! are then read here ([`fields`]).

use super::variables::Session;
use std::os::fd::AsRawFd;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, Interest};
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

/// Peek at the ClientHello (nginx 1.25.5's preread by `MSG_PEEK`: the bytes stay in the
/// socket) and fill in the session's `$ssl_preread_*`. `Err`: the session ends with this
/// `$status`.
pub async fn run(conf: &Preread, client: &mut TcpStream, s: &mut Session) -> Result<(), u16> {
    let mut scan = Scan::default();
    let deadline = tokio::time::Instant::now() + conf.timeout;
    let mut buf = vec![0u8; conf.buffer_size];
    loop {
        let ready = match tokio::time::timeout_at(deadline, client.ready(Interest::READABLE)).await
        {
            Ok(Ok(ready)) => ready,
            Err(_) | Ok(Err(_)) => return Err(200),
        };
        // Once the client has closed its side, what is there is all there will be.
        let closed = ready.is_read_closed();
        // More to wait for is reported as WouldBlock, which clears the socket's readiness
        // so the next wait is for new bytes (each peek sees them all from the start).
        let peeked = client.try_io(Interest::READABLE, || {
            let n = peek(client, &mut buf)?;
            if n == 0 {
                return Ok(Step::Closed);
            }
            if scan.examine(&buf[..n], s) {
                return Ok(Step::Done);
            }
            if n == buf.len() {
                return Ok(Step::Full);
            }
            if closed {
                return Ok(Step::Closed);
            }
            Err(std::io::ErrorKind::WouldBlock.into())
        });
        match peeked {
            Ok(Step::Done) => return Ok(()),
            Ok(Step::Closed) => return Err(200),
            Ok(Step::Full) => return Err(buffer_full(s)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return Err(200),
        }
    }
}

/// What a peek came to.
enum Step {
    Done,
    Full,
    Closed,
}

fn buffer_full(s: &Session) -> u16 {
    crate::errlog::error(format_args!("*{} preread buffer full", s.id));
    400
}

fn peek(client: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call, and the
    // descriptor belongs to `client`, which the borrow keeps open.
    let n = unsafe {
        libc::recv(
            client.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The preread over a TLS session the stream server terminated (nginx's preread phase
/// runs after its ssl phase; TLS cannot be peeked at): what the client sends first is
/// read into `head`, and examined as a ClientHello would be.
pub async fn read<S: AsyncRead + Unpin>(
    conf: &Preread,
    client: &mut S,
    head: &mut Vec<u8>,
    s: &mut Session,
) -> Result<(), u16> {
    let mut scan = Scan::default();
    let deadline = tokio::time::Instant::now() + conf.timeout;
    let mut buf = vec![0u8; conf.buffer_size];
    loop {
        let room = conf.buffer_size - head.len();
        let n = match tokio::time::timeout_at(deadline, client.read(&mut buf[..room])).await {
            Err(_) | Ok(Err(_)) | Ok(Ok(0)) => return Err(200),
            Ok(Ok(n)) => n,
        };
        head.extend_from_slice(&buf[..n]);
        if scan.examine(head, s) {
            return Ok(());
        }
        if head.len() >= conf.buffer_size {
            return Err(buffer_full(s));
        }
    }
}

/// nginx's ClientHello parser over the bytes come so far (all of them, each time): the
/// rustls acceptor is fed those it has not seen.
#[derive(Default)]
struct Scan {
    acceptor: rustls::server::Acceptor,
    fed: usize,
}

impl Scan {
    /// Whether the preread is over: the ClientHello's fields are in `s`, or `head` is no
    /// ClientHello (the variables stay empty).
    fn examine(&mut self, head: &[u8], s: &mut Session) -> bool {
        let fresh = &head[self.fed.min(head.len())..];
        self.fed = head.len();
        // An SSLv2-style hello: nginx looks at its first 5 bytes.
        if head[0] & 0x80 != 0 {
            if head.len() < 5 {
                return false;
            }
            if let Some(protocol) = sslv2_version(head) {
                let f = Fields {
                    protocol,
                    ..Fields::default()
                };
                found(s, f);
            }
            return true;
        }
        // nginx's first checks: a handshake record of SSLv3 / TLS, or not TLS at all.
        if head[0] != 0x16 || head.get(1).is_some_and(|&b| b != 3) {
            return true;
        }
        if self.acceptor.read_tls(&mut &fresh[..]).is_err() {
            if let Some(f) = fields(head) {
                found(s, f);
            }
            return true;
        }
        match self.acceptor.accept() {
            Ok(None) => false,
            Ok(Some(accepted)) => {
                s.preread_protocol = fields(head).map_or("", |f| f.protocol);
                let hello = accepted.client_hello();
                s.sni = Some(hello.server_name().unwrap_or_default().to_string());
                let names: Vec<String> = hello
                    .alpn()
                    .into_iter()
                    .flatten()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect();
                s.alpn = Some(names.join(","));
                true
            }
            // Not a ClientHello rustls can read: nginx may still find its fields (then
            // the protocol is known), or declines too and goes on.
            Err(_) => {
                if let Some(f) = fields(head) {
                    found(s, f);
                }
                true
            }
        }
    }
}

/// A ClientHello read here, not by rustls (which refuses some nginx reads: no cipher
/// suites, an SSLv3 record...): its fields as nginx's parser takes them.
#[derive(Debug, Default, PartialEq)]
struct Fields {
    protocol: &'static str,
    /// The first host name of `server_name`, lowercased; "" without one.
    sni: String,
    /// The ALPN list, `,`-separated.
    alpn: String,
}

fn found(s: &mut Session, f: Fields) {
    s.preread_protocol = f.protocol;
    s.sni = Some(f.sni);
    s.alpn = Some(f.alpn);
}

/// nginx's name of a protocol version (`SSL_get_version`'s); "" for one it has none for.
fn version_name(major: u8, minor: u8) -> &'static str {
    match (major, minor) {
        (0, 2) => "SSLv2",
        (3, 0) => "SSLv3",
        (3, 1) => "TLSv1",
        (3, 2) => "TLSv1.1",
        (3, 3) => "TLSv1.2",
        (3, 4) => "TLSv1.3",
        _ => "",
    }
}

/// An SSLv2-style ClientHello (nginx's test: length's high bit, message type 1, version
/// 0.x or 3.x): its version.
fn sslv2_version(head: &[u8]) -> Option<&'static str> {
    match head {
        [b0, _, 1, major @ (0 | 3), minor, ..] if b0 & 0x80 != 0 => {
            Some(version_name(*major, *minor))
        }
        _ => None,
    }
}

/// The fields of the ClientHello at the start of `head` (TLS records, the hello possibly
/// split across several) as nginx's preread reads them; `None` until it is all there, or
/// when it is no ClientHello (or a broken one: a length running past its end).
fn fields(head: &[u8]) -> Option<Fields> {
    // The handshake messages, out of their records.
    let mut body = Vec::new();
    let mut rest = head;
    loop {
        let [0x16, 3, _, hi, lo, after @ ..] = rest else {
            return None;
        };
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        body.extend_from_slice(after.get(..len)?);
        rest = &after[len..];
        if let [_, a, b, c, ..] = body[..] {
            if body.len() >= 4 + u32::from_be_bytes([0, a, b, c]) as usize {
                break;
            }
        }
    }
    let [1, a, b, c, msg @ ..] = &body[..] else {
        return None;
    };
    let msg = &msg[..u32::from_be_bytes([0, *a, *b, *c]) as usize];
    let mut r = Reader(msg);
    let (major, minor) = (r.u8()?, r.u8()?);
    r.take(32)?; // random
    let n = r.u8()?;
    r.take(n.into())?; // session id
    let n = r.u16()?;
    r.take(n.into())?; // cipher suites
    let n = r.u8()?;
    r.take(n.into())?; // compression methods
    let mut f = Fields {
        protocol: version_name(major, minor),
        ..Fields::default()
    };
    if r.0.is_empty() {
        return Some(f);
    }
    let n = r.u16()?;
    let mut ext = Reader(r.take(n.into())?);
    while !ext.0.is_empty() {
        let (kind, n) = (ext.u16()?, ext.u16()?);
        let mut data = Reader(ext.take(n.into())?);
        match kind {
            // server_name: the list's first entry, a host_name.
            0 if f.sni.is_empty() => {
                data.u16()?;
                if data.u8()? == 0 {
                    let n = data.u16()?;
                    let name = data.take(n.into())?;
                    f.sni = String::from_utf8_lossy(name).to_ascii_lowercase();
                }
            }
            // ALPN: the protocol names, `,`-separated as nginx writes them.
            16 if f.alpn.is_empty() => {
                let n = data.u16()?;
                let mut list = Reader(data.take(n.into())?);
                let mut names = Vec::new();
                while !list.0.is_empty() {
                    let n = list.u8()?;
                    names.push(String::from_utf8_lossy(list.take(n.into())?).into_owned());
                }
                f.alpn = names.join(",");
            }
            // supported_versions: nginx takes TLS 1.3 whatever the list says.
            0x2b => f.protocol = "TLSv1.3",
            _ => {}
        }
    }
    Some(f)
}

/// Length-prefixed fields, bounds checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record: `version`, and the extensions given.
    fn hello(version: [u8; 2], exts: &[u8]) -> Vec<u8> {
        let mut m = version.to_vec();
        m.extend([7u8; 32]);
        m.extend([0, 0, 2, 0x13, 0x01, 1, 0]);
        if !exts.is_empty() {
            m.extend((exts.len() as u16).to_be_bytes());
            m.extend(exts);
        }
        let mut h = vec![1, 0, 0, m.len() as u8];
        h.extend(m);
        let mut r = vec![0x16, 3, 1, 0, h.len() as u8];
        r.extend(h);
        r
    }

    fn version(head: &[u8]) -> Option<&'static str> {
        fields(head).map(|f| f.protocol)
    }

    #[test]
    fn names_and_alpn_without_rustls() {
        let sni = [0, 0, 0, 8, 0, 6, 0, 0, 3, b'F', b'o', b'o'];
        let alpn = [0, 16, 0, 8, 0, 6, 2, b'h', b'2', 2, b'x', b'y'];
        let f = fields(&hello([3, 3], &[&sni[..], &alpn[..]].concat())).unwrap();
        assert_eq!((f.sni.as_str(), f.alpn.as_str()), ("foo", "h2,xy"));
        // A server_name running past its extension: not a hello nginx reads.
        let bad = [0, 0, 0, 4, 0, 6, 0, 0];
        assert_eq!(fields(&hello([3, 3], &bad)), None);
    }

    #[test]
    fn versions_as_nginx_names_them() {
        assert_eq!(version(&hello([3, 3], &[])), Some("TLSv1.2"));
        assert_eq!(version(&hello([3, 1], &[])), Some("TLSv1"));
        assert_eq!(version(&hello([3, 0], &[0, 10, 0, 0])), Some("SSLv3"));
        // supported_versions, whatever it lists.
        assert_eq!(
            version(&hello([3, 3], &[0, 0x2b, 0, 3, 2, 0x7f, 0x1c])),
            Some("TLSv1.3")
        );
        let full = hello([3, 3], &[]);
        assert_eq!(version(&full[..full.len() - 1]), None);
        // Split across two records.
        let mut split = full[..5 + 10].to_vec();
        split[3..5].copy_from_slice(&10u16.to_be_bytes());
        split.extend([0x16, 3, 1, 0, (full.len() - 15) as u8]);
        split.extend(&full[15..]);
        assert_eq!(version(&split), Some("TLSv1.2"));
        assert_eq!(version(b"GET / HTTP/1.0\r\n"), None);
        assert_eq!(sslv2_version(&[0x80, 0x1c, 1, 0, 2]), Some("SSLv2"));
        assert_eq!(sslv2_version(&[0x80, 0x1c, 1, 3, 1]), Some("TLSv1"));
        assert_eq!(sslv2_version(&[0x80, 0x1c, 2, 3, 1]), None);
    }
}
