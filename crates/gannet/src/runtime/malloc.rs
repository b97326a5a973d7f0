//! glibc malloc settings for the worker processes.
//!
//! Each worker thread allocates from its own glibc arena (a non-main heap). With glibc's
//! defaults a heap is trimmed whenever more than 128 KiB is free at its top: every
//! connection that ends frees its buffers, the heap shrinks with `madvise(MADV_DONTNEED)`,
//! and the next connection faults the same pages back in, zero-filled by the kernel.
//! Measured on the stream proxy's short sessions (a connection, 1 KB each way, closed):
//! 4 page faults and 0.14 `madvise` per session, and about a third of the worker's CPU
//! per session, where nginx (its own pools) takes 0.4 faults and HAProxy none.
//!
//! So the worker keeps up to `TRIM_THRESHOLD` free at the top of a heap (what a busy
//! worker's churn of connection buffers needs, bounded), and blocks of up to
//! `MMAP_THRESHOLD` come from the heap rather than a fresh `mmap` each time (setting the
//! trim threshold turns off glibc's own adaptive threshold, which would otherwise do this).
//! Memory stays bounded: what is kept free is at most this much per arena, returned to the
//! kernel above it.

/// Free memory kept at the top of an arena before it is given back.
const TRIM_THRESHOLD: i32 = 32 << 20;
/// Allocations from this size up are served by their own `mmap`.
const MMAP_THRESHOLD: i32 = 4 << 20;

/// Sets the thresholds; called once per worker process before its threads start.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocator parameters (plain integers, no pointers);
    // it is thread-safe and valid at any time; a refused value leaves the default in place.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// The process's allocator: the system's (glibc's `malloc`), but for blocks aligned past what
/// `malloc` guarantees, which are carved out of a slightly larger `malloc` block by hand.
///
/// Why: tokio aligns every task to 128 bytes (its cells are cache-line padded), so each
/// connection's task came from `posix_memalign`, whose `_int_memalign` takes a block of
/// size + alignment, splits the aligned part out and frees the rest back into the bins:
/// about 650 instructions per spawn where a plain `malloc` takes about 100, a tenth of a
/// short stream session's user-space instructions (counted with callgrind,
/// docs/bench/l4-proxy-report.md). The price is up to the alignment in bytes per such block
/// (128 per task), the part before the aligned address, where the `malloc` block's own
/// address is kept for the free.
pub struct Malloc;

/// What `malloc` aligns every block to at least (two words on glibc; a word anywhere), and
/// the room the header takes: an over-aligned block starts at least this far into its
/// `malloc` block.
const MALLOC_ALIGN: usize = 2 * std::mem::size_of::<usize>();
/// Alignments above this (page-aligned buffers) still go to `posix_memalign`: the waste of
/// the carving would be too large.
const MAX_CARVED_ALIGN: usize = 256;

fn carved(layout: &std::alloc::Layout) -> bool {
    layout.align() > MALLOC_ALIGN && layout.align() <= MAX_CARVED_ALIGN
}

// SAFETY: every block is either the system allocator's (layouts that are not `carved`) or
// carved as described at `alloc`; `dealloc` and `realloc` tell the two apart by the layout,
// which Rust guarantees is the one the block was allocated with.
unsafe impl std::alloc::GlobalAlloc for Malloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if !carved(&layout) {
            // SAFETY: the caller's contract (a non-zero size) is passed on as it is.
            return unsafe { std::alloc::System.alloc(layout) };
        }
        let align = layout.align();
        let Some(total) = layout.size().checked_add(align) else {
            return std::ptr::null_mut();
        };
        // SAFETY: malloc takes any size and returns null or a block of `total` bytes aligned
        // to MALLOC_ALIGN.
        let raw = unsafe { libc::malloc(total) }.cast::<u8>();
        if raw.is_null() {
            return raw;
        }
        // The first `align`-aligned address at least MALLOC_ALIGN bytes into the block: `raw`
        // is MALLOC_ALIGN-aligned and `align` a larger power of two, so the distance is
        // between MALLOC_ALIGN and `align`, and `size` bytes from there end within `total`.
        let offset = align - (raw as usize & (align - 1));
        // SAFETY: `offset <= align`, so `p` and the `size` bytes after it are inside the
        // block; the word before `p` is too (`offset >= MALLOC_ALIGN >= a word`), and it is
        // word-aligned since `p` is `align`-aligned.
        unsafe {
            let p = raw.add(offset);
            p.cast::<*mut u8>().sub(1).write(raw);
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if !carved(&layout) {
            // SAFETY: a block of this layout came from the system allocator (see `alloc`).
            return unsafe { std::alloc::System.dealloc(ptr, layout) };
        }
        // SAFETY: a carved block has its `malloc` block's address in the word before it.
        unsafe { libc::free(ptr.cast::<*mut u8>().sub(1).read().cast()) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if !carved(&layout) {
            // SAFETY: as `alloc`.
            return unsafe { std::alloc::System.alloc_zeroed(layout) };
        }
        // SAFETY: as `alloc`; a non-null block has `size` writable bytes.
        unsafe {
            let p = self.alloc(layout);
            if !p.is_null() {
                p.write_bytes(0, layout.size());
            }
            p
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if !carved(&layout) {
            // SAFETY: a block of this layout came from the system allocator (see `alloc`).
            return unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: the caller guarantees `new_size` with this alignment is a valid layout;
        // the old block holds `layout.size()` bytes, the new one `new_size`.
        unsafe {
            let new = std::alloc::Layout::from_size_align_unchecked(new_size, layout.align());
            let p = self.alloc(new);
            if !p.is_null() {
                std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout};

    #[test]
    fn carved_blocks_are_aligned_writable_and_freed() {
        let a = Malloc;
        for align in [32, 64, 128, 256] {
            for size in [1, 24, 200, 1000] {
                let l = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; the block is written within its size, then freed
                // with its layout.
                unsafe {
                    let p = a.alloc(l);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0);
                    p.write_bytes(0xa5, size);
                    let z = a.alloc_zeroed(l);
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    let q = a.realloc(p, l, size * 3);
                    assert_eq!(q as usize % align, 0);
                    assert!(std::slice::from_raw_parts(q, size)
                        .iter()
                        .all(|&b| b == 0xa5));
                    a.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    a.dealloc(z, l);
                }
            }
        }
    }
}
