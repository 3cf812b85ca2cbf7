//! Control-plane messages: the new leader's probe (PROTOCOL.md, "Taking office", step 2) and the
//! opaque openraft envelope.
//!
//! tidal-net knows nothing of openraft: a [`RaftCall`] is a kind name and serialized bytes that
//! tidal-cluster encodes and decodes. Sizes are bounded here like every other message.

use crate::message::{history_from_pb, history_to_pb, position, WireError};
use crate::pb;
use std::time::Duration;
use tidal_types::{NodeId, Term, TermSeqno};

/// Largest openraft payload: openraft's log holds only control entries (membership, LeaderStart),
/// so its messages are small; the bound only keeps garbage out.
pub const RAFT_PAYLOAD_BYTES_MAX: usize = 4 * 1024 * 1024;

/// A probe from a node taking office in `term`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Cluster.
    pub cluster_id: String,
    /// The prober's term.
    pub term: Term,
    /// The prober.
    pub leader: NodeId,
}

/// The answer to a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Same term: the answerer's last DURABLE position and its term history.
    Position {
        /// Last durable position.
        last: TermSeqno,
        /// Term history `[(term, first seqno)]`.
        history: Vec<TermSeqno>,
    },
    /// The answerer's term is above the prober's.
    Fenced,
    /// The answerer's term is below the prober's: openraft has not told it yet.
    NotYet,
}

/// A probe answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReply {
    /// The answerer's term.
    pub term: Term,
    /// What it says.
    pub outcome: ProbeOutcome,
    /// What remains of the leader lease the answerer grants in the probe's term (zero: none).
    pub lease_left: Duration,
}

impl From<&Probe> for pb::ProbeRequest {
    fn from(probe: &Probe) -> pb::ProbeRequest {
        pb::ProbeRequest {
            cluster_id: probe.cluster_id.clone(),
            term: probe.term.0,
            leader_id: probe.leader.0,
        }
    }
}

impl From<pb::ProbeRequest> for Probe {
    fn from(request: pb::ProbeRequest) -> Probe {
        Probe { cluster_id: request.cluster_id, term: Term(request.term), leader: NodeId(request.leader_id) }
    }
}

impl From<&ProbeReply> for pb::ProbeReply {
    fn from(reply: &ProbeReply) -> pb::ProbeReply {
        use pb::probe_reply::Outcome;
        let (outcome, last) = match &reply.outcome {
            ProbeOutcome::Position { last, history } => {
                (Outcome::History(history_to_pb(history)), Some(*last))
            }
            ProbeOutcome::Fenced => (Outcome::Fenced(pb::Empty {}), None),
            ProbeOutcome::NotYet => (Outcome::NotYet(pb::Empty {}), None),
        };
        pb::ProbeReply {
            term: reply.term.0,
            outcome: Some(outcome),
            last_durable: last.map(Into::into),
            lease_left_us: u64::try_from(reply.lease_left.as_micros()).unwrap_or(u64::MAX),
        }
    }
}

impl TryFrom<pb::ProbeReply> for ProbeReply {
    type Error = WireError;

    fn try_from(reply: pb::ProbeReply) -> Result<ProbeReply, WireError> {
        use pb::probe_reply::Outcome;
        let outcome = match reply.outcome.ok_or(WireError::Missing("outcome"))? {
            Outcome::History(history) => {
                if history.entries.len() > 1 << 20 {
                    return Err(WireError::TooLarge {
                        what: "term history",
                        got: history.entries.len(),
                        max: 1 << 20,
                    });
                }
                ProbeOutcome::Position {
                    last: position(reply.last_durable, "last_durable")?,
                    history: history_from_pb(history),
                }
            }
            Outcome::Fenced(_) => ProbeOutcome::Fenced,
            Outcome::NotYet(_) => ProbeOutcome::NotYet,
        };
        Ok(ProbeReply {
            term: Term(reply.term),
            outcome,
            lease_left: Duration::from_micros(reply.lease_left_us),
        })
    }
}

/// One openraft RPC: `kind` names it (`append`, `vote`, `snapshot`), `payload` is its encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftCall {
    /// Which RPC.
    pub kind: String,
    /// Its serialized request (or, in answers, response).
    pub payload: Vec<u8>,
}

/// Checks an openraft payload's size.
pub fn check_raft_payload(payload: &[u8]) -> Result<(), WireError> {
    if payload.len() > RAFT_PAYLOAD_BYTES_MAX {
        return Err(WireError::TooLarge {
            what: "raft payload",
            got: payload.len(),
            max: RAFT_PAYLOAD_BYTES_MAX,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tidal_types::Seqno;

    #[test]
    fn probe_reply_round_trips() {
        let replies = [
            ProbeReply {
                term: Term(3),
                outcome: ProbeOutcome::Position {
                    last: TermSeqno { term: Term(2), seqno: Seqno(9) },
                    history: vec![TermSeqno { term: Term(1), seqno: Seqno(1) }],
                },
                lease_left: Duration::from_millis(650),
            },
            ProbeReply { term: Term(4), outcome: ProbeOutcome::Fenced, lease_left: Duration::ZERO },
            ProbeReply { term: Term(1), outcome: ProbeOutcome::NotYet, lease_left: Duration::from_micros(1) },
        ];
        for reply in replies {
            let back = ProbeReply::try_from(pb::ProbeReply::from(&reply)).unwrap();
            assert_eq!(back, reply);
        }
    }

    #[test]
    fn probe_reply_without_outcome_or_position_is_refused() {
        let empty = pb::ProbeReply { term: 1, outcome: None, last_durable: None, lease_left_us: 0 };
        assert_eq!(ProbeReply::try_from(empty), Err(WireError::Missing("outcome")));
        let no_last = pb::ProbeReply {
            term: 1,
            outcome: Some(pb::probe_reply::Outcome::History(pb::TermHistory { entries: vec![] })),
            last_durable: None,
            lease_left_us: 0,
        };
        assert_eq!(ProbeReply::try_from(no_last), Err(WireError::Missing("last_durable")));
    }

    #[test]
    fn oversize_raft_payload_is_refused() {
        assert!(check_raft_payload(&vec![0; RAFT_PAYLOAD_BYTES_MAX]).is_ok());
        assert!(matches!(
            check_raft_payload(&vec![0; RAFT_PAYLOAD_BYTES_MAX + 1]),
            Err(WireError::TooLarge { .. })
        ));
    }
}
