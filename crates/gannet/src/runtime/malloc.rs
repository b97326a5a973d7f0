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
