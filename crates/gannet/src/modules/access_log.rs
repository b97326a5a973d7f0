//! `log_format name [escape=default|none] string ...;` and
//! `access_log path|syslog:... [format [buffer=size] [flush=time] [if=condition]] | off;`.
//!
//! `syslog:server=...` sends each line as one datagram (see `syslog`), unbuffered as nginx
//! requires; `if=` skips the line when the condition is empty or `0`.
//!
//! Lines are built in nginx's formats (the predefined `combined` byte for byte) and kept in
//! a per-worker buffer per file, written with one `write` to a file opened `O_APPEND` when
//! the buffer fills, when `flush` time has passed, or when the worker stops. Without
//! `buffer=` each line is written at once, as in nginx. Unlike nginx, gannet has no access
//! log until `access_log` is set (nginx's default `logs/access.log` rarely exists where gannet
//! runs).

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::request::Request;
use crate::http::variables::{Sent, Template};
use crate::log_open::Target;
use crate::syslog::{is_syslog, Peer};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "log_format",
        ctx: Ctx::HTTP,
        args: Args::AtLeast(2),
        block: false,
    },
    Spec {
        name: "access_log",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::AtLeast(1),
        block: false,
    },
];

pub const COMBINED: &str =
    "$remote_addr - $remote_user [$time_local] \"$request\" $status $body_bytes_sent \"$http_referer\" \"$http_user_agent\"";

#[derive(Debug)]
pub struct LogFormat {
    pub template: Template,
    /// `escape=none` writes values as they are.
    pub escape: bool,
}

/// An open log, shared by all workers; each worker buffers its own lines.
#[derive(Debug)]
pub struct LogFile {
    pub id: usize,
    out: Output,
    pub format: Arc<LogFormat>,
    pub buffer: usize,
    /// Without `flush=`, a buffer is written only when full or when the worker stops.
    pub flush: Option<Duration>,
    /// `if=`: the line is written unless this is empty or `0`.
    pub filter: Option<Template>,
}

#[derive(Debug)]
enum Output {
    /// The file and, unless it is an inherited descriptor (`/dev/stdout`, `/dev/stderr`),
    /// its path for reopening (SIGUSR1).
    File(File, Option<PathBuf>),
    Syslog(Peer),
}

impl LogFile {
    /// Write whole lines (a syslog log is never buffered, so it gets one line at a time).
    pub fn write(&self, lines: &[u8]) -> std::io::Result<()> {
        match &self.out {
            Output::File(f, _) => (&*f).write_all(lines),
            Output::Syslog(p) => p.send(p.severity, lines),
        }
    }

    /// Reopen the file by its name; nothing to do for the other outputs.
    pub fn reopen(&self) -> std::io::Result<()> {
        match &self.out {
            Output::File(f, Some(p)) => crate::runtime::log_reopen::reopen_in_place(f, p),
            _ => Ok(()),
        }
    }

    /// The descriptor [`LogFile::reopen`] replaces, if it is a file opened by name.
    pub fn reopened_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.out {
            Output::File(f, Some(_)) => Some(std::os::fd::AsRawFd::as_raw_fd(f)),
            _ => None,
        }
    }

    /// The path logged when reopening fails.
    pub fn name(&self) -> String {
        match &self.out {
            Output::File(_, Some(p)) => p.display().to_string(),
            Output::File(_, None) => "(inherited descriptor)".to_string(),
            Output::Syslog(_) => "syslog".to_string(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct LogConf {
    /// `Some(empty)` is `access_log off`.
    pub logs: Option<Arc<Vec<Arc<LogFile>>>>,
}

impl LogConf {
    pub fn merge(&mut self, p: &LogConf) {
        inherit!(self, p, logs);
    }
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// Open a log for appending (created if missing), or duplicate the inherited stdout/stderr.
fn open_log(target: &Target, d: &Directive) -> Result<File, ConfError> {
    target
        .open()
        .map_err(|e| d.error(format!("open() \"{}\" failed ({e})", target.display())))
}

pub fn set(d: &Directive, lc: &mut LocConf, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if d.name == "log_format" {
        let (escape, start) = match d.args[1].strip_prefix("escape=") {
            Some("default") | Some("json") => (true, 2),
            Some("none") => (false, 2),
            Some(v) => return Err(invalid(d, v)),
            None => (true, 1),
        };
        if d.args[0] == "combined" {
            return Err(d.error("duplicate \"log_format\" name \"combined\""));
        }
        let text: String = d.args[start..].concat();
        let template = Template::compile(&text).map_err(|e| d.error(e))?;
        ctx.log_formats
            .insert(d.args[0].clone(), Arc::new(LogFormat { template, escape }));
        return Ok(());
    }
    if d.args[0] == "off" {
        lc.log.logs = Some(Arc::new(Vec::new()));
        return Ok(());
    }
    let syslog = if is_syslog(&d.args[0]) {
        Some(Peer::parse(&d.args[0], d)?)
    } else {
        None
    };
    let format = match d.args.get(1) {
        None => ctx.log_formats.get("combined").cloned(),
        Some(name) => ctx.log_formats.get(name).cloned(),
    }
    .ok_or_else(|| d.error(format!("unknown log format \"{}\"", d.args[1])))?;
    let (mut buffer, mut flush, mut filter) = (0usize, None, None);
    for a in d.args.iter().skip(2) {
        if let Some(v) = a.strip_prefix("buffer=") {
            buffer = setters::size(v).ok_or_else(|| invalid(d, a))? as usize;
        } else if let Some(v) = a.strip_prefix("flush=") {
            flush = Some(Duration::from_millis(
                setters::msec(v).ok_or_else(|| invalid(d, a))?,
            ));
        } else if let Some(v) = a.strip_prefix("if=") {
            filter = Some(Template::compile(v).map_err(|e| d.error(e))?);
        } else {
            return Err(d.error(format!(
                "parameter \"{a}\" of \"access_log\" is not supported"
            )));
        }
    }
    let out = match syslog {
        Some(_) if buffer > 0 => return Err(d.error("logs to syslog cannot be buffered")),
        Some(peer) => Output::Syslog(peer),
        None => {
            let target = Target::parse(&d.args[0], &ctx.prefix, false);
            let file = open_log(&target, d)?;
            Output::File(file, target.path().map(Path::to_path_buf))
        }
    };
    let log = Arc::new(LogFile {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        out,
        format,
        buffer,
        flush,
        filter,
    });
    ctx.log_files.push(log.clone());
    let mut logs = match &lc.log.logs {
        Some(l) if !l.is_empty() => (**l).clone(),
        _ => Vec::new(),
    };
    logs.push(log);
    lc.log.logs = Some(Arc::new(logs));
    Ok(())
}

/// The predefined formats every http block starts with.
pub fn predefined() -> std::collections::HashMap<String, Arc<LogFormat>> {
    let mut m = std::collections::HashMap::new();
    if let Ok(template) = Template::compile(COMBINED) {
        m.insert(
            "combined".to_string(),
            Arc::new(LogFormat {
                template,
                escape: true,
            }),
        );
    }
    m
}

/// Build the line for one request into `out` (with its newline).
pub fn format_line(f: &LogFormat, req: &Request, sent: &Sent, out: &mut Vec<u8>) {
    if f.escape {
        f.template.eval_log(req, sent, out);
    } else {
        out.extend_from_slice(f.template.eval(req, Some(sent)).as_bytes());
    }
    out.push(b'\n');
}
