//! Token stream -> directive tree. `include` is expanded here, while parsing, so the rest of
//! gannet never sees it: the included directives are spliced into the enclosing block and
//! keep their own file name in their locations.
//!
//! Errors and their wording follow nginx (`unexpected "}"`, `unexpected end of file,
//! expecting "}"`...). Two limits that nginx lacks keep hostile or broken input from
//! exhausting the stack: block nesting ([`MAX_BLOCK_DEPTH`]) and include nesting
//! ([`MAX_INCLUDE_DEPTH`], which is also how an include cycle ends).

use crate::include;
use crate::lexer::{Lexer, Tok};
use crate::{ConfError, Directive};
use std::path::Path;
use std::sync::Arc;

/// Deepest `{ }` nesting accepted, across included files. Real configs use well under 10.
pub const MAX_BLOCK_DEPTH: usize = 100;
/// Deepest chain of files including each other.
pub const MAX_INCLUDE_DEPTH: usize = 32;

/// Parse the main config file. `include` paths that are relative are taken relative to the
/// directory holding `path` (nginx's conf prefix).
pub fn parse_file(path: &Path) -> Result<Vec<Directive>, ConfError> {
    parse_file_dumped(path, None)
}

/// A file the parser read, in the order read: its name (as in error locations) and bytes.
/// `nginx -T` prints these.
pub type Dump = Vec<(Arc<str>, Vec<u8>)>;

/// [`parse_file`], also recording into `dump` the main file and every included one.
pub fn parse_file_dumped(
    path: &Path,
    dump: Option<&mut Dump>,
) -> Result<Vec<Directive>, ConfError> {
    let src = include::read_main(path)?;
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name: Arc<str> = Arc::from(path.display().to_string());
    let mut parser = Parser {
        include_base: base,
        includes: 0,
        dump,
    };
    parser.record(&name, &src);
    parser.file(&src, name)
}

/// Parse config text; `name` is used in locations, `include_base` resolves relative includes.
pub fn parse_str(src: &str, name: &str, include_base: &Path) -> Result<Vec<Directive>, ConfError> {
    Parser {
        include_base,
        includes: 0,
        dump: None,
    }
    .file(src.as_bytes(), Arc::from(name))
}

/// Where directives given with `-g` say they come from, as nginx's "in command line".
pub const COMMAND_LINE: &str = "command line";

/// Parse the directives of `-g` (main context). Their locations, and errors in them, name
/// [`COMMAND_LINE`] with line 0, which prints without a line number.
pub fn parse_params(src: &str, include_base: &Path) -> Result<Vec<Directive>, ConfError> {
    fn unnumber(ds: &mut [Directive]) {
        for d in ds {
            d.loc.line = 0;
            if let Some(b) = &mut d.block {
                unnumber(b);
            }
        }
    }
    match parse_str(src, COMMAND_LINE, include_base) {
        Ok(mut ds) => {
            unnumber(&mut ds);
            Ok(ds)
        }
        Err(mut e) => {
            if let Some(loc) = e.loc.as_mut().filter(|l| &*l.file == COMMAND_LINE) {
                loc.line = 0;
            }
            Err(e)
        }
    }
}

/// What ends a list of words: a directive's terminator, or a block's or file's end.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Semi,
    Open,
    Close,
    Eof,
}

struct Parser<'p> {
    include_base: &'p Path,
    /// How many include files are being parsed right now (the include stack's height).
    includes: usize,
    /// Every file read, for `-T`.
    dump: Option<&'p mut Dump>,
}

impl Parser<'_> {
    fn record(&mut self, name: &Arc<str>, src: &[u8]) {
        if let Some(d) = self.dump.as_mut() {
            d.push((name.clone(), src.to_vec()));
        }
    }

    fn file(&mut self, src: &[u8], name: Arc<str>) -> Result<Vec<Directive>, ConfError> {
        let mut lx = Lexer::new(src, name);
        let mut out = Vec::new();
        self.block(&mut lx, 0, End::Eof, &mut out)?;
        Ok(out)
    }

    /// Parse directives into `out` until `end` (`Close` for a block, `Eof` for a file).
    /// `depth` counts enclosing blocks, including those of the files that included this one.
    fn block(
        &mut self,
        lx: &mut Lexer,
        depth: usize,
        end: End,
        out: &mut Vec<Directive>,
    ) -> Result<(), ConfError> {
        loop {
            let mut words: Vec<String> = Vec::new();
            let mut first_line = 0;
            let (tok, line) = loop {
                let t = lx.next_token()?;
                match t.tok {
                    Tok::Word(w) => {
                        if words.is_empty() {
                            first_line = t.line;
                        }
                        words.push(w);
                    }
                    Tok::Semi => break (End::Semi, t.line),
                    Tok::Open => break (End::Open, t.line),
                    Tok::Close => break (End::Close, t.line),
                    Tok::Eof => break (End::Eof, t.line),
                }
            };
            let at = lx.loc(line);
            let err = |msg: &str| Err(ConfError::at(&at, msg));
            let mut words = words.into_iter();
            let Some(name) = words.next() else {
                return match (tok, end) {
                    (End::Semi, _) => err(r#"unexpected ";""#),
                    (End::Open, _) => err(r#"unexpected "{""#),
                    (End::Close, End::Close) | (End::Eof, End::Eof) => Ok(()),
                    (End::Close, _) => err(r#"unexpected "}""#),
                    (End::Eof, _) => err(r#"unexpected end of file, expecting "}""#),
                };
            };
            let mut d = Directive {
                name,
                args: words.collect(),
                block: None,
                loc: lx.loc(first_line),
            };
            match tok {
                End::Semi if d.name == "include" => self.include(&d, depth, out)?,
                End::Semi => out.push(d),
                End::Open => {
                    if d.name == "include" {
                        return Err(d.error(r#"directive "include" is not terminated by ";""#));
                    }
                    if depth >= MAX_BLOCK_DEPTH {
                        return Err(d.error(format_args!(
                            "too deeply nested blocks (more than {MAX_BLOCK_DEPTH} levels)"
                        )));
                    }
                    let mut inner = Vec::new();
                    self.block(lx, depth + 1, End::Close, &mut inner)?;
                    d.block = Some(inner);
                    out.push(d);
                }
                End::Close => return err(r#"unexpected "}""#),
                End::Eof => return err(r#"unexpected end of file, expecting ";" or "}""#),
            }
        }
    }

    /// Expand `include PATTERN;` into `out`, parsing each file as a whole file (so its braces
    /// must balance on their own, as in nginx) at the current block depth.
    fn include(
        &mut self,
        d: &Directive,
        depth: usize,
        out: &mut Vec<Directive>,
    ) -> Result<(), ConfError> {
        let [pattern] = d.args.as_slice() else {
            return Err(d.error(r#"invalid number of arguments in "include" directive"#));
        };
        if self.includes >= MAX_INCLUDE_DEPTH {
            return Err(d.error(format_args!(
                "includes nested too deeply (more than {MAX_INCLUDE_DEPTH} levels), \
                 is there an include cycle?"
            )));
        }
        for path in include::resolve(self.include_base, pattern) {
            let src = include::read_included(&path, &d.loc)?;
            let name: Arc<str> = Arc::from(path.display().to_string());
            self.record(&name, &src);
            let mut lx = Lexer::new(&src, name);
            self.includes += 1;
            let r = self.block(&mut lx, depth, End::Eof, out);
            self.includes -= 1;
            r?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Loc;

    fn loc(file: &str, line: u32) -> Loc {
        Loc {
            file: Arc::from(file),
            line,
        }
    }

    fn parse(src: &str) -> Result<Vec<Directive>, ConfError> {
        parse_str(src, "t.conf", Path::new("/nonexistent-gannet-base"))
    }

    fn err(src: &str) -> String {
        match parse(src) {
            Ok(d) => panic!("expected an error for {src:?}, got {d:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn command_line_params_have_no_line() {
        let d = parse_params("daemon on; events { x; }", Path::new("/")).unwrap();
        assert_eq!(d[0].loc, loc(COMMAND_LINE, 0));
        assert_eq!(d[1].block.as_ref().unwrap()[0].loc, loc(COMMAND_LINE, 0));
        assert_eq!(d[0].error("bad").to_string(), "command line: bad");
        let e = parse_params("daemon on", Path::new("/")).unwrap_err();
        assert!(
            e.to_string().starts_with("command line: unexpected end"),
            "{e}"
        );
    }

    #[test]
    fn tree_shape() {
        let d = parse("a 1 2;\nb {\n  c;\n}\ne {}\n").unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].args, vec!["1", "2"]);
        assert_eq!(d[0].block, None);
        let b = d[1].block.as_ref().unwrap();
        assert_eq!(
            (b[0].name.as_str(), b[0].loc.clone()),
            ("c", loc("t.conf", 3))
        );
        assert_eq!(d[2].block, Some(vec![]));
    }

    #[test]
    fn structural_errors() {
        assert_eq!(err("a;\n;"), r#"t.conf:2: unexpected ";""#);
        assert_eq!(err("\n{}"), r#"t.conf:2: unexpected "{""#);
        assert_eq!(err("a;\n}"), r#"t.conf:2: unexpected "}""#);
        assert_eq!(err("a {\n b\n}"), r#"t.conf:3: unexpected "}""#);
        assert_eq!(
            err("a {\n b;\n"),
            r#"t.conf:3: unexpected end of file, expecting "}""#
        );
        assert_eq!(
            err("a b"),
            r#"t.conf:1: unexpected end of file, expecting ";" or "}""#
        );
        assert_eq!(
            err("x {\ninclude a {}\n}"),
            r#"t.conf:2: directive "include" is not terminated by ";""#
        );
        assert_eq!(
            err("include;"),
            r#"t.conf:1: invalid number of arguments in "include" directive"#
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let src = "a {".repeat(100_000);
        assert!(err(&src).contains("too deeply nested blocks"));
        let ok = format!(
            "{}{}",
            "a {".repeat(MAX_BLOCK_DEPTH),
            "}".repeat(MAX_BLOCK_DEPTH)
        );
        assert!(parse(&ok).is_ok());
    }
}
