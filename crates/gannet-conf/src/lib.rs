//! gannet-conf: the nginx configuration syntax, with nothing gannet-specific in it.
//!
//! - [`parse_file`] / [`parse_str`] turn a config into a tree of [`Directive`]s, each carrying
//!   the `file:line` it came from; `include` (with globs) is resolved here, relative to the
//!   directory of the main config file, as nginx does. [`parse_file_dumped`] also keeps the
//!   bytes of every file read (`-T`); [`parse_params`] reads `-g`'s directives.
//! - [`registry`] describes a directive (name, allowed contexts, argument count) so that each
//!   server module can own a table of them, and checks a parsed directive against it.
//! - [`setters`] parse the shared argument kinds: flags, sizes, durations.
//!
//! Errors are [`ConfError`]s, printed as `file:line: message` like `nginx -t`. Untrusted or
//! broken input cannot exhaust the stack or memory: block nesting, include nesting and file
//! size are capped ([`MAX_BLOCK_DEPTH`], [`MAX_INCLUDE_DEPTH`], [`MAX_FILE_SIZE`]).

mod error;
mod include;
mod lexer;
mod parser;
pub mod registry;
pub mod setters;

pub use error::{ConfError, Loc};
pub use include::MAX_FILE_SIZE;
pub use parser::{
    parse_file, parse_file_dumped, parse_params, parse_str, Dump, COMMAND_LINE, MAX_BLOCK_DEPTH,
    MAX_INCLUDE_DEPTH,
};

/// One directive: `name arg1 arg2;` or `name args { block }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    pub name: String,
    /// Arguments after quote removal and escape processing; `$variables` are kept verbatim.
    pub args: Vec<String>,
    /// `Some` for a block directive (`server { ... }`), even when the block is empty.
    pub block: Option<Vec<Directive>>,
    pub loc: Loc,
}

impl Directive {
    /// The directive's error: `file:line: "name" directive <msg>`-style helper.
    pub fn error(&self, msg: impl std::fmt::Display) -> ConfError {
        ConfError::at(&self.loc, msg)
    }
}
