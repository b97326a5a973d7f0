use super::*;

fn wire(content_length: usize, pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut h = Headers::new();
    for (n, v) in pairs {
        h.push(n, v).unwrap();
    }
    let mut out = Vec::new();
    request(&mut out, content_length, &h);
    out
}

#[test]
fn netstring_with_content_length_first_then_scgi() {
    let out = wire(
        5,
        &[(b"REQUEST_METHOD", b"POST"), (b"REQUEST_URI", b"/x?a=1")],
    );
    let block =
        b"CONTENT_LENGTH\x005\x00SCGI\x001\x00REQUEST_METHOD\x00POST\x00REQUEST_URI\x00/x?a=1\x00";
    let mut want = format!("{}:", block.len()).into_bytes();
    want.extend_from_slice(block);
    want.push(b',');
    assert_eq!(out, want);
}

#[test]
fn no_params_and_empty_values() {
    assert_eq!(wire(0, &[]), b"24:CONTENT_LENGTH\x000\x00SCGI\x001\x00,");
    let out = wire(12345, &[(b"HTTPS", b"")]);
    assert_eq!(
        out,
        b"35:CONTENT_LENGTH\x0012345\x00SCGI\x001\x00HTTPS\x00\x00,"
    );
}

#[test]
fn fixed_names_are_not_repeated() {
    // nginx's scgi_params sets SCGI; a configured CONTENT_LENGTH would contradict the body.
    let out = wire(
        3,
        &[(b"SCGI", b"1"), (b"CONTENT_LENGTH", b"99"), (b"A", b"b")],
    );
    assert_eq!(out, b"28:CONTENT_LENGTH\x003\x00SCGI\x001\x00A\x00b\x00,");
}

#[test]
fn nul_cannot_be_framed() {
    let mut h = Headers::new();
    assert_eq!(h.push(b"A\0B", b"v"), Err(ParamError::Nul));
    assert_eq!(h.push(b"A", b"v\0w"), Err(ParamError::Nul));
    assert!(h.is_empty(), "a refused pair leaves nothing behind");
    h.push(b"A", b"v").unwrap();
    assert_eq!(h.len(), 4);
}

#[test]
fn big_blocks_have_a_long_length_prefix() {
    let value = vec![b'v'; 100_000];
    let out = wire(0, &[(b"BIG", &value)]);
    let colon = out.iter().position(|&b| b == b':').unwrap();
    let len: usize = std::str::from_utf8(&out[..colon]).unwrap().parse().unwrap();
    assert_eq!(colon + 1 + len + 1, out.len());
    assert_eq!(out.last(), Some(&b','));
}
