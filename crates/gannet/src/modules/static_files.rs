//! The static-file content handler and its directives: `etag`, `if_modified_since`,
//! `open_file_cache`, `open_file_cache_valid`, `open_file_cache_min_uses`,
//! `open_file_cache_errors`. Precompressed files (`gzip_static` and its Brotli and zstd
//! twins, configured in `modules::compress`) are looked for here too.
//!
//! A found regular file becomes a 200 with Last-Modified, ETag (nginx's `"mtime-size"` in
//! hex) and Accept-Ranges; its body is the cached bytes for small files or a file range for
//! `sendfile`. A directory without the trailing slash is a 301 to the slash form. Conditional
//! requests and ranges are answered afterwards by `http::conditional`.

use super::compress::{Coding, Static};
use super::file_cache::Policy;
use super::{inherit, invalid, LoadCtx, LocConf};
use crate::errlog::Level;
use crate::http::compress;
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, FileRange, Part, Response};
use crate::runtime::worker::Worker;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::h1::Method;
use std::io::ErrorKind;
use std::time::Duration;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "etag",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "if_modified_since",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "open_file_cache",
        ctx: Ctx::HSL,
        args: Args::Between(1, 2),
        block: false,
    },
    Spec {
        name: "open_file_cache_valid",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "open_file_cache_min_uses",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "open_file_cache_errors",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfModifiedSince {
    Off,
    Exact,
    Before,
}

#[derive(Debug, Clone, Default)]
pub struct FilesConf {
    pub etag: Option<bool>,
    pub if_modified_since: Option<IfModifiedSince>,
    /// `open_file_cache max= inactive=`: (max, inactive); `off` (`Some(None)`) keeps
    /// gannet's default size, and each use of a file re-checks it as nginx re-opens it.
    pub cache_size: Option<Option<(usize, Duration)>>,
    pub cache_valid: Option<Duration>,
    pub cache_errors: Option<bool>,
}

impl FilesConf {
    pub fn merge(&mut self, p: &FilesConf) {
        inherit!(
            self,
            p,
            etag,
            if_modified_since,
            cache_size,
            cache_valid,
            cache_errors
        );
    }
    pub fn etag(&self) -> bool {
        self.etag.unwrap_or(true)
    }
    pub fn if_modified_since(&self) -> IfModifiedSince {
        self.if_modified_since.unwrap_or(IfModifiedSince::Exact)
    }
    pub fn policy(&self) -> Policy {
        let d = Policy::default();
        let set = self.cache_size.flatten();
        let (max, inactive) = set.unwrap_or((d.max, d.inactive));
        Policy {
            max,
            inactive,
            // gannet re-validates each second by default: nginx's 60 s applies only once an
            // admin turns open_file_cache on, and serving a stale file for a minute would
            // surprise one who did not.
            valid: self.cache_valid.unwrap_or(d.valid),
            errors: self.cache_errors.unwrap_or(false),
            // Set per request by `Request::open_file` from `disable_symlinks`.
            symlinks: d.symlinks,
            restat: set.is_none(),
        }
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.files;
    match d.name.as_str() {
        "etag" => c.etag = Some(setters::flag(d)?),
        "if_modified_since" => {
            c.if_modified_since = Some(match d.args[0].as_str() {
                "off" => IfModifiedSince::Off,
                "exact" => IfModifiedSince::Exact,
                "before" => IfModifiedSince::Before,
                v => return Err(invalid(d, v)),
            })
        }
        "open_file_cache" => {
            if d.args[0] == "off" {
                c.cache_size = Some(None);
                return Ok(());
            }
            let mut max = None;
            let mut inactive = Duration::from_secs(60);
            for a in &d.args {
                if let Some(v) = a.strip_prefix("max=") {
                    max = Some(
                        v.parse::<usize>()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| invalid(d, a))?,
                    );
                } else if let Some(v) = a.strip_prefix("inactive=") {
                    inactive = Duration::from_secs(setters::sec(v).ok_or_else(|| invalid(d, a))?);
                } else {
                    return Err(invalid(d, a));
                }
            }
            let max =
                max.ok_or_else(|| d.error("\"open_file_cache\" must have the \"max\" parameter"))?;
            c.cache_size = Some(Some((max, inactive)));
        }
        "open_file_cache_valid" => {
            c.cache_valid = Some(Duration::from_secs(
                setters::sec(&d.args[0]).ok_or_else(|| invalid(d, &d.args[0]))?,
            ))
        }
        "open_file_cache_min_uses" => {
            // Accepted: gannet caches on first use, which is what min_uses 1 means.
            d.args[0]
                .parse::<u32>()
                .map_err(|_| invalid(d, &d.args[0]))?;
        }
        "open_file_cache_errors" => c.cache_errors = Some(setters::flag(d)?),
        _ => return Err(d.error(format!("unknown directive \"{}\"", d.name))),
    }
    Ok(())
}

/// nginx's ETag: `"<mtime hex>-<size hex>"`.
pub fn etag(mtime_secs: i64, size: u64) -> String {
    format!("\"{mtime_secs:x}-{size:x}\"")
}

/// Serve `req.uri` as a file. URIs ending in `/` are left to index and autoindex.
pub fn handle(req: &Request, w: &Worker) -> Flow {
    // The method first, as nginx: a PUT to a directory URI is 405 too.
    if !matches!(req.method(), Method::Get | Method::Head | Method::Post) {
        return Flow::Status(405);
    }
    if req.uri.ends_with('/') {
        return Flow::Next;
    }
    // The path in the thread's buffer (taken out of its cell while in use): a file served
    // from the open file cache then costs no allocation for its name.
    let mut buf = PATH.with(std::cell::Cell::take);
    buf.clear();
    req.filename_into(&req.uri, &mut buf);
    let flow = serve(req, w, std::path::Path::new(&buf));
    if buf.capacity() <= PATH_KEEP {
        PATH.with(|c| c.set(buf));
    }
    flow
}

/// A path buffer that grew past this is not kept.
const PATH_KEEP: usize = 4096;

thread_local! {
    static PATH: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// [`handle`] once the file's path is known.
fn serve(req: &Request, w: &Worker, path: &std::path::Path) -> Flow {
    let mut vary = false;
    if req.conf.compress.any_static() && req.method() != Method::Post {
        match precompressed(req, w, path) {
            Precompressed::Found(r) => return Flow::Done(r),
            Precompressed::Varies => vary = true,
            Precompressed::None => {}
        }
    }
    let f = match req.open_file(w, path) {
        Ok(f) => f,
        Err(kind) => return Flow::Status(file_error(req, kind, path)),
    };
    if f.is_dir {
        return Flow::Moved(301, dir_location(req));
    }
    if !f.is_file {
        return Flow::Status(404);
    }
    if req.method() == Method::Post {
        return Flow::Status(405);
    }
    let mut r = file_response(req, &f);
    if vary {
        compress::add_vary(&mut r);
    }
    Flow::Done(r)
}

enum Precompressed {
    Found(Response),
    /// None for this client, but another client would get one (`gzip_vary`).
    Varies,
    None,
}

/// `gzip_static` / `brotli_static` / `zstd_static`: `file.gz` (`.br`, `.zst`) for an
/// encoding the client accepts, best first, or for one set to `always` whatever it accepts.
/// As in nginx, the compressed file is served even if the plain one does not exist; its
/// own Last-Modified and ETag go with it, the Content-Type is the plain name's, and a Range
/// is ignored (200).
fn precompressed(req: &Request, w: &Worker, path: &std::path::Path) -> Precompressed {
    let conf = &req.conf.compress;
    let mut on = [false; 3];
    let mut always = [false; 3];
    for c in Coding::PREFERENCE {
        match conf.static_mode(c) {
            Static::Off => {}
            Static::On => on[c as usize] = true,
            Static::Always => (on[c as usize], always[c as usize]) = (true, true),
        }
    }
    let open = |c: Coding| {
        let mut p = path.as_os_str().to_owned();
        p.push(c.suffix());
        req.open_file(w, std::path::Path::new(&p))
            .ok()
            .filter(|f| f.is_file)
    };
    let serve = |c: Coding, f: super::file_cache::OpenFile| {
        let mut r = file_response(req, &f);
        r.variants = None;
        // As nginx's gzip_static: no ranges of a compressed file.
        r.accept_ranges = false;
        r.headers
            .push(("Content-Encoding".into(), c.token().into()));
        if conf.vary() {
            compress::add_vary(&mut r);
        }
        Precompressed::Found(r)
    };
    // Each missing file is looked for once (the cache keeps no not-found results by default).
    let mut untried = on;
    if !compress::client_refuses(req, &Response::new(200)) {
        while let Some(c) = compress::negotiate(compress::accept_encoding(req), &untried) {
            untried[c as usize] = false;
            if let Some(f) = open(c) {
                return serve(c, f);
            }
        }
    }
    for c in Coding::PREFERENCE {
        if always[c as usize] && untried[c as usize] {
            untried[c as usize] = false;
            if let Some(f) = open(c) {
                return serve(c, f);
            }
        }
    }
    let exists = Coding::PREFERENCE
        .iter()
        .any(|&c| untried[c as usize] && open(c).is_some());
    if conf.vary() && exists {
        Precompressed::Varies
    } else {
        Precompressed::None
    }
}

/// The 200 response for an open regular file.
pub fn file_response(req: &Request, f: &super::file_cache::OpenFile) -> Response {
    let mut r = Response::new(200);
    r.content_type = Some(req.conf.types.lookup(&req.uri));
    r.last_modified = Some(f.mtime);
    if req.conf.files.etag() {
        r.etag = Some(f.etag.clone());
    }
    r.accept_ranges = true;
    r.body = match &f.data {
        Some(d) => {
            r.variants = Some(f.variants.clone());
            Body::one(Part::Bytes(d.clone()))
        }
        None => Body::one(Part::File(FileRange {
            file: f.file.clone(),
            offset: 0,
            len: f.size,
        })),
    };
    r
}

/// The regular file a pseudo-streaming handler (flv, mp4) serves, or what to answer instead:
/// 405 for other methods than GET/HEAD, the next handler for a directory URI or a directory
/// (the static handler's redirect), the open error's status.
/// (Boxed: a `Flow` is large and this is the rare path.)
pub fn open_media(req: &Request, w: &Worker) -> Result<super::file_cache::OpenFile, Box<Flow>> {
    if !matches!(req.method(), Method::Get | Method::Head) {
        return Err(Box::new(Flow::Status(405)));
    }
    if req.uri.ends_with('/') {
        return Err(Box::new(Flow::Next));
    }
    let path = req.filename_for(&req.uri);
    let f = req
        .open_file(w, &path)
        .map_err(|kind| Box::new(Flow::Status(file_error(req, kind, &path))))?;
    if !f.is_file {
        return Err(Box::new(Flow::Next));
    }
    Ok(f)
}

/// The status for a failed open, logged as nginx does (`open() "..." failed (2: ...)`).
pub fn file_error(req: &Request, kind: ErrorKind, path: &std::path::Path) -> u16 {
    let (status, errno, why) = match kind {
        ErrorKind::NotFound => (404, 2, "No such file or directory"),
        ErrorKind::NotADirectory => (404, 20, "Not a directory"),
        ErrorKind::PermissionDenied => (403, 13, "Permission denied"),
        ErrorKind::InvalidFilename => (414, 36, "File name too long"),
        // `disable_symlinks` refused a link.
        super::file_cache::LINK_REFUSED => (403, 40, "Too many levels of symbolic links"),
        _ => (500, 5, "Input/output error"),
    };
    // Under `disable_symlinks` nginx opens with openat() and says so.
    let call = match &req.conf.core.disable_symlinks {
        Some((m, _)) if *m != crate::modules::core::SymlinkMode::Off => "openat",
        _ => "open",
    };
    if status != 404 || req.conf.core.log_not_found() {
        crate::errlog::request(
            Level::Error,
            req,
            format_args!("{call}() \"{}\" failed ({errno}: {why})", path.display()),
        );
    }
    status
}

/// `uri/` plus the query string: where a directory request without its slash is sent.
fn dir_location(req: &Request) -> String {
    let mut loc = gannet_proto::uri::percent_encode_path(&req.uri);
    loc.push('/');
    if let Some(a) = &req.args {
        loc.push('?');
        loc.push_str(a);
    }
    loc
}
