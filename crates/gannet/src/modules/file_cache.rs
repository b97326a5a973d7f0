//! The per-worker open-file cache: what `open_file_cache` configures in nginx, always on in
//! gannet for found files because it is what makes small files cheap.
//!
//! An entry keeps the open file, its size, mtime and inode, and for files up to
//! `SMALL_FILE` bytes the whole content as `Bytes`, so a hot small file is answered with one
//! write and no open or read of the file. Without `open_file_cache` an entry is re-validated
//! with `stat` at each use (nginx opens the file anew each time, so a file rewritten in place
//! is seen at once); with it, once its `valid` period (1 s, or `open_file_cache_valid`) is
//! over. A changed file is re-read.
//! Not-found results are cached only with `open_file_cache_errors on`, as in nginx.
//! Nothing here is shared between workers, so there are no locks.
//!
//! `disable_symlinks` (see [`Symlinks`]) opens a path component by component with `openat`
//! and `O_NOFOLLOW`, as nginx's `ngx_open_file_wrapper`; an entry remembers the check it was
//! opened under, and one opened under a check is re-validated by opening it again that way.

use super::compress::Coding;
use crate::runtime::clock::Within;
use bytes::Bytes;
use std::cell::RefCell;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Files up to this size are kept in memory.
pub const SMALL_FILE: u64 = 64 * 1024;

#[derive(Debug, Clone)]
pub struct OpenFile {
    pub file: Rc<File>,
    pub size: u64,
    pub mtime: SystemTime,
    pub mtime_secs: i64,
    /// nginx's ETag for this version of the file, made once.
    pub etag: Arc<str>,
    pub is_dir: bool,
    pub is_file: bool,
    /// The whole content for small regular files.
    pub data: Option<Bytes>,
    /// Compressed copies of `data`, made on first demand (shared by every clone).
    pub variants: Rc<Variants>,
    mtime_nsec: i64,
    /// The inode's change time (seconds, nanoseconds).
    ctime: (i64, i64),
    ino: u64,
    dev: u64,
}

/// A small file's compressed copies by encoding and level, so that a hot file (robots.txt,
/// a stylesheet) is compressed once per worker instead of once per request. They live as
/// long as the cache entry: a changed file gets a new entry and new copies.
#[derive(Debug, Default)]
pub struct Variants(RefCell<Vec<(Coding, u32, Bytes)>>);

impl Variants {
    pub fn get_or_make(
        &self,
        coding: Coding,
        level: u32,
        make: impl FnOnce() -> io::Result<Vec<u8>>,
    ) -> io::Result<Bytes> {
        if let Some((_, _, b)) = self
            .0
            .borrow()
            .iter()
            .find(|(c, l, _)| (*c, *l) == (coding, level))
        {
            return Ok(b.clone());
        }
        let b = Bytes::from(make()?);
        self.0.borrow_mut().push((coding, level, b.clone()));
        Ok(b)
    }
}

#[derive(Debug)]
enum Entry {
    Found(OpenFile),
    Error(io::ErrorKind),
}

#[derive(Debug)]
struct Slot {
    entry: Entry,
    symlinks: Symlinks,
    checked: Instant,
    /// `open_file_cache_valid` from `checked` (see `clock::Within`).
    fresh: Within,
    last_used: Instant,
}

/// Cache limits from `open_file_cache max=N inactive=T`, `open_file_cache_valid`,
/// `open_file_cache_errors`.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub max: usize,
    pub inactive: Duration,
    pub valid: Duration,
    pub errors: bool,
    pub symlinks: Symlinks,
    /// No `open_file_cache` in force: nginx opens the file anew for each request, so a file
    /// rewritten in place is served new at once. The entry is then checked with `stat` at
    /// every use (a changed file is read again), not once per `valid`.
    pub restat: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max: 1024,
            inactive: Duration::from_secs(60),
            valid: Duration::from_secs(1),
            errors: false,
            symlinks: Symlinks::Off,
            restat: false,
        }
    }
}

/// The error a link refused by `disable_symlinks` (ELOOP) is cached and returned as: std's
/// own kind for it is not stable, and opening a file never otherwise reports this one.
pub const LINK_REFUSED: io::ErrorKind = io::ErrorKind::Unsupported;

/// `disable_symlinks`: how symbolic links on the way to a file are refused (ELOOP, which the
/// caller answers 403). `from` is the length of a leading part of the path (`from=`) that is
/// not checked; 0 checks from `/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    Off,
    /// Any symbolic link refused.
    On {
        from: usize,
    },
    /// A symbolic link refused when its owner is not its target's.
    IfNotOwner {
        from: usize,
    },
}

/// The cache's table, keyed by the path's bytes: a `PathBuf` key hashed and compared the
/// path component by component (std's `Hash for Path`), a byte-wise key does it at once
/// (`/a//b` and `/a/b` are two entries for one file then, which only costs room).
///
/// Hashed with foldhash, not SipHash: the keys are request paths, so a client chooses
/// them, but foldhash's seed is random per table (per worker) and never shown to a client,
/// and the table holds at most `open_file_cache max` entries of files that exist (or
/// errors, with `open_file_cache_errors on`), evicted by age: crafted collisions would need
/// the seed, and could at worst make one lookup walk that many entries.
type Map = std::collections::HashMap<Box<[u8]>, Slot, foldhash::fast::RandomState>;

#[derive(Default)]
pub struct FileCache {
    map: RefCell<Map>,
}

impl FileCache {
    /// Open (or find) `path`. Errors are io::Error kinds (NotFound, PermissionDenied...).
    pub fn open(&self, path: &Path, policy: &Policy) -> Result<OpenFile, io::ErrorKind> {
        // The turn's time (`runtime::clock`): no clock read of its own per request.
        let now = crate::runtime::clock::now();
        let mut map = self.map.borrow_mut();
        let key = path.as_os_str().as_bytes();
        if let Some(slot) = map.get_mut(key).filter(|s| s.symlinks == policy.symlinks) {
            if !policy.restat && slot.fresh.holds(slot.checked, now, policy.valid) {
                slot.last_used = now;
                return match &slot.entry {
                    Entry::Found(f) => Ok(f.clone()),
                    Entry::Error(e) => Err(*e),
                };
            }
            // Re-validate: the same inode, size and times (to the nanosecond: a file
            // rewritten within the second, to the same size, is another file) keep the
            // entry. Under a symlink check, the metadata comes from opening the path again
            // with that check.
            let meta = match policy.symlinks {
                Symlinks::Off => std::fs::metadata(path),
                check => open_checked(path, check).and_then(|f| f.metadata()),
            };
            if let (Entry::Found(f), Ok(meta)) = (&slot.entry, meta) {
                if meta.ino() == f.ino
                    && meta.dev() == f.dev
                    && meta.size() == f.size
                    && meta.mtime() == f.mtime_secs
                    && meta.mtime_nsec() == f.mtime_nsec
                    && (meta.ctime(), meta.ctime_nsec()) == f.ctime
                {
                    slot.checked = now;
                    slot.fresh = Within::new(now, policy.valid);
                    slot.last_used = now;
                    return Ok(f.clone());
                }
            }
        }
        map.remove(key);
        let result = load(path, policy.symlinks);
        if map.len() >= policy.max {
            evict(&mut map, now, policy);
        }
        match &result {
            Ok(f) => {
                map.insert(
                    Box::from(key),
                    Slot {
                        symlinks: policy.symlinks,
                        entry: Entry::Found(f.clone()),
                        checked: now,
                        fresh: Within::new(now, policy.valid),
                        last_used: now,
                    },
                );
            }
            Err(e) if policy.errors => {
                map.insert(
                    Box::from(key),
                    Slot {
                        symlinks: policy.symlinks,
                        entry: Entry::Error(*e),
                        checked: now,
                        fresh: Within::new(now, policy.valid),
                        last_used: now,
                    },
                );
            }
            Err(_) => {}
        }
        result
    }
}

/// Drop entries unused for `inactive`; if still full, drop the least recently used half.
fn evict(map: &mut Map, now: Instant, policy: &Policy) {
    map.retain(|_, s| now.duration_since(s.last_used) < policy.inactive);
    if map.len() >= policy.max {
        let mut ages: Vec<Instant> = map.values().map(|s| s.last_used).collect();
        ages.sort_unstable();
        let cut = ages[ages.len() / 2];
        map.retain(|_, s| s.last_used > cut);
    }
}

fn load(path: &Path, symlinks: Symlinks) -> Result<OpenFile, io::ErrorKind> {
    // Blocking open/stat/read, as nginx does without aio: for files in the page cache these
    // take microseconds, less than a hop to a thread pool would.
    let mut file = match symlinks {
        Symlinks::Off => File::open(path),
        check => open_checked(path, check),
    }
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => LINK_REFUSED,
        _ => e.kind(),
    })?;
    let meta: Metadata = file.metadata().map_err(|e| e.kind())?;
    let size = meta.len();
    let data = if meta.is_file() && size <= SMALL_FILE {
        let mut buf = Vec::with_capacity(size as usize);
        file.read_to_end(&mut buf).map_err(|e| e.kind())?;
        Some(Bytes::from(buf))
    } else {
        None
    };
    let size = data.as_ref().map_or(size, |d| d.len() as u64);
    Ok(OpenFile {
        etag: Arc::from(super::static_files::etag(meta.mtime(), size)),
        size,
        mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        mtime_secs: meta.mtime(),
        mtime_nsec: meta.mtime_nsec(),
        ctime: (meta.ctime(), meta.ctime_nsec()),
        is_dir: meta.is_dir(),
        is_file: meta.is_file(),
        data,
        variants: Rc::default(),
        ino: meta.ino(),
        dev: meta.dev(),
        file: Rc::new(file),
    })
}

/// `openat(dir, name, flags)`, as an owned descriptor.
fn openat(dir: &OwnedFd, name: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
    let name =
        std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::NotFound))?;
    // SAFETY: `dir` is an open descriptor and `name` a NUL-terminated string, both alive for
    // the call; the flags open no file for creation, so no mode argument is read.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open `path` refusing symbolic links past its first `from` bytes, as nginx's
/// `ngx_open_file_wrapper`: each directory with `openat(O_NOFOLLOW)` from the previous one,
/// or (`if_not_owner`) following links but refusing one whose owner differs from its
/// target's. A refused link is ELOOP.
fn open_checked(path: &Path, check: Symlinks) -> io::Result<File> {
    let (from, not_owner) = match check {
        Symlinks::Off => return File::open(path),
        Symlinks::On { from } => (from, false),
        Symlinks::IfNotOwner { from } => (from, true),
    };
    let bytes = path.as_os_str().as_bytes();
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK;
    // The unchecked prefix (or `/`) is opened as is.
    let (start, rest) = if from > 0 && from < bytes.len() {
        (&bytes[..from], &bytes[from + 1..])
    } else {
        (&b"/"[..], bytes.strip_prefix(b"/").unwrap_or(bytes))
    };
    let mut dir: OwnedFd = File::open(std::ffi::OsStr::from_bytes(start))?.into();
    let mut parts = rest
        .split(|&c| c == b'/')
        .filter(|p| !p.is_empty())
        .peekable();
    while let Some(name) = parts.next() {
        let last = parts.peek().is_none();
        // A path that ends with `/` names a folder, its last part too (a file there is
        // ENOTDIR, as nginx's ngx_open_file_wrapper).
        let flags = if last && !bytes.ends_with(b"/") {
            libc::O_RDONLY | libc::O_NONBLOCK
        } else {
            dir_flags
        };
        let fd = if not_owner {
            let fd = openat(&dir, name, flags)?;
            if owner_differs(&dir, name, &fd)? {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            fd
        } else {
            openat(&dir, name, flags | libc::O_NOFOLLOW)?
        };
        if last {
            return Ok(File::from(fd));
        }
        dir = fd;
    }
    // The path named only the unchecked part.
    Ok(File::from(dir))
}

/// Whether `name` in `dir` (not followed) has another owner than the file `fd` opened.
fn owner_differs(dir: &OwnedFd, name: &[u8], fd: &OwnedFd) -> io::Result<bool> {
    let name =
        std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::NotFound))?;
    let mut at = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid descriptor and NUL-terminated name; `at` is written by the call before
    // it is read, and only read when the call succeeded.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            at.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatat succeeded, so it filled `at`.
    let at = unsafe { at.assume_init() };
    let target = File::from(fd.try_clone()?).metadata()?;
    Ok(target.uid() != at.st_uid)
}
