//! The usual request head in one pass, without httparse: `METHOD target HTTP/1.x`, then
//! fields named by letters, digits and `-`, values of printable ASCII, CRLF line ends, all
//! within the limits. Hand-written because this is every keep-alive request's first work:
//! httparse walks the head into its header slots, then `parse_with` and `finish` walk the
//! slots again to turn them into offsets and check each name (about 700 instructions for
//! h2load's three fields, callgrind; docs/bench/cost-per-request.md); here the offsets go
//! straight into the head's index as the bytes are seen.
//!
//! It accepts only heads that httparse takes the same way (each byte class here is a subset
//! of httparse's: a method of upper-case letters, a target of visible ASCII, a value that
//! neither starts nor ends with white space, so that httparse's trimming changes nothing),
//! and declines everything else (`None`): an odd byte, a bare LF, a tab, an empty value, a
//! limit reached, an incomplete head. The general path then parses it as before, so the
//! answer to a head never depends on which path took it (`plain_tests`).

use super::parse::{Fail, Index, Limits, Parsed, Version};
use super::reqline::RequestLine;

/// Parse `b` as a plain head with at most `max_fields` fields (see the module docs);
/// `None`: not one, left to the general path.
pub(super) fn parse(b: &[u8], limits: &Limits, max_fields: usize) -> Option<Result<Parsed, Fail>> {
    let method_end = b.iter().position(|&c| !c.is_ascii_uppercase())?;
    if method_end == 0 || b[method_end] != b' ' {
        return None;
    }
    let t = method_end + 1;
    let target_end = t + run(&b[t..], 0x21)?;
    if target_end == t || b[target_end] != b' ' {
        return None;
    }
    let v = target_end + 1;
    let version = match b.get(v..v + 10)? {
        b"HTTP/1.1\r\n" => Version::Http11,
        b"HTTP/1.0\r\n" => Version::Http10,
        _ => return None,
    };
    let line_len = v + 8;
    if line_len > limits.max_request_line {
        return None;
    }
    let mut index = super::parse::take_index(8);
    match fields(b, v + 10, limits, max_fields, &mut index) {
        Some((len, conditional)) => {
            let line = RequestLine {
                method: 0..method_end,
                target: t..target_end,
                version,
                len: line_len,
            };
            Some(
                super::fields::interpret(b, version, &index)
                    .map(|fields| Parsed {
                        len,
                        line,
                        headers: index,
                        ignored: Vec::new(),
                        fields,
                        conditional,
                    })
                    .map_err(Fail::Parse),
            )
        }
        None => {
            super::parse::give_index(index);
            None
        }
    }
}

/// The field lines from `at` to the empty line: the head's length and whether a name
/// starts with `If-`, the fields' ranges in `index`; `None` to decline.
fn fields(
    b: &[u8],
    mut at: usize,
    limits: &Limits,
    max_fields: usize,
    index: &mut Index,
) -> Option<(usize, bool)> {
    let mut conditional = false;
    loop {
        if b.get(at)? == &b'\r' {
            if b.get(at + 1)? != &b'\n' {
                return None;
            }
            let len = at + 2;
            return (len <= limits.max_head).then_some((len, conditional));
        }
        let name_len = b[at..].iter().position(|&c| !is_name_byte(c))?;
        let colon = at + name_len;
        if name_len == 0 || b[colon] != b':' {
            return None;
        }
        let mut vs = colon + 1;
        while b.get(vs)? == &b' ' {
            vs += 1;
        }
        let cr = vs + run(&b[vs..], 0x20)?;
        // A value that is empty or ends with a space: httparse trims; declined here.
        if cr == vs || b[cr - 1] == b' ' || b[cr] != b'\r' || b.get(cr + 1)? != &b'\n' {
            return None;
        }
        if cr - at > limits.max_header_line || index.len() == max_fields {
            return None;
        }
        conditional |= b
            .get(at..at + 3)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"if-"));
        index.push((at..colon, vs..cr));
        at = cr + 2;
    }
}

/// Letters, digits and `-`: a name every `underscores_in_headers` / `ignore_invalid_headers`
/// setting keeps as it is (see `HeaderNames::drops`). By nginx's table: a compare a byte
/// was three tests.
fn is_name_byte(c: u8) -> bool {
    super::parse::NAME_CLASS[usize::from(c)] == 1
}

/// The length of the run of bytes from `lo` to `~` at the start of `v`, up to the byte that
/// is not one; `None` when every byte is (the line is not complete). Eight bytes at a time:
/// targets and values (a user agent, cookies) are most of a head's bytes.
fn run(v: &[u8], lo: u8) -> Option<usize> {
    let mut i = 0;
    while let Some(w) = v.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        let flags = outside(u64::from_le_bytes(word), lo);
        if flags != 0 {
            return Some(i + (flags.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    v[i..]
        .iter()
        .position(|&c| !(lo..=0x7e).contains(&c))
        .map(|n| i + n)
}

/// The high bit of each byte of `x` that is below `lo` (0x20 or 0x21 here) or above 0x7e.
/// A borrow or carry can flag a byte that is fine, but only above one that is not, so the
/// lowest flag always marks the first such byte.
fn outside(x: u64, lo: u8) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = x.wrapping_sub(ONES * u64::from(lo)) & !x & HIGH;
    let above = (x.wrapping_add(ONES) | x) & HIGH;
    below | above
}
