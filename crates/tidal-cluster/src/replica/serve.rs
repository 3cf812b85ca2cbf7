//! What this node serves to the others: pulls from its own segments, and the replication RPC
//! handler that routes every call to the role that answers it.

use super::{Replica, PULL_CHUNK_BYTES_MAX, SHIP_BYTES_MAX};
use crate::refusal::Refusal;
use std::sync::Arc;
use tidal_net::{
    Chunk, ChunkOutcome, ChunkStream, Probe, ProbeReply, Pull, RaftCall, ServiceError, Ship, ShipAnswer,
    SnapshotRequest, SnapshotStream,
};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::Wal;

/// Chunks a pull server keeps ready while the follower takes the previous ones: with
/// [`PULL_CHUNK_BYTES_MAX`] this bounds its read-ahead memory per pull.
const PULL_CHUNKS_AHEAD: usize = 4;

impl Replica {
    /// Serves a pull: batches after `from`, from the WAL, in chunks.
    pub fn serve_pull(&self, pull: Pull) -> Result<ChunkStream, ServiceError> {
        if !self.is_member(pull.node) {
            self.count_refusal(Refusal::NotMember);
            tracing::warn!(node = %pull.node, "refused a pull from a node that is not a member");
            return Err(ServiceError::PermissionDenied(format!("node {} is not a member", pull.node)));
        }
        let from = pull.from;
        let purged = self.wal.purged();
        // We name ourselves as the leader only while we hold office in the term we serve in: the
        // receiver lets only such chunks replace its batches (`Origin::Pull`). Otherwise the leader
        // we know, or none (0).
        let term = self.term();
        let leader = if self.commit.office() == Some(term) {
            self.me
        } else {
            self.leader().filter(|leader| *leader != self.me).unwrap_or(NodeId(0))
        };
        let baseline = self.baseline();
        let header = |outcome| Chunk { term, leader, baseline, commit: self.commit.commit(), outcome };
        if from.seqno > Seqno::ZERO && from.seqno < purged.seqno {
            return Ok(Box::pin(tokio_stream::iter([Ok(header(ChunkOutcome::Purged(purged)))])));
        }
        if !self.wal.holds(from) {
            let history = self.wal.term_history();
            return Ok(Box::pin(tokio_stream::iter([Ok(header(ChunkOutcome::Diverged(history)))])));
        }
        let chunk_bytes =
            usize::try_from(pull.chunk_bytes_max).unwrap_or(SHIP_BYTES_MAX).clamp(1, PULL_CHUNK_BYTES_MAX);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Chunk, ServiceError>>(PULL_CHUNKS_AHEAD);
        let wal = self.wal.clone();
        let commit = self.commit.commit();
        // An async producer whose reads run on the blocking pool one at a time: the channel keeps
        // up to PULL_CHUNKS_AHEAD chunks read ahead, and in the simulation every read is counted
        // work that ends within the step that asked for it (decisions/051).
        tokio::spawn(async move {
            let read_failed = |error: String| Err(ServiceError::Internal(format!("read WAL: {error}")));
            // Runs of the segment files' bytes, cut at batch boundaries from the headers alone: no
            // decoding, hashing or copying per batch here. The follower verifies every batch's seal
            // before its WAL takes it (tidal-net `split_batches`), and `receive_from` decides.
            let opening = wal.clone();
            let opened = crate::blocking::blocking(move || open_pull_reader(&opening, from)).await;
            let mut reader = match opened {
                Ok(PullStart::Reader(reader)) => reader,
                Ok(PullStart::Refused(outcome)) => {
                    return drop(tx.send(Ok(Chunk { term, leader, baseline, commit, outcome })).await);
                }
                Ok(PullStart::Failed(error)) => return drop(tx.send(read_failed(error)).await),
                Err(error) => return drop(tx.send(read_failed(error.to_string())).await),
            };
            let mut prev = from;
            loop {
                let read = crate::blocking::blocking(move || {
                    let run = reader.next_run(chunk_bytes);
                    (reader, run)
                })
                .await;
                let run = match read {
                    Ok((back, run)) => {
                        reader = back;
                        run
                    }
                    Err(error) => return drop(tx.send(read_failed(error.to_string())).await),
                };
                let run = match run {
                    Ok(Some(run)) => run,
                    Ok(None) => return,
                    Err(error) => return drop(tx.send(read_failed(error.to_string())).await),
                };
                if !wal.holds(prev) {
                    // The log was cut after this run was read: end here (the follower pulls again).
                    return drop(
                        tx.send(read_failed(format!("{prev} left the log while serving a pull"))).await,
                    );
                }
                let chunk = Chunk {
                    term,
                    leader,
                    baseline,
                    commit,
                    outcome: ChunkOutcome::Encoded { prev, bytes: run.bytes },
                };
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
                prev = run.last;
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// How a pull's reader started.
enum PullStart {
    /// Reading the batches that follow `from` in this log.
    Reader(tidal_wal::RawReader),
    /// The log does not hold `from` (any more), or purged past it: the one chunk to answer.
    Refused(ChunkOutcome),
    /// The WAL could not be read.
    Failed(String),
}

/// Opens the reader of a pull after `from`. The check that our log holds `from` is made again here,
/// with the reader's start, under the WAL's log lock: `serve_pull`'s first check runs earlier, and a
/// quarantine and refill in between (a node taking office by adopting another log, just when its
/// followers pull from it) would otherwise pair `from` with batches of the new log (decisions/057).
fn open_pull_reader(wal: &Wal, from: TermSeqno) -> PullStart {
    match wal.read_raw_after(from) {
        Ok(reader) => PullStart::Reader(reader),
        Err(tidal_wal::Error::NotInLog { .. }) => {
            PullStart::Refused(ChunkOutcome::Diverged(wal.term_history()))
        }
        Err(tidal_wal::Error::Purged { .. }) => PullStart::Refused(ChunkOutcome::Purged(wal.purged())),
        Err(error) => PullStart::Failed(error.to_string()),
    }
}

/// The replication service of a node.
pub struct ReplicaService(pub Arc<Replica>);

#[tidal_net::async_trait]
impl tidal_net::Handler for ReplicaService {
    fn cluster_id(&self) -> &str {
        &self.0.spec.cluster_id
    }

    fn refused(&self, why: tidal_net::ServiceRefusal) {
        self.0.count_refusal(why.into());
    }

    async fn ship(&self, ship: Ship) -> Result<ShipAnswer, ServiceError> {
        Ok(self.0.receive(ship).await)
    }

    async fn pull(&self, pull: Pull) -> Result<ChunkStream, ServiceError> {
        self.0.serve_pull(pull)
    }

    async fn commit(&self, term: Term, leader: NodeId, commit: Seqno) -> Result<Term, ServiceError> {
        Ok(self.0.notice_commit(term, leader, commit))
    }

    async fn nudge(&self, _reason: String) -> Result<bool, ServiceError> {
        Ok(self.0.clone().start_pull("nudge"))
    }

    async fn probe(&self, probe: Probe) -> Result<ProbeReply, ServiceError> {
        Ok(self.0.answer_probe(probe.term).await)
    }

    async fn snapshot(&self, request: SnapshotRequest) -> Result<SnapshotStream, ServiceError> {
        if !self.0.is_member(request.node) {
            self.0.count_refusal(Refusal::NotMember);
            tracing::warn!(node = %request.node, "refused a snapshot to a node that is not a member");
            return Err(ServiceError::PermissionDenied(format!("node {} is not a member", request.node)));
        }
        self.0.snapshots.serve(request)
    }

    async fn negatives(
        &self,
        after_user: String,
        limit: u32,
    ) -> Result<tidal_net::NegativesPage, ServiceError> {
        self.0.serve_negatives(after_user, limit).await.map_err(|e| ServiceError::Internal(e.to_string()))
    }

    async fn elect(
        &self,
        term: u64,
        leader: u64,
        not_before: std::time::Duration,
        mode: tidal_net::ElectMode,
    ) -> Result<tidal_net::Election, ServiceError> {
        // A refusal to stand is an answer (its reason travels to the leader), not a failed call.
        Ok(match self.0.stand_for_election(term, leader, not_before, mode).await {
            Ok(()) => tidal_net::Election::Started,
            Err(why) => tidal_net::Election::Refused(why.to_string()),
        })
    }

    async fn raft(&self, call: RaftCall) -> Result<Vec<u8>, ServiceError> {
        let Some(control) = self.0.control.get() else {
            return Err(ServiceError::Unavailable("control plane not started yet".into()));
        };
        // A vote request or append from a node outside the membership must not move our term
        // (a stranger with the secret forced elections before decisions/057).
        let sender = crate::control::caller_of(&call)?;
        if !self.0.is_member(sender) {
            self.0.count_refusal(Refusal::NotMember);
            tracing::warn!(node = %sender, kind = %call.kind, "refused an openraft call from a node that is not a member");
            return Err(ServiceError::PermissionDenied(format!("node {sender} is not a member")));
        }
        control.serve(call).await
    }
}

#[cfg(test)]
mod tests {
    use super::{open_pull_reader, PullStart};
    use std::sync::Arc;
    use tidal_net::ChunkOutcome;
    use tidal_types::{RecordKind, Seqno, Term, TermSeqno};
    use tidal_wal::{AppendRequest, Batch, FlushedHook, ManualClock, SimIo, Wal, WalConfig};

    struct NoHook;

    impl FlushedHook for NoHook {
        fn flushed(&mut self, _batches: &[Batch]) {}
    }

    fn wal_with(io: &SimIo, term: u64, batches: u64) -> Wal {
        let config = WalConfig::new("/wal");
        let clock = Arc::new(ManualClock::new(1_000));
        let (wal, _) = Wal::open(config, Arc::new(io.clone()), clock, Box::new(NoHook)).expect("open WAL");
        wal.set_term(Term(term));
        for _ in 0..batches {
            let request = AppendRequest { kind: RecordKind::Signal, event_count: 2, payload: vec![0; 16] };
            wal.append_blocking(request).expect("append");
        }
        wal
    }

    /// Finding 2 of the safety review, as `serve_pull` meets it: its first check passes, the log is
    /// quarantined and refilled with another term's batches (a node adopting another log while
    /// taking office), then the reader opens. At a57b07b the reader (`read_raw_from`) started
    /// after the stale `prev` and served the new log's batches under it.
    #[test]
    fn a_pull_opened_after_a_quarantine_and_refill_answers_diverged() {
        let io = SimIo::new();
        let wal = wal_with(&io, 1, 5);
        let from = TermSeqno { term: Term(1), seqno: Seqno(8) };
        assert!(wal.holds(from), "serve_pull's first check passes");
        let other = wal_with(&SimIo::new(), 1, 3);
        other.set_term(Term(2));
        for _ in 0..3 {
            let request = AppendRequest { kind: RecordKind::Signal, event_count: 2, payload: vec![1; 16] };
            other.append_blocking(request).expect("append");
        }
        let replacement: Vec<Batch> =
            other.read_from(Seqno(7)).expect("read").map(|batch| batch.expect("batch")).collect();
        wal.quarantine_from(Seqno(7)).expect("quarantine");
        wal.append_replicated_blocking(replacement).expect("refill");
        match open_pull_reader(&wal, from) {
            PullStart::Refused(ChunkOutcome::Diverged(history)) => {
                assert_eq!(history.last().map(|e| e.term), Some(Term(2)));
            }
            PullStart::Reader(_) => panic!("a reader after {from}, which the log no longer holds"),
            PullStart::Refused(other) => panic!("unexpected refusal {other:?}"),
            PullStart::Failed(error) => panic!("unexpected failure {error}"),
        }
    }
}
