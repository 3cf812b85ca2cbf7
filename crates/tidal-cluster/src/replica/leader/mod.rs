//! The leader's side: one ShipQueue per follower (`ship_queue`), what the leader knows of each
//! follower (matched, durable, applied, last answer), and the operator's `heal`.

mod ship_queue;

use super::Replica;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tidal_net::{Ship, ShipAnswer, ShipOutcome};
use tidal_protocol::{next_after, Reply};
use tidal_types::{NodeId, Seqno, TermSeqno};
// tokio's clock: simulated time under turmoil.
use tokio::time::Instant;

impl Leading {
    fn notice_sent(&self) {
        self.notices_sent.fetch_add(1, Ordering::Relaxed);
    }

    fn notice_failed(&self) {
        self.notices_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Commit notices sent and failed.
    pub(super) fn notice_counts(&self) -> (u64, u64) {
        (self.notices_sent.load(Ordering::Relaxed), self.notices_failed.load(Ordering::Relaxed))
    }
}

/// The leader side's state.
#[derive(Default)]
pub(super) struct Leading {
    /// What this leader knows of each follower.
    progress: Mutex<BTreeMap<NodeId, FollowerProgress>>,
    /// Followers whose queue an operator asked to heal.
    heal_requests: Mutex<BTreeSet<NodeId>>,
    /// Commit notices sent, and failed ([`super::NoticeStats`]).
    notices_sent: AtomicU64,
    notices_failed: AtomicU64,
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

/// What `heal` did (or, with `dry_run`, would do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealReport {
    /// The follower.
    pub node: NodeId,
    /// Its last matched position in this term.
    pub matched: TermSeqno,
    /// Its last reported applied seqno.
    pub applied: Seqno,
    /// What the leader does.
    pub action: String,
}

impl Replica {
    /// Operator `heal`: the leader resets `node`'s ShipQueue to that follower's last matched position
    /// and nudges it to pull (no redelivery scan, no per-item traffic). Only the leader heals.
    pub fn heal(&self, node: NodeId, dry_run: bool) -> Result<HealReport> {
        self.serving_term()?;
        if node == self.me || self.peer(node).is_none() {
            return Err(Error::Invalid(format!("node {node} is not a follower of this leader")));
        }
        let progress = self.progress().get(&node).cloned().unwrap_or_default();
        let verb = if dry_run { "would reset" } else { "reset" };
        let report = HealReport {
            node,
            matched: progress.matched,
            applied: progress.applied,
            action: format!(
                "{verb} the ShipQueue to {} and nudge the follower to pull from there",
                progress.matched
            ),
        };
        if !dry_run {
            self.leading.heal_requests.lock().expect("heal lock is never held across a panic").insert(node);
        }
        Ok(report)
    }

    fn set_pulling(&self, follower: NodeId, pulling: bool) {
        self.leading
            .progress
            .lock()
            .expect("progress lock is never held across a panic")
            .entry(follower)
            .or_default()
            .pulling = pulling;
    }

    /// Handles a follower's answer; returns the position to ship after next and the reply as the
    /// decision core saw it.
    fn on_answer(
        &self,
        follower: NodeId,
        ship: &Ship,
        answer: ShipAnswer,
        after: TermSeqno,
    ) -> (TermSeqno, Reply) {
        {
            let mut progress =
                self.leading.progress.lock().expect("progress lock is never held across a panic");
            let entry = progress.entry(follower).or_default();
            entry.durable = answer.durable;
            entry.applied = answer.applied;
            entry.last_ack = Some(Instant::now());
            if let ShipOutcome::Matched(matched) = answer.outcome {
                entry.matched = matched;
                entry.pulling = false;
            }
        }
        if let ShipOutcome::Matched(matched) = answer.outcome {
            // A follower that installed one of our snapshots and has caught up on the log no longer
            // needs the purge horizon pinned.
            self.snapshots.pins().follower_matched(follower, matched.seqno);
        }
        let reply = match answer.outcome {
            ShipOutcome::Matched(matched) => {
                self.commit.record_matched(follower, answer.term, matched);
                Reply::Matched(matched)
            }
            ShipOutcome::Gap(last) => Reply::Gap(last),
            ShipOutcome::Fenced => {
                // An election this leader lost: expected (a partition, a transfer), not for a person.
                tracing::warn!(%follower, term = %answer.term, "a follower has a higher term; this leader must step down");
                Reply::Unchanged
            }
            ShipOutcome::NotYet => Reply::Unchanged,
            ShipOutcome::Diverged(history) => Reply::Diverged { history, durable: answer.durable },
            ShipOutcome::Refused(reason) => {
                tracing::warn!(%follower, "follower refused a ship: {reason}");
                Reply::Unchanged
            }
        };
        let next = next_after(&reply, after, &self.leader_view(), &self.wal.term_history());
        if matches!(reply, Reply::Diverged { .. }) {
            // The follower quarantines its batches after the divergence point when they come.
            tracing::warn!(%follower, prev = %ship.prev, from = %next, "follower diverged; resending from the divergence point");
        }
        (next, reply)
    }
}

impl Replica {
    /// Per-follower progress (leader).
    pub fn progress(&self) -> BTreeMap<NodeId, FollowerProgress> {
        self.leading.progress.lock().expect("progress lock is never held across a panic").clone()
    }

    /// What the ship tail holds: (batches, bytes). A leader ships from it; every member keeps it
    /// (its WAL's hook feeds it), bounded by the node's `ship_tail_*` settings.
    pub fn ship_tail_held(&self) -> (usize, usize) {
        self.feed.held()
    }
}

impl Replica {
    /// Forgets the progress of followers that are no longer members.
    pub(super) fn forget_progress_except(&self, members: &super::Members) {
        self.leading
            .progress
            .lock()
            .expect("progress lock is never held across a panic")
            .retain(|id, _| members.nodes.contains_key(id));
    }
}
