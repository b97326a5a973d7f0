//! Where a directive came from, and the error type that prints it.

use std::fmt;
use std::sync::Arc;

/// A source position: the file (as given or resolved) and its 1-based line; line 0 is text
/// with no lines to count (the command line's `-g`), printed as the name alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loc {
    pub file: Arc<str>,
    pub line: u32,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => f.write_str(&self.file),
            n => write!(f, "{}:{n}", self.file),
        }
    }
}

/// A configuration error; `Display` gives `file:line: message` (or just the message when the
/// error has no position, e.g. a missing main file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfError {
    pub loc: Option<Loc>,
    pub msg: String,
}

impl ConfError {
    pub fn at(loc: &Loc, msg: impl fmt::Display) -> Self {
        ConfError {
            loc: Some(loc.clone()),
            msg: msg.to_string(),
        }
    }
    pub fn bare(msg: impl fmt::Display) -> Self {
        ConfError {
            loc: None,
            msg: msg.to_string(),
        }
    }
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.loc {
            Some(loc) => write!(f, "{loc}: {}", self.msg),
            None => f.write_str(&self.msg),
        }
    }
}

impl std::error::Error for ConfError {}
