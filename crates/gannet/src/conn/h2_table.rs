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

/// A pseudo-header after a regular field: where its representation starts in the block,
/// and its name.
#[derive(Debug, PartialEq, Eq)]
pub struct Late {
    pub at: usize,
    pub name: Box<[u8]>,
}

/// What a name is.
enum Kind {
    Regular,
    Pseudo(Box<[u8]>),
    Unknown,
}

impl Shadow {
    /// A header block the codec is given without this shadow following it.
    pub fn lose(&mut self) {
        self.lost = true;
        self.entries.clear();
    }

    /// Follow a whole header block (`block`: its fragment): the pseudo-headers in it after a
    /// regular field, or the connection error nginx ends the connection with for an index
    /// past the table.
    pub fn walk(&mut self, block: &[u8]) -> Result<Vec<Late>, u32> {
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
                    Kind::Pseudo(name.clone().into_boxed_slice())
                } else {
                    Kind::Regular
                };
                (kind, name.len())
            } else {
                self.name(index)?
            };
            let mut value_len = 0;
            if prefix != 7 {
                let Some((s, huffman, n)) = string(&block[at..]) else {
                    self.lose();
                    return Ok(late);
                };
                at += n;
                if insert {
                    let Some(v) = decoded_len(s, huffman) else {
                        self.lose();
                        return Ok(late);
                    };
                    value_len = v;
                }
            }
            let pseudo = match kind {
                Kind::Regular => {
                    regular = true;
                    None
                }
                Kind::Pseudo(name) => {
                    if regular {
                        late.push(Late {
                            at: start,
                            name: name.clone(),
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
                self.insert(name_len, name_len + value_len + 32, pseudo);
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
                true => Kind::Pseudo(name.as_bytes().into()),
                false => Kind::Regular,
            };
            return Ok((kind, name.len()));
        }
        let i = usize::try_from(index - STATIC - 1).unwrap_or(usize::MAX);
        let Some(e) = self.entries.get(i) else {
            return Err(COMPRESSION_ERROR);
        };
        Ok(match &e.pseudo {
            Some(p) => (Kind::Pseudo(p.clone()), e.name_len),
            None => (Kind::Regular, e.name_len),
        })
    }

    fn insert(&mut self, name_len: usize, size: usize, pseudo: Option<Box<[u8]>>) {
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
