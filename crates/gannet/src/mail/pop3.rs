//! POP3 before the login (nginx's ngx_mail_pop3_module, ngx_mail_pop3_handler.c and the
//! POP3 part of ngx_mail_parse.c): the greeting `+OK POP3 ready` (with the APOP
//! challenge when `apop` or `cram-md5` is on), then `CAPA`, `NOOP`, `QUIT`, `STLS`,
//! `USER` / `PASS` (their argument is the rest of the line, spaces included), `APOP user
//! digest` and `AUTH [PLAIN|LOGIN|CRAM-MD5|EXTERNAL]`. A command is four letters; more
//! than three arguments are invalid; a command line holds at most 128 bytes (nginx's
//! fixed POP3 buffer).
//!
//! `pop3_capabilities NAME...` (TOP USER UIDL), `pop3_auth plain|apop|cram-md5|
//! external...` (plain, which brings LOGIN along: the `SASL` capability's list).

use super::core::{self, Capabilities, Texts};
use super::handler::{self as h, Line, Sasl, Session, Step};
use gannet_conf::{ConfError, Directive};

#[derive(Debug, Clone)]
pub struct Pop3Conf {
    pub capabilities: Capabilities,
    pub auth: u8,
}

impl Default for Pop3Conf {
    fn default() -> Pop3Conf {
        Pop3Conf {
            capabilities: Capabilities::new(&["TOP", "USER", "UIDL"]),
            auth: core::AUTH_PLAIN,
        }
    }
}

const METHODS: &[(&str, u8)] = &[
    ("plain", core::AUTH_PLAIN),
    ("apop", core::AUTH_APOP),
    ("cram-md5", core::AUTH_CRAM_MD5),
    ("external", core::AUTH_EXTERNAL),
];

/// nginx's POP3 command buffer.
const BUFFER: usize = 128;

pub fn set(d: &Directive, c: &mut Pop3Conf) -> Result<(), ConfError> {
    match d.name.as_str() {
        "pop3_capabilities" => c.capabilities.add(d)?,
        "pop3_auth" => c.auth = core::auth_methods(d, METHODS)?,
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

fn methods(c: &Pop3Conf) -> u8 {
    match c.auth & core::AUTH_PLAIN {
        0 => c.auth,
        _ => c.auth | core::AUTH_LOGIN,
    }
}

/// The CAPA and AUTH lists (nginx's merge).
pub fn texts(c: &Pop3Conf) -> Texts {
    let names = ["PLAIN", "LOGIN", "", "CRAM-MD5", "EXTERNAL"];
    let auth = core::auth_names(methods(c), &names);
    let mut caps = String::from("+OK Capability list follows\r\n");
    let mut only = caps.clone();
    for cap in &c.capabilities.list {
        caps.push_str(cap);
        caps.push_str("\r\n");
        if !cap.eq_ignore_ascii_case("USER") {
            only.push_str(cap);
            only.push_str("\r\n");
        }
    }
    caps.push_str("SASL");
    for n in &auth {
        caps.push(' ');
        caps.push_str(n);
    }
    caps.push_str("\r\n");
    let mut auth_list = String::from("+OK methods supported:\r\n");
    for n in &auth {
        auth_list.push_str(n);
        auth_list.push_str("\r\n");
    }
    Texts {
        greeting: b"+OK POP3 ready\r\n".to_vec(),
        starttls_capability: format!("{caps}STLS\r\n.\r\n").into_bytes(),
        starttls_only_capability: format!("{only}STLS\r\n.\r\n").into_bytes(),
        capability: format!("{caps}.\r\n").into_bytes(),
        auth_capability: format!("{auth_list}.\r\n").into_bytes(),
        ..Default::default()
    }
}

pub async fn greet(s: &mut Session) -> bool {
    let c = &s.srv.conf.pop3;
    if c.auth & (core::AUTH_APOP | core::AUTH_CRAM_MD5) != 0 {
        s.make_salt();
        let line = [b"+OK POP3 ready ".as_slice(), &s.salt].concat();
        return s.send(&line).await;
    }
    s.send(b"+OK POP3 ready\r\n").await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum St {
    Start,
    User,
    /// Within AUTH: waiting for the client's answer to a challenge.
    Sasl(h::SaslWait),
}

pub async fn auth_state(s: &mut Session) -> Step {
    let mut st = St::Start;
    loop {
        let mut out: Vec<u8> = b"+OK\r\n".to_vec();
        let line = match s.next_line(BUFFER).await {
            Line::Got(l) => Some(l),
            Line::TooLong => {
                s.too_long();
                None
            }
            Line::Gone => return Step::Quit,
        };
        let rc = match line.as_deref().map(|l| parse(l, st)) {
            None => Sasl::Invalid,
            Some(None) => {
                s.invalid();
                Sasl::Invalid
            }
            Some(Some((cmd, args))) => match st {
                St::Start | St::User => match command(s, &cmd, &args, &mut st, &mut out) {
                    Some(rc) => rc,
                    None => {
                        if !s.send(b"+OK\r\n").await || !super::ssl::starttls(s).await {
                            return Step::Quit;
                        }
                        continue;
                    }
                },
                _ => {
                    let arg = args.first().cloned().unwrap_or_default();
                    match st {
                        St::Sasl(wait) => {
                            let (rc, next) = h::sasl_continue(s, wait, &arg, "+ ", &mut out);
                            if let Some(next) = next {
                                st = St::Sasl(next);
                            }
                            rc
                        }
                        St::Start | St::User => Sasl::Invalid,
                    }
                }
            },
        };
        match rc {
            Sasl::Done => return Step::Auth,
            Sasl::Invalid => {
                out = b"-ERR invalid command\r\n".to_vec();
                st = St::Start;
            }
            Sasl::Next => {}
        }
        if !s.send(&out).await || s.quit {
            return Step::Quit;
        }
    }
}

/// A command of the start or USER state; `None`: STLS, to answer and start TLS.
fn command(
    s: &mut Session,
    cmd: &[u8],
    args: &[Vec<u8>],
    st: &mut St,
    out: &mut Vec<u8>,
) -> Option<Sasl> {
    let t = &s.srv.texts;
    let capa = |s: &Session| {
        if s.io.is_tls() {
            return t.capability.clone();
        }
        match s.srv.conf.ssl.starttls {
            super::ssl::StartTls::On => t.starttls_capability.clone(),
            super::ssl::StartTls::Only => t.starttls_only_capability.clone(),
            super::ssl::StartTls::Off => t.capability.clone(),
        }
    };
    let rc = match (cmd, *st) {
        (b"CAPA", _) => {
            *out = capa(s);
            Sasl::Next
        }
        (b"QUIT", _) => {
            s.quit = true;
            Sasl::Next
        }
        (b"NOOP", _) => Sasl::Next,
        (b"USER", St::Start) => {
            if s.starttls_only() || args.len() != 1 {
                return Some(Sasl::Invalid);
            }
            s.login = args[0].clone();
            *st = St::User;
            Sasl::Next
        }
        (b"PASS", St::User) => {
            if args.len() != 1 {
                return Some(Sasl::Invalid);
            }
            s.passwd = Some(args[0].clone());
            s.method = h::Method::Plain;
            Sasl::Done
        }
        (b"APOP", St::Start) => {
            if s.starttls_only() || args.len() != 2 || s.srv.conf.pop3.auth & core::AUTH_APOP == 0 {
                return Some(Sasl::Invalid);
            }
            s.login = args[0].clone();
            s.passwd = Some(args[1].clone());
            s.method = h::Method::Apop;
            Sasl::Done
        }
        (b"AUTH", St::Start) => auth(s, args, st, out),
        (b"STLS", St::Start) if !s.io.is_tls() && s.srv.conf.ssl.starttls_enabled() => return None,
        _ => Sasl::Invalid,
    };
    Some(rc)
}

fn auth(s: &mut Session, args: &[Vec<u8>], st: &mut St, out: &mut Vec<u8>) -> Sasl {
    if s.starttls_only() {
        return Sasl::Invalid;
    }
    if args.is_empty() {
        *out = s.srv.texts.auth_capability.clone();
        return Sasl::Next;
    }
    let (rc, next) = h::sasl_begin(s, args, s.srv.conf.pop3.auth, "+ ", out);
    if let Some(next) = next {
        *st = St::Sasl(next);
    }
    rc
}

/// A line as nginx's POP3 parser reads it: the command (upper-cased) and its arguments;
/// a continuation line of AUTH is all arguments. `None`: invalid.
fn parse(line: &[u8], st: St) -> Option<(Vec<u8>, Vec<Vec<u8>>)> {
    let l = h::strip_eol(line)?;
    if !matches!(st, St::Start | St::User) {
        return Some((Vec::new(), vec![h::continuation(line)?]));
    }
    let end = l.iter().position(|&c| c == b' ').unwrap_or(l.len());
    let cmd = l[..end].to_ascii_uppercase();
    const KNOWN: &[&[u8]] = &[
        b"USER", b"PASS", b"APOP", b"QUIT", b"CAPA", b"AUTH", b"NOOP", b"STLS",
    ];
    if !KNOWN.contains(&cmd.as_slice()) {
        return None;
    }
    let rest = &l[end..];
    let args = if cmd == b"USER" || cmd == b"PASS" {
        let a: Vec<u8> = rest.iter().copied().skip_while(|&c| c == b' ').collect();
        match a.is_empty() {
            true => Vec::new(),
            false => vec![a],
        }
    } else {
        h::split_args(rest, 3)?
    };
    Some((cmd, args))
}
