//! Where a streamed response body comes from: an application's answer as it arrives, or a
//! body already at hand (a large file) that is compressed on the way out
//! (`Response::encode`). The connection sends both the same way, piece by piece.

use super::gateway::Streaming;
use crate::errlog::{self, Level};
use crate::http::request::Request;
use crate::http::response::{Body, Part, Response};
use crate::modules::{addition, charset, gunzip, ssi, sub_filter};
use crate::runtime::worker::Worker;
use bytes::Bytes;
use std::collections::VecDeque;
use std::os::unix::fs::FileExt;

/// Files are read (for compression) in pieces of this size.
const PIECE: u64 = 64 * 1024;

pub enum Source {
    App(Box<Streaming>),
    Parts(VecDeque<Part>),
    /// Another source's pieces parsed for SSI commands (`conn::ssi` runs its includes).
    Ssi(Box<super::ssi::Included>),
    /// Another source's gzip pieces inflated (`gunzip`).
    Gunzip(Box<Source>, Box<gunzip::Stream>),
    /// Another source's pieces rewritten by `sub_filter`.
    Sub(Box<Source>, Box<sub_filter::Stream>),
    /// Another source's pieces recoded by the charset module.
    Recode(Box<Source>, Box<charset::Stream>),
    /// Another source's pieces with subrequests' bodies before and after them.
    Addition(Box<Addition>),
    /// The first slice of a sliced answer, the others fetched after it (`conn::slice`).
    Slice(Box<super::slice::Chain>),
}

/// The main answer's body (filtered by its own location) between the bodies of the
/// `add_before_body` and `add_after_body` subrequests, each run when its turn comes.
pub struct Addition {
    around: addition::Around,
    main: Source,
    main_done: bool,
    /// The subrequest being sent, and its body.
    sub: Option<super::subrequest::Body>,
}

impl Source {
    /// `self` rewritten by the response's `sub_filter` strings, then recoded to its
    /// charset, if it has either (HTTP/1 and HTTP/2 both send streamed bodies through here).
    pub fn filtered(self, resp: &mut Response) -> Source {
        self.filtered_in(resp, None)
    }

    /// [`filtered`](Source::filtered) for a body that is part of an SSI page (`within`: the
    /// page's shared SSI state and how deep the include is).
    pub fn filtered_in(
        self,
        resp: &mut Response,
        within: Option<(std::rc::Rc<std::cell::RefCell<ssi::Shared>>, u8)>,
    ) -> Source {
        let Some(rw) = resp.rewrites.take() else {
            return self;
        };
        // An error page in place of an application's answer: that answer is dropped.
        let s = match self {
            Source::App(_) if rw.own_body => Source::whole(resp),
            s => s,
        };
        // The window (and the slices after it) is the body the other filters see.
        let s = match rw.window {
            Some(win) => Source::Slice(Box::new(super::slice::Chain::new(s, win))),
            None => s,
        };
        let s = if rw.gunzip {
            Source::Gunzip(Box::new(s), Box::default())
        } else {
            s
        };
        let s = match rw.sub_filter {
            Some(p) => Source::Sub(Box::new(s), Box::new(sub_filter::Stream::new(p))),
            None => s,
        };
        let s = match rw.charset {
            Some(r) => Source::Recode(Box::new(s), Box::new(charset::Stream::new(r))),
            None => s,
        };
        let s = match rw.ssi {
            Some(setup) => {
                let (shared, depth) = within.map_or((None, 0), |(s, d)| (Some(s), d));
                let stream = ssi::Stream::new(setup, shared, depth);
                Source::Ssi(Box::new(super::ssi::Included::new(s, stream)))
            }
            None => s,
        };
        // The subrequests' bodies are not the main answer's filters' to rewrite (nginx's
        // postpone filter joins them after those); compression takes them all.
        match rw.addition {
            Some(around) => Source::Addition(Box::new(Addition {
                around,
                main: s,
                main_done: false,
                sub: None,
            })),
            None => s,
        }
    }

    /// A body at hand that must still be streamed: compressed or rewritten while sent.
    pub fn from_body(resp: &mut Response) -> Option<Source> {
        if resp.encode.is_none() && resp.rewrites.is_none() {
            return None;
        }
        Some(Source::whole(resp))
    }

    /// The response's body, taken out of it to be sent piece by piece (chunked, so that
    /// trailer fields can follow it).
    pub fn whole(resp: &mut Response) -> Source {
        match std::mem::take(&mut resp.body) {
            Body::Parts(p) => Source::Parts(p.into()),
            Body::Empty => Source::Parts(VecDeque::new()),
        }
    }

    /// The next piece; `Ok(None)` at the end. An error is logged and cuts the body short.
    pub async fn next(&mut self, w: &Worker, req: &Request) -> Result<Option<Bytes>, ()> {
        match self {
            Source::App(s) => s.next(req).await,
            Source::Sub(inner, sub) => loop {
                if sub.ended() {
                    return Ok(None);
                }
                // Boxed: the inner source's future is of this same function.
                let piece = Box::pin(inner.next(w, req)).await?;
                let last = piece.is_none();
                let out = sub.feed(piece.as_deref().unwrap_or_default(), last);
                // Nothing may come out of a piece that only began a match: read on.
                if !out.is_empty() {
                    return Ok(Some(out.into()));
                }
            },
            // Boxed: the page's includes are sources of this same function.
            Source::Ssi(inc) => Box::pin(inc.next(w, req)).await,
            Source::Slice(c) => Box::pin(c.next(w, req)).await,
            Source::Gunzip(inner, gz) => loop {
                if gz.ended() {
                    return Ok(None);
                }
                let piece = Box::pin(inner.next(w, req)).await?;
                let last = piece.is_none();
                match gz.feed(piece.as_deref().unwrap_or_default(), last) {
                    // A piece of header or of a deflate block may give nothing yet.
                    Ok(out) if out.is_empty() && !last => {}
                    Ok(out) if out.is_empty() => return Ok(None),
                    Ok(out) => return Ok(Some(out.into())),
                    Err(e) => {
                        errlog::request(Level::Error, req, format_args!("inflate() failed: {e}"));
                        return Err(());
                    }
                }
            },
            Source::Addition(a) => loop {
                if let Some(sub) = &mut a.sub {
                    match Box::pin(sub.src.next(w, &sub.req)).await? {
                        Some(piece) => return Ok(Some(piece)),
                        None => {
                            if let Some(sub) = a.sub.take() {
                                sub.src.finish(w);
                                super::subrequest::log(w, &sub.req, sub.status);
                            }
                        }
                    }
                } else if let Some(uri) = a.around.before.take() {
                    a.sub = Some(Box::pin(super::subrequest::body(w, req, &uri)).await);
                } else if !a.main_done {
                    match Box::pin(a.main.next(w, req)).await? {
                        Some(piece) => return Ok(Some(piece)),
                        None => a.main_done = true,
                    }
                } else if let Some(uri) = a.around.after.take() {
                    a.sub = Some(Box::pin(super::subrequest::body(w, req, &uri)).await);
                } else {
                    return Ok(None);
                }
            },
            Source::Recode(inner, rec) => loop {
                if rec.ended() {
                    return Ok(None);
                }
                let piece = Box::pin(inner.next(w, req)).await?;
                let last = piece.is_none();
                let out = rec.feed(piece.as_deref().unwrap_or_default(), last);
                // A piece that held only part of a character gives nothing yet: read on.
                if !out.is_empty() {
                    return Ok(Some(out.into()));
                }
            },
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
        match self {
            Source::App(_) => true,
            Source::Parts(_) => false,
            Source::Sub(inner, _) | Source::Recode(inner, _) | Source::Gunzip(inner, _) => {
                inner.may_pause()
            }
            Source::Ssi(inc) => inc.may_pause(),
            // Subrequests may wait for applications.
            Source::Addition(_) | Source::Slice(_) => true,
        }
    }

    /// Whether the next piece is at hand, with no wait for an application (a file's pieces
    /// always are): a write may then wait to gather more.
    pub fn at_hand(&self) -> bool {
        match self {
            Source::App(s) => s.at_hand(),
            Source::Parts(_) => true,
            Source::Sub(inner, _) | Source::Recode(inner, _) | Source::Gunzip(inner, _) => {
                inner.at_hand()
            }
            Source::Ssi(inc) => inc.at_hand(),
            Source::Slice(c) => c.cur().at_hand(),
            Source::Addition(a) => match &a.sub {
                Some(sub) => sub.src.at_hand(),
                None => a.main_done || a.main.at_hand(),
            },
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
            Source::Sub(inner, _) | Source::Recode(inner, _) | Source::Gunzip(inner, _) => {
                Box::pin(inner.alongside(w, req, send)).await
            }
            Source::Ssi(inc) => Box::pin(inc.alongside(w, req, send)).await,
            Source::Slice(c) => {
                let (src, req) = c.reading(req);
                Box::pin(src.alongside(w, req, send)).await
            }
            Source::Addition(a) => match &mut a.sub {
                Some(sub) => Box::pin(sub.src.alongside(w, &sub.req, send)).await,
                None => Box::pin(a.main.alongside(w, req, send)).await,
            },
        }
    }

    /// The body was sent whole: an application's connection may go back to its pool.
    pub fn finish(self, w: &Worker) {
        match self {
            Source::App(s) => s.finish(w),
            Source::Sub(inner, _) | Source::Recode(inner, _) | Source::Gunzip(inner, _) => {
                inner.finish(w)
            }
            Source::Ssi(inc) => inc.finish(w),
            Source::Addition(a) => a.main.finish(w),
            Source::Slice(c) => c.finish(w),
            Source::Parts(_) => {}
        }
    }
}
