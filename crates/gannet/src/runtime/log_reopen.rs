//! SIGUSR1 (`gannet -s reopen`): reopen the error logs and every access log by name, for
//! logrotate.
//!
//! Each log is reopened in place: the path is opened again (created if logrotate moved the
//! old file away) and the new file is `dup2`ed over the descriptor gannet already writes
//! to. Workers keep their `File`s and take no lock; a write that races the swap goes
//! wholly to the old file or wholly to the new one.

use crate::config::Config;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Point `file`'s descriptor at a fresh open of `path` (append mode, created if missing).
pub fn reopen_in_place(file: &File, path: &Path) -> io::Result<()> {
    let fresh = OpenOptions::new().create(true).append(true).open(path)?;
    // SAFETY: both descriptors are open for the duration of the call (`fresh` and `file`
    // are borrowed); dup2 atomically replaces `file`'s table entry and leaves `fresh` to be
    // closed by its drop.
    if unsafe { libc::dup2(fresh.as_raw_fd(), file.as_raw_fd()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reopen the error log and the access logs of every config still in use.
pub fn reopen_all<'a>(configs: impl Iterator<Item = &'a Config>) {
    if let Err(e) = crate::errlog::reopen() {
        crate::errlog::error(format_args!("reopening the error log failed ({e})"));
    }
    for cfg in configs {
        for log in &cfg.error_files {
            if let Err(e) = log.reopen() {
                crate::errlog::error(format_args!("reopening an error log failed ({e})"));
            }
        }
        for log in &cfg.log_files {
            if let Err(e) = log.reopen() {
                crate::errlog::error(format_args!("open() \"{}\" failed ({e})", log.name()));
            }
        }
    }
    crate::errlog::notice(format_args!("reopened the log files"));
}
