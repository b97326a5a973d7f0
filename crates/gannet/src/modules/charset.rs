//! `charset`, `source_charset`, `override_charset`, `charset_types` and `charset_map`
//! (nginx's ngx_http_charset_filter_module): name the charset of answers in their
//! Content-Type, and recode their bodies from one charset to another.
//!
//! As nginx decides, for an answer with a Content-Type: `charset off` (the default) leaves it
//! alone. An answer whose Content-Type names no charset gets `; charset=NAME` when its type
//! is in `charset_types` (text/html always); one that names a charset (a proxied answer's)
//! is left alone unless `override_charset on`. The source charset is the answer's own, else
//! `source_charset`; when it is off or the same as the destination, only the name is set.
//! Otherwise, unless the answer has a Content-Encoding, the body is recoded and the
//! Content-Type names the destination; when no recoding is known between the two, the error
//! log says `no "charset_map" between the charsets "A" and "B"` and the answer is sent
//! unchanged. 301 and 302 answers never get a charset name. Names (and `$variables` in
//! `charset` / `source_charset`) are compared ignoring case.
//!
//! What is recoded: a `charset_map` table (http level, e.g. Debian's koi-win, koi-utf,
//! win-utf) first, used both ways, exactly as nginx: byte to byte, byte to UTF-8 ('?' for a
//! byte the table does not map), UTF-8 to byte (`&#N;` for a character the table lacks,
//! '?' for invalid UTF-8). Without a table, gannet (unlike nginx, which refuses) recodes
//! between any two charsets the WHATWG Encoding Standard knows (encoding_rs: utf-8,
//! windows-125x, koi8-r, koi8-u, iso-8859-x, ...): malformed input becomes U+FFFD, and a
//! character the destination lacks becomes `&#N;`. UTF-16 and other unknown names are not
//! recoded (the "no charset_map" case). The body is recoded piece by piece as it is sent
//! (`conn::source`); only an incomplete UTF-8 character is held between pieces. A recoded
//! answer loses its Content-Length, and so its ranges, except for byte-to-byte tables, whose
//! ranges are cut as nginx's (after this filter: each part names the new charset).
//!
//! An application's `X-Accel-Charset` (proxied, FastCGI...; unless `*_ignore_headers`
//! names it) is the destination charset of its answer, as nginx's `override_charset` of the
//! answer: it holds whatever the location's `charset` says, with the same recoding.

use super::compress::Types;
use super::{LoadCtx, LocConf};
use crate::errlog::{self, Level};
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::variables::Template;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::rc::Rc;
use std::sync::Arc;

use super::gateway::spec;

/// http, server, location and `if` in a location, as nginx.
const HSLI: Ctx = Ctx::HSL.or(Ctx::IF);

pub const DIRECTIVES: &[Spec] = &[
    spec("charset", HSLI, Args::Exactly(1)),
    spec("source_charset", HSLI, Args::Exactly(1)),
    spec("override_charset", HSLI, Args::Exactly(1)),
    spec("charset_types", Ctx::HSL, Args::AtLeast(1)),
    Spec {
        name: "charset_map",
        ctx: Ctx::HTTP,
        args: Args::Exactly(2),
        block: true,
    },
];

const DEFAULT_TYPES: &[&str] = &[
    "text/html",
    "text/xml",
    "text/plain",
    "text/vnd.wap.wml",
    "application/javascript",
    "application/rss+xml",
];

/// A `charset` or `source_charset` value.
#[derive(Debug, Clone)]
enum Name {
    Off,
    Fixed(Arc<str>),
    Var(Template),
}

/// One `charset_map`: from a one-byte charset to another, or to UTF-8.
#[derive(Debug)]
pub struct Table {
    src: String,
    dst: String,
    /// Byte to byte (both ways), or byte to UTF-8 and back.
    map: Map,
}

#[derive(Debug)]
enum Map {
    Bytes {
        to: Box<[u8; 256]>,
        back: Box<[u8; 256]>,
    },
    Utf8 {
        to: Vec<Vec<u8>>,
        back: std::collections::HashMap<u32, u8>,
    },
}

#[derive(Debug, Clone, Default)]
pub struct CharsetConf {
    charset: Option<Name>,
    source: Option<Name>,
    override_charset: Option<bool>,
    types: Option<Arc<Types>>,
    /// Every `charset_map` of http, shared by all levels.
    maps: Option<Arc<Vec<Table>>>,
}

impl CharsetConf {
    pub fn merge(&mut self, parent: &CharsetConf) {
        super::inherit!(self, parent, charset, source, override_charset, types, maps);
    }

    /// Whether `charset` names UTF-8 outright (autoindex then measures names in characters,
    /// as nginx does when the answer's charset is utf-8).
    pub fn is_utf8(&self) -> bool {
        matches!(&self.charset, Some(Name::Fixed(n)) if n.eq_ignore_ascii_case("utf-8"))
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.charset;
    match d.name.as_str() {
        "charset" | "source_charset" => {
            let slot = if d.name == "charset" {
                &mut c.charset
            } else {
                &mut c.source
            };
            if slot.is_some() {
                return Err(d.error(format!("\"{}\" directive is duplicate", d.name)));
            }
            let v = &d.args[0];
            *slot = Some(if v == "off" {
                Name::Off
            } else if v.starts_with('$') {
                Name::Var(Template::compile(v).map_err(|e| d.error(e))?)
            } else {
                Name::Fixed(Arc::from(v.as_str()))
            });
        }
        "override_charset" => c.override_charset = Some(setters::flag(d)?),
        "charset_types" => c.types = Some(Arc::new(super::compress::types(d))),
        "charset_map" => {
            let mut maps = c
                .maps
                .as_deref()
                .map(|t| clone_tables(t))
                .unwrap_or_default();
            maps.push(table(d, &maps)?);
            c.maps = Some(Arc::new(maps));
        }
        _ => unreachable!("not a charset directive: {}", d.name),
    }
    Ok(())
}

fn clone_tables(t: &[Table]) -> Vec<Table> {
    t.iter()
        .map(|t| Table {
            src: t.src.clone(),
            dst: t.dst.clone(),
            map: match &t.map {
                Map::Bytes { to, back } => Map::Bytes {
                    to: to.clone(),
                    back: back.clone(),
                },
                Map::Utf8 { to, back } => Map::Utf8 {
                    to: to.clone(),
                    back: back.clone(),
                },
            },
        })
        .collect()
}

fn hex(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 8 {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

/// Read one `charset_map SRC DST { XX YY; ... }` block.
fn table(d: &Directive, others: &[Table]) -> Result<Table, ConfError> {
    let (src, dst) = (&d.args[0], &d.args[1]);
    if src.eq_ignore_ascii_case(dst) {
        return Err(d.error(format!(
            "\"charset_map\" between the same charsets \"{src}\" and \"{dst}\""
        )));
    }
    if src.eq_ignore_ascii_case("utf-8") {
        return Err(
            d.error("\"charset_map\" with \"utf-8\" charset should be given in the second column")
        );
    }
    if others.iter().any(|t| {
        (t.src.eq_ignore_ascii_case(src) && t.dst.eq_ignore_ascii_case(dst))
            || (t.src.eq_ignore_ascii_case(dst) && t.dst.eq_ignore_ascii_case(src))
    }) {
        return Err(d.error(format!(
            "duplicate \"charset_map\" between \"{src}\" and \"{dst}\""
        )));
    }
    let utf8 = dst.eq_ignore_ascii_case("utf-8");
    let mut bytes_to = [b'?'; 256];
    let mut bytes_back = [b'?'; 256];
    let mut utf_to: Vec<Vec<u8>> = vec![b"?".to_vec(); 256];
    let mut utf_back = std::collections::HashMap::new();
    for i in 0..128u8 {
        bytes_to[usize::from(i)] = i;
        bytes_back[usize::from(i)] = i;
        utf_to[usize::from(i)] = vec![i];
    }
    for e in d.block.as_deref().unwrap_or_default() {
        if e.block.is_some() || e.args.len() != 1 {
            return Err(e.error("invalid parameters number"));
        }
        let bad = |v: &str| e.error(format!("invalid value \"{v}\""));
        let from = hex(&e.name)
            .filter(|n| *n <= 255)
            .ok_or_else(|| bad(&e.name))? as u8;
        let value = &e.args[0];
        if utf8 {
            if value.len() / 2 > 3 || value.len() % 2 != 0 {
                return Err(bad(value));
            }
            let mut seq = Vec::new();
            for i in (0..value.len()).step_by(2) {
                seq.push(hex(&value[i..i + 2]).ok_or_else(|| bad(value))? as u8);
            }
            let ch = std::str::from_utf8(&seq)
                .ok()
                .and_then(|s| s.chars().next())
                .ok_or_else(|| bad(value))?;
            utf_back.insert(u32::from(ch), from);
            utf_to[usize::from(from)] = seq;
        } else {
            let to = hex(value).filter(|n| *n <= 255).ok_or_else(|| bad(value))? as u8;
            bytes_to[usize::from(from)] = to;
            bytes_back[usize::from(to)] = from;
        }
    }
    Ok(Table {
        src: src.clone(),
        dst: dst.clone(),
        map: if utf8 {
            Map::Utf8 {
                to: utf_to,
                back: utf_back,
            }
        } else {
            Map::Bytes {
                to: Box::new(bytes_to),
                back: Box::new(bytes_back),
            }
        },
    })
}

/// How one answer's body is recoded.
#[derive(Debug, Clone)]
pub enum Recode {
    /// A `charset_map` (index among http's), forwards or backwards.
    Table(Arc<Vec<Table>>, usize, bool),
    /// Between two charsets encoding_rs knows.
    Whatwg(
        &'static encoding_rs::Encoding,
        &'static encoding_rs::Encoding,
    ),
}

/// The charset an answer's Content-Type names, and where its type ends.
fn own_charset(ct: &str) -> Option<(usize, &str)> {
    let semi = ct.find(';')?;
    let lower = ct.to_ascii_lowercase();
    let at = lower[semi..].find("charset=")? + semi + "charset=".len();
    let v = ct[at..].split([';', ' ']).next().unwrap_or("");
    let v = v.trim_matches('"');
    let end = ct[..semi].trim_end().len();
    (!v.is_empty()).then_some((end, v))
}

fn eval(n: &Name, req: &Request) -> Option<String> {
    match n {
        Name::Off => None,
        Name::Fixed(s) => Some(s.to_string()),
        Name::Var(t) => Some(t.eval(req, None)),
    }
}

/// The charset header filter: name the charset in `resp`'s Content-Type and set up its
/// recoding (in `resp.rewrites`), as nginx's. Free for a location without `charset` whose
/// answer has no `X-Accel-Charset`.
pub fn start(req: &Request, resp: &mut Response) {
    let over = req.override_charset.borrow_mut().take();
    start_with(req, resp, over);
}

fn start_with(req: &Request, resp: &mut Response, over: Option<Arc<str>>) {
    let c = &req.conf.charset;
    let dst_conf = c.charset.as_ref().filter(|n| !matches!(n, Name::Off));
    if over.is_none() && dst_conf.is_none() {
        return;
    }
    let Some(ct) = resp.content_type.clone().filter(|t| !t.is_empty()) else {
        return;
    };
    let own = own_charset(&ct);
    // An application's `X-Accel-Charset` is the destination whatever the location says
    // (nginx's `override_charset` of the answer); else the location's `charset`, for an
    // answer that names none of its own (unless `override_charset on`) and whose type is
    // in `charset_types`.
    let dst = match (over, dst_conf) {
        (Some(o), _) => o.to_string(),
        (None, None) => return,
        (None, Some(dst_conf)) => {
            if own.is_some() {
                if c.override_charset != Some(true) {
                    return;
                }
            } else {
                let default;
                let types = match &c.types {
                    Some(t) => t.as_ref(),
                    None => {
                        default =
                            Types::List(DEFAULT_TYPES.iter().map(|s| s.to_string()).collect());
                        &default
                    }
                };
                if !types.matches(&ct) {
                    return;
                }
            }
            let Some(dst) = eval(dst_conf, req) else {
                return;
            };
            dst
        }
    };
    let base = own.map_or(&ct[..], |(end, _)| &ct[..end]);
    let src = match own {
        Some((_, s)) => Some(s.to_string()),
        None => c.source.as_ref().and_then(|n| eval(n, req)),
    };
    let named = |resp: &mut Response| {
        if !matches!(resp.status, 301 | 302) {
            resp.content_type = Some(Arc::from(format!("{base}; charset={dst}")));
        } else if own.is_some() {
            resp.content_type = Some(Arc::from(base));
        }
    };
    let Some(src) = src else {
        // source_charset off: only the name.
        if own.is_none() {
            named(resp);
        }
        return;
    };
    if src.eq_ignore_ascii_case(&dst) {
        named(resp);
        return;
    }
    let encoded = resp
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("content-encoding") && !v.is_empty());
    if encoded {
        return;
    }
    let Some(recode) = recoder(c.maps.as_ref(), &src, &dst) else {
        errlog::request(
            Level::Error,
            req,
            format_args!("no \"charset_map\" between the charsets \"{src}\" and \"{dst}\""),
        );
        return;
    };
    named(resp);
    if !recode.bytewise() {
        // The length changes: no Content-Length, and so no ranges (nginx's range filter
        // cuts only an answer of known length).
        resp.content_length = None;
        resp.length_unknown = true;
        resp.accept_ranges = false;
        resp.headers.retain(|(n, _)| {
            !n.eq_ignore_ascii_case("content-length") && !n.eq_ignore_ascii_case("accept-ranges")
        });
    }
    if !req.is_head() {
        resp.rewrites().charset = Some(Rc::new(recode));
    }
}

/// After the range filter: a body at hand recoded byte for byte keeps its length (whole, or
/// the ranges cut from it), though it is now streamed through the recoding.
pub fn keep_length(resp: &mut Response) {
    let bytewise = resp
        .rewrites
        .as_ref()
        .and_then(|r| r.charset.as_deref())
        .is_some_and(Recode::bytewise);
    if bytewise && resp.content_length.is_none() && !resp.length_unknown && resp.body.len() > 0 {
        resp.content_length = Some(resp.body.len());
    }
}

/// Whether `start` will change the body's length (for the filters that plan before it).
pub fn changes_length(req: &Request, resp: &Response) -> bool {
    let c = &req.conf.charset;
    if c.charset.as_ref().is_none_or(|n| matches!(n, Name::Off))
        && req.override_charset.borrow().is_none()
    {
        return false;
    }
    let mut probe = Response {
        status: resp.status,
        content_type: resp.content_type.clone(),
        headers: resp
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("content-encoding"))
            .cloned()
            .collect(),
        ..Default::default()
    };
    let over = req.override_charset.borrow().clone();
    start_with(req, &mut probe, over);
    probe.length_unknown
}

impl Recode {
    /// Byte to byte (a `charset_map` between one-byte charsets): the length stays.
    fn bytewise(&self) -> bool {
        matches!(self, Recode::Table(t, i, _) if matches!(t[*i].map, Map::Bytes { .. }))
    }
}

fn recoder(maps: Option<&Arc<Vec<Table>>>, src: &str, dst: &str) -> Option<Recode> {
    if let Some(maps) = maps {
        for (i, t) in maps.iter().enumerate() {
            if t.src.eq_ignore_ascii_case(src) && t.dst.eq_ignore_ascii_case(dst) {
                return Some(Recode::Table(maps.clone(), i, true));
            }
            if t.src.eq_ignore_ascii_case(dst) && t.dst.eq_ignore_ascii_case(src) {
                return Some(Recode::Table(maps.clone(), i, false));
            }
        }
    }
    let from = encoding_rs::Encoding::for_label(src.as_bytes())?;
    let to = encoding_rs::Encoding::for_label(dst.as_bytes())?;
    // UTF-16 cannot be an output, and "replacement" is no charset to write.
    if to.output_encoding() != to || from == encoding_rs::REPLACEMENT {
        return None;
    }
    Some(Recode::Whatwg(from, to))
}

/// One body being recoded.
pub struct Stream {
    recode: Rc<Recode>,
    /// An incomplete UTF-8 character at the end of the last piece (tables from UTF-8).
    saved: Vec<u8>,
    whatwg: Option<(encoding_rs::Decoder, encoding_rs::Encoder)>,
    ended: bool,
}

impl Stream {
    pub fn new(recode: Rc<Recode>) -> Stream {
        let whatwg = match &*recode {
            Recode::Whatwg(from, to) => Some((from.new_decoder(), to.new_encoder())),
            Recode::Table(..) => None,
        };
        Stream {
            recode,
            saved: Vec::new(),
            whatwg,
            ended: false,
        }
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Recode the next piece (`last`: the body ends after it).
    pub fn feed(&mut self, piece: &[u8], last: bool) -> Vec<u8> {
        self.ended |= last;
        if let Some((dec, enc)) = &mut self.whatwg {
            return whatwg(dec, enc, piece, last);
        }
        let Recode::Table(maps, i, forwards) = &*self.recode else {
            return piece.to_vec();
        };
        match (&maps[*i].map, forwards) {
            (Map::Bytes { to, .. }, true) => piece.iter().map(|b| to[usize::from(*b)]).collect(),
            (Map::Bytes { back, .. }, false) => {
                piece.iter().map(|b| back[usize::from(*b)]).collect()
            }
            (Map::Utf8 { to, .. }, true) => {
                let mut out = Vec::with_capacity(piece.len() * 2);
                for b in piece {
                    out.extend_from_slice(&to[usize::from(*b)]);
                }
                out
            }
            (Map::Utf8 { back, .. }, false) => {
                let mut buf = std::mem::take(&mut self.saved);
                buf.extend_from_slice(piece);
                from_utf8(back, &buf, last, &mut self.saved)
            }
        }
    }
}

/// UTF-8 to a one-byte charset by a table, as nginx: `&#N;` for what the table lacks, '?'
/// for invalid bytes; an incomplete character at the end is kept in `saved`.
fn from_utf8(
    back: &std::collections::HashMap<u32, u8>,
    mut s: &[u8],
    last: bool,
    saved: &mut Vec<u8>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    while !s.is_empty() {
        let (valid, err) = match std::str::from_utf8(s) {
            Ok(v) => (v, None),
            Err(e) => (
                // Up to valid_up_to the bytes are valid UTF-8.
                std::str::from_utf8(&s[..e.valid_up_to()]).unwrap_or_default(),
                Some(e),
            ),
        };
        for ch in valid.chars() {
            let n = u32::from(ch);
            if n < 0x80 {
                out.push(n as u8);
            } else if let Some(b) = back.get(&n) {
                out.push(*b);
            } else {
                out.extend_from_slice(format!("&#{n};").as_bytes());
            }
        }
        let Some(e) = err else { break };
        let rest = &s[e.valid_up_to()..];
        match e.error_len() {
            Some(n) => {
                out.push(b'?');
                s = &rest[n..];
            }
            None if last => {
                out.push(b'?');
                break;
            }
            None => {
                saved.extend_from_slice(rest);
                break;
            }
        }
    }
    out
}

fn whatwg(
    dec: &mut encoding_rs::Decoder,
    enc: &mut encoding_rs::Encoder,
    piece: &[u8],
    last: bool,
) -> Vec<u8> {
    let mut text = String::with_capacity(
        dec.max_utf8_buffer_length(piece.len())
            .unwrap_or(piece.len() * 3),
    );
    let mut input = piece;
    loop {
        let (r, read, _) = dec.decode_to_string(input, &mut text, last);
        input = &input[read..];
        if r == encoding_rs::CoderResult::InputEmpty {
            break;
        }
        text.reserve(input.len() * 3 + 16);
    }
    let mut out = Vec::with_capacity(text.len() + 16);
    let mut rest = text.as_str();
    loop {
        out.reserve(
            enc.max_buffer_length_from_utf8_if_no_unmappables(rest.len())
                .unwrap_or(rest.len() * 4)
                + 16,
        );
        let (r, read, _) = enc.encode_from_utf8_to_vec(rest, &mut out, last);
        rest = &rest[read..];
        if r == encoding_rs::CoderResult::InputEmpty {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_charset_parameter() {
        assert_eq!(
            own_charset("text/html; charset=KOI8-R"),
            Some((9, "KOI8-R"))
        );
        assert_eq!(
            own_charset("text/html ;Charset=\"utf-8\"; x=y"),
            Some((9, "utf-8"))
        );
        assert_eq!(own_charset("text/html"), None);
    }

    #[test]
    fn utf8_split_across_pieces_is_held() {
        let mut back = std::collections::HashMap::new();
        back.insert(0x416, 0xc6u8);
        let mut saved = Vec::new();
        let s = "Ж€".as_bytes();
        let mut out = from_utf8(&back, &s[..1], false, &mut saved);
        assert!(out.is_empty());
        let buf = [std::mem::take(&mut saved), s[1..].to_vec()].concat();
        out.extend(from_utf8(&back, &buf, true, &mut saved));
        assert_eq!(out, b"\xc6&#8364;");
    }

    #[test]
    fn whatwg_recodes_split_input_and_escapes_unmappables() {
        let from = encoding_rs::UTF_8;
        let to = encoding_rs::WINDOWS_1251;
        let (mut d, mut e) = (from.new_decoder(), to.new_encoder());
        let s = "Ж€漢".as_bytes();
        let mut out = whatwg(&mut d, &mut e, &s[..1], false);
        out.extend(whatwg(&mut d, &mut e, &s[1..], true));
        assert_eq!(out, b"\xc6\x88&#28450;");
    }
}
