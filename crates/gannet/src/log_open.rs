//! Where a log goes: a file by its path (opened `O_APPEND`, created if missing), or the
//! descriptors gannet inherited, for `/dev/stdout` and `/dev/stderr` (and the error log's
//! `stderr`).
//!
//! Opening `/dev/stdout` by its name makes a second open file description of whatever fd 1
//! is, with its own offset: run as `gannet > server.log 2>&1`, access lines written through
//! it and error lines written to fd 2 overwrite each other. A duplicate of the inherited
//! descriptor shares the shell's description instead, and with it the offset and the
//! `O_APPEND` flag (set when the shell opened the file with `>>`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// A log destination as the config names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    File(PathBuf),
    Stdout,
    Stderr,
}

impl Target {
    /// `arg` as written in `access_log` / `error_log`; relative paths resolve against `prefix`.
    /// `stderr` is a keyword of `error_log` only (for `access_log` it is a file name, as in
    /// nginx).
    pub fn parse(arg: &str, prefix: &Path, stderr_keyword: bool) -> Target {
        match arg {
            "/dev/stdout" => Target::Stdout,
            "/dev/stderr" => Target::Stderr,
            "stderr" if stderr_keyword => Target::Stderr,
            p => Target::File(prefix.join(p)),
        }
    }

    /// The path to reopen on SIGUSR1; `None` for an inherited descriptor, which has no name
    /// to reopen (logrotate cannot move it away either).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Target::File(p) => Some(p),
            Target::Stdout | Target::Stderr => None,
        }
    }

    /// Open it: the file for appending, or a duplicate of fd 1 / fd 2.
    pub fn open(&self) -> io::Result<File> {
        match self {
            Target::File(p) => OpenOptions::new().create(true).append(true).open(p),
            Target::Stdout => Ok(File::from(io::stdout().as_fd().try_clone_to_owned()?)),
            Target::Stderr => Ok(File::from(io::stderr().as_fd().try_clone_to_owned()?)),
        }
    }

    /// How the config's error messages name it.
    pub fn display(&self) -> String {
        match self {
            Target::File(p) => p.display().to_string(),
            Target::Stdout => "/dev/stdout".to_string(),
            Target::Stderr => "stderr".to_string(),
        }
    }
}
