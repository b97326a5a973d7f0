//! The text formats of the `metrics` page: Prometheus's 0.0.4 and OpenMetrics 1.0.

use crate::runtime::metrics::BUCKETS;
use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
}

/// Writes families and samples in the text format 0.0.4 or OpenMetrics 1.0. The two differ
/// in counters (0.0.4 names the family with its `_total`, OpenMetrics without) and in the
/// closing `# EOF`.
pub struct Encoder {
    om: bool,
    out: String,
    /// The type of the family being written.
    kind: Type,
}

impl Encoder {
    pub fn new(om: bool) -> Encoder {
        Encoder {
            om,
            out: String::with_capacity(8192),
            kind: Type::Gauge,
        }
    }

    /// A family's header; `name` is without `_total` for a counter.
    pub fn family(&mut self, name: &str, t: Type, help: &str) {
        self.kind = t;
        let total = if t == Type::Counter && !self.om {
            "_total"
        } else {
            ""
        };
        let ty = match t {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name}{total} {help}");
        let _ = writeln!(self.out, "# TYPE {name}{total} {ty}");
    }

    /// One sample of the current family (a counter's gets its `_total`).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: impl std::fmt::Display) {
        let total = if self.kind == Type::Counter {
            "_total"
        } else {
            ""
        };
        self.line(name, total, labels, v);
    }

    fn line(
        &mut self,
        name: &str,
        suffix: &str,
        labels: &[(&str, &str)],
        v: impl std::fmt::Display,
    ) {
        self.out.push_str(name);
        self.out.push_str(suffix);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                for ch in val.chars() {
                    match ch {
                        '\\' => self.out.push_str("\\\\"),
                        '"' => self.out.push_str("\\\""),
                        '\n' => self.out.push_str("\\n"),
                        c => self.out.push(c),
                    }
                }
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {v}");
    }

    pub fn histogram_of(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        counts: &[u64; BUCKETS.len() + 1],
        sum: f64,
    ) {
        // The labels and `le` (a family has at most three labels of its own).
        let mut with_le = [("", ""); 4];
        let n = labels.len().min(3);
        with_le[..n].copy_from_slice(&labels[..n]);
        let mut acc = 0u64;
        for (i, c) in counts.iter().enumerate() {
            acc += c;
            with_le[n] = ("le", BUCKETS.get(i).map_or("+Inf", |b| b.0));
            self.line(name, "_bucket", &with_le[..=n], acc);
        }
        self.line(name, "_sum", labels, sum);
        self.line(name, "_count", labels, acc);
    }

    pub fn finish(mut self) -> String {
        if self.om {
            self.out.push_str("# EOF\n");
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format_names_counters_with_total() {
        let mut e = Encoder::new(false);
        e.family("x_requests", Type::Counter, "Requests.");
        e.sample("x_requests", &[("server", "a\"b\\c\nd")], 3);
        let s = e.finish();
        assert_eq!(
            s,
            "# HELP x_requests_total Requests.\n# TYPE x_requests_total counter\n\
             x_requests_total{server=\"a\\\"b\\\\c\\nd\"} 3\n"
        );
    }

    #[test]
    fn openmetrics_names_the_family_without_total_and_ends_with_eof() {
        let mut e = Encoder::new(true);
        e.family("x_requests", Type::Counter, "Requests.");
        e.sample("x_requests", &[], 3);
        e.family("x_open", Type::Gauge, "Open.");
        e.sample("x_open", &[("state", "idle")], 1);
        let s = e.finish();
        assert_eq!(
            s,
            "# HELP x_requests Requests.\n# TYPE x_requests counter\nx_requests_total 3\n\
             # HELP x_open Open.\n# TYPE x_open gauge\nx_open{state=\"idle\"} 1\n# EOF\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut e = Encoder::new(false);
        e.family("d_seconds", Type::Histogram, "D.");
        let mut counts = [0u64; BUCKETS.len() + 1];
        counts[0] = 2;
        counts[3] = 1;
        counts[BUCKETS.len()] = 4;
        e.histogram_of("d_seconds", &[("server", "s")], &counts, 1.5);
        let s = e.finish();
        assert!(s.contains("d_seconds_bucket{server=\"s\",le=\"0.005\"} 2\n"));
        assert!(s.contains("d_seconds_bucket{server=\"s\",le=\"0.05\"} 3\n"));
        assert!(s.contains("d_seconds_bucket{server=\"s\",le=\"10.0\"} 3\n"));
        assert!(s.contains("d_seconds_bucket{server=\"s\",le=\"+Inf\"} 7\n"));
        assert!(s.contains("d_seconds_sum{server=\"s\"} 1.5\n"));
        assert!(s.contains("d_seconds_count{server=\"s\"} 7\n"));
        assert!(s.starts_with("# HELP d_seconds D.\n# TYPE d_seconds histogram\n"));
    }
}
