//! `include` resolution and `parse_file`, on real files in a scratch directory.

use gannet_conf::{parse_file, parse_str, Directive};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A unique scratch directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("gannet-conf-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    fn path(&self, rel: &str) -> String {
        self.0.join(rel).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn names(ds: &[Directive]) -> Vec<&str> {
    ds.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn glob_include_is_sorted_and_spliced() {
    let s = Scratch::new("glob");
    s.write("conf.d/b.conf", "b;\n");
    s.write("conf.d/a.conf", "\na1;\na2;\n");
    s.write("conf.d/c.txt", "not_included;\n");
    s.write("conf.d/.hidden.conf", "hidden;\n");
    std::fs::create_dir_all(s.0.join("conf.d/dir.conf")).unwrap();
    let main = s.write(
        "nginx.conf",
        "first;\nhttp {\n  include conf.d/*.conf;\n  last;\n}\n",
    );
    let d = parse_file(&main).unwrap();
    assert_eq!(names(&d), ["first", "http"]);
    let http = d[1].block.as_ref().unwrap();
    assert_eq!(names(http), ["a1", "a2", "b", "last"]);
    assert_eq!(
        http[0].loc.to_string(),
        format!("{}:2", s.path("conf.d/a.conf"))
    );
    assert_eq!(
        http[2].loc.to_string(),
        format!("{}:1", s.path("conf.d/b.conf"))
    );
    assert_eq!(http[3].loc.to_string(), format!("{}:4", main.display()));
}

#[test]
fn glob_matching_nothing_is_fine() {
    let s = Scratch::new("empty");
    let main = s.write(
        "nginx.conf",
        "include nothing/*.conf;\ninclude none?.conf;\nx;\n",
    );
    assert_eq!(names(&parse_file(&main).unwrap()), ["x"]);
}

#[test]
fn nested_includes_are_relative_to_the_main_directory() {
    let s = Scratch::new("nested");
    s.write(
        "snippets/outer.conf",
        "location / {\n  include snippets/inner.conf;\n}\n",
    );
    s.write("snippets/inner.conf", "root /srv;\n");
    let main = s.write(
        "nginx.conf",
        "server {\n  include snippets/outer.conf;\n}\n",
    );
    let d = parse_file(&main).unwrap();
    let loc = &d[0].block.as_ref().unwrap()[0];
    assert_eq!(loc.name, "location");
    let root = &loc.block.as_ref().unwrap()[0];
    assert_eq!(root.args, ["/srv"]);
    assert_eq!(
        root.loc.to_string(),
        format!("{}:1", s.path("snippets/inner.conf"))
    );
}

#[test]
fn absolute_include_and_parse_str_base() {
    let s = Scratch::new("abs");
    let inc = s.write("x.conf", "x;\n");
    let src = format!("include {};\ninclude x.conf;\n", inc.display());
    let d = parse_str(&src, "inline", &s.0).unwrap();
    assert_eq!(names(&d), ["x", "x"]);
}

#[test]
fn base_directory_with_glob_characters() {
    let s = Scratch::new("we[ir]d*");
    s.write("a.conf", "a;\n");
    let d = parse_str("include *.conf;", "inline", &s.0).unwrap();
    assert_eq!(names(&d), ["a"]);
}

#[test]
fn missing_include_is_an_error_at_the_include() {
    let s = Scratch::new("missing");
    let main = s.write("nginx.conf", "http {\n\n  include nope.conf;\n}\n");
    let e = parse_file(&main).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}:3: open() \"{}\" failed (No such file or directory)",
            main.display(),
            s.path("nope.conf")
        )
    );
}

#[test]
fn include_argument_errors() {
    let base = Path::new("/nonexistent-gannet-conf-base");
    let e = parse_str("include a b;", "t", base).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"t:1: invalid number of arguments in "include" directive"#
    );
    let e = parse_str("\ninclude a { }", "t", base).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"t:2: directive "include" is not terminated by ";""#
    );
}

#[test]
fn include_cycle_is_reported() {
    let s = Scratch::new("cycle");
    s.write("a.conf", "include b.conf;\n");
    s.write("b.conf", "x;\ninclude a.conf;\n");
    let main = s.write("nginx.conf", "include a.conf;\n");
    let e = parse_file(&main).unwrap_err();
    assert!(
        e.msg
            .contains("includes nested too deeply (more than 32 levels)"),
        "{e}"
    );
    let loc = e.loc.unwrap();
    assert!(loc.file.ends_with(".conf") && loc.line >= 1, "{loc}");
}

#[test]
fn self_include_twice_fails_fast() {
    // Each level includes itself twice: the first branch hits the limit and stops everything.
    let s = Scratch::new("twice");
    let main = s.write("nginx.conf", "include nginx.conf;\ninclude nginx.conf;\n");
    assert!(parse_file(&main).is_err());
}

#[test]
fn errors_inside_included_files_name_that_file() {
    let s = Scratch::new("inner-err");
    s.write("bad1.conf", "a;\n}\n");
    s.write("bad2.conf", "a {\n  b;\n");
    let main = s.write("one.conf", "http {\n  include bad1.conf;\n}\n");
    assert_eq!(
        parse_file(&main).unwrap_err().to_string(),
        format!("{}:2: unexpected \"}}\"", s.path("bad1.conf"))
    );
    let main = s.write("two.conf", "http {\n  include bad2.conf;\n}\n");
    assert_eq!(
        parse_file(&main).unwrap_err().to_string(),
        format!(
            "{}:3: unexpected end of file, expecting \"}}\"",
            s.path("bad2.conf")
        )
    );
}

#[test]
fn including_a_directory_explicitly_is_an_error() {
    let s = Scratch::new("dir");
    std::fs::create_dir_all(s.0.join("sub")).unwrap();
    let e = parse_str("include sub;", "t", &s.0).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("t:1: \"{}\" is not a regular file", s.path("sub"))
    );
}

#[test]
fn missing_main_file_is_a_bare_error() {
    let s = Scratch::new("nomain");
    let e = parse_file(&s.0.join("nginx.conf")).unwrap_err();
    assert_eq!(e.loc, None);
    assert_eq!(
        e.to_string(),
        format!(
            "open() \"{}\" failed (No such file or directory)",
            s.path("nginx.conf")
        )
    );
}

#[test]
fn main_file_locations_use_the_given_path() {
    let s = Scratch::new("loc");
    let main = s.write("nginx.conf", "a;\n\nb;\n");
    let d = parse_file(&main).unwrap();
    assert_eq!(d[1].loc.to_string(), format!("{}:3", main.display()));
}

#[test]
fn non_utf8_bytes_do_not_break_parsing() {
    let s = Scratch::new("latin1");
    let main = s.0.join("nginx.conf");
    std::fs::write(&main, b"# caf\xe9\nx \xe9;\n").unwrap();
    let d = parse_file(&main).unwrap();
    assert_eq!(
        (d[0].name.as_str(), d[0].args.clone()),
        ("x", vec!["\u{fffd}".to_string()])
    );
}
