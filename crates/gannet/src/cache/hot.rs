//! A worker thread's copies of the entries it serves: per key the open entry file, its
//! header, its answer's head already parsed (and made ready for the location that serves it)
//! and the key's md5, so that a hit costs no open, stat, read or parse of the file and no
//! md5 of the key (nginx keeps the descriptor with `open_file_cache` and re-reads the
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
use crate::runtime::clock;
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
    /// The md5 of its key.
    pub hash: Hash,
    made: Instant,
    pub file: Rc<File>,
    pub meta: Meta,
    /// The body of a small entry (up to `file_cache::SMALL_FILE`, as static files are kept):
    /// sent with the head in one write.
    pub data: Option<Bytes>,
    status: Option<u16>,
    pub fields: Fields,
    /// The answer's head as the last location that served it makes it, when that is the
    /// same for every request of the location (`conn::gateway_cache::serve_hot`).
    pub ready: RefCell<Option<Ready>>,
}

/// An entry's answer head made ready for one location: a hit clones it instead of
/// parsing the stored head, hiding fields and reading its dates again.
pub struct Ready {
    /// The location (a `Weak` keeps its address from being reused by a reloaded one).
    pub conf: Weak<crate::modules::LocConf>,
    /// The answer without its body.
    pub resp: crate::http::response::Response,
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

/// Keyed by the entry's key text (foldhash, seeded per table, as the open file cache's
/// paths): a hit finds its copy, and with it the key's md5 (`Hot::hash`), without hashing
/// the key with md5 (about 760 instructions a hit, callgrind, docs/bench/cache-report.md).
type Map = HashMap<Box<str>, Rc<Hot>, foldhash::fast::RandomState>;

thread_local! {
    static HOT: RefCell<Map> = RefCell::new(Map::default());
}

impl Hot {
    /// Whether the copy is still the entry of version `version` (the keys zone's) and
    /// younger than `valid`.
    pub fn current(&self, version: u64, valid: Duration) -> bool {
        self.version == version && clock::now().saturating_duration_since(self.made) < valid
    }
}

/// This thread's copy of `key`'s entry in `zone`, whatever its version (see
/// [`Hot::current`]).
pub fn find(zone: &Arc<Zone>, key: &str) -> Option<Rc<Hot>> {
    HOT.with_borrow(|m| {
        let hot = m.get(key)?;
        std::ptr::eq(hot.zone.as_ptr(), Arc::as_ptr(zone)).then(|| hot.clone())
    })
}

/// Keep `file` as the entry of `key` (whose md5 is `h`) at version `version` (at most
/// `open_file_cache`'s `max` copies per thread); the copy, or the file back if the entry
/// has `Vary` or its head does not parse.
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
        hash: *h,
        made: clock::now(),
        file: Rc::new(file),
        meta,
        data,
        status: head.status,
        fields: head.headers,
        ready: RefCell::new(None),
    });
    let (valid, max) = (policy.valid, policy.max.max(1));
    HOT.with_borrow_mut(|m| {
        if m.len() >= max && !m.contains_key(key) {
            // The copies past their time first; else any one.
            let now = clock::now();
            m.retain(|_, v| {
                now.saturating_duration_since(v.made) < valid && v.zone.strong_count() > 0
            });
            if m.len() >= max {
                if let Some(k) = m.keys().next().cloned() {
                    m.remove(&k);
                }
            }
        }
        m.insert(key.into(), hot.clone());
    });
    Ok(hot)
}
