//! The processes: the master (signals, pid file, binding, loading; keeps root) and a worker
//! process per config generation holding the worker threads, each a single-threaded event
//! loop with its own listening sockets and caches. See `master` for the model, and its
//! "Single process" for `master_process off`, where the worker threads run in the master.

pub mod activation;
pub mod channel;
pub mod clock;
pub mod conn_stats;
pub mod listener;
pub mod log_reopen;
pub mod malloc;
pub mod master;
pub mod metrics;
pub mod notify;
pub mod parking;
pub mod pid_file;
pub mod placement;
pub mod privileges;
pub mod read_timers;
pub mod shared_mem;
pub mod threads;
pub mod upgrade;
pub mod worker;
pub mod worker_process;

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
