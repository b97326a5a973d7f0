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
//! Unlike nginx, every include is run to its end before the page goes on (as with
//! `wait="yes"`): the output is the same, only commands after an include that nginx would
//! run while the include is still under way see its side effects.

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
    let Some(ct) = resp.content_type.as_deref() else {
        return false;
    };
    let types_match = match &c.types {
        Some(t) => t.matches(ct),
        None => Types::List(Vec::new()).matches(ct),
    };
    let known_empty = match resp.content_length {
        Some(n) => n == 0,
        None => !streamed && !resp.length_unknown && resp.body.len() == 0,
    };
    types_match && !known_empty
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

    /// Run through `input` from `self.pos`, text into `text`, until a command or an error
    /// is complete or the input ends.
    fn parse(&mut self, input: &[u8], text: &mut Vec<u8>) -> Parsed {
        while self.pos < input.len() {
            let ch = input[self.pos];
            self.pos += 1;
            if self.state == State::Start {
                // The tight loop: plain text up to the next '<'.
                let rest = &input[self.pos - 1..];
                match memchr::memchr(b'<', rest) {
                    Some(i) => {
                        text.extend_from_slice(&rest[..i]);
                        self.pos += i;
                        self.looked = 1;
                        self.state = State::Tag;
                    }
                    None => {
                        text.extend_from_slice(rest);
                        self.pos = input.len();
                    }
                }
                continue;
            }
            match self.state {
                State::Start => {}
                State::Tag | State::Comment0 | State::Comment1 | State::Sharp => {
                    let want = match self.state {
                        State::Tag => b'!',
                        State::Sharp => b'#',
                        _ => b'-',
                    };
                    if ch == want {
                        self.looked += 1;
                        self.state = match self.state {
                            State::Tag => State::Comment0,
                            State::Comment0 => State::Comment1,
                            State::Comment1 => State::Sharp,
                            _ => {
                                self.looked = 0;
                                State::Precommand
                            }
                        };
                    } else {
                        // Not a command: the prefix was text; `ch` starts afresh.
                        text.extend_from_slice(&b"<!--"[..self.looked]);
                        if ch == b'<' {
                            self.looked = 1;
                            self.state = State::Tag;
                        } else {
                            text.push(ch);
                            self.looked = 0;
                            self.state = State::Start;
                        }
                    }
                }
                State::Precommand => {
                    if !is_space(ch) {
                        self.command.clear();
                        self.command.push(ch);
                        self.params.clear();
                        self.state = State::Command;
                    }
                }
                State::Command => match ch {
                    c if is_space(c) => self.state = State::Preparam,
                    b'-' => self.state = State::CommentEnd0,
                    _ => {
                        if self.command.len() == COMMAND_LEN {
                            self.log(format_args!(
                                "the \"{}{}...\" SSI command is too long",
                                lossy(&self.command),
                                ch as char
                            ));
                            self.state = State::Error;
                        } else {
                            self.command.push(ch);
                        }
                    }
                },
                State::Preparam => match ch {
                    c if is_space(c) => {}
                    b'-' => self.state = State::CommentEnd0,
                    _ => {
                        self.params.push((vec![ch], Vec::new()));
                        self.state = State::Param;
                    }
                },
                State::Param => match ch {
                    c if is_space(c) => self.state = State::Preequal,
                    b'=' => self.state = State::Prevalue,
                    b'-' => {
                        self.log(format_args!(
                            "unexpected \"-\" symbol after \"{}\" parameter in \"{}\" SSI command",
                            lossy(self.key()),
                            lossy(&self.command)
                        ));
                        self.state = State::ErrorEnd0;
                    }
                    _ => {
                        if self.key().len() == PARAM_LEN {
                            self.log(format_args!(
                                "too long \"{}{}...\" parameter in \"{}\" SSI command",
                                lossy(self.key()),
                                ch as char,
                                lossy(&self.command)
                            ));
                            self.state = State::Error;
                        } else if let Some(p) = self.params.last_mut() {
                            p.0.push(ch);
                        }
                    }
                },
                State::Preequal | State::Prevalue => match ch {
                    c if is_space(c) => {}
                    b'=' if self.state == State::Preequal => self.state = State::Prevalue,
                    b'"' if self.state == State::Prevalue => self.state = State::DoubleQuoted,
                    b'\'' if self.state == State::Prevalue => self.state = State::Quoted,
                    _ => {
                        let where_ = if self.state == State::Preequal {
                            "after"
                        } else {
                            "before value of"
                        };
                        self.log(format_args!(
                            "unexpected \"{}\" symbol {where_} \"{}\" parameter in \"{}\" SSI command",
                            ch as char,
                            lossy(self.key()),
                            lossy(&self.command)
                        ));
                        self.state = if ch == b'-' {
                            State::ErrorEnd0
                        } else {
                            State::Error
                        };
                    }
                },
                State::DoubleQuoted | State::Quoted => {
                    let close = if self.state == State::DoubleQuoted {
                        b'"'
                    } else {
                        b'\''
                    };
                    if ch == close {
                        self.state = State::Postparam;
                    } else {
                        if ch == b'\\' {
                            self.saved_state = self.state;
                            self.state = State::QuotedSymbol;
                        }
                        self.value_byte(ch);
                    }
                }
                State::QuotedSymbol => {
                    self.state = self.saved_state;
                    self.value_byte(ch);
                }
                State::Postparam => match ch {
                    c if is_space(c) => self.state = State::Preparam,
                    b'-' => self.state = State::CommentEnd0,
                    _ => {
                        let value = self.params.last().map(|p| p.1.clone()).unwrap_or_default();
                        self.log(format_args!(
                            "unexpected \"{}\" symbol after \"{}\" value of \"{}\" parameter in \"{}\" SSI command",
                            ch as char,
                            lossy(&value),
                            lossy(self.key()),
                            lossy(&self.command)
                        ));
                        self.state = State::Error;
                    }
                },
                State::CommentEnd0 | State::CommentEnd1 => {
                    let want = if self.state == State::CommentEnd0 {
                        b'-'
                    } else {
                        b'>'
                    };
                    if ch != want {
                        self.log(format_args!(
                            "unexpected \"{}\" symbol in \"{}\" SSI command",
                            ch as char,
                            lossy(&self.command)
                        ));
                        self.state = State::Error;
                    } else if self.state == State::CommentEnd0 {
                        self.state = State::CommentEnd1;
                    } else {
                        self.state = State::Start;
                        return Parsed::Command;
                    }
                }
                State::Error => {
                    if ch == b'-' {
                        self.state = State::ErrorEnd0;
                    }
                }
                State::ErrorEnd0 => {
                    self.state = if ch == b'-' {
                        State::ErrorEnd1
                    } else {
                        State::Error
                    };
                }
                State::ErrorEnd1 => {
                    if ch == b'>' {
                        self.state = State::Start;
                        return Parsed::Error;
                    }
                    self.state = State::Error;
                }
            }
        }
        Parsed::Again
    }

    fn key(&self) -> &[u8] {
        self.params
            .last()
            .map(|p| p.0.as_slice())
            .unwrap_or_default()
    }

    /// A byte of a quoted value, up to `ssi_value_length`.
    fn value_byte(&mut self, ch: u8) {
        let limit = self.setup.value_len();
        let Some((key, value)) = self.params.last_mut() else {
            return;
        };
        if value.len() >= limit {
            let (v, k) = (lossy(value).into_owned(), lossy(key).into_owned());
            self.log(format_args!(
                "too long \"{v}{}...\" value of \"{k}\" parameter in \"{}\" SSI command",
                ch as char,
                lossy(&self.command)
            ));
            self.state = State::Error;
        } else {
            value.push(ch);
        }
    }

    fn log(&self, args: std::fmt::Arguments) {
        errlog::error(args);
    }

    /// Run the command just parsed; an include is handed back to be run.
    fn run(&mut self, req: &Request, out: &mut Vec<u8>) -> Option<Include> {
        let cmd = std::mem::take(&mut self.command);
        let params = std::mem::take(&mut self.params);
        let r = self.command_with(req, &cmd, &params, out);
        self.command = cmd;
        match r {
            Ok(inc) => inc,
            Err(Failed) => {
                self.error(out);
                None
            }
        }
    }

    fn command_with(
        &mut self,
        req: &Request,
        cmd: &[u8],
        params: &[(Vec<u8>, Vec<u8>)],
        out: &mut Vec<u8>,
    ) -> Result<Option<Include>, Failed> {
        // (name, its parameters: (name, mandatory, multiple), conditional level, block)
        let spec: (&[(&str, bool)], u8, bool) = match cmd {
            b"include" => (
                &[
                    ("virtual", false),
                    ("file", false),
                    ("wait", false),
                    ("set", false),
                    ("stub", false),
                ],
                0,
                false,
            ),
            b"echo" => (
                &[("var", true), ("default", false), ("encoding", false)],
                0,
                false,
            ),
            b"config" => (&[("errmsg", false), ("timefmt", false)], 0, false),
            b"set" => (&[("var", true), ("value", true)], 0, false),
            b"if" => (&[("expr", true)], 0, false),
            b"elif" => (&[("expr", true)], 1, false),
            b"else" => (&[], 1, false),
            b"endif" => (&[], 2, false),
            b"block" => (&[("name", true)], 0, false),
            b"endblock" => (&[], 0, true),
            _ => {
                if self.output {
                    self.log(format_args!("invalid SSI command: \"{}\"", lossy(cmd)));
                    return Err(Failed);
                }
                return Ok(None);
            }
        };
        let (names, conditional, block) = spec;
        if !self.output && !block {
            if self.block {
                // Inside a block: the command is kept as text, rebuilt.
                let mut t = b"<!--#".to_vec();
                t.extend_from_slice(cmd);
                for (k, v) in params {
                    t.push(b' ');
                    t.extend_from_slice(k);
                    t.extend_from_slice(b"=\"");
                    t.extend_from_slice(v);
                    t.push(b'"');
                }
                t.extend_from_slice(b" -->");
                if let Some(b) = self.shared.borrow_mut().blocks.last_mut() {
                    b.1.extend_from_slice(&t);
                }
                return Ok(None);
            }
            if conditional == 0 {
                return Ok(None);
            }
        }
        let c = lossy(cmd);
        if conditional != 0 && (self.conditional == 0 || self.conditional > conditional) {
            self.log(format_args!("invalid context of SSI command: \"{c}\""));
            return Err(Failed);
        }
        if params.len() > MAX_PARAMS {
            self.log(format_args!("too many SSI command parameters: \"{c}\""));
            return Err(Failed);
        }
        let mut got: Vec<Option<Vec<u8>>> = vec![None; names.len()];
        for (k, v) in params {
            let Some(i) = names.iter().position(|(n, _)| n.as_bytes() == k.as_slice()) else {
                self.log(format_args!(
                    "invalid parameter name: \"{}\" in \"{c}\" SSI command",
                    lossy(k)
                ));
                return Err(Failed);
            };
            if got[i].is_some() {
                self.log(format_args!(
                    "duplicate \"{}\" parameter in \"{c}\" SSI command",
                    lossy(k)
                ));
                return Err(Failed);
            }
            got[i] = Some(v.clone());
        }
        for (i, (n, mandatory)) in names.iter().enumerate() {
            if *mandatory && got[i].is_none() {
                self.log(format_args!(
                    "mandatory \"{n}\" parameter is absent in \"{c}\" SSI command"
                ));
                return Err(Failed);
            }
        }
        let mut got = got.into_iter();
        let mut p = move || got.next().flatten();
        match cmd {
            b"include" => self.include(req, p(), p(), p(), p(), p()).map(Some),
            b"echo" => self.echo(req, p(), p(), p(), out).map(|()| None),
            b"config" => {
                let (errmsg, timefmt) = (p(), p());
                if let Some(t) = timefmt {
                    self.timefmt = t;
                }
                if let Some(e) = errmsg {
                    self.errmsg = e;
                }
                Ok(None)
            }
            b"set" => {
                let (name, value) = (p().unwrap_or_default(), p().unwrap_or_default());
                let value = self.evaluate(req, &value, false)?;
                let name = String::from_utf8_lossy(&name).to_ascii_lowercase();
                self.shared.borrow_mut().set_var(name, value);
                Ok(None)
            }
            b"if" | b"elif" => {
                if cmd == b"if" && self.conditional != 0 {
                    self.log(format_args!("the \"if\" command inside the \"if\" command"));
                    return Err(Failed);
                }
                if self.output_chosen {
                    self.output = false;
                    return Ok(None);
                }
                let yes = self.expr(req, &p().unwrap_or_default())?;
                self.output = yes;
                self.output_chosen |= yes;
                self.conditional = 1;
                Ok(None)
            }
            b"else" => {
                self.output = !self.output_chosen;
                self.conditional = 2;
                Ok(None)
            }
            b"endif" => {
                self.output = true;
                self.output_chosen = false;
                self.conditional = 0;
                Ok(None)
            }
            b"block" => {
                let name = p().unwrap_or_default();
                self.shared.borrow_mut().blocks.push((name, Vec::new()));
                self.output = false;
                self.block = true;
                Ok(None)
            }
            _ => {
                // endblock
                self.output = true;
                self.block = false;
                Ok(None)
            }
        }
    }

    fn include(
        &mut self,
        req: &Request,
        virt: Option<Vec<u8>>,
        file: Option<Vec<u8>>,
        wait: Option<Vec<u8>>,
        set: Option<Vec<u8>>,
        stub: Option<Vec<u8>>,
    ) -> Result<Include, Failed> {
        let uri = match (virt, file) {
            (Some(u), Some(f)) => {
                self.log(format_args!(
                    "inclusion may be either virtual=\"{}\" or file=\"{}\"",
                    lossy(&u),
                    lossy(&f)
                ));
                return Err(Failed);
            }
            (None, None) => {
                self.log(format_args!("no parameter in \"include\" SSI command"));
                return Err(Failed);
            }
            (Some(u), None) => {
                if let Some(w) = &wait {
                    if !w.eq_ignore_ascii_case(b"no") && !w.eq_ignore_ascii_case(b"yes") {
                        self.log(format_args!(
                            "invalid value \"{}\" in the \"wait\" parameter",
                            lossy(w)
                        ));
                        return Err(Failed);
                    }
                }
                u
            }
            (None, Some(f)) => {
                if wait.is_some() {
                    self.log(format_args!(
                        "\"wait\" cannot be used with file=\"{}\"",
                        lossy(&f)
                    ));
                    return Err(Failed);
                }
                f
            }
        };
        if set.is_some() && stub.is_some() {
            self.log(format_args!(
                "\"set\" and \"stub\" cannot be used together in \"include\" SSI command"
            ));
            return Err(Failed);
        }
        let mut uri = self.evaluate(req, &uri, false)?;
        if uri.first() != Some(&b'/') {
            // Relative to the page's directory.
            let dir = match req.uri.rfind('/') {
                Some(i) => &req.uri[..=i],
                None => "",
            };
            let mut full = dir.as_bytes().to_vec();
            full.extend_from_slice(&uri);
            uri = full;
        }
        let uri = String::from_utf8_lossy(&uri).into_owned();
        let (path, args) = match uri.split_once('?') {
            Some((p, a)) => (p.to_string(), Some(a.to_string())),
            None => (uri, None),
        };
        // nginx's ngx_http_parse_unsafe_uri: no "..", no NUL.
        if path.contains('\0') || path.split('/').any(|s| s == "..") {
            self.log(format_args!("unsafe URI \"{path}\" was detected"));
            return Err(Failed);
        }
        let stub = match stub {
            Some(name) => match self.shared.borrow().block(&name) {
                Some(b) => Some(b),
                None => {
                    self.log(format_args!(
                        "\"stub\"=\"{}\" for \"include\" not found",
                        lossy(&name)
                    ));
                    return Err(Failed);
                }
            },
            None => None,
        };
        // nginx counts 51 levels down from the main request (NGX_HTTP_MAX_SUBREQUESTS + 1).
        if self.depth > MAX_DEPTH {
            self.log(format_args!(
                "subrequests cycle while processing \"{path}\""
            ));
            return Err(Failed);
        }
        Ok(Include {
            uri: path,
            args,
            set: set.map(|s| String::from_utf8_lossy(&s).to_ascii_lowercase()),
            stub,
        })
    }

    fn echo(
        &mut self,
        req: &Request,
        var: Option<Vec<u8>>,
        default: Option<Vec<u8>>,
        encoding: Option<Vec<u8>>,
        out: &mut Vec<u8>,
    ) -> Result<(), Failed> {
        let name = String::from_utf8_lossy(&var.unwrap_or_default()).to_ascii_lowercase();
        let value = match self.lookup(req, &name) {
            Some(v) => v,
            None => default.unwrap_or_else(|| b"(none)".to_vec()),
        };
        if value.is_empty() {
            return Ok(());
        }
        if let Some(e) = encoding {
            match e.as_slice() {
                b"none" => self.encoding = Encoding::None,
                b"url" => self.encoding = Encoding::Url,
                b"entity" => self.encoding = Encoding::Entity,
                _ => self.log(format_args!(
                    "unknown encoding \"{}\" in the \"echo\" command",
                    lossy(&e)
                )),
            }
        }
        match self.encoding {
            Encoding::None => out.extend_from_slice(&value),
            Encoding::Url => {
                for &b in &value {
                    // nginx's NGX_ESCAPE_HTML table: controls, non-ASCII and these.
                    if b <= b' '
                        || b >= 0x7f
                        || matches!(
                            b,
                            b'"' | b'#'
                                | b'%'
                                | b'\''
                                | b'<'
                                | b'>'
                                | b'\\'
                                | b'^'
                                | b'`'
                                | b'{'
                                | b'|'
                                | b'}'
                        )
                    {
                        out.extend_from_slice(format!("%{b:02X}").as_bytes());
                    } else {
                        out.push(b);
                    }
                }
            }
            Encoding::Entity => {
                for &b in &value {
                    match b {
                        b'<' => out.extend_from_slice(b"&lt;"),
                        b'>' => out.extend_from_slice(b"&gt;"),
                        b'&' => out.extend_from_slice(b"&amp;"),
                        b'"' => out.extend_from_slice(b"&quot;"),
                        _ => out.push(b),
                    }
                }
            }
        }
        Ok(())
    }

    /// A variable's value: SSI's own (and captures), `$date_*` in this page's `timefmt`,
    /// else the request's; `None` when not found.
    fn lookup(&self, req: &Request, name: &str) -> Option<Vec<u8>> {
        if let Some(v) = self.shared.borrow().var(name) {
            return Some(v.to_vec());
        }
        match name {
            "date_local" => Some(date(&self.timefmt, false)),
            "date_gmt" => Some(date(&self.timefmt, true)),
            _ => crate::http::variables::lookup(name, req).map(String::into_bytes),
        }
    }

    /// nginx's ngx_http_ssi_evaluate_string: `$var` / `${var}` replaced, backslashes taken
    /// off before `\`, `'`, `"` and `$`.
    fn evaluate(&self, req: &Request, text: &[u8], _regex: bool) -> Result<Vec<u8>, Failed> {
        let mut out = Vec::with_capacity(text.len());
        let mut i = 0;
        let mut quoted = false;
        while i < text.len() {
            let ch = text[i];
            if ch == b'$' && !quoted {
                i += 1;
                let bracket = text.get(i) == Some(&b'{');
                if bracket {
                    i += 1;
                }
                let start = i;
                while i < text.len() && (text[i].is_ascii_alphanumeric() || text[i] == b'_') {
                    i += 1;
                }
                let name = &text[start..i];
                if bracket {
                    if text.get(i) != Some(&b'}') {
                        self.log(format_args!(
                            "the closing bracket in \"{}\" variable is missing",
                            lossy(&text[start..])
                        ));
                        return Err(Failed);
                    }
                    i += 1;
                }
                if name.is_empty() {
                    self.log(format_args!("invalid variable name in \"{}\"", lossy(text)));
                    return Err(Failed);
                }
                let name = String::from_utf8_lossy(name).to_ascii_lowercase();
                if let Some(v) = self.lookup(req, &name) {
                    out.extend_from_slice(&v);
                }
                continue;
            }
            i += 1;
            if quoted {
                quoted = false;
                if !matches!(ch, b'\\' | b'\'' | b'"' | b'$') {
                    out.push(b'\\');
                }
            } else if ch == b'\\' {
                quoted = true;
                continue;
            }
            out.push(ch);
        }
        Ok(out)
    }

    /// `if expr=`: `$var`, `$a = text`, `$a != text`, `$a = /regex/`.
    fn expr(&self, req: &Request, expr: &[u8]) -> Result<bool, Failed> {
        let mut lower = expr.to_vec();
        let mut p = 0;
        while p < lower.len() {
            let c = lower[p];
            if c.is_ascii_uppercase() {
                lower[p] = c.to_ascii_lowercase();
            } else if !(c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || matches!(c, b'$' | b'{' | b'}' | b'_' | b'"' | b'\''))
            {
                break;
            }
            p += 1;
        }
        let left = self.evaluate(req, &lower[..p], false)?;
        while expr.get(p) == Some(&b' ') {
            p += 1;
        }
        if p == expr.len() {
            return Ok(!left.is_empty());
        }
        let invalid = || {
            self.log(format_args!("invalid expression in \"{}\"", lossy(expr)));
            Failed
        };
        let negative = if expr[p] == b'=' {
            p += 1;
            false
        } else if expr[p] == b'!' && expr.get(p + 1) == Some(&b'=') {
            p += 2;
            true
        } else {
            return Err(invalid());
        };
        while expr.get(p) == Some(&b' ') {
            p += 1;
        }
        let mut last = expr.len();
        let regex = p + 1 < last && expr[p] == b'/';
        if regex {
            if expr[last - 1] != b'/' {
                return Err(invalid());
            }
            last -= 1;
            p += 1;
        } else if p + 1 < last && expr[p] == b'\\' && expr[p + 1] == b'/' {
            p += 1;
        }
        let right = self.evaluate(req, &expr[p..last.max(p)], regex)?;
        let matched = if regex {
            self.regex_match(&right, &left)?
        } else {
            left == right
        };
        Ok(matched != negative)
    }

    fn regex_match(&self, pattern: &[u8], subject: &[u8]) -> Result<bool, Failed> {
        let re = match Regex::new(&String::from_utf8_lossy(pattern), false) {
            Ok(re) => re,
            Err(e) => {
                self.log(format_args!("{e}"));
                return Err(Failed);
            }
        };
        let Some(caps) = re.captures(subject) else {
            return Ok(false);
        };
        let mut sh = self.shared.borrow_mut();
        sh.captures = (0..caps.groups())
            .map(|i| caps.get(i).unwrap_or_default().to_vec())
            .collect();
        for (i, name) in re.names() {
            let v = caps.get(i).unwrap_or_default().to_vec();
            sh.set_var(name.to_ascii_lowercase(), v);
        }
        Ok(true)
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

/// `$date_local` / `$date_gmt` in `fmt` (strftime's; `%s` alone is the Unix time).
pub fn date(fmt: &[u8], gmt: bool) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    if fmt == b"%s" {
        return now.to_string().into_bytes();
    }
    let Ok(cfmt) = std::ffi::CString::new(fmt) else {
        return Vec::new();
    };
    let t = now as libc::time_t;
    // SAFETY: an all-zero `tm` is a valid value (plain integers and a null zone pointer).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: pointers to live values of this frame; the *_r variants only write `tm`.
    let ok = unsafe {
        if gmt {
            !libc::gmtime_r(&t, &mut tm).is_null()
        } else {
            !libc::localtime_r(&t, &mut tm).is_null()
        }
    };
    if !ok {
        return Vec::new();
    }
    // nginx's NGX_HTTP_SSI_DATE_LEN.
    let mut buf = vec![0u8; 2048];
    // SAFETY: `buf` has `buf.len()` writable bytes, `cfmt` is NUL-terminated and `tm` is
    // initialised; strftime writes at most `buf.len()` bytes and returns how many.
    let n = unsafe {
        libc::strftime(
            buf.as_mut_ptr().cast::<libc::c_char>(),
            buf.len(),
            cfmt.as_ptr(),
            &tm,
        )
    };
    buf.truncate(n);
    buf
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
