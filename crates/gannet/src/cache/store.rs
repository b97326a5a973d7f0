//! The keys zone: what a worker process knows of the entries of one cache folder, shared
//! by its worker threads behind one lock (nginx keeps it in shared memory for all its
//! workers; gannet's worker processes each have theirs, over the same files). A lookup
//! costs the lock and a hash-map probe by the key's md5; the entry's header is read from
//! its file, so an entry written before a restart (or by another worker process) is found
//! as nginx's cache loader would have found it.
//!
//! A node also carries the one fetch under way for its key: with `*_cache_lock` the other
//! requests for it wait for that fetch ([`Fetching`]); with `*_cache_use_stale updating`
//! they get the expired entry meanwhile.
//!
//! The manager (a thread per zone and worker process, started with the first entry stored,
//! as nginx's cache manager process) walks the folder once to learn the entries already
//! there (nginx's cache loader), then every second removes the entries not used for
//! `inactive` and, while the entries take more than `max_size`, the least recently used.

use super::key::Hash;
use super::path::Zone;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

#[derive(Debug)]
pub struct Index {
    inner: Mutex<Inner>,
    /// Wakes the manager early: the entries outgrew `max_size`.
    wake: Condvar,
    manager: Once,
}

#[derive(Debug, Default)]
struct Inner {
    nodes: HashMap<Hash, Node>,
    /// What the entries known take on disk.
    size: u64,
}

#[derive(Debug)]
struct Node {
    /// The entry's file size, 0 while there is no entry.
    size: u64,
    last: Instant,
    uses: u64,
    fetch: Option<Arc<Notify>>,
    fetch_since: Instant,
}

/// What a lookup learned of its key.
pub struct Seen {
    /// Lookups of the key while the zone remembered it, this one included.
    pub uses: u64,
    /// A fetch of the key under way: its signal and its age.
    pub fetching: Option<(Arc<Notify>, Duration)>,
}

/// The fetch of a key under way; dropping it (the entry stored, or given up) lets the
/// requests waiting for it go on.
#[derive(Debug)]
pub struct Fetching {
    zone: Arc<Zone>,
    hash: Hash,
    notify: Arc<Notify>,
}

impl Drop for Fetching {
    fn drop(&mut self) {
        let mut inner = self.zone.index.lock();
        if let Some(n) = inner.nodes.get_mut(&self.hash) {
            if n.fetch
                .as_ref()
                .is_some_and(|f| Arc::ptr_eq(f, &self.notify))
            {
                n.fetch = None;
            }
        }
        drop(inner);
        self.notify.notify_waiters();
    }
}

impl Default for Index {
    fn default() -> Self {
        Index {
            inner: Mutex::default(),
            wake: Condvar::new(),
            manager: Once::new(),
        }
    }
}

impl Index {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Count a lookup of `h` and say whether a fetch of it is under way.
pub fn look(zone: &Zone, h: &Hash) -> Seen {
    let now = Instant::now();
    let mut inner = zone.index.lock();
    if !inner.nodes.contains_key(h) && inner.nodes.len() >= zone.keys {
        // The zone is full: the least recently used keys are forgotten to make room (a
        // sixteenth at once, so that a full zone does not sort its keys per lookup).
        forget_lru(zone, &mut inner, (zone.keys / 16).max(1));
    }
    let n = inner.nodes.entry(*h).or_insert(Node {
        size: 0,
        last: now,
        uses: 0,
        fetch: None,
        fetch_since: now,
    });
    n.uses += 1;
    n.last = now;
    Seen {
        uses: n.uses,
        fetching: n
            .fetch
            .as_ref()
            .map(|f| (f.clone(), now.duration_since(n.fetch_since))),
    }
}

/// Mark a fetch of `h` as under way (another one may be: past `*_cache_lock_age`, or
/// without the lock); it lasts while the returned value lives.
pub fn begin_fetch(zone: &Arc<Zone>, h: &Hash) -> Fetching {
    let notify = Arc::new(Notify::new());
    let mut inner = zone.index.lock();
    if let Some(n) = inner.nodes.get_mut(h) {
        n.fetch = Some(notify.clone());
        n.fetch_since = Instant::now();
    }
    Fetching {
        zone: zone.clone(),
        hash: *h,
        notify,
    }
}

/// An entry of `size` bytes was stored (or found on disk) for `h`.
pub fn stored(zone: &Arc<Zone>, h: &Hash, size: u64) {
    start_manager(zone);
    let mut inner = zone.index.lock();
    let now = Instant::now();
    let n = inner.nodes.entry(*h).or_insert(Node {
        size: 0,
        last: now,
        uses: 1,
        fetch: None,
        fetch_since: now,
    });
    let old = std::mem::replace(&mut n.size, size);
    inner.size = inner.size - old.min(inner.size) + size;
    if zone.max_size.is_some_and(|m| inner.size > m) {
        zone.index.wake.notify_one();
    }
}

/// Drop the `count` least recently used keys that no fetch is under way for, with their
/// files. Run under the lock; the files are few per call.
fn forget_lru(zone: &Zone, inner: &mut Inner, count: usize) {
    let mut old: Vec<(Instant, Hash)> = inner
        .nodes
        .iter()
        .filter(|(_, n)| n.fetch.is_none())
        .map(|(h, n)| (n.last, *h))
        .collect();
    old.sort_unstable();
    for (_, h) in old.into_iter().take(count) {
        drop_node(zone, inner, &h);
    }
}

fn drop_node(zone: &Zone, inner: &mut Inner, h: &Hash) {
    if let Some(n) = inner.nodes.remove(h) {
        inner.size -= n.size.min(inner.size);
        if n.size > 0 {
            let _ = std::fs::remove_file(zone.file(h));
        }
    }
}

fn start_manager(zone: &Arc<Zone>) {
    zone.index.manager.call_once(|| {
        let weak = Arc::downgrade(zone);
        let spawned = std::thread::Builder::new()
            .name(format!("cache manager {}", zone.name))
            .spawn(move || manage(weak));
        if let Err(e) = spawned {
            crate::errlog::error(format_args!("cache manager for \"{}\": {e}", zone.name));
        }
    });
}

/// The manager's loop; it ends with its zone (a reload made new ones).
fn manage(weak: Weak<Zone>) {
    if let Some(zone) = weak.upgrade() {
        load(&zone);
    }
    loop {
        let Some(zone) = weak.upgrade() else { return };
        let mut inner = zone.index.lock();
        let now = Instant::now();
        let gone: Vec<Hash> = inner
            .nodes
            .iter()
            .filter(|(_, n)| n.fetch.is_none() && now.duration_since(n.last) >= zone.inactive)
            .map(|(h, _)| *h)
            .collect();
        for h in &gone {
            drop_node(&zone, &mut inner, h);
        }
        if let Some(max) = zone.max_size.filter(|&m| inner.size > m) {
            // Oldest first, until the entries fit.
            let mut sized: Vec<(Instant, Hash)> = inner
                .nodes
                .iter()
                .filter(|(_, n)| n.size > 0 && n.fetch.is_none())
                .map(|(h, n)| (n.last, *h))
                .collect();
            sized.sort_unstable();
            for (_, h) in sized {
                if inner.size <= max {
                    break;
                }
                drop_node(&zone, &mut inner, &h);
            }
        }
        // Wait a second, or until an entry stored makes the folder outgrow `max_size`.
        let (inner, _) = zone
            .index
            .wake
            .wait_timeout(inner, Duration::from_secs(1))
            .unwrap_or_else(|e| e.into_inner());
        drop(inner);
    }
}

/// nginx's cache loader: the entries already in the folder (from before a restart) join
/// the index, so that `max_size` and `inactive` count them.
fn load(zone: &Arc<Zone>) {
    let mut found = Vec::new();
    walk(&zone.dir, zone.levels.len(), &mut found);
    let now = Instant::now();
    let mut inner = zone.index.lock();
    for (h, size) in found {
        if inner.nodes.len() >= zone.keys {
            break;
        }
        let n = inner.nodes.entry(h).or_insert(Node {
            size: 0,
            last: now,
            uses: 0,
            fetch: None,
            fetch_since: now,
        });
        if n.size == 0 {
            n.size = size;
            inner.size += size;
        }
    }
}

fn walk(dir: &std::path::Path, depth: usize, out: &mut Vec<(Hash, u64)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if depth > 0 {
            if meta.is_dir() {
                walk(&e.path(), depth - 1, out);
            }
            continue;
        }
        if let Some(h) = e.file_name().to_str().and_then(parse_hex) {
            if meta.is_file() {
                out.push((h, meta.len()));
            }
        }
    }
}

fn parse_hex(name: &str) -> Option<Hash> {
    if name.len() != 32 {
        return None;
    }
    let mut h = [0u8; 16];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(name.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(h)
}

/// Whether the fetch under way for `h` is still the one `signal` belongs to.
pub fn fetching_with(zone: &Zone, h: &Hash, signal: &Arc<Notify>) -> bool {
    zone.index
        .lock()
        .nodes
        .get(h)
        .and_then(|n| n.fetch.as_ref())
        .is_some_and(|f| Arc::ptr_eq(f, signal))
}

/// A purge removed `h`'s file: its size no longer counts (the key stays known, with the
/// fetch that may be under way for it).
pub fn forget(zone: &Zone, h: &Hash) {
    let mut guard = zone.index.lock();
    let inner = &mut *guard;
    if let Some(n) = inner.nodes.get_mut(h) {
        let size = std::mem::take(&mut n.size);
        inner.size -= size.min(inner.size);
    }
}

/// What the entries this index knows take, and how many they are (the metrics' gauges);
/// the manager starts if it had not, so that the loader counts the entries on disk.
pub fn usage(zone: &Arc<Zone>) -> (u64, usize) {
    start_manager(zone);
    let inner = zone.index.lock();
    let entries = inner.nodes.values().filter(|n| n.size > 0).count();
    (inner.size, entries)
}

/// Every entry file in the zone's folder (its hash), as the loader finds them.
pub fn on_disk(zone: &Zone) -> Vec<Hash> {
    let mut found = Vec::new();
    walk(&zone.dir, zone.levels.len(), &mut found);
    found.into_iter().map(|(h, _)| h).collect()
}
