//! [`WalStats`]: counters of the writer, and the fsync latency histogram with fixed bucket bounds.
//!
//! The counters are relaxed atomics bumped by the writer thread only; a snapshot may mix values of
//! two drains, which is fine for metrics and never used for correctness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (inclusive, microseconds) of the fsync latency buckets; the last is a catch-all.
/// They span a fast NVMe fdatasync (tens of µs) up to a stalled disk (a second and more).
pub const FSYNC_LATENCY_BUCKETS_US: [u64; 14] =
    [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, u64::MAX];

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
}

impl StatsCounters {
    pub(crate) fn record_fsync(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = FSYNC_LATENCY_BUCKETS_US.iter().position(|bound| micros <= *bound).unwrap_or(0);
        self.fsync_latency_us_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.fsync_latency_us_sum.fetch_add(micros, Ordering::Relaxed);
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
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
        counters.record_fsync(Duration::from_secs(10));
        let stats = counters.snapshot();
        assert_eq!(stats.fsyncs, 3);
        assert_eq!(stats.fsync_latency_us_buckets[0], 1);
        assert_eq!(stats.fsync_latency_us_buckets[1], 1);
        assert_eq!(stats.fsync_latency_us_buckets[FSYNC_LATENCY_BUCKETS_US.len() - 1], 1);
    }
}
