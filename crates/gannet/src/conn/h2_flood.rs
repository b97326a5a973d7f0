//! Flood detection for HTTP/2 connections: the frames a client sends that cost the server
//! work but ask for nothing (PING, SETTINGS, RST_STREAM, PRIORITY, empty DATA), counted
//! against a budget that requests refill. A client that spends it (a PING or SETTINGS flood,
//! CVE-2019-9512/9515/9518) is cut off: its input stops being read and the connection loop
//! ends it with GOAWAY ENHANCE_YOUR_CALM, then a lingering close (`conn::h2_linger`). The h2
//! crate handles the other abuses itself.
//!
//! The guard sits under the codec and only reads the 9-byte frame headers as they pass.

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Frames that ask for nothing a client may send before it is cut off.
const BUDGET: u32 = 10_000;
/// What each request (a HEADERS frame) gives back: a browser sends a few such frames per
/// request, a flood thousands.
const PER_REQUEST: u32 = 100;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const PRIORITY: u8 = 2;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const END_STREAM: u8 = 0x1;

/// Shared between the guard (under the codec) and the connection loop.
#[derive(Default)]
pub struct Flood {
    tripped: Cell<bool>,
    /// Wakes the connection loop when the budget runs out.
    pub alarm: Notify,
}

impl Flood {
    pub fn tripped(&self) -> bool {
        self.tripped.get()
    }
}

pub struct FloodGuard<IO> {
    io: IO,
    flood: Rc<Flood>,
    budget: u32,
    /// Bytes to pass before the next frame header (the preface first, then payloads).
    skip: usize,
    header: [u8; 9],
    have: usize,
}

impl<IO> FloodGuard<IO> {
    /// `skip`: the bytes before the first frame (the 24-byte client preface).
    pub fn new(io: IO, flood: Rc<Flood>, skip: usize) -> FloodGuard<IO> {
        FloodGuard {
            io,
            flood,
            budget: BUDGET,
            skip,
            header: [0; 9],
            have: 0,
        }
    }

    /// Follow the frame boundaries through bytes just read, spending the budget.
    fn scan(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            let n = (9 - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have < 9 {
                return;
            }
            self.have = 0;
            let h = self.header;
            let len = super::h2_mend::frame_len(&h);
            self.skip = len;
            let idle = match h[3] {
                HEADERS => {
                    self.budget = (self.budget + PER_REQUEST).min(BUDGET);
                    false
                }
                DATA => len == 0 && h[4] & END_STREAM == 0,
                PRIORITY | RST_STREAM | SETTINGS | PING => true,
                _ => false,
            };
            if idle {
                self.budget = self.budget.saturating_sub(1);
                if self.budget == 0 && !self.flood.tripped.replace(true) {
                    self.flood.alarm.notify_one();
                }
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FloodGuard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.flood.tripped() {
            // Nothing more is read from a flooding client; the connection loop is ending
            // the connection (its GOAWAY still goes out: writes are not held).
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.scan(&buf.filled()[before..]);
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FloodGuard<IO> {
    // The close after a cut-off lingers (`conn::h2_linger`, under this guard): the client's
    // unread frames are still coming, and closing on them would reset the connection.
    writes_through!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        let mut f = vec![
            (n >> 16) as u8,
            (n >> 8) as u8,
            n as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    fn guard() -> FloodGuard<()> {
        FloodGuard::new((), Rc::new(Flood::default()), 24)
    }

    #[test]
    fn pings_spend_the_budget_requests_refill_it() {
        let mut g = guard();
        g.scan(&[b'P'; 24]);
        let ping = frame(PING, 0, &[0; 8]);
        for _ in 0..BUDGET - 1 {
            g.scan(&ping);
        }
        assert!(!g.flood.tripped());
        g.scan(&frame(HEADERS, 0x5, &[0x82, 0x86, 0x84]));
        for _ in 0..PER_REQUEST {
            g.scan(&ping);
        }
        assert!(!g.flood.tripped());
        g.scan(&ping);
        assert!(g.flood.tripped());
    }

    #[test]
    fn frames_split_anywhere_are_followed() {
        let mut g = guard();
        let mut bytes = vec![b'P'; 24];
        for _ in 0..50 {
            bytes.extend(frame(DATA, 0, &[7; 1000]));
            bytes.extend(frame(SETTINGS, 0, &[]));
            bytes.extend(frame(DATA, END_STREAM, &[]));
        }
        for piece in bytes.chunks(7) {
            g.scan(piece);
        }
        // Only the 50 SETTINGS counted: payload bytes were never read as headers.
        assert_eq!(g.budget, BUDGET - 50);
        assert_eq!((g.have, g.skip), (0, 0));
    }
}
