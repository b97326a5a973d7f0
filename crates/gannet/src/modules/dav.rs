//! ngx_http_dav_module: `dav_methods`, `dav_access`, `create_full_put_path` and
//! `min_delete_depth`: the WebDAV methods `PUT`, `DELETE`, `MKCOL`, `COPY` and `MOVE` on
//! the files under `root` / `alias`, with nginx's statuses, headers and error log lines.
//!
//! A `PUT` body is read whole into a named file in `client_body_temp_path` (so it should
//! be on the documents' filesystem), given `dav_access`'s mode (and the request's `Date` as
//! its time), then renamed over the target: a reader sees the old file or the new one,
//! never a part. Across filesystems it is copied next to the target and renamed there, as
//! nginx does. A body that fails (cut, too large) leaves nothing: its file is unlinked.

use super::{LoadCtx, LocConf};
use crate::conn::request_body::{self, BodyFile, RequestBody};
use crate::errlog::errno_text;
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::Response;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::h1::{BodyKind, Method};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "dav_methods",
        ctx: Ctx::HSL,
        args: Args::AtLeast(1),
        block: false,
    },
    Spec {
        name: "dav_access",
        ctx: Ctx::HSL,
        args: Args::Between(1, 3),
        block: false,
    },
    Spec {
        name: "create_full_put_path",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "min_delete_depth",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

const PUT: u8 = 1;
const DELETE: u8 = 2;
const MKCOL: u8 = 4;
const COPY: u8 = 8;
const MOVE: u8 = 16;

#[derive(Debug, Clone, Default)]
pub struct DavConf {
    /// The methods handled (a bit each); `Some(0)` is `dav_methods off`.
    methods: Option<u8>,
    access: Option<u32>,
    min_delete_depth: Option<u64>,
    create_full_put_path: Option<bool>,
}

impl DavConf {
    pub fn merge(&mut self, p: &DavConf) {
        super::inherit!(
            self,
            p,
            methods,
            access,
            min_delete_depth,
            create_full_put_path
        );
    }

    /// `dav_access`: the mode of the files made (0600 by default).
    fn access(&self) -> u32 {
        self.access.unwrap_or(0o600)
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.dav;
    let dup = || d.error(format!("\"{}\" directive is duplicate", d.name));
    match d.name.as_str() {
        // nginx's bitmask slot: a repeat adds to what the first one set.
        "dav_methods" => {
            let mut bits = c.methods.unwrap_or(0);
            for v in &d.args {
                bits |= match v.to_ascii_lowercase().as_str() {
                    "off" => 0,
                    "put" => PUT,
                    "delete" => DELETE,
                    "mkcol" => MKCOL,
                    "copy" => COPY,
                    "move" => MOVE,
                    _ => return Err(d.error(format!("invalid value \"{v}\""))),
                };
            }
            c.methods = Some(bits);
        }
        "dav_access" => {
            if c.access.is_some() {
                return Err(dup());
            }
            c.access = Some(access_mode(d)?);
        }
        "create_full_put_path" => {
            if c.create_full_put_path.is_some() {
                return Err(dup());
            }
            c.create_full_put_path = Some(setters::flag(d)?);
        }
        _ => {
            if c.min_delete_depth.is_some() {
                return Err(dup());
            }
            c.min_delete_depth = Some(setters::num_arg(d, 0)?);
        }
    }
    Ok(())
}

/// nginx's access slot: `user:rw|r`, `group:rw|r`, `all:rw|r`; the user always has at
/// least `rw` unless it is named.
fn access_mode(d: &Directive) -> Result<u32, ConfError> {
    let mut mode = 0;
    let mut user = 0o600;
    for v in &d.args {
        let (shift, right) = if let Some(r) = v.strip_prefix("user:") {
            user = 0;
            (6, r)
        } else if let Some(r) = v.strip_prefix("group:") {
            (3, r)
        } else if let Some(r) = v.strip_prefix("all:") {
            (0, r)
        } else {
            return Err(d.error(format!("invalid value \"{v}\"")));
        };
        let bits = match right {
            "rw" => 6,
            "r" => 4,
            _ => return Err(d.error(format!("invalid value \"{v}\""))),
        };
        mode |= bits << shift;
    }
    Ok(mode | user)
}

/// nginx's ngx_dir_access: a folder is searchable where it is readable.
fn dir_access(mode: u32) -> u32 {
    mode | (mode & 0o444) >> 2
}

/// The DAV method of the request, if the location handles it.
fn method(req: &Request, methods: u8) -> Option<u8> {
    let bit = match req.method() {
        Method::Put => PUT,
        Method::Delete => DELETE,
        Method::Other => match req.head.method_str() {
            "MKCOL" => MKCOL,
            "COPY" => COPY,
            "MOVE" => MOVE,
            _ => return None,
        },
        _ => return None,
    };
    (methods & bit != 0).then_some(bit)
}

/// The content handler: `Flow::Next` for what it does not handle.
pub fn handle(req: &Request) -> Flow {
    let Some(methods) = req.conf.dav.methods.filter(|&m| m != 0) else {
        return Flow::Next;
    };
    let Some(m) = method(req, methods) else {
        return Flow::Next;
    };
    match m {
        PUT => {
            if req.uri.ends_with('/') {
                return refuse(req, 409, "cannot PUT to a collection");
            }
            if req.head.header("content-range").is_some() {
                return refuse(req, 501, "PUT with range is unsupported");
            }
            Flow::Put
        }
        DELETE => delete(req),
        MKCOL => mkcol(req),
        _ => copy_move(req, m == MOVE),
    }
}

fn refuse(req: &Request, status: u16, why: &str) -> Flow {
    errlog::request(Level::Error, req, format_args!("{why}"));
    Flow::Status(status)
}

fn has_body(req: &Request) -> bool {
    match req.head.body {
        BodyKind::Length(n) => n > 0,
        BodyKind::Chunked => true,
        BodyKind::None => false,
    }
}

/// nginx's ngx_http_dav_error: the status for a failed call and its log line.
fn fs_error(req: &Request, e: &io::Error, not_found: u16, call: &str, path: &Path) -> u16 {
    let (level, status) = match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG) => (Level::Error, not_found),
        Some(libc::EACCES | libc::EPERM) => (Level::Error, 403),
        Some(libc::EEXIST) => (Level::Error, 405),
        Some(libc::ENOSPC) => (Level::Crit, 507),
        _ => (Level::Crit, 500),
    };
    log_failed(req, level, call, path, e);
    status
}

fn log_failed(req: &Request, level: Level, call: &str, path: &Path, e: &io::Error) {
    errlog::request(
        level,
        req,
        format_args!("{call} \"{}\" failed ({})", path.display(), errno_text(e)),
    );
}

/// A 201 or 204 with no body; a 201 says `Content-Length: 0` (and, for a made resource,
/// `Location`), as nginx's.
fn answer(status: u16, location: Option<&str>) -> Flow {
    let mut r = Response::new(status);
    if status == 201 {
        r.content_length = Some(0);
    }
    if let Some(uri) = location {
        let mut out = Vec::with_capacity(uri.len());
        super::proxy::escape_uri(uri, &mut out);
        r.location = Some(String::from_utf8_lossy(&out).into_owned());
    }
    Flow::Done(r)
}

/// `Depth`: `0`, `1` or `infinity` (`None`); anything else is logged and `Err`.
fn depth(req: &Request, default: Option<u8>) -> Result<Option<u8>, ()> {
    let Some(v) = req.head.header("depth") else {
        return Ok(default);
    };
    match v {
        b"0" => Ok(Some(0)),
        b"1" => Ok(Some(1)),
        b"infinity" => Ok(None),
        _ => {
            errlog::request(
                Level::Error,
                req,
                format_args!(
                    "client sent invalid \"Depth\" header: \"{}\"",
                    String::from_utf8_lossy(v)
                ),
            );
            Err(())
        }
    }
}

/// The body has been read into a named temporary file: give it its mode and time, then
/// rename it over the target.
pub fn put(req: &Request) -> Flow {
    let owned;
    let body: &BodyFile = match req.body.as_deref() {
        Some(RequestBody::File(f)) => f,
        Some(RequestBody::Memory(_)) => {
            return refuse(req, 500, "PUT request body must be in a file");
        }
        None if req.subrequest => return refuse(req, 500, "PUT request body is unavailable"),
        None => match request_body::empty_named(req) {
            Ok(f) => {
                owned = f;
                &owned
            }
            Err(_) => return Flow::Status(500),
        },
    };
    let path = req.filename_for(&req.uri);
    let status = match fs::metadata(&path) {
        Err(_) => 201,
        Ok(m) if m.is_dir() => {
            let e = io::Error::from_raw_os_error(libc::EISDIR);
            errlog::request(
                Level::Error,
                req,
                format_args!(
                    "\"{}\" could not be created ({})",
                    path.display(),
                    errno_text(&e)
                ),
            );
            return Flow::Status(409);
        }
        Ok(_) => 204,
    };
    let Some(temp) = body.take_name() else {
        return refuse(req, 500, "PUT request body must be in a file");
    };
    let dav = &req.conf.dav;
    let access = dav.access();
    let mut ready = body
        .file()
        .set_permissions(fs::Permissions::from_mode(access))
        .map_err(|e| ("chmod()", e));
    if ready.is_ok() {
        let date = req
            .head
            .header("date")
            .and_then(gannet_proto::h1::encode::parse_http_date);
        if let Some(t) = date {
            let times = fs::FileTimes::new().set_accessed(t).set_modified(t);
            ready = body.file().set_times(times).map_err(|e| ("utimes()", e));
        }
    }
    if let Err((call, e)) = ready {
        log_failed(req, Level::Crit, call, &temp, &e);
        let _ = fs::remove_file(&temp);
        return Flow::Status(500);
    }
    let full = dav.create_full_put_path == Some(true);
    if !rename_into_place(req, &temp, &path, full, access, None) {
        let _ = fs::remove_file(&temp);
        return Flow::Status(500);
    }
    answer(status, (status == 201).then_some(req.uri.as_str()))
}

/// nginx's ngx_ext_rename_file: rename `from` to `to`, making the missing folders (with
/// `dir_access(access)`) if `full`; across filesystems, copied next to `to` and renamed
/// there (given `mode` if set). Failures are logged; `from` is left for the caller.
fn rename_into_place(
    req: &Request,
    from: &Path,
    to: &Path,
    full: bool,
    access: u32,
    mode: Option<u32>,
) -> bool {
    let mut r = fs::rename(from, to);
    if full && matches!(&r, Err(e) if e.kind() == io::ErrorKind::NotFound) {
        if let Some(parent) = to.parent() {
            let made = fs::DirBuilder::new()
                .recursive(true)
                .mode(dir_access(access))
                .create(parent);
            if let Err(e) = made {
                log_failed(req, Level::Crit, "mkdir()", to, &e);
                return false;
            }
        }
        r = fs::rename(from, to);
    }
    let e = match r {
        Ok(()) => return true,
        Err(e) => e,
    };
    if e.raw_os_error() == Some(libc::EXDEV) {
        let mut name = to.as_os_str().to_owned();
        name.push(format!(".{:010}", fastrand::u32(..)));
        let side = PathBuf::from(name);
        let copied = copy_file(from, &side, mode.unwrap_or(access), None)
            .map_err(|(call, e)| log_failed(req, Level::Crit, call, &side, &e));
        if copied.is_ok() {
            match fs::rename(&side, to) {
                Ok(()) => {
                    let _ = fs::remove_file(from);
                    return true;
                }
                Err(e) => errlog::request(
                    Level::Crit,
                    req,
                    format_args!(
                        "rename() \"{}\" to \"{}\" failed ({})",
                        side.display(),
                        to.display(),
                        errno_text(&e)
                    ),
                ),
            }
        }
        let _ = fs::remove_file(&side);
        return false;
    }
    errlog::request(
        Level::Crit,
        req,
        format_args!(
            "rename() \"{}\" to \"{}\" failed ({})",
            from.display(),
            to.display(),
            errno_text(&e)
        ),
    );
    false
}

/// nginx's ngx_copy_file: `to` created (or truncated) with `mode`, the bytes copied, its
/// time set to `time` if given.
fn copy_file(
    from: &Path,
    to: &Path,
    mode: u32,
    time: Option<std::time::SystemTime>,
) -> Result<(), (&'static str, io::Error)> {
    let mut src = fs::File::open(from).map_err(|e| ("open()", e))?;
    let mut dst = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(to)
        .map_err(|e| ("open()", e))?;
    io::copy(&mut src, &mut dst).map_err(|e| ("write()", e))?;
    if let Some(t) = time {
        let times = fs::FileTimes::new().set_accessed(t).set_modified(t);
        dst.set_times(times).map_err(|e| ("utimes()", e))?;
    }
    Ok(())
}

fn delete(req: &Request) -> Flow {
    if has_body(req) {
        return refuse(req, 415, "DELETE with body is unsupported");
    }
    let min = req.conf.dav.min_delete_depth.unwrap_or(0);
    if min > 0 {
        // nginx counts the slashes that have something after them.
        let uri = req.uri.as_bytes();
        let mut d = 0u64;
        let mut deep = false;
        for (i, &c) in uri.iter().enumerate() {
            if c == b'/' {
                d += 1;
                if d >= min && i + 1 < uri.len() {
                    deep = true;
                    break;
                }
            }
        }
        if !deep {
            return refuse(req, 409, &format!("insufficient URI depth:{d} to DELETE"));
        }
    }
    let path = req.filename_for(&req.uri);
    let meta = match fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) => {
            let nf = if e.raw_os_error() == Some(libc::ENOTDIR) {
                409
            } else {
                404
            };
            return Flow::Status(fs_error(req, &e, nf, "lstat()", &path));
        }
    };
    let dir = meta.is_dir();
    if dir {
        if !req.uri.ends_with('/') {
            let e = io::Error::from_raw_os_error(libc::EISDIR);
            log_failed(req, Level::Error, "DELETE", &path, &e);
            return Flow::Status(409);
        }
        if !matches!(depth(req, None), Ok(None)) {
            return refuse(req, 400, "\"Depth\" header must be infinity");
        }
    } else if !matches!(depth(req, Some(0)), Ok(None | Some(0))) {
        return refuse(req, 400, "\"Depth\" header must be 0 or infinity");
    }
    match delete_path(req, &trim_slash(&path), dir) {
        Ok(()) => answer(204, None),
        Err(status) => Flow::Status(status),
    }
}

/// A path without its trailing slash (a collection's).
fn trim_slash(p: &Path) -> PathBuf {
    let s = p.as_os_str().as_encoded_bytes();
    match s.strip_suffix(b"/") {
        Some(t) if !t.is_empty() => PathBuf::from(std::ffi::OsStr::from_bytes(t)),
        _ => p.to_path_buf(),
    }
}

/// Delete a file, or a folder and everything in it (what cannot be deleted inside is
/// logged and left, as nginx does).
fn delete_path(req: &Request, path: &Path, dir: bool) -> Result<(), u16> {
    let (r, call) = if dir {
        delete_tree(req, path);
        (fs::remove_dir(path), "rmdir()")
    } else {
        (fs::remove_file(path), "unlink()")
    };
    r.map_err(|e| fs_error(req, &e, 404, call, path))
}

fn delete_tree(req: &Request, dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let p = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let (r, call) = if is_dir {
            delete_tree(req, &p);
            (fs::remove_dir(&p), "rmdir()")
        } else {
            (fs::remove_file(&p), "unlink()")
        };
        if let Err(e) = r {
            fs_error(req, &e, 0, call, &p);
        }
    }
}

fn mkcol(req: &Request) -> Flow {
    if has_body(req) {
        return refuse(req, 415, "MKCOL with body is unsupported");
    }
    if !req.uri.ends_with('/') {
        return refuse(req, 409, "MKCOL can create a collection only");
    }
    let path = trim_slash(&req.filename_for(&req.uri));
    let made = fs::DirBuilder::new()
        .mode(dir_access(req.conf.dav.access()))
        .create(&path);
    match made {
        Ok(()) => answer(201, Some(&req.uri)),
        Err(e) => Flow::Status(fs_error(req, &e, 409, "mkdir()", &path)),
    }
}

mod copy_move;
use copy_move::copy_move;
