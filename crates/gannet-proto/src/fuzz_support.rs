//! The steps of the `h1_parse` fuzz target, shared with the regression replay test so both
//! exercise exactly the same code. Not part of the API: hidden from the docs.
//!
//! Besides "never panic", it asserts invariants a crash report should catch: parsing a head
//! whole or byte by byte agrees, chunked decoding does not depend on how bytes arrive, and a
//! normalised path survives an encode/parse round trip unchanged.

use bytes::BytesMut;

use crate::h1::chunked::{Chunk, ChunkedDecoder};
use crate::h1::encode::parse_http_date;
use crate::h1::{parse_request, BodyKind, HeaderNames, Limits};
use crate::uri::{parse_target, percent_encode_path};

/// Limits small enough for fuzzed inputs to hit them.
const SMALL: Limits = Limits {
    max_request_line: 64,
    max_header_line: 48,
    max_head: 256,
    max_headers: 4,
    // The other policy than the default, so both are fuzzed.
    names: HeaderNames {
        underscores: true,
        ignore_invalid: false,
    },
};
/// Inputs up to this size also get the (quadratic) byte-by-byte comparison.
const BYTEWISE_MAX: usize = 512;

/// Run one fuzz input through the request parser, body decoders and target parser.
pub fn h1_parse(data: &[u8]) {
    for limits in [Limits::default(), SMALL] {
        run_stream(data, &limits);
        if data.len() <= BYTEWISE_MAX {
            bytewise_agrees(data, &limits);
        }
    }
    chunked_agrees(data);
    let _ = parse_http_date(data);
}

/// Parse pipelined requests until the input runs out or is refused, consuming each body as
/// its framing says; then hand what is left to a chunked decoder.
fn run_stream(data: &[u8], limits: &Limits) {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(head)) = parse_request(&mut buf, limits) {
        assert!(!head.raw().is_empty());
        let _ = (
            head.method_str(),
            head.header("host"),
            head.host(),
            head.header_count(),
        );
        assert_eq!(head.headers().count(), head.header_count());
        check_target(head.target());
        match head.body {
            BodyKind::None => {}
            BodyKind::Length(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
                let _ = buf.split_to(n);
            }
            BodyKind::Chunked => {
                if !drain_chunked(&mut buf) {
                    return;
                }
            }
        }
    }
    drain_chunked(&mut buf);
}

/// Decode a chunked body from `buf`; true if it ended (so a next request may follow).
fn drain_chunked(buf: &mut BytesMut) -> bool {
    let mut dec = ChunkedDecoder::new();
    let mut total = 0u64;
    loop {
        match dec.decode(buf) {
            Ok(Chunk::Data(d)) => {
                assert!(!d.is_empty());
                total += d.len() as u64;
                assert_eq!(dec.decoded_total(), total);
            }
            Ok(Chunk::Done) => return true,
            Ok(Chunk::NeedMore) => {
                assert!(buf.is_empty());
                return false;
            }
            Err(e) => {
                assert_eq!(e.status(), 400);
                return false;
            }
        }
    }
}

/// A target either is refused or yields a normalised path that round-trips.
fn check_target(raw: &[u8]) {
    let Ok(t) = parse_target(raw) else { return };
    if t.path == "*" {
        return;
    }
    assert!(t.path.starts_with('/'), "{:?}", t.path);
    assert!(!t.path.contains("//"), "{:?}", t.path);
    assert!(
        t.path.split('/').all(|s| s != "." && s != ".."),
        "{:?}",
        t.path
    );
    let again = parse_target(percent_encode_path(&t.path).as_bytes()).map(|t| t.path);
    assert_eq!(again.as_deref(), Ok(t.path.as_str()));
}

/// The first head parsed from the whole input and from the input fed one byte at a time
/// must agree: both refused, both incomplete, or the same head.
fn bytewise_agrees(data: &[u8], limits: &Limits) {
    let whole = parse_request(&mut BytesMut::from(data), limits);
    let mut buf = BytesMut::new();
    for (i, &c) in data.iter().enumerate() {
        buf.extend_from_slice(&[c]);
        match parse_request(&mut buf, limits) {
            Ok(None) => {}
            Ok(Some(h)) => {
                let w = whole.as_ref().ok().and_then(Option::as_ref);
                let w = w.unwrap_or_else(|| panic!("byte-wise head at {i}, whole {whole:?}"));
                assert_eq!(h.raw(), w.raw());
                assert_eq!((h.method, h.version, h.body), (w.method, w.version, w.body));
                assert_eq!(
                    (h.keep_alive, h.expect_continue),
                    (w.keep_alive, w.expect_continue)
                );
                return;
            }
            Err(e) => {
                assert!(whole.is_err(), "byte-wise {e:?} at {i}, whole {whole:?}");
                return;
            }
        }
    }
    assert!(
        matches!(whole, Ok(None)),
        "byte-wise incomplete, whole {whole:?}"
    );
}

/// Chunked decoding of the whole input and of single bytes gives the same body and outcome.
fn chunked_agrees(data: &[u8]) {
    let (whole_body, whole_end) = decode_pieces(data, data.len().max(1));
    let (byte_body, byte_end) = decode_pieces(data, 1);
    assert_eq!(whole_body, byte_body);
    assert_eq!(whole_end, byte_end);
}

/// Body bytes and how decoding ended: `Some(Ok(rest_len))` for Done, `Some(Err(()))` for
/// an error, `None` for input exhausted.
fn decode_pieces(data: &[u8], piece: usize) -> (Vec<u8>, Option<Result<usize, ()>>) {
    let mut dec = ChunkedDecoder::new();
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut pieces = data.chunks(piece);
    loop {
        match dec.decode(&mut buf) {
            Ok(Chunk::Data(d)) => body.extend_from_slice(&d),
            Ok(Chunk::Done) => {
                let rest = buf.len() + pieces.map(<[u8]>::len).sum::<usize>();
                return (body, Some(Ok(rest)));
            }
            Ok(Chunk::NeedMore) => match pieces.next() {
                Some(p) => buf.extend_from_slice(p),
                None => return (body, None),
            },
            Err(_) => return (body, Some(Err(()))),
        }
    }
}
