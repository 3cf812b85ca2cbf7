//! A single Tidal node: the WAL, the engine, the applier, and the write path that ties them.
//!
//! Write path: the handler encodes one payload (one client write = one batch) and submits it to the
//! WAL's group-commit writer, which assigns seqnos, stamps the logged time, writes and fsyncs. After
//! the fsync the writer hands the batches to the applier thread (through `ApplyFeed`), which folds
//! them into the engine through the ONE apply path and publishes the applied frontier. A write is
//! acknowledged once its last seqno is applied, so a client that got `{"seqno": N}` can read it back
//! here at once.
//!
//! Delicate:
//! - Nothing is acknowledged before its fsync: the WAL calls completions only after it.
//! - Storage faults are fatal for the node (decisions/059): a poisoned WAL, a stopped applier, a
//!   failed engine flush or fjall worker, a failed vote fsync or a stopped openraft raise the one
//!   [`Fatal`] state. The replica then leaves office, waiting writes fail with 503, `/healthz` and
//!   `/readyz` fail, and `run_on` exits with the reason. A restart replays the WAL from the
//!   engine's applied seqno.
//! - Memory is bounded: in-flight write bytes and requests are capped by semaphores (writers wait,
//!   then get 503 `overloaded`), the WAL queue is capped, and the apply channel is bounded (the writer
//!   thread waits for the applier rather than buffering without limit).
//! - Idempotency: a key is registered as in flight BEFORE the engine's table is consulted, and the
//!   registration is removed only after the write is applied, so two racing requests with one key
//!   never both write. The write runs in its own task, so a client hanging up does not cancel it.

use crate::auth::Principal;
use crate::config::ServeConfig;
use crate::error::ApiError;
use anyhow::Context;
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidal_cluster::replica::WriteTicket;
use tidal_cluster::{
    AppliedWaiter, Applier, ApplierSender, Fatal, FatalReason, FatalSource, Reached, Replica,
};
use tidal_core::{Envelope, Records, TidalDb};
use tidal_types::{ErrorCode, Seqno, Term};
use tidal_wal::{AppendRequest, SubmitError, Wal};
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};

pub mod checkpoints;
mod identity;
mod open;
mod replay;

/// Most writes submitted and not yet acknowledged; matches the WAL queue bound with room to spare.
const WRITES_INFLIGHT_MAX: usize = 2048;
/// How long a write waits for room in the in-flight budget before it is refused with `overloaded`.
const WRITE_ADMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an admitted write may wait to be committed and applied before it is answered 503 with
/// its outcome unknown (the client retries with its Idempotency-Key): longer than a failover, so a
/// write that a new leader's office would commit is not given up too soon.
const WRITE_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A leader's office as a write watches it: `Some(term)` while this node serves as leader.
type Office = watch::Receiver<Option<Term>>;

/// Outcome of a finished write as seen by requests waiting on the same idempotency key.
type WriteOutcome = Result<u64, ApiError>;

struct InFlight {
    fingerprint: [u8; 32],
    done: watch::Receiver<Option<WriteOutcome>>,
}

/// How a write's one wake-up ends.
enum Written {
    /// Durable (committed, in a cluster) and applied through this, its last seqno.
    Applied(Seqno),
    /// The WAL append failed (the writer is poisoned; the node stops taking writes).
    AppendFailed(String),
    /// The applier stopped before the write was applied: its outcome is unknown.
    ApplierStopped,
    /// The log was cut below the write (it lost office and its suffix was replaced): unknown.
    Cut,
}

/// A write registered with the applied frontier's waiters once its append completed.
struct WriteWaiter {
    tx: oneshot::Sender<Written>,
    last: Seqno,
}

impl AppliedWaiter for WriteWaiter {
    fn reached(self: Box<Self>, reached: Reached) {
        let _ = self.tx.send(match reached {
            Reached::Applied(_) => Written::Applied(self.last),
            Reached::Cut => Written::Cut,
            Reached::Stopped => Written::ApplierStopped,
        });
    }

    fn abandoned(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Called once a write is handed to the WAL ([`Node::write_then`]).
pub type Submitted = Box<dyn FnOnce() + Send>;

/// A running node.
pub struct Node {
    config: ServeConfig,
    wal: Wal,
    db: Arc<TidalDb>,
    applied: watch::Receiver<Seqno>,
    applier: Applier,
    applier_sender: Mutex<Option<ApplierSender>>,
    write_bytes: Arc<Semaphore>,
    write_slots: Arc<Semaphore>,
    inflight: Mutex<HashMap<(String, String), InFlight>>,
    /// Engine checkpoint: WAL purge never passes it.
    checkpoint_seqno: AtomicU64,
    /// What the checkpointer decides by (issue 43).
    checkpoints: checkpoints::Checkpoints,
    replica: Option<Arc<Replica>>,
    /// The control plane's store (asked for a poisoned database; the replica holds it too).
    raft_store: tidal_core::RaftStore,
    /// The node's one fatal state (see the module doc).
    fatal: Fatal,
    started: Instant,
    _lock: File,
    /// Disconnects once this node (its data dir lock above) and its engine are both gone; see
    /// [`Node::take_release`].
    release: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    _released: std::sync::mpsc::Sender<()>,
}

/// What startup replay did.
#[derive(Debug, Clone, Copy)]
pub struct ReplayReport {
    /// Batches applied.
    pub batches: u64,
    /// Encoded bytes applied.
    pub bytes: u64,
    /// Wall time of the replay.
    pub elapsed: Duration,
    /// Wall time of opening the engine (fjall), before the WAL.
    pub engine_open: Duration,
    /// Wall time of the WAL's recovery (reading and verifying every retained segment).
    pub wal_recovery: Duration,
}

impl Node {
    /// Opens the data directory: recovers the WAL, opens the engine, replays the WAL past the
    /// engine's applied seqno, and starts the applier (and, for a cluster member, the replica).
    pub fn open(config: ServeConfig) -> anyhow::Result<(Arc<Node>, ReplayReport)> {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("create data dir {}", config.data_dir.display()))?;
        let lock = open::lock_data_dir(&config.data_dir)?;
        // Another node's WAL or engine is refused before anything is written to it (decisions/063).
        let identity = identity::check_wal(&config)?;
        let open::Storage { db, recovered, engine_open, wal_recovery } = open::open_storage(&config)?;
        identity::check_engine_and_record(identity, &db, &config.data_dir)?;
        let (applier, sender) =
            Applier::spawn_probed(db.clone(), config.io.apply_probe.clone()).context("start applier")?;
        let cluster = open::cluster_parts(&config, &db, &sender)?;
        let fatal = Fatal::new();
        let (wal, recovery) = open::start_wal(&config, recovered, cluster.as_ref(), &sender, &db, &fatal)?;
        tracing::info!(
            durable = %recovery.durable, segments = recovery.segments, batches = recovery.batches,
            mb = recovery.bytes as f64 / 1e6, seconds = wal_recovery.as_secs_f64(),
            engine_open_seconds = engine_open.as_secs_f64(), "WAL recovered"
        );
        open::finish_pending_install(&config, &wal, &db)?;
        let raft_store = tidal_core::RaftStore::open_dir(&config.data_dir.join("raft"))
            .context("open the control plane's store")?
            .with_faults(config.io.raft_faults.clone());
        let mut replay = open::catch_up_engine(&wal, &db, &sender, &raft_store, cluster.is_some())?;
        (replay.engine_open, replay.wal_recovery) = (engine_open, wal_recovery);
        open::lower_background_priority(&db, config.engine_background_nice);
        wal.set_term(std::cmp::max(std::cmp::max(recovery.last_term, wal.last_position().term), Term(1)));
        let replica = cluster
            .map(|parts| {
                open::start_replica(parts, &config, &wal, &db, &raft_store, applier.applied(), &fatal)
            })
            .transpose()?;
        // Replay applied directly; tell the applier where the engine now is.
        sender.commit(db.applied_seqno());
        let checkpoint = db.applied_seqno().get();
        let checkpoints = checkpoints::Checkpoints::new(wal.stats().bytes);
        let (released, release) = std::sync::mpsc::channel();
        db.watch_close(released.clone());
        if let Some(watch) = &config.io.close_watch {
            db.watch_close(watch.clone());
        }
        let node = Node {
            write_bytes: Arc::new(Semaphore::new(config.write_inflight_bytes_max)),
            write_slots: Arc::new(Semaphore::new(WRITES_INFLIGHT_MAX)),
            config,
            wal,
            db,
            applied: applier.applied(),
            applier,
            applier_sender: Mutex::new(Some(sender)),
            inflight: Mutex::new(HashMap::new()),
            checkpoint_seqno: AtomicU64::new(checkpoint),
            checkpoints,
            replica,
            raft_store,
            fatal,
            started: Instant::now(),
            _lock: lock,
            release: Mutex::new(Some(release)),
            _released: released,
        };
        Ok((Arc::new(node), replay))
    }

    /// A receiver that disconnects once this node and its engine are dropped, i.e. the data dir's
    /// lock and fjall's are released (background tasks that still hold a clone keep them). Taken
    /// once, by whoever shuts the node down.
    pub fn take_release(&self) -> Option<std::sync::mpsc::Receiver<()>> {
        self.release.lock().expect("release lock is never held across a panic").take()
    }

    /// The configuration.
    pub fn config(&self) -> &ServeConfig {
        &self.config
    }

    /// The engine, for reads.
    pub fn db(&self) -> &TidalDb {
        &self.db
    }

    /// The replication side, when this node is a cluster member.
    pub fn replica(&self) -> Option<&Arc<Replica>> {
        self.replica.as_ref()
    }

    /// The WAL, for stats.
    pub fn wal(&self) -> &Wal {
        &self.wal
    }

    /// Writes appended and waiting to be committed (in a cluster) and applied.
    pub fn writes_waiting(&self) -> usize {
        self.applier.waiters().waiting()
    }

    /// Applied frontier.
    pub fn applied_seqno(&self) -> u64 {
        self.applied.borrow().get()
    }

    /// The fatal fault that stopped the node, if any. Looks at the sources that cost nothing to
    /// ask (the WAL's poisoned flag, the applier) and raises what it finds; the others are asked by
    /// [`Node::check_fatal`], periodically.
    pub fn fatal(&self) -> Option<FatalReason> {
        if self.fatal.is_raised() {
            return self.fatal.get();
        }
        if self.wal.is_poisoned() {
            let why = self.wal.poison_reason().unwrap_or_else(|| "a write or fsync failed".into());
            self.fatal.raise(FatalSource::Wal, format!("the WAL is poisoned: {why}"));
        } else if let Some(why) = self.applier.stopped() {
            self.fatal.raise(FatalSource::Applier, why);
        }
        self.fatal.get()
    }

    /// [`Node::fatal`], and also asks the engine (a failed background flush, a poisoned fjall) and
    /// the control plane's store (a poisoned fjall). Blocking (it takes fjall's journal lock for a
    /// moment): run it off the async workers.
    pub fn check_fatal(&self) -> Option<FatalReason> {
        if let Some(reason) = self.fatal() {
            return Some(reason);
        }
        if let Some(why) = self.db.fault() {
            self.fatal.raise(FatalSource::Engine, why);
        } else if let Some(why) = self.raft_store.fault() {
            self.fatal.raise(FatalSource::ControlPlane, format!("the control plane's store: {why}"));
        }
        self.fatal.get()
    }

    /// The node's fatal state (watch it to learn when the node must stop).
    pub fn fatal_state(&self) -> &Fatal {
        &self.fatal
    }

    /// Seconds since start.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Last engine checkpoint.
    pub fn checkpoint_seqno(&self) -> u64 {
        self.checkpoint_seqno.load(Ordering::Relaxed)
    }

    /// Writes one batch and returns its last seqno once it is durable and applied.
    pub async fn write(
        self: &Arc<Self>,
        principal: &Principal,
        idempotency_key: Option<String>,
        records: Records,
    ) -> Result<u64, ApiError> {
        self.write_then(principal, idempotency_key, records, None).await
    }

    /// [`Node::write`], calling `submitted` once the batch is handed to the WAL (sequenced, not
    /// yet durable): a write submitted after that gets a later seqno.
    pub async fn write_then(
        self: &Arc<Self>,
        principal: &Principal,
        idempotency_key: Option<String>,
        records: Records,
        submitted: Option<Submitted>,
    ) -> Result<u64, ApiError> {
        let envelope = Envelope {
            time_ms: 0,
            principal: principal.name.clone(),
            idempotency_key: idempotency_key.clone().unwrap_or_default(),
        };
        let encoded = tidal_core::encode_payload(&envelope, &records);
        let request =
            AppendRequest { kind: encoded.kind, event_count: encoded.event_count, payload: encoded.payload };
        let node = self.clone();
        let principal = principal.name.clone();
        // The whole write runs in its own task: a client hanging up must not cancel it half way.
        tokio::spawn(async move {
            match idempotency_key {
                None => node.write_inner(request, submitted).await,
                Some(key) => node.write_idempotent(principal, key, request, submitted).await,
            }
        })
        .await
        .unwrap_or_else(|error| Err(ApiError::internal(format!("write task failed: {error}"))))
    }

    async fn write_idempotent(
        self: Arc<Self>,
        principal: String,
        key: String,
        request: AppendRequest,
        submitted: Option<Submitted>,
    ) -> Result<u64, ApiError> {
        let fingerprint = tidal_core::records_fingerprint(&request.payload);
        let slot = (principal, key);
        let done_tx = loop {
            let waiting = {
                let mut inflight = self.inflight.lock().expect("inflight lock is never held across a panic");
                match inflight.get(&slot) {
                    Some(entry) => (entry.fingerprint, entry.done.clone()),
                    None => {
                        let (done_tx, done_rx) = watch::channel(None);
                        inflight.insert(slot.clone(), InFlight { fingerprint, done: done_rx });
                        break done_tx;
                    }
                }
            };
            let (other_fingerprint, mut done) = waiting;
            if other_fingerprint != fingerprint {
                return Err(idempotency_conflict());
            }
            // The first attempt is in flight: its result is ours.
            let outcome =
                done.wait_for(|outcome| outcome.is_some()).await.ok().and_then(|outcome| outcome.clone());
            if let Some(result) = outcome {
                return result;
            }
            // The first attempt ended without an outcome (its guard removed the entry): try again.
        };
        let mut guard = InFlightGuard { node: &self, slot: &slot, armed: true };
        // Registered first, looked up second: a write that finished before we registered is in the
        // engine's table by now (entries are removed only after apply).
        let result = match self.db.idempotency_lookup(&slot.0, &slot.1) {
            Err(error) => Err(ApiError::from(error)),
            Ok(Some(record)) if record.fingerprint == fingerprint => Ok(record.last_seqno.get()),
            Ok(Some(_)) => Err(idempotency_conflict()),
            Ok(None) => match self.clone().write_waiting(request, submitted).await {
                Ok(last) => Ok(last),
                Err(Unanswered { error, pending: None }) => Err(error),
                Err(Unanswered { error, pending: Some(pending) }) => {
                    // Not committed in time, but still in our log under our office: it may yet
                    // commit. Until it does (or is cut, or the office ends), the key stays in flight
                    // and every retry is told the outcome is unknown; a retry that wrote again
                    // would put the write in the log twice.
                    guard.armed = false;
                    self.clone().hold_until_resolved(slot.clone(), pending);
                    Err(error)
                }
            },
        };
        let _ = done_tx.send(Some(result.clone()));
        result
    }

    /// Keeps `slot` in flight until `pending` resolves: the write is applied or refused, or this
    /// node's office ends (a retry then goes to the next leader, whose log decides).
    fn hold_until_resolved(self: Arc<Self>, slot: (String, String), pending: Pending) {
        let Pending { mut written, office } = pending;
        tokio::spawn(async move {
            match office {
                None => drop((&mut written).await),
                Some(mut office) => tokio::select! {
                    _ = &mut written => {}
                    _ = office.wait_for(|term| term.is_none()) => {}
                },
            }
            drop(InFlightGuard { node: &self, slot: &slot, armed: true });
        });
    }

    /// One write, admitted, appended, committed (in a cluster) and applied, or refused.
    async fn write_inner(
        self: Arc<Self>,
        request: AppendRequest,
        submitted: Option<Submitted>,
    ) -> Result<u64, ApiError> {
        self.write_waiting(request, submitted).await.map_err(|unanswered| unanswered.error)
    }

    /// [`Node::write_inner`], whose error says what still waits for a write not committed in time.
    async fn write_waiting(
        self: Arc<Self>,
        request: AppendRequest,
        submitted: Option<Submitted>,
    ) -> Result<u64, Unanswered> {
        let _admitted = self.admit(request.payload.len()).await.map_err(Unanswered::from)?;
        if let Some(fatal) = self.fatal() {
            return Err(ApiError::unavailable(ErrorCode::NotReady, fatal.to_string()).into());
        }
        let (mut office, ticket) = self.write_office()?;
        let mut written = self.submit(request, ticket)?;
        if let Some(submitted) = submitted {
            submitted();
        }
        match wait_written(&mut written, office.as_mut()).await {
            Ok(written) => Ok(self.answer(written)?),
            Err(WaitFailed::OfficeLost(error)) => Err(error.into()),
            Err(WaitFailed::TimedOut(error)) => {
                Err(Unanswered { error, pending: Some(Pending { written, office }) })
            }
        }
    }

    /// Waits, within [`WRITE_ADMIT_TIMEOUT`], for room in the in-flight budget: a slot and the
    /// payload's bytes, held until the write is answered.
    async fn admit(
        &self,
        payload_bytes: usize,
    ) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), ApiError> {
        let bytes = u32::try_from(payload_bytes.max(1)).unwrap_or(u32::MAX);
        let admit = async {
            let slot = self.write_slots.clone().acquire_owned().await;
            let bytes = self.write_bytes.clone().acquire_many_owned(bytes).await;
            (slot, bytes)
        };
        let (Ok(slot), Ok(bytes)) = tokio::time::timeout(WRITE_ADMIT_TIMEOUT, admit)
            .await
            .map_err(|_| ApiError::unavailable(ErrorCode::Overloaded, "write queue is full; retry later"))?
        else {
            return Err(ApiError::internal("write admission closed"));
        };
        Ok((slot, bytes))
    }

    /// A cluster member writes only while it serves as leader: the office the write watches while
    /// it waits (losing it fails the wait: the outcome is unknown, the client retries with its
    /// Idempotency-Key) and the ticket a leadership transfer waits for. Nothing on a single node.
    fn write_office(&self) -> Result<(Option<Office>, Option<WriteTicket>), ApiError> {
        let Some(replica) = &self.replica else { return Ok((None, None)) };
        let office = replica.serving();
        if office.borrow().is_none() {
            return Err(not_leader(replica));
        }
        let ticket = replica.admit_write().map_err(|target| {
            ApiError::unavailable(
                ErrorCode::NotReady,
                format!("leadership is moving to node {target}; retry in a moment"),
            )
        })?;
        Ok((Some(office), Some(ticket)))
    }

    /// Hands the write to the WAL. One wake-up per write (decisions/028): the WAL completion (on the
    /// writer thread) ends the admission and registers the write with the applied frontier's
    /// waiters, which wake the returned receiver once the write is applied; an append error wakes
    /// it from the completion.
    fn submit(
        &self,
        request: AppendRequest,
        ticket: Option<WriteTicket>,
    ) -> Result<oneshot::Receiver<Written>, ApiError> {
        let (tx, rx) = oneshot::channel();
        let waiters = self.applier.waiters();
        let done: tidal_wal::Completion = Box::new(move |result| {
            // Appended: a leadership transfer waiting for admitted writes may go on.
            drop(ticket);
            match result {
                Ok(appended) => {
                    waiters.on_applied(appended.last, Box::new(WriteWaiter { tx, last: appended.last }))
                }
                Err(error) => drop(tx.send(Written::AppendFailed(format!("{error:#}")))),
            }
        });
        match self.wal.submit(request, done) {
            Ok(()) => Ok(rx),
            Err(SubmitError::QueueFull(_)) => {
                Err(ApiError::unavailable(ErrorCode::Overloaded, "WAL queue is full; retry later"))
            }
            Err(SubmitError::Invalid(why)) => Err(ApiError::internal(format!("invalid append: {why}"))),
            Err(error) => Err(ApiError::unavailable(ErrorCode::NotReady, format!("WAL refused: {error:?}"))),
        }
    }

    /// The answer to a write that woke with `written`.
    fn answer(&self, written: Result<Written, oneshot::error::RecvError>) -> Result<u64, ApiError> {
        match written {
            Ok(Written::Applied(last)) => Ok(last.get()),
            Ok(Written::AppendFailed(error)) => {
                tracing::error!("failed to append: {error}");
                Err(ApiError::unavailable(ErrorCode::NotReady, format!("WAL append failed: {error}")))
            }
            Ok(Written::ApplierStopped) => Err(ApiError::unavailable(
                ErrorCode::NotReady,
                self.fatal().map_or_else(|| "applier stopped".into(), |fatal| fatal.to_string()),
            )),
            Ok(Written::Cut) => Err(ApiError::unavailable(
                ErrorCode::NotReady,
                "this node's log was cut below the write (it lost leadership); the outcome is unknown, retry with the same Idempotency-Key",
            )),
            Err(_) => Err(ApiError::internal("WAL writer stopped; the outcome is unknown")),
        }
    }

    /// The applied frontier as a watch: a stream subscriber marks it seen, then reads, then waits
    /// for a change, so an apply between its read and its wait still wakes it.
    pub fn applied_watch(&self) -> watch::Receiver<Seqno> {
        self.applied.clone()
    }

    /// Waits until the applied frontier reaches `seqno`; `timeout` None waits as long as it takes
    /// (writes), else fails with 504 `not_caught_up`.
    pub async fn wait_applied(&self, seqno: u64, timeout: Option<Duration>) -> Result<u64, ApiError> {
        let mut applied = self.applied.clone();
        let wait = applied.wait_for(|applied| applied.get() >= seqno);
        let reached = match timeout {
            None => wait.await.map(|value| value.get()),
            Some(timeout) => match tokio::time::timeout(timeout, wait).await {
                Ok(reached) => reached.map(|value| value.get()),
                Err(_) => {
                    return Err(ApiError::new(
                        axum::http::StatusCode::GATEWAY_TIMEOUT,
                        ErrorCode::NotCaughtUp,
                        format!("applied seqno is {} after waiting for {seqno}", self.applied_seqno()),
                    ))
                }
            },
        };
        reached.map_err(|_| {
            ApiError::unavailable(
                ErrorCode::NotReady,
                self.fatal().map_or_else(|| "applier stopped".into(), |fatal| fatal.to_string()),
            )
        })
    }

    /// What lies past the last checkpoint, for [`checkpoints::checkpoint_due`]. Takes fjall's and
    /// the WAL's locks for a moment: not on an async worker.
    pub fn past_checkpoint(&self, since: Duration) -> checkpoints::PastCheckpoint {
        checkpoints::PastCheckpoint {
            since,
            engine_bytes: self.db.memtable_bytes(),
            wal_bytes: self.checkpoints.wal_bytes_since(self.wal.stats().bytes),
        }
    }

    /// The checkpoint bookkeeping (counts by reason).
    pub fn checkpoints(&self) -> &checkpoints::Checkpoints {
        &self.checkpoints
    }

    /// Checkpoints the engine and purges WAL segments that are below the checkpoint and beyond the
    /// retention budget; for [`checkpoints::CheckpointReason::EngineBytes`] also writes fjall's
    /// memtables into tables, so what a crashed node's open must insert again from fjall's journal
    /// stays under the bound.
    /// Blocking: run it off the async workers.
    pub fn checkpoint_and_purge(&self, reason: checkpoints::CheckpointReason) -> anyhow::Result<()> {
        // Counted before the checkpoint: what the applier had not applied yet is not in it, so the
        // next count misses at most the applier's backlog (bounded by the overlay), never more.
        let wal_bytes = self.wal.stats().bytes;
        let checkpoint = self.db.checkpoint().context("checkpoint engine")?;
        self.checkpoint_seqno.store(checkpoint.get(), Ordering::Relaxed);
        if reason == checkpoints::CheckpointReason::EngineBytes {
            self.db.flush_tables().context("write the engine's memtables into tables")?;
        }
        self.checkpoints.taken(reason, wal_bytes);
        let segments = self.wal.list_segments().context("list WAL segments")?;
        // Newest first: keep segments until the retention budget is spent; the oldest kept segment's
        // first seqno is the horizon, never past the checkpoint.
        let mut kept_bytes = 0u64;
        let mut horizon = None;
        for segment in segments.iter().rev() {
            kept_bytes += segment.bytes;
            if kept_bytes > self.config.wal_retention_bytes {
                break;
            }
            horizon = Some(segment.first_seqno);
        }
        if let Some(horizon) = horizon {
            let mut horizon = std::cmp::min(horizon, checkpoint.next());
            if let Some(replica) = &self.replica {
                // A snapshot being served (or just served) keeps its seqno + 1 in the WAL, so its
                // follower can continue from the log.
                horizon = replica.snapshot_pins().purge_horizon(horizon, Instant::now());
            }
            let report = self.wal.purge_below(horizon).context("purge WAL")?;
            tracing::debug!(?report, "WAL purge");
        }
        Ok(())
    }

    /// After a fatal fault: stops taking writes, drains the WAL (a poisoned one fails what is
    /// queued) and waits for the applier, but writes nothing more to the engine (no checkpoint, no
    /// table flush: the disk just failed; a restart replays the WAL). Idempotent.
    pub fn stop_after_fatal(&self) {
        self.wal.shutdown();
        let sender = self.applier_sender.lock().expect("sender lock is never held across a panic").take();
        if let Some(sender) = sender {
            self.applier.join(sender);
        }
    }

    /// Stops taking writes, drains the WAL, waits for the applier, checkpoints. Idempotent.
    pub fn shutdown(&self) {
        self.wal.shutdown();
        // The writer thread owned the hook's sender; with it and ours gone the applier drains and exits.
        let sender = self.applier_sender.lock().expect("sender lock is never held across a panic").take();
        if let Some(sender) = sender {
            self.applier.join(sender);
        }
        match self.db.checkpoint() {
            Ok(seqno) => tracing::info!(%seqno, "engine checkpointed at shutdown"),
            Err(error) => {
                tracing::error!("failed to checkpoint at shutdown: {error:#}");
                return;
            }
        }
        // So that the next open has no journal to replay (experiments/050).
        let started = Instant::now();
        match self.db.flush_tables() {
            Ok(()) => tracing::info!(elapsed = ?started.elapsed(), "engine memtables written to tables"),
            Err(error) => tracing::warn!("could not write the engine's memtables to tables at shutdown (the next open replays fjall's journal): {error:#}"),
        }
    }
}

/// Waits for a submitted write's wake-up. Every write gets an answer within a bound
/// (decisions/057): a leader cut off from a majority (or past its lease) would otherwise leave it
/// hanging for as long as that lasts; and a leader that loses `office` first stops waiting.
async fn wait_written(
    written: &mut oneshot::Receiver<Written>,
    office: Option<&mut Office>,
) -> Result<Result<Written, oneshot::error::RecvError>, WaitFailed> {
    let waiting = async {
        match office {
            None => Some(written.await),
            Some(office) => {
                let lost = office.wait_for(|term| term.is_none());
                tokio::select! {
                    biased;
                    written = &mut *written => Some(written),
                    // Lost office before this write was committed and applied here.
                    _ = lost => written.try_recv().ok().map(Ok),
                }
            }
        }
    };
    match tokio::time::timeout(WRITE_ANSWER_TIMEOUT, waiting).await {
        Ok(Some(written)) => Ok(written),
        Ok(None) => Err(WaitFailed::OfficeLost(ApiError::unavailable(
            ErrorCode::NotReady,
            "this node lost leadership before the write committed; the outcome is unknown, retry with the same Idempotency-Key",
        ))),
        Err(_) => Err(WaitFailed::TimedOut(ApiError::unavailable(
            ErrorCode::NotReady,
            format!("the write was not committed within {WRITE_ANSWER_TIMEOUT:?} (no contact with a majority?); the outcome is unknown, retry with the same Idempotency-Key"),
        ))),
    }
}

/// Why [`wait_written`] gave up on a write: either way its outcome is unknown to the client.
enum WaitFailed {
    /// This node lost its office first.
    OfficeLost(ApiError),
    /// Not committed within [`WRITE_ANSWER_TIMEOUT`]; the write is still in our log.
    TimedOut(ApiError),
}

/// What still waits for a write whose answer timed out: its applied notice, and the office it was
/// written under (None on a single node).
struct Pending {
    written: oneshot::Receiver<Written>,
    office: Option<Office>,
}

/// A write's error, with what still waits for it when it may yet commit.
struct Unanswered {
    error: ApiError,
    pending: Option<Pending>,
}

impl From<ApiError> for Unanswered {
    fn from(error: ApiError) -> Unanswered {
        Unanswered { error, pending: None }
    }
}

fn not_leader(replica: &Replica) -> ApiError {
    let hint = match replica.leader() {
        Some(leader) if leader != replica.me() => {
            let http = replica.members().nodes.get(&leader).map_or(String::new(), |node| node.http.clone());
            format!("node {leader} leads (http {http})")
        }
        Some(_) => "this node was elected and is taking office".to_string(),
        None => "no leader is known (an election is under way)".to_string(),
    };
    ApiError::unavailable(ErrorCode::NotReady, format!("this node does not accept writes now: {hint}; retry"))
}

fn idempotency_conflict() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::IdempotencyConflict,
        "this Idempotency-Key was used with a different request",
    )
}

/// Removes an idempotency key's in-flight entry however the write ends, unless disarmed (the
/// entry then outlives the request: [`Node::hold_until_resolved`]).
struct InFlightGuard<'a> {
    node: &'a Node,
    slot: &'a (String, String),
    armed: bool,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.node.inflight.lock().expect("inflight lock is never held across a panic").remove(self.slot);
        }
    }
}
