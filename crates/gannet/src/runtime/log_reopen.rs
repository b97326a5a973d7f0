//! SIGUSR1 (`gannet -s reopen`): reopen the error logs and every access log by name, for
//! logrotate.
//!
//! Each log is reopened in place: the path is opened again (created if logrotate moved the
//! old file away) and the new file is `dup2`ed over the descriptor gannet already writes
//! to. Workers keep their `File`s and take no lock; a write that races the swap goes
//! wholly to the old file or wholly to the new one.
//!
//! The master (root) does the opening: a worker process, which may run as an unprivileged
//! user, gets the master's reopened descriptors over its channel and `dup2`s them over its
//! own copies the same way.

use crate::config::Config;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
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
        for log in cfg.stream.iter().flat_map(|s| &s.logs) {
            if let Err(e) = log.reopen() {
                crate::errlog::error(format_args!("open() \"{}\" failed ({e})", log.name()));
            }
        }
    }
    crate::errlog::notice(format_args!("reopened the log files"));
}

/// The log descriptors a worker process of `config` writes to that the master reopens, by
/// index: the main error logs, then `config.error_files`, then `config.log_files`, then the
/// stream block's access logs, each
/// counted whether or not it is a file (so master and worker, holding the same config,
/// number them alike). The master sends its own, reopened ones under these indices
/// (`adopt`).
pub fn descriptors(config: &Config) -> Vec<(u32, RawFd)> {
    let errors = config.error_files.iter().map(|l| l.reopened_fd());
    let access = config.log_files.iter().map(|l| l.reopened_fd());
    let stream = config.stream.iter().flat_map(|s| &s.logs);
    (0u32..)
        .zip(
            crate::errlog::main_fds()
                .into_iter()
                .chain(errors)
                .chain(access)
                .chain(stream.map(|l| l.reopened_fd())),
        )
        .filter_map(|(i, fd)| fd.map(|fd| (i, fd)))
        .collect()
}

/// In a worker process: put the files the master reopened (and passed, `descriptors`'
/// indices) in place of the ones it writes to. The worker may not be allowed to open the
/// paths itself (they belong to root), so it never tries.
pub fn adopt(config: &Config, fds: Vec<(u32, OwnedFd)>) {
    let own = descriptors(config);
    for (index, fresh) in fds {
        let Some(&(_, target)) = own.iter().find(|(i, _)| *i == index) else {
            continue;
        };
        // SAFETY: `target` is a descriptor of a log file `config` (or the error log) owns
        // and keeps open for the life of the process; `fresh` is open and closed by its drop
        // after dup2 atomically replaced `target`'s table entry.
        if unsafe { libc::dup2(fresh.as_raw_fd(), target) } < 0 {
            crate::errlog::error(format_args!(
                "adopting a reopened log file failed ({})",
                io::Error::last_os_error()
            ));
        }
    }
}
