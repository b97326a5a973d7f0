use super::*;

#[test]
fn header_and_variables_little_endian() {
    let mut v = Vars::new();
    v.push(b"REQUEST_METHOD", b"GET").unwrap();
    v.push(b"QUERY_STRING", b"").unwrap();
    let mut out = Vec::new();
    request(&mut out, 0, 0, &v);
    let mut want = vec![0u8, 37, 0, 0];
    want.extend_from_slice(b"\x0e\x00REQUEST_METHOD\x03\x00GET");
    want.extend_from_slice(b"\x0c\x00QUERY_STRING\x00\x00");
    assert_eq!(out, want);
    assert_eq!(
        usize::from(u16::from_le_bytes([out[1], out[2]])),
        out.len() - 4
    );
}

#[test]
fn modifiers_and_an_empty_block() {
    let mut out = Vec::new();
    request(&mut out, 5, 9, &Vars::new());
    assert_eq!(out, [5, 0, 0, 9]);
}

#[test]
fn lengths_over_255_use_both_bytes() {
    let mut v = Vars::new();
    let value = vec![b'x'; 0x1234];
    v.push(b"K", &value).unwrap();
    let mut out = Vec::new();
    request(&mut out, 0, 0, &v);
    assert_eq!(&out[..4], &[0, 0x39, 0x12, 0]);
    assert_eq!(&out[4..7], b"\x01\x00K");
    assert_eq!(&out[7..9], &[0x34, 0x12]);
    assert_eq!(out.len(), 4 + 3 + 2 + 0x1234);
}

#[test]
fn block_over_64k_is_refused() {
    let mut v = Vars::new();
    // 4 length bytes + 1 + value fills the block exactly.
    let value = vec![b'a'; MAX_VARS - 5];
    v.push(b"A", &value).unwrap();
    assert_eq!(v.len(), MAX_VARS);
    assert_eq!(v.push(b"", b""), Err(ParamError::TooBig));
    assert_eq!(
        v.len(),
        MAX_VARS,
        "a refused variable leaves nothing behind"
    );

    let mut v = Vars::new();
    assert_eq!(v.push(b"A", &[b'a'; MAX_VARS - 4]), Err(ParamError::TooBig));
    assert_eq!(v.push(&[b'n'; 70_000], b""), Err(ParamError::TooBig));
    assert_eq!(v.push(b"", &[b'v'; 70_000]), Err(ParamError::TooBig));
    assert!(v.is_empty());
}
