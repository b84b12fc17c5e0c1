//! The two histograms every request records (`http_server_request_duration_seconds`
//! and `gateway_upstream_request_duration_seconds`), kept as counts per
//! bucket and rendered after the recorder's exposition.
//!
//! Hand-written because the recorder's histogram keeps every sample, with
//! a clock reading, in a buffer its upkeep drains every few seconds: a
//! request paid for the clock and an epoch guard, and under load the
//! buffer held seconds' worth of samples (see benches/README.md,
//! Decisions). Here a sample is two relaxed atomic additions, and a
//! series is a fixed few hundred bytes whatever the rate.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_exporter_prometheus::formatting;

use super::BUCKETS;

/// One series: a count per bucket (the last past every bound), and the sum.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

/// The buckets' upper bounds in nanoseconds.
const BOUNDS: [u64; BUCKETS.len()] = {
    let mut bounds = [0; BUCKETS.len()];
    let mut i = 0;
    while i < BUCKETS.len() {
        bounds[i] = (BUCKETS[i] * 1e9) as u64;
        i += 1;
    }
    bounds
};

impl Histogram {
    pub fn record(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // Most requests fall in the first buckets: a scan from the start.
        let bucket = BOUNDS.iter().position(|&b| nanos <= b).unwrap_or(BOUNDS.len());
        self.counts[bucket].fetch_add(1, Relaxed);
        self.sum_nanos.fetch_add(nanos, Relaxed);
    }
}

/// A histogram metric: its name, help text, and series by label values.
pub struct Family {
    name: &'static str,
    help: &'static str,
    label_names: &'static [&'static str],
    series: Mutex<Vec<(Vec<String>, Arc<Histogram>)>>,
}

/// `http_server_request_duration_seconds`, by route, method and status.
pub static REQUESTS: Family =
    Family::new(super::REQUEST_DURATION, "Time from request arrival to response head.", &["route", "method", "status"]);

/// `gateway_upstream_request_duration_seconds`, by upstream and status.
pub static UPSTREAMS: Family =
    Family::new(super::UPSTREAM_DURATION, "Upstream response time to response head.", &["upstream", "status"]);

impl Family {
    const fn new(name: &'static str, help: &'static str, label_names: &'static [&'static str]) -> Self {
        Family { name, help, label_names, series: Mutex::new(Vec::new()) }
    }

    /// The series of these label values (one per name, in order), made on
    /// first use and kept for the process's life, as the recorder keeps its
    /// own: a route reloaded with the same name counts on where it was.
    pub fn series(&self, values: Vec<String>) -> Arc<Histogram> {
        debug_assert_eq!(values.len(), self.label_names.len());
        let mut series = self.series.lock().expect("histogram lock");
        if let Some((_, h)) = series.iter().find(|(v, _)| *v == values) {
            return h.clone();
        }
        let h = Arc::new(Histogram::default());
        series.push((values, h.clone()));
        h
    }

    /// Appends the family in Prometheus' text format (nothing while it has
    /// no series), as the recorder writes a histogram.
    pub fn render(&self, out: &mut String) {
        let series = self.series.lock().expect("histogram lock");
        if series.is_empty() {
            return;
        }
        let name = self.name;
        formatting::write_help_line(out, name, None, None, self.help);
        formatting::write_type_line(out, name, None, None, "histogram");
        for (values, h) in series.iter() {
            let mut labels = String::new();
            for (label, value) in self.label_names.iter().zip(values) {
                let _ = write!(labels, "{label}=\"{}\",", formatting::sanitize_label_value(value));
            }
            let mut cumulative = 0;
            for (i, count) in h.counts.iter().enumerate() {
                cumulative += count.load(Relaxed);
                match BUCKETS.get(i) {
                    Some(le) => _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {cumulative}"),
                    None => _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}"),
                }
            }
            let labels = labels.trim_end_matches(',');
            let sum = h.sum_nanos.load(Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(family: &Family) -> Vec<String> {
        let mut out = String::new();
        family.render(&mut out);
        out.lines().map(str::to_owned).collect()
    }

    #[test]
    fn bounds_are_the_buckets_in_nanoseconds() {
        let want = [
            1_000_000,
            2_500_000,
            5_000_000,
            10_000_000,
            25_000_000,
            50_000_000,
            100_000_000,
            250_000_000,
            500_000_000,
            1_000_000_000,
            2_000_000_000,
            5_000_000_000,
            10_000_000_000,
        ];
        assert_eq!(BOUNDS, want);
    }

    #[test]
    fn samples_fall_in_the_first_bucket_whose_bound_they_do_not_pass() {
        let family = Family::new("t_seconds", "Test.", &["route"]);
        assert!(lines(&family).is_empty(), "no series, nothing written");
        let h = family.series(vec!["a\"b".into()]);
        for ms in [0, 1, 2, 1000, 1001, 60_000] {
            h.record(Duration::from_millis(ms));
        }
        let got = lines(&family);
        let want = [
            "# HELP t_seconds Test.",
            "# TYPE t_seconds histogram",
            r#"t_seconds_bucket{route="a\"b",le="0.001"} 2"#,
            r#"t_seconds_bucket{route="a\"b",le="0.0025"} 3"#,
            r#"t_seconds_bucket{route="a\"b",le="0.005"} 3"#,
            r#"t_seconds_bucket{route="a\"b",le="0.5"} 3"#,
            r#"t_seconds_bucket{route="a\"b",le="1"} 4"#,
            r#"t_seconds_bucket{route="a\"b",le="2"} 5"#,
            r#"t_seconds_bucket{route="a\"b",le="10"} 5"#,
            r#"t_seconds_bucket{route="a\"b",le="+Inf"} 6"#,
            r#"t_seconds_sum{route="a\"b"} 62.004"#,
            r#"t_seconds_count{route="a\"b"} 6"#,
        ];
        for line in want {
            assert!(got.iter().any(|g| g == line), "{line} not in {got:#?}");
        }
        assert_eq!(got.len(), 2 + BUCKETS.len() + 1 + 2, "{got:#?}");
    }

    #[test]
    fn the_same_labels_are_the_same_series() {
        let family = Family::new("t_seconds", "Test.", &["upstream", "status"]);
        let a = family.series(vec!["u".into(), "200".into()]);
        let b = family.series(vec!["u".into(), "200".into()]);
        let c = family.series(vec!["u".into(), "503".into()]);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        a.record(Duration::from_millis(3));
        b.record(Duration::from_millis(3));
        let got = lines(&family);
        assert!(got.contains(&r#"t_seconds_count{upstream="u",status="200"} 2"#.to_owned()), "{got:#?}");
        assert!(got.contains(&r#"t_seconds_count{upstream="u",status="503"} 0"#.to_owned()), "{got:#?}");
    }
}
