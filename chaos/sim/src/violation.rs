//! What a run can break: one [`Violation`] per failed check, with the values it found (nodes,
//! seqnos, terms). The checks build them; the reports print them ([`fmt::Display`], the messages
//! the failures have always printed); the counts read their fields ([`Violation::lost_write`]).
//! Nothing parses a printed violation back.
//!
//! The invariant numbers are those of `docs/PROTOCOL.md` ("Invariants the simulation checks").

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// A node of the simulated cluster by its index; printed `n1`, `n2`, … as in the traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Node(pub usize);

impl fmt::Display for Node {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "n{}", self.0 + 1)
    }
}

/// A stream event as the checks compare it: `(offset, writer id)`.
pub type StreamEntry = (u64, u64);

/// A feed as read from one node: `(item, score)` in order.
pub type FeedItems = Vec<(u64, f64)>;

/// One broken invariant (or a check that could not be made), with what the check saw.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Violation {
    // Invariant 1: no acknowledged write is lost.
    /// An acknowledged item is not readable on a node at the converged frontier.
    AckedItemUnreadable {
        /// The write's id.
        id: u64,
        /// The seqno it was acknowledged with.
        seqno: u64,
        /// The node that acknowledged it.
        acked_by: Node,
        /// The node that did not return it.
        node: Node,
        /// What the read returned (status and body, or the error).
        read: String,
    },
    /// An acknowledged write's seqno is above the frontier every node converged to.
    AckedAboveFrontier {
        /// The write's id.
        id: u64,
        /// The seqno it was acknowledged with.
        seqno: u64,
        /// The converged commit frontier.
        frontier: u64,
    },

    // Invariant 2: after heal, every node has the same state, reached through the log.
    /// The nodes' digests at one applied seqno differ.
    DigestMismatch {
        /// Every node's `(applied seqno, digest)`.
        digests: Vec<(u64, String)>,
    },
    /// A node's digest could not be read.
    DigestUnreadable {
        /// The node.
        node: Node,
        /// The error.
        error: String,
    },
    /// The cluster did not converge (one leader, every node on its term, durable = applied =
    /// commit) within the deadline after the heal.
    ConvergedTooLate {
        /// The deadline.
        deadline: Duration,
        /// Every node's status at the deadline.
        statuses: Vec<String>,
    },
    /// A node installed a snapshot in a family that heals through the log only.
    SnapshotInstalled {
        /// The node.
        node: Node,
        /// Its `tidal_snapshot_installs_total`.
        installs: f64,
    },

    // Invariant 3: every WAL is well formed.
    /// A WAL segment could not be read from the simulated disk.
    WalUnreadable {
        /// The node.
        node: Node,
        /// The segment.
        segment: PathBuf,
        /// The error.
        error: String,
    },
    /// A WAL batch does not decode or verify.
    WalCorrupt {
        /// The node.
        node: Node,
        /// The segment.
        segment: PathBuf,
        /// The batch's offset in the segment.
        offset: usize,
        /// The decoder's error.
        error: String,
    },
    /// A WAL batch does not start right after the one before it.
    WalNotContiguous {
        /// The node.
        node: Node,
        /// The batch's first seqno.
        seqno: u64,
        /// The last seqno of the batch before it.
        after: u64,
    },
    /// A WAL batch's term is below the one before it.
    TermDecreases {
        /// The node.
        node: Node,
        /// The term before.
        from: u64,
        /// The batch's term.
        to: u64,
        /// The batch's first seqno.
        seqno: u64,
    },
    /// A WAL batch's logged time is below an earlier batch's.
    LoggedTimeDecreases {
        /// The node.
        node: Node,
        /// The batch's first seqno.
        seqno: u64,
        /// Its logged time (unix ms).
        time: u64,
        /// The greatest logged time before it.
        previous: u64,
    },
    /// One Idempotency-Key names two batches of a WAL (a retried write applied twice).
    Duplicated {
        /// The node.
        node: Node,
        /// The Idempotency-Key.
        key: String,
        /// The first seqnos of the two batches.
        seqnos: (u64, u64),
    },
    /// A WAL segment grew past the size limit before its last batch.
    SegmentTooLarge {
        /// The node.
        node: Node,
        /// The segment.
        segment: PathBuf,
        /// Its bytes before its last batch.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// Fewer WAL rotations in all than the scenario asks for.
    TooFewRotations {
        /// Rotations, summed over the nodes.
        rotations: u64,
        /// The scenario's minimum.
        expected: u64,
        /// Writes acknowledged.
        acked: u64,
    },

    // Invariant 4: one leader per term, fencing, log matching.
    /// A term had two leaders (as sampled from the nodes' status).
    TwoLeaders {
        /// The term.
        term: u64,
        /// The node ids that reported themselves leader of it.
        leaders: BTreeSet<u64>,
    },
    /// Two nodes hold different batches at one seqno.
    LogMismatch {
        /// The two nodes.
        nodes: (Node, Node),
        /// The seqno.
        seqno: u64,
        /// Their batches' terms.
        terms: (u64, u64),
    },
    /// A node was about to ship (or serve) a `prev` its own log does not hold
    /// (`tidal_replication_refusals_total{reason="unheld_prev"}`).
    UnheldPrev {
        /// The node.
        node: Node,
        /// How many times.
        count: f64,
    },
    /// A receiver halted (`tidal_replication_refusals_total{reason="halted"}`): quorum mode must
    /// never halt.
    ReceiverHalted {
        /// The node.
        node: Node,
        /// Messages refused with a halt.
        count: f64,
    },
    /// A redelivered copy was answered in a way that breaks fencing (an older term's ship matched
    /// by a newer follower, a vote granted against a later vote, a probe of another term), or a
    /// halt.
    Redelivery {
        /// The node that sent the copy.
        node: Node,
        /// What the copy was and how it was answered.
        answer: String,
    },

    // Invariant 5: feed parity.
    /// A user's feed could not be read at one applied seqno on every node.
    FeedUnreadable {
        /// The user.
        user: u64,
        /// The nodes whose feed was read, with the applied seqno it was read at.
        seen: Vec<(Node, u64)>,
    },
    /// Two nodes list different feeds for a user at one applied seqno.
    FeedMismatch {
        /// The user.
        user: u64,
        /// The applied seqno.
        seqno: u64,
        /// The first node's feed.
        first: (Node, FeedItems),
        /// The other node's feed.
        other: (Node, FeedItems),
    },

    // Invariant 5, streams: the same events at the same offsets on every node, none acknowledged
    // lost, a tx all or nothing, a reader that moves between nodes never skipping or repeating.
    /// A node's stream could not be read whole at the converged seqno.
    StreamUnreadable {
        /// The node.
        node: Node,
        /// What the read returned.
        read: String,
    },
    /// Two nodes hold different events (offset, writer id) in the stream.
    StreamMismatch {
        /// The first node and its event count.
        first: (Node, usize),
        /// The other node and its event count.
        other: (Node, usize),
        /// The first position where they differ: `(offset, id)` on each, if any.
        at: (Option<StreamEntry>, Option<StreamEntry>),
    },
    /// An acknowledged publish is not in the stream at its offset.
    AckedEventLost {
        /// The write's id.
        id: u64,
        /// The offset it was acknowledged with.
        offset: u64,
    },
    /// A tx left its item without its event or its event without its item.
    TxHalfApplied {
        /// The write's id.
        id: u64,
        /// Whether the item exists.
        item: bool,
        /// Whether the event exists.
        event: bool,
    },
    /// A reader that resumed by its last offset on one node after another skipped or repeated an
    /// event of the final stream.
    ReaderGap {
        /// How many events it had read in order.
        position: usize,
        /// The offset it read there.
        read: u64,
        /// The offset the final stream holds there, if any.
        expected: Option<u64>,
    },

    // Invariant 6: inboxes deliver every acknowledged send exactly once, in order per topic.
    /// An acknowledged send was never delivered, not even by the drain after the heal.
    InboxMessageLost {
        /// The writer id.
        id: u64,
        /// The sequence it was acknowledged with.
        inbox_seq: u64,
    },
    /// A message was delivered to more than one receive.
    InboxDeliveredTwice {
        /// The message.
        inbox_seq: u64,
        /// The receive ids that got it.
        receives: Vec<String>,
    },
    /// A topic delivered a message after a later one.
    InboxOutOfOrder {
        /// The topic.
        topic: String,
        /// `(receive seqno, inbox_seq)` delivered first.
        earlier: (u64, u64),
        /// `(receive seqno, inbox_seq)` delivered after it.
        later: (u64, u64),
    },
    /// A resend of an acknowledged message was not answered as the first send.
    InboxResendAnsweredAsNew {
        /// The writer id.
        id: u64,
        /// The first send's sequence.
        first: u64,
        /// What the resend answered.
        resent: u64,
    },
    /// A receive was refused with a 4xx.
    InboxReceiveRefused {
        /// The receive id.
        receive_id: String,
        /// The status.
        status: u16,
        /// The body.
        body: String,
    },
    /// The inbox could not be read on a node, or a receive after the heal got no answer.
    InboxUnreadable {
        /// The node, if one was asked.
        node: Option<Node>,
        /// What the read or the receive returned.
        read: String,
    },
    /// After the drain, nodes hold different inboxes or a backlog is left:
    /// `(node, consumed, backlog)` each.
    InboxStateDiffers {
        /// Each node's view.
        views: Vec<(Node, u64, u64)>,
    },

    // Invariant 7: no unexpected exit.
    /// A node exited, and neither a refusal of a damaged WAL nor an injected fatal fault explains
    /// it.
    UnexpectedExit {
        /// The node.
        node: Node,
        /// Simulated ms since the load started.
        at_ms: u64,
        /// Its error.
        error: String,
    },
    /// A node started on a damaged WAL instead of refusing.
    StartedOnDamagedWal {
        /// The node.
        node: Node,
        /// The damage.
        damage: String,
    },
    /// The simulation itself stopped (a host's error, a panic).
    SimulationStopped {
        /// turmoil's error.
        error: String,
    },

    // The register family: per-key linearizability.
    /// A key's history could not be fed to the checker.
    MalformedHistory {
        /// The register key.
        key: u64,
        /// The checker's error.
        error: String,
    },
    /// A key's history has no linearization.
    NotLinearizable {
        /// The register key.
        key: u64,
        /// Operations in its history.
        operations: usize,
        /// The history in real-time order.
        history: String,
    },

    // The client's answers.
    /// No node led within the deadline after the start.
    NoFirstLeader {
        /// The deadline.
        deadline: Duration,
    },
    /// A write was answered 2xx without a seqno.
    AckWithoutSeqno {
        /// The write's id.
        id: u64,
    },
    /// A write was refused with a 4xx (other than 429).
    WriteRefused {
        /// The write's id.
        id: u64,
        /// The status.
        status: u16,
        /// The body's start.
        body: String,
    },
    /// An embedding was refused with a 4xx (other than 429).
    EmbeddingRefused {
        /// The item's id.
        id: u64,
        /// The status.
        status: u16,
        /// The body's start.
        body: String,
    },
    /// A register overwrite was refused with a 4xx (other than 429).
    RegisterWriteRefused {
        /// The register key.
        key: u64,
        /// The version written.
        version: u64,
        /// The status.
        status: u16,
        /// The body's start.
        body: String,
    },
    /// A register read answered 200 without the version it holds.
    RegisterReadWithoutVersion {
        /// The register key.
        key: u64,
        /// The body's start.
        body: String,
    },
    /// A counter a check reads is missing from a node's `/metrics`.
    MetricMissing {
        /// The node.
        node: Node,
        /// The counter, with its labels.
        metric: String,
    },

    // The disk family's file faults (decisions/020).
    /// A node acknowledged a write of a term whose stream baseline it could not write.
    ServedWithoutBaseline {
        /// The node.
        node: Node,
        /// The write's id.
        id: u64,
        /// Its seqno.
        seqno: u64,
        /// The term.
        term: u64,
        /// The step of the baseline's write that failed.
        step: String,
    },
    /// A node started although writing its CRDT incarnation failed.
    StartedWithoutIncarnation {
        /// The node.
        node: Node,
    },

    // The fatal-handover family (decisions/059).
    /// The node whose WAL failed was not the leader.
    HandoverNotLeader {
        /// The node whose WAL failed.
        node: Node,
        /// The node that acknowledged the last write before the fault.
        last_acker: Option<Node>,
    },
    /// The node whose WAL failed did not exit.
    HandoverNoExit {
        /// The node.
        node: Node,
    },
    /// Another node acknowledged a write only after the failover bound.
    HandoverTooLate {
        /// The node whose WAL failed.
        node: Node,
        /// Simulated ms from the fault to the first write another node acknowledged.
        after_ms: u64,
        /// The bound, in ms.
        bound_ms: u64,
    },
    /// No other node acknowledged a write after the fault.
    HandoverNoFailover {
        /// The node whose WAL failed.
        node: Node,
    },

    // Scripted histories.
    /// A step of a scripted history was not reached: the run proves nothing about its window.
    ScriptMissed {
        /// The script.
        script: String,
        /// The step's number (from 1).
        step: usize,
        /// The step.
        what: String,
        /// Simulated ms since the load started.
        at_ms: u64,
        /// Why.
        why: String,
    },
}

impl Violation {
    /// The id of the acknowledged write this violation says is lost (invariant 1), if any.
    pub fn lost_write(&self) -> Option<u64> {
        match self {
            Violation::AckedItemUnreadable { id, .. }
            | Violation::AckedAboveFrontier { id, .. }
            | Violation::AckedEventLost { id, .. }
            | Violation::InboxMessageLost { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// The first 200 characters of a body, as the reports quote it.
pub fn body_start(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(200).collect()
}

/// Milliseconds of a duration, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::AckedItemUnreadable { id, seqno, acked_by, node, read } => {
                write!(f, "invariant 1: acked item {id} (seqno {seqno} from {acked_by}) not readable on {node}: {read}")
            }
            Violation::AckedAboveFrontier { id, seqno, frontier } => {
                write!(f, "invariant 1: acked write {id} has seqno {seqno} above the converged frontier {frontier}")
            }
            Violation::DigestMismatch { digests } => write!(f, "invariant 2: digests differ after heal: {digests:?}"),
            Violation::DigestUnreadable { node, error } => write!(f, "digest of {node}: {error}"),
            Violation::ConvergedTooLate { deadline, statuses } => {
                write!(f, "heal gate: no convergence within {deadline:?} after heal: {}", statuses.join("; "))
            }
            Violation::SnapshotInstalled { node, installs } => {
                write!(f, "invariant 2: {node} healed outside the log ({installs} snapshot installs)")
            }
            Violation::WalUnreadable { node, segment, error } => {
                write!(f, "{node}: read {}: {error}", segment.display())
            }
            Violation::WalCorrupt { node, segment, offset, error } => {
                write!(f, "invariant 3: {node}: {} offset {offset}: {error}", segment.display())
            }
            Violation::WalNotContiguous { node, seqno, after } => {
                write!(f, "invariant 3: {node}: batch at seqno {seqno} follows one ending at {after}")
            }
            Violation::TermDecreases { node, from, to, seqno } => {
                write!(f, "invariant 3: {node}: term goes down from {from} to {to} at seqno {seqno}")
            }
            Violation::LoggedTimeDecreases { node, seqno, time, previous } => write!(
                f,
                "logged time: {node}: batch at seqno {seqno} has time {time} below the previous {previous}"
            ),
            Violation::Duplicated { node, key, seqnos: (earlier, later) } => write!(
                f,
                "duplicated: {node}: the write with Idempotency-Key {key} is in the log twice (seqnos {earlier} and {later})"
            ),
            Violation::SegmentTooLarge { node, segment, bytes, limit } => write!(
                f,
                "rotation: {node}: {} holds {bytes} bytes before its last batch, past the {limit}-byte limit",
                segment.display()
            ),
            Violation::TooFewRotations { rotations, expected, acked } => write!(
                f,
                "rotation: {rotations} WAL segments rotated in all, expected at least {expected} ({acked} writes acked)"
            ),
            Violation::TwoLeaders { term, leaders } => write!(f, "invariant 4: term {term} had leaders {leaders:?}"),
            Violation::LogMismatch { nodes: (a, b), seqno, terms: (ta, tb) } => write!(
                f,
                "log matching: {a} and {b} hold different batches at seqno {seqno} (terms {ta} and {tb})"
            ),
            Violation::UnheldPrev { node, count } => {
                write!(f, "log matching: {node} was about to ship {count} times a prev its own log does not hold")
            }
            Violation::ReceiverHalted { node, count } => write!(
                f,
                "receiver halted: {node} refused {count} messages with a halt (quorum mode must never halt)"
            ),
            Violation::Redelivery { node, answer } => write!(f, "redelivery: a copy {node} sent to {answer}"),
            Violation::FeedUnreadable { user, seen } => {
                let seen: Vec<String> = seen.iter().map(|(node, at)| format!("{node} at {at}")).collect();
                write!(
                    f,
                    "invariant 5: could not read u{user}'s feed at one applied seqno on every node ({})",
                    seen.join(", ")
                )
            }
            Violation::StreamUnreadable { node, read } => write!(f, "invariant 5: the stream of {node} is unreadable: {read}"),
            Violation::StreamMismatch { first, other, at } => write!(
                f,
                "invariant 5: streams differ: {} holds {} events, {} holds {}; first difference {:?} vs {:?}",
                first.0, first.1, other.0, other.1, at.0, at.1
            ),
            Violation::AckedEventLost { id, offset } => {
                write!(f, "invariant 1: acked publish {id} (offset {offset}) is not in the stream")
            }
            Violation::TxHalfApplied { id, item, event } => {
                write!(f, "tx atomicity: write {id} left item {item}, event {event}")
            }
            Violation::ReaderGap { position, read, expected } => write!(
                f,
                "invariant 5: a reader resuming across nodes read offset {read} as event {position}, the stream holds {expected:?} there"
            ),
            Violation::InboxMessageLost { id, inbox_seq } => {
                write!(f, "invariant 6: acked inbox send {id} (inbox_seq {inbox_seq}) was never delivered")
            }
            Violation::InboxDeliveredTwice { inbox_seq, receives } => {
                write!(f, "invariant 6: inbox_seq {inbox_seq} delivered to several receives: {receives:?}")
            }
            Violation::InboxOutOfOrder { topic, earlier, later } => write!(
                f,
                "invariant 6: topic {topic} delivered inbox_seq {} (receive {}) after {} (receive {})",
                later.1, later.0, earlier.1, earlier.0
            ),
            Violation::InboxResendAnsweredAsNew { id, first, resent } => {
                write!(f, "invariant 6: resend of inbox send {id} (first {first}) answered {resent}, not a duplicate")
            }
            Violation::InboxReceiveRefused { receive_id, status, body } => {
                write!(f, "receive {receive_id} refused with {status}: {body}")
            }
            Violation::InboxUnreadable { node, read } => match node {
                Some(node) => write!(f, "invariant 6: the inbox of {node} is unreadable: {read}"),
                None => write!(f, "invariant 6: receive {read} got no answer after the heal"),
            },
            Violation::InboxStateDiffers { views } => {
                write!(f, "invariant 6: inboxes differ or hold a backlog after the drain (node, consumed, backlog): {views:?}")
            }
            Violation::FeedMismatch { user, seqno, first: (a, first), other: (b, other) } => {
                write!(f, "invariant 5: feed of u{user} at seqno {seqno} differs: {a} {first:?}, {b} {other:?}")
            }
            Violation::UnexpectedExit { node, at_ms, error } => write!(f, "{node} exited at {at_ms} ms: {error}"),
            Violation::StartedOnDamagedWal { node, damage } => {
                write!(f, "disk: {node} started on a damaged WAL instead of refusing ({damage})")
            }
            Violation::SimulationStopped { error } => write!(f, "simulation stopped: {error}"),
            Violation::MalformedHistory { key, error } => {
                write!(f, "linearizability: key {key}: malformed history: {error}")
            }
            Violation::NotLinearizable { key, operations, history } => write!(
                f,
                "linearizability: key {key}: the history of {operations} operations has no linearization: {history}"
            ),
            Violation::NoFirstLeader { deadline } => write!(f, "no leader within {deadline:?} of start"),
            Violation::AckWithoutSeqno { id } => write!(f, "write {id}: 2xx without a seqno"),
            Violation::WriteRefused { id, status, body } => write!(f, "write {id} refused with {status}: {body}"),
            Violation::EmbeddingRefused { id, status, body } => {
                write!(f, "embedding {id} refused with {status}: {body}")
            }
            Violation::RegisterWriteRefused { key, version, status, body } => {
                write!(f, "register write {key}={version} refused with {status}: {body}")
            }
            Violation::RegisterReadWithoutVersion { key, body } => {
                write!(f, "register read {key}: 200 without metadata.w: {body}")
            }
            Violation::MetricMissing { node, metric } => write!(f, "{node}: no {metric} in /metrics"),
            Violation::ServedWithoutBaseline { node, id, seqno, term, step } => write!(
                f,
                "file faults: {node} acknowledged write {id} (seqno {seqno}) in term {term} although its stream baseline of that term was not written ({step} failed)"
            ),
            Violation::StartedWithoutIncarnation { node } => write!(
                f,
                "file faults: {node} did not refuse to start although writing its CRDT incarnation failed"
            ),
            Violation::HandoverNotLeader { node, last_acker } => write!(
                f,
                "fatal handover: {node} was not the leader when its WAL failed (the last write was acknowledged by {})",
                last_acker.map_or("nobody".to_string(), |acker| acker.to_string())
            ),
            Violation::HandoverNoExit { node } => write!(
                f,
                "fatal handover: {node} did not exit after its WAL failed (a supervisor would never restart it)"
            ),
            Violation::HandoverTooLate { node, after_ms, bound_ms } => write!(
                f,
                "fatal handover: the first write acknowledged by another node came {after_ms} ms after {node}'s WAL failed (bound {bound_ms} ms)"
            ),
            Violation::HandoverNoFailover { node } => {
                write!(f, "fatal handover: no other node acknowledged a write after {node}'s WAL failed")
            }
            Violation::ScriptMissed { script, step, what, at_ms, why } => write!(
                f,
                "script {script}: step {step} {what} at {at_ms} ms: {why} (the scripted history was not reached)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_writes_are_read_from_the_invariant_1_variants_only() {
        let violations = [
            Violation::AckedItemUnreadable {
                id: 7,
                seqno: 12,
                acked_by: Node(0),
                node: Node(2),
                read: "404".into(),
            },
            Violation::AckedAboveFrontier { id: 7, seqno: 12, frontier: 11 },
            Violation::AckWithoutSeqno { id: 9 },
        ];
        let lost: Vec<u64> = violations.iter().filter_map(Violation::lost_write).collect();
        assert_eq!(lost, [7, 7]);
        assert_eq!(
            violations[0].to_string(),
            "invariant 1: acked item 7 (seqno 12 from n1) not readable on n3: 404"
        );
    }

    #[test]
    fn a_violation_crosses_a_process_boundary_as_json() {
        let violation = Violation::LogMismatch { nodes: (Node(0), Node(2)), seqno: 6, terms: (3, 3) };
        let json = serde_json::to_string(&violation).unwrap();
        assert_eq!(serde_json::from_str::<Violation>(&json).unwrap(), violation);
        assert_eq!(
            violation.to_string(),
            "log matching: n1 and n3 hold different batches at seqno 6 (terms 3 and 3)"
        );
    }
}
