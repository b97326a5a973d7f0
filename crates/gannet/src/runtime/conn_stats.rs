//! The connection and request counters `stub_status` and `$connections_*` report, for the
//! whole server: every worker thread of every worker process, the draining generations of
//! a reload included (nginx keeps its counters in shared memory for the same reason).
//!
//! The master maps one shared anonymous region before it forks any worker process
//! ([`init`]); each worker thread claims a slot of its own in it and is the only writer of
//! that slot, so counting costs a plain load and store on a cache line no other thread
//! writes (no locked instruction, no contention). A read sums the slots. When a worker
//! thread ends, its totals go to the retired slot so that accepts, handled connections
//! and requests keep counting up across reloads, as nginx's do.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// Slots in the region: worker threads alive at once across all generations (a slot is
/// given back when its thread ends). Past that a thread counts in a slot of its own
/// process only.
const SLOTS: usize = 512;

/// One worker thread's counters, alone on its cache line.
#[repr(C, align(64))]
#[derive(Default)]
pub struct Slot {
    taken: AtomicU32,
    accepted: AtomicU64,
    handled: AtomicU64,
    requests: AtomicU64,
    active: AtomicU64,
    reading: AtomicU64,
    writing: AtomicU64,
}

impl Slot {
    /// Add `d` (wrapping: a decrement is `u64::MAX`). Only the owning thread writes a
    /// counting slot, so load-then-store loses nothing.
    fn add(c: &AtomicU64, d: u64) {
        c.store(c.load(Relaxed).wrapping_add(d), Relaxed);
    }
}

/// The slots; slot 0 holds the totals of the threads that ended.
fn slots() -> &'static [Slot] {
    static REGION: OnceLock<&'static [Slot]> = OnceLock::new();
    REGION.get_or_init(|| {
        let len = SLOTS * std::mem::size_of::<Slot>();
        let p = match crate::runtime::shared_mem::map(len, true) {
            Ok(p) => p,
            Err(e) => {
                crate::errlog::warn(format_args!(
                    "no shared memory for connection counters: {e}"
                ));
                let local: Vec<Slot> = (0..SLOTS).map(|_| Slot::default()).collect();
                return Vec::leak(local);
            }
        };
        // SAFETY: the mapping is page-aligned (more than Slot's 64), `len` bytes long, zero
        // filled (a valid Slot: atomics of 0) and never unmapped, so it lives for 'static;
        // it is only ever accessed through atomics, also by the other processes sharing it.
        unsafe { std::slice::from_raw_parts(p.as_ptr().cast::<Slot>(), SLOTS) }
    })
}

/// Map the shared region now: the master calls it before the first fork so that every
/// worker process shares it.
pub fn init() {
    slots();
}

/// A worker thread's claim on its slot; counting goes through it.
pub struct Counter(&'static Slot);

impl Counter {
    pub fn claim() -> Counter {
        let free = slots()[1..]
            .iter()
            .find(|s| s.taken.compare_exchange(0, 1, Relaxed, Relaxed).is_ok());
        Counter(free.unwrap_or_else(|| Box::leak(Box::default())))
    }

    /// A connection was accepted and is being served.
    pub fn accepted(&self) {
        Slot::add(&self.0.accepted, 1);
        Slot::add(&self.0.handled, 1);
        Slot::add(&self.0.active, 1);
    }

    /// A connection refused for lack of `worker_connections`: accepted, not handled.
    pub fn dropped(&self) {
        Slot::add(&self.0.accepted, 1);
    }

    pub fn closed(&self) {
        Slot::add(&self.0.active, u64::MAX);
    }

    /// A request began (its head is being read, or came whole at once).
    pub fn request(&self) {
        Slot::add(&self.0.requests, 1);
    }

    /// The request's head is being read until the guard drops.
    pub fn reading(&self) -> Phase {
        Slot::add(&self.0.reading, 1);
        Phase(&self.0.reading)
    }

    /// The request is being processed and answered until the guard drops.
    pub fn writing(&self) -> Phase {
        Slot::add(&self.0.writing, 1);
        Phase(&self.0.writing)
    }
}

impl Drop for Counter {
    /// The thread ended (or panicked): its totals move to the retired slot and the slot
    /// is free again. Its connections are gone with it.
    fn drop(&mut self) {
        let s = self.0;
        let retired = &slots()[0];
        for (from, to) in [
            (&s.accepted, &retired.accepted),
            (&s.handled, &retired.handled),
            (&s.requests, &retired.requests),
        ] {
            to.fetch_add(from.swap(0, Relaxed), Relaxed);
        }
        for c in [&s.active, &s.reading, &s.writing] {
            c.store(0, Relaxed);
        }
        s.taken.store(0, Relaxed);
    }
}

/// A connection counted as reading or writing while this lives.
pub struct Phase(&'static AtomicU64);

impl Drop for Phase {
    fn drop(&mut self) {
        Slot::add(self.0, u64::MAX);
    }
}

/// The server's counters summed at one moment.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub accepted: u64,
    pub handled: u64,
    pub requests: u64,
    pub active: u64,
    pub reading: u64,
    pub writing: u64,
}

impl Totals {
    pub fn now() -> Totals {
        let mut t = Totals::default();
        // The per-slot gauges may be read between two related stores (a wrapped
        // decrement summed before its increment): sums are taken wrapping, as signed.
        for s in slots() {
            t.accepted = t.accepted.wrapping_add(s.accepted.load(Relaxed));
            t.handled = t.handled.wrapping_add(s.handled.load(Relaxed));
            t.requests = t.requests.wrapping_add(s.requests.load(Relaxed));
            t.active = t.active.wrapping_add(s.active.load(Relaxed));
            t.reading = t.reading.wrapping_add(s.reading.load(Relaxed));
            t.writing = t.writing.wrapping_add(s.writing.load(Relaxed));
        }
        for g in [&mut t.active, &mut t.reading, &mut t.writing] {
            *g = (*g as i64).max(0) as u64;
        }
        t
    }

    /// Connections kept open without a request in hand.
    pub fn waiting(&self) -> u64 {
        self.active.saturating_sub(self.reading + self.writing)
    }
}
