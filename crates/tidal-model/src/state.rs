//! The model's state: per-node durable and in-memory state, the network, and history variables.
//!
//! A batch is abstracted as one seqno stamped with one term and the writer process that wrote it
//! ([`Batch`]): `wal[i]` is the batch at seqno `i + 1`. The decision core sees `(term, seqno)` only,
//! as production does; the writer is what the properties use to tell apart two batches at the same
//! `(term, seqno)` written by two processes of one leader (a leader put back in office in its term
//! after a restart that lost batches it had already shipped). Everything the properties need that no single node remembers (what was acknowledged,
//! what some leader declared committed, rules broken at a transition) is kept in [`History`].

use std::collections::{BTreeMap, BTreeSet};
use tidal_protocol::{Located, LogView, ProbeAnswer};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};

/// The whole cluster at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelState {
    /// Nodes, `nodes[i]` is `NodeId(i + 1)`.
    pub nodes: Vec<NodeState>,
    /// Messages in flight, the last one sent on each link. Delivery leaves a ship, ack or notice
    /// here, so it can be delivered again (duplication), after messages on other links
    /// (reordering), or never (loss); a newer message on the same link replaces it. A checked pull
    /// and a pulled chunk leave when delivered (one reader per check, each chunk taken once).
    pub network: Network,
    /// The highest term openraft has started (elections take terms in order).
    pub last_term: Term,
    /// Client writes accepted so far (bounded by the model).
    pub writes: u8,
    /// Crash-and-restarts so far (bounded by the model).
    pub crashes: u8,
    /// Follower pulls so far (bounded by the model).
    pub pulls: u8,
    /// The membership configuration the data path is in.
    pub config: Config,
    /// History variables for the properties.
    pub history: History,
}

/// One node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeState {
    /// Persisted vote term (openraft's `save_vote` fsyncs it before returning).
    pub term: Term,
    /// Persisted: openraft made this node leader of this term (a restart may put it back in office).
    pub elected: Option<Term>,
    /// The writer-process id this node stamps on the batches it writes: restarts since openraft last
    /// elected it (bumped by a restart while `elected` is set, reset by an election). A term's
    /// batches come from its one leader, so numbering from the election keeps every batch's writer 0
    /// unless a restarted leader resumes its term (the planted bug `resume_after_restart`).
    pub incarnation: u8,
    /// The WAL as appended: `wal[i]` is the batch at seqno `i + 1`.
    pub wal: Vec<Batch>,
    /// Last fsynced seqno: a crash keeps `wal[..durable]` only.
    pub durable: Seqno,
    /// Commit frontier (in memory).
    pub commit: Seqno,
    /// Applied seqno (persisted with the engine state; the model persists it at once, up to the
    /// durable WAL: a follower may apply past its durable position, decisions/025, and a restart
    /// keeps `min(applied, durable)`).
    pub applied: Seqno,
    /// What the node is doing.
    pub role: Role,
    /// Accepted messages waiting for the fsync before their ack (PROTOCOL.md, "Shipping and
    /// pulling", step 4).
    pub unsynced: BTreeSet<PendingAck>,
    /// Follower (in memory): the leader's commit notices and how far a live ship of that term
    /// matched: once written (decisions/025), or after its fsync (decisions/016, the rule before).
    pub notice: NoticeState,
    /// The ship feed's base (in memory): the seqno right before the front of the node's bounded
    /// tail (`ShipFeed`). The tail holds `wal[tail_base..]` up to its end (the written log, or
    /// the durable one without ships on write), at most [`crate::ReplicationModel::tail_batches`]
    /// batches: the base moves up as batches fall off the front (kept normalized after every
    /// step), and is reset to the WAL's last position at a restart and after a quarantine.
    pub tail_base: Seqno,
    /// The vote persisted when this process started (`Replica::boot_term`): a term at or below it
    /// is never resumed (`resumes_a_term`).
    pub boot_term: Term,
    /// The highest term this process opened as leader (`Replica::opened_term`; 0: none).
    pub opened: Term,
}

/// One batch in a WAL or a message: the term of the leader that wrote it and which process of that
/// leader (its [`NodeState::incarnation`]) wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Batch {
    /// The writing leader's term.
    pub term: Term,
    /// The writing process (0 unless a restarted leader resumed its term).
    pub writer: u8,
}

impl Batch {
    /// A batch of `term` written by process `writer`.
    pub fn new(term: Term, writer: u8) -> Batch {
        Batch { term, writer }
    }
}

/// A follower's commit-notice bookkeeping, as tidal-cluster's `LeaderCommit`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NoticeState {
    /// The term the other fields belong to.
    pub term: Term,
    /// The highest commit a notice of `term` announced.
    pub notified: Seqno,
    /// The last position of a live ship of `term` accepted and written (decisions/025; before it,
    /// accepted and fsynced).
    pub matched: Seqno,
}

impl NoticeState {
    /// The state for `term`: reset when `term` is newer; `None` when it is older.
    pub fn in_term(&mut self, term: Term) -> Option<&mut NoticeState> {
        if term > self.term {
            *self = NoticeState { term, ..NoticeState::default() };
        }
        (term == self.term).then_some(self)
    }

    /// What a notice lets the follower commit: announced AND matched.
    pub fn frontier(&self) -> Seqno {
        self.notified.min(self.matched)
    }
}

/// An accepted ship or chunk whose ack waits for the next fsync and the term re-check.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PendingAck {
    /// The message's term.
    pub term: Term,
    /// Who to ack (None for a pulled chunk: nobody counts it).
    pub to: Option<NodeId>,
    /// `matched` from the verdict.
    pub matched: TermSeqno,
    /// `commit` from the verdict.
    pub commit: Seqno,
}

/// What a node is doing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Accepts ships of its term.
    Follower,
    /// Elected in `term`, probing (taking office step 2).
    Probing {
        /// The term it was elected in.
        term: Term,
        /// Answers so far.
        answers: BTreeMap<NodeId, ProbeAnswer>,
        /// Commit frontiers seen while probing: read ONLY by the planted bug `choose_by_commit`.
        commits: BTreeMap<NodeId, Seqno>,
    },
    /// Pulling the greatest log before opening the term (taking office step 3).
    Syncing {
        /// The term.
        term: Term,
        /// Node holding the greatest log.
        source: NodeId,
        /// Its last position: once held, the term opens.
        target: TermSeqno,
    },
    /// Term opened (LeaderStart appended).
    Leader {
        /// The term.
        term: Term,
        /// Seqno of this term's LeaderStart.
        start: Seqno,
        /// LeaderStart committed and applied: reads and acks allowed.
        serving: bool,
        /// Per node (itself included), the last position acked in this term.
        matched: BTreeMap<NodeId, TermSeqno>,
        /// Client writes appended and not yet acknowledged.
        waiting: BTreeSet<Seqno>,
        /// Per follower, the position its ShipQueue ships after next (`ShipQueue`'s `after`): the
        /// tail's last position when the term opens, then `tidal_protocol::next_after` of
        /// each answer (Matched with the ack, Gap and Diverged at once), or the tail's last again
        /// when the tail cannot serve it (the follower is nudged to pull).
        after: BTreeMap<NodeId, TermSeqno>,
    },
}

/// The membership configuration (5-node variant; the 3-node model stays `Static`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Config {
    /// One voter set that never changes.
    Static,
    /// The old voter set.
    Old,
    /// The leader of `term` decided on the change: it counts commit against both sets; openraft does
    /// not know yet, so elections still use the old set.
    Deciding {
        /// The deciding leader's term.
        term: Term,
    },
    /// Openraft committed the new configuration.
    New,
}

/// The network: per link, the last message sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Network(BTreeMap<(NodeId, NodeId, u8), Message>);

impl Network {
    /// Sends `message`, replacing the one in flight on its link. False if it was already there.
    pub fn send(&mut self, message: Message) -> bool {
        let link = match &message {
            Message::Ship { from, to, pull, .. } => (*from, *to, u8::from(*pull)),
            Message::Ack { from, to, .. } => (*from, *to, 0),
            Message::Commit { from, to, .. } => (*from, *to, 2),
            Message::Pull { source, to, .. } => (*source, *to, 3),
        };
        self.0.insert(link, message.clone()) != Some(message)
    }

    /// Messages in flight.
    pub fn messages(&self) -> impl Iterator<Item = &Message> {
        self.0.values()
    }

    /// Removes `message` from its link.
    pub fn remove(&mut self, message: &Message) {
        self.0.retain(|_, m| m != message);
    }

    /// Keeps only the messages for which `keep` holds.
    pub fn retain(&mut self, keep: impl Fn(&Message) -> bool) {
        self.0.retain(|_, message| keep(message));
    }
}

/// A message on the network.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Message {
    /// `ShipSegment`, or a chunk of a pull (`pull`), with single-seqno batches after `prev`.
    Ship {
        /// Sender.
        from: NodeId,
        /// Receiver.
        to: NodeId,
        /// Sender's term.
        term: Term,
        /// Position before the first batch.
        prev: TermSeqno,
        /// Batches with their seqnos, contiguous from `prev.seqno + 1`.
        batches: Vec<(Seqno, Batch)>,
        /// Sender's commit frontier.
        commit: Seqno,
        /// A pulled chunk (not acked).
        pull: bool,
        /// The chunk names its sender as the leader of `term` (it held office in that term when it
        /// checked the pull; production's `Chunk::leader == source`): the receiver lets such a
        /// chunk replace its batches, any other only append. Always true for a live ship.
        leader: bool,
    },
    /// A pull that `source` has checked (its durable log held `prev` then) and whose reader has
    /// not opened yet (production's `serve_pull` checks, then a spawned task opens the reader).
    /// Its delivery is the reader opening on the source's log as it is THEN: it sends the chunk.
    Pull {
        /// The node serving the pull.
        source: NodeId,
        /// The node pulling.
        to: NodeId,
        /// The source's term at the check (the chunk's term).
        term: Term,
        /// The puller's position the check found in the source's log.
        prev: TermSeqno,
        /// The source's commit frontier at the check.
        commit: Seqno,
        /// The source held office in `term` at the check (see [`Message::Ship`]'s `leader`).
        leader: bool,
    },
    /// A commit notice: the leader of `term` committed through `commit`.
    Commit {
        /// Leader.
        from: NodeId,
        /// Follower.
        to: NodeId,
        /// The leader's term.
        term: Term,
        /// Its commit frontier.
        commit: Seqno,
    },
    /// `Ack{term, matched}`.
    Ack {
        /// Follower.
        from: NodeId,
        /// Leader.
        to: NodeId,
        /// The acked message's term.
        term: Term,
        /// Last position verified or appended.
        matched: TermSeqno,
    },
}

/// History variables: what the properties need beyond the current state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct History {
    /// Every client acknowledgement.
    pub acked: BTreeSet<Acked>,
    /// Every batch some leader counted as committed (quorum mode).
    pub committed: BTreeSet<Committed>,
    /// Nodes that have served as leader.
    pub served_by: BTreeSet<NodeId>,
    /// A divergent suffix was moved to quarantine.
    pub quarantined: bool,
    /// A restarted node that openraft put back in office handed its term over (`resumes_a_term`).
    pub handed_over: bool,
    /// A pull's reader opened after its source's log stopped holding the checked `prev` (a
    /// quarantine and refill in between) and answered Diverged (`Wal::read_raw_after`).
    pub pull_prev_gone: bool,
    /// A follower refused a pulled chunk from a node not in office that conflicted with its log at
    /// or below its commit frontier (`append_only`; the planted bug HaltOnStaleChunk halts there).
    pub stale_chunk_refused: bool,
    /// Rules broken at a transition.
    pub broken: BTreeSet<Broken>,
}

/// A batch a leader counted as committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Committed {
    /// Its position.
    pub position: TermSeqno,
    /// Its writer process.
    pub writer: u8,
    /// The term of the leader that counted it.
    pub by: Term,
}

/// A client acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Acked {
    /// The write's position.
    pub batch: TermSeqno,
    /// Its writer process.
    pub writer: u8,
    /// The acknowledging node.
    pub by: NodeId,
    /// Its term when it acknowledged.
    pub in_term: Term,
}

/// A rule broken at a transition (not visible in a single state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Broken {
    /// A node's commit frontier went down without a restart.
    CommitDecreased(NodeId),
    /// A committed position was moved to quarantine.
    QuarantinedCommitted(NodeId, TermSeqno),
    /// A receiver halted (decide_ship refused to quarantine at or below its commit).
    Halted(NodeId),
    /// A follower halted on a pulled chunk from a node not in office in the chunk's term (which
    /// may only append). Such a chunk never proves a conflict with the leader's log, so the halt
    /// stalls a follower for nothing (a violation since issue 37; decisions/006).
    HaltedOnChunk(NodeId),
    /// A node sent a ship or served a pulled chunk whose `prev` its own log did not hold
    /// (production counts it as `unheld_prev`: a bug).
    UnheldPrev(NodeId),
}

impl NodeState {
    /// A node with an empty log in term 0.
    pub fn new() -> NodeState {
        NodeState {
            term: Term(0),
            elected: None,
            incarnation: 0,
            wal: Vec::new(),
            durable: Seqno::ZERO,
            commit: Seqno::ZERO,
            applied: Seqno::ZERO,
            role: Role::Follower,
            unsynced: BTreeSet::new(),
            notice: NoticeState::default(),
            tail_base: Seqno::ZERO,
            boot_term: Term(0),
            opened: Term(0),
        }
    }

    /// Last appended seqno.
    pub fn len(&self) -> Seqno {
        Seqno(self.wal.len() as u64)
    }

    /// The batch at `seqno`, if held.
    pub fn batch_at(&self, seqno: Seqno) -> Option<Batch> {
        let index = usize::try_from(seqno.get()).ok()?.checked_sub(1)?;
        self.wal.get(index).copied()
    }

    /// The term of the batch at `seqno`, if held.
    pub fn term_at(&self, seqno: Seqno) -> Option<Term> {
        self.batch_at(seqno).map(|batch| batch.term)
    }

    /// Whether the node holds `position` written by `writer` (the same batch, not only its position).
    pub fn holds(&self, position: TermSeqno, writer: u8) -> bool {
        self.batch_at(position.seqno) == Some(Batch::new(position.term, writer))
    }

    /// Whether the log up to `upto` holds `position` (term level, as production's `Wal::holds`):
    /// `(0, 0)`, or a seqno at or below `upto` whose batch has `position.term`.
    pub fn holds_position(&self, position: TermSeqno, upto: Seqno) -> bool {
        if position.seqno == Seqno::ZERO {
            return position.term == Term(0);
        }
        position.seqno <= upto && self.term_at(position.seqno) == Some(position.term)
    }

    /// The position of `seqno` (`(0, 0)` for seqno 0 or one not held).
    pub fn position(&self, seqno: Seqno) -> TermSeqno {
        self.term_at(seqno).map_or_else(TermSeqno::default, |term| TermSeqno { term, seqno })
    }

    /// Last durable position.
    pub fn durable_last(&self) -> TermSeqno {
        self.position(self.durable)
    }

    /// Term history `[(term, first seqno)]` of `wal[..upto]`.
    pub fn history(&self, upto: Seqno) -> Vec<TermSeqno> {
        let mut history: Vec<TermSeqno> = Vec::new();
        for (i, batch) in self.wal.iter().enumerate().take(usize::try_from(upto.get()).unwrap_or(0)) {
            if history.last().is_none_or(|entry| entry.term != batch.term) {
                history.push(TermSeqno { term: batch.term, seqno: Seqno(i as u64 + 1) });
            }
        }
        history
    }

    /// The term of the role, if the node holds or is taking office.
    pub fn office_term(&self) -> Option<Term> {
        match &self.role {
            Role::Follower => None,
            Role::Probing { term, .. } | Role::Syncing { term, .. } | Role::Leader { term, .. } => {
                Some(*term)
            }
        }
    }
}

impl Default for NodeState {
    fn default() -> Self {
        NodeState::new()
    }
}

impl LogView for NodeState {
    fn term(&self) -> Term {
        self.term
    }
    fn last(&self) -> TermSeqno {
        self.position(self.len())
    }
    fn locate(&self, seqno: Seqno) -> Located {
        match self.term_at(seqno) {
            Some(term) => Located::In { term, first: seqno, last: seqno },
            None => Located::Beyond,
        }
    }
    fn snapshot_position(&self) -> Option<TermSeqno> {
        None
    }
    fn commit(&self) -> Seqno {
        self.commit
    }
}

/// A node's DURABLE log, as production's `WalView` sees it (WAL positions are durable ones): what a
/// leader's ShipQueue computes its next position from (`next_after`).
pub struct DurableView<'a>(pub &'a NodeState);

impl LogView for DurableView<'_> {
    fn term(&self) -> Term {
        self.0.term
    }
    fn last(&self) -> TermSeqno {
        self.0.durable_last()
    }
    fn locate(&self, seqno: Seqno) -> Located {
        if seqno > self.0.durable {
            return Located::Beyond;
        }
        self.0.locate(seqno)
    }
    fn snapshot_position(&self) -> Option<TermSeqno> {
        None
    }
    fn commit(&self) -> Seqno {
        self.0.commit
    }
}

/// A node's log seen with a lower term: the planted bug `accept_lower_term`.
pub struct LowerTermView<'a> {
    /// The node.
    pub node: &'a NodeState,
    /// The term to pretend.
    pub term: Term,
}

impl LogView for LowerTermView<'_> {
    fn term(&self) -> Term {
        self.term
    }
    fn last(&self) -> TermSeqno {
        self.node.last()
    }
    fn locate(&self, seqno: Seqno) -> Located {
        self.node.locate(seqno)
    }
    fn snapshot_position(&self) -> Option<TermSeqno> {
        None
    }
    fn commit(&self) -> Seqno {
        self.node.commit
    }
}

/// `NodeId` of node index `i`.
pub fn id(i: usize) -> NodeId {
    NodeId(i as u64 + 1)
}

/// Index of `NodeId`.
pub fn index(node: NodeId) -> usize {
    usize::try_from(node.0).map_or(usize::MAX, |n| n.wrapping_sub(1))
}
