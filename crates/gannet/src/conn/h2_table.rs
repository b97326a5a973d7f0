//! A shadow of a client's HPACK dynamic table (RFC 7541 2.3.2), kept by `conn::h2_mend`:
//! each entry's size and whether its name is a pseudo-header (then the name), never the
//! values. It answers two things the mend cannot see without it:
//!
//! - which field a dynamic index names, so that a pseudo-header coming after a regular
//!   field (nginx: "client sent out of order pseudo-headers", 400; the h2 crate resets the
//!   stream as malformed) is found and given on as a regular field, its stream answered 400;
//! - an index past the table, which nginx ends the connection for with COMPRESSION_ERROR
//!   naming the stream (the crate: PROTOCOL_ERROR naming the stream before it).
//!
//! Only what is known to be a regular field counts as one (a static name past the
//! pseudo-headers, a literal name without a colon, an entry shadowed as regular): when the
//! shadow cannot follow the client (a string it cannot decode, a block given on unread), it
//! is lost and decides nothing more. A block that inserts nothing costs one walk over its
//! representations' integers; an inserted field costs its Huffman-coded strings' decoding
//! (their decoded length is their size) and a queue slot.

use super::h2_goaway::COMPRESSION_ERROR;
use std::collections::VecDeque;

/// HPACK's static table length (RFC 7541 A): dynamic indexes start past it.
const STATIC: u64 = 61;
/// The static entries that are pseudo-headers (`:authority` .. `:status`).
const STATIC_PSEUDO: usize = 14;
/// The table size a client may use: gannet's codec advertises no other than the
/// default SETTINGS_HEADER_TABLE_SIZE, and nginx's is the same (NGX_HTTP_V2_TABLE_SIZE).
const DEFAULT_SIZE: usize = 4096;

/// One dynamic entry: its size (RFC 7541 4.1) and, for a pseudo-header, its name.
struct Entry {
    size: usize,
    name_len: usize,
    pseudo: Option<Box<[u8]>>,
    /// A pseudo-header inserted after a regular field of a request, which the codec holds
    /// under a regular name (`conn::h2_mend`): its value's representation.
    renamed: Option<Box<[u8]>>,
}

pub struct Shadow {
    /// Newest first.
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
    /// The client was not followed: nothing is decided any more.
    lost: bool,
}

impl Default for Shadow {
    fn default() -> Shadow {
        Shadow {
            entries: VecDeque::new(),
            size: 0,
            max: DEFAULT_SIZE,
            lost: false,
        }
    }
}

/// A pseudo-header the codec is not to be given as the client sent it: where its
/// representation starts in the block, and its name.
#[derive(Debug, PartialEq, Eq)]
pub struct Late {
    pub at: usize,
    pub name: Box<[u8]>,
    /// After a regular field (else in its place, named from an entry the codec holds under
    /// a regular name: given on under its own).
    pub late: bool,
    /// In its place and indexed: the entry's value representation, as the client sent it.
    pub value: Option<Box<[u8]>>,
}

/// What a name is.
enum Kind {
    Regular,
    /// Its name, and the value's representation of an entry the codec holds renamed.
    Pseudo(Box<[u8]>, Option<Box<[u8]>>),
    Unknown,
}

impl Shadow {
    /// A header block the codec is given without this shadow following it.
    pub fn lose(&mut self) {
        self.lost = true;
        self.entries.clear();
    }

    /// Follow a whole header block (`request`: one opening a request; `block`: its
    /// fragment): the pseudo-headers in it after a regular field and those named from an
    /// entry the codec holds renamed, or the connection error nginx ends the connection with
    /// for an index past the table.
    pub fn walk(&mut self, request: bool, block: &[u8]) -> Result<Vec<Late>, u32> {
        let mut late = Vec::new();
        if self.lost {
            return Ok(late);
        }
        let mut regular = false;
        let mut at = 0;
        while at < block.len() {
            let start = at;
            let b = block[at];
            let (prefix, insert) = match b {
                _ if b & 0x80 != 0 => (7, false),
                _ if b & 0xc0 == 0x40 => (6, true),
                _ if b & 0xe0 == 0x20 => (5, false),
                _ => (4, false),
            };
            let Some((index, n)) = int(&block[at..], prefix) else {
                self.lose();
                return Ok(late);
            };
            at += n;
            if prefix == 5 {
                self.resize(usize::try_from(index).unwrap_or(usize::MAX));
                continue;
            }
            let (kind, name_len) = if prefix != 7 && index == 0 {
                // A literal name.
                let Some((s, huffman, n)) = string(&block[at..]) else {
                    self.lose();
                    return Ok(late);
                };
                at += n;
                let Some(name) = decode(s, huffman) else {
                    self.lose();
                    return Ok(late);
                };
                let kind = if name.first() == Some(&b':') {
                    Kind::Pseudo(name.clone().into_boxed_slice(), None)
                } else {
                    Kind::Regular
                };
                (kind, name.len())
            } else {
                self.name(index)?
            };
            let mut value_len = 0;
            let mut value: &[u8] = &[];
            if prefix != 7 {
                let Some((s, huffman, n)) = string(&block[at..]) else {
                    self.lose();
                    return Ok(late);
                };
                value = &block[at..at + n];
                at += n;
                if insert {
                    let Some(v) = decoded_len(s, huffman) else {
                        self.lose();
                        return Ok(late);
                    };
                    value_len = v;
                }
            }
            let mut renamed = None;
            let pseudo = match kind {
                Kind::Regular => {
                    regular = true;
                    None
                }
                Kind::Pseudo(name, held) => {
                    if regular {
                        late.push(Late {
                            at: start,
                            name: name.clone(),
                            late: true,
                            value: None,
                        });
                        renamed = request.then(|| value.into());
                    } else if held.is_some() {
                        late.push(Late {
                            at: start,
                            name: name.clone(),
                            late: false,
                            value: held.filter(|_| prefix == 7),
                        });
                    }
                    Some(name)
                }
                Kind::Unknown => {
                    // Not known either way: nothing is decided from here on.
                    self.lose();
                    return Ok(late);
                }
            };
            if insert {
                self.insert(name_len, name_len + value_len + 32, pseudo, renamed);
            }
        }
        Ok(late)
    }

    /// What index `index` names (RFC 7541 2.3.3), and its name's length.
    fn name(&self, index: u64) -> Result<(Kind, usize), u32> {
        if index == 0 {
            // nginx's decoder stops on it first (`h2_goaway::hpack_fault`).
            return Ok((Kind::Unknown, 0));
        }
        if index <= STATIC {
            let name = STATIC_NAMES[index as usize - 1];
            let kind = match index as usize <= STATIC_PSEUDO {
                true => Kind::Pseudo(name.as_bytes().into(), None),
                false => Kind::Regular,
            };
            return Ok((kind, name.len()));
        }
        let i = usize::try_from(index - STATIC - 1).unwrap_or(usize::MAX);
        let Some(e) = self.entries.get(i) else {
            return Err(COMPRESSION_ERROR);
        };
        Ok(match &e.pseudo {
            Some(p) => (Kind::Pseudo(p.clone(), e.renamed.clone()), e.name_len),
            None => (Kind::Regular, e.name_len),
        })
    }

    fn insert(
        &mut self,
        name_len: usize,
        size: usize,
        pseudo: Option<Box<[u8]>>,
        renamed: Option<Box<[u8]>>,
    ) {
        if size > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict(self.max - size);
        self.size += size;
        self.entries.push_front(Entry {
            size,
            name_len,
            pseudo,
            renamed,
        });
    }

    fn resize(&mut self, max: usize) {
        self.max = max.min(DEFAULT_SIZE);
        self.evict(self.max);
    }

    fn evict(&mut self, room: usize) {
        while self.size > room {
            match self.entries.pop_back() {
                Some(e) => self.size -= e.size,
                None => self.size = 0,
            }
        }
    }
}

/// An HPACK integer with an `n`-bit prefix and its length in bytes.
fn int(b: &[u8], n: u32) -> Option<(u64, usize)> {
    let max = (1u64 << n) - 1;
    let mut v = u64::from(*b.first()?) & max;
    if v < max {
        return Some((v, 1));
    }
    for (i, &c) in b.iter().enumerate().skip(1).take(4) {
        v += u64::from(c & 0x7f) << (7 * (i - 1));
        if c & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// A string literal: its bytes, whether Huffman-coded, and the representation's length.
pub(super) fn string(b: &[u8]) -> Option<(&[u8], bool, usize)> {
    let huffman = *b.first()? & 0x80 != 0;
    let (len, n) = int(b, 7)?;
    let len = usize::try_from(len).ok()?;
    Some((b.get(n..n.checked_add(len)?)?, huffman, n + len))
}

fn decode(s: &[u8], huffman: bool) -> Option<Vec<u8>> {
    if !huffman {
        return Some(s.to_vec());
    }
    let mut out = Vec::with_capacity(s.len() * 2);
    let s = super::h2_mend::trim_padding(s);
    httlib_huffman::decode(s, &mut out, httlib_huffman::DecoderSpeed::FourBits).ok()?;
    Some(out)
}

fn decoded_len(s: &[u8], huffman: bool) -> Option<usize> {
    if !huffman {
        return Some(s.len());
    }
    decode(s, true).map(|v| v.len())
}

/// The static table's names (RFC 7541 A), for their lengths.
const STATIC_NAMES: [&str; 61] = [
    ":authority",
    ":method",
    ":method",
    ":path",
    ":path",
    ":scheme",
    ":scheme",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "accept",
    "access-control-allow-origin",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-range",
    "content-type",
    "cookie",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "link",
    "location",
    "max-forwards",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "refresh",
    "retry-after",
    "server",
    "set-cookie",
    "strict-transport-security",
    "transfer-encoding",
    "user-agent",
    "vary",
    "via",
    "www-authenticate",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn huff(s: &[u8]) -> Vec<u8> {
        let mut h = Vec::new();
        httlib_huffman::encode(s, &mut h).unwrap();
        let mut out = vec![0x80 | h.len() as u8];
        out.extend(h);
        out
    }

    fn sizes(t: &Shadow) -> Vec<usize> {
        t.entries.iter().map(|e| e.size).collect()
    }

    #[test]
    fn insertions_are_sized_and_evicted_oldest_first() {
        let mut t = Shadow::default();
        // referer: foo (static name 51), x-foo: X-Bar (literal name), each 42 bytes.
        assert_eq!(
            t.walk(true, b"\x82\x73\x03foo\x40\x05x-foo\x05X-Bar"),
            Ok(vec![])
        );
        assert_eq!(sizes(&t), [42, 42]);
        // Without indexing, never indexed, indexed: nothing inserted.
        assert_eq!(
            t.walk(true, b"\x0f\x24\x01a\x10\x01b\x01c\xbe\xbf"),
            Ok(vec![])
        );
        assert_eq!(t.size, 84);
        // A size update to 61 keeps the newest only; 62 then names x-foo, 63 nothing.
        assert_eq!(t.walk(true, b"\x3f\x1e\xbe"), Ok(vec![]));
        assert_eq!(sizes(&t), [42]);
        assert_eq!(t.walk(true, b"\xbf"), Err(COMPRESSION_ERROR));
        // A name past the table in a literal field too.
        assert_eq!(t.walk(true, b"\x7f\x01\x03foo"), Err(COMPRESSION_ERROR));
        // An entry larger than the table empties it.
        assert_eq!(
            t.walk(true, b"\x40\x05x-bar\x20aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
            Ok(vec![])
        );
        assert_eq!((sizes(&t), t.size), (vec![], 0));
        // Back to 4096: a second entry fits beside the first, a name from a dynamic entry
        // counts its length.
        assert_eq!(
            t.walk(true, b"\x3f\xe1\x1f\x40\x01a\x01b\x7e\x02cd"),
            Ok(vec![])
        );
        assert_eq!(sizes(&t), [35, 34]);
        // Over 4096 stays 4096 (the codec's and nginx's limit; nginx's check ends the
        // connection before this).
        t.resize(10_000);
        assert_eq!(t.max, 4096);
    }

    #[test]
    fn huffman_strings_count_their_decoded_length() {
        let mut t = Shadow::default();
        let mut block = vec![0x40];
        block.extend(huff(b"x-forwarded-for"));
        block.extend(huff(b"192.168.100.200"));
        // Over-long padding (a whole byte of ones) is taken as nginx takes it.
        block.push(0x7a);
        let mut ua = huff(b"abc");
        ua[0] += 1;
        ua.push(0xff);
        block.extend(ua);
        assert_eq!(t.walk(true, &block), Ok(vec![]));
        assert_eq!(sizes(&t), [10 + 3 + 32, 15 + 15 + 32]);
    }

    #[test]
    fn pseudo_headers_after_a_regular_field_are_found() {
        let mut t = Shadow::default();
        // :authority inserted (62), then used in place; :method after a regular field.
        let name = |n: &[u8]| Late {
            at: 0,
            name: n.into(),
            late: true,
            value: None,
        };
        assert_eq!(t.walk(true, b"\x82\x41\x01a\xbe\x7a\x01b"), Ok(vec![]));
        let got = t
            .walk(true, b"\x82\x86\x84\x7a\x01c\xc0\x82\x40\x03:xy\x01z")
            .unwrap();
        let at: Vec<_> = got.iter().map(|l| l.at).collect();
        assert_eq!(at, [6, 7, 8]);
        let names: Vec<_> = got.into_iter().map(|l| Late { at: 0, ..l }).collect();
        assert_eq!(names, [name(b":authority"), name(b":method"), name(b":xy")]);
        // The pseudo entry inserted late is still a pseudo-header to the client.
        assert_eq!(t.entries[0].pseudo.as_deref(), Some(&b":xy"[..]));
        // Held renamed by the codec: named from in its place, it is given its name back
        // (its value with it when indexed).
        let got = t.walk(true, b"\xbe\x7e\x01w").unwrap();
        let want = |at, value: Option<&[u8]>| Late {
            at,
            name: b":xy"[..].into(),
            late: false,
            value: value.map(Into::into),
        };
        assert_eq!(got, [want(0, Some(b"\x01z")), want(1, None)]);
        // Not renamed in trailers.
        let mut t = Shadow::default();
        assert_eq!(t.walk(false, b"\x7a\x01c\x41\x01a").unwrap().len(), 1);
        assert_eq!(t.walk(true, b"\xbe"), Ok(vec![]));
    }

    #[test]
    fn what_cannot_be_followed_decides_nothing() {
        let mut t = Shadow::default();
        // A Huffman name that does not decode (EOS inside): lost, later indexes let be.
        assert_eq!(t.walk(true, b"\x40\x84\xff\xff\xff\xff\x01a"), Ok(vec![]));
        assert!(t.lost);
        assert_eq!(t.walk(true, b"\x7a\x01b\xc5\x01\x01a"), Ok(vec![]));
    }
}
