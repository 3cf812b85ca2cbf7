//! Prometheus text exposition, hand-rolled: a few counters, gauges and one histogram family do not
//! justify a metrics framework.
//!
//! Every metric is named `tidal_*`. Every HTTP label comes from a fixed set, so the number of series
//! stays bounded whatever clients send (random methods once grew `/metrics` from 8 KB to 21 MB):
//! the method is one of [`METHOD_LABELS`] or `other`, the route the matched route TEMPLATE (never the
//! raw path) or `unmatched`, and the status one of [`STATUS_LABELS`] or its class.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Upper bounds (seconds) of the request latency histogram.
const LATENCY_BOUNDS_S: [f64; 12] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0];

#[derive(Default)]
struct Histogram {
    buckets: [u64; LATENCY_BOUNDS_S.len()],
    count: u64,
    sum: f64,
}

/// Methods labelled as themselves; every other is `other`.
pub const METHOD_LABELS: [&str; 7] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];

/// Statuses labelled as themselves; every other is its class (`1xx` .. `5xx`, else `other`).
pub const STATUS_LABELS: [&str; 22] = [
    "200", "201", "204", "304", "400", "401", "403", "404", "405", "406", "408", "409", "410", "411", "413",
    "415", "422", "429", "500", "502", "503", "504",
];

/// The label of `method`.
pub fn method_label(method: &str) -> &'static str {
    METHOD_LABELS.iter().find(|label| **label == method).copied().unwrap_or("other")
}

/// The label of `status`.
pub fn status_label(status: u16) -> &'static str {
    let code = status.to_string();
    if let Some(label) = STATUS_LABELS.iter().find(|label| **label == code) {
        return label;
    }
    match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        5 => "5xx",
        _ => "other",
    }
}

/// HTTP request metrics.
#[derive(Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(&'static str, &'static str, &'static str), u64>>,
    latency: Mutex<BTreeMap<&'static str, Histogram>>,
}

impl HttpMetrics {
    /// Records one finished request: `route` is a route template from the router's table (or
    /// `unmatched`): `'static`, so no request can make a label of its own text.
    pub fn record(&self, method: &str, route: &'static str, status: u16, seconds: f64) {
        let key = (method_label(method), route, status_label(status));
        {
            let mut requests = self.requests.lock().expect("metrics lock is never held across a panic");
            *requests.entry(key).or_default() += 1;
        }
        let mut latency = self.latency.lock().expect("metrics lock is never held across a panic");
        let histogram = latency.entry(route).or_default();
        for (i, bound) in LATENCY_BOUNDS_S.iter().enumerate() {
            if seconds <= *bound {
                histogram.buckets[i] += 1;
            }
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }

    /// Appends the HTTP families to `out`.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP tidal_http_requests_total HTTP requests by method, route and status.\n");
        out.push_str("# TYPE tidal_http_requests_total counter\n");
        for ((method, route, status), count) in
            self.requests.lock().expect("metrics lock is never held across a panic").iter()
        {
            let _ = writeln!(
                out,
                "tidal_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {count}"
            );
        }
        out.push_str("# HELP tidal_http_request_duration_seconds HTTP request latency by route.\n");
        out.push_str("# TYPE tidal_http_request_duration_seconds histogram\n");
        for (route, histogram) in
            self.latency.lock().expect("metrics lock is never held across a panic").iter()
        {
            for (i, bound) in LATENCY_BOUNDS_S.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "tidal_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {}",
                    histogram.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "tidal_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                histogram.count
            );
            let _ = writeln!(
                out,
                "tidal_http_request_duration_seconds_sum{{route=\"{route}\"}} {}",
                histogram.sum
            );
            let _ = writeln!(
                out,
                "tidal_http_request_duration_seconds_count{{route=\"{route}\"}} {}",
                histogram.count
            );
        }
    }
}

/// Appends one gauge or counter family with a single sample.
pub fn render_single(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// Appends a histogram family from per-bucket (not cumulative) counts.
///
/// `bounds_s` are upper bounds in seconds; `counts[i]` counts observations in bucket i alone; `counts`
/// may have one more entry than `bounds_s`, the catch-all that only `+Inf` covers.
pub fn render_histogram(
    out: &mut String,
    name: &str,
    help: &str,
    bounds_s: &[f64],
    counts: &[u64],
    sum_s: f64,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0u64;
    for (bound, count) in bounds_s.iter().zip(counts) {
        cumulative += count;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let total: u64 = counts.iter().sum();
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}\n{name}_sum {sum_s}\n{name}_count {total}");
}

/// Appends the size and the space left for the node's files (`statvfs`'s available blocks: what an
/// unprivileged writer may still use) of the file system holding the data directory. A full disk
/// fails a WAL write, which is fatal (the node exits and its restart fails again), so operators
/// alert on this before it happens. A file system that cannot be queried leaves both series out:
/// an absent series is what the alert rules treat as unknown, never as full.
pub fn render_data_dir_space(out: &mut String, data_dir: &std::path::Path) {
    let Ok(stat) = rustix::fs::statvfs(data_dir) else { return };
    let size = stat.f_blocks.saturating_mul(stat.f_frsize);
    let available = stat.f_bavail.saturating_mul(stat.f_frsize);
    render_single(
        out,
        "tidal_data_dir_size_bytes",
        "gauge",
        "Size of the file system holding the data directory.",
        size as f64,
    );
    render_single(
        out,
        "tidal_data_dir_available_bytes",
        "gauge",
        "Bytes of that file system the node may still write (statvfs f_bavail).",
        available as f64,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_labelled_counters_and_cumulative_buckets() {
        let metrics = HttpMetrics::default();
        metrics.record("POST", "/v1/signals", 200, 0.0007);
        metrics.record("POST", "/v1/signals", 200, 0.3);
        let mut out = String::new();
        metrics.render(&mut out);
        assert!(
            out.contains("tidal_http_requests_total{method=\"POST\",route=\"/v1/signals\",status=\"200\"} 2")
        );
        assert!(
            out.contains("tidal_http_request_duration_seconds_bucket{route=\"/v1/signals\",le=\"0.001\"} 1")
        );
        assert!(
            out.contains("tidal_http_request_duration_seconds_bucket{route=\"/v1/signals\",le=\"0.5\"} 2")
        );
        let mut out = String::new();
        render_histogram(&mut out, "tidal_x_seconds", "x", &[0.1, 1.0], &[3, 2], 1.5);
        assert!(out.contains("tidal_x_seconds_bucket{le=\"1\"} 5"));
    }

    #[test]
    fn data_dir_space_is_reported_for_a_real_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = String::new();
        render_data_dir_space(&mut out, dir.path());
        let value = |name: &str| -> f64 {
            let line = out.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap();
            line.rsplit_once(' ').unwrap().1.parse().unwrap()
        };
        let size = value("tidal_data_dir_size_bytes");
        let available = value("tidal_data_dir_available_bytes");
        assert!(size > 0.0 && available <= size, "size {size} available {available}\n{out}");
        let mut out = String::new();
        render_data_dir_space(&mut out, &dir.path().join("missing"));
        assert!(out.is_empty(), "{out}");
    }

    #[test]
    fn labels_come_from_a_fixed_set() {
        let metrics = HttpMetrics::default();
        for i in 0..1000u16 {
            metrics.record(&format!("M{i}"), "unmatched", 100 + i % 600, 0.001);
        }
        metrics.record("GET", "/v1/trending", 200, 0.001);
        let mut out = String::new();
        metrics.render(&mut out);
        let series = out.lines().filter(|line| line.starts_with("tidal_http_requests_total{")).count();
        assert!(series <= 1 + STATUS_LABELS.len() + 6, "{series} series:\n{out}");
        assert!(out.contains("method=\"other\",route=\"unmatched\",status=\"5xx\""), "{out}");
        assert!(out.contains("status=\"404\""), "{out}");
        assert!(out.contains("method=\"GET\",route=\"/v1/trending\",status=\"200\"} 1"), "{out}");
        assert!(!out.contains("M1"), "{out}");
        assert_eq!(method_label("get"), "other", "methods are case-sensitive");
        assert_eq!(status_label(299), "2xx");
        assert_eq!(status_label(999), "other");
    }
}
