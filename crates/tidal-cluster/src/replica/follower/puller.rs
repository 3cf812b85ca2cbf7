//! Catch-up by pull: this node asks another for the batches after its last position and takes each
//! chunk through the one receive path; when the log cannot bring it back, it installs a snapshot.

use super::super::{Replica, PULL_CHUNK_BYTES_MAX};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tidal_net::{ChunkOutcome, NetError, Pull, Ship, ShipOutcome};
use tidal_protocol::{divergence_point, Origin};
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
// tokio's clock: simulated time under turmoil.
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// A pull that receives nothing for this long is abandoned (and retried later).
const PULL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pulls started by gaps are at least this far apart (rate limit per source).
const PULL_INTERVAL_MIN: Duration = Duration::from_millis(200);

impl Replica {
    /// Operator `catchup`: this follower pulls from its leader now. Returns whether a pull started.
    pub fn catchup(self: &Arc<Self>) -> Result<bool> {
        if self.is_leader() {
            return Err(Error::IsLeader);
        }
        if self.leader().is_none() {
            return Err(Error::NoLeaderKnown);
        }
        Ok(self.clone().start_pull("catchup"))
    }

    /// Starts a pull from the leader unless one is running or one started too recently.
    pub fn start_pull(self: Arc<Self>, reason: &'static str) -> bool {
        let Some(leader) = self.leader().filter(|leader| *leader != self.me) else { return false };
        if self.commit.office().is_some() {
            return false;
        }
        {
            let mut last = self.following.last_pull.lock().expect("pull lock is never held across a panic");
            if last.is_some_and(|at| at.elapsed() < PULL_INTERVAL_MIN) && reason == "gap" {
                return false;
            }
            if self.following.pulling.swap(true, Ordering::SeqCst) {
                return false;
            }
            *last = Some(Instant::now());
        }
        tokio::spawn(async move {
            let from = self.wal.last_position();
            if let Err(error) = self.pull_from(leader, from, false).await {
                tracing::warn!(reason, %leader, "failed to pull from the leader: {error}");
            }
            self.following.pulling.store(false, Ordering::SeqCst);
        });
        true
    }

    /// Pulls from `source` everything after `from` (our last durable position, or a divergence
    /// point), through the one receive path. On `Diverged`, retries once from the divergence point.
    /// When the log alone cannot bring this node back (the source purged past our position, or we
    /// diverged and already applied past the divergence point), installs the source's snapshot
    /// ([`Replica::install_from`]) and pulls on from it.
    ///
    /// `adopting`: we are a new leader pulling the log we chose (taking office, step 3), so the
    /// source's chunks may replace our divergent suffix even though the source is not in office.
    pub(in crate::replica) async fn pull_from(
        self: &Arc<Self>,
        source: NodeId,
        from: TermSeqno,
        adopting: bool,
    ) -> Result<()> {
        match self.pull_once(source, from, adopting).await? {
            PullEnd::Done => Ok(()),
            PullEnd::Purged(at) => {
                tracing::warn!(%source, %from, purged = %at, "the source purged past our position: installing its snapshot");
                self.install_from(source, "behind the source's purge point").await?;
                self.pull_after_install(source, adopting).await
            }
            PullEnd::Diverged(history) => {
                let theirs_last =
                    TermSeqno { term: history.last().map_or(Term(0), |e| e.term), seqno: Seqno(u64::MAX) };
                let point = divergence_point(
                    &self.wal.term_history(),
                    self.wal.last_position(),
                    &history,
                    theirs_last,
                );
                let applied = *self.applied.borrow();
                if applied > point.seqno {
                    tracing::warn!(%source, %point, %applied, "our log diverged and we applied past the divergence point: installing the source's snapshot");
                    self.install_from(source, "applied past the divergence point").await?;
                    return self.pull_after_install(source, adopting).await;
                }
                tracing::warn!(%source, %point, "our log diverged; pulling from the divergence point");
                match self.pull_once(source, point, adopting).await? {
                    PullEnd::Done => Ok(()),
                    PullEnd::Purged(at) => Err(Error::Pull {
                        from: source,
                        why: format!("it purged past the divergence point {point} ({at})"),
                    }),
                    PullEnd::Diverged(_) => Err(Error::Pull {
                        from: source,
                        why: format!("still diverged after pulling from {point}"),
                    }),
                }
            }
        }
    }

    /// After an install: pulls from our new last position (the snapshot's).
    pub(in crate::replica) async fn pull_after_install(
        self: &Arc<Self>,
        source: NodeId,
        adopting: bool,
    ) -> Result<()> {
        match self.pull_once(source, self.wal.last_position(), adopting).await? {
            PullEnd::Done => Ok(()),
            PullEnd::Purged(at) => Err(Error::Pull {
                from: source,
                why: format!("it purged past its own snapshot ({at}); retrying later"),
            }),
            PullEnd::Diverged(_) => {
                Err(Error::Pull { from: source, why: "diverged right after installing its snapshot".into() })
            }
        }
    }

    /// One pull.
    async fn pull_once(self: &Arc<Self>, source: NodeId, from: TermSeqno, adopting: bool) -> Result<PullEnd> {
        let peer = self.peer(source).ok_or(Error::NotAPeer(source))?;
        let pull = Pull {
            cluster_id: self.spec.cluster_id.clone(),
            term: self.term(),
            node: self.me,
            from,
            chunk_bytes_max: PULL_CHUNK_BYTES_MAX as u64,
        };
        let started = Instant::now();
        let mut stream =
            peer.pull(&pull, PULL_IDLE_TIMEOUT).await.map_err(|e: NetError| Error::net(source, e))?;
        let mut batches = 0usize;
        // Where a pull's time goes: waiting for the source's next chunk, or taking it (append + fsync).
        let (mut waited, mut took) = (Duration::ZERO, Duration::ZERO);
        let mut bytes = 0usize;
        loop {
            let asked = Instant::now();
            let Some(chunk) = stream.next().await else { break };
            waited += asked.elapsed();
            let chunk = chunk.map_err(|e| Error::net(source, e))?;
            match chunk.outcome {
                ChunkOutcome::Batches { prev, batches: pulled } => {
                    batches += pulled.len();
                    bytes += pulled.iter().map(|batch| batch.encoded().len()).sum::<usize>();
                    let ship = Ship {
                        cluster_id: self.spec.cluster_id.clone(),
                        term: chunk.term,
                        leader: chunk.leader,
                        prev,
                        commit: chunk.commit,
                        baseline: chunk.baseline,
                        batches: pulled,
                    };
                    let origin = if adopting { Origin::Adopting } else { Origin::Pull { source } };
                    let taking = Instant::now();
                    let answer = self.receive_from(ship, origin).await;
                    took += taking.elapsed();
                    if !matches!(answer.outcome, ShipOutcome::Matched(_)) {
                        let why = format!("a pulled chunk was not accepted: {:?}", answer.outcome);
                        return Err(Error::Pull { from: source, why });
                    }
                }
                ChunkOutcome::Encoded { .. } => {
                    let why = "a received chunk was not verified (tidal-net never yields this)".into();
                    return Err(Error::Pull { from: source, why });
                }
                ChunkOutcome::Diverged(history) => {
                    self.count_pull(batches, bytes, started);
                    return Ok(PullEnd::Diverged(history));
                }
                ChunkOutcome::Purged(at) => {
                    self.count_pull(batches, bytes, started);
                    return Ok(PullEnd::Purged(at));
                }
            }
        }
        self.count_pull(batches, bytes, started);
        tracing::info!(batches, bytes, %source, last = %self.wal.last_position(), ?waited, ?took, "pull done");
        Ok(PullEnd::Done)
    }

    /// Adds an ended pull to [`PullStats`].
    fn count_pull(&self, batches: usize, bytes: usize, started: Instant) {
        let mut stats = self.following.pulls.lock().expect("pull stats lock is never held across a panic");
        stats.pulls += 1;
        stats.batches += batches as u64;
        stats.bytes += bytes as u64;
        stats.seconds += started.elapsed().as_secs_f64();
    }
}

/// How one pull ended.
enum PullEnd {
    /// The stream ended: we hold what the source held when it started.
    Done,
    /// The source's log diverged from ours; its term history.
    Diverged(Vec<TermSeqno>),
    /// The source purged past our position (its purge point): only a snapshot brings us back.
    Purged(TermSeqno),
}
