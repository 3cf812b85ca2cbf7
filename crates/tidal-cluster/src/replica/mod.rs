//! One node of a cluster, split by role around a small shared core (PROTOCOL.md):
//! - `hook`: the WAL hook (written and fsynced batches to the applier, the ship feed, commit);
//! - `leader/`: one ShipQueue per follower, whose next step is `tidal_protocol::next_ship_step`;
//! - `follower/`: the receiver (every ship and pulled chunk) and the puller (catch-up);
//! - `serve`: the replication service (pulls served from this node's segments, the RPC handler);
//! - `install`: snapshot installs; `office`: taking and leaving office; `membership`: members and
//!   the `members` verbs; `promote`: leadership transfer; `reconcile`: negatives anti-entropy.
//!
//! Every decision is a pure function in `tidal-protocol`; these modules perform what it decides.
//! Terms and leadership come from openraft ([`crate::control`]). In short:
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

mod follower;
mod hook;
mod install;
mod leader;
mod membership;
mod office;
mod promote;
mod reconcile;
mod serve;

pub use follower::{NoticeStats, PullStats};
pub use hook::ReplicaHook;
pub use install::InstallStats;
pub use leader::{FollowerProgress, HealReport};
pub use membership::{MemberChange, MemberReport, Members};
pub use office::Role;
pub use promote::{PromoteReport, WriteTicket};
pub use reconcile::{PeerReconcile, RECONCILE_INTERVAL};
pub use serve::ReplicaService;

use crate::applier::ApplierSender;
use crate::commit_state::CommitState;
use crate::control::{ControlPlane, ControlTiming, TermGate};
use crate::error::{Error, Result};
use crate::refusal::Refusal;
use crate::ship_feed::ShipFeed;
use crate::snapshot::{SnapshotPins, SnapshotSource};
use crate::spec::{ClusterSpec, Durability};
use follower::Following;
use install::Installs;
use leader::Leading;
use membership::Membership;
use office::Office;
use promote::Transfer;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tidal_core::{RaftStore, RaftWrite, TidalDb};
use tidal_protocol::{Located, LogView};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::{Position, Wal};
use tokio::sync::watch;

/// Bytes per ship: big enough to carry a busy second of small batches in a few
/// messages, far below the 64 MiB + slack message limit (a larger single batch still goes alone).
pub const SHIP_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Bound on one pulled chunk: a follower appends a chunk with one write and one fsync (fewer
/// fsyncs with bigger chunks), but it starts appending, and applying, only once a whole chunk
/// arrived and was verified (a longer pipeline fill with bigger chunks). 8 MiB measured no better
/// than 4 MiB on the loaded machine of experiments/024, so it stays at the ship size. Below
/// tidal-net's message bound; a single batch larger than this still travels alone.
pub const PULL_CHUNK_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Heartbeat (empty ship) interval when nothing else is sent.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
/// Automatic snapshot installs on this node start at least this far apart: a follower that keeps
/// needing one (a leader purging faster than it can follow) does not cut and move the whole state
/// in a loop.
pub const SNAPSHOT_INSTALL_INTERVAL_MIN: Duration = Duration::from_secs(5);

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
    /// How peers are reached (the OS's TCP in production; the simulation's network in chaos/sim).
    pub connector: tidal_net::Connector,
    /// Joining a running cluster: with nothing stored, wait to be added instead of writing the
    /// cluster file's membership as the first control entry.
    pub join: bool,
    /// The node's fatal state: raised by a failed vote or a stopped control plane here; once
    /// raised (by any source) the replica leaves office for good (`office.rs`).
    pub fatal: crate::fatal::Fatal,
}

/// A cluster node's replication side: a small shared core (the term gate, the WAL, commit state,
/// the ship feed, the control plane) and one part per role, each owning its state and defined in
/// its own module: [`Membership`] (`membership.rs`), [`Office`] (`office.rs`), [`Transfer`]
/// (`promote.rs`), [`Leading`] (`leader/`), [`Following`] (`follower/`) and [`Installs`]
/// (`install.rs`). A role's fields are private to its module: another role asks through methods.
pub struct Replica {
    spec: ClusterSpec,
    me: NodeId,
    data_dir: PathBuf,
    /// The control plane's store (the commit hint lives there too).
    store: RaftStore,
    timing: ControlTiming,
    wal: Wal,
    commit: Arc<CommitState>,
    /// The leader's written tail, which ShipQueues read from.
    feed: ShipFeed,
    connector: tidal_net::Connector,
    /// Joining a running cluster (see [`ReplicaParts::join`]).
    join: bool,
    /// The term lock: serializes receive, votes and probes (module docs).
    gate: Arc<TermGate>,
    control: OnceLock<Arc<ControlPlane>>,
    /// The leader as last learned (0: none known).
    leader_hint: AtomicU64,
    /// The applier's applied frontier.
    applied: watch::Receiver<Seqno>,
    /// Set when the replica stops: background tasks end.
    stopped: watch::Sender<bool>,
    db: Arc<TidalDb>,
    applier: ApplierSender,
    snapshots: Arc<SnapshotSource>,
    /// Refused replication input by class (metrics): see [`Replica::refusals`].
    refusals: Mutex<BTreeMap<Refusal, u64>>,
    /// The node's fatal state (see [`ReplicaParts::fatal`]).
    fatal: crate::fatal::Fatal,
    /// Who the members are and how to reach them.
    membership: Membership,
    /// Taking, holding and leaving office.
    office: Office,
    /// Leadership transfer and write admission.
    transfer: Transfer,
    /// Leader: what it knows of each follower.
    leading: Leading,
    /// Follower: the leader's commit notices, a halt, pulls.
    following: Following,
    /// Snapshot installs on this node.
    installs: Installs,
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
    pub(crate) async fn quarantine_from(&self, seqno: Seqno) -> Result<tidal_wal::QuarantineReport> {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        self.wal
            .quarantine_from_then(seqno, move |result| drop(done_tx.send(result)))
            .map_err(|e| Error::wal(format!("quarantine from {seqno}"), e))?;
        done_rx
            .await
            .map_err(|_| Error::wal(format!("quarantine from {seqno}"), "the WAL writer stopped"))?
            .map_err(|e| Error::wal(format!("quarantine from {seqno}"), e))
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
    ) -> Result<Arc<Replica>> {
        let fatal = parts.fatal.clone();
        let ReplicaParts {
            spec, me, data_dir, store, timing, db, applier, snapshots, connector, join, ..
        } = parts;
        spec.validate()?;
        spec.node(me).ok_or_else(|| Error::Spec(format!("node {me} is not in the cluster file")))?;
        let members = Members::from_spec(&spec);
        let mut peers = BTreeMap::new();
        for node in spec.nodes.iter().filter(|node| node.id != me) {
            peers.insert(node.id, membership::connect(&spec, node, &connector)?);
        }
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
            connector,
            join,
            gate,
            control: OnceLock::new(),
            leader_hint: AtomicU64::new(0),
            applied,
            stopped: watch::channel(false).0,
            db,
            applier,
            snapshots,
            refusals: Mutex::new(BTreeMap::new()),
            fatal,
            membership: Membership::new(members, peers),
            office: Office::new(boot_term),
            transfer: Transfer::default(),
            leading: Leading::default(),
            following: Following::default(),
            installs: Installs::default(),
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

    /// The pins served snapshots hold on the WAL purge horizon.
    pub fn snapshot_pins(&self) -> &SnapshotPins {
        self.snapshots.pins()
    }

    /// Replication input this node refused, by class ([`Refusal`] says what each means).
    pub fn refusals(&self) -> BTreeMap<Refusal, u64> {
        self.refusals.lock().expect("refusals lock is never held across a panic").clone()
    }

    fn count_refusal(&self, class: Refusal) {
        *self
            .refusals
            .lock()
            .expect("refusals lock is never held across a panic")
            .entry(class)
            .or_default() += 1;
    }

    /// Starts the control plane and the background work: the office watcher (which takes and
    /// leaves office as openraft decides) and the commit-hint saver.
    pub async fn start(self: &Arc<Self>) -> Result<()> {
        self.office.mark_booted();
        let control = ControlPlane::start(
            self.me.0,
            &self.spec,
            self.timing,
            self.store.clone(),
            self.gate.clone(),
            self.connector.clone(),
            !self.join,
            self.fatal.clone(),
            self.office.boot_term(),
        )
        .await?;
        let control = Arc::new(control);
        if self.control.set(control.clone()).is_err() {
            return Err(Error::Control("the replica was started twice".into()));
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

    fn quorum(&self) -> bool {
        self.spec.durability == Durability::Quorum
    }

    /// This node's durable log as the decision core sees it.
    fn leader_view(&self) -> WalView<'_> {
        self.wal_view(self.gate.term())
    }

    /// This node's durable log as the decision core sees it, in `term` (read under the term lock).
    fn wal_view(&self, term: Term) -> WalView<'_> {
        WalView { wal: &self.wal, commit: &self.commit, term }
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
