//! The parking lot: keep-alive connections that have been idle for a while leave their
//! task and tokio registration, and wait as a bare socket in an epoll set of the worker's
//! own. When one turns readable it gets a task again and goes on where it stopped.
//!
//! Why: an idle connection is the common case (10,000 of them is a normal day), and a
//! tokio task plus its I/O registration costs over a kilobyte even with nothing in it.
//! Parked, a connection costs its slot here (about 150 bytes) and a kernel epoll entry,
//! which is nginx's territory (it holds ~500 bytes per idle connection). Connections only
//! park after `PARK_AFTER` of silence, so a busy keep-alive client never pays the extra
//! epoll calls of parking and waking.

use super::metrics;
use crate::conn::ConnInfo;
use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;

/// How long a keep-alive connection waits in its task before it parks.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// What a parked connection keeps.
pub struct Parked {
    pub stream: TcpStream,
    pub info: ConnInfo,
    pub group: usize,
    /// When its keep-alive time (or, before a first request, its header time) runs out.
    pub deadline: Instant,
    /// Since when it has waited with no request in hand: a worker out of connections
    /// closes the longest waiting first (`Worker::reuse_connections`).
    pub idle_since: Instant,
}

pub struct ParkingLot {
    epoll: AsyncFd<OwnedFd>,
    slots: RefCell<Vec<Option<Parked>>>,
    /// (deadline, slot) of each park, earliest first: the worker's tick closes what is due
    /// without walking every parked connection (with 10,000 parked, that walk four times a
    /// second had every L2 miss of a kept request and over half its L1 misses, callgrind,
    /// docs/bench/cost-per-request.md). An entry outlives its park when the connection
    /// wakes: it closes only a slot's connection that is due itself.
    due: RefCell<BinaryHeap<Reverse<(Instant, usize)>>>,
    free: RefCell<Vec<usize>>,
    /// Connections parked since the last `trimmed`.
    parked: Cell<usize>,
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl ParkingLot {
    /// Needs a running tokio runtime (it registers its epoll fd with it).
    pub fn new() -> io::Result<ParkingLot> {
        // SAFETY: epoll_create1 takes a flag and returns a new fd or -1; no memory involved.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an OwnedFd always reports the fd it owns, which stays open until it drops
        // with the AsyncFd.
        let epoll = unsafe { AsyncFd::register(owned) }.map_err(io::Error::from)?;
        Ok(ParkingLot {
            epoll,
            slots: RefCell::default(),
            due: RefCell::default(),
            free: RefCell::default(),
            parked: Cell::new(0),
        })
    }

    fn ctl(&self, op: libc::c_int, fd: libc::c_int, key: usize) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: key as u64,
        };
        // SAFETY: both fds are open; `ev` is a valid epoll_event that outlives the call
        // (the kernel copies it).
        check(unsafe { libc::epoll_ctl(self.epoll.get_ref().as_raw_fd(), op, fd, &mut ev) })
            .map(|_| ())
    }

    /// Park a connection (its socket must already be out of tokio's hands). On error the
    /// connection is dropped, which closes it.
    pub fn park(&self, p: Parked) -> io::Result<()> {
        let key = self.free.borrow_mut().pop().unwrap_or_else(|| {
            let mut slots = self.slots.borrow_mut();
            slots.push(None);
            slots.len() - 1
        });
        if let Err(e) = self.ctl(libc::EPOLL_CTL_ADD, p.stream.as_raw_fd(), key) {
            self.free.borrow_mut().push(key);
            return Err(e);
        }
        self.due.borrow_mut().push(Reverse((p.deadline, key)));
        self.slots.borrow_mut()[key] = Some(p);
        self.compact();
        self.parked.set(self.parked.get() + 1);
        metrics::gauge_add(metrics::GLOBAL, metrics::global::PARKED, 1);
        Ok(())
    }

    /// How many connections parked since the worker last returned memory to the system.
    pub fn parked_since_trim(&self) -> usize {
        self.parked.get()
    }

    /// The worker returned freed memory to the system.
    pub fn trimmed(&self) {
        self.parked.set(0);
    }

    fn take(&self, key: usize) -> Option<Parked> {
        let p = self.slots.borrow_mut().get_mut(key)?.take()?;
        self.free.borrow_mut().push(key);
        metrics::gauge_add(metrics::GLOBAL, metrics::global::PARKED, -1);
        Some(p)
    }

    /// Wait until parked connections turn readable (data, or the client closing) and
    /// hand them back, out of the epoll set.
    pub async fn ready(&self) -> Vec<Parked> {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            let Ok(mut guard) = self.epoll.readable().await else {
                return Vec::new();
            };
            // SAFETY: `events` is a writable array of 256 epoll_events, as the length says.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.get_ref().as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    0,
                )
            };
            if n <= 0 {
                guard.clear_ready();
                continue;
            }
            let mut out = Vec::with_capacity(n as usize);
            for ev in &events[..n as usize] {
                if let Some(p) = self.take(ev.u64 as usize) {
                    let _ = self.ctl(libc::EPOLL_CTL_DEL, p.stream.as_raw_fd(), 0);
                    out.push(p);
                }
            }
            return out;
        }
    }

    /// The parked connections, as (waiting since, key), for `close`.
    pub fn waiting(&self, out: &mut Vec<(Instant, usize)>) {
        let slots = self.slots.borrow();
        for (k, p) in slots.iter().enumerate() {
            if let Some(p) = p {
                out.push((p.idle_since, k));
            }
        }
    }

    /// Close one parked connection (to make room for a new one). Returns whether it was
    /// still there.
    pub fn close(&self, key: usize) -> bool {
        // Dropped, the socket closes and leaves the epoll set.
        self.take(key).is_some()
    }

    /// Every parked connection, out of the epoll set: a draining worker gives them a task
    /// again to close them the careful way (`conn::h1`), or answer a request that came.
    pub fn take_all(&self) -> Vec<Parked> {
        let n = self.slots.borrow().len();
        let mut out = Vec::new();
        for key in 0..n {
            if let Some(p) = self.take(key) {
                let _ = self.ctl(libc::EPOLL_CTL_DEL, p.stream.as_raw_fd(), 0);
                out.push(p);
            }
        }
        out
    }

    /// Close parked connections whose keep-alive time is over (all of them with `all`).
    /// Returns how many were closed.
    pub fn expire(&self, now: Instant, all: bool) -> usize {
        if all {
            self.due.borrow_mut().clear();
            let n = self.slots.borrow().len();
            // Dropping the socket closes it, which also takes it out of the epoll set.
            return (0..n).filter(|&k| self.take(k).is_some()).count();
        }
        let mut closed = 0;
        loop {
            let key = {
                let mut due = self.due.borrow_mut();
                match due.peek() {
                    Some(&Reverse((deadline, key))) if deadline <= now => {
                        due.pop();
                        key
                    }
                    _ => return closed,
                }
            };
            let is_due = self.slots.borrow()[key]
                .as_ref()
                .is_some_and(|p| p.deadline <= now);
            if is_due && self.take(key).is_some() {
                closed += 1;
            }
        }
    }

    /// Rebuild `due` from the slots once most of its entries are of connections that left
    /// (a connection that parks and wakes often leaves one each time): it stays within
    /// twice the parked connections.
    fn compact(&self) {
        let live = self.slots.borrow().len() - self.free.borrow().len();
        let mut due = self.due.borrow_mut();
        if due.len() <= 2 * live + 64 {
            return;
        }
        let slots = self.slots.borrow();
        due.clear();
        for (key, p) in slots.iter().enumerate() {
            if let Some(p) = p {
                due.push(Reverse((p.deadline, key)));
            }
        }
    }
}
