//! Domain forms of the replication messages, and their conversion from and to protobuf.
//!
//! Everything that arrives from the network is checked here before the cluster code sees it: the
//! concatenated batches are split and each one verified (header, BLAKE3 seal), positions are
//! required, and sizes are bounded. A message that fails any check is a [`WireError`], answered with
//! `invalid_argument`, never half-used.

use crate::pb;
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::{decode_header, Batch, DecodeError};

/// Largest concatenation of batches one message may carry: one whole maximal batch (64 MiB) plus
/// room for headers, so a batch that can be written can always be shipped (no livelock).
pub const MESSAGE_BATCH_BYTES_MAX: usize = 64 * 1024 * 1024 + 1024 * 1024;

/// Why a received message is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A required field is missing.
    #[error("missing field {0}")]
    Missing(&'static str),
    /// The batches do not decode or verify.
    #[error("batch at byte {offset}: {reason}")]
    BadBatch {
        /// Byte offset within the concatenation.
        offset: usize,
        /// What failed.
        reason: String,
    },
    /// A field's value breaks the message's rules.
    #[error("{what}: {reason}")]
    Invalid {
        /// Which message.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Over a size bound.
    #[error("{what} is {got} bytes, over the limit of {max}")]
    TooLarge {
        /// What.
        what: &'static str,
        /// Size.
        got: usize,
        /// Limit.
        max: usize,
    },
}

pub(crate) fn position(p: Option<pb::Position>, field: &'static str) -> Result<TermSeqno, WireError> {
    let p = p.ok_or(WireError::Missing(field))?;
    Ok(TermSeqno { term: Term(p.term), seqno: Seqno(p.seqno) })
}

impl From<TermSeqno> for pb::Position {
    fn from(p: TermSeqno) -> pb::Position {
        pb::Position { term: p.term.0, seqno: p.seqno.0 }
    }
}

/// Splits and verifies concatenated encoded batches. Each batch is a slice of `bytes` (no copy).
pub fn split_batches(bytes: impl Into<bytes::Bytes>) -> Result<Vec<Batch>, WireError> {
    let bytes: bytes::Bytes = bytes.into();
    if bytes.len() > MESSAGE_BATCH_BYTES_MAX {
        return Err(WireError::TooLarge { what: "batches", got: bytes.len(), max: MESSAGE_BATCH_BYTES_MAX });
    }
    let mut batches = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        let bad = |error: DecodeError| WireError::BadBatch { offset, reason: error.to_string() };
        // The header says how long the batch is; the seal is checked once, by `from_encoded`.
        let rest = &bytes[offset..];
        let len = decode_header(rest).map_err(bad)?.encoded_len();
        if rest.len() < len {
            return Err(bad(DecodeError::Truncated { needed: len, available: rest.len() }));
        }
        batches.push(Batch::from_encoded(bytes.slice(offset..offset + len)).map_err(bad)?);
        offset += len;
    }
    Ok(batches)
}

/// Concatenates encoded batches for the wire.
pub fn join_batches(batches: &[Batch]) -> Vec<u8> {
    let mut out = Vec::with_capacity(batches.iter().map(|b| b.encoded().len()).sum());
    for batch in batches {
        out.extend_from_slice(batch.encoded());
    }
    out
}

/// A ship (leader → follower), checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ship {
    /// Cluster the sender belongs to.
    pub cluster_id: String,
    /// Sender's term.
    pub term: Term,
    /// Sender.
    pub leader: NodeId,
    /// Position just before the first batch.
    pub prev: TermSeqno,
    /// Sender's commit frontier.
    pub commit: Seqno,
    /// The term's stream baseline.
    pub baseline: TermSeqno,
    /// Verified batches, in the sender's order.
    pub batches: Vec<Batch>,
}

impl TryFrom<pb::ShipRequest> for Ship {
    type Error = WireError;

    fn try_from(request: pb::ShipRequest) -> Result<Ship, WireError> {
        Ok(Ship {
            prev: position(request.prev, "prev")?,
            baseline: position(request.baseline, "baseline")?,
            batches: split_batches(request.batches)?,
            cluster_id: request.cluster_id,
            term: Term(request.term),
            leader: NodeId(request.leader_id),
            commit: Seqno(request.commit_seqno),
        })
    }
}

impl From<&Ship> for pb::ShipRequest {
    fn from(ship: &Ship) -> pb::ShipRequest {
        pb::ShipRequest {
            cluster_id: ship.cluster_id.clone(),
            term: ship.term.0,
            leader_id: ship.leader.0,
            prev: Some(ship.prev.into()),
            commit_seqno: ship.commit.0,
            baseline: Some(ship.baseline.into()),
            batches: join_batches(&ship.batches),
        }
    }
}

/// How a follower answered a ship.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShipOutcome {
    /// Accepted through this position.
    Matched(TermSeqno),
    /// Sender's term is below ours.
    Fenced,
    /// Sender's term is above ours.
    NotYet,
    /// We lack `prev`; our last position.
    Gap(TermSeqno),
    /// We hold prev.seqno with another term; our term history.
    Diverged(Vec<TermSeqno>),
    /// Malformed or misaligned; nothing written.
    Refused(String),
}

/// A follower's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShipAnswer {
    /// The follower's term when it answered.
    pub term: Term,
    /// Its durable frontier.
    pub durable: Seqno,
    /// Its applied frontier.
    pub applied: Seqno,
    /// The outcome.
    pub outcome: ShipOutcome,
}

pub(crate) fn history_to_pb(history: &[TermSeqno]) -> pb::TermHistory {
    pb::TermHistory { entries: history.iter().map(|p| (*p).into()).collect() }
}

pub(crate) fn history_from_pb(history: pb::TermHistory) -> Vec<TermSeqno> {
    history.entries.into_iter().map(|p| TermSeqno { term: Term(p.term), seqno: Seqno(p.seqno) }).collect()
}

impl From<&ShipAnswer> for pb::ShipReply {
    fn from(answer: &ShipAnswer) -> pb::ShipReply {
        use pb::ship_reply::Outcome;
        let outcome = match &answer.outcome {
            ShipOutcome::Matched(p) => Outcome::Matched((*p).into()),
            ShipOutcome::Fenced => Outcome::Fenced(pb::Empty {}),
            ShipOutcome::NotYet => Outcome::NotYet(pb::Empty {}),
            ShipOutcome::Gap(p) => Outcome::Gap((*p).into()),
            ShipOutcome::Diverged(history) => Outcome::Diverged(history_to_pb(history)),
            ShipOutcome::Refused(reason) => Outcome::Refused(reason.clone()),
        };
        pb::ShipReply {
            term: answer.term.0,
            durable_seqno: answer.durable.0,
            applied_seqno: answer.applied.0,
            outcome: Some(outcome),
        }
    }
}

impl TryFrom<pb::ShipReply> for ShipAnswer {
    type Error = WireError;

    fn try_from(reply: pb::ShipReply) -> Result<ShipAnswer, WireError> {
        use pb::ship_reply::Outcome;
        let outcome = match reply.outcome.ok_or(WireError::Missing("outcome"))? {
            Outcome::Matched(p) => ShipOutcome::Matched(position(Some(p), "matched")?),
            Outcome::Fenced(_) => ShipOutcome::Fenced,
            Outcome::NotYet(_) => ShipOutcome::NotYet,
            Outcome::Gap(p) => ShipOutcome::Gap(position(Some(p), "gap")?),
            Outcome::Diverged(history) => ShipOutcome::Diverged(history_from_pb(history)),
            Outcome::Refused(reason) => ShipOutcome::Refused(reason),
        };
        Ok(ShipAnswer {
            term: Term(reply.term),
            durable: Seqno(reply.durable_seqno),
            applied: Seqno(reply.applied_seqno),
            outcome,
        })
    }
}

/// A pull request (follower → log holder), checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pull {
    /// Cluster.
    pub cluster_id: String,
    /// Requester's term.
    pub term: Term,
    /// Requester.
    pub node: NodeId,
    /// The requester's last durable position; the stream starts after it.
    pub from: TermSeqno,
    /// Requested chunk bound.
    pub chunk_bytes_max: u64,
}

impl TryFrom<pb::PullRequest> for Pull {
    type Error = WireError;

    fn try_from(request: pb::PullRequest) -> Result<Pull, WireError> {
        Ok(Pull {
            from: position(request.from, "from")?,
            cluster_id: request.cluster_id,
            term: Term(request.term),
            node: NodeId(request.node_id),
            chunk_bytes_max: request.chunk_bytes_max,
        })
    }
}

impl From<&Pull> for pb::PullRequest {
    fn from(pull: &Pull) -> pb::PullRequest {
        pb::PullRequest {
            cluster_id: pull.cluster_id.clone(),
            term: pull.term.0,
            node_id: pull.node.0,
            from: Some(pull.from.into()),
            chunk_bytes_max: pull.chunk_bytes_max,
        }
    }
}

/// One chunk of a pull stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The server's current term.
    pub term: Term,
    /// The leader the server knows.
    pub leader: NodeId,
    /// The current term's baseline.
    pub baseline: TermSeqno,
    /// The server's commit frontier.
    pub commit: Seqno,
    /// What the chunk holds.
    pub outcome: ChunkOutcome,
}

/// What a pull chunk holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkOutcome {
    /// Batches following `prev`.
    Batches {
        /// Position before the first batch.
        prev: TermSeqno,
        /// Verified batches.
        batches: Vec<Batch>,
    },
    /// What a server sends instead of [`ChunkOutcome::Batches`]: whole batches following `prev`,
    /// as its WAL holds them, concatenated, their seals not checked by the sender. Never received:
    /// the conversion from the wire splits and verifies them into [`ChunkOutcome::Batches`].
    Encoded {
        /// Position before the first batch.
        prev: TermSeqno,
        /// The concatenated encoded batches.
        bytes: Vec<u8>,
    },
    /// The server does not hold `from` with that term; its term history.
    Diverged(Vec<TermSeqno>),
    /// `from` is below the server's purge point.
    Purged(TermSeqno),
}

impl From<Chunk> for pb::PullChunk {
    fn from(chunk: Chunk) -> pb::PullChunk {
        use pb::pull_chunk::Outcome;
        let outcome = match chunk.outcome {
            ChunkOutcome::Batches { prev, batches } => Outcome::Batches(pb::Batches {
                prev: Some(prev.into()),
                batches: join_batches(&batches).into(),
            }),
            // Moved, not copied.
            ChunkOutcome::Encoded { prev, bytes } => {
                Outcome::Batches(pb::Batches { prev: Some(prev.into()), batches: bytes.into() })
            }
            ChunkOutcome::Diverged(history) => Outcome::Diverged(history_to_pb(&history)),
            ChunkOutcome::Purged(p) => Outcome::Purged(p.into()),
        };
        pb::PullChunk {
            term: chunk.term.0,
            leader_id: chunk.leader.0,
            baseline: Some(chunk.baseline.into()),
            commit_seqno: chunk.commit.0,
            outcome: Some(outcome),
        }
    }
}

impl TryFrom<pb::PullChunk> for Chunk {
    type Error = WireError;

    fn try_from(chunk: pb::PullChunk) -> Result<Chunk, WireError> {
        use pb::pull_chunk::Outcome;
        let outcome = match chunk.outcome.ok_or(WireError::Missing("outcome"))? {
            Outcome::Batches(b) => {
                // The received bytes are a slice of the client's decode buffer, which can be up to
                // twice the chunk (it grows by doubling). A batch the ship tail keeps would keep
                // all of it, so the chunk is copied once into a buffer of its own size; the
                // batches are slices of that (experiments/053). The bound is checked first.
                let bytes = if b.batches.len() > MESSAGE_BATCH_BYTES_MAX {
                    b.batches
                } else {
                    bytes::Bytes::copy_from_slice(&b.batches)
                };
                ChunkOutcome::Batches { prev: position(b.prev, "prev")?, batches: split_batches(bytes)? }
            }
            Outcome::Diverged(history) => ChunkOutcome::Diverged(history_from_pb(history)),
            Outcome::Purged(p) => ChunkOutcome::Purged(position(Some(p), "purged")?),
        };
        Ok(Chunk {
            term: Term(chunk.term),
            leader: NodeId(chunk.leader_id),
            baseline: position(chunk.baseline, "baseline")?,
            commit: Seqno(chunk.commit_seqno),
            outcome,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tidal_types::RecordKind;

    fn batch(first: u64, count: u32) -> Batch {
        Batch::new(RecordKind::ItemMetadata, Term(1), Seqno(first), count, &[0u8; 20])
    }

    fn ship() -> Ship {
        Ship {
            cluster_id: "c".into(),
            term: Term(2),
            leader: NodeId(1),
            prev: TermSeqno { term: Term(1), seqno: Seqno(4) },
            commit: Seqno(3),
            baseline: TermSeqno { term: Term(1), seqno: Seqno(0) },
            batches: vec![batch(5, 1), batch(6, 3)],
        }
    }

    #[test]
    fn ship_round_trips() {
        let original = ship();
        let wire = pb::ShipRequest::from(&original);
        assert_eq!(Ship::try_from(wire).unwrap(), original);
    }

    #[test]
    fn split_batches_are_slices_of_the_message_not_copies() {
        let bytes = bytes::Bytes::from(join_batches(&[batch(5, 1), batch(6, 3)]));
        let range = bytes.as_ptr_range();
        let batches = split_batches(bytes.clone()).unwrap();
        assert_eq!(batches.len(), 2);
        for batch in &batches {
            assert!(range.contains(&batch.encoded().as_ptr()), "batch {} was copied", batch.first_seqno());
        }
    }

    #[test]
    fn answers_round_trip() {
        for outcome in [
            ShipOutcome::Matched(TermSeqno { term: Term(2), seqno: Seqno(9) }),
            ShipOutcome::Fenced,
            ShipOutcome::NotYet,
            ShipOutcome::Gap(TermSeqno::default()),
            ShipOutcome::Diverged(vec![TermSeqno { term: Term(1), seqno: Seqno(1) }]),
            ShipOutcome::Refused("no".into()),
        ] {
            let answer = ShipAnswer { term: Term(2), durable: Seqno(9), applied: Seqno(8), outcome };
            assert_eq!(ShipAnswer::try_from(pb::ShipReply::from(&answer)).unwrap(), answer);
        }
    }

    #[test]
    fn missing_fields_and_every_truncation_or_flip_are_refused() {
        let mut wire = pb::ShipRequest::from(&ship());
        wire.prev = None;
        assert_eq!(Ship::try_from(wire).unwrap_err(), WireError::Missing("prev"));
        let bytes = pb::ShipRequest::from(&ship()).batches;
        for len in 1..bytes.len() {
            let cut = [&bytes[..len]].concat();
            let result = split_batches(cut);
            let whole_prefix = len == batch(5, 1).encoded().len();
            assert_eq!(result.is_ok(), whole_prefix, "truncation at {len}");
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(split_batches(flipped).is_err(), "flip of bit {bit} accepted");
        }
    }

    fn encoded_chunk(bytes: Vec<u8>) -> pb::PullChunk {
        pb::PullChunk::from(Chunk {
            term: Term(2),
            leader: NodeId(1),
            baseline: TermSeqno::default(),
            commit: Seqno(3),
            outcome: ChunkOutcome::Encoded { prev: TermSeqno { term: Term(1), seqno: Seqno(4) }, bytes },
        })
    }

    #[test]
    fn an_encoded_chunk_arrives_as_verified_batches_or_not_at_all() {
        let batches = vec![batch(5, 1), batch(6, 3)];
        let bytes = join_batches(&batches);
        {
            tracing::info!("phase: the sender's raw bytes arrive as the same batches");
            let chunk = Chunk::try_from(encoded_chunk(bytes.clone())).unwrap();
            let prev = TermSeqno { term: Term(1), seqno: Seqno(4) };
            assert_eq!(chunk.outcome, ChunkOutcome::Batches { prev, batches: batches.clone() });
        }
        {
            tracing::info!("phase: a cut, a flipped bit or garbage is refused as a whole");
            for len in 1..bytes.len() {
                let whole_prefix = len == batch(5, 1).encoded().len();
                let result = Chunk::try_from(encoded_chunk(bytes[..len].to_vec()));
                assert_eq!(result.is_ok(), whole_prefix, "truncation at {len}");
            }
            for bit in (0..bytes.len() * 8).step_by(7) {
                let mut flipped = bytes.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                assert!(Chunk::try_from(encoded_chunk(flipped)).is_err(), "flip of bit {bit} accepted");
            }
            let garbage = vec![0xA5u8; 200];
            assert!(matches!(
                Chunk::try_from(encoded_chunk(garbage)),
                Err(WireError::BadBatch { offset: 0, .. })
            ));
        }
        {
            tracing::info!("phase: over the message bound is refused before any batch is looked at");
            let oversize = vec![0u8; MESSAGE_BATCH_BYTES_MAX + 1];
            assert!(matches!(Chunk::try_from(encoded_chunk(oversize)), Err(WireError::TooLarge { .. })));
        }
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = split_batches(bytes);
        }
    }
}
