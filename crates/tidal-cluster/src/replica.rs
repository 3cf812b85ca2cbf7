//! One node of a cluster: the WAL hook, the follower receiver, the pull (catch-up) client and
//! server, and the leader's ShipQueues, wired around the decisions of `tidal_protocol`.
//!
//! Terms and leadership come from openraft ([`crate::control`]); taking and leaving office is in
//! [`office`]. Everything else follows PROTOCOL.md:
//! - the leader's writer hands each fsynced drain to the applier, the ship feed and its own matched
//!   position; commit advances when a majority has matched (quorum) or at once (leader mode);
//! - a follower decides every ship and pulled chunk with [`decide_ship`], appends byte-identical
//!   batches to its own WAL (WAL first), fsyncs, then acks; it applies only up to the commit
//!   frontier the leader sends;
//! - a follower that lacks `prev` answers `Gap` and pulls from its last durable position.
//!
//! Delicate: the term lock ([`TermGate`]) serializes decide → append → fsync → ack with persisting a
//! vote and answering a probe, so the log view the decision sees is exactly the durable log (the
//! WAL's positions are durable-only) and an ack always names the term it was appended in. It is held
//! across the fsync (simpler than releasing it for the fsync and re-checking the term after, the
//! first design, and equally safe: no vote can slip between the append and the ack; PROTOCOL.md,
//! "The term lock").

mod members;
mod office;
mod promote;
mod reconcile;

pub use members::{MemberChange, MemberReport, Members};
pub use promote::{PromoteReport, WriteTicket};
pub use reconcile::{PeerReconcile, RECONCILE_INTERVAL};

use crate::applier::{ApplierSender, DurableFrontier};
use crate::commit_state::CommitState;
use crate::control::{ControlPlane, ControlTiming, TermGate};
use crate::refusal::Refusal;
use crate::ship_feed::{ShipFeed, TailRead};
use crate::snapshot::{
    fetch_snapshot, install_fetched, FetchOutcome, InstallOutcome, SnapshotPins, SnapshotSource,
};
use crate::spec::{ClusterSpec, Durability};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;
use tidal_protocol::{
    answer_probe, append_only, authority, decide_ship, divergence_point, next_after, repairs_a_halt,
    replaced_from, resume_after_gap, waits_before_next, Authority, BatchMeta, Located, LogView, Origin,
    ProbeAnswer, Reply, ShipMeta, Step, Verdict,
};
// tokio's clock, not std's: the same instant in production (tokio reads std's clock), and the
// simulated clock under turmoil, so heartbeat pacing, pull and install rate limits and the
// promote/membership deadlines follow simulated time there (decisions/008, "Determinism").
use tidal_core::{RaftStore, RaftWrite, TidalDb};
use tidal_net::{
    Chunk, ChunkOutcome, ChunkStream, NetError, Peer, Probe, ProbeOutcome, ProbeReply, Pull, RaftCall, Ship,
    ShipAnswer, ShipOutcome, SnapshotRequest, SnapshotStream,
};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::{Batch, FlushedHook, Position, Wal};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// Bytes per ship: big enough to carry a busy second of small batches in a few
/// messages, far below the 64 MiB + slack message limit (a larger single batch still goes alone).
pub const SHIP_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Bound on one pulled chunk: a follower appends a chunk with one write and one fsync (fewer
/// fsyncs with bigger chunks), but it starts appending, and applying, only once a whole chunk
/// arrived and was verified (a longer pipeline fill with bigger chunks). 8 MiB measured no better
/// than 4 MiB on the loaded machine of experiments/024, so it stays at the ship size. Below
/// tidal-net's message bound; a single batch larger than this still travels alone.
pub const PULL_CHUNK_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Chunks a pull server keeps ready while the follower takes the previous ones: with
/// [`PULL_CHUNK_BYTES_MAX`] this bounds its read-ahead memory per pull.
const PULL_CHUNKS_AHEAD: usize = 4;
/// Heartbeat (empty ship) interval when nothing else is sent.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
/// How long a commit notice may take: it is only worth anything while its ship is in flight.
const NOTICE_TIMEOUT: Duration = Duration::from_millis(500);
/// Retry backoff bounds for a ShipQueue whose follower does not answer.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A pull that receives nothing for this long is abandoned (and retried later).
const PULL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pulls started by gaps are at least this far apart (rate limit per source).
const PULL_INTERVAL_MIN: Duration = Duration::from_millis(200);
/// Automatic snapshot installs on this node start at least this far apart: a follower that keeps
/// needing one (a leader purging faster than it can follow) does not cut and move the whole state
/// in a loop.
pub const SNAPSHOT_INSTALL_INTERVAL_MIN: Duration = Duration::from_secs(5);

/// The WAL hook of a cluster node.
pub struct ReplicaHook {
    applier: ApplierSender,
    commit: Arc<CommitState>,
    feed: ShipFeed,
    me: NodeId,
    durable: Arc<DurableFrontier>,
    /// Written batches the applier's full input did not take before the fsync; handed over after
    /// it (in order: once one is deferred, every later one waits behind it).
    deferred: Vec<Batch>,
}

impl ReplicaHook {
    /// The hook of node `me`: applier input, commit bookkeeping, the ship feed (the leader's tail)
    /// and the engine's durability gate (woken at each flush).
    pub fn new(
        applier: ApplierSender,
        commit: Arc<CommitState>,
        feed: ShipFeed,
        me: NodeId,
        durable: Arc<DurableFrontier>,
    ) -> ReplicaHook {
        ReplicaHook { applier, commit, feed, me, durable, deferred: Vec::new() }
    }
}

impl FlushedHook for ReplicaHook {
    fn written(&mut self, batches: &[Batch]) {
        // The applier takes them now, before our fsync: it applies only what is committed, and a
        // batch is committed once a majority fsynced it (the leader's commit also never passes its
        // own durable position), so a follower shows what the cluster holds without waiting for its
        // own disk (decisions/025). The engine's gate keeps fjall behind our durable WAL. Never
        // waiting here: the applier may be waiting for our fsync (see `ApplierSender`).
        if !batches.is_empty() {
            if self.deferred.is_empty() {
                if let Err(back) = self.applier.try_flushed(batches.to_vec()) {
                    self.deferred = back;
                }
            } else {
                self.deferred.extend_from_slice(batches);
            }
        }
        // Shipped while our own fsync runs (decisions/023, 027), so followers fsync while we do. Safe
        // because our commit never passes our own durable position (CommitState) and a restart never
        // resumes a term this node led before it (office.rs), so what a crash loses here was never
        // committed and is never written again with other contents under the same term.
        self.feed.push(batches);
    }

    fn flushed(&mut self, batches: &[Batch]) {
        let Some(last) = batches.last() else { return };
        let position = TermSeqno { term: last.term(), seqno: last.last_seqno() };
        self.durable.notify();
        // Durable now: the engine's gate lets the applier's flush through, so waiting is safe.
        if !self.deferred.is_empty() {
            self.applier.flushed(std::mem::take(&mut self.deferred));
        }
        self.applier.resend_commit();
        // While in office, the leader's own durable position counts as matched. CommitState ignores
        // it unless this node holds office in the batch's term (stepping down is synchronous with
        // persisting a higher vote, so a deposed leader never counts its own batches).
        self.commit.record_matched(self.me, position.term, position);
    }

    fn truncated(&mut self, from: Seqno) {
        // Ordered before any later flush: the applier never applies a quarantined batch, and the
        // ship tail never serves one.
        self.applier.truncated(from);
    }
}

/// A node's role, as status reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Follows a leader (or knows none yet).
    Follower,
    /// Standing for election, or elected and taking office (not serving yet).
    Candidate,
    /// Leader in office: LeaderStart committed and applied.
    Leader,
}

impl Role {
    /// The status name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Leader => "leader",
        }
    }
}

/// What the leader knows of each follower, for status.
#[derive(Clone, Debug, Default)]
pub struct FollowerProgress {
    /// Last position matched in this term.
    pub matched: TermSeqno,
    /// Last reported durable frontier.
    pub durable: Seqno,
    /// Last reported applied frontier.
    pub applied: Seqno,
    /// When it last answered.
    pub last_ack: Option<Instant>,
    /// Whether it is being caught up by pull (the tail no longer holds what it needs).
    pub pulling: bool,
}

/// This node's own snapshot installs (follower side), for status and metrics.
#[derive(Clone, Debug, Default)]
pub struct InstallStats {
    /// Installs completed since start.
    pub installed: u64,
    /// Installs that failed (transfer or install) since start.
    pub failed: u64,
    /// Position of the last completed install.
    pub last_position: Option<TermSeqno>,
}

/// This node's pulls (follower side: catch-up from another node's log), for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct PullStats {
    /// Pulls that ended (the stream ran out, or the source's log diverged or was purged).
    pub pulls: u64,
    /// Batches they appended to this node's WAL.
    pub batches: u64,
    /// Encoded bytes of those batches.
    pub bytes: u64,
    /// Wall time of those pulls, from the request to the last chunk durable here.
    pub seconds: f64,
}

/// What a replica needs besides its WAL and commit state.
pub struct ReplicaParts {
    /// The cluster.
    pub spec: ClusterSpec,
    /// This node.
    pub me: NodeId,
    /// The data directory (`stream_baseline` lives there).
    pub data_dir: PathBuf,
    /// The control plane's store.
    pub store: RaftStore,
    /// Election timing.
    pub timing: ControlTiming,
    /// The engine (snapshot installs replace its state).
    pub db: Arc<TidalDb>,
    /// The applier's input (an install makes it drop its pending batches).
    pub applier: ApplierSender,
    /// Serves this node's snapshots; its pins bound the WAL purge horizon.
    pub snapshots: Arc<SnapshotSource>,
    /// How peers are reached (the OS's TCP in production; the simulation's network in harness/sim).
    pub connector: tidal_net::Connector,
    /// Joining a running cluster: with nothing stored, wait to be added instead of writing the
    /// cluster file's membership as the first control entry.
    pub join: bool,
    /// The node's fatal state: raised by a failed vote or a stopped control plane here; once
    /// raised (by any source) the replica leaves office for good (`office.rs`).
    pub fatal: crate::fatal::Fatal,
}

/// A cluster node's replication side.
pub struct Replica {
    spec: ClusterSpec,
    me: NodeId,
    data_dir: PathBuf,
    store: RaftStore,
    timing: ControlTiming,
    wal: Wal,
    commit: Arc<CommitState>,
    feed: ShipFeed,
    /// Every other member (voters and learners), as openraft's membership says; see `members.rs`.
    peers: RwLock<BTreeMap<NodeId, Peer>>,
    /// The membership this node knows (openraft's, once its metrics arrive; the cluster file before).
    members: watch::Sender<Members>,
    /// Held while this leader changes the membership (single flight).
    changing_members: tokio::sync::Mutex<()>,
    /// Set while a membership change counts commit against a configuration openraft has not reported
    /// yet: metrics do not overwrite the commit quorum meanwhile.
    quorum_pinned: AtomicBool,
    connector: tidal_net::Connector,
    join: bool,
    gate: Arc<TermGate>,
    control: OnceLock<Arc<ControlPlane>>,
    /// The leader as last learned (0: none known).
    leader_hint: AtomicU64,
    role: Mutex<Role>,
    /// `Some(term)` while this node serves as leader of `term`.
    serving: watch::Sender<Option<Term>>,
    /// The running office (term and its stop signal).
    office: Mutex<Option<(Term, watch::Sender<bool>)>>,
    baseline: Mutex<TermSeqno>,
    pulling: AtomicBool,
    last_pull: Mutex<Option<Instant>>,
    progress: Mutex<BTreeMap<NodeId, FollowerProgress>>,
    halted: Mutex<Option<String>>,
    applied: watch::Receiver<Seqno>,
    /// Follower: when the leader was last heard (a ship or heartbeat in our term).
    last_heard: Mutex<Option<Instant>>,
    /// Set when the replica stops: background tasks end.
    stopped: watch::Sender<bool>,
    /// Followers whose queue an operator asked to heal.
    heal_requests: Mutex<std::collections::BTreeSet<NodeId>>,
    db: Arc<TidalDb>,
    applier: ApplierSender,
    snapshots: Arc<SnapshotSource>,
    /// Held while this node fetches and installs a snapshot (one at a time: the files are shared).
    installing: tokio::sync::Mutex<()>,
    /// The highest term this process opened as leader (0: none). A term this node led in an earlier
    /// process is not resumed (office.rs, decisions/023).
    opened_term: AtomicU64,
    /// The persisted vote's term when this process started. openraft makes a node leader of a
    /// term at or below it only by restoring an election an earlier process won: such a term is
    /// handed over, never resumed (office.rs, decisions/057).
    boot_term: Term,
    /// When the last automatic install started (rate limit).
    last_install: Mutex<Option<Instant>>,
    installs: Mutex<InstallStats>,
    pulls: Mutex<PullStats>,
    /// Set while a leadership transfer runs on this leader (single flight).
    promoting: AtomicBool,
    /// The node leadership is being handed to, while this leader refuses new writes (0: none).
    handing_to: AtomicU64,
    /// Client writes between their admission and their WAL append (see `admit_write`).
    writes_in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Refused replication input by class (metrics): see [`Replica::refusals`].
    refusals: Mutex<BTreeMap<Refusal, u64>>,
    /// Offices given up past the office deadline (metrics): see [`Replica::handovers`].
    handovers: AtomicU64,
    /// Follower: the leader's commit notices and how far our log is known to match its log.
    leader_commit: Mutex<LeaderCommit>,
    /// Commit-notice counters (metrics): see [`NoticeStats`].
    notice_stats: [AtomicU64; 4],
    /// The node's fatal state (see [`ReplicaParts::fatal`]).
    fatal: crate::fatal::Fatal,
}

/// Commit notices (decisions/016), for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoticeStats {
    /// Leader: notices sent (quiet ones queued on their stream; older peers' answered).
    pub sent: u64,
    /// Leader: notices that failed (a full quiet stream; for older peers no answer within the
    /// deadline, transport error).
    pub failed: u64,
    /// Follower: notices received in our term.
    pub received: u64,
    /// Follower: times a notice moved our commit frontier past what the ships alone gave.
    pub advanced: u64,
}

const NOTICE_SENT: usize = 0;
const NOTICE_FAILED: usize = 1;
const NOTICE_RECEIVED: usize = 2;
const NOTICE_ADVANCED: usize = 3;

/// Follower: what the leader of `term` told us in commit notices (`notified`), and the last position
/// of a live ship of `term` we accepted and fsynced (`matched`). Everything up to `matched` is the
/// leader's log (log matching), so `min(notified, matched)` is committed AND held durably here: the
/// frontier a notice lets us apply without waiting for the next ship (decisions/016).
///
/// Delicate: only live ships count for `matched` (a pulled chunk may come from a follower whose log
/// still holds an uncommitted suffix of an older term); a snapshot install forgets it (the log is
/// replaced); it only moves to a higher term, never back.
#[derive(Clone, Copy, Debug, Default)]
struct LeaderCommit {
    term: Term,
    notified: Seqno,
    matched: Seqno,
}

impl LeaderCommit {
    /// The state for `term`: reset when `term` is newer; `None` when it is older.
    fn in_term(&mut self, term: Term) -> Option<&mut LeaderCommit> {
        if term > self.term {
            *self = LeaderCommit { term, ..LeaderCommit::default() };
        }
        (term == self.term).then_some(self)
    }

    fn frontier(&self) -> Seqno {
        self.notified.min(self.matched)
    }
}

/// What `heal` did (or, with `dry_run`, would do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealReport {
    /// The follower.
    pub node: NodeId,
    /// Its last matched position in this term.
    pub matched: TermSeqno,
    /// Its last reported applied seqno.
    pub applied: Seqno,
    /// What the leader does.
    pub action: String,
}

/// Key of the commit hint in the control plane's store: a seqno known committed, so a restart may
/// replay (apply) the WAL up to it without waiting for the leader.
const KEY_COMMIT_HINT: &[u8] = b"commit_hint";
/// How often the commit hint is saved.
const COMMIT_HINT_INTERVAL: Duration = Duration::from_millis(200);

/// The saved commit hint (0 if none).
pub fn commit_hint(store: &RaftStore) -> Seqno {
    store
        .get(KEY_COMMIT_HINT)
        .ok()
        .flatten()
        .and_then(|bytes| <[u8; 8]>::try_from(bytes.as_slice()).ok())
        .map_or(Seqno::ZERO, |bytes| Seqno(u64::from_le_bytes(bytes)))
}

impl Replica {
    /// Moves the log from `seqno` on into quarantine through the WAL writer, awaited here (no
    /// blocking thread waits for the writer: in the simulation it is done between two steps,
    /// decisions/051).
    pub(crate) async fn quarantine_from(&self, seqno: Seqno) -> Result<tidal_wal::QuarantineReport, String> {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        self.wal
            .quarantine_from_then(seqno, move |result| drop(done_tx.send(result)))
            .map_err(|e| format!("quarantine from {seqno}: {e}"))?;
        done_rx
            .await
            .map_err(|_| format!("quarantine from {seqno}: the WAL writer stopped"))?
            .map_err(|e| format!("quarantine from {seqno}: {e}"))
    }

    /// Builds the replica over an opened WAL. `commit` and `feed` are the ones given to the hook;
    /// `gate` is the term lock openraft's vote storage takes.
    pub fn new(
        parts: ReplicaParts,
        wal: Wal,
        commit: Arc<CommitState>,
        feed: ShipFeed,
        applied: watch::Receiver<Seqno>,
        gate: Arc<TermGate>,
    ) -> Result<Arc<Replica>, String> {
        let fatal = parts.fatal.clone();
        let ReplicaParts {
            spec, me, data_dir, store, timing, db, applier, snapshots, connector, join, ..
        } = parts;
        spec.validate()?;
        spec.node(me).ok_or_else(|| format!("node {me} is not in the cluster file"))?;
        let members = Members::from_spec(&spec);
        let mut peers = BTreeMap::new();
        for node in spec.nodes.iter().filter(|node| node.id != me) {
            peers.insert(node.id, members::connect(&spec, node, &connector)?);
        }
        let (serving, _) = watch::channel(None);
        let boot_term = gate.term();
        let replica = Arc::new(Replica {
            spec,
            me,
            data_dir,
            store,
            timing,
            wal,
            commit,
            feed,
            peers: RwLock::new(peers),
            members: watch::channel(members).0,
            changing_members: tokio::sync::Mutex::new(()),
            quorum_pinned: AtomicBool::new(false),
            connector,
            join,
            gate,
            control: OnceLock::new(),
            leader_hint: AtomicU64::new(0),
            role: Mutex::new(Role::Follower),
            serving,
            office: Mutex::new(None),
            baseline: Mutex::new(TermSeqno::default()),
            pulling: AtomicBool::new(false),
            last_pull: Mutex::new(None),
            progress: Mutex::new(BTreeMap::new()),
            halted: Mutex::new(None),
            applied,
            last_heard: Mutex::new(None),
            stopped: watch::channel(false).0,
            heal_requests: Mutex::new(std::collections::BTreeSet::new()),
            db,
            applier,
            snapshots,
            installing: tokio::sync::Mutex::new(()),
            opened_term: AtomicU64::new(0),
            boot_term,
            last_install: Mutex::new(None),
            installs: Mutex::new(InstallStats::default()),
            pulls: Mutex::new(PullStats::default()),
            promoting: AtomicBool::new(false),
            handing_to: AtomicU64::new(0),
            writes_in_flight: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            refusals: Mutex::new(BTreeMap::new()),
            handovers: AtomicU64::new(0),
            leader_commit: Mutex::new(LeaderCommit::default()),
            notice_stats: Default::default(),
            fatal,
        });
        // Losing office is synchronous with persisting a higher vote (PROTOCOL.md, "Losing office").
        let weak = Arc::downgrade(&replica);
        replica.gate.on_raise(Box::new(move |term| {
            if let Some(replica) = weak.upgrade() {
                replica.deposed(term);
            }
        }));
        Ok(replica)
    }

    /// This node.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The leader as last learned, if any.
    pub fn leader(&self) -> Option<NodeId> {
        match self.leader_hint.load(Ordering::SeqCst) {
            0 => None,
            id => Some(NodeId(id)),
        }
    }

    /// Whether this node serves as leader (in office, LeaderStart committed and applied).
    pub fn is_leader(&self) -> bool {
        self.serving.borrow().is_some()
    }

    /// The term this node serves as leader in, or why an operator verb must go elsewhere (the leader
    /// this node knows).
    pub(crate) fn serving_term(&self) -> Result<Term, String> {
        let serving = *self.serving.borrow();
        serving.ok_or_else(|| {
            format!("node {} is not the serving leader; ask the leader ({:?})", self.me, self.leader())
        })
    }

    /// `Some(term)` while this node serves as leader; watch it to learn when office is lost.
    pub fn serving(&self) -> watch::Receiver<Option<Term>> {
        self.serving.subscribe()
    }

    /// The role, for status.
    ///
    /// `Leader` only while this node serves in the term it has persisted: between a higher vote
    /// (which stops the serving at once) and the office watcher's next step, the stored role still
    /// says leader, and status must not pair it with the new term (the simulation's "two leaders in
    /// one term" check saw exactly that, partition-heal seed 43).
    pub fn role(&self) -> Role {
        let role = *self.role.lock().expect("role lock is never held across a panic");
        if role == Role::Leader && *self.serving.borrow() != Some(self.gate.term()) {
            return Role::Follower;
        }
        role
    }

    /// The role with the term it holds in, read consistently (status): a `Leader` answer means this
    /// node served in exactly that term.
    pub fn role_in_term(&self) -> (Role, Term) {
        // Terms move a few times a second at most; a read that keeps racing them reports follower.
        for _ in 0..8 {
            let before = self.gate.term();
            let role = self.role();
            if self.gate.term() == before {
                return (role, before);
            }
        }
        (Role::Follower, self.gate.term())
    }

    /// The stream baseline `(T, B(T))` of this node's current (or last) office: its term, and the
    /// last seqno before that term's LeaderStart.
    pub fn baseline(&self) -> TermSeqno {
        *self.baseline.lock().expect("baseline lock is never held across a panic")
    }

    /// How long since this follower last heard its leader (None: never, or this node leads).
    pub fn leader_silence(&self) -> Option<Duration> {
        self.last_heard.lock().expect("heard lock is never held across a panic").map(|at| at.elapsed())
    }

    /// The control plane, once started.
    pub fn control(&self) -> Option<&Arc<ControlPlane>> {
        self.control.get()
    }

    /// The cluster.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The commit frontier.
    pub fn commit_seqno(&self) -> Seqno {
        self.commit.commit()
    }

    /// The current (persisted vote) term.
    pub fn term(&self) -> Term {
        self.gate.term()
    }

    /// Per-follower progress (leader).
    pub fn progress(&self) -> BTreeMap<NodeId, FollowerProgress> {
        self.progress.lock().expect("progress lock is never held across a panic").clone()
    }

    /// The pins served snapshots hold on the WAL purge horizon.
    pub fn snapshot_pins(&self) -> &SnapshotPins {
        self.snapshots.pins()
    }

    /// This node's snapshot installs.
    pub fn install_stats(&self) -> InstallStats {
        self.installs.lock().expect("install stats lock is never held across a panic").clone()
    }

    /// This node's pulls that ended, for metrics.
    pub fn pull_stats(&self) -> PullStats {
        *self.pulls.lock().expect("pull stats lock is never held across a panic")
    }

    /// Replication input this node refused, by class ([`Refusal`] says what each means).
    pub fn refusals(&self) -> BTreeMap<Refusal, u64> {
        self.refusals.lock().expect("refusals lock is never held across a panic").clone()
    }

    /// How many offices this node gave up because it could not take them within the office deadline
    /// (it asked the voter with the greatest log to stand instead; PROTOCOL.md, "Taking office").
    pub fn handovers(&self) -> u64 {
        self.handovers.load(Ordering::SeqCst)
    }

    fn count_refusal(&self, class: Refusal) {
        *self
            .refusals
            .lock()
            .expect("refusals lock is never held across a panic")
            .entry(class)
            .or_default() += 1;
    }

    /// Why the receiver halted, if it did (a protocol violation: the node must be looked at).
    pub fn halted(&self) -> Option<String> {
        self.halted.lock().expect("halt lock is never held across a panic").clone()
    }

    /// Starts the control plane and the background work: the office watcher (which takes and
    /// leaves office as openraft decides) and the commit-hint saver.
    pub async fn start(self: &Arc<Self>) -> Result<(), String> {
        let control = ControlPlane::start(
            self.me.0,
            &self.spec,
            self.timing,
            self.store.clone(),
            self.gate.clone(),
            self.connector.clone(),
            !self.join,
            self.fatal.clone(),
        )
        .await?;
        let control = Arc::new(control);
        if self.control.set(control.clone()).is_err() {
            return Err("replica started twice".into());
        }
        tokio::spawn(self.clone().watch_fatal(control.clone()));
        tokio::spawn(self.clone().watch_control(control));
        tokio::spawn(self.clone().save_commit_hints());
        tokio::spawn(self.clone().reconcile_loop());
        Ok(())
    }

    /// Stops the control plane (a clean shutdown: a follower then elects another leader).
    pub async fn stop(&self) {
        self.stopped.send_replace(true);
        self.leave_office();
        if let Some(control) = self.control.get() {
            control.shutdown().await;
        }
    }

    async fn save_commit_hints(self: Arc<Self>) {
        let mut saved = Seqno::ZERO;
        let mut stopped = self.stopped.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(COMMIT_HINT_INTERVAL) => {}
                _ = stopped.wait_for(|stopped| *stopped) => return,
            }
            let commit = self.commit.commit();
            if commit > saved {
                let put = RaftWrite::Put(KEY_COMMIT_HINT.to_vec(), commit.get().to_le_bytes().to_vec());
                if let Err(error) = self.store.write(vec![put], false) {
                    tracing::warn!("failed to save the commit hint: {error}");
                }
                saved = commit;
            }
        }
    }

    /// Operator `heal`: the leader resets `node`'s ShipQueue to that follower's last matched position
    /// and nudges it to pull (no redelivery scan, no per-item traffic). Only the leader heals.
    pub fn heal(&self, node: NodeId, dry_run: bool) -> Result<HealReport, String> {
        self.serving_term()?;
        if node == self.me || self.peer(node).is_none() {
            return Err(format!("node {node} is not a follower of this leader"));
        }
        let progress = self.progress().get(&node).cloned().unwrap_or_default();
        let verb = if dry_run { "would reset" } else { "reset" };
        let report = HealReport {
            node,
            matched: progress.matched,
            applied: progress.applied,
            action: format!(
                "{verb} the ShipQueue to {} and nudge the follower to pull from there",
                progress.matched
            ),
        };
        if !dry_run {
            self.heal_requests.lock().expect("heal lock is never held across a panic").insert(node);
        }
        Ok(report)
    }

    /// Operator `catchup`: this follower pulls from its leader now. Returns whether a pull started.
    pub fn catchup(self: &Arc<Self>) -> Result<bool, String> {
        if self.is_leader() {
            return Err("the leader has nothing to catch up from".into());
        }
        if self.leader().is_none() {
            return Err("no leader is known yet".into());
        }
        Ok(self.clone().start_pull("catchup"))
    }

    fn quorum(&self) -> bool {
        self.spec.durability == Durability::Quorum
    }

    // ---------------------------------------------------------------- leader: one queue per follower

    async fn ship_queue(
        self: Arc<Self>,
        follower: NodeId,
        peer: Peer,
        term: Term,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut fed = self.feed.subscribe();
        let mut commits = self.commit.subscribe();
        let (notices, notices_rx) = watch::channel(Seqno::ZERO);
        tokio::spawn(Replica::commit_notifier(
            Arc::downgrade(&self),
            follower,
            peer.clone(),
            term,
            notices_rx,
        ));
        // Optimistic start at our own end; a follower that lacks it answers Gap with its last.
        let mut after = self.feed.last();
        let mut sent_commit = Seqno::ZERO;
        let mut backoff = BACKOFF_MIN;
        let mut last_sent = Instant::now() - HEARTBEAT_INTERVAL;
        loop {
            if *stop.borrow() || self.gate.term() != term {
                return;
            }
            if self.peer(follower).is_none() {
                tracing::info!(%follower, "no longer a member: its ShipQueue ends");
                return;
            }
            if self.heal_requests.lock().expect("heal lock is never held across a panic").remove(&follower) {
                let matched = self.progress().get(&follower).map(|p| p.matched).unwrap_or_default();
                // Its matched position may be of an earlier office: resume from our own log.
                after = resume_after_gap(matched, &self.leader_view());
                tracing::info!(%follower, %matched, %after, "heal: queue reset to the follower's matched position; nudging it to pull");
                let _ = peer.nudge("heal").await;
            }
            let commit = self.commit.commit();
            let batches = match self.feed.read_after(after, SHIP_BYTES_MAX) {
                TailRead::Batches(batches) => batches,
                TailRead::Rotated { .. } | TailRead::Unknown => {
                    // The tail cannot serve this follower: it pulls from our segments (the nudge is
                    // single-flight on its side). Pace the nudges, then send heartbeats from our end so
                    // its answers tell us where it has got to.
                    self.set_pulling(follower, true);
                    let _ = peer.nudge("behind the leader's ship tail").await;
                    tokio::time::sleep(HEARTBEAT_INTERVAL).await;
                    after = self.feed.last();
                    Vec::new()
                }
            };
            let heartbeat_due = last_sent.elapsed() >= HEARTBEAT_INTERVAL;
            if batches.is_empty() && !heartbeat_due && commit != sent_commit {
                // Only the commit frontier moved: a quiet notice carries it, with no ship to answer
                // (decisions/027). Lost with a broken stream, it rides the next ship or heartbeat.
                match peer.commit_quiet(term, self.me, commit) {
                    Ok(()) => {
                        self.count_notice(NOTICE_SENT);
                        sent_commit = commit;
                        continue;
                    }
                    Err(tidal_net::NotSent::Full) => self.count_notice(NOTICE_FAILED),
                    Err(tidal_net::NotSent::Unavailable) => {}
                }
            }
            let due = !batches.is_empty() || commit != sent_commit || heartbeat_due;
            if !due {
                tokio::select! {
                    _ = fed.changed() => {}
                    _ = commits.changed() => {}
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(HEARTBEAT_INTERVAL) => {}
                }
                continue;
            }
            if !self.holds(after) {
                // Never reached by the rules above; if a regression gets here, the follower's prev
                // check would pass a position we never wrote. Resume from our own log instead.
                self.count_refusal(Refusal::UnheldPrev);
                let resumed = resume_after_gap(after, &self.leader_view());
                tracing::error!(%follower, prev = %after, %resumed, "a ship's prev is not in our log; not sent");
                after = resumed;
                continue;
            }
            let ship = Ship {
                cluster_id: self.spec.cluster_id.clone(),
                term,
                leader: self.me,
                prev: after,
                commit,
                baseline: self.baseline(),
                batches,
            };
            last_sent = Instant::now();
            match self.ship_with_notices(&peer, &ship, &mut commits, &notices).await {
                Ok(answer) => {
                    // A commit handed to the notifier while the ship was out reaches the follower
                    // from there: no second notice for it (zero while notices are off).
                    sent_commit = commit.max(*notices.borrow());
                    if answer.term == term {
                        // It was still in our term when it answered: the lease and readiness count it.
                        self.commit.record_contact(follower, term, last_sent);
                    }
                    let reply;
                    (after, reply) = self.on_answer(follower, &ship, answer, after);
                    if waits_before_next(&reply) {
                        // Not yet in our term, fenced, refused or halted: the same ship at once
                        // would get the same answer (it did, in a loop, before decisions/057).
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    } else {
                        backoff = BACKOFF_MIN;
                    }
                }
                Err(error) => {
                    tracing::debug!(%follower, "failed to ship: {error}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Sends `ship` and waits for the answer; while it is in flight, every advance of the commit
    /// frontier past what the ship carries goes to the follower's notifier (a follower whose fsync
    /// finishes after another follower's ack then applies at once, not a round trip later).
    async fn ship_with_notices(
        &self,
        peer: &Peer,
        ship: &Ship,
        commits: &mut watch::Receiver<Seqno>,
        notices: &watch::Sender<Seqno>,
    ) -> Result<ShipAnswer, NetError> {
        let call = peer.ship(ship);
        tokio::pin!(call);
        let mut watching = true;
        loop {
            tokio::select! {
                biased;
                answer = &mut call => return answer,
                changed = commits.changed(), if watching => {
                    if changed.is_err() {
                        watching = false;
                        continue;
                    }
                    let commit = *commits.borrow_and_update();
                    notices.send_if_modified(|sent| {
                        let newer = commit > ship.commit && commit > *sent;
                        if newer {
                            *sent = commit;
                        }
                        newer
                    });
                }
            }
        }
    }

    /// One per ShipQueue: sends the commit notices it is handed, one at a time, the newest first;
    /// ends with its queue. It holds the replica only weakly and never across a call, so a stopping
    /// node is not kept alive by a notice in flight (its engine must be released for a restart).
    async fn commit_notifier(
        replica: std::sync::Weak<Replica>,
        follower: NodeId,
        peer: Peer,
        term: Term,
        mut notices: watch::Receiver<Seqno>,
    ) {
        while notices.changed().await.is_ok() {
            let commit = *notices.borrow_and_update();
            let me = match replica.upgrade() {
                Some(replica) if replica.gate.term() == term => replica.me,
                _ => return,
            };
            // Quiet: queued on the notice stream, never waited for (decisions/027); an older peer
            // gets the notice as a call it answers.
            let outcome = match peer.commit_quiet(term, me, commit) {
                Ok(()) => Ok(()),
                Err(tidal_net::NotSent::Full) => Err("the notice stream is full".to_string()),
                Err(tidal_net::NotSent::Unavailable) => {
                    peer.commit(term, me, commit, NOTICE_TIMEOUT).await.map(drop).map_err(|e| e.to_string())
                }
            };
            let Some(replica) = replica.upgrade() else { return };
            match outcome {
                Ok(_) => replica.count_notice(NOTICE_SENT),
                Err(error) => {
                    replica.count_notice(NOTICE_FAILED);
                    tracing::debug!(%follower, "commit notice failed: {error}");
                }
            }
        }
    }

    fn set_pulling(&self, follower: NodeId, pulling: bool) {
        self.progress
            .lock()
            .expect("progress lock is never held across a panic")
            .entry(follower)
            .or_default()
            .pulling = pulling;
    }

    /// Handles a follower's answer; returns the position to ship after next and the reply as the
    /// decision core saw it.
    fn on_answer(
        &self,
        follower: NodeId,
        ship: &Ship,
        answer: ShipAnswer,
        after: TermSeqno,
    ) -> (TermSeqno, Reply) {
        {
            let mut progress = self.progress.lock().expect("progress lock is never held across a panic");
            let entry = progress.entry(follower).or_default();
            entry.durable = answer.durable;
            entry.applied = answer.applied;
            entry.last_ack = Some(Instant::now());
            if let ShipOutcome::Matched(matched) = answer.outcome {
                entry.matched = matched;
                entry.pulling = false;
            }
        }
        if let ShipOutcome::Matched(matched) = answer.outcome {
            // A follower that installed one of our snapshots and has caught up on the log no longer
            // needs the purge horizon pinned.
            self.snapshots.pins().follower_matched(follower, matched.seqno);
        }
        let reply = match answer.outcome {
            ShipOutcome::Matched(matched) => {
                self.commit.record_matched(follower, answer.term, matched);
                Reply::Matched(matched)
            }
            ShipOutcome::Gap(last) => Reply::Gap(last),
            ShipOutcome::Fenced => {
                tracing::error!(%follower, term = %answer.term, "a follower has a higher term; this leader must step down");
                Reply::Unchanged
            }
            ShipOutcome::NotYet => Reply::Unchanged,
            ShipOutcome::Diverged(history) => Reply::Diverged { history, durable: answer.durable },
            ShipOutcome::Refused(reason) => {
                tracing::warn!(%follower, "follower refused a ship: {reason}");
                Reply::Unchanged
            }
        };
        let next = next_after(&reply, after, &self.leader_view(), &self.wal.term_history());
        if matches!(reply, Reply::Diverged { .. }) {
            // The follower quarantines its batches after the divergence point when they come.
            tracing::warn!(%follower, prev = %ship.prev, from = %next, "follower diverged; resending from the divergence point");
        }
        (next, reply)
    }

    /// This node's durable log as the decision core sees it.
    fn leader_view(&self) -> WalView<'_> {
        WalView { wal: &self.wal, commit: &self.commit, term: self.gate.term() }
    }

    /// Whether our log holds `prev` (decisions/057): the written tail of the ship feed (a batch end
    /// or its base) or the durable WAL. No ship and no pulled chunk leaves this node with a `prev`
    /// it does not hold; a miss is a bug, counted (`unheld_prev`) and checked by the simulation.
    fn holds(&self, prev: TermSeqno) -> bool {
        self.feed.holds(prev) || self.wal.holds(prev)
    }

    /// Leader: whether a majority (this node counted) answered ships sent within the last
    /// [`ControlTiming::ready_contact`]; what `/readyz` reports for a leader.
    pub fn has_quorum_contact(&self) -> bool {
        self.commit.has_contact_within(self.timing.ready_contact())
    }

    /// Whether `node` is another member of the cluster (voter or learner), as openraft's membership
    /// says. Only members may ship to us, pull from us, fetch our snapshot or ask us to stand.
    pub(crate) fn is_member(&self, node: NodeId) -> bool {
        node != self.me && self.peer(node).is_some()
    }

    /// Whether `sender` may ship (or send commit notices) to us in `term` (`ours`: our term, read
    /// under the term lock for a ship): it must be a member, and for our own term the node that
    /// openraft's vote names (the node we voted for or learned as leader of it). Another term's
    /// message is decided by the term check (fenced or not yet) as before. Err: the refusal class
    /// and why.
    fn check_sender(&self, sender: NodeId, term: Term, ours: Term) -> Result<(), (Refusal, String)> {
        if !self.is_member(sender) {
            return Err((Refusal::NotMember, format!("node {sender} is not a member of this cluster")));
        }
        if term != ours {
            return Ok(());
        }
        match self.vote_names(term) {
            Some(named) if named != sender => Err((
                Refusal::NotLeader,
                format!("node {sender} sent as leader of term {term}, but our vote names node {named}"),
            )),
            _ => Ok(()),
        }
    }

    /// The node openraft's persisted vote names for `term` (None: the vote is of another term, or
    /// no control plane runs).
    fn vote_names(&self, term: Term) -> Option<NodeId> {
        let control = self.control.get()?;
        let vote = control.raft().metrics().borrow().vote;
        let leader_id = vote.leader_id();
        (leader_id.get_term() == term.get()).then(|| leader_id.voted_for().map(NodeId)).flatten()
    }

    // ---------------------------------------------------------------- follower: receive

    /// A commit notice from the leader of `term`: apply what we hold of its log up to `commit`.
    /// Returns our term. Takes no term lock (a ship's fsync may hold it: that is when notices come).
    pub fn notice_commit(&self, term: Term, leader: NodeId, commit: Seqno) -> Term {
        let ours = self.gate.term();
        if let Err((class, reason)) = self.check_sender(leader, term, ours) {
            tracing::debug!(%leader, %term, "ignored a commit notice: {reason}");
            self.count_refusal(class);
            return ours;
        }
        if term == ours {
            let frontier = self.note_leader(term, |state| state.notified = state.notified.max(commit));
            self.count_notice(NOTICE_RECEIVED);
            if let Some(frontier) = frontier {
                if frontier > self.commit.commit() {
                    self.count_notice(NOTICE_ADVANCED);
                }
                self.commit.advance(frontier);
            }
        }
        ours
    }

    fn count_notice(&self, which: usize) {
        self.notice_stats[which].fetch_add(1, Ordering::Relaxed);
    }

    /// Commit-notice counters.
    pub fn notice_stats(&self) -> NoticeStats {
        let get = |which: usize| self.notice_stats[which].load(Ordering::Relaxed);
        NoticeStats {
            sent: get(NOTICE_SENT),
            failed: get(NOTICE_FAILED),
            received: get(NOTICE_RECEIVED),
            advanced: get(NOTICE_ADVANCED),
        }
    }

    /// Updates what we know of the leader of `term` and returns the frontier it allows now (`None`
    /// for an older term than the one recorded).
    fn note_leader(&self, term: Term, update: impl FnOnce(&mut LeaderCommit)) -> Option<Seqno> {
        let mut state = self.leader_commit.lock().expect("leader-commit lock is never held across a panic");
        state.in_term(term).map(|state| {
            update(state);
            state.frontier()
        })
    }

    /// Our log from `cut` on is about to be quarantined: what we matched of the leader of `term`
    /// ends before it.
    fn forget_leader_match_from(&self, term: Term, cut: Seqno) {
        let mut state = self.leader_commit.lock().expect("leader-commit lock is never held across a panic");
        if state.term == term {
            state.matched = state.matched.min(Seqno(cut.get().saturating_sub(1)));
        }
    }

    /// Forgets how far our log matches the leader's (our log was replaced by a snapshot).
    fn forget_leader_match(&self) {
        self.leader_commit.lock().expect("leader-commit lock is never held across a panic").matched =
            Seqno::ZERO;
    }

    /// Decides and performs one live ship from the leader (the one receive path).
    pub async fn receive(self: &Arc<Self>, ship: Ship) -> ShipAnswer {
        self.receive_from(ship, Origin::Live).await
    }

    /// Decides and performs one ship or pulled chunk (the one receive path).
    async fn receive_from(self: &Arc<Self>, ship: Ship, origin: Origin) -> ShipAnswer {
        let _term_lock = self.gate.lock().await;
        let term = self.gate.term();
        let live = origin == Origin::Live;
        if live {
            if let Err((class, reason)) = self.check_sender(ship.leader, ship.term, term) {
                tracing::warn!(leader = %ship.leader, ship_term = %ship.term, "refused a ship: {reason}");
                self.count_refusal(class);
                let outcome = ShipOutcome::Refused(reason);
                return ShipAnswer {
                    term,
                    durable: self.wal.durable_seqno(),
                    applied: *self.applied.borrow(),
                    outcome,
                };
            }
        }
        // Does the sender hold the log of the message's term, and does it name the leader?
        let Authority { replaces: authoritative, names_leader } = authority(origin, ship.leader);
        if ship.term == term && ship.leader != self.me && names_leader {
            self.leader_hint.store(ship.leader.0, Ordering::SeqCst);
            *self.last_heard.lock().expect("heard lock is never held across a panic") = Some(Instant::now());
        }
        let meta = ShipMeta {
            term: ship.term,
            prev: ship.prev,
            batches: ship
                .batches
                .iter()
                .map(|b| BatchMeta { first: b.first_seqno(), last: b.last_seqno(), term: b.term() })
                .collect(),
            commit: ship.commit,
        };
        let verdict =
            decide_ship(&WalView { wal: &self.wal, commit: &self.commit, term }, &meta, self.quorum());
        let stale_source = !authoritative && replaced_from(&verdict).is_some();
        let verdict = if authoritative { verdict } else { append_only(verdict) };
        let outcome = match verdict {
            Verdict::Fenced { .. } => {
                tracing::info!(ship_term = %ship.term, %term, leader = %ship.leader, "refused a ship from an older term");
                self.count_refusal(Refusal::StaleTerm);
                ShipOutcome::Fenced
            }
            Verdict::NotYet { .. } => ShipOutcome::NotYet,
            Verdict::Gap { last } => {
                self.count_refusal(Refusal::Gap);
                self.clone().start_pull("gap");
                ShipOutcome::Gap(last)
            }
            Verdict::Diverged => {
                tracing::info!(prev = %ship.prev, "a ship's prev is not in our log: diverged");
                self.count_refusal(Refusal::Diverged);
                ShipOutcome::Diverged(self.wal.term_history())
            }
            Verdict::Refuse { reason } if stale_source => {
                tracing::info!(leader = %ship.leader, "refused a pulled chunk: {reason}");
                self.count_refusal(Refusal::StaleSource);
                ShipOutcome::Refused(reason)
            }
            Verdict::Refuse { reason } => {
                tracing::warn!("refused a ship: {reason}");
                self.count_refusal(Refusal::Overlap);
                ShipOutcome::Refused(reason)
            }
            Verdict::Halt { reason, .. } => {
                tracing::error!("receiver halted: {reason}");
                self.count_refusal(Refusal::Halted);
                *self.halted.lock().expect("halt lock is never held across a panic") = Some(reason.clone());
                if repairs_a_halt(self.quorum(), names_leader) {
                    // Leader mode lost batches we committed: only the leader's state brings us
                    // back. Every halted ship (the queue backs off) tries again, at most one
                    // install every SNAPSHOT_INSTALL_INTERVAL_MIN.
                    self.clone().start_halt_repair(ship.leader);
                }
                ShipOutcome::Refused(reason)
            }
            Verdict::Accept { steps, matched, commit_now, commit } => {
                // What `prev` covers is committed now; the batches this message brings are
                // applied once fsynced (the applier applies only flushed batches).
                self.commit.advance(commit_now);
                // What we quarantine is no longer the leader's log here: a notice must not cover it.
                if let Some(cut) = steps.iter().find_map(|step| match step {
                    Step::QuarantineFrom(seqno) => Some(*seqno),
                    _ => None,
                }) {
                    self.forget_leader_match_from(term, cut);
                }
                // A live ship's batches move the commit frontier the moment they are written to our
                // WAL, before its fsync (decisions/025): on the WAL writer's thread, before the
                // fsync starts (the applier then applies what is committed at once), not after a
                // wake-up of this task. A commit covers only what a majority fsynced, so what we
                // show is never lost cluster-wide; our ack still waits for our fsync. We hold the
                // term lock until `perform` returns, so the term cannot change in between.
                let on_written = live.then(|| {
                    let replica = Arc::clone(self);
                    let matched = matched.seqno;
                    Box::new(move || replica.live_written(term, matched, commit))
                        as tidal_wal::WrittenCallback
                });
                match self.perform(&ship, steps, on_written).await {
                    Ok(()) => {
                        // We ack `matched`: the leader counts it toward commit. It must be in our
                        // log, written and (perform waited for it) fsynced.
                        let durable = self.wal.durable_seqno();
                        assert!(
                            matched.seqno <= durable,
                            "acking {matched} past our durable seqno {durable} (term {term})"
                        );
                        // Again here (idempotent), for a ship whose batches we all held already.
                        if live {
                            self.live_written(term, matched.seqno, commit);
                        } else {
                            self.commit.advance(commit);
                        }
                        ShipOutcome::Matched(matched)
                    }
                    Err(reason) => {
                        tracing::warn!("could not take a ship: {reason}");
                        self.count_refusal(Refusal::AppendFailed);
                        ShipOutcome::Refused(reason)
                    }
                }
            }
        };
        ShipAnswer { term, durable: self.wal.durable_seqno(), applied: *self.applied.borrow(), outcome }
    }

    /// A live ship of `term` is written here (maybe not fsynced yet) up to `matched`, which the
    /// leader's log holds there: a commit notice that came meanwhile covers it now; so does the
    /// ship's `commit`.
    fn live_written(&self, term: Term, matched: Seqno, commit: Seqno) {
        let notified =
            self.note_leader(term, |state| state.matched = state.matched.max(matched)).unwrap_or(Seqno::ZERO);
        if notified > commit.max(self.commit.commit()) {
            self.count_notice(NOTICE_ADVANCED);
        }
        self.commit.advance(commit.max(notified));
    }

    /// Performs the accepted steps; `on_written` runs on the WAL writer's thread once the appended
    /// batches are written, before their fsync (not at all if nothing is appended or the WAL refuses
    /// them); returns once they are durable.
    async fn perform(
        &self,
        ship: &Ship,
        steps: Vec<Step>,
        on_written: Option<tidal_wal::WrittenCallback>,
    ) -> Result<(), String> {
        let mut appends = Vec::new();
        for step in steps {
            match step {
                Step::Skip(_) => {}
                Step::Append(i) => appends.push(ship.batches[i].clone()),
                Step::QuarantineFrom(seqno) => {
                    let report = self.quarantine_from(seqno).await?;
                    tracing::warn!(?report, "moved a divergent suffix to quarantine");
                    self.feed.reset(self.wal.last_position());
                }
            }
        }
        if appends.is_empty() {
            return Ok(());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.wal
            .submit_replicated_with(appends, on_written, Box::new(move |result| drop(tx.send(result))))
            .map_err(|e| format!("append refused: {e:?}"))?;
        match rx.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("append failed: {error}")),
            Err(_) => Err("WAL writer stopped".into()),
        }
    }

    /// Answers a probe of `term` under the term lock with our last DURABLE position.
    pub async fn answer_probe(&self, term: Term) -> ProbeReply {
        let _term_lock = self.gate.lock().await;
        let ours = self.gate.term();
        let outcome = match answer_probe(ours, term, self.wal.last_position(), &self.wal.term_history()) {
            ProbeAnswer::NotYet { .. } => ProbeOutcome::NotYet,
            ProbeAnswer::Fenced { .. } => ProbeOutcome::Fenced,
            ProbeAnswer::Position { last, history } => ProbeOutcome::Position { last, history },
        };
        ProbeReply { term: ours, outcome }
    }

    // ---------------------------------------------------------------- catch-up by pull

    /// Repairs a halted receiver from `leader`'s snapshot in the background (single flight and rate
    /// limited by [`Replica::install_from`]); a successful install clears the halt.
    fn start_halt_repair(self: Arc<Self>, leader: NodeId) {
        tokio::spawn(async move {
            match self.install_from(leader, "halted: leader durability lost batches we committed").await {
                Ok(()) => {
                    if let Err(error) = self.pull_after_install(leader, false).await {
                        tracing::warn!(%leader, "pull after the halt repair: {error}");
                    }
                }
                Err(error) => tracing::warn!(%leader, "halt repair not done now: {error}"),
            }
        });
    }

    /// Starts a pull from the leader unless one is running or one started too recently.
    pub fn start_pull(self: Arc<Self>, reason: &'static str) -> bool {
        let Some(leader) = self.leader().filter(|leader| *leader != self.me) else { return false };
        if self.commit.office().is_some() {
            return false;
        }
        {
            let mut last = self.last_pull.lock().expect("pull lock is never held across a panic");
            if last.is_some_and(|at| at.elapsed() < PULL_INTERVAL_MIN) && reason == "gap" {
                return false;
            }
            if self.pulling.swap(true, Ordering::SeqCst) {
                return false;
            }
            *last = Some(Instant::now());
        }
        tokio::spawn(async move {
            let from = self.wal.last_position();
            if let Err(error) = self.pull_from(leader, from, false).await {
                tracing::warn!(reason, %leader, "failed to pull from the leader: {error}");
            }
            self.pulling.store(false, Ordering::SeqCst);
        });
        true
    }

    /// Pulls from `source` everything after `from` (our last durable position, or a divergence
    /// point), through the one receive path. On `Diverged`, retries once from the divergence point.
    /// When the log alone cannot bring this node back (the source purged past our position, or we
    /// diverged and already applied past the divergence point), installs the source's snapshot
    /// ([`Replica::install_from`]) and pulls on from it.
    ///
    /// `adopting`: we are a new leader pulling the log we chose (taking office, step 3), so the
    /// source's chunks may replace our divergent suffix even though the source is not in office.
    async fn pull_from(
        self: &Arc<Self>,
        source: NodeId,
        from: TermSeqno,
        adopting: bool,
    ) -> Result<(), String> {
        match self.pull_once(source, from, adopting).await? {
            PullEnd::Done => Ok(()),
            PullEnd::Purged(at) => {
                tracing::warn!(%source, %from, purged = %at, "the source purged past our position: installing its snapshot");
                self.install_from(source, "behind the source's purge point").await?;
                self.pull_after_install(source, adopting).await
            }
            PullEnd::Diverged(history) => {
                let theirs_last =
                    TermSeqno { term: history.last().map_or(Term(0), |e| e.term), seqno: Seqno(u64::MAX) };
                let point = divergence_point(
                    &self.wal.term_history(),
                    self.wal.last_position(),
                    &history,
                    theirs_last,
                );
                let applied = *self.applied.borrow();
                if applied > point.seqno {
                    tracing::warn!(%source, %point, %applied, "our log diverged and we applied past the divergence point: installing the source's snapshot");
                    self.install_from(source, "applied past the divergence point").await?;
                    return self.pull_after_install(source, adopting).await;
                }
                tracing::warn!(%source, %point, "our log diverged; pulling from the divergence point");
                match self.pull_once(source, point, adopting).await? {
                    PullEnd::Done => Ok(()),
                    PullEnd::Purged(at) => {
                        Err(format!("{source} purged past the divergence point {point} ({at})"))
                    }
                    PullEnd::Diverged(_) => {
                        Err(format!("still diverged from {source} after pulling from {point}"))
                    }
                }
            }
        }
    }

    /// After an install: pulls from our new last position (the snapshot's).
    async fn pull_after_install(self: &Arc<Self>, source: NodeId, adopting: bool) -> Result<(), String> {
        match self.pull_once(source, self.wal.last_position(), adopting).await? {
            PullEnd::Done => Ok(()),
            PullEnd::Purged(at) => {
                Err(format!("{source} purged past its own snapshot ({at}); retrying later"))
            }
            PullEnd::Diverged(_) => {
                Err(format!("diverged from {source} right after installing its snapshot"))
            }
        }
    }

    /// Fetches `source`'s snapshot (no lock held: the transfer may take long), then installs it under
    /// the term lock (ships and pulled chunks wait for the seconds the state replacement takes) and
    /// moves the ship feed and the commit frontier to the snapshot's position. At most one install
    /// runs at a time and automatic installs start at most every [`SNAPSHOT_INSTALL_INTERVAL_MIN`].
    pub(crate) async fn install_from(self: &Arc<Self>, source: NodeId, why: &str) -> Result<(), String> {
        let peer = self.peer(source).ok_or_else(|| format!("node {source} is not a peer"))?;
        let Ok(_installing) = self.installing.try_lock() else {
            return Err("a snapshot install is already running".into());
        };
        {
            let mut last = self.last_install.lock().expect("install lock is never held across a panic");
            if let Some(at) = last.filter(|at| at.elapsed() < SNAPSHOT_INSTALL_INTERVAL_MIN) {
                return Err(format!(
                    "needs a snapshot ({why}), but the last install started {:?} ago (at most one every {SNAPSHOT_INSTALL_INTERVAL_MIN:?}); retrying later",
                    at.elapsed()
                ));
            }
            *last = Some(Instant::now());
        }
        let result = self.fetch_and_install(&peer, source, why).await;
        let mut stats = self.installs.lock().expect("install stats lock is never held across a panic");
        match &result {
            Ok(Some(position)) => {
                stats.installed += 1;
                stats.last_position = Some(*position);
            }
            Ok(None) => {}
            Err(_) => stats.failed += 1,
        }
        result.map(|_| ())
    }

    /// `Some(position)` if a snapshot was installed, `None` if the log turned out to suffice.
    async fn fetch_and_install(
        self: &Arc<Self>,
        peer: &Peer,
        source: NodeId,
        why: &str,
    ) -> Result<Option<TermSeqno>, String> {
        tracing::warn!(%source, why, "fetching a snapshot");
        let fetched = fetch_snapshot(peer, self.me, &self.wal, &self.db, &self.data_dir, &mut |_| {})
            .await
            .map_err(|e| format!("snapshot transfer from {source}: {e}"))?;
        let fetched = match fetched {
            FetchOutcome::Fetched(fetched) => fetched,
            FetchOutcome::NotNeeded { position } => {
                tracing::info!(%source, %position, "snapshot not needed: our log holds its position");
                return Ok(None);
            }
        };
        tracing::info!(%source, position = %fetched.position(), bytes = fetched.bytes(), "snapshot received; installing");
        let _term_lock = self.gate.lock().await;
        let outcome = install_fetched(fetched, &self.wal, &self.db, Some(&self.applier), &self.data_dir)
            .await
            .map_err(|e| format!("snapshot install from {source}: {e}"))?;
        match outcome {
            InstallOutcome::Installed(report) => {
                self.feed.reset(self.wal.last_position());
                self.forget_leader_match();
                self.commit.advance(report.position.seqno);
                // A halt (leader durability lost committed batches of ours) is healed by this
                // install: the batches are in quarantine, the state is the source's.
                *self.halted.lock().expect("halt lock is never held across a panic") = None;
                tracing::info!(%source, position = %report.position, bytes = report.bytes,
                    elapsed = ?report.elapsed, "snapshot installed; pulling on from it");
                Ok(Some(report.position))
            }
            InstallOutcome::NotNeeded { position } => {
                tracing::info!(%source, %position, "snapshot not needed any more: the log moved on");
                Ok(None)
            }
        }
    }

    /// One pull.
    async fn pull_once(
        self: &Arc<Self>,
        source: NodeId,
        from: TermSeqno,
        adopting: bool,
    ) -> Result<PullEnd, String> {
        let peer = self.peer(source).ok_or_else(|| format!("node {source} is not a peer"))?;
        let pull = Pull {
            cluster_id: self.spec.cluster_id.clone(),
            term: self.term(),
            node: self.me,
            from,
            chunk_bytes_max: PULL_CHUNK_BYTES_MAX as u64,
        };
        let started = Instant::now();
        let mut stream = peer.pull(&pull, PULL_IDLE_TIMEOUT).await.map_err(|e: NetError| e.to_string())?;
        let mut batches = 0usize;
        // Where a pull's time goes: waiting for the source's next chunk, or taking it (append + fsync).
        let (mut waited, mut took) = (Duration::ZERO, Duration::ZERO);
        let mut bytes = 0usize;
        loop {
            let asked = Instant::now();
            let Some(chunk) = stream.next().await else { break };
            waited += asked.elapsed();
            let chunk = chunk.map_err(|e| e.to_string())?;
            match chunk.outcome {
                ChunkOutcome::Batches { prev, batches: pulled } => {
                    batches += pulled.len();
                    bytes += pulled.iter().map(|batch| batch.encoded().len()).sum::<usize>();
                    let ship = Ship {
                        cluster_id: self.spec.cluster_id.clone(),
                        term: chunk.term,
                        leader: chunk.leader,
                        prev,
                        commit: chunk.commit,
                        baseline: chunk.baseline,
                        batches: pulled,
                    };
                    let origin = if adopting { Origin::Adopting } else { Origin::Pull { source } };
                    let taking = Instant::now();
                    let answer = self.receive_from(ship, origin).await;
                    took += taking.elapsed();
                    if !matches!(answer.outcome, ShipOutcome::Matched(_)) {
                        return Err(format!("pulled chunk not accepted: {:?}", answer.outcome));
                    }
                }
                ChunkOutcome::Encoded { .. } => {
                    return Err("a received chunk was not verified (tidal-net never yields this)".into())
                }
                ChunkOutcome::Diverged(history) => {
                    self.count_pull(batches, bytes, started);
                    return Ok(PullEnd::Diverged(history));
                }
                ChunkOutcome::Purged(at) => {
                    self.count_pull(batches, bytes, started);
                    return Ok(PullEnd::Purged(at));
                }
            }
        }
        self.count_pull(batches, bytes, started);
        tracing::info!(batches, bytes, %source, last = %self.wal.last_position(), ?waited, ?took, "pull done");
        Ok(PullEnd::Done)
    }

    /// Adds an ended pull to [`PullStats`].
    fn count_pull(&self, batches: usize, bytes: usize, started: Instant) {
        let mut stats = self.pulls.lock().expect("pull stats lock is never held across a panic");
        stats.pulls += 1;
        stats.batches += batches as u64;
        stats.bytes += bytes as u64;
        stats.seconds += started.elapsed().as_secs_f64();
    }

    /// Serves a pull: batches after `from`, from the WAL, in chunks.
    pub fn serve_pull(&self, pull: Pull) -> Result<ChunkStream, tonic::Status> {
        if !self.is_member(pull.node) {
            self.count_refusal(Refusal::NotMember);
            tracing::warn!(node = %pull.node, "refused a pull from a node that is not a member");
            return Err(tonic::Status::permission_denied(format!("node {} is not a member", pull.node)));
        }
        let from = pull.from;
        let purged = self.wal.purged();
        // We name ourselves as the leader only while we hold office in the term we serve in: the
        // receiver lets only such chunks replace its batches (`Origin::Pull`). Otherwise the leader
        // we know, or none (0).
        let term = self.term();
        let leader = if self.commit.office() == Some(term) {
            self.me
        } else {
            self.leader().filter(|leader| *leader != self.me).unwrap_or(NodeId(0))
        };
        let baseline = self.baseline();
        let header = |outcome| Chunk { term, leader, baseline, commit: self.commit.commit(), outcome };
        if from.seqno > Seqno::ZERO && from.seqno < purged.seqno {
            return Ok(Box::pin(tokio_stream::iter([Ok(header(ChunkOutcome::Purged(purged)))])));
        }
        if !self.wal.holds(from) {
            let history = self.wal.term_history();
            return Ok(Box::pin(tokio_stream::iter([Ok(header(ChunkOutcome::Diverged(history)))])));
        }
        let chunk_bytes =
            usize::try_from(pull.chunk_bytes_max).unwrap_or(SHIP_BYTES_MAX).clamp(1, PULL_CHUNK_BYTES_MAX);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Chunk, tonic::Status>>(PULL_CHUNKS_AHEAD);
        let wal = self.wal.clone();
        let commit = self.commit.commit();
        // An async producer whose reads run on the blocking pool one at a time: the channel keeps
        // up to PULL_CHUNKS_AHEAD chunks read ahead, and in the simulation every read is counted
        // work that ends within the step that asked for it (decisions/051).
        tokio::spawn(async move {
            let read_failed = |error: String| Err(tonic::Status::internal(format!("read WAL: {error}")));
            // Runs of the segment files' bytes, cut at batch boundaries from the headers alone: no
            // decoding, hashing or copying per batch here. The follower verifies every batch's seal
            // before its WAL takes it (tidal-net `split_batches`), and `receive_from` decides.
            let opening = wal.clone();
            let opened = crate::blocking::blocking(move || open_pull_reader(&opening, from)).await;
            let mut reader = match opened {
                Ok(PullStart::Reader(reader)) => reader,
                Ok(PullStart::Refused(outcome)) => {
                    return drop(tx.send(Ok(Chunk { term, leader, baseline, commit, outcome })).await);
                }
                Ok(PullStart::Failed(error)) => return drop(tx.send(read_failed(error)).await),
                Err(error) => return drop(tx.send(read_failed(error.to_string())).await),
            };
            let mut prev = from;
            loop {
                let read = crate::blocking::blocking(move || {
                    let run = reader.next_run(chunk_bytes);
                    (reader, run)
                })
                .await;
                let run = match read {
                    Ok((back, run)) => {
                        reader = back;
                        run
                    }
                    Err(error) => return drop(tx.send(read_failed(error.to_string())).await),
                };
                let run = match run {
                    Ok(Some(run)) => run,
                    Ok(None) => return,
                    Err(error) => return drop(tx.send(read_failed(error.to_string())).await),
                };
                if !wal.holds(prev) {
                    // The log was cut after this run was read: end here (the follower pulls again).
                    return drop(
                        tx.send(read_failed(format!("{prev} left the log while serving a pull"))).await,
                    );
                }
                let chunk = Chunk {
                    term,
                    leader,
                    baseline,
                    commit,
                    outcome: ChunkOutcome::Encoded { prev, bytes: run.bytes },
                };
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
                prev = run.last;
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// How a pull's reader started.
enum PullStart {
    /// Reading the batches that follow `from` in this log.
    Reader(tidal_wal::RawReader),
    /// The log does not hold `from` (any more), or purged past it: the one chunk to answer.
    Refused(ChunkOutcome),
    /// The WAL could not be read.
    Failed(String),
}

/// Opens the reader of a pull after `from`. The check that our log holds `from` is made again here,
/// with the reader's start, under the WAL's log lock: `serve_pull`'s first check runs earlier, and a
/// quarantine and refill in between (a node taking office by adopting another log, just when its
/// followers pull from it) would otherwise pair `from` with batches of the new log (decisions/057).
fn open_pull_reader(wal: &Wal, from: TermSeqno) -> PullStart {
    match wal.read_raw_after(from) {
        Ok(reader) => PullStart::Reader(reader),
        Err(tidal_wal::Error::NotInLog { .. }) => {
            PullStart::Refused(ChunkOutcome::Diverged(wal.term_history()))
        }
        Err(tidal_wal::Error::Purged { .. }) => PullStart::Refused(ChunkOutcome::Purged(wal.purged())),
        Err(error) => PullStart::Failed(error.to_string()),
    }
}

/// How one pull ended.
enum PullEnd {
    /// The stream ended: we hold what the source held when it started.
    Done,
    /// The source's log diverged from ours; its term history.
    Diverged(Vec<TermSeqno>),
    /// The source purged past our position (its purge point): only a snapshot brings us back.
    Purged(TermSeqno),
}

/// The decision core's view of this node's durable log.
struct WalView<'a> {
    wal: &'a Wal,
    commit: &'a CommitState,
    term: Term,
}

impl LogView for WalView<'_> {
    fn term(&self) -> Term {
        self.term
    }

    fn last(&self) -> TermSeqno {
        self.wal.last_position()
    }

    fn locate(&self, seqno: Seqno) -> Located {
        match self.wal.locate(seqno) {
            Position::In { term, first, last } => Located::In { term, first, last },
            Position::Beyond => Located::Beyond,
            Position::Purged => Located::Purged,
        }
    }

    fn snapshot_position(&self) -> Option<TermSeqno> {
        let purged = self.wal.purged();
        (purged.seqno > Seqno::ZERO).then_some(purged)
    }

    fn commit(&self) -> Seqno {
        self.commit.commit()
    }
}

/// The replication service of a node.
pub struct ReplicaService(pub Arc<Replica>);

#[tonic::async_trait]
impl tidal_net::Handler for ReplicaService {
    fn cluster_id(&self) -> &str {
        &self.0.spec.cluster_id
    }

    fn refused(&self, why: tidal_net::ServiceRefusal) {
        self.0.count_refusal(why.into());
    }

    async fn ship(&self, ship: Ship) -> Result<ShipAnswer, tonic::Status> {
        Ok(self.0.receive(ship).await)
    }

    async fn pull(&self, pull: Pull) -> Result<ChunkStream, tonic::Status> {
        self.0.serve_pull(pull)
    }

    async fn commit(&self, term: Term, leader: NodeId, commit: Seqno) -> Result<Term, tonic::Status> {
        Ok(self.0.notice_commit(term, leader, commit))
    }

    async fn nudge(&self, _reason: String) -> Result<bool, tonic::Status> {
        Ok(self.0.clone().start_pull("nudge"))
    }

    async fn probe(&self, probe: Probe) -> Result<ProbeReply, tonic::Status> {
        Ok(self.0.answer_probe(probe.term).await)
    }

    async fn snapshot(&self, request: SnapshotRequest) -> Result<SnapshotStream, tonic::Status> {
        if !self.0.is_member(request.node) {
            self.0.count_refusal(Refusal::NotMember);
            tracing::warn!(node = %request.node, "refused a snapshot to a node that is not a member");
            return Err(tonic::Status::permission_denied(format!("node {} is not a member", request.node)));
        }
        self.0.snapshots.serve(request)
    }

    async fn negatives(
        &self,
        after_user: String,
        limit: u32,
    ) -> Result<tidal_net::NegativesPage, tonic::Status> {
        self.0.serve_negatives(after_user, limit).await.map_err(tonic::Status::internal)
    }

    async fn elect(&self, term: u64, leader: u64) -> Result<Result<(), String>, tonic::Status> {
        Ok(self.0.stand_for_election(term, leader).await)
    }

    async fn raft(&self, call: RaftCall) -> Result<Vec<u8>, tonic::Status> {
        let Some(control) = self.0.control.get() else {
            return Err(tonic::Status::unavailable("control plane not started yet"));
        };
        // A vote request or append from a node outside the membership must not move our term
        // (a stranger with the secret forced elections before decisions/057).
        let sender = crate::control::caller_of(&call)?;
        if !self.0.is_member(sender) {
            self.0.count_refusal(Refusal::NotMember);
            tracing::warn!(node = %sender, kind = %call.kind, "refused an openraft call from a node that is not a member");
            return Err(tonic::Status::permission_denied(format!("node {sender} is not a member")));
        }
        control.serve(call).await
    }
}

#[cfg(test)]
mod tests {
    use super::{open_pull_reader, LeaderCommit, PullStart};
    use std::sync::Arc;
    use tidal_net::ChunkOutcome;
    use tidal_types::{RecordKind, Seqno, Term, TermSeqno};
    use tidal_wal::{AppendRequest, Batch, FlushedHook, ManualClock, SimIo, Wal, WalConfig};

    struct NoHook;

    impl FlushedHook for NoHook {
        fn flushed(&mut self, _batches: &[Batch]) {}
    }

    fn wal_with(io: &SimIo, term: u64, batches: u64) -> Wal {
        let config = WalConfig::new("/wal");
        let clock = Arc::new(ManualClock::new(1_000));
        let (wal, _) = Wal::open(config, Arc::new(io.clone()), clock, Box::new(NoHook)).expect("open WAL");
        wal.set_term(Term(term));
        for _ in 0..batches {
            let request = AppendRequest { kind: RecordKind::Signal, event_count: 2, payload: vec![0; 16] };
            wal.append_blocking(request).expect("append");
        }
        wal
    }

    /// Finding 2 of the safety review, as `serve_pull` meets it: its first check passes, the log is
    /// quarantined and refilled with another term's batches (a node adopting another log while
    /// taking office), then the reader opens. At a57b07b the reader (`read_raw_from`) started
    /// after the stale `prev` and served the new log's batches under it.
    #[test]
    fn a_pull_opened_after_a_quarantine_and_refill_answers_diverged() {
        let io = SimIo::new();
        let wal = wal_with(&io, 1, 5);
        let from = TermSeqno { term: Term(1), seqno: Seqno(8) };
        assert!(wal.holds(from), "serve_pull's first check passes");
        let other = wal_with(&SimIo::new(), 1, 3);
        other.set_term(Term(2));
        for _ in 0..3 {
            let request = AppendRequest { kind: RecordKind::Signal, event_count: 2, payload: vec![1; 16] };
            other.append_blocking(request).expect("append");
        }
        let replacement: Vec<Batch> =
            other.read_from(Seqno(7)).expect("read").map(|batch| batch.expect("batch")).collect();
        wal.quarantine_from(Seqno(7)).expect("quarantine");
        wal.append_replicated_blocking(replacement).expect("refill");
        match open_pull_reader(&wal, from) {
            PullStart::Refused(ChunkOutcome::Diverged(history)) => {
                assert_eq!(history.last().map(|e| e.term), Some(Term(2)));
            }
            PullStart::Reader(_) => panic!("a reader after {from}, which the log no longer holds"),
            PullStart::Refused(other) => panic!("unexpected refusal {other:?}"),
            PullStart::Failed(error) => panic!("unexpected failure {error}"),
        }
    }

    #[test]
    fn a_notice_commits_only_what_a_live_ship_of_its_term_matched() {
        let mut state = LeaderCommit::default();
        // A notice ahead of what we hold durably: nothing beyond matched.
        let s = state.in_term(Term(2)).expect("newer term");
        s.notified = Seqno(10);
        assert_eq!(s.frontier(), Seqno::ZERO);
        // The in-flight ship's fsync is done: matched 12, the notice covers 10.
        s.matched = Seqno(12);
        assert_eq!(s.frontier(), Seqno(10));
        s.notified = Seqno(15);
        assert_eq!(s.frontier(), Seqno(12));
        // An older term's notice or match is ignored; a newer term forgets everything.
        assert!(state.in_term(Term(1)).is_none());
        assert_eq!(state.in_term(Term(3)).expect("newer term").frontier(), Seqno::ZERO);
        assert_eq!(state.term, Term(3));
    }
}
