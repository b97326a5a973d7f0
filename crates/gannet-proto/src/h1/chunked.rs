//! Chunked transfer-coding decoder for request bodies (RFC 9112 7.1).
//!
//! A resumable state machine: it consumes what it can from the read buffer and remembers
//! where it stopped, so bytes may arrive split at any position. Chunk data is split off the
//! buffer (no copy); size lines, extensions and trailers are consumed and dropped. Line ends
//! may be CRLF or a bare LF, as nginx accepts.

use bytes::{Buf, Bytes, BytesMut};

use super::parse::ParseError;

/// Default longest chunk-size line (size + extensions), as bytes.
pub const DEFAULT_MAX_LINE: usize = 4096;
/// Default largest trailer section, as bytes.
pub const DEFAULT_MAX_TRAILERS: usize = 16 * 1024;

/// One step of decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Body bytes (never empty).
    Data(Bytes),
    /// The buffer is exhausted before the end of the body: read more and call again.
    NeedMore,
    /// The last chunk and the trailers were consumed; the buffer starts at whatever the
    /// client sent next (a pipelined request).
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the hex size; `digits` seen so far.
    Size {
        size: u64,
        digits: usize,
    },
    /// After the size: whitespace and extensions up to the line end (ignored).
    Ext {
        size: u64,
    },
    /// Saw CR ending the size line; LF must follow.
    SizeLf {
        size: u64,
    },
    /// Inside chunk data.
    Data {
        left: u64,
    },
    /// After chunk data: CRLF or LF must follow.
    DataEnd,
    /// Saw CR after chunk data; LF must follow.
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart,
    /// Inside a trailer field line.
    TrailerLine,
    /// Saw CR inside or at the end of a trailer line; LF must follow.
    TrailerLf {
        last: bool,
    },
    Done,
}

/// Decoder for one chunked body.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    line_len: usize,
    trailer_len: usize,
    total: u64,
    max_line: usize,
    max_trailers: usize,
    /// The trailer section's lines, when asked to keep them ([`ChunkedDecoder::keep_trailers`]).
    kept: Option<Vec<u8>>,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

const fn bad(reason: &'static str) -> ParseError {
    ParseError::BadRequest(reason)
}

impl ChunkedDecoder {
    /// A decoder with the default limits ([`DEFAULT_MAX_LINE`], [`DEFAULT_MAX_TRAILERS`]).
    pub fn new() -> Self {
        Self::with_limits(DEFAULT_MAX_LINE, DEFAULT_MAX_TRAILERS)
    }

    /// A decoder refusing size lines longer than `max_line` bytes and trailer sections
    /// larger than `max_trailers` bytes (both exclusive of line ends). The limits bound
    /// how much a client can make us read without any body progress.
    pub fn with_limits(max_line: usize, max_trailers: usize) -> Self {
        ChunkedDecoder {
            state: State::Size { size: 0, digits: 0 },
            line_len: 0,
            trailer_len: 0,
            total: 0,
            max_line,
            max_trailers,
            kept: None,
        }
    }

    /// Keep the trailer section (within the same limit) rather than drop it: a proxy
    /// passing an upstream's trailers on.
    pub fn keep_trailers(&mut self) {
        self.kept = Some(Vec::new());
    }

    /// The trailer fields kept, once the body is done: `(name, value)` pairs, the value
    /// trimmed; lines without a `:` are left out.
    pub fn take_trailers(&mut self) -> Vec<(String, String)> {
        let Some(kept) = self.kept.take() else {
            return Vec::new();
        };
        kept.split(|&b| b == b'\n')
            .filter_map(|line| {
                let at = line.iter().position(|&b| b == b':')?;
                let name = std::str::from_utf8(&line[..at]).ok()?.trim();
                let value = String::from_utf8_lossy(&line[at + 1..]).trim().to_string();
                (!name.is_empty()).then(|| (name.to_string(), value))
            })
            .collect()
    }

    /// Body bytes returned so far (for `client_max_body_size`).
    pub fn decoded_total(&self) -> u64 {
        self.total
    }

    /// Whether the whole body, trailers included, has been consumed.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consume from `buf` up to the next piece of body data, the end of the body, or the end
    /// of `buf`. After `Done` every call returns `Done` and leaves `buf` alone.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Chunk, ParseError> {
        loop {
            if let State::Data { left } = self.state {
                if buf.is_empty() {
                    return Ok(Chunk::NeedMore);
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let left = left - n as u64;
                self.state = if left == 0 {
                    State::DataEnd
                } else {
                    State::Data { left }
                };
                self.total = self.total.saturating_add(n as u64);
                return Ok(Chunk::Data(buf.split_to(n).freeze()));
            }
            if self.state == State::Done {
                return Ok(Chunk::Done);
            }
            // Framing bytes: one at a time (they are few), consumed as they are understood.
            let Some(&c) = buf.first() else {
                return Ok(Chunk::NeedMore);
            };
            buf.advance(1);
            self.state = self.step(c)?;
        }
    }

    /// Advance the framing state machine by one byte.
    fn step(&mut self, c: u8) -> Result<State, ParseError> {
        Ok(match self.state {
            State::Size { size, digits } => {
                self.count_line()?;
                match (hex(c), digits) {
                    (Some(d), _) => {
                        let size = size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(u64::from(d)))
                            .ok_or(bad("chunk size overflow"))?;
                        State::Size {
                            size,
                            digits: digits + 1,
                        }
                    }
                    (None, 0) => return Err(bad("invalid chunk size")),
                    (None, _) => self.after_size(size, c)?,
                }
            }
            State::Ext { size } => {
                self.count_line()?;
                match c {
                    b'\r' | b'\n' => self.after_size(size, c)?,
                    // Extensions are ignored, but a NUL or other control byte is garbage.
                    b'\t' | 0x20..=0x7e | 0x80..=0xff => State::Ext { size },
                    _ => return Err(bad("invalid chunk extension")),
                }
            }
            State::SizeLf { size } => match c {
                b'\n' => self.size_line_done(size),
                _ => return Err(bad("invalid chunk size line end")),
            },
            State::DataEnd => match c {
                b'\r' => State::DataLf,
                b'\n' => State::Size { size: 0, digits: 0 },
                _ => return Err(bad("missing CRLF after chunk data")),
            },
            State::DataLf => match c {
                b'\n' => State::Size { size: 0, digits: 0 },
                _ => return Err(bad("missing CRLF after chunk data")),
            },
            State::TrailerStart => match c {
                b'\r' => State::TrailerLf { last: true },
                b'\n' => State::Done,
                _ => self.trailer_byte(c)?,
            },
            State::TrailerLine => match c {
                b'\r' => State::TrailerLf { last: false },
                b'\n' => self.trailer_line_end(),
                _ => self.trailer_byte(c)?,
            },
            State::TrailerLf { last } => match (c, last) {
                (b'\n', true) => State::Done,
                (b'\n', false) => self.trailer_line_end(),
                _ => return Err(bad("invalid trailer line end")),
            },
            // `decode` handles these two before calling `step`.
            State::Data { .. } | State::Done => self.state,
        })
    }

    /// The byte after the size digits: a line end, or the start of whitespace/extensions.
    fn after_size(&mut self, size: u64, c: u8) -> Result<State, ParseError> {
        Ok(match c {
            b'\r' => State::SizeLf { size },
            b'\n' => self.size_line_done(size),
            // nginx allows whitespace before the `;` of an extension.
            b';' | b' ' | b'\t' => State::Ext { size },
            _ => return Err(bad("invalid chunk size")),
        })
    }

    fn size_line_done(&mut self, size: u64) -> State {
        self.line_len = 0;
        if size == 0 {
            State::TrailerStart
        } else {
            State::Data { left: size }
        }
    }

    fn count_line(&mut self) -> Result<(), ParseError> {
        self.line_len += 1;
        if self.line_len > self.max_line {
            return Err(bad("chunk size line too long"));
        }
        Ok(())
    }

    fn trailer_byte(&mut self, c: u8) -> Result<State, ParseError> {
        self.trailer_len += 1;
        if self.trailer_len > self.max_trailers {
            return Err(bad("chunk trailers too large"));
        }
        // Trailers are skipped, but control bytes (other than HTAB) are never valid there.
        if c < 0x20 && c != b'\t' || c == 0x7f {
            return Err(bad("invalid trailer"));
        }
        if let Some(k) = &mut self.kept {
            k.push(c);
        }
        Ok(State::TrailerLine)
    }

    fn trailer_line_end(&mut self) -> State {
        if let Some(k) = &mut self.kept {
            k.push(b'\n');
        }
        State::TrailerStart
    }
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}
