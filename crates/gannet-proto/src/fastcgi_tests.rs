use super::*;
use crate::cgi::ParamSink;

fn record(kind: u8, id: u16, content: &[u8], pad: u8) -> Vec<u8> {
    let mut v = vec![1, kind, (id >> 8) as u8, id as u8];
    v.extend_from_slice(&(content.len() as u16).to_be_bytes());
    v.push(pad);
    v.push(0);
    v.extend_from_slice(content);
    v.extend(std::iter::repeat_n(0u8, usize::from(pad)));
    v
}

#[test]
fn begin_request_bytes() {
    let mut out = Vec::new();
    begin_request(&mut out, true);
    assert_eq!(out, [1, 1, 0, 1, 0, 8, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]);
    out.clear();
    begin_request(&mut out, false);
    assert_eq!(out[10], 0);
}

#[test]
fn params_short_and_long_lengths() {
    let mut out = Vec::new();
    let mut p = Params::new(&mut out);
    p.push(b"SCRIPT_NAME", b"/index.php").unwrap();
    let long = vec![b'x'; 300];
    p.push(b"QUERY_STRING", &long).unwrap();
    p.finish();
    // First record: header, then the pairs.
    assert_eq!(&out[..2], &[1, PARAMS]);
    let len = usize::from(u16::from_be_bytes([out[4], out[5]]));
    let pad = usize::from(out[6]);
    assert_eq!((len + pad) % 8, 0);
    let body = &out[8..8 + len];
    assert_eq!(&body[..2], &[11, 10]);
    assert_eq!(&body[2..13], b"SCRIPT_NAME");
    assert_eq!(&body[13..23], b"/index.php");
    // 300 does not fit in 7 bits: four bytes with the top bit set.
    assert_eq!(&body[23..28], &[12, 0x80, 0, 1, 44]);
    assert_eq!(&body[28..40], b"QUERY_STRING");
    assert_eq!(body.len(), 40 + 300);
    // Then the empty record that ends the stream.
    assert_eq!(&out[out.len() - 8..], &[1, PARAMS, 0, 1, 0, 0, 0, 0]);
}

#[test]
fn no_params_is_only_the_end_of_the_stream() {
    let mut out = vec![9];
    Params::new(&mut out).finish();
    assert_eq!(out, [9, 1, PARAMS, 0, 1, 0, 0, 0, 0]);
}

#[test]
fn params_over_one_record_are_cut_into_records() {
    let mut out = vec![9];
    let mut p = Params::new(&mut out);
    let value = vec![b'v'; 40_000];
    p.push(b"A", &value).unwrap();
    p.push(b"B", &value).unwrap();
    let pairs = p.len();
    p.finish();
    assert_eq!(out[0], 9);
    let (mut pos, mut got, mut lens) = (1, Vec::new(), Vec::new());
    while pos < out.len() {
        assert_eq!(&out[pos..pos + 4], &[1, PARAMS, 0, 1]);
        let len = usize::from(u16::from_be_bytes([out[pos + 4], out[pos + 5]]));
        let pad = usize::from(out[pos + 6]);
        assert_eq!((len + pad) % 8, 0);
        got.extend_from_slice(&out[pos + 8..pos + 8 + len]);
        lens.push(len);
        pos += 8 + len + pad;
    }
    assert_eq!(pos, out.len());
    assert_eq!(lens, [MAX_CONTENT, pairs - MAX_CONTENT, 0]);
    assert_eq!(&got[..6], &[1, 0x80, 0, 0x9c, 0x40, b'A']);
    assert_eq!(got.len(), pairs);
}

#[test]
fn big_streams_are_cut_into_records() {
    let data = vec![7u8; MAX_CONTENT * 2 + 10];
    let mut out = Vec::new();
    stdin(&mut out, &data);
    stdin_end(&mut out);
    let mut total = 0;
    let mut pos = 0;
    let mut records = 0;
    while pos < out.len() {
        let len = usize::from(u16::from_be_bytes([out[pos + 4], out[pos + 5]]));
        let pad = usize::from(out[pos + 6]);
        assert_eq!(out[pos + 1], STDIN);
        total += len;
        records += 1;
        pos += 8 + len + pad;
    }
    assert_eq!(pos, out.len());
    assert_eq!(total, data.len());
    assert_eq!(records, 4);
}

#[test]
fn decodes_records_split_anywhere() {
    let mut wire = record(STDOUT, 1, b"Status: 200 OK\r\n\r\nhi", 6);
    wire.extend(record(STDERR, 1, b"PHP Notice: x", 3));
    wire.extend(record(STDOUT, 1, b"", 0));
    wire.extend(record(END_REQUEST, 1, &[0, 0, 0, 3, 0, 0, 0, 0], 0));
    for cut in 0..wire.len() {
        let mut buf = BytesMut::from(&wire[..cut]);
        let mut got = Vec::new();
        while let Some(r) = decode(&mut buf).unwrap() {
            got.push(r);
        }
        buf.extend_from_slice(&wire[cut..]);
        while let Some(r) = decode(&mut buf).unwrap() {
            got.push(r);
        }
        assert!(buf.is_empty());
        assert_eq!(
            got,
            vec![
                Record::Stdout(Bytes::from_static(b"Status: 200 OK\r\n\r\nhi")),
                Record::Stderr(Bytes::from_static(b"PHP Notice: x")),
                Record::End {
                    app_status: 3,
                    protocol_status: 0
                },
            ],
            "cut at {cut}"
        );
    }
}

#[test]
fn management_records_are_skipped() {
    let mut wire = record(10, 0, b"\x0eFCGI_MPXS_CONNS\x010", 0);
    wire.extend(record(STDOUT, 1, b"x", 7));
    let mut buf = BytesMut::from(&wire[..]);
    assert_eq!(
        decode(&mut buf).unwrap(),
        Some(Record::Stdout(Bytes::from_static(b"x")))
    );
}

#[test]
fn decode_errors() {
    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
    assert_eq!(decode(&mut buf), Err(DecodeError::Version(b'H')));
    let mut buf = BytesMut::from(&record(STDOUT, 2, b"x", 0)[..]);
    assert_eq!(decode(&mut buf), Err(DecodeError::RequestId(2)));
    let mut buf = BytesMut::from(&record(PARAMS, 1, b"", 0)[..]);
    assert_eq!(decode(&mut buf), Err(DecodeError::Type(PARAMS)));
    let mut buf = BytesMut::from(&record(END_REQUEST, 1, &[0, 0], 0)[..]);
    assert_eq!(decode(&mut buf), Err(DecodeError::ShortEnd));
}

#[test]
fn peek_borrows_records_where_they_lie() {
    let mut buf = record(STDOUT, 1, b"Status: 200\r\n\r\nhi", 6);
    let first = buf.len();
    buf.extend(record(STDOUT, 0, b"mgmt", 4));
    buf.extend(record(STDERR, 1, b"", 0));
    buf.extend(record(END_REQUEST, 1, &[0, 0, 0, 7, 0, 0, 0, 0], 0));
    let (r, used) = peek(&buf).unwrap().unwrap();
    assert_eq!(
        (r, used),
        (RecordRef::Stdout(b"Status: 200\r\n\r\nhi"), first)
    );
    let rest = &buf[used..];
    let (r, used) = peek(rest).unwrap().unwrap();
    assert_eq!((r, used), (RecordRef::Skip, 16));
    let (r, used2) = peek(&rest[used..]).unwrap().unwrap();
    assert_eq!((r, used2), (RecordRef::Skip, 8));
    let end = &rest[used + used2..];
    assert_eq!(
        peek(end).unwrap(),
        Some((
            RecordRef::End {
                app_status: 7,
                protocol_status: 0
            },
            16
        ))
    );
    // Cut anywhere before its end, a record is not there yet.
    for cut in 0..end.len() {
        assert_eq!(peek(&end[..cut]).unwrap(), None);
    }
    assert_eq!(
        peek(&[2, 6, 0, 1, 0, 0, 0, 0]),
        Err(DecodeError::Version(2))
    );
}
