//! Taking office (PROTOCOL.md, "Taking office", steps 2 and 3): probe answers, adopting the most
//! up-to-date log, and the divergence point.
//!
//! A new leader L of term T probes the voters; each answers under its term lock with its last DURABLE
//! position and its term history ([`answer_probe`]). Once a majority of every voter set (L counted)
//! has answered with a position, [`plan_office`] decides: open the term on L's own log, or pull the
//! greatest log first. Delicate:
//! - the log is chosen by last position, term first, then seqno; commit frontiers are never used
//!   (a node's commit lags, and a log with a greater commit can lack a committed batch's successor);
//! - a tie between L and another node keeps L's log: it needs no pull;
//! - a node answering `Fenced` has a term above T: L stops taking office at once;
//! - after a restart in the SAME term, L writes no second LeaderStart if its WAL holds a batch of T.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tidal_types::{NodeId, Seqno, Term, TermSeqno};

use super::commit::Quorum;

/// A node's answer to a probe of term `probe_term` (PROTOCOL.md, "Taking office",
/// step 2). Answered with the DURABLE last position.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ProbeAnswer {
    /// Our term is below the probe's: openraft has not told us yet; the prober retries.
    NotYet {
        /// Our term.
        term: Term,
    },
    /// Our term is above the probe's: the prober is deposed.
    Fenced {
        /// Our term.
        term: Term,
    },
    /// Same term: our durable last position and our term history.
    Position {
        /// Last durable position; `(0, 0)` for an empty log.
        last: TermSeqno,
        /// Term history `[(term, first seqno of that term)]`, in order, through `last`.
        history: Vec<TermSeqno>,
    },
}

/// What the new leader knows of its own log.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OwnLog {
    /// Last durable position.
    pub last: TermSeqno,
    /// Term history `[(term, first seqno of that term)]`.
    pub history: Vec<TermSeqno>,
    /// Applied seqno of the engine state.
    pub applied: Seqno,
}

/// What the new leader does next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OfficePlan {
    /// Not yet a majority (by `quorum`, the leader's own answer counted) of Position answers: probe
    /// again.
    Wait,
    /// Some node answered Fenced with a higher term: stop taking office.
    StepDown {
        /// The highest term seen.
        term: Term,
    },
    /// Our log is the greatest last position of the probed majority: open the term.
    Open {
        /// Our last position: LeaderStart goes at `baseline.seqno + 1`.
        baseline: TermSeqno,
        /// False when our WAL already holds a batch of the term (same-term re-election after a
        /// restart: no second LeaderStart).
        write_leader_start: bool,
    },
    /// Another node's log is greater (term first, then seqno): quarantine our batches from
    /// `quarantine_from`, then pull from `source` starting at `pull_from` until we hold `target`.
    Sync {
        /// The node holding the greatest log.
        source: NodeId,
        /// Its last position.
        target: TermSeqno,
        /// The divergence point P between our log and the source's: pull from here.
        pull_from: TermSeqno,
        /// First seqno of ours after P, if we hold anything after P.
        quarantine_from: Option<Seqno>,
        /// Our applied seqno is past P: our state holds data that no longer exists, so we install
        /// the source's snapshot first.
        needs_snapshot: bool,
    },
}

/// Answers a probe of `probe_term` (under the term lock). `durable_last` is the last FSYNCED position,
/// never the last appended one: an unfsynced batch may vanish in a crash, and the prober must not
/// adopt what no node will hold.
pub fn answer_probe(
    our_term: Term,
    probe_term: Term,
    durable_last: TermSeqno,
    history: &[TermSeqno],
) -> ProbeAnswer {
    if our_term < probe_term {
        return ProbeAnswer::NotYet { term: our_term };
    }
    if our_term > probe_term {
        return ProbeAnswer::Fenced { term: our_term };
    }
    let history = history.iter().copied().filter(|entry| within(*entry, durable_last)).collect();
    ProbeAnswer::Position { last: durable_last, history }
}

/// The term a log holds at `seqno` (None if beyond `last` or seqno 0), from its term history.
pub fn term_at(history: &[TermSeqno], last: TermSeqno, seqno: Seqno) -> Option<Term> {
    if seqno == Seqno::ZERO || seqno > last.seqno {
        return None;
    }
    history.iter().rev().find(|entry| within(**entry, last) && entry.seqno <= seqno).map(|entry| entry.term)
}

/// The divergence point P: the last position at which both logs hold the same term ((0,0) if none).
///
/// Two logs that hold the same term at a seqno agree on everything below it (log matching), so P is
/// the end of the last overlapping run of one term.
pub fn divergence_point(
    a_history: &[TermSeqno],
    a_last: TermSeqno,
    b_history: &[TermSeqno],
    b_last: TermSeqno,
) -> TermSeqno {
    let a_runs = runs(a_history, a_last);
    let b_runs = runs(b_history, b_last);
    let mut point = TermSeqno::default();
    for a in &a_runs {
        for b in b_runs.iter().filter(|b| b.term == a.term) {
            let first = a.first.max(b.first);
            let last = a.last.min(b.last);
            if first <= last && last > point.seqno {
                point = TermSeqno { term: a.term, seqno: last };
            }
        }
    }
    point
}

/// Decides, from the probe answers gathered so far in `term`, what leader `me` does next.
///
/// `answers` may or may not include `me`; our own log always counts as a Position answer. Only
/// voters' answers count toward the majority and are candidates for adoption.
pub fn plan_office(
    me: NodeId,
    term: Term,
    own: &OwnLog,
    answers: &BTreeMap<NodeId, ProbeAnswer>,
    quorum: &Quorum,
) -> OfficePlan {
    let fenced = answers
        .values()
        .filter_map(|answer| match answer {
            ProbeAnswer::Fenced { term: theirs } if *theirs > term => Some(*theirs),
            _ => None,
        })
        .max();
    if let Some(higher) = fenced {
        return OfficePlan::StepDown { term: higher };
    }
    let mut answered = BTreeSet::from([me]);
    let mut best: Option<(NodeId, TermSeqno, &[TermSeqno])> = None;
    for (node, answer) in answers {
        let ProbeAnswer::Position { last, history } = answer else { continue };
        if *node == me || !quorum.is_voter(*node) {
            continue;
        }
        answered.insert(*node);
        // Strictly greater: on a tie the first (lowest id) stays, and our own log beats all ties below.
        if best.is_none_or(|(_, best_last, _)| *last > best_last) {
            best = Some((*node, *last, history));
        }
    }
    if !quorum.is_majority(&answered) {
        return OfficePlan::Wait;
    }
    match best {
        Some((source, target, history)) if target > own.last => {
            let pull_from = divergence_point(&own.history, own.last, history, target);
            let quarantine_from = (own.last.seqno > pull_from.seqno).then(|| pull_from.seqno.next());
            OfficePlan::Sync {
                source,
                target,
                pull_from,
                quarantine_from,
                needs_snapshot: own.applied > pull_from.seqno,
            }
        }
        _ => OfficePlan::Open {
            baseline: own.last,
            write_leader_start: !holds_term(&own.history, own.last, term),
        },
    }
}

/// Taking office ran past its deadline and one more probe did not open the term: the voter to hand
/// the office to. It is the probed voter (not `me`) with the greatest last position, which needs no
/// pull to take office (PROTOCOL.md, "Taking office"); on a tie the lowest id. `None` if no other
/// voter answered with a position: the caller then only stops its heartbeats, so the voters' lease
/// runs out and they elect without it.
pub fn transfer_target(
    me: NodeId,
    answers: &BTreeMap<NodeId, ProbeAnswer>,
    quorum: &Quorum,
) -> Option<NodeId> {
    let mut best: Option<(NodeId, TermSeqno)> = None;
    for (node, answer) in answers {
        let ProbeAnswer::Position { last, .. } = answer else { continue };
        if *node == me || !quorum.is_voter(*node) {
            continue;
        }
        if best.is_none_or(|(_, best_last)| *last > best_last) {
            best = Some((*node, *last));
        }
    }
    best.map(|(node, _)| node)
}

/// How long the voter asked to stand (`target`) must wait before it campaigns, for its election to
/// be able to succeed (decisions/068, second amendment). A voter refuses every vote while the leader
/// lease it grants runs, so the candidate needs voters whose leases have run out, enough to make a
/// majority of every voter set with itself. `leases`: what remains of the lease each other node
/// grants, as it answered the probe (the asker's own included; non-voters are ignored). The shortest
/// wait after which that majority exists; when none ever does (too few voters answered), the longest
/// lease known, by when every voter that answered has run out of its lease.
pub fn campaign_not_before(target: NodeId, leases: &BTreeMap<NodeId, Duration>, quorum: &Quorum) -> Duration {
    let mut waits: Vec<(Duration, NodeId)> = leases
        .iter()
        .filter(|(node, _)| **node != target && quorum.is_voter(**node))
        .map(|(node, left)| (*left, *node))
        .collect();
    waits.sort_unstable();
    let mut granting = BTreeSet::from([target]);
    if quorum.is_majority(&granting) {
        return Duration::ZERO;
    }
    for (left, node) in &waits {
        granting.insert(*node);
        if quorum.is_majority(&granting) {
            return *left;
        }
    }
    waits.last().map_or(Duration::ZERO, |(left, _)| *left)
}

/// One run of a single term in a log: seqnos `first..=last` all of `term`.
struct Run {
    term: Term,
    first: Seqno,
    last: Seqno,
}

/// A history entry describes the log ending at `last`: its term is not above `last`'s and it starts
/// at or before `last`. Entries past `last` (a suffix not yet durable, or quarantined) are ignored.
fn within(entry: TermSeqno, last: TermSeqno) -> bool {
    entry.term <= last.term && entry.seqno <= last.seqno && entry.seqno > Seqno::ZERO
}

/// The runs of a log ending at `last`, in order.
fn runs(history: &[TermSeqno], last: TermSeqno) -> Vec<Run> {
    let entries: Vec<TermSeqno> = history.iter().copied().filter(|entry| within(*entry, last)).collect();
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let end = entries.get(i + 1).map_or(last.seqno, |next| Seqno(next.seqno.get() - 1));
            Run { term: entry.term, first: entry.seqno, last: end }
        })
        .filter(|run| run.first <= run.last)
        .collect()
}

/// Whether the log ending at `last` holds a batch of `term`.
fn holds_term(history: &[TermSeqno], last: TermSeqno, term: Term) -> bool {
    last.term == term || runs(history, last).iter().any(|run| run.term == term)
}

/// Whether leading `term` now would resume a term an earlier process of this node led: `term` is at
/// or below the vote this process found persisted at its start (`boot_term`; openraft's standard
/// mode elects a node only in a term above every vote it persisted, so leading such a term is a
/// restored election), or this process never opened `term` yet our log holds its LeaderStart.
/// The second test was the only one until decisions/057: it missed a restart whose crash took the
/// LeaderStart itself (shipped on write, never fsynced here). The office (`replica/office.rs`)
/// hands such a term over; the model check (tidal-model) drives this function at every restored
/// office.
pub fn resumes_a_term(term: Term, boot_term: Term, write_leader_start: bool, opened_term: u64) -> bool {
    term <= boot_term || (!write_leader_start && opened_term < term.get())
}

/// Whether an openraft call this node is about to send as `leader` of `term` must stay home: it
/// would speak for a term at or below the vote found at start (`boot_term`), i.e. for a restored
/// office, which [`resumes_a_term`] hands over. Every voter that accepted such a call would renew
/// the lease it grants (openraft refuses all votes while it runs), so the election that replaces
/// the restored office would wait a whole lease counted from the restart instead of from the
/// crash (decisions/068). Keeping a call home is a message lost, which the protocol tolerates.
pub fn speaks_for_a_restored_term(leader: NodeId, term: Term, me: NodeId, boot_term: Term) -> bool {
    leader == me && term <= boot_term
}

/// The first seqno of `term` once its office opens: the LeaderStart this office writes goes right
/// after the baseline; an office that holds its term already (the same process put back in office)
/// starts where its log's term history says the term began.
pub fn term_start(term: Term, baseline: Seqno, write_leader_start: bool, history: &[TermSeqno]) -> Seqno {
    if write_leader_start {
        return baseline.next();
    }
    history.iter().find(|entry| entry.term == term).map_or(baseline.next(), |entry| entry.seqno)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    fn history(entries: &[(u64, u64)]) -> Vec<TermSeqno> {
        entries.iter().map(|(t, s)| at(*t, *s)).collect()
    }

    fn three() -> Quorum {
        Quorum::single(vec![NodeId(1), NodeId(2), NodeId(3)])
    }

    fn position(last: TermSeqno, entries: &[(u64, u64)]) -> ProbeAnswer {
        ProbeAnswer::Position { last, history: history(entries) }
    }

    fn answers(entries: Vec<(u64, ProbeAnswer)>) -> BTreeMap<NodeId, ProbeAnswer> {
        entries.into_iter().map(|(id, a)| (NodeId(id), a)).collect()
    }

    #[test]
    fn probe_answers_follow_the_term() {
        let h = history(&[(1, 1)]);
        assert_eq!(answer_probe(Term(1), Term(2), at(1, 5), &h), ProbeAnswer::NotYet { term: Term(1) });
        assert_eq!(answer_probe(Term(3), Term(2), at(1, 5), &h), ProbeAnswer::Fenced { term: Term(3) });
        assert_eq!(answer_probe(Term(2), Term(2), at(1, 5), &h), position(at(1, 5), &[(1, 1)]));
    }

    #[test]
    fn probe_answer_drops_history_past_the_durable_position() {
        // Term 2 started at 6 but only 1..5 is fsynced: the answer describes the durable log only.
        let h = history(&[(1, 1), (2, 6)]);
        assert_eq!(answer_probe(Term(2), Term(2), at(1, 5), &h), position(at(1, 5), &[(1, 1)]));
    }

    #[test]
    fn term_at_reads_the_history() {
        let h = history(&[(1, 1), (3, 101), (4, 120)]);
        let last = at(4, 130);
        assert_eq!(term_at(&h, last, Seqno(0)), None);
        assert_eq!(term_at(&h, last, Seqno(1)), Some(Term(1)));
        assert_eq!(term_at(&h, last, Seqno(100)), Some(Term(1)));
        assert_eq!(term_at(&h, last, Seqno(101)), Some(Term(3)));
        assert_eq!(term_at(&h, last, Seqno(130)), Some(Term(4)));
        assert_eq!(term_at(&h, last, Seqno(131)), None);
        // An entry past `last` (not durable) is ignored.
        assert_eq!(term_at(&h, at(3, 110), Seqno(110)), Some(Term(3)));
        assert_eq!(term_at(&[], TermSeqno::default(), Seqno(1)), None);
    }

    #[test]
    fn divergence_point_of_the_cut_off_leader() {
        // PROTOCOL.md "a cut-off leader": n1 holds 101..105 of t1; n2 holds 1..100 t1, then 101.. t2.
        let n1 = history(&[(1, 1)]);
        let n2 = history(&[(1, 1), (2, 101)]);
        assert_eq!(divergence_point(&n1, at(1, 105), &n2, at(2, 110)), at(1, 100));
        assert_eq!(divergence_point(&n2, at(2, 110), &n1, at(1, 105)), at(1, 100));
    }

    #[test]
    fn divergence_point_cases() {
        // Identical logs: P is the shorter end.
        let h = history(&[(1, 1), (2, 4)]);
        assert_eq!(divergence_point(&h, at(2, 6), &h, at(2, 9)), at(2, 6));
        // Nothing in common.
        assert_eq!(divergence_point(&history(&[(1, 1)]), at(1, 3), &history(&[(2, 1)]), at(2, 3)), at(0, 0));
        // Empty logs.
        assert_eq!(divergence_point(&[], at(0, 0), &history(&[(1, 1)]), at(1, 3)), at(0, 0));
        // Shared t1 prefix, then t2 on one side and t3 on the other, both from seqno 3.
        let a = history(&[(1, 1), (2, 3)]);
        let b = history(&[(1, 1), (3, 3)]);
        assert_eq!(divergence_point(&a, at(2, 5), &b, at(3, 4)), at(1, 2));
        // A shared run of t2 ends where the first log moved on to t3 (6), not where the other did (8).
        let a = history(&[(1, 1), (2, 3), (3, 6)]);
        let b = history(&[(1, 1), (2, 3), (4, 8)]);
        assert_eq!(divergence_point(&a, at(3, 9), &b, at(4, 9)), at(2, 5));
    }

    #[test]
    fn waits_for_a_majority_of_positions() {
        let own = OwnLog { last: at(1, 5), history: history(&[(1, 1)]), applied: Seqno(5) };
        let none = answers(vec![(2, ProbeAnswer::NotYet { term: Term(1) })]);
        assert_eq!(plan_office(NodeId(1), Term(2), &own, &none, &three()), OfficePlan::Wait);
        let one = answers(vec![(2, position(at(1, 5), &[(1, 1)]))]);
        assert!(matches!(plan_office(NodeId(1), Term(2), &own, &one, &three()), OfficePlan::Open { .. }));
        // A learner's answer does not make a majority.
        let learner = answers(vec![(9, position(at(1, 5), &[(1, 1)]))]);
        assert_eq!(plan_office(NodeId(1), Term(2), &own, &learner, &three()), OfficePlan::Wait);
    }

    #[test]
    fn a_higher_term_steps_down() {
        let own = OwnLog { last: at(1, 5), history: history(&[(1, 1)]), applied: Seqno(5) };
        let a = answers(vec![(2, position(at(1, 5), &[(1, 1)])), (3, ProbeAnswer::Fenced { term: Term(4) })]);
        assert_eq!(
            plan_office(NodeId(1), Term(2), &own, &a, &three()),
            OfficePlan::StepDown { term: Term(4) }
        );
    }

    #[test]
    fn opens_on_the_cut_off_leaders_successor() {
        // PROTOCOL.md "a cut-off leader": n2 probes {n2:(t1,100), n3:(t1,100)} → LeaderStart at 101.
        let own = OwnLog { last: at(1, 100), history: history(&[(1, 1)]), applied: Seqno(100) };
        let a = answers(vec![(3, position(at(1, 100), &[(1, 1)]))]);
        assert_eq!(
            plan_office(NodeId(2), Term(2), &own, &a, &three()),
            OfficePlan::Open { baseline: at(1, 100), write_leader_start: true }
        );
    }

    #[test]
    fn a_tie_keeps_our_own_log() {
        let own = OwnLog { last: at(1, 7), history: history(&[(1, 1)]), applied: Seqno(3) };
        let a = answers(vec![(1, position(at(1, 7), &[(1, 1)])), (3, position(at(1, 7), &[(1, 1)]))]);
        assert!(matches!(plan_office(NodeId(2), Term(2), &own, &a, &three()), OfficePlan::Open { .. }));
    }

    #[test]
    fn adopts_the_greatest_position_term_first() {
        // n3 has a shorter log of a later term: it wins over n2's longer t1 log and over ours.
        let own = OwnLog { last: at(1, 6), history: history(&[(1, 1)]), applied: Seqno(2) };
        let a = answers(vec![(2, position(at(1, 9), &[(1, 1)])), (3, position(at(2, 4), &[(1, 1), (2, 4)]))]);
        assert_eq!(
            plan_office(NodeId(1), Term(3), &own, &a, &three()),
            OfficePlan::Sync {
                source: NodeId(3),
                target: at(2, 4),
                pull_from: at(1, 3),
                quarantine_from: Some(Seqno(4)),
                needs_snapshot: false,
            }
        );
    }

    #[test]
    fn a_shorter_log_pulls_without_quarantine() {
        let own = OwnLog { last: at(1, 3), history: history(&[(1, 1)]), applied: Seqno(3) };
        let a = answers(vec![(2, position(at(1, 6), &[(1, 1)]))]);
        assert_eq!(
            plan_office(NodeId(1), Term(2), &own, &a, &three()),
            OfficePlan::Sync {
                source: NodeId(2),
                target: at(1, 6),
                pull_from: at(1, 3),
                quarantine_from: None,
                needs_snapshot: false,
            }
        );
    }

    #[test]
    fn leader_mode_losing_an_acked_tail_needs_a_snapshot() {
        // PROTOCOL.md "leader mode loses an acknowledged tail": n1 applied 101..105 t1; n2 leads t2 from
        // 100. When n1 is elected in t3 and probes, n2's (t2, 110) is greater: n1 quarantines 101.. and,
        // having applied past P = 100, installs a snapshot first.
        let own = OwnLog { last: at(1, 105), history: history(&[(1, 1)]), applied: Seqno(105) };
        let a = answers(vec![(2, position(at(2, 110), &[(1, 1), (2, 101)]))]);
        assert_eq!(
            plan_office(NodeId(1), Term(3), &own, &a, &three()),
            OfficePlan::Sync {
                source: NodeId(2),
                target: at(2, 110),
                pull_from: at(1, 100),
                quarantine_from: Some(Seqno(101)),
                needs_snapshot: true,
            }
        );
    }

    #[test]
    fn commit_frontiers_never_choose() {
        // The greater log wins even if the leader has applied (so committed) more: the plan depends on
        // last positions only.
        let own = OwnLog { last: at(1, 8), history: history(&[(1, 1)]), applied: Seqno(8) };
        let a = answers(vec![(2, position(at(2, 5), &[(1, 1), (2, 5)]))]);
        assert!(matches!(
            plan_office(NodeId(1), Term(3), &own, &a, &three()),
            OfficePlan::Sync { source: NodeId(2), needs_snapshot: true, .. }
        ));
    }

    #[test]
    fn same_term_reelection_writes_no_second_leader_start() {
        let own = OwnLog { last: at(2, 12), history: history(&[(1, 1), (2, 11)]), applied: Seqno(11) };
        let a = answers(vec![(3, position(at(2, 11), &[(1, 1), (2, 11)]))]);
        assert_eq!(
            plan_office(NodeId(1), Term(2), &own, &a, &three()),
            OfficePlan::Open { baseline: at(2, 12), write_leader_start: false }
        );
    }

    #[test]
    fn joint_configuration_needs_both_majorities() {
        let q = Quorum {
            voter_sets: vec![vec![NodeId(1), NodeId(2), NodeId(3)], vec![NodeId(1), NodeId(4), NodeId(5)]],
        };
        let own = OwnLog { last: at(1, 4), history: history(&[(1, 1)]), applied: Seqno(4) };
        let old_only = answers(vec![(2, position(at(1, 4), &[(1, 1)])), (3, position(at(1, 4), &[(1, 1)]))]);
        assert_eq!(plan_office(NodeId(1), Term(2), &own, &old_only, &q), OfficePlan::Wait);
        let both = answers(vec![(2, position(at(1, 4), &[(1, 1)])), (4, position(at(1, 6), &[(1, 1)]))]);
        assert!(matches!(
            plan_office(NodeId(1), Term(2), &own, &both, &q),
            OfficePlan::Sync { source: NodeId(4), .. }
        ));
    }

    /// Finding 7 of the safety review: taking office had no deadline; past it, the office goes to
    /// the probed voter with the greatest log (it needs no pull), never to a learner or to us.
    #[test]
    fn the_office_goes_to_the_voter_with_the_greatest_log() {
        let me = NodeId(1);
        let quorum = Quorum::single(vec![NodeId(1), NodeId(2), NodeId(3)]);
        let position = |term, seqno| ProbeAnswer::Position {
            last: TermSeqno { term: Term(term), seqno: Seqno(seqno) },
            history: vec![],
        };
        let mut answers = BTreeMap::from([
            (NodeId(2), position(2, 10)),
            (NodeId(3), position(3, 5)),
            (NodeId(4), position(3, 50)),
            (NodeId(1), position(3, 99)),
        ]);
        assert_eq!(
            transfer_target(me, &answers, &quorum),
            Some(NodeId(3)),
            "term first; learner 4 and we never"
        );
        answers.insert(NodeId(3), ProbeAnswer::NotYet { term: Term(1) });
        assert_eq!(transfer_target(me, &answers, &quorum), Some(NodeId(2)));
        answers.remove(&NodeId(2));
        assert_eq!(transfer_target(me, &answers, &quorum), None);
    }

    /// `script-restarted-leader-missed`: the voter asked to stand heard the last heartbeats before
    /// the crash less recently than another voter. Campaigning when its own lease ran out, it was
    /// refused by that voter and by the restarted node (openraft restores its vote with a fresh
    /// lease); it must wait for the shorter of the two, the one vote it needs.
    #[test]
    fn a_campaign_waits_for_the_leases_its_majority_needs() {
        let ms = Duration::from_millis;
        let three = Quorum::single(vec![NodeId(1), NodeId(2), NodeId(3)]);
        let leases = |pairs: &[(u64, u64)]| pairs.iter().map(|(n, left)| (NodeId(*n), ms(*left))).collect();
        let asked = NodeId(2);
        assert_eq!(campaign_not_before(asked, &leases(&[(1, 900), (3, 120)]), &three), ms(120));
        assert_eq!(campaign_not_before(asked, &leases(&[(1, 900), (3, 0)]), &three), ms(0));
        assert_eq!(
            campaign_not_before(asked, &leases(&[(1, 900)]), &three),
            ms(900),
            "the other voter is down"
        );
        assert_eq!(
            campaign_not_before(asked, &leases(&[(2, 5_000), (1, 10), (3, 20)]), &three),
            ms(10),
            "its own"
        );
        let five = Quorum::single((1..=5).map(NodeId).collect());
        let all = leases(&[(1, 900), (3, 100), (4, 700), (5, 300)]);
        assert_eq!(campaign_not_before(asked, &all, &five), ms(300), "two more votes");
        assert_eq!(campaign_not_before(asked, &leases(&[(1, 900)]), &five), ms(900), "too few answered");
        assert_eq!(
            campaign_not_before(asked, &leases(&[(9, 50), (1, 900)]), &three),
            ms(900),
            "9 is no voter"
        );
        assert_eq!(campaign_not_before(asked, &leases(&[]), &Quorum::single(vec![asked])), ms(0));
    }

    /// Finding 3 of the safety review: a restart whose crash took the term's LeaderStart from our
    /// WAL (so `write_leader_start` is true) must still refuse the restored term.
    #[test]
    fn a_restored_term_is_refused_even_when_its_leader_start_was_lost() {
        assert!(resumes_a_term(Term(3), Term(3), true, 0), "LeaderStart lost in the crash");
        assert!(resumes_a_term(Term(3), Term(3), false, 0), "LeaderStart kept");
        assert!(!resumes_a_term(Term(4), Term(3), true, 0), "a fresh election in this process");
        assert!(!resumes_a_term(Term(4), Term(3), false, 4), "re-entering a term this process opened");
        assert!(resumes_a_term(Term(4), Term(3), false, 0), "holds a LeaderStart it never wrote");
    }

    #[test]
    fn only_our_own_calls_for_a_term_at_or_below_the_boot_vote_stay_home() {
        let (me, other) = (NodeId(1), NodeId(2));
        assert!(speaks_for_a_restored_term(me, Term(3), me, Term(3)), "the restored office's term");
        assert!(speaks_for_a_restored_term(me, Term(2), me, Term(3)), "an older term of ours");
        assert!(!speaks_for_a_restored_term(me, Term(4), me, Term(3)), "a term won in this process");
        assert!(!speaks_for_a_restored_term(other, Term(3), me, Term(3)), "another node's call");
    }

    #[test]
    fn a_term_starts_after_its_baseline_or_where_the_log_began_it() {
        let log = history(&[(1, 1), (3, 9)]);
        assert_eq!(term_start(Term(4), Seqno(12), true, &log), Seqno(13), "a new LeaderStart at B + 1");
        assert_eq!(term_start(Term(3), Seqno(8), false, &log), Seqno(9), "a held term starts where it began");
        assert_eq!(
            term_start(Term(5), Seqno(12), false, &log),
            Seqno(13),
            "not in the log: after the baseline"
        );
    }
}
