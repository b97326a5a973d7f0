//! The keys zone's use: counting lookups, the one fetch of a key under way, and the manager
//! that enforces `inactive` and `max_size`. What is known of the keys is in shared memory
//! ([`super::shm`]), the same for every worker process, as nginx's keys zone: uses for
//! `*_cache_min_uses` count across processes, `*_cache_lock` makes one fetch of a key
//! whatever process the requests land on, and `max_size` is accounted once.
//!
//! A fetch is marked in the key's node by a token naming its process. Requests waiting
//! for a fetch of their own process are woken by a tokio `Notify` kept here, per process,
//! by token; those waiting for another process's fetch re-check the node every 50 ms
//! (nginx's `ngx_http_file_cache_lock_wait` re-checks every 500 ms).
//!
//! The manager runs in one process at a time (each worker process has a thread ready for
//! it; the one holding the zone's lease works, a newer config's process takes the lease
//! over, and a dead holder's is freed): every second it removes the entries not used for
//! `inactive` and, while the entries take more than `max_size` or the file system has less
//! than `min_free` free, the least recently used, in rounds paced by `manager_*`.
//! Before that, once per zone (not again after a reload that keeps the zone), it walks the
//! folder to learn the entries already there (nginx's cache loader, paced by `loader_*`).
//! Files are removed outside the zone's lock.

use super::key::Hash;
use super::path::Zone;
use super::shm;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// This process's fetches by token; foldhash, not SipHash: each miss inserts and removes
/// one (SipHash took about 200 instructions of it; docs/bench/cache-report.md).
type Fetches = HashMap<u64, Arc<Notify>, foldhash::fast::RandomState>;

/// What a worker process keeps of a zone for itself: the signals of its own fetches, and
/// its manager thread.
#[derive(Debug)]
pub struct Local {
    fetches: Mutex<Fetches>,
    manager: Once,
}

/// What a lookup learned of its key.
pub struct Seen {
    /// Lookups of the key while the zone remembered it, this one included.
    pub uses: u64,
    /// A fetch of the key under way: its token and its age.
    pub fetching: Option<(u64, Duration)>,
    /// The version of the key's entry (see `shm::Guard::version`).
    pub version: u64,
    /// The key may have an entry file: one was stored (or found by the loader), or the
    /// loader has not counted the folder's entries yet. Every entry written, found or
    /// removed is accounted in the zone, so a key without one has no file to open.
    pub on_disk: bool,
}

/// The fetch of a key under way; dropping it (the entry stored, or given up) lets the
/// requests waiting for it go on.
#[derive(Debug)]
pub struct Fetching {
    zone: Arc<Zone>,
    hash: Hash,
    token: u64,
    notify: Arc<Notify>,
}

impl Drop for Fetching {
    fn drop(&mut self) {
        let mut g = self.zone.shm.lock();
        if let Some(s) = g.find(&self.hash) {
            if g.fetch(s).is_some_and(|(t, _)| t == self.token) {
                g.clear_fetch(s);
            }
        }
        drop(g);
        self.zone.local.lock().remove(&self.token);
        self.notify.notify_waiters();
    }
}

impl Default for Local {
    fn default() -> Self {
        Local {
            fetches: Mutex::default(),
            manager: Once::new(),
        }
    }
}

impl Local {
    fn lock(&self) -> std::sync::MutexGuard<'_, Fetches> {
        self.fetches.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The zone had no room for the key, even after forgetting the least recently used.
#[derive(Debug)]
pub struct NoRoom;

/// Look `h` up (counting a use if `count`: once per request, as nginx counts the first
/// lookup only) and say whether a fetch of it is under way.
pub fn look(zone: &Arc<Zone>, h: &Hash, count: bool) -> Result<Seen, NoRoom> {
    start_manager(zone);
    let mut evicted = Vec::new();
    let mut g = zone.shm.lock();
    let s = match g.get_or_insert(h, &mut evicted) {
        Ok(s) => s,
        Err(shm::Full) => {
            drop(g);
            remove_files(zone, evicted);
            crate::errlog::log(
                crate::errlog::Level::Alert,
                format_args!(
                    "could not allocate node in cache keys zone \"{}\"",
                    zone.name
                ),
            );
            return Err(NoRoom);
        }
    };
    let uses = g.touch(s, count);
    let version = g.version(s);
    let on_disk = g.size(s) > 0 || !zone.shm.loaded();
    let fetching = g.fetch(s).map(|(t, since)| {
        let now = shm::now_ms();
        (t, Duration::from_millis(now.saturating_sub(since)))
    });
    drop(g);
    if !evicted.is_empty() {
        remove_files(zone, evicted);
    }
    Ok(Seen {
        uses,
        fetching,
        version,
        on_disk,
    })
}

static SEQ: AtomicU64 = AtomicU64::new(1);

/// Mark a fetch of `h` as under way, if the fetch under way is still the one the lookup
/// saw (`seen`: none, or one it may run beside: past `*_cache_lock_age`, or without the
/// lock); `None` if another request began one meanwhile (the lookup is to be done again).
/// The fetch lasts while the returned value lives.
pub fn begin_fetch(zone: &Arc<Zone>, h: &Hash, seen: Option<u64>) -> Option<Fetching> {
    let token = (u64::from(shm::pid()) << 32) | (SEQ.fetch_add(1, Relaxed) & 0xffff_ffff);
    let notify = Arc::new(Notify::new());
    // Registered first: a waiter that sees the token finds its signal.
    zone.local.lock().insert(token, notify.clone());
    let mut g = zone.shm.lock();
    if let Some(s) = g.find(h) {
        if g.fetch(s).map(|(t, _)| t) != seen {
            drop(g);
            zone.local.lock().remove(&token);
            return None;
        }
        g.set_fetch(s, token);
    }
    Some(Fetching {
        zone: zone.clone(),
        hash: *h,
        token,
        notify,
    })
}

/// An entry of `size` bytes was stored (or found on disk) for `h`.
pub fn stored(zone: &Arc<Zone>, h: &Hash, size: u64) {
    let mut evicted = Vec::new();
    let mut g = zone.shm.lock();
    if let Ok(s) = g.get_or_insert(h, &mut evicted) {
        g.set_size(s, size);
    }
    drop(g);
    remove_files(zone, evicted);
}

/// Whether the fetch under way for `h` is still the one of `token`.
pub fn fetching_with(zone: &Zone, h: &Hash, token: u64) -> bool {
    let g = zone.shm.lock();
    g.find(h)
        .and_then(|s| g.fetch(s))
        .is_some_and(|(t, _)| t == token)
}

/// Wait until the fetch `token` of `h` ends; false if `timeout` passed first.
pub async fn wait(zone: &Zone, h: &Hash, token: u64, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    let mine = token >> 32 == u64::from(shm::pid());
    let local = mine
        .then(|| zone.local.lock().get(&token).cloned())
        .flatten();
    if let Some(signal) = local {
        // A fetch of this process: woken as soon as it ends.
        let notified = signal.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        if !fetching_with(zone, h, token) {
            return true;
        }
        return tokio::time::timeout_at(deadline, notified).await.is_ok();
    }
    // Another process's: no signal reaches here, the node is looked at again.
    const POLL: Duration = Duration::from_millis(50);
    loop {
        if !fetching_with(zone, h, token) {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep_until(deadline.min(now + POLL)).await;
    }
}

/// Remove the files of forgotten keys, off the event loop (a slow disk must not stall it).
fn remove_files(zone: &Zone, gone: Vec<(Hash, u64)>) {
    let files: Vec<_> = gone
        .iter()
        .filter(|(_, size)| *size > 0)
        .map(|(h, _)| zone.file(h))
        .collect();
    if files.is_empty() {
        return;
    }
    super::entry::off_loop(move || {
        for f in files {
            let _ = std::fs::remove_file(f);
        }
    });
}

fn start_manager(zone: &Arc<Zone>) {
    zone.local.manager.call_once(|| {
        let weak = Arc::downgrade(zone);
        let spawned = std::thread::Builder::new()
            .name(format!("cache manager {}", zone.name))
            .spawn(move || manage(weak));
        if let Err(e) = spawned {
            crate::errlog::error(format_args!("cache manager for \"{}\": {e}", zone.name));
        }
    });
}

/// The manager's loop; it ends with its zone (a reload made new ones). A round that had
/// more to remove than its `manager_files` or `manager_threshold` allowed is followed by
/// another after `manager_sleep`, else after a second.
fn manage(weak: Weak<Zone>) {
    loop {
        let Some(zone) = weak.upgrade() else { return };
        let mut pause = Duration::from_secs(1);
        if zone.shm.lease(zone.gen) {
            if !zone.shm.loaded() {
                drop(zone);
                if !load(&weak) {
                    return;
                }
                continue;
            }
            let started = std::time::Instant::now();
            let (gone, more) = expire(&zone, started);
            for h in gone {
                let _ = std::fs::remove_file(zone.file(&h));
            }
            if more {
                pause = zone.manager.sleep;
            }
        }
        drop(zone);
        std::thread::sleep(pause);
    }
}

/// The keys not used for `inactive`, then the least recently used while the entries take
/// more than `max_size` or the file system has less than `min_free` free (as nginx's
/// manager, which removes entries until both hold): forgotten, their files to be removed;
/// at most `manager_files` of them, chosen within `manager_threshold` of `started`, and
/// whether there were more.
fn expire(zone: &Zone, started: std::time::Instant) -> (Vec<Hash>, bool) {
    let pace = zone.manager;
    let now = shm::now_ms();
    let inactive = zone.inactive.as_millis() as u64;
    // What the entries to go must free for `min_free` (their sizes, not the blocks they
    // take: the next round, a second later, sees what their removal gave back).
    let mut short = zone
        .min_free
        .and_then(|m| Some(m.saturating_sub(available(&zone.dir)?)))
        .unwrap_or(0);
    let mut g = zone.shm.lock();
    let mut gone = Vec::new();
    let mut drop_list = Vec::new();
    let mut total = g.total();
    let mut more = false;
    for s in g.oldest_first() {
        if g.fetch(s).is_some() {
            continue;
        }
        // At least one a round, as nginx's manager, whatever the threshold.
        if drop_list.len() as u64 >= pace.files.max(1)
            || (!drop_list.is_empty() && started.elapsed() >= pace.threshold)
        {
            more = true;
            break;
        }
        let idle = g.idle_ms(s, now) >= inactive;
        let over = (zone.max_size.is_some_and(|m| total > m) || short > 0) && g.size(s) > 0;
        if !idle && !over {
            // The list is oldest first: the rest are neither idle nor needed.
            if zone.max_size.is_none_or(|m| total <= m) && short == 0 {
                break;
            }
            continue;
        }
        total = total.saturating_sub(g.size(s));
        short = short.saturating_sub(g.size(s));
        drop_list.push(s);
    }
    // (`more` may be set by a key the loop would have left: the next round, sooner, finds
    // nothing and waits its second again.)
    for s in drop_list {
        if g.size(s) > 0 {
            gone.push(g.hash(s));
        }
        g.remove(s);
    }
    (gone, more)
}

/// The bytes an unprivileged user may still write on the file system of `dir`, as
/// nginx's `ngx_fs_available` (`None`: not known, nothing is removed for it).
fn available(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string alive for the call, `st` a buffer of the
    // struct statvfs writes; it is read only when the call succeeded.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// nginx's cache loader: the entries already in the folder (from before a restart) join
/// the zone, so that `max_size` and `inactive` count them; `loader_files` of them at a
/// time (or what `loader_threshold` allows), `loader_sleep` between. False if the zone
/// went meanwhile (a reload made new ones) or its lease did.
fn load(weak: &Weak<Zone>) -> bool {
    let Some((dir, depth, pace)) = weak
        .upgrade()
        .map(|z| (z.dir.clone(), z.levels.len(), z.loader))
    else {
        return false;
    };
    let mut batch = Vec::new();
    let mut started = std::time::Instant::now();
    let mut zone_gone = false;
    walk(&dir, depth, &mut |h, size| {
        batch.push((h, size));
        if (batch.len() as u64) < pace.files.max(1) && started.elapsed() < pace.threshold {
            return true;
        }
        let Some(zone) = weak.upgrade().filter(|z| z.shm.lease(z.gen)) else {
            // The zone went (a reload made new ones), or a newer config's manager took
            // the lease over: it loads the folder itself.
            zone_gone = true;
            return false;
        };
        let room = add(&zone, &batch);
        batch.clear();
        drop(zone);
        if room {
            std::thread::sleep(pace.sleep);
            started = std::time::Instant::now();
        }
        room
    });
    if zone_gone {
        return false;
    }
    let Some(zone) = weak.upgrade() else {
        return false;
    };
    add(&zone, &batch);
    zone.shm.set_loaded();
    true
}

/// Entries the loader found join the zone; false once it is full.
fn add(zone: &Zone, found: &[(Hash, u64)]) -> bool {
    let mut g = zone.shm.lock();
    for (h, size) in found {
        if let Some(s) = g.find(h) {
            // A key looked up before the loader came to it: its file counts too (else
            // lookups, which open no file for a key without one, would never find it).
            if g.size(s) == 0 {
                g.set_size(s, *size);
            }
            continue;
        }
        if g.count() >= zone.shm.capacity() {
            return false;
        }
        let mut none = Vec::new();
        if let Ok(s) = g.get_or_insert(h, &mut none) {
            g.set_size(s, *size);
        }
    }
    true
}

/// Each entry file under `dir` (`depth` levels of folders) with its size, to `found`,
/// until it returns false.
fn walk(dir: &std::path::Path, depth: usize, found: &mut dyn FnMut(Hash, u64) -> bool) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return true;
    };
    for e in rd.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if depth > 0 {
            if meta.is_dir() && !walk(&e.path(), depth - 1, found) {
                return false;
            }
            continue;
        }
        if let Some(h) = e.file_name().to_str().and_then(parse_hex) {
            if meta.is_file() && !found(h, meta.len()) {
                return false;
            }
        }
    }
    true
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
/// `h`'s entry file was rewritten in place (a revalidation made it fresh again): copies of
/// it kept in memory are not to be used.
pub fn changed(zone: &Zone, h: &Hash) {
    let mut g = zone.shm.lock();
    if let Some(s) = g.find(h) {
        g.changed(s);
    }
}

/// A purge removed `h`'s file: its size no longer counts (the key stays known, with the
/// fetch that may be under way for it).
pub fn forget(zone: &Zone, h: &Hash) {
    let mut g = zone.shm.lock();
    if let Some(s) = g.find(h) {
        g.set_size(s, 0);
    }
}

/// What the entries of the zone take, and how many they are (the metrics' gauges); the
/// manager starts if it had not, so that the loader counts the entries on disk.
pub fn usage(zone: &Arc<Zone>) -> (u64, usize) {
    start_manager(zone);
    let g = zone.shm.lock();
    let entries = g.oldest_first().filter(|&s| g.size(s) > 0).count();
    (g.total(), entries)
}

/// Every entry file in the zone's folder (its hash), as the loader finds them.
pub fn on_disk(zone: &Zone) -> Vec<Hash> {
    let mut found = Vec::new();
    walk(&zone.dir, zone.levels.len(), &mut |h, _| {
        found.push(h);
        true
    });
    found
}
