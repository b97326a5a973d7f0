//! What a run counted, and the summary it prints: h2load's lines where h2load has one
//! (`finished in`, `requests:`, `status codes:`), so the arena reads both tools alike, and
//! the latency percentiles computed here (the arena's own rule: linear interpolation between
//! the closest ranks) instead of a per-request log file.

use std::fmt::Write;
use std::time::Duration;

#[derive(Debug, Default)]
pub struct Tally {
    /// Requests sent (their HEADERS frame written) and not handed back for a retry.
    pub started: u64,
    /// Requests answered whole: status, fields and the body to its end.
    pub done: u64,
    /// Answers by status class: 1xx .. 5xx at index 1 .. 5.
    pub classes: [u64; 6],
    /// Requests sent and never answered whole: their stream or connection failed.
    pub errored: u64,
    /// Of `errored`: those lost with a connection that timed out.
    pub timeout: u64,
    /// Requests the server refused unprocessed (H3_REQUEST_REJECTED, or a connection it
    /// closed gracefully after GOAWAY), sent again on a new connection.
    pub retried: u64,
    pub body_bytes: u64,
    /// The answers' fields as decoded (name and value lengths, `:status` included): the h3
    /// crate does not say how many bytes QPACK took on the wire.
    pub header_bytes: u64,
    /// UDP payload received, QUIC packets whole: every byte the answers cost on the wire.
    pub udp_rx_bytes: u64,
    pub udp_rx_datagrams: u64,
    pub connections: u64,
    pub connect_failed: u64,
    pub connect_us: Vec<u64>,
    /// Each answered request's time from sending to the body's end, in microseconds.
    pub latency_us: Vec<u64>,
    /// The application protocol the first connection negotiated.
    pub alpn: Option<String>,
    pub first_error: Option<String>,
}

impl Tally {
    pub fn error(&mut self, what: String) {
        if self.first_error.is_none() {
            self.first_error = Some(what);
        }
    }

    fn succeeded(&self) -> u64 {
        self.classes[2] + self.classes[3]
    }
}

/// The pct-th percentile of sorted `values` by linear interpolation between closest ranks.
pub fn percentile(sorted: &[u64], pct: f64) -> f64 {
    match sorted {
        [] => 0.0,
        [only] => *only as f64,
        _ => {
            let rank = (sorted.len() - 1) as f64 * pct / 100.0;
            let low = rank.floor() as usize;
            let high = (low + 1).min(sorted.len() - 1);
            sorted[low] as f64 + (sorted[high] as f64 - sorted[low] as f64) * (rank - low as f64)
        }
    }
}

fn ms(us: f64) -> f64 {
    us / 1000.0
}

pub struct Setup<'a> {
    pub url: &'a str,
    pub requests: u64,
    pub connections: usize,
    pub streams: usize,
    pub verified: bool,
}

/// The summary printed at the end of a run that took `elapsed` (first connection attempt to
/// the last answer).
pub fn render(setup: &Setup, tally: &mut Tally, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let per_sec = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "h3load {}: {} requests, {} connections, {} streams per connection, {}",
        env!("CARGO_PKG_VERSION"),
        setup.requests,
        setup.connections,
        setup.streams,
        setup.url
    );
    let _ = writeln!(
        out,
        "finished in {:.6}s, {:.2} req/s, {:.2}MB/s",
        secs,
        per_sec(tally.done as f64),
        per_sec(tally.body_bytes as f64) / 1e6
    );
    let succeeded = tally.succeeded();
    // As h2load counts: `failed` is every request that did not end in a 2xx or 3xx answer,
    // those never sent included.
    let _ = writeln!(
        out,
        "requests: {} total, {} started, {} done, {} succeeded, {} failed, {} errored, {} timeout",
        setup.requests,
        tally.started,
        tally.done,
        succeeded,
        setup.requests.saturating_sub(succeeded),
        tally.errored - tally.timeout,
        tally.timeout
    );
    let c = &tally.classes;
    let _ = writeln!(
        out,
        "status codes: {} 2xx, {} 3xx, {} 4xx, {} 5xx",
        c[2], c[3], c[4], c[5]
    );
    let _ = writeln!(
        out,
        "traffic: {} bytes body, {} bytes headers (decoded), {} bytes in {} UDP datagrams received",
        tally.body_bytes, tally.header_bytes, tally.udp_rx_bytes, tally.udp_rx_datagrams
    );
    tally.latency_us.sort_unstable();
    let lat = &tally.latency_us;
    if !lat.is_empty() {
        let mean = lat.iter().sum::<u64>() as f64 / lat.len() as f64;
        let _ = writeln!(
            out,
            "latency ms: min {:.3} p50 {:.3} p90 {:.3} p99 {:.3} max {:.3} mean {:.3}",
            ms(lat[0] as f64),
            ms(percentile(lat, 50.0)),
            ms(percentile(lat, 90.0)),
            ms(percentile(lat, 99.0)),
            ms(lat[lat.len() - 1] as f64),
            ms(mean)
        );
    }
    let connect = &tally.connect_us;
    let (mean, max) = match connect.iter().max() {
        Some(max) => (
            connect.iter().sum::<u64>() as f64 / connect.len() as f64,
            *max,
        ),
        None => (0.0, 0),
    };
    let _ = writeln!(
        out,
        "connections: {} made, {} failed; connect mean {:.3} ms, max {:.3} ms; {} requests retried",
        tally.connections,
        tally.connect_failed,
        ms(mean),
        ms(max as f64),
        tally.retried
    );
    if let Some(alpn) = &tally.alpn {
        // QUIC is TLS 1.3 by definition (RFC 9001).
        let _ = writeln!(out, "TLS Protocol: TLSv1.3");
        let _ = writeln!(out, "Application protocol: {alpn}");
    }
    let _ = writeln!(
        out,
        "Server certificate: {}",
        if setup.verified {
            "verified"
        } else {
            "not verified"
        }
    );
    if let Some(error) = &tally.first_error {
        let _ = writeln!(out, "first error: {error}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v = [10, 20, 30, 40];
        assert_eq!(percentile(&v, 50.0), 25.0);
        assert_eq!(percentile(&v, 0.0), 10.0);
        assert_eq!(percentile(&v, 100.0), 40.0);
        assert!((percentile(&v, 90.0) - 37.0).abs() < 1e-9);
        assert_eq!(percentile(&[7], 99.0), 7.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }

    #[test]
    fn summary_counts_unsent_requests_as_failed() {
        let mut t = Tally {
            started: 8,
            done: 7,
            classes: [0, 0, 6, 0, 1, 0],
            errored: 1,
            timeout: 1,
            body_bytes: 700,
            latency_us: vec![3000, 1000, 2000],
            alpn: Some("h3".into()),
            connections: 1,
            connect_us: vec![1500],
            ..Tally::default()
        };
        let setup = Setup {
            url: "https://127.0.0.1:1/x",
            requests: 10,
            connections: 1,
            streams: 2,
            verified: false,
        };
        let text = render(&setup, &mut t, Duration::from_millis(500));
        assert!(
            text.contains("finished in 0.500000s, 14.00 req/s,"),
            "{text}"
        );
        assert!(
            text.contains("requests: 10 total, 8 started, 7 done, 6 succeeded, 4 failed, 0 errored, 1 timeout"),
            "{text}"
        );
        assert!(
            text.contains("status codes: 6 2xx, 0 3xx, 1 4xx, 0 5xx"),
            "{text}"
        );
        assert!(
            text.contains(
                "latency ms: min 1.000 p50 2.000 p90 2.800 p99 2.980 max 3.000 mean 2.000"
            ),
            "{text}"
        );
        assert!(text.contains("connect mean 1.500 ms"), "{text}");
        assert!(text.contains("Application protocol: h3"), "{text}");
    }
}
