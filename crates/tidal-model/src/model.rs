//! The replication protocol as a stateright [`Model`], driving tidal-cluster's decision core.
//!
//! Every decision goes through the production functions: a follower (and a new leader pulling)
//! decides each message with `decide_ship`; a leader's commit is `commit_frontier` over a `Quorum`;
//! taking office is `answer_probe` + `plan_office`, and `resumes_a_term` at its last step; a
//! ShipQueue's next position is `next_after` of the follower's answer, and what its tail can ship
//! after it is `tidal_protocol::tail_start`. The model only performs what they return (append,
//! quarantine, fsync, send, apply), as the production receiver does, and chooses everything else
//! nondeterministically: who wins which election, when a node fsyncs, crashes, ships, pulls, and
//! which message is delivered. Delicate:
//! - a planted bug ([`Bugs`]) flips ONE rule by lying to or bypassing the core, never by editing it;
//! - an action that changes nothing returns `None`, so stateright does not count it as a new state.
//!
//! The inputs are generated the way production generates them (issue 37; until then every ship
//! carried the whole log after `(0, 0)`, a pull was one atomic copy, and a restarted leader came
//! back in office only with a planted bug):
//! - ships: each leader keeps, per follower, the ShipQueue's `after`: the tail's last position when
//!   the term opens, then `next_after` of each answer (Gap and Diverged folded into the delivery,
//!   Matched with the ack). A ship carries `prev = after` and the batches its bounded tail holds
//!   after it ([`ReplicationModel::tail_batches`]; the tail restarts at the node's last position
//!   at a restart and after a quarantine); when the tail cannot serve `after` the queue ships a
//!   heartbeat from the tail's end and the follower is left to pull;
//! - pulls: a check (the source's durable log holds the puller's last position, or the divergence
//!   point), then, as a later step, a read of the source's durable log as it is THEN, which checks
//!   `prev` again (`Wal::read_raw_after`). A follower pulls from the node openraft elected in its
//!   term, also while that node is still taking office (a leader change);
//! - restarts: openraft may put a restarted node whose vote names it leader back in office
//!   ([`Action::Reelect`]); it takes office as after an election, and `resumes_a_term` makes it hand
//!   the term over before it writes.
//!
//! The leader writes its log in parallel with replicating (Raft §10.2.1, decisions/023): a live ship
//! carries appends not yet fsynced, so a follower may hold durably a batch that the leader's crash
//! loses. Two rules keep that safe, and each has a planted bug:
//! - in quorum mode the leader's commit is `min(commit_frontier, own durable)`, never decreasing
//!   ([`Bug::CommitPastOwnDurable`] drops the cap);
//! - a restarted leader never resumes its term: it hands it over and waits for an election of a
//!   higher term ([`Bug::ResumeAfterRestart`] has no guard, [`Bug::ResumeLostLeaderStart`] the guard
//!   of a57b07b). Resumed, it could write another batch at a `(term, seqno)` it had shipped before
//!   the crash. The core decides on `(term, seqno)` only and cannot tell the two apart; the model
//!   stamps each batch with its writer process ([`crate::state::Batch`]) so that the properties can.
//!
//! Pulls (a syncing leader's, a follower's catch-up) serve the source's durable log only.
//!
//! A follower applies committed batches once WRITTEN, before its own fsync (decisions/025,
//! [`ReplicationModel::apply_on_write`]): a live ship's batches count as held for its own commit
//! frontier the moment they are appended (`matched` for commit notices is set then), so the
//! ship's commit and later notices cover them and the follower applies up to that commit. Its ack
//! still waits for its fsync, and the leader still counts only fsynced acks, so what a follower
//! applies early is already fsynced by a majority. A follower's commit and applied frontiers may
//! therefore pass its durable position (never its written log); a restart brings `applied` back to
//! the durable WAL, since the engine never persists state past it. Two planted bugs:
//! [`Bug::NoticePastWritten`] (the write-time commit is not capped at what was written) and
//! [`Bug::PersistPastDurable`] (a restart keeps `applied` above the durable WAL).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use stateright::{Model, Property};
use tidal_protocol::{
    answer_probe, append_only, authority, commit_frontier, decide_ship, divergence_point, next_after,
    next_ship_step, plan_office, resumes_a_term, tail_start, term_start, BatchMeta, LogView, OfficePlan,
    Origin, OwnLog, ProbeAnswer, QueueStep, QueueView, Quorum, Reply, ShipMeta, Step, Tail, TailStart,
    Verdict,
};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};

use crate::properties;
use crate::state::{
    id, index, Acked, Batch, Broken, Committed, Config, DurableView, History, LowerTermView, Message,
    ModelState, Network, NodeState, NoticeState, PendingAck, Role,
};

/// Durability mode (PROTOCOL.md, "Committing and acknowledging").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Commit = majority of voters; ack once committed and applied.
    Quorum,
    /// Commit = the leader's durable; ack after the leader's fsync and apply.
    Leader,
}

/// A rule of PROTOCOL.md that a planted bug breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// A follower acks at accept time, before its fsync.
    AckBeforeFsync,
    /// A follower acks after its fsync without re-checking its term.
    NoTermRecheck,
    /// The leader counts an ack of an older-term batch toward commit (matched relabelled with the
    /// ack's term, and `term_at` lies).
    CountOlderTerm,
    /// A follower accepts a ship whose sender's term is below its own.
    AcceptLowerTerm,
    /// Nodes apply up to durable instead of up to commit.
    ApplyPastCommit,
    /// A new leader serves as soon as it appends LeaderStart, before it is committed.
    ServeBeforeLeaderStart,
    /// A new leader adopts the log with the greatest commit frontier instead of `plan_office`'s choice.
    ChooseByCommit,
    /// During a membership change the leader counts commit against the new voter set only.
    SkipDualCount,
    /// A follower takes a commit notice's frontier without capping it at what a live ship of that
    /// term matched (after its fsync, decisions/016; once written, decisions/025) when the notice
    /// arrives.
    NoticePastMatched,
    /// A follower's catch-up chunk from a node not in office (stale leader hint) may replace the
    /// follower's batches, as a ship from the leader may (chaos 114, decisions/019).
    StalePullReplaces,
    /// The leader's commit is the majority-matched frontier alone, not capped at its own durable
    /// position: with ships of unsynced batches, followers can match past the leader's fsync
    /// (decisions/023).
    CommitPastOwnDurable,
    /// Openraft puts a restarted leader back in office in the same term, and it takes it (no
    /// guard at all): it may write a batch at a `(term, seqno)` where it had shipped another one
    /// that its crash lost (decisions/023).
    ResumeAfterRestart,
    /// A follower that applies on write (decisions/025) takes, when it writes a live ship's
    /// batches, the ship's commit and the notices' commit of that term without capping them at
    /// what it has written (its `matched`).
    NoticePastWritten,
    /// A restart keeps the applied frontier where it was, above the durable WAL: the engine
    /// persisted state the WAL lost (decisions/025 rule 3 broken).
    PersistPastDurable,
    /// Finding 1 of issue 37 (a57b07b): a follower's `Gap` answer makes ITS last position the
    /// ShipQueue's next `prev` (`ShipOutcome::Gap(last) => last`), and the ship feed ships its
    /// front after any position that lines up with it (the old `read_after`: the `start == 0`
    /// branch, and a heartbeat for any term at an empty tail's end), with no `holds(prev)` check
    /// before the ship leaves. The follower's prev check then compares its log with itself.
    ShipFollowerPrev,
    /// Finding 2 of issue 37 (a57b07b): a pull checks that the source holds `prev`, and the reader
    /// that opens later reads whatever follows `prev.seqno` in the source's log THEN, without
    /// checking `prev` again (`read_raw_from` instead of `read_raw_after`): a quarantine and
    /// refill in between pairs `prev` with batches of another log.
    PullCheckThenRead,
    /// Finding 3 of issue 37 (a57b07b): the office guard refuses a restored term only when the WAL
    /// still holds a batch of it (`!write_leader_start && opened_term < term`); a crash that took
    /// the term's LeaderStart itself lets the restored leader write a second one at the same
    /// `(term, seqno)`. The rule is `resumes_a_term` (a term at or below the vote persisted at
    /// process start is never resumed).
    ResumeLostLeaderStart,
    /// Found by this model (issue 37, after the findings): a pulled chunk from a node that did not
    /// hold office in its term, conflicting with the follower's log at or below its commit frontier,
    /// halts the follower (decide_ship's Halt kept by `append_only`, 58e6e09) instead of being
    /// refused like any other replacement from such a sender. Quorum mode must never halt.
    HaltOnStaleChunk,
}

impl Bug {
    /// Every planted bug, in PROTOCOL.md's order ("The planted violations"), then issue 37's findings.
    /// [`Bug::StalePullReplaces`] is not in it: with follower pulls the smallest model that shows
    /// it is too large for the checker within minutes (decisions/019).
    pub const ALL: [Bug; 17] = [
        Bug::AckBeforeFsync,
        Bug::NoTermRecheck,
        Bug::CountOlderTerm,
        Bug::AcceptLowerTerm,
        Bug::ApplyPastCommit,
        Bug::ServeBeforeLeaderStart,
        Bug::ChooseByCommit,
        Bug::SkipDualCount,
        Bug::NoticePastMatched,
        Bug::CommitPastOwnDurable,
        Bug::ResumeAfterRestart,
        Bug::NoticePastWritten,
        Bug::PersistPastDurable,
        Bug::ShipFollowerPrev,
        Bug::PullCheckThenRead,
        Bug::ResumeLostLeaderStart,
        Bug::HaltOnStaleChunk,
    ];
}

/// Which rules are flipped (all false: the protocol as specified).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// See [`Bug::AckBeforeFsync`].
    pub ack_before_fsync: bool,
    /// See [`Bug::NoTermRecheck`].
    pub no_term_recheck: bool,
    /// See [`Bug::CountOlderTerm`].
    pub count_older_term: bool,
    /// See [`Bug::AcceptLowerTerm`].
    pub accept_lower_term: bool,
    /// See [`Bug::ApplyPastCommit`].
    pub apply_past_commit: bool,
    /// See [`Bug::ServeBeforeLeaderStart`].
    pub serve_before_leader_start: bool,
    /// See [`Bug::ChooseByCommit`].
    pub choose_by_commit: bool,
    /// See [`Bug::SkipDualCount`].
    pub skip_dual_count: bool,
    /// See [`Bug::NoticePastMatched`].
    pub notice_past_matched: bool,
    /// See [`Bug::StalePullReplaces`].
    pub stale_pull_replaces: bool,
    /// See [`Bug::CommitPastOwnDurable`].
    pub commit_past_own_durable: bool,
    /// See [`Bug::ResumeAfterRestart`].
    pub resume_after_restart: bool,
    /// See [`Bug::NoticePastWritten`].
    pub notice_past_written: bool,
    /// See [`Bug::PersistPastDurable`].
    pub persist_past_durable: bool,
    /// See [`Bug::ShipFollowerPrev`].
    pub ship_follower_prev: bool,
    /// See [`Bug::PullCheckThenRead`].
    pub pull_check_then_read: bool,
    /// See [`Bug::ResumeLostLeaderStart`].
    pub resume_lost_leader_start: bool,
    /// See [`Bug::HaltOnStaleChunk`].
    pub halt_on_stale_chunk: bool,
}

impl Bugs {
    /// Exactly one planted bug.
    pub fn one(bug: Bug) -> Bugs {
        Bugs::default().with(bug)
    }

    /// These bugs and `bug`.
    pub fn with(self, bug: Bug) -> Bugs {
        let mut bugs = self;
        match bug {
            Bug::AckBeforeFsync => bugs.ack_before_fsync = true,
            Bug::NoTermRecheck => bugs.no_term_recheck = true,
            Bug::CountOlderTerm => bugs.count_older_term = true,
            Bug::AcceptLowerTerm => bugs.accept_lower_term = true,
            Bug::ApplyPastCommit => bugs.apply_past_commit = true,
            Bug::ServeBeforeLeaderStart => bugs.serve_before_leader_start = true,
            Bug::ChooseByCommit => bugs.choose_by_commit = true,
            Bug::SkipDualCount => bugs.skip_dual_count = true,
            Bug::NoticePastMatched => bugs.notice_past_matched = true,
            Bug::StalePullReplaces => bugs.stale_pull_replaces = true,
            Bug::CommitPastOwnDurable => bugs.commit_past_own_durable = true,
            Bug::ResumeAfterRestart => bugs.resume_after_restart = true,
            Bug::NoticePastWritten => bugs.notice_past_written = true,
            Bug::PersistPastDurable => bugs.persist_past_durable = true,
            Bug::ShipFollowerPrev => bugs.ship_follower_prev = true,
            Bug::PullCheckThenRead => bugs.pull_check_then_read = true,
            Bug::ResumeLostLeaderStart => bugs.resume_lost_leader_start = true,
            Bug::HaltOnStaleChunk => bugs.halt_on_stale_chunk = true,
        }
        bugs
    }
}

/// The model's bounds and switches.
#[derive(Clone, Debug)]
pub struct ReplicationModel {
    /// 3, or 5 with `membership_change`.
    pub node_count: usize,
    /// Highest term an election may start.
    pub max_term: u64,
    /// Client writes at most.
    pub max_writes: u8,
    /// Durability mode.
    pub mode: Mode,
    /// 5 nodes: old voters {n1, n2, n3}, new voters {n1, n4, n5}; the leader may change configuration.
    pub membership_change: bool,
    /// Crash-and-restarts at most, over the whole run.
    pub max_crashes: u8,
    /// Openraft may tell a node a term it did not vote in (a heartbeat); without it, terms spread
    /// only by votes (a smaller model for planted bugs that do not need it).
    pub learn_terms: bool,
    /// Leaders send commit notices (decisions/016) to any follower at any time.
    pub commit_notices: bool,
    /// A follower may also pull (catch up) from any node of its term that is not in office: a
    /// leader hint that went stale (decisions/019).
    pub follower_pulls: bool,
    /// A follower may pull from the node openraft elected in its term, at any moment: when the
    /// leader changes (even while that node is still taking office: probing, syncing), on a Gap
    /// answer, when the leader's ShipQueue nudges it (its tail cannot serve the follower), or on an
    /// operator's catchup. False: only a syncing leader pulls (a smaller model for planted bugs
    /// that do not need it).
    pub leader_pulls: bool,
    /// Follower pulls at most, over the whole run (a syncing leader's pulls are not counted).
    pub max_pulls: u8,
    /// Who openraft elects in term 1, 2, ... (empty, or past its end: any voter). A bound for
    /// planted bugs whose history is too deep to search over every election: it fixes who wins,
    /// not with whose votes, nor anything else of the run.
    pub winners: Vec<NodeId>,
    /// The ship feed's bound in batches (`ShipFeed`'s `batches_max`): small, so that tails rotate
    /// and restart at a node's restart point within a few steps.
    pub tail_batches: u8,
    /// A leader's live ships carry its whole log, appends not yet fsynced included (it ships each
    /// group-commit drain once written, before its own fsync: decisions/023). False: only its
    /// durable log, the rule before; kept to show which planted bugs need the new rule.
    pub ship_unsynced: bool,
    /// A follower applies committed batches once written, before its own fsync (decisions/025): a
    /// live ship's batches set its notice `matched` and move its commit to
    /// `max(commit, min(ship's commit or notice, matched))` at write time, and it applies up to
    /// that commit. False: only after its fsync (decisions/016), the rule before; kept to show
    /// which planted bugs need the new rule.
    pub apply_on_write: bool,
    /// Planted bugs.
    pub bugs: Bugs,
}

/// A step of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Openraft elects `candidate` in the next term with the votes of `voters` (a minimal majority,
    /// the candidate included); each voter persists the term (fencing).
    Elect {
        /// Winner.
        candidate: NodeId,
        /// Voters, candidate included.
        voters: Vec<NodeId>,
    },
    /// Openraft tells `node` about `term` (a heartbeat or vote request); it persists it.
    LearnTerm {
        /// Node.
        node: NodeId,
        /// Term.
        term: Term,
    },
    /// After a restart, openraft puts a node whose persisted vote names it leader back in office in
    /// the same term. It takes office as after an election (probe, sync); before it writes,
    /// `resumes_a_term` decides: such a term is handed over (heartbeats off, the others elect a
    /// higher term), never resumed. The planted bugs [`Bug::ResumeAfterRestart`] (no guard) and
    /// [`Bug::ResumeLostLeaderStart`] (the guard of a57b07b) let it write.
    Reelect {
        /// Node.
        node: NodeId,
    },
    /// The probe of `target` by `leader` and its answer (atomic: the answer's receipt commutes).
    Probe {
        /// Prober.
        leader: NodeId,
        /// Probed node.
        target: NodeId,
    },
    /// A client write reaches a serving leader, which appends it.
    ClientWrite {
        /// Leader.
        leader: NodeId,
    },
    /// The leader's ShipQueue for `to` sends its next ship: `prev` is the queue's `after`, the
    /// batches are what its bounded tail holds after it (appends not yet fsynced included with
    /// [`ship_unsynced`]: the feed is pushed once a drain is written). When the tail cannot serve
    /// `after` (`tail_start`: Rotated or Unknown) the queue nudges the follower to pull and ships a
    /// heartbeat from the tail's last position instead. The follower's answer moves `after`
    /// (`next_after`): Gap and Diverged at delivery, Matched with the ack after its fsync.
    ///
    /// [`ship_unsynced`]: ReplicationModel::ship_unsynced
    Ship {
        /// Leader.
        leader: NodeId,
        /// Follower.
        to: NodeId,
    },
    /// The leader sends its commit frontier to a follower (a commit notice).
    Notice {
        /// Leader.
        leader: NodeId,
        /// Follower.
        to: NodeId,
    },
    /// `node` pulls from `source` (a syncing leader from the log it adopts; a follower from the
    /// node openraft elected in its term, or with [`follower_pulls`] from a stale leader hint):
    /// it asks after its last durable position, and `source` checks that its durable log holds
    /// it (`serve_pull`'s first check); if not, the puller asks again after the divergence point
    /// computed from the source's term history (`pull_from`'s retry). The checked pull is left as
    /// a [`Message::Pull`]: its reader opens later, when that message is delivered, and reads
    /// the source's durable log as it is then (a pull never serves unsynced batches).
    ///
    /// [`follower_pulls`]: ReplicationModel::follower_pulls
    Pull {
        /// The node pulling.
        node: NodeId,
        /// The node serving.
        source: NodeId,
    },
    /// A message is delivered (and stays on the network).
    Deliver(Message),
    /// A node's fsync completes; it re-takes the term lock and acks what it accepted.
    Fsync {
        /// Node.
        node: NodeId,
    },
    /// A node crashes and restarts: unfsynced appends are lost, memory is reset.
    Restart {
        /// Node.
        node: NodeId,
    },
    /// The leader decides on the membership change (dual count from now on).
    BeginChange {
        /// Leader.
        leader: NodeId,
    },
    /// The new set matched the leader's commit in its term: openraft commits the new configuration.
    FinishChange {
        /// Leader.
        leader: NodeId,
    },
}

impl ReplicationModel {
    /// The standard 3-node model.
    pub fn three(max_term: u64, max_writes: u8, mode: Mode) -> ReplicationModel {
        ReplicationModel {
            node_count: 3,
            max_term,
            max_writes,
            mode,
            membership_change: false,
            max_crashes: 1,
            learn_terms: true,
            commit_notices: false,
            follower_pulls: false,
            leader_pulls: true,
            max_pulls: 1,
            winners: Vec::new(),
            tail_batches: 2,
            ship_unsynced: true,
            apply_on_write: true,
            bugs: Bugs::default(),
        }
    }

    /// The same model with leaders sending commit notices.
    pub fn with_notices(self) -> ReplicationModel {
        ReplicationModel { commit_notices: true, ..self }
    }

    /// The same model with followers catching up from nodes not in office.
    pub fn with_follower_pulls(self) -> ReplicationModel {
        ReplicationModel { follower_pulls: true, ..self }
    }

    /// The 5-node model with a membership change.
    pub fn five(max_term: u64, max_writes: u8, mode: Mode) -> ReplicationModel {
        ReplicationModel {
            node_count: 5,
            membership_change: true,
            ..ReplicationModel::three(max_term, max_writes, mode)
        }
    }

    /// The same model without followers pulling from their leader (only syncing leaders pull).
    pub fn without_leader_pulls(self) -> ReplicationModel {
        ReplicationModel { leader_pulls: false, ..self }
    }

    /// The same model with openraft electing `winners` in terms 1, 2, ... (node numbers).
    pub fn with_winners(self, winners: &[u64]) -> ReplicationModel {
        ReplicationModel { winners: winners.iter().map(|n| NodeId(*n)).collect(), ..self }
    }

    /// The same model with a ship feed of `batches` batches at most.
    pub fn with_tail(self, batches: u8) -> ReplicationModel {
        ReplicationModel { tail_batches: batches.max(1), ..self }
    }

    /// The same model with live ships of the durable log only (the rule before decisions/023).
    pub fn with_durable_ships(self) -> ReplicationModel {
        ReplicationModel { ship_unsynced: false, ..self }
    }

    /// The same model with followers applying only after their own fsync (the rule before
    /// decisions/025).
    pub fn with_apply_after_fsync(self) -> ReplicationModel {
        ReplicationModel { apply_on_write: false, ..self }
    }

    /// The same model with `bugs` planted.
    pub fn with_bugs(self, bugs: Bugs) -> ReplicationModel {
        ReplicationModel { bugs, ..self }
    }

    fn quorum_mode(&self) -> bool {
        self.mode == Mode::Quorum
    }

    fn old_voters(&self) -> Vec<NodeId> {
        if self.membership_change {
            vec![NodeId(1), NodeId(2), NodeId(3)]
        } else {
            (0..self.node_count).map(id).collect()
        }
    }

    fn new_voters(&self) -> Vec<NodeId> {
        vec![NodeId(1), NodeId(4), NodeId(5)]
    }

    /// The voter set openraft elects with (and a new leader probes).
    pub fn electorate(&self, config: Config) -> Vec<NodeId> {
        match config {
            Config::New => self.new_voters(),
            Config::Static | Config::Old | Config::Deciding { .. } => self.old_voters(),
        }
    }

    /// The quorum a leader counts commit against.
    pub fn commit_quorum(&self, config: Config) -> Quorum {
        match config {
            Config::Static | Config::Old => Quorum::single(self.old_voters()),
            Config::Deciding { .. } if self.bugs.skip_dual_count => Quorum::single(self.new_voters()),
            Config::Deciding { .. } => Quorum { voter_sets: vec![self.old_voters(), self.new_voters()] },
            Config::New => Quorum::single(self.new_voters()),
        }
    }

    fn node<'a>(&self, state: &'a ModelState, node: NodeId) -> &'a NodeState {
        &state.nodes[index(node)]
    }
}

impl Model for ReplicationModel {
    type State = ModelState;
    type Action = Action;

    fn init_states(&self) -> Vec<ModelState> {
        vec![ModelState {
            nodes: vec![NodeState::new(); self.node_count],
            network: Network::default(),
            last_term: Term(0),
            writes: 0,
            crashes: 0,
            pulls: 0,
            config: if self.membership_change { Config::Old } else { Config::Static },
            history: History::default(),
        }]
    }

    fn actions(&self, state: &ModelState, actions: &mut Vec<Action>) {
        self.election_actions(state, actions);
        for i in 0..self.node_count {
            let me = id(i);
            let node = &state.nodes[i];
            if node.durable < node.len() || !node.unsynced.is_empty() {
                actions.push(Action::Fsync { node: me });
            }
            if state.crashes < self.max_crashes {
                actions.push(Action::Restart { node: me });
            }
            match &node.role {
                Role::Follower if state.pulls < self.max_pulls => {
                    for j in (0..self.node_count).filter(|j| *j != i) {
                        let source = &state.nodes[j];
                        let in_office =
                            matches!(source.role, Role::Leader { term, .. } if term == source.term);
                        let elected_here = node.term > Term(0) && source.office_term() == Some(node.term);
                        let stale_hint = source.term == node.term && !in_office;
                        if (self.leader_pulls && elected_here) || (self.follower_pulls && stale_hint) {
                            actions.push(Action::Pull { node: me, source: id(j) });
                        }
                    }
                }
                Role::Follower => {}
                Role::Probing { .. } => {
                    for j in (0..self.node_count).filter(|j| *j != i) {
                        actions.push(Action::Probe { leader: me, target: id(j) });
                    }
                }
                Role::Syncing { term, source, .. } => {
                    // The source serves only a pull of its own term (a lower one is fenced, a higher
                    // one waits).
                    if state.nodes[index(*source)].term == *term {
                        actions.push(Action::Pull { node: me, source: *source });
                    }
                }
                Role::Leader { serving, .. } => {
                    if *serving && state.writes < self.max_writes {
                        actions.push(Action::ClientWrite { leader: me });
                    }
                    for j in (0..self.node_count).filter(|j| *j != i) {
                        // A ship to a node of a higher term can only be fenced.
                        if state.nodes[j].term <= node.term || self.bugs.accept_lower_term {
                            actions.push(Action::Ship { leader: me, to: id(j) });
                        }
                        if self.commit_notices && node.commit > Seqno::ZERO {
                            actions.push(Action::Notice { leader: me, to: id(j) });
                        }
                    }
                    if self.membership_change {
                        match state.config {
                            Config::Old => actions.push(Action::BeginChange { leader: me }),
                            Config::Deciding { .. } if *serving => {
                                actions.push(Action::FinishChange { leader: me })
                            }
                            Config::Static | Config::Deciding { .. } | Config::New => {}
                        }
                    }
                }
            }
        }
        for message in state.network.messages() {
            actions.push(Action::Deliver(message.clone()));
        }
    }

    fn next_state(&self, state: &ModelState, action: Action) -> Option<ModelState> {
        let mut next = state.clone();
        let changed = match action {
            Action::Elect { candidate, voters } => self.elect(&mut next, candidate, &voters),
            Action::LearnTerm { node, term } => {
                adopt(&mut next.nodes[index(node)], term);
                true
            }
            Action::Reelect { node } => self.reelect(&mut next, node),
            Action::Probe { leader, target } => self.probe(&mut next, leader, target),
            Action::ClientWrite { leader } => self.client_write(&mut next, leader),
            Action::Ship { leader, to } => self.ship(&mut next, leader, to),
            Action::Notice { leader, to } => {
                let node = self.node(&next, leader);
                let message = Message::Commit { from: leader, to, term: node.term, commit: node.commit };
                next.network.send(message)
            }
            Action::Pull { node, source } => self.pull(&mut next, node, source),
            Action::Deliver(message) => {
                // A checked pull opens one reader, and each chunk of its stream is taken once:
                // both leave the network when delivered (ships, acks and notices stay, so that
                // they can be delivered again, like a resent request).
                let once = matches!(message, Message::Pull { .. } | Message::Ship { pull: true, .. });
                if once {
                    next.network.remove(&message);
                }
                self.deliver(&mut next, message) || once
            }
            Action::Fsync { node } => self.fsync(&mut next, node),
            Action::Restart { node } => {
                next.crashes += 1;
                // The process's pull streams die with it: the readers it serves, and the pulls it
                // made (their chunks never reach the new process).
                next.network.retain(|message| match message {
                    Message::Pull { source, to, .. } => *source != node && *to != node,
                    Message::Ship { to, pull: true, .. } => *to != node,
                    _ => true,
                });
                restart(&mut next.nodes[index(node)], self.bugs.persist_past_durable)
            }
            Action::BeginChange { leader } => {
                next.config = Config::Deciding { term: self.node(state, leader).term };
                true
            }
            Action::FinishChange { leader } => self.finish_change(&mut next, leader),
        };
        for node in &mut next.nodes {
            node.tail_base = self.tail_base(node);
        }
        self.forget_dead_messages(&mut next);
        (changed && next != *state).then_some(next)
    }

    fn format_action(&self, action: &Action) -> String {
        format!("{action}")
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

impl ReplicationModel {
    /// Drops the messages whose delivery can no longer change anything: a ship, chunk, ack or
    /// commit notice of a term below its receiver's persisted term (fenced, or for no office: a
    /// node never holds office in a term below its own again). A pure reduction: states that
    /// differ only by such messages behave alike. Not with [`Bug::AcceptLowerTerm`], which takes
    /// lower-term ships.
    fn forget_dead_messages(&self, state: &mut ModelState) {
        let terms: Vec<Term> = state.nodes.iter().map(|n| n.term).collect();
        let accept_lower_term = self.bugs.accept_lower_term;
        state.network.retain(|message| match message {
            Message::Ship { to, term, .. } => accept_lower_term || *term >= terms[index(*to)],
            Message::Ack { to, term, .. } | Message::Commit { to, term, .. } => *term >= terms[index(*to)],
            Message::Pull { .. } => true,
        });
    }

    fn election_actions(&self, state: &ModelState, actions: &mut Vec<Action>) {
        let term = Term(state.last_term.get() + 1);
        if term.get() <= self.max_term {
            let electorate = self.electorate(state.config);
            let majority = electorate.len() / 2 + 1;
            let scheduled = self.winners.get(usize::try_from(term.get()).unwrap_or(0).wrapping_sub(1));
            for candidate in electorate.iter().filter(|c| scheduled.is_none_or(|w| w == *c)) {
                let others: Vec<NodeId> = electorate.iter().copied().filter(|v| v != candidate).collect();
                for voters in subsets(&others, majority - 1) {
                    let mut voters = voters;
                    voters.insert(0, *candidate);
                    actions.push(Action::Elect { candidate: *candidate, voters });
                }
            }
        }
        for i in 0..self.node_count {
            let node = &state.nodes[i];
            if self.learn_terms {
                for term in node.term.get() + 1..=state.last_term.get() {
                    actions.push(Action::LearnTerm { node: id(i), term: Term(term) });
                }
            }
            if node.role == Role::Follower && node.elected == Some(node.term) && node.term > Term(0) {
                actions.push(Action::Reelect { node: id(i) });
            }
        }
    }

    fn elect(&self, state: &mut ModelState, candidate: NodeId, voters: &[NodeId]) -> bool {
        let term = Term(state.last_term.get() + 1);
        state.last_term = term;
        for voter in voters {
            adopt(&mut state.nodes[index(*voter)], term);
        }
        let node = &mut state.nodes[index(candidate)];
        node.elected = Some(term);
        node.incarnation = 0;
        node.role = Role::Probing { term, answers: BTreeMap::new(), commits: BTreeMap::new() };
        // A decided change that openraft never saw dies with its leader's term.
        if matches!(state.config, Config::Deciding { .. }) {
            state.config = Config::Old;
        }
        true
    }

    fn reelect(&self, state: &mut ModelState, leader: NodeId) -> bool {
        let node = &mut state.nodes[index(leader)];
        node.role = Role::Probing { term: node.term, answers: BTreeMap::new(), commits: BTreeMap::new() };
        true
    }

    /// Taking office steps 2-3: the target answers under its term lock; the leader plans.
    fn probe(&self, state: &mut ModelState, leader: NodeId, target: NodeId) -> bool {
        let target_node = self.node(state, target);
        let Role::Probing { term, .. } = self.node(state, leader).role else { return false };
        let answer = answer_probe(
            target_node.term,
            term,
            target_node.durable_last(),
            &target_node.history(target_node.durable),
        );
        let target_commit = target_node.commit;
        let electorate = Quorum::single(self.electorate(state.config));
        let node = &mut state.nodes[index(leader)];
        if node.durable != node.len() {
            // Our own appends are still being fsynced: our durable position is not known yet.
            return false;
        }
        let own = OwnLog { last: node.last(), history: node.history(node.len()), applied: node.applied };
        let Role::Probing { answers, commits, .. } = &mut node.role else { return false };
        if matches!(answer, ProbeAnswer::NotYet { .. }) {
            // plan_office ignores it; the leader probes again once openraft has told the target.
            return false;
        }
        answers.insert(target, answer);
        if self.bugs.choose_by_commit {
            commits.insert(target, target_commit);
        }
        let plan = if self.bugs.choose_by_commit {
            choose_by_commit(leader, term, &own, node.commit, answers, commits, &electorate)
        } else {
            plan_office(leader, term, &own, answers, &electorate)
        };
        match plan {
            OfficePlan::Wait => {}
            OfficePlan::StepDown { .. } => {
                let node = &mut state.nodes[index(leader)];
                node.role = Role::Follower;
                node.elected = None;
            }
            OfficePlan::Open { write_leader_start, .. } => self.open(state, leader, term, write_leader_start),
            OfficePlan::Sync { source, target, quarantine_from, needs_snapshot, pull_from } => {
                if let Some(from) = quarantine_from {
                    self.quarantine(state, leader, from, term);
                }
                let node = &mut state.nodes[index(leader)];
                if needs_snapshot {
                    // Install the source's state through P: the same as rewinding ours to P.
                    self.rewind(&mut state.history, leader, node, pull_from.seqno);
                }
                node.role = Role::Syncing { term, source, target };
            }
        }
        true
    }

    /// Taking office step 4: unless the term would be resumed across a restart (then handed
    /// over), LeaderStart (unless the WAL already holds a batch of the term), and the ShipQueues
    /// start at the tail's last position.
    fn open(&self, state: &mut ModelState, leader: NodeId, term: Term, write_leader_start: bool) {
        let node = &mut state.nodes[index(leader)];
        let resumes = if self.bugs.resume_after_restart {
            false
        } else if self.bugs.resume_lost_leader_start {
            // a57b07b's guard: only a WAL holding a batch of the term this process never opened.
            !write_leader_start && node.opened < term
        } else {
            resumes_a_term(term, node.boot_term, write_leader_start, node.opened.get())
        };
        if resumes {
            // Handed over: heartbeats off, the others elect a higher term. openraft restores this
            // office only at a restart, and refusing again changes nothing: it is not offered again.
            node.role = Role::Follower;
            node.elected = None;
            state.history.handed_over = true;
            return;
        }
        node.opened = node.opened.max(term);
        // Where the term starts, as the office decides it: right after our log (the plan's baseline)
        // for a new LeaderStart, else where our log began the term.
        let start = term_start(term, node.len(), write_leader_start, &node.history(node.len()));
        if write_leader_start {
            node.wal.push(Batch::new(term, node.incarnation));
        }
        let tail_last = self.tail_last(node);
        let after = (0..self.node_count).map(id).filter(|n| *n != leader).map(|n| (n, tail_last)).collect();
        node.role = Role::Leader {
            term,
            start,
            serving: self.bugs.serve_before_leader_start,
            matched: BTreeMap::new(),
            waiting: BTreeSet::new(),
            after,
        };
        if self.bugs.serve_before_leader_start {
            state.history.served_by.insert(leader);
        }
        self.record_own_matched(state, leader);
    }

    fn client_write(&self, state: &mut ModelState, leader: NodeId) -> bool {
        let node = &mut state.nodes[index(leader)];
        let Role::Leader { term, waiting, .. } = &mut node.role else { return false };
        node.wal.push(Batch::new(*term, node.incarnation));
        waiting.insert(Seqno(node.wal.len() as u64));
        state.writes += 1;
        true
    }

    /// The last seqno of `node`'s ship feed: its written log, or its durable one without ships on
    /// write (never below the base: a reset above the durable log leaves an empty tail).
    fn tail_end(&self, node: &NodeState) -> Seqno {
        let end = if self.ship_unsynced { node.len() } else { node.durable };
        end.max(node.tail_base)
    }

    /// The feed's base once batches past the bound have fallen off its front.
    fn tail_base(&self, node: &NodeState) -> Seqno {
        let end = self.tail_end(node);
        node.tail_base.max(Seqno(end.get().saturating_sub(u64::from(self.tail_batches))))
    }

    /// The feed's last position (`ShipFeed::last`).
    fn tail_last(&self, node: &NodeState) -> TermSeqno {
        node.position(self.tail_end(node))
    }

    /// Whether `node`'s feed ships its batches after `after` (`tail_start` answers `After`), or
    /// with [`Bug::ShipFollowerPrev`] a57b07b's `read_after` would have.
    fn tail_serves(&self, node: &NodeState, after: TermSeqno) -> bool {
        let (base, end) = (self.tail_base(node), self.tail_end(node));
        let last = node.position(end);
        if self.bugs.ship_follower_prev {
            return old_read_after_ships(after, base, last, |seqno| node.term_at(seqno));
        }
        let base = node.position(base);
        let within =
            |seqno: Seqno| if seqno > base.seqno && seqno <= end { node.term_at(seqno) } else { None };
        tail_start(after, base, last, within) == TailStart::After
    }

    /// The ShipQueue's next ship (PROTOCOL.md, "Shipping"; `ShipQueue::run` in tidal-cluster): the
    /// step is [`next_ship_step`], as in production. The model may ship at any time, so a heartbeat
    /// is always due (notices are their own action): the step is a ship, a nudge to pull (then the
    /// queue goes on from its tail's end), or, for a `prev` our log does not hold, no ship at all.
    fn ship(&self, state: &mut ModelState, leader: NodeId, to: NodeId) -> bool {
        let tail_last = self.tail_last(self.node(state, leader));
        let node = &mut state.nodes[index(leader)];
        let Role::Leader { after: queue, .. } = &mut node.role else { return false };
        let after = queue.get(&to).copied().unwrap_or(tail_last);
        let node = &state.nodes[index(leader)];
        let view = |prev: TermSeqno, serves: bool| QueueView {
            tail: if serves {
                Tail::Batches((self.tail_end(node).get().saturating_sub(prev.seqno.get())) as usize)
            } else {
                Tail::Unservable
            },
            heartbeat_due: true,
            commit_moved: false,
            notice_failed: false,
            prev_held: node.holds_position(prev, node.len()),
        };
        let mut prev = after;
        let mut step = next_ship_step(&view(after, self.tail_serves(node, after)));
        if step == QueueStep::NudgePull {
            // Rotated or Unknown: nudge the follower to pull (it may, any time: Action::Pull) and
            // go on from the tail's end, so that the answer to a heartbeat says where it is.
            prev = tail_last;
            step = next_ship_step(&view(tail_last, true));
        }
        let upto = if prev == tail_last { tail_last.seqno } else { self.tail_end(node) };
        let batches = (prev.seqno.get() + 1..=upto.get())
            .filter_map(|s| Some((Seqno(s), node.batch_at(Seqno(s))?)))
            .collect();
        let message = Message::Ship {
            from: leader,
            to,
            term: node.term,
            prev,
            batches,
            commit: node.commit,
            pull: false,
            leader: true,
        };
        let mut changed = false;
        if let Role::Leader { after: queue, .. } = &mut state.nodes[index(leader)].role {
            changed = queue.insert(to, prev) != Some(prev);
        }
        match step {
            QueueStep::Ship => {}
            QueueStep::Resume => {
                // Production counts a miss (`unheld_prev`) and sends nothing: never reached by its
                // rules. a57b07b had no check: the planted bug sends it.
                state.history.broken.insert(Broken::UnheldPrev(leader));
                if !self.bugs.ship_follower_prev {
                    return true;
                }
            }
            other => unreachable!("a due heartbeat is a ship, a nudge or a resume, not {other:?}"),
        }
        state.network.send(message) || changed
    }

    /// A pull's first step: `node` asks `source` after its last durable position; `source` checks
    /// that its durable log holds it (or, on Diverged, the puller asks again after the divergence
    /// point). The reader opens later ([`Message::Pull`]).
    fn pull(&self, state: &mut ModelState, me: NodeId, source: NodeId) -> bool {
        let node = self.node(state, me);
        if node.role == Role::Follower {
            state.pulls += 1;
        }
        let node = self.node(state, me);
        let source_node = self.node(state, source);
        let from = node.durable_last();
        let prev = if source_node.holds_position(from, source_node.durable) {
            from
        } else {
            // Diverged: the source answers its term history; the puller pulls again from the
            // divergence point (`pull_from`) unless it applied past it (then only the source's
            // snapshot repairs it: not modelled for pulls, the pull ends).
            let history = source_node.history(source_node.durable);
            let theirs =
                TermSeqno { term: history.last().map_or(Term(0), |e| e.term), seqno: Seqno(u64::MAX) };
            let point = divergence_point(&node.history(node.durable), from, &history, theirs);
            if node.applied > point.seqno || !source_node.holds_position(point, source_node.durable) {
                return false;
            }
            point
        };
        let leader = matches!(source_node.role, Role::Leader { term, .. } if term == source_node.term);
        let message = Message::Pull {
            source,
            to: me,
            term: source_node.term,
            prev,
            commit: source_node.commit,
            leader,
        };
        state.network.send(message)
    }

    /// A pull's second step: the reader opens on the source's durable log as it is now and sends
    /// what follows `prev` (`Wal::read_raw_after` checks that the log still holds `prev`: a
    /// quarantine and refill since the check answers Diverged; [`Bug::PullCheckThenRead`] reads
    /// from `prev.seqno + 1` whatever the log holds there).
    fn serve_pull(&self, state: &mut ModelState, pull: &Message) -> bool {
        let Message::Pull { source, to, term, prev, commit, leader } = *pull else { return false };
        let node = self.node(state, source);
        let held = node.holds_position(prev, node.durable);
        if !held && !self.bugs.pull_check_then_read {
            // Diverged at the open: the puller pulls again later.
            state.history.pull_prev_gone = true;
            return true;
        }
        let batches: Vec<(Seqno, Batch)> = (prev.seqno.get() + 1..=node.durable.get())
            .filter_map(|s| Some((Seqno(s), node.batch_at(Seqno(s))?)))
            .collect();
        if batches.is_empty() {
            // Nothing to serve: the stream ends without a chunk.
            return false;
        }
        if !held {
            state.history.broken.insert(Broken::UnheldPrev(source));
        }
        let chunk = Message::Ship { from: source, to, term, prev, batches, commit, pull: true, leader };
        state.network.send(chunk)
    }

    /// The follower's answer to a live ship moves the leader's ShipQueue (`Replica::on_answer`):
    /// `next_after` over the leader's durable log, or with [`Bug::ShipFollowerPrev`] a Gap's
    /// follower position as it is. Only the queue of the ship's term, while it runs.
    fn answer(&self, state: &mut ModelState, leader: NodeId, follower: NodeId, term: Term, reply: &Reply) {
        let node = &state.nodes[index(leader)];
        let Role::Leader { term: office, after: queue, .. } = &node.role else { return };
        if *office != term || node.term != term {
            return;
        }
        let after = queue.get(&follower).copied().unwrap_or_default();
        let next = match reply {
            Reply::Gap(last) if self.bugs.ship_follower_prev => *last,
            _ => next_after(reply, after, &DurableView(node), &node.history(node.durable)),
        };
        if let Role::Leader { after: queue, .. } = &mut state.nodes[index(leader)].role {
            queue.insert(follower, next);
        }
    }

    fn deliver(&self, state: &mut ModelState, message: Message) -> bool {
        match message {
            Message::Ship { from, to, term, prev, batches, commit, pull, leader } => {
                let meta = ShipMeta {
                    term,
                    prev,
                    batches: batches
                        .iter()
                        .map(|(seqno, b)| BatchMeta { first: *seqno, last: *seqno, term: b.term })
                        .collect(),
                    commit,
                };
                self.receive(state, from, to, &meta, &batches, pull, leader)
            }
            pull @ Message::Pull { .. } => self.serve_pull(state, &pull),
            Message::Ack { from, to, term, matched } => self.receive_ack(state, from, to, term, matched),
            Message::Commit { to, term, commit, .. } => self.receive_notice(state, to, term, commit),
        }
    }

    /// A commit notice (tidal-cluster's `Replica::notice_commit`): no term lock, no fsync; commit
    /// moves to what the notice announced AND a live ship of its term matched (once written with
    /// `apply_on_write`, decisions/025; after its fsync otherwise, decisions/016).
    fn receive_notice(&self, state: &mut ModelState, to: NodeId, term: Term, commit: Seqno) -> bool {
        let past_matched = self.bugs.notice_past_matched;
        let node = &mut state.nodes[index(to)];
        if node.term != term {
            return false;
        }
        let Some(notice) = node.notice.in_term(term) else { return false };
        notice.notified = notice.notified.max(commit);
        let frontier = if past_matched { notice.notified } else { notice.frontier() };
        node.commit = node.commit.max(frontier);
        self.apply(node);
        // Whether anything changed is decided by comparing the states.
        true
    }

    /// The follower's receive path: decide_ship (on `(term, seqno)` only, as production), perform
    /// (an append copies the batch, writer included), keep the ack for after the fsync. A live
    /// ship's Gap or Diverged answer moves the leader's ShipQueue at once (the answer's receipt is
    /// folded into the delivery, like a probe's); its Matched answer comes with the ack.
    #[allow(clippy::too_many_arguments)]
    fn receive(
        &self,
        state: &mut ModelState,
        from: NodeId,
        to: NodeId,
        ship: &ShipMeta,
        batches: &[(Seqno, Batch)],
        pull: bool,
        names_leader: bool,
    ) -> bool {
        let node = self.node(state, to);
        // A chunk to a syncing leader from its source is the log it adopts; a chunk to a follower
        // may replace its batches only if it names its sender as the leader of its term
        // (`Origin::Pull`, authoritative), else only append. A node taking or holding office
        // takes no other chunk.
        let adopting = matches!(node.role, Role::Syncing { source, .. } if source == from);
        if pull && !adopting && node.role != Role::Follower {
            return false;
        }
        let verdict = if self.bugs.accept_lower_term && ship.term < node.term {
            decide_ship(&LowerTermView { node, term: ship.term }, ship, self.quorum_mode())
        } else {
            decide_ship(node, ship, self.quorum_mode())
        };
        if !pull {
            if let Some(reply) = live_reply(node, &verdict) {
                self.answer(state, from, to, ship.term, &reply);
                return true;
            }
        }
        // The chunk's leader field: its sender if it held office when it checked the pull, else
        // a node it only heard of (no node, here).
        let origin = match (pull, adopting) {
            (false, _) => Origin::Live,
            (true, true) => Origin::Adopting,
            (true, false) => Origin::Pull { source: from },
        };
        let authoritative = authority(origin, if names_leader { from } else { NodeId(0) }).replaces;
        let (steps, matched, commit) = match self.accepted(state, to, verdict, authoritative) {
            Ok(accepted) => accepted,
            Err(changed) => return changed,
        };
        self.perform(state, to, ship, batches, steps);
        self.after_write(state, (from, to), ship, pull, matched, commit);
        true
    }

    /// What the receiver takes of `verdict`: an accepted message's steps, matched position and
    /// commit after the fsync (its early commit moved and applied already), or whether refusing
    /// it changed the state (a halt is recorded).
    fn accepted(
        &self,
        state: &mut ModelState,
        to: NodeId,
        verdict: Verdict,
        authoritative: bool,
    ) -> Result<(Vec<Step>, TermSeqno, Seqno), bool> {
        let halt = matches!(verdict, Verdict::Halt { .. });
        // The planted bugs: a stale chunk replaces our batches, or its halt is kept.
        let unrestricted = self.bugs.stale_pull_replaces || (self.bugs.halt_on_stale_chunk && halt);
        let restricted = !authoritative && !unrestricted;
        if restricted && halt && matches!(append_only(verdict.clone()), Verdict::Refuse { .. }) {
            state.history.stale_chunk_refused = true;
        }
        let verdict = if restricted { append_only(verdict) } else { verdict };
        match verdict {
            Verdict::Accept { steps, matched, commit_now, commit } => {
                // The code's WAL view holds only durable batches when the receiver decides (it waits
                // for each message's fsync under the term lock); the model's holds appended ones, so
                // it caps the early commit at durable to model the same thing.
                let node = &mut state.nodes[index(to)];
                let before = node.commit;
                node.commit = node.commit.max(commit_now.min(node.durable));
                self.apply(node);
                if node.commit < before {
                    state.history.broken.insert(Broken::CommitDecreased(to));
                }
                Ok((steps, matched, commit))
            }
            // A chunk that may not replace our batches (its sender did not hold office in its
            // term) says nothing about the leader's log: `append_only` refuses it even where it
            // conflicts at or below our commit frontier. A halt on such a chunk (the planted bug
            // HaltOnStaleChunk; or two logs in one term) is recorded apart from `Halted`.
            Verdict::Halt { .. } if !authoritative => {
                Err(state.history.broken.insert(Broken::HaltedOnChunk(to)))
            }
            Verdict::Halt { .. } => Err(state.history.broken.insert(Broken::Halted(to))),
            Verdict::Fenced { .. }
            | Verdict::NotYet { .. }
            | Verdict::Gap { .. }
            | Verdict::Diverged
            | Verdict::Refuse { .. } => Err(false),
        }
    }

    /// Performs an accepted message's steps on `to`'s log: quarantines and appends.
    fn perform(
        &self,
        state: &mut ModelState,
        to: NodeId,
        ship: &ShipMeta,
        batches: &[(Seqno, Batch)],
        steps: Vec<Step>,
    ) {
        for step in steps {
            match step {
                Step::Skip(_) => {}
                Step::QuarantineFrom(seqno) => {
                    let term = state.nodes[index(to)].term;
                    self.quarantine(state, to, seqno, term);
                }
                Step::Append(i) => {
                    let node = &mut state.nodes[index(to)];
                    assert_eq!(node.len().next(), ship.batches[i].first, "append must be contiguous");
                    node.wal.push(batches[i].1);
                }
            }
        }
    }

    /// After an accepted message is written: a live ship's commit on write (decisions/025), the
    /// ack kept for after the fsync (sent now with [`Bug::AckBeforeFsync`]), and a syncing leader
    /// that reached its target takes office.
    fn after_write(
        &self,
        state: &mut ModelState,
        (from, to): (NodeId, NodeId),
        ship: &ShipMeta,
        pull: bool,
        matched: TermSeqno,
        commit: Seqno,
    ) {
        if !pull && self.apply_on_write {
            self.commit_on_write(state, to, ship.term, matched, commit, ship.commit);
        }
        let pending = PendingAck { term: ship.term, to: (!pull).then_some(from), matched, commit };
        let node = &mut state.nodes[index(to)];
        if self.bugs.ack_before_fsync {
            if let Some(leader) = pending.to {
                state.network.send(Message::Ack { from: to, to: leader, term: ship.term, matched });
            }
            add_pending(node, PendingAck { to: None, ..pending });
        } else {
            add_pending(node, pending);
        }
        if let Role::Syncing { term, target, .. } = node.role {
            if node.last() == target {
                let write_leader_start = !node.wal.iter().any(|b| b.term == term);
                self.open(state, to, term, write_leader_start);
            }
        }
    }

    fn receive_ack(
        &self,
        state: &mut ModelState,
        from: NodeId,
        to: NodeId,
        term: Term,
        matched: TermSeqno,
    ) -> bool {
        let count_older_term = self.bugs.count_older_term;
        // The answer of a ship accepted and fsynced: the ShipQueue moves on after it.
        self.answer(state, to, from, term, &Reply::Matched(matched));
        let node = &mut state.nodes[index(to)];
        let Role::Leader { term: leader_term, matched: matched_by, .. } = &mut node.role else {
            return false;
        };
        if *leader_term != term {
            return false;
        }
        let position = if count_older_term { TermSeqno { term, seqno: matched.seqno } } else { matched };
        let entry = matched_by.entry(from).or_default();
        if position <= *entry {
            // Whether the queue moved is decided by comparing the states.
            return true;
        }
        *entry = position;
        self.advance_leader(state, to);
        true
    }

    /// decisions/025 rule 1: a live ship's batches are written (not yet fsynced), still under the
    /// term lock. They match the leader's log of `term` up to `matched` (decide_ship verified `prev`
    /// and each batch), so they count as held for our own commit frontier: the notice `matched` is
    /// set now, and commit moves to `max(commit, min(ship's commit, matched), min(notified,
    /// matched))` — `commit` is decide_ship's `max(ours, min(sender's, matched))` — and we apply up
    /// to it. Everything covered is committed by the leader, whose commit counts only fsynced acks
    /// and never passes its own durable position. The ack still waits for the fsync ([`Self::fsync`]).
    ///
    /// Pulled chunks do not come here: they never set `matched` (decisions/016: a pull source's log
    /// is not necessarily the leader's) and their commit still moves after the fsync, as before.
    fn commit_on_write(
        &self,
        state: &mut ModelState,
        me: NodeId,
        term: Term,
        matched: TermSeqno,
        commit: Seqno,
        sender_commit: Seqno,
    ) {
        let past_written = self.bugs.notice_past_written;
        let node = &mut state.nodes[index(me)];
        // Under the term lock the node's term is the ship's (decide_ship checked it); only the
        // planted `accept_lower_term` gets here with another, and like the ack after the fsync
        // (term re-check) it then takes no commit from the ship.
        if node.term != term {
            return;
        }
        let Some(notice) = node.notice.in_term(term) else { return };
        notice.matched = notice.matched.max(matched.seqno);
        let frontier =
            if past_written { sender_commit.max(notice.notified) } else { commit.max(notice.frontier()) };
        node.commit = node.commit.max(frontier);
        self.apply(node);
    }

    /// The fsync completes; under the term lock again: ack what was accepted (term re-check), advance
    /// commit, apply; a leader records its own matched.
    fn fsync(&self, state: &mut ModelState, me: NodeId) -> bool {
        let node = &mut state.nodes[index(me)];
        node.durable = node.len();
        let before = node.commit;
        for pending in std::mem::take(&mut node.unsynced) {
            if node.term != pending.term && !self.bugs.no_term_recheck {
                continue;
            }
            if let Some(leader) = pending.to {
                state.network.send(Message::Ack {
                    from: me,
                    to: leader,
                    term: pending.term,
                    matched: pending.matched,
                });
                // A live ship of this term, fsynced: its matched is the leader's log, durable here.
                // With `apply_on_write` it was set when the batches were written (a repeat here).
                if let Some(notice) = node.notice.in_term(pending.term) {
                    notice.matched = notice.matched.max(pending.matched.seqno);
                }
            }
            node.commit = node.commit.max(pending.commit);
        }
        if node.notice.term == node.term {
            node.commit = node.commit.max(node.notice.frontier());
        }
        self.apply(node);
        if node.commit < before {
            state.history.broken.insert(Broken::CommitDecreased(me));
        }
        self.record_own_matched(state, me);
        true
    }

    fn apply(&self, node: &mut NodeState) {
        let upto = if self.bugs.apply_past_commit { node.durable } else { node.commit };
        node.applied = node.applied.max(upto);
    }

    /// A leader's own matched is its durable position, recorded under the term lock.
    fn record_own_matched(&self, state: &mut ModelState, me: NodeId) {
        let node = &mut state.nodes[index(me)];
        let durable_last = node.durable_last();
        let Role::Leader { term, matched, .. } = &mut node.role else { return };
        if node.term != *term || durable_last.seqno == Seqno::ZERO {
            return;
        }
        let entry = matched.entry(me).or_default();
        if durable_last > *entry {
            *entry = durable_last;
        }
        self.advance_leader(state, me);
    }

    /// The leader's commit rule, then apply, serve once LeaderStart is applied, acknowledge clients.
    fn advance_leader(&self, state: &mut ModelState, me: NodeId) {
        let quorum = self.commit_quorum(state.config);
        let node = &mut state.nodes[index(me)];
        let Role::Leader { term, matched, .. } = &node.role else { return };
        let term = *term;
        let next = match self.mode {
            Mode::Quorum => {
                let wal = &node.wal;
                let true_term_at = |seqno: Seqno| {
                    let i = usize::try_from(seqno.get()).ok()?.checked_sub(1)?;
                    wal.get(i).map(|b| b.term)
                };
                let frontier = if self.bugs.count_older_term {
                    commit_frontier(&quorum, matched, term, node.commit, |seqno| {
                        true_term_at(seqno).map(|_| term)
                    })
                } else {
                    commit_frontier(&quorum, matched, term, node.commit, true_term_at)
                };
                if self.bugs.commit_past_own_durable {
                    frontier
                } else {
                    // Followers may have matched unsynced batches of ours: never commit past what
                    // we hold durably (a batch our crash loses was never committed), never go down.
                    frontier.min(node.durable).max(node.commit)
                }
            }
            Mode::Leader => matched.get(&me).map_or(node.commit, |p| p.seqno.max(node.commit)),
        };
        if self.quorum_mode() {
            for seqno in node.commit.get() + 1..=next.get() {
                let position = node.position(Seqno(seqno));
                let writer = node.batch_at(Seqno(seqno)).map_or(0, |b| b.writer);
                state.history.committed.insert(Committed { position, writer, by: term });
            }
        }
        node.commit = next;
        self.apply(node);
        let applied = node.applied;
        let node_term = node.term;
        let Role::Leader { start, serving, waiting, .. } = &mut node.role else { return };
        if !*serving && next >= *start && applied >= *start {
            *serving = true;
            state.history.served_by.insert(me);
        }
        if !*serving {
            return;
        }
        let done: Vec<Seqno> = waiting.iter().copied().filter(|s| *s <= next && *s <= applied).collect();
        for seqno in done {
            waiting.remove(&seqno);
            let at = usize::try_from(seqno.get()).unwrap_or(0).wrapping_sub(1);
            let writer = node.wal.get(at).map_or(0, |b| b.writer);
            state.history.acked.insert(Acked {
                batch: TermSeqno { term, seqno },
                writer,
                by: me,
                in_term: node_term,
            });
        }
    }

    /// Moves `node`'s WAL from `from` on into quarantine; `term` is the node's persisted term (a
    /// receiver's; a leader taking office: its office's).
    ///
    /// Recorded as broken: quarantining a batch that a leader of `term` or an earlier term counted
    /// as committed (the leader of `term` holds all of those, so nothing it ships conflicts with
    /// them). A batch committed by a LATER term's leader may be quarantined by a node still in an
    /// earlier term, when a ship of that term reaches it (Raft allows it: the node's own commit
    /// frontier is below it, and the batch stays on the majority that committed it); that node
    /// gets it back from the later leader.
    fn quarantine(&self, state: &mut ModelState, me: NodeId, from: Seqno, term: Term) {
        let node = &mut state.nodes[index(me)];
        for seqno in from.get()..=node.len().get() {
            let position = node.position(Seqno(seqno));
            let Some(batch) = node.batch_at(Seqno(seqno)) else { continue };
            if state
                .history
                .committed
                .iter()
                .any(|c| c.position == position && c.writer == batch.writer && c.by <= term)
            {
                state.history.broken.insert(Broken::QuarantinedCommitted(me, position));
            }
        }
        let keep = Seqno(from.get().saturating_sub(1));
        node.wal.truncate(usize::try_from(keep.get()).unwrap_or(0));
        node.durable = node.durable.min(keep);
        // The ship feed restarts at the log's new end (`feed.reset(wal.last_position())`).
        node.tail_base = keep;
        state.history.quarantined = true;
        if self.mode == Mode::Leader && node.applied > keep {
            // Our state holds data that no longer exists: install the new log's snapshot at `keep`.
            self.rewind(&mut state.history, me, node, keep);
        } else if self.mode == Mode::Leader {
            node.commit = node.commit.min(keep);
        }
    }

    /// A snapshot install at `to` (the source's log matches ours through it).
    fn rewind(&self, history: &mut History, me: NodeId, node: &mut NodeState, to: Seqno) {
        if self.quorum_mode() && node.commit > to {
            history.broken.insert(Broken::CommitDecreased(me));
        }
        node.commit = node.commit.min(to);
        node.applied = node.applied.min(to);
    }

    fn finish_change(&self, state: &mut ModelState, leader: NodeId) -> bool {
        let node = self.node(state, leader);
        let Role::Leader { term, matched, .. } = &node.role else { return false };
        let caught_up: BTreeSet<NodeId> = matched
            .iter()
            .filter(|(_, position)| position.term == *term && position.seqno >= node.commit)
            .map(|(id, _)| *id)
            .collect();
        if !Quorum::single(self.new_voters()).is_majority(&caught_up) {
            return false;
        }
        state.config = Config::New;
        true
    }
}

/// A node persists a higher term (under its term lock): it leaves any office of a lower term.
fn adopt(node: &mut NodeState, term: Term) {
    if term <= node.term {
        return;
    }
    node.term = term;
    if node.office_term().is_some_and(|t| t < term) {
        node.role = Role::Follower;
    }
}

/// A live ship's Gap or Diverged answer, which moves the leader's ShipQueue at once (None for
/// any other verdict).
fn live_reply(node: &NodeState, verdict: &Verdict) -> Option<Reply> {
    match verdict {
        Verdict::Gap { last } => Some(Reply::Gap(*last)),
        // Production decides on its durable log (it holds the term lock across the fsync): the
        // model's receiver decides on its written log, and answers with it.
        Verdict::Diverged => Some(Reply::Diverged { history: node.history(node.len()), durable: node.len() }),
        _ => None,
    }
}

/// Keeps one pending ack per (term, leader): the fsync sends one ack per link anyway, and the greater
/// matched and commit of one term's leader subsume the smaller.
fn add_pending(node: &mut NodeState, pending: PendingAck) {
    let same_link = node.unsynced.iter().find(|p| p.term == pending.term && p.to == pending.to).cloned();
    let merged = match same_link {
        Some(old) => {
            node.unsynced.remove(&old);
            PendingAck {
                matched: old.matched.max(pending.matched),
                commit: old.commit.max(pending.commit),
                ..pending
            }
        }
        None => pending,
    };
    node.unsynced.insert(merged);
}

/// Crash and restart: the WAL keeps what was fsynced, memory restarts from the persisted state; a
/// node openraft elected is a new writer process from now on.
///
/// The engine's persisted state never passes the durable WAL (its flusher waits for the WAL fsync
/// before it writes a frozen overlay, decisions/025 rule 3), so `applied` restarts at most at
/// `durable`: a follower that applied committed batches before its fsync loses that part of its
/// applied state with the unsynced WAL, and gets the batches again from the leader (they are
/// committed: fsynced on a majority). With `persist_past_durable` (planted bug) the applied frontier
/// survives above the WAL. Before decisions/025 `applied <= durable` held on every node and the cap
/// never bound.
fn restart(node: &mut NodeState, persist_past_durable: bool) -> bool {
    if node.elected.is_some() {
        node.incarnation = node.incarnation.saturating_add(1);
    }
    node.wal.truncate(usize::try_from(node.durable.get()).unwrap_or(0));
    // A new process: its ship feed starts at the WAL's last durable position; it remembers the
    // vote it found persisted, and has opened no term yet.
    node.tail_base = node.durable;
    node.boot_term = node.term;
    node.opened = Term(0);
    if !persist_past_durable {
        node.applied = node.applied.min(node.durable);
    }
    node.unsynced.clear();
    node.notice = NoticeState::default();
    node.role = Role::Follower;
    node.commit = node.applied;
    true
}

/// a57b07b's `ShipFeed::read_after` (the planted bug [`Bug::ShipFollowerPrev`]): whether it
/// shipped the tail's batches after `after` (none at its end) from a tail of single-seqno batches
/// `base + 1 ..= last.seqno`. Its `start == 0` branch shipped the front after any position whose
/// seqno lines up with it ("let the follower's prev check decide"), and an empty tail answered a
/// heartbeat at its end for a position of any term.
fn old_read_after_ships(
    after: TermSeqno,
    base: Seqno,
    last: TermSeqno,
    term_at: impl Fn(Seqno) -> Option<Term>,
) -> bool {
    let empty = last.seqno == base;
    if after.seqno == last.seqno {
        return after.term == last.term || empty;
    }
    if empty || after.seqno < base {
        return false;
    }
    if after.seqno == base {
        return true;
    }
    after.seqno < last.seqno && term_at(after.seqno) == Some(after.term)
}

/// The planted bug `choose_by_commit`: adopt the answering node with the greatest commit frontier.
fn choose_by_commit(
    me: NodeId,
    term: Term,
    own: &OwnLog,
    own_commit: Seqno,
    answers: &BTreeMap<NodeId, ProbeAnswer>,
    commits: &BTreeMap<NodeId, Seqno>,
    electorate: &Quorum,
) -> OfficePlan {
    // Same majority and step-down rules as the real plan; only the choice differs.
    match plan_office(me, term, own, answers, electorate) {
        plan @ (OfficePlan::Wait | OfficePlan::StepDown { .. }) => return plan,
        OfficePlan::Open { .. } | OfficePlan::Sync { .. } => {}
    }
    let mut best: Option<(NodeId, Seqno)> = None;
    for (node, answer) in answers {
        if let (ProbeAnswer::Position { .. }, Some(commit)) = (answer, commits.get(node)) {
            if *commit > own_commit && best.is_none_or(|(_, c)| *commit > c) {
                best = Some((*node, *commit));
            }
        }
    }
    let write_leader_start = own.last.term != term;
    let Some((source, _)) = best else { return OfficePlan::Open { baseline: own.last, write_leader_start } };
    let Some(ProbeAnswer::Position { last, history }) = answers.get(&source) else {
        return OfficePlan::Open { baseline: own.last, write_leader_start };
    };
    let pull_from = divergence_point(&own.history, own.last, history, *last);
    OfficePlan::Sync {
        source,
        target: *last,
        pull_from,
        quarantine_from: (own.last.seqno > pull_from.seqno).then(|| pull_from.seqno.next()),
        needs_snapshot: own.applied > pull_from.seqno,
    }
}

/// All subsets of `items` of size `k`, in order.
fn subsets(items: &[NodeId], k: usize) -> Vec<Vec<NodeId>> {
    if k == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for (i, first) in items.iter().enumerate() {
        for mut rest in subsets(&items[i + 1..], k - 1) {
            rest.insert(0, *first);
            all.push(rest);
        }
    }
    all
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Elect { candidate, voters } => {
                let voters: Vec<String> = voters.iter().map(|v| v.to_string()).collect();
                write!(f, "{candidate}: elected, votes {{{}}}", voters.join(","))
            }
            Action::LearnTerm { node, term } => write!(f, "{node}: learns term {term}"),
            Action::Reelect { node } => write!(f, "{node}: back in office in the same term"),
            Action::Probe { leader, target } => write!(f, "{leader}: probes {target}"),
            Action::ClientWrite { leader } => write!(f, "{leader}: client write appended"),
            Action::Ship { leader, to } => write!(f, "{leader}: its ShipQueue for {to} ships"),
            Action::Notice { leader, to } => write!(f, "{leader}: sends its commit frontier to {to}"),
            Action::Pull { node, source } => write!(f, "{node}: pulls from {source}, which checks the prev"),
            Action::Deliver(Message::Pull { source, to, prev, .. }) => {
                write!(f, "{source}: opens the reader of {to}'s pull after {prev}")
            }
            Action::Deliver(message @ Message::Ship { from, to, .. }) => {
                write!(f, "{to}: gets {} from {from}", message_label(message))
            }
            Action::Deliver(Message::Ack { from, to, term, matched }) => {
                write!(f, "{to}: gets ack from {from} {{{term}, matched {matched}}}")
            }
            Action::Deliver(Message::Commit { from, to, term, commit }) => {
                write!(f, "{to}: gets commit notice from {from} {{{term}, commit {commit}}}")
            }
            Action::Fsync { node } => write!(f, "{node}: fsync done"),
            Action::Restart { node } => write!(f, "{node}: crash + restart"),
            Action::BeginChange { leader } => write!(f, "{leader}: decides on the membership change"),
            Action::FinishChange { leader } => write!(f, "{leader}: new configuration committed"),
        }
    }
}

/// A ship or chunk as the histories print it: `ship {t3, prev (t2, 1), [2:t3], commit 0}`.
pub fn message_label(message: &Message) -> String {
    match message {
        Message::Ship { term, prev, batches, commit, pull, .. } => {
            let batches: Vec<String> =
                batches.iter().map(|(seqno, b)| format!("{seqno}:{}", batch_label(b))).collect();
            let kind = if *pull { "chunk" } else { "ship" };
            format!("{kind} {{{term}, prev {prev}, [{}], commit {commit}}}", batches.join(" "))
        }
        Message::Ack { term, matched, .. } => format!("ack {{{term}, matched {matched}}}"),
        Message::Commit { term, commit, .. } => format!("commit notice {{{term}, commit {commit}}}"),
        Message::Pull { term, prev, .. } => format!("pull {{{term}, prev {prev}}}"),
    }
}

/// A batch as the histories print it: its term, and `'` per writer process after the first.
pub fn batch_label(batch: &Batch) -> String {
    format!("{}{}", batch.term, "'".repeat(usize::from(batch.writer)))
}
