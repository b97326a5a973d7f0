//! Time strings, rendered at most once per second per thread: the Date header, `$time_local`,
//! `$time_iso8601`, the error log's and syslog's stamps and autoindex dates. Rendering a date costs more
//! than serving a cached file's bytes, so it must not happen per request.
//!
//! And the time itself, read once per turn of a connection's task ([`Turns`], [`now`],
//! [`wall`]), as nginx reads it once per event-loop turn (`ngx_time_update`): a keep-alive
//! request read, answered and logged in one turn read the clock five times (request start,
//! open file cache, Date, `$time_local`, the next keep-alive deadline) where one read of each
//! clock says the same.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// This thread's time for the turn under way: `None` outside a [`Turns`] poll (the clocks
/// are read every time then), else each clock as first read in this turn.
#[derive(Clone, Copy)]
struct TurnTime {
    mono: Option<Instant>,
    wall: Option<SystemTime>,
}

thread_local! {
    static TURN: Cell<Option<TurnTime>> = const { Cell::new(None) };
}

/// A task whose every poll is one turn: the clocks read during a poll are read once (see
/// the module docs). Only a task that does no long work inside one poll should be wrapped
/// (a connection's loop: its file reads and answers take microseconds); time stands still
/// within a turn, as nginx's cached time does between two event-loop turns.
pub struct Turns<F>(F);

impl<F: Future> Turns<F> {
    pub fn new(f: F) -> Turns<F> {
        Turns(f)
    }
}

impl<F: Future> Future for Turns<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the inner future is structurally pinned: it is never moved out of `self`,
        // nor reached other than through this pinned projection.
        let inner = unsafe { self.map_unchecked_mut(|t| &mut t.0) };
        let _outer = EndTurn(TURN.replace(Some(TurnTime {
            mono: None,
            wall: None,
        })));
        inner.poll(cx)
    }
}

/// Ends a turn however its poll ends (a task that panics is caught by the runtime, which
/// goes on): what ran before it gets its state back, so that no time read in a turn is
/// used after it.
struct EndTurn(Option<TurnTime>);

impl Drop for EndTurn {
    fn drop(&mut self) {
        TURN.set(self.0);
    }
}

/// The monotonic time: the turn's (read once per turn) inside a [`Turns`] task, else now.
pub fn now() -> Instant {
    match TURN.get() {
        None => Instant::now(),
        Some(TurnTime { mono: Some(t), .. }) => t,
        Some(mut turn) => {
            let t = Instant::now();
            turn.mono = Some(t);
            TURN.set(Some(turn));
            t
        }
    }
}

/// The wall-clock time, as [`now`].
pub fn wall() -> SystemTime {
    match TURN.get() {
        None => SystemTime::now(),
        Some(TurnTime { wall: Some(t), .. }) => t,
        Some(mut turn) => {
            let t = SystemTime::now();
            turn.wall = Some(t);
            TURN.set(Some(turn));
            t
        }
    }
}

/// "`t` is less than `d` after `base`" (`t.saturating_duration_since(base) < d`) asked
/// again and again with the same `base` and (nearly always) the same `d`: the end
/// `base + d` is worked out when `d` changes, and each ask is then a comparison, not std's
/// `Instant` subtraction (`Timespec::sub_timespec`, ~37 instructions a call, five a kept
/// request before; callgrind).
#[derive(Clone, Copy, Debug)]
pub struct Within {
    d: Duration,
    /// `base + d`; `None` when that is past any `Instant` (never reached).
    end: Option<Instant>,
}

impl Within {
    pub fn new(base: Instant, d: Duration) -> Within {
        Within {
            d,
            end: base.checked_add(d),
        }
    }

    /// Whether `t` is less than `d` after `base` (`base` the same as at [`Within::new`]).
    #[inline]
    pub fn holds(&mut self, base: Instant, t: Instant, d: Duration) -> bool {
        if self.d != d {
            *self = Within::new(base, d);
        }
        // A zero `d` holds for no `t` (a `t` before `base` is "0 after" it, not less).
        !d.is_zero() && self.end.is_none_or(|end| t < end)
    }
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Broken-down time: (year, month 0-11, day, hour, min, sec, UTC offset in seconds).
type Tm = (i32, usize, u32, u32, u32, u32, i64);

fn breakdown(secs: i64, local: bool) -> Tm {
    let t: libc::time_t = secs as libc::time_t;
    // SAFETY: an all-zero `tm` is a valid value (plain integers and a null zone pointer).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live, properly aligned values owned by this frame; the
    // *_r variants are thread-safe and only write into `tm`.
    let ok = unsafe {
        if local {
            !libc::localtime_r(&t, &mut tm).is_null()
        } else {
            !libc::gmtime_r(&t, &mut tm).is_null()
        }
    };
    if !ok {
        return (1970, 0, 1, 0, 0, 0, 0);
    }
    (
        tm.tm_year + 1900,
        tm.tm_mon.clamp(0, 11) as usize,
        tm.tm_mday as u32,
        tm.tm_hour as u32,
        tm.tm_min as u32,
        tm.tm_sec as u32,
        tm.tm_gmtoff,
    )
}

/// The next moment after `now` (seconds since the epoch) when the local clock shows
/// `of_day` seconds after midnight: `expires @time` (nginx's `ngx_next_time`). Today's if it
/// is still ahead, else tomorrow's; a day is taken as 24 hours (a daylight-saving change
/// between now and then moves the answer by its hour).
pub fn next_local_time(of_day: i64, now: i64) -> i64 {
    let (.., h, m, s, _) = breakdown(now, true);
    let midnight = now - i64::from(h * 3600 + m * 60 + s);
    let next = midnight + of_day;
    if next > now {
        next
    } else {
        next + 24 * 60 * 60
    }
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[derive(Default)]
struct Cache {
    sec: i64,
    /// The wall-clock times of second `sec`: [from, until).
    span: Option<(SystemTime, SystemTime)>,
    date: Vec<u8>,
    local: String,
    iso: String,
    log: String,
    syslog: String,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache { sec: -1, ..Default::default() });
}

fn with_cache<R>(f: impl FnOnce(&Cache) -> R) -> R {
    let wall = wall();
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        // Within the second rendered last: two comparisons, not the `SystemTime`
        // subtraction that finds the second (~37 instructions a request; callgrind).
        if c.span
            .is_some_and(|(from, until)| from <= wall && wall < until)
        {
            return f(&c);
        }
        let now = unix(wall);
        let from = UNIX_EPOCH + Duration::from_secs(now as u64);
        c.span = Some((from, from + Duration::from_secs(1)));
        if c.sec != now {
            c.sec = now;
            c.date = gannet_proto::h1::encode::http_date(
                UNIX_EPOCH + std::time::Duration::from_secs(now as u64),
            )
            .into_bytes();
            let (y, mo, d, h, mi, s, off) = breakdown(now, true);
            let sign = if off < 0 { '-' } else { '+' };
            let (oh, om) = (off.abs() / 3600, off.abs() % 3600 / 60);
            c.local = format!(
                "{d:02}/{}/{y}:{h:02}:{mi:02}:{s:02} {sign}{oh:02}{om:02}",
                MONTHS[mo]
            );
            c.iso = format!(
                "{y}-{:02}-{d:02}T{h:02}:{mi:02}:{s:02}{sign}{oh:02}:{om:02}",
                mo + 1
            );
            c.log = format!("{y}/{:02}/{d:02} {h:02}:{mi:02}:{s:02}", mo + 1);
            // RFC 3164's TIMESTAMP, the day padded with a space as nginx writes it.
            c.syslog = format!("{} {d:2} {h:02}:{mi:02}:{s:02}", MONTHS[mo]);
        }
        f(&c)
    })
}

/// Call `f` with the current IMF-fixdate (the Date header value).
pub fn with_date<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    with_cache(|c| f(&c.date))
}

thread_local! {
    /// The last time formatted by `with_http_date` (responses for one file repeat it),
    /// its second, and its rendering.
    static LAST_DATE: RefCell<(Option<SystemTime>, i64, String)> =
        const { RefCell::new((None, i64::MIN, String::new())) };
}

/// Call `f` with `t` as an IMF-fixdate (Last-Modified), formatted once per distinct second.
pub fn with_http_date<R>(t: SystemTime, f: impl FnOnce(&str) -> R) -> R {
    LAST_DATE.with(|c| {
        let mut c = c.borrow_mut();
        // The same time as last: not even its second is worked out again (a `SystemTime`
        // subtraction, ~37 instructions; callgrind).
        if c.0 != Some(t) {
            let secs = unix(t);
            if c.1 != secs {
                c.2 = gannet_proto::h1::encode::http_date(t);
                c.1 = secs;
            }
            c.0 = Some(t);
        }
        f(&c.2)
    })
}

/// Append `$time_local`: `22/Nov/2026:12:00:00 +0000` (in place: it is in every log line).
pub fn append_time_local(out: &mut String) {
    with_cache(|c| out.push_str(&c.local))
}

/// `$time_local` into a log line.
pub fn write_time_local(out: &mut Vec<u8>) {
    with_cache(|c| out.extend_from_slice(c.local.as_bytes()))
}

/// Append `$time_iso8601`: `2026-11-22T12:00:00+00:00`.
pub fn append_time_iso8601(out: &mut String) {
    with_cache(|c| out.push_str(&c.iso))
}

/// The error log's stamp: `2026/11/22 12:00:00`.
pub fn log_time() -> String {
    with_cache(|c| c.log.clone())
}

/// Append syslog's stamp: `Nov  2 12:00:00`.
pub fn append_syslog_time(out: &mut Vec<u8>) {
    with_cache(|c| out.extend_from_slice(c.syslog.as_bytes()))
}

/// autoindex's xml times: `2026-11-22T12:00:00Z` (always UTC).
pub fn iso8601_utc(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, _) = breakdown(unix(t), false);
    format!("{y:04}-{:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z", mo + 1)
}

/// autoindex's `22-Nov-2026 12:00`.
pub fn listing_time(t: SystemTime, local: bool) -> String {
    let (y, mo, d, h, mi, _, _) = breakdown(unix(t), local);
    format!("{d:02}-{}-{y} {h:02}:{mi:02}", MONTHS[mo])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (without sleeping) until the clock has moved past `t`.
    fn after(t: Instant) {
        while Instant::now() <= t {
            std::hint::spin_loop();
        }
    }

    /// `Within` answers as the subtraction it replaces, for times before, at and after the
    /// end, durations of zero and past any `Instant`, and a duration that changes.
    #[test]
    fn within_agrees_with_the_subtraction() {
        let base = Instant::now() + Duration::from_secs(10);
        let ds = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_secs(3),
            Duration::MAX,
        ];
        let offsets = [-5i64, -1, 0, 1, 2_999_999_999, 3_000_000_000, 3_000_000_001];
        let mut w = Within::new(base, Duration::from_secs(7));
        for d in ds {
            for off in offsets {
                let t = if off < 0 {
                    base - Duration::from_nanos(off.unsigned_abs())
                } else {
                    base + Duration::from_nanos(off as u64)
                };
                let want = t.saturating_duration_since(base) < d;
                assert_eq!(w.holds(base, t, d), want, "d {d:?}, t - base {off} ns");
            }
        }
    }

    #[test]
    fn a_turn_reads_each_clock_once_and_ends_with_its_poll() {
        let mut turn = std::pin::pin!(Turns::new(async {
            let (a, w) = (now(), wall());
            after(a);
            assert_eq!(now(), a, "one monotonic time per turn");
            assert_eq!(wall(), w, "one wall-clock time per turn");
            std::future::pending::<()>().await;
        }));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(turn.as_mut().poll(&mut cx).is_pending());
        // Outside a turn the clock is read each time.
        let a = now();
        after(a);
        assert!(now() > a);
        // And a panic inside a turn ends it too.
        let panicked = std::panic::catch_unwind(|| {
            let mut bad = std::pin::pin!(Turns::new(async {
                now();
                panic!("in a turn");
            }));
            let _ = bad
                .as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()));
        });
        assert!(panicked.is_err());
        let b = now();
        after(b);
        assert!(now() > b);
    }
}
