//! A worker thread's copies of the entries it serves: per key hash the open entry file, its
//! header and its answer's head already parsed, so that a hit costs no open, stat, read or
//! parse of the file (nginx keeps the descriptor with `open_file_cache` and re-reads the
//! header; gannet keeps the header too).
//!
//! A copy is used only while the key's version in the keys zone is the one it was made
//! at (`shm::Guard::version`): an entry stored anew, purged, refreshed by a revalidation or
//! forgotten by the manager, in any worker process, changes the version, so the next
//! lookup sees it at once. A copy is also re-read once it is older than the location's
//! `open_file_cache_valid` (1 s by default, as gannet's open files), which bounds how long
//! a file removed behind the server's back stays served, as for static files. Only entries
//! without `Vary` are kept (a variant's is found through its main entry).

use super::entry::Meta;
use super::key::Hash;
use super::Zone;
use crate::modules::file_cache::{Policy, SMALL_FILE};
use bytes::Bytes;
use gannet_proto::cgi::{self, CgiHead, Fields};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// An entry as a hit serves it.
pub struct Hot {
    /// The zone it is of (a `Weak` keeps the address from being reused by another zone).
    zone: Weak<Zone>,
    version: u64,
    key: Box<str>,
    made: Instant,
    pub file: Rc<File>,
    pub meta: Meta,
    /// The body of a small entry (up to `file_cache::SMALL_FILE`, as static files are kept):
    /// sent with the head in one write.
    pub data: Option<Bytes>,
    status: Option<u16>,
    fields: Fields,
}

impl Hot {
    /// The answer's head, as the application sent it.
    pub fn head(&self) -> CgiHead {
        CgiHead {
            status: self.status,
            headers: self.fields.clone(),
        }
    }
}

/// The keys are md5 hashes already: their first bytes are the map's hash.
#[derive(Default)]
struct Md5Hasher(u64);

impl std::hash::Hasher for Md5Hasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, b: &[u8]) {
        for &x in b.iter().take(8) {
            self.0 = (self.0 << 8) | u64::from(x);
        }
    }
}

type Map = HashMap<Hash, Rc<Hot>, std::hash::BuildHasherDefault<Md5Hasher>>;

thread_local! {
    static HOT: RefCell<Map> = RefCell::new(Map::default());
}

/// The copy of `h`'s entry in `zone`, if it is still the entry of version `version`, for
/// `key`, and younger than `valid`.
pub fn get(
    zone: &Arc<Zone>,
    h: &Hash,
    version: u64,
    key: &str,
    valid: Duration,
) -> Option<Rc<Hot>> {
    HOT.with_borrow(|m| {
        let hot = m.get(h)?;
        (hot.version == version
            && std::ptr::eq(hot.zone.as_ptr(), Arc::as_ptr(zone))
            && &*hot.key == key
            && hot.made.elapsed() < valid)
            .then(|| hot.clone())
    })
}

/// Keep `file` as `h`'s entry of version `version` (at most `open_file_cache`'s `max`
/// copies per thread); the
/// copy, or `None` if the entry has `Vary` or its head does not parse.
pub fn put(
    zone: &Arc<Zone>,
    h: &Hash,
    version: u64,
    key: &str,
    file: File,
    meta: Meta,
    policy: &Policy,
) -> Result<Rc<Hot>, (File, Meta)> {
    if !meta.vary.is_empty() {
        return Err((file, meta));
    }
    let mut buf = bytes::BytesMut::from(&meta.head[..]);
    let Ok(Some(head)) = cgi::parse_head(&mut buf, usize::MAX) else {
        return Err((file, meta));
    };
    let data = (meta.body_len <= SMALL_FILE)
        .then(|| {
            let mut b = vec![0u8; meta.body_len as usize];
            file.read_exact_at(&mut b, meta.body_start).ok()?;
            Some(Bytes::from(b))
        })
        .flatten();
    let hot = Rc::new(Hot {
        zone: Arc::downgrade(zone),
        version,
        key: key.into(),
        made: Instant::now(),
        file: Rc::new(file),
        meta,
        data,
        status: head.status,
        fields: head.headers,
    });
    let (valid, max) = (policy.valid, policy.max.max(1));
    HOT.with_borrow_mut(|m| {
        if m.len() >= max && !m.contains_key(h) {
            // The copies past their time first; else any one.
            m.retain(|_, v| v.made.elapsed() < valid && v.zone.strong_count() > 0);
            if m.len() >= max {
                if let Some(k) = m.keys().next().copied() {
                    m.remove(&k);
                }
            }
        }
        m.insert(*h, hot.clone());
    });
    Ok(hot)
}
