//! `random_index on|off` (location): a URI ending in `/` is served by a file of that
//! directory picked at random (hidden names left out, links followed), through an internal
//! redirect keeping the arguments, as nginx's ngx_http_random_index_module. It runs before
//! `index`, which a directory without files is left to.

use super::{inherit, LoadCtx, LocConf};
use crate::errlog::Level;
use crate::http::flow::Flow;
use crate::http::request::Request;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::h1::Method;
use std::io::ErrorKind;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "random_index",
    ctx: Ctx::LOCATION,
    args: Args::Exactly(1),
    block: false,
}];

#[derive(Debug, Clone, Default)]
pub struct RandomIndexConf {
    pub on: Option<bool>,
}

impl RandomIndexConf {
    pub fn merge(&mut self, p: &RandomIndexConf) {
        inherit!(self, p, on);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    lc.random_index.on = Some(setters::flag(d)?);
    Ok(())
}

pub fn handle(req: &Request) -> Flow {
    if req.conf.random_index.on != Some(true)
        || !req.uri.ends_with('/')
        || !matches!(req.method(), Method::Get | Method::Head | Method::Post)
    {
        return Flow::Next;
    }
    let full = req.filename_for(&req.uri);
    // nginx opens the directory by its name without the trailing slash.
    let dir = full.to_string_lossy();
    let dir = std::path::Path::new(dir.strip_suffix('/').unwrap_or(&dir));
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            let (status, level) = match e.kind() {
                ErrorKind::NotFound | ErrorKind::NotADirectory | ErrorKind::InvalidFilename => {
                    (404, Level::Error)
                }
                ErrorKind::PermissionDenied => (403, Level::Error),
                _ => (500, Level::Crit),
            };
            // nginx's "(errno: text)": the OS's text without Rust's " (os error N)".
            let errno = e.raw_os_error().unwrap_or(0);
            let text = e.to_string();
            let why = text.split(" (os error").next().unwrap_or(&text);
            crate::errlog::request(
                level,
                req,
                format_args!("opendir() \"{}\" failed ({errno}: {why})", dir.display()),
            );
            return Flow::Status(status);
        }
    };
    let names: Vec<String> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            // A link counts by what it points to (stat, as nginx's ngx_de_info).
            let is_file = !name.starts_with('.') && std::fs::metadata(e.path()).ok()?.is_file();
            is_file.then_some(name)
        })
        .collect();
    if names.is_empty() {
        return Flow::Next;
    }
    let pick = &names[fastrand::usize(..names.len())];
    let mut uri = format!("{}{pick}", req.uri);
    if let Some(a) = &req.args {
        uri.push('?');
        uri.push_str(a);
    }
    Flow::Redirect(uri)
}
