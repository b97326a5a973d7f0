//! An SSI page being sent (see `modules::ssi`): its own body parsed piece by piece, and each
//! `include` run as a subrequest (`conn::subrequest`) whose body - streamed, filtered by its
//! own location, SSI included - goes out in the include's place.
//! As nginx's, the includes found in the page run side by side: while one include's body
//! goes out, the page is parsed on as far as its body is at hand and the includes found run
//! up to their answers' heads meanwhile; each body goes out in its turn, so the output keeps
//! the page's order whatever the includes' speed. An include the page waits for
//! (`wait="yes"`, `file=`, `set=`) stops the parsing until it is done.

use super::source::Source;
use crate::http::request::Request;
use crate::http::response::Part;
use crate::modules::ssi::{self, Include, Shared, Step};
use crate::runtime::worker::Worker;
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// How far parsing goes ahead of the output: entries (text pieces and includes) held.
const AHEAD: usize = 64;

pub struct Included {
    /// The page's own body.
    inner: Source,
    stream: ssi::Stream,
    child: Option<Box<Child>>,
    /// What the page came to after `child`, in its order, not sent yet.
    ahead: VecDeque<Ahead>,
    /// The page is parsed to its end.
    ended: bool,
    /// Parsing waits for an include (the last one in `ahead`, or `child`) to be done.
    blocked: bool,
}

/// A piece of the page parsed ahead of the output.
enum Ahead {
    Text(Bytes),
    /// An include running up to its answer's head.
    Starting(Pin<Box<dyn Future<Output = Child>>>),
    Started(Box<Child>),
    /// An include to start when its turn comes (no worker to run it alongside).
    Later(Box<Request>, Include),
}

/// An include under way.
struct Child {
    req: Request,
    src: Source,
    include: Include,
    /// Under `set=`: the body so far.
    kept: Vec<u8>,
    /// Whether the body had anything (else a `stub=` stands in).
    any: bool,
    ok: bool,
    /// Its status, for `log_subrequest`.
    status: u16,
    /// The subrequest's answer was itself an SSI page: a stub standing in for it is
    /// parsed too, as nginx sends it through the subrequest's filters.
    parsed: Option<ssi::Setup>,
}

impl Included {
    pub fn new(inner: Source, stream: ssi::Stream) -> Included {
        Included {
            inner,
            stream,
            child: None,
            ahead: VecDeque::new(),
            ended: false,
            blocked: false,
        }
    }

    /// The page's next piece of output; `Ok(None)` at its end.
    pub async fn next(&mut self, w: &Worker, req: &Request) -> Result<Option<Bytes>, ()> {
        loop {
            if self.child.is_none() && self.ahead.is_empty() {
                if self.ended {
                    return Ok(None);
                }
                // Nothing under way: parse on, waiting for the page's body if need be.
                match self.stream.step(req) {
                    Step::Out(b) if b.is_empty() => {}
                    Step::Out(b) => return Ok(Some(b.into())),
                    Step::Include(inc) => self.launch(req, inc),
                    Step::More => {
                        let piece = Box::pin(self.inner.next(w, req)).await?;
                        self.stream.push(piece);
                    }
                    Step::End => self.ended = true,
                }
                continue;
            }
            self.parse_ahead(w, req).await?;
            let Some(c) = &mut self.child else {
                match self.ahead.pop_front() {
                    Some(Ahead::Text(b)) => return Ok(Some(b)),
                    Some(Ahead::Started(c)) => self.child = Some(c),
                    Some(Ahead::Starting(f)) => {
                        self.child = Some(Box::new(alongside_ahead(&mut self.ahead, f).await))
                    }
                    Some(Ahead::Later(r, inc)) => {
                        let (shared, depth) = (self.stream.shared(), self.depth());
                        let c = Box::pin(start(w, *r, inc, shared, depth)).await;
                        self.child = Some(Box::new(c));
                    }
                    None => {}
                }
                continue;
            };
            match alongside_ahead(&mut self.ahead, Box::pin(c.src.next(w, &c.req))).await {
                Ok(Some(b)) if b.is_empty() => {}
                Ok(Some(b)) => {
                    c.any = true;
                    if c.include.set.is_none() {
                        if c.include.stub.is_none() || c.ok {
                            return Ok(Some(b));
                        }
                    } else {
                        // Kept in memory up to the subrequest's
                        // `subrequest_output_buffer_size`; more is an error that ends
                        // the page, as nginx's.
                        let max = c.req.conf.core.subrequest_output_buffer_size();
                        if c.kept.len() + b.len() > max {
                            crate::errlog::request(
                                crate::errlog::Level::Error,
                                &c.req,
                                format_args!("too big subrequest response"),
                            );
                            return Err(());
                        }
                        c.kept.extend_from_slice(&b);
                    }
                }
                end => {
                    if let Some(c) = self.child.take() {
                        self.done(w, *c, end.is_ok());
                    }
                }
            }
        }
    }

    /// The include under way is done: its `set=` variable set, or its stub (if it
    /// answered nothing or failed) sent in its place.
    fn done(&mut self, w: &Worker, c: Child, ended: bool) {
        let Child {
            req: sub,
            src,
            include,
            kept,
            any,
            ok,
            status,
            parsed,
        } = c;
        if ended {
            src.finish(w);
        }
        if status != 0 {
            super::subrequest::log(w, &sub, status);
        }
        if include.wait {
            self.blocked = false;
        }
        if let Some(name) = &include.set {
            if ok {
                self.stream.shared().borrow_mut().set_included(name, kept);
            }
        } else if let Some(stub) = include.stub.filter(|_| !any || !ok) {
            let text = Source::Parts([Part::Bytes(stub.into())].into());
            let src = match parsed {
                Some(setup) => {
                    let shared = self.stream.shared();
                    let s = ssi::Stream::new(setup, Some(shared), self.depth());
                    Source::Ssi(Box::new(Included::new(text, s)))
                }
                None => text,
            };
            self.child = Some(Box::new(Child {
                req: sub,
                src,
                include: Include::default(),
                kept: Vec::new(),
                any: false,
                ok: true,
                // Logged already: a stub is no subrequest of its own.
                status: 0,
                parsed: None,
            }));
        }
    }

    /// Parse the page on while something is under way, as far as its body is at hand and
    /// no include is waited for: the includes found start at once.
    async fn parse_ahead(&mut self, w: &Worker, req: &Request) -> Result<(), ()> {
        while !self.ended && !self.blocked && self.ahead.len() < AHEAD {
            match self.stream.step(req) {
                Step::Out(b) if b.is_empty() => {}
                Step::Out(b) => self.ahead.push_back(Ahead::Text(b.into())),
                Step::Include(inc) => self.launch(req, inc),
                Step::More if self.inner.at_hand() => {
                    let piece = Box::pin(self.inner.next(w, req)).await?;
                    self.stream.push(piece);
                }
                Step::More => break,
                Step::End => self.ended = true,
            }
        }
        Ok(())
    }

    /// Start the include's subrequest, to run alongside whatever goes out before it.
    fn launch(&mut self, req: &Request, include: Include) {
        self.blocked = include.wait;
        let r = super::subrequest::request(req, include.uri.clone(), include.args.clone());
        let (shared, depth) = (self.stream.shared(), self.depth());
        self.ahead
            .push_back(match crate::runtime::worker::current() {
                Some(w) => Ahead::Starting(Box::pin(async move {
                    start(&w, r, include, shared, depth).await
                })),
                None => Ahead::Later(Box::new(r), include),
            });
    }

    /// How deep this page's includes are.
    fn depth(&self) -> u8 {
        self.stream.depth + 1
    }

    pub fn may_pause(&self) -> bool {
        self.inner.may_pause()
    }

    pub fn at_hand(&self) -> bool {
        self.child.is_none()
            && match self.ahead.front() {
                Some(a) => matches!(a, Ahead::Text(_)),
                None => self.ended || (!self.blocked && self.inner.at_hand()),
            }
    }

    pub async fn alongside<T>(
        &mut self,
        w: &Worker,
        req: &Request,
        send: impl std::future::Future<Output = T>,
    ) -> T {
        let ahead = &mut self.ahead;
        match &mut self.child {
            Some(c) => alongside_ahead(ahead, Box::pin(c.src.alongside(w, &c.req, send))).await,
            None => alongside_ahead(ahead, Box::pin(self.inner.alongside(w, req, send))).await,
        }
    }

    pub fn finish(self, w: &Worker) {
        self.inner.finish(w);
    }
}

/// Run the include's subrequest `r` up to its body.
async fn start(
    w: &Worker,
    mut r: Request,
    include: Include,
    shared: Rc<RefCell<Shared>>,
    depth: u8,
) -> Child {
    let (mut resp, streamed) = Box::pin(super::subrequest::run(w, &mut r)).await;
    let src = match streamed {
        Some(s) => Source::App(s),
        None => Source::whole(&mut resp),
    };
    let parsed = resp.rewrites.as_ref().and_then(|r| r.ssi);
    let src = src.filtered_in(&mut resp, Some((shared, depth)));
    Child {
        req: r,
        src,
        parsed,
        ok: resp.status < 300,
        status: resp.status,
        include,
        kept: Vec::new(),
        any: false,
    }
}

/// Await `fut` while the includes parsed ahead run up to their answers' heads.
async fn alongside_ahead<F: Future + Unpin>(ahead: &mut VecDeque<Ahead>, mut fut: F) -> F::Output {
    std::future::poll_fn(|cx: &mut Context<'_>| {
        for a in ahead.iter_mut() {
            if let Ahead::Starting(f) = a {
                if let Poll::Ready(c) = f.as_mut().poll(cx) {
                    *a = Ahead::Started(Box::new(c));
                }
            }
        }
        Pin::new(&mut fut).poll(cx)
    })
    .await
}
