//! The keys zone in shared memory (nginx's `ngx_http_file_cache_sh_t` in a shm zone): one
//! region per `keys_zone=NAME:SIZE`, mapped by the master while it loads the config, so
//! before it forks the worker processes, which all see the same keys. A reload that keeps
//! a zone's name and size keeps its region (and so what it knows: the cache stays warm);
//! another size makes a new one, as nginx does.
//!
//! The region holds a header (the lock, the entries' total size, the manager's lease, the
//! LRU list's ends, the free list), a hash table of bucket heads, and the nodes: per key
//! its md5, the entry file's size, its last use, its uses and the fetch under way (a token
//! naming the process, and its start). Nodes are linked by index (the region is mapped at
//! another address in each process), in a bucket chain and in the LRU list.
//!
//! The lock is a spin lock on a word holding the owner's pid (nginx's `ngx_shmtx_t` also
//! keeps the pid): critical sections are a few probes and links, no I/O ever runs under it,
//! and the master frees the lock (and the fetches) of a worker process that died
//! ([`child_died`]). Every field is an atomic read and written with `Relaxed` under the
//! lock; the lock's acquire and release order them.

use super::key::Hash;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};

/// nginx's node takes about 128 bytes: one megabyte holds about 8,000 keys.
const NODE_SHARE: u64 = 128;
const NONE: u32 = 0;

#[repr(C, align(64))]
struct Header {
    lock: AtomicU32,
    /// Bumped by each config load that uses the zone: a newer config's manager takes over.
    gen: AtomicU64,
    /// The manager's lease: its pid and its config's generation.
    manager: AtomicU64,
    /// The loader walked the folder (once per region: not again after a reload).
    loaded: AtomicU32,
    size: AtomicU64,
    count: AtomicU32,
    /// Nodes given back, linked by `chain` (index + 1; 0 ends).
    free: AtomicU32,
    /// Nodes never used yet: those from this index on (so that a big zone's pages are
    /// only touched as keys come).
    fresh: AtomicU32,
    /// The LRU list: most recently used first.
    head: AtomicU32,
    tail: AtomicU32,
    /// The last version given to a node (see [`Guard::version`]).
    versions: AtomicU64,
}

#[repr(C)]
struct Node {
    hash: [AtomicU64; 2],
    size: AtomicU64,
    last: AtomicU64,
    fetch: AtomicU64,
    fetch_since: AtomicU64,
    /// Changed whenever the key's entry file may have changed (made, stored, purged,
    /// refreshed): what a worker's in-memory copy of an entry is checked against.
    version: AtomicU64,
    uses: AtomicU32,
    chain: AtomicU32,
    prev: AtomicU32,
    next: AtomicU32,
}

/// One keys zone's region.
#[derive(Debug)]
pub struct Region {
    pub name: String,
    /// The cache folder and levels it was made for (a reload may not change them).
    dir: std::path::PathBuf,
    levels: Vec<u8>,
    bytes: u64,
    base: *mut u8,
    len: usize,
    cap: u32,
    buckets: u32,
}

// SAFETY: the region is only accessed through atomics (under the lock for all but the
// header's lock and lease words), from any thread of any process that maps it.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping made in `map`, unmapped only here; no
        // reference into it outlives the Region (guards borrow it).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The regions the master made, for a reload to find the one to keep.
static REGIONS: Mutex<Vec<Arc<Region>>> = Mutex::new(Vec::new());

/// The region of `keys_zone=name:bytes` for the folder `dir`: the one already mapped for
/// the same name and size (a reload), else a new one; and the config generation to use it
/// with. As nginx, a reload may not give a zone another folder or other levels.
pub fn region(
    name: &str,
    bytes: u64,
    dir: &std::path::Path,
    levels: &[u8],
) -> Result<(Arc<Region>, u64), String> {
    let mut all = REGIONS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(old) = all.iter().find(|r| r.name == name) {
        if old.dir != dir {
            return Err(format!(
                "cache \"{name}\" uses the \"{}\" cache path while previously it used the \"{}\" cache path",
                dir.display(),
                old.dir.display()
            ));
        }
        if old.levels != levels {
            return Err(format!("cache \"{name}\" had previously different levels"));
        }
    }
    let r = match all.iter().find(|r| r.name == name && r.bytes == bytes) {
        Some(r) => r.clone(),
        None => {
            let mut r = map(name, bytes)
                .map_err(|e| format!("could not map keys zone \"{name}\" ({e})"))?;
            r.dir = dir.to_path_buf();
            r.levels = levels.to_vec();
            let r = Arc::new(r);
            all.retain(|o| o.name != name);
            all.push(r.clone());
            r
        }
    };
    let gen = r.header().gen.fetch_add(1, Relaxed) + 1;
    Ok((r, gen))
}

fn map(name: &str, bytes: u64) -> std::io::Result<Region> {
    let cap = u32::try_from((bytes / NODE_SHARE).max(1)).unwrap_or(u32::MAX / 2);
    // At least 2 buckets: the nodes after them start 8-aligned.
    let buckets = cap.next_power_of_two().max(2);
    let len = std::mem::size_of::<Header>()
        + buckets as usize * 4
        + cap as usize * std::mem::size_of::<Node>();
    let p = crate::runtime::shared_mem::map(len, true)?;
    let r = Region {
        name: name.to_string(),
        dir: Default::default(),
        levels: Vec::new(),
        bytes,
        base: p.as_ptr(),
        len,
        cap,
        buckets,
    };
    // The mapping is zero-filled: no key, no free list, every node fresh.
    Ok(r)
}

impl Region {
    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (page-aligned, so aligned), zero-filled
        // at first (valid atomics), and lives as long as `self`.
        unsafe { &*self.base.cast::<Header>() }
    }

    fn bucket(&self, i: u32) -> &AtomicU32 {
        debug_assert!(i < self.buckets);
        // SAFETY: the bucket array follows the header (64-byte aligned, so 4-aligned) and
        // holds `buckets` words; `i` is masked below `buckets` by the callers.
        unsafe {
            &*self
                .base
                .add(std::mem::size_of::<Header>())
                .cast::<AtomicU32>()
                .add(i as usize)
        }
    }

    fn node(&self, i: u32) -> &Node {
        assert!(i < self.cap);
        let at = std::mem::size_of::<Header>() + self.buckets as usize * 4;
        // SAFETY: the node array follows the buckets (8-aligned: the header is 64 bytes,
        // the buckets an even number of 4-byte words), holds `cap` nodes (see `map`),
        // zero-filled at first (valid atomics), and `i < cap` is asserted.
        unsafe { &*self.base.add(at).cast::<Node>().add(i as usize) }
    }

    /// How many keys the zone holds at most.
    pub fn capacity(&self) -> usize {
        self.cap as usize
    }

    /// Take the lock (spinning, then yielding: the sections are short).
    pub fn lock(&self) -> Guard<'_> {
        let me = pid();
        let word = &self.header().lock;
        let mut spins = 0u32;
        while word.compare_exchange_weak(0, me, Acquire, Relaxed).is_err() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Guard { r: self }
    }

    /// Try to be (or stay) the zone's manager for config generation `gen`: the lease is
    /// taken when free, when its holder is gone, or when it holds an older config's.
    pub fn lease(&self, gen: u64) -> bool {
        let me = std::process::id() as u64;
        let want = (gen << 32) | me;
        let lease = &self.header().manager;
        let cur = lease.load(Acquire);
        if cur == want {
            return true;
        }
        let (holder, held_gen) = (cur & 0xffff_ffff, cur >> 32);
        let free = cur == 0 || held_gen < gen || !alive(holder as libc::pid_t);
        free && lease.compare_exchange(cur, want, AcqRel, Acquire).is_ok()
    }

    pub fn loaded(&self) -> bool {
        self.header().loaded.load(Acquire) != 0
    }

    pub fn set_loaded(&self) {
        self.header().loaded.store(1, Release);
    }
}

fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH))
}

/// A worker process ended: the master frees what it held in every zone (the lock, the
/// manager's lease, its fetches, which nobody would end), as nginx's master force-unlocks
/// a dead worker's mutexes.
pub fn child_died(pid: libc::pid_t) {
    if pid <= 0 || pid as u32 == std::process::id() {
        // Worker threads of the master's own process (`master_process off`).
        return;
    }
    let all = REGIONS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for r in all {
        let h = r.header();
        let _ = h.lock.compare_exchange(pid as u32, 0, Release, Relaxed);
        let lease = h.manager.load(Relaxed);
        if lease & 0xffff_ffff == pid as u64 {
            let _ = h.manager.compare_exchange(lease, 0, Release, Relaxed);
        }
        let g = r.lock();
        // The nodes ever used (the others' pages stay untouched).
        for i in 0..h.fresh.load(Relaxed).min(r.cap) {
            let n = r.node(i);
            if n.fetch.load(Relaxed) >> 32 == pid as u64 {
                n.fetch.store(0, Relaxed);
            }
        }
        drop(g);
    }
}

/// This process's id, without a `getpid` system call per lock (each cache hit takes the
/// lock): remembered, and forgotten in a child made by `fork` (the worker processes).
pub fn pid() -> u32 {
    static PID: AtomicU32 = AtomicU32::new(0);
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget() {
        PID.store(0, Relaxed);
    }
    let p = PID.load(Relaxed);
    if p != 0 {
        return p;
    }
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic, which is
        // async-signal-safe as a fork child handler must be.
        unsafe { libc::pthread_atfork(None, None, Some(forget)) };
    });
    let p = std::process::id();
    PID.store(p, Relaxed);
    p
}

/// Milliseconds of the monotonic clock, which every process reads alike.
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into `ts`, valid for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn words(h: &Hash) -> [u64; 2] {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&h[..8]);
    b.copy_from_slice(&h[8..]);
    [u64::from_ne_bytes(a), u64::from_ne_bytes(b)]
}

fn unwords(w: [u64; 2]) -> Hash {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&w[0].to_ne_bytes());
    h[8..].copy_from_slice(&w[1].to_ne_bytes());
    h
}

/// The zone, locked.
pub struct Guard<'a> {
    r: &'a Region,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.r.header().lock.store(0, Release);
    }
}

/// A key's node, as the lock holder sees it.
#[derive(Debug, Clone, Copy)]
pub struct Slot(u32);

/// No node could be had: every one is in use by a fetch.
#[derive(Debug)]
pub struct Full;

impl Guard<'_> {
    fn n(&self, s: Slot) -> &Node {
        self.r.node(s.0)
    }

    fn bucket_of(&self, h: &Hash) -> &AtomicU32 {
        let w = words(h);
        self.r.bucket((w[0] as u32) & (self.r.buckets - 1))
    }

    pub fn find(&self, h: &Hash) -> Option<Slot> {
        let w = words(h);
        let mut at = self.bucket_of(h).load(Relaxed);
        while at != NONE {
            let n = self.r.node(at - 1);
            if n.hash[0].load(Relaxed) == w[0] && n.hash[1].load(Relaxed) == w[1] {
                return Some(Slot(at - 1));
            }
            at = n.chain.load(Relaxed);
        }
        None
    }

    /// The node of `h`, made if new: a full zone gives up its least recently used nodes
    /// no fetch is under way for (their hashes go to `evicted`, whose files are to go).
    pub fn get_or_insert(
        &mut self,
        h: &Hash,
        evicted: &mut Vec<(Hash, u64)>,
    ) -> Result<Slot, Full> {
        if let Some(s) = self.find(h) {
            return Ok(s);
        }
        let hd = self.r.header();
        if hd.free.load(Relaxed) == NONE && hd.fresh.load(Relaxed) >= self.r.cap {
            // nginx's forced expiry: the oldest unused ones, a few at once.
            let mut at = hd.tail.load(Relaxed);
            let mut tries = 0;
            while at != NONE && evicted.len() < 2 && tries < 20 {
                let prev = self.r.node(at - 1).prev.load(Relaxed);
                if self.r.node(at - 1).fetch.load(Relaxed) == 0 {
                    let s = Slot(at - 1);
                    evicted.push((self.hash(s), self.size(s)));
                    self.remove(s);
                }
                at = prev;
                tries += 1;
            }
        }
        let free = hd.free.load(Relaxed);
        let s = if free != NONE {
            let s = Slot(free - 1);
            hd.free.store(self.n(s).chain.load(Relaxed), Relaxed);
            s
        } else {
            let fresh = hd.fresh.load(Relaxed);
            if fresh >= self.r.cap {
                return Err(Full);
            }
            hd.fresh.store(fresh + 1, Relaxed);
            Slot(fresh)
        };
        let n = self.n(s);
        let w = words(h);
        n.hash[0].store(w[0], Relaxed);
        n.hash[1].store(w[1], Relaxed);
        for f in [&n.size, &n.fetch, &n.fetch_since] {
            f.store(0, Relaxed);
        }
        n.uses.store(0, Relaxed);
        n.version.store(self.next_version(), Relaxed);
        n.last.store(now_ms(), Relaxed);
        let b = self.bucket_of(h);
        n.chain.store(b.load(Relaxed), Relaxed);
        b.store(s.0 + 1, Relaxed);
        self.link_front(s);
        hd.count.fetch_add(1, Relaxed);
        Ok(s)
    }

    fn link_front(&self, s: Slot) {
        let hd = self.r.header();
        let n = self.n(s);
        let head = hd.head.load(Relaxed);
        n.prev.store(NONE, Relaxed);
        n.next.store(head, Relaxed);
        if head != NONE {
            self.r.node(head - 1).prev.store(s.0 + 1, Relaxed);
        } else {
            hd.tail.store(s.0 + 1, Relaxed);
        }
        hd.head.store(s.0 + 1, Relaxed);
    }

    fn unlink(&self, s: Slot) {
        let hd = self.r.header();
        let n = self.n(s);
        let (p, x) = (n.prev.load(Relaxed), n.next.load(Relaxed));
        if p != NONE {
            self.r.node(p - 1).next.store(x, Relaxed);
        } else {
            hd.head.store(x, Relaxed);
        }
        if x != NONE {
            self.r.node(x - 1).prev.store(p, Relaxed);
        } else {
            hd.tail.store(p, Relaxed);
        }
    }

    /// The key was used now: first in the LRU list, and counted if `count`; its uses.
    pub fn touch(&mut self, s: Slot, count: bool) -> u64 {
        let n = self.n(s);
        n.last.store(now_ms(), Relaxed);
        self.unlink(s);
        self.link_front(s);
        u64::from(n.uses.fetch_add(u32::from(count), Relaxed)) + u64::from(count)
    }

    /// Forget a key (its file is the caller's to remove, outside the lock).
    pub fn remove(&mut self, s: Slot) {
        let h = self.hash(s);
        let size = self.size(s);
        self.set_size_total(self.total().saturating_sub(size));
        // Off its bucket's chain.
        let b = self.bucket_of(&h);
        let mut at = b.load(Relaxed);
        let mut prev: Option<u32> = None;
        while at != NONE {
            let next = self.r.node(at - 1).chain.load(Relaxed);
            if at - 1 == s.0 {
                match prev {
                    None => b.store(next, Relaxed),
                    Some(p) => self.r.node(p - 1).chain.store(next, Relaxed),
                }
                break;
            }
            prev = Some(at);
            at = next;
        }
        self.unlink(s);
        let hd = self.r.header();
        self.n(s).chain.store(hd.free.load(Relaxed), Relaxed);
        hd.free.store(s.0 + 1, Relaxed);
        hd.count.fetch_sub(1, Relaxed);
    }

    pub fn hash(&self, s: Slot) -> Hash {
        let n = self.n(s);
        unwords([n.hash[0].load(Relaxed), n.hash[1].load(Relaxed)])
    }

    pub fn size(&self, s: Slot) -> u64 {
        self.n(s).size.load(Relaxed)
    }

    /// The version of the key's entry: another one once its file may have changed.
    pub fn version(&self, s: Slot) -> u64 {
        self.n(s).version.load(Relaxed)
    }

    /// The key's entry file changed (stored anew, removed, rewritten in place).
    pub fn changed(&mut self, s: Slot) {
        self.n(s).version.store(self.next_version(), Relaxed);
    }

    fn next_version(&self) -> u64 {
        self.r.header().versions.fetch_add(1, Relaxed) + 1
    }

    /// Set the entry's size, keeping the total; the entry is another one now.
    pub fn set_size(&mut self, s: Slot, size: u64) {
        self.changed(s);
        let old = self.n(s).size.swap(size, Relaxed);
        self.set_size_total(self.total().saturating_sub(old) + size);
    }

    pub fn total(&self) -> u64 {
        self.r.header().size.load(Relaxed)
    }

    fn set_size_total(&self, v: u64) {
        self.r.header().size.store(v, Relaxed);
    }

    pub fn count(&self) -> usize {
        self.r.header().count.load(Relaxed) as usize
    }

    /// Milliseconds since the key's last use.
    pub fn idle_ms(&self, s: Slot, now: u64) -> u64 {
        now.saturating_sub(self.n(s).last.load(Relaxed))
    }

    /// The fetch under way: its token and start (ms), if any.
    pub fn fetch(&self, s: Slot) -> Option<(u64, u64)> {
        let n = self.n(s);
        let t = n.fetch.load(Relaxed);
        (t != 0).then(|| (t, n.fetch_since.load(Relaxed)))
    }

    pub fn set_fetch(&mut self, s: Slot, token: u64) {
        let n = self.n(s);
        n.fetch.store(token, Relaxed);
        n.fetch_since.store(now_ms(), Relaxed);
    }

    pub fn clear_fetch(&mut self, s: Slot) {
        self.n(s).fetch.store(0, Relaxed);
    }

    /// The nodes from the least recently used on.
    pub fn oldest_first(&self) -> impl Iterator<Item = Slot> + '_ {
        let mut at = self.r.header().tail.load(Relaxed);
        std::iter::from_fn(move || {
            if at == NONE {
                return None;
            }
            let s = Slot(at - 1);
            at = self.n(s).prev.load(Relaxed);
            Some(s)
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn full_zone_evicts_the_least_recently_used() {
        let r = super::map("t", 4 * super::NODE_SHARE).unwrap();
        assert_eq!(r.capacity(), 4);
        let mut g = r.lock();
        let mut ev = Vec::new();
        for i in 0..4u8 {
            let s = g.get_or_insert(&[i; 16], &mut ev).unwrap();
            g.set_size(s, 10);
        }
        assert!(ev.is_empty());
        assert_eq!(g.total(), 40);
        let s0 = g.find(&[0; 16]).unwrap();
        g.touch(s0, true);
        let s = g.get_or_insert(&[9; 16], &mut ev).unwrap();
        // Keys 1 and 2 were the oldest.
        let gone: Vec<u8> = ev.iter().map(|(h, _)| h[0]).collect();
        assert_eq!(gone, vec![1, 2]);
        assert_eq!(g.count(), 3);
        assert_eq!(g.total(), 20);
        assert!(g.find(&[0; 16]).is_some() && g.find(&[1; 16]).is_none());
        g.set_fetch(s, 7);
        let order: Vec<u8> = g.oldest_first().map(|s| g.hash(s)[0]).collect();
        assert_eq!(order, vec![3, 0, 9]);
        // Every node fetching: none can be given up.
        ev.clear();
        for h in [3u8, 0] {
            let s = g.find(&[h; 16]).unwrap();
            g.set_fetch(s, 8);
        }
        let s = g.get_or_insert(&[10; 16], &mut ev).unwrap();
        g.set_fetch(s, 9);
        assert!(ev.is_empty());
        assert!(g.get_or_insert(&[11; 16], &mut ev).is_err());
        assert!(ev.is_empty());
    }

    #[test]
    fn a_key_changes_version_whenever_its_entry_may_have() {
        let r = super::map("v", 4 * super::NODE_SHARE).unwrap();
        let mut g = r.lock();
        let mut ev = Vec::new();
        let a = g.get_or_insert(&[1; 16], &mut ev).unwrap();
        let b = g.get_or_insert(&[2; 16], &mut ev).unwrap();
        let v = g.version(a);
        assert_ne!(v, g.version(b));
        // A lookup (touch) is no change.
        g.touch(a, true);
        assert_eq!(g.version(a), v);
        // Stored, purged (size 0), rewritten in place: each a new version.
        g.set_size(a, 10);
        let stored = g.version(a);
        assert_ne!(stored, v);
        g.set_size(a, 0);
        let purged = g.version(a);
        assert_ne!(purged, stored);
        g.changed(a);
        assert_ne!(g.version(a), purged);
        // Forgotten and made again: not any version it had before.
        let before = [v, stored, purged, g.version(a)];
        g.remove(a);
        let again = g.get_or_insert(&[1; 16], &mut ev).unwrap();
        assert!(!before.contains(&g.version(again)));
    }
}
