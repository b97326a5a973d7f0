//! The body of a sliced answer (see `modules::slice`): the main request's slice, then a
//! subrequest per further slice, each run when the one before it has been read to its end
//! (so that each is cached whole), checked as nginx's slice filter checks them, and cut to
//! the client's window of the whole. HTTP/1 and HTTP/2 both read it as a `Source`.

use super::source::Source;
use super::subrequest;
use crate::http::request::Request;
use crate::modules::slice::{self, Window};
use crate::runtime::worker::Worker;
use bytes::Bytes;

pub struct Chain {
    win: Window,
    /// The slice being read, and where its next byte is in the whole.
    cur: Source,
    at: u64,
    /// The subrequest `cur` is the answer of (none: the main request's own slice), and
    /// its status for `log_subrequest`.
    sub: Option<(Box<Request>, u16)>,
}

impl Chain {
    pub fn new(first: Source, win: Window) -> Chain {
        Chain {
            at: win.offset,
            win,
            cur: first,
            sub: None,
        }
    }

    /// The next piece of the window; `Err`: a slice failed (logged), the answer is cut.
    pub async fn next(&mut self, w: &Worker, main: &Request) -> Result<Option<Bytes>, ()> {
        loop {
            let req = self.sub.as_ref().map_or(main, |(r, _)| r);
            match Box::pin(self.cur.next(w, req)).await? {
                Some(b) => {
                    let (s, e) = (self.at, self.at + b.len() as u64);
                    self.at = e;
                    let (lo, hi) = (self.win.from.max(s), self.win.to.min(e));
                    // Bytes outside the window are read all the same: the slice is cached whole.
                    if lo < hi {
                        return Ok(Some(b.slice((lo - s) as usize..(hi - s) as usize)));
                    }
                }
                None => {
                    std::mem::replace(&mut self.cur, Source::Parts(Default::default())).finish(w);
                    if let Some((r, status)) = self.sub.take() {
                        subrequest::log(w, &r, status);
                    }
                    let next = match main.slice.borrow().as_deref() {
                        Some(st) if st.start < st.end => st.clone(),
                        _ => return Ok(None),
                    };
                    self.fetch(w, main, &next).await?;
                }
            }
        }
    }

    /// Run the subrequest for the slice at `next.start` and make its answer the one read.
    async fn fetch(&mut self, w: &Worker, main: &Request, next: &slice::State) -> Result<(), ()> {
        let size = main.conf.slice.size();
        let mut r = Box::new(subrequest::request(
            main,
            main.uri.clone(),
            main.args.clone(),
        ));
        *r.slice.borrow_mut() = Some(slice::for_subrequest(next, next.start, size));
        let (mut resp, stream) = Box::pin(subrequest::run(w, &mut r)).await;
        let checked = match main.slice.borrow_mut().as_deref_mut() {
            Some(st) => slice::check(&r, st, &resp),
            None => Err(()),
        };
        let (start, _, _) = checked?;
        self.at = start;
        self.cur = match stream {
            Some(s) => Source::App(s),
            None => Source::whole(&mut resp),
        };
        self.sub = Some((r, resp.status));
        Ok(())
    }

    pub fn cur(&self) -> &Source {
        &self.cur
    }

    /// The source being read and the request it is read for.
    pub fn reading<'a>(&'a mut self, main: &'a Request) -> (&'a mut Source, &'a Request) {
        let req = self.sub.as_ref().map_or(main, |(r, _)| r);
        (&mut self.cur, req)
    }

    pub fn finish(self, w: &Worker) {
        self.cur.finish(w);
    }
}
