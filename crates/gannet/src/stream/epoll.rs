//! The plain relays' own epoll set (one per worker thread): their sockets (`relay::Sock`)
//! wait here instead of in tokio's.
//!
//! Why: tokio takes a socket out of its set with an `epoll_ctl(EPOLL_CTL_DEL)` before the
//! close (mio's deregistration; skipping it would leak its registration), two per session
//! (client and upstream), where a closed descriptor leaves an epoll set by itself, which
//! is how nginx has it. Here a socket is added once (edge-triggered, for reading and
//! writing, as nginx adds its connections) and its close takes it out.
//!
//! The set's own descriptor is in tokio's set: when it turns readable, one task reads the
//! events (`epoll_wait` without waiting) and wakes the sessions they are for. That is one
//! system call per turn of the event loop in which any relay had an event, shared by all
//! of them: a loss only when every turn serves a single event, a gain as soon as a turn
//! serves more than half a session (measured in docs/bench/l4-proxy-report.md).

use std::cell::RefCell;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use tokio::io::unix::AsyncFd;

/// Readiness bits of a slot.
const READ: u8 = 1;
const WRITE: u8 = 2;
/// The socket failed or hung up: final, both ways stay ready.
const CLOSED: u8 = 4;
/// The peer shut its writing side down (EPOLLRDHUP): final, reading stays ready.
const PEER_DONE: u8 = 8;

/// Events taken from the set per `epoll_wait`.
const BATCH: usize = 256;

/// A socket's place in the set.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    index: u32,
    gen: u32,
}

#[derive(Default)]
struct Slot {
    /// Bumped as the slot is freed: an event read for the slot's former socket is
    /// ignored.
    gen: u32,
    ready: u8,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

pub struct Epoll {
    fd: AsyncFd<OwnedFd>,
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<u32>>,
}

thread_local! {
    static SET: RefCell<Option<Rc<Epoll>>> = const { RefCell::new(None) };
}

/// What a wait is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Read,
    Write,
}

impl Dir {
    fn bit(self) -> u8 {
        match self {
            Dir::Read => READ,
            Dir::Write => WRITE,
        }
    }
}

/// This worker's set, made (and its task started) at the first use; `None` when it
/// cannot be (no epoll descriptor left): the sockets then wait in tokio's.
pub fn get() -> Option<Rc<Epoll>> {
    SET.with_borrow_mut(|set| {
        if set.is_none() {
            let made = Epoll::new()
                .map_err(|e| crate::errlog::warn(format_args!("stream epoll set not made ({e})")));
            if let Ok(e) = made {
                let e = Rc::new(e);
                tokio::task::spawn_local(dispatch(e.clone()));
                *set = Some(e);
            }
        }
        set.clone()
    })
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    match r {
        r if r < 0 => Err(io::Error::last_os_error()),
        r => Ok(r),
    }
}

impl Epoll {
    fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes a flag and returns a new fd or -1; no memory involved.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an OwnedFd always reports the fd it owns, which stays open until it drops
        // with the AsyncFd.
        let fd = unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Epoll {
            fd,
            slots: RefCell::default(),
            free: RefCell::default(),
        })
    }

    /// Add a socket; it leaves the set with its close (after [`Epoll::remove`]).
    pub fn add(&self, fd: RawFd) -> io::Result<Key> {
        let index = self.free.borrow_mut().pop().unwrap_or_else(|| {
            let mut slots = self.slots.borrow_mut();
            slots.push(Slot::default());
            (slots.len() - 1) as u32
        });
        let gen = self.slots.borrow()[index as usize].gen;
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: u64::from(index) | (u64::from(gen) << 32),
        };
        // SAFETY: both fds are open; `ev` is a valid epoll_event that outlives the call
        // (the kernel copies it).
        let r = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if let Err(e) = check(r) {
            self.free.borrow_mut().push(index);
            return Err(e);
        }
        Ok(Key { index, gen })
    }

    /// The socket of `key` is closing: its slot is free again. (To keep the socket open
    /// and out of the set, [`Epoll::delete`] first.)
    pub fn remove(&self, key: Key) {
        let mut slots = self.slots.borrow_mut();
        if let Some(s) = slots
            .get_mut(key.index as usize)
            .filter(|s| s.gen == key.gen)
        {
            *s = Slot {
                gen: s.gen.wrapping_add(1),
                ..Slot::default()
            };
            self.free.borrow_mut().push(key.index);
        }
    }

    /// Take a socket that stays open out of the set (it goes on in tokio's).
    pub fn delete(&self, fd: RawFd, key: Key) {
        // SAFETY: `fd` is open; EPOLL_CTL_DEL reads no event.
        let _ = unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
        self.remove(key);
    }

    /// Ready for `dir` (or closed); else the task is woken by the next event for it.
    pub fn poll_ready(&self, key: Key, dir: Dir, cx: &mut Context<'_>) -> Poll<()> {
        let mut slots = self.slots.borrow_mut();
        let Some(s) = slots
            .get_mut(key.index as usize)
            .filter(|s| s.gen == key.gen)
        else {
            return Poll::Ready(());
        };
        let done = match dir {
            Dir::Read => CLOSED | PEER_DONE,
            Dir::Write => CLOSED,
        };
        if s.ready & (dir.bit() | done) != 0 {
            return Poll::Ready(());
        }
        let w = match dir {
            Dir::Read => &mut s.reader,
            Dir::Write => &mut s.writer,
        };
        if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *w = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// The socket answered EAGAIN (or a short read showed it drained) for `dir`: wait for
    /// its next event. (Only this thread reads the set's events, so none can have come in
    /// between.)
    pub fn clear(&self, key: Key, dir: Dir) {
        let mut slots = self.slots.borrow_mut();
        if let Some(s) = slots
            .get_mut(key.index as usize)
            .filter(|s| s.gen == key.gen)
        {
            s.ready &= !dir.bit();
        }
    }

    /// The peer has shut its writing side down (and the socket has no error): once what
    /// is there is read, a read would find the end.
    pub fn peer_done(&self, key: Key) -> bool {
        let slots = self.slots.borrow();
        slots
            .get(key.index as usize)
            .filter(|s| s.gen == key.gen)
            .is_some_and(|s| s.ready & (PEER_DONE | CLOSED) == PEER_DONE)
    }

    /// The socket reported an error or a hang-up (a refused connect among them).
    pub fn failed(&self, key: Key) -> bool {
        let slots = self.slots.borrow();
        slots
            .get(key.index as usize)
            .filter(|s| s.gen == key.gen)
            .is_some_and(|s| s.ready & CLOSED != 0)
    }

    /// Read the events the set has and wake their sessions; true when there may be more.
    fn take_events(&self) -> bool {
        // Not zeroed: the kernel writes the first `n`, and only those are read. Zeroing
        // the 3 KB array was a `memset` per call, about 1,000 instructions per session.
        let mut events = [const { MaybeUninit::<libc::epoll_event>::uninit() }; BATCH];
        // SAFETY: `events` is a writable array of BATCH epoll_events, as the length says
        // (`MaybeUninit<T>` has `T`'s layout).
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr().cast(),
                BATCH as libc::c_int,
                0,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return false;
        };
        for ev in &events[..n.min(BATCH)] {
            // SAFETY: epoll_wait filled the first `n` entries (n <= BATCH).
            let ev = unsafe { ev.assume_init_read() };
            let (index, gen) = (ev.u64 as u32, (ev.u64 >> 32) as u32);
            let bits = ev.events as libc::c_int;
            let mut ready = 0;
            if bits & libc::EPOLLIN != 0 {
                ready |= READ;
            }
            if bits & libc::EPOLLOUT != 0 {
                ready |= WRITE;
            }
            if bits & libc::EPOLLRDHUP != 0 {
                ready |= PEER_DONE;
            }
            if bits & (libc::EPOLLHUP | libc::EPOLLERR) != 0 {
                ready |= CLOSED;
            }
            let (reader, writer) = {
                let mut slots = self.slots.borrow_mut();
                let Some(s) = slots.get_mut(index as usize).filter(|s| s.gen == gen) else {
                    continue;
                };
                s.ready |= ready;
                let reader = (ready & (READ | CLOSED | PEER_DONE) != 0).then(|| s.reader.take());
                let writer = (ready & (WRITE | CLOSED) != 0).then(|| s.writer.take());
                (reader.flatten(), writer.flatten())
            };
            // Outside the borrow: a woken task may touch the slots.
            for w in [reader, writer].into_iter().flatten() {
                w.wake();
            }
        }
        n == BATCH
    }
}

/// The set's task: its events, as tokio says it has some.
async fn dispatch(set: Rc<Epoll>) {
    loop {
        let Ok(mut guard) = set.fd.readable().await else {
            return;
        };
        if !set.take_events() {
            guard.clear_ready();
        }
    }
}
