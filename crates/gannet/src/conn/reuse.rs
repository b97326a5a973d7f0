//! What the worker thread reuses across its connections: a future in a heap block (the
//! HTTP/1.x loop's per-request future, `conn::h1`), and an idle connection's read and write
//! buffers ([`Spare`]).
//!
//! That future is several KiB (room for every state a request may reach), past glibc's
//! per-thread cache (1 KiB), so each request's `Box` went through `_int_malloc` and
//! `_int_free` (and a `malloc_consolidate` of the small chunks freed since: the large
//! request sweeps them), a few hundred instructions per request. The block is kept
//! instead: a request's future is written into a free block of its layout, dropped in
//! place when done, and the block goes back to this thread's list for the next request.
//! At most [`KEEP`] blocks are kept per thread (the requests in progress at once beyond
//! that free theirs), and they are freed with the thread.
//!
//! A new connection's future goes in such a block too ([`run_or_spawn`]): it is run by the
//! accepting task until it first has to wait, and gets a task of its own only then. A
//! connection that is answered and closed without waiting (with deferred accept its request
//! is there when it is accepted: a `Connection: close` client's whole life) so costs no
//! tokio task: its allocation (a block aligned to 128 bytes, through `memalign`, and its
//! free), the future's copies into it and through its stages, and its scheduling were about
//! 2,500 of a new connection's 12,900 user instructions.

use bytes::BytesMut;
use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll, Waker};

/// Free blocks kept per thread: the requests a worker thread has in progress at once on
/// its busiest keep-alive connections, bounded (a few KiB each).
const KEEP: usize = 64;

/// This thread's free blocks, each with its layout.
struct Free(Vec<(Layout, NonNull<u8>)>);

impl Drop for Free {
    fn drop(&mut self) {
        for (layout, p) in self.0.drain(..) {
            // SAFETY: every block here came from `alloc` with this layout (see `Reused::new`)
            // and is owned by the list alone (no future lives in it).
            unsafe { dealloc(p.as_ptr(), layout) };
        }
    }
}

thread_local! {
    static FREE: RefCell<Free> = const { RefCell::new(Free(Vec::new())) };
}

/// `F` in a block of this thread's (see the module docs); polled in place, dropped in
/// place.
pub struct Reused<F> {
    p: NonNull<F>,
    /// Owns an `F` (for the drop check).
    _owns: PhantomData<F>,
}

impl<F> Reused<F> {
    /// The future `make` builds, written straight into its block: `Box::pin(make())` would
    /// build it on the stack and copy all of it (its whole size, most of it room for states
    /// not entered yet) into the box.
    pub fn new(make: impl FnOnce() -> F) -> Reused<F> {
        let layout = Layout::new::<F>();
        assert!(layout.size() > 0, "a future holds at least its state");
        let kept = FREE.with(|f| {
            let mut f = f.borrow_mut();
            let i = f.0.iter().rposition(|(l, _)| *l == layout)?;
            Some(f.0.swap_remove(i).1)
        });
        let block = kept.unwrap_or_else(|| {
            // SAFETY: the layout's size is not zero (asserted above).
            let p = unsafe { alloc(layout) };
            NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout))
        });
        let p = block.cast::<F>();
        // SAFETY: the block is `F`'s layout (size and alignment), unused and exclusively
        // ours: taken from the free list or just allocated.
        unsafe { p.as_ptr().write(make()) };
        Reused {
            p,
            _owns: PhantomData,
        }
    }
}

// The `F` is in its block, never in `Reused` itself: moving a `Reused` moves the pointer
// only, so it may be moved whether or not `F` may.
impl<F> Unpin for Reused<F> {}

impl<F: Future> Future for Reused<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the `F` lives in its block from `new` until `drop`, which drops it in
        // place: it is never moved, so it may be pinned; `self` is borrowed mutably, so
        // nothing else reaches it meanwhile.
        let f = unsafe { Pin::new_unchecked(&mut *self.get_mut().p.as_ptr()) };
        f.poll(cx)
    }
}

impl<F> Drop for Reused<F> {
    fn drop(&mut self) {
        let layout = Layout::new::<F>();
        // SAFETY: the block holds a live `F` (written in `new`, dropped only here).
        unsafe { std::ptr::drop_in_place(self.p.as_ptr()) };
        let block = self.p.cast::<u8>();
        let kept = FREE
            .try_with(|f| {
                let mut f = f.borrow_mut();
                if f.0.len() < KEEP {
                    f.0.push((layout, block));
                    true
                } else {
                    false
                }
            })
            .unwrap_or(false);
        if !kept {
            // SAFETY: allocated with this layout in `new` (or by a `Reused` before, from
            // the free list); the `F` in it was dropped above and nothing else holds it.
            unsafe { dealloc(block.as_ptr(), layout) };
        }
    }
}

/// One read buffer and one output buffer, empty, that a kept connection gave up when it
/// went idle, for the next request of any of the worker's connections (`conn::h1`).
///
/// Why: with a buffer pair of its own per connection, a request's read and answer went into
/// memory last touched when that connection's previous request was served, a thousand
/// requests earlier with a thousand busy connections: a megabyte and more of buffers (beside
/// the kernel's own per-socket state), past this machine's 1 MiB L2 cache, so each line of
/// them written or read was a miss. Handed on instead, the pair the last request used serves
/// the next one from the L1 cache (callgrind's cache simulation: 10 fewer L2 misses a request
/// at 1,000 connections; docs/bench/cost-per-request.md, "c=1,000"). One slot of each
/// kind is enough: a connection holds its buffers only from its read to its answer's write,
/// which on a kept connection is one poll of its task. A connection that finds the slot
/// taken keeps its own, as before. nginx does the same for its read buffer (freed when a
/// kept connection goes idle, allocated anew for the next request).
#[derive(Default)]
pub struct Spare {
    read: Cell<Option<BytesMut>>,
    write: Cell<Option<Vec<u8>>>,
}

impl Spare {
    /// Give `buf` (empty, read from) to the slot if the slot is free; `buf` is then left
    /// without capacity. One that a big request grew past `max` is freed instead.
    #[inline]
    pub fn give_read(&self, buf: &mut BytesMut, max: usize) {
        if buf.capacity() > max {
            *buf = BytesMut::new();
        }
        if !buf.is_empty() || buf.capacity() == 0 {
            return;
        }
        match self.read.take() {
            None => self.read.set(Some(std::mem::take(buf))),
            held => self.read.set(held),
        }
    }

    /// The slot's read buffer for a connection whose own went to it (none of capacity).
    #[inline]
    pub fn take_read(&self, buf: &mut BytesMut) {
        if buf.capacity() == 0 {
            if let Some(b) = self.read.take() {
                *buf = b;
            }
        }
    }

    /// [`Spare::give_read`] for an output buffer (written out: its length is dropped).
    #[inline]
    pub fn give_write(&self, out: &mut Vec<u8>, max: usize) {
        if out.capacity() > max {
            *out = Vec::new();
        }
        if out.capacity() == 0 {
            return;
        }
        match self.write.take() {
            None => {
                out.clear();
                self.write.set(Some(std::mem::take(out)));
            }
            held => self.write.set(held),
        }
    }

    /// [`Spare::take_read`] for an output buffer.
    #[inline]
    pub fn take_write(&self, out: &mut Vec<u8>) {
        if out.capacity() == 0 {
            if let Some(v) = self.write.take() {
                *out = v;
            }
        }
    }
}

/// Run the future `make` builds (in a reused block) in the calling task until it first
/// has to wait, then as a local task of its own (see the module docs). Call it from inside
/// a `LocalSet`, as `tokio::task::spawn_local`.
///
/// The first poll has a waker that does nothing: a future that waits has registered it
/// (with the event loop, a timer, a channel), and the task's own first poll, which comes
/// right after the spawn, registers the task's waker in its place; a future reads its
/// state again when polled, so an event in between is not missed. A panic in that first
/// poll ends this connection alone, as it would end its task, not the accepting loop.
pub fn run_or_spawn<F: Future<Output = ()> + 'static>(make: impl FnOnce() -> F) {
    let mut f = Reused::new(make);
    let mut cx = Context::from_waker(Waker::noop());
    match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut f).poll(&mut cx))) {
        Ok(Poll::Ready(())) => {}
        Ok(Poll::Pending) => {
            tokio::task::spawn_local(f);
        }
        // Dropped as the runtime drops a task that panicked (the panic hook has reported
        // it); a panic in the drop is swallowed too.
        Err(_) => {
            let _ = catch_unwind(AssertUnwindSafe(move || drop(f)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn spare_buffers_go_to_the_next_taker_one_of_each_kind() {
        let spare = Spare::default();
        let mut a = BytesMut::with_capacity(1024);
        let at = a.as_ptr();
        spare.give_read(&mut a, 4096);
        assert_eq!(a.capacity(), 0, "given up");
        // The slot is taken: the next connection keeps its own.
        let mut b = BytesMut::with_capacity(1024);
        spare.give_read(&mut b, 4096);
        assert_eq!(b.capacity(), 1024, "kept");
        let mut c = BytesMut::new();
        spare.take_read(&mut c);
        assert_eq!(c.as_ptr(), at, "the spare one");
        let mut d = BytesMut::new();
        spare.take_read(&mut d);
        assert_eq!(d.capacity(), 0, "none left");
        // A buffer holding bytes is not given; one grown past the limit is freed.
        let mut e = BytesMut::from(&b"GET"[..]);
        spare.give_read(&mut e, 4096);
        assert_eq!(&e[..], b"GET");
        let mut f = BytesMut::with_capacity(8192);
        spare.give_read(&mut f, 4096);
        assert_eq!(f.capacity(), 0);
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        spare.give_write(&mut out, 4096);
        assert_eq!(out.capacity(), 0);
        let mut next = Vec::new();
        spare.take_write(&mut next);
        assert!(
            next.is_empty() && next.capacity() >= 512,
            "emptied, capacity kept"
        );
    }

    #[test]
    fn a_block_is_reused_and_its_future_dropped_in_place() {
        let dropped = Rc::new(std::cell::Cell::new(0));
        let make = |d: Rc<std::cell::Cell<u32>>| {
            let big = [7u8; 4096];
            async move {
                let _guard = Guard(d);
                std::future::ready(()).await;
                big.iter().map(|&b| u32::from(b)).sum::<u32>()
            }
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut first = Reused::new(|| make(dropped.clone()));
        let at = first.p.cast::<u8>();
        assert_eq!(Pin::new(&mut first).poll(&mut cx), Poll::Ready(7 * 4096));
        drop(first);
        assert_eq!(dropped.get(), 1);
        // The next future of that layout goes in the same block; dropped unfinished, it is
        // dropped all the same.
        let second = Reused::new(|| make(dropped.clone()));
        assert_eq!(second.p.cast::<u8>(), at, "the block is reused");
        drop(second);
        assert_eq!(dropped.get(), 1, "an unstarted future holds no guard yet");
        let mut third = Reused::new(|| make(dropped.clone()));
        let _ = Pin::new(&mut third).poll(&mut cx);
        drop(third);
        assert_eq!(dropped.get(), 2);
    }

    #[test]
    fn run_or_spawn_finishes_here_or_in_a_task_and_keeps_a_panic_to_itself() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            // Done in the first poll: before run_or_spawn returns.
            let done = Rc::new(std::cell::Cell::new(0));
            let d = done.clone();
            run_or_spawn(move || async move { d.set(1) });
            assert_eq!(done.get(), 1);
            // Waits: goes on in a task, woken by the task's own waker (the first poll's
            // does nothing).
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            let d = done.clone();
            run_or_spawn(move || async move { d.set(rx.await.unwrap_or(0)) });
            assert_eq!(done.get(), 1);
            tx.send(2).expect("receiver waits");
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while done.get() != 2 && std::time::Instant::now() < until {
                tokio::task::yield_now().await;
            }
            assert_eq!(done.get(), 2);
            // A panic in the first poll ends that future only; its state is dropped.
            let dropped = Rc::new(std::cell::Cell::new(0));
            let g = Guard(dropped.clone());
            run_or_spawn(move || async move {
                let _g = g;
                panic!("one connection's bug");
            });
            assert_eq!(dropped.get(), 1);
        });
    }

    struct Guard(Rc<std::cell::Cell<u32>>);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }
}
