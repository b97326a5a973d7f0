//! `ssi on | off`, `ssi_types`, `ssi_last_modified`, `ssi_silent_errors`,
//! `ssi_min_file_chunk`, `ssi_value_length` and `ssi_ignore_recycled_buffers` (nginx's
//! ngx_http_ssi_filter_module): server-side includes in response bodies - static files,
//! proxied and FastCGI answers alike - and the variables `$date_local` / `$date_gmt`.
//!
//! Commands are `<!--# command param="value" ... -->`: `include` (`virtual=`, `file=`,
//! `wait=`, `set=`, `stub=`), `echo` (`var=`, `default=`, `encoding=`), `set`, `config`
//! (`errmsg=`, `timefmt=`), `if` / `elif` / `else` / `endif` and `block` / `endblock`. The
//! parser is nginx's state machine byte for byte (the same lengths, the same errors, the
//! same quirks: a `<!--` prefix left at the very end of the body is dropped, a parse error
//! shows the error message even in a branch not taken).
//!
//! The body is parsed as it passes ([`Stream`], driven by `conn::source`): only a partial
//! command is held between pieces. An `include` is a subrequest (`conn::subrequest`) whose
//! body, filtered by its own location (SSI again, nested up to nginx's 50 levels), goes out
//! in its place before the rest of the page is parsed. SSI variables, blocks and regex
//! captures belong to the main request and are shared by every nested level ([`Shared`]).
//!
//! As nginx's, includes start as the page is parsed and run side by side (their bodies go
//! out in the page's order: a later include's answer waits until those before it are sent);
//! parsing stops at an include with `wait="yes"`, `file=` or `set=` until it is done, and
//! goes ahead of the output only as far as the page's own body is at hand.

use super::compress::Types;
use super::{LoadCtx, LocConf};
use crate::errlog;
use crate::http::regex::Regex;
use crate::http::request::Request;
use crate::http::response::Response;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use super::gateway::spec;

mod commands;
mod parser;

pub use commands::date;

pub const DIRECTIVES: &[Spec] = &[
    spec("ssi", Ctx::HSL.or(Ctx::IF), Args::Exactly(1)),
    spec("ssi_silent_errors", Ctx::HSL, Args::Exactly(1)),
    spec("ssi_ignore_recycled_buffers", Ctx::HSL, Args::Exactly(1)),
    spec("ssi_min_file_chunk", Ctx::HSL, Args::Exactly(1)),
    spec("ssi_value_length", Ctx::HSL, Args::Exactly(1)),
    spec("ssi_types", Ctx::HSL, Args::AtLeast(1)),
    spec("ssi_last_modified", Ctx::HSL, Args::Exactly(1)),
];

/// nginx's limits (ngx_http_ssi_filter_module.h) and subrequest nesting (NGX_HTTP_MAX_SUBREQUESTS).
const COMMAND_LEN: usize = 32;
const PARAM_LEN: usize = 32;
const MAX_PARAMS: usize = 16;
pub const MAX_DEPTH: u8 = 50;

const DEFAULT_ERRMSG: &str = "[an error occurred while processing the directive]";
const DEFAULT_TIMEFMT: &str = "%A, %d-%b-%Y %H:%M:%S %Z";

#[derive(Debug, Clone, Default)]
pub struct SsiConf {
    enable: Option<bool>,
    silent_errors: Option<bool>,
    ignore_recycled: Option<bool>,
    last_modified: Option<bool>,
    min_file_chunk: Option<u64>,
    value_len: Option<u64>,
    types: Option<Arc<Types>>,
}

impl SsiConf {
    pub fn merge(&mut self, parent: &SsiConf) {
        super::inherit!(
            self,
            parent,
            enable,
            silent_errors,
            ignore_recycled,
            last_modified,
            min_file_chunk,
            value_len,
            types
        );
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let c = &mut lc.ssi;
    match d.name.as_str() {
        "ssi" => c.enable = Some(setters::flag(d)?),
        "ssi_silent_errors" => c.silent_errors = Some(setters::flag(d)?),
        "ssi_ignore_recycled_buffers" => c.ignore_recycled = Some(setters::flag(d)?),
        "ssi_last_modified" => c.last_modified = Some(setters::flag(d)?),
        "ssi_min_file_chunk" => c.min_file_chunk = Some(setters::size_arg(d, 0)?),
        "ssi_value_length" => c.value_len = Some(setters::size_arg(d, 0)?),
        "ssi_types" => c.types = Some(Arc::new(super::compress::types(d))),
        _ => unreachable!("not an ssi directive: {}", d.name),
    }
    Ok(())
}

/// What a response to be parsed carries (`Response::ssi`) until its body is streamed.
/// Packed in 4 bytes (with a niche for `Option`) so that `Response` does not grow: the top
/// bit is `ssi_silent_errors`, the rest `ssi_value_length` + 1.
#[derive(Debug, Clone, Copy)]
pub struct Setup(std::num::NonZeroU32);

impl Setup {
    fn new(silent: bool, value_len: u64) -> Setup {
        let len = u32::try_from(value_len)
            .unwrap_or(u32::MAX)
            .min(0x7fff_fffe)
            + 1;
        let bits = len | if silent { 1 << 31 } else { 0 };
        Setup(std::num::NonZeroU32::new(bits).unwrap_or(std::num::NonZeroU32::MIN))
    }

    fn silent(self) -> bool {
        self.0.get() >> 31 == 1
    }

    fn value_len(self) -> usize {
        ((self.0.get() & 0x7fff_ffff) - 1) as usize
    }
}

/// Whether SSI applies to `resp` (decided before compression, which must not take its
/// length as known). `streamed`: the body comes from an application.
pub fn applies(req: &Request, resp: &Response, streamed: bool) -> bool {
    let c = &req.conf.ssi;
    if c.enable != Some(true) {
        return false;
    }
    super::sub_filter::text_body(c.types.as_deref(), resp, streamed)
}

/// Set `resp` up to be parsed (its headers as nginx's SSI header filter leaves them), if
/// SSI applies to it.
pub fn start(req: &Request, resp: &mut Response, streamed: bool) {
    if !applies(req, resp, streamed) {
        return;
    }
    let c = &req.conf.ssi;
    if !req.subrequest {
        resp.body_rewritten(c.last_modified == Some(true));
    }
    if !req.is_head() {
        resp.rewrites().ssi = Some(Setup::new(
            c.silent_errors == Some(true),
            c.value_len.unwrap_or(255),
        ));
    }
}

/// What the main request and all its includes share: `set` variables (and named captures),
/// blocks for `stub=`, and the last regex match's numbered captures.
#[derive(Debug, Default)]
pub struct Shared {
    vars: Vec<(String, Vec<u8>)>,
    blocks: Vec<(Vec<u8>, Vec<u8>)>,
    captures: Vec<Vec<u8>>,
}

impl Shared {
    fn var(&self, name: &str) -> Option<&[u8]> {
        if let [d @ b'0'..=b'9'] = name.as_bytes() {
            if let Some(c) = self.captures.get(usize::from(d - b'0')) {
                return Some(c);
            }
        }
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    fn set_var(&mut self, name: String, value: Vec<u8>) {
        match self.vars.iter_mut().find(|(n, _)| *n == name) {
            Some(v) => v.1 = value,
            None => self.vars.push((name, value)),
        }
    }

    /// The `stub=` block's text (the last one so named).
    pub fn block(&self, name: &[u8]) -> Option<Vec<u8>> {
        self.blocks
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
    }

    /// `include set=`: the subrequest's body into a variable.
    pub fn set_included(&mut self, name: &str, value: Vec<u8>) {
        self.set_var(name.to_ascii_lowercase(), value);
    }
}

/// An `include` to run: its URI (the page's directory prepended to a relative one).
#[derive(Debug, Default)]
pub struct Include {
    pub uri: String,
    pub args: Option<String>,
    /// `set=`: the body goes into this variable instead of the page.
    pub set: Option<String>,
    /// `stub=`: this text stands in for an empty or failed answer.
    pub stub: Option<Vec<u8>>,
    /// `wait="yes"`, `file=` or `set=`: the page is parsed on only once this include is
    /// done (commands after it may read what it set); other includes start at once and
    /// run side by side, their bodies going out in the page's order.
    pub wait: bool,
}

/// What parsing came to.
pub enum Step {
    /// Text for the page (possibly empty).
    Out(Vec<u8>),
    Include(Include),
    /// Everything fed is parsed: feed more.
    More,
    /// The body ended.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Tag,
    Comment0,
    Comment1,
    Sharp,
    Precommand,
    Command,
    Preparam,
    Param,
    Preequal,
    Prevalue,
    DoubleQuoted,
    Quoted,
    QuotedSymbol,
    Postparam,
    CommentEnd0,
    CommentEnd1,
    Error,
    ErrorEnd0,
    ErrorEnd1,
}

/// What the parser stopped at.
enum Parsed {
    /// The input ran out.
    Again,
    Command,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    None,
    Url,
    Entity,
}

/// One body being parsed.
pub struct Stream {
    setup: Setup,
    shared: Rc<RefCell<Shared>>,
    /// How deep in includes this body is (the main request's is 0).
    pub depth: u8,
    input: bytes::Bytes,
    pos: usize,
    last: bool,
    ended: bool,
    state: State,
    saved_state: State,
    /// Bytes of "<!--" matched so far.
    looked: usize,
    command: Vec<u8>,
    params: Vec<(Vec<u8>, Vec<u8>)>,
    /// An include waiting for the text before it to go out.
    pending: Option<Include>,
    // The page's own settings (nginx's per-request ctx).
    output: bool,
    output_chosen: bool,
    /// 0, 1 after `if`/`elif`, 2 after `else`.
    conditional: u8,
    block: bool,
    encoding: Encoding,
    timefmt: Vec<u8>,
    errmsg: Vec<u8>,
}

impl Stream {
    pub fn new(setup: Setup, shared: Option<Rc<RefCell<Shared>>>, depth: u8) -> Stream {
        Stream {
            setup,
            shared: shared.unwrap_or_default(),
            depth,
            input: bytes::Bytes::new(),
            pos: 0,
            last: false,
            ended: false,
            state: State::Start,
            saved_state: State::Start,
            looked: 0,
            command: Vec::new(),
            params: Vec::new(),
            pending: None,
            output: true,
            output_chosen: false,
            conditional: 0,
            block: false,
            encoding: Encoding::Entity,
            timefmt: DEFAULT_TIMEFMT.into(),
            errmsg: DEFAULT_ERRMSG.into(),
        }
    }

    pub fn shared(&self) -> Rc<RefCell<Shared>> {
        self.shared.clone()
    }

    /// Hand in the next piece (`None`: the body ended). Only after `Step::More`.
    pub fn push(&mut self, piece: Option<bytes::Bytes>) {
        match piece {
            Some(p) => {
                self.input = p;
                self.pos = 0;
            }
            None => self.last = true,
        }
    }

    /// Parse on; see [`Step`].
    pub fn step(&mut self, req: &Request) -> Step {
        if let Some(inc) = self.pending.take() {
            return Step::Include(inc);
        }
        if self.ended {
            return Step::End;
        }
        let mut out = Vec::new();
        while self.pos < self.input.len() {
            let input = self.input.clone();
            let mut text = Vec::new();
            let parsed = self.parse(&input, &mut text);
            self.text(&text, &mut out);
            match parsed {
                Parsed::Again => {}
                Parsed::Error => self.error(&mut out),
                Parsed::Command => {
                    if let Some(inc) = self.run(req, &mut out) {
                        if out.is_empty() {
                            return Step::Include(inc);
                        }
                        self.pending = Some(inc);
                        return Step::Out(out);
                    }
                }
            }
        }
        if self.last {
            // A partial command or "<!--" prefix at the end is dropped, as nginx does.
            self.ended = true;
            return if out.is_empty() {
                Step::End
            } else {
                Step::Out(out)
            };
        }
        if out.is_empty() {
            Step::More
        } else {
            Step::Out(out)
        }
    }

    /// Page text: out, into the block being recorded, or dropped (a branch not taken).
    fn text(&self, text: &[u8], out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        if self.output {
            out.extend_from_slice(text);
        } else if self.block {
            let mut sh = self.shared.borrow_mut();
            if let Some(b) = sh.blocks.last_mut() {
                b.1.extend_from_slice(text);
            }
        }
    }

    fn error(&self, out: &mut Vec<u8>) {
        if !self.setup.silent() {
            out.extend_from_slice(&self.errmsg);
        }
    }
}

/// A command failed: the error message goes out in its place.
struct Failed;

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\r' | b'\n' | b'\t')
}

fn lossy(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parse `pieces` (commands that need no request: text, errors, conditionals on
    /// set variables are left to the end-to-end tests) - here only the parser's text path.
    fn texts(pieces: &[&[u8]]) -> Vec<u8> {
        let mut s = Stream::new(Setup::new(false, 255), None, 0);
        let mut out = Vec::new();
        for p in pieces {
            s.input = bytes::Bytes::copy_from_slice(p);
            s.pos = 0;
            let mut text = Vec::new();
            while s.pos < s.input.len() {
                let input = s.input.clone();
                if let Parsed::Error = s.parse(&input, &mut text) {
                    text.extend_from_slice(b"[E]");
                }
            }
            out.extend(text);
        }
        out
    }

    #[test]
    fn text_and_prefixes_pass_split_anywhere() {
        let page = b"a <b> <!- x <!-- c --> <<!--# bad ! --> d";
        let want = b"a <b> <!- x <!-- c --> <[E] d".to_vec();
        for cut in 0..=page.len() {
            assert_eq!(texts(&[&page[..cut], &page[cut..]]), want, "cut {cut}");
        }
        let bytes: Vec<&[u8]> = page.chunks(1).collect();
        assert_eq!(texts(&bytes), want);
    }
}
