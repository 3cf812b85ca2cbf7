//! The properties checked in every state (issue 7): safety (`always`) and reachability
//! (`sometimes`, so the model provably reaches the interesting states).
//!
//! Each property is one function; its doc comment says what it defends. Quorum-mode properties hold
//! vacuously in leader mode, whose documented loss of acknowledged writes is a `sometimes` instead.

use std::collections::BTreeSet;

use stateright::Property;
use tidal_protocol::Quorum;
use tidal_types::{NodeId, Term};

use crate::model::{Mode, ReplicationModel};
use crate::state::{id, Broken, ModelState, Role};

/// Names of the safety properties (a discovery of one of these is a violation).
pub const SAFETY: [&str; 15] = [
    NO_ACKED_WRITE_LOST,
    NO_COMMITTED_BATCH_LOST,
    LEADER_COMPLETENESS,
    COMMITTED_ON_ELECTORATE,
    LOG_MATCHING,
    COMMIT_MONOTONE,
    LEADER_COMMIT_DURABLE,
    COMMIT_WRITTEN,
    ONE_ACKER_PER_TERM,
    APPLIED_COMMITTED,
    APPLIED_WRITTEN,
    APPLIED_IS_COMMITTED,
    QUARANTINE_UNCOMMITTED,
    LEADER_HOLDS_PREV,
    NO_HALT_ON_STALE_CHUNK,
];

/// Quorum mode: every acknowledged write is in the log of every leader of its term or later, at the
/// same position (the same batch: same writer process), and applied there, once that leader serves.
pub const NO_ACKED_WRITE_LOST: &str = "no acknowledged write lost (quorum)";
/// Quorum mode: every batch a leader counted as committed (position and writer) is in every later
/// serving leader's log.
pub const NO_COMMITTED_BATCH_LOST: &str = "no committed batch lost (quorum)";
/// Quorum mode: a leader that opened term T holds every position committed by a leader of a term
/// below T (taking office step 3: "L now holds all of them"), before it serves.
pub const LEADER_COMPLETENESS: &str = "an opened leader holds every earlier-term commit (quorum)";
/// Quorum mode: every committed position is durable on a majority of the voters openraft elects
/// with (the premise of taking office step 3: every committed batch is on one node of any majority).
pub const COMMITTED_ON_ELECTORATE: &str = "every commit is durable on a majority of the electorate (quorum)";
/// Two logs holding the same term at a seqno hold the same batch there (same writer process) and
/// agree on everything up to it; terms never decrease along a log. Comparing writers is what sees a
/// leader resumed in its term after a restart writing a second batch at a `(term, seqno)` it had
/// shipped before the crash (decisions/023).
pub const LOG_MATCHING: &str = "log matching";
/// A node's commit frontier never decreases while it runs.
pub const COMMIT_MONOTONE: &str = "commit never decreases";
/// `commit <= durable` on every opened leader (`Role::Leader`).
///
/// Until decisions/025 this was `commit <= durable` on EVERY node ("commit never exceeds
/// durable"). A follower now counts a live ship's batches as held once written, before its fsync,
/// so its commit (and applied) frontier may pass its durable position; that is the rule, not a bug
/// (`SOMETIMES_FOLLOWER_APPLIED_PAST_DURABLE` shows the model reaches it). What still holds: a
/// leader's commit never passes its own durable position (the cap of decisions/023, and commit
/// counts only fsynced acks), checked here, and every node's commit stays within its written log
/// ([`COMMIT_WRITTEN`]). A node elected but still probing may carry a follower's commit above its
/// durable position; it fsyncs before it plans its office (the model's probe waits for it), so an
/// opened leader starts with `commit <= durable`.
pub const LEADER_COMMIT_DURABLE: &str = "a leader's commit never exceeds its durable position";
/// `commit <= len` (last written seqno) on every node: a follower's commit, moved at write time,
/// is capped at what it has written and matched (decisions/025); nothing else lowers the log below
/// commit (quarantine halts at or below commit; a restart sets commit to applied, see
/// [`APPLIED_WRITTEN`]).
pub const COMMIT_WRITTEN: &str = "commit never exceeds the written log";
/// In any term, at most one node acknowledges client writes.
pub const ONE_ACKER_PER_TERM: &str = "at most one node acknowledges in a term";
/// `applied <= commit` on every node.
pub const APPLIED_COMMITTED: &str = "nothing applied above commit";
/// `applied <= len` on every node. While a node runs it follows from `applied <= commit <= len`;
/// after a restart it is the persisted-state rule of decisions/025: the engine never persists state
/// past the durable WAL, so a restarted node's applied frontier is within what its WAL kept.
pub const APPLIED_WRITTEN: &str = "applied never exceeds the written log";
/// Quorum mode: every batch a node holds at or below its applied frontier is one (position and
/// writer) that some leader counted as committed. With [`NO_COMMITTED_BATCH_LOST`] this is "nothing
/// a node applied is lost cluster-wide", the premise of applying before the follower's own fsync
/// (decisions/025).
pub const APPLIED_IS_COMMITTED: &str = "a node applies only batches a leader counted as committed (quorum)";
/// Quorum mode: a node in term T never quarantines a position that a leader of term T or earlier
/// counted as committed, and no receiver halts for it. (A node still in an earlier term may
/// quarantine a batch that a LATER term's leader committed when a ship of its own term replaces
/// it: its commit frontier is below that batch, which stays on the majority that committed it; Raft
/// allows the same. Until issue 37 this property named every committed position; the model's
/// capped three-term run never reached such a state.)
pub const QUARANTINE_UNCOMMITTED: &str = "quarantine never touches a committed seqno (quorum)";

/// No ship leaves a leader and no pulled chunk leaves its source with a `prev` that the sender's
/// own log does not hold (the written log for a ship, the durable log for a chunk): the follower's
/// prev check proves log matching only against a `prev` of the sender's log (issue 37, findings 1
/// and 2; production checks it before every ship and counts a miss as `unheld_prev`).
pub const LEADER_HOLDS_PREV: &str = "a leader ships and serves only a prev its own log holds";

/// Reached: a client write is acknowledged.
pub const SOMETIMES_ACKED: &str = "sometimes: a write is acknowledged";
/// Reached: a second node serves as leader.
pub const SOMETIMES_LEADER_CHANGE: &str = "sometimes: a leader changes";
/// Reached: a divergent suffix is quarantined.
pub const SOMETIMES_QUARANTINE: &str = "sometimes: a divergent suffix is quarantined";
/// Reached with followers applying on write (decisions/025): a follower has applied past its own
/// durable position (what `COMMIT_DURABLE` forbade before).
pub const SOMETIMES_FOLLOWER_APPLIED_PAST_DURABLE: &str =
    "sometimes: a follower applies past its durable position";
/// Reached: a node that openraft put back in office after a restart handed its term over instead
/// of resuming it (`resumes_a_term`; issue 37, finding 3).
pub const SOMETIMES_HANDED_OVER: &str = "sometimes: a restored office is handed over";
/// Reached: a pull's reader opened after its source's log stopped holding the checked `prev` and
/// answered Diverged (issue 37, finding 2: the window between the check and the read).
pub const SOMETIMES_PULL_PREV_GONE: &str = "sometimes: a pull's prev leaves its source's log before the read";
/// Reached (issue 37; decisions/006): a follower refuses a pulled chunk from a node that did not
/// hold office in the chunk's term where the chunk conflicts at or below its commit frontier. The
/// follower pulled from a newly elected node while it was taking office; the chunk (of that node's
/// log before it adopted another) arrives only after the follower committed the new leader's log.
pub const SOMETIMES_STALE_CHUNK_REFUSED: &str =
    "sometimes: a follower refuses a chunk from a node not in office below its commit";
/// Always (both modes; found by this model, issue 37): a pulled chunk from a node that did not
/// hold office in its term never halts its receiver. Such a chunk proves nothing about the leader's
/// log (its sender may hold an uncommitted suffix of an older term), so a conflict with it is a
/// refusal (`append_only`); a halt there stalls a follower for nothing, in quorum mode for good.
pub const NO_HALT_ON_STALE_CHUNK: &str = "a chunk from a node not in office never halts its receiver";
/// Reached in leader mode only (PROTOCOL.md "leader mode loses an acknowledged tail").
pub const SOMETIMES_LEADER_MODE_LOSS: &str = "sometimes: leader mode loses an acknowledged write";

/// Every property.
pub fn all() -> Vec<Property<ReplicationModel>> {
    vec![
        Property::always(NO_ACKED_WRITE_LOST, |m: &ReplicationModel, s: &ModelState| {
            m.mode != Mode::Quorum || acked_writes_held(s)
        }),
        Property::always(NO_COMMITTED_BATCH_LOST, |m: &ReplicationModel, s: &ModelState| {
            m.mode != Mode::Quorum || committed_held(s)
        }),
        Property::always(LEADER_COMPLETENESS, |m: &ReplicationModel, s: &ModelState| {
            m.mode != Mode::Quorum || leaders_complete(s)
        }),
        Property::always(COMMITTED_ON_ELECTORATE, |m: &ReplicationModel, s: &ModelState| {
            m.mode != Mode::Quorum || committed_on_electorate(m, s)
        }),
        Property::always(LOG_MATCHING, |_, s: &ModelState| log_matching(s)),
        Property::always(COMMIT_MONOTONE, |_, s: &ModelState| {
            !s.history.broken.iter().any(|b| matches!(b, Broken::CommitDecreased(_)))
        }),
        Property::always(LEADER_COMMIT_DURABLE, |_, s: &ModelState| {
            s.nodes.iter().all(|n| !matches!(n.role, Role::Leader { .. }) || n.commit <= n.durable)
        }),
        Property::always(COMMIT_WRITTEN, |_, s: &ModelState| s.nodes.iter().all(|n| n.commit <= n.len())),
        Property::always(ONE_ACKER_PER_TERM, |_, s: &ModelState| one_acker_per_term(s)),
        Property::always(APPLIED_COMMITTED, |_, s: &ModelState| {
            s.nodes.iter().all(|n| n.applied <= n.commit)
        }),
        Property::always(APPLIED_WRITTEN, |_, s: &ModelState| s.nodes.iter().all(|n| n.applied <= n.len())),
        Property::always(APPLIED_IS_COMMITTED, |m: &ReplicationModel, s: &ModelState| {
            m.mode != Mode::Quorum || applied_committed_by_a_leader(s)
        }),
        Property::always(QUARANTINE_UNCOMMITTED, |m: &ReplicationModel, s: &ModelState| {
            m.mode != Mode::Quorum
                || !s
                    .history
                    .broken
                    .iter()
                    .any(|b| matches!(b, Broken::QuarantinedCommitted(..) | Broken::Halted(_)))
        }),
        Property::always(LEADER_HOLDS_PREV, |_, s: &ModelState| {
            !s.history.broken.iter().any(|b| matches!(b, Broken::UnheldPrev(_)))
        }),
        Property::always(NO_HALT_ON_STALE_CHUNK, |_, s: &ModelState| {
            !s.history.broken.iter().any(|b| matches!(b, Broken::HaltedOnChunk(_)))
        }),
        Property::sometimes(SOMETIMES_ACKED, |_, s: &ModelState| !s.history.acked.is_empty()),
        Property::sometimes(SOMETIMES_LEADER_CHANGE, |_, s: &ModelState| s.history.served_by.len() >= 2),
        Property::sometimes(SOMETIMES_QUARANTINE, |_, s: &ModelState| s.history.quarantined),
        Property::sometimes(SOMETIMES_FOLLOWER_APPLIED_PAST_DURABLE, |_, s: &ModelState| {
            s.nodes.iter().any(|n| n.role == Role::Follower && n.applied > n.durable)
        }),
        Property::sometimes(SOMETIMES_HANDED_OVER, |_, s: &ModelState| s.history.handed_over),
        Property::sometimes(SOMETIMES_PULL_PREV_GONE, |_, s: &ModelState| s.history.pull_prev_gone),
        Property::sometimes(SOMETIMES_STALE_CHUNK_REFUSED, |_, s: &ModelState| s.history.stale_chunk_refused),
        Property::sometimes(SOMETIMES_LEADER_MODE_LOSS, |m: &ReplicationModel, s: &ModelState| {
            m.mode == Mode::Leader && !acked_writes_held(s)
        }),
    ]
}

/// Serving leaders: (node index, term).
fn serving_leaders(state: &ModelState) -> impl Iterator<Item = (usize, Term)> + '_ {
    state.nodes.iter().enumerate().filter_map(|(i, node)| match node.role {
        Role::Leader { term, serving: true, .. } => Some((i, term)),
        _ => None,
    })
}

fn acked_writes_held(state: &ModelState) -> bool {
    serving_leaders(state).all(|(i, term)| {
        let node = &state.nodes[i];
        state
            .history
            .acked
            .iter()
            .filter(|a| a.batch.term <= term)
            .all(|a| node.holds(a.batch, a.writer) && node.applied >= a.batch.seqno)
    })
}

fn committed_held(state: &ModelState) -> bool {
    serving_leaders(state).all(|(i, term)| {
        let node = &state.nodes[i];
        state
            .history
            .committed
            .iter()
            .filter(|c| c.position.term <= term)
            .all(|c| node.holds(c.position, c.writer))
    })
}

fn committed_on_electorate(model: &ReplicationModel, state: &ModelState) -> bool {
    let electorate = Quorum::single(model.electorate(state.config));
    state.history.committed.iter().all(|c| {
        let holders: BTreeSet<NodeId> = (0..state.nodes.len())
            .filter(|i| {
                let node = &state.nodes[*i];
                c.position.seqno <= node.durable && node.holds(c.position, c.writer)
            })
            .map(id)
            .collect();
        electorate.is_majority(&holders)
    })
}

fn applied_committed_by_a_leader(state: &ModelState) -> bool {
    state.nodes.iter().all(|node| {
        (1..=node.applied.min(node.len()).get()).all(|seqno| {
            let seqno = tidal_types::Seqno(seqno);
            let (position, writer) = (node.position(seqno), node.batch_at(seqno).map_or(0, |b| b.writer));
            state.history.committed.iter().any(|c| c.position == position && c.writer == writer)
        })
    })
}

fn leaders_complete(state: &ModelState) -> bool {
    state.nodes.iter().all(|node| {
        let Role::Leader { term, .. } = node.role else { return true };
        state.history.committed.iter().filter(|c| c.by < term).all(|c| node.holds(c.position, c.writer))
    })
}

fn log_matching(state: &ModelState) -> bool {
    let ordered = state.nodes.iter().all(|n| n.wal.windows(2).all(|w| w[0].term <= w[1].term));
    let matching = state.nodes.iter().enumerate().all(|(i, a)| {
        state.nodes.iter().skip(i + 1).all(|b| {
            // Holding the same term at the highest such seqno implies the same batches (writers
            // included) up to it.
            let common = a.wal.iter().zip(&b.wal).rposition(|(x, y)| x.term == y.term);
            common.is_none_or(|last| a.wal[..=last] == b.wal[..=last])
        })
    });
    ordered && matching
}

fn one_acker_per_term(state: &ModelState) -> bool {
    let mut acker: std::collections::BTreeMap<Term, NodeId> = std::collections::BTreeMap::new();
    state.history.acked.iter().all(|a| *acker.entry(a.in_term).or_insert(a.by) == a.by)
}

/// Node ids of a model state, for reports.
pub fn node_ids(state: &ModelState) -> Vec<NodeId> {
    (0..state.nodes.len()).map(id).collect()
}
