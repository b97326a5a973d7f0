//! An entry file, nginx's layout in spirit (`ngx_http_file_cache_header_t`, then the key,
//! then the answer's head, then the body): a fixed header (a magic word, the time the entry
//! is valid until, the time it was stored, the lengths below, the `Vary` variant's hash,
//! and the `stale-while-revalidate` and `stale-if-error` seconds past it), the key, the `Vary` header the answer had, the answer's head as the application
//! sent it (in CGI form: `Status: NNN` and the fields), then the body.
//!
//! An entry is written to a temp file (in the location's `*_temp_path`, or in the cache
//! folder with `use_temp_path=off`) and renamed into place when whole, so a reader never
//! sees one half written; one that is not finished is removed.

use super::key::Hash;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"GNTCACH2";
/// magic, valid, date, key length, vary length, head length, variant, updating, error.
const FIXED: usize = 8 + 8 + 8 + 4 + 4 + 4 + 16 + 4 + 4;

/// What an entry's header says.
#[derive(Debug)]
pub struct Meta {
    /// Fresh until this time (seconds since the epoch).
    pub valid: i64,
    pub date: i64,
    pub vary: String,
    pub variant: Hash,
    /// `Cache-Control: stale-while-revalidate=N` (nginx's `updating_sec`): seconds past
    /// `valid` the entry may be served while it is updated.
    pub updating: u32,
    /// `stale-if-error=N` (or `stale-while-revalidate`'s; nginx's `error_sec`): seconds
    /// past `valid` the entry may be served in place of an error.
    pub error: u32,
    /// The answer's head, CGI form, ending with its empty line.
    pub head: Vec<u8>,
    pub body_start: u64,
    pub body_len: u64,
}

impl Meta {
    /// Expired, but within `stale-while-revalidate` (nginx's `stale_updating`).
    pub fn stale_updating(&self, now: i64) -> bool {
        self.valid + i64::from(self.updating) >= now
    }
    /// Expired, but within `stale-if-error` (nginx's `stale_error`).
    pub fn stale_error(&self, now: i64) -> bool {
        self.valid + i64::from(self.error) >= now
    }
}

/// Open the entry at `path` if it is one for `key`; `None` if there is none (or it is
/// not an entry, or one of another key with the same md5).
pub fn open(path: &Path, key: &str) -> Option<(File, Meta)> {
    let file = File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let mut fixed = [0u8; FIXED];
    file.read_exact_at(&mut fixed, 0).ok()?;
    if &fixed[..8] != MAGIC {
        return None;
    }
    let i64_at = |at: usize| i64::from_le_bytes(fixed[at..at + 8].try_into().unwrap_or([0; 8]));
    let u32_at =
        |at: usize| u32::from_le_bytes(fixed[at..at + 4].try_into().unwrap_or([0; 4])) as usize;
    let (key_len, vary_len, head_len) = (u32_at(24), u32_at(28), u32_at(32));
    if key_len != key.len() || vary_len > 1024 || head_len > 1 << 20 {
        return None;
    }
    let mut rest = vec![0u8; key_len + vary_len + head_len];
    file.read_exact_at(&mut rest, FIXED as u64).ok()?;
    if &rest[..key_len] != key.as_bytes() {
        return None;
    }
    let body_start = (FIXED + rest.len()) as u64;
    let vary = String::from_utf8_lossy(&rest[key_len..key_len + vary_len]).into_owned();
    rest.drain(..key_len + vary_len);
    let meta = Meta {
        valid: i64_at(8),
        date: i64_at(16),
        vary,
        variant: fixed[36..52].try_into().unwrap_or([0; 16]),
        updating: u32_at(52) as u32,
        error: u32_at(56) as u32,
        head: rest,
        body_start,
        body_len: len.checked_sub(body_start)?,
    };
    Some((file, meta))
}

/// The key an entry file was stored for (`None` if the file is no entry): what a wildcard
/// purge matches, whichever process wrote the entry.
pub fn key_of(path: &Path) -> Option<Vec<u8>> {
    let file = File::open(path).ok()?;
    let mut fixed = [0u8; FIXED];
    file.read_exact_at(&mut fixed, 0).ok()?;
    if &fixed[..8] != MAGIC {
        return None;
    }
    let key_len = u32::from_le_bytes(fixed[24..28].try_into().ok()?) as usize;
    if key_len > 1 << 20 {
        return None;
    }
    let mut key = vec![0u8; key_len];
    file.read_exact_at(&mut key, FIXED as u64).ok()?;
    Some(key)
}

/// Make an entry fresh again until `valid` (a revalidation's 304): its header's times are
/// rewritten in place.
pub fn refresh(path: &Path, valid: i64, date: i64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    let mut times = [0u8; 16];
    times[..8].copy_from_slice(&valid.to_le_bytes());
    times[8..].copy_from_slice(&date.to_le_bytes());
    f.write_all_at(&times, 8)
}

/// An entry being written.
pub struct Writer {
    file: File,
    tmp: PathBuf,
    dest: PathBuf,
    len: u64,
    done: bool,
}

static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Writer {
    /// Start the entry for `dest` with a temp file in `tmp_dir`.
    pub fn create(
        tmp_dir: &Path,
        dest: PathBuf,
        key: &str,
        meta: &Meta,
    ) -> std::io::Result<Writer> {
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = tmp_dir.join(format!("{:010}.{}.cache", n, std::process::id()));
        let file = match File::create(&tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                make_dirs(tmp_dir)?;
                File::create(&tmp)?
            }
            r => r?,
        };
        let mut w = Writer {
            file,
            tmp,
            dest,
            len: 0,
            done: false,
        };
        let mut h = Vec::with_capacity(FIXED + key.len() + meta.vary.len() + meta.head.len());
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&meta.valid.to_le_bytes());
        h.extend_from_slice(&meta.date.to_le_bytes());
        for l in [key.len(), meta.vary.len(), meta.head.len()] {
            h.extend_from_slice(&(l as u32).to_le_bytes());
        }
        h.extend_from_slice(&meta.variant);
        h.extend_from_slice(&meta.updating.to_le_bytes());
        h.extend_from_slice(&meta.error.to_le_bytes());
        h.extend_from_slice(key.as_bytes());
        h.extend_from_slice(meta.vary.as_bytes());
        h.extend_from_slice(&meta.head);
        w.write(&h)?;
        Ok(w)
    }

    pub fn write(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.file.write_all(b)?;
        self.len += b.len() as u64;
        Ok(())
    }

    /// Put the entry in place; its size on disk.
    pub fn commit(mut self) -> std::io::Result<u64> {
        if let Some(dir) = self.dest.parent() {
            make_dirs(dir)?;
        }
        std::fs::rename(&self.tmp, &self.dest)?;
        self.done = true;
        Ok(self.len)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn make_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Read an entry's body whole (for tests and small bodies).
#[cfg(test)]
fn body(file: &mut File, meta: &Meta) -> Vec<u8> {
    let mut v = Vec::new();
    use std::io::{Read, Seek};
    let _ = file.seek(std::io::SeekFrom::Start(meta.body_start));
    let _ = file.read_to_end(&mut v);
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn written_then_read() {
        let dir = std::env::temp_dir().join(format!("gannet-entry-{}", std::process::id()));
        let dest = dir.join("a/bc/entry");
        let meta = super::Meta {
            valid: 100,
            date: 50,
            vary: "Accept".into(),
            variant: [7; 16],
            updating: 3,
            error: 9,
            head: b"Status: 200\r\nX: y\r\n\r\n".to_vec(),
            body_start: 0,
            body_len: 0,
        };
        let mut w = super::Writer::create(&dir, dest.clone(), "key", &meta).unwrap();
        w.write(b"hello").unwrap();
        w.commit().unwrap();
        assert!(super::open(&dest, "other").is_none());
        let (mut f, m) = super::open(&dest, "key").unwrap();
        assert_eq!((m.valid, m.date, m.vary.as_str()), (100, 50, "Accept"));
        assert_eq!((m.updating, m.error), (3, 9));
        assert_eq!(m.head, meta.head);
        assert_eq!(m.body_len, 5);
        assert_eq!(super::body(&mut f, &m), b"hello");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
