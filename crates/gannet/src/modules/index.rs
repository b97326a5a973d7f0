//! `index`: for a URI ending in `/`, the first listed file that exists is served through an
//! internal redirect (so its own location applies, as in nginx). An entry starting with `/`
//! is a redirect target as is. With none found the directory goes to autoindex, else 403
//! (404 when the directory itself is missing).

use super::{inherit, LoadCtx, LocConf};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::variables::Template;
use crate::runtime::worker::Worker;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use gannet_proto::h1::Method;
use std::io::ErrorKind;
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "index",
    ctx: Ctx::HSL,
    args: Args::AtLeast(1),
    block: false,
}];

#[derive(Debug, Clone, Default)]
pub struct IndexConf {
    pub files: Option<Arc<Vec<Template>>>,
}

impl IndexConf {
    pub fn merge(&mut self, p: &IndexConf) {
        inherit!(self, p, files);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let mut files: Vec<Template> = lc.index.files.as_deref().cloned().unwrap_or_default();
    for a in &d.args {
        if a.is_empty() {
            return Err(d.error("index \"\" in \"index\" directive is invalid"));
        }
        files.push(Template::compile(a).map_err(|e| d.error(e))?);
    }
    lc.index.files = Some(Arc::new(files));
    Ok(())
}

pub fn handle(req: &Request, w: &Worker) -> Flow {
    // Other methods are left to the static handler (405), as in nginx.
    if !req.uri.ends_with('/') || !matches!(req.method(), Method::Get | Method::Head | Method::Post)
    {
        return Flow::Next;
    }
    let default = [Template::literal("index.html")];
    let files: &[Template] = req
        .conf
        .index
        .files
        .as_deref()
        .map_or(&default[..], |v| v.as_slice());
    for (i, t) in files.iter().enumerate() {
        let name = t.eval(req, None);
        if name.starts_with('/') {
            // An absolute entry (usually the last) is used without checking it exists.
            return Flow::Redirect(name);
        }
        let uri = format!("{}{}", req.uri, name);
        match req.open_file(w, &req.filename_for(&uri)) {
            Ok(f) if f.is_file => return Flow::Redirect(uri),
            Ok(_) => {}
            Err(ErrorKind::NotFound) if i + 1 == files.len() => {}
            Err(ErrorKind::NotFound) => {}
            Err(kind) => {
                return Flow::Status(super::static_files::file_error(
                    req,
                    kind,
                    &req.filename_for(&uri),
                ))
            }
        }
    }
    let dir = req.filename_for(&req.uri);
    match req.open_file(w, &dir) {
        Ok(f) if f.is_dir => Flow::Next,
        Ok(_) => Flow::Status(404),
        Err(kind) => Flow::Status(super::static_files::file_error(req, kind, &dir)),
    }
}
