//! One node of a cluster: the WAL hook, the follower receiver, the pull (catch-up) client and
//! server, and the leader's ShipQueues, wired around the decision core in [`crate::decide`].
//!
//! Leadership is static in this stage (the lowest id leads in term 1, decisions/002); the control
//! plane replaces that with openraft terms. Everything else follows PROTOCOL.md:
//! - the leader's writer hands each fsynced drain to the applier, the ship feed and its own matched
//!   position; commit advances when a majority has matched (quorum) or at once (leader mode);
//! - a follower decides every ship and pulled chunk with [`decide_ship`], appends byte-identical
//!   batches to its own WAL (WAL first), fsyncs, then acks; it applies only up to the commit
//!   frontier the leader sends;
//! - a follower that lacks `prev` answers `Gap` and pulls from its last durable position.
//!
//! Delicate: one receive lock serializes decide → append → fsync → ack, so the log view the decision
//! sees is exactly the durable log (the WAL's positions are durable-only). It is held across the
//! fsync; with terms from openraft the term re-check after the fsync moves outside it (PROTOCOL.md).

use crate::applier::ApplierSender;
use crate::commit_state::CommitState;
use crate::decide::{decide_ship, BatchMeta, Located, LogView, ShipMeta, Step, Verdict};
use crate::ship_feed::{ShipFeed, TailRead};
use crate::spec::{ClusterSpec, Durability};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidal_net::{Chunk, ChunkOutcome, ChunkStream, NetError, Peer, Pull, Ship, ShipAnswer, ShipOutcome};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::{Batch, FlushedHook, Position, Wal};
use tokio_stream::StreamExt;

/// Bytes per ship or pulled chunk: big enough to carry a busy second of small batches in a few
/// messages, far below the 64 MiB + slack message limit (a larger single batch still goes alone).
pub const SHIP_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Heartbeat (empty ship) interval when nothing else is sent.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
/// Retry backoff bounds for a ShipQueue whose follower does not answer.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A pull that receives nothing for this long is abandoned (and retried later).
const PULL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pulls started by gaps are at least this far apart (rate limit per source).
const PULL_INTERVAL_MIN: Duration = Duration::from_millis(200);

/// The WAL hook of a cluster node.
pub struct ReplicaHook {
    /// Applier input.
    pub applier: ApplierSender,
    /// Commit bookkeeping.
    pub commit: Arc<CommitState>,
    /// The ship feed (the leader's tail).
    pub feed: ShipFeed,
    /// This node.
    pub me: NodeId,
    /// Whether this node leads (its own durable position counts as matched).
    pub leading: bool,
}

impl FlushedHook for ReplicaHook {
    fn flushed(&mut self, batches: &[Batch]) {
        let Some(last) = batches.last() else { return };
        let position = TermSeqno { term: last.term(), seqno: last.last_seqno() };
        self.applier.flushed(batches.to_vec());
        self.feed.push(batches);
        if self.leading {
            self.commit.record_matched(self.me, self.commit.term(), position);
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

/// A cluster node's replication side.
pub struct Replica {
    spec: ClusterSpec,
    me: NodeId,
    leader: NodeId,
    wal: Wal,
    commit: Arc<CommitState>,
    feed: ShipFeed,
    peers: BTreeMap<NodeId, Peer>,
    receive_lock: tokio::sync::Mutex<()>,
    pulling: AtomicBool,
    last_pull: Mutex<Option<Instant>>,
    progress: Mutex<BTreeMap<NodeId, FollowerProgress>>,
    halted: Mutex<Option<String>>,
    applied: tokio::sync::watch::Receiver<Seqno>,
}

impl Replica {
    /// Builds the replica over an opened WAL. `commit` and `feed` are the ones given to the hook.
    pub fn new(
        spec: ClusterSpec,
        me: NodeId,
        wal: Wal,
        commit: Arc<CommitState>,
        feed: ShipFeed,
        applied: tokio::sync::watch::Receiver<Seqno>,
    ) -> Result<Arc<Replica>, String> {
        spec.validate()?;
        let leader = spec.static_leader().ok_or("no leader")?;
        spec.node(me).ok_or_else(|| format!("node {me} is not in the cluster file"))?;
        let mut peers = BTreeMap::new();
        for node in spec.nodes.iter().filter(|node| node.id != me) {
            let peer =
                Peer::connect_lazy(&node.rpc, &spec.secret, &spec.cluster_id).map_err(|e| e.to_string())?;
            peers.insert(node.id, peer);
        }
        let term_start = wal
            .term_history()
            .iter()
            .find(|entry| entry.term == commit.term())
            .map_or(wal.last_position().seqno.next(), |entry| entry.seqno);
        commit.set_term_start(term_start);
        Ok(Arc::new(Replica {
            spec,
            me,
            leader,
            wal,
            commit,
            feed,
            peers,
            receive_lock: tokio::sync::Mutex::new(()),
            pulling: AtomicBool::new(false),
            last_pull: Mutex::new(None),
            progress: Mutex::new(BTreeMap::new()),
            halted: Mutex::new(None),
            applied,
        }))
    }

    /// This node.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The leader.
    pub fn leader(&self) -> NodeId {
        self.leader
    }

    /// Whether this node leads.
    pub fn is_leader(&self) -> bool {
        self.me == self.leader
    }

    /// The cluster.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The commit frontier.
    pub fn commit_seqno(&self) -> Seqno {
        self.commit.commit()
    }

    /// The current term.
    pub fn term(&self) -> Term {
        self.commit.term()
    }

    /// Per-follower progress (leader).
    pub fn progress(&self) -> BTreeMap<NodeId, FollowerProgress> {
        self.progress.lock().expect("progress lock is never held across a panic").clone()
    }

    /// Why the receiver halted, if it did (a protocol violation: the node must be looked at).
    pub fn halted(&self) -> Option<String> {
        self.halted.lock().expect("halt lock is never held across a panic").clone()
    }

    /// Starts the background work: ShipQueues on the leader, a boot-time pull on a follower.
    pub fn start(self: &Arc<Self>) {
        if self.is_leader() {
            for (&id, peer) in &self.peers {
                let replica = self.clone();
                let peer = peer.clone();
                tokio::spawn(async move { replica.ship_queue(id, peer).await });
            }
        } else {
            self.clone().start_pull("boot");
        }
    }

    fn quorum(&self) -> bool {
        self.spec.durability == Durability::Quorum
    }

    // ---------------------------------------------------------------- leader: one queue per follower

    async fn ship_queue(self: Arc<Self>, follower: NodeId, peer: Peer) {
        let mut fed = self.feed.subscribe();
        let mut commits = self.commit.subscribe();
        // Optimistic start at our own end; a follower that lacks it answers Gap with its last.
        let mut after = self.feed.last();
        let mut sent_commit = Seqno::ZERO;
        let mut backoff = BACKOFF_MIN;
        let mut last_sent = Instant::now() - HEARTBEAT_INTERVAL;
        loop {
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
            let due =
                !batches.is_empty() || commit != sent_commit || last_sent.elapsed() >= HEARTBEAT_INTERVAL;
            if !due {
                tokio::select! {
                    _ = fed.changed() => {}
                    _ = commits.changed() => {}
                    _ = tokio::time::sleep(HEARTBEAT_INTERVAL) => {}
                }
                continue;
            }
            let ship = Ship {
                cluster_id: self.spec.cluster_id.clone(),
                term: self.term(),
                leader: self.me,
                prev: after,
                commit,
                baseline: TermSeqno::default(),
                batches,
            };
            last_sent = Instant::now();
            match peer.ship(&ship).await {
                Ok(answer) => {
                    backoff = BACKOFF_MIN;
                    sent_commit = commit;
                    after = self.on_answer(follower, &ship, answer, after);
                }
                Err(error) => {
                    tracing::debug!(%follower, "failed to ship: {error}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
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

    /// Handles a follower's answer; returns the position to ship after next.
    fn on_answer(&self, follower: NodeId, ship: &Ship, answer: ShipAnswer, after: TermSeqno) -> TermSeqno {
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
        match answer.outcome {
            ShipOutcome::Matched(matched) => {
                self.commit.record_matched(follower, answer.term, matched);
                matched
            }
            ShipOutcome::Gap(last) => last,
            ShipOutcome::Fenced => {
                tracing::error!(%follower, term = %answer.term, "a follower has a higher term; this leader must step down");
                after
            }
            ShipOutcome::NotYet => after,
            ShipOutcome::Diverged(_) => {
                tracing::warn!(%follower, prev = %ship.prev, "follower diverged; it will pull");
                self.feed.last()
            }
            ShipOutcome::Refused(reason) => {
                tracing::warn!(%follower, "follower refused a ship: {reason}");
                after
            }
        }
    }

    // ---------------------------------------------------------------- follower: receive

    /// Decides and performs one ship or pulled chunk (the one receive path).
    pub async fn receive(self: &Arc<Self>, ship: Ship) -> ShipAnswer {
        let _guard = self.receive_lock.lock().await;
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
        let verdict = decide_ship(&WalView { wal: &self.wal, commit: &self.commit }, &meta, self.quorum());
        let outcome = match verdict {
            Verdict::Fenced { .. } => ShipOutcome::Fenced,
            Verdict::NotYet { .. } => ShipOutcome::NotYet,
            Verdict::Gap { last } => {
                self.clone().start_pull("gap");
                ShipOutcome::Gap(last)
            }
            Verdict::Diverged => ShipOutcome::Diverged(self.wal.term_history()),
            Verdict::Refuse { reason } => {
                tracing::warn!("refused a ship: {reason}");
                ShipOutcome::Refused(reason)
            }
            Verdict::Halt { reason } => {
                tracing::error!("receiver halted: {reason}");
                *self.halted.lock().expect("halt lock is never held across a panic") = Some(reason.clone());
                ShipOutcome::Refused(reason)
            }
            Verdict::Accept { steps, matched, commit } => match self.perform(&ship, steps).await {
                Ok(()) => {
                    self.commit.advance(commit);
                    ShipOutcome::Matched(matched)
                }
                Err(reason) => ShipOutcome::Refused(reason),
            },
        };
        ShipAnswer {
            term: self.term(),
            durable: self.wal.durable_seqno(),
            applied: *self.applied.borrow(),
            outcome,
        }
    }

    async fn perform(&self, ship: &Ship, steps: Vec<Step>) -> Result<(), String> {
        let mut appends = Vec::new();
        for step in steps {
            match step {
                Step::Skip(_) => {}
                Step::Append(i) => appends.push(ship.batches[i].clone()),
                Step::QuarantineFrom(seqno) => {
                    let wal = self.wal.clone();
                    let report = tokio::task::spawn_blocking(move || wal.quarantine_from(seqno))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| format!("quarantine from {seqno}: {e}"))?;
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
            .submit_replicated(appends, Box::new(move |result| drop(tx.send(result))))
            .map_err(|e| format!("append refused: {e:?}"))?;
        match rx.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("append failed: {error}")),
            Err(_) => Err("WAL writer stopped".into()),
        }
    }

    // ---------------------------------------------------------------- catch-up by pull

    /// Starts a pull from the leader unless one is running or one started too recently.
    pub fn start_pull(self: Arc<Self>, reason: &'static str) -> bool {
        if self.is_leader() {
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
            if let Err(error) = self.pull_once().await {
                tracing::warn!(reason, "failed to pull from the leader: {error}");
            }
            self.pulling.store(false, Ordering::SeqCst);
        });
        true
    }

    async fn pull_once(self: &Arc<Self>) -> Result<(), String> {
        let peer = self.peers.get(&self.leader).ok_or("no leader peer")?;
        let pull = Pull {
            cluster_id: self.spec.cluster_id.clone(),
            term: self.term(),
            node: self.me,
            from: self.wal.last_position(),
            chunk_bytes_max: SHIP_BYTES_MAX as u64,
        };
        let mut stream = peer.pull(&pull, PULL_IDLE_TIMEOUT).await.map_err(|e: NetError| e.to_string())?;
        let mut batches = 0usize;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            match chunk.outcome {
                ChunkOutcome::Batches { prev, batches: pulled } => {
                    batches += pulled.len();
                    let ship = Ship {
                        cluster_id: self.spec.cluster_id.clone(),
                        term: chunk.term,
                        leader: chunk.leader,
                        prev,
                        commit: chunk.commit,
                        baseline: chunk.baseline,
                        batches: pulled,
                    };
                    let answer = self.receive(ship).await;
                    if !matches!(answer.outcome, ShipOutcome::Matched(_)) {
                        return Err(format!("pulled chunk not accepted: {:?}", answer.outcome));
                    }
                }
                ChunkOutcome::Diverged(_) => return Err("our log diverged from the leader's".into()),
                ChunkOutcome::Purged(at) => {
                    return Err(format!(
                        "the leader purged past our position (purge point {at}): needs a snapshot"
                    ))
                }
            }
        }
        tracing::info!(batches, last = %self.wal.last_position(), "pull done");
        Ok(())
    }

    /// Serves a pull: batches after `from`, from the WAL, in chunks.
    pub fn serve_pull(&self, pull: Pull) -> Result<ChunkStream, tonic::Status> {
        let from = pull.from;
        let purged = self.wal.purged();
        let header = |outcome| Chunk {
            term: self.term(),
            leader: self.leader,
            baseline: TermSeqno::default(),
            commit: self.commit.commit(),
            outcome,
        };
        if from.seqno > Seqno::ZERO && from.seqno < purged.seqno {
            return Ok(Box::pin(tokio_stream::iter([Ok(header(ChunkOutcome::Purged(purged)))])));
        }
        let holds =
            from.seqno == Seqno::ZERO || from == purged || self.wal.term_at(from.seqno) == Some(from.term);
        if !holds {
            let history = self.wal.term_history();
            return Ok(Box::pin(tokio_stream::iter([Ok(header(ChunkOutcome::Diverged(history)))])));
        }
        let chunk_bytes =
            usize::try_from(pull.chunk_bytes_max).unwrap_or(SHIP_BYTES_MAX).clamp(1, SHIP_BYTES_MAX);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Chunk, tonic::Status>>(4);
        let wal = self.wal.clone();
        let (term, leader, commit) = (self.term(), self.leader, self.commit.commit());
        let durable = self.wal.durable_seqno();
        tokio::task::spawn_blocking(move || {
            let reader = match wal.read_from(from.seqno.next()) {
                Ok(reader) => reader,
                Err(error) => {
                    let _ = tx.blocking_send(Err(tonic::Status::internal(format!("read WAL: {error}"))));
                    return;
                }
            };
            let mut prev = from;
            let mut pending: Vec<Batch> = Vec::new();
            let mut pending_bytes = 0usize;
            let send = |prev: TermSeqno, batches: Vec<Batch>| {
                let chunk = Chunk {
                    term,
                    leader,
                    baseline: TermSeqno::default(),
                    commit,
                    outcome: ChunkOutcome::Batches { prev, batches },
                };
                tx.blocking_send(Ok(chunk)).is_ok()
            };
            for batch in reader {
                let batch = match batch {
                    Ok(batch) => batch,
                    Err(error) => {
                        let _ = tx.blocking_send(Err(tonic::Status::internal(format!("read WAL: {error}"))));
                        return;
                    }
                };
                if batch.first_seqno() > durable {
                    break;
                }
                if !pending.is_empty() && pending_bytes + batch.encoded().len() > chunk_bytes {
                    let last = pending.last().map(|b| TermSeqno { term: b.term(), seqno: b.last_seqno() });
                    if !send(prev, std::mem::take(&mut pending)) {
                        return;
                    }
                    prev = last.unwrap_or(prev);
                    pending_bytes = 0;
                }
                pending_bytes += batch.encoded().len();
                pending.push(batch);
            }
            if !pending.is_empty() {
                send(prev, pending);
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// The decision core's view of this node's durable log.
struct WalView<'a> {
    wal: &'a Wal,
    commit: &'a CommitState,
}

impl LogView for WalView<'_> {
    fn term(&self) -> Term {
        self.commit.term()
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

    async fn ship(&self, ship: Ship) -> Result<ShipAnswer, tonic::Status> {
        Ok(self.0.receive(ship).await)
    }

    async fn pull(&self, pull: Pull) -> Result<ChunkStream, tonic::Status> {
        self.0.serve_pull(pull)
    }

    async fn nudge(&self, _reason: String) -> Result<bool, tonic::Status> {
        Ok(self.0.clone().start_pull("nudge"))
    }
}
