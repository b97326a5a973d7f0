//! Chunked decoder tests: valid bodies split at every position, and every refusal.

use bytes::BytesMut;

use super::chunked::{Chunk, ChunkedDecoder};
use super::parse::ParseError;

/// Decode `input` delivered in the given pieces; returns the body, whether `Done` was seen,
/// and what was left in the buffer.
fn run(dec: &mut ChunkedDecoder, pieces: &[&[u8]]) -> Result<(Vec<u8>, bool, Vec<u8>), ParseError> {
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match dec.decode(&mut buf)? {
                Chunk::Data(d) => {
                    assert!(!d.is_empty(), "empty Data");
                    body.extend_from_slice(&d);
                }
                Chunk::NeedMore => {
                    assert!(buf.is_empty(), "NeedMore with bytes left");
                    break;
                }
                Chunk::Done => return Ok((body, true, buf.to_vec())),
            }
        }
    }
    Ok((body, false, buf.to_vec()))
}

fn whole(input: &[u8]) -> Result<(Vec<u8>, bool, Vec<u8>), ParseError> {
    run(&mut ChunkedDecoder::new(), &[input])
}

fn status(input: &[u8]) -> u16 {
    whole(input).expect_err("should be refused").status()
}

const VALID: &[(&[u8], &[u8])] = &[
    (b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", b"hello world"),
    (b"0\r\n\r\n", b""),
    (b"A\r\n0123456789\r\n0\r\n\r\n", b"0123456789"),
    (b"a\r\n0123456789\r\n00\r\n\r\n", b"0123456789"),
    (b"000003\r\nabc\r\n0\r\n\r\n", b"abc"),
    (b"3;name=value\r\nabc\r\n0;last\r\n\r\n", b"abc"),
    (b"3 ; ext\r\nabc\r\n0\t\r\n\r\n", b"abc"),
    (b"3\nabc\n0\n\n", b"abc"),
    (b"3\r\nabc\r\n0\r\nTrailer: x\r\nOther: y\r\n\r\n", b"abc"),
    (b"3\r\nabc\r\n0\r\nTrailer: x\n\n", b"abc"),
    (b"1\r\n\r\r\n1\r\n\n\r\n0\r\n\r\n", b"\r\n"),
];

#[test]
fn valid_bodies_whole() {
    for (input, body) in VALID {
        let (got, done, rest) = whole(input).unwrap();
        assert!(done, "{:?}", String::from_utf8_lossy(input));
        assert_eq!(&got, body);
        assert!(rest.is_empty());
    }
}

#[test]
fn valid_bodies_every_split() {
    for (input, body) in VALID {
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let mut dec = ChunkedDecoder::new();
                let (got, done, rest) =
                    run(&mut dec, &[&input[..i], &input[i..j], &input[j..]]).unwrap();
                assert!(
                    done && rest.is_empty(),
                    "split {i},{j} of {:?}",
                    String::from_utf8_lossy(input)
                );
                assert_eq!(&got, body);
                assert_eq!(dec.decoded_total(), body.len() as u64);
            }
        }
    }
}

#[test]
fn byte_by_byte() {
    let input = b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nT: v\r\n\r\nGET / HTTP/1.1\r\n";
    let pieces: Vec<&[u8]> = input.chunks(1).collect();
    let mut dec = ChunkedDecoder::new();
    let (body, done, rest) = run(&mut dec, &pieces).unwrap();
    assert!(done);
    assert_eq!(body, b"hello world");
    assert_eq!(rest, b"");
    // The bytes after Done were never fed in `run`; check the remainder on a whole buffer.
    let mut buf = BytesMut::from(&input[..]);
    let mut dec = ChunkedDecoder::new();
    while dec.decode(&mut buf).unwrap() != Chunk::Done {}
    assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n");
    assert!(dec.is_done());
    // Done is sticky and leaves the buffer alone.
    assert_eq!(dec.decode(&mut buf), Ok(Chunk::Done));
    assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n");
}

#[test]
fn data_is_split_off_without_waiting_for_the_whole_chunk() {
    let mut dec = ChunkedDecoder::new();
    let mut buf = BytesMut::from(&b"10\r\nabcd"[..]);
    assert_eq!(dec.decode(&mut buf), Ok(Chunk::Data("abcd".into())));
    assert_eq!(dec.decode(&mut buf), Ok(Chunk::NeedMore));
    buf.extend_from_slice(b"efgh");
    assert_eq!(dec.decode(&mut buf), Ok(Chunk::Data("efgh".into())));
    buf.extend_from_slice(b"ijklmnop\r\n0\r\n\r\n");
    assert_eq!(dec.decode(&mut buf), Ok(Chunk::Data("ijklmnop".into())));
    assert_eq!(dec.decode(&mut buf), Ok(Chunk::Done));
    assert_eq!(dec.decoded_total(), 16);
}

#[test]
fn pipelined_after_body() {
    let (body, done, rest) = whole(b"2\r\nhi\r\n0\r\n\r\nGET /next HTTP/1.1\r\n\r\n").unwrap();
    assert!(done);
    assert_eq!(body, b"hi");
    assert_eq!(rest, b"GET /next HTTP/1.1\r\n\r\n");
}

#[test]
fn incomplete_is_need_more() {
    for input in [
        &b""[..],
        b"5",
        b"5\r",
        b"5\r\nhel",
        b"5\r\nhello",
        b"5\r\nhello\r",
        b"0\r\n",
        b"0\r\nX: y",
        b"0\r\n\r",
    ] {
        let (_, done, _) = whole(input).unwrap();
        assert!(!done, "{:?}", String::from_utf8_lossy(input));
    }
}

#[test]
fn refusals() {
    for input in [
        &b"g\r\n"[..],
        b"\r\n",
        b";ext\r\n",
        b" 5\r\nhello\r\n",
        b"-5\r\n",
        b"0x5\r\n",
        b"5\rhello",
        b"5\r\nhelloX\r\n",
        b"5\r\nhello\rX",
        b"5\r\nhello0\r\n\r\n",
        b"10000000000000000\r\n",
        b"fffffffffffffffff\r\n",
        b"5;a\x00b\r\nhello\r\n",
        b"0\r\nT: a\x00b\r\n\r\n",
        b"0\r\nT: v\rX",
        b"0\r\n\rX",
    ] {
        assert_eq!(status(input), 400, "{:?}", String::from_utf8_lossy(input));
    }
    // Largest u64 size is accepted (the server's body limit refuses it, not the framing).
    let mut dec = ChunkedDecoder::new();
    assert_eq!(
        dec.decode(&mut BytesMut::from(&b"ffffffffffffffff\r\n"[..])),
        Ok(Chunk::NeedMore)
    );
}

#[test]
fn limits() {
    let mut dec = ChunkedDecoder::with_limits(8, 10);
    assert!(run(&mut dec, &[b"5;abc\r\nhello\r\n"]).is_ok());
    let mut dec = ChunkedDecoder::with_limits(8, 10);
    assert_eq!(
        run(&mut dec, &[b"5;abcdefgh\r\n"]).unwrap_err().status(),
        400
    );
    let mut dec = ChunkedDecoder::with_limits(8, 10);
    assert_eq!(
        run(&mut dec, &[b"000000000005\r\n"]).unwrap_err().status(),
        400
    );
    let mut dec = ChunkedDecoder::with_limits(8, 10);
    assert!(run(&mut dec, &[b"0\r\nA: 1\r\nB: 2\r\n\r\n"]).unwrap().1);
    let mut dec = ChunkedDecoder::with_limits(8, 10);
    assert_eq!(
        run(&mut dec, &[b"0\r\nA: 1\r\nB: 2\r\nCCC"])
            .unwrap_err()
            .status(),
        400
    );
    // The default size-line limit refuses an endless extension.
    let mut endless = b"1;".to_vec();
    endless.resize(10_000, b'x');
    assert_eq!(status(&endless), 400);
}

#[test]
fn kept_trailers_split_anywhere() {
    let input: &[u8] = b"3\r\nabc\r\n0\r\nX-One: 1\r\nx-two:  two words \nbad line\r\n\r\n";
    for cut in 0..input.len() {
        let mut dec = ChunkedDecoder::new();
        dec.keep_trailers();
        let (body, done, _) = run(&mut dec, &[&input[..cut], &input[cut..]]).unwrap();
        assert_eq!((body.as_slice(), done), (&b"abc"[..], true));
        let t = dec.take_trailers();
        assert_eq!(
            t,
            vec![
                ("X-One".to_string(), "1".to_string()),
                ("x-two".to_string(), "two words".to_string())
            ]
        );
    }
    // Not asked: nothing kept.
    let mut dec = ChunkedDecoder::new();
    run(&mut dec, &[input]).unwrap();
    assert!(dec.take_trailers().is_empty());
}
