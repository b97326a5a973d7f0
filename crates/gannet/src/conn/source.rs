//! Where a streamed response body comes from: an application's answer as it arrives, or a
//! body already at hand (a large file) that is compressed on the way out
//! (`Response::encode`). The connection sends both the same way, piece by piece.

use super::gateway::Streaming;
use crate::errlog::{self, Level};
use crate::http::request::Request;
use crate::http::response::Part;
use crate::runtime::worker::Worker;
use bytes::Bytes;
use std::collections::VecDeque;
use std::os::unix::fs::FileExt;

/// Files are read (for compression) in pieces of this size.
const PIECE: u64 = 64 * 1024;

pub enum Source {
    App(Box<Streaming>),
    Parts(VecDeque<Part>),
}

impl Source {
    /// The next piece; `Ok(None)` at the end. An error is logged and cuts the body short.
    pub async fn next(&mut self, req: &Request) -> Result<Option<Bytes>, ()> {
        match self {
            Source::App(s) => s.next(req).await,
            Source::Parts(parts) => {
                let Some(part) = parts.front_mut() else {
                    return Ok(None);
                };
                match part {
                    Part::Bytes(b) => {
                        let b = std::mem::take(b);
                        parts.pop_front();
                        Ok(Some(b))
                    }
                    Part::File(f) => {
                        // Blocking pread, as sendfile off does: the file is in the page cache
                        // in the cases that matter, and compressing costs more than reading.
                        let mut buf = vec![0u8; f.len.min(PIECE) as usize];
                        match f.file.read_at(&mut buf, f.offset) {
                            Ok(0) | Err(_) => {
                                errlog::request(
                                    Level::Error,
                                    req,
                                    format_args!("file truncated or unreadable while sending"),
                                );
                                Err(())
                            }
                            Ok(n) => {
                                buf.truncate(n);
                                f.offset += n as u64;
                                f.len -= n as u64;
                                if f.len == 0 {
                                    parts.pop_front();
                                }
                                Ok(Some(buf.into()))
                            }
                        }
                    }
                }
            }
        }
    }

    /// Whether the source may pause between pieces (an application): compressed output is
    /// then flushed after each piece rather than held for a fuller block.
    pub fn may_pause(&self) -> bool {
        matches!(self, Source::App(_))
    }

    /// Whether the next piece is at hand, with no wait for an application (a file's pieces
    /// always are): a write may then wait to gather more.
    pub fn at_hand(&self) -> bool {
        match self {
            Source::App(s) => s.at_hand(),
            Source::Parts(_) => true,
        }
    }

    /// Run `send`, a write of what came to the client; meanwhile an application's buffered
    /// answer is read ahead of the client (see `gateway::Streaming::alongside`).
    pub async fn alongside<T>(
        &mut self,
        w: &Worker,
        req: &Request,
        send: impl std::future::Future<Output = T>,
    ) -> T {
        match self {
            Source::App(s) => s.alongside(w, req, send).await,
            Source::Parts(_) => send.await,
        }
    }

    /// The body was sent whole: an application's connection may go back to its pool.
    pub fn finish(self, w: &Worker) {
        if let Source::App(s) = self {
            s.finish(w);
        }
    }
}
