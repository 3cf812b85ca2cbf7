//! [`WalStats`]: counters of the writer, and the fsync latency histogram with fixed bucket bounds.
//!
//! The counters are relaxed atomics bumped by the writer thread only; a snapshot may mix values of
//! two drains, which is fine for metrics and never used for correctness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (inclusive, microseconds) of the fsync latency buckets; the last is a catch-all.
/// They span a fast NVMe fdatasync (tens of µs) up to a stalled disk (a second and more), finer
/// between 0.1 and 2 ms, where most disks' fdatasync lies (and its p99 under a cluster's load):
/// ack latency is judged against its p99.
pub const FSYNC_LATENCY_BUCKETS_US: [u64; 20] = [
    50,
    100,
    150,
    200,
    250,
    300,
    400,
    500,
    750,
    1_000,
    1_500,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    1_000_000,
    u64::MAX,
];

/// Upper bounds (inclusive) of the buckets of requests per drain (per group commit's fsync); the
/// last is a catch-all. Read with the writer's concurrency: at 64 writers in flight, a drain that
/// covers them all lands in the `64` bucket.
pub const DRAIN_REQUESTS_BUCKETS: [u64; 12] = [1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 512, u64::MAX];

/// A snapshot of the writer's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Batches written and fsynced.
    pub batches: u64,
    /// Events (seqnos) in them.
    pub events: u64,
    /// Encoded bytes in them.
    pub bytes: u64,
    /// Data fsyncs of segments (one per drain, plus one per rotation).
    pub fsyncs: u64,
    /// Drains (group commits).
    pub drains: u64,
    /// Segments created by rotation.
    pub rotations: u64,
    /// Next segments prepared (written with zeros and fsynced) while the writer was idle.
    pub segments_prepared: u64,
    /// Rotations that found no prepared segment ready and started an empty one instead (written by
    /// appending); 0 while preallocation is off.
    pub rotations_unprepared: u64,
    /// Count of fsyncs per bucket of [`FSYNC_LATENCY_BUCKETS_US`].
    pub fsync_latency_us_buckets: [u64; FSYNC_LATENCY_BUCKETS_US.len()],
    /// Sum of fsync latencies, microseconds.
    pub fsync_latency_us_sum: u64,
    /// Count of drains (group commits that wrote at least one batch) per bucket of
    /// [`DRAIN_REQUESTS_BUCKETS`] by the requests they covered.
    pub drain_requests_buckets: [u64; DRAIN_REQUESTS_BUCKETS.len()],
    /// Requests covered by those drains (sum over the histogram).
    pub drain_requests_sum: u64,
    /// Gather waits (experiments/021): times the writer waited for the writers of its last drain.
    pub gathers: u64,
    /// Of those, the ones that ended because every expected writer was back (the rest timed out).
    pub gathers_complete: u64,
    /// Time spent in gather waits, microseconds.
    pub gather_wait_us_sum: u64,
    /// Requests queued and not yet taken by the writer.
    pub queue_batches: usize,
    /// Payload bytes of those requests.
    pub queue_bytes: usize,
    /// The durable frontier.
    pub durable_seqno: u64,
}

/// The live counters behind [`WalStats`].
#[derive(Debug, Default)]
pub(crate) struct StatsCounters {
    pub(crate) batches: AtomicU64,
    pub(crate) events: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) fsyncs: AtomicU64,
    pub(crate) drains: AtomicU64,
    pub(crate) rotations: AtomicU64,
    pub(crate) segments_prepared: AtomicU64,
    pub(crate) rotations_unprepared: AtomicU64,
    fsync_latency_us_buckets: [AtomicU64; FSYNC_LATENCY_BUCKETS_US.len()],
    fsync_latency_us_sum: AtomicU64,
    drain_requests_buckets: [AtomicU64; DRAIN_REQUESTS_BUCKETS.len()],
    drain_requests_sum: AtomicU64,
    gathers: AtomicU64,
    gathers_complete: AtomicU64,
    gather_wait_us_sum: AtomicU64,
}

impl StatsCounters {
    pub(crate) fn record_fsync(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = FSYNC_LATENCY_BUCKETS_US.iter().position(|bound| micros <= *bound).unwrap_or(0);
        self.fsync_latency_us_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.fsync_latency_us_sum.fetch_add(micros, Ordering::Relaxed);
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a drain that wrote `requests` requests under one fsync.
    pub(crate) fn record_drain(&self, requests: usize) {
        let requests = requests as u64;
        let bucket = DRAIN_REQUESTS_BUCKETS.iter().position(|bound| requests <= *bound).unwrap_or(0);
        self.drain_requests_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.drain_requests_sum.fetch_add(requests, Ordering::Relaxed);
    }

    /// Counts a gather wait of `elapsed`; `complete` if every expected writer came.
    pub(crate) fn record_gather(&self, elapsed: Duration, complete: bool) {
        self.gathers.fetch_add(1, Ordering::Relaxed);
        self.gathers_complete.fetch_add(u64::from(complete), Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.gather_wait_us_sum.fetch_add(micros, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WalStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WalStats {
            batches: load(&self.batches),
            events: load(&self.events),
            bytes: load(&self.bytes),
            fsyncs: load(&self.fsyncs),
            drains: load(&self.drains),
            rotations: load(&self.rotations),
            segments_prepared: load(&self.segments_prepared),
            rotations_unprepared: load(&self.rotations_unprepared),
            fsync_latency_us_buckets: std::array::from_fn(|index| {
                load(&self.fsync_latency_us_buckets[index])
            }),
            fsync_latency_us_sum: load(&self.fsync_latency_us_sum),
            drain_requests_buckets: std::array::from_fn(|index| load(&self.drain_requests_buckets[index])),
            drain_requests_sum: load(&self.drain_requests_sum),
            gathers: load(&self.gathers),
            gathers_complete: load(&self.gathers_complete),
            gather_wait_us_sum: load(&self.gather_wait_us_sum),
            queue_batches: 0,
            queue_bytes: 0,
            durable_seqno: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_their_buckets() {
        let counters = StatsCounters::default();
        counters.record_fsync(Duration::from_micros(50));
        counters.record_fsync(Duration::from_micros(51));
        counters.record_fsync(Duration::from_micros(301));
        counters.record_fsync(Duration::from_secs(10));
        let stats = counters.snapshot();
        assert_eq!(stats.fsyncs, 4);
        assert_eq!(stats.fsync_latency_us_buckets[0], 1);
        assert_eq!(stats.fsync_latency_us_buckets[1], 1);
        let at_400 = FSYNC_LATENCY_BUCKETS_US.iter().position(|bound| *bound == 400).expect("a 400 µs bound");
        assert_eq!(stats.fsync_latency_us_buckets[at_400], 1, "301 µs lands in (300, 400]");
        assert_eq!(stats.fsync_latency_us_buckets[FSYNC_LATENCY_BUCKETS_US.len() - 1], 1);
    }

    #[test]
    fn drains_land_in_their_buckets() {
        let counters = StatsCounters::default();
        counters.record_drain(1);
        counters.record_drain(33);
        counters.record_drain(64);
        counters.record_drain(10_000);
        let stats = counters.snapshot();
        assert_eq!(stats.drain_requests_buckets[0], 1);
        assert_eq!(stats.drain_requests_buckets[7], 1, "33 is in the 48 bucket");
        assert_eq!(stats.drain_requests_buckets[8], 1);
        assert_eq!(stats.drain_requests_buckets[DRAIN_REQUESTS_BUCKETS.len() - 1], 1);
        assert_eq!(stats.drain_requests_sum, 1 + 33 + 64 + 10_000);
    }
}
