//! [`TidalDb`]: the engine. One apply path folds WAL batches into an in-memory write-back overlay
//! and the ranking index; a background flusher moves frozen overlays to fjall; reads see the
//! active overlay over the frozen one over fjall.
//!
//! Delicate:
//! - Atomicity: an apply changes only memory (overlay, index, counters, frontier). A flush writes
//!   every dirty entry of one frozen overlay, its applied seqno and logged time as ONE flush
//!   (`flush_ingest`: one ingested table per keyspace behind an intent file, `meta` last, finished
//!   by the next open if a crash cut it), so fjall always holds a prefix of the log. After any
//!   crash, `open` finds fjall's applied seqno and the caller replays the WAL from the next one;
//!   what the overlays held is folded again. An ingested flush is durable when it ends;
//!   `checkpoint` flushes and persists fjall's journal (what else writes fjall), and its return is
//!   what the WAL may be purged below.
//! - Bounds: once the active overlay exceeds `overlay_bytes_max` or `overlay_batches_max` it is
//!   frozen (moved, O(1)) and handed to the flusher thread (`flusher.rs`), and a fresh one starts.
//!   At most one frozen overlay is in flight: if the next one comes due first, apply waits
//!   (backpressure). Memory holds at most two overlays; replay after a crash re-folds at most two.
//! - Replays are harmless: a batch at or below the applied seqno is skipped, a batch that does not
//!   start right after it is a gap; both change nothing.
//! - A failed apply changes nothing: every fallible step (decoding, fjall reads) happens before the
//!   first change, and the changes are merged under the state write lock. A failed flush is fatal:
//!   every later apply, checkpoint and digest returns [`Error::FlushFailed`].
//! - Consistency of reads: the overlays and the index change together under the state write lock,
//!   so a read holding the read lock sees one applied seqno. A frozen overlay leaves the read path
//!   only after fjall holds it, so fjall changing under a reader never changes what it sees.
//! - Dropping the engine flushes both overlays (no fsync) and stops the flusher; a crash loses
//!   them, and replay restores them.
//! - Hard negatives are NOT log-derived: written on any node, persisted with an fsync per change (a
//!   lost change could reuse a CRDT dot), and excluded from [`TidalDb::digest`].

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fjall::PersistMode;
use tidal_types::Seqno;
use tidal_wal::Batch;

use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::dirty_set::Mark;
use crate::error::Error;
use crate::feed_index::{inverse_norm, FeedIndex};
use crate::flush_ingest::FlushIngest;
use crate::flusher::{self, FlushHold, FlushShared, FlushStage, FlushStats, FlusherContext, FrozenOverlay};
use crate::fold::{self, SignalsFold};
use crate::idempotency::{self, IdempotencyRecord, NewKey, Window};
use crate::inboxes::{self, InboxOutcome, InboxState};
use crate::keys;
use crate::negatives::{Actor, NegativesState, NEGATIVES_PER_USER_MAX};
use crate::overlay::{Overlay, OverlayView, WriterDirty, ENTRY_OVERHEAD_BYTES};
use crate::ranked::{
    rank_feed, rank_feed_ann, rank_similar, rank_similar_ann, rank_trending, RankParams, Ranked,
    RANKED_LIMIT_MAX,
};
use crate::record::{
    decode_for_apply, records_fingerprint, Envelope, FoldRecords, Records, SignalColumns, StreamControl,
};
use crate::record_error::RecordError;
use crate::seen;
use crate::stores::Stores;
use crate::streams::{StoredEvent, StreamInfo, StreamMeta};
use crate::trend::Trend;
use crate::trend_blocks;

/// The name fjall 3 gives its worker threads (its memtable flushes and compactions).
const FJALL_WORKER_THREAD: &str = "fjall:worker";

mod inbox_io;
mod snapshot_io;

pub use inbox_io::InboxListener;

/// What [`TidalDb::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The batch was folded; the applied frontier is now `last_seqno`.
    Applied {
        /// First seqno of the batch.
        first_seqno: Seqno,
        /// Last seqno of the batch, the new applied frontier.
        last_seqno: Seqno,
    },
    /// The batch was already applied; nothing changed.
    Skipped,
}

/// An item as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemState {
    /// Metadata JSON text.
    pub metadata: Vec<u8>,
    /// Whether the item has an embedding.
    pub has_embedding: bool,
    /// Seqno of the write that last set the metadata.
    pub seqno: Seqno,
}

/// Sizes and flush counters, for metrics and status. The sizes are log-derived (equal on replicas
/// at one applied seqno); `flushed_applied_seqno` and `flush` are node-local.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EngineStats {
    /// Applied frontier.
    pub applied_seqno: Seqno,
    /// Logged time of the last applied batch.
    pub last_applied_time_ms: u64,
    /// Items with metadata.
    pub items: u64,
    /// Items with an embedding.
    pub embeddings: u64,
    /// Items with a trending score.
    pub trending_items: u64,
    /// Users with a profile (every user who sent a signal).
    pub users: u64,
    /// Applied seqno fjall holds.
    pub flushed_applied_seqno: Seqno,
    /// Estimated bytes of the ranking index's embeddings (matrix, ids, norms, row map): node-local
    /// (allocation sizes).
    pub feed_index_bytes: u64,
    /// Estimated bytes of the approximate index and its trend order (0 without one): node-local.
    pub ann_index_bytes: u64,
    /// Lists of the approximate index (0 without one): log-derived.
    pub ann_lists: u64,
    /// Background flushes.
    pub flush: FlushStats,
}

/// The engine over one fjall database. `Send + Sync`: reads run concurrently with `apply`.
pub struct TidalDb {
    stores: Stores,
    config: EngineConfig,
    /// What reads see beside fjall: the ranking index and the overlays, changed together. Shared
    /// with the flusher thread, which retires a frozen overlay once fjall holds it.
    state: Arc<RwLock<State>>,
    /// Applied frontier (overlays over fjall); written under the state write lock.
    applied_seqno: AtomicU64,
    /// Logged time of the last applied batch; written with `applied_seqno`.
    last_time_ms: AtomicU64,
    items: AtomicU64,
    users: AtomicU64,
    /// The applier's own state; its lock serializes `apply` and freezes.
    writer: Mutex<Writer>,
    /// Flush progress, fjall's applied seqno and flush counters, shared with the flusher thread.
    flush: Arc<FlushShared>,
    /// The flushes' intent file and the lock a flush holds while it ingests.
    ingest: Arc<FlushIngest>,
    /// The flusher thread; joined on drop.
    flusher_thread: Option<JoinHandle<()>>,
    /// The flusher's kernel thread id (`None` where the platform has none).
    flusher_tid: Option<i32>,
    /// Serializes read-modify-write of hard negatives.
    negatives_lock: Mutex<()>,
    /// False after [`TidalDb::simulate_crash`]: drop then leaves the overlays unflushed.
    flush_on_drop: bool,
    /// True after a tx failed half-way ([`TidalDb::apply_tx`]): drop leaves the overlays unflushed.
    half_applied: AtomicBool,
    /// True while a snapshot install is replacing the state, and after one that failed half-way
    /// (fjall holds [`crate::snapshot::META_IMPORT_PENDING`]): applies and exports are refused
    /// until an install completes.
    import_incomplete: AtomicBool,
    /// True during a startup replay: the overlay's bound on applies is off (its bound on bytes
    /// stays). See [`TidalDb::set_replaying`].
    replaying: AtomicBool,
    /// The thread that folds half of each large signal batch during a startup replay
    /// (experiments/047); `None` otherwise. Only the applier's thread uses it.
    fold_helper: Mutex<Option<rayon_core::ThreadPool>>,
    /// What inbox records did, for their writers, and who to tell.
    inbox_signals: inbox_io::InboxSignals,
    /// Dropped after everything above (fjall included): their receivers see the engine closed.
    close_watchers: Mutex<Vec<std::sync::mpsc::Sender<()>>>,
}

/// The index and the overlays, under one lock so reads see them at one applied seqno.
struct State {
    index: FeedIndex,
    /// Changes since the last freeze.
    overlay: Overlay,
    /// The overlay being flushed, until fjall holds it.
    frozen: Option<Arc<FrozenOverlay>>,
}

/// State only the applier touches.
struct Writer {
    counters: Counters,
    dirty: WriterDirty,
    /// Lower bound on the logged time of every idempotency entry (see `idempotency::fold`).
    idempotency_oldest_ms: Option<u64>,
    /// Applied frontier at the last freeze (or open): the active overlay holds what is above it.
    frozen_seqno: Seqno,
    /// Hands frozen overlays to the flusher thread; `None` once the engine is closing.
    frozen_overlays: Option<SyncSender<Arc<FrozenOverlay>>>,
    /// What the inbox record being applied did: published after the apply's frontier.
    inbox_done: Option<(String, InboxOutcome)>,
}

/// A WAL batch with its payload decoded: what [`TidalDb::apply_decoded`] folds. Decoding needs
/// nothing from the engine, so it can run ahead on another thread; a payload that does not decode
/// is kept as its error, which the apply returns where [`TidalDb::apply`] always did.
#[derive(Debug)]
pub struct DecodedBatch {
    batch: Batch,
    decoded: Result<(Envelope, FoldRecords), RecordError>,
}

impl DecodedBatch {
    /// Decodes `batch`'s payload (never fails here: an error is kept for the apply).
    pub fn decode(batch: Batch) -> DecodedBatch {
        let decoded = decode_for_apply(batch.kind(), batch.payload());
        DecodedBatch { batch, decoded }
    }

    /// The batch.
    pub fn batch(&self) -> &Batch {
        &self.batch
    }
}

/// What one decoded batch changes, computed before anything changes.
enum Change<'a> {
    Signals {
        fold: SignalsFold<'a>,
        events: &'a SignalColumns,
        envelope_time_ms: u64,
    },
    ItemMetadata {
        item: u64,
        value: Vec<u8>,
        new: bool,
    },
    /// The vector is moved out of the decoded record into the overlay, not copied.
    ItemEmbedding {
        item: u64,
        seqno: Seqno,
        vector: Vec<f32>,
    },
    ItemDelete {
        item: u64,
        existed: bool,
    },
    LeaderStart(Vec<u8>),
    Stream(crate::streams::StreamChange),
    /// Inbox entries to set or delete, and what the record did (for its writer and waiters).
    Inbox {
        writes: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        owner: String,
        outcome: InboxOutcome,
    },
}

/// Why fjall refuses writes to `database` for good, if it does. fjall keeps its poisoned flag to
/// itself; every write and `persist` answers [`fjall::Error::Poisoned`] once it is set, and a
/// `persist(Buffer)` writes nothing but what its journal buffer holds, so it is the question.
pub(crate) fn database_fault(database: &fjall::Database) -> Option<String> {
    match database.persist(PersistMode::Buffer) {
        Ok(()) => None,
        Err(fjall::Error::Poisoned) => Some(
            "fjall is poisoned: a journal write or fsync, or a background worker (flush, compaction), failed"
                .into(),
        ),
        Err(error) => Some(format!("fjall refused to write its journal: {error}")),
    }
}

impl TidalDb {
    /// Opens (or creates) the engine at `path` and rebuilds the in-memory index from fjall.
    pub fn open(path: &Path, config: EngineConfig) -> Result<TidalDb, Error> {
        config.validate()?;
        let started = Instant::now();
        let stores = Stores::open(path)?;
        // Where an open's time goes: fjall replaying its journal, then the index and counters.
        let fjall_seconds = started.elapsed().as_secs_f64();
        // Before anything reads fjall: a flush a crash cut between two ingestions is finished.
        let ingest = Arc::new(FlushIngest::new(path, config.flush_ingest_bytes_min));
        ingest.recover(&stores)?;
        match stores.meta.get(keys::META_DIMENSION)? {
            Some(bytes) => {
                let persisted = <[u8; 4]>::try_from(&*bytes).map(u32::from_le_bytes).map_err(|_| {
                    Error::Corrupt { keyspace: "meta", reason: "dimension is not a u32".into() }
                })?;
                if persisted != config.dimension {
                    return Err(Error::DimensionMismatch { persisted, configured: config.dimension });
                }
            }
            None => {
                stores.meta.insert(keys::META_DIMENSION, config.dimension.to_le_bytes())?;
                stores.database.persist(PersistMode::SyncAll)?;
            }
        }
        let applied_seqno = meta_u64(&stores, keys::META_APPLIED_SEQNO)?;
        let import_incomplete = stores.meta.contains_key(crate::snapshot::META_IMPORT_PENDING)?;
        if import_incomplete {
            tracing::error!("a snapshot install was interrupted: applies are refused until it is resumed");
        }
        let last_time_ms = meta_u64(&stores, keys::META_LAST_TIME_MS)?;
        migrate_layout(&stores)?;
        let swept = crate::streams::sweep_below_horizons(&stores)?;
        if swept > 0 {
            tracing::info!(swept, "deleted stream events a trim left behind (a crash after its flush)");
        }
        let loading = Instant::now();
        let (index, counters) = load_memory(&stores, &config)?;
        let load_seconds = loading.elapsed().as_secs_f64();
        let (items, users) = stored_counts(&stores)?;
        tracing::info!(
            applied_seqno,
            embeddings = index.embeddings(),
            items,
            users,
            fjall_seconds,
            load_seconds,
            "engine opened"
        );
        let state = Arc::new(RwLock::new(State { index, overlay: Overlay::default(), frozen: None }));
        let flush = Arc::new(FlushShared::new(Seqno(applied_seqno)));
        // One slot: at most one frozen overlay is in flight (`FlushShared::start` asserts it).
        let (sender, receiver) = sync_channel(1);
        let context = FlusherContext {
            stores: stores.clone(),
            ingest: ingest.clone(),
            state: state.clone(),
            shared: flush.clone(),
            retire: State::retire,
        };
        // The flusher tells its kernel thread id first, so the node can lower its priority later
        // ([`TidalDb::lower_background_priority`]) without guessing which thread is ours.
        let (tid_tx, tid_rx) = sync_channel(1);
        let flusher_thread = std::thread::Builder::new()
            .name("tidal-flusher".into())
            .spawn(move || {
                let _ = tid_tx.send(crate::priority::this_thread());
                flusher::run(context, receiver)
            })
            .map_err(|source| Error::Spawn { name: "tidal-flusher", source })?;
        let flusher_tid = tid_rx.recv().ok().flatten();
        Ok(TidalDb {
            stores,
            config,
            state,
            applied_seqno: AtomicU64::new(applied_seqno),
            last_time_ms: AtomicU64::new(last_time_ms),
            items: AtomicU64::new(items),
            users: AtomicU64::new(users),
            writer: Mutex::new(Writer {
                counters,
                dirty: WriterDirty::default(),
                idempotency_oldest_ms: None,
                frozen_seqno: Seqno(applied_seqno),
                frozen_overlays: Some(sender),
                inbox_done: None,
            }),
            flush,
            ingest,
            flusher_thread: Some(flusher_thread),
            flusher_tid,
            negatives_lock: Mutex::new(()),
            flush_on_drop: true,
            half_applied: AtomicBool::new(false),
            import_incomplete: AtomicBool::new(import_incomplete),
            replaying: AtomicBool::new(false),
            fold_helper: Mutex::new(None),
            inbox_signals: inbox_io::InboxSignals::default(),
            close_watchers: Mutex::new(Vec::new()),
        })
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Marks a startup replay (on) and its end (off). Meanwhile the overlay is frozen and flushed
    /// only when it passes its bound on bytes, not its bound on applies
    /// ([`EngineConfig::overlay_batches_max`]). That bound keeps the replay after a crash short,
    /// and during a replay it cannot: a crash in the middle, or after it before the next flush,
    /// replays from the same point (plus the writes since). Flushing anyway cost a replay of 211k
    /// embedding batches a flush of 100k entries on the second core and a 33–142 ms wait for it
    /// (experiments/043).
    ///
    /// A replay also folds the two halves of each large signal batch on two threads
    /// (experiments/047), unless the machine has one CPU; the helper thread ends with the replay. And
    /// its flushes write the seen pairs as new tables by fjall's ingestion, before the batch with
    /// the rest (experiments/054).
    pub fn set_replaying(&self, on: bool) {
        self.replaying.store(on, Ordering::Relaxed);
        let wanted = on && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
        self.set_parallel_fold(wanted);
    }

    /// Folds large signal batches on two threads (`true`) or one from now on, whatever the machine
    /// and the replay say; for tests and benchmarks that compare the two.
    #[doc(hidden)]
    pub fn set_parallel_fold(&self, on: bool) {
        let helper = on.then(start_fold_helper).flatten();
        *self.fold_helper.lock().unwrap_or_else(PoisonError::into_inner) = helper;
    }

    /// Keeps `watcher` until this engine is closed: its receiver sees the channel disconnect once
    /// the engine's flusher has stopped and fjall is released, so a process that opens the same
    /// directory again (a restart in the same process) can wait for it instead of finding it locked.
    pub fn watch_close(&self, watcher: std::sync::mpsc::Sender<()>) {
        self.close_watchers.lock().unwrap_or_else(PoisonError::into_inner).push(watcher);
    }

    /// Applied frontier: the highest seqno folded into the state reads see (overlay over fjall).
    /// After a crash, `open` reports [`TidalDb::flushed_applied_seqno`] instead.
    pub fn applied_seqno(&self) -> Seqno {
        Seqno(self.applied_seqno.load(Ordering::Acquire))
    }

    /// The identity recorded in this state by [`TidalDb::record_identity`], if any (the server's
    /// encoding; decisions/063).
    pub fn identity(&self) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.stores.local.get(keys::LOCAL_IDENTITY)?.map(|value| value.to_vec()))
    }

    /// Records the identity of the node this state belongs to, fsynced. Node-local: a snapshot
    /// install neither carries nor removes it.
    pub fn record_identity(&self, identity: &[u8]) -> Result<(), Error> {
        self.stores.local.insert(keys::LOCAL_IDENTITY, identity)?;
        self.stores.database.persist(PersistMode::SyncAll)?;
        Ok(())
    }

    /// Makes every flush to fjall wait until `gate` says the WAL is durable through the flushed
    /// overlay's applied seqno, for a node that applies batches before its own fsync
    /// (decisions/025). Once; false if a gate is set already.
    pub fn set_durable_gate(&self, gate: Arc<dyn crate::flusher::DurableGate>) -> bool {
        self.flush.set_gate(gate)
    }

    /// The applied seqno fjall holds: the last flush's, committed atomically with the data it
    /// covers (not necessarily fsynced: [`TidalDb::checkpoint`] is). A process crash falls back to it.
    pub fn flushed_applied_seqno(&self) -> Seqno {
        self.flush.flushed_seqno()
    }

    /// Logged time of the last applied batch: "now" for every ranking.
    pub fn last_applied_time_ms(&self) -> u64 {
        self.last_time_ms.load(Ordering::Acquire)
    }

    /// THE apply path: the leader's writes, a follower's ships, catch-up and startup replay.
    ///
    /// A batch at or below the applied frontier is skipped; one that does not start right after it
    /// is [`Error::Gap`]; a kind without an applier or a payload that does not decode is an error.
    /// Errors write nothing. After a failed background flush every apply is [`Error::FlushFailed`].
    ///
    /// Waits (backpressure) only if the active overlay is full while the previous one is still
    /// being flushed.
    pub fn apply(&self, batch: &Batch) -> Result<ApplyOutcome, Error> {
        self.apply_decoded(&mut DecodedBatch::decode(batch.clone()))
    }

    /// [`TidalDb::apply`] of a batch decoded beforehand, maybe on another thread (startup replay
    /// decodes on its reader thread while this one folds). The same path: `apply` is this after
    /// [`DecodedBatch::decode`], and a batch that did not decode fails here, at the same step.
    ///
    /// An embedding's vector is moved out of `decoded` into the write-back overlay: once applied,
    /// `decoded` is spent (applying it again is a skip, as for any applied batch).
    pub fn apply_decoded(&self, decoded: &mut DecodedBatch) -> Result<ApplyOutcome, Error> {
        let batch = &decoded.batch;
        let mut writer = self.lock_writer();
        if self.import_incomplete.load(Ordering::Acquire) {
            return Err(Error::ImportIncomplete);
        }
        self.flush.check()?;
        let applied = self.applied_seqno();
        if batch.last_seqno() <= applied {
            return Ok(ApplyOutcome::Skipped);
        }
        if batch.first_seqno() != applied.next() {
            return Err(Error::Gap { expected: applied.next(), got: batch.first_seqno() });
        }
        let first_seqno = batch.first_seqno();
        let last_seqno = batch.last_seqno();
        let (envelope, records) = match &mut decoded.decoded {
            Ok((envelope, records)) => (&*envelope, records),
            Err(source) => {
                return Err(Error::Record { seqno: first_seqno, kind: batch.kind(), source: source.clone() })
            }
        };
        let header_events = batch.header().event_count;
        if records.event_count() != u64::from(header_events) {
            return Err(Error::EventCount {
                seqno: first_seqno,
                header: header_events,
                records: records.event_count(),
            });
        }
        // The overlay crossed its bound while a flush was in flight: wait for it, then freeze.
        if self.overlay_full(&writer) {
            self.freeze(&mut writer, Wait::Backpressure)?;
        }
        let now_ms = self.last_applied_time_ms().max(envelope.time_ms);
        let new_key = (!envelope.idempotency_key.is_empty()).then(|| NewKey {
            principal: &envelope.principal,
            key: &envelope.idempotency_key,
            record: IdempotencyRecord {
                last_seqno,
                first_seqno,
                fingerprint: records_fingerprint(batch.payload()),
                time_ms: envelope.time_ms,
            },
        });
        if let FoldRecords::Tx(ops) = records {
            let at = TxAt { first: first_seqno, last: last_seqno, envelope, now_ms };
            self.apply_tx(&mut writer, at, new_key.as_ref(), ops)?;
            tracing::trace!(%first_seqno, %last_seqno, ops = ops.len(), "applied a tx");
            return Ok(ApplyOutcome::Applied { first_seqno, last_seqno });
        }
        let (change, idempotency_writes, idempotency_oldest_ms) = {
            let state = self.read_state();
            let (idempotency_writes, oldest_ms) =
                self.fold_idempotency(&state, &writer, new_key.as_ref(), now_ms)?;
            (
                self.fold_records(&state, first_seqno, (envelope, now_ms), records)?,
                idempotency_writes,
                oldest_ms,
            )
        };

        // Nothing below fails: merge the change, then publish the new frontier.
        let mut state = self.write_state();
        let mut bytes = state.overlay.set_idempotency(idempotency_writes);
        writer.idempotency_oldest_ms = idempotency_oldest_ms;
        bytes += self.merge(&mut state, &mut writer, change);
        self.applied_seqno.store(last_seqno.0, Ordering::Release);
        self.last_time_ms.store(now_ms, Ordering::Release);
        drop(state);
        if let Some((owner, outcome)) = writer.inbox_done.take() {
            self.inbox_signals.applied(&owner, last_seqno, outcome);
        }
        self.applied(&mut writer, bytes, last_seqno);
        tracing::trace!(%first_seqno, %last_seqno, kind = %batch.kind(), "applied");
        Ok(ApplyOutcome::Applied { first_seqno, last_seqno })
    }

    /// The idempotency table's changes for an apply (the new key, expired entries), over `state`.
    fn fold_idempotency(
        &self,
        state: &State,
        writer: &Writer,
        new_key: Option<&NewKey<'_>>,
        now_ms: u64,
    ) -> Result<(idempotency::Writes, Option<u64>), Error> {
        let mut writes = Vec::new();
        let table = state.view().idempotency_table(&self.stores);
        let oldest_ms = idempotency::fold(
            table,
            &mut writes,
            new_key,
            now_ms,
            self.window(),
            writer.idempotency_oldest_ms,
        )?;
        Ok((writes, oldest_ms))
    }

    /// After an apply published its frontier: counts it and freezes the overlay if it is full and
    /// the flusher is free (nothing waits: only the applier starts flushes); otherwise the next
    /// apply waits for it. A failed flush is not this apply's error (it applied): it is sticky, and
    /// the next apply returns it.
    fn applied(&self, writer: &mut Writer, bytes: usize, last_seqno: Seqno) {
        writer.dirty.bytes += bytes;
        writer.dirty.batches += 1;
        if self.overlay_full(writer) && !self.flush.in_flight() {
            if let Err(error) = self.freeze(writer, Wait::Flush) {
                tracing::debug!("no freeze after seqno {last_seqno}: {error:#}");
            }
        }
    }

    /// Applies a tx: its ops in order, each folded over the state the ops before it left, under
    /// the state write lock the whole time, so no read sees part of it.
    ///
    /// Every error the ops' input can cause is found before the first change ([`check_tx`]); what
    /// is left is a storage fault (a fjall read), which after the first op has changed the overlay
    /// would leave half a batch applied: the engine then refuses everything from here on and does
    /// not flush (the node stops; its replay folds the whole tx again from fjall's prefix).
    fn apply_tx(
        &self,
        writer: &mut Writer,
        at: TxAt<'_>,
        new_key: Option<&NewKey<'_>>,
        ops: &mut [FoldRecords],
    ) -> Result<(), Error> {
        check_tx(ops, self.config.dimension)?;
        let mut state = self.write_state();
        let (idempotency_writes, oldest_ms) = self.fold_idempotency(&state, writer, new_key, at.now_ms)?;
        let (mut seqno, mut bytes) = (at.first, 0);
        for (index, op) in ops.iter_mut().enumerate() {
            let events = op.event_count();
            let change = match self.fold_records(&state, seqno, (at.envelope, at.now_ms), op) {
                Ok(change) => change,
                Err(error) if index == 0 => return Err(error),
                Err(error) => {
                    let reason = format!("the tx at seqno {} failed at op {index}: {error}", at.first);
                    tracing::error!("{reason}; the engine refuses further applies");
                    self.half_applied.store(true, Ordering::Release);
                    self.flush.fail_now(reason);
                    return Err(error);
                }
            };
            bytes += self.merge(&mut state, writer, change);
            seqno = Seqno(seqno.0 + events);
        }
        assert_eq!(seqno, at.last.next(), "the tx's ops consumed its seqnos {}..={}", at.first, at.last);
        bytes += state.overlay.set_idempotency(idempotency_writes);
        writer.idempotency_oldest_ms = oldest_ms;
        self.applied_seqno.store(at.last.0, Ordering::Release);
        self.last_time_ms.store(at.now_ms, Ordering::Release);
        drop(state);
        self.applied(writer, bytes, at.last);
        Ok(())
    }

    /// Flushes the overlay to fjall and makes everything flushed durable (fsync). Returns the
    /// applied seqno now durable in fjall: WAL purge may not pass it.
    ///
    /// Applies continue meanwhile: only the freeze holds the applier's lock.
    pub fn checkpoint(&self) -> Result<Seqno, Error> {
        self.flush_all()?;
        let flushed = self.flushed_applied_seqno();
        // Every commit up to `flushed` is already in fjall's journal; later flushes only add.
        self.stores.database.persist(PersistMode::SyncAll)?;
        Ok(flushed)
    }

    /// Writes fjall's memtables into tables and waits until they are written: a clean shutdown
    /// calls it after [`TidalDb::checkpoint`] (experiments/050). fjall flushes nothing when it
    /// closes, so the next open would replay its journal entry by entry (about 15-30 MB/s for our
    /// small entries) and write the same tables then. Once every memtable that holds a journal's
    /// entries is in a table, fjall deletes that journal (a sealed one, over 64 MB), and an open
    /// skips the entries of the rest that a table already holds. Only an optimization: on error
    /// the journal still holds everything.
    ///
    /// The wait is ours, not fjall's `rotate_memtable_and_wait`: that one polls until the sealed
    /// memtables are gone and never looks at fjall's poison, so on a failing disk (fjall's flush
    /// worker "crashed" and poisoned the database) it waited forever, and a node that was told to
    /// stop hung at shutdown. This wait ends with [`Error::TablesNotWritten`] once fjall is
    /// poisoned or after [`FLUSH_TABLES_WAIT_MAX`].
    pub fn flush_tables(&self) -> Result<(), Error> {
        let keyspaces: Vec<&fjall::Keyspace> =
            self.stores.log_derived_stored().chain([&self.stores.negatives, &self.stores.local]).collect();
        for keyspace in &keyspaces {
            // Public but hidden in fjall 3: seals the active memtable and queues its flush.
            keyspace.rotate_memtable()?;
        }
        let started = Instant::now();
        loop {
            let sealed: usize = keyspaces.iter().map(|keyspace| keyspace.sealed_memtable_count()).sum();
            if sealed == 0 {
                return Ok(());
            }
            if let Some(reason) = self.fault() {
                return Err(Error::TablesNotWritten { sealed, reason });
            }
            if started.elapsed() >= FLUSH_TABLES_WAIT_MAX {
                let reason =
                    format!("fjall's flush worker wrote none of them within {FLUSH_TABLES_WAIT_MAX:?}");
                return Err(Error::TablesNotWritten { sealed, reason });
            }
            std::thread::sleep(FLUSH_TABLES_POLL);
        }
    }

    /// Raises the nice value of the engine's background threads, the flusher and fjall's workers
    /// (flushes and compactions), by `by` levels (at most to 19), so the threads that answer requests
    /// get a core first when both want one (`priority`). Once, when the node starts serving: an
    /// unprivileged process cannot undo it. Returns how many threads it lowered. fjall's workers
    /// are found by their thread name, so every fjall database of the process is lowered with them.
    pub fn lower_background_priority(&self, by: i32) -> Result<usize, Error> {
        let mut threads = crate::priority::threads_named(FJALL_WORKER_THREAD)
            .map_err(|source| Error::Priority { thread: 0, source })?;
        threads.extend(self.flusher_tid);
        let mut lowered = 0;
        for thread in threads {
            match crate::priority::lower(thread, by) {
                Ok(Some(_)) => lowered += 1,
                Ok(None) => {}
                Err(source) => return Err(Error::Priority { thread, source }),
            }
        }
        Ok(lowered)
    }

    /// Bytes in fjall's memtables, active and sealed: entries in fjall's journal that no table
    /// holds yet, which an open after a crash inserts again one by one. [`TidalDb::flush_tables`]
    /// brings it down to what arrives meanwhile.
    pub fn memtable_bytes(&self) -> u64 {
        self.stores.database.write_buffer_size()
    }

    /// Drops the engine without flushing the overlays, as a process crash would: fjall keeps what
    /// the last committed flush wrote; a flush not yet committed is dropped. For crash tests and
    /// benchmarks.
    #[doc(hidden)]
    pub fn simulate_crash(mut self) {
        self.flush_on_drop = false;
    }

    /// Why the engine refuses applies for good, if it does: a background flush failed (every later
    /// apply fails), or fjall poisoned itself (a failed journal write or fsync, or a failed
    /// background worker: fjall logs "Worker #N crashed" and refuses every write from then on).
    /// The node asks periodically (a fatal fault: it must leave office and exit), so a failure
    /// shows even while no apply comes. Takes fjall's journal lock for a moment: not on an async
    /// worker.
    pub fn fault(&self) -> Option<String> {
        if let Err(error) = self.flush.check() {
            return Some(error.to_string());
        }
        database_fault(&self.stores.database)
    }

    /// Makes the flusher's next commit fail with `reason`, as if fjall had refused it: the engine
    /// then refuses applies ([`Error::FlushFailed`]). For tests.
    #[doc(hidden)]
    pub fn fail_next_flush(&self, reason: &str) {
        self.flush.fail_next(reason);
    }

    /// Holds the flusher at `stage` of its next flush until the returned hold is dropped, so tests
    /// can look at the engine while a flush is in flight. Without a hold nothing waits.
    #[doc(hidden)]
    pub fn hold_flushes(&self, stage: FlushStage) -> FlushHold {
        self.flush.hold(stage)
    }

    /// An item's metadata; `None` if it has no metadata (even if it has an embedding).
    pub fn get_item(&self, id: u64) -> Result<Option<ItemState>, Error> {
        let state = self.read_state();
        let has_embedding = state.index.embedding(id).is_some();
        let item = |value: &[u8]| {
            let (seqno, metadata) =
                keys::split_seqno_value(value).ok_or_else(|| corrupt("items", "short value"))?;
            Ok(Some(ItemState { metadata: metadata.to_vec(), has_embedding, seqno }))
        };
        match state.view().item(id) {
            Some(Some(value)) => item(value),
            Some(None) => Ok(None),
            None => match self.stores.items.get(keys::item_key(id))? {
                Some(value) => item(&value),
                None => Ok(None),
            },
        }
    }

    /// Items with an embedding, and whether `item` is one of them (applied state): what a cap on
    /// the ranking index's size is checked against.
    pub fn embeddings_and_has(&self, item: u64) -> (u64, bool) {
        let state = self.read_state();
        (state.index.embeddings() as u64, state.index.embedding(item).is_some())
    }

    /// An item's embedding and the seqno that stored it.
    pub fn get_embedding(&self, id: u64) -> Result<Option<(Vec<f32>, Seqno)>, Error> {
        let state = self.read_state();
        match state.view().embedding(id) {
            Some(Some((seqno, vector))) => return Ok(Some((vector.clone(), *seqno))),
            Some(None) => return Ok(None),
            None => {}
        }
        let Some(value) = self.stores.embeddings.get(keys::item_key(id))? else {
            return Ok(None);
        };
        let (seqno, bytes) =
            keys::split_seqno_value(&value).ok_or_else(|| corrupt("embeddings", "short value"))?;
        let vector = keys::f32s_from_bytes(bytes, self.config.dimension as usize)
            .ok_or_else(|| corrupt("embeddings", "wrong length"))?;
        Ok(Some((vector, seqno)))
    }

    /// A user's feed: items with embeddings, by `a * cosine(profile, e) + b * trending`, without the
    /// user's seen items, hard negatives and `exclude`. `limit` is capped at [`RANKED_LIMIT_MAX`].
    /// From [`EngineConfig::ann_threshold`] embeddings on, the candidates come from the approximate
    /// index ([`TidalDb::feed_with`]).
    pub fn feed(&self, user: &str, limit: usize, exclude: &[u64]) -> Result<Ranked, Error> {
        self.feed_with(user, limit, exclude, false)
    }

    /// [`TidalDb::feed`], by the exact scan of every item if `exact` (for audits), else by the
    /// approximate index when the catalogue is large enough and the user has a profile.
    pub fn feed_with(&self, user: &str, limit: usize, exclude: &[u64], exact: bool) -> Result<Ranked, Error> {
        let state = self.read_state();
        let applied_seqno = self.applied_seqno();
        let view = state.view();
        let profile = view.profile(&self.stores, user, self.config.dimension as usize)?;
        let mut excluded: HashSet<u64> = exclude.iter().copied().collect();
        excluded.extend(view.seen(user));
        let (mut stored, mut items) = (0, Vec::new());
        for guard in self.stores.seen.prefix(keys::seen_prefix(user)) {
            let (key, value) = guard.into_inner()?;
            seen::entry_items(&key, &value, &mut items)?;
            stored += 1;
        }
        excluded.extend(items);
        if stored > seen::KEYS_BEFORE_MERGE {
            self.flush.request_seen_merge(user);
        }
        excluded.extend(self.load_negatives(user)?.items());
        let params = RankParams {
            now_ms: self.now_ms(),
            half_life_ms: self.config.half_life_ms,
            similarity_weight: self.config.similarity_weight,
            trending_weight: self.config.trending_weight,
            excluded: &excluded,
            limit: limit.min(RANKED_LIMIT_MAX),
        };
        let profile = profile.as_ref().map(|p| p.vector.as_slice());
        let approximate = self.approximate(&state.index, exact);
        let items = match (approximate, profile) {
            // A user without a profile (or with a zero one) ranks by trending alone: no list is
            // nearer than another, and the scan without dot products is cheap.
            (Some(ann), Some(profile)) if inverse_norm(profile) > 0.0 => {
                rank_feed_ann(&state.index, ann, profile, &params, self.config.ann_probes)
            }
            _ => rank_feed(&state.index, profile, &params),
        };
        Ok(Ranked { items, applied_seqno })
    }

    /// Nearest neighbours of `item` by cosine, without the item; `None` if it has no embedding.
    pub fn similar(&self, item: u64, limit: usize) -> Result<Option<Ranked>, Error> {
        self.similar_with(item, limit, false)
    }

    /// [`TidalDb::similar`], by the exact scan if `exact`, else as [`TidalDb::feed_with`] decides.
    pub fn similar_with(&self, item: u64, limit: usize, exact: bool) -> Result<Option<Ranked>, Error> {
        let state = self.read_state();
        let applied_seqno = self.applied_seqno();
        let limit = limit.min(RANKED_LIMIT_MAX);
        let items = match self.approximate(&state.index, exact) {
            Some((ann, _)) => rank_similar_ann(&state.index, ann, item, limit, self.config.ann_probes),
            None => rank_similar(&state.index, item, limit),
        };
        Ok(items.map(|items| Ranked { items, applied_seqno }))
    }

    /// The approximate index a ranking uses, if it should: not asked for the exact scan, and the
    /// index exists over at least `ann_threshold` embeddings. Every input is log-derived or the
    /// request's, so every node at one applied seqno decides alike.
    fn approximate<'a>(
        &self,
        index: &'a FeedIndex,
        exact: bool,
    ) -> Option<(&'a crate::ann_index::AnnIndex, &'a crate::trend_order::TrendOrder)> {
        let wanted = !exact && self.config.ann_lists > 0 && index.embeddings() >= self.config.ann_threshold;
        wanted.then(|| index.ann().zip(index.trend_order())).flatten()
    }

    /// Items by trending term, decayed to the last applied batch's time.
    pub fn trending(&self, limit: usize) -> Result<Ranked, Error> {
        let state = self.read_state();
        let applied_seqno = self.applied_seqno();
        let items =
            rank_trending(&state.index, self.now_ms(), self.config.half_life_ms, limit.min(RANKED_LIMIT_MAX));
        Ok(Ranked { items, applied_seqno })
    }

    /// Up to `limit` events of `stream` with offsets above `after` (and above the stream's trim
    /// horizon), ascending, as of the applied state.
    pub fn stream_events(&self, stream: &str, after: u64, limit: usize) -> Result<Vec<StoredEvent>, Error> {
        self.read_state().view().stream_events(&self.stores, stream, after, limit)
    }

    /// A stream's meta; `None` if nothing was ever published to it or saved for it.
    pub fn stream_meta(&self, stream: &str) -> Result<Option<StreamMeta>, Error> {
        self.read_state().view().stream_meta(&self.stores, stream)
    }

    /// Where a retention trim of `stream` would cut: the offset through which it keeps at most
    /// `keep_events` events and none created before `cutoff_s`, scanning at most `scan_max`
    /// events; `None` when nothing is due.
    pub fn stream_retention_point(
        &self,
        stream: &str,
        keep_events: Option<u64>,
        cutoff_s: Option<i64>,
        scan_max: u64,
    ) -> Result<Option<u64>, Error> {
        self.read_state().view().retention_point(&self.stores, stream, keep_events, cutoff_s, scan_max)
    }

    /// A consumer's saved offset.
    pub fn consumer_offset(&self, stream: &str, consumer: &str) -> Result<Option<u64>, Error> {
        self.read_state().view().consumer_offset(&self.stores, stream, consumer)
    }

    /// Every consumer of `stream` with its saved offset, by name.
    pub fn consumers(&self, stream: &str) -> Result<Vec<(String, u64)>, Error> {
        self.read_state().view().consumers(&self.stores, stream)
    }

    /// Up to `limit` streams named after `after`, by name.
    pub fn streams(&self, after: &str, limit: usize) -> Result<Vec<StreamInfo>, Error> {
        self.read_state().view().streams(&self.stores, after, limit)
    }

    /// How many events of `stream` fjall holds after a flush, trimmed or not: trims must leave
    /// nothing behind in storage. For tests.
    #[doc(hidden)]
    pub fn stream_events_in_storage(&self, stream: &str) -> Result<usize, Error> {
        self.flush_all()?;
        crate::streams::stored_event_count(&self.stores, stream)
    }

    /// A user's profile vector as the applied state holds it (`None`: no signal yet), for tests and
    /// debugging.
    #[doc(hidden)]
    pub fn profile(&self, user: &str) -> Result<Option<Vec<f32>>, Error> {
        let state = self.read_state();
        let profile = state.view().profile(&self.stores, user, self.config.dimension as usize)?;
        Ok(profile.map(|profile| profile.vector))
    }

    /// An item's trending score as stored (not decayed), for tests and debugging.
    pub fn trend(&self, item: u64) -> Option<Trend> {
        self.read_state().index.trend(item)
    }

    /// The write that used `(principal, key)` within the window, as of the applied state.
    pub fn idempotency_lookup(&self, principal: &str, key: &str) -> Result<Option<IdempotencyRecord>, Error> {
        let state = self.read_state();
        idempotency::lookup(
            state.view().idempotency_table(&self.stores),
            principal,
            key,
            self.last_applied_time_ms(),
            self.window(),
        )
    }

    /// Adds a hard negative as this node's actor; durable (fsync) when it returns.
    pub fn negatives_add(&self, user: &str, item: u64) -> Result<(), Error> {
        let _lock = self.negatives_lock.lock().expect("negatives lock poisoned");
        let mut state = self.load_negatives(user)?;
        if !state.contains(item) && state.len() >= NEGATIVES_PER_USER_MAX {
            return Err(Error::NegativesFull { count: state.len() });
        }
        let (node, incarnation) = self.config.node_actor;
        state.add(Actor { node, incarnation }, item);
        self.store_negatives(user, &state)
    }

    /// Removes a hard negative (the dots this node has seen); durable when it returns.
    pub fn negatives_remove(&self, user: &str, item: u64) -> Result<(), Error> {
        let _lock = self.negatives_lock.lock().expect("negatives lock poisoned");
        let mut state = self.load_negatives(user)?;
        if !state.contains(item) {
            return Ok(());
        }
        state.remove(item);
        self.store_negatives(user, &state)
    }

    /// A user's hard negatives, ascending.
    pub fn negatives(&self, user: &str) -> Result<Vec<u64>, Error> {
        Ok(self.load_negatives(user)?.items())
    }

    /// A user's CRDT state, for anti-entropy.
    pub fn negatives_state(&self, user: &str) -> Result<NegativesState, Error> {
        self.load_negatives(user)
    }

    /// Merges a peer's state for `user` into ours (ORSWOT join); durable when it returns.
    pub fn negatives_merge(&self, user: &str, remote: &NegativesState) -> Result<(), Error> {
        let _lock = self.negatives_lock.lock().expect("negatives lock poisoned");
        let mut state = self.load_negatives(user)?;
        let before = state.clone();
        state.merge(remote);
        if state == before {
            return Ok(());
        }
        self.store_negatives(user, &state)
    }

    /// Every user with a hard negatives state, ascending by bytes, for anti-entropy.
    pub fn negatives_users(&self) -> Result<Vec<String>, Error> {
        let mut users = Vec::new();
        for guard in self.stores.negatives.iter() {
            let key = guard.key()?;
            let user = std::str::from_utf8(&key).map_err(|_| corrupt("negatives", "user is not UTF-8"))?;
            users.push(user.to_owned());
        }
        Ok(users)
    }

    /// Up to `limit` users' hard negatives states with user names after `after` (ascending), for
    /// anti-entropy pages.
    pub fn negatives_page(&self, after: &str, limit: usize) -> Result<Vec<(String, NegativesState)>, Error> {
        let mut page = Vec::new();
        // The first key after `after` is `after` followed by a zero byte.
        let mut from = after.as_bytes().to_vec();
        if !from.is_empty() {
            from.push(0);
        }
        for guard in self.stores.negatives.range(from..).take(limit) {
            let (key, value) = guard.into_inner()?;
            let user = std::str::from_utf8(&key).map_err(|_| corrupt("negatives", "user is not UTF-8"))?;
            let state = NegativesState::from_bytes(&value)
                .map_err(|reason| Error::Corrupt { keyspace: "negatives", reason })?;
            page.push((user.to_owned(), state));
        }
        Ok(page)
    }

    /// BLAKE3 over the canonical log-derived state, with the applied seqno it was taken at. Two
    /// replicas that applied the same log have equal digests. Excludes hard negatives.
    ///
    /// Flushes the overlays first, so the digest is the same wherever the state sits. Applies
    /// continue meanwhile; the digest is of the fjall snapshot taken right after the flush, and
    /// its seqno is the applied seqno in that snapshot (taken between two flushes, never within one).
    pub fn digest(&self) -> Result<(Seqno, [u8; 32]), Error> {
        self.flush_all()?;
        let snapshot = {
            let _whole = self.ingest.whole_flushes();
            self.stores.database.snapshot()
        };
        crate::digest::state_digest(&self.stores, &snapshot)
    }

    /// [`TidalDb::digest`] of what fjall holds now, without flushing first, from a snapshot taken
    /// between two flushes as `digest` takes its own; `None` while a flush is between its first
    /// ingestion and its last. For tests of what a digest or snapshot can see mid-flush.
    #[doc(hidden)]
    pub fn try_digest_between_flushes(&self) -> Result<Option<(Seqno, [u8; 32])>, Error> {
        let Some(_whole) = self.ingest.try_whole_flushes() else {
            return Ok(None);
        };
        let snapshot = self.stores.database.snapshot();
        crate::digest::state_digest(&self.stores, &snapshot).map(Some)
    }

    /// [`TidalDb::digest`] of what fjall holds now, without flushing first (a flush may be in
    /// flight). For tests of what a digest or snapshot sees mid-flush.
    #[doc(hidden)]
    pub fn digest_of_storage(&self) -> Result<(Seqno, [u8; 32]), Error> {
        crate::digest::state_digest(&self.stores, &self.stores.database.snapshot())
    }

    /// BLAKE3 over every user's hard negatives state.
    pub fn negatives_digest(&self) -> Result<[u8; 32], Error> {
        crate::digest::negatives_digest(&self.stores)
    }

    /// Sizes, for metrics.
    pub fn stats(&self) -> EngineStats {
        let state = self.read_state();
        let index = &state.index;
        let (feed_index_bytes, ann_index_bytes) = index.bytes();
        EngineStats {
            feed_index_bytes: feed_index_bytes as u64,
            ann_index_bytes: ann_index_bytes as u64,
            ann_lists: index.ann().map_or(0, |ann| ann.lists() as u64),
            applied_seqno: self.applied_seqno(),
            last_applied_time_ms: self.last_applied_time_ms(),
            items: self.items.load(Ordering::Relaxed),
            embeddings: index.embeddings() as u64,
            trending_items: index.trending_items() as u64,
            users: self.users.load(Ordering::Relaxed),
            flushed_applied_seqno: self.flushed_applied_seqno(),
            flush: self.flush.stats(),
        }
    }

    /// What `records` change, over the applied state. Fails only on a fjall read or a bad record.
    fn fold_records<'a>(
        &self,
        state: &State,
        seqno: Seqno,
        (envelope, now_ms): (&Envelope, u64),
        records: &'a mut FoldRecords,
    ) -> Result<Change<'a>, Error> {
        let envelope_time_ms = envelope.time_ms;
        let stores = &self.stores;
        let records = match records {
            FoldRecords::Signals(events) => {
                let dimension = self.config.dimension as usize;
                let view = state.view();
                let (trends, users) = self.fold_in_two(
                    events.len(),
                    || fold::trends(&state.index, &self.config, envelope_time_ms, events),
                    || fold::users(stores, view, dimension, events),
                );
                let (loaded, slots) = users?;
                let fold = SignalsFold { trends, loaded, slots };
                return Ok(Change::Signals { fold, events, envelope_time_ms });
            }
            FoldRecords::Tx(_) => unreachable!("a tx is applied op by op (apply_tx)"),
            FoldRecords::Other(records) => records,
        };
        Ok(match records {
            Records::Signals(_) => unreachable!("decode_for_apply decodes signals as columns"),
            Records::Tx(_) => unreachable!("decode_for_apply decodes a tx as FoldRecords::Tx"),
            Records::ItemMetadata { item, metadata } => Change::ItemMetadata {
                item: *item,
                value: keys::seqno_value(seqno, metadata),
                new: !state.view().has_item(stores, *item)?,
            },
            Records::ItemEmbedding { item, vector } => {
                if vector.len() != self.config.dimension as usize {
                    return Err(Error::EmbeddingDimension {
                        item: *item,
                        expected: self.config.dimension,
                        got: vector.len(),
                    });
                }
                Change::ItemEmbedding { item: *item, seqno, vector: std::mem::take(vector) }
            }
            Records::ItemDelete { item } => {
                Change::ItemDelete { item: *item, existed: state.view().has_item(stores, *item)? }
            }
            Records::Control(control) => Change::LeaderStart(fold::control_value(control)),
            Records::StreamEvents { stream, events } => Change::Stream(state.view().fold_publish(
                stores,
                stream,
                seqno.0,
                envelope_time_ms,
                events,
            )?),
            Records::StreamControl(StreamControl::SaveOffset { stream, consumer, offset }) => {
                Change::Stream(state.view().fold_save_offset(stores, stream, consumer, *offset)?)
            }
            Records::StreamControl(StreamControl::Trim { stream, through }) => {
                Change::Stream(state.view().fold_trim(stores, stream, *through)?)
            }
            Records::InboxSend(send) => {
                let at = inboxes::At { seqno: seqno.0, now_ms, principal: &envelope.principal };
                let mut inbox = InboxState::new(state.view(), stores);
                let outcome = inbox.fold_send(at, send)?;
                Change::Inbox { writes: inbox.pending, owner: send.owner.clone(), outcome }
            }
            Records::InboxConsume(consume) => {
                let at = inboxes::At { seqno: seqno.0, now_ms, principal: &envelope.principal };
                let mut inbox = InboxState::new(state.view(), stores);
                let outcome = inbox.fold_consume(at, consume)?;
                Change::Inbox { writes: inbox.pending, owner: consume.owner().to_string(), outcome }
            }
        })
    }

    /// Merges a change into the index, the overlay and the counters. Returns the estimated bytes
    /// the overlay grew by.
    fn merge(&self, state: &mut State, writer: &mut Writer, change: Change<'_>) -> usize {
        let mut bytes = 0;
        let dimension = self.config.dimension as usize;
        match change {
            Change::Signals { fold, events, envelope_time_ms } => {
                bytes += fold.trends.len() * 8;
                let State { index, overlay, .. } = state;
                let (mut scores, embeddings) = index.split_for_signals();
                let Writer { dirty, counters, .. } = writer;
                // The scores and counts (per item) and the profiles (per user) share nothing but
                // read-only embeddings: a large batch folds them on two threads (experiments/047).
                // Each side still folds its events in log order, so the state is the same.
                let scores_side = move || {
                    for (item, trend) in fold.trends {
                        let mark = scores.set_trend(item, trend);
                        dirty.trends.set(mark, item, Some(trend));
                    }
                    // After the scores: the counts live in the scores' entries.
                    fold::count_signals(counters, &mut scores, events);
                };
                let config = &self.config;
                let profiles_side = move || {
                    fold::profiles(
                        overlay,
                        embeddings,
                        config,
                        envelope_time_ms,
                        events,
                        fold.loaded,
                        &fold.slots,
                    )
                };
                let ((), (new_users, user_bytes)) =
                    self.fold_in_two(events.len(), scores_side, profiles_side);
                bytes += user_bytes;
                add_signed(&self.users, new_users);
            }
            Change::ItemMetadata { item, value, new } => {
                let value_bytes = value.len();
                bytes += Overlay::set(&mut state.overlay.items, item, Some(value), value_bytes);
                if new {
                    add_signed(&self.items, 1);
                }
            }
            Change::ItemEmbedding { item, seqno, vector } => {
                state.index.set_embedding(item, &vector);
                if self.ann_due(&state.index) {
                    self.start_ann(&mut state.index, writer);
                }
                let entry = Some((seqno, vector));
                bytes += Overlay::set(&mut state.overlay.embeddings, item, entry, 8 + dimension * 4);
            }
            Change::ItemDelete { item, existed } => {
                // Users' seen sets and profiles keep what they already absorbed: they are history
                // of the users, not state of the item, and rewriting every profile would make a
                // delete cost O(users).
                let removed = state.index.remove_item(item);
                bytes += Overlay::set(&mut state.overlay.items, item, None, 0);
                bytes += Overlay::set(&mut state.overlay.embeddings, item, None, 0);
                // Removed from fjall too (a score the index never held is removed all the same).
                writer.dirty.trends.set_removed(removed.map_or(Mark::CLEAN, |(mark, _)| mark), item, None);
                bytes += 8;
                writer.counters.remove_item(item, removed.map(|(_, counts)| counts));
                if existed {
                    add_signed(&self.items, -1);
                }
            }
            Change::LeaderStart(value) => {
                bytes += ENTRY_OVERHEAD_BYTES;
                writer.dirty.leader_start = Some(value);
            }
            Change::Stream(change) => bytes += state.overlay.merge_stream(change),
            Change::Inbox { writes, owner, outcome } => {
                bytes += state.overlay.merge_inbox(writes);
                writer.inbox_done = Some((owner, outcome));
            }
        }
        bytes
    }

    /// Whether this apply chooses the approximate index's centroids: it is on, it has none yet, and
    /// the catalogue has reached `ann_centroids_at` (log-derived, so every node chooses at the
    /// same apply).
    fn ann_due(&self, index: &FeedIndex) -> bool {
        self.config.ann_lists > 0
            && index.ann().is_none()
            && index.embeddings() >= self.config.ann_centroids_at
    }

    /// Chooses the centroids from the embeddings held now, starts the approximate index over them
    /// and marks them for the next flush (meta). Pauses this one apply: one dot product per row and
    /// list (measured in docs/measurements.md).
    fn start_ann(&self, index: &mut FeedIndex, writer: &mut Writer) {
        let dimension = self.config.dimension as usize;
        let rows = index.rows_in(0..index.embeddings()).map(|(item, vector, _, _)| (item, vector));
        let centroids = crate::ann_index::choose_centroids(rows, self.config.ann_lists);
        if centroids.is_empty() {
            return;
        }
        writer.dirty.ann_centroids = Some(crate::ann_index::encode_centroids(dimension, &centroids));
        index.install_ann(centroids, self.config.half_life_ms);
    }

    /// Whether the overlay is past one of its bounds.
    fn overlay_full(&self, writer: &Writer) -> bool {
        // Each dirty counter costs its key in memory now and its part of a trend block at flush.
        let bytes = writer.dirty.bytes + writer.counters.dirty_len() * DIRTY_KEY_BYTES;
        bytes > self.config.overlay_bytes_max
            || (writer.dirty.batches >= self.config.overlay_batches_max
                && !self.replaying.load(Ordering::Relaxed))
    }

    /// Freezes the active overlay (if it holds anything) and hands it to the flusher, after
    /// waiting for the flush in flight, if any. Fails if a flush failed.
    fn freeze(&self, writer: &mut Writer, wait: Wait) -> Result<(), Error> {
        self.flush.wait_idle(wait == Wait::Backpressure)?;
        let applied = self.applied_seqno();
        if applied == writer.frozen_seqno {
            return Ok(());
        }
        let Writer { counters, dirty, frozen_overlays, .. } = &mut *writer;
        let sender = frozen_overlays.as_ref().ok_or_else(|| Error::FlushFailed {
            reason: "the flusher is stopped: the engine is closing".into(),
        })?;
        let frozen = {
            let mut state = self.write_state();
            assert!(
                state.frozen.is_none(),
                "freezing at {applied} while the overlay frozen at {:?} is still read",
                state.frozen.as_ref().map(|frozen| frozen.applied_seqno)
            );
            let (frozen_dirty, wrapped) = dirty.take();
            if wrapped {
                state.index.clear_trend_marks();
            }
            let frozen = Arc::new(FrozenOverlay {
                overlay: std::mem::take(&mut state.overlay),
                dirty: frozen_dirty,
                counters: counters.take_dirty(&mut state.index),
                applied_seqno: applied,
                last_time_ms: self.last_applied_time_ms(),
                ingest_seen: self.replaying.load(Ordering::Relaxed),
                // Exact at `applied`: every apply that changes them holds the writer lock we hold.
                items: self.items.load(Ordering::Relaxed),
                users: self.users.load(Ordering::Relaxed),
            });
            state.frozen = Some(frozen.clone());
            frozen
        };
        self.flush.start(applied);
        let sent = sender.send(frozen);
        writer.frozen_seqno = applied;
        if sent.is_err() {
            // The flusher only stops after a failed flush, which `wait_idle` reported.
            self.flush.check()?;
            return Err(Error::FlushFailed { reason: "the flusher thread is gone".into() });
        }
        tracing::trace!(%applied, "overlay frozen");
        Ok(())
    }

    /// Freezes what is applied now and waits until fjall holds it. Holds the applier's lock only
    /// for the freeze.
    fn flush_all(&self) -> Result<(), Error> {
        let target = {
            let mut writer = self.lock_writer();
            self.freeze(&mut writer, Wait::Flush)?;
            writer.frozen_seqno
        };
        self.flush.wait_flushed(target)
    }

    fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().expect("writer lock poisoned: an apply panicked")
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().expect("state lock poisoned: an apply panicked")
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().expect("state lock poisoned: an apply panicked")
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.last_applied_time_ms()).unwrap_or(i64::MAX)
    }

    fn window(&self) -> Window {
        Window { window_ms: self.config.idempotency_window_ms, keys_max: self.config.idempotency_keys_max }
    }

    fn load_negatives(&self, user: &str) -> Result<NegativesState, Error> {
        match self.stores.negatives.get(user.as_bytes())? {
            Some(bytes) => NegativesState::from_bytes(&bytes)
                .map_err(|reason| Error::Corrupt { keyspace: "negatives", reason }),
            None => Ok(NegativesState::default()),
        }
    }

    fn store_negatives(&self, user: &str, state: &NegativesState) -> Result<(), Error> {
        let mut writes = self.stores.database.batch().durability(Some(PersistMode::SyncAll));
        writes.insert(&self.stores.negatives, user.as_bytes(), state.to_bytes());
        writes.commit()?;
        Ok(())
    }
}

impl Drop for TidalDb {
    /// Flushes the overlays (no fsync), so a clean close needs no replay, then stops the flusher.
    fn drop(&mut self) {
        if !self.flush_on_drop || self.half_applied.load(Ordering::Acquire) {
            self.flush.abandon();
        } else if self.writer.is_poisoned() {
            // An apply panicked half-way: the active overlay may hold half a batch. A frozen one is
            // whole; the flusher finishes it below.
            tracing::error!("not flushing the overlay on close: an apply panicked");
        } else if let Err(error) = self.flush_all() {
            tracing::error!("failed to flush the overlay on close: {error:#}");
        }
        // Closing the channel ends the flusher's loop once its flush in flight is done.
        self.writer.get_mut().unwrap_or_else(PoisonError::into_inner).frozen_overlays = None;
        if let Some(thread) = self.flusher_thread.take() {
            if thread.join().is_err() {
                tracing::error!("the flusher thread panicked");
            }
        }
    }
}

/// Where a tx sits in the log and the times it folds at.
#[derive(Clone, Copy)]
struct TxAt<'e> {
    first: Seqno,
    last: Seqno,
    /// The batch's envelope (its logged time, its principal).
    envelope: &'e Envelope,
    /// "Now" after it: the later of the logged time and the last applied batch's.
    now_ms: u64,
}

/// Every error a tx's input can cause, found before it changes anything: a vector of another
/// dimension, a stream name too long for its keys.
fn check_tx(ops: &[FoldRecords], dimension: u32) -> Result<(), Error> {
    for op in ops {
        match op {
            FoldRecords::Other(Records::ItemEmbedding { item, vector })
                if vector.len() != dimension as usize =>
            {
                return Err(Error::EmbeddingDimension {
                    item: *item,
                    expected: dimension,
                    got: vector.len(),
                });
            }
            FoldRecords::Other(
                Records::StreamEvents { stream, .. }
                | Records::StreamControl(
                    StreamControl::SaveOffset { stream, .. } | StreamControl::Trim { stream, .. },
                ),
            ) if stream.len() > crate::streams::STREAM_NAME_BYTES_MAX => {
                return Err(Error::Corrupt {
                    keyspace: "streams",
                    reason: format!("stream name of {} bytes", stream.len()),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether a freeze that finds a flush in flight is an apply waiting (counted as backpressure) or
/// a checkpoint, digest or close.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Backpressure,
    Flush,
}

impl State {
    /// The overlays as reads see them.
    fn view(&self) -> OverlayView<'_> {
        OverlayView { active: &self.overlay, frozen: self.frozen.as_deref().map(|frozen| &frozen.overlay) }
    }

    /// Called by the flusher once fjall holds `flushed`: reads stop consulting it.
    fn retire(&mut self, flushed: &Arc<FrozenOverlay>) {
        if self.frozen.as_ref().is_some_and(|frozen| Arc::ptr_eq(frozen, flushed)) {
            self.frozen = None;
        }
    }
}

/// Estimated bytes of one dirty counter key: the key in memory now, and its share of the fjall
/// entry written at flush (many signals share one counter).
/// How long [`TidalDb::flush_tables`] waits for fjall's flush worker when fjall reports no fault:
/// a disk that neither writes nor fails (a hung device) must not hold a node's shutdown forever. A
/// healthy flush of the checkpointer's byte bound (16 MiB of memtables) takes well under a second.
pub const FLUSH_TABLES_WAIT_MAX: Duration = Duration::from_secs(60);

/// How often [`TidalDb::flush_tables`] looks at the sealed memtables (fjall's own wait polls as often).
const FLUSH_TABLES_POLL: Duration = Duration::from_millis(10);

const DIRTY_KEY_BYTES: usize = 16;

// Reads run on many threads beside the applier: the engine must stay Send + Sync.
const _: () = {
    fn assert_send_sync<T: Send + Sync>() {}
    let _ = assert_send_sync::<TidalDb>;
};

/// Signal batches of at least this many events fold their scores and their profiles on two
/// threads (experiments/047): below it the hand-over costs more than it saves.
const PARALLEL_FOLD_EVENTS_MIN: usize = 256;

impl TidalDb {
    /// Runs `here` on this thread and `there` on the fold helper at the same time if there is one
    /// and the batch of `events` is large enough, else one after the other here: the two halves of
    /// a signal fold (experiments/047). A panic in either is resumed here.
    fn fold_in_two<A, B: Send>(
        &self,
        events: usize,
        here: impl FnOnce() -> A,
        there: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        if events < PARALLEL_FOLD_EVENTS_MIN {
            return (here(), there());
        }
        let helper = self.fold_helper.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(helper) = helper.as_ref() else {
            return (here(), there());
        };
        let mut theirs = None;
        let mut ours = None;
        helper.in_place_scope(|scope| {
            scope.spawn(|_| theirs = Some(there()));
            ours = Some(here());
        });
        (
            ours.expect("the scope ran this thread's half"),
            theirs.expect("the scope ends after the helper's half"),
        )
    }
}

fn start_fold_helper() -> Option<rayon_core::ThreadPool> {
    rayon_core::ThreadPoolBuilder::new()
        .num_threads(1)
        .thread_name(|_| "tidal-fold".into())
        .build()
        .inspect_err(|error| tracing::warn!("no fold helper thread, folding on one: {error}"))
        .ok()
}

fn add_signed(counter: &AtomicU64, delta: i64) {
    if delta >= 0 {
        counter.fetch_add(delta as u64, Ordering::Relaxed);
    } else {
        counter.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
    }
}

fn corrupt(keyspace: &'static str, reason: &str) -> Error {
    Error::Corrupt { keyspace, reason: reason.into() }
}

/// The item and user counts at fjall's applied seqno: the ones the last flush stored with it
/// (decisions/048), else counted, key by key (a data dir from before them, in the middle of a
/// snapshot install, or last flushed by a build that did not store them).
fn stored_counts(stores: &Stores) -> Result<(u64, u64), Error> {
    let applied = Seqno(meta_u64(stores, keys::META_APPLIED_SEQNO)?);
    match stores.local.get(keys::LOCAL_COUNTS)? {
        Some(value) => {
            let (seqno, items, users) = keys::split_counts_value(&value)
                .ok_or_else(|| corrupt("local", "counts are not 24 bytes"))?;
            if seqno == applied {
                return Ok((items, users));
            }
            tracing::info!(%seqno, %applied, "stored counts are not at the applied seqno: counting items and users");
        }
        // A new database (or one whose first snapshot install did not complete): nothing to say.
        None if applied == Seqno::ZERO => {}
        None => tracing::info!(%applied, "no stored counts: counting items and users"),
    }
    Ok((stores.items.len()? as u64, stores.profiles.len()? as u64))
}

fn meta_u64(stores: &Stores, key: &[u8]) -> Result<u64, Error> {
    match stores.meta.get(key)? {
        None => Ok(0),
        Some(bytes) => keys::u64_value(&bytes).ok_or_else(|| corrupt("meta", "not a u64")),
    }
}

/// The engine's on-disk layout: 2 since trending scores and counters are stored in trend blocks
/// (decisions/070); 1 (no key) before.
const LAYOUT: u32 = 2;

/// Bytes of old-layout entries one batch of the layout migration moves.
const MIGRATION_BATCH_BYTES: usize = 4 << 20;

/// Refuses a data dir of a later layout, and moves one of the old layout into trend blocks
/// (resuming a migration a crash cut short), then records the layout.
fn migrate_layout(stores: &Stores) -> Result<(), Error> {
    let stored = match stores.local.get(keys::LOCAL_LAYOUT)? {
        Some(value) => <[u8; 4]>::try_from(&*value)
            .map(u32::from_le_bytes)
            .map_err(|_| corrupt("local", "layout is not a u32"))?,
        None => 1,
    };
    if stored > LAYOUT {
        return Err(Error::Config {
            reason: format!("the data dir has engine layout {stored}; this build reads up to {LAYOUT}"),
        });
    }
    if stored < LAYOUT {
        let started = Instant::now();
        let moved = trend_blocks::migrate_legacy(stores, MIGRATION_BATCH_BYTES, None)?;
        stores.local.insert(keys::LOCAL_LAYOUT, LAYOUT.to_le_bytes())?;
        trend_blocks::drop_legacy(stores)?;
        stores.database.persist(PersistMode::SyncAll)?;
        tracing::info!(
            items = moved.items,
            batches = moved.batches,
            seconds = started.elapsed().as_secs_f64(),
            "moved trending scores and counters into trend blocks (engine layout {LAYOUT})"
        );
    } else if trend_blocks::holds_legacy(stores) {
        // A crash after the layout was recorded and before the old keyspaces were cleared.
        trend_blocks::drop_legacy(stores)?;
        stores.database.persist(PersistMode::SyncAll)?;
        tracing::info!("cleared the old layout's trending scores and counters (engine layout {LAYOUT})");
    }
    Ok(())
}

/// Rebuilds what memory holds of fjall's state: the index (embeddings, trending scores) and the
/// counters. Nothing writes fjall meanwhile (an open, or a reload with the applier and the flusher
/// held).
pub(crate) fn load_memory(stores: &Stores, config: &EngineConfig) -> Result<(FeedIndex, Counters), Error> {
    let dimension = config.dimension as usize;
    let mut index = FeedIndex::new(dimension);
    for guard in stores.embeddings.iter() {
        let (key, value) = guard.into_inner()?;
        let item = keys::item_of_key(&key).ok_or_else(|| corrupt("embeddings", "malformed key"))?;
        let (_, bytes) =
            keys::split_seqno_value(&value).ok_or_else(|| corrupt("embeddings", "short value"))?;
        let vector =
            keys::f32s_from_bytes(bytes, dimension).ok_or_else(|| corrupt("embeddings", "wrong length"))?;
        index.set_embedding(item, &vector);
    }
    let mut counters = Counters::default();
    for guard in stores.trend_blocks.iter() {
        let (key, value) = guard.into_inner()?;
        trend_blocks::parse_block::<Error>(&key, &value, |item, trend, counts| {
            index.set_trend(item, trend);
            for (kind, count) in counts {
                counters.load_count(&mut index, item, kind, *count)?;
            }
            Ok(())
        })?;
    }
    // The centroids are log-derived state: a node without the approximate index keeps them (they
    // are in the digest) but does not build the lists.
    if let Some(value) = stores.meta.get(keys::META_ANN_CENTROIDS)? {
        if config.ann_lists > 0 {
            let centroids = crate::ann_index::decode_centroids(&value, dimension)?;
            index.install_ann(centroids, config.half_life_ms);
        }
    }
    Ok((index, counters))
}
