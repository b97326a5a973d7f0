//! Byte-level tests of the request-head parser: every accepted and refused shape, the
//! limits, pipelining, and byte-by-byte arrival.

use bytes::BytesMut;

use super::parse::*;

fn parse(s: &[u8]) -> Result<Option<RequestHead>, ParseError> {
    parse_request(&mut BytesMut::from(s), &Limits::default())
}

fn ok(s: &[u8]) -> RequestHead {
    match parse(s) {
        Ok(Some(h)) => h,
        other => panic!(
            "{:?}: expected a head, got {other:?}",
            String::from_utf8_lossy(s)
        ),
    }
}

fn status(s: &[u8]) -> u16 {
    status_with(s, &Limits::default())
}

fn status_with(s: &[u8], limits: &Limits) -> u16 {
    match parse_request(&mut BytesMut::from(s), limits) {
        Err(e) => e.status(),
        other => panic!(
            "{:?}: expected an error, got {other:?}",
            String::from_utf8_lossy(s)
        ),
    }
}

#[test]
fn simple_get() {
    let mut buf = BytesMut::from(
        &b"GET /index.html?x=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"[..],
    );
    let h = parse_request(&mut buf, &Limits::default())
        .unwrap()
        .unwrap();
    assert!(buf.is_empty());
    assert_eq!(h.method, Method::Get);
    assert_eq!(h.method_str(), "GET");
    assert_eq!(h.target(), b"/index.html?x=1");
    assert_eq!(h.version, Version::Http11);
    assert_eq!(h.body, BodyKind::None);
    assert!(h.keep_alive);
    assert!(!h.expect_continue);
    assert_eq!(h.header("HOST"), Some(&b"example.com"[..]));
    assert_eq!(h.host(), Some(&b"example.com"[..]));
    assert_eq!(h.header("accept"), Some(&b"*/*"[..]));
    assert_eq!(h.header("missing"), None);
    assert_eq!(h.header_count(), 2);
    let names: Vec<&str> = h.headers().map(|(n, _)| n).collect();
    assert_eq!(names, ["Host", "Accept"]);
    assert!(h.raw().ends_with(b"\r\n\r\n"));
}

#[test]
fn methods() {
    for (m, want) in [
        ("GET", Method::Get),
        ("HEAD", Method::Head),
        ("POST", Method::Post),
        ("PUT", Method::Put),
        ("DELETE", Method::Delete),
        ("OPTIONS", Method::Options),
        ("TRACE", Method::Trace),
        ("CONNECT", Method::Connect),
        ("PATCH", Method::Patch),
        ("PROPFIND", Method::Other),
        ("X_CUSTOM-M", Method::Other),
    ] {
        let h = ok(format!("{m} / HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
        assert_eq!(h.method, want, "{m}");
        assert_eq!(h.method_str(), m);
    }
}

#[test]
fn bad_method_and_target() {
    // nginx takes upper-case letters, `_` and `-` only, and refuses a method with another
    // byte before the line is complete.
    assert_eq!(status(b"get / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"X-CUSTOM! / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    for partial in [&b"get"[..], b"G1", b"xxxxxxxxxxxxxxxx", b"GET\r\n"] {
        assert!(parse(partial).is_err(), "{partial:?}");
    }
    for partial in [&b"G"[..], b"GE", b"GET", b"GET /", b"M-SEARCH"] {
        assert!(matches!(parse(partial), Ok(None)), "{partial:?}");
    }
    assert_eq!(status(b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"GE\x01T / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b" GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    // Non-UTF-8 target bytes.
    assert_eq!(status(b"GET /\xff HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"GET /\xff HTTP/1.2\r\nHost: a\r\n\r\n"), 400);
}

#[test]
fn versions() {
    let h = ok(b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(h.version, Version::Http10);
    assert!(!h.keep_alive);
    // Other 1.x minors are served as 1.1, as nginx does.
    for v in ["1.2", "1.9", "1.10", "1.999"] {
        let h = ok(format!("GET / HTTP/{v}\r\nHost: a\r\n\r\n").as_bytes());
        assert_eq!(h.version, Version::Http11, "{v}");
        assert_eq!(h.header("host"), Some(&b"a"[..]));
    }
    // A 1.x request served as 1.1 still needs Host.
    assert_eq!(status(b"GET / HTTP/1.2\r\n\r\n"), 400);
    // Trailing spaces after the version (nginx allows them).
    let h = ok(b"GET / HTTP/1.1  \r\nHost: a\r\n\r\n");
    assert_eq!(h.version, Version::Http11);
    assert_eq!(h.target(), b"/");
    let h = ok(b"GET /x HTTP/1.0 \n\n");
    assert_eq!(h.version, Version::Http10);
}

#[test]
fn unsupported_and_bad_versions() {
    for v in [
        "HTTP/2.0",
        "HTTP/2",
        "HTTP/3",
        "HTTP/3.0",
        "HTTP/9.9",
        "HTTP/10.0",
        "HTTP/11",
    ] {
        assert_eq!(
            status(format!("GET / {v}\r\nHost: a\r\n\r\n").as_bytes()),
            505,
            "{v}"
        );
    }
    // 505 is known as soon as the major digit arrives.
    assert_eq!(status(b"GET / HTTP/2"), 505);
    for v in [
        "HTTP/0.9",
        "HTTP/1",
        "HTTP/1.",
        "HTTP/1.1x",
        "HTTP/1.x",
        "HTTP/1.1234",
        "HTTP/x.1",
        "HTTP/",
        "http/1.1",
        "HTTX/1.1",
        "HTTP/01.1",
    ] {
        assert_eq!(
            status(format!("GET / {v}\r\nHost: a\r\n\r\n").as_bytes()),
            400,
            "{v}"
        );
    }
    // HTTP/0.9 (no version at all) is served, as nginx does, for GET only.
    assert_eq!(status(b"HEAD /\r\n"), 400);
    assert_eq!(status(b"POST / \n"), 400);
    // Bare CR after the version.
    assert_eq!(status(b"GET / HTTP/1.1\rHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.3\rHost: a\r\n\r\n"), 400);
}

#[test]
fn leading_empty_lines_skipped() {
    let h = ok(b"\r\n\r\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(h.target(), b"/");
    assert!(h.raw().starts_with(b"GET"));
    let mut buf = BytesMut::from(&b"\r\n\r\n"[..]);
    assert!(matches!(
        parse_request(&mut buf, &Limits::default()),
        Ok(None)
    ));
    assert!(buf.is_empty(), "empty lines are dropped from the buffer");
    let mut buf = BytesMut::from(&b"\r\n\r"[..]);
    assert!(matches!(
        parse_request(&mut buf, &Limits::default()),
        Ok(None)
    ));
    assert_eq!(&buf[..], b"\r");
    // A lone CR is not an empty line.
    assert_eq!(status(b"\rGET / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
}

#[test]
fn bare_lf_accepted_bare_cr_refused() {
    let h = ok(b"GET / HTTP/1.1\nHost: a\nX: y\n\n");
    assert_eq!(h.header("x"), Some(&b"y"[..]));
    let h = ok(b"GET / HTTP/1.1\r\nHost: a\nX: y\r\n\n");
    assert_eq!(h.header("x"), Some(&b"y"[..]));
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\n\rX"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n"), 400);
}

#[test]
fn header_syntax() {
    // OWS around the value is trimmed.
    let h = ok(b"GET / HTTP/1.1\r\nHost: a\r\nX-A:   v  w \t\r\nX-B:\r\nX-C:x\r\n\r\n");
    assert_eq!(h.header("x-a"), Some(&b"v  w"[..]));
    assert_eq!(h.header("x-b"), Some(&b""[..]));
    assert_eq!(h.header("x-c"), Some(&b"x"[..]));
    // obs-text in values is allowed.
    assert_eq!(
        ok(b"GET / HTTP/1.1\r\nHost: a\r\nX: \xc3\xa9\r\n\r\n").header("x"),
        Some(&b"\xc3\xa9"[..])
    );
    // obs-fold.
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n\tb\r\n\r\n"),
        400
    );
    assert_eq!(status(b"GET / HTTP/1.1\r\n Host: a\r\n\r\n"), 400);
    // Whitespace before the colon.
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nX\t: b\r\n\r\n"), 400);
    // Bad name characters, empty name, no colon.
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nX(y): b\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n"), 400);
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nX\xff: b\r\n\r\n"),
        400
    );
    // Bad value characters.
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fb\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01\r\n\r\n"),
        400
    );
}

#[test]
fn too_many_headers() {
    let mut req = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 0..99 {
        req.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    // 100 fields: exactly the default limit (and more than the stack slots).
    assert_eq!(ok(&req).header_count(), 100);
    let n = req.len();
    req.truncate(n - 2);
    req.extend_from_slice(b"X-last: v\r\n\r\n");
    assert_eq!(status(&req), 431);
    // Small limits use a slice of the stack slots.
    let limits = Limits {
        max_headers: 2,
        ..Limits::default()
    };
    let two = b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n";
    assert!(parse_request(&mut BytesMut::from(&two[..]), &limits)
        .unwrap()
        .is_some());
    assert_eq!(
        status_with(
            b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nY: 2\r\n\r\n",
            &limits
        ),
        431
    );
    // The same through the lenient version path.
    assert_eq!(
        status_with(
            b"GET / HTTP/1.5\r\nHost: a\r\nX: 1\r\nY: 2\r\n\r\n",
            &limits
        ),
        431
    );
    let limits = Limits {
        max_headers: 0,
        ..Limits::default()
    };
    assert!(
        parse_request(&mut BytesMut::from(&b"GET / HTTP/1.0\r\n\r\n"[..]), &limits)
            .unwrap()
            .is_some()
    );
}

#[test]
fn content_length() {
    let post = |cl: &str| format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {cl}\r\n\r\n");
    assert_eq!(ok(post("0").as_bytes()).body, BodyKind::Length(0));
    assert_eq!(ok(post("42").as_bytes()).body, BodyKind::Length(42));
    assert_eq!(ok(post(" 7 ").as_bytes()).body, BodyKind::Length(7));
    assert_eq!(
        ok(post("18446744073709551615").as_bytes()).body,
        BodyKind::Length(u64::MAX)
    );
    for bad in [
        "",
        "-1",
        "+1",
        "1 2",
        "0x10",
        "1,1",
        "1.0",
        "18446744073709551616",
        "99999999999999999999999",
        "a",
    ] {
        assert_eq!(status(post(bad).as_bytes()), 400, "{bad:?}");
    }
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\n"),
        400
    );
    // HTTP/1.0 with a length.
    assert_eq!(
        ok(b"POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\n").body,
        BodyKind::Length(3)
    );
}

#[test]
fn transfer_encoding() {
    let te = |v: &str| format!("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {v}\r\n\r\n");
    for v in ["chunked", "Chunked", "CHUNKED", "  chunked\t"] {
        assert_eq!(ok(te(v).as_bytes()).body, BodyKind::Chunked, "{v}");
    }
    for v in [
        "gzip",
        "gzip, chunked",
        "chunked, chunked",
        "identity",
        "chunked;q=1",
        "",
    ] {
        assert_eq!(status(te(v).as_bytes()), 501, "{v:?}");
    }
    assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"), 400);
    assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
    assert_eq!(
        status(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: gzip\r\n\r\n"
        ),
        400
    );
    assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
    // Transfer-Encoding on HTTP/1.0.
    assert_eq!(
        status(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.0\r\nTransfer-Encoding: gzip\r\n\r\n"),
        400
    );
}

#[test]
fn host_rules() {
    assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"), 400);
    for bad in [
        "", "a b", "a/b", "a\\b", "a\tb", "a..b", "..", ".", ":80", "[::1]x/",
    ] {
        let req = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
        assert_eq!(status(req.as_bytes()), 400, "{bad:?}");
    }
    for (value, host) in [
        ("example.com", "example.com"),
        ("Example.COM:8080", "Example.COM"),
        ("example.com.", "example.com"),
        ("example.com.:80", "example.com"),
        ("[::1]:8080", "[::1]"),
        ("[::1]", "[::1]"),
        ("127.0.0.1", "127.0.0.1"),
        ("a_b-c", "a_b-c"),
    ] {
        let h = ok(format!("GET / HTTP/1.1\r\nHost: {value}\r\n\r\n").as_bytes());
        assert_eq!(h.host(), Some(host.as_bytes()), "{value}");
    }
    // HTTP/1.0 needs no Host, but a bad one is still refused.
    assert_eq!(ok(b"GET / HTTP/1.0\r\n\r\n").host(), None);
    assert_eq!(status(b"GET / HTTP/1.0\r\nHost: a/b\r\n\r\n"), 400);
}

#[test]
fn keep_alive_rules() {
    let ka = |v: &str, c: &str| {
        ok(format!("GET / HTTP/{v}\r\nHost: a\r\n{c}\r\n").as_bytes()).keep_alive
    };
    assert!(ka("1.1", ""));
    assert!(!ka("1.1", "Connection: close\r\n"));
    assert!(!ka("1.1", "Connection: CLOSE\r\n"));
    assert!(!ka("1.1", "Connection: keep-alive, close\r\n"));
    assert!(!ka("1.1", "Connection: Upgrade\r\nConnection: close\r\n"));
    assert!(ka("1.1", "Connection: keep-alive\r\n"));
    assert!(ka("1.1", "Connection: closed\r\n"));
    assert!(!ka("1.0", ""));
    assert!(ka("1.0", "Connection: keep-alive\r\n"));
    assert!(ka("1.0", "Connection: Keep-Alive\r\n"));
    assert!(ka("1.0", "Connection: foo ,  keep-alive \r\n"));
    assert!(!ka("1.0", "Connection: keep-alive, close\r\n"));
    assert!(!ka("1.0", "Connection: keep-alivex\r\n"));
}

#[test]
fn expect_rules() {
    let ex = |v: &str, e: &str| {
        ok(
            format!("POST / HTTP/{v}\r\nHost: a\r\nExpect: {e}\r\nContent-Length: 1\r\n\r\n")
                .as_bytes(),
        )
        .expect_continue
    };
    assert!(ex("1.1", "100-continue"));
    assert!(ex("1.1", "100-Continue"));
    assert!(!ex("1.1", "200-ok"));
    assert!(!ex("1.1", "100-continue-x"));
    assert!(!ex("1.0", "100-continue"));
}

#[test]
fn request_line_limit() {
    let limits = Limits {
        max_request_line: 32,
        ..Limits::default()
    };
    // "GET /xxx HTTP/1.1" is 9 + path + 1 bytes long.
    let line = |path_len: usize| format!("GET /{} HTTP/1.1", "x".repeat(path_len - 1));
    let fits = format!("{}\r\nHost: a\r\n\r\n", line(32 - 13));
    assert_eq!(fits.find('\r'), Some(32));
    assert!(parse_request(&mut BytesMut::from(fits.as_bytes()), &limits)
        .unwrap()
        .is_some());
    let long = format!("{}\r\nHost: a\r\n\r\n", line(33 - 13));
    assert_eq!(status_with(long.as_bytes(), &limits), 414);
    // Incomplete: refused once the line is known to be too long, not before.
    let partial = "GET /".to_string() + &"x".repeat(27);
    assert!(matches!(
        parse_request(&mut BytesMut::from(partial.as_bytes()), &limits),
        Ok(None)
    ));
    assert_eq!(
        status_with((partial.clone() + "x").as_bytes(), &limits),
        414
    );
    // A trailing CR may be the line end, so it does not count yet.
    let exact = line(32 - 13) + "\r";
    assert!(matches!(
        parse_request(&mut BytesMut::from(exact.as_bytes()), &limits),
        Ok(None)
    ));
    // Through the lenient path (odd version, trailing spaces).
    let odd = format!("GET /{} HTTP/1.1 \r\nHost: a\r\n\r\n", "x".repeat(19));
    assert_eq!(status_with(odd.as_bytes(), &limits), 414);
    // Long request line with headers still incomplete.
    assert_eq!(
        status_with(format!("{}\r\nHost: a\r\n", line(40)).as_bytes(), &limits),
        414
    );
}

#[test]
fn header_line_limit() {
    let limits = Limits {
        max_header_line: 16,
        ..Limits::default()
    };
    // "X: " + 13 bytes = 16.
    let fits = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n", "v".repeat(13));
    assert!(parse_request(&mut BytesMut::from(fits.as_bytes()), &limits)
        .unwrap()
        .is_some());
    let fits_lf = format!("GET / HTTP/1.1\nHost: a\nX: {}\n\n", "v".repeat(13));
    assert!(
        parse_request(&mut BytesMut::from(fits_lf.as_bytes()), &limits)
            .unwrap()
            .is_some()
    );
    let long = format!("GET / HTTP/1.1\r\nX: {}\r\nHost: a\r\n\r\n", "v".repeat(14));
    assert_eq!(status_with(long.as_bytes(), &limits), 431);
    let long_last = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\n\n", "v".repeat(14));
    assert_eq!(status_with(long_last.as_bytes(), &limits), 431);
    // Trailing whitespace counts: it is part of the line.
    let padded = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX: v{}\r\n\r\n",
        " ".repeat(20)
    );
    assert_eq!(status_with(padded.as_bytes(), &limits), 431);
    // Incomplete.
    let partial = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}", "v".repeat(14));
    assert_eq!(status_with(partial.as_bytes(), &limits), 431);
    // Incomplete, with an over-long line that is already complete.
    let partial_done = format!("GET / HTTP/1.1\r\nX: {}\r\nHost: a\r\n", "v".repeat(14));
    assert_eq!(status_with(partial_done.as_bytes(), &limits), 431);
    let partial_ok = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r", "v".repeat(13));
    assert!(matches!(
        parse_request(&mut BytesMut::from(partial_ok.as_bytes()), &limits),
        Ok(None)
    ));
}

#[test]
fn head_limit() {
    let limits = Limits {
        max_head: 64,
        ..Limits::default()
    };
    let req = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n", "v".repeat(32)).into_bytes();
    assert_eq!(req.len(), 64);
    assert!(parse_request(&mut BytesMut::from(&req[..]), &limits)
        .unwrap()
        .is_some());
    let mut big = req[..62].to_vec();
    big.extend_from_slice(b"Y: 2\r\n\r\n");
    assert_eq!(status_with(&big, &limits), 431);
    // Incomplete and already over.
    assert_eq!(status_with(&big[..65], &limits), 431);
    assert!(matches!(
        parse_request(&mut BytesMut::from(&big[..64]), &limits),
        Ok(None)
    ));
}

#[test]
fn pipelined_requests() {
    let mut buf = BytesMut::from(
        &b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nPOST /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc\
GET /3 HTTP/1.0\r\n\r\nGET /4 HTTP/1.1\r\nHo"[..],
    );
    let limits = Limits::default();
    let a = parse_request(&mut buf, &limits).unwrap().unwrap();
    assert_eq!(a.target(), b"/1");
    let b = parse_request(&mut buf, &limits).unwrap().unwrap();
    assert_eq!(b.target(), b"/2");
    assert_eq!(b.body, BodyKind::Length(3));
    assert!(buf.starts_with(b"abc"));
    let _ = buf.split_to(3);
    let c = parse_request(&mut buf, &limits).unwrap().unwrap();
    assert_eq!((c.target(), c.version), (&b"/3"[..], Version::Http10));
    assert!(matches!(parse_request(&mut buf, &limits), Ok(None)));
    assert_eq!(&buf[..], b"GET /4 HTTP/1.1\r\nHo");
    buf.extend_from_slice(b"st: a\r\n\r\n");
    assert_eq!(
        parse_request(&mut buf, &limits).unwrap().unwrap().target(),
        b"/4"
    );
    assert!(buf.is_empty());
}

/// Feeding a request one byte at a time gives `None` until the last byte, then the same
/// head as parsing it whole, and leaves the same remainder.
fn byte_by_byte(req: &[u8], limits: &Limits) {
    let whole = parse_request(&mut BytesMut::from(req), limits);
    let mut buf = BytesMut::new();
    let mut got = None;
    for (i, &c) in req.iter().enumerate() {
        buf.extend_from_slice(&[c]);
        match parse_request(&mut buf, limits) {
            Ok(None) => {}
            Ok(Some(h)) => {
                got = Some(h);
                buf.extend_from_slice(&req[i + 1..]);
                break;
            }
            Err(e) => {
                assert!(
                    whole.is_err(),
                    "{:?}: byte-wise {e:?}, whole {whole:?}",
                    String::from_utf8_lossy(req)
                );
                return;
            }
        }
    }
    match (got, whole) {
        (Some(a), Ok(Some(b))) => {
            assert_eq!(a.raw(), b.raw());
            assert_eq!(a.target(), b.target());
            assert_eq!(
                (a.method, a.version, a.body, a.keep_alive),
                (b.method, b.version, b.body, b.keep_alive)
            );
            assert_eq!(
                a.headers().collect::<Vec<_>>(),
                b.headers().collect::<Vec<_>>()
            );
        }
        (None, Ok(None)) => {}
        (got, whole) => panic!(
            "{:?}: byte-wise {got:?}, whole {whole:?}",
            String::from_utf8_lossy(req)
        ),
    }
}

#[test]
fn partial_input_byte_by_byte() {
    let limits = Limits {
        max_request_line: 40,
        max_header_line: 30,
        max_head: 120,
        max_headers: 4,
        names: HeaderNames::default(),
    };
    for req in [
        &b"GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"[..],
        b"\r\n\nPOST /x HTTP/1.0\nContent-Length: 10\nConnection: keep-alive\n\nbody",
        b"GET / HTTP/1.5\r\nHost: a\r\n\r\nGET",
        b"GET / HTTP/1.1   \r\nHost: a\r\n\r\n",
        b"PUT /u HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n5\r\nhello",
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n",
        b"GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\n\r",
    ] {
        byte_by_byte(req, &limits);
    }
    // The first head comes out at its last byte exactly.
    let req = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut buf = BytesMut::new();
    for (i, &c) in req.iter().enumerate() {
        buf.extend_from_slice(&[c]);
        let r = parse_request(&mut buf, &Limits::default()).unwrap();
        assert_eq!(r.is_some(), i == req.len() - 1, "at byte {i}");
    }
}

#[test]
fn error_statuses() {
    assert_eq!(ParseError::BadRequest("x").status(), 400);
    assert_eq!(ParseError::UriTooLong.status(), 414);
    assert_eq!(ParseError::HeaderTooLarge.status(), 431);
    assert_eq!(ParseError::NotImplemented("x").status(), 501);
    assert_eq!(ParseError::VersionNotSupported.status(), 505);
}

// --- heads of HTTP/2 streams -------------------------------------------------------------

#[test]
fn head_from_fields_reads_like_an_http1_head() {
    let fields: [(&str, &[u8]); 3] = [
        ("accept", b"*/*"),
        ("content-length", b"5"),
        ("cookie", b"a=1"),
    ];
    let h = RequestHead::from_fields(
        "POST",
        "/x?y=1",
        Some("Example.com:8443"),
        fields,
        true,
        HeaderNames::default(),
    )
    .unwrap();
    assert_eq!(h.method, Method::Post);
    assert_eq!(h.version, Version::Http2);
    assert_eq!(h.target(), b"/x?y=1");
    assert_eq!(h.host(), Some(&b"Example.com"[..]));
    assert_eq!(h.header("accept"), Some(&b"*/*"[..]));
    assert_eq!(h.body, BodyKind::Length(5));
    assert!(h
        .raw()
        .starts_with(b"POST /x?y=1 HTTP/2.0\r\nhost: Example.com:8443\r\n"));
    assert!(h.raw().ends_with(b"\r\n\r\n"));
}

#[test]
fn head_from_fields_joins_cookies_as_nginx() {
    let fields: [(&str, &[u8]); 4] = [
        ("cookie", b"a=b"),
        ("accept", b"*/*"),
        ("cookie", b"c=d"),
        ("cookie", b"e=f"),
    ];
    let h =
        RequestHead::from_fields("GET", "/", None, fields, false, HeaderNames::default()).unwrap();
    let cookies: Vec<&[u8]> = h.header_all("cookie").collect();
    assert_eq!(cookies, [&b"a=b; c=d; e=f"[..]]);
    assert!(h
        .raw()
        .ends_with(b"accept: */*\r\ncookie: a=b; c=d; e=f\r\n\r\n"));
}

#[test]
fn head_from_fields_checks_host_and_length() {
    let none: [(&str, &[u8]); 0] = [];
    let h =
        RequestHead::from_fields("GET", "/", None, none, false, HeaderNames::default()).unwrap();
    assert_eq!((h.host(), h.body), (None, BodyKind::None));
    // A body without Content-Length ends with the stream.
    assert_eq!(
        RequestHead::from_fields("PUT", "/", None, none, true, HeaderNames::default())
            .unwrap()
            .body,
        BodyKind::Chunked
    );
    let bad_host: [(&str, &[u8]); 1] = [("host", b"a b")];
    assert!(
        RequestHead::from_fields("GET", "/", None, bad_host, false, HeaderNames::default())
            .is_err()
    );
    // :authority wins over a Host field, which is then not kept.
    let h = RequestHead::from_fields(
        "GET",
        "/",
        Some("a.test"),
        bad_host,
        false,
        HeaderNames::default(),
    )
    .unwrap();
    assert_eq!(h.header_all("host").count(), 1);
    let two: [(&str, &[u8]); 2] = [("content-length", b"1"), ("content-length", b"1")];
    assert!(
        RequestHead::from_fields("GET", "/", None, two, false, HeaderNames::default()).is_err()
    );
    let junk: [(&str, &[u8]); 1] = [("content-length", b"x")];
    assert!(
        RequestHead::from_fields("GET", "/", None, junk, false, HeaderNames::default()).is_err()
    );
}

#[test]
fn invalid_header_names_dropped_or_kept_as_configured() {
    let req = b"GET / HTTP/1.1\r\nHost: a\r\nX_Under: 1\r\nX.Dot: 2\r\nX-Ok: 3\r\n\r\n";
    // nginx's defaults: both dropped, listed for the log as whole lines.
    let h = parse(req).unwrap().unwrap();
    assert_eq!(h.header("x-ok"), Some(&b"3"[..]));
    assert_eq!(h.header("x_under"), None);
    assert_eq!(h.header("x.dot"), None);
    assert_eq!(h.ignored, vec![&b"X_Under: 1"[..], &b"X.Dot: 2"[..]]);
    // underscores_in_headers on: the underscore name is valid.
    let names = HeaderNames {
        underscores: true,
        ignore_invalid: true,
    };
    let limits = Limits {
        names,
        ..Limits::default()
    };
    let h = parse_request(&mut BytesMut::from(&req[..]), &limits)
        .unwrap()
        .unwrap();
    assert_eq!(h.header("x_under"), Some(&b"1"[..]));
    assert_eq!(h.header("x.dot"), None);
    // ignore_invalid_headers off: everything kept.
    let limits = Limits {
        names: HeaderNames {
            underscores: false,
            ignore_invalid: false,
        },
        ..Limits::default()
    };
    let h = parse_request(&mut BytesMut::from(&req[..]), &limits)
        .unwrap()
        .unwrap();
    assert_eq!(h.header("x_under"), Some(&b"1"[..]));
    assert_eq!(h.header("x.dot"), Some(&b"2"[..]));
    assert!(h.ignored.is_empty());
    // A dropped Host is no Host: HTTP/1.1 without one is refused.
    assert!(parse(b"GET / HTTP/1.1\r\nHo_st: a\r\n\r\n").is_err());
    // HTTP/2 fields go through the same policy.
    let fields = [("x_under", &b"1"[..]), ("x-ok", &b"2"[..])];
    let h = RequestHead::from_fields("GET", "/", Some("a"), fields, false, HeaderNames::default())
        .unwrap();
    assert_eq!(h.header("x_under"), None);
    assert_eq!(h.ignored, vec![&b"x_under"[..]]);
}

#[test]
fn set_header_replaces_or_adds_and_keeps_the_received_bytes() {
    let sent: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\nTraceparent: 0123\r\nX: y\r\n\r\n";
    let mut h = ok(sent);
    // Same length: written over in place.
    h.set_header("traceparent", b"abcd");
    assert_eq!(h.header("TRACEPARENT"), Some(&b"abcd"[..]));
    // Another length, and a new field: after the received bytes.
    h.set_header("traceparent", b"00-long");
    h.set_header("tracestate", b"k=v");
    // An empty value adds nothing.
    h.set_header("x-none", b"");
    assert_eq!(h.header("traceparent"), Some(&b"00-long"[..]));
    assert_eq!(h.header("tracestate"), Some(&b"k=v"[..]));
    assert_eq!(h.header("x-none"), None);
    assert_eq!(h.header("x"), Some(&b"y"[..]));
    assert_eq!(h.header_count(), 4);
    // What was received keeps its length ($request_length) and request line ($request).
    assert_eq!(h.raw().len(), sent.len());
    assert!(h.raw().starts_with(b"GET / HTTP/1.1\r\nHost: a\r\n"));
}

#[test]
fn http09_request_line() {
    for line in [&b"GET /\r\n"[..], b"GET /\n", b"GET /x?a=1   \r\n"] {
        let mut buf = BytesMut::from(&[line, b"Host: ignored\r\n\r\n"].concat()[..]);
        let h = match parse_request(&mut buf, &Limits::default()) {
            Ok(Some(h)) => h,
            other => panic!("{line:?}: {other:?}"),
        };
        assert_eq!(h.version, Version::Http09);
        assert!(!h.keep_alive && h.header("host").is_none());
        assert!(h.target().starts_with(b"/"));
        // No header fields are read: what follows the line stays in the buffer.
        assert!(buf.starts_with(b"Host:"));
    }
    // Still incomplete: a CR without its LF.
    assert!(matches!(
        parse_request(&mut BytesMut::from(&b"GET /\r"[..]), &Limits::default()),
        Ok(None)
    ));
    // A target running into a control byte is still a bad one.
    assert_eq!(status(b"GET /\x01\r\n"), 400);
}
