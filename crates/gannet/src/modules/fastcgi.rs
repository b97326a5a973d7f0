//! FastCGI, the configuration side (nginx's ngx_http_fastcgi_module): what is FastCGI's own
//! on top of the shared gateway settings (`gateway`: `fastcgi_pass`, `fastcgi_param`, the
//! timeouts, header lists, `fastcgi_next_upstream`...). The I/O is in `conn::gateway`; the
//! records in `gannet_proto::fastcgi`.
//!
//! Directives: the shared ones with the `fastcgi_` prefix, and `fastcgi_index`,
//! `fastcgi_split_path_info`, `fastcgi_keep_conn`, `fastcgi_catch_stderr`. Variables: `$fastcgi_script_name`,
//! `$fastcgi_path_info`.

use super::gateway::{self, spec, GatewayConf, Proto};
use super::{inherit, LoadCtx, LocConf};
use crate::http::regex::Regex;
use crate::http::request::Request;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::borrow::Cow;

pub const DIRECTIVES: &[Spec] = gateway::directives!(
    "fastcgi_",
    spec("fastcgi_index", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_split_path_info", Ctx::LOCATION, Args::Exactly(1)),
    spec("fastcgi_keep_conn", Ctx::HSL, Args::Exactly(1)),
    spec("fastcgi_catch_stderr", Ctx::HSL, Args::Exactly(1)),
);

#[derive(Debug, Clone, Default)]
pub struct FastCgiConf {
    pub gw: GatewayConf,
    pub index: Option<String>,
    pub split: Option<Regex>,
    pub keep_conn: Option<bool>,
    /// `fastcgi_catch_stderr`: strings that, in what the application writes to stderr
    /// before its answer's head, make the answer an invalid one (502, or the next server).
    pub catch_stderr: Option<std::sync::Arc<Vec<String>>>,
}

impl FastCgiConf {
    pub fn merge(&mut self, parent: &FastCgiConf) {
        self.gw.merge(&parent.gw);
        inherit!(self, parent, index, keep_conn, split, catch_stderr);
    }

    /// Whether `stderr`, written before the answer's head, holds a `fastcgi_catch_stderr`
    /// string.
    pub fn catches(&self, stderr: &[u8]) -> bool {
        self.catch_stderr.as_ref().is_some_and(|list| {
            list.iter()
                .any(|p| memchr::memmem::find(stderr, p.as_bytes()).is_some())
        })
    }
    pub fn keep_conn(&self) -> bool {
        self.keep_conn.unwrap_or(false)
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if gateway::set(d, Proto::FastCgi, lc, ctx)? {
        return Ok(());
    }
    let c = &mut lc.fastcgi;
    let a0 = d.args[0].as_str();
    match d.name.as_str() {
        "fastcgi_index" => c.index = Some(a0.to_string()),
        "fastcgi_split_path_info" => {
            let re = Regex::new(a0, false).map_err(|e| d.error(e))?;
            if re.groups() < 3 {
                return Err(d.error(format!("pattern \"{a0}\" must have 2 captures")));
            }
            c.split = Some(re);
        }
        "fastcgi_keep_conn" => c.keep_conn = Some(setters::flag(d)?),
        // A list at each level; a level with none inherits its parent's (nginx's array).
        "fastcgi_catch_stderr" => {
            let mut list = c.catch_stderr.as_deref().cloned().unwrap_or_default();
            list.push(a0.to_string());
            c.catch_stderr = Some(std::sync::Arc::new(list));
        }
        _ => unreachable!("not a fastcgi directive: {}", d.name),
    }
    Ok(())
}

/// `$fastcgi_script_name` and `$fastcgi_path_info` for the current URI, as parts of it; a
/// script name ending in `/` gets `fastcgi_index` appended by [`append_script_name`].
fn split_path_info(req: &Request) -> (Cow<'_, str>, Cow<'_, str>) {
    let uri = req.uri.as_str();
    match req
        .conf
        .fastcgi
        .split
        .as_ref()
        .and_then(|re| re.captures(uri.as_bytes()))
    {
        // Bytes, not chars: a group may split a UTF-8 sequence (see http::regex).
        Some(caps) => (caps.text(1), caps.text(2)),
        None => (Cow::Borrowed(uri), Cow::Borrowed("")),
    }
}

/// Append `$fastcgi_script_name`.
pub fn append_script_name(req: &Request, out: &mut String) {
    let script = split_path_info(req).0;
    out.push_str(&script);
    if script.ends_with('/') {
        if let Some(index) = &req.conf.fastcgi.index {
            out.push_str(index);
        }
    }
}

/// Append `$fastcgi_path_info`.
pub fn append_path_info(req: &Request, out: &mut String) {
    out.push_str(&split_path_info(req).1);
}
