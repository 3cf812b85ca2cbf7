//! The commit frontier of a node, and on the leader the `matched` positions it is computed from.
//!
//! Delicate:
//! - Only positions acknowledged IN THE CURRENT TERM count (PROTOCOL.md, "Quorum mode"); the
//!   leader's own matched is its durable position, recorded by the WAL hook after each fsync.
//! - The leader's commit never passes its own durable position: followers may hold and ack a drain
//!   the leader shipped before its own fsync (decisions/023), which a crash of the leader can lose.
//! - The frontier never decreases; each advance is handed to the applier (which applies nothing
//!   above it) and published to the ShipQueues (which carry it to followers).

use crate::applier::ApplierSender;
use crate::spec::Durability;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tidal_protocol::{commit_frontier, lease_holds, Quorum};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tokio::sync::watch;
// tokio's clock: simulated under turmoil, std's in production.
use tokio::time::Instant;

struct Matched {
    /// The term this node leads in, while it holds office; acks count only then.
    office: Option<Term>,
    positions: BTreeMap<NodeId, TermSeqno>,
    /// First seqno written in `term` by this leader: batches below it are of older terms and are
    /// committed only underneath a batch of `term`.
    term_start: Seqno,
    /// When this leader SENT the last ship that each follower answered in `office`'s term: the
    /// lease and the leader's readiness are timed from these.
    contacts: BTreeMap<NodeId, Instant>,
}

/// Commit bookkeeping shared by the WAL hook, the ShipQueues and the receiver.
pub struct CommitState {
    me: NodeId,
    /// The voter sets commit counts against: openraft's membership, or a joint configuration while
    /// this leader changes the membership (PROTOCOL.md, "Membership changes").
    quorum: Mutex<Quorum>,
    durability: Durability,
    matched: Mutex<Matched>,
    commit: watch::Sender<Seqno>,
    applier: ApplierSender,
    /// Leader mode: how long a majority's contact lets this leader commit (acknowledge) on its own
    /// durable position (PROTOCOL.md, "The leader-mode lease": shorter than the minimum election
    /// timeout). `None`: no lease
    /// (quorum mode, where a majority's fsync is the proof).
    lease: Option<Duration>,
}

impl CommitState {
    /// A commit state starting at `commit` (the engine's applied seqno is always committed). It
    /// counts nothing until [`CommitState::begin_term`].
    pub fn new(
        me: NodeId,
        voters: Vec<NodeId>,
        durability: Durability,
        commit: Seqno,
        applier: ApplierSender,
    ) -> CommitState {
        let (commit_tx, _) = watch::channel(commit);
        CommitState {
            me,
            quorum: Mutex::new(Quorum::single(voters)),
            durability,
            matched: Mutex::new(Matched {
                office: None,
                positions: BTreeMap::new(),
                term_start: Seqno(1),
                contacts: BTreeMap::new(),
            }),
            commit: commit_tx,
            applier,
            lease: None,
        }
    }

    /// Leader mode: commits (and so acknowledges) only while a majority answered a ship sent within
    /// `lease` (decisions/057). Set once, before the node takes office.
    pub fn with_lease(mut self, lease: Duration) -> CommitState {
        if self.durability == Durability::Leader {
            self.lease = Some(lease);
        }
        self
    }

    /// The term this node leads in, while it holds office.
    pub fn office(&self) -> Option<Term> {
        self.lock().office
    }

    /// Takes office in `term`: from now on acks of `term` count; `term_start` is the first seqno of
    /// `term` in this node's log (its LeaderStart): older batches commit only beneath a batch of
    /// `term`. Forgets every matched position of an earlier office.
    pub fn begin_term(&self, term: Term, term_start: Seqno) {
        let mut matched = self.lock();
        matched.office = Some(term);
        matched.term_start = term_start;
        matched.positions.clear();
        matched.contacts.clear();
    }

    /// Leaves office: nothing counts any more. Called synchronously when a higher term is
    /// persisted (before the vote is answered), so a deposed leader never commits again.
    pub fn step_down(&self) {
        let mut matched = self.lock();
        matched.office = None;
        matched.positions.clear();
        matched.contacts.clear();
    }

    /// The voters commit is counted against.
    pub fn quorum(&self) -> Quorum {
        self.quorum.lock().expect("quorum lock is never held across a panic").clone()
    }

    /// Counts commit against `quorum` from now on, and recomputes the frontier (a smaller voter set
    /// may commit at once what the larger one had not yet).
    pub fn set_quorum(&self, quorum: Quorum) {
        let matched = self.lock();
        *self.quorum.lock().expect("quorum lock is never held across a panic") = quorum;
        let next = self.frontier(&matched);
        drop(matched);
        self.advance(next);
    }

    /// The highest seqno a majority of each voter set of `quorum` has matched in the current office
    /// (0 without office): what a leader waits for before it asks openraft for a new configuration.
    pub fn majority_matched(&self, quorum: &Quorum) -> Seqno {
        let matched = self.lock();
        let Some(term) = matched.office else { return Seqno::ZERO };
        let term_start = matched.term_start;
        let term_at = |seqno: Seqno| if seqno >= term_start { Some(term) } else { None };
        commit_frontier(quorum, &matched.positions, term, Seqno::ZERO, term_at)
    }

    /// The frontier the matched positions give (never below the current one).
    fn frontier(&self, matched: &Matched) -> Seqno {
        let current = self.commit();
        let Some(term) = matched.office else { return current };
        match self.durability {
            Durability::Leader => {
                let own = matched.positions.get(&self.me).map_or(Seqno::ZERO, |own| own.seqno);
                match self.lease {
                    Some(lease) if !self.contact_within(matched, lease) => current,
                    _ => own.max(current),
                }
            }
            Durability::Quorum => {
                let term_start = matched.term_start;
                let term_at = |seqno: Seqno| if seqno >= term_start { Some(term) } else { None };
                let quorum = self.quorum.lock().expect("quorum lock is never held across a panic");
                let majority = commit_frontier(&quorum, &matched.positions, term, current, term_at);
                // Never past our own durable position: followers may hold (and ack) batches we ship
                // before our fsync (decisions/023); a crash may lose them here, and a commit we
                // announced must stay in our log.
                let own = matched.positions.get(&self.me).map_or(Seqno::ZERO, |own| own.seqno);
                let next = majority.min(own).max(current);
                assert!(
                    next == current || next <= own,
                    "leader of {term}: commit {next} (was {current}) past our own durable {own}"
                );
                next
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Matched> {
        self.matched.lock().expect("commit lock is never held across a panic")
    }

    /// The commit frontier.
    pub fn commit(&self) -> Seqno {
        *self.commit.borrow()
    }

    /// Subscribes to commit advances.
    pub fn subscribe(&self) -> watch::Receiver<Seqno> {
        self.commit.subscribe()
    }

    /// Matched positions (for status).
    pub fn matched(&self) -> BTreeMap<NodeId, TermSeqno> {
        self.lock().positions.clone()
    }

    /// Leader: a node (itself included) matched `position` in `term`. Acks of another term are
    /// ignored. Recomputes the frontier.
    pub fn record_matched(&self, node: NodeId, term: Term, position: TermSeqno) {
        let mut matched = self.lock();
        if matched.office != Some(term) {
            return;
        }
        let entry = matched.positions.entry(node).or_default();
        if position > *entry {
            *entry = position;
        }
        let next = self.frontier(&matched);
        drop(matched);
        self.advance(next);
    }

    /// Leader: `node` answered, in `term`, a ship this leader sent at `sent`. Recomputes the
    /// frontier (a leader-mode leader whose lease had run out commits again).
    pub fn record_contact(&self, node: NodeId, term: Term, sent: Instant) {
        let mut matched = self.lock();
        if matched.office != Some(term) {
            return;
        }
        let entry = matched.contacts.entry(node).or_insert(sent);
        *entry = (*entry).max(sent);
        let next = self.frontier(&matched);
        drop(matched);
        self.advance(next);
    }

    /// Leader: whether a majority of each voter set (this node counted) answered a ship sent within
    /// `within` of now, in the current office. False without office.
    pub fn has_contact_within(&self, within: Duration) -> bool {
        let matched = self.lock();
        matched.office.is_some() && self.contact_within(&matched, within)
    }

    fn contact_within(&self, matched: &Matched, within: Duration) -> bool {
        let quorum = self.quorum.lock().expect("quorum lock is never held across a panic");
        let now = Instant::now();
        let ages = matched.contacts.iter().map(|(node, sent)| (*node, now.saturating_duration_since(*sent)));
        lease_holds(&quorum, self.me, ages, within)
    }

    /// Follower: the leader's commit frontier, already capped at what this node holds.
    pub fn advance(&self, next: Seqno) {
        let advanced = self.commit.send_if_modified(|commit| {
            if next > *commit {
                *commit = next;
                true
            } else {
                false
            }
        });
        if advanced {
            self.applier.commit(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::applier::Applier;
    use std::sync::Arc;
    use tidal_core::{EngineConfig, TidalDb};

    fn at(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    /// Followers may hold and ack batches the leader shipped before its own fsync (decisions/023):
    /// a majority of followers is not enough, the commit waits for the leader's own durable position.
    #[test]
    fn the_leaders_commit_never_passes_its_own_durable_position() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(TidalDb::open(dir.path(), EngineConfig::with_dimension(4)).unwrap());
        let (applier, sender) = Applier::spawn(db).unwrap();
        let voters = vec![NodeId(1), NodeId(2), NodeId(3)];
        let commit = CommitState::new(NodeId(1), voters, Durability::Quorum, Seqno::ZERO, sender.clone());
        commit.begin_term(Term(2), Seqno(1));
        commit.record_matched(NodeId(1), Term(2), at(2, 3));
        commit.record_matched(NodeId(2), Term(2), at(2, 8));
        commit.record_matched(NodeId(3), Term(2), at(2, 8));
        assert_eq!(commit.commit(), Seqno(3), "two followers at 8, the leader durable at 3");
        commit.record_matched(NodeId(1), Term(2), at(2, 6));
        assert_eq!(commit.commit(), Seqno(6));
        commit.record_matched(NodeId(1), Term(2), at(2, 9));
        assert_eq!(commit.commit(), Seqno(8), "the leader past the majority: the majority's");
        applier.join(sender);
    }
}
