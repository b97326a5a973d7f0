//! IMAP before the login (nginx's ngx_mail_imap_module, ngx_mail_imap_handler.c and the
//! IMAP part of ngx_mail_parse.c): the greeting `* OK IMAP4 ready`, then `CAPABILITY`,
//! `NOOP`, `LOGOUT`, `STARTTLS`, `LOGIN user password` (atoms, quoted strings with
//! backslash escapes, or literals `{N}` answered with `+ OK`, `{N+}` without) and
//! `AUTHENTICATE PLAIN|LOGIN|CRAM-MD5|EXTERNAL`. Tags are up to 32 characters of
//! `[A-Za-z0-9._-]`; a command with more than three arguments is invalid.
//!
//! `imap_capabilities NAME...` (IMAP4 IMAP4rev1 UIDPLUS), `imap_auth plain|login|cram-md5|
//! external...` (plain: the `AUTH=` capabilities listed and the mechanisms taken beyond
//! PLAIN and LOGIN), `imap_client_buffer SIZE` (4k: the longest command).

use super::core::{self, Capabilities, Texts};
use super::handler::{self as h, Line, Sasl, Session, Step};
use gannet_conf::{setters, ConfError, Directive};

#[derive(Debug, Clone)]
pub struct ImapConf {
    pub client_buffer: usize,
    pub capabilities: Capabilities,
    pub auth: u8,
}

impl Default for ImapConf {
    fn default() -> ImapConf {
        ImapConf {
            client_buffer: 4096,
            capabilities: Capabilities::new(&["IMAP4", "IMAP4rev1", "UIDPLUS"]),
            auth: core::AUTH_PLAIN,
        }
    }
}

const METHODS: &[(&str, u8)] = &[
    ("plain", core::AUTH_PLAIN),
    ("login", core::AUTH_LOGIN),
    ("cram-md5", core::AUTH_CRAM_MD5),
    ("external", core::AUTH_EXTERNAL),
];

pub fn set(d: &Directive, c: &mut ImapConf) -> Result<(), ConfError> {
    match d.name.as_str() {
        "imap_client_buffer" => {
            if d.args.len() != 1 {
                return Err(
                    d.error("invalid number of arguments in \"imap_client_buffer\" directive")
                );
            }
            c.client_buffer = setters::size_arg(d, 0)?.max(1) as usize;
        }
        "imap_capabilities" => c.capabilities.add(d)?,
        "imap_auth" => c.auth = core::auth_methods(d, METHODS)?,
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// The CAPABILITY lines (nginx's merge).
pub fn texts(c: &ImapConf) -> Texts {
    let mut caps = String::from("* CAPABILITY");
    for cap in &c.capabilities.list {
        caps.push(' ');
        caps.push_str(cap);
    }
    let before_auth = caps.clone();
    let names = [
        "AUTH=PLAIN",
        "AUTH=LOGIN",
        "",
        "AUTH=CRAM-MD5",
        "AUTH=EXTERNAL",
    ];
    for n in core::auth_names(c.auth, &names) {
        caps.push(' ');
        caps.push_str(n);
    }
    Texts {
        greeting: b"* OK IMAP4 ready\r\n".to_vec(),
        starttls_capability: format!("{caps} STARTTLS\r\n").into_bytes(),
        starttls_only_capability: format!("{before_auth} STARTTLS LOGINDISABLED\r\n").into_bytes(),
        capability: format!("{caps}\r\n").into_bytes(),
        ..Default::default()
    }
}

pub async fn greet(s: &mut Session) -> bool {
    let g = s.srv.texts.greeting.clone();
    s.send(&g).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum St {
    Start,
    /// Within AUTH: waiting for the client's answer to a challenge.
    Sasl(h::SaslWait),
}

/// A command as read.
enum Read {
    /// The command's name (none for a continuation line) and arguments.
    Cmd(Vec<u8>, Vec<Vec<u8>>),
    Invalid,
    TooLong,
    Gone,
}

pub async fn auth_state(s: &mut Session) -> Step {
    let mut st = St::Start;
    // A refused login's tag was used for its `NO`: the next command brings its own.
    s.tag.clear();
    loop {
        let read = read_command(s, st != St::Start).await;
        let mut tagged = true;
        let mut text: Vec<u8> = Vec::new();
        let mut out: Vec<u8> = b"OK completed\r\n".to_vec();
        let rc = match read {
            Read::Gone => return Step::Quit,
            Read::TooLong => {
                s.too_long();
                Sasl::Invalid
            }
            Read::Invalid => {
                s.invalid();
                Sasl::Invalid
            }
            Read::Cmd(name, args) if st == St::Start => {
                match name.to_ascii_uppercase().as_slice() {
                    b"LOGIN" => login(s, &args),
                    b"AUTHENTICATE" => {
                        let rc = authenticate(s, &args, &mut st, &mut out);
                        tagged = !matches!(rc, Sasl::Next);
                        rc
                    }
                    b"CAPABILITY" => {
                        let t = &s.srv.texts;
                        text = if s.io.is_tls() {
                            t.capability.clone()
                        } else {
                            match s.srv.conf.ssl.starttls {
                                super::ssl::StartTls::On => t.starttls_capability.clone(),
                                super::ssl::StartTls::Only => t.starttls_only_capability.clone(),
                                super::ssl::StartTls::Off => t.capability.clone(),
                            }
                        };
                        Sasl::Next
                    }
                    b"LOGOUT" => {
                        s.quit = true;
                        text = b"* BYE\r\n".to_vec();
                        Sasl::Next
                    }
                    b"NOOP" => Sasl::Next,
                    b"STARTTLS" if !s.io.is_tls() && s.srv.conf.ssl.starttls_enabled() => {
                        let line = [tag(s), out].concat();
                        if !s.send(&line).await || !super::ssl::starttls(s).await {
                            return Step::Quit;
                        }
                        s.tag.clear();
                        continue;
                    }
                    _ => Sasl::Invalid,
                }
            }
            Read::Cmd(_, args) => {
                let arg = args.first().cloned().unwrap_or_default();
                match st {
                    St::Sasl(wait) => {
                        let (rc, next) = h::sasl_continue(s, wait, &arg, "+ ", &mut out);
                        if let Some(next) = next {
                            tagged = false;
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
                tagged = true;
                text.clear();
                out = b"BAD invalid command\r\n".to_vec();
                st = St::Start;
            }
            Sasl::Next => {}
        }
        let line = match tagged {
            true => [text, tag(s), out].concat(),
            false => out,
        };
        if !s.send(&line).await || s.quit {
            return Step::Quit;
        }
        if st == St::Start {
            s.tag.clear();
        }
    }
}

fn tag(s: &Session) -> Vec<u8> {
    match s.tag.is_empty() {
        true => b"* ".to_vec(),
        false => s.tag.clone(),
    }
}

fn login(s: &mut Session, args: &[Vec<u8>]) -> Sasl {
    if s.starttls_only() || args.len() != 2 || args[0].is_empty() {
        return Sasl::Invalid;
    }
    s.login = args[0].clone();
    s.passwd = Some(args[1].clone());
    s.method = h::Method::Plain;
    Sasl::Done
}

fn authenticate(s: &mut Session, args: &[Vec<u8>], st: &mut St, out: &mut Vec<u8>) -> Sasl {
    let (rc, next) = h::sasl_begin(s, args, s.srv.conf.imap.auth, "+ ", out);
    if let Some(next) = next {
        *st = St::Sasl(next);
    }
    rc
}

/// Read one command: its tag (unless `continuation`), name and arguments, with literals.
async fn read_command(s: &mut Session, continuation: bool) -> Read {
    let limit = s.srv.conf.imap.client_buffer;
    let line = match s.next_line(limit).await {
        Line::Got(l) => l,
        Line::TooLong => return Read::TooLong,
        Line::Gone => return Read::Gone,
    };
    let mut used = line.len();
    // A non-synchronizing literal in an invalid command: its bytes would be taken as
    // commands, so the session ends (as nginx's).
    let nonsync = line.trim_ascii_end().ends_with(b"+}");
    let Some(mut rest) = h::strip_eol(&line).map(<[u8]>::to_vec) else {
        return bad(s, nonsync);
    };
    let mut name = Vec::new();
    if !continuation {
        let Some(sp) = rest.iter().position(|&c| c == b' ') else {
            return bad(s, nonsync);
        };
        let t = &rest[..sp];
        let ok = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_');
        if t.is_empty() || t.len() > 32 || !t.iter().all(ok) {
            return bad(s, nonsync);
        }
        s.tag = rest[..=sp].to_vec();
        let after: Vec<u8> = rest[sp..]
            .iter()
            .copied()
            .skip_while(|&c| c == b' ')
            .collect();
        let end = after.iter().position(|&c| c == b' ').unwrap_or(after.len());
        name = after[..end].to_vec();
        const KNOWN: &[&[u8]] = &[
            b"NOOP",
            b"LOGIN",
            b"LOGOUT",
            b"STARTTLS",
            b"CAPABILITY",
            b"AUTHENTICATE",
        ];
        if !KNOWN.iter().any(|k| k.eq_ignore_ascii_case(&name)) {
            return bad(s, nonsync);
        }
        rest = after[end..].to_vec();
    }
    let mut args = Vec::new();
    loop {
        let raw = continuation && args.is_empty();
        match parse_args(&rest, &mut args, raw) {
            Err(()) => return bad(s, nonsync),
            Ok(None) => return Read::Cmd(name, args),
            Ok(Some((n, sync))) => {
                if sync && !s.send(b"+ OK\r\n").await {
                    return Read::Gone;
                }
                used = used.saturating_add(n);
                if used > limit {
                    return Read::TooLong;
                }
                while s.buf.len() < n {
                    if !s.fill(limit).await {
                        return Read::Gone;
                    }
                }
                args.push(s.buf.drain(..n).collect());
                let line = match s.next_line(limit.saturating_sub(used).max(1)).await {
                    Line::Got(l) => l,
                    Line::TooLong => return Read::TooLong,
                    Line::Gone => return Read::Gone,
                };
                used = used.saturating_add(line.len());
                match h::strip_eol(&line) {
                    Some(r) if r.is_empty() || r[0] == b' ' => rest = r.to_vec(),
                    _ => return bad(s, nonsync),
                }
            }
        }
    }
}

fn bad(s: &mut Session, nonsync: bool) -> Read {
    if nonsync {
        s.quit = true;
    }
    Read::Invalid
}

/// The arguments of `rest` (after the command): atoms, quoted strings, and a literal's
/// announcement at the end (`Some((length, synchronizing))`). `raw`: a continuation
/// line, whose first argument is the line up to a space.
fn parse_args(
    rest: &[u8],
    args: &mut Vec<Vec<u8>>,
    raw: bool,
) -> Result<Option<(usize, bool)>, ()> {
    let mut i = 0;
    if raw {
        let end = rest.iter().position(|&c| c == b' ').unwrap_or(rest.len());
        args.push(rest[..end].to_vec());
        i = end;
    }
    loop {
        while i < rest.len() && rest[i] == b' ' {
            i += 1;
        }
        if i == rest.len() {
            return Ok(None);
        }
        if args.len() > 2 {
            return Err(());
        }
        match rest[i] {
            b'"' => {
                let mut arg = Vec::new();
                i += 1;
                loop {
                    match rest.get(i) {
                        None => return Err(()),
                        Some(b'"') => break,
                        Some(b'\\') => {
                            let c = *rest.get(i + 1).ok_or(())?;
                            arg.push(c);
                            i += 2;
                        }
                        Some(&c) => {
                            arg.push(c);
                            i += 1;
                        }
                    }
                }
                args.push(arg);
                i += 1;
            }
            b'{' => {
                let body = &rest[i + 1..];
                let (digits, sync) = match body {
                    [d @ .., b'+', b'}'] => (d, false),
                    [d @ .., b'}'] => (d, true),
                    _ => return Err(()),
                };
                if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                    return Err(());
                }
                let n = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| d.parse::<usize>().ok())
                    .ok_or(())?;
                return Ok(Some((n, sync)));
            }
            _ => {
                let end = rest[i..]
                    .iter()
                    .position(|&c| c == b' ')
                    .map_or(rest.len(), |e| i + e);
                args.push(rest[i..end].to_vec());
                i = end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_args;

    type Parsed = (Result<Option<(usize, bool)>, ()>, Vec<Vec<u8>>);

    fn args(rest: &[u8]) -> Parsed {
        let mut a = Vec::new();
        let r = parse_args(rest, &mut a, false);
        (r, a)
    }

    #[test]
    fn atoms_quoted_and_literals() {
        let (r, a) = args(br#" te\"st "se\"cret x""#);
        assert_eq!(r, Ok(None));
        assert_eq!(a, vec![br#"te\"st"#.to_vec(), br#"se"cret x"#.to_vec()]);
        assert_eq!(args(b" user {6}").0, Ok(Some((6, true))));
        assert_eq!(args(b" {6+}").0, Ok(Some((6, false))));
        // At most three arguments; an unterminated quote or a bad literal is invalid.
        assert_eq!(args(b" a b c d").0, Err(()));
        assert_eq!(args(b" \"open").0, Err(()));
        assert_eq!(args(b" {x}").0, Err(()));
    }
}
