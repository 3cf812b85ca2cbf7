//! Domain forms of the snapshot transfer messages ([`SnapshotRequest`], [`SnapshotChunk`]) and their
//! checked conversions.
//!
//! A snapshot travels as the bytes of tidal-core's snapshot file, cut into chunks that each say
//! where they belong (`offset`) in how much (`total_bytes`). The decoder checks each chunk on its
//! own: position present, term history well-formed and ending in the position's term, data within
//! [`SNAPSHOT_CHUNK_BYTES_MAX`], `offset + data` within `total_bytes`, and `last` set exactly on
//! the chunk that reaches the end. Whether chunks follow each other (same position, contiguous
//! offsets) is the receiver's check, across chunks; whether the bytes are a good snapshot is
//! tidal-core's, once all of them are there.

use crate::message::WireError;
use crate::pb;
use tidal_types::{NodeId, Seqno, Term, TermSeqno};
use tidal_wal::wal_meta::TERM_HISTORY_LEN_MAX;

/// Bytes of snapshot data a server puts in one chunk: big enough that per-message overhead is
/// negligible, small enough that a chunk in flight costs little memory on either side.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Largest chunk a receiver accepts (a server may be configured with bigger chunks than ours).
pub const SNAPSHOT_CHUNK_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Largest snapshot a receiver accepts: far above any state this engine holds, it only keeps a
/// corrupt `total_bytes` from meaning "fill the disk".
pub const SNAPSHOT_BYTES_MAX: u64 = 1 << 40;

/// A request for the server's snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRequest {
    /// Cluster of the requester.
    pub cluster_id: String,
    /// The requester.
    pub node: NodeId,
}

impl From<pb::SnapshotRequest> for SnapshotRequest {
    fn from(request: pb::SnapshotRequest) -> SnapshotRequest {
        SnapshotRequest { cluster_id: request.cluster_id, node: NodeId(request.node_id) }
    }
}

impl From<&SnapshotRequest> for pb::SnapshotRequest {
    fn from(request: &SnapshotRequest) -> pb::SnapshotRequest {
        pb::SnapshotRequest { cluster_id: request.cluster_id.clone(), node_id: request.node.0 }
    }
}

/// One checked chunk of a snapshot stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// The snapshot's position: its applied seqno and the term of the batch holding it.
    pub position: TermSeqno,
    /// The server's term history through `position`; in the first chunk (offset 0) only.
    pub history: Option<Vec<TermSeqno>>,
    /// Where `data` starts in the snapshot.
    pub offset: u64,
    /// Bytes of the whole snapshot.
    pub total_bytes: u64,
    /// The bytes at `offset..offset + data.len()`.
    pub data: Vec<u8>,
    /// Whether this chunk reaches `total_bytes`.
    pub last: bool,
}

impl From<SnapshotChunk> for pb::SnapshotChunk {
    fn from(chunk: SnapshotChunk) -> pb::SnapshotChunk {
        pb::SnapshotChunk {
            position: Some(chunk.position.into()),
            offset: chunk.offset,
            total_bytes: chunk.total_bytes,
            data: chunk.data,
            last: chunk.last,
            history: chunk.history.map(|history| pb::TermHistory {
                entries: history.into_iter().map(pb::Position::from).collect(),
            }),
        }
    }
}

impl TryFrom<pb::SnapshotChunk> for SnapshotChunk {
    type Error = WireError;

    fn try_from(chunk: pb::SnapshotChunk) -> Result<SnapshotChunk, WireError> {
        let p = chunk.position.ok_or(WireError::Missing("position"))?;
        let position = TermSeqno { term: Term(p.term), seqno: Seqno(p.seqno) };
        if chunk.data.len() > SNAPSHOT_CHUNK_BYTES_MAX {
            return Err(WireError::TooLarge {
                what: "snapshot chunk",
                got: chunk.data.len(),
                max: SNAPSHOT_CHUNK_BYTES_MAX,
            });
        }
        if chunk.total_bytes > SNAPSHOT_BYTES_MAX {
            return Err(invalid(format!(
                "total of {} bytes is over {SNAPSHOT_BYTES_MAX}",
                chunk.total_bytes
            )));
        }
        let end = chunk.offset.checked_add(chunk.data.len() as u64).filter(|end| *end <= chunk.total_bytes);
        let Some(end) = end else {
            return Err(invalid(format!(
                "{} bytes at offset {} run past the total of {}",
                chunk.data.len(),
                chunk.offset,
                chunk.total_bytes
            )));
        };
        if chunk.last != (end == chunk.total_bytes) {
            return Err(invalid(format!(
                "chunk ending at {end} of {} says last = {}",
                chunk.total_bytes, chunk.last
            )));
        }
        if !chunk.last && chunk.data.is_empty() {
            return Err(invalid("an empty chunk that is not the last".into()));
        }
        let history = match (chunk.offset, chunk.history) {
            (0, Some(history)) => Some(checked_history(history, position)?),
            (0, None) => return Err(WireError::Missing("history")),
            (_, Some(_)) => return Err(invalid("term history after the first chunk".into())),
            (_, None) => None,
        };
        Ok(SnapshotChunk {
            position,
            history,
            offset: chunk.offset,
            total_bytes: chunk.total_bytes,
            data: chunk.data,
            last: chunk.last,
        })
    }
}

fn invalid(reason: String) -> WireError {
    WireError::Invalid { what: "snapshot chunk", reason }
}

/// A term history through `position`: strictly increasing, starting at seqno and term 1 or later,
/// nothing above `position.seqno`, and `position.term` at `position.seqno`.
fn checked_history(history: pb::TermHistory, position: TermSeqno) -> Result<Vec<TermSeqno>, WireError> {
    if history.entries.len() > TERM_HISTORY_LEN_MAX {
        return Err(WireError::TooLarge {
            what: "term history",
            got: history.entries.len(),
            max: TERM_HISTORY_LEN_MAX,
        });
    }
    let entries: Vec<TermSeqno> = history
        .entries
        .into_iter()
        .map(|p| TermSeqno { term: Term(p.term), seqno: Seqno(p.seqno) })
        .collect();
    if entries.iter().any(|entry| entry.seqno == Seqno::ZERO || entry.term == Term(0)) {
        return Err(invalid("term history entries start at seqno 1 and term 1".into()));
    }
    if entries.windows(2).any(|pair| pair[1].term <= pair[0].term || pair[1].seqno <= pair[0].seqno) {
        return Err(invalid("term history is not strictly increasing".into()));
    }
    if entries.last().is_some_and(|entry| entry.seqno > position.seqno) {
        return Err(invalid(format!("term history goes past the snapshot's position {position}")));
    }
    let term_at_position = if position.seqno == Seqno::ZERO {
        Term(0)
    } else {
        entries.last().map_or(Term(0), |entry| entry.term)
    };
    if term_at_position != position.term {
        return Err(invalid(format!(
            "term history puts term {term_at_position} at the snapshot's position {position}"
        )));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn at(term: u64, seqno: u64) -> TermSeqno {
        TermSeqno { term: Term(term), seqno: Seqno(seqno) }
    }

    fn first() -> SnapshotChunk {
        SnapshotChunk {
            position: at(3, 90),
            history: Some(vec![at(1, 1), at(3, 40)]),
            offset: 0,
            total_bytes: 10,
            data: vec![1, 2, 3, 4],
            last: false,
        }
    }

    fn decode(chunk: pb::SnapshotChunk) -> Result<SnapshotChunk, WireError> {
        SnapshotChunk::try_from(chunk)
    }

    #[test]
    fn chunks_and_requests_round_trip() {
        let chunk = first();
        assert_eq!(decode(pb::SnapshotChunk::from(chunk.clone())).unwrap(), chunk);
        let rest = SnapshotChunk { history: None, offset: 4, data: vec![5; 6], last: true, ..first() };
        assert_eq!(decode(pb::SnapshotChunk::from(rest.clone())).unwrap(), rest);
        let empty = SnapshotChunk {
            position: at(0, 0),
            history: Some(Vec::new()),
            total_bytes: 0,
            data: Vec::new(),
            last: true,
            ..first()
        };
        assert_eq!(decode(pb::SnapshotChunk::from(empty.clone())).unwrap(), empty);
        let request = SnapshotRequest { cluster_id: "c".into(), node: NodeId(4) };
        assert_eq!(SnapshotRequest::from(pb::SnapshotRequest::from(&request)), request);
    }

    #[test]
    fn inconsistent_chunks_are_refused() {
        let wire = || pb::SnapshotChunk::from(first());
        let refused = |change: &dyn Fn(&mut pb::SnapshotChunk), what: &str| {
            let mut chunk = wire();
            change(&mut chunk);
            assert!(decode(chunk).is_err(), "{what} accepted");
        };
        refused(&|c| c.position = None, "no position");
        refused(&|c| c.history = None, "first chunk without history");
        refused(&|c| c.offset = 4, "history after the first chunk");
        refused(&|c| c.last = true, "last before the end");
        refused(&|c| c.total_bytes = 3, "data past the total");
        refused(&|c| c.offset = u64::MAX, "offset overflow");
        refused(&|c| c.total_bytes = SNAPSHOT_BYTES_MAX + 1, "absurd total");
        refused(&|c| c.data = vec![0; SNAPSHOT_CHUNK_BYTES_MAX + 1], "oversize data");
        refused(&|c| c.data.clear(), "empty chunk that is not the last");
        refused(&|c| c.position = Some(at(2, 90).into()), "position term not the history's");
        refused(&|c| c.position = Some(at(3, 30).into()), "history past the position");
        refused(
            &|c| c.history = Some(pb::TermHistory { entries: vec![at(3, 40).into(), at(1, 50).into()] }),
            "decreasing history",
        );
        refused(
            &|c| c.history = Some(pb::TermHistory { entries: vec![at(0, 1).into()] }),
            "term 0 in history",
        );
        refused(&|c| c.history = Some(pb::TermHistory::default()), "empty history for a nonzero position");
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(chunk) = pb::SnapshotChunk::decode(bytes.as_slice()) {
                let _ = decode(chunk);
            }
        }

        #[test]
        fn any_decoded_chunk_is_consistent(offset in 0u64..64, len in 0usize..64, total in 0u64..128, last: bool, seqno in 0u64..5) {
            let chunk = pb::SnapshotChunk {
                position: Some(at(u64::from(seqno > 0), seqno).into()),
                offset,
                total_bytes: total,
                data: vec![0; len],
                last,
                history: (offset == 0).then(|| pb::TermHistory { entries: if seqno > 0 { vec![at(1, 1).into()] } else { Vec::new() } }),
            };
            if let Ok(chunk) = decode(chunk) {
                prop_assert!(chunk.offset + chunk.data.len() as u64 <= chunk.total_bytes);
                prop_assert_eq!(chunk.last, chunk.offset + chunk.data.len() as u64 == chunk.total_bytes);
            }
        }
    }
}
