//! FastCGI 1.0 records (the responder role), no I/O: encoders for what a web server sends
//! (BEGIN_REQUEST, PARAMS, STDIN, ABORT_REQUEST) and an incremental decoder for what the
//! application answers (STDOUT, STDERR, END_REQUEST). STDOUT starts with the CGI response
//! head ([`crate::cgi`]).
//!
//! One request per connection at a time (request id 1): multiplexing is optional in the
//! spec, PHP-FPM does not do it, and nginx never asks for it.

use bytes::{Buf, Bytes, BytesMut};

// The head at the start of STDOUT is CGI's, shared with SCGI and uwsgi.
pub use crate::cgi::{parse_head, CgiHead, HeadError};
use crate::cgi::{ParamError, ParamSink};

pub const VERSION: u8 = 1;
pub const BEGIN_REQUEST: u8 = 1;
pub const ABORT_REQUEST: u8 = 2;
pub const END_REQUEST: u8 = 3;
pub const PARAMS: u8 = 4;
pub const STDIN: u8 = 5;
pub const STDOUT: u8 = 6;
pub const STDERR: u8 = 7;
pub const UNKNOWN_TYPE: u8 = 11;

const RESPONDER: u16 = 1;
const FLAG_KEEP_CONN: u8 = 1;
/// The request id gannet uses on every connection (one request at a time).
pub const REQUEST_ID: u16 = 1;
/// The most content one record carries.
pub const MAX_CONTENT: usize = 65535;
pub const HEADER_LEN: usize = 8;

fn header(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.extend_from_slice(&header_bytes(kind, len));
}

fn header_bytes(kind: u8, len: usize) -> [u8; HEADER_LEN] {
    debug_assert!(len <= MAX_CONTENT);
    // Pad content to a multiple of 8, as the spec recommends and nginx does.
    let pad = (8 - len % 8) % 8;
    [
        VERSION,
        kind,
        (REQUEST_ID >> 8) as u8,
        REQUEST_ID as u8,
        (len >> 8) as u8,
        len as u8,
        pad as u8,
        0,
    ]
}

fn padding(out: &mut Vec<u8>, len: usize) {
    let pad = (8 - len % 8) % 8;
    out.extend_from_slice(&[0u8; 8][..pad]);
}

/// BEGIN_REQUEST for the responder role; `keep_conn` asks the application not to close
/// the connection after the request (`fastcgi_keep_conn on`).
pub fn begin_request(out: &mut Vec<u8>, keep_conn: bool) {
    header(out, BEGIN_REQUEST, 8);
    let flags = if keep_conn { FLAG_KEEP_CONN } else { 0 };
    out.extend_from_slice(&[
        (RESPONDER >> 8) as u8,
        RESPONDER as u8,
        flags,
        0,
        0,
        0,
        0,
        0,
    ]);
}

/// ABORT_REQUEST: the client went away.
pub fn abort_request(out: &mut Vec<u8>) {
    header(out, ABORT_REQUEST, 0);
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    if n < 128 {
        out.push(n as u8);
    } else {
        out.extend_from_slice(&((n as u32) | 0x8000_0000).to_be_bytes());
    }
}

/// The PARAMS stream, written straight into the request's output: the pairs follow a record
/// header left blank until [`Params::finish`] knows their length (a separate buffer for the
/// pairs was an allocation and a copy of some 600 bytes per request). Streams over one
/// record's 65,535 bytes are cut into records then.
#[derive(Debug)]
pub struct Params<'a> {
    out: &'a mut Vec<u8>,
    /// Where the first record's header is.
    start: usize,
}

impl<'a> Params<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Params<'a> {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        Params { out, start }
    }

    /// The bytes of the pairs so far.
    pub fn len(&self) -> usize {
        self.out.len() - self.start - HEADER_LEN
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Close the stream: the pairs in as many records as they need, then the empty record
    /// that ends it.
    pub fn finish(self) {
        let len = self.len();
        if len == 0 {
            // No pairs: an empty first record would end the stream by itself.
            self.out.truncate(self.start);
        } else if len <= MAX_CONTENT {
            self.out[self.start..self.start + HEADER_LEN]
                .copy_from_slice(&header_bytes(PARAMS, len));
            padding(self.out, len);
        } else {
            let pairs = self.out.split_off(self.start + HEADER_LEN);
            self.out.truncate(self.start);
            stream(self.out, PARAMS, &pairs);
        }
        header(self.out, PARAMS, 0);
    }
}

impl ParamSink for Params<'_> {
    /// Add one pair. Names and values are limited to 2^31-1 bytes by the format.
    fn push(&mut self, name: &[u8], value: &[u8]) -> Result<(), ParamError> {
        if name.len() > i32::MAX as usize || value.len() > i32::MAX as usize {
            return Err(ParamError::TooBig);
        }
        put_len(self.out, name.len());
        put_len(self.out, value.len());
        self.out.extend_from_slice(name);
        self.out.extend_from_slice(value);
        Ok(())
    }
}

/// Request body bytes as STDIN records (without the end-of-stream record).
pub fn stdin(out: &mut Vec<u8>, data: &[u8]) {
    stream(out, STDIN, data);
}

/// The header of a STDIN record of `len` (at most [`MAX_CONTENT`]) bytes, and how many
/// zero bytes of padding follow them: for a body framed where it lies, without a copy.
pub fn stdin_header(len: usize) -> ([u8; HEADER_LEN], usize) {
    (header_bytes(STDIN, len), (8 - len % 8) % 8)
}

/// The empty STDIN record: the request body is complete.
pub fn stdin_end(out: &mut Vec<u8>) {
    header(out, STDIN, 0);
}

fn stream(out: &mut Vec<u8>, kind: u8, data: &[u8]) {
    for chunk in data.chunks(MAX_CONTENT) {
        header(out, kind, chunk.len());
        out.extend_from_slice(chunk);
        padding(out, chunk.len());
    }
}

/// A record from the application.
#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    Stdout(Bytes),
    Stderr(Bytes),
    /// The request is over: the application's exit status and the protocol status
    /// (0 request complete, 1 cannot multiplex, 2 overloaded, 3 unknown role).
    End {
        app_status: u32,
        protocol_status: u8,
    },
}

/// What is wrong with what the application sent.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum DecodeError {
    /// Not FastCGI version 1: usually not a FastCGI server at all.
    Version(u8),
    /// A record for another request id.
    RequestId(u16),
    /// A record type an application does not send to a web server.
    Type(u8),
    /// END_REQUEST shorter than its 8 bytes.
    ShortEnd,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Version(v) => {
                write!(f, "upstream sent unsupported FastCGI protocol version: {v}")
            }
            DecodeError::RequestId(id) => {
                write!(f, "upstream sent unexpected FastCGI request id {id}")
            }
            DecodeError::Type(t) => write!(f, "upstream sent invalid FastCGI record type: {t}"),
            DecodeError::ShortEnd => {
                f.write_str("upstream sent too short FastCGI END_REQUEST record")
            }
        }
    }
}

/// A record at the front of a buffer, where it lies (see [`peek`]).
#[derive(Debug, PartialEq, Eq)]
pub enum RecordRef<'a> {
    Stdout(&'a [u8]),
    Stderr(&'a [u8]),
    End {
        app_status: u32,
        protocol_status: u8,
    },
    /// A record the web server may ignore: a management record (request id 0), or an
    /// empty STDOUT or STDERR.
    Skip,
}

/// The whole record at the front of `buf`, borrowed, and the bytes it takes (header,
/// content and padding); `Ok(None)` means more bytes are needed. For a caller that takes
/// records apart where they were read, without a buffer of its own for them.
pub fn peek(buf: &[u8]) -> Result<Option<(RecordRef<'_>, usize)>, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let h = &buf[..HEADER_LEN];
    if h[0] != VERSION {
        return Err(DecodeError::Version(h[0]));
    }
    let kind = h[1];
    let id = u16::from_be_bytes([h[2], h[3]]);
    let len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    let used = HEADER_LEN + len + usize::from(h[6]);
    if buf.len() < used {
        return Ok(None);
    }
    // Management records (request id 0) carry no request's data.
    if id == 0 {
        return Ok(Some((RecordRef::Skip, used)));
    }
    if id != REQUEST_ID {
        return Err(DecodeError::RequestId(id));
    }
    let content = &buf[HEADER_LEN..HEADER_LEN + len];
    let record = match kind {
        STDOUT | STDERR if content.is_empty() => RecordRef::Skip,
        STDOUT => RecordRef::Stdout(content),
        STDERR => RecordRef::Stderr(content),
        END_REQUEST => {
            if content.len() < 8 {
                return Err(DecodeError::ShortEnd);
            }
            RecordRef::End {
                app_status: u32::from_be_bytes([content[0], content[1], content[2], content[3]]),
                protocol_status: content[4],
            }
        }
        other => return Err(DecodeError::Type(other)),
    };
    Ok(Some((record, used)))
}

/// The header at the front of `buf` when it starts a STDOUT record of this request with
/// content, whether or not the rest has come: its content length and padding. For a caller
/// that reads the rest of a long record straight into the buffer its content goes to.
pub fn stdout_header(buf: &[u8]) -> Option<(usize, usize)> {
    let h = buf.get(..HEADER_LEN)?;
    let len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    let ours = h[0] == VERSION && h[1] == STDOUT && u16::from_be_bytes([h[2], h[3]]) == REQUEST_ID;
    (ours && len > 0).then_some((len, usize::from(h[6])))
}

/// Take the next whole record off `buf`; `Ok(None)` means more bytes are needed. Records
/// the web server may ignore (an empty STDOUT, GET_VALUES_RESULT...) are skipped.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Record>, DecodeError> {
    loop {
        let Some((record, used)) = peek(buf)? else {
            if buf.len() >= HEADER_LEN {
                // Room for the rest of the record.
                let want = HEADER_LEN + usize::from(u16::from_be_bytes([buf[4], buf[5]]));
                buf.reserve(want + usize::from(buf[6]) - buf.len());
            }
            return Ok(None);
        };
        let stdout = matches!(record, RecordRef::Stdout(_));
        let record = match record {
            RecordRef::Skip => {
                buf.advance(used);
                continue;
            }
            RecordRef::End {
                app_status,
                protocol_status,
            } => Record::End {
                app_status,
                protocol_status,
            },
            RecordRef::Stdout(c) | RecordRef::Stderr(c) => {
                let len = c.len();
                buf.advance(HEADER_LEN);
                let content = buf.split_to(len).freeze();
                buf.advance(used - HEADER_LEN - len);
                return Ok(Some(if stdout {
                    Record::Stdout(content)
                } else {
                    Record::Stderr(content)
                }));
            }
        };
        buf.advance(used);
        return Ok(Some(record));
    }
}

#[cfg(test)]
#[path = "fastcgi_tests.rs"]
mod tests;
