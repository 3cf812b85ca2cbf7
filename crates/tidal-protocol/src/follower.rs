//! The follower's acceptance rules for a ship or a pulled chunk (PROTOCOL.md, "Shipping and pulling").
//!
//! `decide_ship` runs under the follower's term lock with a view of its log. It returns a
//! [`Verdict`]; the caller performs the steps (quarantine, append), fsyncs and acks `matched`, all
//! still under the same lock (PROTOCOL.md, "The term lock"): no vote can be persisted between the
//! append and the ack, so the ack names the term it was appended in. Delicate:
//! - a refusal is an answer (Fenced, NotYet, Gap, Diverged, Refuse), never an error;
//! - a batch that starts inside one of our batches refuses the WHOLE message: nothing is half-applied;
//! - in quorum mode quarantining at or below our commit frontier would drop committed data: that is
//!   a protocol bug, so the verdict is Halt, loudly.

use tidal_types::{NodeId, Seqno, Term, TermSeqno};

/// What the decision needs to know about the follower's log.
pub trait LogView {
    /// The follower's persisted term (openraft's vote term).
    fn term(&self) -> Term;
    /// Last appended position; `(0, 0)` for an empty log.
    fn last(&self) -> TermSeqno;
    /// Where `seqno` sits in our log.
    fn locate(&self, seqno: Seqno) -> Located;
    /// Position of the installed snapshot, if the log starts after one.
    fn snapshot_position(&self) -> Option<TermSeqno>;
    /// Commit frontier.
    fn commit(&self) -> Seqno;
}

/// Where a seqno sits in a follower's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Located {
    /// Inside our batch `first..=last` of `term`.
    In {
        /// Term of that batch.
        term: Term,
        /// Its first seqno.
        first: Seqno,
        /// Its last seqno.
        last: Seqno,
    },
    /// Past our last seqno.
    Beyond,
    /// Below our purge point or snapshot: the term is no longer known.
    Purged,
}

/// The position-relevant fields of one shipped batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMeta {
    /// First seqno.
    pub first: Seqno,
    /// Last seqno.
    pub last: Seqno,
    /// Term of the leader that wrote it.
    pub term: Term,
}

/// The position-relevant fields of a ship or pulled chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShipMeta {
    /// The sender's term.
    pub term: Term,
    /// Position just before the first batch.
    pub prev: TermSeqno,
    /// Batches in seqno order.
    pub batches: Vec<BatchMeta>,
    /// Sender's commit frontier.
    pub commit: Seqno,
}

/// What the follower does with one batch of an accepted message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Already held with the same term: nothing to write.
    Skip(usize),
    /// Move our WAL from this seqno on into quarantine (another term held it), then append.
    QuarantineFrom(Seqno),
    /// Append batch `i` of the message.
    Append(usize),
}

/// The follower's answer to a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The sender's term is below ours.
    Fenced {
        /// Our term.
        term: Term,
    },
    /// The sender's term is above ours: openraft has not told us yet; the sender retries.
    NotYet {
        /// Our term.
        term: Term,
    },
    /// We do not hold `prev`: pull from our last position.
    Gap {
        /// Our last position.
        last: TermSeqno,
    },
    /// We hold `prev.seqno` with another term: the sender computes the divergence point from our
    /// term history.
    Diverged,
    /// Malformed or misaligned message; nothing written. An aligned ship or pull re-delivers.
    Refuse {
        /// Why.
        reason: String,
    },
    /// Accepting would break a safety rule; the receiver must stop loudly.
    Halt {
        /// Which rule.
        cause: HaltCause,
        /// Why, with the positions.
        reason: String,
    },
    /// Advance commit to `commit_now` at once, perform `steps` in order, fsync (the term lock still
    /// held), then ack `matched` and advance commit to `commit`.
    Accept {
        /// What to write.
        steps: Vec<Step>,
        /// The last position this message verified or appended.
        matched: TermSeqno,
        /// Commit frontier before anything is written: `max(ours, min(sender's, prev))`. Everything
        /// up to `prev` is the sender's log (we hold `prev` with its term: log matching), so its
        /// commit covers it now; a follower under steady load then applies without waiting for the
        /// fsync of the batches this same message brings (replication lag).
        commit_now: Seqno,
        /// New commit frontier after the fsync: `max(ours, min(sender's, matched))`.
        commit: Seqno,
    },
}

/// Why a message halts its receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaltCause {
    /// A batch of the message starts where one of ours of the same term starts but ends elsewhere:
    /// batches of one term are byte-identical on every node, so two logs hold that term. Whoever
    /// sent it, log matching is broken.
    OneTermTwoLogs,
    /// The message conflicts with our log at or below our commit frontier: accepting it would
    /// quarantine committed (maybe applied) batches. From a sender whose log is the leader's, a
    /// protocol bug in quorum mode and a lost acknowledged tail in leader mode; from a sender that
    /// did not hold office in its term, no proof of anything ([`append_only`] refuses it).
    ReplacesCommitted {
        /// The first of our batches the message would replace.
        at: Seqno,
    },
}

/// Checks that the message is internally consistent: contiguous batches after `prev`, terms not
/// decreasing and not above the sender's term.
fn check_shape(ship: &ShipMeta) -> Result<(), String> {
    let mut expected_first = ship.prev.seqno.next();
    let mut previous_term = ship.prev.term;
    for (i, batch) in ship.batches.iter().enumerate() {
        if batch.first != expected_first || batch.last < batch.first {
            return Err(format!(
                "batch {i} covers {}..={} but {} was expected next",
                batch.first, batch.last, expected_first
            ));
        }
        if batch.term < previous_term || batch.term > ship.term {
            return Err(format!(
                "batch {i} has term {} after term {} in a message of term {}",
                batch.term, previous_term, ship.term
            ));
        }
        previous_term = batch.term;
        expected_first = batch.last.next();
    }
    Ok(())
}

fn holds_prev(log: &impl LogView, prev: TermSeqno) -> Result<(), Verdict> {
    if prev.seqno == Seqno::ZERO || log.snapshot_position() == Some(prev) {
        return Ok(());
    }
    match log.locate(prev.seqno) {
        Located::Beyond => Err(Verdict::Gap { last: log.last() }),
        Located::Purged => Err(Verdict::Gap { last: log.last() }),
        Located::In { term, last, .. } if last == prev.seqno => {
            if term == prev.term {
                Ok(())
            } else {
                Err(Verdict::Diverged)
            }
        }
        Located::In { term, .. } => {
            if term == prev.term {
                // prev is in the middle of one of our batches of the same term: batches of one term are
                // byte-identical on every node, so the sender cannot mean this position.
                Err(Verdict::Refuse { reason: format!("prev {prev} is not the end of one of our batches") })
            } else {
                Err(Verdict::Diverged)
            }
        }
    }
}

/// Decides what to do with a ship or pulled chunk. `quorum` is the durability mode.
pub fn decide_ship(log: &impl LogView, ship: &ShipMeta, quorum: bool) -> Verdict {
    let our_term = log.term();
    if ship.term < our_term {
        return Verdict::Fenced { term: our_term };
    }
    if ship.term > our_term {
        return Verdict::NotYet { term: our_term };
    }
    if let Err(reason) = check_shape(ship) {
        return Verdict::Refuse { reason };
    }
    if let Err(verdict) = holds_prev(log, ship.prev) {
        return verdict;
    }
    let mut steps = Vec::with_capacity(ship.batches.len());
    let mut appending = false;
    for (i, batch) in ship.batches.iter().enumerate() {
        if appending {
            steps.push(Step::Append(i));
            continue;
        }
        match log.locate(batch.first) {
            Located::In { term, first, last } if first == batch.first && term == batch.term => {
                if last != batch.last {
                    return Verdict::Halt {
                        cause: HaltCause::OneTermTwoLogs,
                        reason: format!(
                            "our batch at {} of term {term} ends at {last}, the sender's at {}: one term, two logs",
                            batch.first, batch.last
                        ),
                    };
                }
                steps.push(Step::Skip(i));
            }
            Located::In { term, first, .. } if first == batch.first => {
                if batch.first <= log.commit() {
                    // Quorum mode: a protocol bug. Leader mode: acknowledged writes were lost in a
                    // failover; our state (commit, applied) is past the divergence point, and
                    // accepting would leave commit above durable (found by the model check,
                    // decisions/006). Either way nothing is written: the node needs a snapshot.
                    let why = if quorum {
                        "a protocol violation"
                    } else {
                        "leader mode lost them; install a snapshot"
                    };
                    return Verdict::Halt {
                        cause: HaltCause::ReplacesCommitted { at: batch.first },
                        reason: format!(
                            "would quarantine committed seqno {} (commit {}) held with term {term}, sender has {}: {why}",
                            batch.first,
                            log.commit(),
                            batch.term
                        ),
                    };
                }
                steps.push(Step::QuarantineFrom(batch.first));
                steps.push(Step::Append(i));
                appending = true;
            }
            Located::In { .. } => {
                return Verdict::Refuse {
                    reason: format!("batch {i} starts at {} inside one of our batches", batch.first),
                };
            }
            Located::Purged => {
                // Below our snapshot or purge point: we hold it in applied state; nothing to write.
                steps.push(Step::Skip(i));
            }
            Located::Beyond => {
                steps.push(Step::Append(i));
                appending = true;
            }
        }
    }
    let matched = match ship.batches.last() {
        Some(batch) => TermSeqno { term: batch.term, seqno: batch.last },
        None => ship.prev,
    };
    let commit = std::cmp::max(log.commit(), std::cmp::min(ship.commit, matched.seqno));
    let commit_now = std::cmp::max(log.commit(), std::cmp::min(ship.commit, ship.prev.seqno));
    Verdict::Accept { steps, matched, commit_now, commit }
}

/// Where a message on the follower's one receive path comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A live ship from the leader's ShipQueue.
    Live,
    /// A chunk pulled from `source` (its leader field says whether it holds office in the term).
    Pull {
        /// The node serving the pull.
        source: NodeId,
    },
    /// A chunk of the log a new leader adopts while taking office (from the source it chose).
    Adopting,
}

/// What a message may do to the receiver, by where it comes from ([`authority`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Authority {
    /// Its sender holds the log of the message's term: it may quarantine and replace our batches
    /// (else [`append_only`] restricts its verdict).
    pub replaces: bool,
    /// It names the leader of its term: its sender becomes our leader hint, and a leader-mode halt
    /// on it repairs itself from the sender's snapshot ([`repairs_a_halt`]).
    pub names_leader: bool,
}

/// The authority of a message from `origin` whose leader field is `leader`. The leader's ships hold
/// the log of their term; so does a chunk from the node in office (it names itself as the leader),
/// and the pull of a leader adopting the log it chose. Any other chunk may carry an uncommitted
/// suffix of an older term (decisions/019). A chunk a leader adopts names no leader: the adopting
/// node is the leader.
pub fn authority(origin: Origin, leader: NodeId) -> Authority {
    match origin {
        Origin::Live => Authority { replaces: true, names_leader: true },
        Origin::Pull { source } => Authority { replaces: leader == source, names_leader: leader == source },
        Origin::Adopting => Authority { replaces: true, names_leader: false },
    }
}

/// Restricts a verdict for a message whose sender may not hold the log of the message's term: a
/// pulled chunk from a node that is not in office in that term (a follower, or a deposed leader whose
/// leader hint is stale, or a node still taking office). Such a node may still hold an uncommitted
/// suffix of an older term that the leader has not replaced on it yet. Its chunk may add batches
/// past our log (commit from it is capped by the sender's commit, and what the sender committed is
/// the leader's log), but it must never replace ours: the batches it would quarantine may be the
/// leader's, acked by us and counted toward commit (and, with commit notices, covered by `matched`).
/// Found by the simulation (chaos 114, decisions/019). Only the leader's ships, a pull from the node
/// in office, and the pull of a leader adopting the log it chose (taking office, step 3) may
/// quarantine.
///
/// The same holds where the chunk conflicts at or below our commit frontier: from such a sender the
/// conflict proves nothing about the leader's log, so it is refused like any other replacement, not
/// a halt (found by the model check, issue 37: a follower pulled from a node taking office, committed
/// the new leader's log, then got the node's pre-adoption chunk). A batch of one term with other
/// boundaries still halts: that is two logs in one term whoever sends it.
pub fn append_only(verdict: Verdict) -> Verdict {
    match replaced_from(&verdict) {
        Some(seqno) => Verdict::Refuse {
            reason: format!(
                "a chunk from a node not in office in its term would replace our batches from {seqno}"
            ),
        },
        None => verdict,
    }
}

/// Where the verdict would replace our log: the first quarantined seqno of an acceptance, or the
/// conflicting committed seqno of a [`HaltCause::ReplacesCommitted`] halt. A chunk whose sender may
/// not hold its term's log is refused exactly when this is `Some` ([`append_only`]).
pub fn replaced_from(verdict: &Verdict) -> Option<Seqno> {
    match verdict {
        Verdict::Accept { steps, .. } => steps.iter().find_map(|step| match step {
            Step::QuarantineFrom(seqno) => Some(*seqno),
            _ => None,
        }),
        Verdict::Halt { cause: HaltCause::ReplacesCommitted { at }, .. } => Some(*at),
        _ => None,
    }
}

/// Whether a halted receiver repairs itself from the sender's snapshot: in leader mode a halt means
/// the leader's durability lost batches we had committed, which only its state repairs; the sender
/// must hold office (it names itself leader). In quorum mode a halt is a protocol violation and
/// stays, loudly, for a person to look at.
pub fn repairs_a_halt(quorum: bool, names_leader: bool) -> bool {
    !quorum && names_leader
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log as a list of batches (first, last, term), for tests.
    struct TestLog {
        term: Term,
        batches: Vec<BatchMeta>,
        commit: Seqno,
        snapshot: Option<TermSeqno>,
    }

    impl LogView for TestLog {
        fn term(&self) -> Term {
            self.term
        }
        fn last(&self) -> TermSeqno {
            self.batches
                .last()
                .map(|b| TermSeqno { term: b.term, seqno: b.last })
                .or(self.snapshot)
                .unwrap_or_default()
        }
        fn locate(&self, seqno: Seqno) -> Located {
            for batch in &self.batches {
                if batch.first <= seqno && seqno <= batch.last {
                    return Located::In { term: batch.term, first: batch.first, last: batch.last };
                }
            }
            match self.batches.first() {
                Some(first) if seqno < first.first => Located::Purged,
                None if self.snapshot.is_some_and(|s| seqno <= s.seqno) => Located::Purged,
                _ => Located::Beyond,
            }
        }
        fn snapshot_position(&self) -> Option<TermSeqno> {
            self.snapshot
        }
        fn commit(&self) -> Seqno {
            self.commit
        }
    }

    fn b(first: u64, last: u64, term: u64) -> BatchMeta {
        BatchMeta { first: Seqno(first), last: Seqno(last), term: Term(term) }
    }

    fn pos(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    fn log(term: u64, batches: Vec<BatchMeta>, commit: u64) -> TestLog {
        TestLog { term: Term(term), batches, commit: Seqno(commit), snapshot: None }
    }

    fn ship(term: u64, prev: TermSeqno, batches: Vec<BatchMeta>, commit: u64) -> ShipMeta {
        ShipMeta { term: Term(term), prev, batches, commit: Seqno(commit) }
    }

    #[test]
    fn terms_fence_and_wait() {
        let l = log(2, vec![b(1, 10, 1)], 10);
        assert_eq!(
            decide_ship(&l, &ship(1, pos(1, 10), vec![], 10), true),
            Verdict::Fenced { term: Term(2) }
        );
        assert_eq!(
            decide_ship(&l, &ship(3, pos(1, 10), vec![], 10), true),
            Verdict::NotYet { term: Term(2) }
        );
    }

    #[test]
    fn appends_contiguous_batches_and_advances_commit_to_matched() {
        let l = log(1, vec![b(1, 10, 1)], 5);
        let verdict = decide_ship(&l, &ship(1, pos(1, 10), vec![b(11, 15, 1), b(16, 16, 1)], 20), true);
        assert_eq!(
            verdict,
            Verdict::Accept {
                steps: vec![Step::Append(0), Step::Append(1)],
                matched: pos(1, 16),
                commit_now: Seqno(10),
                commit: Seqno(16)
            }
        );
    }

    #[test]
    fn empty_ship_is_a_heartbeat_carrying_commit() {
        let l = log(1, vec![b(1, 10, 1)], 5);
        let verdict = decide_ship(&l, &ship(1, pos(1, 10), vec![], 9), true);
        assert_eq!(
            verdict,
            Verdict::Accept { steps: vec![], matched: pos(1, 10), commit_now: Seqno(9), commit: Seqno(9) }
        );
    }

    #[test]
    fn commit_never_decreases() {
        let l = log(1, vec![b(1, 10, 1)], 8);
        let verdict = decide_ship(&l, &ship(1, pos(1, 10), vec![], 3), true);
        assert!(matches!(verdict, Verdict::Accept { commit: Seqno(8), .. }));
    }

    #[test]
    fn gap_and_divergence_at_prev() {
        let l = log(2, vec![b(1, 10, 1)], 10);
        assert_eq!(
            decide_ship(&l, &ship(2, pos(1, 12), vec![b(13, 13, 2)], 0), true),
            Verdict::Gap { last: pos(1, 10) }
        );
        let l = log(2, vec![b(1, 10, 1), b(11, 12, 1)], 10);
        assert_eq!(decide_ship(&l, &ship(2, pos(2, 12), vec![b(13, 13, 2)], 0), true), Verdict::Diverged);
    }

    #[test]
    fn held_batches_are_skipped_and_a_conflicting_suffix_is_quarantined() {
        // The worked history "a cut-off leader": n1 holds 101..105 of t1 beyond the committed 100.
        let l = log(2, vec![b(1, 100, 1), b(101, 103, 1), b(104, 105, 1)], 100);
        let verdict = decide_ship(&l, &ship(2, pos(1, 100), vec![b(101, 101, 2), b(102, 110, 2)], 101), true);
        assert_eq!(
            verdict,
            Verdict::Accept {
                steps: vec![Step::QuarantineFrom(Seqno(101)), Step::Append(0), Step::Append(1)],
                matched: pos(2, 110),
                commit_now: Seqno(100),
                commit: Seqno(101)
            }
        );
        let l = log(1, vec![b(1, 100, 1), b(101, 103, 1)], 100);
        let verdict = decide_ship(&l, &ship(1, pos(1, 100), vec![b(101, 103, 1), b(104, 104, 1)], 104), true);
        assert_eq!(
            verdict,
            Verdict::Accept {
                steps: vec![Step::Skip(0), Step::Append(1)],
                matched: pos(1, 104),
                commit_now: Seqno(100),
                commit: Seqno(104)
            }
        );
    }

    #[test]
    fn quarantine_of_committed_data_halts_in_both_modes_and_uncommitted_is_quarantined() {
        // Committed (and maybe applied) data would be cut: quorum mode, a protocol bug; leader mode,
        // lost acknowledged writes that need a snapshot (decisions/006). Nothing is written.
        let l = log(2, vec![b(1, 100, 1), b(101, 105, 1)], 105);
        let s = ship(2, pos(1, 100), vec![b(101, 101, 2)], 101);
        for quorum in [true, false] {
            let verdict = decide_ship(&l, &s, quorum);
            let cause = HaltCause::ReplacesCommitted { at: Seqno(101) };
            assert!(matches!(verdict, Verdict::Halt { cause: c, .. } if c == cause), "{verdict:?}");
        }
        // The same tail, uncommitted: quarantined and replaced in both modes.
        let l = log(2, vec![b(1, 100, 1), b(101, 105, 1)], 100);
        for quorum in [true, false] {
            let verdict = decide_ship(&l, &s, quorum);
            let Verdict::Accept { steps, commit, .. } = verdict else { panic!("{verdict:?}") };
            assert_eq!(steps, vec![Step::QuarantineFrom(Seqno(101)), Step::Append(0)]);
            assert!(commit <= Seqno(101), "commit never passes what we hold");
        }
    }

    #[test]
    fn a_batch_starting_inside_ours_refuses_the_whole_message() {
        let l = log(1, vec![b(1, 10, 1), b(11, 20, 1)], 0);
        let verdict = decide_ship(&l, &ship(1, pos(1, 10), vec![b(11, 15, 1)], 0), true);
        let two_logs = matches!(verdict, Verdict::Halt { cause: HaltCause::OneTermTwoLogs, .. });
        assert!(two_logs, "same term, different boundaries: {verdict:?}");
        // Whoever sends it: two logs in one term is never a mere refusal.
        let verdict = append_only(decide_ship(&l, &ship(1, pos(1, 10), vec![b(11, 15, 1)], 0), true));
        assert!(matches!(verdict, Verdict::Halt { cause: HaltCause::OneTermTwoLogs, .. }), "{verdict:?}");
        let l = log(2, vec![b(1, 10, 1), b(11, 20, 1)], 0);
        let verdict = decide_ship(&l, &ship(2, pos(1, 5), vec![b(6, 15, 2)], 0), true);
        assert!(matches!(verdict, Verdict::Refuse { .. }), "{verdict:?}");
    }

    #[test]
    fn malformed_messages_are_refused() {
        let l = log(1, vec![b(1, 10, 1)], 0);
        for batches in
            [vec![b(12, 12, 1)], vec![b(11, 12, 1), b(12, 13, 1)], vec![b(11, 12, 2)], vec![b(11, 10, 1)]]
        {
            let verdict = decide_ship(&l, &ship(1, pos(1, 10), batches.clone(), 0), true);
            assert!(matches!(verdict, Verdict::Refuse { .. }), "{batches:?}: {verdict:?}");
        }
    }

    #[test]
    fn a_snapshot_position_counts_as_held() {
        let l = TestLog { term: Term(3), batches: vec![], commit: Seqno(50), snapshot: Some(pos(2, 50)) };
        let verdict = decide_ship(&l, &ship(3, pos(2, 50), vec![b(51, 51, 3)], 51), true);
        assert!(matches!(verdict, Verdict::Accept { .. }), "{verdict:?}");
    }

    #[test]
    fn a_chunk_from_a_node_not_in_office_never_replaces_our_batches() {
        // Ours: 1..=9 of term 2, then the term-3 leader's LeaderStart at 10. A follower still holding
        // an uncommitted 10 of term 2 serves it in a chunk of term 3.
        let l = log(3, vec![b(1, 9, 2), b(10, 10, 3)], 9);
        let stale = ship(3, pos(2, 9), vec![b(10, 10, 2), b(11, 11, 2)], 9);
        let verdict = decide_ship(&l, &stale, true);
        assert!(
            matches!(&verdict, Verdict::Accept { steps, .. } if steps.contains(&Step::QuarantineFrom(Seqno(10)))),
            "the leader's own rules replace it: {verdict:?}"
        );
        assert!(matches!(append_only(verdict), Verdict::Refuse { .. }));
        // Appending past our log, or skipping what we hold, is still fine.
        let l = log(3, vec![b(1, 5, 2), b(6, 9, 2)], 5);
        let verdict = append_only(decide_ship(&l, &ship(3, pos(2, 9), vec![b(10, 10, 2)], 9), true));
        assert!(matches!(verdict, Verdict::Accept { .. }), "{verdict:?}");
        let verdict = append_only(decide_ship(&l, &ship(3, pos(2, 5), vec![b(6, 9, 2)], 9), true));
        assert!(matches!(verdict, Verdict::Accept { .. }), "{verdict:?}");
        // Refusals pass through unchanged.
        let verdict = append_only(decide_ship(&l, &ship(2, pos(2, 9), vec![], 9), true));
        assert!(matches!(verdict, Verdict::Fenced { .. }), "{verdict:?}");
    }

    #[test]
    fn a_chunk_from_a_node_not_in_office_that_conflicts_below_our_commit_is_refused_not_a_halt() {
        // The model check's history (issue 37): we committed 1 of term 2 and 2 of term 3 (the new
        // leader's log); a chunk served by that leader before it adopted term 2's log (while it was
        // taking office) brings 1 of term 1.
        let l = log(3, vec![b(1, 1, 2), b(2, 2, 3)], 2);
        let stale = ship(3, pos(0, 0), vec![b(1, 1, 1)], 0);
        for quorum in [true, false] {
            let verdict = decide_ship(&l, &stale, quorum);
            assert_eq!(replaced_from(&verdict), Some(Seqno(1)), "{verdict:?}");
            assert!(matches!(verdict, Verdict::Halt { .. }), "from the leader it halts: {verdict:?}");
            let verdict = append_only(verdict);
            assert!(matches!(verdict, Verdict::Refuse { .. }), "from a node not in office: {verdict:?}");
        }
    }

    #[test]
    fn only_a_leader_mode_halt_on_the_leaders_message_repairs_itself() {
        assert!(repairs_a_halt(false, true), "leader mode, from the node in office: install its snapshot");
        assert!(!repairs_a_halt(false, false), "leader mode, from a node not in office: proves nothing");
        assert!(!repairs_a_halt(true, true), "quorum mode: a protocol violation stays for a person");
        assert!(!repairs_a_halt(true, false));
    }

    #[test]
    fn only_the_leaders_messages_and_the_adopted_log_may_replace() {
        let (n1, n2) = (NodeId(1), NodeId(2));
        assert_eq!(authority(Origin::Live, n1), Authority { replaces: true, names_leader: true });
        let in_office = authority(Origin::Pull { source: n1 }, n1);
        assert_eq!(in_office, Authority { replaces: true, names_leader: true });
        let stale_hint = authority(Origin::Pull { source: n1 }, n2);
        assert_eq!(stale_hint, Authority { replaces: false, names_leader: false });
        assert_eq!(authority(Origin::Adopting, n2), Authority { replaces: true, names_leader: false });
    }
}
