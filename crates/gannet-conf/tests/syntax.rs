//! The config syntax end to end through `parse_str`: every token feature, and every syntax
//! error with the exact message and line `nginx -t` gives (checked against nginx 1.22).

use gannet_conf::{parse_str, ConfError, Directive};
use std::path::Path;

fn parse(src: &str) -> Result<Vec<Directive>, ConfError> {
    parse_str(src, "test.conf", Path::new("/nonexistent-gannet-conf-base"))
}

fn ok(src: &str) -> Vec<Directive> {
    match parse(src) {
        Ok(d) => d,
        Err(e) => panic!("{src:?} failed: {e}"),
    }
}

/// The single directive's args.
fn args(src: &str) -> Vec<String> {
    let d = ok(src);
    assert_eq!(d.len(), 1, "{d:?}");
    d[0].args.clone()
}

fn err(src: &str) -> (u32, String) {
    match parse(src) {
        Ok(d) => panic!("{src:?} parsed: {d:?}"),
        Err(e) => {
            let loc = e.loc.expect("syntax errors have a location");
            assert_eq!(&*loc.file, "test.conf");
            (loc.line, e.msg)
        }
    }
}

const EOF_SEMI: &str = r#"unexpected end of file, expecting ";" or "}""#;

#[test]
fn directives_blocks_and_lines() {
    let d = ok("# top\nuser www;\n\nhttp {\n  server\n  {\n    listen\n      80;\n  }\n}\n");
    assert_eq!(d.len(), 2);
    assert_eq!((d[0].name.as_str(), d[0].loc.line), ("user", 2));
    assert_eq!(d[1].loc.to_string(), "test.conf:4");
    let server = &d[1].block.as_ref().unwrap()[0];
    assert_eq!((server.name.as_str(), server.loc.line), ("server", 5));
    let listen = &server.block.as_ref().unwrap()[0];
    assert_eq!(
        (listen.loc.line, listen.args.clone()),
        (7, vec!["80".to_string()])
    );
    assert_eq!(listen.block, None);
}

#[test]
fn empty_inputs() {
    assert!(ok("").is_empty());
    assert!(ok("  \n\t# only a comment").is_empty());
    assert_eq!(ok("a{}")[0].block, Some(vec![]));
}

#[test]
fn whitespace_and_punctuation() {
    assert_eq!(args("a\tb\r\nc;"), ["b", "c"]);
    let d = ok("a;b;c{d;}");
    assert_eq!(d.len(), 3);
    assert_eq!(d[2].block.as_ref().unwrap()[0].name, "d");
    // `}` only ends a block at the start of a token, as in nginx.
    assert_eq!(ok("a { b c}; }")[0].block.as_ref().unwrap()[0].args, ["c}"]);
}

#[test]
fn comments() {
    assert_eq!(args("a b#c # d ;\n e; # f"), ["b#c", "e"]);
    assert_eq!(args("a 'x' # c\n;"), ["x"]);
}

#[test]
fn quoted_strings() {
    assert_eq!(
        args(r#"a "b c" 'd;e{f}' "" '';"#),
        ["b c", "d;e{f}", "", ""]
    );
    assert_eq!(args("a \"multi\nline\";"), ["multi\nline"]);
    assert_eq!(args(r#"a "it's" 'say "hi"';"#), ["it's", "say \"hi\""]);
    // Quoted directive names work too.
    assert_eq!(ok(r#""name" x;"#)[0].name, "name");
    // A quote inside a bare word is literal.
    assert_eq!(args(r#"a b"c'd;"#), ["b\"c'd"]);
    // `)` may follow a closing quote and starts a new word (`if ($a = "b")`).
    assert_eq!(args(r#"if ($a = "b") {}"#), ["($a", "=", "b", ")"]);
}

#[test]
fn escapes() {
    assert_eq!(args(r#"a "q\"q" 'q\'q' "b\\s";"#), ["q\"q", "q'q", "b\\s"]);
    assert_eq!(args(r#"a "\n\t\r" \n;"#), ["\n\t\r", "\n"]);
    // Other escapes keep their backslash, but still stop the delimiter.
    assert_eq!(
        args(r"a \d x\ y x\;y x\{;"),
        [r"\d", r"x\ y", r"x\;y", r"x\{"]
    );
    assert_eq!(args(r#"a "^/img/\d{3}";"#), [r"^/img/\d{3}"]);
}

#[test]
fn variables_with_braces() {
    assert_eq!(args("a ${host}x $uri;"), ["${host}x", "$uri"]);
    assert_eq!(args("a pre${x}post/${y};"), ["pre${x}post/${y}"]);
    // Without `$` right before it, `{` opens a block.
    let d = ok("a $x{ }");
    assert_eq!(
        (d[0].args.clone(), d[0].block.clone()),
        (vec!["$x".to_string()], Some(vec![]))
    );
}

#[test]
fn utf8_is_kept() {
    assert_eq!(
        args("add_header X-Name \"café ☕\";"),
        ["X-Name", "café ☕"]
    );
}

#[test]
fn error_unexpected_punctuation() {
    assert_eq!(err("a;\n\n;"), (3, r#"unexpected ";""#.into()));
    assert_eq!(err("a;\n{ b; }"), (2, r#"unexpected "{""#.into()));
    assert_eq!(err("a;\n}\n"), (2, r#"unexpected "}""#.into()));
    assert_eq!(
        err("http {\n root /x\n}\n"),
        (3, r#"unexpected "}""#.into())
    );
    assert_eq!(err("http {\n {}\n}"), (2, r#"unexpected "{""#.into()));
}

#[test]
fn error_unexpected_after_quote() {
    assert_eq!(err("a\n\"b\"c;"), (2, r#"unexpected "c""#.into()));
    assert_eq!(err("a 'b'#c;"), (1, r##"unexpected "#""##.into()));
    assert_eq!(err("x {\na \"b\"}"), (2, r#"unexpected "}""#.into()));
    assert_eq!(err("a \"b\"\"c\";"), (1, r#"unexpected """"#.into()));
}

#[test]
fn error_end_of_file() {
    // nginx reports the line count at the end of the file.
    assert_eq!(err("events {}\nhttp {\n  root /x\n"), (4, EOF_SEMI.into()));
    assert_eq!(err("a"), (1, EOF_SEMI.into()));
    assert_eq!(err("a \\"), (1, EOF_SEMI.into()));
    assert_eq!(err("a 'b'"), (1, EOF_SEMI.into()));
    assert_eq!(
        err("events {}\nhttp {\n  root /x;\n"),
        (4, r#"unexpected end of file, expecting "}""#.into())
    );
    assert_eq!(
        err("a {\n b {\n c;\n }"),
        (4, r#"unexpected end of file, expecting "}""#.into())
    );
}

#[test]
fn error_unbalanced_quotes() {
    let (line, msg) = err("http {\n  root \"/x;\n}\n");
    assert_eq!(line, 4);
    assert!(msg.starts_with(EOF_SEMI), "{msg}");
    assert!(
        msg.contains("unbalanced quotes: string opened on line 2"),
        "{msg}"
    );
    let (line, msg) = err("a 'b\\'");
    assert_eq!(line, 1);
    assert!(msg.contains("unbalanced quotes"), "{msg}");
}

#[test]
fn error_display_is_file_line_message() {
    let e = parse("a;\n}").unwrap_err();
    assert_eq!(e.to_string(), r#"test.conf:2: unexpected "}""#);
}

#[test]
fn block_depth_limit() {
    let depth = gannet_conf::MAX_BLOCK_DEPTH;
    let fine = format!("{}{}", "a {\n".repeat(depth), "}".repeat(depth));
    assert!(parse(&fine).is_ok());
    let too_deep = format!("{}{}", "a {\n".repeat(depth + 1), "}".repeat(depth + 1));
    assert_eq!(
        err(&too_deep),
        (
            depth as u32 + 1,
            "too deeply nested blocks (more than 100 levels)".into()
        )
    );
    // Far beyond the limit: still an error, not a stack overflow.
    assert!(parse(&"{a {".repeat(200_000)).is_err());
    assert!(parse(&"a {".repeat(200_000)).is_err());
}
