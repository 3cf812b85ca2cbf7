//! [`Wal`]: the handle to one write-ahead log — open (with recovery), submit, read back, purge,
//! shut down.
//!
//! Delicate:
//! - `submit` never blocks: a full queue hands the request back. The writer thread owns the files;
//!   handles only queue requests and read fsynced bytes.
//! - `purge_below` records the new purge point in `wal.meta` BEFORE it deletes anything, so a crash
//!   halfway leaves files that the next open recognises as leftovers and removes.
//! - Dropping the last handle shuts the WAL down (drains and fsyncs what is queued). Doing so from a
//!   completion or hook (the writer thread) does not wait for the thread: it cannot join itself.
//!
//! # Leader or follower
//!
//! A node is either SEQUENCING (the leader: [`Wal::submit`], the writer assigns seqnos and stamps
//! its term and time) or RECEIVING (a follower: [`Wal::submit_replicated`], batches are written
//! byte-identical to the leader's). There is no mode switch: the writer checks, at sequencing time,
//! that replicated batches start exactly where the log ends and that no batch's term is below the
//! log's last term. So a stray leader append on a follower makes the next replicated request fail
//! with [`Error::NotContiguous`] (loudly, nothing written), and a leader append after replicated
//! batches of a higher term than [`Wal::term`] fails with [`Error::TermRegression`]. A promoted
//! follower simply starts submitting after its replicated log.
//!
//! # Positions
//!
//! [`Wal::locate`], [`Wal::last_position`] and [`Wal::term_at`] answer from the batch index and the
//! term history, and see only DURABLE batches (fsynced and announced). A receiver that pipelines
//! several requests before their completions arrive must track its own in-flight tail.
//!
//! # Truncation
//!
//! [`Wal::quarantine_from`] and [`Wal::reset_to`] move batches into `quarantine/` and make the
//! durable frontier go DOWN (see [`crate::quarantine`]); the caller guarantees nothing above the cut
//! was committed or applied. They run on the writer thread, ordered with appends.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use tidal_types::{Seqno, Term, TermSeqno};

use crate::batch::Batch;
use crate::batch::PAYLOAD_LEN_MAX;
use crate::batch_index::{Position, INDEX_BYTES_PER_BATCH};
use crate::clock::Clock;
use crate::config::WalConfig;
use crate::error::{Error, ReplicatedSubmitError, SubmitError};
use crate::io::FileIo;
use crate::quarantine::QuarantineReport;
use crate::reader::{RawReader, ReadPlan, WalReader};
use crate::recovery::{recover, Recovered, Recovery};
use crate::segment::SegmentInfo;
use crate::shared::{Done, LogState, PoisonState, Queue, Queued, Shared, TruncateOp, Work};
use crate::stats::{StatsCounters, WalStats};
use crate::writer::{
    AppendRequest, Appended, Completion, FlushedHook, Prep, ReplicatedAppended, ReplicatedCompletion, Writer,
    WrittenCallback, LOGGED_TIME_LEN,
};

/// How long `append_blocking` waits for queue space before it tries again; a wake-up normally comes
/// much sooner, from the writer taking a drain.
const QUEUE_FULL_RETRY_WAIT: Duration = Duration::from_millis(10);

/// What a purge did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgeReport {
    /// Segments deleted.
    pub segments_removed: usize,
    /// Their bytes.
    pub bytes_removed: u64,
    /// The purge point now (the last purged position; seqno 0 if nothing was ever purged).
    pub purged: TermSeqno,
    /// The first seqno still retained.
    pub first_retained: Seqno,
}

/// Handle to a write-ahead log. Cheap to clone; the last handle dropped shuts the WAL down.
#[derive(Clone)]
pub struct Wal {
    inner: Arc<WalInner>,
}

struct WalInner {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    writer_thread: ThreadId,
}

/// A WAL read and checked from disk whose writer has not started: the slow half of an open
/// ([`Wal::recover`]), which a node runs beside its engine's open; [`RecoveredWal::start`] is the
/// rest. Nothing else may touch the WAL directory in between.
pub struct RecoveredWal {
    config: WalConfig,
    io: Arc<dyn FileIo>,
    recovered: Recovered,
}

impl RecoveredWal {
    /// Starts the writer thread: the WAL takes writes from here on.
    pub fn start(self, clock: Arc<dyn Clock>, hook: Box<dyn FlushedHook>) -> Result<(Wal, Recovery), Error> {
        Wal::start(self.config, self.io, clock, hook, self.recovered)
    }
}

impl Wal {
    /// Opens (recovering) or creates the WAL in `config.dir` and starts its writer thread:
    /// [`Wal::recover`], then [`RecoveredWal::start`].
    pub fn open(
        config: WalConfig,
        io: Arc<dyn FileIo>,
        clock: Arc<dyn Clock>,
        hook: Box<dyn FlushedHook>,
    ) -> Result<(Wal, Recovery), Error> {
        Wal::recover(config, io)?.start(clock, hook)
    }

    /// Recovers the WAL in `config.dir` (creating it if missing): lists and verifies every segment,
    /// cuts a torn tail of the last one, and refuses corruption anywhere else. Starts nothing.
    pub fn recover(config: WalConfig, io: Arc<dyn FileIo>) -> Result<RecoveredWal, Error> {
        let recovered = recover(&config, io.as_ref())?;
        Ok(RecoveredWal { config, io, recovered })
    }

    fn start(
        config: WalConfig,
        io: Arc<dyn FileIo>,
        clock: Arc<dyn Clock>,
        hook: Box<dyn FlushedHook>,
        recovered: Recovered,
    ) -> Result<(Wal, Recovery), Error> {
        let took_ready = recovered.took_ready;
        let recovery = recovered.recovery.clone();
        let history_term = recovered.meta.term_history.last().map_or(Term(0), |entry| entry.term);
        let active_info = recovered.segments.last().cloned().unwrap_or_else(|| SegmentInfo {
            path: config.dir.join(crate::segment::segment_file_name(recovered.next_seqno)),
            first_seqno: recovered.next_seqno,
            last_seqno: None,
            bytes: 0,
        });
        let segments =
            if recovered.segments.is_empty() { vec![active_info.clone()] } else { recovered.segments };
        let config_preallocates = config.preallocate_len() > 0;
        let shared = Arc::new(Shared {
            config,
            io,
            clock,
            queue: Mutex::new(Queue::default()),
            queue_ready: Condvar::new(),
            queue_space: Condvar::new(),
            log: Mutex::new(LogState { segments, meta: recovered.meta, index: recovered.index }),
            term: AtomicU64::new(recovery.last_term.get()),
            durable: AtomicU64::new(recovery.durable.get()),
            poisoned: AtomicBool::new(false),
            poison: Mutex::new(PoisonState::default()),
            stats: StatsCounters::default(),
            truncations: AtomicU64::new(0),
            verified_at_open: recovery.durable,
            prep_pending: Mutex::new(config_preallocates),
            prep_changed: Condvar::new(),
            handoff: tidal_types::activity::Handoff::on_current(),
        });
        let writer = Writer {
            shared: shared.clone(),
            hook,
            active: recovered.active,
            active_info,
            active_len: recovered.active_len,
            prep: Prep::resume(shared.config.preallocate_len(), recovered.next),
            next_seqno: recovered.next_seqno,
            last_time_ms: recovery.last_time_ms,
            history_term,
            last_drain_requests: 0,
            last_fsync: Duration::ZERO,
        };
        let mut writer = writer;
        // The first next segment is prepared before the WAL takes writes: a fresh node does not
        // spend its first seconds interleaving zero-fill steps with client drains (decisions/017).
        // A segment.prep a crash left behind is finished in idle steps instead: a restarted node
        // (a follower that must catch up) serves at once (decisions/022).
        // After a clean restart that took the kept `segment.ready` (decisions/033) the next one is
        // prepared in idle steps too: the restart writes no zeros before it serves.
        if matches!(writer.prep, Prep::Wanted) && !took_ready {
            writer.prepare_next_segment();
        }
        shared.set_prep_pending(writer.prep.is_pending());
        let handle = std::thread::Builder::new()
            .name("tidal-wal-writer".to_string())
            .spawn(move || writer.run())
            .map_err(|err| Error::Spawn(Arc::new(err)))?;
        let writer_thread = handle.thread().id();
        tracing::info!(
            dir = %shared.config.dir.display(),
            durable = %recovery.durable,
            segments = recovery.segments,
            batches = recovery.batches,
            "opened WAL"
        );
        let inner = WalInner { shared, writer: Mutex::new(Some(handle)), writer_thread };
        Ok((Wal { inner: Arc::new(inner) }, recovery))
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Queues a leader write; `done` is called once it is durable (or failed). Never blocks.
    pub fn submit(&self, request: AppendRequest, done: Completion) -> Result<(), SubmitError> {
        validate(&request)?;
        match self.enqueue(Queued { work: Work::Append(request), done: Done::Append(done) }, true) {
            Ok(()) => Ok(()),
            Err((Work::Append(request), Refusal::Full)) => Err(SubmitError::QueueFull(request)),
            Err((_, Refusal::Full)) => unreachable!("enqueue hands back what it was given"),
            Err((_, Refusal::Closed)) => Err(SubmitError::Closed),
            Err((_, Refusal::Poisoned)) => Err(SubmitError::Poisoned),
        }
    }

    /// Queues replicated batches (a follower's append): they are written byte-identical, as one
    /// request, through the same drains, fsync and [`FlushedHook`] as leader writes; `done` is called
    /// once they are durable. The batches must be contiguous with non-decreasing terms (checked here);
    /// the first must start at the seqno the log continues at when the writer sequences them, and its
    /// term must not be below the log's last term (checked there: else `done` gets
    /// [`Error::NotContiguous`] or [`Error::TermRegression`] and nothing is written). A term above
    /// every term in the log is recorded in the term history. Never blocks.
    pub fn submit_replicated(
        &self,
        batches: Vec<Batch>,
        done: ReplicatedCompletion,
    ) -> Result<(), ReplicatedSubmitError> {
        self.submit_replicated_with(batches, None, done)
    }

    /// [`Wal::submit_replicated`], and `on_written` runs on the writer thread once the batches are
    /// written to the segment, before the drain's fsync and after [`FlushedHook::written`]; never if
    /// the request is refused or the write fails. Same rules as the completion.
    pub fn submit_replicated_with(
        &self,
        batches: Vec<Batch>,
        on_written: Option<WrittenCallback>,
        done: ReplicatedCompletion,
    ) -> Result<(), ReplicatedSubmitError> {
        validate_replicated(&batches).map_err(ReplicatedSubmitError::Invalid)?;
        let queued = Queued { work: Work::Replicated(batches, on_written), done: Done::Replicated(done) };
        match self.enqueue(queued, true) {
            Ok(()) => Ok(()),
            Err((Work::Replicated(batches, _), Refusal::Full)) => {
                Err(ReplicatedSubmitError::QueueFull(batches))
            }
            Err((_, Refusal::Full)) => unreachable!("enqueue hands back what it was given"),
            Err((_, Refusal::Closed)) => Err(ReplicatedSubmitError::Closed),
            Err((_, Refusal::Poisoned)) => Err(ReplicatedSubmitError::Poisoned),
        }
    }

    /// [`Wal::submit_replicated`], waiting for queue space and then until the batches are durable.
    pub fn append_replicated_blocking(&self, batches: Vec<Batch>) -> Result<ReplicatedAppended, Error> {
        let (sender, receiver) = mpsc::sync_channel(1);
        let mut batches = batches;
        loop {
            let sender = sender.clone();
            let done: ReplicatedCompletion = Box::new(move |result| {
                // The receiver only goes away if the caller stopped waiting; nothing to tell then.
                let _ = sender.send(result);
            });
            match self.submit_replicated(batches, done) {
                Ok(()) => break,
                Err(ReplicatedSubmitError::QueueFull(back)) => {
                    batches = back;
                    let queue = self.shared().lock_queue();
                    let _ = self.shared().queue_space.wait_timeout(queue, QUEUE_FULL_RETRY_WAIT);
                }
                Err(ReplicatedSubmitError::Poisoned) => return Err(Error::Poisoned),
                Err(ReplicatedSubmitError::Closed) => return Err(Error::Closed),
                Err(ReplicatedSubmitError::Invalid(reason)) => return Err(Error::Invalid(reason)),
            }
        }
        drop(sender);
        receiver.recv().unwrap_or(Err(Error::Poisoned))
    }

    /// Moves the durable batches from `seqno` on into a quarantine file and cuts them off the log
    /// (see [`crate::quarantine`]). `seqno` must be the first seqno of a retained batch. Runs on the
    /// writer thread after everything queued before it is durable; waits for it. The durable
    /// frontier goes DOWN to `seqno - 1`: the caller guarantees nothing above it was committed or
    /// applied. An I/O failure poisons the WAL. Refused ([`Error::Invalid`]) from a completion or hook.
    pub fn quarantine_from(&self, seqno: Seqno) -> Result<QuarantineReport, Error> {
        self.truncate(TruncateOp::QuarantineFrom(seqno))
    }

    /// Quarantines every retained batch and leaves an empty log that continues at
    /// `position.seqno + 1`, with purge point `position` and `term_history` (the snapshot source's,
    /// entries above `position` ignored; it must put `position.term` at `position.seqno`). Crash-safe:
    /// a reopen sees either the old log or the reset one. Same rules as [`Wal::quarantine_from`].
    pub fn reset_to(
        &self,
        position: TermSeqno,
        term_history: &[TermSeqno],
    ) -> Result<QuarantineReport, Error> {
        self.truncate(TruncateOp::ResetTo { position, term_history: term_history.to_vec() })
    }

    /// [`Wal::quarantine_from`] without waiting: `done` is called on the writer thread with the
    /// outcome (an async caller awaits a channel instead of holding a blocking thread).
    pub fn quarantine_from_then(
        &self,
        seqno: Seqno,
        done: impl FnOnce(Result<QuarantineReport, Error>) + Send + 'static,
    ) -> Result<(), Error> {
        let queued = Queued {
            work: Work::Truncate(TruncateOp::QuarantineFrom(seqno)),
            done: Done::Truncate(Box::new(done)),
        };
        match self.enqueue(queued, false) {
            Ok(()) => Ok(()),
            Err((_, Refusal::Closed)) => Err(Error::Closed),
            Err((_, Refusal::Poisoned | Refusal::Full)) => Err(Error::Poisoned),
        }
    }

    fn truncate(&self, op: TruncateOp) -> Result<QuarantineReport, Error> {
        if std::thread::current().id() == self.inner.writer_thread {
            return Err(Error::Invalid(
                "a truncation cannot wait for the writer thread on itself".to_string(),
            ));
        }
        let (sender, receiver) = mpsc::sync_channel(1);
        let done = Box::new(move |result| {
            // The receiver only goes away if the caller stopped waiting; nothing to tell then.
            let _ = sender.send(result);
        });
        match self.enqueue(Queued { work: Work::Truncate(op), done: Done::Truncate(done) }, false) {
            Ok(()) => {}
            Err((_, Refusal::Closed)) => return Err(Error::Closed),
            Err((_, Refusal::Poisoned | Refusal::Full)) => return Err(Error::Poisoned),
        }
        receiver.recv().unwrap_or(Err(Error::Poisoned))
    }

    /// Queues `queued`, subject to the queue bounds if `bounded`; hands the work back if refused.
    fn enqueue(&self, queued: Queued, bounded: bool) -> Result<(), (Work, Refusal)> {
        let shared = self.shared();
        if shared.is_poisoned() {
            return Err((queued.work, Refusal::Poisoned));
        }
        let mut queue = shared.lock_queue();
        if queue.closed {
            return Err((queued.work, Refusal::Closed));
        }
        if shared.is_poisoned() {
            return Err((queued.work, Refusal::Poisoned));
        }
        let bytes = queued.work.queued_bytes();
        let full = queue.requests.len() >= shared.config.queue_batches_max
            || (!queue.requests.is_empty()
                && queue.bytes.saturating_add(bytes) > shared.config.queue_bytes_max);
        if bounded && full {
            return Err((queued.work, Refusal::Full));
        }
        queue.bytes += bytes;
        queue.requests.push_back(queued);
        shared.handoff.woken();
        let wake = queue.writer_waiting && queue.requests.len() >= queue.wake_at;
        drop(queue);
        if wake {
            shared.queue_ready.notify_one();
        }
        Ok(())
    }

    /// Submits and waits until the request is durable. Waits for queue space instead of failing.
    pub fn append_blocking(&self, request: AppendRequest) -> Result<Appended, Error> {
        let (sender, receiver) = mpsc::sync_channel(1);
        let mut request = request;
        loop {
            let sender = sender.clone();
            let done: Completion = Box::new(move |result| {
                // The receiver only goes away if the caller stopped waiting; nothing to tell then.
                let _ = sender.send(result);
            });
            match self.submit(request, done) {
                Ok(()) => break,
                Err(SubmitError::QueueFull(back)) => {
                    request = back;
                    let queue = self.shared().lock_queue();
                    let _ = self.shared().queue_space.wait_timeout(queue, QUEUE_FULL_RETRY_WAIT);
                }
                Err(SubmitError::Poisoned) => return Err(Error::Poisoned),
                Err(SubmitError::Closed) => return Err(Error::Closed),
                Err(SubmitError::Invalid(reason)) => return Err(Error::Invalid(reason)),
            }
        }
        drop(sender);
        // A dropped completion means the writer thread died: report the WAL as poisoned.
        receiver.recv().unwrap_or(Err(Error::Poisoned))
    }

    /// Sets the term stamped into batches written from now on. A lower term is ignored.
    pub fn set_term(&self, term: Term) {
        self.shared().term.fetch_max(term.get(), Ordering::SeqCst);
    }

    /// The term stamped into batches written from now on.
    pub fn term(&self) -> Term {
        Term(self.shared().term.load(Ordering::SeqCst))
    }

    /// The durable frontier: highest fsynced seqno.
    pub fn durable_seqno(&self) -> Seqno {
        self.shared().durable_seqno()
    }

    /// Whether a write or fsync failure has poisoned the WAL.
    pub fn is_poisoned(&self) -> bool {
        self.shared().is_poisoned()
    }

    /// The failure that poisoned the WAL (the first one), if any.
    pub fn poison_reason(&self) -> Option<String> {
        self.shared().poison_reason()
    }

    /// Calls `listener` once with the reason when the WAL is poisoned (at once if it is already),
    /// on the thread that poisons it (usually the writer's): it must not wait for anything.
    pub fn on_poison(&self, listener: impl Fn(&str) + Send + Sync + 'static) {
        self.shared().on_poison(Box::new(listener));
    }

    /// The term history `[(term, first seqno of that term)]` (terms above 0 only).
    pub fn term_history(&self) -> Vec<TermSeqno> {
        self.shared().lock_log().meta.term_history.clone()
    }

    /// Where `seqno` sits in the durable log: inside a retained batch, beyond the durable frontier,
    /// or at or below the purge point (seqno 0 included).
    pub fn locate(&self, seqno: Seqno) -> Position {
        let log = self.shared().lock_log();
        if seqno <= log.meta.purged.seqno {
            return Position::Purged;
        }
        match log.index.batch_of(seqno) {
            Some((first, last)) => Position::In { term: log.meta.term_at(first), first, last },
            None if seqno >= log.index.next() => Position::Beyond,
            // Retained seqnos are all indexed; only seqnos below them are left.
            None => Position::Purged,
        }
    }

    /// The last DURABLE position: the durable frontier and its term (`(0, 0)` for a log that never
    /// held anything; the purge point for a log whose every batch is purged or reset).
    pub fn last_position(&self) -> TermSeqno {
        let log = self.shared().lock_log();
        let seqno = Seqno(log.index.next().get() - 1);
        TermSeqno { term: log.meta.term_at(seqno), seqno }
    }

    /// Whether `position` is a position of this durable log: `(0, 0)`, the purge point, or the last
    /// seqno of a retained batch of `position.term`. A leader ships and serves a `prev` only if its
    /// own log holds it (decisions/057): a follower's prev check is only as good as that.
    pub fn holds(&self, position: TermSeqno) -> bool {
        holds_locked(&self.shared().lock_log(), position)
    }

    /// The term of the batch holding `seqno`, from the term history: known for every seqno up to the
    /// durable frontier, purged ones included; `None` for seqno 0 and beyond the frontier.
    pub fn term_at(&self, seqno: Seqno) -> Option<Term> {
        let log = self.shared().lock_log();
        (seqno > Seqno::ZERO && seqno < log.index.next()).then(|| log.meta.term_at(seqno))
    }

    /// Retained batches in the in-memory batch index; it costs [`Wal::index_bytes`].
    pub fn indexed_batches(&self) -> usize {
        self.shared().lock_log().index.len()
    }

    /// Memory of the batch index's entries: 8 bytes per retained batch (a `VecDeque` may hold up to
    /// twice that in capacity). Its marks add 16 bytes per [`WalConfig::mark_spacing`] bytes of
    /// segment, not counted here.
    pub fn index_bytes(&self) -> usize {
        self.indexed_batches() * INDEX_BYTES_PER_BATCH
    }

    /// The purge point: the last purged position (seqno 0 if nothing was purged).
    pub fn purged(&self) -> TermSeqno {
        self.shared().lock_log().meta.purged
    }

    /// The retained segments, oldest first, with their durable extent (`bytes` is the logical length:
    /// the active segment's file is longer by its preallocated zeros).
    pub fn list_segments(&self) -> Result<Vec<SegmentInfo>, Error> {
        Ok(self.shared().lock_log().segments.clone())
    }

    /// Reads durable batches, starting with the one that contains `from` (seqno 0 reads as 1).
    /// [`Error::Purged`] if `from` is below the retained segments.
    pub fn read_from(&self, from: Seqno) -> Result<WalReader, Error> {
        Ok(WalReader::new(self.inner.shared.clone(), self.read_plan(from)?, Seqno::ZERO))
    }

    /// [`Wal::read_from`] for startup replay: the batches that recovery verified when this WAL was
    /// opened (up to [`Recovery::durable`]) are not hashed again. Their headers, lengths and seqno
    /// chain are still checked, and every batch written since the open is verified as usual. Once a
    /// quarantine or reset has cut the log, nothing is trusted and this is [`Wal::read_from`].
    pub fn read_recovered_from(&self, from: Seqno) -> Result<WalReader, Error> {
        let plan = self.read_plan(from)?;
        let trusted = if plan.truncations == 0 { self.shared().verified_at_open } else { Seqno::ZERO };
        Ok(WalReader::new(self.inner.shared.clone(), plan, trusted))
    }

    /// [`Wal::read_from`] as runs of segment bytes whose seals are not checked ([`RawReader`]): for
    /// serving a pull, whose receiver verifies every batch.
    pub fn read_raw_from(&self, from: Seqno) -> Result<RawReader, Error> {
        Ok(RawReader::new(self.inner.shared.clone(), self.read_plan(from)?))
    }

    /// [`Wal::read_raw_from`] the seqno after `prev`, once this log is known to hold `prev`
    /// ([`Wal::holds`]). The check and the reader's start are one step under the log lock, and the
    /// reader fails on any truncation after it ([`Error::TruncatedWhileReading`]), so what it reads
    /// is what followed `prev` in this log: a pull never pairs a `prev` with batches of a log that
    /// replaced it in between (decisions/057). [`Error::NotInLog`] if the log does not hold `prev`;
    /// [`Error::Purged`] if `prev` is below the purge point.
    pub fn read_raw_after(&self, prev: TermSeqno) -> Result<RawReader, Error> {
        Ok(RawReader::new(self.inner.shared.clone(), self.read_plan_checked(prev.seqno.next(), Some(prev))?))
    }

    /// The segments to read from `from` on, `from` itself (at least 1), the durable frontier, the
    /// truncation count and the mark to start at, taken together.
    fn read_plan(&self, from: Seqno) -> Result<ReadPlan, Error> {
        self.read_plan_checked(from, None)
    }

    /// [`Wal::read_plan`], checking under the same lock that the log holds `prev` (if given).
    fn read_plan_checked(&self, from: Seqno, prev: Option<TermSeqno>) -> Result<ReadPlan, Error> {
        let from = from.max(Seqno(1));
        let (segments, durable, truncations, start) = {
            let log = self.shared().lock_log();
            if let Some(prev) = prev {
                if prev.seqno > Seqno::ZERO && prev.seqno < log.meta.purged.seqno {
                    let first_retained = log.segments.first().map_or(log.index.next(), |s| s.first_seqno);
                    return Err(Error::Purged { requested: from, first_retained });
                }
                if !holds_locked(&log, prev) {
                    return Err(Error::NotInLog { position: prev });
                }
            }
            let holding =
                log.segments.iter().find(|segment| segment.last_seqno.is_some_and(|last| last >= from));
            (
                log.segments.clone(),
                self.shared().durable_seqno(),
                self.shared().truncations.load(Ordering::SeqCst),
                holding.and_then(|segment| log.index.start_in(segment.first_seqno, from)),
            )
        };
        let first_retained = segments.first().map_or(durable.next(), |segment| segment.first_seqno);
        if from < first_retained {
            return Err(Error::Purged { requested: from, first_retained });
        }
        let segments: Vec<SegmentInfo> = segments
            .into_iter()
            .filter(|segment| segment.last_seqno.is_some_and(|last| last >= from))
            .collect();
        Ok(ReadPlan { segments, from, durable, truncations, start })
    }

    /// Deletes whole segments whose every seqno is below `horizon`, never the active one, after
    /// recording the new purge point in `wal.meta`. A failed fsync of the meta file poisons the WAL;
    /// a store that finds no file descriptor left fails the purge alone ([`Error::Fatal`] with
    /// EMFILE as its cause, the WAL not poisoned).
    pub fn purge_below(&self, horizon: Seqno) -> Result<PurgeReport, Error> {
        let shared = self.shared();
        if shared.is_poisoned() {
            return Err(Error::Poisoned);
        }
        let mut log = shared.lock_log();
        let removable = log.segments[..log.segments.len().saturating_sub(1)]
            .iter()
            .take_while(|segment| segment.last_seqno.is_some_and(|last| last < horizon))
            .count();
        let first_retained =
            |log: &LogState| log.segments.first().map_or(Seqno(1), |segment| segment.first_seqno);
        if removable == 0 {
            return Ok(PurgeReport {
                segments_removed: 0,
                bytes_removed: 0,
                purged: log.meta.purged,
                first_retained: first_retained(&log),
            });
        }
        let purged_seqno = log.segments[removable - 1].last_seqno.unwrap_or(Seqno::ZERO);
        let mut meta = log.meta.clone();
        meta.purged = TermSeqno { term: meta.term_at(purged_seqno), seqno: purged_seqno };
        if let Err(err) = meta.store(shared.io.as_ref(), &shared.config.dir) {
            tracing::error!("failed to {err:#}");
            if !err.is_out_of_descriptors() {
                shared.poison(&format!("{err:#}"));
            }
            // Out of file descriptors, nothing was fsynced: the purge changed nothing that
            // matters (a new `wal.meta` that reaches the disk anyway only has the next open remove
            // segments below a horizon that was already allowed). Try again later.
            return Err(err);
        }
        log.meta = meta;
        let removed: Vec<SegmentInfo> = log.segments.drain(..removable).collect();
        let first_retained_now = first_retained(&log);
        log.index.purge_below(first_retained_now);
        let report = PurgeReport {
            segments_removed: removed.len(),
            bytes_removed: removed.iter().map(|segment| segment.bytes).sum(),
            purged: log.meta.purged,
            first_retained: first_retained(&log),
        };
        drop(log);
        for segment in &removed {
            // The purge point is already durable: a file left behind is removed by the next open.
            shared
                .io
                .remove_file(&segment.path)
                .map_err(|err| Error::io("remove purged segment", &segment.path, err))?;
        }
        shared
            .io
            .sync_dir(&shared.config.dir)
            .map_err(|err| Error::io("fsync WAL directory", &shared.config.dir, err))?;
        tracing::info!(purged = %report.purged, segments = report.segments_removed, "purged WAL segments");
        Ok(report)
    }

    /// Stops taking requests, writes and fsyncs what is queued, completes it, and joins the writer
    /// thread. Idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// A view of this WAL's durable frontier that does not keep the WAL open (the writer stops when
    /// the last [`Wal`] handle goes, whatever views remain).
    pub fn durable_view(&self) -> DurableView {
        DurableView(self.inner.shared.clone())
    }

    /// Waits until the writer has no next segment left to prepare (it prepares one while idle, after
    /// open and after each rotation), at most `timeout`; whether it got there. With preallocation
    /// off, at once. For tests and benchmarks that want the file operations of a quiet WAL.
    pub fn wait_segment_prepared(&self, timeout: Duration) -> bool {
        let shared = self.shared();
        let guard = shared.prep_pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (guard, _) = shared
            .prep_changed
            .wait_timeout_while(guard, timeout, |pending| *pending && !shared.is_poisoned())
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        !*guard
    }

    /// A snapshot of the writer's counters.
    pub fn stats(&self) -> WalStats {
        let shared = self.shared();
        let mut stats = shared.stats.snapshot();
        {
            let queue = shared.lock_queue();
            stats.queue_batches = queue.requests.len();
            stats.queue_bytes = queue.bytes;
        }
        stats.durable_seqno = shared.durable_seqno().get();
        stats
    }

    /// The configuration the WAL was opened with.
    pub fn config(&self) -> &WalConfig {
        &self.shared().config
    }
}

impl WalInner {
    fn shutdown(&self) {
        self.shared.lock_queue().closed = true;
        self.shared.queue_ready.notify_all();
        self.shared.queue_space.notify_all();
        if std::thread::current().id() == self.writer_thread {
            return;
        }
        let handle = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(handle) = handle {
            if handle.join().is_err() {
                tracing::error!("the WAL writer thread panicked");
            }
        }
    }
}

/// See [`Wal::durable_view`].
#[derive(Clone)]
pub struct DurableView(Arc<Shared>);

impl DurableView {
    /// Highest fsynced seqno (it goes down only at a quarantine or reset).
    pub fn durable_seqno(&self) -> Seqno {
        self.0.durable_seqno()
    }

    /// Whether the WAL is poisoned (nothing more becomes durable).
    pub fn is_poisoned(&self) -> bool {
        self.0.is_poisoned()
    }
}

impl std::fmt::Debug for DurableView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableView").field("durable", &self.durable_seqno()).finish()
    }
}

impl Drop for WalInner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Why `enqueue` refused.
enum Refusal {
    Full,
    Closed,
    Poisoned,
}

/// Replicated batches must form one contiguous run with non-decreasing terms.
fn validate_replicated(batches: &[Batch]) -> Result<(), String> {
    if batches.is_empty() {
        return Err("a replicated request holds at least one batch".to_string());
    }
    for pair in batches.windows(2) {
        if pair[1].first_seqno() != pair[0].last_seqno().next() {
            return Err(format!(
                "batch at seqno {} does not follow the batch ending at {}",
                pair[1].first_seqno(),
                pair[0].last_seqno()
            ));
        }
        if pair[1].term() < pair[0].term() {
            return Err(format!("batch term {} follows term {}", pair[1].term(), pair[0].term()));
        }
    }
    Ok(())
}

fn validate(request: &AppendRequest) -> Result<(), SubmitError> {
    if request.event_count == 0 {
        return Err(SubmitError::Invalid("a batch consumes at least one seqno".to_string()));
    }
    if request.payload.len() < LOGGED_TIME_LEN {
        return Err(SubmitError::Invalid(format!(
            "payload of {} bytes has no room for the {LOGGED_TIME_LEN}-byte logged time",
            request.payload.len()
        )));
    }
    if request.payload.len() > PAYLOAD_LEN_MAX as usize {
        return Err(SubmitError::Invalid(format!(
            "payload of {} bytes is over the maximum of {PAYLOAD_LEN_MAX}",
            request.payload.len()
        )));
    }
    Ok(())
}

/// [`Wal::holds`] on a locked log.
fn holds_locked(log: &LogState, position: TermSeqno) -> bool {
    if position.seqno == Seqno::ZERO {
        return position.term == Term(0);
    }
    if position == log.meta.purged {
        return true;
    }
    log.index.batch_of(position.seqno).is_some_and(|(_, last)| last == position.seqno)
        && log.meta.term_at(position.seqno) == position.term
}
