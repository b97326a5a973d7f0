//! `autoindex`, `autoindex_format html|json`, `autoindex_exact_size`, `autoindex_localtime`:
//! directory listings in nginx's layout. Hidden entries (leading `.`) are left out;
//! directories come first, then files, each sorted by name.

use super::{inherit, invalid, LoadCtx, LocConf};
use crate::http::handler::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use gannet_proto::h1::Method;
use gannet_proto::uri::html_escape;
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
    Json,
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
                "json" => Format::Json,
                v => return Err(invalid(d, v)),
            })
        }
    }
    Ok(())
}

struct Entry {
    name: String,
    dir: bool,
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
            // Follow symlinks, as nginx's stat() does.
            let meta = std::fs::metadata(e.path()).ok()?;
            Some(Entry {
                name,
                dir: meta.is_dir(),
                size: meta.len(),
                mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            })
        })
        .collect();
    entries.sort_by(|a, b| b.dir.cmp(&a.dir).then_with(|| a.name.cmp(&b.name)));
    let c = &req.conf.autoindex;
    let mut r = Response::new(200);
    let body = match c.format.unwrap_or(Format::Html) {
        Format::Html => {
            r.content_type = Some(Arc::from("text/html"));
            html(
                &req.uri,
                &entries,
                c.exact_size.unwrap_or(true),
                c.localtime.unwrap_or(false),
            )
        }
        Format::Json => {
            r.content_type = Some(Arc::from("application/json"));
            json(&entries)
        }
    };
    r.body = Body::bytes(body);
    Flow::Done(r)
}

fn html(uri: &str, entries: &[Entry], exact: bool, local: bool) -> String {
    let title = html_escape(uri);
    let mut s = format!("<html>\r\n<head><title>Index of {title}</title></head>\r\n<body>\r\n<h1>Index of {title}</h1><hr><pre><a href=\"../\">../</a>\r\n");
    for e in entries {
        let mut name = e.name.clone();
        if e.dir {
            name.push('/');
        }
        let href = encode_component(&name);
        // Long names are cut to 50 columns with "..>", as nginx does.
        let shown: String = if name.chars().count() > 50 {
            name.chars().take(47).collect::<String>() + "..>"
        } else {
            name.clone()
        };
        let pad = 51usize.saturating_sub(shown.chars().count());
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
            html_escape(&shown),
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

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json(entries: &[Entry]) -> String {
    let mut s = String::from("[\n");
    for (i, e) in entries.iter().enumerate() {
        let mtime = gannet_proto::h1::encode::http_date(e.mtime);
        let _ = write!(
            s,
            "{{ \"name\":{}, \"type\":\"{}\", \"mtime\":\"{mtime}\"",
            json_str(&e.name),
            if e.dir { "directory" } else { "file" }
        );
        if !e.dir {
            let _ = write!(s, ", \"size\":{}", e.size);
        }
        s.push_str(" }");
        s.push_str(if i + 1 < entries.len() { ",\n" } else { "\n" });
    }
    s.push_str("]\n");
    s
}
