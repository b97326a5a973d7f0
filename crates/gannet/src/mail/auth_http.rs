//! Asking the auth server (nginx's ngx_mail_auth_http_module): a `GET` over HTTP/1.0 to
//! `auth_http URL` with the login in `Auth-*` headers (`Auth-Method`, `Auth-User`,
//! `Auth-Pass` %-escaped, `Auth-Salt` for APOP / CRAM-MD5, `Auth-Protocol`,
//! `Auth-Login-Attempt`, `Client-IP`, `Client-Host`, the PROXY protocol's addresses, SMTP's
//! `Auth-SMTP-Helo/From/To`, `Auth-SSL-*` over TLS, then every `auth_http_header`). The
//! answer's `Auth-Status: OK` with `Auth-Server` / `Auth-Port` (and `Auth-Pass`,
//! `Auth-User`) names the back end; another status is the message the client gets (SMTP:
//! after `Auth-Error-Code`, 535 5.7.0 by default), then the session ends, or, with
//! `Auth-Wait: N`, goes on after N seconds; `Auth-Status: WAIT` asks again after them.
//!
//! `auth_http_timeout` (60s) bounds the whole exchange; `auth_http_pass_client_cert on`
//! adds the client's certificate (`Auth-SSL-Cert`, escaped PEM) when `ssl_verify_client`
//! is on.

use super::core::Protocol;
use super::handler::{Method, Session};
use crate::errlog::Level;
use gannet_conf::{setters, ConfError, Directive};
use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `auth_http`'s server.
#[derive(Debug, Clone)]
pub struct AuthUrl {
    pub addr: SocketAddr,
    /// How the log names it (`host:port` as written).
    pub name: String,
    pub host_header: String,
    pub uri: String,
}

#[derive(Debug, Clone)]
pub struct AuthConf {
    pub url: Option<AuthUrl>,
    pub timeout: Duration,
    /// `auth_http_header NAME VALUE`, as lines.
    pub headers: String,
    pub pass_client_cert: bool,
}

impl Default for AuthConf {
    fn default() -> AuthConf {
        AuthConf {
            url: None,
            timeout: Duration::from_secs(60),
            headers: String::new(),
            pass_client_cert: false,
        }
    }
}

pub fn set(d: &Directive, c: &mut AuthConf) -> Result<(), ConfError> {
    let n = if d.name == "auth_http_header" { 2 } else { 1 };
    if d.args.len() != n {
        return Err(d.error(format!(
            "invalid number of arguments in \"{}\" directive",
            d.name
        )));
    }
    match d.name.as_str() {
        "auth_http" => c.url = Some(parse_url(d)?),
        "auth_http_timeout" => c.timeout = Duration::from_millis(setters::msec_arg(d, 0)?),
        "auth_http_pass_client_cert" => c.pass_client_cert = setters::flag(d)?,
        _ => {
            let _ = write!(c.headers, "{}: {}\r\n", d.args[0], d.args[1]);
        }
    }
    Ok(())
}

fn parse_url(d: &Directive) -> Result<AuthUrl, ConfError> {
    let url = d.args[0].strip_prefix("http://").unwrap_or(&d.args[0]);
    let (hostport, uri) = match url.find('/') {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, "/"),
    };
    let bad = |why: &str| d.error(format!("{why} in auth_http \"{url}\""));
    if hostport.is_empty() {
        return Err(bad("no host"));
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') && !p.contains(']') => {
            let port = p.parse::<u16>().ok().filter(|p| *p > 0);
            (h, port.ok_or_else(|| bad("invalid port"))?)
        }
        _ => (hostport, 80),
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addr = (bare, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| bad("host not found"))?;
    Ok(AuthUrl {
        addr,
        name: format!("{host}:{port}"),
        host_header: host.to_string(),
        uri: uri.to_string(),
    })
}

/// %-escaping as nginx's: `mail_auth` (space, `%`, controls) or SMTP's xtext.
pub fn escape(b: &[u8], xtext: bool) -> String {
    let mut out = String::with_capacity(b.len());
    for &c in b {
        let esc = match xtext {
            false => c <= 0x20 || c == b'%',
            true => c <= 0x20 || c >= 0x7f || c == b'+' || c == b'=',
        };
        if esc {
            let _ = write!(out, "%{c:02X}");
        } else {
            out.push(c as char);
        }
    }
    out
}

/// The request for the session's login.
fn request(s: &Session, url: &AuthUrl) -> String {
    let c = &s.srv.conf.auth;
    let mut r = String::with_capacity(512);
    let _ = write!(
        r,
        "GET {} HTTP/1.0\r\nHost: {}\r\nAuth-Method: {}\r\nAuth-User: {}\r\nAuth-Pass: {}\r\n",
        url.uri,
        url.host_header,
        s.method.name(),
        escape(&s.login, false),
        escape(s.passwd.as_deref().unwrap_or_default(), false),
    );
    if matches!(s.method, Method::Apop | Method::CramMd5) && !s.salt.is_empty() {
        r.push_str("Auth-Salt: ");
        r.push_str(&String::from_utf8_lossy(&s.salt));
    }
    let _ = write!(
        r,
        "Auth-Protocol: {}\r\nAuth-Login-Attempt: {}\r\nClient-IP: {}\r\n",
        s.srv.protocol.name(),
        s.login_attempt,
        s.client_text()
    );
    if !s.host.is_empty() {
        let _ = write!(r, "Client-Host: {}\r\n", s.host);
    }
    if let Some(p) = &s.proxy_protocol {
        let _ = write!(
            r,
            "Proxy-Protocol-Addr: {}\r\nProxy-Protocol-Port: {}\r\n\
             Proxy-Protocol-Server-Addr: {}\r\nProxy-Protocol-Server-Port: {}\r\n",
            p.addr, p.port, p.server_addr, p.server_port
        );
    }
    if s.method == Method::None {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let _ = write!(
            r,
            "Auth-SMTP-Helo: {}\r\nAuth-SMTP-From: {}\r\nAuth-SMTP-To: {}\r\n",
            text(&s.smtp.helo),
            text(&s.smtp.from),
            text(&s.smtp.to)
        );
    }
    if let Some(t) = &s.tls {
        use crate::tls::vars::SslVar;
        r.push_str("Auth-SSL: on\r\n");
        let mut field = |name: &str, v: SslVar| {
            let mut val = String::new();
            v.append(&mut val, t);
            if !val.is_empty() {
                let _ = write!(r, "Auth-SSL-{name}: {val}\r\n");
            }
        };
        field("Protocol", SslVar::Protocol);
        field("Cipher", SslVar::Cipher);
        if s.srv.conf.ssl.verifies() {
            field("Verify", SslVar::ClientVerify);
            field("Subject", SslVar::ClientSDn);
            field("Issuer", SslVar::ClientIDn);
            field("Serial", SslVar::ClientSerial);
            field("Fingerprint", SslVar::ClientFingerprint);
            if c.pass_client_cert {
                let mut pem = String::new();
                SslVar::ClientRawCert.append(&mut pem, t);
                if !pem.is_empty() {
                    let _ = write!(r, "Auth-SSL-Cert: {}\r\n", escape(pem.as_bytes(), false));
                }
            }
        }
    }
    r.push_str(&c.headers);
    r.push_str("\r\n");
    r
}

/// The auth server's answer, as far as it matters.
#[derive(Default)]
struct Answer {
    status: Option<Vec<u8>>,
    wait: bool,
    server: Option<String>,
    port: Option<String>,
    user: Option<Vec<u8>>,
    pass: Option<Vec<u8>>,
    sleep: u64,
    errcode: Option<Vec<u8>>,
}

/// Ask the auth server about the session's login: the back end's address, or `None` after
/// answering the client (the session ends when `s.quit` is set, else the dialogue
/// resumes).
pub async fn ask(s: &mut Session) -> Option<SocketAddr> {
    loop {
        s.action = "in http auth state";
        let Some(url) = s.srv.conf.auth.url.clone() else {
            return internal(s).await;
        };
        let req = request(s, &url);
        if matches!(s.method, Method::Apop | Method::CramMd5) {
            // nginx forgets the digest once sent: the auth server must give Auth-Pass.
            s.passwd = None;
        }
        let timeout = s.srv.conf.auth.timeout;
        let got = tokio::time::timeout(timeout, exchange(&url, &req)).await;
        let raw = match got {
            Ok(Ok(raw)) => raw,
            Ok(Err(e)) => {
                s.log(Level::Error, format_args!("{e}"));
                return internal(s).await;
            }
            Err(_) => {
                s.log(
                    Level::Error,
                    format_args!("auth http server {} timed out", url.name),
                );
                return internal(s).await;
            }
        };
        let Some(a) = parse(&raw) else {
            s.log(
                Level::Error,
                format_args!("auth http server {} sent invalid response", url.name),
            );
            return internal(s).await;
        };
        if let Some(user) = a.user.clone() {
            s.login = user;
        }
        if let Some(pass) = a.pass.clone() {
            s.passwd = Some(pass);
        }
        if let Some(msg) = a.status.clone() {
            return failed(s, &a, &msg).await;
        }
        if a.wait {
            tokio::time::sleep(Duration::from_secs(a.sleep)).await;
            continue;
        }
        let (Some(server), Some(port)) = (&a.server, &a.port) else {
            s.log(
                Level::Error,
                format_args!("auth http server {} did not send server or port", url.name),
            );
            return internal(s).await;
        };
        if s.passwd.is_none() && s.srv.protocol != Protocol::Smtp {
            s.log(
                Level::Error,
                format_args!("auth http server {} did not send password", url.name),
            );
            return internal(s).await;
        }
        let Ok(ip) = server.parse::<std::net::IpAddr>() else {
            s.log(
                Level::Error,
                format_args!(
                    "auth http server {} sent invalid server address:\"{server}\"",
                    url.name
                ),
            );
            return internal(s).await;
        };
        let Some(port_n) = port.parse::<u16>().ok().filter(|p| *p > 0) else {
            s.log(
                Level::Error,
                format_args!(
                    "auth http server {} sent invalid server port:\"{port}\"",
                    url.name
                ),
            );
            return internal(s).await;
        };
        s.upstream = Some(format!("{server}:{port}"));
        return Some(SocketAddr::new(ip, port_n));
    }
}

/// The login was refused: the client is told why (after `Auth-Wait`, then the dialogue
/// goes on; without it the session ends).
async fn failed(s: &mut Session, a: &Answer, msg: &[u8]) -> Option<SocketAddr> {
    s.log(
        Level::Info,
        format_args!("client login failed: \"{}\"", String::from_utf8_lossy(msg)),
    );
    let line = match s.srv.protocol {
        Protocol::Pop3 => [b"-ERR ".as_slice(), msg, b"\r\n"].concat(),
        Protocol::Imap => [s.tag.as_slice(), b"NO ", msg, b"\r\n"].concat(),
        Protocol::Smtp => {
            let code = a.errcode.as_deref().unwrap_or(b"535 5.7.0");
            [code, b" ", msg, b"\r\n"].concat()
        }
    };
    if a.sleep == 0 {
        s.quit = true;
    } else {
        tokio::time::sleep(Duration::from_secs(a.sleep)).await;
        s.method = Method::Plain;
    }
    if !s.send(&line).await {
        s.quit = true;
    }
    None
}

/// gannet's own failure: the protocol's error line, and the end.
async fn internal(s: &mut Session) -> Option<SocketAddr> {
    s.quit = true;
    let line = s.srv.protocol.internal_error();
    s.send(line).await;
    None
}

async fn exchange(url: &AuthUrl, req: &str) -> Result<Vec<u8>, String> {
    let mut conn = tokio::net::TcpStream::connect(url.addr)
        .await
        .map_err(|e| format!("connect() failed ({})", crate::errlog::errno_text(&e)))?;
    conn.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("send() failed ({})", crate::errlog::errno_text(&e)))?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if head_end(&raw).is_some() || raw.len() >= 1024 {
            return Ok(raw);
        }
        let n = conn
            .read(&mut chunk)
            .await
            .map_err(|e| format!("recv() failed ({})", crate::errlog::errno_text(&e)))?;
        if n == 0 {
            return Ok(raw);
        }
        raw.extend_from_slice(&chunk[..n]);
    }
}

fn head_end(b: &[u8]) -> Option<usize> {
    memchr::memmem::find(b, b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| memchr::memmem::find(b, b"\n\n").map(|i| i + 2))
}

/// The status line (`HTTP/...`) and the headers nginx reads.
fn parse(raw: &[u8]) -> Option<Answer> {
    let end = head_end(raw)?;
    let mut lines = raw[..end].split(|&c| c == b'\n');
    if !lines.next()?.starts_with(b"HTTP/") {
        return None;
    }
    let mut a = Answer::default();
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        let colon = line.iter().position(|&c| c == b':')?;
        let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
        let value = line[colon + 1..]
            .iter()
            .copied()
            .skip_while(|&c| c == b' ')
            .collect::<Vec<u8>>();
        let value = value.trim_ascii_end().to_vec();
        let text = || String::from_utf8_lossy(&value).into_owned();
        match name.as_str() {
            "auth-status" => match value.as_slice() {
                b"OK" => {}
                b"WAIT" => a.wait = true,
                _ => a.status = Some(value.clone()),
            },
            "auth-server" => a.server = Some(text()),
            "auth-port" => a.port = Some(text()),
            "auth-user" => a.user = Some(value.clone()),
            "auth-pass" => a.pass = Some(value.clone()),
            "auth-wait" => {
                if let Ok(n) = text().parse() {
                    a.sleep = n;
                }
            }
            "auth-error-code" => a.errcode = Some(value.clone()),
            _ => {}
        }
    }
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_as_nginx() {
        assert_eq!(escape(b"a b%c\x01", false), "a%20b%25c%01");
        assert_eq!(escape(b"te\"st", false), "te\"st");
        assert_eq!(escape(b"a+b=c d", true), "a%2Bb%3Dc%20d");
    }

    #[test]
    fn parses_answer() {
        let a = parse(b"HTTP/1.0 200 OK\r\nAuth-Status: Invalid login\r\nAuth-Wait: 3\r\n\r\n")
            .unwrap();
        assert_eq!(a.status.as_deref(), Some(b"Invalid login".as_slice()));
        assert_eq!(a.sleep, 3);
        assert!(parse(b"FOO\r\n\r\n").is_none());
    }
}
