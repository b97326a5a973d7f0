//! SMTP before the login (nginx's ngx_mail_smtp_module, ngx_mail_smtp_handler.c and the
//! SMTP part of ngx_mail_parse.c): with a `resolver`, the client's name (its address's
//! PTR name, kept only when that name resolves back to the address: `Client-Host`,
//! XCLIENT's `NAME=`; `[UNAVAILABLE]` / `[TEMPUNAVAIL]` otherwise), the greeting
//! `220 server_name ESMTP ready` (after `smtp_greeting_delay`: a client that speaks
//! first is refused with 503), then `HELO`, `EHLO` (the capability list), `AUTH
//! PLAIN|LOGIN|CRAM-MD5|EXTERNAL`, `MAIL FROM` / `RCPT TO` (with `smtp_auth none` the
//! recipient is the login), `RSET`, `NOOP`, `QUIT`, `STARTTLS`.
//!
//! `smtp_capabilities NAME...` (none), `smtp_auth plain|login|cram-md5|external|none...`
//! (plain login), `smtp_client_buffer SIZE` (4k), `smtp_greeting_delay TIME` (0).

use super::core::{self, Capabilities, Texts};
use super::handler::{self as h, Line, Sasl, Session, Step};
use crate::errlog::Level;
use gannet_conf::{setters, ConfError, Directive};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct SmtpConf {
    pub client_buffer: usize,
    pub greeting_delay: Duration,
    pub capabilities: Capabilities,
    pub auth: u8,
}

impl Default for SmtpConf {
    fn default() -> SmtpConf {
        SmtpConf {
            client_buffer: 4096,
            greeting_delay: Duration::ZERO,
            capabilities: Capabilities::new(&[]),
            auth: core::AUTH_PLAIN | core::AUTH_LOGIN,
        }
    }
}

const METHODS: &[(&str, u8)] = &[
    ("plain", core::AUTH_PLAIN),
    ("login", core::AUTH_LOGIN),
    ("cram-md5", core::AUTH_CRAM_MD5),
    ("external", core::AUTH_EXTERNAL),
    ("none", core::AUTH_NONE),
];

pub fn set(d: &Directive, c: &mut SmtpConf) -> Result<(), ConfError> {
    let one = || {
        if d.args.len() == 1 {
            Ok(())
        } else {
            Err(d.error(format!(
                "invalid number of arguments in \"{}\" directive",
                d.name
            )))
        }
    };
    match d.name.as_str() {
        "smtp_client_buffer" => {
            one()?;
            c.client_buffer = setters::size_arg(d, 0)?.max(1) as usize;
        }
        "smtp_greeting_delay" => {
            one()?;
            c.greeting_delay = Duration::from_millis(setters::msec_arg(d, 0)?);
        }
        "smtp_capabilities" => c.capabilities.add(d)?,
        "smtp_auth" => c.auth = core::auth_methods(d, METHODS)?,
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// SMTP's multi-line answer: `250-` on every line but the last.
fn reply(lines: &[String]) -> Vec<u8> {
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let sep = if i + 1 == lines.len() { ' ' } else { '-' };
        out.push_str(&format!("250{sep}{l}\r\n"));
    }
    out.into_bytes()
}

/// The greeting and EHLO's lists (nginx's merge).
pub fn texts(c: &SmtpConf, server_name: &str) -> Texts {
    let mut lines = vec![server_name.to_string()];
    lines.extend(c.capabilities.list.iter().cloned());
    let before_auth = lines.clone();
    let names = ["PLAIN", "LOGIN", "", "CRAM-MD5", "EXTERNAL"];
    let auth = core::auth_names(c.auth, &names);
    if c.auth & 0x1f != 0 {
        lines.push(format!("AUTH {}", auth.join(" ")));
    }
    let with = |mut l: Vec<String>| {
        l.push("STARTTLS".to_string());
        reply(&l)
    };
    Texts {
        greeting: format!("220 {server_name} ESMTP ready\r\n").into_bytes(),
        helo: format!("250 {server_name}\r\n").into_bytes(),
        capability: reply(&lines),
        starttls_capability: with(lines.clone()),
        starttls_only_capability: with(before_auth),
        ..Default::default()
    }
}

/// The client's name, then the greeting (after `smtp_greeting_delay`).
pub async fn greet(s: &mut Session) -> bool {
    s.host = client_host(s).await;
    let delay = s.srv.conf.smtp.greeting_delay;
    if !delay.is_zero() {
        s.action = "in delay pipelining state";
        let limit = s.srv.conf.smtp.client_buffer;
        if let Ok(alive) = tokio::time::timeout(delay, s.fill(limit)).await {
            if alive {
                let cmd: Vec<u8> = s
                    .buf
                    .iter()
                    .map(|&c| if c == b'\r' || c == b'\n' { b'_' } else { c })
                    .collect();
                s.log(
                    Level::Info,
                    format_args!(
                        "client was rejected before greeting: \"{}\"",
                        String::from_utf8_lossy(&cmd)
                    ),
                );
                s.send(b"503 5.5.0 Improper use of SMTP command pipelining\r\n")
                    .await;
            }
            return false;
        }
    }
    let g = s.srv.texts.greeting.clone();
    s.send(&g).await
}

const UNAVAILABLE: &str = "[UNAVAILABLE]";
const TEMPUNAVAIL: &str = "[TEMPUNAVAIL]";

async fn client_host(s: &mut Session) -> String {
    let Some(r) = s.srv.conf.resolver.clone() else {
        return UNAVAILABLE.to_string();
    };
    if s.unix {
        return TEMPUNAVAIL.to_string();
    }
    let ip = crate::http::cidr::unmapped(s.peer.ip());
    let t = s.srv.conf.resolver_timeout;
    s.action = "in resolving client address";
    let name = match r.reverse(ip, t).await {
        Ok(n) => n,
        Err(f) => {
            s.log(
                Level::Error,
                format_args!("{ip} could not be resolved ({})", f),
            );
            return match matches!(f, crate::resolver::Failure::NotFound) {
                true => UNAVAILABLE,
                false => TEMPUNAVAIL,
            }
            .to_string();
        }
    };
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'.');
    if !valid {
        s.log(
            Level::Error,
            format_args!("{ip} resolved to invalid host name \"{name}\""),
        );
        return TEMPUNAVAIL.to_string();
    }
    s.action = "in resolving client hostname";
    match r.lookup(&name, t).await {
        Ok((addrs, _)) if addrs.contains(&ip) => name,
        Ok(_) => UNAVAILABLE.to_string(),
        Err(f) => {
            s.log(
                Level::Error,
                format_args!("\"{name}\" could not be resolved ({})", f),
            );
            match matches!(f, crate::resolver::Failure::NotFound) {
                true => UNAVAILABLE,
                false => TEMPUNAVAIL,
            }
            .to_string()
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum St {
    Start,
    /// Within AUTH: waiting for the client's answer to a challenge.
    Sasl(h::SaslWait),
}

const OK: &[u8] = b"250 2.0.0 OK\r\n";
const INVALID_ARGUMENT: &[u8] = b"501 5.5.4 Invalid argument\r\n";
const BAD_SEQUENCE: &[u8] = b"503 5.5.1 Bad sequence of commands\r\n";

pub async fn auth_state(s: &mut Session) -> Step {
    let mut st = St::Start;
    loop {
        let limit = s.srv.conf.smtp.client_buffer;
        let mut out: Vec<u8> = OK.to_vec();
        let line = match s.next_line(limit).await {
            Line::Got(l) => Some(l),
            Line::TooLong => {
                s.too_long();
                None
            }
            Line::Gone => return Step::Quit,
        };
        let parsed = line.as_deref().map(|l| parse(l, st));
        let rc = match parsed {
            None => Sasl::Invalid,
            Some(None) => {
                s.invalid();
                Sasl::Invalid
            }
            Some(Some((cmd, args, text))) if st == St::Start => {
                let raw = line.clone().unwrap_or_default();
                match command(s, &cmd, &args, text, &raw, &mut st, &mut out) {
                    Some(rc) => rc,
                    None => {
                        let said = s.send(b"220 2.0.0 Start TLS\r\n").await;
                        if !said || !super::ssl::starttls(s).await {
                            return Step::Quit;
                        }
                        continue;
                    }
                }
            }
            Some(Some((_, args, _))) => {
                let arg = args.first().cloned().unwrap_or_default();
                match st {
                    St::Sasl(wait) => {
                        let (rc, next) = h::sasl_continue(s, wait, &arg, "334 ", &mut out);
                        if let Some(next) = next {
                            st = St::Sasl(next);
                        }
                        rc
                    }
                    St::Start => Sasl::Invalid,
                }
            }
        };
        match rc {
            Sasl::Done => return Step::Auth,
            Sasl::Invalid => {
                out = b"500 5.5.1 Invalid command\r\n".to_vec();
                st = St::Start;
            }
            Sasl::Next => {}
        }
        if !s.send(&out).await || s.quit {
            return Step::Quit;
        }
    }
}

/// A command of the start state; `None`: STARTTLS, to answer and start TLS.
fn command(
    s: &mut Session,
    cmd: &[u8],
    args: &[Vec<u8>],
    text: Vec<u8>,
    raw: &[u8],
    st: &mut St,
    out: &mut Vec<u8>,
) -> Option<Sasl> {
    let srv = s.srv.clone();
    let rc = match cmd {
        b"HELO" | b"EHLO" => {
            if args.len() != 1 {
                *out = INVALID_ARGUMENT.to_vec();
                return Some(Sasl::Next);
            }
            s.smtp.helo = args[0].clone();
            s.smtp.from.clear();
            s.smtp.to.clear();
            if cmd == b"HELO" {
                *out = srv.texts.helo.clone();
            } else {
                s.smtp.esmtp = true;
                *out = if s.io.is_tls() {
                    srv.texts.capability.clone()
                } else {
                    match srv.conf.ssl.starttls {
                        super::ssl::StartTls::On => srv.texts.starttls_capability.clone(),
                        super::ssl::StartTls::Only => srv.texts.starttls_only_capability.clone(),
                        super::ssl::StartTls::Off => srv.texts.capability.clone(),
                    }
                };
            }
            Sasl::Next
        }
        b"AUTH" => {
            if s.starttls_only() {
                return Some(Sasl::Invalid);
            }
            if args.is_empty() {
                *out = INVALID_ARGUMENT.to_vec();
                return Some(Sasl::Next);
            }
            auth(s, args, st, out)
        }
        b"QUIT" => {
            s.quit = true;
            *out = b"221 2.0.0 Bye\r\n".to_vec();
            Sasl::Next
        }
        b"MAIL" => {
            if srv.conf.smtp.auth & core::AUTH_NONE == 0 {
                rejected(s, raw);
                *out = b"530 5.7.1 Authentication required\r\n".to_vec();
            } else if !s.smtp.from.is_empty() {
                *out = BAD_SEQUENCE.to_vec();
            } else if args.is_empty() {
                *out = INVALID_ARGUMENT.to_vec();
            } else {
                s.smtp.from = text;
                s.login.clear();
                s.passwd = None;
            }
            Sasl::Next
        }
        b"RCPT" => {
            if s.smtp.from.is_empty() {
                *out = BAD_SEQUENCE.to_vec();
                return Some(Sasl::Next);
            }
            if args.is_empty() {
                *out = INVALID_ARGUMENT.to_vec();
                return Some(Sasl::Next);
            }
            s.smtp.to = text;
            s.method = h::Method::None;
            Sasl::Done
        }
        b"RSET" => {
            s.smtp.from.clear();
            s.smtp.to.clear();
            Sasl::Next
        }
        b"NOOP" => Sasl::Next,
        b"STARTTLS" if !s.io.is_tls() && srv.conf.ssl.starttls_enabled() => {
            // RFC 3207: what the client said before STARTTLS is forgotten.
            s.smtp = Default::default();
            s.buf.clear();
            return None;
        }
        _ => Sasl::Invalid,
    };
    Some(rc)
}

/// nginx's log line for a command refused (CR and LF shown as `_`).
fn rejected(s: &Session, raw: &[u8]) {
    let cmd: Vec<u8> = raw
        .iter()
        .map(|&c| if c == b'\r' || c == b'\n' { b'_' } else { c })
        .collect();
    s.log(
        Level::Info,
        format_args!("client was rejected: \"{}\"", String::from_utf8_lossy(&cmd)),
    );
}

fn auth(s: &mut Session, args: &[Vec<u8>], st: &mut St, out: &mut Vec<u8>) -> Sasl {
    let (rc, next) = h::sasl_begin(s, args, s.srv.conf.smtp.auth, "334 ", out);
    if let Some(next) = next {
        *st = St::Sasl(next);
    }
    rc
}

/// A command, its arguments and its text.
type Parsed = (Vec<u8>, Vec<Vec<u8>>, Vec<u8>);

/// A line as nginx's SMTP parser reads it: the command (upper-cased), its arguments (at
/// most 11) and the command's text up to its last argument (for MAIL FROM / RCPT TO).
/// A continuation line of AUTH is all arguments. `None`: invalid.
fn parse(line: &[u8], st: St) -> Option<Parsed> {
    let l = h::strip_eol(line)?;
    if st != St::Start {
        return Some((Vec::new(), vec![h::continuation(line)?], Vec::new()));
    }
    let end = l.iter().position(|&c| c == b' ').unwrap_or(l.len());
    let cmd = l[..end].to_ascii_uppercase();
    const KNOWN: &[&[u8]] = &[
        b"HELO",
        b"EHLO",
        b"QUIT",
        b"AUTH",
        b"NOOP",
        b"MAIL",
        b"RSET",
        b"RCPT",
        b"VRFY",
        b"EXPN",
        b"HELP",
        b"STARTTLS",
    ];
    if !KNOWN.contains(&cmd.as_slice()) {
        return None;
    }
    let args = h::split_args(&l[end..], 11)?;
    let text = l.trim_ascii_end().to_vec();
    Some((cmd, args, text))
}
