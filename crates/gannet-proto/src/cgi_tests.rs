use super::*;
use bytes::BytesMut;

#[test]
fn cgi_head_status_location_and_body() {
    let mut buf = BytesMut::from(
        &b"Status: 404 Not Found\r\nContent-Type: text/html; charset=UTF-8\r\nX-A:  b \r\n\r\n<p>"
            [..],
    );
    let head = parse_head(&mut buf, 4096).unwrap().unwrap();
    assert_eq!(head.status, Some(404));
    assert_eq!(head.get("content-type"), Some("text/html; charset=UTF-8"));
    assert_eq!(head.get("x-a"), Some("b"));
    assert_eq!(&buf[..], b"<p>");

    let mut buf = BytesMut::from(&b"Location: /elsewhere\n\n"[..]);
    let head = parse_head(&mut buf, 4096).unwrap().unwrap();
    assert_eq!(head.status, None);
    assert_eq!(head.get("Location"), Some("/elsewhere"));
    assert!(buf.is_empty());
}

#[test]
fn cgi_head_incomplete_and_invalid() {
    let mut buf = BytesMut::from(&b"Content-Type: text/plain\r\n"[..]);
    assert_eq!(parse_head(&mut buf, 4096), Ok(None));
    assert_eq!(buf.len(), 26, "nothing consumed until the head is whole");
    let mut buf = BytesMut::from(&b"no colon here\r\n\r\n"[..]);
    assert_eq!(parse_head(&mut buf, 4096), Err(HeadError::Invalid));
    let mut buf = BytesMut::from(&b"Bad Name: x\r\n\r\n"[..]);
    assert_eq!(parse_head(&mut buf, 4096), Err(HeadError::Invalid));
    let mut buf = BytesMut::from(&b"Status: abc\r\n\r\n"[..]);
    assert_eq!(parse_head(&mut buf, 4096), Err(HeadError::BadStatus));
    let mut buf = BytesMut::from(&b"Status: 2000\r\n\r\n"[..]);
    assert_eq!(parse_head(&mut buf, 4096), Err(HeadError::BadStatus));
    let mut buf = BytesMut::from(&vec![b'a'; 5000][..]);
    assert_eq!(parse_head(&mut buf, 4096), Err(HeadError::TooBig));
}

fn head_or_line(wire: &[u8]) -> (Result<Option<CgiHead>, HeadError>, BytesMut) {
    let mut buf = BytesMut::from(wire);
    let r = parse_head_or_status_line(&mut buf, 4096);
    (r, buf)
}

#[test]
fn status_line_then_fields() {
    // What uWSGI answers over the uwsgi protocol.
    let (r, rest) = head_or_line(b"HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n\r\nbody");
    let head = r.unwrap().unwrap();
    assert_eq!(head.status, Some(201));
    assert_eq!(
        head.headers.iter().collect::<Vec<_>>(),
        [("Content-Type", "text/plain")]
    );
    assert_eq!(&rest[..], b"body");
    // Bare LF, HTTP/1.0, no reason phrase.
    let (r, rest) = head_or_line(b"HTTP/1.0 404\nX: y\n\n");
    let head = r.unwrap().unwrap();
    assert_eq!(head.status, Some(404));
    assert!(rest.is_empty());
    // The status line wins over a Status field, which is only dropped (not even checked).
    let (r, _) = head_or_line(b"HTTP/1.1 503 Busy\r\nStatus: nonsense\r\n\r\n");
    let head = r.unwrap().unwrap();
    assert_eq!(head.status, Some(503));
    assert!(head.headers.is_empty());
}

#[test]
fn without_status_line_it_is_a_cgi_head() {
    // What uWSGI answers over SCGI.
    let (r, rest) = head_or_line(b"Status: 200 OK\r\nContent-Type: application/json\r\n\r\n{}");
    let head = r.unwrap().unwrap();
    assert_eq!(head.status, Some(200));
    assert_eq!(head.get("content-type"), Some("application/json"));
    assert_eq!(&rest[..], b"{}");
    let (r, _) = head_or_line(b"Location: /x\r\n\r\n");
    assert_eq!(r.unwrap().unwrap().status, None);
}

#[test]
fn status_line_incomplete_keeps_the_buffer() {
    for wire in [
        &b""[..],
        b"HTTP/1.1 20",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: x\r\n",
    ] {
        let (r, rest) = head_or_line(wire);
        assert_eq!(r, Ok(None), "{wire:?}");
        assert_eq!(&rest[..], wire, "nothing consumed until the head is whole");
    }
}

#[test]
fn malformed_status_lines() {
    // Not a status line, so read as a header field: none of these is one either.
    for wire in [
        &b"HTTP/1.1 2000 OK\r\n\r\n"[..],
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 099 Low\r\n\r\n",
        b"HTTP/x.1 200 OK\r\n\r\n",
        b"HTTP/1. 200 OK\r\n\r\n",
        b"HTTP/11 200 OK\r\n\r\n",
        b"HTTP/1.1\r\n\r\n",
        b"HTTP/1.1200 OK\r\n\r\n",
        b"http/1.1 200 OK\r\n\r\n",
        b"garbage\r\n\r\n",
    ] {
        let (r, _) = head_or_line(wire);
        assert_eq!(r, Err(HeadError::Invalid), "{wire:?}");
    }
    // A valid status line and then a broken field.
    let (r, _) = head_or_line(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n");
    assert_eq!(r, Err(HeadError::Invalid));
    // Too big, with and without a status line.
    let mut long = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
    long.extend(vec![b'a'; 5000]);
    assert_eq!(head_or_line(&long).0, Err(HeadError::TooBig));
    assert_eq!(head_or_line(&[b'H'; 5000]).0, Err(HeadError::TooBig));
}

#[test]
fn header_names_keep_their_spelling_and_usual_ones_are_not_copied() {
    use std::borrow::Cow;
    assert!(matches!(
        header_name(b"Content-Type"),
        Cow::Borrowed("Content-Type")
    ));
    // Another spelling of a usual name is kept as sent, not made the usual one.
    assert!(matches!(header_name(b"content-type"), Cow::Owned(ref n) if n == "content-type"));
    assert!(matches!(header_name(b"X-Custom"), Cow::Owned(ref n) if n == "X-Custom"));
    assert!(matches!(header_name(b"X-\xff"), Cow::Owned(ref n) if n == "X-\u{fffd}"));
    let (r, _) = head_or_line(b"Status: 200 OK\r\nContent-Type: a\r\nx-pad: b\r\n\r\n");
    let head = r.unwrap().unwrap();
    assert!(matches!(
        head.headers.list[0].0,
        Cow::Borrowed("Content-Type")
    ));
    assert_eq!(head.headers.list[1].0, "x-pad");
}

#[test]
fn obs_text_in_a_value_is_replaced_and_the_others_stay_in_place() {
    let (r, rest) = head_or_line(b"Status: 200\r\nX: a\xffb\r\nY:  fine \r\n\r\nbody");
    let head = r.unwrap().unwrap();
    assert_eq!(head.status, Some(200));
    assert_eq!(
        head.headers.iter().collect::<Vec<_>>(),
        [("X", "a\u{fffd}b"), ("Y", "fine")]
    );
    assert_eq!(&rest[..], b"body");
}
