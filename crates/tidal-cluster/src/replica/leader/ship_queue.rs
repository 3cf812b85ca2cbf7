//! One ShipQueue per follower: ships what the leader's log holds after the follower's position,
//! heartbeats when idle, commit notices when only the commit moved, and a nudge to pull when the
//! tail no longer holds what the follower needs. What to do next is
//! [`tidal_protocol::next_ship_step`]; this module waits, sends and reads the answers.

use super::super::{Replica, HEARTBEAT_INTERVAL, SHIP_BYTES_MAX};
use crate::refusal::Refusal;
use crate::ship_feed::TailRead;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tidal_net::{NetError, Peer, Ship, ShipAnswer};
use tidal_protocol::{
    next_backoff, next_ship_step, resume_after_gap, waits_before_next, QueueStep, QueueView, Tail,
};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tokio::sync::watch;
// tokio's clock: simulated time under turmoil.
use tokio::time::Instant;

/// How long a commit notice may take: it is only worth anything while its ship is in flight.
const NOTICE_TIMEOUT: Duration = Duration::from_millis(500);
/// Retry backoff bounds for a ShipQueue whose follower does not answer.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One follower's queue in one term: where it ships next, what commit the follower was last sent,
/// when it last heard from us, and its backoff. Its loop asks [`next_ship_step`] what to do and
/// does it; it ends when the office or the follower's membership ends.
pub(in crate::replica) struct ShipQueue {
    replica: Arc<Replica>,
    follower: NodeId,
    peer: Peer,
    term: Term,
    stop: watch::Receiver<bool>,
    /// The position the next ship names as its `prev` (always a position of our log).
    after: TermSeqno,
    sent_commit: Seqno,
    backoff: Duration,
    last_sent: Instant,
    /// Commits that advanced while a ship was in flight, for the notifier.
    notices: watch::Sender<Seqno>,
}

impl ShipQueue {
    /// The queue of `follower` for the office of `term`, with its commit notifier started.
    pub(in crate::replica) fn start(
        replica: Arc<Replica>,
        follower: NodeId,
        peer: Peer,
        term: Term,
        stop: watch::Receiver<bool>,
    ) -> ShipQueue {
        let (notices, notices_rx) = watch::channel(Seqno::ZERO);
        tokio::spawn(Replica::commit_notifier(
            Arc::downgrade(&replica),
            follower,
            peer.clone(),
            term,
            notices_rx,
        ));
        // Optimistic start at our own end; a follower that lacks it answers Gap with its last.
        let after = replica.feed.last();
        ShipQueue {
            replica,
            follower,
            peer,
            term,
            stop,
            after,
            sent_commit: Seqno::ZERO,
            backoff: BACKOFF_MIN,
            last_sent: Instant::now() - HEARTBEAT_INTERVAL,
            notices,
        }
    }

    /// Runs the queue until its office ends or its follower is no longer a member.
    pub(in crate::replica) async fn run(mut self) {
        let mut fed = self.replica.feed.subscribe();
        let mut commits = self.replica.commit.subscribe();
        while self.still_running() {
            self.heal_if_asked().await;
            let commit = self.replica.commit.commit();
            let (tail, batches) = match self.replica.feed.read_after(self.after, SHIP_BYTES_MAX) {
                TailRead::Batches(batches) => (Tail::Batches(batches.len()), batches),
                TailRead::Rotated { .. } | TailRead::Unknown => (Tail::Unservable, Vec::new()),
            };
            let mut view = QueueView {
                tail,
                heartbeat_due: self.last_sent.elapsed() >= HEARTBEAT_INTERVAL,
                commit_moved: commit != self.sent_commit,
                notice_failed: false,
                // Looked up (two locks) only for a step that would ship, below.
                prev_held: true,
            };
            let mut step = next_ship_step(&view);
            if step == QueueStep::Notice {
                if self.send_quiet_notice(commit) {
                    continue;
                }
                view.notice_failed = true;
                step = next_ship_step(&view);
            }
            if step == QueueStep::Ship {
                view.prev_held = self.replica.holds(self.after);
                step = next_ship_step(&view);
            }
            match step {
                QueueStep::NudgePull => self.nudge_to_pull().await,
                QueueStep::Notice => unreachable!("a failed notice is decided again: {view:?}"),
                QueueStep::Wait => {
                    tokio::select! {
                        _ = fed.changed() => {}
                        _ = commits.changed() => {}
                        _ = self.stop.changed() => {}
                        _ = tokio::time::sleep(HEARTBEAT_INTERVAL) => {}
                    }
                }
                QueueStep::Resume => self.resume_unheld_prev(),
                QueueStep::Ship => self.ship(batches, commit, &mut commits).await,
            }
        }
    }

    /// Whether the office of our term still runs and the follower is still a member.
    fn still_running(&self) -> bool {
        if *self.stop.borrow() || self.replica.gate.term() != self.term {
            return false;
        }
        if self.replica.peer(self.follower).is_none() {
            tracing::info!(follower = %self.follower, "no longer a member: its ShipQueue ends");
            return false;
        }
        true
    }

    /// An operator's `heal`: back to the follower's matched position, and a nudge to pull.
    async fn heal_if_asked(&mut self) {
        let replica = &self.replica;
        let asked = replica
            .leading
            .heal_requests
            .lock()
            .expect("heal lock is never held across a panic")
            .remove(&self.follower);
        if !asked {
            return;
        }
        let matched = replica.progress().get(&self.follower).map(|p| p.matched).unwrap_or_default();
        // Its matched position may be of an earlier office: resume from our own log.
        self.after = resume_after_gap(matched, &replica.leader_view());
        tracing::info!(follower = %self.follower, %matched, after = %self.after, "heal: queue reset to the follower's matched position; nudging it to pull");
        let _ = self.peer.nudge("heal").await;
    }

    /// Only the commit frontier moved: a quiet notice carries it, with no ship to answer
    /// (decisions/027). Lost with a broken stream, it rides the next ship or heartbeat. Whether it
    /// was queued.
    fn send_quiet_notice(&mut self, commit: Seqno) -> bool {
        match self.peer.commit_quiet(self.term, self.replica.me, commit) {
            Ok(()) => {
                self.replica.leading.notice_sent();
                self.sent_commit = commit;
                true
            }
            Err(tidal_net::NotSent::Full) => {
                self.replica.leading.notice_failed();
                false
            }
            Err(tidal_net::NotSent::Unavailable) => false,
        }
    }

    /// The tail cannot serve this follower: it pulls from our segments (the nudge is single-flight
    /// on its side). Pace the nudges, then go on from our end, so its answers to our heartbeats
    /// tell us where it has got to.
    async fn nudge_to_pull(&mut self) {
        self.replica.set_pulling(self.follower, true);
        let _ = self.peer.nudge("behind the leader's ship tail").await;
        tokio::time::sleep(HEARTBEAT_INTERVAL).await;
        self.after = self.replica.feed.last();
    }

    /// Never reached by the rules above; if a regression gets here, the follower's prev check would
    /// pass a position we never wrote. Resume from our own log instead (counted, `unheld_prev`).
    fn resume_unheld_prev(&mut self) {
        self.replica.count_refusal(Refusal::UnheldPrev);
        let resumed = resume_after_gap(self.after, &self.replica.leader_view());
        tracing::error!(follower = %self.follower, prev = %self.after, %resumed, "a ship's prev is not in our log; not sent");
        self.after = resumed;
    }

    /// Sends one ship and takes its answer: the next position, and the backoff.
    async fn ship(
        &mut self,
        batches: Vec<tidal_wal::Batch>,
        commit: Seqno,
        commits: &mut watch::Receiver<Seqno>,
    ) {
        let replica = Arc::clone(&self.replica);
        let ship = Ship {
            cluster_id: replica.spec.cluster_id.clone(),
            term: self.term,
            leader: replica.me,
            prev: self.after,
            commit,
            baseline: replica.baseline(),
            batches,
        };
        self.last_sent = Instant::now();
        let waited = match replica.ship_with_notices(&self.peer, &ship, commits, &self.notices).await {
            Ok(answer) => {
                // A commit handed to the notifier while the ship was out reaches the follower
                // from there: no second notice for it.
                self.sent_commit = commit.max(*self.notices.borrow());
                if answer.term == self.term {
                    // It was still in our term when it answered: the lease and readiness count it.
                    replica.commit.record_contact(self.follower, self.term, self.last_sent);
                }
                let reply;
                (self.after, reply) = replica.on_answer(self.follower, &ship, answer, self.after);
                // Not yet in our term, fenced, refused or halted: the same ship at once would get
                // the same answer (it did, in a loop, before decisions/057).
                waits_before_next(&reply)
            }
            Err(error) => {
                tracing::debug!(follower = %self.follower, "failed to ship: {error}");
                true
            }
        };
        if waited {
            tokio::time::sleep(self.backoff).await;
        }
        self.backoff = next_backoff(self.backoff, waited, BACKOFF_MIN, BACKOFF_MAX);
    }
}

impl Replica {
    /// Sends `ship` and waits for the answer; while it is in flight, every advance of the commit
    /// frontier past what the ship carries goes to the follower's notifier (a follower whose fsync
    /// finishes after another follower's ack then applies at once, not a round trip later).
    async fn ship_with_notices(
        &self,
        peer: &Peer,
        ship: &Ship,
        commits: &mut watch::Receiver<Seqno>,
        notices: &watch::Sender<Seqno>,
    ) -> Result<ShipAnswer, NetError> {
        let call = peer.ship(ship);
        tokio::pin!(call);
        let mut watching = true;
        loop {
            tokio::select! {
                biased;
                answer = &mut call => return answer,
                changed = commits.changed(), if watching => {
                    if changed.is_err() {
                        watching = false;
                        continue;
                    }
                    let commit = *commits.borrow_and_update();
                    notices.send_if_modified(|sent| {
                        let newer = commit > ship.commit && commit > *sent;
                        if newer {
                            *sent = commit;
                        }
                        newer
                    });
                }
            }
        }
    }

    /// One per ShipQueue: sends the commit notices it is handed, one at a time, the newest first;
    /// ends with its queue. It holds the replica only weakly and never across a call, so a stopping
    /// node is not kept alive by a notice in flight (its engine must be released for a restart).
    async fn commit_notifier(
        replica: std::sync::Weak<Replica>,
        follower: NodeId,
        peer: Peer,
        term: Term,
        mut notices: watch::Receiver<Seqno>,
    ) {
        while notices.changed().await.is_ok() {
            let commit = *notices.borrow_and_update();
            let me = match replica.upgrade() {
                Some(replica) if replica.gate.term() == term => replica.me,
                _ => return,
            };
            // Quiet: queued on the notice stream, never waited for (decisions/027); an older peer
            // gets the notice as a call it answers.
            let outcome = match peer.commit_quiet(term, me, commit) {
                Ok(()) => Ok(()),
                Err(tidal_net::NotSent::Full) => Err("the notice stream is full".to_string()),
                Err(tidal_net::NotSent::Unavailable) => {
                    peer.commit(term, me, commit, NOTICE_TIMEOUT).await.map(drop).map_err(|e| e.to_string())
                }
            };
            let Some(replica) = replica.upgrade() else { return };
            match outcome {
                Ok(_) => replica.leading.notice_sent(),
                Err(error) => {
                    replica.leading.notice_failed();
                    tracing::debug!(%follower, "commit notice failed: {error}");
                }
            }
        }
    }
}

impl Replica {
    /// Leader: runs one ShipQueue per member for the office of `term`, starting queues for members
    /// added while in office (a removed member's queue ends by itself).
    pub(in crate::replica) async fn ship_queues(
        self: Arc<Self>,
        term: Term,
        stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut members = self.watch_members();
        let mut stop_wait = stop.clone();
        let mut running: BTreeMap<NodeId, tokio::task::JoinHandle<()>> = BTreeMap::new();
        loop {
            if *stop.borrow() || self.gate.term() != term {
                return;
            }
            running.retain(|_, queue| !queue.is_finished());
            for (id, peer) in self.peer_list() {
                running.entry(id).or_insert_with(|| {
                    tokio::spawn(ShipQueue::start(self.clone(), id, peer, term, stop.clone()).run())
                });
            }
            tokio::select! {
                changed = members.changed() => if changed.is_err() { return },
                _ = stop_wait.changed() => {}
            }
        }
    }
}
