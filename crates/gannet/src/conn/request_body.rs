//! A request body read whole before it goes to an application (nginx's request
//! buffering), held within a memory budget: up to `client_body_buffer_size` in memory,
//! else in an unlinked temporary file (see `conn::temp_file` and `modules::client_body`),
//! written as it comes in pieces of at most that size and read back in bounded pieces when
//! it is sent. HTTP/1.x and HTTP/2 read it through the same [`read`]; the gateways send it
//! with [`BodyFile::piece`], and mirrored copies share it.

use super::body::{BodyError, BodySource};
use super::temp_file::{self, TempFile};
use crate::errlog::{self, Level};
use crate::http::request::Request;
use std::os::unix::fs::FileExt;

/// A body read whole.
pub enum RequestBody {
    /// Up to `client_body_buffer_size` (what `$request_body` gives).
    Memory(Vec<u8>),
    File(BodyFile),
}

impl RequestBody {
    pub fn len(&self) -> u64 {
        match self {
            RequestBody::Memory(v) => v.len() as u64,
            RequestBody::File(f) => f.len,
        }
    }
}

/// A body in an unlinked temporary file.
pub struct BodyFile {
    file: std::fs::File,
    len: u64,
}

impl BodyFile {
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The body's bytes from `at` into `buf` (at most its length); 0 at the end. A read of
    /// a file in the page cache does not block for long; nginx reads its temp files from
    /// the event loop too.
    pub fn piece(&self, at: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(at);
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        self.file.read_exact_at(&mut buf[..n], at)?;
        Ok(n)
    }
}

/// Why a body could not be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// The client's side: too large, malformed, gone or too slow.
    Client(BodyError),
    /// The temporary file could not be made or written (logged): a 500.
    Store,
}

impl Failed {
    /// The status the request is answered with; `None` when there is nobody to answer.
    pub fn status(self) -> Option<u16> {
        match self {
            Failed::Client(BodyError::TooLarge) => Some(413),
            Failed::Client(BodyError::Malformed) => Some(400),
            Failed::Client(BodyError::Io) => None,
            Failed::Store => Some(500),
        }
    }
}

/// Read the whole body from `src`: in memory while it fits in `client_body_buffer_size`
/// (and `client_body_in_file_only` is off), else into a temporary file, written each time
/// that much has gathered. Memory held: at most the buffer size, whatever the body's size.
pub async fn read<B: BodySource + ?Sized>(
    src: &mut B,
    req: &Request,
) -> Result<RequestBody, Failed> {
    let c = &req.conf.client_body;
    let cap = usize::try_from(c.buffer_size()).unwrap_or(usize::MAX);
    let file_only = c.in_file_only();
    let mut held: Vec<u8> = Vec::new();
    let mut file: Option<(TempFile, u64)> = None;
    while let Some(piece) = src.next_piece().await.map_err(Failed::Client)? {
        if file.is_none() && !file_only && held.len() + piece.len() <= cap {
            held.extend_from_slice(&piece);
            continue;
        }
        let (t, at) = match &mut file {
            Some(f) => f,
            None => file.insert((open(req)?, 0)),
        };
        if held.len() + piece.len() > cap {
            write(req, t, at, &held)?;
            held.clear();
        }
        if piece.len() >= cap {
            write(req, t, at, &piece)?;
        } else {
            held.extend_from_slice(&piece);
        }
    }
    match file {
        None => Ok(RequestBody::Memory(held)),
        Some((mut t, mut at)) => {
            write(req, &mut t, &mut at, &held)?;
            Ok(RequestBody::File(BodyFile {
                file: t.file,
                len: at,
            }))
        }
    }
}

fn open(req: &Request) -> Result<TempFile, Failed> {
    match temp_file::create(&req.conf.client_body.temp_path()) {
        Ok(t) => {
            // nginx's notice of the same event, at its level (the name is the folder for
            // a file that never had one).
            errlog::request(
                Level::Warn,
                req,
                format_args!(
                    "a client request body is buffered to a temporary file {}",
                    t.name.display()
                ),
            );
            Ok(t)
        }
        Err(why) => {
            errlog::request(Level::Crit, req, format_args!("{why}"));
            Err(Failed::Store)
        }
    }
}

/// Append `data` at `*at`, as nginx's `pwrite()`, with its log line on failure.
fn write(req: &Request, t: &mut TempFile, at: &mut u64, data: &[u8]) -> Result<(), Failed> {
    if data.is_empty() {
        return Ok(());
    }
    if let Err(e) = t.file.write_all_at(data, *at) {
        let why = temp_file::failed("pwrite()", &t.name, &e);
        errlog::request(Level::Crit, req, format_args!("{why}"));
        return Err(Failed::Store);
    }
    *at += data.len() as u64;
    Ok(())
}
