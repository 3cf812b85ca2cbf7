//! When the checkpointer runs: on its interval, or at once when the engine's fjall memtables or the
//! WAL written since the last checkpoint pass their byte bounds (issue 43).
//!
//! Delicate: what a crashed node must do before it is ready grows with two byte counts, not with
//! time. Its engine open replays, entry by entry, every fjall journal entry that is not yet in a
//! table (the memtables' contents, about 15-30 MB/s for our small entries: experiments/034), and an
//! open after a power loss also replays the WAL past the engine's last fsynced checkpoint. A time
//! interval alone let a fast ingest fill fjall's 64 MiB journal bound between two checkpoints, so
//! a restart took 4-5 s at full ingest and less at a slow one. The byte bounds make it the same
//! whatever the rate. [`checkpoint_due`] decides; the checkpointer task only performs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Why a checkpoint runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointReason {
    /// `checkpoint_interval_ms` passed.
    Interval,
    /// The engine's fjall memtables passed `checkpoint_engine_bytes_max`: the checkpoint also
    /// writes them into tables.
    EngineBytes,
    /// The WAL written since the last checkpoint passed `checkpoint_wal_bytes_max`.
    WalBytes,
}

impl CheckpointReason {
    /// Every reason, in the order of [`Checkpoints`]'s counters.
    pub const ALL: [CheckpointReason; 3] =
        [CheckpointReason::Interval, CheckpointReason::EngineBytes, CheckpointReason::WalBytes];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            CheckpointReason::Interval => "interval",
            CheckpointReason::EngineBytes => "engine_bytes",
            CheckpointReason::WalBytes => "wal_bytes",
        }
    }

    fn index(self) -> usize {
        match self {
            CheckpointReason::Interval => 0,
            CheckpointReason::EngineBytes => 1,
            CheckpointReason::WalBytes => 2,
        }
    }
}

/// The checkpointer's bounds, from the configuration.
#[derive(Clone, Copy, Debug)]
pub struct CheckpointBounds {
    /// Longest time between two checkpoints.
    pub interval: Duration,
    /// Bytes in fjall's memtables past which a checkpoint writes them into tables.
    pub engine_bytes_max: u64,
    /// WAL bytes written since the last checkpoint past which one runs.
    pub wal_bytes_max: u64,
}

/// What lies past the last checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct PastCheckpoint {
    /// Time since the last checkpoint.
    pub since: Duration,
    /// Bytes in fjall's memtables (in its journal, not in its tables).
    pub engine_bytes: u64,
    /// WAL bytes written since the last checkpoint began.
    pub wal_bytes: u64,
}

/// Whether a checkpoint is due and why. A byte bound passed wins over the interval: only its
/// checkpoint writes the memtables into tables.
pub fn checkpoint_due(bounds: &CheckpointBounds, past: &PastCheckpoint) -> Option<CheckpointReason> {
    if past.engine_bytes > bounds.engine_bytes_max {
        Some(CheckpointReason::EngineBytes)
    } else if past.wal_bytes > bounds.wal_bytes_max {
        Some(CheckpointReason::WalBytes)
    } else if past.since >= bounds.interval {
        Some(CheckpointReason::Interval)
    } else {
        None
    }
}

/// The node's checkpoint bookkeeping: the WAL's written bytes when the last checkpoint began, and
/// the checkpoints taken by reason.
#[derive(Debug, Default)]
pub struct Checkpoints {
    wal_bytes_at_last: AtomicU64,
    taken: [AtomicU64; 3],
}

impl Checkpoints {
    /// Bookkeeping for a node whose WAL writer has written `wal_bytes` so far.
    pub fn new(wal_bytes: u64) -> Checkpoints {
        let checkpoints = Checkpoints::default();
        checkpoints.wal_bytes_at_last.store(wal_bytes, Ordering::Relaxed);
        checkpoints
    }

    /// WAL bytes written since the last checkpoint began, given the writer's count now.
    pub fn wal_bytes_since(&self, wal_bytes: u64) -> u64 {
        wal_bytes.saturating_sub(self.wal_bytes_at_last.load(Ordering::Relaxed))
    }

    /// A checkpoint for `reason` is done; it began when the writer had written `wal_bytes`
    /// (everything written before then is in the checkpoint).
    pub fn taken(&self, reason: CheckpointReason, wal_bytes: u64) {
        self.wal_bytes_at_last.fetch_max(wal_bytes, Ordering::Relaxed);
        self.taken[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Checkpoints taken for `reason` since the node opened.
    pub fn count(&self, reason: CheckpointReason) -> u64 {
        self.taken[reason.index()].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: CheckpointBounds =
        CheckpointBounds { interval: Duration::from_secs(30), engine_bytes_max: 1000, wal_bytes_max: 5000 };

    fn past(since_s: u64, engine_bytes: u64, wal_bytes: u64) -> PastCheckpoint {
        PastCheckpoint { since: Duration::from_secs(since_s), engine_bytes, wal_bytes }
    }

    #[test]
    fn a_byte_bound_passed_runs_a_checkpoint_before_the_interval() {
        assert_eq!(checkpoint_due(&BOUNDS, &past(1, 10, 10)), None);
        assert_eq!(checkpoint_due(&BOUNDS, &past(1, 1000, 5000)), None, "the bounds are inclusive");
        assert_eq!(checkpoint_due(&BOUNDS, &past(1, 1001, 0)), Some(CheckpointReason::EngineBytes));
        assert_eq!(checkpoint_due(&BOUNDS, &past(1, 0, 5001)), Some(CheckpointReason::WalBytes));
        assert_eq!(checkpoint_due(&BOUNDS, &past(30, 0, 0)), Some(CheckpointReason::Interval));
        // Only the engine-bytes checkpoint writes tables: it wins whatever else is due.
        assert_eq!(checkpoint_due(&BOUNDS, &past(99, 1001, 5001)), Some(CheckpointReason::EngineBytes));
        assert_eq!(checkpoint_due(&BOUNDS, &past(99, 0, 5001)), Some(CheckpointReason::WalBytes));
    }

    #[test]
    fn wal_bytes_count_from_the_start_of_the_last_checkpoint() {
        let checkpoints = Checkpoints::new(100);
        assert_eq!(checkpoints.wal_bytes_since(150), 50);
        checkpoints.taken(CheckpointReason::WalBytes, 140);
        assert_eq!(checkpoints.wal_bytes_since(150), 10);
        // A checkpoint that began earlier (they run one at a time, but the count never goes back).
        checkpoints.taken(CheckpointReason::Interval, 120);
        assert_eq!(checkpoints.wal_bytes_since(150), 10);
        assert_eq!(checkpoints.wal_bytes_since(130), 0);
        assert_eq!(checkpoints.count(CheckpointReason::WalBytes), 1);
        assert_eq!(checkpoints.count(CheckpointReason::Interval), 1);
        assert_eq!(checkpoints.count(CheckpointReason::EngineBytes), 0);
    }
}
