//! The process: the master thread (signals, pid file) and the worker threads, each a
//! single-threaded event loop with its own listening sockets and caches.

pub mod clock;
pub mod listener;
pub mod log_reopen;
pub mod master;
pub mod parking;
pub mod placement;
pub mod read_timers;
pub mod worker;

use std::sync::OnceLock;

/// `$hostname`.
pub fn hostname() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    })
}
