//! The one receive path: every live ship and every pulled chunk is decided by
//! [`tidal_protocol::decide_ship`] under the term lock, then performed (quarantine, append, fsync)
//! before the answer names what we hold.

use super::super::Replica;
use crate::error::{Error, Result};
use crate::refusal::Refusal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tidal_net::{ProbeOutcome, ProbeReply, Ship, ShipAnswer, ShipOutcome};
use tidal_protocol::{
    answer_probe, append_only, authority, decide_ship, repairs_a_halt, replaced_from, Authority, BatchMeta,
    Origin, ProbeAnswer, ShipMeta, Step, Verdict,
};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
// tokio's clock: simulated time under turmoil.
use tokio::time::Instant;

impl Replica {
    /// Decides and performs one live ship from the leader (the one receive path).
    pub async fn receive(self: &Arc<Self>, ship: Ship) -> ShipAnswer {
        self.receive_from(ship, Origin::Live).await
    }

    /// Decides and performs one ship or pulled chunk (the one receive path).
    pub(super) async fn receive_from(self: &Arc<Self>, ship: Ship, origin: Origin) -> ShipAnswer {
        let _term_lock = self.gate.lock().await;
        let term = self.gate.term();
        let outcome = match self.check_origin(&ship, origin, term) {
            Err(outcome) => outcome,
            Ok(authority) => {
                let verdict = decide_ship(&self.wal_view(term), &ship_meta(&ship), self.quorum());
                // A source not in office may only append: a verdict that would replace our log is
                // refused (counted `stale_source`), never a halt.
                let stale_source = !authority.replaces && replaced_from(&verdict).is_some();
                let verdict = if authority.replaces { verdict } else { append_only(verdict) };
                match verdict {
                    Verdict::Accept { steps, matched, commit_now, commit } => {
                        let accepted =
                            Accepted { steps, matched, commit_now, commit, live: origin == Origin::Live };
                        self.accept(&ship, term, accepted).await
                    }
                    refused => self.refuse(&ship, term, refused, stale_source, authority.names_leader),
                }
            }
        };
        ShipAnswer { term, durable: self.wal.durable_seqno(), applied: *self.applied.borrow(), outcome }
    }

    /// Who sent it: a live ship must come from a member and, in our term, from the node our vote
    /// names (else the refusal to answer). Returns what the message may do (its authority), and
    /// notes that the leader was heard.
    fn check_origin(&self, ship: &Ship, origin: Origin, term: Term) -> Result<Authority, ShipOutcome> {
        if origin == Origin::Live {
            if let Err((class, reason)) = self.check_sender(ship.leader, ship.term, term) {
                tracing::warn!(leader = %ship.leader, ship_term = %ship.term, "refused a ship: {reason}");
                self.count_refusal(class);
                return Err(ShipOutcome::Refused(reason));
            }
        }
        // Does the sender hold the log of the message's term, and does it name the leader?
        let authority = authority(origin, ship.leader);
        if ship.term == term && ship.leader != self.me && authority.names_leader {
            self.leader_hint.store(ship.leader.0, Ordering::SeqCst);
            *self.following.last_heard.lock().expect("heard lock is never held across a panic") =
                Some(Instant::now());
        }
        Ok(authority)
    }

    /// Answers a verdict other than Accept, counting its refusal class; a halt of leader mode
    /// starts its repair from the leader's snapshot.
    fn refuse(
        self: &Arc<Self>,
        ship: &Ship,
        term: Term,
        verdict: Verdict,
        stale_source: bool,
        names_leader: bool,
    ) -> ShipOutcome {
        match verdict {
            Verdict::Fenced { .. } => {
                tracing::info!(ship_term = %ship.term, %term, leader = %ship.leader, "refused a ship from an older term");
                self.count_refusal(Refusal::StaleTerm);
                ShipOutcome::Fenced
            }
            Verdict::NotYet { .. } => ShipOutcome::NotYet,
            Verdict::Gap { last } => {
                self.count_refusal(Refusal::Gap);
                self.clone().start_pull("gap");
                ShipOutcome::Gap(last)
            }
            Verdict::Diverged => {
                tracing::info!(prev = %ship.prev, "a ship's prev is not in our log: diverged");
                self.count_refusal(Refusal::Diverged);
                ShipOutcome::Diverged(self.wal.term_history())
            }
            Verdict::Refuse { reason } if stale_source => {
                tracing::info!(leader = %ship.leader, "refused a pulled chunk: {reason}");
                self.count_refusal(Refusal::StaleSource);
                ShipOutcome::Refused(reason)
            }
            Verdict::Refuse { reason } => {
                tracing::warn!("refused a ship: {reason}");
                self.count_refusal(Refusal::Overlap);
                ShipOutcome::Refused(reason)
            }
            Verdict::Halt { reason, .. } => {
                tracing::error!("receiver halted: {reason}");
                self.count_refusal(Refusal::Halted);
                self.halt(reason.clone());
                if repairs_a_halt(self.quorum(), names_leader) {
                    // Leader mode lost batches we committed: only the leader's state brings us
                    // back. Every halted ship (the queue backs off) tries again, at most one
                    // install every SNAPSHOT_INSTALL_INTERVAL_MIN.
                    self.clone().start_halt_repair(ship.leader);
                }
                ShipOutcome::Refused(reason)
            }
            Verdict::Accept { .. } => unreachable!("an accepted ship is performed, not refused"),
        }
    }

    /// Performs an accepted ship or chunk (quarantine, append, fsync) and acks what it matched.
    async fn accept(self: &Arc<Self>, ship: &Ship, term: Term, accepted: Accepted) -> ShipOutcome {
        let Accepted { steps, matched, commit_now, commit, live } = accepted;
        // What `prev` covers is committed now; the batches this message brings are applied once
        // fsynced (the applier applies only flushed batches).
        self.commit.advance(commit_now);
        // What we quarantine is no longer the leader's log here: a notice must not cover it.
        if let Some(cut) = steps.iter().find_map(|step| match step {
            Step::QuarantineFrom(seqno) => Some(*seqno),
            _ => None,
        }) {
            self.forget_leader_match_from(term, cut);
        }
        // A live ship's batches move the commit frontier the moment they are written to our WAL,
        // before its fsync (decisions/025): on the WAL writer's thread, before the fsync starts (the
        // applier then applies what is committed at once), not after a wake-up of this task. A
        // commit covers only what a majority fsynced, so what we show is never lost cluster-wide;
        // our ack still waits for our fsync. We hold the term lock until `perform` returns, so the
        // term cannot change in between.
        let on_written = live.then(|| {
            let replica = Arc::clone(self);
            let matched = matched.seqno;
            Box::new(move || replica.live_written(term, matched, commit)) as tidal_wal::WrittenCallback
        });
        if let Err(error) = self.perform(ship, steps, on_written).await {
            let reason = error.to_string();
            tracing::warn!("could not take a ship: {reason}");
            self.count_refusal(Refusal::AppendFailed);
            return ShipOutcome::Refused(reason);
        }
        // We ack `matched`: the leader counts it toward commit. It must be in our log, written and
        // (perform waited for it) fsynced.
        let durable = self.wal.durable_seqno();
        assert!(matched.seqno <= durable, "acking {matched} past our durable seqno {durable} (term {term})");
        // Again here (idempotent), for a ship whose batches we all held already.
        if live {
            self.live_written(term, matched.seqno, commit);
        } else {
            self.commit.advance(commit);
        }
        ShipOutcome::Matched(matched)
    }

    /// A live ship of `term` is written here (maybe not fsynced yet) up to `matched`, which the
    /// leader's log holds there: a commit notice that came meanwhile covers it now; so does the
    /// ship's `commit`.
    fn live_written(&self, term: Term, matched: Seqno, commit: Seqno) {
        let notified =
            self.note_leader(term, |state| state.matched = state.matched.max(matched)).unwrap_or(Seqno::ZERO);
        if notified > commit.max(self.commit.commit()) {
            self.notice_advanced();
        }
        self.commit.advance(commit.max(notified));
    }

    /// Performs the accepted steps; `on_written` runs on the WAL writer's thread once the appended
    /// batches are written, before their fsync (not at all if nothing is appended or the WAL refuses
    /// them); returns once they are durable.
    async fn perform(
        &self,
        ship: &Ship,
        steps: Vec<Step>,
        on_written: Option<tidal_wal::WrittenCallback>,
    ) -> Result<()> {
        let mut appends = Vec::new();
        for step in steps {
            match step {
                Step::Skip(_) => {}
                Step::Append(i) => appends.push(ship.batches[i].clone()),
                Step::QuarantineFrom(seqno) => {
                    let report = self.quarantine_from(seqno).await?;
                    tracing::warn!(?report, "moved a divergent suffix to quarantine");
                    self.feed.reset(self.wal.last_position());
                }
            }
        }
        if appends.is_empty() {
            return Ok(());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.wal
            .submit_replicated_with(appends, on_written, Box::new(move |result| drop(tx.send(result))))
            .map_err(|e| Error::wal("append", format!("refused: {e:?}")))?;
        match rx.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(Error::wal("append", error)),
            Err(_) => Err(Error::wal("append", "the WAL writer stopped")),
        }
    }

    /// Answers a probe of `term` under the term lock with our last DURABLE position, and what
    /// remains of the leader lease we grant in `term` (a restored office's hand-over times its
    /// request by it, decisions/068).
    pub async fn answer_probe(&self, term: Term) -> ProbeReply {
        let _term_lock = self.gate.lock().await;
        let ours = self.gate.term();
        let outcome = match answer_probe(ours, term, self.wal.last_position(), &self.wal.term_history()) {
            ProbeAnswer::NotYet { .. } => ProbeOutcome::NotYet,
            ProbeAnswer::Fenced { .. } => ProbeOutcome::Fenced,
            ProbeAnswer::Position { last, history } => ProbeOutcome::Position { last, history },
        };
        ProbeReply { term: ours, outcome, lease_left: self.lease_granted(term) }
    }

    /// Whether `sender` may ship (or send commit notices) to us in `term` (`ours`: our term, read
    /// under the term lock for a ship): it must be a member, and for our own term the node that
    /// openraft's vote names (the node we voted for or learned as leader of it). Another term's
    /// message is decided by the term check (fenced or not yet) as before. Err: the refusal class
    /// and why.
    pub(super) fn check_sender(
        &self,
        sender: NodeId,
        term: Term,
        ours: Term,
    ) -> Result<(), (Refusal, String)> {
        if !self.is_member(sender) {
            return Err((Refusal::NotMember, format!("node {sender} is not a member of this cluster")));
        }
        if term != ours {
            return Ok(());
        }
        match self.vote_names(term) {
            Some(named) if named != sender => Err((
                Refusal::NotLeader,
                format!("node {sender} sent as leader of term {term}, but our vote names node {named}"),
            )),
            _ => Ok(()),
        }
    }

    /// The node openraft's persisted vote names for `term` (None: the vote is of another term, or
    /// no control plane runs).
    pub(in crate::replica) fn vote_names(&self, term: Term) -> Option<NodeId> {
        let control = self.control.get()?;
        let vote = control.raft().metrics().borrow().vote;
        let leader_id = vote.leader_id();
        (leader_id.get_term() == term.get()).then(|| leader_id.voted_for().map(NodeId)).flatten()
    }
}

/// An accepted verdict's parts, and whether the message was a live ship.
struct Accepted {
    steps: Vec<Step>,
    matched: TermSeqno,
    commit_now: Seqno,
    commit: Seqno,
    live: bool,
}

/// What the decision core needs of a message: its positions, not its bytes.
fn ship_meta(ship: &Ship) -> ShipMeta {
    ShipMeta {
        term: ship.term,
        prev: ship.prev,
        batches: ship
            .batches
            .iter()
            .map(|b| BatchMeta { first: b.first_seqno(), last: b.last_seqno(), term: b.term() })
            .collect(),
        commit: ship.commit,
    }
}
