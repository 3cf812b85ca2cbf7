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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::applier::tests::item_batch as batch;
    use crate::applier::Applier;
    use crate::spec::Durability;
    use std::time::Duration;
    use tidal_core::{EngineConfig, TidalDb};

    /// A leader cut off from its followers keeps taking writes: every drain hands the applier a
    /// batch it cannot apply (nothing commits) and so does not wake it. Once the applier's input is
    /// full of them, the next drain's hand-over must not wait forever for an applier nobody woke
    /// (the WAL writer thread would stop for good; the simulation's `script-isolated-leader` walks
    /// into it). Each drain here is what the WAL writer does: `written` before the fsync,
    /// `flushed` after it.
    #[test]
    fn drains_that_cannot_commit_never_wedge_the_wal_writer() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(TidalDb::open(dir.path(), EngineConfig::with_dimension(4)).unwrap());
        let (applier, sender) = Applier::spawn(db.clone()).unwrap();
        let voters = vec![NodeId(1), NodeId(2), NodeId(3)];
        let commit =
            Arc::new(CommitState::new(NodeId(1), voters, Durability::Quorum, Seqno::ZERO, sender.clone()));
        let feed = ShipFeed::new(TermSeqno::default(), 1 << 20, 1 << 16);
        let mut hook = ReplicaHook::new(sender.clone(), commit, feed, NodeId(1), DurableFrontier::new());
        let drains = 600u64;
        let (done_tx, done) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            for seqno in 1..=drains {
                let drained = [batch(seqno)];
                hook.written(&drained);
                hook.flushed(&drained);
            }
            done_tx.send(()).unwrap();
            hook
        });
        // A bound, not a sleep: 600 hand-overs take microseconds; a wedged writer never ends.
        let finished = done.recv_timeout(Duration::from_secs(30));
        assert!(finished.is_ok(), "the WAL writer's hand-over to the applier is still blocked after 30 s");
        let _hook = writer.join().unwrap();
        // Nothing was committed, so nothing was applied; once the commit comes, all of it is.
        assert_eq!(db.applied_seqno(), Seqno::ZERO);
        sender.commit(Seqno(drains));
        let mut applied = applier.applied();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let reached = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), applied.wait_for(|seqno| *seqno == Seqno(drains)))
                .await
        });
        assert!(
            reached.is_ok_and(|r| r.is_ok()),
            "applied {} after the commit of {drains}",
            db.applied_seqno()
        );
        applier.join(sender);
    }
}
