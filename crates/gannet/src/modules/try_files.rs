//! `try_files file ... uri | =code`: serve the first file that exists (a name ending in `/`
//! tests for a directory, and the URI it leaves has that `/` removed, as in nginx), else make
//! an internal redirect to the last argument (a URI or `@name`), or answer with `=code`.

use super::{LoadCtx, LocConf};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::variables::Template;
use crate::runtime::worker::Worker;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "try_files",
    ctx: Ctx(Ctx::SERVER.0 | Ctx::LOCATION.0),
    args: Args::AtLeast(2),
    block: false,
}];

#[derive(Debug, Clone)]
pub enum Fallback {
    Uri(Template),
    Code(u16),
}

/// One name to try.
#[derive(Debug, Clone)]
pub struct Try {
    /// The name, without the `/` that asks for a directory.
    pub name: Template,
    /// The argument ended in `/` (in the config, not in a variable's value, as nginx
    /// decides): a directory is looked for, and the URI it leaves has no final `/`.
    pub dir: bool,
}

#[derive(Debug, Clone, Default)]
pub struct TryFilesConf {
    pub tries: Option<Arc<(Vec<Try>, Fallback)>>,
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if lc.try_files.tries.is_some() {
        return Err(d.error("\"try_files\" directive is duplicate"));
    }
    let (last, files) = d
        .args
        .split_last()
        .ok_or_else(|| d.error("invalid number of arguments in \"try_files\" directive"))?;
    let fallback = match last.strip_prefix('=') {
        Some(code) => Fallback::Code(
            code.parse::<u16>()
                .ok()
                .filter(|c| (100..=999).contains(c))
                .ok_or_else(|| d.error(format!("invalid code \"{last}\"")))?,
        ),
        None => Fallback::Uri(Template::compile(last).map_err(|e| d.error(e))?),
    };
    let files = files
        .iter()
        .map(|f| {
            let dir = f.len() > 1 && f.ends_with('/');
            let name = if dir { &f[..f.len() - 1] } else { &f[..] };
            Template::compile(name)
                .map(|name| Try { name, dir })
                .map_err(|e| d.error(e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    lc.try_files.tries = Some(Arc::new((files, fallback)));
    Ok(())
}

/// Returns `Flow::Next` with `req.uri` set to the found file, or the fallback's flow.
pub fn handle(req: &mut Request, w: &Worker) -> Flow {
    let Some(tries) = req.conf.try_files.tries.clone() else {
        return Flow::Next;
    };
    for t in &tries.0 {
        let name = t.name.eval(req, None);
        let path = req.filename_for(&name);
        if let Ok(f) = req.open_file(w, &path) {
            if (t.dir && f.is_dir) || (!t.dir && f.is_file) {
                // `$uri/` for `/sub` leaves `/sub`, which the static module redirects to
                // `/sub/` (so relative links resolve), as nginx does; `/sub/` leaves `/sub/`
                // for the index module.
                req.uri = name;
                return Flow::Next;
            }
        }
    }
    match &tries.1 {
        Fallback::Code(c) => Flow::Status(*c),
        Fallback::Uri(t) => Flow::Redirect(t.eval(req, None)),
    }
}
