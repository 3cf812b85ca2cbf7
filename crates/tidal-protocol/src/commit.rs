//! The leader's commit rule (PROTOCOL.md, "Committing and acknowledging").
//!
//! Only `matched` positions acknowledged in the leader's current term count. A seqno is committed when
//! a majority of EVERY voter set in force (both halves of a joint configuration) has matched at or past
//! it, and the batch at that seqno is of the current term: older-term batches become committed only
//! underneath a current-term one (that is why every term opens with LeaderStart).

use std::collections::{BTreeMap, BTreeSet};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};

/// The voter sets whose majorities must agree: one set normally, two during a membership change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quorum {
    /// Voter sets; a seqno must be matched by a majority of each.
    pub voter_sets: Vec<Vec<NodeId>>,
}

impl Quorum {
    /// A single voter set.
    pub fn single(voters: Vec<NodeId>) -> Quorum {
        Quorum { voter_sets: vec![voters] }
    }

    /// Whether `node` is a voter of any voter set.
    pub fn is_voter(&self, node: NodeId) -> bool {
        self.voter_sets.iter().any(|voters| voters.contains(&node))
    }

    /// Whether `nodes` holds a majority of EVERY voter set (false when there is no voter set, or an
    /// empty one: nothing can be decided without voters).
    pub fn is_majority(&self, nodes: &BTreeSet<NodeId>) -> bool {
        !self.voter_sets.is_empty()
            && self.voter_sets.iter().all(|voters| {
                let present = voters.iter().filter(|id| nodes.contains(id)).count();
                !voters.is_empty() && present > voters.len() / 2
            })
    }
}

/// The highest seqno a majority of `voters` has matched in `term` (0 if none).
fn majority_matched(voters: &[NodeId], matched: &BTreeMap<NodeId, TermSeqno>, term: Term) -> Seqno {
    if voters.is_empty() {
        return Seqno::ZERO;
    }
    let mut seqnos: Vec<Seqno> = voters
        .iter()
        .map(|id| matched.get(id).filter(|position| position.term == term).map_or(Seqno::ZERO, |p| p.seqno))
        .collect();
    seqnos.sort_unstable_by(|a, b| b.cmp(a));
    // With n voters, a majority is n/2 + 1; the (n/2)-th highest (0-based) is matched by that many.
    seqnos[voters.len() / 2]
}

/// Whether `me` still holds its lease: a majority of each voter set, `me` counted, answered a ship
/// `me` SENT at most `lease` ago (`ages`: per follower, how long ago the ship of its last answer was
/// sent). A follower that answered a ship sent at `t` had not moved past our term by then, and no
/// other leader can be elected sooner than the minimum election timeout after the majority's last
/// contact: a lease shorter than that ends before another leader can acknowledge anything.
pub fn lease_holds(
    quorum: &Quorum,
    me: NodeId,
    ages: impl IntoIterator<Item = (NodeId, std::time::Duration)>,
    lease: std::time::Duration,
) -> bool {
    let fresh: BTreeSet<NodeId> = ages
        .into_iter()
        .filter(|(_, age)| *age <= lease)
        .map(|(node, _)| node)
        .chain(std::iter::once(me))
        .collect();
    quorum.is_majority(&fresh)
}

/// The new commit frontier of a leader in `term`.
///
/// `matched` holds, per node (the leader included, at its own durable position), the last position it
/// acked IN THIS TERM; entries of other terms are ignored. `term_at` gives the leader's term at a
/// seqno. Never returns less than `commit`.
pub fn commit_frontier(
    quorum: &Quorum,
    matched: &BTreeMap<NodeId, TermSeqno>,
    term: Term,
    commit: Seqno,
    term_at: impl Fn(Seqno) -> Option<Term>,
) -> Seqno {
    let candidate = quorum
        .voter_sets
        .iter()
        .map(|voters| majority_matched(voters, matched, term))
        .min()
        .unwrap_or(Seqno::ZERO);
    if candidate > commit && term_at(candidate) == Some(term) {
        candidate
    } else {
        commit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    fn matched(entries: &[(u64, TermSeqno)]) -> BTreeMap<NodeId, TermSeqno> {
        entries.iter().map(|(id, p)| (NodeId(*id), *p)).collect()
    }

    fn voters(ids: &[u64]) -> Vec<NodeId> {
        ids.iter().map(|id| NodeId(*id)).collect()
    }

    #[test]
    fn majority_of_three() {
        let q = Quorum::single(voters(&[1, 2, 3]));
        let m = matched(&[(1, at(2, 20)), (2, at(2, 15)), (3, at(2, 5))]);
        assert_eq!(commit_frontier(&q, &m, Term(2), Seqno(0), |_| Some(Term(2))), Seqno(15));
    }

    #[test]
    fn older_term_acks_do_not_count() {
        let q = Quorum::single(voters(&[1, 2, 3]));
        let m = matched(&[(1, at(2, 20)), (2, at(1, 20)), (3, at(1, 20))]);
        assert_eq!(commit_frontier(&q, &m, Term(2), Seqno(0), |_| Some(Term(2))), Seqno(0));
    }

    #[test]
    fn an_older_term_batch_is_not_committed_by_counting_replicas() {
        // Raft's figure 8: seqno 15 is of term 1, matched by a majority in term 2 — not committable
        // until a term-2 batch above it is.
        let q = Quorum::single(voters(&[1, 2, 3]));
        let m = matched(&[(1, at(2, 15)), (2, at(2, 15)), (3, at(2, 5))]);
        let term_at = |s: Seqno| Some(if s <= Seqno(15) { Term(1) } else { Term(2) });
        assert_eq!(commit_frontier(&q, &m, Term(2), Seqno(0), term_at), Seqno(0));
        let m = matched(&[(1, at(2, 16)), (2, at(2, 16)), (3, at(2, 5))]);
        assert_eq!(commit_frontier(&q, &m, Term(2), Seqno(0), term_at), Seqno(16));
    }

    #[test]
    fn joint_configuration_needs_both_majorities() {
        let q = Quorum { voter_sets: vec![voters(&[1, 2, 3]), voters(&[1, 4, 5])] };
        let m = matched(&[(1, at(3, 30)), (2, at(3, 30)), (3, at(3, 30)), (4, at(3, 10)), (5, at(3, 0))]);
        assert_eq!(commit_frontier(&q, &m, Term(3), Seqno(0), |_| Some(Term(3))), Seqno(10));
    }

    #[test]
    fn majority_of_every_voter_set() {
        let set = |ids: &[u64]| ids.iter().map(|id| NodeId(*id)).collect::<BTreeSet<_>>();
        let q = Quorum::single(voters(&[1, 2, 3]));
        assert!(q.is_majority(&set(&[1, 2])));
        assert!(!q.is_majority(&set(&[1, 4, 5])));
        let joint = Quorum { voter_sets: vec![voters(&[1, 2, 3]), voters(&[1, 4, 5])] };
        assert!(!joint.is_majority(&set(&[1, 2, 3])));
        assert!(joint.is_majority(&set(&[1, 2, 4])));
        assert!(!Quorum { voter_sets: vec![] }.is_majority(&set(&[1])));
        assert!(!Quorum::single(vec![]).is_majority(&set(&[1])));
        assert!(joint.is_voter(NodeId(5)) && !joint.is_voter(NodeId(6)));
    }

    #[test]
    fn commit_never_decreases() {
        let q = Quorum::single(voters(&[1, 2, 3]));
        let m = matched(&[(1, at(2, 20))]);
        assert_eq!(commit_frontier(&q, &m, Term(2), Seqno(12), |_| Some(Term(2))), Seqno(12));
    }

    /// Finding 4 of the safety review: a leader-mode leader acknowledged for as long as a partition
    /// lasted. The lease holds only while a majority answered ships sent within it.
    #[test]
    fn the_lease_needs_a_majority_of_recent_contacts() {
        let quorum = Quorum::single(vec![NodeId(1), NodeId(2), NodeId(3)]);
        let ms = std::time::Duration::from_millis;
        let lease = ms(270);
        assert!(!lease_holds(&quorum, NodeId(1), [], lease), "alone: no majority");
        assert!(lease_holds(&quorum, NodeId(1), [(NodeId(2), lease)], lease));
        assert!(!lease_holds(&quorum, NodeId(1), [(NodeId(2), ms(271))], lease), "ran out");
        let renewed = [(NodeId(2), ms(271)), (NodeId(3), ms(171))];
        assert!(lease_holds(&quorum, NodeId(1), renewed, lease), "a later contact renews it");
        let single = Quorum::single(vec![NodeId(1)]);
        assert!(lease_holds(&single, NodeId(1), [], lease), "one voter: always");
    }
}
