//! The back end (nginx's ngx_mail_proxy_module): connect to the address the auth server
//! named, replay the login in the back end's protocol, then relay bytes both ways.
//!
//! - POP3: `USER`, `PASS`; IMAP: `LOGIN` with literals (`tag LOGIN {N}`), an untagged
//!   `CAPABILITY` before the tagged `OK` taken; SMTP: `EHLO`/`HELO server_name`, then
//!   with `xclient on` (default) `XCLIENT ADDR= LOGIN= NAME=` and the client's own
//!   `HELO`/`EHLO`, then `AUTH PLAIN` with `proxy_smtp_auth on`, or the client's
//!   `MAIL FROM` / `RCPT TO` when it did not authenticate (`smtp_auth none`). The client
//!   then gets the back end's last answer (`235 2.0.0 OK` for an SMTP login).
//! - `proxy_pass_error_message on`: a back end's refusal goes to the client as it is,
//!   instead of the protocol's internal error line.
//! - `proxy_buffer` (4k): the back end's longest answer line during the login, and the
//!   relay's buffer; `proxy_timeout` (24h): the relay's inactivity limit.
//! - `proxy_protocol on`: a PROXY protocol v1 line opens the connection to the back end.

use super::core::Protocol;
use super::handler::{Method, Session};
use crate::errlog::Level;
use gannet_conf::{setters, ConfError, Directive};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Clone)]
pub struct ProxyConf {
    pub buffer: usize,
    pub timeout: Duration,
    pub pass_error_message: bool,
    pub xclient: bool,
    pub smtp_auth: bool,
    pub proxy_protocol: bool,
}

impl Default for ProxyConf {
    fn default() -> ProxyConf {
        ProxyConf {
            buffer: 4096,
            timeout: Duration::from_secs(24 * 3600),
            pass_error_message: false,
            xclient: true,
            smtp_auth: false,
            proxy_protocol: false,
        }
    }
}

pub fn set(d: &Directive, c: &mut ProxyConf) -> Result<(), ConfError> {
    if d.args.len() != 1 {
        return Err(d.error(format!(
            "invalid number of arguments in \"{}\" directive",
            d.name
        )));
    }
    match d.name.as_str() {
        // nginx's `proxy on` is all a mail server does: accepted as it.
        "proxy" => {
            setters::flag(d)?;
        }
        "proxy_buffer" => c.buffer = setters::size_arg(d, 0)?.max(16) as usize,
        "proxy_timeout" => c.timeout = Duration::from_millis(setters::msec_arg(d, 0)?),
        "proxy_pass_error_message" => c.pass_error_message = setters::flag(d)?,
        "xclient" => c.xclient = setters::flag(d)?,
        "proxy_smtp_auth" => c.smtp_auth = setters::flag(d)?,
        _ => c.proxy_protocol = setters::flag(d)?,
    }
    Ok(())
}

/// Why the login to the back end stopped.
enum Fail {
    /// Logged; the client gets the protocol's internal error.
    Internal,
    /// `proxy_pass_error_message on`: the back end's answer, for the client.
    Pass(Vec<u8>),
}

/// Log in to `backend` for the session and relay.
pub async fn run(s: &mut Session, backend: SocketAddr) {
    s.action = "connecting to upstream";
    let timeout = s.srv.conf.timeout;
    let mut up = match tokio::time::timeout(timeout, TcpStream::connect(backend)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let e = crate::errlog::errno_text(&e);
            s.log(Level::Error, format_args!("connect() failed ({e})"));
            return end(s, Fail::Internal).await;
        }
        Err(_) => {
            s.log(
                Level::Error,
                format_args!("upstream timed out (110: Connection timed out)"),
            );
            return end(s, Fail::Internal).await;
        }
    };
    let _ = up.set_nodelay(true);
    let c = s.srv.conf.proxy.clone();
    if c.proxy_protocol {
        let line = crate::conn::proxy_protocol::v1_line(s.peer, s.local);
        if up.write_all(line.as_bytes()).await.is_err() {
            return end(s, Fail::Internal).await;
        }
    }
    let mut b = Login {
        up: &mut up,
        buf: Vec::with_capacity(c.buffer),
        limit: c.buffer,
        timeout,
        pass_error: c.pass_error_message,
    };
    let login = match s.srv.protocol {
        Protocol::Pop3 => pop3(s, &mut b).await,
        Protocol::Imap => imap(s, &mut b).await,
        Protocol::Smtp => smtp(s, &mut b, &c).await,
    };
    let to_client = match login {
        Ok(last) => last,
        Err(f) => return end(s, f).await,
    };
    s.action = "";
    s.log(Level::Info, format_args!("client logged in"));
    relay(s, up, to_client, &c).await;
}

async fn end(s: &mut Session, f: Fail) {
    let line = match f {
        Fail::Internal => s.srv.protocol.internal_error().to_vec(),
        Fail::Pass(l) => l,
    };
    s.send(&line).await;
}

/// The login exchange with the back end.
struct Login<'a> {
    up: &'a mut TcpStream,
    buf: Vec<u8>,
    limit: usize,
    timeout: Duration,
    pass_error: bool,
}

impl Login<'_> {
    async fn send(
        &mut self,
        s: &mut Session,
        line: &[u8],
        action: &'static str,
    ) -> Result<(), Fail> {
        s.action = action;
        self.buf.clear();
        match self.up.write_all(line).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let e = crate::errlog::errno_text(&e);
                s.log(Level::Error, format_args!("send() failed ({e})"));
                Err(Fail::Internal)
            }
        }
    }

    /// The back end's whole answer (ending in CRLF; SMTP: its last line), checked with
    /// `ok` (given the answer from its first line on).
    async fn answer(
        &mut self,
        s: &mut Session,
        ok: impl Fn(&[u8]) -> Option<bool>,
    ) -> Result<(), Fail> {
        s.action = "reading response from upstream";
        loop {
            if self.buf.len() >= 4 && self.buf.ends_with(b"\r\n") {
                if let Some(good) = ok(&self.buf) {
                    if good {
                        return Ok(());
                    }
                    return Err(self.invalid(s));
                }
            }
            if self.buf.len() >= self.limit {
                let text = String::from_utf8_lossy(&self.buf[..self.limit - 1]).into_owned();
                s.log(
                    Level::Error,
                    format_args!("upstream sent too long response line: \"{text}\""),
                );
                return Err(Fail::Internal);
            }
            let mut chunk = vec![0u8; self.limit - self.buf.len()];
            match tokio::time::timeout(self.timeout, self.up.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Err(Fail::Internal),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Err(_) => {
                    s.log(
                        Level::Info,
                        format_args!("upstream timed out (110: Connection timed out)"),
                    );
                    return Err(Fail::Internal);
                }
            }
        }
    }

    fn invalid(&self, s: &Session) -> Fail {
        let text = String::from_utf8_lossy(&self.buf[..self.buf.len() - 2]).into_owned();
        if !self.pass_error {
            s.log(
                Level::Error,
                format_args!("upstream sent invalid response: \"{text}\""),
            );
            return Fail::Internal;
        }
        s.log(
            Level::Info,
            format_args!("upstream sent invalid response: \"{text}\""),
        );
        Fail::Pass(self.buf.clone())
    }
}

fn line(parts: &[&[u8]]) -> Vec<u8> {
    let mut l = parts.concat();
    l.extend_from_slice(b"\r\n");
    l
}

async fn pop3(s: &mut Session, b: &mut Login<'_>) -> Result<Vec<u8>, Fail> {
    let ok = |r: &[u8]| Some(r.starts_with(b"+OK"));
    b.answer(s, ok).await?;
    let user = line(&[b"USER ", &s.login]);
    b.send(s, &user, "sending user name to upstream").await?;
    b.answer(s, ok).await?;
    let pass = line(&[b"PASS ", s.passwd.as_deref().unwrap_or_default()]);
    b.send(s, &pass, "sending password to upstream").await?;
    b.answer(s, ok).await?;
    Ok(std::mem::take(&mut b.buf))
}

async fn imap(s: &mut Session, b: &mut Login<'_>) -> Result<Vec<u8>, Fail> {
    b.answer(s, |r| Some(r.starts_with(b"* OK"))).await?;
    let tag = s.tag.clone();
    let login = format!("LOGIN {{{}}}", s.login.len());
    let l = line(&[&tag, login.as_bytes()]);
    b.send(s, &l, "sending LOGIN command to upstream").await?;
    b.answer(s, |r| Some(r.starts_with(b"+"))).await?;
    let passwd = s.passwd.clone().unwrap_or_default();
    let l = line(&[&s.login, format!(" {{{}}}", passwd.len()).as_bytes()]);
    b.send(s, &l, "sending user name to upstream").await?;
    b.answer(s, |r| Some(r.starts_with(b"+"))).await?;
    b.send(s, &line(&[&passwd]), "sending password to upstream")
        .await?;
    b.answer(s, |r| {
        // An untagged CAPABILITY may come first (Gmail, SmarterMail).
        let mut r = r;
        if r.starts_with(b"* ") {
            let i = memchr::memmem::find(&r[2..], b"\r\n")? + 4;
            r = &r[i..];
            if r.len() < 4 {
                return None;
            }
        }
        Some(r.starts_with(&tag) && r[tag.len()..].starts_with(b"OK"))
    })
    .await?;
    Ok(std::mem::take(&mut b.buf))
}

/// An SMTP answer's code, once its last line is in (a multi-line answer's lines have a
/// `-` after the code).
fn smtp_code(r: &[u8]) -> Option<&[u8]> {
    let body = &r[..r.len() - 2];
    let last = match memchr::memmem::rfind(body, b"\r\n") {
        Some(i) => &body[i + 2..],
        None => body,
    };
    if last.get(3) == Some(&b'-') {
        return None;
    }
    Some(&r[..3])
}

async fn smtp(s: &mut Session, b: &mut Login<'_>, c: &ProxyConf) -> Result<Vec<u8>, Fail> {
    let code =
        |want: &'static [&'static [u8]]| move |r: &[u8]| smtp_code(r).map(|c| want.contains(&c));
    b.answer(s, code(&[b"220"])).await?;
    let verb: &[u8] = if s.smtp.esmtp || c.xclient {
        b"EHLO "
    } else {
        b"HELO "
    };
    let name = s.srv.server_name.clone();
    b.send(
        s,
        &line(&[verb, name.as_bytes()]),
        "sending HELO/EHLO to upstream",
    )
    .await?;
    b.answer(s, code(&[b"250"])).await?;
    let xok: &'static [&'static [u8]] = &[b"220", b"250"];
    if c.xclient {
        let mut x = String::from("XCLIENT ADDR=");
        if !s.unix && s.peer.is_ipv6() && crate::http::cidr::unmapped(s.peer.ip()).is_ipv6() {
            x.push_str("IPV6:");
        }
        x.push_str(&s.client_text());
        if !s.login.is_empty() && !c.smtp_auth {
            x.push_str(" LOGIN=");
            x.push_str(&super::auth_http::escape(&s.login, true));
        }
        x.push_str(" NAME=");
        x.push_str(&s.host);
        b.send(s, &line(&[x.as_bytes()]), "sending XCLIENT to upstream")
            .await?;
        b.answer(s, code(xok)).await?;
        if !s.smtp.helo.is_empty() {
            let verb: &[u8] = if s.smtp.esmtp { b"EHLO " } else { b"HELO " };
            let helo = line(&[verb, &s.smtp.helo.clone()]);
            b.send(s, &helo, "sending client HELO/EHLO to upstream")
                .await?;
            b.answer(s, code(xok)).await?;
        }
    }
    if s.method == Method::None {
        let from = line(&[&s.smtp.from.clone()]);
        b.send(s, &from, "sending MAIL FROM to upstream").await?;
        b.answer(s, code(&[b"250"])).await?;
        let to = line(&[&s.smtp.to.clone()]);
        b.send(s, &to, "sending RCPT TO to upstream").await?;
        b.answer(s, |r| smtp_code(r).map(|_| true)).await?;
        return Ok(std::mem::take(&mut b.buf));
    }
    if c.smtp_auth {
        let Some(passwd) = s.passwd.clone() else {
            s.log(Level::Error, format_args!("no password available"));
            return Err(Fail::Internal);
        };
        let plain = [b"\0".as_slice(), &s.login, b"\0", &passwd].concat();
        let auth = format!("AUTH PLAIN {}", super::handler::base64_encode(&plain));
        b.send(s, &line(&[auth.as_bytes()]), "sending AUTH to upstream")
            .await?;
        b.answer(s, code(&[b"235"])).await?;
    }
    Ok(b"235 2.0.0 OK\r\n".to_vec())
}

/// Bytes both ways until either side closes or neither sends for `proxy_timeout`.
async fn relay(s: &mut Session, mut up: TcpStream, to_client: Vec<u8>, c: &ProxyConf) {
    s.action = "proxying";
    let pending = std::mem::take(&mut s.buf);
    if !s.send(&to_client).await || up.write_all(&pending).await.is_err() {
        return;
    }
    let (mut a, mut b) = (vec![0u8; c.buffer], vec![0u8; c.buffer]);
    loop {
        let step = tokio::time::timeout(c.timeout, async {
            tokio::select! {
                r = s.io.read(&mut a) => (true, r),
                r = up.read(&mut b) => (false, r),
            }
        })
        .await;
        let (from_client, n) = match step {
            Err(_) => {
                s.log(
                    Level::Info,
                    format_args!("client timed out (110: Connection timed out)"),
                );
                return;
            }
            Ok((from_client, Ok(n))) if n > 0 => (from_client, n),
            Ok(_) => break,
        };
        let sent = match from_client {
            true => up.write_all(&a[..n]).await.is_ok(),
            false => s.io.write_all(&b[..n]).await.is_ok(),
        };
        if !sent {
            break;
        }
    }
    s.action = "";
    s.log(Level::Info, format_args!("proxied session done"));
}
