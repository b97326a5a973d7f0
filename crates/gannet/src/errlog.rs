//! The error log (`error_log path level`): process-wide, lines in nginx's layout
//! `YYYY/MM/DD HH:MM:SS [level] PID#TID: message`, written with one `write` each to a file
//! opened `O_APPEND` (or stderr).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Notice,
    Warn,
    Error,
    Crit,
    Alert,
    Emerg,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "debug" => Level::Debug,
            "info" => Level::Info,
            "notice" => Level::Notice,
            "warn" => Level::Warn,
            "error" => Level::Error,
            "crit" => Level::Crit,
            "alert" => Level::Alert,
            "emerg" => Level::Emerg,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Notice => "notice",
            Level::Warn => "warn",
            Level::Error => "error",
            Level::Crit => "crit",
            Level::Alert => "alert",
            Level::Emerg => "emerg",
        }
    }
}

struct ErrLog {
    level: Level,
    file: Option<(File, PathBuf)>,
}

static LOG: OnceLock<ErrLog> = OnceLock::new();

/// Open the error log. Until this is called, messages at `error` and above go to stderr.
pub fn init(path: Option<&Path>, level: Level) -> std::io::Result<()> {
    let file = match path {
        Some(p) => Some((
            OpenOptions::new().create(true).append(true).open(p)?,
            p.to_path_buf(),
        )),
        None => None,
    };
    let _ = LOG.set(ErrLog { level, file });
    Ok(())
}

pub fn log(level: Level, args: fmt::Arguments) {
    let (min, file) = match LOG.get() {
        Some(l) => (l.level, l.file.as_ref().map(|(f, _)| f)),
        None => (Level::Error, None),
    };
    if level < min {
        return;
    }
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    let line = format!(
        "{} [{}] {}#{}: {}\n",
        crate::runtime::clock::log_time(),
        level.name(),
        std::process::id(),
        tid,
        args
    );
    match file {
        Some(mut f) => {
            let _ = f.write_all(line.as_bytes());
        }
        None => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// A message about a request, with nginx's context:
/// `*CONN message, client: IP, server: NAME, request: "LINE", host: "HOST"`.
pub fn request(level: Level, req: &crate::http::request::Request, args: fmt::Arguments) {
    if LOG.get().map_or(Level::Error, |l| l.level) > level {
        return;
    }
    let raw = req.head.raw();
    let line_end = memchr::memchr(b'\n', raw).unwrap_or(raw.len());
    let line = String::from_utf8_lossy(
        raw[..line_end]
            .strip_suffix(b"\r")
            .unwrap_or(&raw[..line_end]),
    );
    let mut ctx = format!(
        ", client: {}, server: {}, request: \"{line}\"",
        req.client().ip(),
        req.server.primary_name
    );
    if let Some(h) = req.head.header("host") {
        ctx.push_str(&format!(", host: \"{}\"", String::from_utf8_lossy(h)));
    }
    log(level, format_args!("*{} {args}{ctx}", req.conn.id));
}

/// Reopen the error log file by its name (SIGUSR1); nothing to do when it is stderr.
pub fn reopen() -> std::io::Result<()> {
    match LOG.get().and_then(|l| l.file.as_ref()) {
        Some((f, p)) => crate::runtime::log_reopen::reopen_in_place(f, p),
        None => Ok(()),
    }
}

pub fn error(args: fmt::Arguments) {
    log(Level::Error, args)
}
pub fn warn(args: fmt::Arguments) {
    log(Level::Warn, args)
}
pub fn notice(args: fmt::Arguments) {
    log(Level::Notice, args)
}

/// The error log file, if not stderr (the master passes its descriptor to worker processes
/// when it reopens it).
pub fn file() -> Option<&'static File> {
    LOG.get().and_then(|l| l.file.as_ref().map(|(f, _)| f))
}
