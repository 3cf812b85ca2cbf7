//! The classes of replication input a node refuses, counted for metrics
//! (`tidal_replication_refusals_total{reason=...}`; docs/OPERATIONS.md says what each means and
//! which to alert on).

/// A class of refused replication input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// An RPC without the cluster secret (refused by the service).
    WrongSecret,
    /// A request naming another cluster (refused by the service).
    WrongCluster,
    /// A request that could not be decoded or was too large (refused by the service).
    Malformed,
    /// A ship from an older term.
    StaleTerm,
    /// A ship after a seqno we lack: we pull.
    Gap,
    /// A ship whose `prev` is not in our log.
    Diverged,
    /// A batch starting inside one of ours.
    Overlap,
    /// A pulled chunk from a node not in office that would replace our batches (also below our
    /// commit frontier: such a chunk proves nothing about the leader's log).
    StaleSource,
    /// A message that would quarantine committed seqnos, or one term with two logs.
    Halted,
    /// Our WAL refused to append the message's batches.
    AppendFailed,
    /// A ship, pull, snapshot, notice or election request from a node that is not a member.
    NotMember,
    /// A ship, commit notice or election request of our term from a node openraft's vote does not
    /// name its leader.
    NotLeader,
    /// Sent, not received: a ship or pulled chunk of ours whose `prev` our log does not hold (a bug;
    /// it is not sent).
    UnheldPrev,
}

impl Refusal {
    /// Every class, in the order `/metrics` lists them.
    pub const ALL: [Refusal; 13] = [
        Refusal::WrongSecret,
        Refusal::WrongCluster,
        Refusal::Malformed,
        Refusal::StaleTerm,
        Refusal::Gap,
        Refusal::Diverged,
        Refusal::Overlap,
        Refusal::StaleSource,
        Refusal::Halted,
        Refusal::AppendFailed,
        Refusal::NotMember,
        Refusal::NotLeader,
        Refusal::UnheldPrev,
    ];

    /// The metrics label (`reason`); operators alert on these names.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::WrongSecret => "wrong_secret",
            Refusal::WrongCluster => "wrong_cluster",
            Refusal::Malformed => "malformed",
            Refusal::StaleTerm => "stale_term",
            Refusal::Gap => "gap",
            Refusal::Diverged => "diverged",
            Refusal::Overlap => "overlap",
            Refusal::StaleSource => "stale_source",
            Refusal::Halted => "halted",
            Refusal::AppendFailed => "append_failed",
            Refusal::NotMember => "not_member",
            Refusal::NotLeader => "not_leader",
            Refusal::UnheldPrev => "unheld_prev",
        }
    }
}

impl From<tidal_net::ServiceRefusal> for Refusal {
    fn from(why: tidal_net::ServiceRefusal) -> Refusal {
        match why {
            tidal_net::ServiceRefusal::WrongSecret => Refusal::WrongSecret,
            tidal_net::ServiceRefusal::WrongCluster => Refusal::WrongCluster,
            tidal_net::ServiceRefusal::Malformed => Refusal::Malformed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Refusal;

    #[test]
    fn every_class_has_its_own_label() {
        let mut labels: Vec<&str> = Refusal::ALL.iter().map(|class| class.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Refusal::ALL.len(), "two classes share a label: {labels:?}");
    }
}
