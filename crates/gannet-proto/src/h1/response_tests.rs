use super::response::{parse_response, Framing, ResponseError};
use bytes::BytesMut;

fn parse(
    raw: &str,
    head: bool,
) -> Result<Option<(super::response::ResponseHead, BytesMut)>, ResponseError> {
    let mut buf = BytesMut::from(raw.as_bytes());
    Ok(parse_response(&mut buf, 4096, head)?.map(|h| (h, buf)))
}

#[test]
fn length_delimited_keep_alive() {
    let (h, rest) = parse(
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello",
        false,
    )
    .unwrap()
    .unwrap();
    assert_eq!(h.status, 200);
    assert_eq!(h.framing, Framing::Length(5));
    assert!(h.keep_alive);
    assert_eq!(&rest[..], b"hello");
    // Repeated fields stay separate and in order (Set-Cookie must).
    let xa: Vec<_> = h
        .headers
        .iter()
        .filter(|(n, _)| *n == "X-A")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(xa, ["1", "2"]);
}

#[test]
fn partial_head_waits() {
    assert!(parse("HTTP/1.1 200 OK\r\nContent-Le", false)
        .unwrap()
        .is_none());
}

#[test]
fn chunked_and_close_framing() {
    let (h, _) = parse(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        false,
    )
    .unwrap()
    .unwrap();
    assert_eq!(h.framing, Framing::Chunked);
    assert!(h.keep_alive);
    let (h, _) = parse("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc", false)
        .unwrap()
        .unwrap();
    assert_eq!(h.framing, Framing::Close);
    assert!(!h.keep_alive);
    // Without a length a 1.1 answer ends with the connection, which cannot be kept.
    let (h, _) = parse("HTTP/1.1 200 OK\r\n\r\nabc", false).unwrap().unwrap();
    assert_eq!(h.framing, Framing::Close);
    assert!(!h.keep_alive);
}

#[test]
fn http10_keeps_only_when_asked() {
    let (h, _) = parse("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false)
        .unwrap()
        .unwrap();
    assert!(!h.keep_alive);
    let (h, _) = parse(
        "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n",
        false,
    )
    .unwrap()
    .unwrap();
    assert!(h.keep_alive);
}

#[test]
fn bodiless_statuses_and_head() {
    for raw in [
        "HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
    ] {
        let (h, _) = parse(raw, false).unwrap().unwrap();
        assert_eq!(h.framing, Framing::Empty, "{raw}");
        assert!(h.keep_alive);
    }
    let (h, _) = parse("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true)
        .unwrap()
        .unwrap();
    assert_eq!(h.framing, Framing::Empty);
    assert_eq!(h.get("content-length"), Some("10"));
}

#[test]
fn interim_answers_are_skipped_but_101_is_not() {
    let (h, rest) = parse(
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
        false,
    )
    .unwrap()
    .unwrap();
    assert_eq!(h.status, 201);
    assert_eq!(&rest[..], b"ok");
    let (h, _) = parse(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        false,
    )
    .unwrap()
    .unwrap();
    assert_eq!(h.status, 101);
    assert!(!h.keep_alive);
}

#[test]
fn ambiguous_framing_is_refused() {
    let e = |raw: &str| parse(raw, false).unwrap_err();
    assert_eq!(
        e("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
        ResponseError::BadLength
    );
    assert_eq!(
        e("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
        ResponseError::BadLength
    );
    assert_eq!(
        e("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
        ResponseError::LengthAndEncoding
    );
    assert_eq!(
        e("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
        ResponseError::BadEncoding
    );
    // The same length twice is one length.
    let (h, _) = parse(
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
        false,
    )
    .unwrap()
    .unwrap();
    assert_eq!(h.framing, Framing::Length(3));
}

#[test]
fn garbage_and_oversize() {
    assert_eq!(
        parse("SSH-2.0-OpenSSH\r\n\r\n", false).unwrap_err(),
        ResponseError::Invalid
    );
    let big = format!("HTTP/1.1 200 OK\r\nX: {}\r\n", "a".repeat(5000));
    assert_eq!(parse(&big, false).unwrap_err(), ResponseError::TooBig);
    let many: String = (0..150).map(|i| format!("X-{i}: v\r\n")).collect();
    let raw = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
    let mut buf = BytesMut::from(raw.as_bytes());
    assert_eq!(
        parse_response(&mut buf, 1 << 20, false).unwrap_err(),
        ResponseError::TooBig
    );
}

#[test]
fn values_are_places_in_the_head_and_obs_text_is_replaced() {
    let (h, rest) = parse(
        "HTTP/1.1 200 OK\r\nA: one\r\nB:  two  \r\nC:\r\nContent-Length: 1\r\n\r\nx",
        false,
    )
    .unwrap()
    .unwrap();
    let got: Vec<_> = h.headers.iter().collect();
    assert_eq!(
        got,
        [
            ("A", "one"),
            ("B", "two"),
            ("C", ""),
            ("Content-Length", "1")
        ]
    );
    assert_eq!(&rest[..], b"x");
    // A value kept apart from the head still reads the same once the head is gone.
    let kept = h.headers.keep(h.headers.get("b").unwrap());
    drop(h);
    assert_eq!(&*kept, "two");
    // Bytes that are not UTF-8 in one value: replaced there, the other values intact.
    let mut buf = BytesMut::from(&b"HTTP/1.1 204 No Content\r\nX: a\xffb\r\nY: fine\r\n\r\n"[..]);
    let h = parse_response(&mut buf, 4096, false).unwrap().unwrap();
    assert_eq!(h.headers.get("x"), Some("a\u{fffd}b"));
    assert_eq!(h.headers.get("y"), Some("fine"));
}

/// The one-pass parser of usual heads (`plain`) gives exactly what httparse gives, or
/// leaves the head to httparse: checked on a back end's head with each byte replaced by,
/// or preceded by, bytes that matter to the grammar, and cut short at each length.
#[test]
fn plain_heads_parse_as_httparse_parses_them() {
    let base: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 02:00:00 GMT\r\nContent-Type: application/json\r\nContent-Length: 14\r\nX-Tab:\ta\tb\r\nETag: \"6564-e\"\r\n\r\nbody";
    let odd: &[u8] = &[
        b'\r', b'\n', b' ', b'\t', b':', 0, 1, 0x1f, 0x7f, 0x80, 0xff, b'a', b'"', b'(', b'0',
    ];
    let mut cases = vec![base.to_vec(), b"HTTP/1.0 404\r\n\r\n".to_vec()];
    for i in 0..base.len() {
        cases.push(base[..i].to_vec());
        for &b in odd {
            let mut v = base.to_vec();
            v[i] = b;
            cases.push(v);
            let mut v = base.to_vec();
            v.insert(i, b);
            cases.push(v);
        }
    }
    let mut taken = 0;
    for case in &cases {
        let Some(fast) = super::response::plain_fields(case) else {
            continue;
        };
        taken += 1;
        let mut slots = [httparse::EMPTY_HEADER; 100];
        let mut r = httparse::Response::new(&mut slots);
        let used = match r.parse(case) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!(
                "{:?}: plain parsed, httparse {other:?}",
                String::from_utf8_lossy(case)
            ),
        };
        let fields: Vec<_> = r
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect();
        let slow = (r.code.unwrap(), r.version.unwrap(), used, fields);
        assert_eq!(fast, slow, "{:?}", String::from_utf8_lossy(case));
    }
    // The usual heads do take the one pass.
    assert!(super::response::plain_fields(base).is_some());
    assert!(taken > cases.len() / 5, "{taken} of {}", cases.len());
}
