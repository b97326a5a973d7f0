//! `listen ... proxy_protocol`: the PROXY protocol header (HAProxy's, version 1 text or
//! version 2 binary) that a load balancer sends ahead of its client's bytes. It is read
//! before anything else on the connection (before TLS, before HTTP/1.x or HTTP/2), and its
//! addresses become `$proxy_protocol_addr`, `$proxy_protocol_port`,
//! `$proxy_protocol_server_addr` and `$proxy_protocol_server_port`, and the client's
//! address with `real_ip_header proxy_protocol` (`modules::realip`). A version 2 header's
//! TLVs are kept as they came and read by `$proxy_protocol_tlv_NAME` ([`Tlv`]).
//!
//! What is accepted is nginx's: `PROXY TCP4|TCP6 src dst sport dport\r\n` with the address
//! text kept as written (nginx checks only its characters), `PROXY UNKNOWN ...\r\n` with no
//! addresses, and version 2 with the PROXY command over a stream transport (IPv4 or IPv6),
//! any other command, transport or family being taken off without addresses. Anything else
//! is nginx's `broken header` error: logged, and the connection closed without an answer.
//!
//! The header is taken off the socket exactly: peeked at until complete, then read by its
//! length, so the bytes behind it (a TLS ClientHello, a request) stay in the socket for the
//! code that reads them next, and neither TLS nor HTTP needs to know. nginx 1.22 parses
//! only what its first read got, so a header split across TCP segments is "broken" there;
//! gannet waits for the rest, within `client_header_timeout`.

use super::ConnInfo;
use crate::errlog::{self, Level};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// A version 1 line's longest form, CRLF included (the spec's and nginx's bound).
const V1_MAX: usize = 107;
/// The largest version 2 header taken (16 fixed bytes, addresses and TLVs); TLVs beyond
/// it are not worth a client's connection.
const V2_MAX: usize = 4096;

/// The addresses a PROXY protocol header carried.
#[derive(Debug, PartialEq, Eq)]
pub struct ProxyAddrs {
    /// The client's address as the header gave it (version 1: its text as written).
    pub addr: Box<str>,
    pub port: u16,
    /// The address the client connected to, at the proxy.
    pub server_addr: Box<str>,
    pub server_port: u16,
    /// A version 2 header's TLVs, as they came (empty for version 1 or none): only the
    /// variables that name one look into them (nginx's `pp->tlvs`).
    pub tlvs: Box<[u8]>,
}

impl ProxyAddrs {
    /// The client's address and port, when the text is an address (nginx's realip takes
    /// nothing from a header whose text is not one).
    pub fn client(&self) -> Option<SocketAddr> {
        let ip: IpAddr = self.addr.parse().ok()?;
        Some(SocketAddr::new(ip, self.port))
    }
}

/// What the bytes at hand say.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// Not yet a whole header, and nothing wrong so far.
    Incomplete,
    /// A header of `len` bytes, with addresses or (`UNKNOWN`, `LOCAL`, another family) none.
    Header {
        len: usize,
        addrs: Option<ProxyAddrs>,
    },
    /// nginx's message for what is wrong.
    Broken(String),
}

fn parse(buf: &[u8]) -> Parsed {
    let sig = buf.len().min(V2_SIGNATURE.len());
    if buf[..sig] == V2_SIGNATURE[..sig] && !buf.is_empty() {
        return parse_v2(buf);
    }
    parse_v1(buf)
}

fn parse_v1(buf: &[u8]) -> Parsed {
    let head = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = head.iter().position(|&b| b == b'\n') else {
        // Wait for the line's end only while what came could still be a header.
        // A protocol word that is neither TCP4, TCP6 nor UNKNOWN is broken already, as
        // nginx finds it without the rest of the line.
        let start = head.len().min(6);
        let word = head.get(6..).unwrap_or_default();
        let known = [&b"TCP4 "[..], b"TCP6 ", b"UNKNOWN"]
            .iter()
            .any(|p| word[..word.len().min(p.len())] == p[..word.len().min(p.len())]);
        return if head.len() < V1_MAX && head[..start] == b"PROXY "[..start] && known {
            Parsed::Incomplete
        } else {
            broken(buf)
        };
    };
    let line = &head[..=end];
    let Some(rest) = line.strip_prefix(b"PROXY ") else {
        return broken(buf);
    };
    if rest.starts_with(b"UNKNOWN") {
        // Whatever follows, up to the line's CRLF, is ignored (nginx).
        return match line.ends_with(b"\r\n") {
            true => Parsed::Header {
                len: line.len(),
                addrs: None,
            },
            false => broken(buf),
        };
    }
    let fields = match rest {
        [b'T', b'C', b'P', b'4' | b'6', b' ', fields @ ..] => fields,
        _ => return broken(buf),
    };
    match v1_fields(fields) {
        Some(addrs) => Parsed::Header {
            len: line.len(),
            addrs: Some(addrs),
        },
        None => broken(buf),
    }
}

/// `src dst sport dport\r\n`, as nginx reads them: each address up to a space, made of
/// hex digits, dots and colons; each port decimal digits up to 65535.
fn v1_fields(fields: &[u8]) -> Option<ProxyAddrs> {
    let fields = fields.strip_suffix(b"\r\n")?;
    let mut parts = fields.splitn(4, |&b| b == b' ');
    let mut addr = || -> Option<Box<str>> {
        let a = parts.next()?;
        a.iter()
            .all(|&b| b.is_ascii_hexdigit() || b == b'.' || b == b':')
            .then(|| String::from_utf8_lossy(a).into())
    };
    let (addr, server_addr) = (addr()?, addr()?);
    let mut port = || -> Option<u16> {
        let p = parts.next()?;
        if p.is_empty() || !p.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(p).ok()?.parse().ok()
    };
    let (port, server_port) = (port()?, port()?);
    Some(ProxyAddrs {
        addr,
        port,
        server_addr,
        server_port,
        tlvs: Box::default(),
    })
}

fn parse_v2(buf: &[u8]) -> Parsed {
    if buf.len() < 16 {
        return Parsed::Incomplete;
    }
    let version = buf[12] >> 4;
    if version != 2 {
        return Parsed::Broken(format!("unknown PROXY protocol version: {version}"));
    }
    let len = 16 + usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if len > V2_MAX {
        return Parsed::Broken(format!("too large PROXY protocol header: {len} bytes"));
    }
    if buf.len() < len {
        return Parsed::Incomplete;
    }
    let body = &buf[16..len];
    let (command, family, transport) = (buf[12] & 0x0f, buf[13] >> 4, buf[13] & 0x0f);
    // LOCAL (a health check from the proxy itself), a datagram or unspecified transport, an
    // unspecified or unix family: the header is taken off and the connection's own
    // addresses stand.
    if command != 1 || transport != 1 || !(family == 1 || family == 2) {
        return Parsed::Header { len, addrs: None };
    }
    let size = if family == 1 { 4 } else { 16 };
    if body.len() < 2 * size + 4 {
        return Parsed::Broken("PROXY protocol v2 header is too short for its addresses".into());
    }
    let ip = |at: usize| -> IpAddr {
        let b = &body[at..at + size];
        match <[u8; 4]>::try_from(b) {
            Ok(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
            Err(_) => {
                let mut v6 = [0u8; 16];
                v6.copy_from_slice(b);
                IpAddr::V6(Ipv6Addr::from(v6))
            }
        }
    };
    let port = |at: usize| u16::from_be_bytes([body[at], body[at + 1]]);
    Parsed::Header {
        len,
        addrs: Some(ProxyAddrs {
            addr: ip(0).to_string().into(),
            server_addr: ip(size).to_string().into(),
            port: port(2 * size),
            server_port: port(2 * size + 2),
            tlvs: body[2 * size + 4..].into(),
        }),
    }
}

/// nginx's message: the bytes up to the first CR or LF.
fn broken(buf: &[u8]) -> Parsed {
    let end = buf
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(buf.len());
    Parsed::Broken(format!(
        "broken header: \"{}\"",
        String::from_utf8_lossy(&buf[..end])
    ))
}

/// What the socket holds now, without taking it: `Ok(None)` when the client has closed.
/// `finished`: the client has sent all it will (its FIN is in), so a header still
/// incomplete never will be: nginx calls what came a broken header.
fn peek(stream: &TcpStream, finished: bool) -> io::Result<Option<Parsed>> {
    let mut buf = [0u8; V2_MAX];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call, and the
    // descriptor belongs to `stream`, which the borrow keeps open.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    Ok((n > 0).then(|| match parse(&buf[..n]) {
        Parsed::Incomplete if finished => broken(&buf[..n]),
        parsed => parsed,
    }))
}

/// The PROXY protocol v1 line a proxy opens its upstream connection with for a client
/// `peer` that connected to `local` (nginx's `ngx_proxy_protocol_write`).
pub fn v1_line(peer: SocketAddr, local: SocketAddr) -> String {
    let (src, dst) = (
        crate::http::cidr::unmapped(peer.ip()),
        crate::http::cidr::unmapped(local.ip()),
    );
    let family = if src.is_ipv4() && dst.is_ipv4() {
        "TCP4"
    } else {
        "TCP6"
    };
    format!(
        "PROXY {family} {src} {dst} {} {}\r\n",
        peer.port(),
        local.port()
    )
}

/// Take the PROXY protocol header off a new connection: its addresses (or none), or
/// `Err` when the connection is to be closed (the reason logged, as nginx logs it).
pub async fn read(
    stream: &TcpStream,
    info: &ConnInfo,
    limit: Duration,
) -> Result<Option<Arc<ProxyAddrs>>, ()> {
    read_for(stream, &Who::of(info), limit).await
}

/// A connection as the log lines name it: its number, client and local address.
pub struct Who {
    pub id: u64,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

impl Who {
    fn of(info: &ConnInfo) -> Who {
        Who {
            id: info.id,
            peer: info.peer,
            local: info.local,
        }
    }
}

/// [`read`] for a connection that is not an HTTP one (a stream session's).
pub async fn read_for(
    stream: &TcpStream,
    info: &Who,
    limit: Duration,
) -> Result<Option<Arc<ProxyAddrs>>, ()> {
    let deadline = Instant::now() + limit;
    let (len, addrs) = loop {
        let ready = match timeout_at(deadline, stream.ready(Interest::READABLE)).await {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => return fail(Level::Info, info, &e.to_string()),
            Err(_) => return fail(Level::Info, info, "client timed out"),
        };
        // An incomplete header is reported as WouldBlock, which tells tokio to wait for
        // the socket's next readiness: the rest of the header arriving. Once the client
        // has closed its side that readiness stays set, so an incomplete header is then
        // final (else this loop would spin until the client went away entirely).
        let finished = ready.is_read_closed();
        let peeked = stream.try_io(Interest::READABLE, || match peek(stream, finished)? {
            Some(Parsed::Incomplete) => Err(io::ErrorKind::WouldBlock.into()),
            other => Ok(other),
        });
        match peeked {
            Ok(Some(Parsed::Header { len, addrs })) => break (len, addrs),
            Ok(Some(Parsed::Broken(why))) => return fail(Level::Error, info, &why),
            Ok(Some(Parsed::Incomplete)) => continue,
            // Closed before a whole header: nothing to say (nginx is silent too).
            Ok(None) => return Err(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return fail(Level::Info, info, &e.to_string()),
        }
    };
    // The header's bytes were all just peeked at: read exactly them.
    let mut sink = [0u8; 512];
    let mut left = len;
    while left > 0 {
        let want = left.min(sink.len());
        match stream.try_read(&mut sink[..want]) {
            Ok(0) => return Err(()),
            Ok(n) => left -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if stream.readable().await.is_err() {
                    return Err(());
                }
            }
            Err(e) => return fail(Level::Info, info, &e.to_string()),
        }
    }
    Ok(addrs.map(Arc::new))
}

/// Log why the connection is closed, as nginx words it; `Err` for `read` to return.
fn fail<T>(level: Level, info: &Who, why: &str) -> Result<T, ()> {
    errlog::log(
        level,
        format_args!(
            "*{} {why} while reading PROXY protocol, client: {}, server: {}",
            info.id,
            info.peer.ip(),
            info.local
        ),
    );
    Err(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(buf: &[u8]) -> (usize, Option<ProxyAddrs>) {
        match parse(buf) {
            Parsed::Header { len, addrs } => (len, addrs),
            other => panic!("{other:?} for {buf:?}"),
        }
    }

    fn addrs(addr: &str, port: u16, server_addr: &str, server_port: u16) -> Option<ProxyAddrs> {
        Some(ProxyAddrs {
            addr: addr.into(),
            port,
            server_addr: server_addr.into(),
            server_port,
            tlvs: Box::default(),
        })
    }

    #[test]
    fn version_1() {
        let line = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            header(line),
            (45, addrs("192.0.2.7", 56324, "198.51.100.1", 443))
        );
        // The text is kept as written: nginx checks only its characters.
        let line = b"PROXY TCP6 0:0:0:0:0:0:0:1 ::1 0 65535\r\n";
        assert_eq!(header(line).1, addrs("0:0:0:0:0:0:0:1", 0, "::1", 65535));
        assert_eq!(
            header(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n")
                .1
                .unwrap()
                .client(),
            Some("1.2.3.4:1".parse().unwrap())
        );
        assert_eq!(
            header(b"PROXY TCP4 abc 5.6.7.8 1 2\r\n")
                .1
                .unwrap()
                .client(),
            None
        );
        assert_eq!(header(b"PROXY UNKNOWN\r\nGET"), (15, None));
        assert_eq!(header(b"PROXY UNKNOWN whatever 1 2\r\n"), (28, None));
    }

    #[test]
    fn version_1_incomplete_or_broken() {
        for part in [
            &b"P"[..],
            b"PROXY",
            b"PROXY TCP4 1.2.3.4 5.6",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r",
        ] {
            assert_eq!(parse(part), Parsed::Incomplete, "{part:?}");
        }
        for (bad, shown) in [
            (&b"GET / HTTP/1.1\r\n"[..], "GET / HTTP/1.1"),
            (b"GET", "GET"),
            (
                b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
                "PROXY TCP5 1.2.3.4 5.6.7.8 1 2",
            ),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n",
                "PROXY TCP4 1.2.3.4 5.6.7.8 1 65536",
            ),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n",
                "PROXY TCP4 1.2.3.4 5.6.7.8 -1 2",
            ),
            (
                b"PROXY TCP4 host 5.6.7.8 1 2\r\n",
                "PROXY TCP4 host 5.6.7.8 1 2",
            ),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
                "PROXY TCP4 1.2.3.4 5.6.7.8 1 2",
            ),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
                "PROXY TCP4 1.2.3.4 5.6.7.8 1",
            ),
            (b"PROXY UNKNOWN\n", "PROXY UNKNOWN"),
        ] {
            assert_eq!(
                parse(bad),
                Parsed::Broken(format!("broken header: \"{shown}\""))
            );
        }
        let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 100]].concat();
        assert!(matches!(parse(&long), Parsed::Broken(_)));
    }

    fn v2(command: u8, family_transport: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family_transport);
        h.extend((body.len() as u16).to_be_bytes());
        h.extend(body);
        h
    }

    #[test]
    fn version_2() {
        let v4 = [192, 0, 2, 7, 198, 51, 100, 1, 0xdc, 0x04, 0x01, 0xbb];
        let h = v2(1, 0x11, &v4);
        let with_request = [h.as_slice(), b"GET / HTTP/1.1\r\n"].concat();
        assert_eq!(
            header(&with_request),
            (28, addrs("192.0.2.7", 56324, "198.51.100.1", 443))
        );
        for cut in 1..h.len() {
            assert_eq!(parse(&h[..cut]), Parsed::Incomplete, "{cut}");
        }
        let mut v6 = vec![0u8; 36];
        v6[15] = 1;
        v6[16..28].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0]);
        v6[31] = 2;
        v6[32..36].copy_from_slice(&[0, 80, 1, 187]);
        let tlv = [0x04, 0x00, 0x02, 0, 0]; // a NOOP TLV is taken off with the header
        let mut with_tlv = addrs("::1", 80, "2001:db8::2", 443);
        if let Some(a) = &mut with_tlv {
            a.tlvs = tlv.into(); // and kept for `$proxy_protocol_tlv_*`
        }
        assert_eq!(
            header(&v2(1, 0x21, &[v6.as_slice(), &tlv].concat())),
            (57, with_tlv)
        );
        // LOCAL, UDP, AF_UNIX: taken off, no addresses.
        assert_eq!(header(&v2(0, 0x00, &[])), (16, None));
        assert_eq!(header(&v2(1, 0x12, &v4)), (28, None));
        assert_eq!(header(&v2(1, 0x31, &[0; 216])), (232, None));
        assert_eq!(
            parse(&v2(1, 0x11, &v4[..8])),
            Parsed::Broken("PROXY protocol v2 header is too short for its addresses".into())
        );
        let mut v3 = v2(1, 0x11, &v4);
        v3[12] = 0x31;
        assert_eq!(
            parse(&v3),
            Parsed::Broken("unknown PROXY protocol version: 3".into())
        );
        let mut huge = v2(1, 0x11, &v4);
        huge[14..16].copy_from_slice(&5000u16.to_be_bytes());
        assert_eq!(
            parse(&huge),
            Parsed::Broken("too large PROXY protocol header: 5016 bytes".into())
        );
    }
}
