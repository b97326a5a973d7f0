//! An application's answer read ahead of a slow client (`*_buffering on`, what nginx's
//! event pipe does): what the client cannot take yet waits in memory up to `*_buffers`,
//! then in a temporary file under `*_temp_path` (unlinked at once, see `conn::temp_file`)
//! up to `*_max_temp_file_size`, written `*_temp_file_write_size` at a time. So the
//! application is read as fast as it sends and its connection is let go as soon as its
//! answer has come, while memory stays bounded; once both are full the application waits
//! for the client. Pieces come out in the order they came, memory first: once anything
//! has gone to the file, what comes next goes there too until the file is drained.
//!
//! The file is written and read from the event loop, as nginx does without `aio`: its
//! pages are in the page cache, and a temp file is the slow path by design.

use super::temp_file::{self, TempFile};
use crate::errlog::{self, Level};
use crate::http::request::Request;
use crate::modules::client_body::TempPath;
use crate::modules::gateway::GatewayConf;
use bytes::Bytes;
use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

pub struct Spool {
    mem: VecDeque<Bytes>,
    mem_len: usize,
    mem_max: usize,
    file: Option<TempFile>,
    /// Bytes written to the file, and read back from it; equal when it is drained.
    written: u64,
    read: u64,
    /// Bytes gathered for the file's next write (they come after the file's).
    pending: Vec<u8>,
    file_max: u64,
    write_size: usize,
    /// The most handed out at once (`*_busy_buffers_size`).
    piece: usize,
    /// The file could not be made or written (logged once): memory alone from then on.
    file_failed: bool,
    temp_path: Arc<TempPath>,
}

impl Spool {
    /// A spool holding `first`, what came with the answer's head.
    pub fn new(c: &GatewayConf, first: Bytes) -> Spool {
        let mem_len = first.len();
        let mut mem = VecDeque::new();
        if !first.is_empty() {
            mem.push_back(first);
        }
        Spool {
            mem,
            mem_len,
            mem_max: c.buffers_total(),
            file: None,
            written: 0,
            read: 0,
            pending: Vec::new(),
            file_max: c.max_temp_file_size(),
            write_size: c.temp_file_write_size(),
            piece: c.busy_buffers_size(),
            file_failed: false,
            temp_path: c.temp_path(),
        }
    }

    /// Whether anything waits for the file or in it: new bytes then go after it.
    fn spilled(&self) -> bool {
        self.read < self.written || !self.pending.is_empty()
    }

    fn file_usable(&self) -> bool {
        self.file_max > 0 && !self.file_failed
    }

    pub fn is_empty(&self) -> bool {
        self.mem.is_empty() && !self.spilled()
    }

    /// Whether another read from the application may be taken in.
    pub fn has_room(&self) -> bool {
        if self.spilled() {
            let held = self.written - self.read + self.pending.len() as u64;
            self.file_usable() && held < self.file_max
        } else {
            self.mem_len < self.mem_max || self.file_usable()
        }
    }

    /// Take in a piece of the answer.
    pub fn push(&mut self, req: &Request, b: Bytes) {
        if !self.spilled() && (self.mem_len < self.mem_max || !self.file_usable()) {
            self.mem_len += b.len();
            self.mem.push_back(b);
            return;
        }
        self.pending.extend_from_slice(&b);
        if self.pending.len() >= self.write_size {
            self.write_out(req);
        }
    }

    /// The next piece, oldest first; `None` when nothing waits.
    pub fn pop(&mut self) -> std::io::Result<Option<Bytes>> {
        if let Some(b) = self.mem.pop_front() {
            self.mem_len -= b.len();
            return Ok(Some(b));
        }
        if self.read < self.written {
            let Some(t) = &self.file else {
                return Ok(None);
            };
            let n = (self.written - self.read).min(self.piece as u64) as usize;
            let mut buf = vec![0u8; n];
            t.file.read_exact_at(&mut buf, self.read)?;
            self.read += n as u64;
            if self.read == self.written {
                // Drained: the next bytes go from the file's start again.
                self.read = 0;
                self.written = 0;
            }
            return Ok(Some(buf.into()));
        }
        if !self.pending.is_empty() {
            return Ok(Some(std::mem::take(&mut self.pending).into()));
        }
        Ok(None)
    }

    /// Write what is gathered to the file (made on first use). A failure is logged with
    /// nginx's wording and leaves the bytes gathered: nothing is lost, the application
    /// waits for the client from then on.
    fn write_out(&mut self, req: &Request) {
        if self.file.is_none() {
            match temp_file::create(&self.temp_path) {
                Ok(t) => {
                    errlog::request(
                        Level::Warn,
                        req,
                        format_args!(
                            "an upstream response is buffered to a temporary file {} while reading upstream",
                            t.name.display()
                        ),
                    );
                    self.file = Some(t);
                }
                Err(why) => {
                    errlog::request(Level::Crit, req, format_args!("{why}"));
                    self.file_failed = true;
                    return;
                }
            }
        }
        let Some(t) = &self.file else {
            return;
        };
        match t.file.write_all_at(&self.pending, self.written) {
            Ok(()) => {
                self.written += self.pending.len() as u64;
                self.pending.clear();
            }
            Err(e) => {
                let why = crate::errlog::failed("pwrite()", &t.name, &e);
                errlog::request(Level::Crit, req, format_args!("{why}"));
                self.file_failed = true;
            }
        }
    }
}
