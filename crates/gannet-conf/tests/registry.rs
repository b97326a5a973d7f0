//! `registry::check` and friends: nginx's messages, in nginx's order of checks.

use gannet_conf::registry::{check, check_in, find, Args, Ctx, Spec};
use gannet_conf::{parse_str, Directive};
use std::path::Path;

const TABLE: &[Spec] = &[
    Spec {
        name: "server",
        ctx: Ctx::HTTP,
        args: Args::Exactly(0),
        block: true,
    },
    Spec {
        name: "listen",
        ctx: Ctx::SERVER,
        args: Args::AtLeast(1),
        block: false,
    },
    Spec {
        name: "root",
        ctx: Ctx::HSL.or(Ctx::IF),
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "location",
        ctx: Ctx::SERVER.or(Ctx::LOCATION),
        args: Args::Between(1, 2),
        block: true,
    },
];

/// The first directive of `src`.
fn one(src: &str) -> Directive {
    parse_str(src, "t.conf", Path::new("/nonexistent"))
        .unwrap()
        .remove(0)
}

fn msg(name: &str, src: &str, ctx: Ctx) -> String {
    let spec = find(TABLE, name).unwrap();
    match check(spec, &one(src), ctx) {
        Ok(()) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn accepted() {
    assert_eq!(msg("server", "server {}", Ctx::HTTP), "ok");
    assert_eq!(
        msg("listen", "listen 80 default_server;", Ctx::SERVER),
        "ok"
    );
    assert_eq!(msg("root", "root /x;", Ctx::LOCATION), "ok");
    assert_eq!(msg("root", "root /x;", Ctx::IF), "ok");
    assert_eq!(msg("location", "location = /x {}", Ctx::LOCATION), "ok");
}

#[test]
fn context() {
    assert_eq!(
        msg("listen", "\nlisten 80;", Ctx::HTTP),
        r#"t.conf:2: "listen" directive is not allowed here"#
    );
    // Context comes first, as in nginx, even when the block and arguments are wrong too.
    assert_eq!(
        msg("listen", "listen {}", Ctx::MAIN),
        r#"t.conf:1: "listen" directive is not allowed here"#
    );
    assert_eq!(
        msg("root", "root /x;", Ctx::LOCATION.or(Ctx::UPSTREAM)),
        r#"t.conf:1: "root" directive is not allowed here"#
    );
    assert_eq!(
        msg("root", "root /x;", Ctx(0)),
        r#"t.conf:1: "root" directive is not allowed here"#
    );
}

#[test]
fn block_or_not() {
    assert_eq!(
        msg("server", "server;", Ctx::HTTP),
        r#"t.conf:1: directive "server" has no opening "{""#
    );
    // Block checks precede the argument count (nginx reports this for `root {}`).
    assert_eq!(
        msg("root", "root {}", Ctx::HTTP),
        r#"t.conf:1: directive "root" is not terminated by ";""#
    );
    assert_eq!(
        msg("server", "server a;", Ctx::HTTP),
        r#"t.conf:1: directive "server" has no opening "{""#
    );
}

#[test]
fn argument_counts() {
    assert_eq!(
        msg("root", "root;", Ctx::HTTP),
        r#"t.conf:1: invalid number of arguments in "root" directive"#
    );
    assert_eq!(
        msg("root", "root a b;", Ctx::HTTP),
        r#"t.conf:1: invalid number of arguments in "root" directive"#
    );
    assert_eq!(
        msg("listen", "listen;", Ctx::SERVER),
        r#"t.conf:1: invalid number of arguments in "listen" directive"#
    );
    assert_eq!(
        msg("location", "location {}", Ctx::SERVER),
        r#"t.conf:1: invalid number of arguments in "location" directive"#
    );
    assert_eq!(
        msg("location", "location a b c {}", Ctx::SERVER),
        r#"t.conf:1: invalid number of arguments in "location" directive"#
    );
    assert_eq!(
        msg("server", "server x {}", Ctx::HTTP),
        r#"t.conf:1: invalid number of arguments in "server" directive"#
    );
}

#[test]
fn args_allows() {
    assert!(Args::Exactly(0).allows(0) && !Args::Exactly(0).allows(1));
    assert!(
        Args::Between(1, 3).allows(3)
            && !Args::Between(1, 3).allows(0)
            && !Args::Between(1, 3).allows(4)
    );
    assert!(Args::AtLeast(2).allows(9) && !Args::AtLeast(2).allows(1));
}

#[test]
fn lookup() {
    assert_eq!(find(TABLE, "root").map(|s| s.name), Some("root"));
    assert!(find(TABLE, "Root").is_none());
    assert_eq!(
        check_in(TABLE, &one("root /;"), Ctx::HTTP).map(|s| s.name),
        Ok("root")
    );
    let e = check_in(TABLE, &one("\n\nfoo bar;"), Ctx::HTTP).unwrap_err();
    assert_eq!(e.to_string(), r#"t.conf:3: unknown directive "foo""#);
    assert_eq!(Ctx::SERVER.name(), "server");
}
