//! Request-target parsing and normalisation table, and the escaping helpers.

use super::*;

fn path(raw: &str) -> Result<String, u16> {
    parse_target(raw.as_bytes())
        .map(|t| t.path)
        .map_err(|e| e.status())
}

#[test]
fn normalisation_table() {
    for (raw, want) in [
        ("/", "/"),
        ("/index.html", "/index.html"),
        ("/a/b/", "/a/b/"),
        ("//a///b", "/a/b"),
        ("//", "/"),
        ("/a//", "/a/"),
        ("/a/./b/../c", "/a/c"),
        ("/a/.", "/a/"),
        ("/a/..", "/"),
        ("/a/b/..", "/a/"),
        ("/a/b/../", "/a/"),
        ("/.", "/"),
        ("/./", "/"),
        ("/a/../b", "/b"),
        ("/..a/b..", "/..a/b.."),
        ("/.hidden", "/.hidden"),
        ("/a/.../b", "/a/.../b"),
        ("/%41%42c", "/ABc"),
        ("/a%20b", "/a b"),
        ("/a%2fb", "/a/b"),
        ("/a%2F..%2Fb", "/b"),
        ("/%2e/x", "/x"),
        ("/caf%C3%A9", "/café"),
        ("/café", "/café"),
        ("/a+b", "/a+b"),
        ("/a%2bb", "/a+b"),
        ("/a;b", "/a;b"),
    ] {
        assert_eq!(path(raw), Ok(want.to_string()), "{raw}");
    }
}

#[test]
fn refusals() {
    for raw in [
        "/a/../../etc/passwd",
        "/..",
        "/../",
        "/%2e%2e/",
        "/%2E%2E",
        "/a/%2e%2e/%2e%2e/x",
        "/.%2e/x",
        "/a%",
        "/a%2",
        "/a%zz",
        "/a%%41",
        "/a%00b",
        "/%c3%28",
        "/%ff",
        "",
        "a/b",
        "?x",
        "**",
        "ftp://host/x",
        "http:/host/x",
        "http://",
        "http:///x",
        "http://user@host/x",
        "http://ho st/",
        "http://host:8x/",
        "http://[::1/",
        "http://[]/",
        "http://host%41/",
        "/a b",
        "/a\tb",
        "/a\x7f",
    ] {
        assert_eq!(path(raw), Err(400), "{raw:?}");
    }
    assert_eq!(parse_target(b"/\xff").map_err(|e| e.status()), Err(400));
    assert_eq!(parse_target(b"/?\xff").map_err(|e| e.status()), Err(400));
}

#[test]
fn query_and_fragment() {
    let t = parse_target(b"/p%20q?a=%20b&c=/../d#frag").unwrap();
    assert_eq!(t.path, "/p q");
    assert_eq!(t.query.as_deref(), Some("a=%20b&c=/../d"));
    assert_eq!(t.host, None);
    let t = parse_target(b"/x?").unwrap();
    assert_eq!(t.query.as_deref(), Some(""));
    let t = parse_target(b"/x#a?b").unwrap();
    assert_eq!((t.path.as_str(), t.query), ("/x", None));
    let t = parse_target(b"/a?b?c").unwrap();
    assert_eq!(t.query.as_deref(), Some("b?c"));
}

#[test]
fn asterisk_and_absolute_form() {
    assert_eq!(
        parse_target(b"*").unwrap(),
        Target {
            path: "*".into(),
            query: None,
            host: None
        }
    );
    let t = parse_target(b"http://Example.COM:8080/a/../b?x=1").unwrap();
    assert_eq!(
        t,
        Target {
            path: "/b".into(),
            query: Some("x=1".into()),
            host: Some("example.com".into())
        }
    );
    let t = parse_target(b"HTTPS://host").unwrap();
    assert_eq!((t.path.as_str(), t.host.as_deref()), ("/", Some("host")));
    let t = parse_target(b"http://host?q").unwrap();
    assert_eq!((t.path.as_str(), t.query.as_deref()), ("/", Some("q")));
    let t = parse_target(b"http://host:/x").unwrap();
    assert_eq!(t.host.as_deref(), Some("host"));
    let t = parse_target(b"http://[::1]:80/").unwrap();
    assert_eq!(t.host.as_deref(), Some("[::1]"));
    let t = parse_target(b"http://a_b-c.d/").unwrap();
    assert_eq!(t.host.as_deref(), Some("a_b-c.d"));
    // An IPvFuture literal with every character nginx's parser takes in one, lowercased.
    let t = parse_target(b"http://[v1F.!$&'()*+,;=-._~Az:]/").unwrap();
    assert_eq!(t.host.as_deref(), Some("[v1f.!$&'()*+,;=-._~az:]"));
    assert!(parse_target(b"http://[v1\"x]/").is_err());
    assert_eq!(
        parse_target(b"http://host/..").map_err(|e| e.status()),
        Err(400)
    );
}

#[test]
fn encode_path() {
    assert_eq!(percent_encode_path("/a b/c"), "/a%20b/c");
    assert_eq!(percent_encode_path("/x?y#z%"), "/x%3Fy%23z%25");
    assert_eq!(
        percent_encode_path("/\"<>`{|}\\^"),
        "/%22%3C%3E%60%7B%7C%7D%5C%5E"
    );
    assert_eq!(percent_encode_path("/café"), "/caf%C3%A9");
    assert_eq!(percent_encode_path("/\t\n\x7f"), "/%09%0A%7F");
    let safe = "/AZaz09-._~!$&'()*+,;=:@";
    assert_eq!(percent_encode_path(safe), safe);
    // Round trip through the decoder.
    for p in ["/a b/c?d", "/%/x", "/café/ü"] {
        assert_eq!(path(&percent_encode_path(p)), Ok(p.to_string()));
    }
}

#[test]
fn escape_html() {
    assert_eq!(
        html_escape(r#"<a href="x">'&'</a>"#),
        "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
    );
    assert_eq!(html_escape("plain café"), "plain café");
}

#[test]
fn unmerged_slashes() {
    let unmerged = |raw: &str| parse_target_with(raw.as_bytes(), false).map(|t| t.path);
    for (raw, want) in [
        ("/foo//../bar", "/foo/bar"),
        ("/foo///../bar", "/foo//bar"),
        ("//a//b//", "//a//b//"),
        ("/a/./b//c", "/a/b//c"),
        ("/a//%2e%2e/b", "/a/b"),
        ("/a/", "/a/"),
    ] {
        assert_eq!(unmerged(raw).as_deref(), Ok(want), "{raw}");
    }
    assert!(unmerged("/..").is_err());
    // Merged, the empty segments go first.
    assert_eq!(path("/foo//../bar").as_deref(), Ok("/bar"));
}
