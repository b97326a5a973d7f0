//! What each upstream `server NAME resolve` last resolved to, in memory the master shares
//! with every worker process, so that a reload starts from those addresses instead of none
//! (nginx keeps them in the upstream's zone and copies them into the new configuration:
//! ngx_http_upstream_zone_preresolve). A name server that is down at reload time then
//! leaves the servers as they were.
//!
//! A slot per (group, name): the master claims it when it loads the config (before it
//! forks that config's worker process), the worker that resolves the name writes each new
//! answer into it, and the master reads it at the next load, matching group and name as
//! nginx matches host names. Writes are guarded by a sequence number (odd while one is
//! under way): a read that overlaps a write is retried, and after a few tries gives up
//! (the new config then resolves from nothing, as it would without this).

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Names kept (past that, a name starts from nothing at each reload).
const SLOTS: usize = 256;

/// Addresses kept per name (past that, the first ones).
const ADDRS: usize = 32;

#[repr(C, align(64))]
pub struct Slot {
    /// The (group, name) hash; 0: free.
    key: AtomicU64,
    /// Odd while a write is under way.
    seq: AtomicU64,
    count: AtomicU64,
    /// Each address as IPv6 (an IPv4 one mapped), in two halves.
    addrs: [[AtomicU64; 2]; ADDRS],
}

fn slots() -> &'static [Slot] {
    static REGION: OnceLock<&'static [Slot]> = OnceLock::new();
    REGION.get_or_init(|| {
        let len = SLOTS * std::mem::size_of::<Slot>();
        // SAFETY: a new anonymous mapping with no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return &[];
        }
        // SAFETY: the mapping is page-aligned (more than Slot's 64), `len` bytes long, zero
        // filled (a valid Slot: atomics of 0) and never unmapped, so it lives for 'static;
        // it is only ever accessed through atomics, also by the other processes sharing it.
        unsafe { std::slice::from_raw_parts(p.cast::<Slot>(), SLOTS) }
    })
}

/// The slot of `host` in group `group`: the one a previous config used, else a free one
/// (`None` when none is left). Called by the master as it loads a config.
pub fn slot(group: &str, host: &str) -> Option<&'static Slot> {
    let mut h = std::hash::DefaultHasher::new();
    (group, host).hash(&mut h);
    let key = h.finish().max(1);
    let slots = slots();
    if let Some(s) = slots.iter().find(|s| s.key.load(Ordering::Relaxed) == key) {
        return Some(s);
    }
    let free = slots.iter().find(|s| {
        s.key
            .compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    })?;
    Some(free)
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("kept_addrs::Slot")
    }
}

impl Slot {
    /// The addresses last written (empty when none, or when writes kept overlapping).
    pub fn read(&self) -> Vec<IpAddr> {
        for _ in 0..8 {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 % 2 == 1 {
                std::thread::yield_now();
                continue;
            }
            let n = (self.count.load(Ordering::Relaxed) as usize).min(ADDRS);
            let out: Vec<IpAddr> = self.addrs[..n]
                .iter()
                .map(|[hi, lo]| {
                    let v = (u128::from(hi.load(Ordering::Relaxed)) << 64)
                        | u128::from(lo.load(Ordering::Relaxed));
                    let v6 = Ipv6Addr::from(v);
                    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
                })
                .collect();
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return out;
            }
        }
        Vec::new()
    }

    /// Keep `ips` as the name's addresses.
    pub fn write(&self, ips: &[IpAddr]) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let n = ips.len().min(ADDRS);
        for (slot, ip) in self.addrs.iter().zip(&ips[..n]) {
            let v = u128::from(match ip {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => *a,
            });
            slot[0].store((v >> 64) as u64, Ordering::Relaxed);
            slot[1].store(v as u64, Ordering::Relaxed);
        }
        self.count.store(n as u64, Ordering::Relaxed);
        self.seq
            .store((s.wrapping_add(1) | 1).wrapping_add(1), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_written_are_read_back_by_group_and_name() {
        let ips: Vec<IpAddr> = ["127.0.0.2", "::1", "10.1.2.3"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let s = slot("kept-test-group", "a.test").unwrap();
        assert!(s.read().is_empty());
        s.write(&ips);
        let again = slot("kept-test-group", "a.test").unwrap();
        assert_eq!(again.read(), ips);
        assert!(slot("kept-test-group", "b.test").unwrap().read().is_empty());
        s.write(&ips[1..]);
        assert_eq!(again.read(), ips[1..]);
    }
}
