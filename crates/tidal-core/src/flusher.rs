//! The background flusher: a thread that writes frozen overlays ([`FrozenOverlay`]) to fjall, each
//! as ONE flush with its applied seqno (ingested keyspace by keyspace behind an intent file,
//! `flush_ingest`), while the applier folds into a fresh active overlay.
//!
//! ```text
//! applier:  apply ... overlay full -> freeze F1 (O(1) move) -> apply ... -> full -> wait -> freeze F2
//! flusher:                          encode F1, commit {data, applied}, drop F1 from reads ^
//! reads:    active -> F1 -> fjall   (F1 leaves the read path only after fjall holds it)
//! ```
//!
//! Delicate:
//! - At most one frozen overlay is in flight ([`FlushShared`]'s `in_flight`): a second freeze waits
//!   for the first flush (backpressure on the applier), so memory holds at most two overlays and
//!   fjall receives flushes in applied-seqno order, each a prefix of the log.
//! - The frozen overlay is removed from the read path (under the state write lock) only after its
//!   commit: until then every key the commit touches is hidden by the frozen overlay, so a reader
//!   never sees fjall half-way through the commit, nor a value disappear.
//! - A failed commit is fatal: it is logged here and kept in [`FlushShared`]; every later apply,
//!   checkpoint and digest returns [`Error::FlushFailed`], and the frozen overlay stays readable.
//! - Waiting never sleeps: waiters block on one condvar, notified at every state change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tidal_types::Seqno;

use crate::counters::DirtyCounters;
use crate::error::Error;
use crate::flush_ingest::{FlushIngest, FlushWrites};
use crate::keys;
use crate::overlay::{FrozenDirty, Overlay, SeenWrites};
use crate::seen;
use crate::stores::Stores;
use crate::trend_blocks::Changes;

/// Upper bounds (inclusive, milliseconds) of the flush duration buckets; the last is a catch-all.
/// They span an overlay of a few keys (under a millisecond) up to a full 64 MiB overlay on a slow
/// disk (seconds).
pub const FLUSH_DURATION_BUCKETS_MS: [u64; 12] =
    [1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, u64::MAX];

/// Flush counters, for metrics. A snapshot may mix values of two flushes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushStats {
    /// Flushes committed to fjall.
    pub flushes: u64,
    /// Entries (keys put or removed) those flushes wrote.
    pub entries: u64,
    /// Count of flushes per bucket of [`FLUSH_DURATION_BUCKETS_MS`] (encode and commit).
    pub duration_ms_buckets: [u64; FLUSH_DURATION_BUCKETS_MS.len()],
    /// Sum of flush durations, milliseconds.
    pub duration_ms_sum: u64,
    /// Duration of the last flush, milliseconds.
    pub last_duration_ms: u64,
    /// Longest flush, milliseconds.
    pub max_duration_ms: u64,
    /// Applies that waited for a flush in flight before freezing the next overlay (backpressure).
    pub backpressure_waits: u64,
    /// Total time applies spent in those waits, milliseconds.
    pub backpressure_wait_ms_sum: u64,
    /// Users whose stored seen entries flushes merged into one chunk (decisions/056).
    pub seen_merged: u64,
    /// Whether a flush is in flight.
    pub in_flight: bool,
    /// How long the flush in flight has run, milliseconds (0: none). A flush that never ends
    /// stops every apply once the next overlay fills (fjall halting its writes, say).
    pub in_flight_ms: u64,
    /// Whether a flush failed (fatal: the engine refuses applies).
    pub failed: bool,
}

/// The stage of a flush a test may hold the flusher at ([`crate::TidalDb::hold_flushes`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushStage {
    /// The frozen overlay is visible to reads; fjall does not hold it yet.
    BeforeCommit,
    /// A startup replay's flush: fjall holds the frozen overlay's seen chunks (ingested), not the
    /// rest of it nor its applied seqno.
    AfterIngest,
    /// fjall holds every keyspace of the frozen overlay but `meta`, which holds its applied seqno
    /// (the flush's commit point); the intent file holds all of it (`flush_ingest`).
    BeforeMarker,
    /// fjall holds the frozen overlay (with its trims' new horizons), not yet the deletes of the
    /// events the trims passed (only a flush with trims stops here).
    BeforeTrimDeletes,
    /// fjall holds the frozen overlay; it is still visible to reads.
    AfterCommit,
}

/// A test's hold on the flusher: while it lives, the flusher stops at its stage. Released on drop.
#[doc(hidden)]
pub struct FlushHold {
    shared: Arc<FlushShared>,
}

/// Everything one flush writes: an overlay moved out of the applier at a freeze, by value.
#[derive(Debug)]
pub struct FrozenOverlay {
    /// What reads see while the flush is in flight.
    pub overlay: Overlay,
    /// Trending scores and LeaderStart.
    pub dirty: FrozenDirty,
    /// Changed counters.
    pub counters: DirtyCounters,
    /// The applied frontier at the freeze: what fjall's applied seqno becomes.
    pub applied_seqno: Seqno,
    /// The logged time of the last batch at the freeze.
    pub last_time_ms: u64,
    /// Whether the seen pairs go in by ingestion ([`Overlay::ingest_seen`]): a startup replay's
    /// flushes.
    pub ingest_seen: bool,
    /// Items with metadata at the freeze.
    pub items: u64,
    /// Users with a profile at the freeze.
    pub users: u64,
}

/// How far this node's WAL is durable, for the flusher: fjall never holds state past it
/// (decisions/025). A cluster member applies committed batches once its WAL has WRITTEN them, before
/// its own fsync; its persisted state must still be a prefix of its durable log, or a power loss
/// would leave fjall ahead of the WAL (and `open` refuses such a data dir). A node that applies only
/// durable batches needs no gate.
pub trait DurableGate: Send + Sync + 'static {
    /// Waits at most `timeout` for the WAL to be durable through `seqno`.
    fn wait_durable(&self, seqno: Seqno, timeout: Duration) -> GateWait;
}

/// What [`DurableGate::wait_durable`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateWait {
    /// Durable through the seqno.
    Durable,
    /// Not yet; ask again.
    NotYet,
    /// Never will be (the WAL is poisoned or closed): why.
    Never(String),
}

/// An apply that has waited this long for the flush in flight says so.
const APPLY_WAIT_WARN: Duration = Duration::from_secs(10);

/// How long the flusher waits on the gate between looks at an abandonment.
const GATE_POLL: Duration = Duration::from_millis(50);

/// The gate, once set (Debug for [`FlushShared`]).
#[derive(Default)]
struct Gate(OnceLock<Arc<dyn DurableGate>>);

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "Gate(set)" } else { "Gate(none)" })
    }
}

/// State shared by the engine and the flusher thread.
#[derive(Debug, Default)]
pub struct FlushShared {
    progress: Mutex<Progress>,
    /// The durability gate of a node that applies before its fsync.
    gate: Gate,
    /// Notified whenever `progress` changes.
    changed: Condvar,
    /// Applied seqno fjall holds (the last committed flush's).
    flushed_seqno: AtomicU64,
    flushes: AtomicU64,
    entries: AtomicU64,
    duration_ms_buckets: [AtomicU64; FLUSH_DURATION_BUCKETS_MS.len()],
    duration_ms_sum: AtomicU64,
    last_duration_ms: AtomicU64,
    max_duration_ms: AtomicU64,
    backpressure_waits: AtomicU64,
    backpressure_wait_ms_sum: AtomicU64,
    /// Users whose seen entries a read found too many of: the next flush merges them.
    seen_merges: Mutex<std::collections::BTreeSet<Box<str>>>,
    /// Users whose seen entries flushes merged.
    seen_merged: AtomicU64,
}

/// At most this many users wait for a merge of their seen entries; a read asks again later.
const SEEN_MERGES_PENDING_MAX: usize = 4096;

/// At most this many users' seen entries are merged by one flush.
const SEEN_MERGES_PER_FLUSH: usize = 256;

/// One user's seen entries merged into one chunk, read by the flusher before its batch.
#[derive(Debug)]
pub struct SeenMerge {
    /// The user.
    pub user: Box<str>,
    /// The stored keys the merged chunk replaces.
    pub stored: Vec<fjall::Slice>,
    /// Every item of those keys and of the frozen overlay, ascending, once each.
    pub items: Vec<u64>,
}

#[derive(Debug, Default)]
struct Progress {
    /// Applied seqno of the frozen overlay being flushed.
    in_flight: Option<Seqno>,
    /// When that flush started.
    in_flight_since: Option<Instant>,
    /// Why a flush failed; sticky.
    failed: Option<String>,
    /// Set by a simulated crash: flushes not yet committed are dropped.
    abandoned: bool,
    /// A failure a test injected into the next commit ([`FlushShared::fail_next`]).
    injected: Option<String>,
    /// A test's hold, and whether the flusher is stopped at it.
    hold: Option<FlushStage>,
    parked: Option<FlushStage>,
}

impl FlushShared {
    /// Shared state for an engine whose fjall holds `flushed_seqno`.
    pub fn new(flushed_seqno: Seqno) -> FlushShared {
        FlushShared { flushed_seqno: AtomicU64::new(flushed_seqno.0), ..FlushShared::default() }
    }

    /// Applied seqno fjall holds.
    pub fn flushed_seqno(&self) -> Seqno {
        Seqno(self.flushed_seqno.load(Ordering::Acquire))
    }

    /// Sets the applied seqno fjall holds after the engine replaced its state (a snapshot install):
    /// it may go down. The caller guarantees no flush is in flight.
    pub fn reset_flushed(&self, seqno: Seqno) {
        let progress = self.lock();
        assert!(progress.in_flight.is_none(), "reset of the flushed seqno while a flush is in flight");
        self.flushed_seqno.store(seqno.0, Ordering::Release);
        drop(progress);
        self.changed.notify_all();
    }

    /// The sticky error of a failed flush.
    pub fn check(&self) -> Result<(), Error> {
        failed(&self.lock())
    }

    /// Whether a flush is in flight.
    pub fn in_flight(&self) -> bool {
        self.lock().in_flight.is_some()
    }

    /// Blocks until no flush is in flight (or one failed). `backpressure`: an apply is waiting,
    /// which the stats count.
    pub fn wait_idle(&self, backpressure: bool) -> Result<(), Error> {
        let mut progress = self.lock();
        if progress.in_flight.is_some() && progress.failed.is_none() && backpressure {
            let started = Instant::now();
            self.backpressure_waits.fetch_add(1, Ordering::Relaxed);
            progress = self.wait_for_flush_warning(progress);
            self.backpressure_wait_ms_sum.fetch_add(millis(started.elapsed()), Ordering::Relaxed);
        }
        progress = self.wait_while(progress, |p| p.in_flight.is_some() && p.failed.is_none());
        failed(&progress)
    }

    /// Blocks until fjall holds `seqno` (or a flush failed).
    pub fn wait_flushed(&self, seqno: Seqno) -> Result<(), Error> {
        let progress = self.wait_while(self.lock(), |p| p.failed.is_none() && self.flushed_seqno() < seqno);
        failed(&progress)
    }

    /// Marks a flush of the overlay frozen at `seqno` in flight. The caller checked none was.
    pub fn start(&self, seqno: Seqno) {
        let mut progress = self.lock();
        assert!(
            progress.in_flight.is_none(),
            "a flush starts at {seqno} while the one at {:?} is in flight",
            progress.in_flight
        );
        progress.in_flight = Some(seqno);
        progress.in_flight_since = Some(Instant::now());
    }

    /// Sets the durability gate (once; false if one is set already).
    pub fn set_gate(&self, gate: Arc<dyn DurableGate>) -> bool {
        self.gate.0.set(gate).is_ok()
    }

    /// Waits until the gate says `seqno` is durable. `Ok(false)`: the flush was abandoned meanwhile.
    fn wait_gate(&self, seqno: Seqno) -> Result<bool, String> {
        let Some(gate) = self.gate.0.get() else { return Ok(true) };
        let started = Instant::now();
        let mut warned = false;
        loop {
            match gate.wait_durable(seqno, GATE_POLL) {
                GateWait::Durable => return Ok(true),
                GateWait::Never(reason) => return Err(reason),
                GateWait::NotYet if self.lock().abandoned => return Ok(false),
                GateWait::NotYet => {
                    if !warned && started.elapsed() > Duration::from_secs(10) {
                        warned = true;
                        tracing::warn!(%seqno, "the engine's flush has waited 10 s for the WAL to be durable");
                    }
                }
            }
        }
    }

    /// Makes the next flush's commit fail with `reason`, as if fjall had refused it (a test seam).
    pub fn fail_next(&self, reason: &str) {
        self.lock().injected = Some(reason.to_string());
    }

    fn take_injected(&self) -> Option<String> {
        self.lock().injected.take()
    }

    /// Drops every flush not committed yet, as a crash would.
    /// Makes the engine refuse every later apply, flush and digest with `reason`, as a failed flush
    /// does: an apply failed half-way (a storage fault in the middle of a tx).
    pub fn fail_now(&self, reason: String) {
        let mut progress = self.lock();
        if progress.failed.is_none() {
            progress.failed = Some(reason);
        }
        drop(progress);
        self.changed.notify_all();
    }

    /// Drops the flush in flight (a crash or a half-applied batch): nothing more reaches fjall.
    pub fn abandon(&self) {
        self.lock().abandoned = true;
        self.changed.notify_all();
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> FlushStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let progress = self.lock();
        FlushStats {
            flushes: load(&self.flushes),
            entries: load(&self.entries),
            duration_ms_buckets: std::array::from_fn(|bucket| load(&self.duration_ms_buckets[bucket])),
            duration_ms_sum: load(&self.duration_ms_sum),
            last_duration_ms: load(&self.last_duration_ms),
            max_duration_ms: load(&self.max_duration_ms),
            backpressure_waits: load(&self.backpressure_waits),
            backpressure_wait_ms_sum: load(&self.backpressure_wait_ms_sum),
            seen_merged: load(&self.seen_merged),
            in_flight: progress.in_flight.is_some(),
            in_flight_ms: progress.in_flight_since.map_or(0, |since| millis(since.elapsed())),
            failed: progress.failed.is_some(),
        }
    }

    /// Holds the flusher at `stage` until the returned hold is dropped.
    pub fn hold(self: &Arc<Self>, stage: FlushStage) -> FlushHold {
        self.lock().hold = Some(stage);
        FlushHold { shared: self.clone() }
    }

    /// Stops at `stage` while a test holds it. Returns false if the flush was abandoned.
    fn pass(&self, stage: FlushStage) -> bool {
        let mut progress = self.lock();
        if progress.hold == Some(stage) && !progress.abandoned {
            progress.parked = Some(stage);
            self.changed.notify_all();
            progress = self.wait_while(progress, |p| p.hold == Some(stage) && !p.abandoned);
            progress.parked = None;
        }
        !progress.abandoned
    }

    /// Records a committed flush of the overlay frozen at `seqno`.
    fn committed(&self, seqno: Seqno, entries: usize, elapsed: Duration) {
        self.flushed_seqno.store(seqno.0, Ordering::Release);
        let ms = millis(elapsed);
        let bucket = FLUSH_DURATION_BUCKETS_MS.iter().position(|bound| ms <= *bound).unwrap_or(0);
        self.duration_ms_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.duration_ms_sum.fetch_add(ms, Ordering::Relaxed);
        self.last_duration_ms.store(ms, Ordering::Relaxed);
        self.max_duration_ms.fetch_max(ms, Ordering::Relaxed);
        self.entries.fetch_add(entries as u64, Ordering::Relaxed);
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends the flush in flight: done, dropped, or failed.
    fn finish(&self, failure: Option<String>) {
        let mut progress = self.lock();
        progress.in_flight = None;
        progress.in_flight_since = None;
        if progress.failed.is_none() {
            progress.failed = failure;
        }
        drop(progress);
        self.changed.notify_all();
    }

    /// Asks the next flush to merge `user`'s seen entries into one chunk (a read found too many).
    /// Dropped if too many wait already: a later read asks again.
    pub fn request_seen_merge(&self, user: &str) {
        let mut pending = self.seen_merges.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.len() < SEEN_MERGES_PENDING_MAX && !pending.contains(user) {
            pending.insert(user.into());
        }
    }

    /// Up to [`SEEN_MERGES_PER_FLUSH`] users waiting for a merge.
    fn take_seen_merges(&self) -> Vec<Box<str>> {
        let mut pending = self.seen_merges.lock().unwrap_or_else(PoisonError::into_inner);
        std::iter::from_fn(|| pending.pop_first()).take(SEEN_MERGES_PER_FLUSH).collect()
    }

    /// Waits for the flush in flight to end; says so once, as a WARN, if the apply waits longer
    /// than [`APPLY_WAIT_WARN`]: applies stop meanwhile (the applied frontier stands still while
    /// the WAL goes on), and only the engine's storage can be holding them.
    fn wait_for_flush_warning<'a>(&self, mut progress: MutexGuard<'a, Progress>) -> MutexGuard<'a, Progress> {
        let started = Instant::now();
        let mut warned = false;
        while progress.in_flight.is_some() && progress.failed.is_none() {
            let (guard, _) = self
                .changed
                .wait_timeout(progress, APPLY_WAIT_WARN)
                .expect("flush progress lock poisoned: no code panics while holding it");
            progress = guard;
            if !warned && progress.in_flight.is_some() && started.elapsed() >= APPLY_WAIT_WARN {
                warned = true;
                tracing::warn!(
                    flush = ?progress.in_flight,
                    waited = ?started.elapsed(),
                    "applies wait for the engine's flush to fjall, which has not finished: fjall may be holding its writes (memtables or L0 runs waiting for its own flush and compaction)"
                );
            }
        }
        if warned {
            tracing::warn!(waited = ?started.elapsed(), "the engine's flush finished; applies go on");
        }
        progress
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().expect("flush progress lock poisoned: no code panics while holding it")
    }

    fn wait_while<'a>(
        &self,
        guard: MutexGuard<'a, Progress>,
        condition: impl FnMut(&mut Progress) -> bool,
    ) -> MutexGuard<'a, Progress> {
        self.changed
            .wait_while(guard, condition)
            .expect("flush progress lock poisoned: no code panics while holding it")
    }
}

impl FlushHold {
    /// Blocks until the flusher is stopped at the held stage.
    pub fn wait_parked(&self) {
        let progress = self.shared.lock();
        drop(self.shared.wait_while(progress, |p| p.hold.is_some() && p.parked != p.hold));
    }

    /// Moves the hold to a later `stage`: the flusher goes on to it and stops there.
    pub fn advance(&self, stage: FlushStage) {
        self.shared.lock().hold = Some(stage);
        self.shared.changed.notify_all();
    }
}

impl Drop for FlushHold {
    fn drop(&mut self) {
        self.shared.lock().hold = None;
        self.shared.changed.notify_all();
    }
}

impl FrozenOverlay {
    /// Puts everything into `writes`: the data, then the applied seqno and the logged time, and
    /// the counts an open reads instead of counting (decisions/048), all in one flush (its `meta`
    /// writes last).
    /// Reads the trend blocks it changes (only the flusher writes them).
    pub fn flush_into(
        &self,
        stores: &Stores,
        writes: &mut FlushWrites,
        merges: &[SeenMerge],
    ) -> Result<(), Error> {
        let seen = if self.ingest_seen { SeenWrites::Ingested } else { SeenWrites::Chunks(merges) };
        self.overlay.flush_into(stores, writes, self.applied_seqno.0, seen);
        self.dirty.flush_into(stores, writes);
        let trends = self.dirty.trend_changes();
        let (counts, kinds) = self.counters.changes();
        Changes { trends: &trends, counts: &counts, kinds }.flush_into(stores, writes)?;
        writes.insert(&stores.meta, keys::META_APPLIED_SEQNO, self.applied_seqno.0.to_le_bytes());
        writes.insert(&stores.meta, keys::META_LAST_TIME_MS, self.last_time_ms.to_le_bytes());
        let counts = keys::counts_value(self.applied_seqno, self.items, self.users);
        writes.insert(&stores.local, keys::LOCAL_COUNTS, counts);
        Ok(())
    }
}

/// What the flusher thread touches: fjall, the state lock (to retire a flushed overlay) and the
/// shared progress.
pub struct FlusherContext<S> {
    /// fjall handles.
    pub stores: Stores,
    /// The intent file and the lock of whole flushes.
    pub ingest: Arc<FlushIngest>,
    /// The engine's read state; the flusher retires the frozen overlay from it.
    pub state: Arc<RwLock<S>>,
    /// Progress and counters.
    pub shared: Arc<FlushShared>,
    /// Removes the frozen overlay from the read state if it is `frozen`.
    pub retire: fn(&mut S, &Arc<FrozenOverlay>),
}

/// The flusher thread's loop: one frozen overlay at a time, until the channel closes. A failed
/// commit ends it (the failure is sticky).
pub fn run<S>(context: FlusherContext<S>, frozen_overlays: Receiver<Arc<FrozenOverlay>>) {
    let FlusherContext { stores, ingest, state, shared, retire } = context;
    // If this thread panics, waiters must not wait forever.
    let _guard = PanicGuard { shared: &shared };
    for frozen in frozen_overlays {
        if !shared.pass(FlushStage::BeforeCommit) {
            shared.finish(None);
            continue;
        }
        match shared.wait_gate(frozen.applied_seqno) {
            Ok(true) => {}
            Ok(false) => {
                shared.finish(None);
                continue;
            }
            Err(reason) => {
                let reason = format!(
                    "the overlay frozen at {} cannot be flushed: the WAL will not be durable there ({reason})",
                    frozen.applied_seqno
                );
                tracing::error!("failed to flush: {reason}; the engine refuses further applies");
                shared.finish(Some(reason));
                return;
            }
        }
        let started = Instant::now();
        // A failed write is fatal: logged here and kept in `shared`.
        let fail = |what: &str, error: &dyn std::fmt::Display| {
            let reason = format!("{what} of the overlay frozen at {}: {error}", frozen.applied_seqno);
            tracing::error!("failed to flush: {reason}; the engine refuses further applies");
            shared.finish(Some(reason));
        };
        let ingested = if frozen.ingest_seen {
            match frozen.overlay.ingest_seen(&stores, frozen.applied_seqno.0) {
                Ok(ingested) => ingested,
                Err(error) => return fail("ingestion of the seen pairs", &error),
            }
        } else {
            0
        };
        if frozen.ingest_seen && !shared.pass(FlushStage::AfterIngest) {
            shared.finish(None);
            continue;
        }
        // A replay's flush (ingested) leaves the merges to a later one.
        let merges = if frozen.ingest_seen { Vec::new() } else { shared.take_seen_merges() };
        let merges = match read_seen_merges(&stores, &frozen.overlay, merges) {
            Ok(merges) => merges,
            Err(error) => return fail("a read of the seen entries to merge", &error),
        };
        let mut writes = FlushWrites::default();
        if let Err(error) = frozen.flush_into(&stores, &mut writes, &merges) {
            return fail("a read of the trend blocks to change", &error);
        }
        let entries = writes.len() + ingested;
        if let Some(reason) = shared.take_injected() {
            return fail("commit", &reason);
        }
        match ingest.commit(&stores, writes, frozen.applied_seqno, || shared.pass(FlushStage::BeforeMarker)) {
            Ok(true) => {}
            Ok(false) => {
                shared.finish(None);
                continue;
            }
            Err(error) => return fail("commit", &error),
        }
        // The trims' events leave fjall after the batch that recorded their horizons and counts
        // (see `streams`); a crash in between leaves them to the sweep at the next open.
        let trims = &frozen.overlay.stream_trims;
        if !trims.is_empty() && !shared.pass(FlushStage::BeforeTrimDeletes) {
            shared.finish(None);
            continue;
        }
        let trimmed = match crate::streams::delete_trimmed(&stores, trims) {
            Ok(trimmed) => trimmed,
            Err(error) => return fail("a delete of trimmed stream events", &error),
        };
        let entries = entries + trimmed;
        let elapsed = started.elapsed();
        shared.committed(frozen.applied_seqno, entries, elapsed);
        shared.seen_merged.fetch_add(merges.len() as u64, Ordering::Relaxed);
        shared.pass(FlushStage::AfterCommit);
        // Readers saw the frozen overlay's values until now and see the same values in fjall from
        // now on. A poisoned lock means an apply panicked; retiring is still correct.
        match state.write() {
            Ok(mut state) => retire(&mut state, &frozen),
            Err(poisoned) => retire(&mut poisoned.into_inner(), &frozen),
        }
        let applied = frozen.applied_seqno;
        // Freed here, off the applier and outside every lock.
        drop(frozen);
        shared.finish(None);
        tracing::debug!(%applied, entries, ?elapsed, "overlay flushed");
    }
}

/// Reads the stored seen entries of each of `users` and joins them with the frozen overlay's
/// items of that user: what one chunk will hold in their place. Only the flusher writes the seen
/// keyspace, so nothing changes them between this read and the batch.
fn read_seen_merges(
    stores: &Stores,
    overlay: &Overlay,
    users: Vec<Box<str>>,
) -> Result<Vec<SeenMerge>, fjall::Error> {
    let mut merges = Vec::with_capacity(users.len());
    for user in users {
        let (mut stored, mut items, mut found) = (Vec::new(), Vec::new(), Vec::new());
        for guard in stores.seen.prefix(keys::seen_prefix(&user)) {
            let (key, value) = guard.into_inner()?;
            found.clear();
            // A damaged entry stays where it is, for reads to report; the rest still merge.
            if seen::entry_items(&key, &value, &mut found).is_ok() {
                items.extend_from_slice(&found);
                stored.push(key);
            }
        }
        items.extend(overlay.user(&user).into_iter().flat_map(|dirty| dirty.seen.iter().copied()));
        items.sort_unstable();
        items.dedup();
        merges.push(SeenMerge { user, stored, items });
    }
    Ok(merges)
}

struct PanicGuard<'a> {
    shared: &'a FlushShared,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.finish(Some("the flusher thread panicked".into()));
        }
    }
}

fn failed(progress: &Progress) -> Result<(), Error> {
    match &progress.failed {
        Some(reason) => Err(Error::FlushFailed { reason: reason.clone() }),
        None => Ok(()),
    }
}

fn millis(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}
