//! `COPY` and `MOVE`: the `Destination` (same host and scheme, a safe path, a collection
//! for a collection), `Depth` and `Overwrite` checked as nginx checks them, then the file
//! or the tree copied or renamed within the location's `root` / `alias`.

use super::{
    answer, delete_path, depth, dir_access, fs_error, has_body, log_failed, refuse,
    rename_into_place, trim_slash,
};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn copy_move(req: &Request, mv: bool) -> Flow {
    if has_body(req) {
        return refuse(req, 415, "COPY and MOVE with body are unsupported");
    }
    let Some(dest) = req.head.header("destination") else {
        return refuse(req, 400, "client sent no \"Destination\" header");
    };
    let dest = String::from_utf8_lossy(dest).into_owned();
    let Some(duri) = destination_uri(req, &dest) else {
        return Flow::Status(400);
    };
    let src_coll = req.uri.ends_with('/');
    if src_coll != dest.ends_with('/') {
        return refuse(
            req,
            409,
            &format!(
                "both URI \"{}\" and \"Destination\" URI \"{dest}\" should be either \
                 collections or non-collections",
                req.uri
            ),
        );
    }
    // An alias location maps only URIs at least as long as its prefix.
    if req.conf.core.alias.is_some() {
        let prefix = req.conf.core.alias_of.as_deref().map_or(0, str::len);
        if duri.len() < prefix {
            return invalid_destination(req, &dest);
        }
    }
    match depth(req, None) {
        Ok(None) => {}
        Ok(Some(0)) if !mv => {}
        _ if mv => return refuse(req, 400, "\"Depth\" header must be infinity"),
        _ => return refuse(req, 400, "\"Depth\" header must be 0 or infinity"),
    }
    let overwrite = match req.head.header("overwrite") {
        None => true,
        Some(b"T" | b"t") => true,
        Some(b"F" | b"f") => false,
        Some(v) => {
            let v = String::from_utf8_lossy(v);
            return refuse(
                req,
                400,
                &format!("client sent invalid \"Overwrite\" header: \"{v}\""),
            );
        }
    };
    let path = merge_slashes(&req.filename_for(&req.uri));
    let to = merge_slashes(&req.filename_for(&duri));
    let slash = to.len() > 1 && to.ends_with('/');
    let to = if slash { &to[..to.len() - 1] } else { &to[..] };
    let verb = if mv { "MOVE" } else { "COPY" };
    if let Some(why) = same_or_inside(&path, to, slash) {
        let msg = match why {
            Inside::Same => format!(
                "both URI \"{}\" and \"Destination\" URI \"{dest}\" point to the same location",
                req.uri
            ),
            Inside::Nested => format!(
                "\"{}\" could not be {verb}ed to collection \"{dest}\"",
                req.uri
            ),
        };
        return refuse(req, 403, &msg);
    }
    let to = Path::new(to);
    let (overwrite, dest_dir) = match fs::symlink_metadata(to) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => (false, false),
        Err(e) => return Flow::Status(fs_error(req, &e, 404, "lstat()", to)),
        Ok(m) => {
            if m.is_dir() && !slash {
                return refuse(
                    req,
                    409,
                    &format!(
                        "\"{}\" could not be {verb}ed to collection \"{dest}\"",
                        req.uri
                    ),
                );
            }
            if !overwrite {
                let e = io::Error::from_raw_os_error(libc::EEXIST);
                errlog::request(
                    Level::Error,
                    req,
                    format_args!(
                        "\"{}\" could not be created ({})",
                        to.display(),
                        crate::errlog::errno_text(&e)
                    ),
                );
                return Flow::Status(412);
            }
            (true, m.is_dir())
        }
    };
    let from = Path::new(&path);
    let meta = match fs::symlink_metadata(from) {
        Ok(m) => m,
        Err(e) => return Flow::Status(fs_error(req, &e, 404, "lstat()", from)),
    };
    if !meta.is_dir() {
        return copy_move_file(req, from, to, &meta, mv);
    }
    if !src_coll {
        return refuse(req, 400, &format!("\"{}\" is collection", req.uri));
    }
    if overwrite {
        if let Err(status) = delete_path(req, to, dest_dir) {
            return Flow::Status(status);
        }
    }
    let from = trim_slash(from);
    if mv && fs::rename(&from, to).is_ok() {
        return answer(201, None);
    }
    let made = fs::DirBuilder::new()
        .mode(meta.permissions().mode() & 0o7777)
        .create(to);
    if let Err(e) = made {
        return Flow::Status(fs_error(req, &e, 404, "mkdir()", to));
    }
    copy_tree(req, &from, to);
    set_time(req, to, mtime(&meta));
    if mv {
        if let Err(status) = delete_path(req, &from, true) {
            return Flow::Status(status);
        }
    }
    answer(201, None)
}

/// A file: `MOVE` renames it (making the destination's folders), `COPY` copies it with
/// its mode and time.
fn copy_move_file(req: &Request, from: &Path, to: &Path, meta: &fs::Metadata, mv: bool) -> Flow {
    let mode = meta.permissions().mode() & 0o7777;
    let done = if mv {
        rename_into_place(req, from, to, true, req.conf.dav.access(), Some(mode))
    } else {
        super::copy_file(from, to, mode, Some(mtime(meta)))
            .map_err(|(call, e)| log_failed(req, Level::Crit, call, to, &e))
            .is_ok()
    };
    if done {
        answer(204, None)
    } else {
        Flow::Status(500)
    }
}

fn mtime(m: &fs::Metadata) -> SystemTime {
    let secs = u64::try_from(m.mtime()).unwrap_or(0);
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn set_time(req: &Request, dir: &Path, t: SystemTime) {
    let r = fs::File::open(dir)
        .and_then(|f| f.set_times(fs::FileTimes::new().set_accessed(t).set_modified(t)));
    if let Err(e) = r {
        log_failed(req, Level::Alert, "utimes()", dir, &e);
    }
}

/// Copy what is in `from` into `to` (made already): folders made with their searchable
/// mode and given their time after their contents, files with their mode and time; what
/// fails is logged and skipped, as nginx's tree walk does.
fn copy_tree(req: &Request, from: &Path, to: &Path) {
    let Ok(entries) = fs::read_dir(from) else {
        return;
    };
    for entry in entries.flatten() {
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let Ok(meta) = fs::symlink_metadata(&src) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            let made = fs::DirBuilder::new().mode(dir_access(mode)).create(&dst);
            if let Err(e) = made {
                fs_error(req, &e, 0, "mkdir()", &dst);
            }
            copy_tree(req, &src, &dst);
            set_time(req, &dst, mtime(&meta));
        } else if meta.is_file() {
            if let Err((call, e)) = super::copy_file(&src, &dst, mode, Some(mtime(&meta))) {
                log_failed(req, Level::Crit, call, &dst, &e);
            }
        }
    }
}

enum Inside {
    Same,
    Nested,
}

/// nginx's check that the source and destination are not the same, nor (for a
/// collection) one inside the other.
fn same_or_inside(src: &str, dst: &str, slash: bool) -> Option<Inside> {
    let src = src.strip_suffix('/').unwrap_or(src).as_bytes();
    let dst = dst.as_bytes();
    if src == dst {
        return Some(Inside::Same);
    }
    let n = src.len().min(dst.len());
    let nested = slash
        && src[..n] == dst[..n]
        && if src.len() < dst.len() {
            dst[src.len()] == b'/'
        } else {
            src[dst.len()] == b'/'
        };
    nested.then_some(Inside::Nested)
}

fn merge_slashes(p: &Path) -> String {
    let s = p.to_string_lossy();
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

fn invalid_destination(req: &Request, dest: &str) -> Flow {
    refuse(
        req,
        400,
        &format!("client sent invalid \"Destination\" header: \"{dest}\""),
    )
}

/// The path `Destination` names: `/path`, or `http(s)://host/path` for this request's
/// host and scheme; decoded, its query dropped; `None` (logged) if it is another host's,
/// malformed or unsafe (`..` segments, NUL).
fn destination_uri(req: &Request, dest: &str) -> Option<String> {
    let raw = if dest.starts_with('/') {
        dest
    } else {
        let server = host_only(&req.host);
        if server.is_empty() {
            refuse(req, 400, "client sent no \"Host\" header");
            return None;
        }
        let scheme = if req.conn.tls.is_some() {
            "https://"
        } else {
            "http://"
        };
        let Some(host) = dest.strip_prefix(scheme) else {
            invalid_destination(req, dest);
            return None;
        };
        if !host.starts_with(server) {
            refuse(
                req,
                400,
                &format!(
                    "\"Destination\" URI \"{dest}\" is handled by different repository than \
                     the source URI"
                ),
            );
            return None;
        }
        match host[server.len()..].find('/') {
            Some(i) => &host[server.len() + i..],
            None => {
                invalid_destination(req, dest);
                return None;
            }
        }
    };
    let safe = crate::http::unsafe_uri(raw);
    if safe.is_none() {
        invalid_destination(req, dest);
    }
    safe
}

/// The host of `Host` without its port (nginx's `headers_in.server`).
fn host_only(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    host.split(':').next().unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::unsafe_uri;

    #[test]
    fn unsafe_destinations_are_refused() {
        assert_eq!(unsafe_uri("/a/b%20c?x=1").as_deref(), Some("/a/b c"));
        assert!(unsafe_uri("/a/../b").is_none());
        assert!(unsafe_uri("/a/%2e%2e/b").is_none());
        assert!(unsafe_uri("/a/..").is_none());
        assert!(unsafe_uri("/a%00b").is_none());
        assert_eq!(unsafe_uri("/a/..b").as_deref(), Some("/a/..b"));
    }

    #[test]
    fn nested_collections_are_found() {
        assert!(matches!(
            same_or_inside("/r/a/", "/r/a", true),
            Some(Inside::Same)
        ));
        assert!(matches!(
            same_or_inside("/r/a/", "/r/a/b", true),
            Some(Inside::Nested)
        ));
        assert!(matches!(
            same_or_inside("/r/a/b/", "/r/a", true),
            Some(Inside::Nested)
        ));
        assert!(same_or_inside("/r/a/", "/r/ab", true).is_none());
    }
}
