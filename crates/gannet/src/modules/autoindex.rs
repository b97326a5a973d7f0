//! `autoindex`, `autoindex_format html|xml|json|jsonp`, `autoindex_exact_size`,
//! `autoindex_localtime`: directory listings byte for byte as nginx writes them. Hidden
//! entries (leading `.`) are left out; directories come first, then the rest, each sorted by
//! name. Entries are looked at through symlinks; a broken link is listed as what it is
//! ("other" in xml and json, as nginx's lstat() fallback).

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::h1::Method;
use std::fmt::Write;
use std::sync::Arc;
use std::time::SystemTime;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "autoindex",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "autoindex_format",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "autoindex_exact_size",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "autoindex_localtime",
        ctx: Ctx::HSL,
        args: Args::Exactly(1),
        block: false,
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Html,
    Xml,
    Json,
    /// JSON wrapped in a call of the request's `?callback=` (plain JSON without one).
    Jsonp,
}

#[derive(Debug, Clone, Default)]
pub struct AutoindexConf {
    pub on: Option<bool>,
    pub format: Option<Format>,
    pub exact_size: Option<bool>,
    pub localtime: Option<bool>,
}

impl AutoindexConf {
    pub fn merge(&mut self, p: &AutoindexConf) {
        inherit!(self, p, on, format, exact_size, localtime);
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.autoindex;
    match d.name.as_str() {
        "autoindex" => c.on = Some(setters::flag(d)?),
        "autoindex_exact_size" => c.exact_size = Some(setters::flag(d)?),
        "autoindex_localtime" => c.localtime = Some(setters::flag(d)?),
        _ => {
            c.format = Some(match d.args[0].as_str() {
                "html" => Format::Html,
                "xml" => Format::Xml,
                "json" => Format::Json,
                "jsonp" => Format::Jsonp,
                v => return Err(invalid(d, v)),
            })
        }
    }
    Ok(())
}

struct Entry {
    name: String,
    dir: bool,
    /// A regular file (neither this nor `dir`: nginx's "other").
    file: bool,
    size: u64,
    mtime: SystemTime,
}

pub fn handle(req: &Request) -> Flow {
    // GET and HEAD only, as nginx (a POST falls through to "directory index is forbidden").
    if !req.uri.ends_with('/')
        || req.conf.autoindex.on != Some(true)
        || !matches!(req.method(), Method::Get | Method::Head)
    {
        return Flow::Next;
    }
    let c = &req.conf.autoindex;
    let mut format = c.format.unwrap_or(Format::Html);
    let mut callback = "";
    if format == Format::Jsonp {
        match jsonp_callback(req) {
            Ok(Some(cb)) => callback = cb,
            Ok(None) => format = Format::Json,
            Err(()) => return Flow::Status(400),
        }
    }
    let path = req.filename_for(&req.uri);
    let rd = match std::fs::read_dir(&path) {
        Ok(rd) => rd,
        Err(e) => return Flow::Status(super::static_files::file_error(req, e.kind(), &path)),
    };
    let mut entries: Vec<Entry> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                return None;
            }
            // Follow symlinks, as nginx's stat() does; a dangling one is taken as itself.
            let meta = std::fs::metadata(e.path())
                .or_else(|_| std::fs::symlink_metadata(e.path()))
                .ok()?;
            Some(Entry {
                name,
                dir: meta.is_dir(),
                file: meta.is_file(),
                size: meta.len(),
                mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            })
        })
        .collect();
    entries.sort_by(|a, b| b.dir.cmp(&a.dir).then_with(|| a.name.cmp(&b.name)));
    let mut r = Response::new(200);
    let body = match format {
        Format::Html => {
            r.content_type = Some(Arc::from("text/html"));
            html(
                &req.uri,
                &entries,
                c.exact_size.unwrap_or(true),
                c.localtime.unwrap_or(false),
                req.conf.charset.is_utf8(),
            )
        }
        Format::Xml => {
            r.content_type = Some(Arc::from("text/xml; charset=utf-8"));
            xml(&entries)
        }
        Format::Json => {
            r.content_type = Some(Arc::from("application/json"));
            json(&entries, None)
        }
        Format::Jsonp => {
            r.content_type = Some(Arc::from("application/javascript"));
            json(&entries, Some(callback))
        }
    };
    r.body = Body::bytes(body);
    Flow::Done(r)
}

/// The `callback` argument of a `jsonp` listing, as nginx takes it: `None` when absent or
/// empty, an error (400) when longer than 128 bytes or not made of letters, digits, `_`, `.`.
fn jsonp_callback(req: &Request) -> Result<Option<&str>, ()> {
    let Some(cb) = req.arg("callback").filter(|cb| !cb.is_empty()) else {
        return Ok(None);
    };
    let why = if cb.len() > 128 {
        "too long"
    } else if !cb
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    {
        "invalid"
    } else {
        return Ok(Some(cb));
    };
    crate::errlog::request(
        crate::errlog::Level::Info,
        req,
        format_args!("client sent {why} callback name: \"{cb}\""),
    );
    Err(())
}

fn html(uri: &str, entries: &[Entry], exact: bool, local: bool, utf8: bool) -> String {
    let title = escape_html(uri);
    let mut s = format!("<html>\r\n<head><title>Index of {title}</title></head>\r\n<body>\r\n<h1>Index of {title}</h1><hr><pre><a href=\"../\">../</a>\r\n");
    for e in entries {
        let mut name = e.name.clone();
        if e.dir {
            name.push('/');
        }
        let href = encode_component(&name);
        // Long names are cut to 50 columns with "..>", as nginx does; columns are
        // characters when the answer is in UTF-8, else bytes (cut here at a character's
        // boundary, where nginx may cut one in two).
        let width = |s: &str| if utf8 { s.chars().count() } else { s.len() };
        let shown: String = if width(&name) > 50 {
            let mut cut = String::new();
            for ch in name.chars() {
                if width(&cut) + if utf8 { 1 } else { ch.len_utf8() } > 47 {
                    break;
                }
                cut.push(ch);
            }
            cut + "..>"
        } else {
            name.clone()
        };
        let pad = 51usize.saturating_sub(width(&shown));
        let size = if e.dir {
            "-".to_string()
        } else if exact {
            e.size.to_string()
        } else {
            human_size(e.size)
        };
        let _ = write!(
            s,
            "<a href=\"{href}\">{}</a>{:pad$}{} {size:>19}\r\n",
            escape_html(&shown),
            "",
            crate::runtime::clock::listing_time(e.mtime, local),
        );
    }
    s.push_str("</pre><hr></body>\r\n</html>\r\n");
    s
}

/// A link to an entry: every byte but unreserved ones (and a directory's trailing `/`)
/// percent-encoded, as nginx's NGX_ESCAPE_URI_COMPONENT does, so `&`, `?`, `#`, `%` and
/// quotes in file names survive both the URL and the HTML attribute.
fn encode_component(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, b) in name.bytes().enumerate() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (b == b'/' && i + 1 == name.len());
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn human_size(n: u64) -> String {
    const UNITS: [(u64, char); 3] = [(1 << 30, 'G'), (1 << 20, 'M'), (1 << 10, 'K')];
    for (div, u) in UNITS {
        if n >= div {
            return format!("{}{u}", (n + div / 2) / div);
        }
    }
    n.to_string()
}

/// nginx's `ngx_escape_html`: `<`, `>`, `&` and `"` (not `'`).
fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(ch),
        }
    }
    out
}

/// nginx's `ngx_escape_json`: `"` and `\` backslashed, control bytes as `\n`-style escapes
/// or `\u00XX`.
fn escape_json(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
}

fn kind(e: &Entry) -> &'static str {
    if e.dir {
        "directory"
    } else if e.file {
        "file"
    } else {
        "other"
    }
}

/// `[` CRLF `{ "name":"..", "type":"..", "mtime":".." [, "size":N] }` ... CRLF `]`, in
/// `/* callback */` CRLF `NAME(...);` for jsonp.
fn json(entries: &[Entry], callback: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(cb) = callback {
        let _ = write!(s, "/* callback */\r\n{cb}(");
    }
    s.push('[');
    for (i, e) in entries.iter().enumerate() {
        s.push_str(if i == 0 { "\r\n" } else { ",\r\n" });
        s.push_str("{ \"name\":\"");
        escape_json(&e.name, &mut s);
        let mtime = gannet_proto::h1::encode::http_date(e.mtime);
        let _ = write!(s, "\", \"type\":\"{}\", \"mtime\":\"{mtime}\"", kind(e));
        if e.file {
            let _ = write!(s, ", \"size\":{}", e.size);
        }
        s.push_str(" }");
    }
    s.push_str("\r\n]");
    if callback.is_some() {
        s.push_str(");");
    }
    s
}

/// `<?xml version="1.0"?>` then `<list>` of `<file mtime=".." size="..">name</file>`,
/// `<directory ..>`, `<other ..>`, times in UTC ISO 8601.
fn xml(entries: &[Entry]) -> String {
    let mut s = String::from("<?xml version=\"1.0\"?>\r\n<list>\r\n");
    for e in entries {
        let kind = kind(e);
        let mtime = crate::runtime::clock::iso8601_utc(e.mtime);
        let _ = write!(s, "<{kind} mtime=\"{mtime}\"");
        if e.file {
            let _ = write!(s, " size=\"{}\"", e.size);
        }
        let _ = write!(s, ">{}</{kind}>\r\n", escape_html(&e.name));
    }
    s.push_str("</list>\r\n");
    s
}
