//! The steps of [`Node::open`](super::Node::open): lock the data dir, open the engine and recover
//! the WAL side by side, wire a cluster member's commit bookkeeping into the WAL's hook, finish an
//! interrupted snapshot install, bring the engine up to the log, and start the replica.

use super::ReplayReport;
use crate::config::{ClusterMembership, ServeConfig};
use anyhow::Context;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidal_cluster::control::LogStore;
use tidal_cluster::{
    ApplierSender, CommitOnFlush, CommitState, DurableFrontier, Fatal, FatalSource, Replica, ReplicaHook,
    ReplicaParts, ShipFeed, SnapshotPins, SnapshotSource, TermGate,
};
use tidal_core::{EngineConfig, RaftStore, TidalDb};
use tidal_types::{Seqno, TermSeqno};
use tidal_wal::{RecoveredWal, Recovery, Wal, WalConfig};
use tokio::sync::watch;

/// Takes the data dir's `LOCK` file: one `tidal serve` per data dir.
pub(super) fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<File> {
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

/// The engine, opened, and the WAL, recovered but not started, with how long each took.
pub(super) struct Storage {
    pub db: Arc<TidalDb>,
    pub recovered: RecoveredWal,
    pub engine_open: Duration,
    pub wal_recovery: Duration,
}

/// Opens the engine and recovers the WAL. The WAL's recovery (reading and verifying every retained
/// segment) and the engine's open (fjall replaying its journal, one thread) need nothing from each
/// other: they run side by side, and a crashed node that must replay both is back sooner.
pub(super) fn open_storage(config: &ServeConfig) -> anyhow::Result<Storage> {
    let mut engine = engine_config(config);
    engine.node_actor = (
        config.cluster.as_ref().map_or(1, |membership| membership.me.0),
        incarnation(&config.data_dir).context("read or create the CRDT incarnation")?,
    );
    let mut wal_config = WalConfig::new(config.data_dir.join("wal"));
    wal_config.segment_bytes_max = config.segment_bytes_max;
    wal_config.preallocate_bytes = config.wal_preallocate_bytes;
    let wal_io = config.io.wal_files.clone();
    let recovering = std::thread::Builder::new()
        .name("tidal-wal-recover".into())
        .spawn(move || {
            let started = Instant::now();
            (Wal::recover(wal_config, wal_io), started.elapsed())
        })
        .context("start the WAL recovery thread")?;
    let started = Instant::now();
    let db = TidalDb::open(&config.data_dir.join("state"), engine);
    let engine_open = started.elapsed();
    // Joined before either result is looked at: nothing of this open outlives a failure.
    let (recovered, wal_recovery) =
        recovering.join().map_err(|_| anyhow::anyhow!("the WAL recovery thread panicked"))?;
    // fjall's errors do not say where: a damaged engine is named by its directory.
    let db = Arc::new(
        db.with_context(|| format!("open the engine at {}", config.data_dir.join("state").display()))?,
    );
    let recovered = recovered.context("open WAL")?;
    Ok(Storage { db, recovered, engine_open, wal_recovery })
}

fn engine_config(config: &ServeConfig) -> EngineConfig {
    EngineConfig {
        dimension: config.dimension,
        half_life_ms: config.half_life_ms,
        profile_half_life_ms: config.profile_half_life_ms,
        similarity_weight: config.similarity_weight,
        trending_weight: config.trending_weight,
        overlay_bytes_max: config.engine_overlay_bytes_max,
        flush_ingest_bytes_min: config.engine_flush_ingest_bytes_min,
        ann_lists: config.feed_ann.lists,
        ann_centroids_at: config.feed_ann.centroids_at,
        ann_threshold: config.feed_ann.threshold,
        ann_probes: config.feed_ann.probes,
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

/// A cluster member's commit bookkeeping and ship tail, which the WAL's hook feeds.
pub(super) struct ClusterParts {
    membership: ClusterMembership,
    commit: Arc<CommitState>,
    feed: ShipFeed,
    applier: ApplierSender,
}

/// A cluster member's [`ClusterParts`]; `None` for a single node. Commit bookkeeping starts at the
/// engine's applied seqno, or at the snapshot's when an install interrupted by a crash is pending
/// (it is finished before replay, [`finish_pending_install`]; the engine still reports its
/// half-replaced state's seqno until then).
pub(super) fn cluster_parts(
    config: &ServeConfig,
    db: &TidalDb,
    applier: &ApplierSender,
) -> anyhow::Result<Option<ClusterParts>> {
    let Some(membership) = &config.cluster else { return Ok(None) };
    let pending_install = tidal_cluster::pending_install_position(&config.data_dir)
        .context("read the snapshot install marker")?;
    let start_applied = pending_install.map_or(db.applied_seqno(), |position| position.seqno);
    let voters = membership.spec.nodes.iter().map(|node| node.id).collect();
    let commit = Arc::new(
        CommitState::new(membership.me, voters, membership.spec.durability, start_applied, applier.clone())
            .with_lease(membership.timing.lease()),
    );
    let feed = ShipFeed::new(TermSeqno::default(), config.ship_tail_bytes_max, config.ship_tail_batches_max);
    Ok(Some(ClusterParts { membership: membership.clone(), commit, feed, applier: applier.clone() }))
}

/// Starts the recovered WAL's writer with the hook that takes its flushed batches: straight to the
/// applier on a single node (it commits what it fsyncs), through the commit bookkeeping and the
/// ship tail on a cluster member. A poisoned WAL raises `fatal`.
pub(super) fn start_wal(
    config: &ServeConfig,
    recovered: RecoveredWal,
    cluster: Option<&ClusterParts>,
    applier: &ApplierSender,
    db: &TidalDb,
    fatal: &Fatal,
) -> anyhow::Result<(Wal, Recovery)> {
    // A cluster member applies committed batches before its own fsync (decisions/025); this gate
    // keeps the engine's persisted state behind its durable WAL all the same.
    let durable_gate = DurableFrontier::new();
    let hook: Box<dyn tidal_wal::FlushedHook> = match cluster {
        None => Box::new(CommitOnFlush(applier.clone())),
        Some(parts) => Box::new(ReplicaHook::new(
            applier.clone(),
            parts.commit.clone(),
            parts.feed.clone(),
            parts.membership.me,
            durable_gate.clone(),
        )),
    };
    let (wal, recovery) = recovered.start(config.io.wal_clock.clone(), hook).context("open WAL")?;
    // Raised from the thread that poisons the WAL, before the failed writes are answered.
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
    Ok((wal, recovery))
}

/// Before anything reads the engine's frontier: finishes an interrupted snapshot install (WAL
/// reset + state replacement), or removes what a transfer that never reached its marker left; then
/// checks that the engine is not ahead of the log.
pub(super) fn finish_pending_install(
    config: &ServeConfig,
    wal: &Wal,
    db: &Arc<TidalDb>,
) -> anyhow::Result<()> {
    if let Some(report) =
        tidal_cluster::resume_pending_install(&config.data_dir, wal, db).context("resume snapshot install")?
    {
        tracing::info!(position = %report.position, "interrupted snapshot install finished");
    }
    let (durable, applied) = (wal.durable_seqno(), db.applied_seqno());
    anyhow::ensure!(
        applied <= durable,
        "engine state is at seqno {applied} but the WAL ends at {durable}: the WAL in {} was lost or replaced; \
         refusing to start (restore the WAL or wipe the data dir)",
        config.data_dir.display()
    );
    Ok(())
}

/// Brings the engine up to the log. A single node commits what it fsyncs: its whole durable log is
/// committed and replayed. A cluster member may hold an uncommitted tail that a new leader will
/// quarantine, so it replays only up to its saved commit hint; the tail past it waits in the
/// applier until the leader's commit frontier covers it (or a new leader's log quarantines it).
pub(super) fn catch_up_engine(
    wal: &Wal,
    db: &TidalDb,
    applier: &ApplierSender,
    raft_store: &RaftStore,
    member: bool,
) -> anyhow::Result<ReplayReport> {
    let durable = wal.durable_seqno();
    let replay_to =
        if member { std::cmp::min(durable, tidal_cluster::commit_hint(raft_store)) } else { durable };
    let report = super::replay::replay(wal, db, replay_to)?;
    if replay_to < durable {
        super::replay::hand_tail_to_applier(wal, applier, db.applied_seqno(), durable)?;
    }
    Ok(report)
}

/// After the replay (which wants the flusher at full speed): the engine's background threads run
/// `by` nice levels below the request path from now on. A failure costs only tail latency, so it is
/// logged, not fatal.
pub(super) fn lower_background_priority(db: &TidalDb, by: i32) {
    if by == 0 {
        return;
    }
    match db.lower_background_priority(by) {
        Ok(threads) => tracing::info!(threads, by, "engine background threads lowered"),
        Err(error) => tracing::warn!("could not lower the engine background threads' priority: {error}"),
    }
}

/// The replica of a cluster member, its ship tail and commit bookkeeping set where the log and the
/// engine now are, its term from the persisted vote.
pub(super) fn start_replica(
    parts: ClusterParts,
    config: &ServeConfig,
    wal: &Wal,
    db: &Arc<TidalDb>,
    raft_store: &RaftStore,
    applied: watch::Receiver<Seqno>,
    fatal: &Fatal,
) -> anyhow::Result<Arc<Replica>> {
    let ClusterParts { membership, commit, feed, applier } = parts;
    feed.reset(wal.last_position());
    commit.advance(db.applied_seqno());
    let term = LogStore::persisted_term(raft_store)
        .map_err(|why| anyhow::anyhow!("read the persisted vote: {why}"))?;
    let snapshots = SnapshotSource::new(db.clone(), wal.clone(), &config.data_dir, SnapshotPins::default())
        .context("snapshot source")?;
    let parts = ReplicaParts {
        spec: membership.spec,
        me: membership.me,
        data_dir: config.data_dir.clone(),
        store: raft_store.clone(),
        timing: membership.timing,
        db: db.clone(),
        applier,
        snapshots: Arc::new(snapshots),
        connector: config.io.connector.clone(),
        join: membership.join,
        fatal: fatal.clone(),
    };
    Replica::new(parts, wal.clone(), commit, feed, applied, TermGate::new(term))
        .map_err(|why| anyhow::anyhow!("cluster: {why}"))
}
