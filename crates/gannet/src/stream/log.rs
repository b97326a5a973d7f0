//! `log_format` / `access_log` in the stream context (nginx's ngx_stream_log_module): one
//! line per session when it ends. Unlike http's there is no predefined format: a log names
//! its format, or nginx's "log format is not specified" stops the load. Values of
//! variables are escaped as nginx does (`escape=default`: `"`, `\` and bytes outside
//! printable ASCII as `\xXX`; `json`; `none`). `if=COND` skips lines whose condition is
//! empty or `0`. Lines are written as the session ends (`buffer=`/`flush=` are accepted
//! and write at once, which only makes lines appear sooner). SIGUSR1 reopens the files with
//! http's (`runtime::log_reopen`).

use super::core::LoadCtx;
use super::variables::{Session, Template};
use gannet_conf::{ConfError, Directive};
use std::fs::File;
use std::io::Write;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    Default,
    Json,
    None,
}

#[derive(Debug)]
pub struct Format {
    escape: Escape,
    /// The format's strings joined, compiled; each variable's value is escaped.
    parts: Vec<Template>,
}

#[derive(Debug)]
pub struct Log {
    /// `None` for a path with variables (opened per line, see `dynamic`).
    file: Option<File>,
    /// A path with variables (`access_log logs/$server_port.log ...`): evaluated and
    /// opened for every line, as nginx's ngx_stream_log_script_write without a cache.
    dynamic: Option<(Template, std::path::PathBuf)>,
    /// For reopening (SIGUSR1); `None` for an inherited descriptor (`/dev/stderr`).
    path: Option<std::path::PathBuf>,
    format: Arc<Format>,
    filter: Option<Template>,
}

/// `log_format NAME [escape=...] STRING...` (stream level only).
pub fn format(d: &Directive, ctx: &mut LoadCtx) -> Result<(), ConfError> {
    if d.args.len() < 2 {
        return Err(d.error("invalid number of arguments in \"log_format\" directive"));
    }
    let name = d.args[0].clone();
    if ctx.formats.contains_key(&name) {
        return Err(d.error(format!("duplicate \"log_format\" name \"{name}\"")));
    }
    let mut rest = &d.args[1..];
    let mut escape = Escape::Default;
    if let Some(e) = rest[0].strip_prefix("escape=") {
        escape = match e {
            "default" => Escape::Default,
            "json" => Escape::Json,
            "none" => Escape::None,
            _ => return Err(d.error(format!("unknown log format escaping \"{e}\""))),
        };
        rest = &rest[1..];
    }
    let mut parts = Vec::new();
    for s in rest {
        parts.push(Template::compile(s, &ctx.maps).map_err(|e| d.error(e))?);
    }
    ctx.formats.insert(name, Arc::new(Format { escape, parts }));
    Ok(())
}

/// `access_log PATH FORMAT [buffer=] [flush=] [gzip] [if=]` or `access_log off`.
pub fn access_log(d: &Directive, ctx: &LoadCtx) -> Result<Option<Arc<Log>>, ConfError> {
    if d.args.first().is_some_and(|a| a == "off") && d.args.len() == 1 {
        return Ok(None);
    }
    if d.args.len() < 2 {
        return Err(d.error("log format is not specified"));
    }
    let format = ctx
        .formats
        .get(&d.args[1])
        .cloned()
        .ok_or_else(|| d.error(format!("unknown log format \"{}\"", d.args[1])))?;
    let mut filter = None;
    for a in &d.args[2..] {
        if let Some(cond) = a.strip_prefix("if=") {
            filter = Some(Template::compile(cond, &ctx.maps).map_err(|e| d.error(e))?);
        } else if a.starts_with("buffer=") || a.starts_with("flush=") || a.starts_with("gzip") {
            // Written at once (see the module's header).
        } else {
            return Err(d.error(format!("invalid parameter \"{a}\"")));
        }
    }
    let target = crate::log_open::Target::parse(&d.args[0], &ctx.prefix, false);
    let dynamic = match d.args[0].contains('$') {
        true => Some((
            Template::compile(&d.args[0], &ctx.maps).map_err(|e| d.error(e))?,
            ctx.prefix.clone(),
        )),
        false => None,
    };
    let file = match dynamic {
        Some(_) => None,
        None => Some(
            target
                .open()
                .map_err(|e| d.error(format!("open() \"{}\" failed ({e})", target.display())))?,
        ),
    };
    let log = Arc::new(Log {
        dynamic,
        file,
        path: target.path().map(|p| p.to_path_buf()),
        format,
        filter,
    });
    ctx.logs.borrow_mut().push(log.clone());
    Ok(Some(log))
}

impl Log {
    /// Reopen the file by its name (SIGUSR1, `runtime::log_reopen`).
    pub fn reopen(&self) -> std::io::Result<()> {
        match (&self.path, &self.file) {
            (Some(p), Some(f)) => crate::runtime::log_reopen::reopen_in_place(f, p),
            _ => Ok(()),
        }
    }

    /// The descriptor [`Log::reopen`] replaces, if the file was opened by name.
    pub fn reopened_fd(&self) -> Option<std::os::fd::RawFd> {
        self.path
            .as_ref()
            .and(self.file.as_ref())
            .map(std::os::fd::AsRawFd::as_raw_fd)
    }

    pub fn name(&self) -> String {
        self.path
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string())
    }

    /// Write the session's line.
    pub fn write(&self, s: &Session, maps: &super::map::Maps) {
        if let Some(f) = &self.filter {
            let v = f.eval(s, maps);
            if v.is_empty() || v == "0" {
                return;
            }
        }
        let mut line = String::new();
        for t in &self.format.parts {
            let missing = match self.format.escape {
                Escape::Default => "-",
                Escape::Json | Escape::None => "",
            };
            t.append_log(&mut line, (s, maps), missing, |v, out| {
                escape(self.format.escape, v, out)
            });
        }
        line.push('\n');
        match (&self.file, &self.dynamic) {
            (Some(f), _) => {
                let _ = (&*f).write_all(line.as_bytes());
            }
            (None, Some((t, prefix))) => {
                let path = prefix.join(t.eval(s, maps));
                let opened = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&path);
                match opened {
                    Ok(mut f) => {
                        let _ = f.write_all(line.as_bytes());
                    }
                    Err(e) => crate::errlog::error(format_args!(
                        "*{} open() \"{}\" failed ({})",
                        s.id,
                        path.display(),
                        crate::errlog::errno_text(&e)
                    )),
                }
            }
            (None, None) => {}
        }
    }
}

fn escape(how: Escape, v: &str, out: &mut String) {
    for c in v.chars() {
        match how {
            Escape::None => out.push(c),
            Escape::Default => match c {
                '"' | '\\' => {
                    out.push_str(&format!("\\x{:02X}", c as u32));
                }
                c if (c as u32) < 0x20 || (c as u32) >= 0x7f => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\x{b:02X}"));
                    }
                }
                c => out.push(c),
            },
            Escape::Json => match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            },
        }
    }
}
