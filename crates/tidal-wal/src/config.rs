//! [`WalConfig`]: where the WAL lives and the bounds of its writer.
//!
//! Every queue and drain is bounded, but each bound always admits at least one whole batch: a batch
//! that could never be written would be a livelock.

use std::path::PathBuf;
use std::time::Duration;

/// Default segment size: 64 MiB keeps the file count small while purge can still free space in
/// reasonably fine steps, and one segment still fits comfortably in memory for a read-back scan.
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default bound on queued, not yet written requests: enough to absorb bursts of thousands of
/// concurrent writers, small enough that their completions are bounded.
pub const QUEUE_BATCHES_MAX_DEFAULT: usize = 4096;
/// Default bound on queued payload bytes: four maximal (64 MiB) batches.
pub const QUEUE_BYTES_MAX_DEFAULT: usize = 256 * 1024 * 1024;
/// Default bound on one drain (one fsync): 16 MiB amortises the fsync well while one slow drain does
/// not delay the next writers for long.
pub const DRAIN_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;

/// Marks of the batch index per full segment ([`WalConfig::mark_spacing`]): with 64 MiB segments a
/// reader starting inside one walks at most about 256 KiB of batches before its own (a few hundred
/// µs), and the marks cost 4 KiB of memory per segment.
pub const MARKS_PER_SEGMENT: u64 = 256;
/// Default for [`WalConfig::gather_min_requests`]: off. Measured (experiments/021), the gather raised
/// 64 threads' events/s 2-4x while fdatasync took 4 ms, and lowered them by about a quarter while it
/// took 70 µs; the 64-in-flight phase never triggers it. 16 is the value those runs used.
pub const GATHER_MIN_REQUESTS_DEFAULT: usize = 0;
/// Default for [`WalConfig::gather_wait_max`].
pub const GATHER_WAIT_MAX_DEFAULT: Duration = Duration::from_micros(200);

/// Where the WAL lives and how its writer is bounded.
#[derive(Clone, Debug)]
pub struct WalConfig {
    /// Directory holding the segments and `wal.meta`.
    pub dir: PathBuf,
    /// Rotate when the active segment has reached this size (checked at batch boundaries, so a
    /// segment may exceed it by one batch).
    pub segment_bytes_max: u64,
    /// Pushback bound on queued, not yet written requests.
    pub queue_batches_max: usize,
    /// Pushback bound on queued payload bytes (one request is always admitted into an empty queue).
    pub queue_bytes_max: usize,
    /// Bound on the encoded bytes of one drain (one fsync); a drain always takes at least one batch.
    pub drain_bytes_max: usize,
    /// Bytes at the start of each segment written with zeros and fsynced before the segment is used
    /// (capped at `segment_bytes_max`; 0 turns preallocation off). Batches then overwrite zeros in
    /// place, so an fdatasync need not commit a new file size through the file system's journal.
    pub preallocate_bytes: u64,
    /// Adaptive gather (experiments/021): when the last drain covered at least this many requests and
    /// fewer than those writers (plus what queued during its fsync) are queued again, the writer
    /// waits up to [`WalConfig::gather_wait_max`] (and never longer than the last fsync took) for the
    /// stragglers before it writes, so one fsync covers them all. 0 turns it off; one or a few
    /// writers never wait.
    pub gather_min_requests: usize,
    /// Bound on one gather wait.
    pub gather_wait_max: Duration,
}

impl WalConfig {
    /// The defaults, in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        WalConfig {
            dir: dir.into(),
            segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT,
            queue_batches_max: QUEUE_BATCHES_MAX_DEFAULT,
            queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            drain_bytes_max: DRAIN_BYTES_MAX_DEFAULT,
            preallocate_bytes: u64::MAX,
            gather_min_requests: GATHER_MIN_REQUESTS_DEFAULT,
            gather_wait_max: GATHER_WAIT_MAX_DEFAULT,
        }
    }

    /// How many zero bytes each segment is prepared with: `preallocate_bytes` capped at the segment
    /// size (0: off).
    pub fn preallocate_len(&self) -> u64 {
        self.preallocate_bytes.min(self.segment_bytes_max)
    }

    /// Bytes of a segment between two of the batch index's marks, at least: where a reader that
    /// starts inside a segment can begin instead of the segment's start. A fraction of the segment
    /// size, so small segments (tests, the simulation) are marked as densely as production's.
    pub fn mark_spacing(&self) -> u64 {
        (self.segment_bytes_max / MARKS_PER_SEGMENT).max(1)
    }
}
