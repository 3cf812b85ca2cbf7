//! State shared by the [`crate::Wal`] handles, the writer thread and readers.
//!
//! Delicate: lock order. `queue` and `log` are never held together. `log` is held across the rare
//! meta-file writes (a new term, a purge), so purges and term changes are serialized with each other
//! and with readers' snapshots of the segment list. `durable` is only advanced by the writer, after
//! its fsync, together with the segment list under `log`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tidal_types::Seqno;

use crate::clock::Clock;
use crate::config::WalConfig;
use crate::io::FileIo;
use crate::segment::SegmentInfo;
use crate::stats::StatsCounters;
use crate::wal_meta::WalMeta;
use crate::writer::{AppendRequest, Completion};

pub(crate) struct Shared {
    pub(crate) config: WalConfig,
    pub(crate) io: Arc<dyn FileIo>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) queue: Mutex<Queue>,
    /// Signalled when a request is queued or the WAL closes (the writer waits on it).
    pub(crate) queue_ready: Condvar,
    /// Signalled when the writer takes requests off the queue (blocked appenders wait on it).
    pub(crate) queue_space: Condvar,
    pub(crate) log: Mutex<LogState>,
    /// Term stamped into batches written from now on; only grows.
    pub(crate) term: AtomicU64,
    /// Highest fsynced seqno.
    pub(crate) durable: AtomicU64,
    pub(crate) poisoned: AtomicBool,
    pub(crate) stats: StatsCounters,
}

/// Requests waiting for the writer.
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) requests: VecDeque<Queued>,
    /// Payload bytes of `requests`.
    pub(crate) bytes: usize,
    pub(crate) closed: bool,
}

pub(crate) struct Queued {
    pub(crate) request: AppendRequest,
    pub(crate) done: Completion,
}

/// The segment list and meta file contents.
pub(crate) struct LogState {
    /// Retained segments in seqno order; never empty (the last is the active one).
    pub(crate) segments: Vec<SegmentInfo>,
    pub(crate) meta: WalMeta,
}

impl Shared {
    pub(crate) fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        // Completions and hooks run outside these locks, so a poisoned mutex only means a panic in
        // this crate's own short critical sections; the data is still consistent enough to fail
        // requests with.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn lock_log(&self) -> MutexGuard<'_, LogState> {
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn durable_seqno(&self) -> Seqno {
        Seqno(self.durable.load(Ordering::SeqCst))
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    /// Marks the WAL poisoned and wakes the writer so it fails what is queued.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
        self.queue_ready.notify_all();
        self.queue_space.notify_all();
    }
}
