//! Tests of the response-head helpers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::encode::*;

#[test]
fn reasons() {
    for (code, phrase) in [
        (100, "Continue"),
        (101, "Switching Protocols"),
        (200, "OK"),
        (204, "No Content"),
        (206, "Partial Content"),
        (301, "Moved Permanently"),
        (304, "Not Modified"),
        (308, "Permanent Redirect"),
        (400, "Bad Request"),
        (404, "Not Found"),
        (413, "Content Too Large"),
        (414, "URI Too Long"),
        (416, "Range Not Satisfiable"),
        (417, "Expectation Failed"),
        (421, "Misdirected Request"),
        (429, "Too Many Requests"),
        (431, "Request Header Fields Too Large"),
        (451, "Unavailable For Legal Reasons"),
        (494, "Request Header Too Large"),
        (500, "Internal Server Error"),
        (505, "HTTP Version Not Supported"),
        (507, "Insufficient Storage"),
    ] {
        assert_eq!(reason(code), phrase);
    }
    for code in (100..=101)
        .chain(200..=206)
        .chain(300..=305)
        .chain(307..=308)
        .chain(400..=417)
    {
        assert!(!reason(code).is_empty(), "{code}");
    }
    for code in [0, 99, 102, 207, 306, 418, 499, 506, 508, 599, 999] {
        assert_eq!(reason(code), "", "{code}");
    }
}

#[test]
fn status_lines() {
    assert_eq!(status_line(200), b"HTTP/1.1 200 OK\r\n");
    assert_eq!(status_line(404), b"HTTP/1.1 404 Not Found\r\n");
    assert_eq!(status_line(599), b"HTTP/1.1 599 \r\n");
    let mut out = b"x".to_vec();
    write_status_line(&mut out, 304);
    assert_eq!(out, b"xHTTP/1.1 304 Not Modified\r\n");
}

#[test]
fn decimal() {
    for n in [0, 1, 9, 10, 99, 100, 12345, 4_294_967_296, u64::MAX] {
        let mut out = Vec::new();
        write_u64(&mut out, n);
        assert_eq!(out, n.to_string().as_bytes());
    }
}

#[test]
fn dates() {
    let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
    assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
    for s in [
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
        " Sun, 06 Nov 1994 08:49:37 GMT ",
    ] {
        assert_eq!(parse_http_date(s.as_bytes()), Some(t), "{s}");
    }
    for s in [
        &b""[..],
        b"yesterday",
        b"Sun, 06 Nov 1994 08:49:37 UTC",
        b"Sun, 32 Nov 1994 08:49:37 GMT",
        b"\xff\xfe",
    ] {
        assert_eq!(parse_http_date(s), None);
    }
    let now = SystemTime::now();
    let round = parse_http_date(http_date(now).as_bytes()).unwrap();
    assert!(now.duration_since(round).unwrap() < Duration::from_secs(1));
    // Out-of-range times are clamped, not a panic.
    assert_eq!(
        http_date(UNIX_EPOCH - Duration::from_secs(10)),
        "Thu, 01 Jan 1970 00:00:00 GMT"
    );
    assert_eq!(
        http_date(UNIX_EPOCH + Duration::from_secs(300_000_000_000)),
        "Fri, 31 Dec 9999 23:59:59 GMT"
    );
}

#[test]
fn chunk_size_lines_match_the_formatter() {
    for n in [
        0usize,
        1,
        9,
        10,
        15,
        16,
        255,
        256,
        4095,
        65536,
        1 << 20,
        usize::MAX,
    ] {
        let mut out = Vec::new();
        chunk_size(&mut out, n);
        assert_eq!(out, format!("{n:x}\r\n").into_bytes(), "{n}");
    }
}
