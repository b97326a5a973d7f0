//! An entry file, nginx's layout in spirit (`ngx_http_file_cache_header_t`, then the key,
//! then the answer's head, then the body): a fixed header (a magic word, the time the entry
//! is valid until, the time it was stored, the lengths below, the `Vary` variant's hash,
//! and the `stale-while-revalidate` and `stale-if-error` seconds past it), the key, the `Vary` header the answer had, the answer's head as the application
//! sent it (in CGI form: `Status: NNN` and the fields), then the body.
//!
//! An entry is written to a temp file (in the location's `*_temp_path`, or in the cache
//! folder with `use_temp_path=off`) and renamed into place when whole, so a reader never
//! sees one half written; one that is not finished is removed.
//!
//! Entry files are opened and read on the worker thread ([`lookup`]), as nginx reads them
//! and as static files are opened. A [`Writer`] writes a small entry there too, when the
//! answer ends, in one write and a rename (as nginx writes its entries without `aio`); a
//! larger one's writes and rename go, in order, to a blocking task (a slow disk must not
//! stall every connection of the thread for a big body).

use super::key::Hash;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

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

/// Run `f` off the event loop: on tokio's blocking pool (or here, outside a runtime).
pub fn off_loop(f: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(f)),
        Err(_) => f(),
    }
}

/// [`open`] on the worker thread, as static files are opened and as nginx reads its cache
/// files (without `aio`): one open, one fstat and two preads of a file the page cache
/// holds. Handing each hit to tokio's blocking pool instead cost two thread switches per
/// request, three times nginx's CPU per hit in the arena's cache scenario (the same holds
/// for a small entry's write: [`Writer`]).
pub async fn lookup(path: PathBuf, key: Arc<str>) -> Option<(File, Meta)> {
    open(&path, &key)
}

/// What precedes an entry's body in its file: the fixed header, the key, the `Vary`
/// header and the answer's head.
#[cfg(test)]
fn header(key: &str, meta: &Meta) -> Vec<u8> {
    header_with(key, meta, 0, |h| h.extend_from_slice(&meta.head))
}

/// [`header`] with the answer's head written by `head` (straight into the buffer: a miss
/// made its head's text, then copied it here) and room for `body` more bytes, so that the
/// body held after it does not grow the buffer again (a miss's realloc of header and body,
/// about 800 instructions; docs/bench/cache-report.md).
pub fn header_with(
    key: &str,
    meta: &Meta,
    body: usize,
    head: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    let body = body.min(HOLD_MAX);
    let mut h = Vec::with_capacity(FIXED + key.len() + meta.vary.len() + 512 + body);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&meta.valid.to_le_bytes());
    h.extend_from_slice(&meta.date.to_le_bytes());
    // The head's length (at 32) is filled in once it is written.
    for l in [key.len(), meta.vary.len(), 0] {
        h.extend_from_slice(&(l as u32).to_le_bytes());
    }
    h.extend_from_slice(&meta.variant);
    h.extend_from_slice(&meta.updating.to_le_bytes());
    h.extend_from_slice(&meta.error.to_le_bytes());
    h.extend_from_slice(key.as_bytes());
    h.extend_from_slice(meta.vary.as_bytes());
    let start = h.len();
    head(&mut h);
    let len = (h.len() - start) as u32;
    h[32..36].copy_from_slice(&len.to_le_bytes());
    h
}

/// The most a [`Writer`] holds in memory to write on the worker thread when the answer
/// ends (as a hot entry's body kept in memory: `file_cache::SMALL_FILE`).
const HOLD_MAX: usize = crate::modules::file_cache::SMALL_FILE as usize;

/// An entry (or a stored answer's file) being written. A small one is held in memory and
/// written on the worker thread when it ends, in one write and a rename, as nginx writes its
/// entries on its event loop (without `aio`): into the page cache that costs less than the
/// thread switches of hops to the blocking pool and back (a miss of the arena's cache
/// scenario: 6 context switches and 8 `futex` calls fewer; docs/bench/cache-report.md). Once past
/// `HOLD_MAX` its operations go, in order, to a blocking task instead (a slow disk must not
/// stall every connection of the thread for a big body).
pub struct Writer {
    state: State,
}

enum State {
    /// Small so far: the bytes, and where they go.
    Held(Vec<u8>, Box<Output>),
    Queued(Arc<Job>),
    /// Committed.
    Done,
}

/// What to do when the entry is in place (its size on disk) or could not be (`None`: the
/// failure is logged).
pub type OnCommit = Box<dyn FnOnce(Option<u64>) + Send>;

enum Op {
    Data(Vec<u8>),
    Commit(OnCommit),
    Abort,
}

struct Job {
    queue: Mutex<(VecDeque<Op>, bool)>,
    file: Mutex<Output>,
    /// Bytes queued and not yet written, and the signal that some were.
    queued: AtomicUsize,
    written: tokio::sync::Notify,
}

/// How many bytes [`Writer::room`] lets wait for the disk.
const QUEUED_MAX: usize = 1 << 20;

struct Output {
    file: Option<File>,
    tmp: PathBuf,
    dest: PathBuf,
    len: u64,
    /// The first failure (later writes are skipped; the entry is not committed).
    failed: Option<String>,
    /// A stored answer's file (`*_store`), not a cache entry: its permissions and
    /// modification time.
    plain: Option<(u32, Option<std::time::SystemTime>)>,
}

static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A new temp file's path in `dir`: `NNNNNNNNNN.PID` and `suffix` (the sequence number at
/// least ten digits, as nginx's temp files), made in one allocation: `format!` and
/// `Path::join` took about 1,650 instructions of a miss (docs/bench/cache-report.md).
fn temp_name(dir: &Path, suffix: &[u8]) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = dir.as_os_str().as_bytes();
    let mut p = Vec::with_capacity(dir.len() + 1 + 20 + 1 + 10 + suffix.len());
    p.extend_from_slice(dir);
    if !dir.is_empty() && p.last() != Some(&b'/') {
        p.push(b'/');
    }
    push_decimal(&mut p, n, 10);
    p.push(b'.');
    push_decimal(&mut p, u64::from(super::shm::pid()), 1);
    p.extend_from_slice(suffix);
    PathBuf::from(std::ffi::OsString::from_vec(p))
}

/// `n` in decimal, zero-padded to `width` digits.
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut i = digits.len();
    while n > 0 || i == digits.len() {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    let i = i.min(digits.len() - width.min(digits.len()));
    out.extend_from_slice(&digits[i..]);
}

impl Writer {
    /// Start an entry for `dest` whose header ([`header_with`]) is `header`, with a temp
    /// file in `tmp_dir` (a failure to write it is logged and the entry not stored).
    pub fn create(tmp_dir: &Path, dest: PathBuf, header: Vec<u8>) -> Writer {
        let out = Output {
            file: None,
            tmp: temp_name(tmp_dir, b".cache"),
            dest,
            len: 0,
            failed: None,
            plain: None,
        };
        Writer {
            state: State::Held(header, Box::new(out)),
        }
    }

    /// A plain file for `dest` (`*_store`), with a temp file in `tmp_dir`: the body alone,
    /// given `access` (its new folders too) and `mtime` when put in place.
    pub fn plain(
        tmp_dir: &Path,
        dest: PathBuf,
        access: u32,
        mtime: Option<std::time::SystemTime>,
    ) -> Writer {
        let out = Output {
            file: None,
            tmp: temp_name(tmp_dir, b""),
            dest,
            len: 0,
            failed: None,
            plain: Some((access, mtime)),
        };
        Writer {
            state: State::Held(Vec::new(), Box::new(out)),
        }
    }

    pub fn write(&mut self, b: &[u8]) {
        match &mut self.state {
            State::Held(held, _) if held.len() + b.len() <= HOLD_MAX => held.extend_from_slice(b),
            State::Queued(job) => job.push(Op::Data(b.to_vec())),
            State::Done => {}
            State::Held(..) => {
                // Too big to hold: what came so far and the rest go to a blocking task.
                let State::Held(held, out) = std::mem::replace(&mut self.state, State::Done) else {
                    return;
                };
                let job = Arc::new(Job {
                    queue: Mutex::new((VecDeque::new(), false)),
                    file: Mutex::new(*out),
                    queued: AtomicUsize::new(0),
                    written: tokio::sync::Notify::new(),
                });
                job.push(Op::Data(held));
                job.push(Op::Data(b.to_vec()));
                self.state = State::Queued(job);
            }
        }
    }

    /// Wait until the bytes queued for the file are few enough to queue more.
    pub async fn room(&self) {
        let State::Queued(job) = &self.state else {
            return;
        };
        loop {
            let written = job.written.notified();
            let mut written = std::pin::pin!(written);
            written.as_mut().enable();
            if job.queued.load(Relaxed) < QUEUED_MAX {
                return;
            }
            written.await;
        }
    }

    /// Whether the entry is still held in memory: committing it is then done on the spot,
    /// with no wait.
    pub fn is_held(&self) -> bool {
        matches!(self.state, State::Held(..))
    }

    /// Put an entry held in memory in place now: its size on disk (`None`: it could not
    /// be, the failure logged); the writer back if its bytes went to a blocking task.
    pub fn commit_held(mut self) -> Result<Option<u64>, Writer> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Held(held, mut out) => {
                out.apply(Op::Data(held));
                Ok(out.commit())
            }
            state => {
                self.state = state;
                Err(self)
            }
        }
    }

    /// Put the entry in place; `then` gets its size on disk (here for an entry held in
    /// memory, else on the blocking task).
    pub fn commit(mut self, then: OnCommit) {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Held(held, mut out) => {
                out.apply(Op::Data(held));
                then(out.commit());
            }
            State::Queued(job) => job.push(Op::Commit(then)),
            State::Done => then(None),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // A held entry has no file yet: nothing to remove.
        if let State::Queued(job) = &self.state {
            job.push(Op::Abort);
        }
    }
}

impl Job {
    fn push(self: &Arc<Self>, op: Op) {
        if let Op::Data(b) = &op {
            self.queued.fetch_add(b.len(), Relaxed);
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.0.push_back(op);
        if q.1 {
            return;
        }
        q.1 = true;
        drop(q);
        let me = self.clone();
        off_loop(move || me.drain());
    }

    /// Work the queue until it is empty (one task at a time: the flag in the queue).
    fn drain(&self) {
        loop {
            let op = {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                match q.0.pop_front() {
                    Some(op) => op,
                    None => {
                        q.1 = false;
                        return;
                    }
                }
            };
            let n = match &op {
                Op::Data(b) => b.len(),
                _ => 0,
            };
            let mut out = self.file.lock().unwrap_or_else(|e| e.into_inner());
            out.apply(op);
            drop(out);
            if n > 0 {
                self.queued.fetch_sub(n, Relaxed);
                self.written.notify_waiters();
            }
        }
    }
}

impl Output {
    fn apply(&mut self, op: Op) {
        match op {
            Op::Data(b) => {
                if self.failed.is_some() {
                    return;
                }
                if let Err(e) = self.write(&b) {
                    crate::errlog::log(crate::errlog::Level::Crit, format_args!("{e}"));
                    self.failed = Some(e);
                }
            }
            Op::Commit(then) => then(self.commit()),
            Op::Abort => self.abort(),
        }
    }

    fn write(&mut self, b: &[u8]) -> Result<(), String> {
        if self.file.is_none() {
            let made = match File::create(&self.tmp) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => self
                    .tmp
                    .parent()
                    .map_or(Err(e), make_dirs)
                    .and_then(|()| File::create(&self.tmp)),
                r => r,
            };
            self.file = Some(made.map_err(|e| crate::errlog::failed("open()", &self.tmp, &e))?);
        }
        if let Some(f) = self.file.as_mut() {
            f.write_all(b).map_err(|e| {
                format!(
                    "write() to cache temp file failed ({})",
                    crate::errlog::errno_text(&e)
                )
            })?;
        }
        self.len += b.len() as u64;
        Ok(())
    }

    fn commit(&mut self) -> Option<u64> {
        if let Some(plain) = self.plain {
            return self.commit_plain(plain);
        }
        if self.failed.is_some() {
            self.abort();
            return None;
        }
        self.file = None;
        // The rename first: the folders are made only when it finds one missing (as nginx's
        // ngx_ext_rename_file), not checked for every entry.
        let r = match rename(&self.tmp, &self.dest, None) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match self.dest.parent() {
                Some(dir) => make_dirs(dir).and_then(|()| rename(&self.tmp, &self.dest, None)),
                None => Err(e),
            },
            r => r,
        };
        if let Err(e) = r {
            crate::errlog::log(
                crate::errlog::Level::Crit,
                format_args!(
                    "rename() of cache temp file failed ({})",
                    crate::errlog::errno_text(&e)
                ),
            );
            let _ = std::fs::remove_file(&self.tmp);
            return None;
        }
        Some(self.len)
    }

    /// A stored answer put in place as nginx's ngx_ext_rename_file: its access and time
    /// set, the missing folders made (with the access and search rights where it reads),
    /// an error logged and the temp file removed on a failure.
    fn commit_plain(
        &mut self,
        (access, mtime): (u32, Option<std::time::SystemTime>),
    ) -> Option<u64> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if self.failed.is_none() && self.file.is_none() {
            // An empty answer: its file is made all the same.
            if let Err(e) = self.write(&[]) {
                crate::errlog::log(crate::errlog::Level::Crit, format_args!("{e}"));
                self.failed = Some(e);
            }
        }
        if self.failed.is_some() {
            self.abort();
            return None;
        }
        if let (Some(f), Some(t)) = (&self.file, mtime) {
            let _ = f.set_modified(t);
        }
        self.file = None;
        let _ = std::fs::set_permissions(&self.tmp, std::fs::Permissions::from_mode(access));
        let dirs = access | (access & 0o444) >> 2;
        let r = match rename(&self.tmp, &self.dest, mtime) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match self.dest.parent() {
                Some(dir) => std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(dirs)
                    .create(dir)
                    .and_then(|()| rename(&self.tmp, &self.dest, mtime)),
                None => Err(e),
            },
            r => r,
        };
        if let Err(e) = r {
            crate::errlog::log(
                crate::errlog::Level::Crit,
                format_args!(
                    "rename() \"{}\" to \"{}\" failed ({})",
                    self.tmp.display(),
                    self.dest.display(),
                    crate::errlog::errno_text(&e)
                ),
            );
            let _ = std::fs::remove_file(&self.tmp);
            return None;
        }
        Some(self.len)
    }

    fn abort(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// `from` renamed to `to`; across file systems (the temp folder on another one), as
/// nginx's `ngx_ext_rename_file`: copied beside `to` as `TO.NNNNNNNNNN` (with `mtime`, a
/// stored answer's time), that renamed to `to`, and `from` removed.
fn rename(from: &Path, to: &Path, mtime: Option<std::time::SystemTime>) -> std::io::Result<()> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    match std::fs::rename(from, to) {
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let mut name = to.as_os_str().as_bytes().to_vec();
            name.push(b'.');
            push_decimal(&mut name, SEQ.fetch_add(1, Relaxed), 10);
            let name = PathBuf::from(std::ffi::OsString::from_vec(name));
            let copied = std::fs::copy(from, &name).and_then(|_| {
                if let Some(t) = mtime {
                    File::options().write(true).open(&name)?.set_modified(t)?;
                }
                std::fs::rename(&name, to)
            });
            match copied {
                Ok(()) => {
                    let _ = std::fs::remove_file(from);
                    Ok(())
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&name);
                    Err(e)
                }
            }
        }
        r => r,
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
    fn temp_names() {
        let mut v = Vec::new();
        super::push_decimal(&mut v, 42, 10);
        assert_eq!(v, b"0000000042");
        v.clear();
        super::push_decimal(&mut v, 0, 1);
        assert_eq!(v, b"0");
        v.clear();
        super::push_decimal(&mut v, u64::MAX, 10);
        assert_eq!(v, u64::MAX.to_string().as_bytes());
        let p = super::temp_name(std::path::Path::new("/t/"), b".cache");
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(p.parent(), Some(std::path::Path::new("/t")));
        let want = format!(".{}.cache", super::super::shm::pid());
        assert!(
            name.ends_with(&want) && name.len() == 10 + want.len(),
            "{name}"
        );
    }

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
        let mut w = super::Writer::create(&dir, dest.clone(), super::header("key", &meta));
        w.write(b"hello");
        let size = std::sync::Arc::new(std::sync::Mutex::new(None));
        let got = size.clone();
        w.commit(Box::new(move |r| *got.lock().unwrap() = r));
        assert!(size.lock().unwrap().is_some());
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
