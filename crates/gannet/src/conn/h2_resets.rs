//! An upstream's RST_STREAM frames read together, judged as nginx's gRPC and HTTP/2 proxy
//! judge them.
//!
//! nginx takes one RST_STREAM NO_ERROR after a stream's end (the server is done reading the
//! body), but a second one for the same stream is "upstream sent frame for closed stream",
//! an error that fails the answer (the client's stream is reset, its trailers not passed
//! on). The h2 crate ignores every reset after the first (the stream is closed by then).
//! nginx sees them because they come in the same read; so does this reader, which sits
//! under the codec on a connection to an upstream: when one read holds two RST_STREAM
//! frames for a stream, the first is given on with PROTOCOL_ERROR instead of NO_ERROR, so
//! the codec reports the stream rejected (`conn::grpc` fails the answer, as it does for a
//! reset with an error). And the codec ignores a reset on a stream closed both ways (the
//! request sent whole, the answer's last DATA frame read), where nginx fails the answer on
//! a reset with an error: a DATA frame that ends a stream such a reset follows in the same
//! read is given on without END_STREAM, so the reset fails the stream. Payloads pass
//! through unread otherwise.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;
const END_STREAM: u8 = 0x1;
/// RFC 9113 7: PROTOCOL_ERROR.
const PROTOCOL_ERROR: [u8; 4] = [0, 0, 0, 1];

pub struct Resets<IO> {
    io: IO,
    /// Payload bytes of the current frame still to come.
    skip: usize,
    /// The start of a frame header cut by the end of a read.
    partial: Vec<u8>,
}

impl<IO> Resets<IO> {
    /// `skip`: bytes before the first frame (none on a client's side of a connection).
    pub fn new(io: IO, skip: usize) -> Resets<IO> {
        Resets {
            io,
            skip,
            partial: Vec::new(),
        }
    }

    /// Follow the frames through `data` (one read), mending repeated resets in it.
    fn walk(&mut self, data: &mut [u8]) {
        let mut at = self.skip.min(data.len());
        self.skip -= at;
        if !self.partial.is_empty() {
            // The rest of a header cut by the last read: only its length matters here.
            let need = 9 - self.partial.len();
            let take = need.min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            if self.partial.len() < 9 {
                return;
            }
            let len = frame_len(&self.partial);
            self.partial.clear();
            at = take;
            let n = len.min(data.len() - at);
            at += n;
            self.skip = len - n;
        }
        // (offset of the code, stream) of each whole RST_STREAM frame NO_ERROR in this read,
        // and (offset of the flags, stream) of each DATA frame that ends its stream.
        let mut resets: Vec<(usize, u32)> = Vec::new();
        let mut ends: Vec<(usize, u32)> = Vec::new();
        while at < data.len() {
            let Some(h) = data.get(at..at + 9) else {
                self.partial.extend_from_slice(&data[at..]);
                break;
            };
            let len = frame_len(h);
            let sid = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
            if h[3] == DATA && h[4] & END_STREAM != 0 {
                ends.push((at + 4, sid));
            }
            if h[3] == RST_STREAM && len == 4 && at + 13 <= data.len() {
                let code = [data[at + 9], data[at + 10], data[at + 11], data[at + 12]];
                let first = resets.iter().find(|&&(_, s)| s == sid).map(|&(f, _)| f);
                if let Some(first) = first {
                    data[first..first + 4].copy_from_slice(&PROTOCOL_ERROR);
                } else if code == [0, 0, 0, 0] {
                    resets.push((at + 9, sid));
                }
                // A stream both ends closed is over for the codec, which would ignore a
                // reset after it: its DATA is given on as not ending it, so the reset
                // fails it.
                if first.is_some() || code != [0, 0, 0, 0] {
                    if let Some(&(flags, _)) = ends.iter().find(|&&(_, s)| s == sid) {
                        data[flags] &= !END_STREAM;
                    }
                }
            }
            let n = len.min(data.len() - at - 9);
            at += 9 + n;
            self.skip = len - n;
        }
    }
}

fn frame_len(h: &[u8]) -> usize {
    usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2])
}

impl<IO: AsyncRead + Unpin> AsyncRead for Resets<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.walk(&mut buf.filled_mut()[before..]);
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Resets<IO> {
    writes_through!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, sid: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&sid.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn rst(sid: u32, code: u32) -> Vec<u8> {
        frame(RST_STREAM, 0, sid, &code.to_be_bytes())
    }

    #[test]
    fn a_second_reset_in_one_read_makes_the_first_an_error() {
        let trailers = frame(0x1, 0x5, 1, &[0x40, 1, b'a', 1, b'b']);
        let mut data = [trailers.clone(), rst(1, 0), rst(3, 0), rst(1, 0)].concat();
        let mut r = Resets::new((), 0);
        r.walk(&mut data);
        assert_eq!(data, [trailers, rst(1, 1), rst(3, 0), rst(1, 0)].concat());
        // One reset, or one with an error already, is left alone.
        for mut one in [rst(1, 0), [rst(1, 8), rst(1, 0)].concat()] {
            let want = one.clone();
            Resets::new((), 0).walk(&mut one);
            assert_eq!(one, want);
        }
    }

    #[test]
    fn a_reset_after_the_last_data_unends_it() {
        for (codes, want_flags) in [(&[8u32][..], 0u8), (&[0, 0], 0), (&[0], 1)] {
            let mut data = frame(DATA, 1, 1, b"SEE-THIS");
            for &c in codes {
                data.extend(rst(1, c));
            }
            let mut want = frame(DATA, want_flags, 1, b"SEE-THIS");
            for (i, &c) in codes.iter().enumerate() {
                let mended = codes.len() > 1 && i == 0;
                want.extend(rst(1, if mended { 1 } else { c }));
            }
            Resets::new((), 0).walk(&mut data);
            assert_eq!(data, want, "{codes:?}");
        }
        // Another stream's reset leaves it be.
        let mut data = [frame(DATA, 1, 1, b"x"), rst(3, 8)].concat();
        let want = data.clone();
        Resets::new((), 0).walk(&mut data);
        assert_eq!(data, want);
    }

    #[test]
    fn frames_are_followed_across_reads() {
        let data = [frame(0x0, 0, 1, b"0123456789"), rst(1, 0), rst(1, 0)].concat();
        for cut in 1..data.len() {
            let (mut a, mut b) = (data[..cut].to_vec(), data[cut..].to_vec());
            let mut r = Resets::new((), 0);
            r.walk(&mut a);
            r.walk(&mut b);
            let got = [a, b].concat();
            // Both resets in the second read: the first mended; else not.
            let both = cut <= 19;
            let first = if both { rst(1, 1) } else { rst(1, 0) };
            let want = [frame(0x0, 0, 1, b"0123456789"), first, rst(1, 0)].concat();
            assert_eq!(got, want, "cut at {cut}");
        }
    }
}
