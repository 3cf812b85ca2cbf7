//! The WAL hook of a cluster node: what happens when the WAL writer has written, fsynced or
//! quarantined batches (the applier's input, the ship feed, this node's own matched position).

use crate::applier::{ApplierSender, DurableFrontier};
use crate::commit_state::CommitState;
use crate::ship_feed::ShipFeed;
use std::sync::Arc;
use tidal_types::{NodeId, Seqno, TermSeqno};
use tidal_wal::{Batch, FlushedHook};

/// The WAL hook of a cluster node.
pub struct ReplicaHook {
    applier: ApplierSender,
    commit: Arc<CommitState>,
    feed: ShipFeed,
    me: NodeId,
    durable: Arc<DurableFrontier>,
    /// Written batches the applier's full input did not take before the fsync; handed over after
    /// it (in order: once one is deferred, every later one waits behind it).
    deferred: Vec<Batch>,
}

impl ReplicaHook {
    /// The hook of node `me`: applier input, commit bookkeeping, the ship feed (the leader's tail)
    /// and the engine's durability gate (woken at each flush).
    pub fn new(
        applier: ApplierSender,
        commit: Arc<CommitState>,
        feed: ShipFeed,
        me: NodeId,
        durable: Arc<DurableFrontier>,
    ) -> ReplicaHook {
        ReplicaHook { applier, commit, feed, me, durable, deferred: Vec::new() }
    }
}

impl FlushedHook for ReplicaHook {
    fn written(&mut self, batches: &[Batch]) {
        // The applier takes them now, before our fsync: it applies only what is committed, and a
        // batch is committed once a majority fsynced it (the leader's commit also never passes its
        // own durable position), so a follower shows what the cluster holds without waiting for its
        // own disk (decisions/025). The engine's gate keeps fjall behind our durable WAL. Never
        // waiting here: the applier may be waiting for our fsync (see `ApplierSender`).
        if !batches.is_empty() {
            if self.deferred.is_empty() {
                if let Err(back) = self.applier.try_flushed(batches.to_vec()) {
                    self.deferred = back;
                }
            } else {
                self.deferred.extend_from_slice(batches);
            }
        }
        // Shipped while our own fsync runs (decisions/023, 027), so followers fsync while we do. Safe
        // because our commit never passes our own durable position (CommitState) and a restart never
        // resumes a term this node led before it (office.rs), so what a crash loses here was never
        // committed and is never written again with other contents under the same term.
        self.feed.push(batches);
    }

    fn flushed(&mut self, batches: &[Batch]) {
        let Some(last) = batches.last() else { return };
        let position = TermSeqno { term: last.term(), seqno: last.last_seqno() };
        self.durable.notify();
        // Durable now: the engine's gate lets the applier's flush through, so waiting is safe.
        if !self.deferred.is_empty() {
            self.applier.flushed(std::mem::take(&mut self.deferred));
        }
        self.applier.resend_commit();
        // While in office, the leader's own durable position counts as matched. CommitState ignores
        // it unless this node holds office in the batch's term (stepping down is synchronous with
        // persisting a higher vote, so a deposed leader never counts its own batches).
        self.commit.record_matched(self.me, position.term, position);
    }

    fn truncated(&mut self, from: Seqno) {
        // Ordered before any later flush: the applier never applies a quarantined batch, and the
        // ship tail never serves one.
        self.applier.truncated(from);
    }
}
