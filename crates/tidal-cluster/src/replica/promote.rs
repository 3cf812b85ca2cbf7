//! Leadership transfer (`promote`) and the read index of linearizable reads.
//!
//! openraft 0.9 has no transfer call, and its voters refuse to vote while the leader lease they
//! granted on the last heartbeat runs (`leader_lease` = the election timeout maximum). So the leader
//! pauses its heartbeats, waits out that lease while it keeps serving writes, then asks the target
//! (`Elect` RPC) to stand for election. The voters' own election timers fire only a full election
//! timeout after the lease, so the target campaigns alone; it wins with the higher term, takes office
//! as after any election (probe, sync, LeaderStart) and the old leader is deposed by the higher vote.
//! At the end of the pause the leader stops taking new writes and waits until the target has
//! matched its whole log, so the target takes office without pulling anything (Raft's transfer
//! recipe); the write gap is the election round plus the target's probe round and LeaderStart,
//! not the pause. Delicate:
//! - heartbeats are switched back on whatever happens (a guard), or a later office of this node would
//!   lose its followers to elections;
//! - the target checks that the request's term is its own: a stale request starts nothing.

use super::Replica;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
// tokio's clock, not std's: the same instant in production (tokio reads std's clock), and the
// simulated clock under turmoil, so heartbeat pacing, pull and install rate limits and the
// promote/membership deadlines follow simulated time there (decisions/008, "Determinism").
use tidal_types::{NodeId, Seqno, Term};
use tokio::time::Instant;

/// A follower that has not answered for this long is not promoted (it may be down).
const PROMOTE_SILENCE_MAX: Duration = Duration::from_secs(2);
/// How long, after the target was asked, the leader waits for the new leader to be known.
const TRANSFER_DEADLINE: Duration = Duration::from_secs(5);
/// Poll step while waiting for the target to match and for the new leader (re-checks observable
/// state each step).
const TRANSFER_POLL: Duration = Duration::from_millis(2);
/// How long the leader, no longer taking writes, waits for the target to match its log.
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(1);

/// A leadership transfer in progress and the client writes it must wait for.
#[derive(Default)]
pub(super) struct Transfer {
    /// Set while a leadership transfer runs on this leader (single flight).
    promoting: AtomicBool,
    /// The node leadership is being handed to, while this leader refuses new writes (0: none).
    handing_to: AtomicU64,
    /// Client writes between their admission and their WAL append (see `admit_write`).
    writes_in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

/// What `promote` did (or, with `dry_run`, would do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromoteReport {
    /// The leader that handed over (this node).
    pub from: NodeId,
    /// The node asked to take over.
    pub to: NodeId,
    /// The term before the transfer.
    pub term: Term,
    /// How many seqnos the target's durable frontier was behind this leader's.
    pub behind: u64,
    /// Who leads after the transfer (None for a dry run, or if nobody was known by the deadline).
    pub new_leader: Option<NodeId>,
    /// Time from the request to the new leader being known (zero for a dry run).
    pub elapsed: Duration,
    /// What was done, in words.
    pub action: String,
}

/// Switches the leader's heartbeats back on when the transfer ends, however it ends.
struct HeartbeatsOff<'a>(&'a openraft::Raft<crate::control::TypeConfig>);

impl Drop for HeartbeatsOff<'_> {
    fn drop(&mut self) {
        self.0.runtime_config().heartbeat(true);
    }
}

/// An admitted client write (see [`Replica::admit_write`]); dropping it ends the admission. Owned,
/// so the WAL completion of the write can drop it (on the writer thread).
pub struct WriteTicket(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for WriteTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Clears the single-flight flag and takes writes again when the transfer ends.
struct Promoting<'a>(&'a Replica);

impl Drop for Promoting<'_> {
    fn drop(&mut self) {
        self.0.transfer.handing_to.store(0, Ordering::SeqCst);
        self.0.transfer.promoting.store(false, Ordering::SeqCst);
    }
}

impl Replica {
    /// Operator `promote`: hands leadership to `target`. Runs on the serving leader.
    pub async fn promote(self: &Arc<Self>, target: NodeId, dry_run: bool) -> Result<PromoteReport, Error> {
        use Error::Unavailable;
        let (control, term) = self.leading_control()?;
        let mut report = PromoteReport {
            from: self.me,
            to: target,
            term,
            behind: 0,
            new_leader: None,
            elapsed: Duration::ZERO,
            action: String::new(),
        };
        if target == self.me {
            report.new_leader = Some(self.me);
            report.action = format!("node {target} already leads term {term}; nothing to do");
            return Ok(report);
        }
        let (peer, progress) = self.promote_target(&control, target)?;
        report.behind = self.wal.durable_seqno().get().saturating_sub(progress.durable.get());
        let lease = self.timing.voters_lease();
        if dry_run {
            report.action = format!(
                "would pause heartbeats for {} ms (the voters' leader lease) while serving writes, then ask node \
                 {target} to stand for election at term {}; it is {} seqnos behind and pulls them while taking \
                 office",
                lease.as_millis(),
                term.get() + 1,
                report.behind
            );
            return Ok(report);
        }
        if self.transfer.promoting.swap(true, Ordering::SeqCst) {
            return Err(Unavailable("a promote is already running on this leader".into()));
        }
        let _promoting = Promoting(self);
        let started = Instant::now();
        let raft = control.raft();
        raft.runtime_config().heartbeat(false);
        let _heartbeats = HeartbeatsOff(raft);
        tracing::info!(%target, %term, lease_ms = lease.as_millis() as u64, "promote: heartbeats paused");
        if self.deposed_during(term, lease).await {
            // Another election ended this office; if the target won it, the transfer is done.
            if self.new_leader().await != Some(target) {
                return Err(Unavailable(format!(
                    "lost office during the transfer (now led by {:?}); retry",
                    self.leader()
                )));
            }
            report.elapsed = started.elapsed();
            report.new_leader = Some(target);
            report.action = format!("node {target} won an election during the pause; this node follows it");
            return Ok(report);
        }
        self.hand_writes_to(target).await?;
        match peer.elect(term.get(), self.me.0, Duration::ZERO, tidal_net::ElectMode::Stand).await {
            Ok(tidal_net::Election::Started) => {}
            Ok(tidal_net::Election::Refused(why)) => {
                return Err(Unavailable(format!("node {target} refused to stand for election: {why}")))
            }
            Err(error) => {
                return Err(Unavailable(format!(
                    "node {target} could not be asked to stand for election: {error}"
                )))
            }
        }
        report.new_leader = self.new_leader().await;
        report.elapsed = started.elapsed();
        report.action = match report.new_leader {
            Some(leader) if leader == target => format!("node {target} won the election; this node follows it"),
            Some(leader) => format!("node {leader} won the election instead of node {target}; run promote again"),
            None => format!(
                "node {target} stood for election but no new leader was known within {} s; this node still leads",
                TRANSFER_DEADLINE.as_secs()
            ),
        };
        tracing::info!(%target, new_leader = ?report.new_leader, elapsed_ms = report.elapsed.as_millis() as u64, "promote: done");
        Ok(report)
    }

    /// On a graceful stop (SIGTERM): if this node is the serving leader and another voter answered
    /// it recently, hands leadership to the one that has matched the most of its log
    /// ([`shutdown_target`]), so the cluster keeps taking writes after a pause of one transfer instead
    /// of waiting out an election timeout after the process is gone. `Ok(None)`: nothing to hand over.
    pub async fn hand_off_for_shutdown(self: &Arc<Self>) -> Result<Option<PromoteReport>, Error> {
        let Ok((control, _term)) = self.leading_control() else {
            return Ok(None);
        };
        let voters: Vec<NodeId> = control.state().membership.membership().voter_ids().map(NodeId).collect();
        let progress = self.progress();
        let candidates = voters.iter().filter(|voter| **voter != self.me).map(|voter| {
            let heard =
                progress.get(voter).and_then(|p| p.last_ack.map(|at| (p.matched.seqno, at.elapsed())));
            (*voter, heard)
        });
        let Some(target) = shutdown_target(candidates) else {
            return Ok(None);
        };
        tracing::info!(%target, "stopping: handing leadership over first");
        self.promote(target, false).await.map(Some)
    }

    /// The target must be a voter that answered this leader recently: its peer and progress.
    fn promote_target(
        &self,
        control: &crate::control::ControlPlane,
        target: NodeId,
    ) -> Result<(tidal_net::Peer, super::FollowerProgress), Error> {
        let is_voter = control.state().membership.membership().voter_ids().any(|id| id == target.0);
        let peer = self.peer(target).filter(|_| is_voter).ok_or_else(|| {
            Error::Invalid(format!("node {target} is not a voter of this cluster; only a voter can lead"))
        })?;
        let progress = self.progress().get(&target).cloned().unwrap_or_default();
        let silence = progress.last_ack.map(|at| at.elapsed());
        if silence.is_none_or(|silence| silence > PROMOTE_SILENCE_MAX) {
            return Err(Error::Unavailable(format!(
                "node {target} has not answered this leader {}: promoting a node that may be down would stall \
                 writes",
                silence.map_or("yet".to_string(), |s| format!("for {} ms", s.as_millis())),
            )));
        }
        Ok((peer, progress))
    }

    /// Waits out the voters' leader `lease` while serving; whether the office of `term` ended
    /// meanwhile (another election).
    async fn deposed_during(&self, term: Term, lease: Duration) -> bool {
        let mut serving = self.serving();
        tokio::select! {
            _ = tokio::time::sleep(lease) => false,
            _ = serving.wait_for(|now| *now != Some(term)) => true,
        }
    }

    /// Stops taking writes and waits until `target` has matched everything this leader holds, so it
    /// takes office without a pull.
    async fn hand_writes_to(&self, target: NodeId) -> Result<(), Error> {
        self.transfer.handing_to.store(target.0, Ordering::SeqCst);
        let caught_up_by = Instant::now() + CATCH_UP_DEADLINE;
        loop {
            let matched = self.progress().get(&target).map_or(Seqno::ZERO, |p| p.matched.seqno);
            let admitted = self.transfer.writes_in_flight.load(Ordering::SeqCst);
            if admitted == 0 && matched >= self.wal.durable_seqno() {
                return Ok(());
            }
            if Instant::now() >= caught_up_by {
                return Err(Error::Unavailable(format!(
                    "node {target} did not match this leader's log (at {matched} of {}) within {} ms; writes resume \
                     here",
                    self.wal.durable_seqno(),
                    CATCH_UP_DEADLINE.as_millis()
                )));
            }
            tokio::time::sleep(TRANSFER_POLL).await;
        }
    }

    /// Waits (up to the transfer deadline) until a leader other than this node is known.
    async fn new_leader(&self) -> Option<NodeId> {
        let deadline = Instant::now() + TRANSFER_DEADLINE;
        while self.leader().is_none_or(|leader| leader == self.me) && Instant::now() < deadline {
            tokio::time::sleep(TRANSFER_POLL).await;
        }
        self.leader().filter(|leader| *leader != self.me)
    }

    /// While this leader hands over to another node and refuses new writes: that node.
    pub fn handing_to(&self) -> Option<NodeId> {
        match self.transfer.handing_to.load(Ordering::SeqCst) {
            0 => None,
            id => Some(NodeId(id)),
        }
    }

    /// Admits a client write on this leader, unless leadership is being handed over (then the
    /// target). Hold the ticket until the write is appended: a transfer waits for every admitted
    /// write, so the target it hands to holds all of them. (Counting before checking, and the
    /// transfer setting its flag before reading the count, both SeqCst: a write either sees the
    /// flag or is waited for.)
    pub fn admit_write(&self) -> Result<WriteTicket, NodeId> {
        self.transfer.writes_in_flight.fetch_add(1, Ordering::SeqCst);
        match self.handing_to() {
            None => Ok(WriteTicket(self.transfer.writes_in_flight.clone())),
            Some(target) => {
                self.transfer.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
                Err(target)
            }
        }
    }

    /// What remains of the leader lease this node grants in `term` (decisions/068): zero when it
    /// grants none, or before its control plane has started.
    pub(crate) fn lease_granted(&self, term: Term) -> Duration {
        let lease = self.timing.voters_lease();
        self.control.get().map_or(Duration::ZERO, |control| control.lease_left(term, lease))
    }

    /// The target side of `promote` and of a restored office's hand-over (decisions/068): stand
    /// for election, if the leader's term is ours, once the lease this node granted that leader has
    /// run out (at once after a transfer, whose leader waited it out) and no sooner than
    /// `not_before` (the other voters' leases, as the asker saw them; capped at one lease, so a
    /// garbled value cannot hold the node back). A restarted leader that will never serve its
    /// restored term asks instead for the lease to be released (`mode`, third amendment).
    pub async fn stand_for_election(
        self: &Arc<Self>,
        term: u64,
        leader: u64,
        not_before: Duration,
        mode: tidal_net::ElectMode,
    ) -> Result<()> {
        self.check_standing(term, leader)?;
        let control =
            self.control.get().ok_or(Error::Unavailable("the control plane has not started yet".into()))?;
        let raft = control.raft().clone();
        let lease = self.timing.voters_lease();
        let (campaign_term, wait) = match mode {
            tidal_net::ElectMode::Stand => (
                term,
                crate::control::lease::campaign_wait(self.lease_granted(Term(term)), not_before, lease),
            ),
            tidal_net::ElectMode::Release | tidal_net::ElectMode::StandPastReleased => {
                // openraft refuses votes while the vote it holds is a committed one granted within
                // the lease; its only way out is a vote of its own, so the node campaigns in the
                // next term. The voters still granting the lease refuse that campaign.
                tracing::info!(term, leader, "releasing the lease granted to a restored office: campaigning");
                raft.trigger().elect().await.map_err(|e| Error::Control(e.to_string()))?;
                if mode == tidal_net::ElectMode::Release {
                    return Ok(());
                }
                // Now above the released voters' campaigns: they vote for the term after them.
                (term + 1, not_before.min(lease))
            }
        };
        if wait.is_zero() {
            tracing::info!(term, leader, "standing for election at the leader's request");
            return raft.trigger().elect().await.map_err(|e| Error::Control(e.to_string()));
        }
        // A campaign inside the lease would be refused by every voter that granted it, and its
        // higher term would make the leader's next request stale: campaign once it has run out.
        tracing::info!(
            term,
            leader,
            wait_ms = wait.as_millis() as u64,
            "standing for election at the leader's request once the leases have run out"
        );
        let replica = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            // Another node may have campaigned or been elected meanwhile: then our term moved on.
            // (Within the term nothing else can change: its vote names one leader, and only that
            // leader could change the membership.)
            let mine = replica.term().get();
            // Past a release the node's vote must still be its own: a node that follows a leader
            // elected in that term meanwhile would otherwise depose it.
            let released_to = replica.vote_names(Term(campaign_term));
            let outcome = if mine != campaign_term {
                Err(format!("this node moved on to term {mine}"))
            } else if campaign_term != term && released_to != Some(replica.me) {
                Err(format!("node {released_to:?} holds our vote in term {mine}"))
            } else {
                raft.trigger().elect().await.map_err(|e| e.to_string())
            };
            match outcome {
                Ok(()) => tracing::info!(term, leader, "standing for election at the leader's request"),
                Err(why) => tracing::info!(term, leader, "not standing for election after the lease: {why}"),
            }
        });
        Ok(())
    }

    /// Whether this node may stand for election at `leader`'s request in `term`.
    fn check_standing(&self, term: u64, leader: u64) -> Result<()> {
        // Only the leader of our term may hand its office over (decisions/057): a stranger or a
        // member that does not lead would otherwise start elections at will.
        if !self.is_member(NodeId(leader)) {
            self.count_refusal(crate::Refusal::NotMember);
            return Err(Error::Invalid(format!("node {leader} is not a member of this cluster")));
        }
        if self.vote_names(Term(term)) != Some(NodeId(leader)) {
            self.count_refusal(crate::Refusal::NotLeader);
            return Err(Error::Invalid(format!(
                "node {leader} does not lead term {term} as far as this node knows"
            )));
        }
        let mine = self.term().get();
        if mine != term {
            return Err(Error::Invalid(format!(
                "this node is at term {mine}, the request from node {leader} is for term {term}"
            )));
        }
        Ok(())
    }

    /// The read index of a linearizable read (ReadIndex; PROTOCOL.md, "Reads"): the commit frontier
    /// when the read arrived, returned once a quorum has confirmed this node still leads that term.
    /// Reading the applied state at or after it observes every write acknowledged before the read
    /// began.
    pub async fn read_index(&self) -> Result<Seqno> {
        let control =
            self.control.get().ok_or(Error::Unavailable("the control plane has not started yet".into()))?;
        let Some(term) = self.serving_now() else {
            return Err(Error::NotLeader { me: self.me, leader: self.leader() });
        };
        let index = self.commit.commit();
        control
            .raft()
            .ensure_linearizable()
            .await
            .map_err(|e| Error::Unavailable(format!("could not confirm leadership with a quorum: {e}")))?;
        if self.serving_now() != Some(term) {
            return Err(Error::Unavailable("lost office while confirming leadership".into()));
        }
        Ok(index)
    }
}

/// The voter a stopping leader hands over to: among the other voters (id, and when it was heard
/// from: its matched seqno and the silence since), one heard within [`PROMOTE_SILENCE_MAX`] that
/// matched the most; the lowest id among equals. None: no voter is fit (a single voter, or every
/// other voter silent, which a transfer would only stall on).
pub(crate) fn shutdown_target(
    candidates: impl IntoIterator<Item = (NodeId, Option<(Seqno, Duration)>)>,
) -> Option<NodeId> {
    candidates
        .into_iter()
        .filter_map(|(id, heard)| {
            heard.filter(|(_, silence)| *silence <= PROMOTE_SILENCE_MAX).map(|(m, _)| (m, id))
        })
        .max_by(|(m1, id1), (m2, id2)| m1.cmp(m2).then(id2.cmp(id1)))
        .map(|(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECENT: Duration = Duration::from_millis(100);

    #[test]
    fn a_stopping_leader_hands_over_to_the_voter_that_matched_most_and_was_heard_recently() {
        let heard = |seqno: u64, silence: Duration| Some((Seqno(seqno), silence));
        // The most matched wins; silence past the limit disqualifies however far it got.
        let target = shutdown_target([
            (NodeId(2), heard(40, RECENT)),
            (NodeId(3), heard(90, RECENT)),
            (NodeId(4), heard(99, PROMOTE_SILENCE_MAX + RECENT)),
            (NodeId(5), None),
        ]);
        assert_eq!(target, Some(NodeId(3)));
        // Equals: the lowest id, whatever the order they come in.
        assert_eq!(
            shutdown_target([(NodeId(3), heard(7, RECENT)), (NodeId(2), heard(7, RECENT))]),
            Some(NodeId(2))
        );
        // No fit voter: nothing to hand over (a lone voter, or every other one silent).
        assert_eq!(shutdown_target([]), None);
        assert_eq!(
            shutdown_target([(NodeId(2), None), (NodeId(3), heard(5, PROMOTE_SILENCE_MAX * 2))]),
            None
        );
    }
}
