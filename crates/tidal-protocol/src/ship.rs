//! The leader's ShipQueue (PROTOCOL.md, "Shipping"): after which position it ships next.
//!
//! A ship carries `prev`, the position right before its first batch, and the follower accepts it
//! only if its own log holds `prev` with the same term. That check proves log matching only if the
//! LEADER's log holds `prev` too: a `prev` taken from the follower and never compared with the
//! leader's log always passes it, whatever batches follow (decisions/057). So every `prev` this
//! module hands back is a position of the leader's log, and the runtime checks it again before each
//! ship ([`crate::ship_feed::ShipFeed::holds`], `Wal::holds`).
//!
//! The model check (tidal-model) drives [`next_after`] with the answers its followers give, as the
//! runtime does with the answers that come back over the network.

use super::follower::{Located, LogView};
use super::office::divergence_point;
use std::time::Duration;
use tidal_types::{Seqno, Term, TermSeqno};

/// A follower's answer to a ship, as far as the queue's next position is concerned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// It holds our log through this position (a `prev` or batch end we sent).
    Matched(TermSeqno),
    /// It lacks `prev`; its last durable position (which our log may or may not hold).
    Gap(TermSeqno),
    /// It holds `prev.seqno` with another term; its term history and durable frontier.
    Diverged {
        /// Its term history `[(term, first seqno)]`.
        history: Vec<TermSeqno>,
        /// Its durable frontier.
        durable: Seqno,
    },
    /// Fenced, not yet in our term, or refused: ship from the same position again (later).
    Unchanged,
}

/// The position to ship after next, given a follower's reply to a ship sent after `after`. `ours`
/// is the leader's durable log and `our_history` its term history. Always a position `ours` holds
/// (or `after` itself for [`Reply::Unchanged`], or a `Matched` position, both of which came from
/// our own ships).
pub fn next_after(
    reply: &Reply,
    after: TermSeqno,
    ours: &impl LogView,
    our_history: &[TermSeqno],
) -> TermSeqno {
    match reply {
        Reply::Matched(matched) => *matched,
        Reply::Gap(follower_last) => resume_after_gap(*follower_last, ours),
        Reply::Diverged { history, durable } => {
            let follower_last =
                TermSeqno { term: history.last().map_or(Term(0), |e| e.term), seqno: *durable };
            divergence_point(our_history, ours.last(), history, follower_last)
        }
        Reply::Unchanged => after,
    }
}

/// Whether the queue waits (with backoff) before its next ship: a reply that moved nothing (not
/// yet in our term, fenced, refused, halted) would come back the same if the ship went out again at
/// once. Progress and a new position to ship from (matched, gap, diverged) go on at once.
pub fn waits_before_next(reply: &Reply) -> bool {
    matches!(reply, Reply::Unchanged)
}

/// Where to ship from after a follower reported `follower_last` as its last position: that very
/// position if our log holds it, else the last batch boundary of OUR log at or below it. From a
/// position the follower holds with the same term it takes our batches (replacing any divergent
/// suffix of its own); from one it holds with another term it answers `Diverged` and we move to the
/// divergence point; from one it lacks it answers `Gap` again, lower, or pulls.
pub fn resume_after_gap(follower_last: TermSeqno, ours: &impl LogView) -> TermSeqno {
    boundary_at_or_below(follower_last.seqno.min(ours.last().seqno), ours)
}

/// The last position of our log at or below `seqno` that ends a batch (with its term), the purge
/// point if `seqno` is purged, `(0, 0)` for seqno 0.
pub fn boundary_at_or_below(seqno: Seqno, ours: &impl LogView) -> TermSeqno {
    if seqno == Seqno::ZERO {
        return TermSeqno::default();
    }
    match ours.locate(seqno) {
        Located::In { term, last, .. } if last == seqno => TermSeqno { term, seqno },
        Located::In { first, .. } => match ours.locate(Seqno(first.get() - 1)) {
            Located::In { term, last, .. } => TermSeqno { term, seqno: last },
            Located::Purged | Located::Beyond => ours.snapshot_position().unwrap_or_default(),
        },
        Located::Purged => ours.snapshot_position().unwrap_or_default(),
        Located::Beyond => ours.last(),
    }
}

/// Where a read of a tail after a position starts ([`tail_start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailStart {
    /// The tail holds the position, term included: ship its batches after it (none if it is the
    /// tail's last position).
    After,
    /// The position is below the tail's base: what follows it has fallen off the front.
    Rotated {
        /// First seqno the tail still holds.
        tail_first: Seqno,
    },
    /// Not a position of the tail: its base or last seqno with another term, past its end, or not
    /// the end of one of its batches with the same term.
    Unknown,
}

/// [`ShipFeed::read_after`]'s rule as a pure function of the tail: `base` is the position right
/// before its front batch, `last` its last position (`base` when empty), and `batch_ending_at(s)`
/// the term of the tail's batch whose last seqno is `s` (asked only for `base < s < last`). A
/// ship may carry `after` as its `prev` only when this answers [`TailStart::After`]: the tail then
/// holds `after` with its term, so the follower's prev check compares its log with ours
/// (decisions/057). The model check (tidal-model) drives this function with its leaders' tails.
pub fn tail_start(
    after: TermSeqno,
    base: TermSeqno,
    last: TermSeqno,
    batch_ending_at: impl Fn(Seqno) -> Option<Term>,
) -> TailStart {
    if after == last || after == base {
        return TailStart::After;
    }
    if after.seqno < base.seqno {
        return TailStart::Rotated { tail_first: base.seqno.next() };
    }
    if after.seqno == base.seqno || after.seqno >= last.seqno {
        // The base or the end with another term, or past our end: not our log.
        return TailStart::Unknown;
    }
    // Strictly inside the tail (base < after < last).
    if batch_ending_at(after.seqno) == Some(after.term) {
        TailStart::After
    } else {
        TailStart::Unknown
    }
}

/// What a ShipQueue's tail read found after its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// The tail holds what follows the position: this many batches to send (0: nothing new).
    Batches(usize),
    /// The tail no longer holds the position (rotated past it, or never held it): the follower must
    /// pull from the segments.
    Unservable,
}

/// What a ShipQueue knows when it chooses its next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueView {
    /// What its tail read found.
    pub tail: Tail,
    /// No message went to the follower for a heartbeat interval.
    pub heartbeat_due: bool,
    /// The commit frontier moved past what the follower was last sent.
    pub commit_moved: bool,
    /// A quiet commit notice was just tried and could not be queued.
    pub notice_failed: bool,
    /// Our log holds the position the next ship would name as its `prev` (decisions/057).
    pub prev_held: bool,
}

/// A ShipQueue's next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueStep {
    /// Nudge the follower to pull, then go on from our own end (its answers tell where it is).
    NudgePull,
    /// Only the commit frontier moved: send it as a quiet notice, with no ship to answer
    /// (decisions/027).
    Notice,
    /// Nothing is due: wait for new batches, a commit, the stop signal or the heartbeat interval.
    Wait,
    /// The `prev` is not in our log (a bug upstream, counted): resume from our own log, send nothing.
    Resume,
    /// Send a ship: the batches read, the commit frontier, or an empty heartbeat.
    Ship,
}

/// The ShipQueue's next step. A ship is due when it carries batches, a commit the follower lacks
/// or a heartbeat; a commit alone goes as a notice unless that just failed; a ship never leaves
/// with a `prev` this node does not hold.
pub fn next_ship_step(view: &QueueView) -> QueueStep {
    let batches = match view.tail {
        Tail::Unservable => return QueueStep::NudgePull,
        Tail::Batches(count) => count,
    };
    if batches == 0 && !view.heartbeat_due && view.commit_moved && !view.notice_failed {
        return QueueStep::Notice;
    }
    if batches == 0 && !view.commit_moved && !view.heartbeat_due {
        return QueueStep::Wait;
    }
    if !view.prev_held {
        return QueueStep::Resume;
    }
    QueueStep::Ship
}

/// The wait before the next ship after one that `waited` (the follower was not in our term,
/// fenced, refused or halted, or the call failed): doubled up to `max`; back to `min` after one that
/// moved something, so the next ship leaves at once.
pub fn next_backoff(current: Duration, waited: bool, min: Duration, max: Duration) -> Duration {
    if waited {
        (current * 2).clamp(min, max)
    } else {
        min
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader's log as batches `(first, last, term)`, optionally after a purge point.
    struct Log {
        batches: Vec<(u64, u64, u64)>,
        purged: TermSeqno,
    }

    impl LogView for Log {
        fn term(&self) -> Term {
            self.last().term
        }
        fn last(&self) -> TermSeqno {
            self.batches.last().map_or(self.purged, |b| at(b.2, b.1))
        }
        fn locate(&self, seqno: Seqno) -> Located {
            if seqno <= self.purged.seqno {
                return Located::Purged;
            }
            self.batches.iter().find(|b| b.0 <= seqno.get() && seqno.get() <= b.1).map_or(
                Located::Beyond,
                |b| Located::In { term: Term(b.2), first: Seqno(b.0), last: Seqno(b.1) },
            )
        }
        fn snapshot_position(&self) -> Option<TermSeqno> {
            (self.purged.seqno > Seqno::ZERO).then_some(self.purged)
        }
        fn commit(&self) -> Seqno {
            Seqno::ZERO
        }
    }

    fn at(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    fn history(log: &Log) -> Vec<TermSeqno> {
        let mut out: Vec<TermSeqno> = Vec::new();
        for b in &log.batches {
            if out.last().is_none_or(|e| e.term != Term(b.2)) {
                out.push(at(b.2, b.0));
            }
        }
        out
    }

    /// Finding 1's history: the follower kept W at (1,101) that no other node holds; our log has
    /// (2,101) there. At a57b07b its Gap answer became the next `prev` as it was.
    #[test]
    fn a_gap_answer_resumes_from_our_log_not_the_followers() {
        let ours = Log { batches: vec![(1, 100, 1), (101, 101, 2), (102, 102, 3)], purged: at(0, 0) };
        let next = next_after(&Reply::Gap(at(1, 101)), at(3, 102), &ours, &history(&ours));
        assert_eq!(next, at(2, 101), "our own term at the follower's seqno, never (1,101)");
        assert_eq!(next_after(&Reply::Gap(at(1, 100)), at(3, 102), &ours, &history(&ours)), at(1, 100));
    }

    #[test]
    fn a_gap_inside_one_of_our_batches_resumes_at_the_batch_before_it() {
        let ours = Log { batches: vec![(1, 4, 1), (5, 9, 2)], purged: at(0, 0) };
        assert_eq!(resume_after_gap(at(1, 7), &ours), at(1, 4));
        assert_eq!(resume_after_gap(at(1, 3), &ours), at(0, 0));
        assert_eq!(resume_after_gap(at(5, 50), &ours), at(2, 9), "past our end: our last");
        let purged = Log { batches: vec![(11, 12, 2)], purged: at(1, 10) };
        assert_eq!(resume_after_gap(at(1, 4), &purged), at(1, 10), "below the purge point: the point");
        assert_eq!(resume_after_gap(at(2, 11), &purged), at(1, 10));
    }

    #[test]
    fn diverged_moves_to_the_divergence_point_and_others_stay() {
        let ours = Log { batches: vec![(1, 4, 1), (5, 9, 3)], purged: at(0, 0) };
        let reply = Reply::Diverged { history: vec![at(1, 1), at(2, 6)], durable: Seqno(8) };
        assert_eq!(next_after(&reply, at(3, 9), &ours, &history(&ours)), at(1, 4));
        assert_eq!(next_after(&Reply::Unchanged, at(3, 9), &ours, &history(&ours)), at(3, 9));
        assert_eq!(next_after(&Reply::Matched(at(3, 9)), at(1, 4), &ours, &history(&ours)), at(3, 9));
    }

    /// Finding 8 of the safety review: a queue re-shipped at once after NotYet, Fenced and Refused
    /// (an answer reset its backoff), forever for a halted follower.
    #[test]
    fn only_a_reply_that_moves_something_ships_again_at_once() {
        assert!(waits_before_next(&Reply::Unchanged));
        assert!(!waits_before_next(&Reply::Matched(at(1, 1))));
        assert!(!waits_before_next(&Reply::Gap(at(1, 1))));
        assert!(!waits_before_next(&Reply::Diverged { history: vec![], durable: Seqno::ZERO }));
    }

    /// Every position `next_after` hands back for a Gap is one our log holds (exhaustive over small
    /// logs and follower positions).
    #[test]
    fn every_gap_resumption_is_a_position_of_our_log() {
        let logs = [
            Log { batches: vec![(1, 2, 1), (3, 3, 1), (4, 6, 2), (7, 7, 4)], purged: at(0, 0) },
            Log { batches: vec![(5, 6, 2), (7, 7, 4)], purged: at(1, 4) },
            Log { batches: vec![], purged: at(0, 0) },
        ];
        for ours in &logs {
            for term in 0..6 {
                for seqno in 0..10 {
                    let p = resume_after_gap(at(term, seqno), ours);
                    let held = p == at(0, 0)
                        || Some(p) == ours.snapshot_position()
                        || matches!(ours.locate(p.seqno), Located::In { term, last, .. } if term == p.term && last == p.seqno);
                    assert!(held, "resume_after_gap({term},{seqno}) = {p} is not in our log");
                    assert!(
                        p.seqno <= Seqno(seqno) || Some(p) == ours.snapshot_position(),
                        "{p} above {seqno}"
                    );
                }
            }
        }
    }

    /// The pure rule on its own, as the model check drives it: a tail `[(2,3) (3,4)]` after a base
    /// `(1,2)`.
    #[test]
    fn tail_start_answers_after_only_for_positions_of_the_tail() {
        let (base, last) = (at(1, 2), at(3, 4));
        let ends = |seqno: Seqno| match seqno.get() {
            3 => Some(Term(2)),
            4 => Some(Term(3)),
            _ => None,
        };
        for held in [at(1, 2), at(2, 3), at(3, 4)] {
            assert_eq!(tail_start(held, base, last, ends), TailStart::After, "{held}");
        }
        assert_eq!(tail_start(at(1, 1), base, last, ends), TailStart::Rotated { tail_first: Seqno(3) });
        assert_eq!(tail_start(at(0, 0), base, last, ends), TailStart::Rotated { tail_first: Seqno(3) });
        for other in [at(2, 2), at(1, 3), at(2, 4), at(3, 5), at(4, 9)] {
            assert_eq!(tail_start(other, base, last, ends), TailStart::Unknown, "{other}");
        }
        let empty = at(2, 7);
        assert_eq!(tail_start(empty, empty, empty, |_| None), TailStart::After);
        assert_eq!(tail_start(at(1, 7), empty, empty, |_| None), TailStart::Unknown, "finding 1: empty tail");
        assert_eq!(tail_start(at(2, 6), empty, empty, |_| None), TailStart::Rotated { tail_first: Seqno(8) });
    }

    fn view(tail: Tail) -> QueueView {
        QueueView { tail, heartbeat_due: false, commit_moved: false, notice_failed: false, prev_held: true }
    }

    #[test]
    fn a_queue_ships_batches_commits_and_heartbeats_and_otherwise_waits() {
        use super::{next_ship_step, QueueStep, Tail};
        assert_eq!(next_ship_step(&view(Tail::Batches(0))), QueueStep::Wait);
        assert_eq!(next_ship_step(&view(Tail::Batches(3))), QueueStep::Ship);
        let heartbeat = QueueView { heartbeat_due: true, ..view(Tail::Batches(0)) };
        assert_eq!(next_ship_step(&heartbeat), QueueStep::Ship);
        let commit = QueueView { commit_moved: true, ..view(Tail::Batches(0)) };
        assert_eq!(next_ship_step(&commit), QueueStep::Notice, "a commit alone goes as a notice");
        let failed = QueueView { notice_failed: true, ..commit };
        assert_eq!(next_ship_step(&failed), QueueStep::Ship, "a failed notice rides a ship");
        let with_batches = QueueView { commit_moved: true, ..view(Tail::Batches(2)) };
        assert_eq!(next_ship_step(&with_batches), QueueStep::Ship, "batches carry the commit");
        assert_eq!(next_ship_step(&view(Tail::Unservable)), QueueStep::NudgePull);
    }

    #[test]
    fn a_queue_never_ships_a_prev_it_does_not_hold() {
        use super::{next_ship_step, QueueStep, Tail};
        for tail in [Tail::Batches(0), Tail::Batches(5)] {
            for heartbeat_due in [false, true] {
                for commit_moved in [false, true] {
                    for notice_failed in [false, true] {
                        let view =
                            QueueView { tail, heartbeat_due, commit_moved, notice_failed, prev_held: false };
                        assert_ne!(next_ship_step(&view), QueueStep::Ship, "{view:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_backoff_doubles_while_ships_wait_and_resets_after_one_that_moved() {
        use super::next_backoff;
        use std::time::Duration;
        let (min, max) = (Duration::from_millis(20), Duration::from_secs(1));
        let mut backoff = min;
        for _ in 0..10 {
            backoff = next_backoff(backoff, true, min, max);
        }
        assert_eq!(backoff, max);
        assert_eq!(next_backoff(backoff, false, min, max), min);
        assert_eq!(next_backoff(min, true, min, max), Duration::from_millis(40));
    }
}
