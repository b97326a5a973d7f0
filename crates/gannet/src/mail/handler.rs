//! A mail session (nginx's ngx_mail_handler.c): accept, the PROXY protocol header and
//! `set_real_ip_from`, the TLS handshake of `listen ... ssl`, the protocol's dialogue until
//! a login, the auth server's answer (retried after `Auth-Wait`), then the proxy. Also the
//! parts every protocol shares: reading a command line within the client buffer, the
//! `max_errors` count, the SASL mechanisms (PLAIN, LOGIN, CRAM-MD5, EXTERNAL) and the
//! error log's context (`while ..., client: ..., server: ..., login: "..."`).

use super::core::{Protocol, Server};
use super::io::Io;
use crate::conn::proxy_protocol::ProxyAddrs;
use crate::errlog::Level;
use crate::runtime::worker::Worker;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How the client authenticated (the auth server's `Auth-Method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Plain,
    Login,
    Apop,
    CramMd5,
    External,
    /// SMTP without authentication (`smtp_auth none`: MAIL FROM / RCPT TO).
    None,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Plain | Method::Login => "plain",
            Method::Apop => "apop",
            Method::CramMd5 => "cram-md5",
            Method::External => "external",
            Method::None => "none",
        }
    }
}

/// What an SMTP client said before authenticating.
#[derive(Debug, Default)]
pub struct SmtpSeen {
    pub helo: Vec<u8>,
    pub from: Vec<u8>,
    pub to: Vec<u8>,
    pub esmtp: bool,
}

pub struct Session {
    pub srv: Arc<Server>,
    pub id: u64,
    /// The client (the PROXY header's, for a trusted `set_real_ip_from` address).
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub unix: bool,
    pub io: Io,
    /// Client bytes read and not parsed yet.
    pub buf: Vec<u8>,
    pub proxy_protocol: Option<Arc<ProxyAddrs>>,
    pub login: Vec<u8>,
    pub passwd: Option<Vec<u8>>,
    /// The APOP / CRAM-MD5 challenge, `<random.time@server_name>` and CRLF.
    pub salt: Vec<u8>,
    pub method: Method,
    /// The IMAP command's tag and its space (`a01 `).
    pub tag: Vec<u8>,
    pub errors: usize,
    pub quit: bool,
    pub login_attempt: u32,
    pub smtp: SmtpSeen,
    /// The SMTP client's name (`[UNAVAILABLE]` without a resolver); empty otherwise.
    pub host: String,
    /// TLS through STARTTLS / STLS.
    pub starttls: bool,
    pub tls: Option<crate::tls::TlsInfo>,
    /// What the session does, for the error log (`while in auth state`).
    pub action: &'static str,
    pub upstream: Option<String>,
}

/// A command line read, or why there is none.
pub enum Line {
    Got(Vec<u8>),
    /// The client buffer filled up without a whole command.
    TooLong,
    /// Closed, failed or timed out (logged).
    Gone,
}

/// Where the dialogue left the session.
pub enum Step {
    /// Close (after anything already sent).
    Quit,
    /// A login to ask the auth server about.
    Auth,
}

/// Serve one accepted connection of mail server `idx`.
pub async fn serve_tcp(w: Rc<Worker>, stream: std::net::TcpStream, peer: SocketAddr, idx: usize) {
    serve_tcp_as(w, stream, peer, idx, None).await
}

/// [`serve_tcp`] for a connection a stream server's `pass` handed over, with the address
/// it was passed to as its local one.
pub async fn serve_passed(
    w: Rc<Worker>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    idx: usize,
    local: SocketAddr,
) {
    Box::pin(serve_tcp_as(w, stream, peer, idx, Some(local))).await
}

async fn serve_tcp_as(
    w: Rc<Worker>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    idx: usize,
    local: Option<SocketAddr>,
) {
    let found = w.config.mail.as_ref().and_then(|m| {
        let l = m.listens.get(idx)?;
        Some((
            m.servers.get(idx)?.clone(),
            l.ssl,
            l.proxy_protocol,
            l.unix.is_some(),
        ))
    });
    let Some((srv, ssl, pp, unix)) = found else {
        w.connection_closed();
        return;
    };
    let local = local.unwrap_or_else(|| {
        stream
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    });
    if let Ok(tcp) = tokio::net::TcpStream::from_std(stream) {
        let mut s = Session {
            srv: srv.clone(),
            id: Worker::next_conn_id(),
            peer,
            local,
            unix,
            io: Io::Plain(tcp),
            buf: Vec::new(),
            proxy_protocol: None,
            login: Vec::new(),
            passwd: None,
            salt: Vec::new(),
            method: Method::Plain,
            tag: Vec::new(),
            errors: 0,
            quit: false,
            login_attempt: 0,
            smtp: SmtpSeen::default(),
            host: String::new(),
            starttls: false,
            tls: None,
            action: "",
            upstream: None,
        };
        crate::errlog::scoped(srv.conf.error_log.clone(), run(&mut s, ssl, pp)).await;
    }
    w.connection_closed();
}

async fn run(s: &mut Session, ssl: bool, pp: bool) {
    // nginx's event module writes a connection's accept at debug level to its listener's
    // log, which is the mail server's `error_log`.
    if crate::errlog::admits(Level::Debug) {
        crate::errlog::log(
            Level::Debug,
            format_args!("*{} accept: {}", s.id, s.client_text()),
        );
    }
    if crate::errlog::admits(Level::Info) {
        crate::errlog::log(
            Level::Info,
            format_args!(
                "*{} client {} connected to {}",
                s.id,
                s.client_text(),
                s.local
            ),
        );
    }
    if pp && !proxy_protocol(s).await {
        return;
    }
    if ssl && !super::ssl::handshake_listen(s).await {
        return;
    }
    let protocol = s.srv.protocol;
    let greeted = match protocol {
        Protocol::Imap => super::imap::greet(s).await,
        Protocol::Pop3 => super::pop3::greet(s).await,
        Protocol::Smtp => super::smtp::greet(s).await,
    };
    if !greeted {
        return;
    }
    loop {
        s.action = "in auth state";
        let step = match protocol {
            Protocol::Imap => super::imap::auth_state(s).await,
            Protocol::Pop3 => super::pop3::auth_state(s).await,
            Protocol::Smtp => super::smtp::auth_state(s).await,
        };
        if let Step::Quit = step {
            return;
        }
        s.login_attempt += 1;
        match super::auth_http::ask(s).await {
            Some(backend) => return super::proxy::run(s, backend).await,
            None if s.quit => return,
            None => {}
        }
    }
}

/// `listen ... proxy_protocol`: the header first, within `timeout`.
async fn proxy_protocol(s: &mut Session) -> bool {
    let Io::Plain(tcp) = &s.io else { return false };
    let who = crate::conn::proxy_protocol::Who {
        id: s.id,
        peer: s.peer,
        local: s.local,
    };
    match crate::conn::proxy_protocol::read_for(tcp, &who, s.srv.conf.timeout).await {
        Ok(addrs) => {
            s.proxy_protocol = addrs;
            super::realip::apply(s);
            true
        }
        Err(()) => false,
    }
}

impl Session {
    /// The client's address as nginx's logs and `Client-IP` give it.
    pub fn client_text(&self) -> String {
        match self.unix {
            true => "unix:".to_string(),
            false => crate::http::cidr::unmapped(self.peer.ip()).to_string(),
        }
    }

    /// A line of the error log, with nginx's mail context after it.
    pub fn log(&self, level: Level, msg: std::fmt::Arguments) {
        if !crate::errlog::admits(level) {
            return;
        }
        let mut ctx = String::new();
        if !self.action.is_empty() {
            ctx.push_str(" while ");
            ctx.push_str(self.action);
        }
        ctx.push_str(", client: ");
        ctx.push_str(&self.client_text());
        if self.starttls {
            ctx.push_str(" using starttls");
        }
        ctx.push_str(&format!(", server: {}", self.local));
        if !self.login.is_empty() {
            ctx.push_str(&format!(
                ", login: \"{}\"",
                String::from_utf8_lossy(&self.login)
            ));
        }
        if let Some(u) = &self.upstream {
            ctx.push_str(&format!(", upstream: {u}"));
        }
        crate::errlog::log(level, format_args!("*{} {msg}{ctx}", self.id));
    }

    /// Write `data` to the client within `timeout`; false when that failed (the session
    /// is over).
    pub async fn send(&mut self, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        let t = self.srv.conf.timeout;
        match tokio::time::timeout(t, self.io.write_all(data)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false,
            Err(_) => {
                self.log(
                    Level::Info,
                    format_args!("client timed out (110: Connection timed out)"),
                );
                false
            }
        }
    }

    /// Read more client bytes (up to `limit` held); false when the client is gone.
    pub async fn fill(&mut self, limit: usize) -> bool {
        let room = limit.saturating_sub(self.buf.len()).max(1);
        let mut chunk = vec![0u8; room.min(16384)];
        let t = self.srv.conf.timeout;
        match tokio::time::timeout(t, self.io.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => {
                self.log(
                    Level::Info,
                    format_args!("client timed out (110: Connection timed out)"),
                );
                false
            }
        }
    }

    /// The next line (up to its LF, which is kept), holding at most `limit` bytes.
    pub async fn next_line(&mut self, limit: usize) -> Line {
        let mut seen = 0;
        loop {
            if let Some(i) = memchr::memchr(b'\n', &self.buf[seen..]) {
                let line: Vec<u8> = self.buf.drain(..seen + i + 1).collect();
                return Line::Got(line);
            }
            seen = self.buf.len();
            if self.buf.len() >= limit {
                return Line::TooLong;
            }
            if !self.fill(limit).await {
                return Line::Gone;
            }
        }
    }

    /// nginx's answer to a command that does not fit the client buffer: logged, and the
    /// session ends after the protocol's invalid-command line.
    pub fn too_long(&mut self) {
        let cmd = String::from_utf8_lossy(&self.buf).into_owned();
        self.log(
            Level::Info,
            format_args!("client sent too long command \"{cmd}\""),
        );
        self.buf.clear();
        self.quit = true;
    }

    /// An invalid command: counted against `max_errors`.
    pub fn invalid(&mut self) {
        self.errors += 1;
        if self.errors >= self.srv.conf.max_errors {
            self.log(
                Level::Info,
                format_args!("client sent too many invalid commands"),
            );
            self.quit = true;
        }
    }

    /// `ssl` `starttls only` without TLS yet: commands that carry a login are invalid.
    pub fn starttls_only(&self) -> bool {
        !self.io.is_tls() && self.srv.conf.ssl.starttls == super::ssl::StartTls::Only
    }

    /// The APOP / CRAM-MD5 challenge, made once per session.
    pub fn make_salt(&mut self) {
        if self.salt.is_empty() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            self.salt = format!(
                "<{}.{}@{}>\r\n",
                fastrand::u32(..) & 0x7fff_ffff,
                now,
                self.srv.server_name
            )
            .into_bytes();
        }
    }
}

/// A SASL step's outcome (nginx's NGX_OK / NGX_DONE / NGX_MAIL_PARSE_INVALID_COMMAND).
pub enum Sasl {
    /// Answer and go on.
    Next,
    /// The login is complete.
    Done,
    Invalid,
}

/// `AUTH`'s mechanism and what it says next (nginx's `ngx_mail_auth_parse`).
pub enum Mech {
    /// LOGIN without the user name: ask for it.
    Login,
    /// LOGIN with the user name given.
    LoginUsername,
    /// PLAIN without the response: ask for it.
    Plain,
    CramMd5,
    External,
    /// PLAIN / EXTERNAL with the response, already taken.
    Done,
    Invalid,
}

pub fn auth_parse(s: &mut Session, args: &[Vec<u8>]) -> Mech {
    if s.starttls_only() || args.is_empty() {
        return Mech::Invalid;
    }
    let m = args[0].to_ascii_uppercase();
    match (m.as_slice(), args.len()) {
        (b"LOGIN", 1) => Mech::Login,
        (b"LOGIN", 2) => Mech::LoginUsername,
        (b"PLAIN", 1) => Mech::Plain,
        (b"PLAIN", 2) => match auth_plain(s, &args[1]) {
            Sasl::Done => Mech::Done,
            _ => Mech::Invalid,
        },
        (b"CRAM-MD5", 1) => Mech::CramMd5,
        (b"EXTERNAL", 1) => Mech::External,
        (b"EXTERNAL", 2) => match auth_external(s, &args[1]) {
            Sasl::Done => Mech::Done,
            _ => Mech::Invalid,
        },
        _ => Mech::Invalid,
    }
}

/// What a SASL exchange (IMAP AUTHENTICATE, POP3 and SMTP AUTH) waits for from the client.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SaslWait {
    LoginUsername,
    LoginPassword,
    Plain,
    CramMd5,
    External,
}

/// An AUTH command's mechanism (`methods`: the protocol's `*_auth` flags; `prompt`: its
/// continuation, "+ " or "334 "): the outcome, what comes next, its challenge in `out`.
pub fn sasl_begin(
    s: &mut Session,
    args: &[Vec<u8>],
    methods: u8,
    prompt: &str,
    out: &mut Vec<u8>,
) -> (Sasl, Option<SaslWait>) {
    let mut ask = |text: &str| *out = format!("{prompt}{text}\r\n").into_bytes();
    match auth_parse(s, args) {
        Mech::Login => {
            ask("VXNlcm5hbWU6");
            (Sasl::Next, Some(SaslWait::LoginUsername))
        }
        Mech::LoginUsername => {
            ask("UGFzc3dvcmQ6");
            (
                auth_login_username(s, &args[1]),
                Some(SaslWait::LoginPassword),
            )
        }
        Mech::Plain => {
            ask("");
            (Sasl::Next, Some(SaslWait::Plain))
        }
        Mech::CramMd5 if methods & super::core::AUTH_CRAM_MD5 != 0 => {
            *out = cram_md5_challenge(s, prompt);
            (Sasl::Next, Some(SaslWait::CramMd5))
        }
        Mech::External if methods & super::core::AUTH_EXTERNAL != 0 => {
            ask("VXNlcm5hbWU6");
            (Sasl::Next, Some(SaslWait::External))
        }
        Mech::Done => (Sasl::Done, None),
        _ => (Sasl::Invalid, None),
    }
}

/// The client's line answering a SASL challenge: the outcome and, when another line is
/// wanted, what it is (its challenge in `out`).
pub fn sasl_continue(
    s: &mut Session,
    wait: SaslWait,
    arg: &[u8],
    prompt: &str,
    out: &mut Vec<u8>,
) -> (Sasl, Option<SaslWait>) {
    match wait {
        SaslWait::LoginUsername => {
            *out = format!("{prompt}UGFzc3dvcmQ6\r\n").into_bytes();
            (auth_login_username(s, arg), Some(SaslWait::LoginPassword))
        }
        SaslWait::LoginPassword => (auth_login_password(s, arg), None),
        SaslWait::Plain => (auth_plain(s, arg), None),
        SaslWait::CramMd5 => (auth_cram_md5(s, arg), None),
        SaslWait::External => (auth_external(s, arg), None),
    }
}

/// nginx's base64 decoding: the standard alphabet, padding optional.
fn base64(s: &[u8]) -> Option<Vec<u8>> {
    let end = s.iter().position(|&c| c == b'=').unwrap_or(s.len());
    let body = &s[..end];
    if body.len() % 4 == 1 {
        return None;
    }
    let mut spec = data_encoding::BASE64_NOPAD.specification();
    spec.check_trailing_bits = false;
    spec.encoding().ok()?.decode(body).ok()
}

pub fn base64_encode(b: &[u8]) -> String {
    data_encoding::BASE64.encode(b)
}

fn bad_base64(s: &Session, mech: &str) -> Sasl {
    s.log(
        Level::Info,
        format_args!("client sent invalid base64 encoding in AUTH {mech} command"),
    );
    Sasl::Invalid
}

/// AUTH PLAIN's response: `authzid NUL login NUL password`.
pub fn auth_plain(s: &mut Session, arg: &[u8]) -> Sasl {
    let Some(plain) = base64(arg) else {
        return bad_base64(s, "PLAIN");
    };
    let mut parts = plain.splitn(3, |&c| c == 0);
    let (_authz, login, pass) = (parts.next(), parts.next(), parts.next());
    let Some(login) = login else {
        s.log(
            Level::Info,
            format_args!("client sent invalid login in AUTH PLAIN command"),
        );
        return Sasl::Invalid;
    };
    let Some(pass) = pass else {
        s.log(
            Level::Info,
            format_args!("client sent invalid password in AUTH PLAIN command"),
        );
        return Sasl::Invalid;
    };
    s.login = login.to_vec();
    s.passwd = Some(pass.to_vec());
    s.method = Method::Plain;
    Sasl::Done
}

pub fn auth_login_username(s: &mut Session, arg: &[u8]) -> Sasl {
    match base64(arg) {
        Some(l) => {
            s.login = l;
            Sasl::Next
        }
        None => bad_base64(s, "LOGIN"),
    }
}

pub fn auth_login_password(s: &mut Session, arg: &[u8]) -> Sasl {
    match base64(arg) {
        Some(p) => {
            s.passwd = Some(p);
            s.method = Method::Login;
            Sasl::Done
        }
        None => bad_base64(s, "LOGIN"),
    }
}

/// The CRAM-MD5 challenge line: `prefix` and the salt in base64.
pub fn cram_md5_challenge(s: &mut Session, prefix: &str) -> Vec<u8> {
    s.make_salt();
    let salt = &s.salt[..s.salt.len() - 2];
    format!("{prefix}{}\r\n", base64_encode(salt)).into_bytes()
}

/// CRAM-MD5's response: `login SP hex-digest` (32 characters).
pub fn auth_cram_md5(s: &mut Session, arg: &[u8]) -> Sasl {
    let Some(d) = base64(arg) else {
        return bad_base64(s, "CRAM-MD5");
    };
    let (login, hash) = match d.iter().position(|&c| c == b' ') {
        Some(i) => (d[..i].to_vec(), d[i + 1..].to_vec()),
        None => (d.clone(), Vec::new()),
    };
    s.login = login;
    if hash.len() != 32 {
        s.log(
            Level::Info,
            format_args!("client sent invalid CRAM-MD5 hash in AUTH CRAM-MD5 command"),
        );
        return Sasl::Invalid;
    }
    s.passwd = Some(hash);
    s.method = Method::CramMd5;
    Sasl::Done
}

pub fn auth_external(s: &mut Session, arg: &[u8]) -> Sasl {
    let Some(login) = base64(arg) else {
        return bad_base64(s, "EXTERNAL");
    };
    s.login = login;
    // EXTERNAL carries no password: the auth server has to give one (Auth-Pass).
    s.passwd = None;
    s.method = Method::External;
    Sasl::Done
}

/// Split a line's arguments at spaces (SMTP, POP3), at most `max`: `None` beyond.
pub fn split_args(rest: &[u8], max: usize) -> Option<Vec<Vec<u8>>> {
    let args: Vec<Vec<u8>> = rest
        .split(|&c| c == b' ')
        .filter(|a| !a.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    (args.len() <= max).then_some(args)
}

/// A command line without its CRLF (or LF); `None` for a CR elsewhere.
pub fn strip_eol(line: &[u8]) -> Option<&[u8]> {
    let l = line.strip_suffix(b"\n").unwrap_or(line);
    let l = l.strip_suffix(b"\r").unwrap_or(l);
    (!l.contains(&b'\r')).then_some(l)
}

/// A continuation line of AUTH (its first argument; nginx keeps parsing arguments).
pub fn continuation(line: &[u8]) -> Option<Vec<u8>> {
    let l = strip_eol(line)?;
    Some(l.split(|&c| c == b' ').next().unwrap_or_default().to_vec())
}
