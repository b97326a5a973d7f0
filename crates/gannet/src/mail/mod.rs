//! nginx's mail proxy modules (src/mail/): the `mail {}` block. A client speaks IMAP,
//! POP3 or SMTP to gannet until it has given a login; gannet asks an HTTP auth server
//! (`auth_http`) where that login lives and with what password, then connects to that
//! back end, replays the login and relays the rest. One file per nginx module:
//!
//! - [`core`]: `server`, `listen`, `protocol`, `timeout`, `server_name`, `max_errors`,
//!   `resolver`, `error_log`, and the session from accept to the proxy
//!   (ngx_mail_core_module, ngx_mail_handler.c);
//! - [`imap`], [`pop3`], [`smtp`]: each protocol's dialogue before the login
//!   (ngx_mail_imap_module, ngx_mail_pop3_module, ngx_mail_smtp_module and their
//!   handlers and parsers);
//! - [`auth_http`]: the request to the auth server and its answer
//!   (ngx_mail_auth_http_module);
//! - [`proxy`]: the login replayed to the back end and the relay (ngx_mail_proxy_module);
//! - [`ssl`]: `listen ... ssl`, `starttls` and the `ssl_*` directives, through the stream
//!   side's TLS setup (ngx_mail_ssl_module);
//! - [`realip`]: `set_real_ip_from` (ngx_mail_realip_module).
//!
//! The listening sockets are bound by the master with the http and stream ones
//! (`Config::all_listens`, after the stream listens in the numbering).

pub mod auth_http;
pub mod core;
pub mod handler;
pub mod imap;
pub mod io;
pub mod pop3;
pub mod proxy;
pub mod realip;
pub mod smtp;
pub mod ssl;

use crate::config::listen::{Endpoint, Listen};
use gannet_conf::{ConfError, Directive};
use std::path::Path;
use std::sync::Arc;

/// The loaded `mail {}` block.
#[derive(Debug)]
pub struct MailConf {
    /// Every address to listen on, each served by `servers[i]`.
    pub listens: Vec<Listen>,
    pub servers: Vec<Arc<core::Server>>,
    /// Every mail `error_log` file (moved to `Config::error_files`, reopened with them).
    pub error_files: Vec<Arc<crate::errlog::Log>>,
}

/// Build the `mail` block. `taken`: the addresses http and stream listen on.
pub fn build(
    d: &Directive,
    prefix: &Path,
    taken: &[Endpoint],
    notes: (&mut Vec<String>, &mut Vec<String>),
) -> Result<MailConf, ConfError> {
    let body = d.block.as_deref().unwrap_or_default();
    let ctx = core::LoadCtx {
        prefix: prefix.to_path_buf(),
        error_files: Default::default(),
        http: std::cell::RefCell::new(crate::modules::LoadCtx::new(prefix)),
    };
    // The mail level's settings, inherited by every server that does not set them.
    let mut top = core::ServerConf::default();
    for e in body.iter().filter(|e| e.name != "server") {
        core::apply(e, &mut top, &ctx, false)?;
    }
    let mut out = MailConf {
        listens: Vec::new(),
        servers: Vec::new(),
        error_files: Vec::new(),
    };
    for s in body.iter().filter(|d| d.name == "server") {
        let (server, listens) = core::server(s, &top, &ctx)?;
        let server = Arc::new(server);
        for l in listens {
            let at = l.endpoint();
            if out.listens.iter().any(|o| o.endpoint() == at) || taken.contains(&at) {
                return Err(s.error(format!("duplicate \"{at}\" address and port pair")));
            }
            out.listens.push(l);
            out.servers.push(server.clone());
        }
    }
    out.error_files = ctx.error_files.take();
    let mut h = ctx.http.borrow_mut();
    notes.0.append(&mut h.notices);
    notes.1.append(&mut h.warnings);
    Ok(out)
}
