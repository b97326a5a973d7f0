//! The error log, as nginx's `error_log`: lines in nginx's layout
//! `YYYY/MM/DD HH:MM:SS [level] PID#TID: message`, each written with one `write`.
//!
//! `error_log` may be given several times at one level, each with its own destination and
//! level; a line goes to every log whose level admits it. Destinations: a file (`O_APPEND`),
//! `stderr`, `/dev/stdout` / `/dev/stderr` (the inherited descriptors, see `log_open`), or
//! `syslog:...` (see `syslog`). The main context's logs get the messages that concern
//! no request; an `error_log` in http, server or location replaces them for the messages
//! about a request handled there, as nginx's per-location error logs do.

use crate::log_open::Target;
use crate::syslog::{self, Peer};
use gannet_conf::{ConfError, Directive};
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

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
        syslog::SEVERITIES[self.severity() as usize]
    }
    /// Syslog's severity: 0 for emerg .. 7 for debug.
    fn severity(self) -> u8 {
        Level::Emerg as u8 - self as u8
    }
}

/// Where one `error_log` writes, as configured (opened by [`Spec::open`]).
#[derive(Debug, Clone)]
pub enum Dest {
    Target(Target),
    Syslog(Arc<Peer>),
}

/// One `error_log` directive, parsed.
#[derive(Debug, Clone)]
pub struct Spec {
    pub dest: Dest,
    pub level: Level,
}

impl Spec {
    /// `error_log dest [level]` (the level defaults to `error`).
    pub fn parse(d: &Directive, prefix: &Path) -> Result<Spec, ConfError> {
        let level = match d.args.get(1) {
            Some(l) => {
                Level::parse(l).ok_or_else(|| d.error(format!("invalid log level \"{l}\"")))?
            }
            None => Level::Error,
        };
        let dest = if syslog::is_syslog(&d.args[0]) {
            Dest::Syslog(Arc::new(Peer::parse(&d.args[0], d)?))
        } else {
            Dest::Target(Target::parse(&d.args[0], prefix, true))
        };
        Ok(Spec { dest, level })
    }

    /// The default when the config names none: stderr at `error`.
    pub fn stderr() -> Spec {
        Spec {
            dest: Dest::Target(Target::Stderr),
            level: Level::Error,
        }
    }

    pub fn open(&self) -> io::Result<Arc<Log>> {
        let out = match &self.dest {
            // fd 2 itself: nothing to open, and it follows a daemon's redirection to /dev/null.
            Dest::Target(Target::Stderr) => Out::Stderr,
            Dest::Target(t) => Out::File(t.open()?, t.path().map(Path::to_path_buf)),
            Dest::Syslog(p) => Out::Syslog(p.clone()),
        };
        Ok(Arc::new(Log {
            level: self.level,
            out,
        }))
    }

    /// How an `open()` failure names it.
    pub fn display(&self) -> String {
        match &self.dest {
            Dest::Target(t) => t.display(),
            Dest::Syslog(_) => "syslog".to_string(),
        }
    }
}

#[derive(Debug)]
enum Out {
    /// The file and, unless it is an inherited descriptor, its path for reopening.
    File(File, Option<PathBuf>),
    Stderr,
    Syslog(Arc<Peer>),
}

/// One open error log.
#[derive(Debug)]
pub struct Log {
    level: Level,
    out: Out,
}

impl Log {
    fn write(&self, level: Level, line: &[u8]) {
        let _ = match &self.out {
            Out::File(f, _) => (&*f).write_all(line),
            Out::Stderr => io::stderr().write_all(line),
            Out::Syslog(p) => p.send(level.severity(), line),
        };
    }

    /// Reopen the file by its name (SIGUSR1); nothing to do for the other destinations.
    pub fn reopen(&self) -> io::Result<()> {
        match &self.out {
            Out::File(f, Some(p)) => crate::runtime::log_reopen::reopen_in_place(f, p),
            _ => Ok(()),
        }
    }

    /// The descriptor [`Log::reopen`] replaces, if it is a file opened by name.
    pub fn reopened_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.out {
            Out::File(f, Some(_)) => Some(std::os::fd::AsRawFd::as_raw_fd(f)),
            _ => None,
        }
    }
}

/// The error logs of one level of the config (main, or an http/server/location).
#[derive(Debug, Default)]
pub struct ErrorLogs {
    logs: Vec<Arc<Log>>,
    /// The lowest level any of them admits: below it, a message is not even formatted.
    min: Option<Level>,
}

impl ErrorLogs {
    /// These logs plus `log` (for a second `error_log` at the same level).
    pub fn with(&self, log: Arc<Log>) -> ErrorLogs {
        let mut logs = self.logs.clone();
        logs.push(log);
        let min = logs.iter().map(|l| l.level).min();
        ErrorLogs { logs, min }
    }

    fn admits(&self, level: Level) -> bool {
        self.min.is_some_and(|m| level >= m)
    }

    fn write(&self, level: Level, args: fmt::Arguments) {
        self.write_to(level, args, false);
    }

    /// `all`: to every log whatever its level (`debug_connection`).
    fn write_to(&self, level: Level, args: fmt::Arguments, all: bool) {
        if !all && !self.admits(level) {
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
        for log in self.logs.iter().filter(|l| all || level >= l.level) {
            log.write(level, line.as_bytes());
        }
    }
}

/// `error_log` in a stream or mail block (`in_server`: a server's): the first at a server
/// level replaces the logs it inherited (`own` says it has its own), the next add to them.
pub fn set_block(
    d: &Directive,
    prefix: &Path,
    (logs, own): (&mut Option<Arc<ErrorLogs>>, &mut bool),
    in_server: bool,
    opened: &mut Vec<Arc<Log>>,
) -> Result<(), ConfError> {
    if d.args.is_empty() || d.args.len() > 2 {
        return Err(d.error("invalid number of arguments in \"error_log\" directive"));
    }
    if in_server && !*own {
        *logs = None;
    }
    *own = in_server;
    set_nested(d, prefix, logs, opened)
}

/// `error_log` in http, server or location: add it to that level's logs (`logs`), and to
/// `opened` for reopening.
pub fn set_nested(
    d: &Directive,
    prefix: &Path,
    logs: &mut Option<Arc<ErrorLogs>>,
    opened: &mut Vec<Arc<Log>>,
) -> Result<(), ConfError> {
    let spec = Spec::parse(d, prefix)?;
    let log = spec
        .open()
        .map_err(|e| d.error(format!("open() \"{}\" failed ({e})", spec.display())))?;
    opened.push(log.clone());
    let base = logs.take().unwrap_or_default();
    *logs = Some(Arc::new(base.with(log)));
    Ok(())
}

/// The main context's logs. Until [`init`], messages at `error` and above go to stderr.
static MAIN: RwLock<Option<Arc<ErrorLogs>>> = RwLock::new(None);

/// The main logs' lowest level (`Level as u8`; [`NO_MIN`]: no logs or none admit
/// anything), written with [`MAIN`]: [`admits`] is asked several times per stream session,
/// and taking the lock and cloning the `Arc` for that was most of what asking cost.
static MAIN_MIN: AtomicU8 = AtomicU8::new(UNSET);
/// `MAIN_MIN` before [`init`]: `error` and above go to stderr.
const UNSET: u8 = u8::MAX;
const NO_MIN: u8 = u8::MAX - 1;

fn main_logs() -> Option<Arc<ErrorLogs>> {
    MAIN.read().ok().and_then(|m| m.clone())
}

/// Open the main context's logs (stderr at `error` when `specs` is empty) and use them from
/// now on; called again, it replaces them (`-e` names a log for the start, the config's
/// replace it).
pub fn init(specs: &[Spec]) -> Result<(), String> {
    let default = [Spec::stderr()];
    let specs = if specs.is_empty() {
        &default[..]
    } else {
        specs
    };
    let mut logs = ErrorLogs::default();
    for s in specs {
        let log = s
            .open()
            .map_err(|e| format!("could not open error log {}: {e}", s.display()))?;
        logs = logs.with(log);
    }
    if let Ok(mut m) = MAIN.write() {
        MAIN_MIN.store(logs.min.map_or(NO_MIN, |l| l as u8), Ordering::Relaxed);
        *m = Some(Arc::new(logs));
    }
    Ok(())
}

tokio::task_local! {
    /// The error logs of the stream server whose session the task serves (its
    /// `error_log`s), for every message written while it runs.
    static SCOPE: Arc<ErrorLogs>;
}

/// Run `f` with `logs` (a stream server's `error_log`s) in place of the main logs for
/// the messages it writes; `None`: the main logs.
pub async fn scoped<F: std::future::Future>(logs: Option<Arc<ErrorLogs>>, f: F) -> F::Output {
    match logs {
        Some(l) => SCOPE.scope(l, f).await,
        None => f.await,
    }
}

/// Whether a message at `level` would be written (in a stream session's scope: its
/// logs), so a caller can skip building what only such a line needs.
pub fn admits(level: Level) -> bool {
    match SCOPE.try_with(|l| l.admits(level)) {
        Ok(yes) => yes,
        Err(_) => match MAIN_MIN.load(Ordering::Relaxed) {
            UNSET => level >= Level::Error,
            min => (level as u8) >= min,
        },
    }
}

pub fn log(level: Level, args: fmt::Arguments) {
    if let Ok(l) = SCOPE.try_with(Arc::clone) {
        return l.write(level, args);
    }
    match main_logs() {
        Some(l) => l.write(level, args),
        None => ErrorLogs::default()
            .with(Arc::new(Log {
                level: Level::Error,
                out: Out::Stderr,
            }))
            .write(level, args),
    }
}

/// A message about a request, with nginx's context:
/// `*CONN message, client: IP, server: NAME, request: "LINE", host: "HOST"`; it goes to the
/// error logs of the request's location (the main ones unless http/server/location set some).
pub fn request(level: Level, req: &crate::http::request::Request, args: fmt::Arguments) {
    let logs = match &req.conf.error_log {
        Some(l) => l.clone(),
        None => match main_logs() {
            Some(l) => l,
            None if level >= Level::Error => {
                return log(level, format_args!("{}", Context(req, args)))
            }
            None => return,
        },
    };
    if logs.admits(level) {
        logs.write(level, format_args!("{}", Context(req, args)));
    } else if debugged(req) {
        logs.write_to(level, format_args!("{}", Context(req, args)), true);
    }
}

/// Whether a line at `level` for `req` goes to one of its logs (the context's, else the
/// main ones).
pub fn admits_for(req: &crate::http::request::Request, level: Level) -> bool {
    match &req.conf.error_log {
        Some(l) => l.admits(level),
        // Read under the lock, not cloned: asked twice per request (the debug lines), the
        // `Arc`'s two atomic counts showed in callgrind.
        None => MAIN
            .read()
            .is_ok_and(|m| m.as_ref().is_some_and(|l| l.admits(level))),
    }
}

/// Whether the request's client is one `debug_connection` names: its lines go to every
/// error log whatever the log's level, as nginx raises that connection's log to debug.
/// Only asked for a line a log would otherwise leave out.
pub fn debugged(req: &crate::http::request::Request) -> bool {
    let Some(w) = crate::runtime::worker::current() else {
        return false;
    };
    let peers = &w.config.main.debug_connection;
    if peers.is_empty() {
        return false;
    }
    let ip = req.conn.unix.is_none().then(|| req.conn.peer.ip());
    crate::config::main_conf::debugged(peers, ip)
}

/// A request message followed by nginx's context.
struct Context<'a>(&'a crate::http::request::Request, fmt::Arguments<'a>);

impl fmt::Display for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let req = self.0;
        let raw = req.head.raw();
        let line_end = memchr::memchr(b'\n', raw).unwrap_or(raw.len());
        let line = String::from_utf8_lossy(
            raw[..line_end]
                .strip_suffix(b"\r")
                .unwrap_or(&raw[..line_end]),
        );
        write!(
            f,
            "*{} {}, client: {}, server: {}, request: \"{line}\"",
            req.conn.id,
            self.1,
            ClientAddr(req),
            req.server.primary_name
        )?;
        if let Some(h) = req.head.header("host") {
            write!(f, ", host: \"{}\"", String::from_utf8_lossy(h))?;
        }
        Ok(())
    }
}

/// Reopen the main error log files by their names (SIGUSR1).
pub fn reopen() -> io::Result<()> {
    match main_logs() {
        Some(l) => l.logs.iter().try_for_each(|l| l.reopen()),
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

/// The main context's logs' descriptors, in order, where they are files reopened by name
/// (the master passes its reopened ones to worker processes).
pub fn main_fds() -> Vec<Option<std::os::fd::RawFd>> {
    main_logs().map_or_else(Vec::new, |l| {
        l.logs.iter().map(|l| l.reopened_fd()).collect()
    })
}

/// The client as an error log line names it: its address, or `unix:` (nginx).
struct ClientAddr<'a>(&'a crate::http::request::Request);

impl fmt::Display for ClientAddr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.unix_client() {
            f.write_str("unix:")
        } else {
            write!(f, "{}", self.0.client().ip())
        }
    }
}

/// The log's rendering of a failed call: `CALL "PATH" failed (ERRNO: TEXT)`, as nginx.
pub fn failed(call: &str, path: &std::path::Path, e: &std::io::Error) -> String {
    format!("{call} \"{}\" failed ({})", path.display(), errno_text(e))
}

/// `28: No space left on device`: nginx's form of an OS error (std's is the other way
/// round, with "os error").
pub fn errno_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let text = e.to_string();
            let suffix = format!(" (os error {n})");
            format!("{n}: {}", text.strip_suffix(&suffix).unwrap_or(&text))
        }
        None => e.to_string(),
    }
}
