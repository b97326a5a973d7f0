//! The mail core (nginx's ngx_mail_core_module): `server { listen ...; protocol ...; }`
//! blocks and the settings a server inherits from the mail level: `protocol imap|pop3|smtp`
//! (or, without it, the protocol of the listen's well-known port: 143/993, 110/995,
//! 25/465/587), `timeout` (60s: the client's silence before the login, and each write),
//! `server_name` (the machine's host name), `max_errors` (5 invalid commands close the
//! session), `resolver` / `resolver_timeout` (the SMTP client's name), `error_log`.
//!
//! `listen ADDRESS:PORT | PORT | unix:PATH [ssl] [proxy_protocol] [backlog=N] [rcvbuf=]
//! [sndbuf=] [so_keepalive=] [ipv6only=] [bind]`: one server serves an address, as in nginx.

use crate::config::listen::Listen;
use gannet_conf::{setters, ConfError, Directive};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What the mail block's parts read while loading.
pub struct LoadCtx {
    pub prefix: PathBuf,
    /// Every error log opened, for reopening (SIGUSR1).
    pub error_files: std::cell::RefCell<Vec<Arc<crate::errlog::Log>>>,
    /// The http side's load state, for the TLS setups (`ssl_*`).
    pub http: std::cell::RefCell<crate::modules::LoadCtx>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Imap,
    Pop3,
    Smtp,
}

impl Protocol {
    /// The name the auth server is told (`Auth-Protocol`).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Imap => "imap",
            Protocol::Pop3 => "pop3",
            Protocol::Smtp => "smtp",
        }
    }

    /// nginx's protocol of a listen without `protocol`: the protocol's well-known ports.
    fn of_port(port: u16) -> Option<Protocol> {
        match port {
            143 | 993 => Some(Protocol::Imap),
            110 | 995 => Some(Protocol::Pop3),
            25 | 465 | 587 => Some(Protocol::Smtp),
            _ => None,
        }
    }

    /// The line a session ends with when gannet itself fails.
    pub fn internal_error(self) -> &'static [u8] {
        match self {
            Protocol::Imap => b"* BAD internal server error\r\n",
            Protocol::Pop3 => b"-ERR internal server error\r\n",
            Protocol::Smtp => b"451 4.3.2 Internal server error\r\n",
        }
    }
}

/// A server's settings (the mail level's, then each server's over them).
#[derive(Debug, Clone)]
pub struct ServerConf {
    pub protocol: Option<Protocol>,
    pub timeout: Duration,
    /// Empty: the machine's host name.
    pub server_name: String,
    pub max_errors: usize,
    pub resolver: Option<Arc<crate::resolver::Resolver>>,
    pub resolver_timeout: Duration,
    pub error_log: Option<Arc<crate::errlog::ErrorLogs>>,
    error_log_own: bool,
    pub auth: super::auth_http::AuthConf,
    pub proxy: super::proxy::ProxyConf,
    pub imap: super::imap::ImapConf,
    pub pop3: super::pop3::Pop3Conf,
    pub smtp: super::smtp::SmtpConf,
    pub ssl: super::ssl::MailSsl,
    pub realip: crate::stream::realip::Trusted,
}

impl Default for ServerConf {
    fn default() -> ServerConf {
        ServerConf {
            protocol: None,
            timeout: Duration::from_secs(60),
            server_name: String::new(),
            max_errors: 5,
            resolver: None,
            resolver_timeout: crate::resolver::DEFAULT_TIMEOUT,
            error_log: None,
            error_log_own: false,
            auth: Default::default(),
            proxy: Default::default(),
            imap: Default::default(),
            pop3: Default::default(),
            smtp: Default::default(),
            ssl: Default::default(),
            realip: Default::default(),
        }
    }
}

/// The lines a server answers with, built once at load (nginx builds them in each
/// protocol module's merge).
#[derive(Debug, Default)]
pub struct Texts {
    pub greeting: Vec<u8>,
    pub capability: Vec<u8>,
    pub starttls_capability: Vec<u8>,
    pub starttls_only_capability: Vec<u8>,
    /// POP3's answer to `AUTH` without arguments.
    pub auth_capability: Vec<u8>,
    /// SMTP's answer to `HELO`.
    pub helo: Vec<u8>,
}

/// A `server {}` block, loaded.
#[derive(Debug)]
pub struct Server {
    pub conf: ServerConf,
    pub protocol: Protocol,
    pub server_name: String,
    pub texts: Texts,
    /// Its TLS setup, for `listen ... ssl` and `starttls`.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
}

/// The SASL mechanisms of `imap_auth`, `pop3_auth`, `smtp_auth`, in nginx's bit order
/// (the order the capability lists name them in).
pub const AUTH_PLAIN: u8 = 1;
pub const AUTH_LOGIN: u8 = 2;
pub const AUTH_APOP: u8 = 4;
pub const AUTH_CRAM_MD5: u8 = 8;
pub const AUTH_EXTERNAL: u8 = 16;
pub const AUTH_NONE: u8 = 32;

/// `*_auth METHOD...`: the methods named, from `known` (nginx's bitmask slot).
pub fn auth_methods(d: &Directive, known: &[(&str, u8)]) -> Result<u8, ConfError> {
    if d.args.is_empty() {
        return Err(d.error(format!(
            "invalid number of arguments in \"{}\" directive",
            d.name
        )));
    }
    let mut set = 0;
    for a in &d.args {
        let Some((_, bit)) = known.iter().find(|(n, _)| n.eq_ignore_ascii_case(a)) else {
            return Err(d.error(format!("invalid value \"{a}\"")));
        };
        if set & bit != 0 {
            return Err(d.error(format!("duplicate value \"{a}\"")));
        }
        set |= bit;
    }
    Ok(set)
}

/// The names of `set`'s methods, in bit order, from `names` (PLAIN, LOGIN, APOP,
/// CRAM-MD5, EXTERNAL; an empty name is never listed).
pub fn auth_names<'a>(set: u8, names: &[&'a str; 5]) -> Vec<&'a str> {
    (0..5)
        .filter(|i| set & (1 << i) != 0 && !names[*i].is_empty())
        .map(|i| names[i])
        .collect()
}

/// `*_capabilities`: the server's own list replaces the inherited one.
#[derive(Debug, Clone)]
pub struct Capabilities {
    pub list: Vec<String>,
    own: bool,
}

impl Capabilities {
    pub fn new(defaults: &[&str]) -> Capabilities {
        Capabilities {
            list: defaults.iter().map(|s| s.to_string()).collect(),
            own: false,
        }
    }

    pub fn add(&mut self, d: &Directive) -> Result<(), ConfError> {
        if d.args.is_empty() {
            return Err(d.error(format!(
                "invalid number of arguments in \"{}\" directive",
                d.name
            )));
        }
        if !self.own {
            self.list.clear();
            self.own = true;
        }
        self.list.extend(d.args.iter().cloned());
        Ok(())
    }

    /// In a new server: the next directive replaces the list.
    pub fn inherit(&mut self) {
        self.own = false;
    }
}

fn one(d: &Directive) -> Result<(), ConfError> {
    if d.args.len() == 1 {
        Ok(())
    } else {
        Err(d.error(format!(
            "invalid number of arguments in \"{}\" directive",
            d.name
        )))
    }
}

/// A directive of the mail or server level. `in_server`: inside a `server {}`.
pub fn apply(
    d: &Directive,
    c: &mut ServerConf,
    ctx: &LoadCtx,
    in_server: bool,
) -> Result<(), ConfError> {
    match d.name.as_str() {
        "protocol" => {
            one(d)?;
            c.protocol = Some(match d.args[0].as_str() {
                "imap" => Protocol::Imap,
                "pop3" => Protocol::Pop3,
                "smtp" => Protocol::Smtp,
                p => return Err(d.error(format!("unknown protocol \"{p}\""))),
            });
        }
        "timeout" => {
            one(d)?;
            c.timeout = Duration::from_millis(setters::msec_arg(d, 0)?);
        }
        "server_name" => {
            one(d)?;
            c.server_name = d.args[0].clone();
        }
        "max_errors" => {
            one(d)?;
            c.max_errors = setters::num_arg(d, 0)? as usize;
        }
        "resolver" => {
            if d.args.is_empty() {
                return Err(d.error("invalid number of arguments in \"resolver\" directive"));
            }
            c.resolver = match d.args[0].as_str() {
                "off" if d.args.len() == 1 => None,
                _ => Some(Arc::new(crate::resolver::parse(d)?)),
            };
        }
        "resolver_timeout" => {
            one(d)?;
            c.resolver_timeout = Duration::from_millis(setters::msec_arg(d, 0)?);
        }
        "error_log" => {
            let mut opened = ctx.error_files.borrow_mut();
            let log = (&mut c.error_log, &mut c.error_log_own);
            crate::errlog::set_block(d, &ctx.prefix, log, in_server, &mut opened)?;
        }
        "auth_http" | "auth_http_timeout" | "auth_http_header" | "auth_http_pass_client_cert" => {
            super::auth_http::set(d, &mut c.auth)?
        }
        "proxy"
        | "proxy_buffer"
        | "proxy_timeout"
        | "proxy_pass_error_message"
        | "xclient"
        | "proxy_smtp_auth"
        | "proxy_protocol" => super::proxy::set(d, &mut c.proxy)?,
        n if n.starts_with("imap_") => super::imap::set(d, &mut c.imap)?,
        n if n.starts_with("pop3_") => super::pop3::set(d, &mut c.pop3)?,
        n if n.starts_with("smtp_") => super::smtp::set(d, &mut c.smtp)?,
        "ssl" | "starttls" => super::ssl::set(d, &mut c.ssl, &mut ctx.http.borrow_mut())?,
        n if n.starts_with("ssl_") => super::ssl::set(d, &mut c.ssl, &mut ctx.http.borrow_mut())?,
        "set_real_ip_from" => c.realip.add(d, &mut ctx.http.borrow_mut().notices)?,
        "listen" | "server" => {
            return Err(d.error(format!("\"{}\" directive is not allowed here", d.name)))
        }
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// A `server {}` block: its settings over the mail level's, and its listens.
pub fn server(
    d: &Directive,
    top: &ServerConf,
    ctx: &LoadCtx,
) -> Result<(Server, Vec<Listen>), ConfError> {
    if d.block.is_none() || !d.args.is_empty() {
        return Err(d.error("invalid number of arguments in \"server\" directive"));
    }
    let mut conf = top.clone();
    conf.error_log_own = false;
    conf.ssl.inherit();
    conf.imap.capabilities.inherit();
    conf.pop3.capabilities.inherit();
    conf.smtp.capabilities.inherit();
    let mut listens = Vec::new();
    let mut by_port = None;
    for e in d.block.as_deref().unwrap_or_default() {
        match e.name.as_str() {
            "listen" => {
                let l = listen(e)?;
                by_port = by_port.or(Protocol::of_port(l.addr.port()));
                listens.push(l);
            }
            "server" => return Err(e.error("\"server\" directive is not allowed here")),
            _ => apply(e, &mut conf, ctx, true)?,
        }
    }
    if listens.is_empty() {
        return Err(d.error("no \"listen\" is defined for server"));
    }
    let Some(protocol) = conf.protocol.or(by_port) else {
        return Err(ConfError::bare(format!(
            "unknown mail protocol for server in {}",
            d.loc
        )));
    };
    if conf.auth.url.is_none() {
        return Err(ConfError::bare(format!(
            "no \"auth_http\" is defined for server in {}",
            d.loc
        )));
    }
    let server_name = match conf.server_name.is_empty() {
        true => crate::runtime::hostname().to_string(),
        false => conf.server_name.clone(),
    };
    let texts = match protocol {
        Protocol::Imap => super::imap::texts(&conf.imap),
        Protocol::Pop3 => super::pop3::texts(&conf.pop3),
        Protocol::Smtp => super::smtp::texts(&conf.smtp, &server_name),
    };
    if conf.ssl.on {
        for l in &mut listens {
            l.ssl = true;
        }
    }
    let wants_tls = listens.iter().any(|l| l.ssl) || conf.ssl.starttls != super::ssl::StartTls::Off;
    let tls = match wants_tls {
        true => Some(super::ssl::build(
            &conf.ssl,
            protocol,
            &mut ctx.http.borrow_mut(),
            &d.loc,
        )?),
        false => None,
    };
    Ok((
        Server {
            conf,
            protocol,
            server_name,
            texts,
            tls,
        },
        listens,
    ))
}

/// A mail `listen`: http's parser for what both have, after the mail checks.
fn listen(d: &Directive) -> Result<Listen, ConfError> {
    if d.args.is_empty() {
        return Err(d.error("invalid number of arguments in \"listen\" directive"));
    }
    for a in &d.args[1..] {
        let key = a.split('=').next().unwrap_or_default();
        match key {
            "default_server" | "default" | "http2" | "deferred" | "quic" | "udp" | "reuseport"
            | "fastopen" => return Err(d.error(format!("the invalid \"{a}\" parameter"))),
            _ => {}
        }
    }
    Listen::parse(d)
}
