//! The condition of `if (...)`, as nginx's rewrite module reads and tests it:
//! `($var)` (true unless empty or "0"), `($var = text)`, `($var != text)`,
//! `($var ~ regex)`, `~*` (caseless), `!~`, `!~*` (a match sets `$1`.. and named captures),
//! and the file tests `-f`, `-d`, `-e`, `-x` and their negations `!-f`...
//!
//! The words arrive split as nginx's lexer splits them: `($a`, `=`, `b)` or `(`, `$a`, `)`.

use crate::errlog::Level;
use crate::http::request::Request;
use crate::http::user_vars::CapRegex;
use crate::http::variables::Template;
use std::os::unix::fs::PermissionsExt;

#[derive(Debug, Clone)]
pub enum Cond {
    /// `($var)`
    NotEmpty(Template),
    /// `($var = text)` / `($var != text)`
    Equals {
        var: Template,
        text: Template,
        negate: bool,
    },
    /// `($var ~ regex)` and its caseless and negated forms.
    Matches {
        var: Template,
        re: CapRegex,
        negate: bool,
    },
    /// `(-f path)` and the other file tests.
    File {
        path: Template,
        test: FileTest,
        negate: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileTest {
    /// `-f`: a regular file
    File,
    /// `-d`: a directory
    Dir,
    /// `-e`: anything
    Exists,
    /// `-x`: executable by its owner
    Exec,
}

fn invalid(word: &str) -> String {
    format!("invalid condition \"{word}\"")
}

fn template(s: &str) -> Result<Template, String> {
    Template::compile(s)
}

/// Parse the words after `if`.
pub fn parse(args: &[String]) -> Result<Cond, String> {
    let mut w: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = w.first().copied().unwrap_or("");
    match first.strip_prefix('(') {
        Some("") => {
            w.remove(0);
        }
        Some(rest) => w[0] = rest,
        None => return Err(invalid(first)),
    }
    let last = w.last().copied().unwrap_or("");
    match last.strip_suffix(')') {
        Some("") => {
            w.pop();
        }
        Some(rest) => {
            let n = w.len() - 1;
            w[n] = rest;
        }
        None => return Err(invalid(last)),
    }
    let head = w.first().copied().unwrap_or("");
    if head.len() > 1 && head.starts_with('$') {
        let var = template(head)?;
        return match w.as_slice() {
            [_] => Ok(Cond::NotEmpty(var)),
            [_, op, operand] => {
                let negate = op.starts_with('!');
                match *op {
                    "=" | "!=" => Ok(Cond::Equals {
                        var,
                        text: template(operand)?,
                        negate,
                    }),
                    "~" | "~*" | "!~" | "!~*" => Ok(Cond::Matches {
                        var,
                        re: CapRegex::compile(operand, op.ends_with('*'))?,
                        negate,
                    }),
                    _ => Err(format!("unexpected \"{op}\" in condition")),
                }
            }
            _ => Err(invalid(head)),
        };
    }
    let (negate, flag) = match head.strip_prefix('!') {
        Some(f) => (true, f),
        None => (false, head),
    };
    let test = match flag {
        "-f" => FileTest::File,
        "-d" => FileTest::Dir,
        "-e" => FileTest::Exists,
        "-x" => FileTest::Exec,
        _ => return Err(invalid(head)),
    };
    match w.as_slice() {
        [_, path] => Ok(Cond::File {
            path: template(path)?,
            test,
            negate,
        }),
        _ => Err(invalid(head)),
    }
}

impl Cond {
    /// Test the condition; a regex match replaces the request's captures.
    pub fn eval(&self, req: &mut Request) -> bool {
        match self {
            Cond::NotEmpty(var) => {
                let v = var.eval(req, None);
                !v.is_empty() && v != "0"
            }
            Cond::Equals { var, text, negate } => {
                (var.eval(req, None) == text.eval(req, None)) != *negate
            }
            Cond::Matches { var, re, negate } => {
                let subject = var.eval(req, None);
                match re.captures(&subject, req) {
                    Some(caps) => {
                        req.captures = caps;
                        !negate
                    }
                    None => *negate,
                }
            }
            Cond::File { path, test, negate } => {
                file_test(req, &path.eval(req, None), *test) != *negate
            }
        }
    }
}

fn file_test(req: &Request, path: &str, test: FileTest) -> bool {
    // Under `disable_symlinks`, a path through a refused link is no file at all (nginx
    // opens it with the location's check): the test fails, with nginx's line.
    if req.conf.core.disable_symlinks.is_some() {
        if let Some(w) = crate::runtime::worker::current() {
            let refused = crate::modules::file_cache::LINK_REFUSED;
            if req.open_file(&w, std::path::Path::new(path)).err() == Some(refused) {
                crate::errlog::request(
                    Level::Crit,
                    req,
                    format_args!(
                        "openat() \"{path}\" failed (40: Too many levels of symbolic links)"
                    ),
                );
                return false;
            }
        }
    }
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            // A missing file is an answer; anything else is worth a line, as in nginx.
            let missing = matches!(
                e.raw_os_error(),
                Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ENAMETOOLONG)
            );
            if !missing {
                crate::errlog::request(
                    Level::Crit,
                    req,
                    format_args!("stat() \"{path}\" failed ({e})"),
                );
            }
            return false;
        }
    };
    match test {
        FileTest::File => meta.is_file(),
        FileTest::Dir => meta.is_dir(),
        FileTest::Exists => true,
        FileTest::Exec => meta.permissions().mode() & 0o100 != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::user_vars::LoadScope;

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    fn ok(s: &str) -> Cond {
        let _scope = LoadScope::begin();
        parse(&words(s)).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn err(s: &str) -> String {
        let _scope = LoadScope::begin();
        match parse(&words(s)) {
            Ok(c) => panic!("{s}: expected an error, got {c:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn parses_every_form() {
        assert!(matches!(ok("($a)"), Cond::NotEmpty(_)));
        assert!(matches!(ok("( $a )"), Cond::NotEmpty(_)));
        assert!(matches!(ok("($a = b)"), Cond::Equals { negate: false, .. }));
        assert!(matches!(ok("($a != b)"), Cond::Equals { negate: true, .. }));
        // A quoted operand followed by `)` reaches us as a word of its own.
        assert!(matches!(ok("($a = x )"), Cond::Equals { .. }));
        // `($a = "")`: an empty quoted operand.
        let _scope = LoadScope::begin();
        let empty = ["($a", "=", "", ")"].map(String::from);
        assert!(matches!(parse(&empty), Ok(Cond::Equals { .. })));
        drop(_scope);
        match ok("($a ~* ^(x|y))") {
            Cond::Matches { re, negate, .. } => {
                assert!(!negate);
                assert_eq!(re.re.as_str(), "^(x|y)");
                assert!(re.re.is_match(b"X"));
            }
            c => panic!("{c:?}"),
        }
        assert!(matches!(
            ok("($a ~ x)"),
            Cond::Matches { negate: false, .. }
        ));
        assert!(matches!(
            ok("($a !~ x)"),
            Cond::Matches { negate: true, .. }
        ));
        assert!(matches!(
            ok("($a !~* x)"),
            Cond::Matches { negate: true, .. }
        ));
        for (f, t) in [
            ("-f", FileTest::File),
            ("-d", FileTest::Dir),
            ("-e", FileTest::Exists),
            ("-x", FileTest::Exec),
        ] {
            assert!(
                matches!(ok(&format!("({f} $uri)")), Cond::File { test, negate: false, .. } if test == t)
            );
            assert!(
                matches!(ok(&format!("(!{f} $uri)")), Cond::File { test, negate: true, .. } if test == t)
            );
        }
    }

    #[test]
    fn rejects_what_nginx_rejects() {
        assert_eq!(err("$a"), "invalid condition \"$a\"");
        assert_eq!(err("($a"), "invalid condition \"$a\"");
        assert_eq!(err("($a == b)"), "unexpected \"==\" in condition");
        assert_eq!(err("($a = b c)"), "invalid condition \"$a\"");
        assert_eq!(err("(-q $uri)"), "invalid condition \"-q\"");
        assert_eq!(err("(-f)"), "invalid condition \"-f\"");
        assert_eq!(err("(-f a b)"), "invalid condition \"-f\"");
        assert_eq!(err("(abc)"), "invalid condition \"abc\"");
        assert!(err("($a ~ ( )").starts_with("pcre2_compile() failed: missing closing parenthesis"));
    }
}
