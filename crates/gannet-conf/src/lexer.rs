//! Tokenizer for the nginx config syntax: words (bare or quoted), `;`, `{`, `}` and end of
//! input, each with the 1-based line it starts on.
//!
//! It follows nginx's `ngx_conf_read_token` closely, because configs written for nginx must
//! split into the same words here:
//! - whitespace is space, tab, CR and LF only; `#` starts a comment only at a token start;
//! - a bare word ends at whitespace, `;` or `{` (so `a}` is a word), except that `${` inside
//!   a word stays in it (`${var}` interpolation);
//! - a backslash stops the next byte from acting as a delimiter, and is only removed for
//!   `\"`, `\'`, `\\`, `\n`, `\t`, `\r`: `a\ b` is the single word `a\ b`, as in nginx;
//! - after a closing quote only whitespace, `;`, `{` or `)` may follow (`)` so that
//!   `if ($a = "b")` works; it starts a new word).
//!
//! The lexer works on bytes so that a file that is not valid UTF-8 still tokenizes the way
//! nginx would; words are converted to `String` lossily at the end.

use crate::{ConfError, Loc};
use std::sync::Arc;

/// What a token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    Word(String),
    Semi,
    Open,
    Close,
    Eof,
}

/// A token and the line it starts on (for `Eof`: the line count at the end, as nginx reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: u32,
}

/// A pull tokenizer over one file's bytes.
pub(crate) struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: u32,
    file: Arc<str>,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

impl<'a> Lexer<'a> {
    pub(crate) fn new(src: &'a [u8], file: Arc<str>) -> Self {
        Lexer {
            src,
            pos: 0,
            line: 1,
            file,
        }
    }

    /// A location in this file.
    pub(crate) fn loc(&self, line: u32) -> Loc {
        Loc {
            file: self.file.clone(),
            line,
        }
    }

    fn err(&self, line: u32, msg: impl std::fmt::Display) -> ConfError {
        ConfError::at(&self.loc(line), msg)
    }

    /// Consume one byte, counting lines.
    fn bump(&mut self) -> Option<u8> {
        let b = *self.src.get(self.pos)?;
        self.pos += 1;
        if b == b'\n' {
            self.line = self.line.saturating_add(1);
        }
        Some(b)
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    /// The next token. Errors are the lexical ones: a quote left open, an unexpected byte
    /// after a closing quote, a backslash at end of input.
    pub(crate) fn next_token(&mut self) -> Result<Token, ConfError> {
        loop {
            let line = self.line;
            let Some(b) = self.peek() else {
                return Ok(Token {
                    tok: Tok::Eof,
                    line,
                });
            };
            let tok = match b {
                _ if is_space(b) => {
                    self.bump();
                    continue;
                }
                b'#' => {
                    // Up to (not including) the newline, so that it is counted by `bump`.
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                    continue;
                }
                b';' | b'{' | b'}' => {
                    self.pos += 1;
                    match b {
                        b';' => Tok::Semi,
                        b'{' => Tok::Open,
                        _ => Tok::Close,
                    }
                }
                b'"' | b'\'' => Tok::Word(self.quoted(b)?),
                _ => Tok::Word(self.bare()?),
            };
            return Ok(Token { tok, line });
        }
    }

    /// A bare word starting at the current byte.
    fn bare(&mut self) -> Result<String, ConfError> {
        let start = self.pos;
        while let Some(b) = self.peek() {
            if is_space(b) || b == b';' || b == b'{' {
                break;
            }
            self.bump();
            match b {
                b'\\' => self.escaped()?,
                // `${` keeps the brace in the word: nginx's "variable" state.
                b'$' if self.peek() == Some(b'{') => {
                    self.bump();
                }
                _ => {}
            }
        }
        Ok(unescape(&self.src[start..self.pos]))
    }

    /// The byte after a backslash: taken whatever it is, but there must be one.
    fn escaped(&mut self) -> Result<(), ConfError> {
        match self.bump() {
            Some(_) => Ok(()),
            None => Err(self.err(self.line, r#"unexpected end of file, expecting ";" or "}""#)),
        }
    }

    /// A quoted word; the current byte is the opening quote `q`.
    fn quoted(&mut self, q: u8) -> Result<String, ConfError> {
        let open_line = self.line;
        self.bump();
        let start = self.pos;
        loop {
            match self.bump() {
                None => {
                    return Err(self.err(
                        self.line,
                        format_args!(
                            r#"unexpected end of file, expecting ";" or "}}" (unbalanced quotes: string opened on line {open_line})"#
                        ),
                    ))
                }
                Some(b'\\') => {
                    // A backslash right before EOF is the unbalanced-quote case above.
                    if self.peek().is_some() {
                        self.bump();
                    }
                }
                Some(b) if b == q => break,
                Some(_) => {}
            }
        }
        let word = unescape(&self.src[start..self.pos - 1]);
        match self.peek() {
            None => Ok(word),
            Some(b) if is_space(b) || matches!(b, b';' | b'{' | b')') => Ok(word),
            Some(_) => Err(self.err(self.line, format_args!("unexpected \"{}\"", self.char_at()))),
        }
    }

    /// The (possibly multi-byte) character at the current position, for error messages.
    fn char_at(&self) -> String {
        let rest = &self.src[self.pos..];
        let end = rest.len().min(4);
        let s = String::from_utf8_lossy(&rest[..end]);
        s.chars().next().map(String::from).unwrap_or_default()
    }
}

/// Escape processing shared by bare and quoted words (nginx does the same for both).
fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == b'\\' {
            let decoded = match raw.get(i + 1) {
                Some(&c @ (b'"' | b'\'' | b'\\')) => Some(c),
                Some(b'n') => Some(b'\n'),
                Some(b't') => Some(b'\t'),
                Some(b'r') => Some(b'\r'),
                _ => None,
            };
            if let Some(c) = decoded {
                out.push(c);
                i += 2;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(src: &str) -> Result<Vec<Tok>, ConfError> {
        let mut lx = Lexer::new(src.as_bytes(), Arc::from("t"));
        let mut out = Vec::new();
        loop {
            let t = lx.next_token()?;
            if t.tok == Tok::Eof {
                return Ok(out);
            }
            out.push(t.tok);
        }
    }

    fn w(s: &str) -> Tok {
        Tok::Word(s.to_string())
    }

    #[test]
    fn punctuation_and_words() {
        assert_eq!(
            toks("a b;c{d}").unwrap(),
            vec![w("a"), w("b"), Tok::Semi, w("c"), Tok::Open, w("d}")]
        );
    }

    #[test]
    fn escapes_follow_nginx() {
        assert_eq!(toks(r"a\ b").unwrap(), vec![w(r"a\ b")]);
        assert_eq!(
            toks(r#""a\qb\"c\'d\\e""#).unwrap(),
            vec![w("a\\qb\"c'd\\e")]
        );
        assert_eq!(toks(r"x\ny\tz\r").unwrap(), vec![w("x\ny\tz\r")]);
        assert_eq!(toks(r"a\;b;").unwrap(), vec![w(r"a\;b"), Tok::Semi]);
    }

    #[test]
    fn variables_keep_braces() {
        assert_eq!(toks("${x}y {").unwrap(), vec![w("${x}y"), Tok::Open]);
        assert_eq!(toks("a$x{").unwrap(), vec![w("a$x"), Tok::Open]);
        assert_eq!(toks("$${a}").unwrap(), vec![w("$${a}")]);
    }

    #[test]
    fn comments_only_at_token_start() {
        assert_eq!(toks("a#b # c d\ne").unwrap(), vec![w("a#b"), w("e")]);
        assert_eq!(toks("a;#x\n").unwrap(), vec![w("a"), Tok::Semi]);
    }

    #[test]
    fn quotes() {
        assert_eq!(
            toks(r#""" '' "a b"; 'c"d'"#).unwrap(),
            vec![w(""), w(""), w("a b"), Tok::Semi, w("c\"d")]
        );
        assert_eq!(toks(r#""a")x"#).unwrap(), vec![w("a"), w(")x")]);
        assert_eq!(toks(r#"a"b"#).unwrap(), vec![w("a\"b")]);
    }

    #[test]
    fn lines() {
        let mut lx = Lexer::new(b"a\n\"b\nc\" d\n# x\n;", Arc::from("t"));
        let lines: Vec<u32> = (0..5).map(|_| lx.next_token().unwrap().line).collect();
        assert_eq!(lines, vec![1, 2, 3, 5, 5]);
    }

    #[test]
    fn errors() {
        let e = toks("a \"b\n\n").unwrap_err();
        assert_eq!(e.loc.as_ref().map(|l| l.line), Some(3));
        assert!(
            e.msg.contains("unbalanced quotes: string opened on line 1"),
            "{e}"
        );
        let e = toks("a \"b\"c").unwrap_err();
        assert_eq!(e.to_string(), "t:1: unexpected \"c\"");
        let e = toks("\n'b'é").unwrap_err();
        assert_eq!(e.to_string(), "t:2: unexpected \"é\"");
        let e = toks("a\\").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t:1: unexpected end of file, expecting \";\" or \"}\""
        );
    }
}
