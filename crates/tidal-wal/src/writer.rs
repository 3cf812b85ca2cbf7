//! The group-commit writer: one dedicated thread, the sequencer of the WAL.
//!
//! Each drain takes what is queued (bounded by `drain_bytes_max`, at least one request), assigns
//! seqnos, stamps the logged time and the current term, encodes every request as exactly one batch,
//! writes them, fsyncs ONCE (plus once per rotation), records a new term in `wal.meta`, advances the
//! durable frontier, then calls the [`FlushedHook`] and finally every completion.
//!
//! Delicate:
//! - Nothing is handed out (hook, completion, reader) before the fsync that covers it, with one
//!   exception: [`FlushedHook::written`] sees a drain's batches once they are written, just before
//!   its fsync (a cluster leader ships them from there, decisions/023, 027). Whoever takes them there
//!   must not treat them as durable: a failed fsync poisons the WAL and a crash may lose them.
//! - A failed write or fsync poisons the WAL for good: the drain's completions get the error, every
//!   later request gets [`Error::Poisoned`], and nothing is ever retried (after a failed fsync the
//!   kernel may have dropped the pages; a later success would prove nothing).
//! - A failure BEFORE any byte of a batch reached a file does not poison (issue 37, finding 11;
//!   decisions/058): getting the next segment at a rotation (creating it, renaming the prepared one
//!   into place, or opening the directory to fsync its name, e.g. EMFILE) fails the requests that
//!   needed it with [`Error::Io`] and leaves the writer on its sealed segment, which no batch is
//!   written into any more: the next request tries the rotation again. Preparing the next segment
//!   while idle never poisons either, and starts over after the next rotation. Recording a new
//!   term in `wal.meta` after the fsync, with no file descriptor left for it, is logged, not fatal
//!   (the segments hold the term; recovery rebuilds the retained range's history from them).
//! - The logged time is `max(clock, previous batch's time)`, so it never goes backwards in seqno
//!   order, whatever the clock does.
//! - Segments rotate only at batch boundaries; the directory is fsynced after a segment is created,
//!   before any batch in it is acknowledged.
//! - Replicated batches (a follower's appends) go through the same drains, fsync and hook, written
//!   byte-identical: no seqno, term or time is stamped. Their contiguity and term order are checked
//!   HERE, when they are sequenced, against what the log (plus the drain so far) ends with; a request
//!   that does not continue the log fails alone and writes nothing. A leader append whose term is
//!   below the log's last term is refused the same way, so a follower that wrongly sequences its own
//!   write cannot break the log's term order.
//! - A truncation (quarantine, reset) is always a drain of its own: everything queued before it is
//!   durable and announced before it starts, and nothing queued after it is sequenced until it ends.
//!
//! # Preallocated segments (decisions/017)
//!
//! The active segment is written with zeros and fsynced before use; batches overwrite it in place at
//! the logical end (`active_info.bytes`, kept in memory; the file is longer). Each drain's write
//! ends with the segment's end mark right after its last batch (decisions/058), which the next
//! drain's write starts over; preallocated or not, the active segment's file is longer than its
//! logical length by at least the mark, and a seal or a clean shutdown cuts it off. An fdatasync then
//! flushes data blocks only, with no file-size change to commit through the journal. The NEXT
//! segment is prepared as `segment.prep`: completely at open, before the writer takes requests;
//! after each rotation while the queue is empty, one chunk of zeros (and its fdatasync) at a time,
//! checking the queue between chunks, so a drain waits for one chunk at most. Once every zero is
//! written and fsynced it is renamed `segment.ready` (and the directory fsynced): the name says it
//! is complete, and an open trusts it without reading it (decisions/033). A rotation:
//! 1. writes the pending bytes, cuts the old segment to its logical length (a sealed segment holds
//!    no zeros, exactly as without preallocation) and fsyncs it: one fsync for both;
//! 2. renames `segment.ready` to the new segment's name (or, if none is ready, creates an empty
//!    file, written by appending: the fallback, counted in the stats), and fsyncs the directory.
//!
//! A crash between 1 and 2 leaves the old segment last and sealed, and a `segment.ready` the next
//! open takes. A batch larger than the zeros left grows the file past them. A clean shutdown cuts
//! the active segment to its logical length, keeps `segment.ready` and removes a `segment.prep`.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidal_types::{RecordKind, Seqno, Term, TermSeqno};

use crate::batch::{encode_batch_into, Batch};
use crate::error::Error;
use crate::io::WalFile;
use crate::recovery::ZERO_CHUNK_LEN;
use crate::segment::{logged_time_ms, segment_file_name, SegmentInfo, PREP_FILE_NAME, READY_FILE_NAME};
use crate::shared::{Outcome, Queued, Shared, Work};

/// Bytes at the start of every payload that hold the envelope's logged time (u64 LE unix ms).
pub const LOGGED_TIME_LEN: usize = 8;

/// One client write: becomes exactly one batch.
pub struct AppendRequest {
    /// What the payload holds.
    pub kind: RecordKind,
    /// Seqnos the batch consumes (at least 1).
    pub event_count: u32,
    /// The payload; its first 8 bytes are the logged-time slot, overwritten by the writer.
    pub payload: Vec<u8>,
}

impl fmt::Debug for AppendRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppendRequest")
            .field("kind", &self.kind)
            .field("event_count", &self.event_count)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// Where a request landed, once it is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// First seqno of the batch.
    pub first: Seqno,
    /// Last seqno of the batch (inclusive).
    pub last: Seqno,
    /// Term stamped in the batch.
    pub term: Term,
    /// Logged time stamped in the payload.
    pub time_ms: u64,
}

/// Called once per request on the writer thread, after its fsync (or with the error). It must be
/// quick and must not panic: it delays every later write.
pub type Completion = Box<dyn FnOnce(Result<Appended, Error>) + Send>;

/// Where replicated batches landed, once they are durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicatedAppended {
    /// First seqno of the first batch.
    pub first: Seqno,
    /// Position of the last batch's last seqno.
    pub last: TermSeqno,
}

/// Called once per replicated request on the writer thread, after its fsync (or with the error).
/// Same rules as [`Completion`].
pub type ReplicatedCompletion = Box<dyn FnOnce(Result<ReplicatedAppended, Error>) + Send>;

/// Called on the writer thread once a replicated request's batches are written, before the fsync
/// ([`Wal::submit_replicated_with`](crate::Wal::submit_replicated_with)). Same rules as
/// [`Completion`]; the batches are not durable yet.
pub type WrittenCallback = Box<dyn FnOnce() + Send>;

/// Sees every flushed batch, on the writer thread, after the fsync and before the completions, in
/// seqno order (the applier and, by default, the ship feed hang here). Must be quick and must not
/// panic.
pub trait FlushedHook: Send + 'static {
    /// The batches of a drain, written to the segment but NOT yet fsynced, in seqno order: called
    /// just before the drain's fsync, once per drain that writes batches (a cluster member's applier
    /// takes them here, decisions/025; a leader's ship feed too, so followers
    /// fsync while the leader does). Must never wait for anything that waits for this WAL's fsync. They are not durable: if the fsync fails, the WAL
    /// is poisoned and [`FlushedHook::flushed`] is never called for them; after a crash they may be
    /// gone. Batches a rotation inside the drain already fsynced are included.
    fn written(&mut self, _batches: &[Batch]) {}
    /// The batches just made durable, in seqno order.
    fn flushed(&mut self, batches: &[Batch]);
    /// Every batch from `from` on was just cut off the log (quarantined or reset away), before any
    /// later batch is flushed: whoever holds copies of them must drop them.
    fn truncated(&mut self, _from: Seqno) {}
}

/// A hook that ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopHook;

impl FlushedHook for NoopHook {
    fn flushed(&mut self, _batches: &[Batch]) {}
}

/// The writer thread's own state.
pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) hook: Box<dyn FlushedHook>,
    pub(crate) active: Box<dyn WalFile>,
    /// The active segment as it will be once the current drain is durable; `bytes` is its logical
    /// length, where the next batch is written.
    pub(crate) active_info: SegmentInfo,
    /// The active segment's length on disk: its logical length plus the preallocated zeros after it.
    pub(crate) active_len: u64,
    /// The next segment, prepared while the writer is idle.
    pub(crate) prep: Prep,
    pub(crate) next_seqno: Seqno,
    pub(crate) last_time_ms: u64,
    /// Term of the last term-history entry: the term of the log's last batch (or of the purge point).
    /// No batch below it may follow.
    pub(crate) history_term: Term,
    /// Requests the last drain covered, plus those queued when its fsync returned (before its
    /// completions ran): how many writers are likely to be back for the next drain. 0 when the
    /// last drain was too small to gather for.
    pub(crate) last_drain_requests: usize,
    /// How long the last data fsync took (bounds a gather wait).
    pub(crate) last_fsync: Duration,
}

/// Zeros written (and fdatasynced) per idle step of preparing the next segment: a write that arrives
/// during a step waits for it, so it is small (a 1 MiB step cost the replication-lag gate's p99
/// several ms right after a rotation).
const PREP_IDLE_STEP_LEN: usize = 128 * 1024;

/// The next segment's preparation: `segment.prep` while it is filled, `segment.ready` once
/// complete (decisions/033).
pub(crate) enum Prep {
    /// Preallocation is off.
    Off,
    /// Nothing prepared yet; start when idle.
    Wanted,
    /// The last attempt failed (an I/O error: out of file descriptors, a full disk); nothing is
    /// prepared. Not retried while idle (no loop of failing attempts): the next rotation starts an
    /// empty segment and preparation starts over after it.
    Failed,
    /// Zeros written up to `len` of `target`; the last chunk fsynced.
    Filling { file: Box<dyn WalFile>, len: u64, target: u64 },
    /// Written with zeros and fsynced, and named `segment.ready`; the next rotation takes it.
    Ready { file: Box<dyn WalFile>, len: u64 },
}

impl Prep {
    /// The starting state for a WAL configured with `preallocate_len`.
    pub(crate) fn new(preallocate_len: u64) -> Prep {
        if preallocate_len > 0 {
            Prep::Wanted
        } else {
            Prep::Off
        }
    }

    /// The starting state at open: [`Prep::new`], or the next segment recovery kept: a
    /// `segment.ready` (complete) or a `segment.prep` (zeros up to its length) to go on from. A
    /// `segment.prep` that is already long enough is only renamed by its next step.
    pub(crate) fn resume(preallocate_len: u64, kept: Option<crate::recovery::KeptNext>) -> Prep {
        use crate::recovery::KeptNext;
        match kept {
            Some(KeptNext::Ready(file, len)) if preallocate_len > 0 => Prep::Ready { file, len },
            Some(KeptNext::Prep(file, len)) if preallocate_len > 0 => {
                Prep::Filling { file, len, target: preallocate_len }
            }
            _ => Prep::new(preallocate_len),
        }
    }

    pub(crate) fn is_pending(&self) -> bool {
        matches!(self, Prep::Wanted | Prep::Filling { .. })
    }
}

/// What one drain wrote, before it is announced.
struct Flushed {
    batches: Vec<Batch>,
    /// Offset of each of `batches` in the segment that holds it (for the batch index's marks).
    offsets: Vec<u64>,
    /// One per request, in order: its outcome, or why it was refused (nothing of it written).
    outcomes: Vec<Result<Outcome, Error>>,
    /// Segments closed by rotations during the drain.
    closed_segments: Vec<SegmentInfo>,
    term_starts: Vec<TermSeqno>,
    /// Callbacks of the replicated requests sequenced in this drain, run once it is written.
    on_written: Vec<WrittenCallback>,
}

/// Why sequencing a drain stopped.
enum Stop {
    /// A write or fsync failed (bytes may have reached a file, or not reached it durably): the
    /// drain fails and the WAL is poisoned.
    Fatal(Error),
    /// The next segment could not be had before any byte of the next batch was written (issue 37,
    /// finding 11: a file descriptor shortage must not poison the WAL). The request and the rest
    /// of the drain fail with the error, what the drain wrote before stays and is announced, and
    /// the WAL takes later requests as usual.
    Retry(Error),
}

impl Stop {
    fn retry(err: Error) -> Stop {
        Stop::Retry(err)
    }
}

impl From<Error> for Stop {
    fn from(err: Error) -> Stop {
        Stop::Fatal(err)
    }
}

/// How to take a new segment's name back when its directory fsync could not start.
enum Undo {
    /// Rename it back to `segment.ready` (this path).
    Rename(PathBuf),
    /// Remove the empty file just created.
    Remove,
}

/// Fails completions if the writer thread unwinds, so nobody waits forever.
struct PanicGuard(Arc<Shared>);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("the WAL writer thread panicked; the WAL is poisoned");
            self.0.poison("the WAL writer thread panicked");
            let queued: Vec<Queued> = {
                let mut queue = self.0.lock_queue();
                queue.closed = true;
                queue.bytes = 0;
                queue.requests.drain(..).collect()
            };
            fail_all(queued, &Error::Poisoned);
        }
        // However the thread ends, it is not busy any more.
        self.0.handoff.parked();
    }
}

impl Writer {
    /// The thread body: drain until closed and empty.
    pub(crate) fn run(mut self) {
        let _guard = PanicGuard(self.shared.clone());
        while let Some((drain, _turn)) = self.next_drain() {
            if self.shared.is_poisoned() {
                fail_all(drain, &Error::Poisoned);
                continue;
            }
            let (works, dones): (Vec<_>, Vec<_>) =
                drain.into_iter().map(|item| (item.work, item.done)).unzip();
            let result = match <[Work; 1]>::try_from(works) {
                Ok([Work::Truncate(op)]) => self
                    .truncate(op)
                    .inspect(|outcome| {
                        if let Ok(report) = outcome {
                            if report.batches > 0 {
                                self.hook.truncated(report.first.seqno);
                            }
                        }
                    })
                    .map(|report| Flushed {
                        batches: Vec::new(),
                        offsets: Vec::new(),
                        outcomes: vec![report.map(Outcome::Truncated)],
                        closed_segments: Vec::new(),
                        term_starts: Vec::new(),
                        on_written: Vec::new(),
                    }),
                Ok(single) => self.write_drain(Vec::from(single)),
                Err(works) => self.write_drain(works),
            };
            match result {
                Ok(flushed) => {
                    if !flushed.batches.is_empty() {
                        self.hook.flushed(&flushed.batches);
                    }
                    for (done, outcome) in dones.into_iter().zip(flushed.outcomes) {
                        done.complete(outcome);
                    }
                }
                Err(err) => {
                    tracing::error!("failed to {err:#}");
                    self.shared.poison(&format!("failed to {err:#}"));
                    for done in dones {
                        done.fail(err.clone());
                    }
                }
            }
        }
        self.shared.set_prep_pending(false);
        if !self.shared.is_poisoned() {
            if let Err(err) = self.trim_at_shutdown() {
                tracing::error!("failed to {err:#}");
                self.shared.poison(&format!("failed to {err:#}"));
            }
        }
    }

    /// A clean shutdown leaves the segments as without preallocation: the active segment cut to its
    /// logical length (durable already; the cut is fsynced). A completely prepared next segment
    /// (`segment.ready`) stays for the next open to take without writing zeros (decisions/033); a
    /// half-prepared one (`segment.prep`) is removed.
    fn trim_at_shutdown(&mut self) -> Result<(), Error> {
        let path = &self.active_info.path;
        if self.active_len > self.active_info.bytes {
            self.active
                .truncate(self.active_info.bytes)
                .map_err(|err| Error::fatal("cut segment at shutdown", path, err))?;
            self.active.sync_data().map_err(|err| Error::fatal("fsync segment", path, err))?;
            self.active_len = self.active_info.bytes;
        }
        if matches!(self.prep, Prep::Filling { .. }) {
            self.prep = Prep::Wanted;
            let prep = self.shared.config.dir.join(PREP_FILE_NAME);
            self.shared
                .io
                .remove_file(&prep)
                .map_err(|err| Error::io("remove prepared segment", &prep, err))?;
        }
        Ok(())
    }

    /// Prepares the next segment completely (before the writer thread starts).
    pub(crate) fn prepare_next_segment(&mut self) {
        while self.prep.is_pending() {
            self.prep_step(ZERO_CHUNK_LEN);
        }
    }

    /// One step of preparing the next segment: create it, or write (and fsync) `step_len` zeros.
    /// An I/O error gives this preparation up ([`Prep::Failed`]: the next rotation creates an empty
    /// segment, and preparation starts over after it); it never poisons the WAL: no batch is at
    /// stake.
    fn prep_step(&mut self, step_len: usize) {
        let dir = self.shared.config.dir.clone();
        let path = dir.join(PREP_FILE_NAME);
        let io = self.shared.io.clone();
        let target = self.shared.config.preallocate_len();
        let step = match std::mem::replace(&mut self.prep, Prep::Off) {
            Prep::Wanted => io.open_append(&path).and_then(|mut file| {
                file.truncate(0)?;
                Ok(Prep::Filling { file, len: 0, target })
            }),
            Prep::Filling { mut file, len, target } => {
                let chunk = target.saturating_sub(len).min(step_len as u64);
                let zeros = vec![0u8; usize::try_from(chunk).unwrap_or(step_len)];
                let written = if chunk > 0 {
                    file.write_all_at(len, &zeros).and_then(|()| file.sync_data())
                } else {
                    Ok(())
                };
                written.and_then(|()| {
                    let len = len + chunk;
                    if len < target {
                        return Ok(Prep::Filling { file, len, target });
                    }
                    // Complete: every zero is fsynced. The new name says so (decisions/033).
                    io.rename(&path, &dir.join(READY_FILE_NAME))?;
                    io.sync_dir(&dir)?;
                    self.shared.stats.segments_prepared.fetch_add(1, Ordering::Relaxed);
                    Ok(Prep::Ready { file, len })
                })
            }
            other => Ok(other),
        };
        match step {
            Ok(prep) => {
                self.prep = prep;
                self.shared.set_prep_pending(self.prep.is_pending());
            }
            Err(err) => {
                self.prep = Prep::Failed;
                self.shared.set_prep_pending(false);
                tracing::error!(path = %path.display(), "failed to prepare the next WAL segment; trying again after the next rotation: {err}");
                // Best effort: recovery removes it anyway.
                let _ = io.remove_file(&path);
            }
        }
    }

    /// Waits for requests; `None` once closed and empty. A truncation is always taken alone.
    /// The drain comes with the writer's turn (the simulation's step barrier, decisions/051): it is
    /// taken, written and completed between two steps.
    fn next_drain(&mut self) -> Option<(Vec<Queued>, tidal_types::activity::Turn)> {
        let shared = Arc::clone(&self.shared);
        let mut queue = shared.lock_queue();
        let mut turn = None;
        loop {
            if !queue.requests.is_empty() {
                if turn.is_some() || !shared.handoff.counted() {
                    break;
                }
                drop(queue);
                turn = Some(shared.handoff.turn());
                queue = shared.lock_queue();
                continue;
            }
            if queue.closed {
                self.shared.handoff.parked();
                return None;
            }
            if self.prep.is_pending() && !self.shared.is_poisoned() {
                drop(queue);
                let _turn = shared.handoff.turn();
                self.prep_step(PREP_IDLE_STEP_LEN);
                queue = shared.lock_queue();
                continue;
            }
            queue.writer_waiting = true;
            self.shared.handoff.parked();
            queue = self.shared.queue_ready.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
            queue.writer_waiting = false;
        }
        queue = self.gather(queue);
        let drain_bytes_max =
            if self.shared.is_poisoned() { usize::MAX } else { self.shared.config.drain_bytes_max };
        let mut drain = Vec::new();
        let mut drain_bytes = 0usize;
        while let Some(front) = queue.requests.front() {
            let is_truncate = matches!(front.work, Work::Truncate(_));
            if !drain.is_empty() && is_truncate {
                break;
            }
            let encoded_len = front.work.encoded_len();
            if !drain.is_empty() && drain_bytes.saturating_add(encoded_len) > drain_bytes_max {
                break;
            }
            let Some(item) = queue.requests.pop_front() else { break };
            queue.bytes -= item.work.queued_bytes();
            drain_bytes = drain_bytes.saturating_add(encoded_len);
            drain.push(item);
            if is_truncate {
                break;
            }
        }
        drop(queue);
        self.shared.queue_space.notify_all();
        Some((drain, turn.unwrap_or_else(tidal_types::activity::Turn::none)))
    }

    /// The adaptive gather (experiments/021). After a drain that covered many writers, those writers
    /// come back one by one as their completions wake them: taking the first few at once splits them
    /// over two or more fsyncs. Waits, bounded by `gather_wait_max` and by the last fsync's
    /// duration, until as many requests are queued as the last drain counted writers; one wake when
    /// they are all there (`wake_at`), not one per request. Never after a small drain (low load),
    /// never before a truncation, never once closed or poisoned.
    fn gather<'a>(
        &mut self,
        mut queue: std::sync::MutexGuard<'a, crate::shared::Queue>,
    ) -> std::sync::MutexGuard<'a, crate::shared::Queue> {
        let target = std::mem::take(&mut self.last_drain_requests);
        // A gather waits on the real clock for writers that, in a simulation, cannot come while
        // this thread holds its turn (decisions/052).
        if target == 0 || queue.requests.len() >= target || self.shared.handoff.counted() {
            return queue;
        }
        if matches!(queue.requests.front().map(|front| &front.work), Some(Work::Truncate(_))) {
            return queue;
        }
        let wait = self.shared.config.gather_wait_max.min(self.last_fsync);
        let started = Instant::now();
        let deadline = started + wait;
        while queue.requests.len() < target && !queue.closed && !self.shared.is_poisoned() {
            let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|left| !left.is_zero())
            else {
                break;
            };
            queue.writer_waiting = true;
            queue.wake_at = target;
            queue = match self.shared.queue_ready.wait_timeout(queue, left) {
                Ok((queue, _)) => queue,
                Err(poisoned) => poisoned.into_inner().0,
            };
            queue.writer_waiting = false;
            queue.wake_at = 1;
        }
        self.shared.stats.record_gather(started.elapsed(), queue.requests.len() >= target);
        queue
    }

    /// Writes and fsyncs one drain of appends, then publishes the new durable frontier, segment list
    /// and index. Requests that do not fit the log are refused alone; an I/O failure fails the drain.
    fn write_drain(&mut self, works: Vec<Work>) -> Result<Flushed, Error> {
        let term = Term(self.shared.term.load(Ordering::SeqCst));
        let mut flushed = Flushed {
            batches: Vec::with_capacity(works.len()),
            offsets: Vec::with_capacity(works.len()),
            outcomes: Vec::with_capacity(works.len()),
            closed_segments: Vec::new(),
            term_starts: Vec::new(),
            on_written: Vec::new(),
        };
        let mut buf = Vec::with_capacity(works.iter().map(Work::encoded_len).sum());
        // Set once a rotation failed without poisoning: the rest of the drain fails with it.
        let mut stopped: Option<Error> = None;
        for work in works {
            if let Some(err) = &stopped {
                flushed.outcomes.push(Err(err.clone()));
                continue;
            }
            if let Err(refusal) = self.check_fits(&work, term) {
                flushed.outcomes.push(Err(refusal));
                continue;
            }
            let outcome = match work {
                Work::Append(request) => self.sequence_append(request, term, &mut buf, &mut flushed),
                Work::Replicated(batches, on_written) => {
                    let outcome = self.sequence_replicated(batches, &mut buf, &mut flushed);
                    if outcome.is_ok() {
                        flushed.on_written.extend(on_written);
                    }
                    outcome
                }
                Work::Truncate(_) => unreachable!("next_drain takes a truncation alone"),
            };
            match outcome {
                Ok(outcome) => flushed.outcomes.push(Ok(outcome)),
                Err(Stop::Fatal(err)) => return Err(err),
                Err(Stop::Retry(err)) => {
                    tracing::error!(
                        "failed to get the next WAL segment; failing the writes that need it: {err:#}"
                    );
                    flushed.outcomes.push(Err(err.clone()));
                    stopped = Some(err);
                }
            }
        }
        if flushed.batches.is_empty() {
            return Ok(flushed);
        }
        self.write_pending(&mut buf, true)?;
        self.hook.written(&flushed.batches);
        for on_written in flushed.on_written.drain(..) {
            on_written();
        }
        self.sync_active()?;
        let gather_min = self.shared.config.gather_min_requests;
        if gather_min > 0 && flushed.outcomes.len() >= gather_min {
            // The writers of this drain are not back yet (their completions run after this):
            // whoever is queued now is another writer.
            self.last_drain_requests = flushed.outcomes.len() + self.shared.lock_queue().requests.len();
        }
        self.publish(&flushed)?;
        Ok(flushed)
    }

    /// Rotates first if the active segment is full. Called before each batch.
    fn rotate_if_full(&mut self, buf: &mut Vec<u8>, flushed: &mut Flushed) -> Result<(), Stop> {
        let pending = self.active_info.bytes + buf.len() as u64;
        if pending > 0 && pending >= self.shared.config.segment_bytes_max {
            self.rotate(buf, flushed)?;
        }
        Ok(())
    }

    /// Whether a request may continue the log as it ends now (with the drain so far). A refusal
    /// fails only that request; nothing of it is written.
    fn check_fits(&self, work: &Work, term: Term) -> Result<(), Error> {
        let (first, first_term) = match work {
            Work::Append(_) => (self.next_seqno, term),
            Work::Replicated(batches, _) => match batches.first() {
                Some(head) => (head.first_seqno(), head.term()),
                None => {
                    return Err(Error::Invalid("a replicated request holds at least one batch".to_string()))
                }
            },
            Work::Truncate(_) => return Ok(()),
        };
        if first != self.next_seqno {
            return Err(Error::NotContiguous { expected: self.next_seqno, got: first });
        }
        if first_term < self.history_term {
            return Err(Error::TermRegression { term: first_term, last_term: self.history_term });
        }
        Ok(())
    }

    /// A leader write: assign seqnos, stamp term and time, encode. `check_fits` passed.
    fn sequence_append(
        &mut self,
        mut request: AppendRequest,
        term: Term,
        buf: &mut Vec<u8>,
        flushed: &mut Flushed,
    ) -> Result<Outcome, Stop> {
        self.rotate_if_full(buf, flushed)?;
        let first = self.next_seqno;
        let last = first.add(u64::from(request.event_count) - 1);
        let time_ms = self.shared.clock.now_ms().max(self.last_time_ms);
        request.payload[..LOGGED_TIME_LEN].copy_from_slice(&time_ms.to_le_bytes());
        let start = buf.len();
        encode_batch_into(buf, request.kind, term, first, request.event_count, &request.payload);
        let batch = Batch::from_verified(bytes::Bytes::copy_from_slice(&buf[start..]))
            .map_err(|err| Error::corrupt(&self.active_info.path, self.active_info.bytes, err.to_string()))?;
        self.account(&batch, start, flushed);
        self.last_time_ms = time_ms;
        Ok(Outcome::Append(Appended { first, last, term, time_ms }))
    }

    /// Replicated batches, copied byte for byte. `check_fits` passed; `submit_replicated` checked
    /// that they are contiguous with non-decreasing terms. A [`Stop::Retry`] at a rotation between
    /// two of them leaves the ones before it written (and the caller announces them).
    fn sequence_replicated(
        &mut self,
        batches: Vec<Batch>,
        buf: &mut Vec<u8>,
        flushed: &mut Flushed,
    ) -> Result<Outcome, Stop> {
        let (Some(head), Some(tail)) = (batches.first(), batches.last()) else {
            unreachable!("check_fits refuses an empty replicated request");
        };
        let appended = ReplicatedAppended {
            first: head.first_seqno(),
            last: TermSeqno { term: tail.term(), seqno: tail.last_seqno() },
        };
        for batch in batches {
            self.rotate_if_full(buf, flushed)?;
            let start = buf.len();
            buf.extend_from_slice(batch.encoded());
            if let Some(time_ms) = logged_time_ms(batch.payload()) {
                self.last_time_ms = self.last_time_ms.max(time_ms);
            }
            self.account(&batch, start, flushed);
        }
        Ok(Outcome::Replicated(appended))
    }

    /// Advances the writer's view of the log's end past `batch` (already in the drain's buffer, at
    /// `start`: the buffer is written at the active segment's logical end).
    fn account(&mut self, batch: &Batch, start: usize, flushed: &mut Flushed) {
        assert!(
            batch.first_seqno() == self.next_seqno && batch.term() >= self.history_term,
            "log order violated: next={} last_term={} batch={}..={} term {}",
            self.next_seqno,
            self.history_term,
            batch.first_seqno(),
            batch.last_seqno(),
            batch.term()
        );
        if batch.term() > self.history_term {
            flushed.term_starts.push(TermSeqno { term: batch.term(), seqno: batch.first_seqno() });
            self.history_term = batch.term();
        }
        self.next_seqno = batch.last_seqno().next();
        self.active_info.last_seqno = Some(batch.last_seqno());
        flushed.batches.push(batch.clone());
        flushed.offsets.push(self.active_info.bytes + start as u64);
    }

    /// Writes the drain's bytes at the logical end of the active segment (over preallocated zeros),
    /// with `end_mark`, in the same write, the end mark after them (decisions/058): a write that
    /// reached its mark wrote every batch before it, which is how recovery tells a damaged last
    /// batch from a torn one. The next write starts over the mark. A rotation writes none (its seal
    /// would cut it).
    fn write_pending(&mut self, buf: &mut Vec<u8>, end_mark: bool) -> Result<(), Error> {
        let path = &self.active_info.path;
        let batches_len = buf.len() as u64;
        if end_mark {
            let at = self.active_info.bytes + batches_len;
            buf.extend_from_slice(&crate::segment::end_mark(at, self.next_seqno));
        }
        self.active
            .write_all_at(self.active_info.bytes, buf)
            .map_err(|err| Error::fatal("write segment", path, err))?;
        self.active_len = self.active_len.max(self.active_info.bytes + buf.len() as u64);
        self.active_info.bytes += batches_len;
        buf.clear();
        Ok(())
    }

    fn sync_active(&mut self) -> Result<(), Error> {
        let path = &self.active_info.path;
        let started = Instant::now();
        self.active.sync_data().map_err(|err| Error::fatal("fsync segment", path, err))?;
        self.last_fsync = started.elapsed();
        self.shared.stats.record_fsync(self.last_fsync);
        Ok(())
    }

    /// Closes the active segment (write + fsync what is pending) and starts the next one at
    /// `self.next_seqno`, fsyncing the directory so the new file survives a crash.
    ///
    /// The old segment is sealed first: its bytes written, cut to its batches and fsynced (a
    /// failure there is fatal: bytes may have reached the file). Getting the next segment comes
    /// after, and touches no byte of any batch: if its file cannot be created, or the prepared one
    /// renamed into place, or the directory opened to fsync the new name (no file descriptor
    /// left), nothing is changed (a new name is taken back) and the error is [`Stop::Retry`]. The
    /// writer then stays on the sealed segment and writes no batch into it: the next batch
    /// rotates again (the segment is still full).
    fn rotate(&mut self, buf: &mut Vec<u8>, flushed: &mut Flushed) -> Result<(), Stop> {
        self.write_pending(buf, false)?;
        if self.active_len > self.active_info.bytes {
            // Sealed: no zeros after the last batch. The fsync below makes the cut durable with the
            // data, before the next segment exists.
            let path = &self.active_info.path;
            self.active
                .truncate(self.active_info.bytes)
                .map_err(|err| Error::fatal("seal segment", path, err))?;
            self.active_len = self.active_info.bytes;
        }
        self.sync_active()?;
        let dir = self.shared.config.dir.clone();
        let path: PathBuf = dir.join(segment_file_name(self.next_seqno));
        let io = self.shared.io.clone();
        let prepared = std::mem::replace(&mut self.prep, Prep::Off);
        let unprepared = !matches!(prepared, Prep::Off | Prep::Ready { .. });
        // The next segment's file and length, and its prepared state if the rotation must be undone.
        let (file, len, undo) = match prepared {
            Prep::Ready { file, len } => {
                let ready = dir.join(READY_FILE_NAME);
                if let Err(err) = io.rename(&ready, &path) {
                    // Nothing renamed. Start the preparation over (the file may be gone); the next
                    // attempt creates an empty segment if none is ready by then.
                    self.prep = Prep::Wanted;
                    self.shared.set_prep_pending(true);
                    return Err(Stop::retry(Error::io("rename prepared segment", &path, err)));
                }
                self.prep = Prep::Wanted;
                (file, len, Undo::Rename(ready))
            }
            other => {
                self.prep = match other {
                    Prep::Failed => Prep::Wanted,
                    other => other,
                };
                self.shared.set_prep_pending(self.prep.is_pending());
                let file = io
                    .open_append(&path)
                    .map_err(|err| Stop::retry(Error::io("create segment", &path, err)))?;
                (file, 0, Undo::Remove)
            }
        };
        self.shared.set_prep_pending(self.prep.is_pending());
        if let Err(err) = io.sync_dir(&dir) {
            if !crate::io::is_out_of_descriptors(&err) {
                return Err(Stop::Fatal(Error::fatal("fsync WAL directory", &dir, err)));
            }
            // The directory could not even be opened: nothing was fsynced. Take the new name back
            // (a crash meanwhile may leave it, empty: recovery reads it as an empty last segment).
            match undo {
                Undo::Rename(ready) => {
                    io.rename(&path, &ready)
                        .map_err(|err| Error::fatal("rename prepared segment back", &ready, err))?;
                    self.prep = Prep::Ready { file, len };
                }
                Undo::Remove => {
                    drop(file);
                    io.remove_file(&path).map_err(|err| Error::fatal("remove new segment", &path, err))?;
                }
            }
            self.shared.set_prep_pending(self.prep.is_pending());
            return Err(Stop::retry(Error::io("fsync WAL directory", &dir, err)));
        }
        if unprepared {
            self.shared.stats.rotations_unprepared.fetch_add(1, Ordering::Relaxed);
        }
        self.active = file;
        self.active_len = len;
        let closed = std::mem::replace(
            &mut self.active_info,
            SegmentInfo { path, first_seqno: self.next_seqno, last_seqno: None, bytes: 0 },
        );
        flushed.closed_segments.push(closed);
        self.shared.stats.rotations.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(segment = %self.active_info.path.display(), "rotated WAL segment");
        Ok(())
    }

    /// After the fsync: records new terms in `wal.meta`, then publishes segments, index and frontier.
    ///
    /// A store that fails for want of a file descriptor (nothing of it was fsynced) is not fatal:
    /// the batches are durable, the term history stays right in memory, and on disk the retained
    /// range's history is never read from `wal.meta` (recovery rebuilds it from the segments; a
    /// purge or a truncation stores the whole history again before it relies on the file).
    fn publish(&mut self, flushed: &Flushed) -> Result<(), Error> {
        let mut log = self.shared.lock_log();
        if !flushed.term_starts.is_empty() {
            let mut meta = log.meta.clone();
            meta.term_history.extend_from_slice(&flushed.term_starts);
            match meta.store(self.shared.io.as_ref(), &self.shared.config.dir) {
                Ok(()) => {}
                Err(err) if err.is_out_of_descriptors() => {
                    tracing::error!(term_starts = ?flushed.term_starts, "could not record new terms in wal.meta (the segments hold them; the next store or a recovery writes them): {err:#}");
                }
                Err(err) => return Err(err),
            }
            log.meta = meta;
        }
        for info in flushed.closed_segments.iter().chain(std::iter::once(&self.active_info)) {
            match log.segments.last_mut() {
                Some(last) if last.first_seqno == info.first_seqno => *last = info.clone(),
                _ => log.segments.push(info.clone()),
            }
        }
        for (batch, offset) in flushed.batches.iter().zip(&flushed.offsets) {
            log.index.push(batch.first_seqno(), batch.last_seqno(), *offset);
        }
        let durable = self.next_seqno.get() - 1;
        assert!(
            durable >= self.shared.durable.load(Ordering::SeqCst),
            "durable frontier monotonicity violated: old={} new={durable}",
            self.shared.durable.load(Ordering::SeqCst)
        );
        self.shared.durable.store(durable, Ordering::SeqCst);
        drop(log);
        let stats = &self.shared.stats;
        stats.drains.fetch_add(1, Ordering::Relaxed);
        stats.record_drain(flushed.outcomes.iter().filter(|outcome| outcome.is_ok()).count());
        stats.batches.fetch_add(flushed.batches.len() as u64, Ordering::Relaxed);
        let events: u64 = flushed
            .batches
            .iter()
            .map(|batch| batch.last_seqno().get() - batch.first_seqno().get() + 1)
            .sum();
        stats.events.fetch_add(events, Ordering::Relaxed);
        let bytes: u64 = flushed.batches.iter().map(|batch| batch.encoded().len() as u64).sum();
        stats.bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }
}

fn fail_all(drain: Vec<Queued>, err: &Error) {
    for item in drain {
        item.done.fail(err.clone());
    }
}
