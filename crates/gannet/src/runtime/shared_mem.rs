//! Anonymous memory that the master maps before it forks, so that every worker process
//! shares it (nginx's shared zones): the connection counters, the metrics, the cache's index
//! and the kept upstream addresses. One place for the `mmap` call and its checks.

use std::io;
use std::ptr::NonNull;

/// `len` bytes of zero-filled, page-aligned memory, shared with the processes forked after
/// this call (`shared`) or private to this one. Never unmapped by this module: the callers
/// keep it for the process's life or unmap it themselves.
pub fn map(len: usize, shared: bool) -> io::Result<NonNull<u8>> {
    let share = if shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    // SAFETY: a new anonymous mapping with no address hint touches no existing memory; the
    // result is checked before it is used.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            share | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned a null address"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn maps_zeroed_writable_memory_and_refuses_an_empty_length() {
        let p = super::map(4096, true).expect("a page");
        // SAFETY: the page was just mapped read-write for 4096 bytes.
        let page = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), 4096) };
        assert!(page.iter().all(|&b| b == 0));
        page[4095] = 7;
        assert_eq!(page[4095], 7);
        assert!(super::map(0, false).is_err());
    }
}
