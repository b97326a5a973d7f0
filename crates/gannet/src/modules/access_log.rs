//! `log_format name [escape=default|json|none] string ...;`,
//! `access_log path|syslog:... [format [buffer=size] [gzip[=level]] [flush=time] [if=condition]] | off;` and
//! `open_log_file_cache max=N [inactive=time] [min_uses=N] [valid=time] | off;`.
//!
//! A path with variables is evaluated and opened per line by the worker (see
//! [`log_cache`], with `open_log_file_cache`); it cannot be buffered, as in nginx.
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

use super::{inherit, LoadCtx, LocConf};
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

mod log_cache;
pub use log_cache::CacheConf;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "open_log_file_cache",
        ctx: Ctx::HSL,
        args: Args::Between(1, 4),
        block: false,
    },
    Spec {
        name: "log_format",
        ctx: Ctx::HTTP,
        args: Args::AtLeast(2),
        block: false,
    },
    Spec {
        name: "access_log",
        ctx: Ctx::HSL.or(Ctx::IF).or(Ctx::LIMIT_EXCEPT),
        args: Args::AtLeast(1),
        block: false,
    },
];

pub const COMBINED: &str =
    "$remote_addr - $remote_user [$time_local] \"$request\" $status $body_bytes_sent \"$http_referer\" \"$http_user_agent\"";

#[derive(Debug)]
pub struct LogFormat {
    pub template: Template,
    pub escape: Escape,
}

/// How a variable's value is written into a line (`escape=`), byte for byte as nginx's
/// `ngx_http_log_escape` / `ngx_escape_json` do, so tools that parse nginx's logs parse
/// gannet's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// `"`, `\`, control bytes and bytes from 0x7f up as `\xHH`; a value that is not there as `-`.
    Default,
    /// For a JSON string: `\"`, `\\`, `\n` `\r` `\t` `\b` `\f`, other control bytes as
    /// `\u00HH`; bytes from 0x7f up as they are (UTF-8 stays UTF-8); a value that is not
    /// there as nothing, so `"$x"` stays a valid string.
    Json,
    /// As it is; a value that is not there as nothing.
    None,
}

impl Escape {
    /// Write one variable's value (`None`: a variable nginx calls "not found").
    fn value(self, v: Option<&[u8]>, out: &mut Vec<u8>) {
        match (self, v) {
            (Escape::Default, None) => out.push(b'-'),
            (_, None) => {}
            (Escape::Default, Some(v)) => escape_default(v, out),
            (Escape::Json, Some(v)) => escape_json(v, out),
            (Escape::None, Some(v)) => out.extend_from_slice(v),
        }
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn escape_default(v: &[u8], out: &mut Vec<u8>) {
    // Runs of bytes that need nothing are copied at once: most values have no byte to escape.
    // They are found eight bytes at a time (`plain8`): byte by byte, the combined format's
    // values (request line, referer, user agent) took a fifth of a small request's user time.
    let mut start = 0;
    let mut i = 0;
    while i < v.len() {
        if let Some(Ok(word)) = v.get(i..i + 8).map(<[u8; 8]>::try_from) {
            if plain8(u64::from_le_bytes(word)) {
                i += 8;
                continue;
            }
        }
        let c = v[i];
        if c == b'"' || c == b'\\' || !(0x20..=0x7e).contains(&c) {
            out.extend_from_slice(&v[start..i]);
            out.extend_from_slice(&[b'\\', b'x', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]);
            start = i + 1;
        }
        i += 1;
    }
    out.extend_from_slice(&v[start..]);
}

/// Whether none of the eight bytes in `x` needs `escape_default` (all are printable ASCII
/// other than `"` and `\`). The classic word-at-a-time byte tests: each flags the high bit
/// of a byte that is below 0x20, above 0x7e, or equal to `"` or `\`; a borrow or carry can
/// flag a byte that is fine (the word is then looked at byte by byte), never miss one.
fn plain8(x: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |y: u64| y.wrapping_sub(ONES) & !y & HIGH;
    let below = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
    let above = (x.wrapping_add(ONES) | x) & HIGH;
    let quote = zero(x ^ (ONES * u64::from(b'"')));
    let backslash = zero(x ^ (ONES * u64::from(b'\\')));
    (below | above | quote | backslash) == 0
}

fn escape_json(v: &[u8], out: &mut Vec<u8>) {
    let mut start = 0;
    for (i, &c) in v.iter().enumerate() {
        let short = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x08 => b'b',
            0x0c => b'f',
            0..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&v[start..i]);
        if short != 0 {
            out.extend_from_slice(&[b'\\', short]);
        } else {
            // nginx writes the high digit as '0' + (c >> 4): always 0 or 1 here.
            out.extend_from_slice(b"\\u00");
            out.extend_from_slice(&[HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&v[start..]);
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
    /// `gzip[=level]`: each buffer written is one gzip member of its lines, as nginx's
    /// (`zcat` reads the file whole).
    gzip: Option<u32>,
}

#[derive(Debug)]
enum Output {
    /// The file and, unless it is an inherited descriptor (`/dev/stdout`, `/dev/stderr`),
    /// its path for reopening (SIGUSR1).
    File(File, Option<PathBuf>),
    Syslog(Peer),
    /// A path with variables, opened per line (`log_cache`); its text for messages.
    Path(Template, String),
}

impl LogFile {
    /// Write whole lines (a syslog log is never buffered, so it gets one line at a time).
    pub fn write(&self, lines: &[u8]) -> std::io::Result<()> {
        match &self.out {
            Output::File(f, _) => match self.gzip {
                Some(level) => {
                    let mut gz = flate2::write::GzEncoder::new(
                        Vec::with_capacity(lines.len() / 4 + 64),
                        flate2::Compression::new(level),
                    );
                    gz.write_all(lines)?;
                    (&*f).write_all(&gz.finish()?)
                }
                None => (&*f).write_all(lines),
            },
            Output::Syslog(p) => p.send(p.severity, lines),
            // Written by `write_line`, which has the request.
            Output::Path(..) => Ok(()),
        }
    }

    /// Write one request's line: to the file, or for a path with variables, to the file
    /// it names for this request.
    pub fn write_line(
        self: &Arc<Self>,
        w: &crate::runtime::worker::Worker,
        req: &Request,
        line: &[u8],
    ) {
        match &self.out {
            Output::Path(path, _) => {
                let cache = req.conf.log.cache.as_ref().and_then(Option::as_deref);
                log_cache::write(req, path, cache, line)
            }
            _ => w.log_line(self, line),
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
            Output::Path(_, text) => text.clone(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct LogConf {
    /// `Some(empty)` is `access_log off`.
    pub logs: Option<Arc<Vec<Arc<LogFile>>>>,
    /// `open_log_file_cache`: `Some(None)` is `off` (the default).
    pub cache: Option<Option<Arc<CacheConf>>>,
}

impl LogConf {
    pub fn merge(&mut self, p: &LogConf) {
        inherit!(self, p, logs, cache);
    }
}

/// `open_log_file_cache`, with nginx's defaults (inactive 10s, min_uses 1, valid 60s) and
/// messages.
fn cache_conf(d: &Directive, lc: &mut LocConf) -> Result<(), ConfError> {
    if lc.log.cache.is_some() {
        return Err(d.error("\"open_log_file_cache\" directive is duplicate"));
    }
    let (mut max, mut inactive, mut min_uses, mut valid, mut off) = (0, 10, 1, 60, false);
    for a in &d.args {
        let bad = || d.error(format!("invalid \"open_log_file_cache\" parameter \"{a}\""));
        if let Some(v) = a.strip_prefix("max=") {
            max = setters::num(v).ok_or_else(bad)?;
        } else if let Some(v) = a.strip_prefix("inactive=") {
            inactive = setters::sec(v).ok_or_else(bad)?;
        } else if let Some(v) = a.strip_prefix("min_uses=") {
            min_uses = setters::num(v).ok_or_else(bad)?;
        } else if let Some(v) = a.strip_prefix("valid=") {
            valid = setters::sec(v).ok_or_else(bad)?;
        } else if a == "off" {
            off = true;
        } else {
            return Err(bad());
        }
    }
    if off {
        lc.log.cache = Some(None);
        return Ok(());
    }
    if max == 0 {
        return Err(d.error("\"open_log_file_cache\" must have \"max\" parameter"));
    }
    lc.log.cache = Some(Some(Arc::new(CacheConf {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        max: max as usize,
        inactive: Duration::from_secs(inactive),
        min_uses: min_uses.min(u32::MAX as u64) as u32,
        valid: Duration::from_secs(valid),
    })));
    Ok(())
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
            Some("default") => (Escape::Default, 2),
            Some("json") => (Escape::Json, 2),
            Some("none") => (Escape::None, 2),
            Some(v) => return Err(d.error(format!("unknown log format escaping \"{v}\""))),
            None => (Escape::Default, 1),
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
    if d.name == "open_log_file_cache" {
        return cache_conf(d, lc);
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
    let (mut buffer, mut flush, mut filter, mut gzip) = (0usize, None, None, None);
    // nginx's checks and words.
    for a in d.args.iter().skip(2) {
        if let Some(v) = a.strip_prefix("buffer=") {
            buffer = setters::size(v)
                .filter(|&n| n > 0)
                .ok_or_else(|| d.error(format!("invalid buffer size \"{v}\"")))?
                as usize;
        } else if let Some(v) = a.strip_prefix("flush=") {
            let ms = setters::msec(v)
                .filter(|&n| n > 0)
                .ok_or_else(|| d.error(format!("invalid flush time \"{v}\"")))?;
            flush = Some(Duration::from_millis(ms));
        } else if a == "gzip" || a.starts_with("gzip=") {
            // A compressed log is buffered (64k unless `buffer=` says), as nginx's.
            if buffer == 0 {
                buffer = 64 * 1024;
            }
            gzip = Some(match a.strip_prefix("gzip=") {
                None => 1,
                Some(v) => v
                    .parse::<u32>()
                    .ok()
                    .filter(|l| (1..=9).contains(l))
                    .ok_or_else(|| d.error(format!("invalid compression level \"{v}\"")))?,
            });
        } else if let Some(v) = a.strip_prefix("if=") {
            filter = Some(Template::compile(v).map_err(|e| d.error(e))?);
        } else {
            return Err(d.error(format!("invalid parameter \"{a}\"")));
        }
    }
    if flush.is_some() && buffer == 0 {
        return Err(d.error(format!(
            "no buffer is defined for access_log \"{}\"",
            d.args[0]
        )));
    }
    // A path with variables: made absolute under the prefix first, as nginx's
    // ngx_conf_full_name on the text.
    let dynamic = match &syslog {
        None if d.args[0].contains('$') => {
            let text = if d.args[0].starts_with('/') {
                d.args[0].clone()
            } else {
                ctx.prefix.join(&d.args[0]).to_string_lossy().into_owned()
            };
            crate::http::user_vars::at(&d.loc);
            let t = Template::compile(&text).map_err(|e| d.error(e))?;
            t.has_vars().then_some((t, text))
        }
        _ => None,
    };
    let out = match syslog {
        Some(_) if buffer > 0 => return Err(d.error("logs to syslog cannot be buffered")),
        Some(peer) => Output::Syslog(peer),
        None if dynamic.is_some() && buffer > 0 => {
            return Err(d.error("buffered logs cannot have variables in name"))
        }
        None if dynamic.is_some() => {
            let (t, text) = dynamic.unwrap_or_else(|| unreachable!());
            Output::Path(t, text)
        }
        None => {
            let target = Target::parse(&d.args[0], &ctx.prefix, false);
            let file = open_log(&target, d)?;
            Output::File(file, target.path().map(Path::to_path_buf))
        }
    };
    // Buffered logs to one file share one buffer (nginx keeps it with the open file), so
    // their lines stay in the order written; they must agree on how it is buffered.
    let same_file = |l: &&Arc<LogFile>| {
        l.buffer > 0
            && matches!((&l.out, &out), (Output::File(_, Some(a)), Output::File(_, Some(b))) if a == b)
    };
    let shared = match ctx.log_files.iter().find(same_file) {
        Some(l) if buffer > 0 => {
            if l.buffer != buffer || l.flush != flush || l.gzip != gzip {
                return Err(d.error(format!(
                    "access_log \"{}\" already defined with conflicting parameters",
                    d.args[0]
                )));
            }
            Some(l.id)
        }
        _ => None,
    };
    let log = Arc::new(LogFile {
        id: shared.unwrap_or_else(|| NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        out,
        format,
        buffer,
        flush,
        filter,
        gzip,
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
                escape: Escape::Default,
            }),
        );
    }
    m
}

/// Build the line for one request into `out` (with its newline).
pub fn format_line(f: &LogFormat, req: &Request, sent: &Sent, out: &mut Vec<u8>) {
    let escape = f.escape;
    f.template
        .eval_log(req, sent, out, |v, out| escape.value(v, out));
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esc(e: Escape, v: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        e.value(Some(v), &mut out);
        out
    }

    #[test]
    fn escapes_as_nginx() {
        let v = b"a\"b\\c\x01\n\x7f\xc3\xa9";
        assert_eq!(
            esc(Escape::Default, v),
            b"a\\x22b\\x5Cc\\x01\\x0A\\x7F\\xC3\\xA9".to_vec()
        );
        assert_eq!(
            esc(Escape::Json, v),
            b"a\\\"b\\\\c\\u0001\\n\x7f\xc3\xa9".to_vec()
        );
        assert_eq!(
            esc(Escape::Json, b"\x08\x0c\t\r\x1f"),
            b"\\b\\f\\t\\r\\u001F".to_vec()
        );
        assert_eq!(esc(Escape::None, v), v.to_vec());
        for (e, unset) in [
            (Escape::Default, &b"-"[..]),
            (Escape::Json, b""),
            (Escape::None, b""),
        ] {
            let mut out = Vec::new();
            e.value(None, &mut out);
            assert_eq!(out, unset);
            assert_eq!(esc(e, b""), b"".to_vec());
        }
        assert_eq!(esc(Escape::Default, b"plain"), b"plain".to_vec());
    }

    /// The word-at-a-time scan escapes what the byte-at-a-time rule does, every byte value
    /// at every position of a word.
    #[test]
    fn the_word_scan_misses_no_byte() {
        let reference = |v: &[u8]| {
            let mut out = Vec::new();
            for &c in v {
                if c == b'"' || c == b'\\' || !(0x20..=0x7e).contains(&c) {
                    out.extend_from_slice(format!("\\x{c:02X}").as_bytes());
                } else {
                    out.push(c);
                }
            }
            out
        };
        for c in 0..=255u8 {
            for pos in 0..19 {
                let mut v = b"GET /robots.txt HTTP/1.1".to_vec();
                v[pos] = c;
                assert_eq!(
                    esc(Escape::Default, &v),
                    reference(&v),
                    "byte {c:#x} at {pos}"
                );
            }
        }
    }
}
