//! Directive descriptions owned by the server's modules, and the check of a parsed directive
//! against one (context allowed, argument count, block or not).

use crate::{ConfError, Directive};

/// Config contexts as a bit set, like nginx's NGX_HTTP_MAIN_CONF etc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctx(pub u16);

impl Ctx {
    pub const MAIN: Ctx = Ctx(1);
    pub const EVENTS: Ctx = Ctx(1 << 1);
    pub const HTTP: Ctx = Ctx(1 << 2);
    pub const SERVER: Ctx = Ctx(1 << 3);
    pub const LOCATION: Ctx = Ctx(1 << 4);
    pub const UPSTREAM: Ctx = Ctx(1 << 5);
    pub const TYPES: Ctx = Ctx(1 << 6);
    pub const IF: Ctx = Ctx(1 << 7);
    /// Inside a location's `limit_except` block.
    pub const LIMIT_EXCEPT: Ctx = Ctx(1 << 8);
    /// http, server and location: the usual set for inheritable directives.
    pub const HSL: Ctx = Ctx(Self::HTTP.0 | Self::SERVER.0 | Self::LOCATION.0);

    pub const fn or(self, other: Ctx) -> Ctx {
        Ctx(self.0 | other.0)
    }
    pub const fn contains(self, other: Ctx) -> bool {
        self.0 & other.0 == other.0
    }
    /// The context's name as nginx prints it in errors ("http", "server", ...).
    pub fn name(self) -> &'static str {
        match self {
            Ctx::MAIN => "main",
            Ctx::EVENTS => "events",
            Ctx::HTTP => "http",
            Ctx::SERVER => "server",
            Ctx::LOCATION => "location",
            Ctx::UPSTREAM => "upstream",
            Ctx::TYPES => "types",
            Ctx::IF => "if",
            Ctx::LIMIT_EXCEPT => "limit_except",
            _ => "mixed",
        }
    }
}

/// How many arguments a directive takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Args {
    Exactly(u8),
    Between(u8, u8),
    AtLeast(u8),
}

/// One directive's description.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    pub ctx: Ctx,
    pub args: Args,
    /// Whether the directive opens a block (`server { }`).
    pub block: bool,
}

/// Check a parsed directive against its spec in the context it appears in. Errors read like
/// nginx's and come in nginx's order (context, then block, then arguments):
/// `"listen" directive is not allowed here`, `directive "server" has no opening "{"`,
/// `directive "root" is not terminated by ";"` (a block where none belongs: nginx's wording,
/// it reports the `{`), `invalid number of arguments in "root" directive`.
pub fn check(spec: &Spec, d: &Directive, ctx: Ctx) -> Result<(), ConfError> {
    let name = &d.name;
    // Every bit of `ctx` must be allowed, so a caller may pass e.g. LOCATION|IF for an `if`
    // inside a location and have directives allowed only in locations refused there.
    if ctx.0 == 0 || !spec.ctx.contains(ctx) {
        return Err(d.error(format_args!("\"{name}\" directive is not allowed here")));
    }
    match (spec.block, d.block.is_some()) {
        (true, false) => {
            return Err(d.error(format_args!("directive \"{name}\" has no opening \"{{\"")))
        }
        (false, true) => {
            return Err(d.error(format_args!(
                "directive \"{name}\" is not terminated by \";\""
            )))
        }
        _ => {}
    }
    if !spec.args.allows(d.args.len()) {
        return Err(d.error(format_args!(
            "invalid number of arguments in \"{name}\" directive"
        )));
    }
    Ok(())
}

impl Args {
    /// Whether `n` arguments (not counting the name) fit.
    pub fn allows(self, n: usize) -> bool {
        match self {
            Args::Exactly(k) => n == usize::from(k),
            Args::Between(lo, hi) => (usize::from(lo)..=usize::from(hi)).contains(&n),
            Args::AtLeast(k) => n >= usize::from(k),
        }
    }
}

/// The spec for `name` in a module's table (directive names are case-sensitive, as in nginx).
pub fn find<'a>(table: &'a [Spec], name: &str) -> Option<&'a Spec> {
    table.iter().find(|s| s.name == name)
}

/// Look `d` up in `table` and check it; a name not in the table is nginx's
/// `unknown directive "NAME"`.
pub fn check_in<'a>(table: &'a [Spec], d: &Directive, ctx: Ctx) -> Result<&'a Spec, ConfError> {
    match find(table, &d.name) {
        Some(spec) => check(spec, d, ctx).map(|()| spec),
        None => Err(d.error(format_args!("unknown directive \"{}\"", d.name))),
    }
}
