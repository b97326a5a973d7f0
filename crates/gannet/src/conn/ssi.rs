//! An SSI page being sent (see `modules::ssi`): its own body parsed piece by piece, and each
//! `include` run as a subrequest (`conn::subrequest`) whose body - streamed, filtered by its
//! own location, SSI included - goes out in the include's place before the page goes on.
//! Only one include runs at a time, so bodies come out in order whatever their speed.

use super::source::Source;
use crate::http::request::Request;
use crate::http::response::Part;
use crate::modules::ssi::{self, Include, Step};
use crate::runtime::worker::Worker;
use bytes::Bytes;

pub struct Included {
    /// The page's own body.
    inner: Source,
    stream: ssi::Stream,
    child: Option<Box<Child>>,
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
        }
    }

    /// The page's next piece of output; `Ok(None)` at its end.
    pub async fn next(&mut self, w: &Worker, req: &Request) -> Result<Option<Bytes>, ()> {
        loop {
            if let Some(c) = &mut self.child {
                match Box::pin(c.src.next(w, &c.req)).await {
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
                        let Some(c) = self.child.take() else { continue };
                        let Child {
                            req: sub,
                            src,
                            include,
                            kept,
                            any,
                            ok,
                            status,
                            parsed,
                        } = *c;
                        if end.is_ok() {
                            src.finish(w);
                        }
                        if status != 0 {
                            super::subrequest::log(w, &sub, status);
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
                }
                continue;
            }
            match self.stream.step(req) {
                Step::Out(b) if b.is_empty() => {}
                Step::Out(b) => return Ok(Some(b.into())),
                Step::Include(inc) => self.child = Some(Box::new(self.start(w, req, inc).await)),
                Step::More => {
                    let piece = Box::pin(self.inner.next(w, req)).await?;
                    self.stream.push(piece);
                }
                Step::End => return Ok(None),
            }
        }
    }

    /// Run the include's subrequest up to its body.
    async fn start(&self, w: &Worker, req: &Request, include: Include) -> Child {
        let mut r = super::subrequest::request(req, include.uri.clone(), include.args.clone());
        let (mut resp, streamed) = Box::pin(super::subrequest::run(w, &mut r)).await;
        let src = match streamed {
            Some(s) => Source::App(s),
            None => Source::whole(&mut resp),
        };
        let parsed = resp.rewrites.as_ref().and_then(|r| r.ssi);
        let src = src.filtered_in(&mut resp, Some((self.stream.shared(), self.depth())));
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

    /// How deep this page's includes are.
    fn depth(&self) -> u8 {
        self.stream.depth + 1
    }

    pub fn may_pause(&self) -> bool {
        self.inner.may_pause()
    }

    pub fn at_hand(&self) -> bool {
        self.child.is_none() && self.inner.at_hand()
    }

    pub async fn alongside<T>(
        &mut self,
        w: &Worker,
        req: &Request,
        send: impl std::future::Future<Output = T>,
    ) -> T {
        match &mut self.child {
            Some(c) => Box::pin(c.src.alongside(w, &c.req, send)).await,
            None => Box::pin(self.inner.alongside(w, req, send)).await,
        }
    }

    pub fn finish(self, w: &Worker) {
        self.inner.finish(w);
    }
}
