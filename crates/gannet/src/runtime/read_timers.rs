//! Deadlines for connections waiting on their client or on an upstream server, kept in one
//! table per worker and swept by a ticker every `TICK`, instead of a tokio `Sleep` in each
//! connection's task.
//!
//! Why: a waiting connection is the common state (10,000 idle keep-alive clients is a normal
//! day), and tokio's `Sleep` (112 bytes) plus a `readable()` future (152 bytes) would be
//! most of its memory. Here a waiting connection holds an index into this table, and its
//! slot is a deadline and a waker. Timeouts fire up to one `TICK` late, which no HTTP
//! timeout notices. A graceful stop ([`ReadTimers::drain`]) cuts every *idle* slot
//! (between requests) short to a grace time, and leaves connections with a partial request
//! alone. nginx closes idle kept connections at once; but a busy keep-alive client has its
//! next request on the wire at any moment, and a close then is a reset or an unanswered
//! request on its side. Within the grace time that request arrives and is answered (with
//! `Connection: close`, the worker draining), so only connections really idle are closed.
//!
//! A slot may also be *reusable* (nginx's word): a connection waiting for a request with
//! nothing of it in hand, new or kept alive. A worker out of `worker_connections` closes
//! the oldest of those to make room ([`ReadTimers::reuse`], `runtime::worker`).
//!
//! The upstream exchanges (`*_send_timeout`, `*_read_timeout`) use the table through
//! [`ReadTimers::within`]: a proxied request waits once for its answer, and a tokio timeout
//! there cost a clock read per read and write, and an insertion into and a removal from
//! tokio's timer wheel per wait (about 7% of the user time of a proxied request).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

pub const TICK: Duration = Duration::from_millis(250);

struct Slot {
    deadline: Instant,
    idle: bool,
    /// Since when the connection has waited with no request in hand, if it may be closed
    /// to make room for a new one.
    reusable: Option<Instant>,
    /// Fired to make room, not by its deadline.
    reused: bool,
    fired: bool,
    waker: Option<Waker>,
}

#[derive(Default)]
pub struct ReadTimers {
    slots: RefCell<Vec<Option<Slot>>>,
    free: RefCell<Vec<usize>>,
    /// Slots fired by `reuse` whose connection has not given them back yet: room that is
    /// being made.
    reusing: Cell<usize>,
    /// Set by a graceful stop: no idle slot waits past it.
    drain_by: Cell<Option<Instant>>,
}

impl ReadTimers {
    /// Start a deadline; the returned key must be given back with `remove`.
    pub fn insert(&self, deadline: Instant, idle: bool) -> usize {
        self.insert_slot(deadline, idle, None)
    }

    fn insert_slot(&self, deadline: Instant, idle: bool, reusable: Option<Instant>) -> usize {
        let deadline = match self.drain_by.get() {
            Some(by) if idle => deadline.min(by),
            _ => deadline,
        };
        let slot = Some(Slot {
            deadline,
            idle,
            reusable,
            reused: false,
            fired: false,
            waker: None,
        });
        let mut slots = self.slots.borrow_mut();
        match self.free.borrow_mut().pop() {
            Some(k) => {
                slots[k] = slot;
                k
            }
            None => {
                slots.push(slot);
                slots.len() - 1
            }
        }
    }

    /// Ready once the deadline has passed.
    pub fn poll(&self, key: usize, cx: &mut Context<'_>) -> Poll<()> {
        let mut slots = self.slots.borrow_mut();
        match slots.get_mut(key).and_then(Option::as_mut) {
            Some(s) if s.fired => Poll::Ready(()),
            Some(s) => {
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            None => Poll::Ready(()),
        }
    }

    /// `f`'s output, or `Err(())` once `timeout` has passed since `f` first had to wait.
    /// The deadline is taken (and the slot filled) only then: an `f` that is ready at once
    /// costs no clock read and no slot.
    pub async fn within<F: Future>(&self, timeout: Duration, f: F) -> Result<F::Output, ()> {
        let mut f = std::pin::pin!(f);
        let mut held: Option<Held> = None;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = f.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            // The turn's time (`runtime::clock`): an upstream's answer awaited right after
            // its request went out costs no clock read of its own.
            let h = held.get_or_insert_with(|| self.hold(super::clock::now() + timeout, false));
            self.poll(h.key, cx).map(|()| Err(()))
        })
        .await
    }

    /// A deadline given back to the table however the wait ends (see [`Held`]).
    pub fn hold(&self, deadline: Instant, idle: bool) -> Held<'_> {
        Held {
            timers: self,
            key: self.insert(deadline, idle),
        }
    }

    /// [`hold`](Self::hold) for a connection that waits with no request in hand since
    /// `since`: it may be closed for room ([`reuse`](Self::reuse)).
    pub fn hold_reusable(&self, deadline: Instant, idle: bool, since: Instant) -> Held<'_> {
        Held {
            timers: self,
            key: self.insert_slot(deadline, idle, Some(since)),
        }
    }

    pub fn remove(&self, key: usize) {
        if let Some(s) = self.slots.borrow_mut().get_mut(key) {
            if let Some(slot) = s.take() {
                if slot.reused {
                    self.reusing.set(self.reusing.get() - 1);
                }
                self.free.borrow_mut().push(key);
            }
        }
    }

    /// Whether the slot was fired to make room (its connection is to close).
    pub fn was_reused(&self, key: usize) -> bool {
        let slots = self.slots.borrow();
        slots
            .get(key)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.reused)
    }

    /// The reusable slots not fired yet, as (waiting since, key).
    pub fn reusable(&self, out: &mut Vec<(Instant, usize)>) {
        let slots = self.slots.borrow();
        for (k, s) in slots.iter().enumerate() {
            if let Some(since) = s.as_ref().filter(|s| !s.fired).and_then(|s| s.reusable) {
                out.push((since, k));
            }
        }
    }

    /// Fire a reusable slot so that its connection closes.
    pub fn reuse(&self, key: usize) {
        let waker = {
            let mut slots = self.slots.borrow_mut();
            let Some(s) = slots.get_mut(key).and_then(Option::as_mut) else {
                return;
            };
            if s.fired || s.reusable.is_none() {
                return;
            }
            s.fired = true;
            s.reused = true;
            s.waker.take()
        };
        self.reusing.set(self.reusing.get() + 1);
        // Outside the borrow, as in `sweep`.
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Connections fired by `reuse` that have not closed yet.
    pub fn reusing(&self) -> usize {
        self.reusing.get()
    }

    /// A graceful stop: idle slots, now and from now on, end by `by` at the latest.
    pub fn drain(&self, by: Instant) {
        self.drain_by.set(Some(by));
        for s in self.slots.borrow_mut().iter_mut().flatten() {
            if s.idle {
                s.deadline = s.deadline.min(by);
            }
        }
    }

    /// Fire the slots whose deadline passed.
    pub fn sweep(&self, now: Instant) {
        let mut wake = Vec::new();
        for s in self.slots.borrow_mut().iter_mut().flatten() {
            if !s.fired && s.deadline <= now {
                s.fired = true;
                wake.extend(s.waker.take());
            }
        }
        // Wake outside the borrow: a woken task may run and touch the table.
        for w in wake {
            w.wake();
        }
    }
}

/// A slot of the table, removed when dropped: when the wait ended, timed out, or its
/// future was dropped (a client that left).
pub struct Held<'a> {
    timers: &'a ReadTimers,
    pub key: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.timers.remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[test]
    fn fires_past_deadline_and_a_drain_cuts_only_idle_slots_short() {
        let t = ReadTimers::default();
        let now = Instant::now();
        let secs = |n| now + Duration::from_secs(n);
        let mut cx = Context::from_waker(Waker::noop());
        let soon = t.insert(secs(1), false);
        let idle = t.insert(secs(100), true);
        let busy = t.insert(secs(100), false);
        assert!(t.poll(soon, &mut cx).is_pending());
        t.sweep(secs(2));
        assert!(t.poll(soon, &mut cx).is_ready());
        assert!(t.poll(idle, &mut cx).is_pending());
        t.drain(secs(3));
        let late = t.insert(secs(100), true);
        t.sweep(secs(2));
        assert!(
            t.poll(idle, &mut cx).is_pending(),
            "idle slots get the grace time"
        );
        t.sweep(secs(3));
        assert!(t.poll(idle, &mut cx).is_ready());
        assert!(
            t.poll(late, &mut cx).is_ready(),
            "idle slots taken after the drain too"
        );
        assert!(t.poll(busy, &mut cx).is_pending());
        t.remove(soon);
        assert_eq!(t.insert(now, false), soon, "freed slots are reused");
    }

    #[test]
    fn reuse_fires_only_reusable_slots_and_counts_them_until_removed() {
        let t = ReadTimers::default();
        let now = Instant::now();
        let mut cx = Context::from_waker(Waker::noop());
        let later = now + Duration::from_secs(100);
        let busy = t.insert(later, false);
        let old = t.insert_slot(later, true, Some(now));
        let new = t.insert_slot(later, true, Some(now + Duration::from_secs(1)));
        let mut found = Vec::new();
        t.reusable(&mut found);
        found.sort();
        assert_eq!(found, vec![(now, old), (now + Duration::from_secs(1), new)]);
        t.reuse(busy);
        t.reuse(old);
        t.reuse(old);
        assert!(t.poll(busy, &mut cx).is_pending());
        assert!(t.poll(old, &mut cx).is_ready());
        assert!(t.was_reused(old) && !t.was_reused(new));
        assert_eq!(t.reusing(), 1);
        found.clear();
        t.reusable(&mut found);
        assert_eq!(found, vec![(now + Duration::from_secs(1), new)]);
        t.remove(old);
        assert_eq!(t.reusing(), 0);
    }

    #[test]
    fn within_takes_a_slot_only_to_wait_and_gives_it_back() {
        let t = ReadTimers::default();
        let mut cx = Context::from_waker(Waker::noop());
        let second = Duration::from_secs(1);
        // Ready at once: no slot taken.
        let mut ready = std::pin::pin!(t.within(second, std::future::ready(7)));
        assert_eq!(ready.as_mut().poll(&mut cx), Poll::Ready(Ok(7)));
        assert!(t.slots.borrow().is_empty());
        // Waiting: a slot, fired by the sweep past the deadline, then given back.
        let mut waiting = Box::pin(t.within(second, std::future::pending::<()>()));
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        assert_eq!(t.slots.borrow().iter().flatten().count(), 1);
        t.sweep(Instant::now() + 2 * second);
        assert_eq!(waiting.as_mut().poll(&mut cx), Poll::Ready(Err(())));
        drop(waiting);
        assert_eq!(t.slots.borrow().iter().flatten().count(), 0);
        // Dropped while waiting (a client that left): the slot is given back too.
        let mut dropped = Box::pin(t.within(second, std::future::pending::<()>()));
        assert!(dropped.as_mut().poll(&mut cx).is_pending());
        drop(dropped);
        assert_eq!(t.slots.borrow().iter().flatten().count(), 0);
    }
}
