//! `log_format name [escape=default|none] string ...;` and
//! `access_log path [format [buffer=size] [flush=time]] | off;`.
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
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::fs::File;
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

/// An open log file, shared by all workers; each worker buffers its own lines.
#[derive(Debug)]
pub struct LogFile {
    pub id: usize,
    pub file: File,
    /// For reopening (SIGUSR1); `None` for `/dev/stdout` and `/dev/stderr`, which write to
    /// the inherited descriptors.
    pub path: Option<PathBuf>,
    pub format: Arc<LogFormat>,
    pub buffer: usize,
    /// Without `flush=`, a buffer is written only when full or when the worker stops.
    pub flush: Option<Duration>,
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
    let target = Target::parse(&d.args[0], &ctx.prefix, false);
    let format = match d.args.get(1) {
        None => ctx.log_formats.get("combined").cloned(),
        Some(name) => ctx.log_formats.get(name).cloned(),
    }
    .ok_or_else(|| d.error(format!("unknown log format \"{}\"", d.args[1])))?;
    let (mut buffer, mut flush) = (0usize, None);
    for a in d.args.iter().skip(2) {
        if let Some(v) = a.strip_prefix("buffer=") {
            buffer = setters::size(v).ok_or_else(|| invalid(d, a))? as usize;
        } else if let Some(v) = a.strip_prefix("flush=") {
            flush = Some(Duration::from_millis(
                setters::msec(v).ok_or_else(|| invalid(d, a))?,
            ));
        } else {
            return Err(d.error(format!(
                "parameter \"{a}\" of \"access_log\" is not supported"
            )));
        }
    }
    let file = open_log(&target, d)?;
    let log = Arc::new(LogFile {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        file,
        path: target.path().map(Path::to_path_buf),
        format,
        buffer,
        flush,
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
