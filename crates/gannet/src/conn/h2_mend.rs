//! HPACK strings with over-long Huffman padding, mended before the h2 crate reads them.
//!
//! RFC 7541 5.2 calls padding longer than 7 bits a decoding error, and the h2 crate ends
//! the connection on it (GOAWAY PROTOCOL_ERROR: a request or an upstream's answer lost).
//! nginx's decoder takes it: a string whose code ends on a byte boundary padded with a
//! whole byte of ones (an empty value coded as the single byte 0xff, as some encoders and
//! nginx's own test suite write them) is read as meant. So that gannet takes what nginx
//! takes, this reader sits under the codec, on a client's connection and on a gRPC
//! upstream's, and drops such surplus bytes from each Huffman string of a header block.
//!
//! On a client's connection it also finds what nginx answers 400 but the h2 crate would
//! take for a connection error (GOAWAY, every stream on it lost): a field name with a
//! space, a control character or a colon (past a pseudo-header's first), a plain (not
//! Huffman-coded) value with NUL, CR or LF (nginx's ngx_http_v2_validate_header). Such a
//! field is given on made lawful (those bytes as `-` in a name, upper case lowered, and as
//! a space in a value, so that the dynamic table keeps its size) and its stream is noted in
//! [`Refused`], which the stream's handler answers 400. A name whose only fault is upper
//! case is left to the codec: RFC 9113 wants an error there (h2spec's 8.1.2 checks it).
//!
//! Frames pass through as they are read, payloads unread, but for HEADERS and
//! CONTINUATION: a header block is held until its END_HEADERS, walked representation by
//! representation (no table is needed for that), and given on unchanged unless a string
//! was mended; a mended block goes on as one HEADERS frame (no padding; CONTINUATION frames
//! past 16 KiB). The dynamic table is the same either way: it holds decoded strings. Header
//! blocks are all this reader copies; DATA passes through unread.
//!
//! On a client's connection it also does `conn::h2_goaway`'s part ([`Guard`]): frames nginx
//! ends the connection for are judged by their headers (and header blocks by their
//! representations) before the codec sees them, frames on streams after a GOAWAY are
//! dropped, and a request's header block not whole within `client_header_timeout` gets its
//! stream reset.

use super::h2_goaway::{self, Guard, Screen};
use super::h2_priority::{Priorities, CONNECTION_ERROR};
use super::h2_table::{string, Late, Shadow};
use super::h2_window::{Allow, Windows};
use bytes::{BufMut, BytesMut};
use std::borrow::Cow;
use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The PRIORITY frame type (`conn::h2_priority` reads them on a client's connection).
const PRIORITY_FRAME: u8 = 0x2;
const SETTINGS: u8 = 0x4;
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;
/// A header block longer than this is given on as it came (the codec's own limits apply).
const MAX_BLOCK: usize = 256 * 1024;
/// The largest frame payload either side of gannet accepts by default (SETTINGS_MAX_FRAME_SIZE).
const MAX_FRAME: usize = 16 * 1024;

/// The streams of a connection whose request is to be answered 400 (see the module docs),
/// and each request's header block length (nginx's `$request_length` before the body: the
/// HEADERS and CONTINUATION payloads without padding or priority).
#[derive(Default)]
pub struct Refused {
    ids: RefCell<Vec<(u32, Fault)>>,
    lens: RefCell<Vec<(u32, u32)>>,
    /// `http2_body_preread_size` is under HTTP/2's default window: a stream that opens
    /// with a body before the client acknowledged the server's SETTINGS is refused.
    pub early_bodies_refused: std::cell::Cell<bool>,
}

/// What a request's header block had that the codec would not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing (or only surplus Huffman padding).
    Lawful,
    /// The method CONNECT, which the codec resets (it wants no :scheme and :path with it)
    /// and nginx answers 405: given on as OPTIONS (the same length, so the dynamic table
    /// keeps its size), the request then refused as CONNECT.
    Connect,
    /// A field nginx answers 400.
    Invalid,
    /// A body coming before the client acknowledged SETTINGS that offered a stream window
    /// under the default (nginx: RST_STREAM REFUSED_STREAM, "client sent stream with data
    /// before settings were acknowledged"; the client may have sent more than the window).
    Unacked,
}

impl Refused {
    /// What stream `id` was noted for, if anything (it is forgotten then).
    pub fn take(&self, id: u32) -> Option<Fault> {
        let mut ids = self.ids.borrow_mut();
        let found = ids.iter().position(|&(s, _)| s == id);
        found.map(|i| ids.swap_remove(i).1)
    }

    /// The length of stream `id`'s header block (forgotten then).
    pub fn block_len(&self, id: u32) -> Option<u32> {
        let mut lens = self.lens.borrow_mut();
        let found = lens.iter().position(|&(s, _)| s == id);
        found.map(|i| lens.swap_remove(i).1)
    }

    fn note(&self, id: u32, fault: Fault) {
        keep_last(&mut self.ids.borrow_mut(), (id, fault));
    }

    fn note_len(&self, id: u32, len: usize) {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        keep_last(&mut self.lens.borrow_mut(), (id, len));
    }
}

/// Streams the codec refuses before they are handled are never taken: the oldest notes go
/// first.
fn keep_last<T>(notes: &mut Vec<T>, note: T) {
    if notes.len() >= 64 {
        notes.remove(0);
    }
    notes.push(note);
}

/// The header block's own bytes in `frames` (a HEADERS frame and its CONTINUATION frames):
/// the payloads without the pad length, the padding and the priority fields.
fn block_len(frames: &[u8]) -> usize {
    let mut at = 0;
    let mut len = 0;
    while let Some(h) = frames.get(at..at + 9) {
        let n = frame_len(h);
        let mut own = n;
        if h[3] == HEADERS {
            if h[4] & PADDED != 0 {
                let pad = frames.get(at + 9).map_or(0, |&p| usize::from(p));
                own = own.saturating_sub(1 + pad);
            }
            if h[4] & PRIORITY != 0 {
                own = own.saturating_sub(5);
            }
        }
        len += own;
        at += 9 + n;
    }
    len
}

pub struct HpackMend<IO> {
    io: IO,
    /// A client's connection: its fields are checked as nginx checks them.
    refused: Option<Rc<Refused>>,
    /// Payload bytes of the current (passed-through) frame still to come.
    skip: usize,
    /// Bytes read but not yet given on: from a frame header whose frame is not known yet,
    /// or a header block not yet complete.
    held: BytesMut,
    /// Bytes ready to be given on, before anything else.
    ready: BytesMut,
    /// The highest stream a header block came on.
    last_sid: u32,
    /// On a client's connection: nginx's connection errors, GOAWAY and header timeout
    /// (`conn::h2_goaway`).
    guard: Option<Box<Guard>>,
    /// On a client's connection: where PRIORITY frames and requests' priority fields go.
    prio: Option<Rc<Priorities>>,
    /// The client acknowledged the server's SETTINGS.
    acked: bool,
    /// On a client's connection: the shadow of its HPACK dynamic table (`conn::h2_table`).
    table: Option<Box<Shadow>>,
    /// On a client's connection: request bodies' windows as nginx keeps them
    /// (`conn::h2_window`).
    windows: Option<Rc<Windows>>,
    /// A DATA frame past its stream's window, being given on in pieces within it.
    carve: Option<Carve>,
}

/// What is left of a DATA frame being cut (its header already taken).
struct Carve {
    sid: u32,
    left: usize,
    /// Its END_STREAM flag, for the last piece.
    end: u8,
}

impl<IO> HpackMend<IO> {
    /// `skip`: the bytes before the first frame (a client's 24-byte preface); `refused`:
    /// on a client's connection, where the streams to answer 400 are noted.
    pub fn new(io: IO, skip: usize, refused: Option<Rc<Refused>>) -> HpackMend<IO> {
        HpackMend {
            io,
            refused,
            skip,
            held: BytesMut::new(),
            ready: BytesMut::new(),
            last_sid: 0,
            guard: None,
            prio: None,
            acked: false,
            table: None,
            windows: None,
            carve: None,
        }
    }

    /// On a client's connection: DATA is given to the codec within each body's window as
    /// nginx keeps it (`conn::h2_window`).
    pub fn with_windows(mut self, windows: Rc<Windows>) -> HpackMend<IO> {
        self.windows = Some(windows);
        self
    }

    /// Whether a DATA frame with header `h` goes to the codec whole (counted in its
    /// stream's window), rather than cut by `carve`. A padded frame always goes whole (the
    /// codec judges it).
    fn data_whole(&self, h: &[u8]) -> bool {
        let Some(w) = &self.windows else {
            return true;
        };
        if h[3] != DATA {
            return true;
        }
        let end = h[4] & END_STREAM != 0;
        if h[4] & PADDED != 0 {
            w.given(frame_sid(h), frame_len(h), end);
            return true;
        }
        w.take_whole(frame_sid(h), frame_len(h), end)
    }

    /// Give on the frame being cut, piece by piece, as far as its stream's window lets
    /// it: each piece's header goes to `ready` with what `held` has of its payload, the
    /// rest of the payload passed through (`skip`). Returns false when the window is shut
    /// (the reader then waits for it).
    fn carve(&mut self) -> bool {
        while self.skip == 0 {
            let Some(c) = &mut self.carve else {
                return true;
            };
            if c.left == 0 {
                self.carve = None;
                return true;
            }
            let allow = self.windows.as_ref().map_or(Allow::All, |w| w.allow(c.sid));
            let k = match allow {
                Allow::Wait => return false,
                Allow::Upto(n) => n.min(c.left).min(MAX_FRAME),
                Allow::All => c.left.min(MAX_FRAME),
            };
            c.left -= k;
            let flags = if c.left == 0 { c.end } else { 0 };
            if let Some(w) = &self.windows {
                w.given(c.sid, k, flags & END_STREAM != 0);
            }
            self.ready.put_uint(k as u64, 3);
            self.ready.put_u8(DATA);
            self.ready.put_u8(flags);
            self.ready.put_u32(c.sid);
            let have = k.min(self.held.len());
            let piece = self.held.split_to(have);
            self.ready.extend_from_slice(&piece);
            self.skip = k - have;
        }
        true
    }

    /// A frame is being cut and its window is shut: nothing more is read until it opens.
    fn carve_stalled(&self) -> bool {
        match (&self.carve, &self.windows) {
            (Some(c), Some(w)) => self.skip == 0 && c.left > 0 && w.allow(c.sid) == Allow::Wait,
            _ => false,
        }
    }

    /// On a client's connection: frames nginx ends the connection for, frames after a
    /// GOAWAY and late header blocks are dealt with as `conn::h2_goaway` says.
    pub fn guarded(mut self, guard: Guard) -> HpackMend<IO> {
        self.guard = Some(Box::new(guard));
        self.table = Some(Box::default());
        self
    }

    /// Whether a frame with header `h` is to be held for `settle` to judge.
    fn held_back(&self, h: &[u8]) -> bool {
        matches!(h[3], HEADERS | CONTINUATION)
            || (h[3] == PRIORITY_FRAME && self.prio.is_some())
            || self
                .guard
                .as_ref()
                .is_some_and(|g| g.wire.screen(h) != Screen::Pass)
    }

    /// A connection error nginx ends the connection with: the codec is given a frame it
    /// ends it on (its GOAWAY then written with `code`), and nothing more.
    fn abort(&mut self, code: u32) {
        if let Some(g) = &mut self.guard {
            g.wire.condemn(code);
            g.ended = true;
            self.held.clear();
            self.ready.extend_from_slice(&h2_goaway::TRIGGER);
        }
    }

    /// Stream `sid`'s header block did not come whole in time: the codec is given an empty
    /// one on it, which it resets (RST_STREAM PROTOCOL_ERROR, as nginx's), and the rest is
    /// then given on as trailers of the reset stream (its table updates kept, the stream
    /// ignored).
    fn late(&mut self, sid: u32) {
        self.last_sid = sid;
        if let Some(g) = &self.guard {
            g.wire.started(sid);
        }
        self.ready.extend_from_slice(&h2_goaway::empty_headers(sid));
    }

    /// On a client's connection, a request's header block held, not yet whole: its timer is
    /// started (`client_header_timeout`), and what nginx's decoder already stops on in it
    /// (an over-long integer) is returned.
    fn early_fault(&mut self) -> Option<u32> {
        let g = self.guard.as_mut()?;
        let h = self.held.get(..9)?;
        if h[3] != HEADERS {
            return None;
        }
        let sid = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
        if sid % 2 == 1 && sid > self.last_sid && g.wire.screen(h) == Screen::Pass {
            g.waiting(sid);
        }
        let (flags, len) = (h[4], frame_len(h));
        if flags & END_HEADERS == 0 {
            return None;
        }
        let avail = &self.held[9..self.held.len().min(9 + len)];
        let (mut from, mut total) = (0, len);
        if flags & PADDED != 0 {
            total = total.checked_sub(1 + usize::from(*avail.first()?))?;
            from = 1;
        }
        if flags & PRIORITY != 0 {
            total = total.checked_sub(5)?;
            from += 5;
        }
        let frag = avail.get(from..)?;
        let fault = h2_goaway::hpack_fault(&frag[..frag.len().min(total)], total, g.field_max);
        if fault.is_some() {
            // nginx has taken the stream at its frame header: the GOAWAY names it.
            g.wire.started(sid);
        }
        fault
    }

    /// Stream priorities are noted in `prio` (`conn::h2_priority`).
    pub fn with_priorities(mut self, prio: Rc<Priorities>) -> HpackMend<IO> {
        self.prio = Some(prio);
        self
    }

    /// Follow the frames through `data` (just read, not yet held): the offset from which
    /// bytes must be held (a frame header that may open a header block), if any.
    fn pass(&mut self, data: &[u8]) -> Option<usize> {
        let mut at = 0;
        loop {
            let n = self.skip.min(data.len() - at);
            self.skip -= n;
            at += n;
            if at == data.len() {
                return None;
            }
            if self.guard.as_ref().is_some_and(|g| g.drop > 0) || self.carve.is_some() {
                return Some(at);
            }
            let Some(h) = data.get(at..at + 9) else {
                return Some(at);
            };
            if self.held_back(h) || !self.data_whole(h) {
                return Some(at);
            }
            self.acked |= is_settings_ack(h);
            self.skip = frame_len(h);
            at += 9;
        }
    }

    /// Move what `held` starts with to `ready`: frames that open no header block (then
    /// passed on as in `pass`), and complete header blocks, mended. Stops at a frame header
    /// or a header block not yet complete.
    fn settle(&mut self) {
        loop {
            if let Some(g) = &mut self.guard {
                if g.ended {
                    self.held.clear();
                }
                let n = g.drop.min(self.held.len());
                let _ = self.held.split_to(n);
                g.drop -= n;
                if g.drop > 0 {
                    return;
                }
            }
            if self.carve.is_some() && (!self.carve() || self.skip > 0) {
                return;
            }
            if self.held.len() < 9 {
                return;
            }
            let h = &self.held[..9];
            if let (PRIORITY_FRAME, 5, Some(prio)) = (h[3], frame_len(h), &self.prio) {
                if self.held.len() < 14 {
                    return;
                }
                let mut frame = self.held.split_to(14);
                prio.priority_frame(&mut frame);
                self.ready.extend_from_slice(&frame);
                continue;
            }
            if !matches!(h[3], HEADERS | CONTINUATION) {
                self.acked |= is_settings_ack(h);
                let len = frame_len(h);
                match self.guard.as_ref().map(|g| g.wire.screen(h)) {
                    Some(Screen::Abort(code)) => {
                        self.abort(code);
                        return;
                    }
                    Some(Screen::Drop) => {
                        let take = (9 + len).min(self.held.len());
                        let _ = self.held.split_to(take);
                        if let Some(g) = &mut self.guard {
                            g.drop = 9 + len - take;
                        }
                        continue;
                    }
                    _ => {}
                }
                if !self.data_whole(&self.held[..9]) {
                    // Past its stream's window: given on in pieces (`conn::h2_window`).
                    let h = self.held.split_to(9);
                    let (sid, end) = (frame_sid(&h), h[4] & END_STREAM);
                    self.carve = Some(Carve {
                        sid,
                        left: len,
                        end,
                    });
                    continue;
                }
                let take = (9 + len).min(self.held.len());
                self.skip = 9 + len - take;
                let piece = self.held.split_to(take);
                self.ready.extend_from_slice(&piece);
                if self.skip > 0 {
                    return;
                }
                continue;
            }
            let Some(end) = block_end(&self.held) else {
                if let Some(code) = self.early_fault() {
                    self.abort(code);
                    return;
                }
                if self.held.len() > MAX_BLOCK {
                    // Too long to hold: given on as it came, the rest passed through.
                    if let Some(t) = &mut self.table {
                        t.lose();
                    }
                    let len = frame_len(&self.held[..9]);
                    let take = (9 + len).min(self.held.len());
                    self.skip = 9 + len - take;
                    let piece = self.held.split_to(take);
                    self.ready.extend_from_slice(&piece);
                    if self.skip > 0 {
                        return;
                    }
                    continue;
                }
                return;
            };
            let block = self.held.split_to(end);
            let check = self.refused.is_some();
            // A client's streams only go up: a block on a higher one opens a request, one
            // on a stream seen already is trailers.
            let h = &block[5..9];
            let sid = u32::from_be_bytes([h[0] & 0x7f, h[1], h[2], h[3]]);
            let request = block[3] == HEADERS && sid > self.last_sid;
            let mut fault = None;
            let mut late = Vec::new();
            if let Some(g) = &mut self.guard {
                g.whole(sid);
                if g.wire.screen(&block[..9]) == Screen::Drop {
                    continue;
                }
                if request {
                    g.wire.started(sid);
                }
                // What nginx's decoder stops on (even streams are the codec's error).
                let frag = fragment(&block);
                fault = (sid % 2 == 1)
                    .then_some(frag.as_ref())
                    .flatten()
                    .and_then(|(_, f)| h2_goaway::hpack_fault(f, f.len(), g.field_max));
                // The dynamic table followed, an index past it found (`conn::h2_table`).
                match (&mut self.table, &frag, fault) {
                    (Some(t), Some((_, f)), None) => match t.walk(request, f) {
                        Ok(l) => late = l,
                        Err(code) => fault = Some(code),
                    },
                    (Some(t), None, _) => t.lose(),
                    _ => {}
                }
            }
            if let Some(code) = fault {
                self.abort(code);
                return;
            }
            if request {
                self.last_sid = sid;
                if let (0, Some(w)) = (block[4] & END_STREAM, &self.windows) {
                    w.body_expected(sid);
                }
                if let Some(r) = &self.refused {
                    r.note_len(sid, block_len(&block));
                    if !self.acked && block[4] & END_STREAM == 0 && r.early_bodies_refused.get() {
                        r.note(sid, Fault::Unacked);
                    }
                }
                if self.prio.as_ref().is_some_and(|p| !p.request(&block)) {
                    // It depends on itself: the connection ends (`conn::h2_priority`).
                    self.ready.extend_from_slice(&CONNECTION_ERROR);
                    continue;
                }
            }
            match mend_block(&block, check, request, &late) {
                Some((frame, fault)) => {
                    if let (true, Some(r)) = (fault != Fault::Lawful, &self.refused) {
                        let h = &frame[5..9];
                        r.note(u32::from_be_bytes([h[0] & 0x7f, h[1], h[2], h[3]]), fault);
                    }
                    self.ready.extend_from_slice(&frame);
                }
                None => self.ready.extend_from_slice(&block),
            }
        }
    }
}

/// A frame header of a SETTINGS frame with ACK.
fn is_settings_ack(h: &[u8]) -> bool {
    h[3] == SETTINGS && h[4] & ACK != 0
}

/// The stream a frame header `h` (9 bytes) names.
pub(super) fn frame_sid(h: &[u8]) -> u32 {
    u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]])
}

/// The payload length a frame header `h` (9 bytes) announces; shared by every reader over
/// the HTTP/2 byte stream (the mend, the flood guard, the GOAWAY and reset watchers).
pub(super) fn frame_len(h: &[u8]) -> usize {
    usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2])
}

/// Where the header block that `buf` starts with ends (after the frame with END_HEADERS),
/// once all of it is in `buf`.
fn block_end(buf: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let h = buf.get(at..at + 9)?;
        let end = at + 9 + frame_len(h);
        if end > buf.len() {
            return None;
        }
        if h[4] & END_HEADERS != 0 {
            return Some(end);
        }
        at = end;
        // A block goes on in CONTINUATION frames only (anything else is the codec's error
        // to find): given on as it is, up to here.
        if buf.get(at + 3).is_some_and(|&t| t != CONTINUATION) {
            return Some(at);
        }
    }
}

/// The header block in `frames` (a HEADERS frame, then CONTINUATION frames) as one HEADERS
/// frame with its over-long Huffman padding dropped (and with `check`, its fields nginx
/// refuses made lawful: then `true`; `request`: it opens a request); `None` when nothing
/// needed mending or the block is not one this reader understands (then the codec judges
/// it).
fn mend_block(
    frames: &[u8],
    check: bool,
    request: bool,
    late: &[Late],
) -> Option<(BytesMut, Fault)> {
    let h = &frames[..9];
    if h[3] != HEADERS {
        return None;
    }
    let (flags, sid) = (h[4], &h[5..9]);
    let (prefix, block) = fragment(frames)?;
    let (mended, fault) = mend_fields_late(&block, check, request, late)?;
    // One HEADERS frame, then CONTINUATION frames past the largest frame.
    let mut out = BytesMut::with_capacity(prefix.len() + mended.len() + 9);
    let first = mended.len().min(MAX_FRAME - prefix.len());
    let (head, mut rest) = mended.split_at(first);
    let end = if rest.is_empty() { END_HEADERS } else { 0 };
    out.put_uint((prefix.len() + head.len()) as u64, 3);
    out.put_u8(HEADERS);
    out.put_u8((flags & !(PADDED | END_HEADERS)) | end);
    out.extend_from_slice(sid);
    out.extend_from_slice(prefix);
    out.extend_from_slice(head);
    while !rest.is_empty() {
        let (piece, more) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = more;
        out.put_uint(piece.len() as u64, 3);
        out.put_u8(CONTINUATION);
        out.put_u8(if rest.is_empty() { END_HEADERS } else { 0 });
        out.extend_from_slice(sid);
        out.extend_from_slice(piece);
    }
    Some((out, fault))
}

/// A whole header block's parts in `frames` (a HEADERS frame, then CONTINUATION frames,
/// the last with END_HEADERS): the priority fields, and the block itself without padding
/// (borrowed when it came in one frame); `None` for a block not whole or not well framed.
fn fragment(frames: &[u8]) -> Option<(&[u8], Cow<'_, [u8]>)> {
    let h = frames.get(..9)?;
    let flags = h[4];
    let mut at = 9 + frame_len(h);
    let mut payload = frames.get(9..at)?;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        payload = &payload[1..];
    }
    let fragment_len = payload.len().checked_sub(pad)?;
    let priority = if flags & PRIORITY != 0 { 5 } else { 0 };
    let prefix = payload.get(..priority)?;
    let first = payload.get(priority..fragment_len)?;
    if at == frames.len() {
        return (flags & END_HEADERS != 0).then_some((prefix, Cow::Borrowed(first)));
    }
    let mut block = first.to_vec();
    let mut last_flags = flags;
    while at < frames.len() {
        let c = frames.get(at..at + 9)?;
        let len = frame_len(c);
        block.extend_from_slice(frames.get(at + 9..at + 9 + len)?);
        last_flags = c[4];
        at += 9 + len;
    }
    (last_flags & END_HEADERS != 0).then_some((prefix, Cow::Owned(block)))
}

/// The field representations of a header block (RFC 7541 6) with each Huffman string's
/// surplus padding bytes dropped, and with `check` the fields nginx refuses made lawful
/// (then `true`); `None` if nothing changed (or the block does not parse). `request`: the
/// block opens a request (not trailers), whose pseudo-headers are checked too.
#[cfg(test)]
fn mend_fields(block: &[u8], check: bool, request: bool) -> Option<(Vec<u8>, Fault)> {
    mend_fields_late(block, check, request, &[])
}

/// [`mend_fields`] with the pseudo-headers `late` after a regular field (`conn::h2_table`,
/// by where their representations start): nginx answers 400 ("client sent out of order
/// pseudo-headers") where the codec would reset the stream. An indexed one is dropped (the
/// table stays as it is); a literal one is given on as a regular field of a name as long
/// (its leading colon an `x`), so that the dynamic table keeps its size. The stream is
/// noted.
fn mend_fields_late(
    block: &[u8],
    check: bool,
    request: bool,
    mut late: &[Late],
) -> Option<(Vec<u8>, Fault)> {
    let mut out = Vec::with_capacity(block.len());
    let mut changed = false;
    let mut bad = false;
    let mut connect = false;
    let mut at = 0;
    // Where missing pseudo-headers would go: after the leading table size updates.
    let mut head = None;
    // The pseudo-headers seen (method, scheme, path), and whether a field named from the
    // dynamic table leaves that unknown.
    let mut seen = [false; 3];
    let mut unknown = false;
    // Empty pseudo-headers given on as other fields (`empty_pseudo`): where each was, and
    // whether a field after it goes into the dynamic table.
    let mut renamed: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut inserts_after = false;
    while at < block.len() {
        let b = block[at];
        let start = at;
        // The representation's first integer (its prefix bits) and how many strings follow.
        let (prefix, strings) = match b {
            _ if b & 0x80 != 0 => (7, 0),
            _ if b & 0xc0 == 0x40 => (6, if b & 0x3f == 0 { 2 } else { 1 }),
            _ if b & 0xe0 == 0x20 => (5, 0),
            _ => (4, if b & 0x0f == 0 { 2 } else { 1 }),
        };
        let n = int_len(&block[at..], prefix)?;
        let index = decode_int(&block[at..at + n], prefix);
        at += n;
        if prefix != 5 && head.is_none() {
            head = Some(out.len());
        }
        if let Some((first, rest)) = late.split_first().filter(|(l, _)| l.at == start) {
            late = rest;
            if check && request {
                changed = true;
                let mut name = first.name.to_vec();
                if first.late {
                    bad = true;
                    if prefix == 7 {
                        continue;
                    }
                    name[0] = b'x';
                    if let Some(fixed) = lawful_name(&name) {
                        name = fixed;
                    }
                } else {
                    // In its place, named from an entry the codec holds renamed: given
                    // under its own name (indexed, as a literal field not indexed).
                    match name.as_slice() {
                        b":method" => seen[0] = true,
                        b":scheme" => seen[1] = true,
                        b":path" => seen[2] = true,
                        _ => {}
                    }
                    if prefix == 7 {
                        let value = first.value.as_deref()?;
                        out.push(0);
                        put_int(&mut out, name.len() as u64, 7, 0);
                        out.extend_from_slice(&name);
                        out.extend_from_slice(value);
                        continue;
                    }
                }
                if strings == 2 {
                    at += string(&block[at..])?.2;
                }
                let (_, _, n) = string(&block[at..])?;
                out.push(if prefix == 6 { 0x40 } else { b & 0xf0 });
                put_int(&mut out, name.len() as u64, 7, 0);
                out.extend_from_slice(&name);
                out.extend_from_slice(&block[at..at + n]);
                at += n;
                continue;
            }
        }
        // The static table's names (RFC 7541 A): 1 :authority, 2-3 :method, 4-5 :path,
        // 6-7 :scheme.
        let mut name_is = |index: u64| match index {
            2 | 3 => seen[0] = true,
            6 | 7 => seen[1] = true,
            4 | 5 => seen[2] = true,
            62.. => unknown = true,
            _ => {}
        };
        if prefix != 5 {
            name_is(index);
        }
        inserts_after |= prefix == 6 && !renamed.is_empty();
        if check && request && prefix == 7 && index == 1 {
            // `:authority` empty (the static entry), which nginx answers 400 and the codec
            // would reset the stream for: dropped (an indexed field leaves the table as it
            // is), the stream noted.
            bad = true;
            changed = true;
            continue;
        }
        // Where this representation starts in `out`, and the first byte of a literal one
        // with the same indexing that names its field anew.
        let rep_at = out.len();
        let literal = match prefix {
            7 => 0x00,
            6 => 0x40,
            _ => b & 0xf0,
        };
        if check && request && prefix != 5 && index == CONTENT_LENGTH_INDEX {
            changed = true;
            alias_content_length(&mut out, literal);
            if prefix == 7 {
                // The static entry's empty value.
                out.push(0);
                continue;
            }
        } else {
            out.extend_from_slice(&block[start..at]);
        }
        let mut path = check && request && strings == 1 && matches!(index, 4 | 5);
        let mut method = check && request && strings == 1 && matches!(index, 2 | 3);
        // The value of `:authority` (static entry 1) or Host (38): `Some(pseudo)`.
        let mut authority = match (strings, index) {
            (1, 1) if check && request => Some(true),
            (1, 38) if check && request => Some(false),
            _ => None,
        };
        for k in 0..strings {
            let huffman = *block.get(at)? & 0x80 != 0;
            let n = int_len(&block[at..], 7)?;
            let len = usize::try_from(decode_int(&block[at..at + n], 7)).ok()?;
            let s = block.get(at + n..at + n + len)?;
            at += n + len;
            let kept = if huffman { trim_padding(s) } else { s };
            if (method || path) && k + 1 == strings && kept.is_empty() {
                out.truncate(rep_at);
                renamed.push((rep_at, empty_pseudo(literal, method)));
                seen[if method { 0 } else { 2 }] = false;
                bad = true;
                changed = true;
                continue;
            }
            if method && k + 1 == strings {
                let value = if huffman {
                    decoded(kept)
                } else {
                    Some(kept.to_vec())
                };
                if value.as_deref() == Some(b"CONNECT") {
                    connect = true;
                    changed = true;
                    put_int(&mut out, 7, 7, 0);
                    out.extend_from_slice(b"OPTIONS");
                    continue;
                }
            }
            // A literal name (Huffman-coded ones decoded: names are few, values many) and
            // a plain value, checked as nginx checks them.
            let is_name = strings == 2 && k == 0;
            if check && (is_name || !huffman) {
                let name = match (huffman, is_name) {
                    (true, _) => decoded(kept),
                    (false, true) => Some(kept.to_vec()),
                    (false, false) => None,
                };
                if let (true, Some(name)) = (request, &name) {
                    if name.as_slice() == b"content-length" {
                        changed = true;
                        put_int(&mut out, CONTENT_LENGTH_ALIAS.len() as u64, 7, 0);
                        out.extend_from_slice(CONTENT_LENGTH_ALIAS.as_bytes());
                        continue;
                    }
                    if name.as_slice() == CONTENT_LENGTH_ALIAS.as_bytes() {
                        // The alias is gannet's own: a client's field of that name is
                        // refused rather than taken for a Content-Length.
                        bad = true;
                        changed = true;
                    }
                }
                if let Some(name) = &name {
                    match name.as_slice() {
                        b":method" => {
                            seen[0] = true;
                            method = request;
                        }
                        b":scheme" => seen[1] = true,
                        b":path" => {
                            seen[2] = true;
                            path = check && request;
                        }
                        b":authority" if request => authority = Some(true),
                        b"host" if request => authority = Some(false),
                        _ => {}
                    }
                }
                let fixed = match name {
                    Some(name) => lawful_name(&name),
                    None if path => lawful_path(kept),
                    None => match authority {
                        Some(pseudo) => lawful_authority(kept, pseudo),
                        None => lawful_value(kept),
                    },
                };
                if let Some(f) = fixed {
                    bad = true;
                    changed = true;
                    put_int(&mut out, f.len() as u64, 7, 0);
                    out.extend_from_slice(&f);
                    continue;
                }
            }
            if kept.len() == s.len() {
                out.extend_from_slice(&block[at - n - len..at]);
                continue;
            }
            changed = true;
            // An empty string goes as a plain one (nothing to decode).
            let h = if kept.is_empty() { 0 } else { 0x80 };
            put_int(&mut out, kept.len() as u64, 7, h);
            out.extend_from_slice(kept);
        }
    }
    // A field among the pseudo-headers is a malformed request to the codec: they go last,
    // unless a field after them goes into the dynamic table (their order there must stay
    // the client's; the codec then resets the stream).
    for (at, rep) in renamed.into_iter().rev() {
        let at = if inserts_after { at } else { out.len() };
        out.splice(at..at, rep);
    }
    if check && request && !unknown && seen.contains(&false) {
        // A request without :method, :scheme or :path (nginx: 400; the codec would reset
        // the stream): the missing ones from the static table (GET, http, /), which leave
        // the dynamic table as it is, the stream noted.
        let fill: Vec<u8> = [0x82, 0x86, 0x84]
            .into_iter()
            .zip(seen)
            .filter(|(_, s)| !s)
            .map(|(b, _)| b)
            .collect();
        let at = head.unwrap_or(out.len());
        out.splice(at..at, fill);
        bad = true;
        changed = true;
    }
    let fault = match (bad, connect) {
        (true, _) => Fault::Invalid,
        (false, true) => Fault::Connect,
        (false, false) => Fault::Lawful,
    };
    changed.then_some((out, fault))
}

/// HPACK's static index of `content-length` (RFC 7541 A).
const CONTENT_LENGTH_INDEX: u64 = 28;

/// The name a request's `content-length` field goes to the codec under, as long as it (so
/// that the dynamic table keeps its size; a field the client names from that table later
/// comes out under the alias too). The h2 crate resets a stream whose DATA does not add up
/// to its Content-Length, or whose Content-Length does not parse, where nginx answers 400
/// (after reading the body, through error_page): under another name the codec lets it be,
/// `conn::h2` takes the field back as Content-Length and checks the body against it as
/// nginx does.
pub const CONTENT_LENGTH_ALIAS: &str = "x-gannet-c-len";
const _: () = assert!(CONTENT_LENGTH_ALIAS.len() == "content-length".len());

/// The start of a literal representation (`first`: its first byte, indexing kept) that
/// names its field [`CONTENT_LENGTH_ALIAS`]; its value follows.
fn alias_content_length(out: &mut Vec<u8>, first: u8) {
    out.push(first);
    put_int(out, CONTENT_LENGTH_ALIAS.len() as u64, 7, 0);
    out.extend_from_slice(CONTENT_LENGTH_ALIAS.as_bytes());
}

/// An empty `:method` (`method`) or `:path`, which nginx answers 400 and the codec would
/// reset the stream for: a literal representation (`first`: its first byte, indexing kept)
/// of `xmethod` or `xpath`, a name as long, so the dynamic table keeps its size. The
/// pseudo-header then counts as missing (filled from the static table), the stream as
/// refused.
fn empty_pseudo(first: u8, method: bool) -> Vec<u8> {
    let name: &[u8] = if method { b"xmethod" } else { b"xpath" };
    let mut out = vec![first];
    put_int(&mut out, name.len() as u64, 7, 0);
    out.extend_from_slice(name);
    out.push(0);
    out
}

#[cfg(test)]
mod length_tests {
    use super::*;

    const ALIAS: &[u8] = CONTENT_LENGTH_ALIAS.as_bytes();

    #[test]
    fn late_pseudo_headers_go_as_regular_fields() {
        let late = |at: usize| Late {
            at,
            name: b":authority"[..].into(),
            late: true,
            value: None,
        };
        // A literal one: renamed as long, its indexing and value kept.
        let block = b"\x82\x86\x84\x7a\x01c\x41\x01a";
        let mut want = b"\x82\x86\x84\x7a\x01c\x40\x0axauthority".to_vec();
        want.extend(b"\x01a");
        let got = mend_fields_late(block, true, true, &[late(6)]);
        assert_eq!(got, Some((want, Fault::Invalid)));
        // An indexed one: dropped.
        let got = mend_fields_late(b"\x82\x86\x84\x7a\x01c\xbe", true, true, &[late(6)]);
        assert_eq!(
            got,
            Some((b"\x82\x86\x84\x7a\x01c".to_vec(), Fault::Invalid))
        );
        // In trailers the codec judges them.
        assert_eq!(mend_fields_late(block, true, false, &[late(6)]), None);
        // In its place, named from an entry the codec holds renamed: under its own name,
        // not indexed when indexed, indexing kept when a literal.
        let held = Late {
            at: 0,
            name: b":authority"[..].into(),
            late: false,
            value: Some(b"\x01a"[..].into()),
        };
        let mut want = b"\x00\x0a:authority\x01a".to_vec();
        want.extend(b"\x82\x86\x84");
        let got = mend_fields_late(b"\xbe\x82\x86\x84", true, true, &[held]);
        assert_eq!(got, Some((want, Fault::Lawful)));
        let named = Late {
            value: None,
            ..late(0)
        };
        let named = Late {
            late: false,
            ..named
        };
        let mut want = b"\x40\x0a:authority\x01b".to_vec();
        want.extend(b"\x82\x86\x84");
        let got = mend_fields_late(b"\x7e\x01b\x82\x86\x84", true, true, &[named]);
        assert_eq!(got, Some((want, Fault::Lawful)));
    }

    #[test]
    fn content_length_goes_under_the_alias() {
        let pseudo = [0x82, 0x86, 0x84];
        // Named from the static table: incremental indexing, without, never indexed.
        for (rep, first) in [(0x5c, 0x40), (0x0f, 0x00), (0x1f, 0x10)] {
            let mut block = pseudo.to_vec();
            block.push(rep);
            if rep != 0x5c {
                block.push(0x0d); // 28 past the 4-bit prefix
            }
            block.extend([2, b'1', b'0']);
            let mut want = pseudo.to_vec();
            want.extend([first, 14]);
            want.extend(ALIAS);
            want.extend([2, b'1', b'0']);
            assert_eq!(
                mend_fields(&block, true, true),
                Some((want, Fault::Lawful)),
                "{rep:#x}"
            );
        }
        // A literal name, plain or Huffman-coded.
        let mut plain = pseudo.to_vec();
        plain.extend(b"\x40\x0econtent-length\x011");
        let mut coded = pseudo.to_vec();
        coded.push(0x40);
        let mut h = Vec::new();
        httlib_huffman::encode(b"content-length", &mut h).unwrap();
        coded.push(0x80 | h.len() as u8);
        coded.extend(&h);
        coded.extend(b"\x011");
        let mut want = pseudo.to_vec();
        want.extend([0x40, 14]);
        want.extend(ALIAS);
        want.extend(b"\x011");
        for block in [plain, coded] {
            assert_eq!(
                mend_fields(&block, true, true),
                Some((want.clone(), Fault::Lawful))
            );
        }
        // The indexed static entry (an empty value): without indexing.
        let mut want = pseudo.to_vec();
        want.extend([0x00, 14]);
        want.extend(ALIAS);
        want.push(0);
        assert_eq!(
            mend_fields(&[0x82, 0x86, 0x84, 0x9c], true, true),
            Some((want, Fault::Lawful))
        );
        // Trailers and an upstream's answers are left alone; the alias from a client is
        // refused.
        assert_eq!(mend_fields(&[0x5c, 1, b'1'], true, false), None);
        assert_eq!(mend_fields(&[0x88, 0x5c, 1, b'1'], false, false), None);
        let mut own = pseudo.to_vec();
        own.extend([0x40, 14]);
        own.extend(ALIAS);
        own.extend([1, b'1']);
        assert_eq!(
            mend_fields(&own, true, true),
            Some((own.clone(), Fault::Invalid))
        );
    }

    #[test]
    fn an_empty_method_or_path_is_renamed_and_refused() {
        // :method "" with incremental indexing (as nginx's tests send it), then :path "".
        // It goes after the pseudo-headers, the missing one filled first.
        let got = mend_fields(&[0x42, 0x00, 0x86, 0x84], true, true);
        let mut want = vec![0x82, 0x86, 0x84, 0x40, 7];
        want.extend(b"xmethod\x00");
        assert_eq!(got, Some((want, Fault::Invalid)));
        let got = mend_fields(&[0x82, 0x04, 0x00, 0x86, 0x0f, 0x0d, 1, b'1'], true, true);
        let mut want = vec![0x84, 0x82, 0x86, 0x00, 14];
        want.extend(ALIAS);
        want.extend([1, b'1', 0x00, 5]);
        want.extend(b"xpath\x00");
        assert_eq!(got, Some((want, Fault::Invalid)));
        // Unless a field after it goes into the dynamic table.
        let got = mend_fields(&[0x42, 0x00, 0x86, 0x84, 0x41, 1, b'a'], true, true);
        let mut want = vec![0x82, 0x40, 7];
        want.extend(b"xmethod\x00\x86\x84\x41\x01a");
        assert_eq!(got, Some((want, Fault::Invalid)));
    }
}

/// A plain `:path` nginx answers 400 (not `/...` nor `*`, or with a space or a control
/// character) made lawful, the same length; `None` for one nginx takes (or an empty one,
/// left to the codec).
fn lawful_path(path: &[u8]) -> Option<Vec<u8>> {
    let refused = |c: u8| c <= 0x20 || c == 0x7f;
    let first = *path.first()?;
    if (first == b'/' || path == b"*") && !path.iter().any(|&c| refused(c)) {
        return None;
    }
    let mut out: Vec<u8> = path
        .iter()
        .map(|&c| if refused(c) { b'-' } else { c })
        .collect();
    if out != b"*" {
        out[0] = b'/';
    }
    Some(out)
}

/// A Huffman string decoded (`None` if it does not decode).
fn decoded(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 2);
    httlib_huffman::decode(s, &mut out, httlib_huffman::DecoderSpeed::FourBits).ok()?;
    Some(out)
}

/// A field name nginx answers 400 (a control character, a space or a colon, a
/// pseudo-header's leading one aside) made lawful, the same length; `None` for a name
/// nginx takes or whose only fault is upper case (see the module docs).
fn lawful_name(name: &[u8]) -> Option<Vec<u8>> {
    let from = usize::from(name.first() == Some(&b':'));
    let refused = |c: u8| c <= 0x20 || c == 0x7f || c == b':';
    if !name[from..].iter().any(|&c| refused(c)) {
        return None;
    }
    let mut out = name.to_vec();
    for c in &mut out[from..] {
        if c.is_ascii_uppercase() {
            c.make_ascii_lowercase();
        } else if refused(*c) {
            *c = b'-';
        }
    }
    Some(out)
}

/// An `:authority` (`pseudo`) or Host value nginx answers 400 that the codec would reset
/// the stream for - one the `http` crate takes for no authority (empty, a path separator),
/// or with a control character - made lawful: as many `x` (one for an empty one).
fn lawful_authority(value: &[u8], pseudo: bool) -> Option<Vec<u8>> {
    let control = value.iter().any(|&c| c < 0x20 || c == 0x7f);
    let refused = control || (pseudo && http::uri::Authority::try_from(value).is_err());
    refused.then(|| vec![b'x'; value.len().max(1)])
}

/// A field value with NUL, CR or LF (nginx answers 400) made lawful, the same length.
fn lawful_value(value: &[u8]) -> Option<Vec<u8>> {
    let refused = |c: &u8| matches!(c, b'\0' | b'\r' | b'\n');
    if !value.iter().any(refused) {
        return None;
    }
    Some(
        value
            .iter()
            .map(|c| if refused(c) { b' ' } else { *c })
            .collect(),
    )
}

/// A Huffman string without its trailing whole bytes of padding: each 0xff at the end is
/// dropped while the rest still decodes with lawful (under 8 bits) padding. No code is
/// eight ones or fewer (the shortest all-ones code is EOS's 30), so such a byte can only
/// be padding.
pub(super) fn trim_padding(mut s: &[u8]) -> &[u8] {
    let mut scratch = Vec::new();
    while let Some((&0xff, rest)) = s.split_last() {
        if httlib_huffman::decode(s, &mut scratch, httlib_huffman::DecoderSpeed::FourBits).is_ok() {
            break;
        }
        scratch.clear();
        if httlib_huffman::decode(rest, &mut scratch, httlib_huffman::DecoderSpeed::FourBits)
            .is_err()
        {
            break;
        }
        scratch.clear();
        s = rest;
    }
    s
}

/// The length of the HPACK integer (RFC 7541 5.1) at the start of `b`, with an
/// `n`-bit prefix.
fn int_len(b: &[u8], n: u32) -> Option<usize> {
    let max = (1u8 << n) - 1;
    if *b.first()? & max != max {
        return Some(1);
    }
    // Continuation bytes until one without the high bit; more than 4 is no length a
    // header block can use.
    for (i, &c) in b.iter().enumerate().skip(1).take(4) {
        if c & 0x80 == 0 {
            return Some(i + 1);
        }
    }
    None
}

fn decode_int(b: &[u8], n: u32) -> u64 {
    let max = (1u64 << n) - 1;
    let mut v = u64::from(b[0]) & max;
    if v < max {
        return v;
    }
    for (i, &c) in b[1..].iter().enumerate() {
        v += u64::from(c & 0x7f) << (7 * i);
    }
    v
}

fn put_int(out: &mut Vec<u8>, mut v: u64, n: u32, flags: u8) {
    let max = (1u64 << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl<IO: AsyncRead + Unpin> AsyncRead for HpackMend<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.guard.as_ref().is_some_and(|g| g.ended) {
                // The codec was given a connection error: the end.
                return Poll::Ready(Ok(()));
            }
            if this.carve.is_some() && this.skip == 0 {
                // A frame being cut goes on as far as its window lets it (and what follows
                // it, if it is done); nothing more is read until the window opens
                // (`conn::h2_window`).
                this.settle();
                if !this.ready.is_empty() {
                    continue;
                }
                if this.carve_stalled() {
                    if let Some(w) = &this.windows {
                        w.wait_reader(cx.waker());
                    }
                    return Poll::Pending;
                }
            }
            let before = buf.filled().len();
            match Pin::new(&mut this.io).poll_read(cx, buf) {
                Poll::Ready(Ok(())) => {}
                Poll::Pending => {
                    let late = this.guard.as_mut().and_then(|g| g.poll_late(cx));
                    let Some(sid) = late else {
                        return Poll::Pending;
                    };
                    this.late(sid);
                    continue;
                }
                other => return other,
            }
            let got = buf.filled().len() - before;
            if got == 0 {
                // The end: whatever is held goes on for the codec to judge (but the rest
                // of a frame being cut, which has no header of its own).
                if this.carve.take().is_some() {
                    this.held.clear();
                }
                if this.held.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                let held = this.held.split();
                this.ready.extend_from_slice(&held);
                continue;
            }
            if this.held.is_empty() {
                let Some(k) = this.pass(&buf.filled()[before..]) else {
                    return Poll::Ready(Ok(()));
                };
                this.held.extend_from_slice(&buf.filled()[before + k..]);
                buf.set_filled(before + k);
            } else {
                this.held.extend_from_slice(&buf.filled()[before..]);
                buf.set_filled(before);
            }
            // Whatever `settle` leaves held is a frame header or header block not yet
            // complete (it stops inside a frame it passes on only at the end of `held`).
            this.settle();
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for HpackMend<IO> {
    writes_through!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn huff(s: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        httlib_huffman::encode(s, &mut out).unwrap();
        out
    }

    fn frame(kind: u8, flags: u8, sid: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&sid.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A literal field without indexing, with a new name (raw) and a value (Huffman).
    fn field(name: &str, value: &[u8]) -> Vec<u8> {
        let mut b = vec![0x00, name.len() as u8];
        b.extend_from_slice(name.as_bytes());
        put_int(&mut b, value.len() as u64, 7, 0x80);
        b.extend_from_slice(value);
        b
    }

    #[test]
    fn lawful_strings_are_kept() {
        for s in [
            &b""[..],
            b"a",
            b"localhost",
            b"application/grpc",
            b"\xff\xfe\x00\x01",
        ] {
            let h = huff(s);
            assert_eq!(trim_padding(&h), &h[..], "{s:?}");
        }
        assert_eq!(
            mend_fields(&field("x-a", &huff(b"localhost")), true, false),
            None
        );
    }

    #[test]
    fn a_whole_byte_of_padding_is_dropped() {
        // "aaaaaaaa": eight 5-bit codes end on a byte boundary.
        let lawful = huff(b"aaaaaaaa");
        assert_eq!(lawful.len(), 5);
        let mut padded = lawful.clone();
        padded.push(0xff);
        assert_eq!(trim_padding(&padded), &lawful[..]);
        let mut block = vec![0x82]; // :method GET (indexed)
        block.extend(field("x-a", &padded));
        let mut want = vec![0x82];
        want.extend(field("x-a", &lawful));
        assert_eq!(
            mend_fields(&block, false, true),
            Some((want, Fault::Lawful))
        );
        // An empty value as the single byte 0xff: an empty plain string.
        assert_eq!(
            mend_fields(&field("x-b", &[0xff]), false, true),
            Some((vec![0x00, 3, b'x', b'-', b'b', 0x00], Fault::Lawful))
        );
    }

    /// A literal field without indexing, name and value plain.
    fn plain(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut b = vec![0x00, name.len() as u8];
        b.extend_from_slice(name);
        b.push(value.len() as u8);
        b.extend_from_slice(value);
        b
    }

    #[test]
    fn fields_nginx_refuses_are_made_lawful_and_noted() {
        for (name, value, want_name, want_value) in [
            (&b"x foo"[..], &b"bar"[..], &b"x-foo"[..], &b"bar"[..]),
            (b"x:foo", b"bar", b"x-foo", b"bar"),
            (b"foo\x02", b"bar", b"foo-", b"bar"),
            (b"X Foo", b"bar", b"x-foo", b"bar"),
            (b"x-foo", b"x\r\nreferer: y", b"x-foo", b"x  referer: y"),
        ] {
            let got = mend_fields(&plain(name, value), true, false);
            assert_eq!(
                got,
                Some((plain(want_name, want_value), Fault::Invalid)),
                "{name:?}"
            );
            // Not on an upstream's connection: the codec judges.
            assert_eq!(mend_fields(&plain(name, value), false, false), None);
        }
        // A Huffman-coded name is decoded to be checked; lawful ones are left alone.
        let mut b = vec![0x00];
        let h = huff(b"x:foo");
        put_int(&mut b, h.len() as u64, 7, 0x80);
        b.extend(h);
        b.extend([0x03, b'b', b'a', b'r']);
        assert_eq!(
            mend_fields(&b, true, false),
            Some((plain(b"x-foo", b"bar"), Fault::Invalid))
        );
        for ok in [&b"x-foo"[..], b"x_foo", b":path", b"x.foo", b"X-Upper"] {
            assert_eq!(mend_fields(&plain(ok, b"bar"), true, false), None, "{ok:?}");
        }
        let r = Refused::default();
        r.note(3, Fault::Invalid);
        r.note(5, Fault::Connect);
        assert_eq!(r.take(1), None);
        assert_eq!(r.take(3), Some(Fault::Invalid));
        assert_eq!(r.take(3), None);
        assert_eq!(r.take(5), Some(Fault::Connect));
    }

    #[test]
    fn headers_split_into_frames_and_reads_are_mended_whole() {
        let mut padded = huff(b"aaaaaaaa");
        padded.push(0xff);
        let block = field("x-a", &padded);
        let mut input = frame(0x4, 0, 0, &[]); // SETTINGS
        input.extend(frame(
            HEADERS,
            PADDED,
            1,
            &[&[2u8][..], &block[..3], &[0, 0]].concat(),
        ));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &block[3..]));
        input.extend(frame(0x0, 0x1, 1, b"HEADERS?")); // DATA, END_STREAM
        let mut want = frame(0x4, 0, 0, &[]);
        want.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &field("x-a", &huff(b"aaaaaaaa")),
        ));
        want.extend(frame(0x0, 0x1, 1, b"HEADERS?"));
        // One byte at a time, and all at once.
        for piece in [1, input.len()] {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let chunks: Vec<Vec<u8>> = input.chunks(piece).map(<[u8]>::to_vec).collect();
            let got = rt.block_on(async {
                let mut r = HpackMend::new(Chunks(chunks), 0, None);
                let mut out = Vec::new();
                r.read_to_end(&mut out).await.unwrap();
                out
            });
            assert_eq!(got, want, "pieces of {piece}");
        }
    }

    #[test]
    fn connect_is_given_on_as_options_and_noted() {
        // A representation's head, its method value, then :scheme http and :path /.
        let block = |head: &[u8], value: &[u8]| [head, value, &[0x86, 0x84]].concat();
        // Indexed name (:method, static 2) with incremental indexing; plain and Huffman.
        let plain = block(&[0x42, 7], b"CONNECT");
        let want = block(&[0x42, 7], b"OPTIONS");
        let wanted = Some((want, Fault::Connect));
        assert_eq!(mend_fields(&plain, true, true), wanted);
        let h = huff(b"CONNECT");
        let coded = block(&[0x42, 0x80 | h.len() as u8], &h);
        assert_eq!(mend_fields(&coded, true, true), wanted);
        // A literal name.
        let literal = block(b"\x00\x07:method\x07", b"CONNECT");
        let want = block(b"\x00\x07:method\x07", b"OPTIONS");
        assert_eq!(
            mend_fields(&literal, true, true),
            Some((want, Fault::Connect))
        );
        // Other methods, trailers and an upstream's answers are left alone.
        assert_eq!(
            mend_fields(&[0x42, 3, b'G', b'E', b'T', 0x86, 0x84], true, true),
            None
        );
        assert_eq!(mend_fields(&plain, true, false), None);
        assert_eq!(mend_fields(&plain, false, true), None);
    }

    #[test]
    fn requests_nginx_answers_400_are_made_lawful_and_noted() {
        // No :method nor :scheme: GET and http from the static table, first.
        let got = mend_fields(&[0x84, 0x41, 1, b'a'], true, true);
        assert_eq!(
            got,
            Some((vec![0x82, 0x86, 0x84, 0x41, 1, b'a'], Fault::Invalid))
        );
        // ... after a table size update.
        let got = mend_fields(&[0x3f, 0x01, 0x84, 0x82], true, true);
        assert_eq!(
            got,
            Some((vec![0x3f, 0x01, 0x86, 0x84, 0x82], Fault::Invalid))
        );
        // Trailers, or a field named from the dynamic table: left alone.
        assert_eq!(mend_fields(&[0x40, 1, b'a', 1, b'b'], true, false), None);
        assert_eq!(mend_fields(&[0x82, 0xbe, 0x86], true, true), None);
        // An empty :authority (the static entry) dropped.
        let got = mend_fields(&[0x82, 0x86, 0x84, 0x81], true, true);
        assert_eq!(got, Some((vec![0x82, 0x86, 0x84], Fault::Invalid)));
        // A :path not from the root, or with a control character.
        let got = mend_fields(&[0x82, 0x86, 0x44, 3, b'a', b'/', b'b'], true, true);
        assert_eq!(
            got,
            Some((vec![0x82, 0x86, 0x44, 3, b'/', b'/', b'b'], Fault::Invalid))
        );
        let got = mend_fields(&[0x82, 0x86, 0x04, 3, b'/', b'a', 2], true, true);
        assert_eq!(
            got,
            Some((vec![0x82, 0x86, 0x04, 3, b'/', b'a', b'-'], Fault::Invalid))
        );
        // An :authority that is none to the codec (empty, a path separator), or a Host
        // with a control character: as many `x`.
        let got = mend_fields(&[0x82, 0x86, 0x84, 0x41, 0], true, true);
        assert_eq!(
            got,
            Some((vec![0x82, 0x86, 0x84, 0x41, 1, b'x'], Fault::Invalid))
        );
        let got = mend_fields(&[0x82, 0x86, 0x84, 0x41, 3, 0x1b, b'/', b'a'], true, true);
        assert_eq!(
            got,
            Some((
                vec![0x82, 0x86, 0x84, 0x41, 3, b'x', b'x', b'x'],
                Fault::Invalid
            ))
        );
        let got = mend_fields(&[0x82, 0x86, 0x84, 0x66, 2, b'a', 2], true, true);
        assert_eq!(
            got,
            Some((vec![0x82, 0x86, 0x84, 0x66, 2, b'x', b'x'], Fault::Invalid))
        );
        let host = [
            0x82, 0x86, 0x84, 0x40, 4, b'h', b'o', b's', b't', 2, b'a', 2,
        ];
        let got = mend_fields(&host, true, true).map(|(b, bad)| (b[10..].to_vec(), bad));
        assert_eq!(got, Some((vec![b'x', b'x'], Fault::Invalid)));
        for fine in [
            &[0x82, 0x86, 0x84, 0x41, 1, b'a'][..],
            &[0x82, 0x86, 0x44, 1, b'*'],
            // A Host nginx itself judges (path separators are its 400, after the codec).
            &[0x82, 0x86, 0x84, 0x66, 3, b'a', b'/', b'b'],
        ] {
            assert_eq!(mend_fields(fine, true, true), None, "{fine:?}");
        }
    }

    #[test]
    fn a_mended_block_past_the_frame_size_goes_on_in_continuations() {
        let mut padded = huff(b"aaaaaaaa");
        padded.push(0xff);
        let mut block = field("x-a", &padded);
        let big = vec![b'v'; 20_000];
        let mut long = vec![0x00, 3, b'x', b'-', b'b'];
        put_int(&mut long, big.len() as u64, 7, 0);
        long.extend(&big);
        block.extend(&long);
        let mut frames = frame(HEADERS, 0x1, 5, &block[..10_000]);
        frames.extend(frame(CONTINUATION, END_HEADERS, 5, &block[10_000..]));
        let (out, fault) = mend_block(&frames, true, false, &[]).unwrap();
        assert_eq!(fault, Fault::Lawful);
        let mut want = field("x-a", &huff(b"aaaaaaaa"));
        want.extend(&long);
        let (first, rest) = out.split_at(9 + frame_len(&out));
        assert_eq!((first[3], first[4]), (HEADERS, 0x1));
        assert_eq!(first.len(), 9 + MAX_FRAME);
        assert_eq!(
            (rest[3], rest[4], &rest[5..9]),
            (CONTINUATION, END_HEADERS, &[0, 0, 0, 5][..])
        );
        assert_eq!([&first[9..], &rest[9..]].concat(), want);
    }

    /// A reader that gives its chunks one read at a time.
    struct Chunks(Vec<Vec<u8>>);

    impl AsyncRead for Chunks {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(c) = self.0.first_mut() {
                let n = c.len().min(buf.remaining());
                buf.put_slice(&c[..n]);
                c.drain(..n);
                if c.is_empty() {
                    self.0.remove(0);
                }
            }
            Poll::Ready(Ok(()))
        }
    }
}
