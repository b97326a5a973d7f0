//! `limit_rate` while an answer is written: how many bytes may go now, and how long to
//! wait when none may. nginx's write-filter arithmetic, in the same units:
//!
//! - by `t` seconds into the answer, `limit_rate_after + rate * (t + 1)` bytes may have
//!   gone - a second's worth at once, as nginx allows - the head counted with the body;
//! - after each write, the bytes of it past `limit_rate_after` are paid for with a pause
//!   of `bytes / rate` before the next one. That keeps writes whole (a second's worth, or
//!   what the socket took) rather than a trickle of the few bytes each moment frees.
//!
//! The pause is taken before the next write, not after the last: an answer ends as soon as
//! its last byte is written. Each write still waits at most `send_timeout` for the client.

use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug)]
pub struct Pace {
    /// Bytes per second.
    rate: u64,
    /// Bytes sent before the limit starts.
    after: u64,
    start: Instant,
    sent: u64,
    /// No write before this moment (the last write's pause).
    resume: Option<Instant>,
}

/// The most one write takes: a large rate does not make one huge write.
const MAX_WRITE: u64 = 2 << 20;

impl Pace {
    /// `None` when `rate` is 0 (no limit).
    pub fn new(rate: u64, after: u64) -> Option<Pace> {
        (rate > 0).then(|| Pace {
            rate,
            after,
            start: Instant::now(),
            sent: 0,
            resume: None,
        })
    }

    /// How many bytes may be written now (at least one), waiting until some may.
    pub async fn allowance(&mut self) -> u64 {
        if let Some(t) = self.resume.take() {
            tokio::time::sleep_until(t).await;
        }
        loop {
            let secs = self.start.elapsed().as_secs_f64();
            let budget = self.after as f64 + self.rate as f64 * (secs + 1.0) - self.sent as f64;
            if budget >= 1.0 {
                return (budget as u64).min(MAX_WRITE);
            }
            let wait = (1.0 - budget) / self.rate as f64;
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }

    /// `n` bytes were written: the ones past `limit_rate_after` pause the next write.
    pub fn wrote(&mut self, n: u64) {
        let paced_before = self.sent.saturating_sub(self.after);
        self.sent += n;
        let paced = self.sent.saturating_sub(self.after) - paced_before;
        if paced > 0 {
            let pause = Duration::from_secs_f64(paced as f64 / self.rate as f64);
            self.resume = Some(Instant::now() + pause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rate_no_pace() {
        assert!(Pace::new(0, 100).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_at_once_then_the_rate() {
        let mut p = Pace::new(1000, 0).expect("a rate");
        let t0 = Instant::now();
        assert_eq!(p.allowance().await, 1000);
        p.wrote(1000);
        // Paid for: the next write waits a second, then may send the next second's worth.
        assert_eq!(p.allowance().await, 1000);
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        p.wrote(400);
        assert!(p.allowance().await >= 600);
        assert_eq!(t0.elapsed(), Duration::from_millis(1400));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_bytes_are_free() {
        let mut p = Pace::new(1000, 5000).expect("a rate");
        let t0 = Instant::now();
        assert_eq!(p.allowance().await, 6000);
        p.wrote(4000);
        // All of it under limit_rate_after: no pause.
        assert_eq!(p.allowance().await, 2000);
        assert_eq!(t0.elapsed(), Duration::ZERO);
        p.wrote(2000);
        // 1000 bytes past the free part: a second's pause, and a second's worth after it.
        assert_eq!(p.allowance().await, 1000);
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_exhausted_budget_waits_for_a_byte() {
        let mut p = Pace::new(100, 0).expect("a rate");
        p.wrote(500);
        p.resume = None;
        let t0 = Instant::now();
        assert!(p.allowance().await >= 1);
        // 500 sent against 100 + 100 t: t = 4.01 s gives the first byte.
        let waited = t0.elapsed().as_secs_f64();
        assert!((4.0..4.1).contains(&waited), "{waited}");
    }

    #[tokio::test(start_paused = true)]
    async fn one_write_is_bounded() {
        let mut p = Pace::new(1 << 40, 0).expect("a rate");
        assert_eq!(p.allowance().await, MAX_WRITE);
    }
}
