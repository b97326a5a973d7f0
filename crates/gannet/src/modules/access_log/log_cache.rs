//! Access logs whose path has variables (`access_log /var/log/nginx/$host.log;`), as
//! nginx's `ngx_http_log_script_write`: per line, the location's root directory must exist
//! (else `testing "ROOT" existence failed` and no line, so requests for hosts that have no
//! site do not make log files); the path is evaluated and opened (created, mode 0644) by
//! the worker, which runs as the unprivileged `user`; a failure is logged as nginx's
//! `open() "PATH" failed` and the line dropped.
//!
//! Without `open_log_file_cache` the file is opened and closed for every line. With it,
//! each worker keeps up to `max` descriptors per cache: a path used `min_uses` times
//! within `inactive` keeps its descriptor until it goes unused for `inactive`; after
//! `valid` the name is looked at again and, if it now names another file (logrotate moved
//! the old one away), that one is opened instead. As in nginx, SIGUSR1 does not touch
//! these descriptors: `valid` is what brings a renamed log back to its name.

use crate::errlog::Level;
use crate::errlog::{errno_text, failed};
use crate::http::request::Request;
use crate::http::variables::Template;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `open_log_file_cache max=N [inactive=T] [min_uses=N] [valid=T]`.
#[derive(Debug)]
pub struct CacheConf {
    /// Which directive: each has its own cache, as in nginx.
    pub id: usize,
    pub max: usize,
    pub inactive: Duration,
    pub min_uses: u32,
    pub valid: Duration,
}

struct Entry {
    file: Option<File>,
    /// Uses since the entry was made (toward `min_uses`).
    uses: u32,
    last: Instant,
    /// When the name was last checked to still be this file.
    checked: Instant,
}

thread_local! {
    /// Each worker's caches, by directive.
    static CACHES: RefCell<HashMap<usize, HashMap<PathBuf, Entry>>> = RefCell::new(HashMap::new());
}

/// Append, create with 0644 (nginx's NGX_FILE_DEFAULT_ACCESS).
fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)
}

/// Whether `path` still names the file `f` is open on.
fn same_file(f: &File, path: &Path) -> bool {
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

/// Write `line` to the log at `path` (a template): see the module docs.
pub fn write(req: &Request, path: &Template, cache: Option<&CacheConf>, line: &[u8]) {
    let root = req.document_root();
    let tested = match std::fs::metadata(&root) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        Err(e) => Err(e),
    };
    if let Err(e) = tested {
        return crate::errlog::request(
            Level::Error,
            req,
            format_args!("testing \"{root}\" existence failed ({})", errno_text(&e)),
        );
    }
    let name = PathBuf::from(path.eval(req, None));
    let written = match cache {
        None => open_write(&name, line).map(drop),
        Some(c) => cached(c, &name, line),
    };
    match written {
        Ok(()) => {}
        Err((Call::Open, e)) => crate::errlog::request(
            Level::Crit,
            req,
            format_args!("{}", failed("open()", &name, &e)),
        ),
        Err((Call::Write, e)) => crate::errlog::request(
            Level::Alert,
            req,
            format_args!(
                "write() to \"{}\" failed ({})",
                name.display(),
                errno_text(&e)
            ),
        ),
    }
}

/// The call that failed, for nginx's message.
enum Call {
    Open,
    Write,
}

type Written = Result<(), (Call, io::Error)>;

fn write_to(mut f: &File, line: &[u8]) -> Written {
    f.write_all(line).map_err(|e| (Call::Write, e))
}

/// Open `name`, write `line`; the file, to keep or to close.
fn open_write(name: &Path, line: &[u8]) -> Result<File, (Call, io::Error)> {
    let f = open(name).map_err(|e| (Call::Open, e))?;
    write_to(&f, line)?;
    Ok(f)
}

fn cached(c: &CacheConf, name: &Path, line: &[u8]) -> Written {
    let now = Instant::now();
    CACHES.with(|caches| {
        let mut caches = caches.borrow_mut();
        let files = caches.entry(c.id).or_default();
        // Descriptors unused for `inactive` close (nginx expires them as it looks up).
        files.retain(|_, e| now.duration_since(e.last) < c.inactive);
        if !files.contains_key(name) {
            // A name not in the cache: opened first, and only a file that opened takes a
            // place (nginx caches no failed open, so a missing directory evicts nothing).
            let f = open_write(name, line)?;
            if files.len() >= c.max {
                // Full: the least recently used one makes room.
                if let Some(oldest) = files
                    .iter()
                    .min_by_key(|(_, e)| e.last)
                    .map(|(p, _)| p.clone())
                {
                    files.remove(&oldest);
                }
            }
            let entry = Entry {
                file: (c.min_uses <= 1).then_some(f),
                uses: 1,
                last: now,
                checked: now,
            };
            files.insert(name.to_path_buf(), entry);
            return Ok(());
        }
        let Some(e) = files.get_mut(name) else {
            return Ok(());
        };
        e.uses = e.uses.saturating_add(1);
        e.last = now;
        if let Some(f) = &e.file {
            if now.duration_since(e.checked) >= c.valid {
                e.checked = now;
                if !same_file(f, name) {
                    e.file = None;
                }
            }
        }
        match &e.file {
            Some(f) => write_to(f, line),
            None if e.uses >= c.min_uses => {
                e.checked = now;
                e.file = Some(open_write(name, line)?);
                Ok(())
            }
            None => open_write(name, line).map(drop),
        }
    })
}
