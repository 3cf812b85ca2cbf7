//! The commit frontier of a node, and on the leader the `matched` positions it is computed from.
//!
//! Delicate:
//! - Only positions acknowledged IN THE CURRENT TERM count (PROTOCOL.md); the leader's own matched
//!   is its durable position, recorded by the WAL hook after each fsync.
//! - The frontier never decreases; each advance is handed to the applier (which applies nothing
//!   above it) and published to the ShipQueues (which carry it to followers).

use crate::applier::ApplierSender;
use crate::decide::{commit_frontier, Quorum};
use crate::spec::Durability;
use std::collections::BTreeMap;
use std::sync::Mutex;
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tokio::sync::watch;

struct Matched {
    positions: BTreeMap<NodeId, TermSeqno>,
    /// First seqno written in `term` by this leader: batches below it are of older terms and are
    /// committed only underneath a batch of `term`.
    term_start: Seqno,
}

/// Commit bookkeeping shared by the WAL hook, the ShipQueues and the receiver.
pub struct CommitState {
    me: NodeId,
    term: Term,
    quorum: Quorum,
    durability: Durability,
    matched: Mutex<Matched>,
    commit: watch::Sender<Seqno>,
    applier: ApplierSender,
}

impl CommitState {
    /// A commit state starting at `commit` (the engine's applied seqno is always committed).
    pub fn new(
        me: NodeId,
        term: Term,
        voters: Vec<NodeId>,
        durability: Durability,
        commit: Seqno,
        applier: ApplierSender,
    ) -> CommitState {
        let (commit_tx, _) = watch::channel(commit);
        CommitState {
            me,
            term,
            quorum: Quorum::single(voters),
            durability,
            matched: Mutex::new(Matched { positions: BTreeMap::new(), term_start: Seqno(1) }),
            commit: commit_tx,
            applier,
        }
    }

    /// The current term.
    pub fn term(&self) -> Term {
        self.term
    }

    /// Sets the first seqno of the current term in this node's log (from the WAL's term history).
    pub fn set_term_start(&self, term_start: Seqno) {
        self.lock().term_start = term_start;
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
        if term != self.term {
            return;
        }
        let mut matched = self.lock();
        let entry = matched.positions.entry(node).or_default();
        if position > *entry {
            *entry = position;
        }
        let current = self.commit();
        let next = match self.durability {
            Durability::Leader if node == self.me => position.seqno.max(current),
            Durability::Leader => current,
            Durability::Quorum => {
                let term_start = matched.term_start;
                let term_at = |seqno: Seqno| if seqno >= term_start { Some(self.term) } else { None };
                commit_frontier(&self.quorum, &matched.positions, self.term, current, term_at)
            }
        };
        drop(matched);
        self.advance(next);
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
