//! A request body's stream window as nginx keeps it, over the h2 crate's.
//!
//! nginx gives each stream `http2_body_preread_size` of window (its SETTINGS), and when a
//! request starts reading its body whole (not `*_request_buffering off`, not gRPC) it lifts
//! that stream out of flow control: one WINDOW_UPDATE opens the window to the most HTTP/2
//! allows (ngx_http_v2_read_request_body, `no_flow_control`). nginx handles a request's
//! HEADERS at once, up to where the request first waits, before it reads the next frame;
//! so a client that sends more DATA than the window right behind its HEADERS (nginx's own
//! tests send a 66,000-byte body as one frame) is served when the location reads the body
//! whole at once, and reset (FLOW_CONTROL_ERROR) when it does not (`limit_req` holds it, the
//! body is discarded or passed on unbuffered).
//!
//! The h2 crate cannot widen a stream's window past its initial size: it gives window back
//! only as the stream's data is taken (`release_capacity`), and resets a stream sent more
//! than that. So that gannet takes what nginx takes, without forking the crate, this layer
//! sits around its codec on a client's connection:
//!
//! - `conn::h2_mend` (reading) follows each body's window as the codec sees it (the
//!   codec's initial window, less the DATA given to it, plus the WINDOW_UPDATEs it writes)
//!   and gives it no more DATA than that: a frame past it is cut into frames within it
//!   (16 KiB at most), the rest waiting for the codec's next WINDOW_UPDATE. DATA past the
//!   window that comes before the stream's task first waited waits for it; if by then
//!   the body is read whole, it goes on as the window lets it, else it is given on as it
//!   is, for the codec to reset the stream as nginx does.
//! - `conn::h2_goaway`'s writer reports the codec's WINDOW_UPDATE and RST_STREAM frames,
//!   and writes nginx's WINDOW_UPDATE for a body read whole: the most the client may then
//!   have in flight is as good as unlimited, and the codec's own updates (never more than
//!   the DATA it was given) cannot push the client's window past 2^31-1.
//! - The stream's task says when it first waits ([`watch`]), when it reads its body
//!   whole ([`Windows::open`]) and when it reads it off unwanted ([`Windows::drain`]: nginx
//!   would have answered and closed the stream, ignoring DATA past the window, which
//!   gannet then takes and drops).
//!
//! Only streams whose HEADERS left a body to come are followed, and only until their task
//! ends; a client that keeps to its window never has a frame cut or held.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::task::Waker;

/// The largest window HTTP/2 allows (RFC 9113 6.9.1).
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// HTTP/2's initial stream window until SETTINGS say otherwise.
const DEFAULT_WINDOW: u32 = 65_535;

/// Where a stream's body stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Its task has not waited yet: DATA past the window waits for it.
    Fresh,
    /// Its task waited without reading the body whole: DATA past the window is the
    /// codec's to judge.
    Waiting,
    /// Its body is read whole: the client's window is opened, the codec's is kept to.
    Open,
    /// Its body is read off unwanted: what the client sends past the window is taken (and
    /// dropped) as the codec's window lets it; the client's window is not opened. nginx
    /// answers such a request at once and ignores the DATA that comes after; gannet reads
    /// the body off first (`conn::h2`), and so takes it rather than reset the stream.
    Drain,
}

struct Track {
    sid: u32,
    phase: Phase,
    /// The codec's window for the stream: what it may still be given.
    window: i64,
    /// The codec was given the body's end (END_STREAM): as nginx, whose body is all
    /// there when it is read, the client's window is not opened then.
    ended: bool,
}

#[derive(Default)]
struct Inner {
    streams: Vec<Track>,
    /// Streams whose client window is to be opened (WINDOW_UPDATE to write).
    open: Vec<u32>,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

/// What a client's connection shares between the mend, the writer and its streams' tasks.
pub struct Windows {
    /// The codec's initial stream window (`http2_body_preread_size`).
    initial: u32,
    /// The largest frame the codec takes (SETTINGS_MAX_FRAME_SIZE): a longer DATA frame is
    /// its FRAME_SIZE_ERROR, never cut.
    max_frame: u32,
    inner: RefCell<Inner>,
}

/// How much of a DATA frame the codec may be given now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Allow {
    /// Up to this much (more than zero).
    Upto(usize),
    /// Nothing until the window opens or the stream's task waits.
    Wait,
    /// All of it: the codec judges (an unfollowed stream, or one past its first wait).
    All,
}

impl Windows {
    pub fn new(initial: u32, max_frame: u32) -> Windows {
        Windows {
            initial,
            max_frame,
            inner: RefCell::default(),
        }
    }

    fn with<R>(&self, sid: u32, f: impl FnOnce(&mut Track) -> R) -> Option<R> {
        let mut inner = self.inner.borrow_mut();
        inner.streams.iter_mut().find(|t| t.sid == sid).map(f)
    }

    fn wake_reader(inner: &mut Inner) {
        if let Some(w) = inner.reader.take() {
            w.wake();
        }
    }

    /// A request's HEADERS left a body to come on stream `sid`.
    pub fn body_expected(&self, sid: u32) {
        let mut inner = self.inner.borrow_mut();
        if inner.streams.iter().all(|t| t.sid != sid) {
            inner.streams.push(Track {
                sid,
                phase: Phase::Fresh,
                window: i64::from(self.initial),
                ended: false,
            });
        }
    }

    /// A whole DATA frame of `len` (window-counted) bytes on `sid` (`end`: with
    /// END_STREAM) may go to the codec as it is: it fits the window (then counted) or the
    /// stream is not followed, or the frame is over the largest the codec takes.
    pub fn take_whole(&self, sid: u32, len: usize, end: bool) -> bool {
        if len > self.max_frame as usize {
            return true;
        }
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        self.with(sid, |t| {
            if t.window >= len {
                t.window -= len;
                t.ended |= end;
                true
            } else {
                false
            }
        })
        .unwrap_or(true)
    }

    /// How much of a frame cut on `sid` may go on now.
    pub fn allow(&self, sid: u32) -> Allow {
        self.with(sid, |t| match (t.phase, t.window) {
            (Phase::Waiting, _) => Allow::All,
            (_, w) if w > 0 => Allow::Upto(usize::try_from(w).unwrap_or(usize::MAX)),
            _ => Allow::Wait,
        })
        .unwrap_or(Allow::All)
    }

    /// `n` bytes of DATA were given to the codec on `sid` (`end`: the body's end) without
    /// regard to its window (a piece of a cut frame, or a padded frame).
    pub fn given(&self, sid: u32, n: usize, end: bool) {
        self.with(sid, |t| {
            t.window -= i64::try_from(n).unwrap_or(i64::MAX);
            t.ended |= end;
        });
    }

    /// The mend waits for a window (or a decision): `waker` is woken when either comes.
    pub fn wait_reader(&self, waker: &Waker) {
        let mut inner = self.inner.borrow_mut();
        match &inner.reader {
            Some(w) if w.will_wake(waker) => {}
            _ => inner.reader = Some(waker.clone()),
        }
    }

    /// The codec wrote a WINDOW_UPDATE of `inc` on stream `sid`.
    pub fn codec_update(&self, sid: u32, inc: u32) {
        let mut inner = self.inner.borrow_mut();
        if let Some(t) = inner.streams.iter_mut().find(|t| t.sid == sid) {
            t.window += i64::from(inc);
            Self::wake_reader(&mut inner);
        }
    }

    /// The stream is over for the codec (it wrote RST_STREAM), or for its task.
    pub fn forget(&self, sid: u32) {
        let mut inner = self.inner.borrow_mut();
        if let Some(i) = inner.streams.iter().position(|t| t.sid == sid) {
            inner.streams.swap_remove(i);
            Self::wake_reader(&mut inner);
        }
    }

    /// The stream's task waited for the first time: unless its body is read whole by now,
    /// DATA past its window is the codec's to judge.
    fn first_wait(&self, sid: u32) {
        let mut inner = self.inner.borrow_mut();
        if let Some(t) = inner.streams.iter_mut().find(|t| t.sid == sid) {
            if t.phase == Phase::Fresh {
                t.phase = Phase::Waiting;
                Self::wake_reader(&mut inner);
            }
        }
    }

    /// Stream `sid` reads its body off unwanted: DATA past its window is taken as the
    /// codec's window lets it (`Phase::Drain`).
    pub fn drain(&self, sid: u32) {
        let mut inner = self.inner.borrow_mut();
        if let Some(t) = inner.streams.iter_mut().find(|t| t.sid == sid) {
            if t.phase != Phase::Open {
                t.phase = Phase::Drain;
                Self::wake_reader(&mut inner);
            }
        }
    }

    /// Stream `sid` reads its body whole: as nginx, the client's window is opened to the
    /// most (written by the writer, which is woken for it).
    pub fn open(&self, sid: u32) {
        let mut inner = self.inner.borrow_mut();
        let Some(t) = inner.streams.iter_mut().find(|t| t.sid == sid) else {
            return;
        };
        if t.phase == Phase::Open {
            return;
        }
        t.phase = Phase::Open;
        if t.ended {
            return;
        }
        inner.open.push(sid);
        Self::wake_reader(&mut inner);
        if let Some(w) = inner.writer.take() {
            w.wake();
        }
    }

    /// The writer's turn: `waker` is woken when there is a WINDOW_UPDATE to write.
    pub fn wait_writer(&self, waker: &Waker) {
        let mut inner = self.inner.borrow_mut();
        match &inner.writer {
            Some(w) if w.will_wake(waker) => {}
            _ => inner.writer = Some(waker.clone()),
        }
    }

    /// The WINDOW_UPDATE frames to write now (appended to `out`). The increment leaves
    /// room for the codec's own updates: those never add up to more than the DATA it was
    /// given, so the client's window stays within 2^31-1 whatever it believed the initial
    /// window was (the default, before it read SETTINGS, or ours).
    pub fn updates(&self, out: &mut Vec<u8>) {
        let mut inner = self.inner.borrow_mut();
        let inc = MAX_WINDOW - self.initial.max(DEFAULT_WINDOW);
        for sid in inner.open.drain(..) {
            out.extend_from_slice(&[0, 0, 4, WINDOW_UPDATE, 0]);
            out.extend_from_slice(&sid.to_be_bytes());
            out.extend_from_slice(&inc.to_be_bytes());
        }
    }
}

const WINDOW_UPDATE: u8 = 0x8;

tokio::task_local! {
    /// The stream a task serves, and its connection's windows.
    static BODY: (Rc<Windows>, u32);
}

/// The stream whose task this is reads its body whole (`Windows::open`); nothing outside a
/// client's HTTP/2 stream.
pub fn open_body() {
    let _ = BODY.try_with(|(w, sid)| w.open(*sid));
}

/// The stream whose task this is reads its body off unwanted (`Windows::drain`).
pub fn drain_body() {
    let _ = BODY.try_with(|(w, sid)| w.drain(*sid));
}

/// Run a stream's task, telling `windows` when it first waits and when it ends.
pub async fn watch<F: Future>(windows: Rc<Windows>, sid: u32, task: F) -> F::Output {
    struct Ended(Rc<Windows>, u32);
    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.forget(self.1);
        }
    }
    let ended = Ended(windows.clone(), sid);
    let task = BODY.scope((windows, sid), task);
    let mut task = std::pin::pin!(task);
    let mut waited = false;
    std::future::poll_fn(|cx| {
        let r = task.as_mut().poll(cx);
        if r.is_pending() && !waited {
            waited = true;
            ended.0.first_wait(sid);
        }
        r
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_followed() {
        let w = Windows::new(100, 16_384);
        assert!(w.take_whole(1, 1000, false), "an unfollowed stream passes");
        w.body_expected(1);
        assert!(
            w.take_whole(1, 16_385, false),
            "over the largest frame: the codec's"
        );
        w.body_expected(3);
        assert!(w.take_whole(3, 60, false));
        assert!(!w.take_whole(3, 60, true));
        assert_eq!(w.allow(3), Allow::Upto(40));
        w.given(3, 40, false);
        assert_eq!(w.allow(3), Allow::Wait);
        w.first_wait(3);
        assert_eq!(w.allow(3), Allow::All);
        w.forget(3);
        assert!(w.take_whole(3, 1000, false));
    }

    #[test]
    fn whole_body_opens_nothing() {
        let w = Windows::new(65_536, 131_072);
        w.body_expected(1);
        assert!(w.take_whole(1, 4, true));
        w.open(1);
        let mut out = Vec::new();
        w.updates(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn opened_window_written_once() {
        let w = Windows::new(65_536, 131_072);
        w.body_expected(5);
        w.given(5, 65_536, false);
        w.open(5);
        w.open(5);
        assert_eq!(w.allow(5), Allow::Wait);
        let mut out = Vec::new();
        w.updates(&mut out);
        assert_eq!(out.len(), 13);
        assert_eq!(&out[5..9], &5u32.to_be_bytes());
        let inc = u32::from_be_bytes([out[9], out[10], out[11], out[12]]);
        assert_eq!(inc, MAX_WINDOW - 65_536);
        w.codec_update(5, 30_000);
        assert_eq!(w.allow(5), Allow::Upto(30_000));
        // Open stays open past the first wait.
        w.first_wait(5);
        assert_eq!(w.allow(5), Allow::Upto(30_000));
    }
}
