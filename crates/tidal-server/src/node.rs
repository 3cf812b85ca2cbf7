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
use tidal_cluster::control::LogStore;
use tidal_cluster::{
    AppliedWaiter, Applier, ApplierSender, CommitOnFlush, CommitState, DurableFrontier, Fatal, FatalReason,
    FatalSource, Reached, Replica, ReplicaHook, ReplicaParts, ShipFeed, SnapshotPins, SnapshotSource,
    TermGate,
};
use tidal_core::{DecodedBatch, EngineConfig, Envelope, Records, TidalDb};
use tidal_types::{ErrorCode, Seqno, Term, TermSeqno};
use tidal_wal::{AppendRequest, SubmitError, Wal, WalConfig};
use tokio::sync::{watch, Semaphore};

/// Most writes submitted and not yet acknowledged; matches the WAL queue bound with room to spare.
const WRITES_INFLIGHT_MAX: usize = 2048;
/// How long a write waits for room in the in-flight budget before it is refused with `overloaded`.
const WRITE_ADMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an admitted write may wait to be committed and applied before it is answered 503 with
/// its outcome unknown (the client retries with its Idempotency-Key): longer than a failover, so a
/// write that a new leader's office would commit is not given up too soon.
const WRITE_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

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
    tx: tokio::sync::oneshot::Sender<Written>,
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
    /// engine's applied seqno, and starts the applier.
    pub fn open(config: ServeConfig) -> anyhow::Result<(Arc<Node>, ReplayReport)> {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("create data dir {}", config.data_dir.display()))?;
        let lock = lock_data_dir(&config.data_dir)?;
        let mut engine = engine_config(&config);
        engine.node_actor = (
            config.cluster.as_ref().map_or(1, |membership| membership.me.0),
            incarnation(&config.data_dir).context("read or create the CRDT incarnation")?,
        );
        let mut wal_config = WalConfig::new(config.data_dir.join("wal"));
        wal_config.segment_bytes_max = config.segment_bytes_max;
        wal_config.preallocate_bytes = config.wal_preallocate_bytes;
        // The WAL's recovery (reading and verifying every retained segment) and the engine's open
        // (fjall replaying its journal, one thread) need nothing from each other: they run side by
        // side, and a crashed node that must replay both is back sooner.
        let wal_io = config.io.wal_files.clone();
        let recovering = std::thread::Builder::new()
            .name("tidal-wal-recover".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                (Wal::recover(wal_config, wal_io), started.elapsed())
            })
            .context("start the WAL recovery thread")?;
        let started = std::time::Instant::now();
        let db = TidalDb::open(&config.data_dir.join("state"), engine);
        let engine_open = started.elapsed();
        // Joined before either result is looked at: nothing of this open outlives a failure.
        let (recovered, wal_recovery) =
            recovering.join().map_err(|_| anyhow::anyhow!("the WAL recovery thread panicked"))?;
        let db = Arc::new(db.context("open engine")?);
        let recovered = recovered.context("open WAL")?;
        let (applier, sender) =
            Applier::spawn_probed(db.clone(), config.io.apply_probe.clone()).context("start applier")?;
        // An install interrupted by a crash is finished below, before replay: the engine will then
        // be at the snapshot's seqno, which is where commit bookkeeping starts (the engine itself
        // still reports its half-replaced state's seqno until then).
        let pending_install = tidal_cluster::pending_install_position(&config.data_dir)
            .context("read the snapshot install marker")?;
        let start_applied = pending_install.map_or(db.applied_seqno(), |position| position.seqno);
        // A cluster member's hook also feeds the ship tail and its commit bookkeeping.
        let cluster = config.cluster.as_ref().map(|membership| {
            let voters = membership.spec.nodes.iter().map(|node| node.id).collect();
            let commit = Arc::new(
                CommitState::new(
                    membership.me,
                    voters,
                    membership.spec.durability,
                    start_applied,
                    sender.clone(),
                )
                .with_lease(membership.timing.lease()),
            );
            let feed = ShipFeed::new(
                TermSeqno::default(),
                tidal_cluster::ship_feed::TAIL_BYTES_MAX_DEFAULT,
                tidal_cluster::ship_feed::TAIL_BATCHES_MAX_DEFAULT,
            );
            (membership.clone(), commit, feed)
        });
        // A cluster member applies committed batches before its own fsync (decisions/025); this gate
        // keeps the engine's persisted state behind its durable WAL all the same.
        let durable_gate = DurableFrontier::new();
        let hook: Box<dyn tidal_wal::FlushedHook> = match &cluster {
            None => Box::new(CommitOnFlush(sender.clone())),
            Some((membership, commit, feed)) => Box::new(ReplicaHook::new(
                sender.clone(),
                commit.clone(),
                feed.clone(),
                membership.me,
                durable_gate.clone(),
            )),
        };
        let (wal, recovery) = recovered.start(config.io.wal_clock.clone(), hook).context("open WAL")?;
        // A poisoned WAL is fatal for the node: raised from the thread that poisons it, before the
        // failed writes are answered.
        let fatal = Fatal::new();
        wal.on_poison({
            let fatal = fatal.clone();
            move |reason| {
                fatal.raise(FatalSource::Wal, reason);
            }
        });
        if cluster.is_some() {
            durable_gate.attach(wal.durable_view());
            db.set_durable_gate(durable_gate);
        }
        if let Some(torn) = &recovery.truncated {
            tracing::warn!(?torn, "WAL had a torn tail; truncated");
        }
        tracing::info!(
            durable = %recovery.durable, segments = recovery.segments, batches = recovery.batches,
            mb = recovery.bytes as f64 / 1e6, seconds = wal_recovery.as_secs_f64(),
            engine_open_seconds = engine_open.as_secs_f64(), "WAL recovered"
        );
        // Before anything reads the engine's frontier: finish an interrupted snapshot install (WAL
        // reset + state replacement), or remove what a transfer that never reached its marker left.
        if let Some(report) = tidal_cluster::resume_pending_install(&config.data_dir, &wal, &db)
            .context("resume snapshot install")?
        {
            tracing::info!(position = %report.position, "interrupted snapshot install finished");
        }
        let durable = wal.durable_seqno();
        let applied = db.applied_seqno();
        anyhow::ensure!(
            applied <= durable,
            "engine state is at seqno {applied} but the WAL ends at {durable}: the WAL in {} was lost or replaced; \
             refusing to start (restore the WAL or wipe the data dir)",
            config.data_dir.display()
        );
        // A single node commits what it fsyncs: its whole durable log is committed. A cluster member
        // may hold an uncommitted tail that a new leader will quarantine, so it replays only up to
        // its saved commit hint; the rest is applied as the leader's commit frontier arrives.
        let raft_store = tidal_core::RaftStore::open_dir(&config.data_dir.join("raft"))
            .context("open the control plane's store")?
            .with_faults(config.io.raft_faults.clone());
        let replay_to = match &cluster {
            None => durable,
            Some(_) => std::cmp::min(durable, tidal_cluster::commit_hint(&raft_store)),
        };
        let mut replay = replay(&wal, &db, replay_to)?;
        (replay.engine_open, replay.wal_recovery) = (engine_open, wal_recovery);
        if replay_to < durable {
            // The durable tail past the commit hint waits in the applier until the leader's commit
            // frontier covers it (or a new leader's log quarantines it).
            hand_tail_to_applier(&wal, &sender, db.applied_seqno(), durable)?;
        }
        wal.set_term(std::cmp::max(std::cmp::max(recovery.last_term, wal.last_position().term), Term(1)));
        let replica = match cluster {
            None => None,
            Some((membership, commit, feed)) => {
                feed.reset(wal.last_position());
                commit.advance(db.applied_seqno());
                let term = LogStore::persisted_term(&raft_store)
                    .map_err(|why| anyhow::anyhow!("read the persisted vote: {why}"))?;
                let snapshots =
                    SnapshotSource::new(db.clone(), wal.clone(), &config.data_dir, SnapshotPins::default())
                        .context("snapshot source")?;
                let parts = ReplicaParts {
                    spec: membership.spec,
                    me: membership.me,
                    data_dir: config.data_dir.clone(),
                    store: raft_store.clone(),
                    timing: membership.timing,
                    db: db.clone(),
                    applier: sender.clone(),
                    snapshots: Arc::new(snapshots),
                    connector: config.io.connector.clone(),
                    join: membership.join,
                    fatal: fatal.clone(),
                };
                let replica =
                    Replica::new(parts, wal.clone(), commit, feed, applier.applied(), TermGate::new(term))
                        .map_err(|why| anyhow::anyhow!("cluster: {why}"))?;
                Some(replica)
            }
        };
        // Replay applied directly; tell the applier where the engine now is.
        sender.commit(db.applied_seqno());
        let checkpoint = db.applied_seqno().get();
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
                None => node.write_inner(request).await,
                Some(key) => node.write_idempotent(principal, key, request).await,
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
        let _guard = InFlightGuard { node: &self, slot: &slot };
        // Registered first, looked up second: a write that finished before we registered is in the
        // engine's table by now (entries are removed only after apply).
        let result = match self.db.idempotency_lookup(&slot.0, &slot.1) {
            Err(error) => Err(ApiError::from(error)),
            Ok(Some(record)) if record.fingerprint == fingerprint => Ok(record.last_seqno.get()),
            Ok(Some(_)) => Err(idempotency_conflict()),
            Ok(None) => self.clone().write_inner(request).await,
        };
        let _ = done_tx.send(Some(result.clone()));
        result
    }

    async fn write_inner(self: Arc<Self>, request: AppendRequest) -> Result<u64, ApiError> {
        let bytes = u32::try_from(request.payload.len().max(1)).unwrap_or(u32::MAX);
        let admit = async {
            let slot = self.write_slots.clone().acquire_owned().await;
            let bytes = self.write_bytes.clone().acquire_many_owned(bytes).await;
            (slot, bytes)
        };
        let (Ok(_slot), Ok(_bytes)) = tokio::time::timeout(WRITE_ADMIT_TIMEOUT, admit)
            .await
            .map_err(|_| ApiError::unavailable(ErrorCode::Overloaded, "write queue is full; retry later"))?
        else {
            return Err(ApiError::internal("write admission closed"));
        };
        if let Some(fatal) = self.fatal() {
            return Err(ApiError::unavailable(ErrorCode::NotReady, fatal.to_string()));
        }
        // A cluster member writes only while it serves as leader; losing office fails the wait (the
        // outcome is unknown: the client retries with its Idempotency-Key).
        let (mut office, ticket) = match &self.replica {
            None => (None, None),
            Some(replica) => {
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
                (Some(office), Some(ticket))
            }
        };
        // One wake-up per write (decisions/028): the WAL completion (on the writer thread) ends the
        // admission and registers the write with the applied frontier's waiters, which wake this
        // task once the write is applied; an append error wakes it from the completion.
        let (tx, mut rx) = tokio::sync::oneshot::channel();
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
            Ok(()) => {}
            Err(SubmitError::QueueFull(_)) => {
                return Err(ApiError::unavailable(ErrorCode::Overloaded, "WAL queue is full; retry later"))
            }
            Err(SubmitError::Invalid(why)) => {
                return Err(ApiError::internal(format!("invalid append: {why}")))
            }
            Err(error) => {
                return Err(ApiError::unavailable(ErrorCode::NotReady, format!("WAL refused: {error:?}")))
            }
        }
        let waiting = async {
            match &mut office {
                None => Some((&mut rx).await),
                Some(office) => {
                    let lost = office.wait_for(|term| term.is_none());
                    tokio::select! {
                        biased;
                        written = &mut rx => Some(written),
                        // Lost office before this write was committed and applied here.
                        _ = lost => rx.try_recv().ok().map(Ok),
                    }
                }
            }
        };
        // Every write gets an answer within a bound (decisions/057): a leader cut off from a
        // majority (or past its lease) would otherwise leave it hanging for as long as that lasts.
        let written = match tokio::time::timeout(WRITE_ANSWER_TIMEOUT, waiting).await {
            Ok(Some(written)) => written,
            Ok(None) => {
                return Err(ApiError::unavailable(
                    ErrorCode::NotReady,
                    "this node lost leadership before the write committed; the outcome is unknown, retry with the same Idempotency-Key",
                ))
            }
            Err(_) => {
                return Err(ApiError::unavailable(
                    ErrorCode::NotReady,
                    format!("the write was not committed within {WRITE_ANSWER_TIMEOUT:?} (no contact with a majority?); the outcome is unknown, retry with the same Idempotency-Key"),
                ))
            }
        };
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

    /// Checkpoints the engine and purges WAL segments that are below the checkpoint and beyond the
    /// retention budget. Blocking: run it off the async workers.
    pub fn checkpoint_and_purge(&self) -> anyhow::Result<()> {
        let checkpoint = self.db.checkpoint().context("checkpoint engine")?;
        self.checkpoint_seqno.store(checkpoint.get(), Ordering::Relaxed);
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
        // So that the next open has no journal to replay (decisions/050).
        let started = Instant::now();
        match self.db.flush_tables() {
            Ok(()) => tracing::info!(elapsed = ?started.elapsed(), "engine memtables written to tables"),
            Err(error) => tracing::warn!("could not write the engine's memtables to tables at shutdown (the next open replays fjall's journal): {error:#}"),
        }
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

/// Removes an idempotency key's in-flight entry however the write ends.
struct InFlightGuard<'a> {
    node: &'a Node,
    slot: &'a (String, String),
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.node.inflight.lock().expect("inflight lock is never held across a panic").remove(self.slot);
    }
}

fn engine_config(config: &ServeConfig) -> EngineConfig {
    EngineConfig {
        dimension: config.dimension,
        half_life_ms: config.half_life_ms,
        profile_half_life_ms: config.profile_half_life_ms,
        similarity_weight: config.similarity_weight,
        trending_weight: config.trending_weight,
        overlay_bytes_max: config.engine_overlay_bytes_max,
        ..EngineConfig::default()
    }
}

/// Name of the file holding this data dir's CRDT incarnation.
const INCARNATION_FILE: &str = "incarnation";

/// This node's incarnation in the hard-negatives CRDT (its actor is `(node id, incarnation)`): read
/// from `data_dir/incarnation`, or drawn anew when the state is fresh (a wiped data dir must never
/// reuse a dot it issued before: peers already saw those dots and would drop new items under them).
/// A random draw and the dir's name through BLAKE3 (the draw comes from the seed in a simulation,
/// decisions/052); persisted write-then-rename, fsynced, before the engine opens.
fn incarnation(data_dir: &std::path::Path) -> anyhow::Result<u64> {
    let path = data_dir.join(INCARNATION_FILE);
    let fresh_state = !data_dir.join("state").exists();
    if !fresh_state {
        if let Ok(text) = std::fs::read_to_string(&path) {
            return text
                .trim()
                .parse::<u64>()
                .with_context(|| format!("{} does not hold an unsigned integer", path.display()));
        }
    }
    // A random draw: the OS-seeded generator in production, the seed in a simulation (the clock
    // and the process id it was drawn from before made a replay's negatives differ).
    let mut hasher = blake3::Hasher::new();
    hasher.update(&tidal_cluster::control::runtime::random_u64().to_le_bytes());
    hasher.update(data_dir.file_name().unwrap_or(data_dir.as_os_str()).as_encoded_bytes());
    let hash = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    let incarnation = u64::from_le_bytes(first).max(1);
    tidal_cluster::files::write_then_rename(&path, format!("{incarnation}\n").as_bytes())
        .with_context(|| format!("write {} (write-then-rename)", path.display()))?;
    tracing::info!(incarnation, "new CRDT incarnation for a fresh state");
    Ok(incarnation)
}

fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<File> {
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    file.try_lock().map_err(|_| {
        anyhow::anyhow!(
            "data dir {} is in use by another tidal process (lock held on {})",
            dir.display(),
            path.display()
        )
    })?;
    Ok(file)
}

/// Hands the durable batches in `(applied, durable]` to the applier as pending (not yet
/// committed), at open (recovery checked their seals moments ago).
fn hand_tail_to_applier(
    wal: &Wal,
    sender: &ApplierSender,
    applied: Seqno,
    durable: Seqno,
) -> anyhow::Result<()> {
    const CHUNK_BYTES: usize = 4 * 1024 * 1024;
    let mut chunk = Vec::new();
    let mut bytes = 0usize;
    let mut batches = 0u64;
    for batch in wal.read_recovered_from(applied.next()).context("read the WAL tail")? {
        let batch = batch.context("read a WAL batch of the tail")?;
        if batch.first_seqno() > durable {
            break;
        }
        bytes += batch.encoded().len();
        batches += 1;
        chunk.push(batch);
        if bytes >= CHUNK_BYTES {
            sender.flushed(std::mem::take(&mut chunk));
            bytes = 0;
        }
    }
    if !chunk.is_empty() {
        sender.flushed(chunk);
    }
    tracing::info!(batches, from = %applied.next(), to = %durable, "WAL tail past the commit hint waits for the commit frontier");
    Ok(())
}

/// Bytes of read-ahead startup replay holds between its reader thread and the fold (at least one
/// batch, whatever its size): bounds the memory of the pipeline.
const REPLAY_READ_AHEAD_BYTES: usize = 32 * 1024 * 1024;
/// Bytes of batches the replay reader hands over at once (a chunk closes at either bound).
const REPLAY_CHUNK_BYTES: usize = 1024 * 1024;
/// Batches the replay reader hands over at once.
const REPLAY_CHUNK_BATCHES: usize = 1024;

/// The engine's replay mode ([`TidalDb::set_replaying`]) from `start` until dropped, however the
/// replay ends.
struct Replaying<'a>(&'a TidalDb);

impl<'a> Replaying<'a> {
    fn start(db: &'a TidalDb) -> Replaying<'a> {
        db.set_replaying(true);
        Replaying(db)
    }
}

impl Drop for Replaying<'_> {
    fn drop(&mut self) {
        self.0.set_replaying(false);
    }
}

/// Startup replay, as a pipeline: a reader thread reads the segments, checks every batch's header
/// and the seqno chain (recovery verified their seals moments ago, on every core:
/// [`tidal_wal::Wal::read_recovered_from`]) and decodes its payload, while this thread folds the
/// batches in order through the one apply path ([`TidalDb::apply_decoded`]) and the engine's
/// flusher writes fjall. The read-ahead between the two is bounded by [`REPLAY_READ_AHEAD_BYTES`].
/// Each folded chunk goes back to the reader to be freed where it was allocated (decisions/044).
/// The engine is in replay mode meanwhile (decisions/043).
fn replay(wal: &Wal, db: &TidalDb, durable: Seqno) -> anyhow::Result<ReplayReport> {
    let started = Instant::now();
    let mut report = ReplayReport {
        batches: 0,
        bytes: 0,
        elapsed: Duration::ZERO,
        engine_open: Duration::ZERO,
        wal_recovery: Duration::ZERO,
    };
    let from = db.applied_seqno().next();
    if from > durable {
        return Ok(report);
    }
    tracing::info!(%from, %durable, "replaying WAL into the engine");
    let reader = wal.read_recovered_from(from).context("read WAL for replay")?;
    let budget = ReadAhead::new(REPLAY_READ_AHEAD_BYTES);
    let (sender, receiver) = std::sync::mpsc::channel::<Result<Vec<DecodedBatch>, tidal_wal::Error>>();
    // Folded chunks go back to the reader, which allocated them, to be freed there: glibc frees a
    // block into the arena of the thread that allocated it, under that arena's lock, so a fold
    // freeing the reader's allocations contends with the reader allocating the next ones.
    let (give_back, given_back) = std::sync::mpsc::channel::<Vec<DecodedBatch>>();
    let mut last_progress = Instant::now();
    let _replaying = Replaying::start(db);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let budget = &budget;
        std::thread::Builder::new()
            .name("tidal-replay-read".into())
            .spawn_scoped(scope, move || {
                // Batches travel in chunks, so small batches (an item, an embedding) do not pay a
                // channel send and two lock round trips each.
                let mut chunk = Vec::new();
                let mut chunk_bytes = 0;
                let mut spare: Option<Vec<DecodedBatch>> = None;
                for batch in reader {
                    let batch = match batch {
                        Ok(batch) => batch,
                        Err(error) => {
                            if !chunk.is_empty() {
                                budget.acquire(chunk_bytes);
                                let _ = sender.send(Ok(chunk));
                            }
                            let _ = sender.send(Err(error));
                            return;
                        }
                    };
                    let last = batch.last_seqno() >= durable;
                    chunk_bytes += batch.encoded().len();
                    chunk.push(DecodedBatch::decode(batch));
                    if last || chunk_bytes >= REPLAY_CHUNK_BYTES || chunk.len() >= REPLAY_CHUNK_BATCHES {
                        budget.acquire(chunk_bytes);
                        chunk_bytes = 0;
                        // Chunks the fold has given back by now: freed here, where they were
                        // allocated; the last one's Vec carries the next chunk.
                        for mut folded in given_back.try_iter() {
                            folded.clear();
                            spare = Some(folded);
                        }
                        let next = spare.take().unwrap_or_default();
                        if budget.is_closed()
                            || sender.send(Ok(std::mem::replace(&mut chunk, next))).is_err()
                            || last
                        {
                            return;
                        }
                    }
                }
                if !chunk.is_empty() {
                    budget.acquire(chunk_bytes);
                    let _ = sender.send(Ok(chunk));
                }
            })
            .context("start the replay reader thread")?;
        // Whatever ends the fold (an error included) releases the reader.
        let _close = CloseOnDrop(budget);
        for chunk in receiver {
            let mut chunk = chunk.context("read WAL batch for replay")?;
            let chunk_bytes: usize = chunk.iter().map(|decoded| decoded.batch().encoded().len()).sum();
            for decoded in &mut chunk {
                let (first_seqno, last_seqno, len) = {
                    let batch = decoded.batch();
                    (batch.first_seqno(), batch.last_seqno(), batch.encoded().len())
                };
                if last_seqno > durable {
                    return Ok(());
                }
                db.apply_decoded(decoded).with_context(|| format!("replay batch at seqno {first_seqno}"))?;
                report.batches += 1;
                report.bytes += len as u64;
            }
            let last_seqno = chunk.last().map(|decoded| decoded.batch().last_seqno());
            // Freed by the reader; if it is gone, here.
            let _ = give_back.send(chunk);
            budget.release(chunk_bytes);
            if last_progress.elapsed() > Duration::from_secs(2) {
                last_progress = Instant::now();
                if let Some(applied) = last_seqno {
                    tracing::info!(%applied, %durable, mb = report.bytes / 1_000_000, "replay progress");
                }
            }
        }
        Ok(())
    })?;
    report.elapsed = started.elapsed();
    anyhow::ensure!(
        db.applied_seqno() >= durable,
        "replay ended at seqno {} but should have reached {durable}",
        db.applied_seqno()
    );
    tracing::info!(
        batches = report.batches,
        mb = report.bytes as f64 / 1e6,
        seconds = report.elapsed.as_secs_f64(),
        "replay done"
    );
    Ok(report)
}

/// The bytes read ahead of the fold during replay: the reader waits while they exceed the bound
/// (one batch always passes, whatever its size).
struct ReadAhead {
    bound: usize,
    state: Mutex<(usize, bool)>,
    changed: std::sync::Condvar,
}

impl ReadAhead {
    fn new(bound: usize) -> ReadAhead {
        ReadAhead { bound, state: Mutex::new((0, false)), changed: std::sync::Condvar::new() }
    }

    fn acquire(&self, bytes: usize) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while state.0 > 0 && state.0 + bytes > self.bound && !state.1 {
            state = self.changed.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        state.0 += bytes;
    }

    fn release(&self, bytes: usize) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.0 = state.0.saturating_sub(bytes);
        self.changed.notify_all();
    }

    fn close(&self) {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1 = true;
        self.changed.notify_all();
    }

    fn is_closed(&self) -> bool {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1
    }
}

struct CloseOnDrop<'a>(&'a ReadAhead);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}
