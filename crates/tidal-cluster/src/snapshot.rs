//! Snapshot transfer: the leader serves a snapshot of its state ([`SnapshotSource`]) to a follower
//! the log alone cannot bring back, which installs it ([`install_snapshot`]) and continues from the
//! log at the snapshot's seqno + 1. [`SnapshotPins`] keeps the leader from purging that seqno + 1
//! while a snapshot is in flight.
//!
//! Install order (PROTOCOL.md, "Shipping and pulling"), every step durable before the next:
//! 1. receive the snapshot into `snapshot/incoming.snap.tmp`, fsync, rename to `install.snap`,
//!    fsync the directory, verify it whole (checksum, shapes, digest of the records);
//! 2. write the `install_pending` marker (position, term history through S; checksummed), fsync the
//!    file and the data directory;
//! 3. quarantine the old WAL and reset it: term history := the source's through S, purge point :=
//!    S, last position := S ([`Wal::reset_to`]); the applier drops its pending batches;
//! 4. replace the state ([`TidalDb::install_snapshot`]: log-derived state replaced, applied := S,
//!    hard negatives merged);
//! 5. remove the marker (fsync the directory), then the snapshot file.
//!
//! A crash before 2 leaves the old WAL and state and a leftover file ([`resume_pending_install`]
//! removes it). A crash after 2 leaves the marker: [`resume_pending_install`] redoes 3-5 from the
//! verified file; both steps are idempotent.
//!
//! Delicate:
//! - The caller must keep ships and pulled chunks out during [`install_fetched`] (steps 2-5; hold
//!   the receive lock): an append between the WAL reset and the state replacement would reach an
//!   engine still at its old applied seqno. The transfer ([`fetch_snapshot`]) needs no lock.
//! - A snapshot at S is installed only if the WAL does not hold S with S's term
//!   ([`snapshot_needed`]); otherwise the log brings the follower on and the install answers
//!   [`InstallOutcome::NotNeeded`].
//! - The applied frontier may go down (a node that applied a divergent suffix installs an earlier
//!   position).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidal_core::snapshot::read_snapshot;
use tidal_core::{SnapshotError, SnapshotInfo, TidalDb};
use tidal_net::{NetError, Peer, SnapshotChunk, SnapshotRequest, SnapshotStream, SNAPSHOT_CHUNK_BYTES};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::wal_meta::TERM_HISTORY_LEN_MAX;
use tidal_wal::{QuarantineReport, Wal};
use tokio_stream::{Stream, StreamExt};

use crate::applier::ApplierSender;
use crate::files::FileStep;

/// Directory inside the data directory for snapshot files (served and received).
pub const SNAPSHOT_DIR_NAME: &str = "snapshot";
/// The install marker, in the data directory.
pub const INSTALL_PENDING_FILE: &str = "install_pending";
/// Snapshots a node serves at once: each costs a cut (a full read of the state) and a file the size
/// of the state; more would compete with the node's own writes for the disk.
pub const SNAPSHOT_SERVES_MAX: usize = 2;
/// Deadline of a whole snapshot transfer: generous for tens of GiB on a slow link.
pub const SNAPSHOT_TRANSFER_DEADLINE: Duration = Duration::from_secs(60 * 60);
/// A transfer that receives no chunk for this long is abandoned (the server may be cutting a large
/// state before its first chunk, so this is longer than a pull's).
pub const SNAPSHOT_CHUNK_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Install progress is logged at most this often.
pub const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(2);
/// How long a served snapshot keeps pinning the purge horizon after its stream ended, unless the
/// follower's matched position passes it first: long enough for the follower to install and pull.
pub const PIN_LINGER: Duration = Duration::from_secs(10 * 60);

/// The verified snapshot an install (or a restore, [`crate::backup`]) works from.
pub(crate) const INSTALL_FILE: &str = "install.snap";
const INCOMING_FILE: &str = "incoming.snap.tmp";
const SERVE_PREFIX: &str = "serve-";
const MARKER_MAGIC: [u8; 8] = *b"TIDALINS";
const MARKER_VERSION: u32 = 1;
/// Chunks queued between the blocking reader and the network: a few MiB per transfer.
const SERVE_CHANNEL_CHUNKS: usize = 4;

/// Why an install failed. Nothing was changed unless the marker was written (then a restart or a
/// retry resumes it).
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The peer could not be asked or failed the stream.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The stream broke the transfer's rules (order, size, stalls).
    #[error("snapshot stream: {0}")]
    Stream(String),
    /// The snapshot itself is bad or could not be installed.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The WAL refused the reset.
    #[error("reset WAL: {0}")]
    Wal(#[from] tidal_wal::Error),
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The install marker is unreadable: the node cannot know what it was installing.
    #[error("install marker {path}: {reason}")]
    Marker {
        /// The marker's path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An install was interrupted on purpose ([`simulate_interrupted_install`]).
    #[error("install interrupted (simulated crash)")]
    Interrupted,
}

/// What [`install_snapshot`] did.
#[derive(Debug)]
pub enum InstallOutcome {
    /// The snapshot was installed; the WAL continues at its seqno + 1.
    Installed(InstallReport),
    /// The WAL already holds the snapshot's position with its term: pull from the log instead.
    NotNeeded {
        /// The position the peer offered.
        position: TermSeqno,
    },
}

/// A completed install.
#[derive(Debug)]
pub struct InstallReport {
    /// The snapshot's position: the node's applied seqno, purge point and last position now.
    pub position: TermSeqno,
    /// Bytes of the snapshot.
    pub bytes: u64,
    /// Entries installed (negatives included).
    pub entries: u64,
    /// What the WAL reset moved into `quarantine/`.
    pub quarantined: QuarantineReport,
    /// Time from the first chunk (or the resume) to the end.
    pub elapsed: Duration,
}

/// Progress of a transfer, handed to the caller's callback after every chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstallProgress {
    /// The snapshot's position.
    pub position: TermSeqno,
    /// Bytes received so far.
    pub received_bytes: u64,
    /// Bytes of the whole snapshot.
    pub total_bytes: u64,
}

/// Whether a snapshot at `position` must be installed: the WAL does not hold `position.seqno` with
/// `position.term` (purged seqnos included, through the term history). A snapshot at seqno 0 is an
/// empty state and never needed.
pub fn snapshot_needed(wal: &Wal, position: TermSeqno) -> bool {
    position.seqno > Seqno::ZERO && wal.term_at(position.seqno) != Some(position.term)
}

/// A snapshot received and verified on disk (`snapshot/install.snap`), not installed yet.
#[derive(Debug)]
pub struct FetchedSnapshot {
    marker: InstallMarker,
    info: SnapshotInfo,
    started: Instant,
}

impl FetchedSnapshot {
    /// The snapshot's position.
    pub fn position(&self) -> TermSeqno {
        self.marker.position
    }

    /// Bytes of the snapshot.
    pub fn bytes(&self) -> u64 {
        self.info.bytes
    }
}

/// What [`fetch_snapshot`] did.
#[derive(Debug)]
pub enum FetchOutcome {
    /// Received and verified; install it with [`install_fetched`].
    Fetched(FetchedSnapshot),
    /// The WAL already holds the offered position with its term.
    NotNeeded {
        /// The position the peer offered.
        position: TermSeqno,
    },
}

/// Step 1 alone: receives `peer`'s snapshot into `data_dir/snapshot` and verifies it, if needed.
/// Changes nothing else, so it needs no lock: the transfer may take long.
pub async fn fetch_snapshot(
    peer: &Peer,
    me: NodeId,
    wal: &Wal,
    db: &Arc<TidalDb>,
    data_dir: &Path,
    progress: &mut (dyn FnMut(InstallProgress) + Send),
) -> Result<FetchOutcome, InstallError> {
    let local = Local { wal: wal.clone(), db: db.clone(), applier: None, data_dir: data_dir.into() };
    if read_marker(&local.data_dir)?.is_some() {
        return Err(InstallError::Stream("an interrupted install is pending: resume it first".into()));
    }
    let started = Instant::now();
    Ok(match receive(peer, me, &local, progress).await? {
        Ok((marker, info)) => FetchOutcome::Fetched(FetchedSnapshot { marker, info, started }),
        Err(position) => FetchOutcome::NotNeeded { position },
    })
}

/// Steps 2-5: installs a fetched snapshot. The caller holds the lock that keeps ships and pulled
/// chunks out (for seconds: the state replacement). Checks again that the snapshot is needed (the
/// log may have moved on during the transfer).
pub async fn install_fetched(
    fetched: FetchedSnapshot,
    wal: &Wal,
    db: &Arc<TidalDb>,
    applier: Option<&ApplierSender>,
    data_dir: &Path,
) -> Result<InstallOutcome, InstallError> {
    let local =
        Local { wal: wal.clone(), db: db.clone(), applier: applier.cloned(), data_dir: data_dir.into() };
    install_fetched_until(fetched, local, None).await
}

async fn install_fetched_until(
    fetched: FetchedSnapshot,
    local: Local,
    stop_after: Option<u64>,
) -> Result<InstallOutcome, InstallError> {
    let position = fetched.marker.position;
    if !snapshot_needed(&local.wal, position) {
        remove_if_present(&local.data_dir.join(SNAPSHOT_DIR_NAME).join(INSTALL_FILE))?;
        return Ok(InstallOutcome::NotNeeded { position });
    }
    let report = blocking(move || {
        write_marker(&local.data_dir, &fetched.marker)?;
        finish_install(&local, &fetched.marker, Some(fetched.info), fetched.started, stop_after)
    })
    .await?;
    Ok(InstallOutcome::Installed(report))
}

/// [`fetch_snapshot`] then [`install_fetched`], in the order the module documents. `applier` is
/// the running applier (`None` before it starts). The caller holds the receive lock throughout;
/// a caller that must not hold it during the transfer calls the two halves itself. Run it on a
/// tokio runtime; the blocking steps run on its blocking pool.
pub async fn install_snapshot(
    peer: &Peer,
    me: NodeId,
    wal: &Wal,
    db: &Arc<TidalDb>,
    applier: Option<&ApplierSender>,
    data_dir: &Path,
    progress: &mut (dyn FnMut(InstallProgress) + Send),
) -> Result<InstallOutcome, InstallError> {
    match fetch_snapshot(peer, me, wal, db, data_dir, progress).await? {
        FetchOutcome::Fetched(fetched) => install_fetched(fetched, wal, db, applier, data_dir).await,
        FetchOutcome::NotNeeded { position } => Ok(InstallOutcome::NotNeeded { position }),
    }
}

/// [`install_snapshot`] that stops the state replacement after `entries` entries, as a crash would,
/// leaving the marker, the reset WAL and a half-replaced state. For crash tests.
#[doc(hidden)]
pub async fn simulate_interrupted_install(
    peer: &Peer,
    me: NodeId,
    wal: &Wal,
    db: &Arc<TidalDb>,
    data_dir: &Path,
    entries: u64,
) -> Result<(), InstallError> {
    let fetched = match fetch_snapshot(peer, me, wal, db, data_dir, &mut |_| {}).await? {
        FetchOutcome::Fetched(fetched) => fetched,
        FetchOutcome::NotNeeded { position } => {
            return Err(InstallError::Stream(format!("a snapshot at {position} is not needed")))
        }
    };
    let local = Local { wal: wal.clone(), db: db.clone(), applier: None, data_dir: data_dir.into() };
    match install_fetched_until(fetched, local, Some(entries)).await {
        Err(InstallError::Interrupted) => Ok(()),
        Err(error) => Err(error),
        Ok(outcome) => Err(InstallError::Stream(format!("the install was not interrupted: {outcome:?}"))),
    }
}

/// At startup, before the WAL is replayed into the engine and before the applier starts: finishes
/// an install a crash interrupted (the marker is present), or removes the leftovers of one that
/// never reached its marker. Blocking.
pub fn resume_pending_install(
    data_dir: &Path,
    wal: &Wal,
    db: &Arc<TidalDb>,
) -> Result<Option<InstallReport>, InstallError> {
    let local = Local { wal: wal.clone(), db: db.clone(), applier: None, data_dir: data_dir.into() };
    match read_marker(data_dir)? {
        Some(marker) => {
            tracing::warn!(position = %marker.position, "finishing a pending snapshot install (restored from a backup, or interrupted by a crash)");
            finish_install(&local, &marker, None, Instant::now(), None).map(Some)
        }
        None => {
            let dir = data_dir.join(SNAPSHOT_DIR_NAME);
            for name in [INCOMING_FILE, INSTALL_FILE] {
                remove_if_present(&dir.join(name))?;
            }
            remove_if_present(&data_dir.join(format!("{INSTALL_PENDING_FILE}.tmp")))?;
            Ok(None)
        }
    }
}

/// The position of an interrupted install whose marker is in `data_dir`, if any: at startup, what
/// the node's applied seqno will be once [`resume_pending_install`] has run (for state that must
/// be seeded before the WAL is open, like the commit frontier).
pub fn pending_install_position(data_dir: &Path) -> Result<Option<TermSeqno>, InstallError> {
    Ok(read_marker(data_dir)?.map(|marker| marker.position))
}

/// Where an install happens.
struct Local {
    wal: Wal,
    db: Arc<TidalDb>,
    applier: Option<ApplierSender>,
    data_dir: PathBuf,
}

/// What the marker records: enough to redo the WAL reset; the state comes from the verified file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct InstallMarker {
    position: TermSeqno,
    history: Vec<TermSeqno>,
}

/// Receives and verifies the snapshot into `snapshot/install.snap`; `Err(position)` if a snapshot
/// at that position is not needed.
async fn receive(
    peer: &Peer,
    me: NodeId,
    local: &Local,
    progress: &mut (dyn FnMut(InstallProgress) + Send),
) -> Result<Result<(InstallMarker, SnapshotInfo), TermSeqno>, InstallError> {
    let mut stream = Box::pin(peer.snapshot(me, SNAPSHOT_TRANSFER_DEADLINE).await?);
    let first = next_chunk(&mut stream).await?.ok_or_else(|| stream_error("ended before its first chunk"))?;
    let (position, Some(history)) = (first.position, first.history.clone()) else {
        return Err(stream_error("the first chunk does not start the snapshot"));
    };
    if !snapshot_needed(&local.wal, position) {
        tracing::info!(%position, last = %local.wal.last_position(), "snapshot not needed: the log holds its position");
        return Ok(Err(position));
    }
    let dir = local.data_dir.join(SNAPSHOT_DIR_NAME);
    std::fs::create_dir_all(&dir).map_err(io("create snapshot directory"))?;
    let incoming = dir.join(INCOMING_FILE);
    let mut file = Some(File::create(&incoming).map_err(io("create incoming snapshot"))?);
    let mut log = ProgressLog { last: None };
    let total_bytes = first.total_bytes;
    let mut chunk = first;
    let mut received = 0u64;
    loop {
        if chunk.position != position || chunk.offset != received || chunk.total_bytes != total_bytes {
            return Err(stream_error(&format!(
                "chunk at {} of {} for {} follows {received} bytes of {} for {position}",
                chunk.offset, chunk.total_bytes, chunk.position, total_bytes
            )));
        }
        received += chunk.data.len() as u64;
        let mut writing = file.take().expect("the file is put back after every write");
        let data = std::mem::take(&mut chunk.data);
        file = Some(
            off_the_runtime(move || writing.write_all(&data).map(|()| writing).map_err(io("write snapshot")))
                .await?,
        );
        let step = InstallProgress { position, received_bytes: received, total_bytes };
        progress(step);
        log.maybe(step, chunk.last);
        if chunk.last {
            break;
        }
        chunk = next_chunk(&mut stream).await?.ok_or_else(|| stream_error("ended before its last chunk"))?;
    }
    let file = file.expect("the file is put back after every write");
    let dimension = local.db.config().dimension;
    off_the_runtime(move || {
        let installing = dir.join(INSTALL_FILE);
        crate::files::step(FileStep::Fsync, &installing, &[]).map_err(io("fsync incoming snapshot"))?;
        file.sync_all().map_err(io("fsync incoming snapshot"))?;
        crate::files::step(FileStep::Rename, &installing, &[]).map_err(io("rename incoming snapshot"))?;
        std::fs::rename(&incoming, &installing).map_err(io("rename incoming snapshot"))?;
        crate::files::step(FileStep::SyncDir, &installing, &[]).map_err(io("fsync snapshot directory"))?;
        sync_dir(&dir)?;
        let info = read_snapshot(open(&installing)?, dimension, &mut |_, _, _| Ok(()))?;
        if info.position != position {
            return Err(stream_error(&format!(
                "the stream announced {position}, the snapshot holds {}",
                info.position
            )));
        }
        Ok(Ok((InstallMarker { position, history }, info)))
    })
    .await
}

/// Steps 3-5: reset the WAL, replace the state, remove the marker and the file. Idempotent.
/// `verified` is the file's verification if it was just done (else the install verifies it).
fn finish_install(
    local: &Local,
    marker: &InstallMarker,
    verified: Option<SnapshotInfo>,
    started: Instant,
    stop_after: Option<u64>,
) -> Result<InstallReport, InstallError> {
    let position = marker.position;
    let quarantined = local.wal.reset_to(position, &marker.history)?;
    tracing::warn!(?quarantined, %position, "WAL reset to the snapshot position");
    if let Some(applier) = &local.applier {
        if !applier.snapshot_installed(position.seqno) {
            tracing::error!("the applier has stopped: the installed state is applied by the next start");
        }
    }
    let file = local.data_dir.join(SNAPSHOT_DIR_NAME).join(INSTALL_FILE);
    if let Some(entries) = stop_after {
        local.db.simulate_interrupted_install(&file, entries)?;
        return Err(InstallError::Interrupted);
    }
    let info = match verified {
        Some(verified) => local.db.install_verified_snapshot(&file, verified)?,
        None => local.db.install_snapshot(&file)?,
    };
    if info.position != position {
        return Err(InstallError::Marker {
            path: local.data_dir.join(INSTALL_PENDING_FILE),
            reason: format!("the marker says {position}, the snapshot file holds {}", info.position),
        });
    }
    std::fs::remove_file(local.data_dir.join(INSTALL_PENDING_FILE)).map_err(io("remove install marker"))?;
    sync_dir(&local.data_dir)?;
    remove_if_present(&file)?;
    if let Some(applier) = &local.applier {
        // Publishes the new applied frontier.
        applier.commit(position.seqno);
    }
    let elapsed = started.elapsed();
    let mib_per_s = info.bytes as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64().max(1e-9);
    tracing::info!(%position, bytes = info.bytes, entries = info.entries, ?elapsed, mib_per_s, "snapshot install done");
    Ok(InstallReport { position, bytes: info.bytes, entries: info.entries, quarantined, elapsed })
}

async fn next_chunk<S>(stream: &mut S) -> Result<Option<SnapshotChunk>, InstallError>
where
    S: Stream<Item = Result<SnapshotChunk, NetError>> + Unpin,
{
    match tokio::time::timeout(SNAPSHOT_CHUNK_IDLE_TIMEOUT, stream.next()).await {
        Err(_) => Err(stream_error(&format!("no chunk for {SNAPSHOT_CHUNK_IDLE_TIMEOUT:?}"))),
        Ok(next) => Ok(next.transpose()?),
    }
}

/// Logs progress at most every [`PROGRESS_LOG_INTERVAL`], and at the end.
struct ProgressLog {
    last: Option<Instant>,
}

impl ProgressLog {
    fn maybe(&mut self, step: InstallProgress, done: bool) {
        if !done && self.last.is_some_and(|last| last.elapsed() < PROGRESS_LOG_INTERVAL) {
            return;
        }
        self.last = Some(Instant::now());
        let percent = (step.received_bytes.saturating_mul(100)).checked_div(step.total_bytes).unwrap_or(100);
        tracing::info!(position = %step.position, received = step.received_bytes, total = step.total_bytes,
            percent, "snapshot transfer");
    }
}

// ---------------------------------------------------------------- the marker

impl InstallMarker {
    /// magic | version u32 | term u64 | seqno u64 | n u32 | (term u64, seqno u64) x n | BLAKE3.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + 16 * self.history.len() + 32);
        out.extend_from_slice(&MARKER_MAGIC);
        out.extend_from_slice(&MARKER_VERSION.to_le_bytes());
        out.extend_from_slice(&self.position.term.0.to_le_bytes());
        out.extend_from_slice(&self.position.seqno.0.to_le_bytes());
        let count =
            u32::try_from(self.history.len()).expect("a term history is bounded by TERM_HISTORY_LEN_MAX");
        out.extend_from_slice(&count.to_le_bytes());
        for entry in &self.history {
            out.extend_from_slice(&entry.term.0.to_le_bytes());
            out.extend_from_slice(&entry.seqno.0.to_le_bytes());
        }
        let checksum = blake3::hash(&out);
        out.extend_from_slice(checksum.as_bytes());
        out
    }

    /// Decodes a marker; `Err` says what is wrong with it.
    fn decode(bytes: &[u8]) -> Result<InstallMarker, MarkerDamage> {
        let (body, checksum) =
            bytes.split_at_checked(bytes.len().saturating_sub(32)).ok_or(MarkerDamage("too short".into()))?;
        if body.len() < 32 || blake3::hash(body).as_bytes() != checksum {
            return Err(MarkerDamage("checksum mismatch or truncated".into()));
        }
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        if body[..8] != MARKER_MAGIC || body[8..12] != MARKER_VERSION.to_le_bytes() {
            return Err(MarkerDamage("unknown magic or version".into()));
        }
        let position = TermSeqno { term: Term(u64_at(12)), seqno: Seqno(u64_at(20)) };
        let count = u32::from_le_bytes(body[28..32].try_into().expect("4 bytes")) as usize;
        if count > TERM_HISTORY_LEN_MAX || body.len() != 32 + 16 * count {
            return Err(MarkerDamage(format!("{count} history entries do not fit {} bytes", body.len())));
        }
        let history = (0..count)
            .map(|i| TermSeqno { term: Term(u64_at(32 + 16 * i)), seqno: Seqno(u64_at(40 + 16 * i)) })
            .collect();
        Ok(InstallMarker { position, history })
    }
}

/// What is wrong with a damaged install marker.
#[derive(Debug)]
struct MarkerDamage(String);

fn write_marker(data_dir: &Path, marker: &InstallMarker) -> Result<(), InstallError> {
    crate::files::write_then_rename(&data_dir.join(INSTALL_PENDING_FILE), &marker.encode())
        .map_err(io("write install marker (write-then-rename)"))
}

/// Writes the install marker for a snapshot already verified at `snapshot/install.snap` (a
/// restore, [`crate::backup::restore_backup`]): the next start finishes the install as
/// [`resume_pending_install`] does after a crash.
pub(crate) fn write_install_marker(
    data_dir: &Path,
    position: TermSeqno,
    history: Vec<TermSeqno>,
) -> Result<(), InstallError> {
    write_marker(data_dir, &InstallMarker { position, history })
}

fn read_marker(data_dir: &Path) -> Result<Option<InstallMarker>, InstallError> {
    let path = data_dir.join(INSTALL_PENDING_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(InstallError::Io { what: format!("read {}", path.display()), source }),
    };
    InstallMarker::decode(&bytes).map(Some).map_err(|damage| InstallError::Marker { path, reason: damage.0 })
}

// ---------------------------------------------------------------- leader side

/// Pins on the purge horizon: while a snapshot at S is in flight, and for [`PIN_LINGER`] after its
/// stream ended (or until the follower's matched position reaches S), the WAL keeps S + 1 on, so
/// the follower can continue from the log. Cheap to clone; clones share the pins.
#[derive(Clone, Default)]
pub struct SnapshotPins(Arc<Mutex<Pins>>);

#[derive(Default)]
struct Pins {
    next_id: u64,
    pins: BTreeMap<u64, PinState>,
}

struct PinState {
    follower: NodeId,
    seqno: Seqno,
    /// When the stream ended; `None` while it runs.
    released: Option<Instant>,
}

/// One snapshot in flight; dropping it starts the linger.
pub struct SnapshotPin {
    pins: SnapshotPins,
    id: u64,
}

impl SnapshotPins {
    /// Pins `seqno + 1` for a snapshot at `seqno` sent to `follower`.
    pub fn pin(&self, follower: NodeId, seqno: Seqno) -> SnapshotPin {
        let mut pins = self.lock();
        let id = pins.next_id;
        pins.next_id += 1;
        pins.pins.insert(id, PinState { follower, seqno, released: None });
        SnapshotPin { pins: self.clone(), id }
    }

    /// The purge horizon to use instead of `horizon`: never past the first seqno a pinned snapshot's
    /// follower still needs. Expires lingering pins older than [`PIN_LINGER`] at `now`.
    pub fn purge_horizon(&self, horizon: Seqno, now: Instant) -> Seqno {
        let mut pins = self.lock();
        pins.pins
            .retain(|_, pin| pin.released.is_none_or(|at| now.saturating_duration_since(at) < PIN_LINGER));
        pins.pins.values().map(|pin| pin.seqno.next()).fold(horizon, Seqno::min)
    }

    /// The follower matched `matched` on the log: its lingering pins at or below it are released.
    pub fn follower_matched(&self, follower: NodeId, matched: Seqno) {
        self.lock()
            .pins
            .retain(|_, pin| !(pin.follower == follower && pin.released.is_some() && pin.seqno <= matched));
    }

    /// The pins held, for status: `(follower, snapshot seqno)`.
    pub fn pinned(&self) -> Vec<(NodeId, Seqno)> {
        self.lock().pins.values().map(|pin| (pin.follower, pin.seqno)).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pins> {
        self.0.lock().expect("pins lock is never held across a panic")
    }
}

impl SnapshotPin {
    /// Moves the pin up to `seqno` (once the snapshot's seqno is known); never down.
    pub fn raise_to(&self, seqno: Seqno) {
        if let Some(pin) = self.pins.lock().pins.get_mut(&self.id) {
            pin.seqno = pin.seqno.max(seqno);
        }
    }
}

impl Drop for SnapshotPin {
    fn drop(&mut self) {
        if let Some(pin) = self.pins.lock().pins.get_mut(&self.id) {
            pin.released = Some(Instant::now());
        }
    }
}

/// Serves this node's snapshots: cuts one per request into a file, pins the purge horizon, streams
/// the file in chunks, deletes it. At most [`SNAPSHOT_SERVES_MAX`] at once.
pub struct SnapshotSource {
    db: Arc<TidalDb>,
    wal: Wal,
    dir: PathBuf,
    pins: SnapshotPins,
    serves: Arc<tokio::sync::Semaphore>,
    next_id: AtomicU64,
}

impl SnapshotSource {
    /// A source over the node's engine and WAL; snapshot files go to `data_dir/snapshot`, where
    /// leftovers of earlier serves are removed now.
    pub fn new(
        db: Arc<TidalDb>,
        wal: Wal,
        data_dir: &Path,
        pins: SnapshotPins,
    ) -> Result<SnapshotSource, InstallError> {
        let dir = data_dir.join(SNAPSHOT_DIR_NAME);
        std::fs::create_dir_all(&dir).map_err(io("create snapshot directory"))?;
        for entry in std::fs::read_dir(&dir).map_err(io("list snapshot directory"))? {
            let path = entry.map_err(io("list snapshot directory"))?.path();
            if path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(SERVE_PREFIX))
            {
                remove_if_present(&path)?;
            }
        }
        let serves = Arc::new(tokio::sync::Semaphore::new(SNAPSHOT_SERVES_MAX));
        Ok(SnapshotSource { db, wal, dir, pins, serves, next_id: AtomicU64::new(0) })
    }

    /// The pins this source takes.
    pub fn pins(&self) -> &SnapshotPins {
        &self.pins
    }

    /// Answers a Snapshot RPC (call from `Handler::snapshot`). `resource_exhausted` while
    /// [`SNAPSHOT_SERVES_MAX`] serves run.
    pub fn serve(&self, request: SnapshotRequest) -> Result<SnapshotStream, tidal_net::ServiceError> {
        let permit = self.serves.clone().try_acquire_owned().map_err(|_| {
            tidal_net::ServiceError::ResourceExhausted(format!(
                "{SNAPSHOT_SERVES_MAX} snapshots are being served"
            ))
        })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{SERVE_PREFIX}{}-{id}.snap", request.node));
        let (tx, rx) = tokio::sync::mpsc::channel(SERVE_CHANNEL_CHUNKS);
        let (db, wal, pins) = (self.db.clone(), self.wal.clone(), self.pins.clone());
        // An async task doing one blocking call per step (the cut, then each chunk's read): a
        // blocking thread feeding the channel woke the RPC's task at OS-chosen moments, and a
        // simulation's replay differed (decisions/052).
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(error) = serve_file(db, wal, pins, request.node, path.clone(), &tx).await {
                tracing::warn!(follower = %request.node, "failed to serve a snapshot: {error}");
                let _ = tx.send(Err(tidal_net::ServiceError::Internal(error.to_string()))).await;
            }
            if let Err(error) = off_the_runtime(move || remove_if_present(&path)).await {
                tracing::warn!("failed to {error}");
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

type ChunkSender = tokio::sync::mpsc::Sender<Result<SnapshotChunk, tidal_net::ServiceError>>;

/// Cuts the snapshot into `path`, pins it, and sends it; returns early if the receiver goes away.
async fn serve_file(
    db: Arc<TidalDb>,
    wal: Wal,
    pins: SnapshotPins,
    follower: NodeId,
    path: PathBuf,
    tx: &ChunkSender,
) -> Result<(), InstallError> {
    let started = Instant::now();
    let (_pin, info, history, mut file) = off_the_runtime(move || {
        // Pinned BEFORE the cut, at what fjall holds now: the cut's seqno is at or above it, and a
        // checkpoint taken while the cut runs could otherwise let a purge pass the cut's seqno + 1.
        let pin = pins.pin(follower, db.flushed_applied_seqno());
        let file = File::create(&path).map_err(io("create snapshot file"))?;
        let (info, _) = db.export_snapshot(std::io::BufWriter::new(file), |seqno| wal.term_at(seqno))?;
        pin.raise_to(info.position.seqno);
        let history: Vec<TermSeqno> =
            wal.term_history().into_iter().filter(|entry| entry.seqno <= info.position.seqno).collect();
        Ok((pin, info, history, open(&path)?))
    })
    .await?;
    let cut = started.elapsed();
    let mut offset = 0u64;
    let mut history = Some(history);
    loop {
        let (data, back) = off_the_runtime(move || {
            let mut data = Vec::with_capacity(SNAPSHOT_CHUNK_BYTES);
            (&mut file)
                .take(SNAPSHOT_CHUNK_BYTES as u64)
                .read_to_end(&mut data)
                .map_err(io("read snapshot file"))?;
            Ok((data, file))
        })
        .await?;
        file = back;
        let end = offset + data.len() as u64;
        if data.is_empty() && end != info.bytes {
            return Err(stream_error(&format!("snapshot file ends at {end} of {} bytes", info.bytes)));
        }
        let last = end == info.bytes;
        let chunk = SnapshotChunk {
            position: info.position,
            history: history.take(),
            offset,
            total_bytes: info.bytes,
            data,
            last,
        };
        if tx.send(Ok(chunk)).await.is_err() {
            tracing::info!(%follower, sent = offset, "snapshot receiver went away");
            return Ok(());
        }
        offset = end;
        if last {
            break;
        }
    }
    tracing::info!(%follower, position = %info.position, bytes = info.bytes, ?cut, elapsed = ?started.elapsed(), "snapshot served");
    Ok(())
}

/// Runs engine and file work that does not wait for the node's threads off the async workers
/// ([`crate::blocking`]: inline in a simulation). Work that waits for them goes through
/// [`blocking`].
async fn off_the_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, InstallError> + Send + 'static,
) -> Result<T, InstallError> {
    crate::blocking::blocking(work).await.map_err(|error| stream_error(&error.to_string()))?
}

// ---------------------------------------------------------------- helpers

fn stream_error(reason: &str) -> InstallError {
    InstallError::Stream(reason.to_string())
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> InstallError {
    move |source| InstallError::Io { what: what.to_string(), source }
}

fn open(path: &Path) -> Result<std::io::BufReader<File>, InstallError> {
    let file = File::open(path).map_err(io("open snapshot file"))?;
    Ok(std::io::BufReader::with_capacity(256 * 1024, file))
}

fn sync_dir(dir: &Path) -> Result<(), InstallError> {
    File::open(dir).and_then(|dir| dir.sync_all()).map_err(io("fsync directory"))
}

fn remove_if_present(path: &Path) -> Result<(), InstallError> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(InstallError::Io { what: format!("remove {}", path.display()), source: error })
        }
        _ => Ok(()),
    }
}

/// Runs blocking work that waits for the node's own threads (the WAL reset, the applier taking the
/// installed state) on the blocking pool; in a simulation those threads take their turns meanwhile
/// ([`tidal_types::activity::carry_awaiting_threads`]).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, InstallError> + Send + 'static,
) -> Result<T, InstallError> {
    tokio::task::spawn_blocking(tidal_types::activity::carry_awaiting_threads(work))
        .await
        .map_err(|error| stream_error(&format!("blocking step failed: {error}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    #[test]
    fn the_marker_round_trips_and_any_damage_is_refused() {
        let marker = InstallMarker { position: at(3, 900), history: vec![at(1, 1), at(3, 500)] };
        let bytes = marker.encode();
        assert_eq!(InstallMarker::decode(&bytes).unwrap(), marker);
        for len in 0..bytes.len() {
            assert!(InstallMarker::decode(&bytes[..len]).is_err(), "truncation at {len}");
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(InstallMarker::decode(&flipped).is_err(), "flip of bit {bit}");
        }
    }

    #[test]
    fn pins_hold_the_horizon_while_in_flight_and_linger_until_matched_or_expired() {
        let pins = SnapshotPins::default();
        let now = Instant::now();
        assert_eq!(pins.purge_horizon(Seqno(500), now), Seqno(500));
        let pin = pins.pin(NodeId(2), Seqno(100));
        let other = pins.pin(NodeId(3), Seqno(300));
        assert_eq!(pins.purge_horizon(Seqno(500), now), Seqno(101));
        assert_eq!(pins.purge_horizon(Seqno(50), now), Seqno(50), "a pin never raises the horizon");
        let early = pins.pin(NodeId(4), Seqno(20));
        assert_eq!(pins.purge_horizon(Seqno(500), now), Seqno(21));
        early.raise_to(Seqno(400));
        early.raise_to(Seqno(10));
        assert_eq!(pins.pinned().iter().find(|(node, _)| *node == NodeId(4)), Some(&(NodeId(4), Seqno(400))));
        drop(early);
        pins.follower_matched(NodeId(4), Seqno(400));
        pins.follower_matched(NodeId(2), Seqno(200));
        assert_eq!(pins.purge_horizon(Seqno(500), now), Seqno(101), "in flight: matched does not release it");
        drop(pin);
        assert_eq!(pins.purge_horizon(Seqno(500), Instant::now()), Seqno(101), "it lingers after the stream");
        pins.follower_matched(NodeId(3), Seqno(200));
        pins.follower_matched(NodeId(2), Seqno(99));
        assert_eq!(
            pins.purge_horizon(Seqno(500), Instant::now()),
            Seqno(101),
            "below the pin, or another follower"
        );
        pins.follower_matched(NodeId(2), Seqno(100));
        assert_eq!(pins.purge_horizon(Seqno(500), Instant::now()), Seqno(301));
        drop(other);
        let later = Instant::now() + PIN_LINGER + Duration::from_secs(1);
        assert_eq!(pins.purge_horizon(Seqno(500), later), Seqno(500), "lingering pins expire");
        assert!(pins.pinned().is_empty());
    }
}
