//! A request body read whole before it goes to an application (nginx's request
//! buffering), held within a memory budget: up to `client_body_buffer_size` in memory,
//! else in a temporary file (see `conn::temp_file` and `modules::client_body`: unlinked at
//! once, or with `client_body_in_file_only` kept by name while the request runs),
//! written as it comes in pieces of at most that size and read back in bounded pieces when
//! it is sent. HTTP/1.x and HTTP/2 read it through the same [`read`]; the gateways send it
//! with [`BodyFile::piece`], and mirrored copies share it.

use super::body::{BodyError, BodySource};
use super::temp_file::{self, TempFile};
use crate::errlog::{self, Level};
use crate::http::request::Request;
use crate::modules::client_body::InFileOnly;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// A loaded config reads `$request_body_file`: temporary body files then get nginx's names
/// (made and unlinked at once, where `O_TMPFILE` would have made them nameless), so the
/// variable has one to give. Never cleared, like `$upstream_http_*`'s flag.
static NAMES_WANTED: AtomicBool = AtomicBool::new(false);

/// Called when a config uses `$request_body_file`.
pub fn want_names() {
    NAMES_WANTED.store(true, Ordering::Relaxed);
}

/// A body read whole.
pub enum RequestBody {
    /// Up to `client_body_buffer_size` (what `$request_body` gives).
    Memory(Vec<u8>),
    File(BodyFile),
}

impl RequestBody {
    pub fn len(&self) -> u64 {
        match self {
            RequestBody::Memory(v) => v.len() as u64,
            RequestBody::File(f) => f.len,
        }
    }
}

/// A body in a temporary file: unlinked at once, or named (`kept`) until it is dropped (a
/// DAV `PUT`'s, to be renamed into place unless its name is taken; `client_body_in_file_only
/// clean`'s), or left for good (`client_body_in_file_only on`).
pub struct BodyFile {
    file: std::fs::File,
    len: u64,
    kept: std::cell::RefCell<Option<PathBuf>>,
    /// Its name, for `$request_body_file` (none for a nameless `O_TMPFILE` file).
    name: Option<PathBuf>,
}

impl Drop for BodyFile {
    fn drop(&mut self) {
        if let Some(name) = self.kept.get_mut().take() {
            let _ = std::fs::remove_file(name);
        }
    }
}

impl BodyFile {
    /// The open file (to set its mode and times before it is renamed).
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// The name of a kept file, taken: from now on the caller renames or unlinks it.
    pub fn take_name(&self) -> Option<PathBuf> {
        self.kept.borrow_mut().take()
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The name it was made under (`$request_body_file`), if it had one.
    pub fn name(&self) -> Option<&Path> {
        self.name.as_deref()
    }

    /// The body's bytes from `at` into `buf` (at most its length); 0 at the end. A read of
    /// a file in the page cache does not block for long; nginx reads its temp files from
    /// the event loop too.
    pub fn piece(&self, at: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(at);
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        self.file.read_exact_at(&mut buf[..n], at)?;
        Ok(n)
    }
}

/// Why a body could not be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// The client's side: too large, malformed, gone or too slow.
    Client(BodyError),
    /// The temporary file could not be made or written (logged): a 500.
    Store,
}

impl Failed {
    /// The status the request is answered with; `None` when there is nobody to answer.
    pub fn status(self) -> Option<u16> {
        match self {
            Failed::Client(BodyError::TooLarge) => Some(413),
            Failed::Client(BodyError::Malformed) => Some(400),
            Failed::Client(BodyError::Io) => None,
            Failed::Store => Some(500),
        }
    }
}

/// Read the whole body from `src`: in memory while it fits in `client_body_buffer_size`
/// (and `client_body_in_file_only` is off), else into a temporary file, written each time
/// that much has gathered. Memory held: at most the buffer size, whatever the body's size.
/// `named`: always into a file, one with a name in `client_body_temp_path` (a DAV `PUT`
/// renames it into place), even for an empty body (as with `client_body_in_file_only`).
pub async fn read<B: BodySource + ?Sized>(
    src: &mut B,
    req: &Request,
    named: bool,
) -> Result<RequestBody, Failed> {
    let c = &req.conf.client_body;
    let cap = usize::try_from(c.buffer_size()).unwrap_or(usize::MAX);
    let file_only = named || c.in_file_only() != InFileOnly::Off;
    let mut held: Vec<u8> = Vec::new();
    // The file and its name for the log.
    let mut file: Option<(BodyFile, PathBuf)> = None;
    while let Some(piece) = src.next_piece().await.map_err(Failed::Client)? {
        if file.is_none() && !file_only && held.len() + piece.len() <= cap {
            held.extend_from_slice(&piece);
            continue;
        }
        let (f, name) = match &mut file {
            Some(f) => f,
            None => file.insert(open(req, named)?),
        };
        if held.len() + piece.len() > cap {
            write(req, f, name, &held)?;
            held.clear();
        }
        if piece.len() >= cap {
            write(req, f, name, &piece)?;
        } else {
            held.extend_from_slice(&piece);
        }
    }
    // An empty body still gets its (empty) file where every body goes to one, as nginx's.
    if file_only && file.is_none() {
        file = Some(open(req, named)?);
    }
    match file {
        None => Ok(RequestBody::Memory(held)),
        Some((mut f, name)) => {
            write(req, &mut f, &name, &held)?;
            Ok(RequestBody::File(f))
        }
    }
}

/// An empty named body file, for a DAV `PUT` that sent no body at all.
pub fn empty_named(req: &Request) -> Result<BodyFile, Failed> {
    Ok(open(req, true)?.0)
}

/// A new body file and its name for the log. `named` (a PUT's body) and
/// `client_body_in_file_only clean` files are unlinked when dropped (unless renamed),
/// `client_body_in_file_only on` files are left; other files are unlinked at once.
fn open(req: &Request, named: bool) -> Result<(BodyFile, PathBuf), Failed> {
    let c = &req.conf.client_body;
    let tp = c.temp_path();
    let in_file_only = c.in_file_only();
    let made = if named || in_file_only != InFileOnly::Off {
        temp_file::create_named(&tp)
    } else if NAMES_WANTED.load(Ordering::Relaxed) {
        temp_file::create_unlinked_named(&tp)
    } else {
        temp_file::create(&tp)
    };
    match made {
        Ok(t) => {
            // nginx's notice of the same event, at its level (the name is the folder for
            // a file that never had one): a notice for the files asked for, else a
            // warning; not for a PUT's body, which is meant for a file.
            if !named {
                let level = match in_file_only {
                    InFileOnly::Off => Level::Warn,
                    _ => Level::Notice,
                };
                errlog::request(
                    level,
                    req,
                    format_args!(
                        "a client request body is buffered to a temporary file {}",
                        t.name.display()
                    ),
                );
            }
            let TempFile { file, name } = t;
            // A nameless file is logged under its folder's name.
            let has_name = name != tp.dir;
            let remove = named || in_file_only == InFileOnly::Clean;
            let body = BodyFile {
                file,
                len: 0,
                kept: std::cell::RefCell::new(remove.then(|| name.clone())),
                name: has_name.then(|| name.clone()),
            };
            Ok((body, name))
        }
        Err(why) => {
            errlog::request(Level::Crit, req, format_args!("{why}"));
            Err(Failed::Store)
        }
    }
}

/// Append `data` at the file's end, as nginx's `pwrite()`, with its log line on failure.
fn write(req: &Request, f: &mut BodyFile, name: &Path, data: &[u8]) -> Result<(), Failed> {
    if data.is_empty() {
        return Ok(());
    }
    if let Err(e) = f.file.write_all_at(data, f.len) {
        let why = crate::errlog::failed("pwrite()", name, &e);
        errlog::request(Level::Crit, req, format_args!("{why}"));
        return Err(Failed::Store);
    }
    f.len += data.len() as u64;
    Ok(())
}
