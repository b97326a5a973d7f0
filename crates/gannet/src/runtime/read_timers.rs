//! Read deadlines for connections waiting on their client, kept in one table per worker and
//! swept by a ticker every `TICK`, instead of a tokio `Sleep` in each connection's task.
//!
//! Why: a waiting connection is the common state (10,000 idle keep-alive clients is a normal
//! day), and tokio's `Sleep` (112 bytes) plus a `readable()` future (152 bytes) would be
//! most of its memory. Here a waiting connection holds an index into this table, and its
//! slot is a deadline and a waker. Timeouts fire up to one `TICK` late, which no HTTP
//! timeout notices. A graceful stop fires every *idle* slot at once (between requests),
//! and leaves connections with a partial request alone, as nginx does.

use std::cell::RefCell;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

pub const TICK: Duration = Duration::from_millis(250);

struct Slot {
    deadline: Instant,
    idle: bool,
    fired: bool,
    waker: Option<Waker>,
}

#[derive(Default)]
pub struct ReadTimers {
    slots: RefCell<Vec<Option<Slot>>>,
    free: RefCell<Vec<usize>>,
}

impl ReadTimers {
    /// Start a deadline; the returned key must be given back with `remove`.
    pub fn insert(&self, deadline: Instant, idle: bool) -> usize {
        let slot = Some(Slot {
            deadline,
            idle,
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

    /// Ready once the deadline has passed (or a graceful stop fired an idle slot).
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

    pub fn remove(&self, key: usize) {
        if let Some(s) = self.slots.borrow_mut().get_mut(key) {
            if s.take().is_some() {
                self.free.borrow_mut().push(key);
            }
        }
    }

    /// Fire the slots whose deadline passed, and with `drain` every idle one.
    pub fn sweep(&self, now: Instant, drain: bool) {
        let mut wake = Vec::new();
        for s in self.slots.borrow_mut().iter_mut().flatten() {
            if !s.fired && (s.deadline <= now || (drain && s.idle)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[test]
    fn fires_past_deadline_and_on_drain_only_idle() {
        let t = ReadTimers::default();
        let now = Instant::now();
        let mut cx = Context::from_waker(Waker::noop());
        let soon = t.insert(now + Duration::from_secs(1), false);
        let idle = t.insert(now + Duration::from_secs(100), true);
        let busy = t.insert(now + Duration::from_secs(100), false);
        assert!(t.poll(soon, &mut cx).is_pending());
        t.sweep(now + Duration::from_secs(2), false);
        assert!(t.poll(soon, &mut cx).is_ready());
        assert!(t.poll(idle, &mut cx).is_pending());
        t.sweep(now + Duration::from_secs(2), true);
        assert!(t.poll(idle, &mut cx).is_ready());
        assert!(t.poll(busy, &mut cx).is_pending());
        t.remove(soon);
        assert_eq!(t.insert(now, false), soon, "freed slots are reused");
    }
}
