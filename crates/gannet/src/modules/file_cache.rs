//! The per-worker open-file cache: what `open_file_cache` configures in nginx, always on in
//! gannet for found files because it is what makes small files cheap.
//!
//! An entry keeps the open file, its size, mtime and inode, and for files up to
//! `SMALL_FILE` bytes the whole content as `Bytes`, so a hot small file is answered with one
//! write and no syscall on the file at all. Entries are re-validated with `stat` once their
//! `valid` period (1 s, or `open_file_cache_valid`) is over; a changed file is re-read.
//! Not-found results are cached only with `open_file_cache_errors on`, as in nginx.
//! Nothing here is shared between workers, so there are no locks.

use super::compress::Coding;
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
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
    checked: Instant,
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
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max: 1024,
            inactive: Duration::from_secs(60),
            valid: Duration::from_secs(1),
            errors: false,
        }
    }
}

#[derive(Default)]
pub struct FileCache {
    map: RefCell<HashMap<PathBuf, Slot>>,
}

impl FileCache {
    /// Open (or find) `path`. Errors are io::Error kinds (NotFound, PermissionDenied...).
    pub fn open(&self, path: &Path, policy: &Policy) -> Result<OpenFile, io::ErrorKind> {
        let now = Instant::now();
        let mut map = self.map.borrow_mut();
        if let Some(slot) = map.get_mut(path) {
            if now.duration_since(slot.checked) < policy.valid {
                slot.last_used = now;
                return match &slot.entry {
                    Entry::Found(f) => Ok(f.clone()),
                    Entry::Error(e) => Err(*e),
                };
            }
            // Re-validate: the same inode, size and mtime keep the entry.
            if let (Entry::Found(f), Ok(meta)) = (&slot.entry, std::fs::metadata(path)) {
                if meta.ino() == f.ino
                    && meta.dev() == f.dev
                    && meta.size() == f.size
                    && meta.mtime() == f.mtime_secs
                {
                    slot.checked = now;
                    slot.last_used = now;
                    return Ok(f.clone());
                }
            }
            map.remove(path);
        }
        let result = load(path);
        if map.len() >= policy.max {
            evict(&mut map, now, policy);
        }
        match &result {
            Ok(f) => {
                map.insert(
                    path.to_path_buf(),
                    Slot {
                        entry: Entry::Found(f.clone()),
                        checked: now,
                        last_used: now,
                    },
                );
            }
            Err(e) if policy.errors => {
                map.insert(
                    path.to_path_buf(),
                    Slot {
                        entry: Entry::Error(*e),
                        checked: now,
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
fn evict(map: &mut HashMap<PathBuf, Slot>, now: Instant, policy: &Policy) {
    map.retain(|_, s| now.duration_since(s.last_used) < policy.inactive);
    if map.len() >= policy.max {
        let mut ages: Vec<Instant> = map.values().map(|s| s.last_used).collect();
        ages.sort_unstable();
        let cut = ages[ages.len() / 2];
        map.retain(|_, s| s.last_used > cut);
    }
}

fn load(path: &Path) -> Result<OpenFile, io::ErrorKind> {
    // Blocking open/stat/read, as nginx does without aio: for files in the page cache these
    // take microseconds, less than a hop to a thread pool would.
    let mut file = File::open(path).map_err(|e| e.kind())?;
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
        is_dir: meta.is_dir(),
        is_file: meta.is_file(),
        data,
        variants: Rc::default(),
        ino: meta.ino(),
        dev: meta.dev(),
        file: Rc::new(file),
    })
}
