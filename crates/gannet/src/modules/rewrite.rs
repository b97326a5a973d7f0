//! The rewrite statements (nginx's ngx_http_rewrite_module): `return code [text|URL]`,
//! `return URL`, `rewrite regex replacement [last|break|redirect|permanent]`, `break`,
//! `set $name value` and `if (condition) { ... }`. They run in order, in the server-rewrite
//! phase (server level) or the rewrite phase (location level), and are not inherited, as in
//! nginx. `return 444` closes the connection without an answer.
//!
//! An `if` in a location is a nested location (nginx's "if" location): when its condition
//! holds, its statements run and its settings (`root`, `add_header`, `fastcgi_pass`...)
//! replace the location's for the rest of the request; it inherits the location's
//! settings, but not its `try_files`, as in nginx. An `if` at server level holds rewrite
//! statements only. The loader builds the block (`config::load`); this module runs it.

mod condition;

use super::{LoadCtx, LocConf};
use crate::errlog::{self, Level};
use crate::http::flow::Flow;
use crate::http::request::Request;
use crate::http::response::{Body, Response};
use crate::http::user_vars::{self, CapRegex, UserVar};
use crate::http::variables::{Sent, Template};
pub use condition::Cond;
use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{ConfError, Directive};
use std::sync::Arc;

const SL: Ctx = Ctx(Ctx::SERVER.0 | Ctx::LOCATION.0);
/// Server, location and the inside of an `if`.
const SLI: Ctx = SL.or(Ctx::IF);

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "return",
        ctx: SLI,
        args: Args::Between(1, 2),
        block: false,
    },
    Spec {
        name: "rewrite",
        ctx: SLI,
        args: Args::Between(2, 3),
        block: false,
    },
    Spec {
        name: "break",
        ctx: SLI,
        args: Args::Exactly(0),
        block: false,
    },
    Spec {
        name: "set",
        ctx: SLI,
        args: Args::Exactly(2),
        block: false,
    },
    Spec {
        name: "if",
        ctx: SL,
        args: Args::AtLeast(1),
        block: true,
    },
    Spec {
        name: "rewrite_log",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::Exactly(1),
        block: false,
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    None,
    Last,
    Break,
    Redirect,
    Permanent,
}

#[derive(Debug, Clone)]
pub enum Stmt {
    Return {
        code: u16,
        text: Option<Template>,
    },
    Rewrite {
        re: CapRegex,
        to: Replacement,
        flag: Flag,
    },
    Break,
    Set {
        var: UserVar,
        value: Template,
    },
    /// `set $args ...` changes the query string, as in nginx.
    SetArgs(Template),
    SetLimitRate(Template),
    If {
        cond: Cond,
        body: Vec<Stmt>,
        /// The block's settings (a location-level `if`), merged with the location's.
        conf: Option<Arc<LocConf>>,
        /// The block names its own application (`proxy_pass`... in it), whose content
        /// handler then outlives the block (see [`run`]).
        own_handler: bool,
    },
}

#[derive(Debug, Clone, Default)]
pub struct RewriteConf {
    pub stmts: Arc<Vec<Stmt>>,
}

fn is_redirect(code: u16) -> bool {
    matches!(code, 301 | 302 | 303 | 307 | 308)
}

fn is_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://") || s.starts_with("$scheme")
}

/// A `rewrite`'s replacement, split as nginx compiles it: what makes it a redirect, where
/// the arguments start and whether the original ones follow are all read from the text in
/// the config, never from what its variables hold (`rewrite ^ $request_uri;` makes a URI
/// with a `?` in it and keeps the arguments, which `proxy_pass http://h$uri` then sends).
#[derive(Debug, Clone)]
pub struct Replacement {
    /// The new URI up to the text's first `?`; for a redirect, the whole target.
    path: Template,
    /// After the text's first `?` (not for a redirect): the new arguments.
    args: Option<Template>,
    /// The text has a `?`: a redirect's original arguments follow an `&`, not a `?`.
    has_query: bool,
    /// The text does not end with `?`: the original arguments are kept (or appended).
    keep_args: bool,
    /// The text starts with `http://`, `https://` or `$scheme`, or the flag says so.
    redirect: bool,
}

impl Replacement {
    /// `t` evaluated; where it makes arguments or a redirect (`quote`), its captures are
    /// escaped as nginx's NGX_ESCAPE_ARGS when the client's URI had a `%` or `+` in it
    /// (nginx's `quoted_uri` / `plus_in_uri`: the captures come from the decoded URI).
    fn eval(t: &Template, req: &Request, quote: bool) -> String {
        if quote && t.has_vars() && client_uri_quoted(req) {
            t.eval_escaping_captures(req, escape_args)
        } else {
            t.eval(req, None)
        }
    }

    fn compile(text: &str, flag: Flag) -> Result<Replacement, String> {
        if text.is_empty() {
            return Err("empty replacement".into());
        }
        let (text, keep_args) = match text.strip_suffix('?') {
            Some(t) => (t, false),
            None => (text, true),
        };
        let redirect = is_url(text) || matches!(flag, Flag::Redirect | Flag::Permanent);
        // A `?` cannot be part of a variable's name, so the first one is the text's own.
        let (path, args) = match text.split_once('?') {
            Some((p, a)) if !redirect => (p, Some(Template::compile(a)?)),
            _ => (text, None),
        };
        Ok(Replacement {
            path: Template::compile(path)?,
            args,
            has_query: text.contains('?'),
            keep_args,
            redirect,
        })
    }
}

pub fn set(d: &Directive, lc: &mut LocConf, _ctx: &mut LoadCtx) -> Result<(), ConfError> {
    let tpl = |s: &str| Template::compile(s).map_err(|e| d.error(e));
    let stmt = match d.name.as_str() {
        "rewrite_log" => {
            gannet_conf::setters::flag(d)?;
            return Ok(());
        }
        "break" => Stmt::Break,
        "set" => {
            let name = d.args[0]
                .strip_prefix('$')
                .ok_or_else(|| d.error(format!("invalid variable name \"{}\"", d.args[0])))?;
            let value = tpl(&d.args[1])?;
            if name == "args" {
                Stmt::SetArgs(value)
            } else if name == "limit_rate" {
                Stmt::SetLimitRate(value)
            } else {
                Stmt::Set {
                    var: user_vars::define_assigned(name).map_err(|e| d.error(e))?,
                    value,
                }
            }
        }
        // Its block is built by the loader, which then calls `add_if`.
        "if" => return Err(d.error("\"if\" cannot be loaded here")),
        "return" => match d.args.as_slice() {
            [one] if is_url(one) => Stmt::Return {
                code: 302,
                text: Some(tpl(one)?),
            },
            [code, rest @ ..] => {
                let code: u16 = code
                    .parse()
                    .ok()
                    .filter(|c| *c <= 999)
                    .ok_or_else(|| d.error(format!("invalid return code \"{code}\"")))?;
                Stmt::Return {
                    code,
                    text: rest.first().map(|t| tpl(t)).transpose()?,
                }
            }
            [] => return Err(d.error("invalid number of arguments in \"return\" directive")),
        },
        _ => {
            let re = CapRegex::compile(&d.args[0], false).map_err(|e| d.error(e))?;
            let flag = match d.args.get(2).map(String::as_str) {
                None => Flag::None,
                Some("last") => Flag::Last,
                Some("break") => Flag::Break,
                Some("redirect") => Flag::Redirect,
                Some("permanent") => Flag::Permanent,
                Some(f) => return Err(d.error(format!("invalid parameter \"{f}\""))),
            };
            Stmt::Rewrite {
                re,
                to: Replacement::compile(&d.args[1], flag).map_err(|e| d.error(e))?,
                flag,
            }
        }
    };
    Arc::make_mut(&mut lc.rewrite.stmts).push(stmt);
    Ok(())
}

/// Add an `if` whose block the loader has built into `inner` (its settings, and its
/// statements in `inner.rewrite`). `location` says whether the block's settings apply.
pub fn add_if(
    d: &Directive,
    lc: &mut LocConf,
    mut inner: LocConf,
    location: bool,
) -> Result<(), ConfError> {
    let cond = condition::parse(&d.args).map_err(|e| d.error(e))?;
    let body = std::mem::take(Arc::make_mut(&mut inner.rewrite.stmts));
    let conf = location.then(|| Arc::new(inner));
    Arc::make_mut(&mut lc.rewrite.stmts).push(Stmt::If {
        cond,
        body,
        conf,
        own_handler: false,
    });
    Ok(())
}

/// Once a location is complete and merged, its `if` blocks inherit from it. They keep its
/// content handler too: an `if` in a `proxy_pass` (`fastcgi_pass`, `scgi_pass`,
/// `uwsgi_pass`) location still passes, as in nginx.
pub fn merge_ifs(lc: &mut LocConf) {
    let mut stmts = std::mem::take(&mut lc.rewrite.stmts);
    for s in Arc::make_mut(&mut stmts) {
        if let Stmt::If {
            conf: Some(c),
            own_handler,
            ..
        } = s
        {
            let c = Arc::make_mut(c);
            *own_handler = super::gateway::active(c).is_some();
            c.merge(lc);
            inherit_handler(c, lc);
        }
    }
    lc.rewrite.stmts = stmts;
}

/// A nested configuration that is not a location of its own (an `if`, `limit_except`)
/// passes to its location's application unless it names one, as nginx's "noname"
/// locations do; a real nested location does not inherit it.
pub fn inherit_handler(c: &mut LocConf, lc: &LocConf) {
    for (inner, outer) in [
        (&mut c.fastcgi.gw, &lc.fastcgi.gw),
        (&mut c.scgi, &lc.scgi),
        (&mut c.uwsgi.gw, &lc.uwsgi.gw),
        (&mut c.proxy.gw, &lc.proxy.gw),
        (&mut c.grpc.gw, &lc.grpc.gw),
    ] {
        if inner.pass.is_none() {
            inner.pass = outer.pass.clone();
        }
    }
    if c.proxy.target.is_none() && c.proxy.gw.pass.is_some() {
        c.proxy.target = lc.proxy.target.clone();
    }
    if c.grpc.target.is_none() && c.grpc.gw.pass.is_some() {
        c.grpc.target = lc.grpc.target.clone();
    }
}

/// What the rewrite statements decided.
pub enum Outcome {
    /// Carry on in this location (`break`, or nothing matched).
    Stay,
    /// The URI changed: search the location again.
    Research,
    /// The request is answered.
    Flow(Flow),
}

pub fn run(stmts: &[Stmt], req: &mut Request) -> Outcome {
    let mut state = State::default();
    match run_block(stmts, req, &mut state) {
        Some(outcome) => outcome,
        None if state.changed => Outcome::Research,
        // nginx's content handler is the last matched `if` block's that names one; a
        // later matched block that names none leaves it, with that block's settings. When
        // those lack its application (the location has none), nginx's upstream finds
        // no configuration: 500, and an alert.
        None if state.orphaned => {
            errlog::request(Level::Alert, req, format_args!("no upstream configuration"));
            Outcome::Flow(Flow::Status(500))
        }
        None => Outcome::Stay,
    }
}

/// What running the statements noted.
#[derive(Default)]
struct State {
    /// A URI rewritten without a flag, which sends the request to a new location search
    /// at the end.
    changed: bool,
    /// The application a matched `if` block named.
    handler: Option<super::gateway::Proto>,
    /// A later matched `if` has settings without that application.
    orphaned: bool,
}

/// Run statements until one ends the script (`Some`).
fn run_block(stmts: &[Stmt], req: &mut Request, state: &mut State) -> Option<Outcome> {
    for s in stmts {
        match s {
            Stmt::Break => return Some(Outcome::Stay),
            Stmt::Return { code, text } => {
                return Some(Outcome::Flow(answer(req, *code, text.as_ref())))
            }
            Stmt::Set { var, value } => {
                let v = value.eval(req, None);
                req.vars.set(var.idx, v);
            }
            Stmt::SetArgs(value) => {
                let v = value.eval(req, None);
                req.args = (!v.is_empty()).then_some(v);
                // As nginx's `$args` setter: the client's raw URI no longer applies (a
                // `*_pass` without a URI part sends the URI with the new arguments).
                req.uri_changed = true;
            }
            Stmt::SetLimitRate(value) => {
                super::limit_rate::set_var(req, &value.eval(req, None));
            }
            Stmt::If {
                cond,
                body,
                conf,
                own_handler,
            } => {
                if !cond.eval(req) {
                    continue;
                }
                if let Some(c) = conf {
                    if *own_handler {
                        state.handler = super::gateway::active(c);
                        state.orphaned = false;
                    } else if let Some(p) = state.handler {
                        state.orphaned = super::gateway::conf(c, p).pass.is_none();
                    }
                    req.conf = c.clone();
                }
                if let Some(outcome) = run_block(body, req, state) {
                    return Some(outcome);
                }
            }
            Stmt::Rewrite { re, to, flag } => {
                let Some(caps) = re.captures(&req.uri, req) else {
                    continue;
                };
                req.captures = caps;
                if to.redirect {
                    let code = if *flag == Flag::Permanent { 301 } else { 302 };
                    let mut loc = unescape_redirect(&Replacement::eval(&to.path, req, true));
                    if let (true, Some(a)) = (to.keep_args, &req.args) {
                        loc.push(if to.has_query { '&' } else { '?' });
                        loc.push_str(a);
                    }
                    return Some(Outcome::Flow(Flow::Moved(code, loc)));
                }
                if !set_uri(req, to) {
                    return Some(Outcome::Flow(Flow::Status(500)));
                }
                state.changed = true;
                match flag {
                    Flag::Last => return Some(Outcome::Research),
                    Flag::Break => return Some(Outcome::Stay),
                    _ => {}
                }
            }
        }
    }
    None
}

/// Replace the URI (and the arguments, after a `?` in the replacement; the original ones
/// appended with `&` unless it ends with `?`) with a rewrite's result.
/// `false` for an empty URI (logged; nginx answers 500).
fn set_uri(req: &mut Request, to: &Replacement) -> bool {
    let uri = to.path.eval(req, None);
    if uri.is_empty() {
        errlog::request(
            Level::Error,
            req,
            format_args!("the rewritten URI has a zero length"),
        );
        return false;
    }
    let args = match &to.args {
        Some(t) => {
            let mut a = Replacement::eval(t, req, true);
            if let (true, Some(old)) = (to.keep_args, &req.args) {
                // nginx adds the `&` even after nothing: `rewrite ^ /x?$arg_none;`
                // makes `&q=1` of `?q=1`.
                a.push('&');
                a.push_str(old);
            }
            (!a.is_empty()).then_some(a)
        }
        None if to.keep_args => req.args.take(),
        None => None,
    };
    // The client's URI no longer applies, nor (after a `break`) the location's prefix.
    req.uri_changed = true;
    req.location_valid = false;
    req.uri = uri;
    req.args = args;
    true
}

/// Whether the client's path (before `?`) was percent-encoded or had a `+` in it.
fn client_uri_quoted(req: &Request) -> bool {
    let t = req.head.target();
    let path = t.split(|&c| c == b'?').next().unwrap_or(t);
    path.iter().any(|&c| c == b'%' || c == b'+')
}

/// nginx's NGX_ESCAPE_ARGS: controls, space, `"#%&+;<>?\^`{|}`, DEL and non-ASCII bytes.
fn escape_args(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &c in s.as_bytes() {
        if c <= b' ' || c >= 0x7f || b"\"#%&+;<>?\\^`{|}".contains(&c) {
            out.push('%');
            out.push(char::from(HEX[usize::from(c >> 4)]));
            out.push(char::from(HEX[usize::from(c & 15)]));
        } else {
            out.push(char::from(c));
        }
    }
}

/// nginx's NGX_UNESCAPE_REDIRECT over a redirect's target before its arguments are added:
/// `%XX` of a printable character above `%` is decoded, others stay as they are; a `%3F`
/// (`?`, its second digit a letter) or a `?` ends the decoding; a broken `%` sequence loses
/// characters as nginx's does.
fn unescape_redirect(s: &str) -> String {
    let hex = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    if !b.contains(&b'%') {
        return s.to_string();
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        i += 1;
        if c == b'?' {
            out.push(c);
            break;
        }
        if c != b'%' {
            out.push(c);
            continue;
        }
        let Some(hi) = b.get(i).and_then(|&d| hex(d)) else {
            // nginx keeps the character after a lone `%`, without the `%`.
            if let Some(&d) = b.get(i) {
                out.push(d);
                i += 1;
            }
            continue;
        };
        let Some(second) = b.get(i + 1).copied() else {
            i += 1;
            continue;
        };
        let Some(lo) = hex(second) else {
            // An invalid second digit: nginx drops the three characters.
            i += 2;
            continue;
        };
        let ch = (hi << 4) | lo;
        i += 2;
        if ch == b'?' && !second.is_ascii_digit() {
            out.push(ch);
            break;
        }
        if ch > b'%' && ch < 0x7f {
            out.push(ch);
        } else {
            out.extend_from_slice(&b[i - 3..i]);
        }
    }
    out.extend_from_slice(&b[i..]);
    String::from_utf8_lossy(&out).into_owned()
}

/// `return`'s answer.
fn answer(req: &Request, code: u16, text: Option<&Template>) -> Flow {
    if code == 444 {
        return Flow::Close;
    }
    let value = match text {
        Some(text) => text.eval(req, Some(&Sent::status(code))),
        // A code under 400 without text is still nginx's ngx_http_send_response, with an
        // empty body (not the built-in page); a redirect's and an error's are the page.
        None if (200..400).contains(&code) && !is_redirect(code) => String::new(),
        None => return Flow::Status(code),
    };
    if is_redirect(code) {
        return Flow::Moved(code, value);
    }
    let mut r = Response::new(code);
    // The type of the URI's extension, else `default_type`, as nginx's
    // ngx_http_send_response (a `return 200 "..."` at /x.html is text/html); a 204 has
    // none (nginx's header filter drops it) unless an error_page answers with another
    // status; a 304 still says its (empty) length, as nginx.
    if code != 204 || req.error_status.is_some() {
        r.content_type = Some(req.conf.types.lookup(&req.uri));
    }
    if code == 304 {
        r.content_length = Some(value.len() as u64);
    }
    r.body = Body::bytes(value);
    Flow::Done(r)
}

/// A redirect with nginx's body. Its target is made absolute by [`absolute`] in the
/// response filters (`http::handler::finish`), after `add_header` has seen it as it is.
pub fn redirect_response(req: &Request, code: u16, location: &str) -> Response {
    let mut r = Response::error_page(code, req.conf.core.server_tokens());
    r.location = Some(location.to_string());
    r
}

/// A `Location` starting with `/` made absolute when `absolute_redirect` is on, from the
/// Host (or the server name with `server_name_in_redirect on`) and the port (with
/// `port_in_redirect on`). nginx does it in its header filter, so for every answer: a
/// redirect of gannet's, or an application's or proxied server's `Location: /path`.
pub fn absolute(req: &Request, location: &str) -> Option<String> {
    let core = &req.conf.core;
    if !location.starts_with('/') || !core.absolute_redirect() {
        return None;
    }
    // The host the client named (Host, or an absolute-form target); without one, nginx
    // names the address the connection came to, not the server.
    // (A head refused unparsed has neither: its Host was never taken.)
    let target = req.head.target();
    let named = req.head.host().is_some() || !(target.is_empty() || target.starts_with(b"/"));
    let local;
    let host = if core.server_name_in_redirect() {
        &req.server.primary_name
    } else if named && !req.host.is_empty() {
        &req.host
    } else {
        local = req.conn.local.ip().to_string();
        &local
    };
    let port = req.conn.local.port();
    let (scheme, default_port) = if req.conn.tls.is_some() {
        ("https", 443)
    } else {
        ("http", 80)
    };
    Some(if core.port_in_redirect() && port != default_port {
        format!("{scheme}://{host}:{port}{location}")
    } else {
        format!("{scheme}://{host}{location}")
    })
}
