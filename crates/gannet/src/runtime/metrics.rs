//! The counters behind the `metrics` page (Prometheus): per server zone, upstream peer and
//! limit zone, for the whole server, every worker thread of every worker process and the
//! draining generations of a reload included.
//!
//! Same design as `conn_stats`: the master maps one shared anonymous region before it forks
//! ([`init`]); each worker thread claims a slot there and is its only writer, so counting
//! is a plain load and store into memory no other thread writes (no locked instruction,
//! no allocation, no lookup); a scrape sums the slots. Counters of a thread that ends move
//! to the retired slot 0, so totals only grow across reloads, as Prometheus wants.
//!
//! What is counted is named by a key: a (kind, name) pair registered in a table in the
//! same region, so that every process gives the same name the same index. Keys are
//! registered while a config loads (server and limit zones) or when first seen (upstream
//! peers); a key is never removed, so a series does not vanish after a reload.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Keys in the table; index 0 holds the server-wide counters ([`GLOBAL`]).
pub const KEYS: usize = 256;
/// Counters per key.
pub const PER_KEY: usize = 24;
/// Worker threads alive at once across all generations; slot 0 is the retired one.
const SLOTS: usize = 128;
/// The longest name kept (longer ones are cut at a character boundary).
const NAME_WORDS: usize = 16;

/// What a key counts; the label set it is shown with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    Server = 1,
    Peer = 2,
    LimitReq = 3,
    LimitConn = 4,
    /// A cache's keys zone (`*_cache_path`).
    Cache = 5,
}

impl Kind {
    fn of(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Server,
            2 => Kind::Peer,
            3 => Kind::LimitReq,
            4 => Kind::LimitConn,
            5 => Kind::Cache,
            _ => return None,
        })
    }
}

/// A registered key: its index in the table (0: none, nothing is counted).
pub type Key = u16;

/// The server-wide counters, at key 0.
pub const GLOBAL: Key = 0;
pub mod global {
    pub const TLS12: usize = 0;
    pub const TLS13: usize = 1;
    pub const TLS_OTHER: usize = 2;
    pub const TLS_RESUMED: usize = 3;
    pub const TLS_FAILED: usize = 4;
    pub const H2_STREAMS: usize = 5;
    /// Gauge: idle client connections parked out of their tasks.
    pub const PARKED: usize = 6;
}

/// Counters of a server zone or upstream peer: the answers by status class (1xx..5xx) at
/// 0..5, then these, then the duration histogram's buckets ([`BUCKETS`] and +Inf).
pub mod zone {
    /// Server zone: bytes received; peer: attempts.
    pub const IN: usize = 5;
    /// Server zone: bytes sent; peer: failed attempts (no answer head).
    pub const OUT: usize = 6;
    /// Sum of the durations, microseconds.
    pub const TIME_US: usize = 7;
    pub const BUCKET0: usize = 8;
    /// Gauges of an upstream peer: connections in use, and kept idle in the pool.
    pub const ACTIVE: usize = 20;
    pub const IDLE: usize = 21;
}

/// Counters at these indexes are gauges: they go up and down, and a thread that ends takes
/// its share with it (its connections are gone) rather than leaving it to the retired slot.
fn is_gauge(key: usize, i: usize) -> bool {
    if key == GLOBAL as usize {
        i == global::PARKED
    } else {
        i >= zone::ACTIVE
    }
}

/// Counters of a limit zone.
pub mod limit {
    pub const PASSED: usize = 0;
    pub const DELAYED: usize = 1;
    pub const REJECTED: usize = 2;
    pub const DELAYED_DRY_RUN: usize = 3;
    pub const REJECTED_DRY_RUN: usize = 4;
}

/// Counters of a cache's keys zone: the lookups by `$upstream_cache_status` at the
/// status's index (`cache::Status::ALL`), then these.
pub mod cache {
    pub const PURGED: usize = 7;
}

/// Upper bounds of the duration histogram buckets, as Prometheus writes them, and in
/// microseconds. The last bucket (+Inf) follows them.
pub const BUCKETS: [(&str, u64); 11] = [
    ("0.005", 5_000),
    ("0.01", 10_000),
    ("0.025", 25_000),
    ("0.05", 50_000),
    ("0.1", 100_000),
    ("0.25", 250_000),
    ("0.5", 500_000),
    ("1.0", 1_000_000),
    ("2.5", 2_500_000),
    ("5.0", 5_000_000),
    ("10.0", 10_000_000),
];
const _: () = assert!(zone::BUCKET0 + BUCKETS.len() < zone::ACTIVE && zone::IDLE < PER_KEY);

/// One registered name.
#[repr(C)]
struct Entry {
    /// 0 free, 1 being written, 2 ready.
    state: AtomicU32,
    kind: AtomicU32,
    len: AtomicU32,
    name: [AtomicU64; NAME_WORDS],
    /// A value set rather than counted (an upstream peer's state), the same for all.
    gauge: AtomicU64,
}

/// One worker thread's counters.
#[repr(C, align(64))]
struct Slot {
    taken: AtomicU32,
    c: [AtomicU64; KEYS * PER_KEY],
}

#[repr(C)]
struct Region {
    keys: [Entry; KEYS],
    slots: [Slot; SLOTS],
}

fn region() -> &'static Region {
    static REGION: OnceLock<&'static Region> = OnceLock::new();
    REGION.get_or_init(|| {
        let len = std::mem::size_of::<Region>();
        use crate::runtime::shared_mem::map;
        let p = map(len, true).unwrap_or_else(|e| {
            crate::errlog::warn(format_args!("no shared memory for metrics: {e}"));
            // This process's own counters, then: the page is private.
            map(len, false).expect("no memory for metrics")
        });
        // SAFETY: the mapping is page-aligned (more than Region's 64), `len` bytes long,
        // zero filled (a valid Region: atomics of 0) and never unmapped, so it lives for
        // 'static; it is only accessed through atomics, also by the other processes.
        unsafe { &*p.as_ptr().cast::<Region>() }
    })
}

/// Map the shared region now: the master calls it before the first fork. Pages are only
/// backed by memory once touched, so an unused region costs address space only.
pub fn init() {
    region();
}

/// A name made of `parts` joined by a tab (the labels of a key with two), cut to what an
/// entry holds at a character boundary: (bytes, length).
fn fit(parts: &[&str]) -> ([u8; NAME_WORDS * 8], usize) {
    let mut buf = [0u8; NAME_WORDS * 8];
    let mut n = 0;
    for (i, part) in parts.iter().enumerate() {
        let sep = if i > 0 { "\t" } else { "" };
        for ch in sep.chars().chain(part.chars()) {
            let mut b = [0u8; 4];
            let e = ch.encode_utf8(&mut b).as_bytes();
            if n + e.len() > buf.len() {
                return (buf, n);
            }
            buf[n..n + e.len()].copy_from_slice(e);
            n += e.len();
        }
    }
    (buf, n)
}

fn hash(kind: Kind, name: &[u8]) -> usize {
    // FNV-1a: only spreads names over the table; collisions are probed past.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ kind as u64;
    for &b in name {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h as usize
}

fn read_name(e: &Entry, buf: &mut [u8; NAME_WORDS * 8]) -> usize {
    for (i, w) in e.name.iter().enumerate() {
        buf[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    (e.len.load(Ordering::Relaxed) as usize).min(buf.len())
}

/// The key of `(kind, name)`, registering it if new; 0 when the table is full. Safe to
/// call from any process at once: an entry is claimed by compare-and-swap and published
/// once written.
pub fn key(kind: Kind, name: &str) -> Key {
    key_of(kind, &[name])
}

/// The key of a name with two labels (an upstream group and one of its servers).
pub fn key2(kind: Kind, a: &str, b: &str) -> Key {
    key_of(kind, &[a, b])
}

fn key_of(kind: Kind, parts: &[&str]) -> Key {
    let (words, len) = fit(parts);
    let name = &words[..len];
    let keys = &region().keys;
    let start = hash(kind, name);
    let mut buf = [0u8; NAME_WORDS * 8];
    for probe in 0..KEYS - 1 {
        let i = 1 + (start + probe) % (KEYS - 1);
        let e = &keys[i];
        loop {
            match e.state.load(Ordering::Acquire) {
                2 => {
                    let n = read_name(e, &mut buf);
                    if e.kind.load(Ordering::Relaxed) == kind as u32 && buf[..n] == *name {
                        return i as Key;
                    }
                    break;
                }
                0 => {
                    if e.state
                        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                        .is_err()
                    {
                        continue;
                    }
                    for (w, chunk) in e.name.iter().zip(words.chunks_exact(8)) {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(chunk);
                        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
                    }
                    e.len.store(name.len() as u32, Ordering::Relaxed);
                    e.kind.store(kind as u32, Ordering::Relaxed);
                    e.state.store(2, Ordering::Release);
                    return i as Key;
                }
                // Another process is writing this entry: it is done in a moment.
                _ => std::thread::yield_now(),
            }
        }
    }
    static FULL: std::sync::Once = std::sync::Once::new();
    FULL.call_once(|| {
        crate::errlog::warn(format_args!(
            "metrics: more than {} zones and peers, the rest are not counted",
            KEYS - 1
        ))
    });
    0
}

/// Set `key`'s shared gauge.
pub fn set_gauge(key: Key, v: u64) {
    if key != 0 {
        region().keys[key as usize]
            .gauge
            .store(v, Ordering::Relaxed);
    }
}

pub fn gauge(key: Key) -> u64 {
    region().keys[key as usize].gauge.load(Ordering::Relaxed)
}

/// Every registered key: (index, kind, name; two labels are joined by a tab).
pub fn registered() -> Vec<(Key, Kind, String)> {
    let mut out = Vec::new();
    let mut buf = [0u8; NAME_WORDS * 8];
    for (i, e) in region().keys.iter().enumerate().skip(1) {
        if e.state.load(Ordering::Acquire) != 2 {
            continue;
        }
        let Some(kind) = Kind::of(e.kind.load(Ordering::Relaxed)) else {
            continue;
        };
        let n = read_name(e, &mut buf);
        out.push((
            i as Key,
            kind,
            String::from_utf8_lossy(&buf[..n]).into_owned(),
        ));
    }
    out
}

thread_local! {
    /// The slot of this worker thread (`None` outside worker threads: nothing counted).
    static SLOT: Cell<Option<&'static Slot>> = const { Cell::new(None) };
}

/// A worker thread's claim on its slot; while it lives the thread's counts go there.
pub struct Claim(Option<&'static Slot>);

impl Claim {
    pub fn new() -> Claim {
        let slot = region().slots[1..].iter().find(|s| {
            s.taken
                .compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
        SLOT.with(|c| c.set(slot));
        Claim(slot)
    }
}

impl Drop for Claim {
    /// The thread ended: its counts move to the retired slot and the slot is free again.
    fn drop(&mut self) {
        SLOT.with(|c| c.set(None));
        let Some(s) = self.0 else {
            return;
        };
        let retired = &region().slots[0];
        for (n, (from, to)) in s.c.iter().zip(&retired.c).enumerate() {
            let v = from.swap(0, Ordering::Relaxed);
            if v != 0 && !is_gauge(n / PER_KEY, n % PER_KEY) {
                to.fetch_add(v, Ordering::Relaxed);
            }
        }
        s.taken.store(0, Ordering::Relaxed);
    }
}

/// Add `n` to counter `i` of `key` in this thread's slot. The thread is the slot's only
/// writer, so load-then-store loses nothing.
#[inline]
pub fn add(key: Key, i: usize, n: u64) {
    SLOT.with(|s| {
        if let Some(s) = s.get() {
            let c = &s.c[key as usize * PER_KEY + i];
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        }
    });
}

/// Move gauge `i` of `key` up or down in this thread's slot (nothing for key 0 unless it is
/// a server-wide gauge).
#[inline]
pub fn gauge_add(key: Key, i: usize, d: i64) {
    if key != GLOBAL || i == global::PARKED {
        add(key, i, d as u64);
    }
}

/// Gauge `i` of `key` summed over every slot. A slot may be read between two related
/// stores of its thread (a decrement summed before its increment): the sum is taken as
/// signed and never shown below 0.
pub fn gauge_total(key: Key, i: usize) -> u64 {
    (total(key, i) as i64).max(0) as u64
}

/// Count a duration in `key`'s histogram (sum and bucket).
#[inline]
pub fn observe(key: Key, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let b = BUCKETS
        .iter()
        .position(|&(_, le)| us <= le)
        .unwrap_or(BUCKETS.len());
    add(key, zone::TIME_US, us);
    add(key, zone::BUCKET0 + b, 1);
}

/// Counter `i` of `key` summed over every slot.
pub fn total(key: Key, i: usize) -> u64 {
    let at = key as usize * PER_KEY + i;
    region()
        .slots
        .iter()
        .fold(0u64, |t, s| t.wrapping_add(s.c[at].load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_counts_sum() {
        let a = key(Kind::Server, "metrics-unit-a");
        let b = key(Kind::Peer, "metrics-unit-a");
        assert_ne!(a, 0);
        assert_ne!(a, b);
        assert_eq!(key(Kind::Server, "metrics-unit-a"), a);
        assert!(registered()
            .iter()
            .any(|(k, kind, n)| *k == b && *kind == Kind::Peer && n == "metrics-unit-a"));
        let before = total(a, 2);
        let claim = Claim::new();
        add(a, 2, 3);
        observe(a, Duration::from_millis(7));
        assert_eq!(total(a, 2), before + 3);
        drop(claim);
        // Retired, still counted.
        assert_eq!(total(a, 2), before + 3);
        assert!(total(a, zone::BUCKET0 + 1) >= 1);
    }

    #[test]
    fn long_names_are_cut_at_a_char_boundary() {
        let long = "é".repeat(100);
        let (b, n) = fit(&[&long]);
        assert_eq!(n, 128);
        assert!(std::str::from_utf8(&b[..n]).is_ok());
        let (b, n) = fit(&["up", "127.0.0.1:80"]);
        assert_eq!(&b[..n], b"up\t127.0.0.1:80");
    }
}
