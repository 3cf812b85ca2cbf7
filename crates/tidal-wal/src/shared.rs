//! State shared by the [`crate::Wal`] handles, the writer thread and readers.
//!
//! Delicate: lock order. `queue` and `log` are never held together. `log` is held across the rare
//! meta-file writes (a new term, a purge), so purges and term changes are serialized with each other
//! and with readers' snapshots of the segment list. `durable` is only advanced by the writer, after
//! its fsync, together with the segment list under `log`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::writer::WrittenCallback;

use tidal_types::{Seqno, TermSeqno};

use crate::batch::{Batch, HEADER_LEN};
use crate::batch_index::BatchIndex;
use crate::clock::Clock;
use crate::config::WalConfig;
use crate::error::Error;
use crate::io::FileIo;
use crate::quarantine::{QuarantineReport, TruncateCompletion};
use crate::segment::SegmentInfo;
use crate::stats::StatsCounters;
use crate::wal_meta::WalMeta;
use crate::writer::{AppendRequest, Appended, Completion, ReplicatedAppended, ReplicatedCompletion};

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
    /// Why the WAL was poisoned (the first failure), and who is told when it is.
    pub(crate) poison: Mutex<PoisonState>,
    pub(crate) stats: StatsCounters,
    /// Bumped (under `log`) when a quarantine or reset starts and when it ends; a reader that sees it
    /// change under it stops with [`Error::TruncatedWhileReading`] instead of mixing two logs.
    pub(crate) truncations: AtomicU64,
    /// The durable frontier recovery verified when this WAL was opened: every retained batch up to
    /// it had its seal checked in this process ([`crate::Wal::read_recovered_from`] relies on it while
    /// `truncations` is still 0).
    pub(crate) verified_at_open: Seqno,
    /// Whether the writer still has a next segment to prepare (it does so while idle).
    pub(crate) prep_pending: Mutex<bool>,
    /// Signalled when `prep_pending` changes.
    pub(crate) prep_changed: Condvar,
    /// Counts the writer busy from a queued request until it waits again (the simulation's step
    /// barrier, decisions/051; counts nothing in production).
    pub(crate) handoff: tidal_types::activity::Handoff,
}

/// Called once, with the reason, when the WAL is poisoned (see [`crate::Wal::on_poison`]).
pub(crate) type PoisonListener = Box<dyn Fn(&str) + Send + Sync>;

/// The first failure that poisoned the WAL, and the listeners told of it.
#[derive(Default)]
pub(crate) struct PoisonState {
    pub(crate) reason: Option<String>,
    pub(crate) listeners: Vec<PoisonListener>,
}

/// Requests waiting for the writer.
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) requests: VecDeque<Queued>,
    /// Payload bytes of `requests`.
    pub(crate) bytes: usize,
    pub(crate) closed: bool,
    /// Whether the writer waits on `queue_ready` (set and cleared by the writer under this lock).
    /// A submitter wakes it only then: a futex wake per request costs a system call each, and a busy
    /// writer looks at the queue again before it sleeps.
    pub(crate) writer_waiting: bool,
    /// While the writer waits: the queue length that wakes it (1, or more while it gathers).
    pub(crate) wake_at: usize,
}

pub(crate) struct Queued {
    pub(crate) work: Work,
    pub(crate) done: Done,
}

/// What the writer is asked to do.
pub(crate) enum Work {
    /// A leader write: the writer assigns seqnos and stamps term and time.
    Append(AppendRequest),
    /// Replicated batches, written byte-identical if they continue the log; the callback runs once
    /// they are written, before their fsync.
    Replicated(Vec<Batch>, Option<WrittenCallback>),
    /// A quarantine or reset; always a drain of its own.
    Truncate(TruncateOp),
}

/// A truncation the writer performs between drains.
#[derive(Clone, Debug)]
pub(crate) enum TruncateOp {
    /// Move the batches from this seqno on into quarantine and cut them off.
    QuarantineFrom(Seqno),
    /// Quarantine everything, then continue after `position` with `term_history` (through it).
    ResetTo { position: TermSeqno, term_history: Vec<TermSeqno> },
}

/// Who is told the outcome.
pub(crate) enum Done {
    Append(Completion),
    Replicated(ReplicatedCompletion),
    Truncate(TruncateCompletion),
}

/// A successful outcome, of the same kind as its request.
pub(crate) enum Outcome {
    Append(Appended),
    Replicated(ReplicatedAppended),
    Truncated(QuarantineReport),
}

impl Work {
    /// Bytes the item holds in the queue (counted against `queue_bytes_max`).
    pub(crate) fn queued_bytes(&self) -> usize {
        match self {
            Work::Append(request) => request.payload.len(),
            Work::Replicated(batches, _) => batches.iter().map(|batch| batch.encoded().len()).sum(),
            Work::Truncate(_) => 0,
        }
    }

    /// Bytes the item adds to a drain's writes.
    pub(crate) fn encoded_len(&self) -> usize {
        match self {
            Work::Append(request) => HEADER_LEN + request.payload.len(),
            other => other.queued_bytes(),
        }
    }
}

impl Done {
    /// Tells the waiter the outcome.
    pub(crate) fn complete(self, result: Result<Outcome, Error>) {
        match (self, result) {
            (Done::Append(done), Ok(Outcome::Append(appended))) => done(Ok(appended)),
            (Done::Replicated(done), Ok(Outcome::Replicated(appended))) => done(Ok(appended)),
            (Done::Truncate(done), Ok(Outcome::Truncated(report))) => done(Ok(report)),
            (done, Err(err)) => done.fail(err),
            (_, Ok(_)) => unreachable!("the writer answers every request with an outcome of its kind"),
        }
    }

    /// Tells the waiter it failed.
    pub(crate) fn fail(self, err: Error) {
        match self {
            Done::Append(done) => done(Err(err)),
            Done::Replicated(done) => done(Err(err)),
            Done::Truncate(done) => done(Err(err)),
        }
    }
}

/// The segment list, meta file contents and batch index.
pub(crate) struct LogState {
    /// Retained segments in seqno order; never empty (the last is the active one).
    pub(crate) segments: Vec<SegmentInfo>,
    pub(crate) meta: WalMeta,
    /// Boundaries of the retained durable batches.
    pub(crate) index: BatchIndex,
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

    /// Records whether a segment preparation is pending, waking waiters.
    pub(crate) fn set_prep_pending(&self, pending: bool) {
        let mut guard = self.prep_pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *guard != pending {
            *guard = pending;
            self.prep_changed.notify_all();
        }
    }

    /// Marks the WAL poisoned and wakes the writer so it fails what is queued. The first call
    /// records `reason` and tells the listeners ([`crate::Wal::on_poison`]), on this thread.
    pub(crate) fn poison(&self, reason: &str) {
        {
            let mut poison = self.lock_poison();
            if poison.reason.is_none() {
                poison.reason = Some(reason.to_string());
                // Set under the lock: a listener registered later sees the flag and the reason.
                self.poisoned.store(true, Ordering::SeqCst);
                for listener in &poison.listeners {
                    listener(reason);
                }
            }
        }
        self.poisoned.store(true, Ordering::SeqCst);
        self.set_prep_pending(false);
        self.queue_ready.notify_all();
        self.queue_space.notify_all();
    }

    /// Registers `listener` for the poisoning; called at once if the WAL is poisoned already.
    pub(crate) fn on_poison(&self, listener: PoisonListener) {
        let mut poison = self.lock_poison();
        match &poison.reason {
            Some(reason) => listener(reason),
            None => poison.listeners.push(listener),
        }
    }

    /// Why the WAL was poisoned, if it was.
    pub(crate) fn poison_reason(&self) -> Option<String> {
        self.lock_poison().reason.clone()
    }

    fn lock_poison(&self) -> MutexGuard<'_, PoisonState> {
        self.poison.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
