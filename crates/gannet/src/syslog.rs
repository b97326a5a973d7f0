//! Logging to syslog, as nginx's `syslog:` targets of `error_log` and `access_log`:
//! `syslog:server=ADDR[:PORT][,facility=F][,severity=S][,tag=T][,nohostname]`.
//!
//! Messages are RFC 3164 datagrams, byte for byte as nginx builds them (ngx_syslog.c):
//! `<PRI>Mmm dd HH:MM:SS hostname tag: message`, PRI = facility * 8 + severity, the day
//! space-padded, the local time, the host name lowercased, no trailing newline. `ADDR` is a
//! host (UDP, port 514 unless given) or `unix:/path` (a unix datagram socket such as
//! `/dev/log`). Defaults as nginx: facility `local7`, severity `info`, tag `nginx`.
//!
//! Each target owns one unconnected, non-blocking datagram socket and sends with `sendto`:
//! no connection state to share between workers, no lock, and a receiver that is absent
//! or full costs a dropped message, never a blocked worker (nginx drops them too).

use gannet_conf::{ConfError, Directive};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::OnceLock;

const FACILITIES: [&str; 24] = [
    "kern", "user", "mail", "daemon", "auth", "intern", "lpr", "news", "uucp", "clock", "authpriv",
    "ftp", "ntp", "audit", "alert", "cron", "local0", "local1", "local2", "local3", "local4",
    "local5", "local6", "local7",
];

/// Severity names in syslog's order (0 = emerg); nginx's spelling, not syslog's err/warning.
pub const SEVERITIES: [&str; 8] = [
    "emerg", "alert", "crit", "error", "warn", "notice", "info", "debug",
];

/// RFC 3164 limits the tag to 32 characters; nginx checks it.
const MAX_TAG: usize = 32;

#[derive(Debug)]
enum Socket {
    Udp(UdpSocket, SocketAddr),
    Unix(UnixDatagram, PathBuf),
}

/// One `syslog:` target, ready to send.
#[derive(Debug)]
pub struct Peer {
    socket: Socket,
    facility: u8,
    /// The configured severity: what access-log lines are sent with (the error log sends
    /// each line with its own level's severity, as nginx).
    pub severity: u8,
    tag: String,
    nohostname: bool,
}

/// Whether a log argument names a syslog target.
pub fn is_syslog(arg: &str) -> bool {
    arg.starts_with("syslog:")
}

impl Peer {
    /// Parse `syslog:...` (the whole argument) for directive `d` and open its socket.
    pub fn parse(arg: &str, d: &Directive) -> Result<Peer, ConfError> {
        let spec = arg.strip_prefix("syslog:").unwrap_or(arg);
        let (mut server, mut facility, mut severity, mut tag) = (None, None, None, None);
        let mut nohostname = false;
        let dup = |what: &str| d.error(format!("duplicate syslog \"{what}\""));
        for p in spec.split(',') {
            if let Some(v) = p.strip_prefix("server=") {
                if server.is_some() {
                    return Err(dup("server"));
                }
                server = Some(open_socket(v, d)?);
            } else if let Some(v) = p.strip_prefix("facility=") {
                if facility.is_some() {
                    return Err(dup("facility"));
                }
                facility = Some(index_of(&FACILITIES, v, "facility", d)?);
            } else if let Some(v) = p.strip_prefix("severity=") {
                if severity.is_some() {
                    return Err(dup("severity"));
                }
                severity = Some(index_of(&SEVERITIES, v, "severity", d)?);
            } else if let Some(v) = p.strip_prefix("tag=") {
                if tag.is_some() {
                    return Err(dup("tag"));
                }
                if v.len() > MAX_TAG {
                    return Err(d.error("syslog tag length exceeds 32"));
                }
                if !v.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                    return Err(d.error(
                        "syslog \"tag\" only allows alphanumeric characters and underscore",
                    ));
                }
                tag = Some(v.to_string());
            } else if p == "nohostname" {
                nohostname = true;
            } else {
                return Err(d.error(format!("unknown syslog parameter \"{p}\"")));
            }
        }
        let socket = server.ok_or_else(|| d.error("no syslog server specified"))?;
        Ok(Peer {
            socket,
            facility: facility.unwrap_or(23),
            severity: severity.unwrap_or(6),
            tag: tag.unwrap_or_else(|| "nginx".to_string()),
            nohostname,
        })
    }

    /// Send `msg` (one line; a trailing newline is dropped) with `severity` (0 = emerg).
    pub fn send(&self, severity: u8, msg: &[u8]) -> io::Result<()> {
        let msg = msg.strip_suffix(b"\n").unwrap_or(msg);
        let mut out = Vec::with_capacity(64 + msg.len());
        out.extend_from_slice(
            format!("<{}>", u32::from(self.facility) * 8 + u32::from(severity)).as_bytes(),
        );
        crate::runtime::clock::append_syslog_time(&mut out);
        out.push(b' ');
        if !self.nohostname {
            out.extend_from_slice(hostname().as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(self.tag.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(msg);
        match &self.socket {
            Socket::Udp(s, to) => s.send_to(&out, to).map(drop),
            Socket::Unix(s, to) => s.send_to(&out, to).map(drop),
        }
    }
}

/// `server=` value: `unix:/path`, `host`, `host:port`, `[v6]` or `[v6]:port`.
fn open_socket(v: &str, d: &Directive) -> Result<Socket, ConfError> {
    let fail = |e: io::Error| d.error(format!("socket() for syslog server \"{v}\" failed ({e})"));
    if let Some(path) = v.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(d.error(format!("no path in the unix domain socket \"{v}\"")));
        }
        let s = UnixDatagram::unbound().map_err(fail)?;
        s.set_nonblocking(true).map_err(fail)?;
        return Ok(Socket::Unix(s, PathBuf::from(path)));
    }
    let addr = resolve(v).map_err(|m| d.error(format!("{m} in syslog server \"{v}\"")))?;
    let bind: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let s = UdpSocket::bind(bind).map_err(fail)?;
    s.set_nonblocking(true).map_err(fail)?;
    Ok(Socket::Udp(s, addr))
}

/// A host with an optional port (514 by default), resolved once at load, as nginx does.
fn resolve(v: &str) -> Result<SocketAddr, &'static str> {
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or("invalid host")?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or("invalid host")?)),
        }
    } else {
        match v.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (v, None),
        }
    };
    if host.is_empty() {
        return Err("no host");
    }
    let port = match port {
        None => 514,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err("invalid port"),
        },
    };
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or("host not found")
}

/// This machine's name, lowercased, as nginx puts it in every message (read once).
fn hostname() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` is a live, writable buffer of the length passed; gethostname writes
        // at most that many bytes into it.
        let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
        if !ok {
            return "localhost".to_string();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).to_lowercase()
    })
}

/// `v`'s number in syslog's table of names (facilities, severities), or nginx's error.
fn index_of(table: &[&str], v: &str, what: &str, d: &Directive) -> Result<u8, ConfError> {
    table
        .iter()
        .position(|n| *n == v)
        .map(|i| i as u8)
        .ok_or_else(|| d.error(format!("unknown syslog {what} \"{v}\"")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gannet_conf::Loc;

    fn directive(arg: &str) -> Directive {
        Directive {
            name: "error_log".into(),
            args: vec![arg.into()],
            block: None,
            loc: Loc {
                file: "t.conf".into(),
                line: 3,
            },
        }
    }

    fn parse(arg: &str) -> Result<Peer, String> {
        Peer::parse(arg, &directive(arg)).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_parameters() {
        let p = parse("syslog:server=127.0.0.1").unwrap();
        assert_eq!((p.facility, p.severity, p.tag.as_str()), (23, 6, "nginx"));
        match &p.socket {
            Socket::Udp(_, a) => assert_eq!(a.to_string(), "127.0.0.1:514"),
            s => panic!("{s:?}"),
        }
        let p = parse(
            "syslog:server=127.0.0.1:5140,facility=daemon,severity=warn,tag=web_1,nohostname",
        )
        .unwrap();
        assert_eq!(
            (p.facility, p.severity, p.tag.as_str(), p.nohostname),
            (3, 4, "web_1", true)
        );
        match &p.socket {
            Socket::Udp(_, a) => assert_eq!(a.to_string(), "127.0.0.1:5140"),
            s => panic!("{s:?}"),
        }
        assert_eq!(resolve("[::1]:5140"), Ok("[::1]:5140".parse().unwrap()));
        assert!(matches!(
            parse("syslog:server=unix:/dev/log").unwrap().socket,
            Socket::Unix(..)
        ));
    }

    #[test]
    fn errors_as_nginx_words_them() {
        let cases = [
            ("syslog:facility=local0", "no syslog server specified"),
            (
                "syslog:server=127.0.0.1,facility=local9",
                "unknown syslog facility \"local9\"",
            ),
            (
                "syslog:server=127.0.0.1,severity=err",
                "unknown syslog severity \"err\"",
            ),
            (
                "syslog:server=127.0.0.1,tag=a-b",
                "only allows alphanumeric",
            ),
            (
                "syslog:server=127.0.0.1,tag=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                "exceeds 32",
            ),
            (
                "syslog:server=127.0.0.1,bogus",
                "unknown syslog parameter \"bogus\"",
            ),
            (
                "syslog:server=127.0.0.1,server=127.0.0.1",
                "duplicate syslog \"server\"",
            ),
            (
                "syslog:server=127.0.0.1:99999",
                "invalid port in syslog server",
            ),
        ];
        for (arg, want) in cases {
            let e = parse(arg).unwrap_err();
            assert!(
                e.starts_with("t.conf:3: ") && e.contains(want),
                "{arg}: {e}"
            );
        }
    }
}
