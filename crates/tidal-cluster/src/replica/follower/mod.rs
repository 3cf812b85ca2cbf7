//! The follower's side: the receiver (`receiver`: every live ship and pulled chunk goes through
//! one decision), the puller (`puller`: catch-up from another node's segments) and what this node
//! knows of its leader (commit notices, when it was last heard, a halt).

mod puller;
mod receiver;

use super::Replica;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tidal_types::{NodeId, Seqno, Term};
// tokio's clock: simulated time under turmoil.
use tokio::time::Instant;

/// The follower side's state.
#[derive(Default)]
pub(super) struct Following {
    /// When the leader was last heard (a ship or heartbeat in our term).
    last_heard: Mutex<Option<Instant>>,
    /// Why the receiver halted, if it did.
    halted: Mutex<Option<String>>,
    /// The leader's commit notices and how far our log is known to match its log.
    leader_commit: Mutex<LeaderCommit>,
    /// A pull runs (single flight).
    pulling: AtomicBool,
    /// When the last pull started (rate limit for gap-started pulls).
    last_pull: Mutex<Option<Instant>>,
    pulls: Mutex<PullStats>,
    /// Commit notices received in our term, and those that moved our commit frontier.
    notices_received: AtomicU64,
    notices_advanced: AtomicU64,
}

/// This node's pulls (follower side: catch-up from another node's log), for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct PullStats {
    /// Pulls that ended (the stream ran out, or the source's log diverged or was purged).
    pub pulls: u64,
    /// Batches they appended to this node's WAL.
    pub batches: u64,
    /// Encoded bytes of those batches.
    pub bytes: u64,
    /// Wall time of those pulls, from the request to the last chunk durable here.
    pub seconds: f64,
}

/// Commit notices (decisions/016), for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoticeStats {
    /// Leader: notices sent (quiet ones queued on their stream; older peers' answered).
    pub sent: u64,
    /// Leader: notices that failed (a full quiet stream; for older peers no answer within the
    /// deadline, transport error).
    pub failed: u64,
    /// Follower: notices received in our term.
    pub received: u64,
    /// Follower: times a notice moved our commit frontier past what the ships alone gave.
    pub advanced: u64,
}

/// Follower: what the leader of `term` told us in commit notices (`notified`), and the last position
/// of a live ship of `term` we accepted and fsynced (`matched`). Everything up to `matched` is the
/// leader's log (log matching), so `min(notified, matched)` is committed AND held durably here: the
/// frontier a notice lets us apply without waiting for the next ship (decisions/016).
///
/// Delicate: only live ships count for `matched` (a pulled chunk may come from a follower whose log
/// still holds an uncommitted suffix of an older term); a snapshot install forgets it (the log is
/// replaced); it only moves to a higher term, never back.
#[derive(Clone, Copy, Debug, Default)]
struct LeaderCommit {
    term: Term,
    notified: Seqno,
    matched: Seqno,
}

impl LeaderCommit {
    /// The state for `term`: reset when `term` is newer; `None` when it is older.
    fn in_term(&mut self, term: Term) -> Option<&mut LeaderCommit> {
        if term > self.term {
            *self = LeaderCommit { term, ..LeaderCommit::default() };
        }
        (term == self.term).then_some(self)
    }

    fn frontier(&self) -> Seqno {
        self.notified.min(self.matched)
    }
}

impl Replica {
    /// A commit notice from the leader of `term`: apply what we hold of its log up to `commit`.
    /// Returns our term. Takes no term lock (a ship's fsync may hold it: that is when notices come).
    pub fn notice_commit(&self, term: Term, leader: NodeId, commit: Seqno) -> Term {
        let ours = self.gate.term();
        if let Err((class, reason)) = self.check_sender(leader, term, ours) {
            tracing::debug!(%leader, %term, "ignored a commit notice: {reason}");
            self.count_refusal(class);
            return ours;
        }
        if term == ours {
            let frontier = self.note_leader(term, |state| state.notified = state.notified.max(commit));
            self.following.notices_received.fetch_add(1, Ordering::Relaxed);
            if let Some(frontier) = frontier {
                if frontier > self.commit.commit() {
                    self.notice_advanced();
                }
                self.commit.advance(frontier);
            }
        }
        ours
    }

    fn notice_advanced(&self) {
        self.following.notices_advanced.fetch_add(1, Ordering::Relaxed);
    }

    /// Commit-notice counters.
    pub fn notice_stats(&self) -> NoticeStats {
        let (sent, failed) = self.leading.notice_counts();
        NoticeStats {
            sent,
            failed,
            received: self.following.notices_received.load(Ordering::Relaxed),
            advanced: self.following.notices_advanced.load(Ordering::Relaxed),
        }
    }

    /// Updates what we know of the leader of `term` and returns the frontier it allows now (`None`
    /// for an older term than the one recorded).
    fn note_leader(&self, term: Term, update: impl FnOnce(&mut LeaderCommit)) -> Option<Seqno> {
        let mut state =
            self.following.leader_commit.lock().expect("leader-commit lock is never held across a panic");
        state.in_term(term).map(|state| {
            update(state);
            state.frontier()
        })
    }

    /// Our log from `cut` on is about to be quarantined: what we matched of the leader of `term`
    /// ends before it.
    fn forget_leader_match_from(&self, term: Term, cut: Seqno) {
        let mut state =
            self.following.leader_commit.lock().expect("leader-commit lock is never held across a panic");
        if state.term == term {
            state.matched = state.matched.min(Seqno(cut.get().saturating_sub(1)));
        }
    }

    /// Forgets how far our log matches the leader's (our log was replaced by a snapshot).
    pub(super) fn forget_leader_match(&self) {
        self.following
            .leader_commit
            .lock()
            .expect("leader-commit lock is never held across a panic")
            .matched = Seqno::ZERO;
    }
}

impl Replica {
    /// How long since this follower last heard its leader (None: never, or this node leads).
    pub fn leader_silence(&self) -> Option<Duration> {
        self.following
            .last_heard
            .lock()
            .expect("heard lock is never held across a panic")
            .map(|at| at.elapsed())
    }

    /// This node's pulls that ended, for metrics.
    pub fn pull_stats(&self) -> PullStats {
        *self.following.pulls.lock().expect("pull stats lock is never held across a panic")
    }

    /// Why the receiver halted, if it did (a protocol violation: the node must be looked at).
    pub fn halted(&self) -> Option<String> {
        self.following.halted.lock().expect("halt lock is never held across a panic").clone()
    }
}

impl Replica {
    /// Records why the receiver halted.
    fn halt(&self, reason: String) {
        *self.following.halted.lock().expect("halt lock is never held across a panic") = Some(reason);
    }

    /// A snapshot install replaced the state a halt was about: the halt is healed.
    pub(super) fn clear_halt(&self) {
        *self.following.halted.lock().expect("halt lock is never held across a panic") = None;
    }
}

#[cfg(test)]
mod tests {
    use super::LeaderCommit;
    use tidal_types::{Seqno, Term};

    #[test]
    fn a_notice_commits_only_what_a_live_ship_of_its_term_matched() {
        let mut state = LeaderCommit::default();
        // A notice ahead of what we hold durably: nothing beyond matched.
        let s = state.in_term(Term(2)).expect("newer term");
        s.notified = Seqno(10);
        assert_eq!(s.frontier(), Seqno::ZERO);
        // The in-flight ship's fsync is done: matched 12, the notice covers 10.
        s.matched = Seqno(12);
        assert_eq!(s.frontier(), Seqno(10));
        s.notified = Seqno(15);
        assert_eq!(s.frontier(), Seqno(12));
        // An older term's notice or match is ignored; a newer term forgets everything.
        assert!(state.in_term(Term(1)).is_none());
        assert_eq!(state.in_term(Term(3)).expect("newer term").frontier(), Seqno::ZERO);
        assert_eq!(state.term, Term(3));
    }
}
