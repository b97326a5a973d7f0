//! The one-pass parse of the usual head (`h1::plain`) answers every head as the general
//! path does: each base head, changed at every position to each byte that matters to one
//! of the two, cut at every length, and under tight limits, parses to the same head, error
//! or "more bytes needed", and leaves the same bytes behind.

use bytes::BytesMut;

use super::parse::*;

const BASES: &[&[u8]] = &[
    b"GET /robots.txt HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: h2load nghttp2/1.52.0\r\nAccept: */*\r\n\r\n",
    b"POST /a?b=c%20d HTTP/1.0\r\nHost: x.example\r\nContent-Length: 3\r\nIf-None-Match: \"e\"\r\nConnection: keep-alive\r\n\r\nabcGET / HTTP/1.1\r\n",
    b"HEAD http://h/x HTTP/1.1\r\nHost:  a\r\nX-Forwarded-For: 10.0.0.1, 10.0.0.2\r\nCookie: a=b; c=d\r\n\r\n",
];

/// Bytes each path treats specially somewhere in a head.
const BYTES: &[u8] = &[
    b' ', b'\t', b'\r', b'\n', b':', b'_', b'.', b'-', b'/', b'%', b'"', b'a', b'A', b'0', 0, 0x1f,
    0x7f, 0x80, 0xff,
];

fn both(input: &[u8], limits: &Limits) -> bool {
    let mut quick = BytesMut::from(input);
    let mut general = BytesMut::from(input);
    let q = parse_request_as(&mut quick, limits, true);
    let g = parse_request_as(&mut general, limits, false);
    assert_eq!(
        format!("{q:?}"),
        format!("{g:?}"),
        "{:?}",
        String::from_utf8_lossy(input)
    );
    assert_eq!(quick, general, "{:?}", String::from_utf8_lossy(input));
    matches!(q, Ok(Some(_)))
}

#[test]
fn plain_heads_parse_as_the_general_path_parses_them() {
    let mut limits = Limits::default();
    for base in BASES {
        // The bases themselves go the quick way (else this test compares nothing).
        assert!(both(base, &limits));
        let mut buf = BytesMut::from(*base);
        assert!(super::plain::parse(&buf, &limits, 64).is_some());
        buf.clear();
        for n in 0..base.len() {
            both(&base[..n], &limits);
        }
        for at in 0..base.len() {
            for &c in BYTES {
                let mut v = base.to_vec();
                v[at] = c;
                both(&v, &limits);
                v.insert(at, c);
                both(&v, &limits);
            }
        }
    }
    // At and past each limit.
    for base in BASES {
        for size in [8, 14, 20, 24, 26, 30, 40] {
            limits.max_request_line = size;
            both(base, &limits);
            limits.max_request_line = 8192;
            limits.max_header_line = size;
            both(base, &limits);
            limits.max_header_line = 8192;
            limits.max_head = size * 3;
            both(base, &limits);
            limits.max_head = 32768;
        }
        for n in 0..5 {
            limits.max_headers = n;
            both(base, &limits);
        }
        limits.max_headers = 100;
        for names in [(true, true), (true, false), (false, false)] {
            limits.names = HeaderNames {
                underscores: names.0,
                ignore_invalid: names.1,
            };
            both(base, &limits);
        }
        limits.names = HeaderNames::default();
    }
}

/// Header lookups compare names eight bytes at a time: every byte pair at every position
/// of a name long enough for a word and a tail agrees with `eq_ignore_ascii_case`.
#[test]
fn header_names_compare_as_eq_ignore_ascii_case() {
    let head = |name: &[u8]| {
        let mut h = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        h.extend_from_slice(name);
        h.extend_from_slice(b": v\r\n\r\n");
        let mut buf = BytesMut::from(&h[..]);
        parse_request(&mut buf, &Limits::default()).ok().flatten()
    };
    let base = b"x-forwarded-f";
    for at in 0..base.len() {
        for c in 0..=255u8 {
            let mut sent = base.to_vec();
            sent[at] = c;
            // A name httparse refuses or nginx's rule drops is not looked up.
            let Some(h) = head(&sent).filter(|h| {
                h.headers()
                    .nth(1)
                    .is_some_and(|(n, _)| n.as_bytes() == sent)
            }) else {
                continue;
            };
            for l in [
                b'a',
                b'A',
                b'z',
                b'Z',
                b'@',
                b'[',
                b'`',
                b'{',
                b'-',
                c,
                c ^ 0x20,
            ] {
                let mut asked = base.to_vec();
                asked[at] = l;
                let Ok(asked) = std::str::from_utf8(&asked) else {
                    continue;
                };
                assert_eq!(
                    h.header(asked).is_some(),
                    sent.eq_ignore_ascii_case(asked.as_bytes()),
                    "{sent:?} {asked:?}"
                );
            }
        }
    }
}
