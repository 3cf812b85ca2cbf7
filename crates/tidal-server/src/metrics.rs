//! Prometheus text exposition, hand-rolled: a few counters, gauges and one histogram family do not
//! justify a metrics framework.
//!
//! Every metric is named `tidal_*`. HTTP counters are labelled by the route TEMPLATE (never the raw
//! path), so label cardinality stays bounded whatever clients send.

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

/// HTTP request metrics.
#[derive(Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
}

impl HttpMetrics {
    /// Records one finished request.
    pub fn record(&self, method: &str, route: &str, status: u16, seconds: f64) {
        {
            let mut requests = self.requests.lock().expect("metrics lock is never held across a panic");
            *requests.entry((method.to_string(), route.to_string(), status)).or_default() += 1;
        }
        let mut latency = self.latency.lock().expect("metrics lock is never held across a panic");
        let histogram = latency.entry(route.to_string()).or_default();
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
}
